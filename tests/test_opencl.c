/* test_opencl.c: the OpenCL path against the CPU reference and against the float64 oracle
 * of tests/oracle.c (which shares no code with either) on fresh random inputs and odd shapes;
 * every element of out and attn checked (poisoned first).
 * Every configuration runs with both algorithms: fused (out) and unfused (out, and attn
 * when the configuration asks for the weights). */
#include "oracle.h"
#include "attention/attention.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct config {
    size_t B, Tq, Tk, E, Ekv, H, dk, dv, Eo;
    int cross, causal, weights, biases, kpm;
    clattn_mask_kind mask;
    clattn_layout layout;
    float dropout, scale;
    int need_weights;
} config;

static clattn_device *cl_dev, *ref_dev;

static void setup(void)
{
    cl_dev = tu_open_opencl();
    cr_assert(cl_dev, "no OpenCL device (install pocl-opencl-icd): %s", clattn_last_error());
    cr_assert(clattn_device_backend(cl_dev) == CLATTN_BACKEND_OPENCL);
    ref_dev = tu_open_ref();
    cr_assert(ref_dev);
}

static void teardown(void)
{
    clattn_device_free(cl_dev);
    clattn_device_free(ref_dev);
}

TestSuite(opencl, .init = setup, .fini = teardown);

/* Build one random problem from cfg, run it on both devices with `alg`, compare everything. */
static void check_alg(const config *cfg, uint64_t seed, clattn_algorithm alg)
{
    tu_rng rng = {seed};
    clattn_attention_desc d = {0};
    d.batch = cfg->B;
    d.seq_q = cfg->Tq;
    d.seq_kv = cfg->cross ? cfg->Tk : 0;
    d.embed = cfg->E;
    d.kv_embed = cfg->cross ? cfg->Ekv : 0;
    d.heads = cfg->H;
    d.head_dim_qk = cfg->weights ? cfg->dk : 0;
    d.head_dim_v = cfg->weights ? cfg->dv : 0;
    d.out_dim = cfg->Eo;
    d.cross = cfg->cross;
    d.causal = cfg->causal;
    d.key_padding_mask = cfg->kpm;
    d.attn_mask = cfg->mask;
    d.dropout = cfg->dropout;
    d.scale = cfg->scale;
    d.seed = seed * 7919u + 1;
    d.layout = cfg->layout;
    d.algorithm = alg;
    const int need_weights = cfg->need_weights && alg != CLATTN_ALGORITHM_FUSED;
    if (!tu_core_applies(alg, need_weights)) return;
    d.need_weights = need_weights;
    const size_t B = cfg->B, Tq = cfg->Tq, Tk = cfg->cross ? cfg->Tk : cfg->Tq, E = cfg->E;
    const size_t Ekv = cfg->cross ? cfg->Ekv : cfg->E, H = cfg->H;
    const size_t dk = cfg->weights ? cfg->dk : E / H, dv = cfg->weights ? cfg->dv : E / H;
    const float wq = 1.0f / sqrtf((float)E), wkv = 1.0f / sqrtf((float)Ekv), wo = 1.0f / sqrtf((float)(H * dv));

    clattn_attention_weights w = {0};
    float *bufs[16] = {0};
    int nb = 0;
    if (cfg->weights) {
        w.w_query = bufs[nb++] = tu_random(&rng, H * dk * E, -wq, wq);
        w.w_key = bufs[nb++] = tu_random(&rng, H * dk * Ekv, -wkv, wkv);
        w.w_value = bufs[nb++] = tu_random(&rng, H * dv * Ekv, -wkv, wkv);
        if (cfg->biases) {
            w.b_query = bufs[nb++] = tu_random(&rng, H * dk, -0.5f, 0.5f);
            w.b_key = bufs[nb++] = tu_random(&rng, H * dk, -0.5f, 0.5f);
            w.b_value = bufs[nb++] = tu_random(&rng, H * dv, -0.5f, 0.5f);
        }
    }
    if (cfg->Eo) {
        w.w_out = bufs[nb++] = tu_random(&rng, cfg->Eo * H * dv, -wo, wo);
        if (cfg->biases) w.b_out = bufs[nb++] = tu_random(&rng, cfg->Eo, -0.5f, 0.5f);
    }
    clattn_attention_args a = {0};
    a.x = bufs[nb++] = tu_random(&rng, B * Tq * E, -1.0f, 1.0f);
    if (cfg->cross) a.kv = bufs[nb++] = tu_random(&rng, B * Tk * Ekv, -1.0f, 1.0f);
    uint8_t *kpm = NULL, *bmask = NULL;
    if (cfg->kpm) {
        kpm = calloc(B * Tk, 1);
        for (size_t i = 0; i < B * Tk; i++) kpm[i] = (tu_next(&rng) % 4) == 0;
        if (B > 1) memset(kpm + (B - 1) * Tk, 1, Tk); /* one batch entry fully masked: its rows give 0 */
        a.key_padding_mask = kpm;
    }
    if (cfg->mask == CLATTN_MASK_BOOL) {
        bmask = calloc(Tq * Tk, 1);
        for (size_t i = 0; i < Tq * Tk; i++) bmask[i] = (tu_next(&rng) % 3) == 0;
        a.attn_mask = bmask;
    } else if (cfg->mask == CLATTN_MASK_FLOAT) {
        float *fm = bufs[nb++] = tu_random(&rng, Tq * Tk, -2.0f, 2.0f);
        for (size_t i = 0; i < Tq * Tk; i++)
            if (tu_next(&rng) % 5 == 0) fm[i] = -INFINITY;
        a.attn_mask = fm;
    }

    clattn_plan *pc = NULL, *pr = NULL;
    clattn_status st = tu_plan_create(cl_dev, &d, &w, &pc);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "OpenCL plan: %s: %s\n%s", clattn_status_string(st), clattn_last_error(),
                 clattn_last_build_log());
    cr_assert_eq(clattn_plan_algorithm(pc), alg, "asked for %s, got %s", clattn_algorithm_name(alg),
                 clattn_algorithm_name(clattn_plan_algorithm(pc)));
    st = tu_plan_create(ref_dev, &d, &w, &pr);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "ref plan: %s", clattn_last_error());
    const size_t ow = clattn_plan_out_width(pc);
    cr_assert_eq(ow, clattn_plan_out_width(pr));
    const size_t n_out = B * Tq * ow, n_attn = B * H * Tq * Tk;
    float *out_c = tu_poisoned(n_out), *out_r = tu_poisoned(n_out);
    float *attn_c = tu_poisoned(n_attn), *attn_r = tu_poisoned(n_attn);
    clattn_attention_args ac = a, ar = a;
    ac.out = out_c, ar.out = out_r;
    ac.attn = need_weights ? attn_c : NULL;
    ar.attn = attn_r;
    st = tu_plan_execute(pc, &ac);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "OpenCL execute (%s): %s: %s", clattn_algorithm_name(alg),
                 clattn_status_string(st), clattn_last_error());
    st = tu_plan_execute(pr, &ar);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "ref execute: %s", clattn_last_error());

    char msg[256];
    /* the reference output must be finite, and not all zero */
    int nonzero = 0;
    for (size_t i = 0; i < n_out; i++) {
        cr_assert(isfinite(out_r[i]), "reference out[%zu] = %g", i, out_r[i]);
        nonzero |= out_r[i] != 0.0f;
    }
    cr_assert(nonzero, "reference output is all zero");
    size_t bad = tu_compare(out_c, out_r, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s out: %zu of %zu elements differ; %s", clattn_algorithm_name(alg), bad, n_out, msg);
    if (need_weights) {
        bad = tu_compare(attn_c, attn_r, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "attn: %zu of %zu elements differ; %s", bad, n_attn, msg);
        if (cfg->dropout > 0.0f) /* the same elements dropped, bit for bit */
            for (size_t i = 0; i < n_attn; i++)
                cr_assert_eq(attn_c[i] == 0.0f, attn_r[i] == 0.0f, "dropout mask differs at %zu", i);
    }
    {
        /* both against the independent float64 oracle, dropout mask included */
        double *o64 = malloc(n_out * sizeof *o64), *a64 = malloc(n_attn * sizeof *a64);
        cr_assert(o64 && a64);
        cr_assert_eq(oracle_attention(&d, &w, &a, o64, a64), 0);
        bad = oracle_compare(out_c, o64, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "%s out vs float64: %zu of %zu differ; %s", clattn_algorithm_name(alg), bad, n_out, msg);
        bad = oracle_compare(out_r, o64, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "ref out vs float64: %zu of %zu differ; %s", bad, n_out, msg);
        bad = oracle_compare(attn_r, a64, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "ref attn vs float64: %zu of %zu differ; %s", bad, n_attn, msg);
        if (need_weights) {
            bad = oracle_compare(attn_c, a64, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg);
            cr_assert_eq(bad, 0, "attn vs float64: %zu of %zu differ; %s", bad, n_attn, msg);
        }
        free(o64);
        free(a64);
    }
    clattn_plan_free(pc);
    clattn_plan_free(pr);
    free(out_c); free(out_r); free(attn_c); free(attn_r); free(kpm); free(bmask);
    for (int i = 0; i < nb; i++) free(bufs[i]);
}

static void check(const config *cfg, uint64_t seed)
{
    check_alg(cfg, seed, CLATTN_ALGORITHM_FUSED);
    check_alg(cfg, seed, CLATTN_ALGORITHM_UNFUSED);
}

/* B, Tq, Tk, E, Ekv, H, dk, dv, Eo | cross causal weights biases kpm | mask layout dropout scale need_weights */
Test(opencl, self_attention_shapes)
{
    static const config cfgs[] = {
        {1, 1, 0, 8, 0, 1, 4, 4, 0, 0, 0, 1, 0, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {1, 7, 0, 12, 0, 3, 4, 4, 12, 0, 0, 1, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {2, 61, 0, 32, 0, 4, 8, 8, 32, 0, 1, 1, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {3, 130, 0, 24, 0, 8, 3, 3, 0, 0, 1, 1, 0, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_RAW, 0, 0, 1},
        {2, 9, 0, 5, 0, 5, 1, 1, 5, 0, 0, 1, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {1, 33, 0, 128, 0, 1, 128, 128, 0, 0, 1, 1, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 0},
        {2, 17, 0, 64, 0, 2, 96, 40, 16, 0, 0, 1, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_RAW, 0, 0.3f, 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 1000 + i);
}

Test(opencl, no_weights)
{
    static const config cfgs[] = {
        {1, 6, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 1.0f, 1},
        {2, 7, 0, 8, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {2, 5, 0, 12, 0, 3, 0, 0, 6, 0, 0, 0, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 2000 + i);
}

Test(opencl, cross_attention)
{
    static const config cfgs[] = {
        {2, 5, 11, 12, 7, 3, 4, 4, 12, 1, 0, 1, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {2, 6, 9, 8, 10, 2, 4, 5, 0, 1, 1, 1, 0, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {1, 1, 130, 16, 16, 4, 4, 4, 16, 1, 0, 1, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {3, 61, 7, 6, 5, 3, 2, 4, 0, 1, 1, 1, 0, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_RAW, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 3000 + i);
}

Test(opencl, masks)
{
    static const config cfgs[] = {
        {3, 8, 0, 12, 0, 3, 4, 4, 12, 0, 0, 1, 1, 1, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {2, 7, 0, 8, 0, 2, 4, 4, 8, 0, 0, 1, 1, 0, CLATTN_MASK_BOOL, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {2, 7, 0, 8, 0, 2, 4, 4, 8, 0, 0, 1, 1, 0, CLATTN_MASK_FLOAT, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {2, 61, 0, 16, 0, 4, 4, 4, 16, 0, 1, 1, 1, 1, CLATTN_MASK_BOOL, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
        {2, 5, 13, 8, 6, 2, 4, 4, 8, 1, 1, 1, 1, 1, CLATTN_MASK_FLOAT, CLATTN_LAYOUT_LINEAR, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 4000 + i);
}

Test(opencl, dropout)
{
    static const config cfgs[] = {
        {2, 7, 0, 12, 0, 3, 4, 4, 12, 0, 0, 1, 1, 0, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0.2f, 0, 1},
        {2, 61, 0, 16, 0, 4, 4, 4, 0, 0, 1, 1, 0, 1, CLATTN_MASK_NONE, CLATTN_LAYOUT_LINEAR, 0.5f, 0, 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 5000 + i);
}

/* A fused plan makes no attention weights: asking for them is refused, naming the fix, and
 * nothing is written; FUSED with need_weights is refused at plan creation; AUTO picks FUSED
 * without need_weights and UNFUSED with it (a core CLATTN_CORE forces: its algorithm, and a plan it
 * cannot serve is refused naming its limit). */
Test(opencl, fused_refuses_weights)
{
    tu_rng r = {8};
    const size_t B = 1, T = 9, E = 8;
    float *x = tu_random(&r, B * T * E, -1, 1);
    clattn_attention_desc d = {.batch = B, .seq_q = T, .embed = E, .heads = 2};
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(cl_dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_core_info *forced = tu_forced_core();
    cr_assert_eq(clattn_plan_algorithm(plan), forced ? forced->algorithm : CLATTN_ALGORITHM_FUSED,
                 "AUTO without need_weights");
    if (forced) cr_assert_str_eq(clattn_plan_core(plan), forced->name);
    float *out = tu_poisoned(B * T * E), *attn = tu_poisoned(2 * T * T);
    clattn_attention_args a = {.x = x, .out = out, .attn = attn};
    if (clattn_plan_algorithm(plan) == CLATTN_ALGORITHM_FUSED) {
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(strstr(clattn_last_error(), "need_weights"), "%s", clattn_last_error());
        for (size_t i = 0; i < B * T * E; i++) cr_assert(isnan(out[i]), "out written on a refused call");
        for (size_t i = 0; i < 2 * T * T; i++) cr_assert(isnan(attn[i]), "attn written on a refused call");
    }
    clattn_plan_free(plan);
    d.need_weights = 1;
    cr_assert_eq(tu_plan_create(cl_dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_plan_algorithm(plan), CLATTN_ALGORITHM_UNFUSED, "AUTO with need_weights");
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    {
        double o64[1 * 9 * 8], a64[2 * 9 * 9];
        cr_assert_eq(oracle_attention(&d, NULL, &a, o64, a64), 0);
        char m[256];
        cr_assert_eq(oracle_compare(out, o64, B * T * E, TU_ATOL, TU_RTOL, m, sizeof m), 0, "out: %s", m);
        cr_assert_eq(oracle_compare(attn, a64, 2 * T * T, TU_ATOL, TU_RTOL, m, sizeof m), 0, "attn: %s", m);
    }
    clattn_plan_free(plan);
    d.algorithm = CLATTN_ALGORITHM_FUSED;
    plan = (clattn_plan *)(uintptr_t)1;
    cr_assert_eq(tu_plan_create(cl_dev, &d, NULL, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_null(plan);
    d.algorithm = (clattn_algorithm)7;
    cr_assert_eq(tu_plan_create(cl_dev, &d, NULL, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    /* head sizes above the fused kernel's 256: FUSED refused naming the limit, AUTO falls back */
    clattn_attention_desc big = {.batch = 1, .seq_q = 3, .embed = 300, .heads = 1};
    float *xb = tu_random(&r, 3 * 300, -1, 1);
    big.algorithm = CLATTN_ALGORITHM_FUSED;
    cr_assert_eq(tu_plan_create(cl_dev, &big, NULL, &plan), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "256"), "%s", clattn_last_error());
    big.algorithm = CLATTN_ALGORITHM_AUTO;
    if (forced && forced->algorithm == CLATTN_ALGORITHM_FUSED) { /* forced: refused, never another core */
        cr_assert_eq(tu_plan_create(cl_dev, &big, NULL, &plan), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(strstr(clattn_last_error(), "256") && strstr(clattn_last_error(), forced->name), "%s",
                  clattn_last_error());
    } else {
        cr_assert_eq(tu_plan_create(cl_dev, &big, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(clattn_plan_algorithm(plan), CLATTN_ALGORITHM_UNFUSED);
        clattn_plan_free(plan);
    }
    free(x); free(xb); free(out); free(attn);
}
