/* test_encoder.c: the transformer encoder layer (issue 6).
 *   - every PyTorch-made fixture (tests/golden/encoder, made by
 *     tests/golden/make_golden_encoder.py) on ref and on the OpenCL device, in both weight layouts;
 *   - the OpenCL path against the reference on random problems (T = 1, 7, 37, 61; odd E; both
 *     norms and activations; causal; key padding masks), from host arrays and from cl_mem buffers;
 *   - the residual + LayerNorm kernel alone on rows with a large common offset;
 *   - validation, argument errors, allocation failures;
 *   - `clattn encoder` end to end.
 * Every output is poisoned first and checked element by element with |got - ref| <= 1e-5 + 1e-4 |ref|. */
#include "encoder/encoder.h"
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define ENCODER_DIR CLATTN_GOLDEN_DIR "/../encoder"

/* ---------------------------------------------------------------- fixtures */

enum { X, WQ, WK, WV, BQ, BK, BV, WO, BO, LN1W, LN1B, WF1, BF1, WF2, BF2, LN2W, LN2B, KPM, EXPECT, N_FILES };
static const char *const files[N_FILES] = {
    "x", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out", "b_out", "ln1_weight", "ln1_bias",
    "w_ff1", "b_ff1", "w_ff2", "b_ff2", "ln2_weight", "ln2_bias", "key_padding_mask", "expect_out"};

typedef struct enc_case {
    char name[128];
    clattn_npy a[N_FILES];
    clattn_encoder_desc d;
    clattn_encoder_weights w;
    char activation[16];
} enc_case;

static float *f32(enc_case *c, int i) { return c->a[i].data; } /* NULL when the file is absent */

static void case_load(const char *name, enc_case *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    for (int i = 0; i < N_FILES; i++) {
        char path[1024], err[256];
        snprintf(path, sizeof path, "%s/%s/%s.npy", ENCODER_DIR, name, files[i]);
        if (access(path, F_OK) != 0) {
            cr_assert(i == KPM, "%s: missing", path);
            continue;
        }
        cr_assert_eq(clattn_npy_load(path, &c->a[i], err, sizeof err), 0, "%s: %s", path, err);
    }
    char path[1024], line[256];
    snprintf(path, sizeof path, "%s/%s/meta.txt", ENCODER_DIR, name);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s: missing", path);
    clattn_encoder_desc *d = &c->d;
    while (fgets(line, sizeof line, f)) {
        char key[64], val[64];
        if (line[0] == '#' || sscanf(line, "%63s %63s", key, val) != 2) continue;
        if (strcmp(key, "heads") == 0) d->attn.heads = strtoul(val, NULL, 10);
        else if (strcmp(key, "causal") == 0) d->attn.causal = atoi(val);
        else if (strcmp(key, "norm_first") == 0) d->norm_first = atoi(val);
        else if (strcmp(key, "eps") == 0) d->eps = strtof(val, NULL);
        else if (strcmp(key, "activation") == 0) snprintf(c->activation, sizeof c->activation, "%.15s", val);
    }
    fclose(f);
    cr_assert(strcmp(c->activation, "relu") == 0 || strcmp(c->activation, "gelu") == 0, "%s: activation", name);
    d->activation = strcmp(c->activation, "gelu") == 0 ? CLATTN_ACTIVATION_GELU : CLATTN_ACTIVATION_RELU;
    cr_assert_eq(c->a[X].ndim, 3);
    d->attn.batch = c->a[X].shape[0];
    d->attn.seq_q = c->a[X].shape[1];
    d->attn.embed = c->a[X].shape[2];
    d->attn.head_dim_qk = d->attn.head_dim_v = d->attn.embed / d->attn.heads;
    d->attn.out_dim = d->attn.embed;
    d->attn.key_padding_mask = c->a[KPM].data != NULL;
    d->ff_dim = c->a[WF1].shape[0];
    /* every array's shape against the case: x (B, T, E), weights as torch stores them */
    const size_t B = d->attn.batch, T = d->attn.seq_q, E = d->attn.embed, F = d->ff_dim;
    cr_assert(d->attn.heads > 0 && E % d->attn.heads == 0, "%s: heads", name);
    const size_t shapes[N_FILES][3] = {
        [X] = {B, T, E},   [WQ] = {E, E},      [WK] = {E, E},  [WV] = {E, E},   [BQ] = {E},   [BK] = {E},
        [BV] = {E},        [WO] = {E, E},      [BO] = {E},     [LN1W] = {E},    [LN1B] = {E}, [WF1] = {F, E},
        [BF1] = {F},       [WF2] = {E, F},     [BF2] = {E},    [LN2W] = {E},    [LN2B] = {E}, [KPM] = {B, T},
        [EXPECT] = {B, T, E}};
    for (int i = 0; i < N_FILES; i++) {
        const clattn_npy *a = &c->a[i];
        if (!a->data) continue;
        const int nd = shapes[i][2] ? 3 : shapes[i][1] ? 2 : 1;
        cr_assert(a->ndim == nd && a->shape[0] == shapes[i][0] && (nd < 2 || a->shape[1] == shapes[i][1]) &&
                      (nd < 3 || a->shape[2] == shapes[i][2]),
                  "%s/%s.npy: shape does not match B=%zu T=%zu E=%zu F=%zu", name, files[i], B, T, E, F);
        cr_assert(i == KPM ? a->dtype == CLATTN_NPY_BOOL || a->dtype == CLATTN_NPY_U8 : a->dtype == CLATTN_NPY_F32,
                  "%s/%s.npy: dtype", name, files[i]);
    }
    for (size_t k = 0; k < c->a[EXPECT].count; k++)
        cr_assert(isfinite(((const float *)c->a[EXPECT].data)[k]), "%s: expect_out[%zu] not finite", name, k);
    clattn_encoder_weights *w = &c->w;
    w->attn = (clattn_attention_weights){.w_query = f32(c, WQ), .w_key = f32(c, WK), .w_value = f32(c, WV),
                                         .b_query = f32(c, BQ), .b_key = f32(c, BK), .b_value = f32(c, BV),
                                         .w_out = f32(c, WO), .b_out = f32(c, BO)};
    w->ln1_weight = f32(c, LN1W), w->ln1_bias = f32(c, LN1B), w->w_ff1 = f32(c, WF1), w->b_ff1 = f32(c, BF1);
    w->w_ff2 = f32(c, WF2), w->b_ff2 = f32(c, BF2), w->ln2_weight = f32(c, LN2W), w->ln2_bias = f32(c, LN2B);
}

static void case_free(enc_case *c)
{
    for (int i = 0; i < N_FILES; i++) clattn_npy_free(&c->a[i]);
}

static int cmp_names(const void *a, const void *b) { return strcmp(a, b); }

static size_t case_names(char names[][128], size_t cap)
{
    DIR *dir = opendir(ENCODER_DIR);
    cr_assert(dir, "cannot open %s", ENCODER_DIR);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < cap)
        if (e->d_name[0] != '.') snprintf(names[n++], 128, "%.127s", e->d_name);
    closedir(dir);
    qsort(names, n, 128, cmp_names);
    return n;
}

/* a (rows, cols) -> malloc'd (cols, rows) */
static float *transposed(const float *a, size_t rows, size_t cols)
{
    float *t = malloc(rows * cols * sizeof *t);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) t[c * rows + r] = a[r * cols + c];
    return t;
}

static void run_fixtures(clattn_device *dev, clattn_layout layout)
{
    static char names[64][128];
    size_t n = case_names(names, 64);
    cr_assert(n >= 12, "expected the encoder fixtures in %s, found %zu", ENCODER_DIR, n);
    for (size_t i = 0; i < n; i++) {
        enc_case c;
        case_load(names[i], &c);
        clattn_encoder_weights w = c.w;
        float *t[6] = {0};
        if (layout == CLATTN_LAYOUT_RAW) { /* every matrix handed over as x @ W ([in, out]) */
            c.d.attn.layout = CLATTN_LAYOUT_RAW;
            const void **ws[] = {&w.attn.w_query, &w.attn.w_key, &w.attn.w_value, &w.attn.w_out};
            const int idx[] = {WQ, WK, WV, WO, WF1, WF2};
            for (int k = 0; k < 4; k++) *ws[k] = t[k] = transposed(*ws[k], c.a[idx[k]].shape[0], c.a[idx[k]].shape[1]);
            w.w_ff1 = t[4] = transposed(w.w_ff1, c.a[WF1].shape[0], c.a[WF1].shape[1]);
            w.w_ff2 = t[5] = transposed(w.w_ff2, c.a[WF2].shape[0], c.a[WF2].shape[1]);
        }
        clattn_encoder_plan *plan = NULL;
        clattn_status st = tu_encoder_plan_create(dev, &c.d, &w, &plan);
        cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: plan: %s: %s\n%s", c.name, clattn_status_string(st),
                     clattn_last_error(), clattn_last_build_log());
        const size_t count = c.a[EXPECT].count;
        cr_assert_eq(count, c.a[X].count);
        float *out = tu_poisoned(count);
        clattn_encoder_args a = {.x = c.a[X].data, .key_padding_mask = c.a[KPM].data, .out = out};
        st = tu_encoder_plan_execute(plan, &a);
        cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: execute: %s: %s", c.name, clattn_status_string(st),
                     clattn_last_error());
        char msg[256];
        size_t bad = tu_compare(out, c.a[EXPECT].data, count, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_expect_eq(bad, 0, "%s on %s (%s layout): %zu of %zu differ; %s", c.name, clattn_device_name(dev),
                     layout == CLATTN_LAYOUT_RAW ? "raw" : "linear", bad, count, msg);
        clattn_encoder_plan_free(plan);
        free(out);
        for (int k = 0; k < 6; k++) free(t[k]);
        case_free(&c);
    }
}

static clattn_device *open_cl(void)
{
    clattn_device *dev = tu_open_opencl();
    cr_assert(dev, "no OpenCL device (install pocl-opencl-icd): %s", clattn_last_error());
    cr_assert_eq(clattn_device_backend(dev), CLATTN_BACKEND_OPENCL);
    return dev;
}

Test(encoder_golden, ref)
{
    clattn_device *dev = tu_open_ref();
    run_fixtures(dev, CLATTN_LAYOUT_LINEAR);
    run_fixtures(dev, CLATTN_LAYOUT_RAW);
    clattn_device_free(dev);
}

Test(encoder_golden, opencl)
{
    clattn_device *dev = open_cl();
    run_fixtures(dev, CLATTN_LAYOUT_LINEAR);
    clattn_device_free(dev);
}

Test(encoder_golden, opencl_raw_layout)
{
    clattn_device *dev = open_cl();
    run_fixtures(dev, CLATTN_LAYOUT_RAW);
    clattn_device_free(dev);
}

/* ---------------------------------------------------------------- random problems */

typedef struct problem {
    clattn_encoder_desc d;
    clattn_encoder_weights w;
    float *bufs[20];
    int nb;
    float *x;
    uint8_t *kpm;
    size_t n;   /* B*T*E */
} problem;

typedef struct config {
    size_t B, T, E, H, F;
    int norm_first, causal, kpm;
    clattn_activation act;
    clattn_layout layout;
} config;

static float *rnd(problem *p, tu_rng *r, size_t n, float lo, float hi) { return p->bufs[p->nb++] = tu_random(r, n, lo, hi); }

static void make_problem(problem *p, const config *cfg, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    tu_rng r = {seed};
    const size_t B = cfg->B, T = cfg->T, E = cfg->E, H = cfg->H, F = cfg->F, dh = (E + H - 1) / H;
    clattn_encoder_desc *d = &p->d;
    d->attn = (clattn_attention_desc){.batch = B, .seq_q = T, .embed = E, .heads = H, .head_dim_qk = dh,
                                      .out_dim = E, .causal = cfg->causal, .key_padding_mask = cfg->kpm,
                                      .layout = cfg->layout};
    d->ff_dim = F;
    d->activation = cfg->act;
    d->norm_first = cfg->norm_first;
    const float we = 1.0f / sqrtf((float)E), wo = 1.0f / sqrtf((float)(H * dh)), wf = 1.0f / sqrtf((float)F);
    clattn_encoder_weights *w = &p->w;
    w->attn.w_query = rnd(p, &r, H * dh * E, -we, we);
    w->attn.w_key = rnd(p, &r, H * dh * E, -we, we);
    w->attn.w_value = rnd(p, &r, H * dh * E, -we, we);
    w->attn.b_query = rnd(p, &r, H * dh, -0.5f, 0.5f);
    w->attn.b_key = rnd(p, &r, H * dh, -0.5f, 0.5f);
    w->attn.b_value = rnd(p, &r, H * dh, -0.5f, 0.5f);
    w->attn.w_out = rnd(p, &r, E * H * dh, -wo, wo);
    w->attn.b_out = rnd(p, &r, E, -0.5f, 0.5f);
    w->ln1_weight = rnd(p, &r, E, 0.5f, 1.5f);
    w->ln1_bias = rnd(p, &r, E, -0.5f, 0.5f);
    w->w_ff1 = rnd(p, &r, F * E, -2 * we, 2 * we);
    w->b_ff1 = rnd(p, &r, F, -0.5f, 0.5f);
    w->w_ff2 = rnd(p, &r, E * F, -2 * wf, 2 * wf);
    w->b_ff2 = rnd(p, &r, E, -0.5f, 0.5f);
    w->ln2_weight = rnd(p, &r, E, 0.5f, 1.5f);
    w->ln2_bias = rnd(p, &r, E, -0.5f, 0.5f);
    p->n = B * T * E;
    p->x = rnd(p, &r, p->n, -2.0f, 2.0f);
    if (cfg->kpm) {
        p->kpm = calloc(B * T, 1);
        for (size_t i = 0; i < B * T; i++) p->kpm[i] = tu_next(&r) % 4 == 0;
        if (B > 1) memset(p->kpm + (B - 1) * T, 1, T); /* a fully masked entry: attention gives b_out there */
    }
}

static void free_problem(problem *p)
{
    for (int i = 0; i < p->nb; i++) free(p->bufs[i]);
    free(p->kpm);
}

static clattn_device *cl_dev, *ref_dev;

static void devices_setup(void)
{
    cl_dev = open_cl();
    ref_dev = tu_open_ref();
    cr_assert(ref_dev);
}

static void devices_teardown(void)
{
    clattn_device_free(cl_dev);
    clattn_device_free(ref_dev);
}

/* out of a fresh plan on dev (poisoned first); the caller frees it */
static float *run_on(clattn_device *dev, const problem *p)
{
    clattn_encoder_plan *plan = NULL;
    clattn_status st = tu_encoder_plan_create(dev, &p->d, &p->w, &plan);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "plan on %s: %s: %s\n%s", clattn_device_name(dev),
                 clattn_status_string(st), clattn_last_error(), clattn_last_build_log());
    float *out = tu_poisoned(p->n);
    clattn_encoder_args a = {.x = p->x, .key_padding_mask = p->kpm, .out = out};
    st = tu_encoder_plan_execute(plan, &a);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "execute on %s: %s: %s", clattn_device_name(dev),
                 clattn_status_string(st), clattn_last_error());
    clattn_encoder_plan_free(plan);
    return out;
}

static void check_config(const config *cfg, uint64_t seed)
{
    problem p;
    make_problem(&p, cfg, seed);
    float *ref = run_on(ref_dev, &p), *got = run_on(cl_dev, &p);
    char msg[256];
    /* both against the float64 oracle of tests/oracle.c, which shares no code with either */
    double *o64 = malloc(p.n * sizeof *o64);
    cr_assert_not_null(o64);
    cr_assert_eq(oracle_encoder(&p.d, &p.w, p.x, p.kpm, o64), 0);
    size_t bad = oracle_compare(ref, o64, p.n, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_expect_eq(bad, 0, "ref vs float64: %zu of %zu differ; %s", bad, p.n, msg);
    bad = oracle_compare(got, o64, p.n, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_expect_eq(bad, 0, "OpenCL vs float64: %zu of %zu differ; %s", bad, p.n, msg);
    free(o64);
    bad = tu_compare(got, ref, p.n, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_expect_eq(bad, 0,
                 "B=%zu T=%zu E=%zu H=%zu F=%zu norm_first=%d causal=%d kpm=%d %s %s: %zu of %zu differ; %s", cfg->B,
                 cfg->T, cfg->E, cfg->H, cfg->F, cfg->norm_first, cfg->causal, cfg->kpm,
                 cfg->act == CLATTN_ACTIVATION_GELU ? "gelu" : "relu", cfg->layout == CLATTN_LAYOUT_RAW ? "raw" : "linear",
                 bad, p.n, msg);
    free(ref);
    free(got);
    free_problem(&p);
}

TestSuite(encoder_opencl, .init = devices_setup, .fini = devices_teardown);

Test(encoder_opencl, post_norm_vs_ref)
{
    const config cfgs[] = {
        {2, 1, 7, 7, 22, 0, 0, 0, CLATTN_ACTIVATION_RELU, CLATTN_LAYOUT_LINEAR},
        {2, 7, 9, 3, 28, 0, 1, 0, CLATTN_ACTIVATION_GELU, CLATTN_LAYOUT_LINEAR},
        {1, 37, 15, 5, 46, 0, 0, 1, CLATTN_ACTIVATION_GELU, CLATTN_LAYOUT_RAW},
        {3, 61, 13, 1, 40, 0, 1, 1, CLATTN_ACTIVATION_RELU, CLATTN_LAYOUT_LINEAR},
        {1, 7, 5, 5, 1, 0, 0, 0, CLATTN_ACTIVATION_GELU, CLATTN_LAYOUT_LINEAR}, /* F = 1 */
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_config(&cfgs[i], 100 + i);
}

Test(encoder_opencl, pre_norm_vs_ref)
{
    const config cfgs[] = {
        {3, 1, 5, 1, 16, 1, 0, 1, CLATTN_ACTIVATION_RELU, CLATTN_LAYOUT_LINEAR},
        {2, 7, 11, 2, 34, 1, 1, 1, CLATTN_ACTIVATION_GELU, CLATTN_LAYOUT_RAW},
        {2, 37, 33, 3, 100, 1, 1, 0, CLATTN_ACTIVATION_RELU, CLATTN_LAYOUT_LINEAR},
        {1, 61, 301, 7, 64, 1, 0, 0, CLATTN_ACTIVATION_GELU, CLATTN_LAYOUT_LINEAR}, /* E > 256: several per item */
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_config(&cfgs[i], 200 + i);
}

/* cl_mem inputs at offsets, a wait list and an event; the same numbers as from host arrays */
Test(encoder_opencl, buffers)
{
    for (int norm_first = 0; norm_first <= 1; norm_first++) {
        const config cfg = {2, 7, 9, 3, 28, norm_first, 1, 1, CLATTN_ACTIVATION_GELU, CLATTN_LAYOUT_LINEAR};
        problem p;
        make_problem(&p, &cfg, 300 + norm_first);
        float *ref = run_on(ref_dev, &p);
        clattn_encoder_plan *plan = NULL;
        cr_assert_eq(tu_encoder_plan_create(cl_dev, &p.d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        cl_context ctx = clattn_device_context(cl_dev);
        cl_command_queue q = clattn_device_queue(cl_dev);
        const size_t xo = 5, oo = 3, mo = 2, N = cfg.B * cfg.T;
        cl_int e1, e2, e3;
        cl_mem bx = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (xo + p.n) * 4, NULL, &e1);
        cl_mem bo = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (oo + p.n) * 4, NULL, &e2);
        cl_mem bm = clCreateBuffer(ctx, CL_MEM_READ_WRITE, mo + N, NULL, &e3);
        cr_assert(e1 == CL_SUCCESS && e2 == CL_SUCCESS && e3 == CL_SUCCESS);
        float *poison = tu_poisoned(p.n);
        cl_event up[3];
        cr_assert_eq(clEnqueueWriteBuffer(q, bx, CL_FALSE, xo * 4, p.n * 4, p.x, 0, NULL, &up[0]), CL_SUCCESS);
        cr_assert_eq(clEnqueueWriteBuffer(q, bm, CL_FALSE, mo, N, p.kpm, 0, NULL, &up[1]), CL_SUCCESS);
        cr_assert_eq(clEnqueueWriteBuffer(q, bo, CL_FALSE, oo * 4, p.n * 4, poison, 0, NULL, &up[2]), CL_SUCCESS);
        clattn_encoder_buffers b = {.x = {bx, xo}, .key_padding_mask = {bm, mo}, .out = {bo, oo}};
        cl_event done = NULL;
        clattn_status st = clattn_encoder_plan_execute_buffers(plan, &b, 3, up, &done);
        cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: %s", clattn_status_string(st), clattn_last_error());
        cr_assert(done);
        cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS);
        float *got = tu_poisoned(p.n);
        cr_assert_eq(clEnqueueReadBuffer(q, bo, CL_TRUE, oo * 4, p.n * 4, got, 0, NULL, NULL), CL_SUCCESS);
        char msg[256];
        size_t bad = tu_compare(got, ref, p.n, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_expect_eq(bad, 0, "norm_first=%d from buffers: %zu of %zu differ; %s", norm_first, bad, p.n, msg);
        /* a buffer too small for its offset: refused before anything is enqueued */
        b.out.offset = oo + 1;
        st = clattn_encoder_plan_execute_buffers(plan, &b, 0, NULL, NULL);
        cr_assert_eq(st, CLATTN_STATUS_SHAPE_MISMATCH, "%s", clattn_last_error());
        cr_assert(strstr(clattn_last_error(), "buffers.out"), "%s", clattn_last_error());
        b.out.offset = oo;
        b.key_padding_mask.mem = NULL;
        st = clattn_encoder_plan_execute_buffers(plan, &b, 0, NULL, NULL);
        cr_assert_eq(st, CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, &b, 1, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        for (int i = 0; i < 3; i++) clReleaseEvent(up[i]);
        clReleaseEvent(done);
        clReleaseMemObject(bx);
        clReleaseMemObject(bo);
        clReleaseMemObject(bm);
        clattn_encoder_plan_free(plan);
        free(poison);
        free(got);
        free(ref);
        free_problem(&p);
    }
}

/* ---------------------------------------------------------------- the LayerNorm kernel alone */

static float gauss(tu_rng *r)
{
    double u1 = ((tu_next(r) >> 11) + 1) * (1.0 / 9007199254740993.0), u2 = (tu_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* What the one-pass formula var = E[v^2] - E[v]^2 gives in float: how far from the reference it lands. */
static size_t one_pass_failures(const float *x, size_t rows, size_t E, const float *gamma, const float *beta,
                                const float *ref)
{
    size_t bad = 0;
    for (size_t i = 0; i < rows; i++) {
        float s = 0.0f, s2 = 0.0f;
        for (size_t j = 0; j < E; j++) s += x[i * E + j], s2 += x[i * E + j] * x[i * E + j];
        float mean = s / (float)E, var = s2 / (float)E - mean * mean;
        float rstd = 1.0f / sqrtf(fmaxf(var, 0.0f) + 1e-5f);
        for (size_t j = 0; j < E; j++) {
            float o = (x[i * E + j] - mean) * rstd * gamma[j] + beta[j];
            bad += !(fabs((double)o - ref[i * E + j]) <= TU_ATOL + TU_RTOL * fabs(ref[i * E + j]));
        }
    }
    return bad;
}

/* LayerNorm of the float rows v in float64 (biased variance, as torch), written here. */
static double *layernorm64(const float *v, size_t rows, size_t E, const float *gamma, const float *beta, double eps)
{
    double *y = malloc(rows * E * sizeof *y);
    cr_assert_not_null(y);
    for (size_t i = 0; i < rows; i++) {
        double mean = 0.0, var = 0.0;
        for (size_t j = 0; j < E; j++) mean += v[i * E + j];
        mean /= (double)E;
        for (size_t j = 0; j < E; j++) var += (v[i * E + j] - mean) * (v[i * E + j] - mean);
        var /= (double)E;
        for (size_t j = 0; j < E; j++) y[i * E + j] = (v[i * E + j] - mean) / sqrt(var + eps) * gamma[j] + beta[j];
    }
    return y;
}

TestSuite(layernorm, .init = devices_setup, .fini = devices_teardown);

/* rows of 1e4 + N(0, 1e-2): two-pass mean and variance keep full precision, the one-pass formula does not */
Test(layernorm, large_offset_rows)
{
    const size_t Es[] = {1, 2, 7, 64, 300, 1000};
    for (size_t k = 0; k < sizeof Es / sizeof Es[0]; k++) {
        const size_t E = Es[k], rows = 9;
        tu_rng r = {4000 + E};
        float *x = malloc(rows * E * sizeof *x);
        for (size_t i = 0; i < rows * E; i++) x[i] = 1e4f + 1e-2f * gauss(&r);
        for (size_t j = 0; j < E; j++) x[(rows - 1) * E + j] = 1e4f; /* a constant row: out = beta */
        float *gamma = tu_random(&r, E, 0.5f, 1.5f), *beta = tu_random(&r, E, -0.5f, 0.5f);
        float *ref = tu_poisoned(rows * E);
        cr_assert_eq(clattn_residual_layernorm_rows(ref_dev, rows, E, x, NULL, NULL, gamma, beta, 1e-5f, -1, NULL, ref),
                     CLATTN_STATUS_SUCCESS);
        for (size_t j = 0; j < E; j++) cr_assert_eq(ref[(rows - 1) * E + j], beta[j]);
        char msg[256];
        double *y64 = layernorm64(x, rows, E, gamma, beta, 1e-5);
        cr_assert_eq(oracle_compare(ref, y64, rows * E, TU_ATOL, TU_RTOL, msg, sizeof msg), 0,
                     "E=%zu: ref vs float64: %s", E, msg);
        if (E >= 64)
            cr_assert_gt(one_pass_failures(x, rows, E, gamma, beta, ref), rows * E / 4,
                         "E=%zu: the data should defeat the one-pass formula", E);
        for (int cache = 0; cache <= 1; cache++) {
            float *got = tu_poisoned(rows * E);
            clattn_status st =
                clattn_residual_layernorm_rows(cl_dev, rows, E, x, NULL, NULL, gamma, beta, 1e-5f, cache, NULL, got);
            cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: %s\n%s", clattn_status_string(st), clattn_last_error(),
                         clattn_last_build_log());
            size_t bad = tu_compare(got, ref, rows * E, TU_ATOL, TU_RTOL, msg, sizeof msg);
            cr_expect_eq(bad, 0, "E=%zu row_cache=%d: %zu of %zu differ; %s", E, cache, bad, rows * E, msg);
            bad = oracle_compare(got, y64, rows * E, TU_ATOL, TU_RTOL, msg, sizeof msg);
            cr_expect_eq(bad, 0, "E=%zu row_cache=%d vs float64: %zu of %zu differ; %s", E, cache, bad, rows * E, msg);
            free(got);
        }
        free(x); free(gamma); free(beta); free(ref); free(y64);
    }
}

/* with the residual and a bias, writing the sum too (the pre-norm variant): the sums are the same floats */
Test(layernorm, residual_bias_sum)
{
    const size_t E = 257, rows = 12;
    tu_rng r = {77};
    float *x = malloc(rows * E * sizeof *x), *res = malloc(rows * E * sizeof *res);
    for (size_t i = 0; i < rows * E; i++) x[i] = 1e4f + 1e-2f * gauss(&r), res[i] = 3e-2f * gauss(&r);
    float *bias = tu_random(&r, E, -0.01f, 0.01f), *gamma = tu_random(&r, E, 0.5f, 1.5f);
    float *beta = tu_random(&r, E, -0.5f, 0.5f);
    float *ref = tu_poisoned(rows * E), *ref_sum = tu_poisoned(rows * E);
    cr_assert_eq(clattn_residual_layernorm_rows(ref_dev, rows, E, x, res, bias, gamma, beta, 1e-3f, -1, ref_sum, ref),
                 CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    /* the sums are x + res + bias in float; the normalised rows are LayerNorm of those floats */
    for (size_t i = 0; i < rows * E; i++) {
        const double want = (double)x[i] + res[i] + bias[i % E];
        cr_assert(fabs(ref_sum[i] - want) <= 2e-3, "sum %zu: %.9g, float64 %.9g", i, ref_sum[i], want);
    }
    double *y64 = layernorm64(ref_sum, rows, E, gamma, beta, 1e-3);
    char msg64[256];
    cr_assert_eq(oracle_compare(ref, y64, rows * E, TU_ATOL, TU_RTOL, msg64, sizeof msg64), 0, "ref vs float64: %s",
                 msg64);
    for (int cache = -1; cache <= 1; cache++) {
        float *got = tu_poisoned(rows * E), *sum = tu_poisoned(rows * E);
        clattn_status st = clattn_residual_layernorm_rows(cl_dev, rows, E, x, res, bias, gamma, beta, 1e-3f, cache, sum, got);
        cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(memcmp(sum, ref_sum, rows * E * sizeof *sum), 0, "row_cache=%d: the sums differ", cache);
        char msg[256];
        size_t bad = tu_compare(got, ref, rows * E, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_expect_eq(bad, 0, "row_cache=%d: %zu of %zu differ; %s", cache, bad, rows * E, msg);
        bad = oracle_compare(got, y64, rows * E, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_expect_eq(bad, 0, "row_cache=%d vs float64: %zu of %zu differ; %s", cache, bad, rows * E, msg);
        free(got);
        free(sum);
    }
    free(y64);
    cr_assert_eq(clattn_residual_layernorm_rows(cl_dev, rows, E, x, res, bias, gamma, beta, NAN, -1, NULL, ref),
                 CLATTN_STATUS_INVALID_ARGUMENT);
    free(x); free(res); free(bias); free(gamma); free(beta); free(ref); free(ref_sum);
}

/* Under a device's loop limit (lowered here to a few dozen: Mesa 22's llvmpipe ends a work-item's loops after 65,535),
 * a LayerNorm variant whose work-items would loop past it is refused with the limit named, and one within it computes
 * the right rows: E = 1000 over 256 work-items is 4 + 4 + 4 (+ 4 to cache the row) trips and 16 halvings. */
Test(layernorm, loop_limit)
{
    const size_t E = 1000, rows = 3;
    tu_rng r = {78};
    float *x = tu_random(&r, rows * E, -2.0f, 2.0f), *gamma = tu_random(&r, E, 0.5f, 1.5f);
    float *beta = tu_random(&r, E, -0.5f, 0.5f);
    double *y64 = layernorm64(x, rows, E, gamma, beta, 1e-5);
    const size_t limit = cl_dev->caps.loop_limit;
    cl_dev->caps.loop_limit = 33;
    const size_t budget = clattn_loop_budget(&cl_dev->caps);
    int refused = 0;
    for (int cache = 0; cache <= 1; cache++) {
        float *got = tu_poisoned(rows * E);
        clattn_test_trips_reach(1);
        const clattn_status st =
            clattn_residual_layernorm_rows(cl_dev, rows, E, x, NULL, NULL, gamma, beta, 1e-5f, cache, NULL, got);
        if (st != CLATTN_STATUS_SUCCESS) {
            cr_assert_eq(st, CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "row_cache=%d: %s", cache, clattn_last_error());
            cr_assert(strstr(clattn_last_error(), "residual_layernorm") && strstr(clattn_last_error(), "E = 1000") &&
                      strstr(clattn_last_error(), "loops after 33 "), "%s", clattn_last_error());
            for (size_t i = 0; i < rows * E; i++) cr_assert(isnan(got[i]), "row_cache=%d: refused, but written", cache);
            refused++;
        } else {
            const size_t reach = clattn_test_trips_reach(0);
            cr_assert(reach > 0 && reach <= budget, "row_cache=%d: work-items of %zu loop iterations, budget %zu",
                      cache, reach, budget);
            char msg[256];
            const size_t bad = oracle_compare(got, y64, rows * E, TU_ATOL, TU_RTOL, msg, sizeof msg);
            cr_assert_eq(bad, 0, "row_cache=%d vs float64: %zu of %zu differ; %s", cache, bad, rows * E, msg);
        }
        free(got);
    }
    cr_assert_geq(refused, 1, "the row-caching variant's 32 trips should be past the budget of %zu", budget);
    cl_dev->caps.loop_limit = limit;
    free(x), free(gamma), free(beta), free(y64);
}

/* ---------------------------------------------------------------- validation */

static void expect_refused(clattn_device *dev, const clattn_encoder_desc *d, const clattn_encoder_weights *w,
                           clattn_status want, const char *needle, const char *what)
{
    clattn_encoder_plan *plan = (clattn_encoder_plan *)&plan; /* not NULL: must come back NULL */
    clattn_status st = tu_encoder_plan_create(dev, d, w, &plan);
    cr_assert_eq(st, want, "%s: got %s (%s), expected %s", what, clattn_status_string(st), clattn_last_error(),
                 clattn_status_string(want));
    cr_assert_null(plan, "%s: *plan not NULL after a failure", what);
    cr_assert(strstr(clattn_last_error(), needle), "%s: message '%s' does not mention '%s'", what, clattn_last_error(),
              needle);
}

Test(encoder_validation, plan_arguments)
{
    const config cfg = {2, 5, 6, 2, 13, 0, 0, 1, CLATTN_ACTIVATION_RELU, CLATTN_LAYOUT_LINEAR};
    problem p;
    make_problem(&p, &cfg, 9);
    clattn_device *dev = tu_open_ref();
    cr_assert_eq(tu_encoder_plan_create(dev, &p.d, &p.w, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    expect_refused(NULL, &p.d, &p.w, CLATTN_STATUS_INVALID_ARGUMENT, "device", "NULL device");
    expect_refused(dev, NULL, &p.w, CLATTN_STATUS_INVALID_ARGUMENT, "desc", "NULL desc");
    expect_refused(dev, &p.d, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "weights", "NULL weights");

    clattn_encoder_desc d;
    clattn_encoder_weights w;
#define REFUSED(edit, want, needle)                     \
    do {                                                \
        d = p.d, w = p.w;                               \
        edit;                                           \
        expect_refused(dev, &d, &w, want, needle, #edit); \
    } while (0)
    REFUSED(d.attn.cross = 1, CLATTN_STATUS_INVALID_ARGUMENT, "cross");
    REFUSED(d.attn.dropout = 0.1f, CLATTN_STATUS_UNSUPPORTED, "eval mode");
    REFUSED(d.attn.dropout = NAN, CLATTN_STATUS_INVALID_ARGUMENT, "dropout");
    REFUSED(d.attn.attn_mask = CLATTN_MASK_BOOL, CLATTN_STATUS_INVALID_ARGUMENT, "attn_mask");
    REFUSED(d.ff_dim = 0, CLATTN_STATUS_INVALID_ARGUMENT, "ff_dim");
    REFUSED(d.activation = (clattn_activation)7, CLATTN_STATUS_INVALID_ARGUMENT, "activation");
    REFUSED(d.norm_first = 2, CLATTN_STATUS_INVALID_ARGUMENT, "norm_first");
    REFUSED(d.norm_first = -1, CLATTN_STATUS_INVALID_ARGUMENT, "norm_first");
    REFUSED(d.eps = NAN, CLATTN_STATUS_INVALID_ARGUMENT, "eps");
    REFUSED(d.eps = INFINITY, CLATTN_STATUS_INVALID_ARGUMENT, "eps");
    REFUSED(d.eps = -1e-5f, CLATTN_STATUS_INVALID_ARGUMENT, "eps");
    REFUSED(w.attn.w_out = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "w_out");
    REFUSED(d.attn.out_dim = 0, CLATTN_STATUS_SHAPE_MISMATCH, "out_dim");
    REFUSED(d.attn.out_dim = 7, CLATTN_STATUS_SHAPE_MISMATCH, "out_dim");
    REFUSED(w.ln1_weight = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "ln1_weight");
    REFUSED(w.ln1_bias = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "ln1_bias");
    REFUSED(w.w_ff1 = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "w_ff1");
    REFUSED(w.b_ff1 = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "b_ff1");
    REFUSED(w.w_ff2 = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "w_ff2");
    REFUSED(w.b_ff2 = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "b_ff2");
    REFUSED(w.ln2_weight = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "ln2_weight");
    REFUSED(w.ln2_bias = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "ln2_bias");
    /* the self-attention's own checks, passed through with their detail */
    REFUSED(d.attn.batch = 0, CLATTN_STATUS_INVALID_ARGUMENT, "self-attention: batch");
    REFUSED(d.attn.heads = 0, CLATTN_STATUS_INVALID_ARGUMENT, "heads");
    REFUSED(w.attn.w_key = NULL, CLATTN_STATUS_INVALID_ARGUMENT, "w_key");
    REFUSED(d.attn.layout = (clattn_layout)5, CLATTN_STATUS_INVALID_ARGUMENT, "layout");
    REFUSED(d.attn.causal = 2, CLATTN_STATUS_INVALID_ARGUMENT, "causal");
    REFUSED(d.attn.seq_kv = 3, CLATTN_STATUS_SHAPE_MISMATCH, "seq_kv");
    REFUSED(d.ff_dim = SIZE_MAX / 2, CLATTN_STATUS_SIZE_OVERFLOW, "overflow");
#undef REFUSED

    /* eps 0 is the default 1e-5: the same output */
    d = p.d;
    d.eps = 0.0f;
    float *o0 = run_on(dev, &(problem){.d = d, .w = p.w, .x = p.x, .kpm = p.kpm, .n = p.n});
    d.eps = 1e-5f;
    float *o1 = run_on(dev, &(problem){.d = d, .w = p.w, .x = p.x, .kpm = p.kpm, .n = p.n});
    cr_assert_eq(memcmp(o0, o1, p.n * sizeof *o0), 0);
    double *w64 = malloc(p.n * sizeof *w64);
    cr_assert_not_null(w64);
    cr_assert_eq(oracle_encoder(&d, &p.w, p.x, p.kpm, w64), 0);
    char msg[256];
    cr_assert_eq(oracle_compare(o0, w64, p.n, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "eps 0 vs float64: %s", msg);
    free(w64);
    free(o0);
    free(o1);
    clattn_device_free(dev);
    free_problem(&p);
}

Test(encoder_validation, too_large_for_device)
{
    const config cfg = {2, 4, 6, 2, 13, 0, 0, 0, CLATTN_ACTIVATION_RELU, CLATTN_LAYOUT_LINEAR};
    problem p;
    make_problem(&p, &cfg, 10);
    clattn_device *dev = open_cl();
    clattn_encoder_desc d = p.d;
    d.ff_dim = (size_t)1 << 31; /* B*T*F floats: 64 GiB; the weights are never read */
    expect_refused(dev, &d, &p.w, CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "max allocation", "huge ff_dim on OpenCL");
    d = p.d;
    d.attn.dropout = 0.2f;
    expect_refused(dev, &d, &p.w, CLATTN_STATUS_UNSUPPORTED, "dropout", "dropout on OpenCL");
    clattn_device_free(dev);
    free_problem(&p);
}

static void execute_errors(clattn_device *dev)
{
    const config cfg = {2, 3, 4, 2, 9, 1, 0, 1, CLATTN_ACTIVATION_GELU, CLATTN_LAYOUT_LINEAR};
    problem p;
    make_problem(&p, &cfg, 11);
    clattn_encoder_plan *plan = NULL;
    cr_assert_eq(tu_encoder_plan_create(dev, &p.d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *out = malloc(p.n * sizeof *out);
    for (size_t i = 0; i < p.n; i++) out[i] = 7.0f;
    clattn_encoder_args a = {.x = p.x, .key_padding_mask = p.kpm, .out = out};
    cr_assert_eq(tu_encoder_plan_execute(NULL, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_encoder_plan_execute(plan, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    a.x = NULL;
    cr_assert_eq(tu_encoder_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "args.x"));
    a.x = p.x;
    a.key_padding_mask = NULL;
    cr_assert_eq(tu_encoder_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "key_padding_mask"));
    for (size_t i = 0; i < p.n; i++) cr_assert_eq(out[i], 7.0f, "out written by a refused call");
    a.key_padding_mask = p.kpm;
    a.out = NULL;
    cr_assert_eq(tu_encoder_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_encoder_buffers b = {0};
    cr_assert_eq(clattn_encoder_plan_execute_buffers(NULL, &b, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, NULL, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    if (clattn_device_backend(dev) == CLATTN_BACKEND_REF)
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_UNSUPPORTED);
    else
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_encoder_plan_free(plan);
    clattn_encoder_plan_free(NULL);
    free(out);
    free_problem(&p);
}

Test(encoder_validation, execute_arguments_ref)
{
    clattn_device *dev = tu_open_ref();
    execute_errors(dev);
    clattn_device_free(dev);
}

Test(encoder_validation, execute_arguments_opencl)
{
    clattn_device *dev = open_cl();
    execute_errors(dev);
    clattn_device_free(dev);
}

/* Every host allocation (and on OpenCL every buffer) of plan creation and execution made to fail in turn:
 * each failure is reported, *plan stays NULL or the plan is freeable, and out is never written. */
static void fault_walk(int opencl, int buffers, int norm_first)
{
    clattn_device *dev = opencl ? tu_open_opencl() : tu_open_ref();
    const config cfg = {2, 3, 6, 2, 7, norm_first, 0, 1, CLATTN_ACTIVATION_RELU, CLATTN_LAYOUT_RAW};
    problem p;
    make_problem(&p, &cfg, 12);
    /* the successful call that ends the walk must give the float64 oracle's output */
    double *want = malloc(p.n * sizeof *want);
    cr_assert_not_null(want);
    cr_assert_eq(oracle_encoder(&p.d, &p.w, p.x, p.kpm, want), 0);
    float *out = malloc(p.n * sizeof *out);
    int failures = 0;
    for (long n = 1;; n++) {
        cr_assert(n < 500, "the walk does not end");
        for (size_t i = 0; i < p.n; i++) out[i] = 7.0f;
        clattn_test_fail_nth_alloc(buffers ? 0 : n, buffers ? n : 0);
        clattn_encoder_plan *plan = NULL;
        clattn_status st = tu_encoder_plan_create(dev, &p.d, &p.w, &plan);
        if (st == CLATTN_STATUS_SUCCESS) {
            clattn_encoder_args a = {.x = p.x, .key_padding_mask = p.kpm, .out = out};
            st = tu_encoder_plan_execute(plan, &a);
        } else {
            cr_assert_null(plan);
        }
        int fired = clattn_test_alloc_fault_fired();
        clattn_test_fail_nth_alloc(0, 0);
        clattn_encoder_plan_free(plan);
        if (!fired) {
            cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "N=%ld: %s", n, clattn_last_error());
            char msg[256];
            cr_assert_eq(oracle_compare(out, want, p.n, TU_ATOL, TU_RTOL, msg, sizeof msg), 0,
                         "the call after the walk: %s", msg);
            break;
        }
        failures++;
        cr_assert(st == CLATTN_STATUS_OUT_OF_HOST_MEMORY || st == CLATTN_STATUS_DEVICE_ALLOCATION,
                  "N=%ld: %s (%s)", n, clattn_status_string(st), clattn_last_error());
        for (size_t i = 0; i < p.n; i++) cr_assert_eq(out[i], 7.0f, "N=%ld: out written on failure", n);
    }
    cr_assert(failures >= 10, "only %d allocations were walked", failures);
    free(out);
    free(want);
    free_problem(&p);
    clattn_device_free(dev);
}

Test(encoder_faults, host_allocations_ref)
{
    fault_walk(0, 0, 0);
    fault_walk(0, 0, 1);
}
Test(encoder_faults, host_allocations_opencl) { fault_walk(1, 0, 0); }
Test(encoder_faults, device_buffers_opencl) { fault_walk(1, 1, 1); }

/* ---------------------------------------------------------------- the CLI */

static char root[64], in_dir[128], out_dir[128], err_path[128];

static void rm_rf(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_rf(sub);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static void cli_setup(void)
{
    snprintf(root, sizeof root, "/tmp/clattn_test_encoder_XXXXXX");
    cr_assert(mkdtemp(root), "mkdtemp failed");
    snprintf(in_dir, sizeof in_dir, "%s/in", root);
    snprintf(out_dir, sizeof out_dir, "%s/out", root);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", root);
    cr_assert(mkdir(in_dir, 0700) == 0 && mkdir(out_dir, 0700) == 0);
}

static void cli_teardown(void)
{
    if (strncmp(root, "/tmp/clattn_test_encoder_", 25) == 0) rm_rf(root);
}

static const char *path_in(const char *dir, const char *file)
{
    static char bufs[4][1024];
    static int k;
    char *p = bufs[k++ % 4];
    snprintf(p, 1024, "%s/%s", dir, file);
    return p;
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    cr_assert(a && b, "copy %s -> %s", from, to);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) cr_assert_eq(fwrite(buf, 1, n, b), n);
    fclose(a);
    fclose(b);
}

/* the fixture's input files (not meta.txt, not expect_out.npy) into in_dir */
static void copy_case(const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", ENCODER_DIR, name);
    for (int i = 0; i < N_FILES; i++) {
        if (i == EXPECT) continue;
        char f[64];
        snprintf(f, sizeof f, "%s.npy", files[i]);
        if (access(path_in(dir, f), F_OK) == 0) copy_file(path_in(dir, f), path_in(in_dir, f));
    }
}

/* Run `clattn encoder ARGS...`; stderr into *err (malloc'd). Returns the exit status. */
static int run_cli(const char *const *args, char **err)
{
    const char *argv[48];
    int n = 0;
    argv[n++] = CLATTN_CLI_PATH;
    argv[n++] = "encoder";
    for (; *args; args++) argv[n++] = *args;
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) { /* no allocation up to the exec: testutil.h's tu_env_with says why */
        int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fo = open("/dev/null", O_WRONLY);
        if (fe < 0 || fo < 0 || dup2(fe, 2) < 0 || dup2(fo, 1) < 0) _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    FILE *f = fopen(err_path, "rb");
    char *text = calloc(1, 8192);
    if (f) {
        size_t got = fread(text, 1, 8191, f);
        text[got] = '\0';
        fclose(f);
    }
    *err = text;
    if (getenv("CLATTN_CORE")) { /* the per-core entries: the CLI's note that CLATTN_CORE does nothing for a plan */
        const char *note = "clattn encoder: note: CLATTN_CORE=";
        for (char *l = strstr(text, note); l; l = strstr(text, note)) {
            char *end = strchr(l, '\n');
            memmove(l, end ? end + 1 : l + strlen(l), strlen(end ? end + 1 : l + strlen(l)) + 1);
        }
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const char *cl_spec(void) { return tu_opencl_spec(); }

static void check_out(const char *what, const float *expect, size_t count, int ndim, const size_t *shape)
{
    clattn_npy o = {0};
    char err[256];
    cr_assert_eq(clattn_npy_load(path_in(out_dir, "out.npy"), &o, err, sizeof err), 0, "%s: out.npy: %s", what, err);
    cr_assert_eq(o.ndim, ndim, "%s: out.npy has %d dimensions", what, o.ndim);
    for (int i = 0; i < ndim; i++) cr_assert_eq(o.shape[i], shape[i], "%s: out.npy dimension %d", what, i);
    cr_assert_eq(o.count, count);
    char msg[256];
    size_t bad = tu_compare(o.data, expect, count, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_expect_eq(bad, 0, "%s: %zu of %zu differ; %s", what, bad, count, msg);
    clattn_npy_free(&o);
    unlink(path_in(out_dir, "out.npy"));
}

TestSuite(encoder_cli, .init = cli_setup, .fini = cli_teardown);

Test(encoder_cli, fixture_roundtrip)
{
    const char *cases[][6] = {{"enc_pre_kpm_causal", "5", "gelu", "1e-05", "--causal", "--norm-first"},
                              {"tut004_encoder", "2", "relu", "1e-5", NULL, NULL},
                              {"enc_eps", "2", "relu", "0.01", NULL, NULL}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        enc_case c;
        case_load(cases[k][0], &c);
        const char *specs[] = {"ref", cl_spec()};
        for (int s = 0; s < 2; s++) {
            const char *args[20] = {"--in", path_in(ENCODER_DIR, cases[k][0]), "--out", out_dir, "--heads", cases[k][1],
                                    "--activation", cases[k][2], "--eps", cases[k][3], "--device", specs[s]};
            int n = 12;
            for (int f = 4; f < 6; f++)
                if (cases[k][f]) args[n++] = cases[k][f];
            char *err;
            int rc = run_cli(args, &err);
            cr_assert_eq(rc, 0, "%s on %s: exit %d: %s", cases[k][0], specs[s], rc, err);
            cr_assert_eq(err[0], '\0', "%s on %s: stderr: %s", cases[k][0], specs[s], err);
            free(err);
            char what[128];
            snprintf(what, sizeof what, "%s on %s", cases[k][0], specs[s]);
            check_out(what, c.a[EXPECT].data, c.a[EXPECT].count, 3, c.a[EXPECT].shape);
        }
        case_free(&c);
    }
}

/* x (T, E) of one batch entry, with its key padding mask as (T,) and as (1, T): out.npy is (T, E) */
Test(encoder_cli, two_d_input)
{
    enc_case c;
    case_load("enc_kpm", &c);
    const size_t T = c.a[X].shape[1], E = c.a[X].shape[2];
    const size_t b = 2, xs[2] = {T, E}; /* batch entry 2 masks keys 0, 3 and 6 */
    copy_case("enc_kpm");
    char err[256];
    cr_assert_eq(clattn_npy_save_f32(path_in(in_dir, "x.npy"), (float *)c.a[X].data + b * T * E, 2, xs, err, sizeof err), 0);
    /* the mask as float32 0/1 would be refused: write uint8 bytes by hand through a tiny npy header */
    for (int form = 0; form < 2; form++) {
        FILE *f = fopen(path_in(in_dir, "key_padding_mask.npy"), "wb");
        char hdr[128];
        int hl = snprintf(hdr, sizeof hdr, "{'descr': '|u1', 'fortran_order': False, 'shape': %s, }",
                          form == 0 ? "(8,)" : "(1, 8)");
        cr_assert_eq(T, 8u);
        int total = 10 + hl + 1, pad = (64 - total % 64) % 64;
        unsigned short len = (unsigned short)(hl + pad + 1);
        fwrite("\x93NUMPY\x01\x00", 1, 8, f);
        fputc(len & 0xFF, f), fputc(len >> 8, f);
        fwrite(hdr, 1, (size_t)hl, f);
        for (int i = 0; i < pad; i++) fputc(' ', f);
        fputc('\n', f);
        fwrite((uint8_t *)c.a[KPM].data + b * T, 1, T, f);
        fclose(f);
        const char *spec = form == 0 ? "ref" : cl_spec();
        char *e;
        int rc = run_cli(ARGS("--in", in_dir, "--out", out_dir, "--heads", "4", "--device", spec), &e);
        cr_assert_eq(rc, 0, "2-D on %s: exit %d: %s", spec, rc, e);
        free(e);
        check_out(spec, (float *)c.a[EXPECT].data + b * T * E, T * E, 2, xs);
    }
    case_free(&c);
}

/* exactly one stderr line "clattn encoder: ..." mentioning needle, exit status want, nothing in --out */
static void bad(const char *what, int want, const char *needle, const char *const *extra)
{
    const char *args[40] = {"--in", in_dir, "--out", out_dir, "--device", "ref"};
    int n = 6;
    for (; *extra; extra++) args[n++] = *extra;
    args[n] = NULL;
    char *err;
    int rc = run_cli(args, &err);
    cr_assert_eq(rc, want, "%s: exit %d, expected %d; stderr: %s", what, rc, want, err);
    cr_assert(strncmp(err, "clattn encoder: ", 16) == 0, "%s: stderr: %s", what, err);
    size_t len = strlen(err);
    cr_assert(err[len - 1] == '\n' && strchr(err, '\n') == err + len - 1, "%s: not one line: [%s]", what, err);
    cr_assert(strstr(err, needle), "%s: stderr does not mention '%s': %s", what, needle, err);
    cr_assert_eq(dir_entries(out_dir), 0, "%s: --out is not empty", what);
    free(err);
}

Test(encoder_cli, bad_inputs)
{
    copy_case("enc_post_relu"); /* B=2, T=7, E=12, H=3, F=37 */
    bad("bad --activation", 2, "--activation", ARGS("--heads", "3", "--activation", "swish"));
    bad("--eps nan", 2, "--eps", ARGS("--heads", "3", "--eps", "nan"));
    bad("--eps 0", 2, "--eps", ARGS("--heads", "3", "--eps", "0"));
    bad("--eps -1", 2, "--eps", ARGS("--heads", "3", "--eps", "-1"));
    bad("--eps 1e-50", 2, "--eps", ARGS("--heads", "3", "--eps", "1e-50"));
    bad("--heads 0", 2, "--heads", ARGS("--heads", "0"));
    bad("--heads twice", 2, "--heads", ARGS("--heads", "3", "--heads", "3"));
    bad("unknown flag", 2, "unknown option '--scale' (see clattn encoder --help)", ARGS("--heads", "3", "--scale", "1"));
    bad("--heads without value", 2, "--heads", ARGS("--causal", "--heads"));
    bad("--heads not dividing", 1, "w_query.npy", ARGS("--heads", "5"));

    /* wrong w_ff2 shape: its transpose */
    clattn_npy w2 = {0};
    char err[256];
    cr_assert_eq(clattn_npy_load(path_in(in_dir, "w_ff2.npy"), &w2, err, sizeof err), 0);
    const size_t ts[2] = {w2.shape[1], w2.shape[0]};
    cr_assert_eq(clattn_npy_save_f32(path_in(in_dir, "w_ff2.npy"), w2.data, 2, ts, err, sizeof err), 0);
    bad("w_ff2 transposed", 1, "w_ff2.npy: shape (37, 12) but expected (12, 37)", ARGS("--heads", "3"));
    const size_t s1[1] = {12 * 37};
    cr_assert_eq(clattn_npy_save_f32(path_in(in_dir, "w_ff2.npy"), w2.data, 1, s1, err, sizeof err), 0);
    bad("w_ff2 1-D", 1, "w_ff2.npy", ARGS("--heads", "3"));
    clattn_npy_free(&w2);
    copy_case("enc_post_relu");

    /* a missing required file */
    unlink(path_in(in_dir, "ln1_weight.npy"));
    bad("missing ln1_weight.npy", 1, "ln1_weight.npy", ARGS("--heads", "3"));
    copy_case("enc_post_relu");
    /* b_ff1 of the wrong length, ln2_bias not float32 */
    const float z[40] = {0};
    const size_t l36[1] = {36};
    cr_assert_eq(clattn_npy_save_f32(path_in(in_dir, "b_ff1.npy"), z, 1, l36, err, sizeof err), 0, "%s", err);
    bad("b_ff1 too short", 1, "b_ff1.npy", ARGS("--heads", "3"));
    copy_case("enc_post_relu");
    /* a mask of the wrong shape */
    const size_t m[2] = {2, 6};
    cr_assert_eq(clattn_npy_save_f32(path_in(in_dir, "key_padding_mask.npy"), z, 2, m, err, sizeof err), 0, "%s", err);
    bad("float32 key_padding_mask", 1, "key_padding_mask.npy", ARGS("--heads", "3"));
    /* a 16-bit one (it was read as bytes before clattn 0.8) */
    const uint16_t h12[12] = {0};
    char tmp[600];
    cr_assert_eq(clattn_npy_save_temp(path_in(in_dir, "key_padding_mask.npy"), CLATTN_NPY_F16, h12, 2, m, tmp,
                                      sizeof tmp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rename(tmp, path_in(in_dir, "key_padding_mask.npy")), 0);
    bad("float16 key_padding_mask", 1, "key_padding_mask.npy: dtype float16 but expected bool or uint8",
        ARGS("--heads", "3"));
    unlink(path_in(in_dir, "key_padding_mask.npy"));
    /* unsupported extra inputs are named, not ignored */
    cr_assert_eq(clattn_npy_save_f32(path_in(in_dir, "attn_mask.npy"), z, 1, l36, err, sizeof err), 0, "%s", err);
    bad("attn_mask.npy present", 1, "attn_mask.npy", ARGS("--heads", "3"));
    unlink(path_in(in_dir, "attn_mask.npy"));
    /* directories */
    const char *nope = path_in(root, "nope");
    const char *args1[] = {"--in", nope, "--out", out_dir, NULL};
    char *e;
    cr_assert_eq(run_cli(args1, &e), 1);
    cr_assert(strncmp(e, "clattn encoder: --in", 20) == 0, "%s", e);
    free(e);
    const char *args2[] = {"--in", in_dir, NULL};
    cr_assert_eq(run_cli(args2, &e), 2);
    cr_assert(strstr(e, "--out"), "%s", e);
    free(e);
    /* a device spec that cannot be parsed (2), one that matches nothing (1) */
    const char *args3[] = {"--in", in_dir, "--out", out_dir, "--heads", "3", "--device", "bogus", NULL};
    cr_assert_eq(run_cli(args3, &e), 2, "%s", e);
    cr_assert(strncmp(e, "clattn encoder: --device", 24) == 0, "%s", e);
    free(e);
    cr_assert_eq(dir_entries(out_dir), 0);
}

/* ---------------------------------------------------------------- half-precision layers (desc.attn.dtype) */

/* A layer of type t (F16, BF16): every weight and x in the type, out in it: bit for bit the fp32 layer on the same
 * rounded values, rounded once, on ref and OpenCL, from host arrays and (OpenCL) from buffers at offsets. */
static void half_layer(clattn_device *dev, const config *cfg, clattn_dtype t, uint64_t seed)
{
    problem p;
    make_problem(&p, cfg, seed);
    const size_t E = cfg->E, F = cfg->F, H = cfg->H, dh = (E + H - 1) / H;
    const size_t counts[17] = {H * dh * E, H * dh * E, H * dh * E, H * dh, H * dh, H * dh, E * H * dh, E, E, E,
                               F * E, F, E * F, E, E, E, p.n}; /* p.bufs in make_problem's order, x last */
    cr_assert_eq(p.nb, 17);
    for (int i = 0; i < 17; i++)
        for (size_t j = 0; j < counts[i]; j++) p.bufs[i][j] = (float)tu_dtype_round(p.bufs[i][j], t);
    float *want = run_on(dev, &p);
    /* the same problem in the type */
    clattn_encoder_desc d = p.d;
    d.attn.dtype = t;
    void *typed[17];
    for (int i = 0; i < 17; i++) typed[i] = tu_typed(p.bufs[i], counts[i], t);
    clattn_encoder_weights w = {0};
    const void **slots[16] = {&w.attn.w_query, &w.attn.w_key, &w.attn.w_value, &w.attn.b_query, &w.attn.b_key,
                              &w.attn.b_value, &w.attn.w_out, &w.attn.b_out, &w.ln1_weight, &w.ln1_bias, &w.w_ff1,
                              &w.b_ff1, &w.w_ff2, &w.b_ff2, &w.ln2_weight, &w.ln2_bias};
    for (int i = 0; i < 16; i++) *slots[i] = typed[i];
    clattn_encoder_plan *plan = NULL;
    cr_assert_eq(tu_encoder_plan_create(dev, &d, &w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    uint16_t *got = tu_poisoned_typed(p.n, t);
    clattn_encoder_args a = {.x = typed[16], .key_padding_mask = p.kpm, .out = got};
    cr_assert_eq(tu_encoder_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t i = 0; i < p.n; i++)
        cr_assert_eq(got[i], tu_dtype_bits((float)tu_dtype_round(want[i], t), t),
                     "dtype %d on %s, out[%zu]: %g, the fp32 layer's %g", (int)t, clattn_device_name(dev), i,
                     (double)tu_dtype_value(got[i], t), (double)want[i]);
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL) { /* a fresh plan: nothing staged by the host call */
        clattn_encoder_plan_free(plan);
        plan = NULL;
        cr_assert_eq(tu_encoder_plan_create(dev, &d, &w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cl_context ctx = clattn_device_context(dev);
        cl_command_queue q = clattn_device_queue(dev);
        const size_t xo = 3, oo = 5, N = cfg->B * cfg->T;
        cl_int e;
        cl_mem bx = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (xo + p.n) * 2, NULL, &e);
        cl_mem bo = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (oo + p.n) * 2, NULL, &e);
        cl_mem bm = p.kpm ? clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &e) : NULL;
        cr_assert_eq(clEnqueueWriteBuffer(q, bx, CL_TRUE, xo * 2, p.n * 2, typed[16], 0, NULL, NULL), CL_SUCCESS);
        if (bm) cr_assert_eq(clEnqueueWriteBuffer(q, bm, CL_TRUE, 0, N, p.kpm, 0, NULL, NULL), CL_SUCCESS);
        const clattn_encoder_buffers b = {.x = {bx, xo}, .key_padding_mask = {bm, 0}, .out = {bo, oo}};
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        uint16_t *gb = malloc(p.n * 2);
        cr_assert_eq(clEnqueueReadBuffer(q, bo, CL_TRUE, oo * 2, p.n * 2, gb, 0, NULL, NULL), CL_SUCCESS);
        cr_assert(memcmp(gb, got, p.n * 2) == 0, "dtype %d: the layer on buffers differs from host arrays", (int)t);
        free(gb);
        clReleaseMemObject(bx), clReleaseMemObject(bo);
        if (bm) clReleaseMemObject(bm);
    }
    clattn_encoder_plan_free(plan);
    for (int i = 0; i < 17; i++) free(typed[i]);
    free(got), free(want);
    free_problem(&p);
}

Test(encoder_opencl, half_types)
{
    const config cfgs[] = {
        {2, 7, 9, 3, 28, 0, 1, 1, CLATTN_ACTIVATION_GELU, CLATTN_LAYOUT_LINEAR},
        {1, 13, 16, 2, 20, 1, 0, 0, CLATTN_ACTIVATION_RELU, CLATTN_LAYOUT_RAW},
    };
    clattn_device *devs[2] = {ref_dev, cl_dev};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
            for (int t = 1; t <= 2; t++) half_layer(devs[k], &cfgs[i], (clattn_dtype)t, 900 + 10 * i + t);
}
