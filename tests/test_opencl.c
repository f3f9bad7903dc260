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

typedef tu_attn_case config; /* the attention families' shared case (testutil.h) */

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
    const int need_weights = cfg->need_weights && alg != CLATTN_ALGORITHM_FUSED;
    if (!tu_core_applies(alg, need_weights)) return;
    tu_attn_case c = *cfg;
    c.need_weights = need_weights;
    tu_problem prob;
    tu_problem_make(&prob, &c, seed);
    clattn_attention_desc d = prob.d;
    d.algorithm = alg;
    const clattn_attention_weights w = prob.w;
    const clattn_attention_args a = prob.a;
    const size_t B = cfg->B, Tq = cfg->Tq, Tk = cfg->cross ? cfg->Tk : cfg->Tq, H = cfg->H;

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
    free(out_c); free(out_r); free(attn_c); free(attn_r);
    tu_problem_free(&prob);
}

static void check(const config *cfg, uint64_t seed)
{
    check_alg(cfg, seed, CLATTN_ALGORITHM_FUSED);
    check_alg(cfg, seed, CLATTN_ALGORITHM_UNFUSED);
}

Test(opencl, self_attention_shapes)
{
    static const config cfgs[] = {
        {.B = 1, .Tq = 1, .E = 8, .H = 1, .dk = 4, .dv = 4, .need_weights = 1},
        {.B = 1, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .need_weights = 1},
        {.B = 2, .Tq = 61, .E = 32, .H = 4, .dk = 8, .dv = 8, .Eo = 32, .causal = 1, .biases = 1, .need_weights = 1},
        {.B = 3, .Tq = 130, .E = 24, .H = 8, .dk = 3, .dv = 3, .causal = 1, .layout = CLATTN_LAYOUT_RAW, .need_weights = 1},
        {.B = 2, .Tq = 9, .E = 5, .H = 5, .dk = 1, .dv = 1, .Eo = 5, .biases = 1, .need_weights = 1},
        {.B = 1, .Tq = 33, .E = 128, .H = 1, .dk = 128, .dv = 128, .causal = 1, .biases = 1},
        {.B = 2, .Tq = 17, .E = 64, .H = 2, .dk = 96, .dv = 40, .Eo = 16, .biases = 1, .layout = CLATTN_LAYOUT_RAW, .scale = 0.3f, .need_weights = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 1000 + i);
}

Test(opencl, no_weights)
{
    static const config cfgs[] = {
        {.B = 1, .Tq = 6, .E = 3, .H = 1, .noproj = 1, .scale = 1.0f, .need_weights = 1},
        {.B = 2, .Tq = 7, .E = 8, .H = 2, .causal = 1, .noproj = 1, .need_weights = 1},
        {.B = 2, .Tq = 5, .E = 12, .H = 3, .Eo = 6, .noproj = 1, .biases = 1, .need_weights = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 2000 + i);
}

Test(opencl, cross_attention)
{
    static const config cfgs[] = {
        {.B = 2, .Tq = 5, .Tk = 11, .E = 12, .Ekv = 7, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .cross = 1, .biases = 1, .need_weights = 1},
        {.B = 2, .Tq = 6, .Tk = 9, .E = 8, .Ekv = 10, .H = 2, .dk = 4, .dv = 5, .cross = 1, .causal = 1, .need_weights = 1},
        {.B = 1, .Tq = 1, .Tk = 130, .E = 16, .Ekv = 16, .H = 4, .dk = 4, .dv = 4, .Eo = 16, .cross = 1, .biases = 1, .need_weights = 1},
        {.B = 3, .Tq = 61, .Tk = 7, .E = 6, .Ekv = 5, .H = 3, .dk = 2, .dv = 4, .cross = 1, .causal = 1, .layout = CLATTN_LAYOUT_RAW, .need_weights = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 3000 + i);
}

Test(opencl, masks)
{
    static const config cfgs[] = {
        {.B = 3, .Tq = 8, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .need_weights = 1},
        {.B = 2, .Tq = 7, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 8, .biases = 1, .mask = CLATTN_MASK_BOOL, .need_weights = 1},
        {.B = 2, .Tq = 7, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 8, .biases = 1, .mask = CLATTN_MASK_FLOAT, .need_weights = 1},
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .Eo = 16, .causal = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_BOOL, .need_weights = 1},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 4, .Eo = 8, .cross = 1, .causal = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_FLOAT, .need_weights = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 4000 + i);
}

Test(opencl, dropout)
{
    static const config cfgs[] = {
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .dropout = 0.2f, .need_weights = 1},
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .causal = 1, .kpm = 1, .dropout = 0.5f, .need_weights = 1},
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
