/* test_decode.c: grouped-query attention, sliding windows, half-precision keys/values and decoding
 * over a KV cache, on ref and on the OpenCL device, against the float64 oracle (tests/oracle.c),
 * which computes a plain causal run over the whole sequence from the definitions.
 *   attention    ordinary plans with kv_heads, window, kv_half: both algorithms
 *   decode       prefill + one decode step per token = one causal run; appends in uneven chunks;
 *                sequences of different lengths in one batch; truncation; split-K forced to 1..64
 *                parts (empty parts included); the cache read back; every validation error
 *   accept       a verify step's draft tree and clattn_kv_cache_accept (speculative decoding)
 *   codes        int8 caches: the codes and scales on both paths, decoding over them
 *                (accept and codes: the ctest entry test_decode_verify; the plain entry runs the other suites)
 *   edges        capacities exactly at their boundary with the neighbours read back (appends, padding rows,
 *                truncation, writes); every refused call and every failed allocation of a call leaves the
 *                lengths, the cache and the output as they were; writes round to half as appends do; split-K
 *                with every score far below zero
 * kv_half cases use dyadic inputs (x in units of 2^-6, weights of 2^-10, E = 16) so that every
 * projection is exact in float: the half rounding of the library and the oracle's then see the same
 * value, and the comparison is of the rounding itself, not of float summation order. */
#include "cores/core.h"
#include "decode/decode.h"
#include "runtime/runtime.h"
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct model {
    size_t E, H, HK, dk, dv, Eo;
    float scale; /* 0: 1/sqrt(dk) */
    clattn_rope rope; /* rotary embeddings (kind NONE: none) */
    float *wq, *wk, *wv, *bq, *bk, *bv, *wo, *bo;
    clattn_attention_weights w;
} model;

/* A value in [-1, 1]: uniform, or a multiple of 2^-bits (dyadic). */
static float val(tu_rng *r, int dyadic, int bits, float scale)
{
    const float u = tu_uniform(r, -1.0f, 1.0f);
    if (!dyadic) return u * scale;
    return ldexpf(nearbyintf(ldexpf(u, bits)), -bits);
}

static float *vals(tu_rng *r, size_t n, int dyadic, int bits, float scale)
{
    float *a = malloc(n * sizeof *a);
    for (size_t i = 0; i < n; i++) a[i] = val(r, dyadic, bits, scale);
    return a;
}

static void model_make(model *m, tu_rng *r, size_t E, size_t H, size_t HK, size_t dk, size_t dv, int dyadic)
{
    memset(m, 0, sizeof *m);
    m->E = E, m->H = H, m->HK = HK, m->dk = dk, m->dv = dv, m->Eo = 13;
    const float s = 1.5f / sqrtf((float)E);
    m->wq = vals(r, H * dk * E, dyadic, 10, s);
    m->wk = vals(r, HK * dk * E, dyadic, 10, s);
    m->wv = vals(r, HK * dv * E, dyadic, 10, s);
    m->bq = vals(r, H * dk, dyadic, 10, 0.3f);
    m->bk = vals(r, HK * dk, dyadic, 10, 0.3f);
    m->bv = vals(r, HK * dv, dyadic, 10, 0.3f);
    m->wo = vals(r, m->Eo * H * dv, 0, 0, 0.4f);
    m->bo = vals(r, m->Eo, 0, 0, 0.2f);
    m->w = (clattn_attention_weights){.w_query = m->wq, .w_key = m->wk, .w_value = m->wv, .b_query = m->bq,
                                      .b_key = m->bk, .b_value = m->bv, .w_out = m->wo, .b_out = m->bo};
}

static void model_free(model *m)
{
    free(m->wq), free(m->wk), free(m->wv), free(m->bq), free(m->bk), free(m->bv), free(m->wo), free(m->bo);
}

static clattn_attention_desc model_desc(const model *m, size_t B, size_t T, size_t window, int half)
{
    return (clattn_attention_desc){.batch = B, .seq_q = T, .embed = m->E, .heads = m->H, .kv_heads = m->HK,
                                   .head_dim_qk = m->dk, .head_dim_v = m->dv, .out_dim = m->Eo, .causal = 1,
                                   .window = window, .kv_half = half, .scale = m->scale, .rope = m->rope};
}

/* The oracle's causal run over x (B, T, E), under rope row t of entry b at pos[b*T + t] (pos NULL: at t). */
static double *expect_at(const model *m, size_t B, size_t T, size_t window, int half, const float *x,
                         const uint32_t *pos)
{
    clattn_attention_desc d = model_desc(m, B, T, window, half);
    double *want = malloc(B * T * m->Eo * sizeof *want);
    clattn_attention_args a = {.x = x, .rope_positions = pos, .rope_positions_count = pos ? B * T : 0};
    cr_assert_eq(oracle_attention(&d, &m->w, &a, want, NULL), 0);
    return want;
}

static double *expect(const model *m, size_t B, size_t T, size_t window, int half, const float *x)
{
    return expect_at(m, B, T, window, half, x, NULL);
}

static void check(const float *got, const double *want, size_t n, const char *what)
{
    char msg[300];
    size_t bad = oracle_compare(got, want, n, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s: %zu of %zu elements differ; first: %s", what, bad, n, msg);
}

/* ---------------------------------------------------------------- ordinary plans */

static void plan_case(clattn_device *dev, clattn_algorithm alg, size_t B, size_t T, size_t H, size_t HK,
                      size_t dk, size_t dv, size_t window, int half, uint64_t seed)
{
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL && !tu_core_applies(alg, 0)) return;
    tu_rng r = {seed};
    model m;
    const size_t E = half ? 16 : 24;
    model_make(&m, &r, E, H, HK, dk, dv, half);
    float *x = vals(&r, B * T * E, half, 6, 1.0f);
    clattn_attention_desc d = model_desc(&m, B, T, window, half);
    d.algorithm = alg;
    clattn_plan *p = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL) cr_assert_eq(clattn_plan_algorithm(p), alg);
    float *out = tu_poisoned(B * T * m.Eo);
    clattn_attention_args a = {.x = x, .out = out};
    cr_assert_eq(tu_plan_execute(p, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    double *want = expect(&m, B, T, window, half, x);
    char what[160];
    snprintf(what, sizeof what, "%s B=%zu T=%zu H=%zu HK=%zu dk=%zu dv=%zu W=%zu half=%d",
             clattn_algorithm_name(alg), B, T, H, HK, dk, dv, window, half);
    check(out, want, B * T * m.Eo, what);
    clattn_plan_free(p);
    free(x), free(out), free(want);
    model_free(&m);
}

static void plan_cases(clattn_device *dev, clattn_algorithm alg)
{
    uint64_t seed = 100;
    plan_case(dev, alg, 2, 61, 4, 2, 8, 8, 0, 0, seed++);     /* GQA */
    plan_case(dev, alg, 1, 130, 6, 1, 16, 8, 0, 0, seed++);   /* multi-query, dk != dv */
    plan_case(dev, alg, 2, 61, 4, 4, 8, 8, 7, 0, seed++);     /* window */
    plan_case(dev, alg, 1, 130, 8, 2, 16, 16, 33, 0, seed++); /* GQA + window across blocks */
    plan_case(dev, alg, 2, 37, 4, 2, 8, 20, 0, 1, seed++);    /* half K/V (dv 20: two float8 pieces and 4) */
    plan_case(dev, alg, 1, 61, 4, 1, 8, 4, 5, 1, seed++);     /* all three */
    plan_case(dev, alg, 3, 1, 2, 1, 4, 4, 1, 0, seed++);      /* T = 1, W = 1 */
}

Test(attention, gqa_window_half_ref)
{
    clattn_device *dev = tu_open_ref();
    plan_cases(dev, CLATTN_ALGORITHM_AUTO);
    clattn_device_free(dev);
}

Test(attention, gqa_window_half_fused)
{
    clattn_device *dev = tu_open_opencl();
    plan_cases(dev, CLATTN_ALGORITHM_FUSED);
    clattn_device_free(dev);
}

Test(attention, gqa_window_half_unfused)
{
    clattn_device *dev = tu_open_opencl();
    plan_cases(dev, CLATTN_ALGORITHM_UNFUSED);
    clattn_device_free(dev);
}

/* ---------------------------------------------------------------- decoding */

typedef struct dcase {
    size_t B, T, H, HK, dk, dv, window, E; /* E = 0: 24 (16 with half) */
    int half;
    int coarse;             /* large scores, computed exactly: see decode_case */
    size_t splits;          /* clattn_decode_plan_set_splits */
    const size_t *chunks;   /* new tokens per call, until T; NULL = prefill P then one by one */
    size_t P;
    size_t page;            /* a paged cache's page size (the pages suite); 0: contiguous */
    clattn_rope rope;       /* rotary embeddings: token t at position t, however the calls cut the tokens */
    int positioned;         /* rope: token t of sequence b at position_of(b, t), given by each step (rope_positions) */
    int buffers;            /* OpenCL: the steps on buffers (clattn_decode_execute_buffers) */
} dcase;

/* A dcase's positions when it gives them: not the cache slots, nor a shift of them (which would change no score):
 * sequence 0 jumps by 1975 after its token 14, odd sequences step by 3. */
static uint32_t position_of(size_t b, size_t t)
{
    return (uint32_t)(b % 2 ? 5 + 3 * t : t < 15 ? 1000 + t : 2990 + t);
}

/* One decode step on the device's buffers (OpenCL): x's rows written to a buffer, the step, out read back. The
 * positions (a host array) are overwritten as soon as the call returns, before the step completes: the call must
 * have taken them. */
static void step_on_buffers(clattn_device *dev, clattn_decode_plan *p, clattn_kv_cache *cache, const float *x,
                            size_t xn, float *out, size_t on, size_t n, uint32_t *pos, size_t npos)
{
    cl_context ctx = clattn_device_context(dev);
    cl_command_queue q = clattn_device_queue(dev);
    cl_int err;
    cl_mem xb = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, xn * sizeof(float), (void *)x, &err);
    cl_mem ob = clCreateBuffer(ctx, CL_MEM_READ_WRITE, on * sizeof(float), NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_event gate = clCreateUserEvent(ctx, &err), done = NULL;
    const clattn_decode_buffers bufs = {.x = {xb, 0}, .out = {ob, 0}, .rope_positions = pos,
                                        .rope_positions_count = npos};
    cr_assert_eq(clattn_decode_execute_buffers(p, cache, &bufs, n, NULL, 1, &gate, &done), CLATTN_STATUS_SUCCESS,
                 "on buffers: %s", clattn_last_error());
    for (size_t i = 0; pos && i < npos; i++) pos[i] = 7u * (uint32_t)i; /* (the call is done with them) */
    cr_assert_eq(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS);
    cr_assert_eq(clEnqueueReadBuffer(q, ob, CL_TRUE, 0, on * sizeof(float), out, 0, NULL, NULL), CL_SUCCESS);
    clReleaseEvent(gate), clReleaseEvent(done);
    clReleaseMemObject(xb), clReleaseMemObject(ob);
}

static clattn_kv_cache *make_paged(clattn_device *dev, const model *m, size_t B, size_t cap, int half, size_t page,
                                   size_t pages)
{
    clattn_kv_cache_desc cd = {.batch = B, .capacity = cap, .kv_heads = m->HK, .head_dim_qk = m->dk,
                               .head_dim_v = m->dv, .type = (clattn_kv_type)half, /* half: the cache's type */
                               .page_size = page, .pages = pages};
    clattn_kv_cache *c = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    return c;
}

static clattn_kv_cache *make_cache(clattn_device *dev, const model *m, size_t B, size_t cap, int half)
{
    clattn_kv_cache_desc cd = {.batch = B, .capacity = cap, .kv_heads = m->HK, .head_dim_qk = m->dk,
                               .head_dim_v = m->dv, .type = (clattn_kv_type)half}; /* half: the cache's type */
    clattn_kv_cache *c = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    return c;
}

/* Run x (B, T, E) through a decode plan in the calls the case says; every output row into out. */
static void decode_all(clattn_device *dev, const model *m, const dcase *c, const float *x, float *out)
{
    const size_t B = c->B, T = c->T, E = m->E;
    const size_t maxn = c->chunks ? T : c->P;
    clattn_attention_desc d = model_desc(m, B, maxn, c->window, c->half);
    d.kv_page_size = c->page;
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, &m->w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_decode_plan_set_splits(p, c->splits), CLATTN_STATUS_SUCCESS);
    clattn_kv_cache *cache = make_paged(dev, m, B, T + 3, c->half, c->page, 0);
    float *xs = malloc(B * maxn * E * sizeof *xs), *os = malloc(B * maxn * m->Eo * sizeof *os);
    uint32_t *ps = c->positioned ? malloc(B * maxn * sizeof *ps) : NULL;
    const int on_buffers = c->buffers && clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL;
    size_t t0 = 0;
    for (size_t call = 0; t0 < T; call++) {
        size_t n = c->chunks ? c->chunks[call] : call == 0 ? c->P : 1;
        if (n > T - t0) n = T - t0;
        for (size_t b = 0; b < B; b++) memcpy(xs + b * n * E, x + (b * T + t0) * E, n * E * sizeof *xs);
        for (size_t i = 0; ps && i < B * n; i++) ps[i] = position_of(i / n, t0 + i % n);
        for (size_t i = 0; i < B * n * m->Eo; i++) os[i] = NAN;
        clattn_decode_args a = {.x = xs, .new_tokens = n, .out = os, .rope_positions = ps};
        if (on_buffers)
            step_on_buffers(dev, p, cache, xs, B * n * E, os, B * n * m->Eo, n, ps, ps ? B * n : 0);
        else
            cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_SUCCESS, "call %zu: %s", call,
                         clattn_last_error());
        if (c->splits > 1 && clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL && n == 1)
            cr_assert_eq(clattn_decode_plan_last_splits(p), c->splits, "split-K did not run with %zu parts", c->splits);
        for (size_t b = 0; b < B; b++)
            memcpy(out + (b * T + t0) * m->Eo, os + b * n * m->Eo, n * m->Eo * sizeof *out);
        t0 += n;
    }
    size_t lens[32];
    cr_assert_eq(clattn_kv_cache_lengths(cache, lens), CLATTN_STATUS_SUCCESS);
    for (size_t b = 0; b < B; b++) cr_assert_eq(lens[b], T);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    free(xs), free(os), free(ps);
}

static void decode_case(clattn_device *dev, const dcase *c, uint64_t seed)
{
    tu_rng r = {seed};
    model m;
    const size_t E = c->E ? c->E : c->coarse ? 8 : c->half ? 16 : 24;
    model_make(&m, &r, E, c->H, c->HK, c->dk, c->dv, c->half || c->coarse);
    m.rope = c->rope;
    float *x = NULL;
    if (c->coarse) {
        /* Scores in the thousands, which only a softmax that subtracts the true running maximum keeps
         * finite: x in halves, projections in quarters, scale 32. Every product and sum is exact in
         * float (and in half for the cache), so the float64 oracle's tolerance still applies. */
        float **w[] = {&m.wq, &m.wk, &m.wv, &m.bq, &m.bk, &m.bv};
        const size_t n[] = {c->H * c->dk * E, c->HK * c->dk * E, c->HK * c->dv * E, c->H * c->dk, c->HK * c->dk,
                            c->HK * c->dv};
        for (size_t i = 0; i < 6; i++) {
            free(*w[i]);
            *w[i] = vals(&r, n[i], 1, 2, 1.0f);
        }
        m.w.w_query = m.wq, m.w.w_key = m.wk, m.w.w_value = m.wv, m.w.b_query = m.bq, m.w.b_key = m.bk,
        m.w.b_value = m.bv;
        m.scale = 32.0f;
        x = vals(&r, c->B * c->T * E, 1, 1, 1.0f);
    } else {
        x = vals(&r, c->B * c->T * E, c->half, 6, 1.0f);
    }
    float *out = tu_poisoned(c->B * c->T * m.Eo);
    decode_all(dev, &m, c, x, out);
    uint32_t *pos = c->positioned ? malloc(c->B * c->T * sizeof *pos) : NULL;
    for (size_t i = 0; pos && i < c->B * c->T; i++) pos[i] = position_of(i / c->T, i % c->T);
    double *want = expect_at(&m, c->B, c->T, c->window, c->half, x, pos);
    char what[200];
    snprintf(what, sizeof what,
             "B=%zu T=%zu H=%zu HK=%zu dk=%zu dv=%zu W=%zu half=%d splits=%zu P=%zu page=%zu%s%s%s%s%s", c->B, c->T,
             c->H, c->HK, c->dk, c->dv, c->window, c->half, c->splits, c->P, c->page,
             c->chunks ? " chunked" : "", c->coarse ? " coarse" : "", c->rope.kind ? " rope" : "",
             c->positioned ? " positioned" : "", c->buffers ? " buffers" : "");
    check(out, want, c->B * c->T * m.Eo, what);
    free(x), free(out), free(want), free(pos);
    model_free(&m);
}

static void decode_cases(clattn_device *dev)
{
    static const size_t uneven[] = {5, 1, 1, 13, 2, 1, 7, 40, 3, 1, 1, 64};
    const dcase cases[] = {
        {.B = 2, .T = 40, .H = 4, .HK = 2, .dk = 8, .dv = 8, .P = 11},                 /* GQA */
        {.B = 1, .T = 61, .H = 4, .HK = 4, .dk = 16, .dv = 8, .P = 1},                 /* MHA, from 1 token */
        {.B = 2, .T = 33, .H = 6, .HK = 1, .dk = 8, .dv = 12, .P = 20},                /* multi-query */
        {.B = 2, .T = 50, .H = 4, .HK = 2, .dk = 8, .dv = 8, .window = 9, .P = 17},    /* window */
        {.B = 1, .T = 45, .H = 32, .HK = 2, .dk = 4, .dv = 4, .P = 30},                /* group of 16 rows */
        {.B = 2, .T = 37, .H = 4, .HK = 2, .dk = 8, .dv = 8, .half = 1, .P = 9},       /* half cache */
        {.B = 1, .T = 41, .H = 4, .HK = 1, .dk = 8, .dv = 4, .window = 6, .half = 1, .P = 3},
        {.B = 2, .T = 130, .H = 4, .HK = 2, .dk = 8, .dv = 8, .chunks = uneven},       /* appends in chunks */
        {.B = 1, .T = 130, .H = 4, .HK = 2, .dk = 8, .dv = 8, .window = 20, .chunks = uneven},
        {.B = 2, .T = 70, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 3, .P = 30},    /* split-K */
        {.B = 1, .T = 90, .H = 8, .HK = 2, .dk = 16, .dv = 16, .splits = 7, .window = 25, .P = 50},
        {.B = 2, .T = 20, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 64, .P = 5},    /* parts without keys */
        {.B = 1, .T = 60, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 5, .half = 1, .P = 31},
        {.B = 1, .T = 40, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 1, .P = 1},
        {.B = 2, .T = 30, .H = 4, .HK = 2, .dk = 5, .dv = 3, .E = 21, .P = 7},         /* odd widths everywhere */
        {.B = 17, .T = 5, .H = 2, .HK = 1, .dk = 4, .dv = 4, .P = 2},                  /* steps of 17 rows: CLBlast */
        {.B = 1, .T = 70, .H = 8, .HK = 2, .dk = 128, .dv = 128, .P = 37},             /* a real model's heads */
        {.B = 2, .T = 45, .H = 8, .HK = 2, .dk = 128, .dv = 64, .half = 1, .splits = 2, .P = 20},
        {.B = 2, .T = 90, .H = 8, .HK = 2, .dk = 16, .dv = 16, .coarse = 1, .P = 41},  /* scores in the thousands */
        {.B = 1, .T = 70, .H = 4, .HK = 1, .dk = 8, .dv = 8, .coarse = 1, .half = 1, .splits = 3, .P = 20},
        /* bfloat16 caches (half = 2, CLATTN_KV_BF16): each vector width of the cache's loads (8, 4, 1) */
        {.B = 2, .T = 37, .H = 4, .HK = 2, .dk = 8, .dv = 8, .half = 2, .P = 9},
        {.B = 1, .T = 41, .H = 4, .HK = 1, .dk = 8, .dv = 4, .window = 6, .half = 2, .P = 3},
        {.B = 2, .T = 45, .H = 8, .HK = 2, .dk = 128, .dv = 64, .half = 2, .splits = 2, .P = 20},
        {.B = 2, .T = 30, .H = 4, .HK = 2, .dk = 5, .dv = 3, .E = 21, .half = 2, .P = 7},
        /* int8 caches (half = 3, CLATTN_KV_INT8, clattn 0.8) through the projections, against the oracle's own
         * quantisation (oracle_int8_rows; dyadic inputs: the same K and V in float): each vector width of the loads */
        {.B = 2, .T = 37, .H = 4, .HK = 2, .dk = 8, .dv = 8, .half = 3, .P = 9},
        {.B = 1, .T = 41, .H = 4, .HK = 1, .dk = 8, .dv = 4, .window = 6, .half = 3, .P = 3},
        {.B = 2, .T = 45, .H = 8, .HK = 2, .dk = 128, .dv = 64, .half = 3, .splits = 2, .P = 20},
        {.B = 2, .T = 30, .H = 4, .HK = 2, .dk = 5, .dv = 3, .E = 21, .half = 3, .P = 7},
        /* rotary embeddings (the prefill's, clattn_rope): token t of every call at position t, its key rotated before
         * it is cached; the plan's table grown past its first length as the steps go (1 token, then 11 per plan row
         * count... up to 130 positions); GQA, the window, half and bfloat16 caches (rounded after the rotation),
         * split-K. int8 caches with rope are int8_cases': their codes of a rotated (inexact) key may differ from the
         * oracle's by one step, so those check the cache read back */
        {.B = 2, .T = 40, .H = 4, .HK = 2, .dk = 8, .dv = 8, .P = 11, .rope = {.kind = CLATTN_ROPE_HALF}},
        {.B = 1, .T = 130, .H = 4, .HK = 2, .dk = 8, .dv = 8, .window = 20, .chunks = uneven,
         .rope = {.kind = CLATTN_ROPE_INTERLEAVED, .dims = 4, .theta = 500.0}},
        {.B = 2, .T = 37, .H = 4, .HK = 2, .dk = 8, .dv = 8, .half = 1, .P = 9,
         .rope = {.kind = CLATTN_ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_YARN, .factor = 4.0,
                  .original_max_position = 16}},
        {.B = 2, .T = 70, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 3, .P = 1,
         .rope = {.kind = CLATTN_ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_NTK, .factor = 2.0}},
        {.B = 1, .T = 70, .H = 8, .HK = 2, .dk = 128, .dv = 128, .P = 37, .rope = {.kind = CLATTN_ROPE_HALF}},
        {.B = 2, .T = 37, .H = 4, .HK = 2, .dk = 8, .dv = 8, .half = 2, .P = 9, /* bfloat16: rounded after the rotation */
         .rope = {.kind = CLATTN_ROPE_INTERLEAVED, .scaling = CLATTN_ROPE_SCALING_LINEAR, .factor = 2.0}},
        /* rope at the positions each step gives (args.rope_positions, clattn 0.8; position_of: a jump, steps of 3):
         * a prompt and single steps, chunks with the window, split-K with a half cache, the steps on buffers (OpenCL;
         * the positions overwritten as the call returns), past the plan's first table (up to position 3119) */
        {.B = 2, .T = 40, .H = 4, .HK = 2, .dk = 8, .dv = 8, .P = 11, .rope = {.kind = CLATTN_ROPE_HALF},
         .positioned = 1},
        {.B = 2, .T = 130, .H = 4, .HK = 2, .dk = 8, .dv = 8, .window = 20, .chunks = uneven, .positioned = 1,
         .buffers = 1, .rope = {.kind = CLATTN_ROPE_INTERLEAVED, .dims = 4, .theta = 500.0}},
        {.B = 2, .T = 70, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 3, .half = 1, .P = 1, .positioned = 1,
         .buffers = 1, .rope = {.kind = CLATTN_ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_NTK, .factor = 2.0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) decode_case(dev, &cases[i], 500 + i);
}

Test(decode, equals_causal_run_ref)
{
    clattn_device *dev = tu_open_ref();
    decode_cases(dev);
    clattn_device_free(dev);
}

Test(decode, equals_causal_run_opencl)
{
    clattn_device *dev = tu_open_opencl();
    decode_cases(dev);
    clattn_device_free(dev);
}

/* The heads as given (desc.separate_value, no weights): each call's new tokens' Q, K and V go in as they are, K and
 * V into the cache. Sequence 0 takes every token; sequence 1 a prompt 3 tokens shorter (args.valid), then the same
 * steps. Each sequence's outputs against the float64 oracle's causal attention over that sequence alone (a cross
 * plan with separate_value over its tokens: the two share no code); the rows past a sequence's tokens are 0. */
static void heads_as_given(clattn_device *dev, size_t T, size_t P, size_t H, size_t HK, size_t dk, size_t dv,
                           size_t window, size_t splits, uint64_t seed, clattn_rope rope)
{
    enum { B = 2 };
    tu_rng r = {seed};
    float *q = tu_random(&r, B * T * H * dk, -2, 2), *k = tu_random(&r, B * T * HK * dk, -2, 2);
    float *v = tu_random(&r, B * T * HK * dv, -2, 2), *out = tu_poisoned(B * T * H * dv);
    const clattn_attention_desc d = {.batch = B, .seq_q = P, .embed = H * dk, .heads = H, .kv_heads = HK,
                                     .head_dim_v = dv, .causal = 1, .window = window, .separate_value = 1,
                                     .rope = rope};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_decode_plan_set_splits(p, splits), CLATTN_STATUS_SUCCESS);
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = T, .kv_heads = HK, .head_dim_qk = dk, .head_dim_v = dv};
    clattn_kv_cache *cache = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &cache), CLATTN_STATUS_SUCCESS);
    const size_t lens[B] = {T, T - 3};
    float *qs = malloc(B * P * H * dk * 4), *ks = malloc(B * P * HK * dk * 4), *vs = malloc(B * P * HK * dv * 4);
    float *os = malloc(B * P * H * dv * 4);
    for (size_t t0 = 0, call = 0; t0 < T; call++) {
        const size_t n = call == 0 ? P : 1;
        size_t valid[B];
        for (size_t b = 0; b < B; b++) { /* sequence b's tokens t0 .. in the rows of this call (b's own count) */
            const size_t off = call == 0 ? 0 : t0 - (T - lens[b]); /* sequence 1 is 3 tokens behind after the prompt */
            valid[b] = call == 0 ? P - (T - lens[b]) : 1;
            memcpy(qs + b * n * H * dk, q + (b * T + off) * H * dk, n * H * dk * 4);
            memcpy(ks + b * n * HK * dk, k + (b * T + off) * HK * dk, n * HK * dk * 4);
            memcpy(vs + b * n * HK * dv, v + (b * T + off) * HK * dv, n * HK * dv * 4);
        }
        const clattn_decode_args a = {.x = qs, .kv = ks, .value = vs, .new_tokens = n, .valid = valid, .out = os};
        cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_SUCCESS, "call %zu: %s", call, clattn_last_error());
        for (size_t b = 0; b < B; b++) {
            const size_t off = call == 0 ? 0 : t0 - (T - lens[b]);
            for (size_t i = 0; i < n; i++)
                if (i < valid[b]) memcpy(out + (b * T + off + i) * H * dv, os + (b * n + i) * H * dv, H * dv * 4);
                else
                    for (size_t e = 0; e < H * dv; e++)
                        cr_assert(os[(b * n + i) * H * dv + e] == 0.0f, "row past sequence %zu's tokens not 0", b);
        }
        t0 += n;
    }
    size_t got[B];
    cr_assert_eq(clattn_kv_cache_lengths(cache, got), CLATTN_STATUS_SUCCESS);
    for (size_t b = 0; b < B; b++) {
        cr_assert_eq(got[b], lens[b]);
        const size_t Tb = lens[b];
        const clattn_attention_desc od = {.batch = 1, .seq_q = Tb, .seq_kv = Tb, .embed = H * dk, .heads = H,
                                          .kv_heads = HK, .head_dim_v = dv, .causal = 1, .window = window, .cross = 1,
                                          .separate_value = 1, .rope = rope};
        const clattn_attention_args oa = {.x = q + b * T * H * dk, .kv = k + b * T * HK * dk,
                                          .value = v + b * T * HK * dv};
        double *want = malloc(Tb * H * dv * sizeof *want);
        cr_assert_eq(oracle_attention(&od, NULL, &oa, want, NULL), 0);
        char what[120];
        snprintf(what, sizeof what, "heads as given, sequence %zu: T=%zu P=%zu H=%zu HK=%zu dk=%zu dv=%zu W=%zu "
                 "splits=%zu rope=%d", b, Tb, P, H, HK, dk, dv, window, splits, (int)rope.kind);
        check(out + b * T * H * dv, want, Tb * H * dv, what);
        free(want);
    }
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    free(q), free(k), free(v), free(out), free(qs), free(ks), free(vs), free(os);
}

static void heads_as_given_cases(clattn_device *dev)
{
    const clattn_rope none = {0};
    heads_as_given(dev, 40, 11, 4, 2, 8, 6, 0, 0, 1500, none);
    heads_as_given(dev, 61, 20, 8, 1, 16, 16, 9, 0, 1501, none);
    heads_as_given(dev, 70, 30, 4, 2, 64, 64, 0, 3, 1502, none);
    /* rotary embeddings: sequence 1, 3 tokens behind, rotates its tokens at its own positions */
    heads_as_given(dev, 40, 11, 4, 2, 8, 6, 0, 0, 1503, (clattn_rope){.kind = CLATTN_ROPE_INTERLEAVED});
    heads_as_given(dev, 70, 30, 4, 2, 64, 64, 0, 3, 1504, (clattn_rope){.kind = CLATTN_ROPE_HALF, .dims = 32});
}

/* Rotary embeddings on a decode plan without weights or separate_value (x is Q, K and V): only Q and K rotate, V is
 * x as it is; a prompt of 5 then one token per step against the oracle's causal run over every token. */
static void rope_x_is_qkv(clattn_device *dev)
{
    enum { B = 2, T = 20, P = 5, E = 8, H = 2 };
    tu_rng r = {1510};
    float *x = tu_random(&r, B * T * E, -2, 2), *out = tu_poisoned(B * T * E), xs[B * P * E], os[B * P * E];
    const clattn_attention_desc d = {.batch = B, .seq_q = P, .embed = E, .heads = H, .causal = 1,
                                     .rope = {.kind = CLATTN_ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_LINEAR,
                                              .factor = 2.0}};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = T, .kv_heads = H, .head_dim_qk = E / H};
    clattn_kv_cache *cache = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &cache), CLATTN_STATUS_SUCCESS);
    for (size_t t0 = 0; t0 < T;) {
        const size_t n = t0 ? 1 : P;
        for (size_t b = 0; b < B; b++) memcpy(xs + b * n * E, x + (b * T + t0) * E, n * E * sizeof *xs);
        const clattn_decode_args a = {.x = xs, .new_tokens = n, .out = os};
        cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (size_t b = 0; b < B; b++) memcpy(out + (b * T + t0) * E, os + b * n * E, n * E * sizeof *out);
        t0 += n;
    }
    clattn_attention_desc od = d;
    od.seq_q = T;
    const clattn_attention_args oa = {.x = x};
    double *want = malloc(B * T * E * sizeof *want);
    cr_assert_eq(oracle_attention(&od, NULL, &oa, want, NULL), 0);
    check(out, want, B * T * E, "rope, x as Q, K and V");
    /* the plan's table of cos and sin grew with the steps to the cache's capacity (T), not to the next power of two */
    cr_assert_eq(p->base->rope_positions, (size_t)T, "the rope table holds %zu positions for a cache of %d",
                 p->base->rope_positions, T);
    free(want), free(x), free(out);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
}

Test(decode, rope_x_is_qkv_ref)
{
    clattn_device *dev = tu_open_ref();
    rope_x_is_qkv(dev);
    clattn_device_free(dev);
}

Test(decode, rope_x_is_qkv_opencl)
{
    clattn_device *dev = tu_open_opencl();
    rope_x_is_qkv(dev);
    clattn_device_free(dev);
}

/* What a step with the heads as given cannot mean is refused, naming the input, with the cache unchanged. */
Test(decode, heads_as_given_refusals)
{
    clattn_device *dev = tu_open_ref();
    float buf[64] = {0}, out[64];
    const clattn_attention_desc d = {.batch = 1, .seq_q = 2, .embed = 8, .heads = 2, .kv_heads = 1, .causal = 1,
                                     .separate_value = 1};
    clattn_decode_plan *p = NULL;
    const clattn_attention_weights w = {.w_query = buf, .w_key = buf, .w_value = buf, .w_query_count = 64,
                                        .w_key_count = 32, .w_value_count = 32};
    clattn_attention_desc dw = d;
    dw.head_dim_qk = 4;
    cr_assert_eq(clattn_decode_plan_create(dev, &dw, &w, &p), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "separate_value takes no Q/K/V weights"), "%s", clattn_last_error());
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = 1, .capacity = 4, .kv_heads = 1, .head_dim_qk = 4};
    clattn_kv_cache *cache = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &cache), CLATTN_STATUS_SUCCESS);
    const struct { const char *needle; clattn_decode_args a; } bad[] = {
        {"args.kv is NULL", {.x = buf, .value = buf, .new_tokens = 1, .out = out}},
        {"args.value is NULL", {.x = buf, .kv = buf, .new_tokens = 1, .out = out}},
        {"value_count", {.x = buf, .kv = buf, .value = buf, .new_tokens = 1, .out = out, .x_count = 8, .kv_count = 4,
                         .value_count = 8, .out_count = 8}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_neq(clattn_decode_execute(p, cache, &bad[i].a), CLATTN_STATUS_SUCCESS, "%s", bad[i].needle);
        cr_assert(strstr(clattn_last_error(), bad[i].needle), "%s: %s", bad[i].needle, clattn_last_error());
    }
    size_t len = 9;
    cr_assert_eq(clattn_kv_cache_lengths(cache, &len), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(len, 0, "a refused step appended");
    clattn_decode_plan_free(p);
    clattn_kv_cache_free(cache);
    /* a plan without separate_value refuses kv and value: they would be ignored */
    clattn_attention_desc plain = d;
    plain.separate_value = 0, plain.kv_heads = 0;
    cr_assert_eq(tu_decode_plan_create(dev, &plain, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd2 = {.batch = 1, .capacity = 4, .kv_heads = 2, .head_dim_qk = 4};
    cr_assert_eq(tu_kv_cache_create(dev, &cd2, &cache), CLATTN_STATUS_SUCCESS);
    const clattn_decode_args a = {.x = buf, .kv = buf, .new_tokens = 1, .out = out, .x_count = 8, .out_count = 8};
    cr_assert_eq(clattn_decode_execute(p, cache, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "args.kv is given") && strstr(clattn_last_error(), "ignored"), "%s",
              clattn_last_error());
    clattn_decode_plan_free(p);
    clattn_kv_cache_free(cache);
    clattn_device_free(dev);
}

/* The same steps on device buffers (Q, K and V at element offsets in one buffer each): the host path's outputs. */
Test(decode, heads_as_given_buffers_opencl)
{
    clattn_device *dev = tu_open_opencl();
    enum { T = 9, P = 5, H = 4, HK = 2, DK = 8, DV = 6, OFF = 3 };
    tu_rng r = {77};
    float *q = tu_random(&r, T * H * DK, -2, 2), *k = tu_random(&r, T * HK * DK, -2, 2);
    float *v = tu_random(&r, T * HK * DV, -2, 2), *want = tu_poisoned(T * H * DV), *got = tu_poisoned(T * H * DV);
    const clattn_attention_desc d = {.batch = 1, .seq_q = P, .embed = H * DK, .heads = H, .kv_heads = HK,
                                     .head_dim_v = DV, .causal = 1, .separate_value = 1};
    const clattn_kv_cache_desc cd = {.batch = 1, .capacity = T, .kv_heads = HK, .head_dim_qk = DK, .head_dim_v = DV};
    clattn_decode_plan *p = NULL;
    clattn_kv_cache *c1 = NULL, *c2 = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c1), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c2), CLATTN_STATUS_SUCCESS);
    cl_context ctx = clattn_device_context(dev);
    cl_command_queue queue = clattn_device_queue(dev);
    cl_int e;
    cl_mem bq = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (OFF + T * H * DK) * 4, NULL, &e);
    cl_mem bk = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (OFF + T * HK * DK) * 4, NULL, &e);
    cl_mem bv = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (OFF + T * HK * DV) * 4, NULL, &e);
    cl_mem bo = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (OFF + T * H * DV) * 4, NULL, &e);
    cr_assert_eq(clEnqueueWriteBuffer(queue, bq, CL_TRUE, OFF * 4, T * H * DK * 4, q, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(queue, bk, CL_TRUE, OFF * 4, T * HK * DK * 4, k, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(queue, bv, CL_TRUE, OFF * 4, T * HK * DV * 4, v, 0, NULL, NULL), CL_SUCCESS);
    for (size_t t0 = 0; t0 < T;) {
        const size_t n = t0 == 0 ? P : 1;
        const clattn_decode_args a = {.x = q + t0 * H * DK, .kv = k + t0 * HK * DK, .value = v + t0 * HK * DV,
                                      .new_tokens = n, .out = want + t0 * H * DV};
        cr_assert_eq(tu_decode_execute(p, c1, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const clattn_decode_buffers b = {.x = {bq, OFF + t0 * H * DK}, .kv = {bk, OFF + t0 * HK * DK},
                                         .value = {bv, OFF + t0 * HK * DV}, .out = {bo, OFF + t0 * H * DV}};
        cr_assert_eq(clattn_decode_execute_buffers(p, c2, &b, n, NULL, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        t0 += n;
    }
    cr_assert_eq(clEnqueueReadBuffer(queue, bo, CL_TRUE, OFF * 4, T * H * DV * 4, got, 0, NULL, NULL), CL_SUCCESS);
    for (size_t i = 0; i < T * H * DV; i++) cr_assert(got[i] == want[i], "out[%zu] %g, host path %g", i, got[i], want[i]);
    const clattn_decode_buffers nokv = {.x = {bq, 0}, .value = {bv, 0}, .out = {bo, 0}};
    cr_assert_eq(clattn_decode_execute_buffers(p, c2, &nokv, 1, NULL, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "buffers.kv is NULL"), "%s", clattn_last_error());
    clReleaseMemObject(bq), clReleaseMemObject(bk), clReleaseMemObject(bv), clReleaseMemObject(bo);
    clattn_kv_cache_free(c1), clattn_kv_cache_free(c2);
    clattn_decode_plan_free(p);
    free(q), free(k), free(v), free(want), free(got);
    clattn_device_free(dev);
}

Test(decode, heads_as_given_ref)
{
    clattn_device *dev = tu_open_ref();
    heads_as_given_cases(dev);
    clattn_device_free(dev);
}

Test(decode, heads_as_given_opencl)
{
    clattn_device *dev = tu_open_opencl();
    heads_as_given_cases(dev);
    clattn_device_free(dev);
}

/* ---------------------------------------------------------------- speculative decoding: verify and accept */

/* A verify step: T0 tokens prefilled (the heads as given, random), then n draft tokens in one step whose tree is
 * random (tokens 0 and 1 children of the context, token i > 1 a child of one of 1 .. i-1), each sequence its own. Each draft
 * token's output against the float64 oracle's attention over the context and its ancestors and itself (a boolean
 * mask over the dequantised K and V the cache holds). Then clattn_kv_cache_accept keeps a root-to-leaf branch of
 * each tree: the cache then holds the context and the branch's tokens in order, nothing else changed, and one more
 * step (the token after the branch) equals the oracle's causal attention over context + branch + that token. */
static void verify_case(clattn_device *dev, size_t B, size_t T0, size_t n, size_t H, size_t HK, size_t dk, size_t dv,
                        int kv_type, size_t splits, size_t page, uint64_t seed, int rope)
{
    tu_rng r = {seed};
    cr_assert(!rope || kv_type == 0, "rope cases check against the unrotated inputs: a float cache");
    uint32_t *dpos = calloc(B * n, sizeof *dpos); /* rope: draft token i of sequence b at T0 + its depth */
    const size_t T = T0 + n + 1, cap = T0 + n + 2; /* the context, the drafts, the step after the branch */
    float *q = tu_random(&r, B * T * H * dk, -2, 2), *k = tu_random(&r, B * T * HK * dk, -2, 2);
    float *v = tu_random(&r, B * T * HK * dv, -2, 2);
    uint8_t *tree = calloc(B * n * n, 1);
    size_t *branch = calloc(B * n, sizeof *branch), counts[4] = {0}, from[4];
    cr_assert(B <= 4);
    for (size_t b = 0; b < B; b++) {
        long parent[16];
        cr_assert(n <= 16);
        /* tokens 0 and 1 children of the context, the others below token 1: every accepted token moves */
        for (size_t i = 0; i < n; i++) {
            parent[i] = i < 2 ? -1 : 1 + (long)(tu_next(&r) % (i - 1));
            for (long a = (long)i; a >= 0; a = parent[a]) tree[(b * n + i) * n + (size_t)a] = 1;
            dpos[b * n + i] = parent[i] < 0 ? (uint32_t)T0 : dpos[b * n + (size_t)parent[i]] + 1;
        }
        /* the accepted branch: the ancestors of the last draft token, root first */
        size_t leaf = n - 1, path[16], len = 0;
        for (long a = (long)leaf; a >= 0; a = parent[a]) path[len++] = (size_t)a;
        if (b == 1) len = 0; /* sequence 1 rejects every draft */
        for (size_t i = 0; i < len; i++) branch[b * n + i] = path[len - 1 - i];
        counts[b] = len;
        from[b] = T0;
    }
    const clattn_attention_desc d = {.batch = B, .seq_q = T0 > n ? T0 : n, .embed = H * dk, .heads = H,
                                     .kv_heads = HK, .head_dim_v = dv, .causal = 1, .separate_value = 1,
                                     .kv_half = kv_type, .kv_page_size = page,
                                     .rope = {.kind = rope ? CLATTN_ROPE_HALF : CLATTN_ROPE_NONE}};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_decode_plan_set_splits(p, splits), CLATTN_STATUS_SUCCESS);
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = cap, .kv_heads = HK, .head_dim_qk = dk, .head_dim_v = dv,
                                     .type = (clattn_kv_type)kv_type, .page_size = page};
    clattn_kv_cache *cache = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &cache), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    /* a step of m tokens per sequence from token t0 of each */
    const size_t most = T0 > n ? T0 : n;
    float *qs = malloc(B * most * H * dk * 4), *ks = malloc(B * most * HK * dk * 4), *vs = malloc(B * most * HK * dv * 4);
    float *os = tu_poisoned(B * most * H * dv);
#define STEP(t0, m, mask, pos)                                                                                         \
    do {                                                                                                             \
        for (size_t b_ = 0; b_ < B; b_++) {                                                                          \
            memcpy(qs + b_ * (m) * H * dk, q + (b_ * T + (t0)) * H * dk, (m) * H * dk * 4);                          \
            memcpy(ks + b_ * (m) * HK * dk, k + (b_ * T + (t0)) * HK * dk, (m) * HK * dk * 4);                       \
            memcpy(vs + b_ * (m) * HK * dv, v + (b_ * T + (t0)) * HK * dv, (m) * HK * dv * 4);                       \
        }                                                                                                            \
        const clattn_decode_args a_ = {.x = qs, .kv = ks, .value = vs, .new_tokens = (m), .out = os,                 \
                                       .tree_mask = (mask), .rope_positions = (pos)};                                \
        cr_assert_eq(tu_decode_execute(p, cache, &a_), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());            \
    } while (0)
    STEP(0, T0, NULL, NULL);
    STEP(T0, n, tree, rope ? dpos : NULL);
    char what[160];
    snprintf(what, sizeof what,
             "verify B=%zu T0=%zu n=%zu H=%zu HK=%zu dk=%zu dv=%zu kv=%d splits=%zu page=%zu rope=%d", B, T0, n, H,
             HK, dk, dv, kv_type, splits, page, rope);
    float *kq = malloc(B * HK * cap * dk * 4), *vq = malloc(B * HK * cap * dv * 4);
    cr_assert_eq(clattn_kv_cache_read(cache, kq, vq), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    /* the oracle: sequence b's drafts over its cache rows 0 .. T0+n-1 as read back, masked by the tree; with rope over
     * the given (unrotated) keys, the context's at their slots and the drafts' at T0 + their depths, rotated by the
     * oracle, the drafts' queries at the same */
    const size_t Tk = T0 + n;
    float *kb = malloc((Tk + 1) * HK * dk * 4), *vb = malloc((Tk + 1) * HK * dv * 4);
    uint8_t *mask = malloc(n * Tk);
    uint32_t *kpos = malloc((Tk + 1) * sizeof *kpos);
    double *want = malloc(n * H * dv * sizeof *want);
    const clattn_rope half_rope = {.kind = rope ? CLATTN_ROPE_HALF : CLATTN_ROPE_NONE};
    for (size_t b = 0; b < B; b++) {
        for (size_t t = 0; t < Tk; t++)
            for (size_t g = 0; g < HK; g++) {
                const float *given = k + ((b * T + t) * HK + g) * dk, *cached = kq + ((b * HK + g) * cap + t) * dk;
                memcpy(kb + (t * HK + g) * dk, rope ? given : cached, dk * 4);
                memcpy(vb + (t * HK + g) * dv, vq + ((b * HK + g) * cap + t) * dv, dv * 4);
            }
        for (size_t t = 0; t < Tk; t++) kpos[t] = t < T0 ? (uint32_t)t : dpos[b * n + t - T0];
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < Tk; j++) mask[i * Tk + j] = !(j < T0 || tree[(b * n + i) * n + (j - T0)]);
        const clattn_attention_desc od = {.batch = 1, .seq_q = n, .seq_kv = Tk, .embed = H * dk, .heads = H,
                                          .kv_heads = HK, .head_dim_v = dv, .cross = 1, .separate_value = 1,
                                          .attn_mask = CLATTN_MASK_BOOL, .rope = half_rope};
        const clattn_attention_args oa = {.x = qs + b * n * H * dk, .kv = kb, .value = vb, .attn_mask = mask,
                                          .rope_positions = rope ? dpos + b * n : NULL, .rope_positions_count = n,
                                          .rope_positions_kv = rope ? kpos : NULL, .rope_positions_kv_count = Tk};
        cr_assert_eq(oracle_attention(&od, NULL, &oa, want, NULL), 0);
        char wb[260];
        snprintf(wb, sizeof wb, "%s, sequence %zu's drafts", what, b);
        check(os + b * n * H * dv, want, n * H * dv, wb);
    }
    /* accept each sequence's branch: the context unchanged, the branch's rows in order, the lengths */
    cr_assert_eq(clattn_kv_cache_accept(cache, from, counts, branch, n), CLATTN_STATUS_SUCCESS, "%s",
                 clattn_last_error());
    size_t lens[4];
    cr_assert_eq(clattn_kv_cache_lengths(cache, lens), CLATTN_STATUS_SUCCESS);
    float *ka = malloc(B * HK * cap * dk * 4), *va = malloc(B * HK * cap * dv * 4);
    cr_assert_eq(clattn_kv_cache_read(cache, ka, va), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++) {
        cr_assert_eq(lens[b], T0 + counts[b], "%s: sequence %zu's length %zu after accepting %zu", what, b, lens[b],
                     counts[b]);
        for (size_t g = 0; g < HK; g++)
            for (size_t t = 0; t < lens[b]; t++) {
                const size_t src = t < T0 ? t : T0 + branch[b * n + t - T0];
                const size_t at = (b * HK + g) * cap;
                cr_assert(!memcmp(ka + (at + t) * dk, kq + (at + src) * dk, dk * 4) &&
                          !memcmp(va + (at + t) * dv, vq + (at + src) * dv, dv * 4),
                          "%s: sequence %zu, KV head %zu, position %zu after accepting: not cache row %zu", what, b, g,
                          t, src);
            }
    }
    /* one more step: each sequence's next token over context + branch + itself, causal */
    for (size_t b = 0; b < B; b++) { /* the next token's q, k, v are token T - 1's */
        memcpy(qs + b * H * dk, q + (b * T + T - 1) * H * dk, H * dk * 4);
        memcpy(ks + b * HK * dk, k + (b * T + T - 1) * HK * dk, HK * dk * 4);
        memcpy(vs + b * HK * dv, v + (b * T + T - 1) * HK * dv, HK * dv * 4);
    }
    const clattn_decode_args a1 = {.x = qs, .kv = ks, .value = vs, .new_tokens = 1, .out = os};
    cr_assert_eq(tu_decode_execute(p, cache, &a1), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_read(cache, ka, va), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++) {
        const size_t L = T0 + counts[b] + 1;
        for (size_t t = 0; t < L; t++) {
            /* with rope the given keys: the context's, the branch's, the new token's (T - 1), each at its slot */
            const size_t src = t < T0 ? t : t < L - 1 ? T0 + branch[b * n + t - T0] : T - 1;
            for (size_t g = 0; g < HK; g++) {
                const float *given = k + ((b * T + src) * HK + g) * dk, *cached = ka + ((b * HK + g) * cap + t) * dk;
                memcpy(kb + (t * HK + g) * dk, rope ? given : cached, dk * 4);
                memcpy(vb + (t * HK + g) * dv, va + ((b * HK + g) * cap + t) * dv, dv * 4);
            }
            kpos[t] = (uint32_t)t;
        }
        const clattn_attention_desc od = {.batch = 1, .seq_q = 1, .seq_kv = L, .embed = H * dk, .heads = H,
                                          .kv_heads = HK, .head_dim_v = dv, .cross = 1, .separate_value = 1,
                                          .rope = half_rope};
        const uint32_t qpos = (uint32_t)(L - 1);
        const clattn_attention_args oa = {.x = qs + b * H * dk, .kv = kb, .value = vb,
                                          .rope_positions = rope ? &qpos : NULL, .rope_positions_count = 1,
                                          .rope_positions_kv = rope ? kpos : NULL, .rope_positions_kv_count = L};
        cr_assert_eq(oracle_attention(&od, NULL, &oa, want, NULL), 0);
        char wb[260];
        snprintf(wb, sizeof wb, "%s, sequence %zu's step after accepting %zu", what, b, counts[b]);
        check(os + b * H * dv, want, H * dv, wb);
    }
#undef STEP
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    free(q), free(k), free(v), free(tree), free(branch), free(qs), free(ks), free(vs), free(os), free(kq), free(vq);
    free(kb), free(vb), free(mask), free(want), free(ka), free(va), free(dpos), free(kpos);
}

static void verify_cases(clattn_device *dev)
{
    /* the head shapes of decode_cases and int8_cases: no kernel compiled for these alone (a slow driver's compiles) */
    verify_case(dev, 2, 37, 8, 4, 2, 8, 8, 0, 0, 0, 1800, 0);    /* GQA, 8 drafts */
    verify_case(dev, 2, 20, 16, 6, 1, 8, 12, 0, 3, 0, 1801, 0);  /* multi-query, 16 drafts (96 query rows), split-K */
    verify_case(dev, 3, 61, 5, 4, 2, 8, 8, 3, 0, 0, 1802, 0);    /* int8 cache */
    verify_case(dev, 2, 130, 3, 4, 2, 8, 8, 1, 2, 0, 1803, 0);   /* half cache, a long context */
    /* rope (clattn 0.8): the drafts at T0 + their depths (args.rope_positions), the accepted branch's keys then at the
     * positions they were rotated for, the step after it at its slot */
    verify_case(dev, 2, 37, 8, 4, 2, 8, 8, 0, 0, 0, 1804, 1);
    verify_case(dev, 2, 20, 16, 6, 1, 8, 12, 0, 3, 0, 1805, 1);  /* split-K */
}

/* A packed verify step (cu_new with a draft tree): sequences bring 3, 0 and 2 drafts, the tree's rows past a
 * sequence's count left zero (no token's: not checked); the same bits as the padded step (valid, the unused rows'
 * diagonal set), outputs and caches, with the heads given (no projection, whose row count could round differently).
 * A packed step's real row without its diagonal is still refused. */
static void packed_tree(clattn_device *dev)
{
    enum { B = 3, H = 4, HK = 2, D = 8, T0 = 5, N = 3, CAP = 12 };
    tu_rng r = {1810};
    const clattn_attention_desc d = {.batch = B, .seq_q = 8, .embed = H * D, .heads = H, .kv_heads = HK,
                                     .head_dim_v = D, .causal = 1, .separate_value = 1};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = CAP, .kv_heads = HK, .head_dim_qk = D, .head_dim_v = D};
    clattn_kv_cache *cp = NULL, *cq = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &cp), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &cq), CLATTN_STATUS_SUCCESS);
    float *q = tu_random(&r, B * T0 * H * D, -1, 1), *k = tu_random(&r, B * T0 * HK * D, -1, 1);
    float *v = tu_random(&r, B * T0 * HK * D, -1, 1), *o = tu_poisoned(B * T0 * H * D);
    const clattn_decode_args pre = {.x = q, .kv = k, .value = v, .new_tokens = T0, .out = o};
    cr_assert_eq(tu_decode_execute(p, cp, &pre), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_decode_execute(p, cq, &pre), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    static const size_t count[B] = {3, 0, 2};
    const uint32_t cu[B + 1] = {0, 3, 3, 5};
    uint8_t tree[B * N * N] = {1, 0, 0, 1, 1, 0, 1, 0, 1, /* sequence 0: token 2 a sibling of token 1 */
                               0, 0, 0, 0, 0, 0, 0, 0, 0, /* sequence 1: no token */
                               1, 0, 0, 1, 1, 0, 0, 0, 0}; /* sequence 2: a chain of 2, row 2 unused */
    uint8_t padded_tree[B * N * N];
    memcpy(padded_tree, tree, sizeof tree);
    for (size_t b = 0; b < B; b++)
        for (size_t i = count[b]; i < N; i++) padded_tree[(b * N + i) * N + i] = 1; /* padding rows: their diagonal */
    float *qs = tu_random(&r, 5 * H * D, -1, 1), *ks = tu_random(&r, 5 * HK * D, -1, 1);
    float *vs = tu_random(&r, 5 * HK * D, -1, 1), *op = tu_poisoned(5 * H * D);
    float *qp = calloc(B * N * H * D, 4), *kp = calloc(B * N * HK * D, 4), *vp = calloc(B * N * HK * D, 4);
    float *oq = tu_poisoned(B * N * H * D);
    for (size_t b = 0; b < B; b++) { /* the padded step's rows b*N + t hold the packed rows cu[b] + t */
        memcpy(qp + b * N * H * D, qs + cu[b] * H * D, count[b] * H * D * 4);
        memcpy(kp + b * N * HK * D, ks + cu[b] * HK * D, count[b] * HK * D * 4);
        memcpy(vp + b * N * HK * D, vs + cu[b] * HK * D, count[b] * HK * D * 4);
    }
    tree[2 * N * N + N + 1] = 0; /* sequence 2's real row 1 without its diagonal: refused, nothing changed */
    clattn_decode_args ap = {.x = qs, .kv = ks, .value = vs, .out = op, .cu_new = cu, .tree_mask = tree};
    cr_assert_eq(tu_decode_execute(p, cp, &ap), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "tree_mask[2][1][1] is 0"), "%s", clattn_last_error());
    tree[2 * N * N + N + 1] = 1;
    cr_assert_eq(tu_decode_execute(p, cp, &ap), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_decode_args aq = {.x = qp, .kv = kp, .value = vp, .new_tokens = N, .valid = count, .out = oq,
                                   .tree_mask = padded_tree};
    cr_assert_eq(tu_decode_execute(p, cq, &aq), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++)
        cr_assert_eq(memcmp(op + cu[b] * H * D, oq + b * N * H * D, count[b] * H * D * 4), 0,
                     "sequence %zu: the packed verify step's outputs differ from the padded step's", b);
    const size_t nk = B * HK * CAP * D;
    float *k1 = tu_poisoned(nk), *v1 = tu_poisoned(nk), *k2 = tu_poisoned(nk), *v2 = tu_poisoned(nk);
    cr_assert_eq(clattn_kv_cache_read(cp, k1, v1), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(clattn_kv_cache_read(cq, k2, v2), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(memcmp(k1, k2, nk * 4), 0, "the packed and padded verify steps' caches differ (keys)");
    cr_assert_eq(memcmp(v1, v2, nk * 4), 0, "the packed and padded verify steps' caches differ (values)");
    clattn_kv_cache_free(cp), clattn_kv_cache_free(cq);
    clattn_decode_plan_free(p);
    free(q), free(k), free(v), free(o), free(qs), free(ks), free(vs), free(op), free(qp), free(kp), free(vp), free(oq);
    free(k1), free(v1), free(k2), free(v2);
}

Test(accept, packed_tree_ref) { clattn_device *d = tu_open_ref(); packed_tree(d); clattn_device_free(d); }
Test(accept, packed_tree_opencl) { clattn_device *d = tu_open_opencl(); packed_tree(d); clattn_device_free(d); }

Test(accept, verify_tree_ref)
{
    clattn_device *dev = tu_open_ref();
    verify_cases(dev);
    clattn_device_free(dev);
}

Test(accept, verify_tree_opencl)
{
    clattn_device *dev = tu_open_opencl();
    verify_cases(dev);
    clattn_device_free(dev);
}

/* What a verify step or an accept cannot mean is refused by name with nothing changed: a tree whose token does not see
 * itself or sees a later one, a tree with a window, a tree of the wrong size; an accept past a length, out of order,
 * or longer than its stride. */
Test(accept, refusals)
{
    clattn_device *devs[2] = {tu_open_ref(), tu_open_opencl()};
    for (int k = 0; k < 2; k++) {
        clattn_attention_desc d = {.batch = 1, .seq_q = 3, .embed = 8, .heads = 2, .causal = 1};
        clattn_decode_plan *p = NULL;
        cr_assert_eq(tu_decode_plan_create(devs[k], &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const clattn_kv_cache_desc cd = {.batch = 1, .capacity = 8, .kv_heads = 2, .head_dim_qk = 4};
        clattn_kv_cache *c = NULL;
        cr_assert_eq(tu_kv_cache_create(devs[k], &cd, &c), CLATTN_STATUS_SUCCESS);
        float x[24] = {0}, out[24];
        const uint8_t no_diag[9] = {1, 0, 0, 1, 0, 0, 0, 1, 1}, later[9] = {1, 0, 0, 1, 1, 1, 0, 0, 1};
        const struct { const char *needle; const uint8_t *tree; size_t count; } bad[] = {
            {"args.tree_mask[0][1][1] is 0", no_diag, 9},
            {"args.tree_mask[0][1][2] is nonzero", later, 9},
            {"args.tree_mask has 8 elements", later, 8},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            const clattn_decode_args a = {.x = x, .new_tokens = 3, .out = out, .x_count = 24, .out_count = 24,
                                          .tree_mask = bad[i].tree, .tree_mask_count = bad[i].count};
            cr_assert_neq(clattn_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", bad[i].needle);
            cr_assert(strstr(clattn_last_error(), bad[i].needle), "%s: %s", bad[i].needle, clattn_last_error());
        }
        size_t len = 9;
        clattn_kv_cache_lengths(c, &len);
        cr_assert_eq(len, 0, "a refused verify step appended");
        clattn_decode_plan_free(p);
        d.window = 4; /* a tree with a window */
        cr_assert_eq(tu_decode_plan_create(devs[k], &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const uint8_t chain[9] = {1, 0, 0, 1, 1, 0, 1, 1, 1};
        const clattn_decode_args aw = {.x = x, .new_tokens = 3, .out = out, .x_count = 24, .out_count = 24,
                                       .tree_mask = chain, .tree_mask_count = 9};
        cr_assert_eq(clattn_decode_execute(p, c, &aw), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(strstr(clattn_last_error(), "tree_mask with a window"), "%s", clattn_last_error());
        /* accept: 3 tokens after a context of 2 (length 5) */
        const clattn_decode_args a2 = {.x = x, .new_tokens = 2, .out = out, .x_count = 16, .out_count = 16};
        const clattn_decode_args a3 = {.x = x, .new_tokens = 3, .out = out, .x_count = 24, .out_count = 24};
        cr_assert_eq(clattn_decode_execute(p, c, &a2), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(clattn_decode_execute(p, c, &a3), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const size_t from[1] = {2}, past[1] = {6}, one[1] = {1}, two[1] = {2}, three[1] = {3};
        const size_t idx_past[2] = {0, 3}, idx_down[2] = {1, 0}, idx_ok[2] = {0, 2};
        struct { const char *needle; const size_t *from, *counts, *index; size_t stride; } acc[] = {
            {"from[0] = 6 is past", past, one, idx_ok, 2},
            {"index[1] = 3 (sequence 0): token 5", from, two, idx_past, 2},
            {"does not come after", from, two, idx_down, 2},
            {"counts[0] = 3 is more than stride (2)", from, three, idx_ok, 2},
            {"index is NULL", from, one, NULL, 2},
        };
        for (size_t i = 0; i < sizeof acc / sizeof acc[0]; i++) {
            cr_assert_eq(clattn_kv_cache_accept(c, acc[i].from, acc[i].counts, acc[i].index, acc[i].stride),
                         CLATTN_STATUS_INVALID_ARGUMENT, "%s", acc[i].needle);
            cr_assert(strstr(clattn_last_error(), acc[i].needle), "%s: %s", acc[i].needle, clattn_last_error());
            clattn_kv_cache_lengths(c, &len);
            cr_assert_eq(len, 5, "a refused accept changed the length (%zu)", len);
        }
        cr_assert_eq(clattn_kv_cache_accept(c, from, two, idx_ok, 2), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_kv_cache_lengths(c, &len);
        cr_assert_eq(len, 4);
        clattn_kv_cache_free(c);
        clattn_decode_plan_free(p);
        clattn_device_free(devs[k]);
    }
}

/* ---------------------------------------------------------------- int8 caches */

/* An INT8 cache's rows against the values appended: x (B, T, HK*D) for the first T positions of each sequence, the
 * cache's dequantised rows xq (B, HK, cap, D). Each row's values are q_c * s with integer |q_c| <= 127 and
 * s = max_c |x_c| / 127, and each within half a step of its x_c (clattn.h, clattn_kv_type); a row of zeros stays 0;
 * positions past T read 0. slack: what the values quantised may differ from x by before they are (a fraction of the
 * row's largest |x_c|: the float32 rotation of a key under rope against x rotated in float64); 0 when x is exact. */
static void check_int8_rows(const double *x, const float *xq, size_t B, size_t T, size_t HK, size_t D, size_t cap,
                            double slack, const char *what)
{
    for (size_t b = 0; b < B; b++)
        for (size_t g = 0; g < HK; g++)
            for (size_t t = 0; t < cap; t++) {
                const float *row = xq + ((b * HK + g) * cap + t) * D;
                if (t >= T) {
                    for (size_t c = 0; c < D; c++) cr_assert(row[c] == 0.0f, "%s: position %zu past the length", what, t);
                    continue;
                }
                const double *xr = x + (b * T + t) * HK * D + g * D;
                double amax = 0.0;
                for (size_t c = 0; c < D; c++) amax = fmax(amax, fabs(xr[c]));
                const double s = amax / 127.0;
                for (size_t c = 0; c < D; c++) {
                    const double got = row[c];
                    cr_assert(fabs(got - xr[c]) <= 0.5 * s * (1.0 + 1e-5) + (1e-7 + slack) * amax, "%s: b %zu g %zu t %zu c %zu: "
                              "%.9g for %.9g, more than half a step (%.9g) away", what, b, g, t, c, got, xr[c], s / 2);
                    if (s == 0.0) {
                        cr_assert(got == 0.0, "%s: a row of zeros reads %g", what, got);
                        continue;
                    }
                    const double q = got / s;
                    cr_assert(fabs(q - nearbyint(q)) <= 1e-4 && fabs(nearbyint(q)) <= 127.0, "%s: b %zu g %zu t %zu c "
                              "%zu: %.9g is not a whole step of %.9g (%.6f steps)", what, b, g, t, c, got, s, q);
                }
            }
}

typedef struct i8case {
    size_t B, T, P, H, HK, dk, dv, window, splits;
    const size_t *chunks; /* new tokens per call until T (NULL: P, then one by one) */
    int special;          /* rows of zeros, a row with one large element, and a sequence 3 tokens shorter */
    clattn_rope rope;     /* rotary embeddings: each sequence's token t at position t, its key rotated, then quantised */
} i8case;

/* Decoding into an INT8 cache with the heads as given (Q, K, V random in [-2, 2]): the cache read back is a valid
 * quantisation of every appended K and V row (check_int8_rows), and the outputs are the float64 oracle's causal
 * attention over the dequantised K and V read back, at the ordinary tolerance. With rope, the keys checked are
 * oracle_rope's rotation of K (within 2e-6 of the row's largest value before quantising: the kernel rotates in
 * float32, so a value at a rounding boundary may take the neighbouring code), and the oracle attends Q rotated by
 * oracle_rope (rounded to float: its input type) to the keys read back, which are rotated already. */
static void int8_case(clattn_device *dev, const i8case *c, uint64_t seed)
{
    const size_t B = c->B, T = c->T, H = c->H, HK = c->HK, dk = c->dk, dv = c->dv, cap = T + 2;
    tu_rng r = {seed};
    float *q = tu_random(&r, B * T * H * dk, -2, 2), *k = tu_random(&r, B * T * HK * dk, -2, 2);
    float *v = tu_random(&r, B * T * HK * dv, -2, 2), *out = tu_poisoned(B * T * H * dv);
    const size_t lens[2] = {T, c->special ? T - 3 : T};
    if (c->special) {
        memset(k + (0 * T + 3) * HK * dk, 0, dk * sizeof *k);            /* a row of zeros: scale 0 */
        memset(v + (0 * T + 5) * HK * dv + (HK - 1) * dv, 0, dv * sizeof *v);
        v[(0 * T + 6) * HK * dv + 1] = 300.0f;                          /* one large value: a coarse row */
        k[(B - 1) * T * HK * dk + 7 * HK * dk] = -250.0f;
    }
    size_t maxn = c->P;
    for (size_t i = 0; c->chunks && i < 64 && c->chunks[i]; i++) maxn = c->chunks[i] > maxn ? c->chunks[i] : maxn;
    const clattn_attention_desc d = {.batch = B, .seq_q = maxn, .embed = H * dk, .heads = H, .kv_heads = HK,
                                     .head_dim_v = dv, .causal = 1, .window = c->window, .separate_value = 1,
                                     .kv_half = CLATTN_KV_INT8, .rope = c->rope};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_decode_plan_set_splits(p, c->splits), CLATTN_STATUS_SUCCESS);
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = cap, .kv_heads = HK, .head_dim_qk = dk, .head_dim_v = dv,
                                     .type = CLATTN_KV_INT8};
    clattn_kv_cache *cache = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &cache), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *qs = malloc(B * maxn * H * dk * 4), *ks = malloc(B * maxn * HK * dk * 4);
    float *vs = malloc(B * maxn * HK * dv * 4), *os = malloc(B * maxn * H * dv * 4);
    size_t done[2] = {0, 0};
    for (size_t call = 0; done[0] < T; call++) {
        size_t n = c->chunks ? c->chunks[call] : call == 0 ? c->P : 1;
        if (n > T - done[0]) n = T - done[0];
        size_t valid[2];
        for (size_t b = 0; b < B; b++) {
            valid[b] = done[b] + n <= lens[b] ? n : lens[b] - done[b];
            memcpy(qs + b * n * H * dk, q + (b * T + done[b]) * H * dk, valid[b] * H * dk * 4);
            memcpy(ks + b * n * HK * dk, k + (b * T + done[b]) * HK * dk, valid[b] * HK * dk * 4);
            memcpy(vs + b * n * HK * dv, v + (b * T + done[b]) * HK * dv, valid[b] * HK * dv * 4);
            for (size_t i = valid[b] * H * dk; i < n * H * dk; i++) qs[b * n * H * dk + i] = 0.0f;
            for (size_t i = valid[b] * HK * dk; i < n * HK * dk; i++) ks[b * n * HK * dk + i] = 0.0f;
            for (size_t i = valid[b] * HK * dv; i < n * HK * dv; i++) vs[b * n * HK * dv + i] = 0.0f;
        }
        const clattn_decode_args a = {.x = qs, .kv = ks, .value = vs, .new_tokens = n, .valid = valid, .out = os};
        cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_SUCCESS, "call %zu: %s", call, clattn_last_error());
        for (size_t b = 0; b < B; b++) {
            memcpy(out + (b * T + done[b]) * H * dv, os + b * n * H * dv, valid[b] * H * dv * 4);
            done[b] += valid[b];
        }
    }
    float *kq = malloc(B * HK * cap * dk * 4), *vq = malloc(B * HK * cap * dv * 4);
    cr_assert_eq(clattn_kv_cache_read(cache, kq, vq), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    char what[160];
    snprintf(what, sizeof what, "int8 B=%zu T=%zu P=%zu H=%zu HK=%zu dk=%zu dv=%zu W=%zu splits=%zu%s%s%s", B, T,
             c->P, H, HK, dk, dv, c->window, c->splits, c->chunks ? " chunked" : "", c->special ? " special" : "",
             c->rope.kind ? " rope" : "");
    for (size_t b = 0; b < B; b++) { /* each sequence alone: its own length (the rows past it read 0) */
        const size_t Tb = lens[b];
        double *xk = malloc(Tb * HK * dk * sizeof *xk), *xv = malloc(Tb * HK * dv * sizeof *xv);
        for (size_t i = 0; i < Tb * HK * dk; i++) xk[i] = k[b * T * HK * dk + i];
        for (size_t i = 0; i < Tb * HK * dv; i++) xv[i] = v[b * T * HK * dv + i];
        oracle_rope(&c->rope, dk, xk, Tb, HK * dk, HK); /* sequence b's token t at position t */
        check_int8_rows(xk, kq + b * HK * cap * dk, 1, Tb, HK, dk, cap, c->rope.kind ? 2e-6 : 0.0, what);
        check_int8_rows(xv, vq + b * HK * cap * dv, 1, Tb, HK, dv, cap, 0.0, what);
        float *qb = malloc(Tb * H * dk * 4); /* Q as the oracle takes it: rotated here under rope */
        double *qr = malloc(Tb * H * dk * sizeof *qr);
        for (size_t i = 0; i < Tb * H * dk; i++) qr[i] = q[b * T * H * dk + i];
        oracle_rope(&c->rope, dk, qr, Tb, H * dk, H);
        for (size_t i = 0; i < Tb * H * dk; i++) qb[i] = (float)qr[i];
        /* the dequantised K and V (B, HK, cap, D) as the oracle's (T, HK*D) rows */
        float *kb = malloc(Tb * HK * dk * 4), *vb = malloc(Tb * HK * dv * 4);
        for (size_t t = 0; t < Tb; t++)
            for (size_t g = 0; g < HK; g++) {
                memcpy(kb + (t * HK + g) * dk, kq + ((b * HK + g) * cap + t) * dk, dk * 4);
                memcpy(vb + (t * HK + g) * dv, vq + ((b * HK + g) * cap + t) * dv, dv * 4);
            }
        const clattn_attention_desc od = {.batch = 1, .seq_q = Tb, .seq_kv = Tb, .embed = H * dk, .heads = H,
                                          .kv_heads = HK, .head_dim_v = dv, .causal = 1, .window = c->window,
                                          .cross = 1, .separate_value = 1};
        const clattn_attention_args oa = {.x = qb, .kv = kb, .value = vb};
        double *want = malloc(Tb * H * dv * sizeof *want);
        cr_assert_eq(oracle_attention(&od, NULL, &oa, want, NULL), 0);
        char wb[200];
        snprintf(wb, sizeof wb, "%s, sequence %zu", what, b);
        check(out + b * T * H * dv, want, Tb * H * dv, wb);
        free(want), free(kb), free(vb), free(xk), free(xv), free(qb), free(qr);
    }
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    free(q), free(k), free(v), free(out), free(qs), free(ks), free(vs), free(os), free(kq), free(vq);
}

static void int8_cases(clattn_device *dev)
{
    static const size_t uneven[] = {5, 1, 1, 13, 2, 1, 7, 40, 3, 1, 1, 64, 0};
    const i8case cases[] = {
        {.B = 2, .T = 40, .P = 11, .H = 4, .HK = 2, .dk = 8, .dv = 8, .special = 1},     /* GQA, zero rows, outliers */
        {.B = 2, .T = 50, .P = 17, .H = 6, .HK = 1, .dk = 8, .dv = 12, .window = 9},     /* multi-query, window */
        {.B = 2, .T = 130, .H = 4, .HK = 2, .dk = 8, .dv = 8, .chunks = uneven},          /* appends in chunks */
        {.B = 2, .T = 70, .P = 30, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 3, .special = 1}, /* split-K */
        {.B = 2, .T = 30, .P = 7, .H = 4, .HK = 2, .dk = 5, .dv = 3},                    /* odd widths: scalar loads */
        /* rotary embeddings: keys rotated before they are quantised (the shorter sequence at its own positions) */
        {.B = 2, .T = 40, .P = 11, .H = 4, .HK = 2, .dk = 8, .dv = 8, .special = 1, .rope = {.kind = CLATTN_ROPE_HALF}},
        {.B = 2, .T = 130, .H = 4, .HK = 2, .dk = 8, .dv = 8, .window = 20, .chunks = uneven,
         .rope = {.kind = CLATTN_ROPE_INTERLEAVED, .dims = 4, .theta = 500.0}},
        {.B = 2, .T = 70, .P = 30, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 3,
         .rope = {.kind = CLATTN_ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_YARN, .factor = 4.0,
                  .original_max_position = 16}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) int8_case(dev, &cases[i], 1700 + i);
}

Test(codes, int8_cache_ref)
{
    clattn_device *dev = tu_open_ref();
    int8_cases(dev);
    clattn_device_free(dev);
}

Test(codes, int8_cache_opencl)
{
    clattn_device *dev = tu_open_opencl();
    int8_cases(dev);
    clattn_device_free(dev);
}

/* The projected key (isk) or value of token x (E floats) for key/value head g, channel c, as the cache holds it. */
static double projected(const model *m, const float *x, int isk, size_t g, size_t c, int half)
{
    const size_t D = isk ? m->dk : m->dv;
    const float *wr = (isk ? m->wk : m->wv) + (g * D + c) * m->E;
    double s = (isk ? m->bk : m->bv)[g * D + c];
    for (size_t e = 0; e < m->E; e++) s += (double)x[e] * wr[e];
    return oracle_kv(s, half);
}

/* The cache read back: position t of sequence b holds token seq[b][t] for t < len[b], 0 from there on; every
 * head, every position up to the capacity (the neighbours of a boundary included). */
static void expect_cache(clattn_kv_cache *cache, const model *m, size_t B, size_t cap, const float *seq,
                         const size_t *len, int half, const char *what)
{
    const size_t HK = m->HK, dk = m->dk, dv = m->dv;
    float *k = tu_poisoned(B * HK * cap * dk), *v = tu_poisoned(B * HK * cap * dv);
    size_t got[8];
    cr_assert_eq(clattn_kv_cache_lengths(cache, got), CLATTN_STATUS_SUCCESS);
    for (size_t b = 0; b < B; b++) cr_assert_eq(got[b], len[b], "%s: length of %zu is %zu, want %zu", what, b, got[b],
                                                len[b]);
    cr_assert_eq(clattn_kv_cache_read(cache, k, v), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++)
        for (size_t g = 0; g < HK; g++)
            for (size_t t = 0; t < cap; t++)
                for (size_t c = 0; c < dk + dv; c++) {
                    const int isk = c < dk;
                    const size_t cc = isk ? c : c - dk, D = isk ? dk : dv;
                    const double want = t < len[b] ? projected(m, seq + (b * cap + t) * m->E, isk, g, cc, half) : 0.0;
                    const float gv = (isk ? k : v)[((b * HK + g) * cap + t) * D + cc];
                    cr_assert(oracle_close(gv, want, half ? 0.0 : 1e-5, half ? 0.0 : 1e-5, 0, 0),
                              "%s: %c[b=%zu, g=%zu, t=%zu, %zu] = %.9g, want %.9g", what, isk ? 'K' : 'V', b, g, t, cc,
                              gv, want);
                }
    free(k), free(v);
}

/* Sequences of different lengths in one batch (args.valid), decode steps after, then truncation and
 * new tokens: each sequence equals the oracle's run over its own tokens. */
static void ragged(clattn_device *dev, int half, size_t splits)
{
    enum { B = 3, P = 20, STEPS = 6, TRUNC = 4, MORE = 5 };
    const size_t valid[B] = {20, 7, 13};
    tu_rng r = {77 + (uint64_t)half};
    model m;
    const size_t E = half ? 16 : 24;
    model_make(&m, &r, E, 4, 2, 8, 8, half);
    const size_t Eo = m.Eo, cap = P + STEPS + MORE;
    clattn_attention_desc d = model_desc(&m, B, P, 0, half);
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_decode_plan_set_splits(p, splits), CLATTN_STATUS_SUCCESS);
    clattn_kv_cache *cache = make_cache(dev, &m, B, cap, half);

    /* seq[b]: the tokens sequence b has seen, in order; got[b]: the outputs for them */
    float *seq = calloc(B * cap * E, sizeof *seq), *got = calloc(B * cap * Eo, sizeof *got);
    size_t len[B] = {0};
    float *xp = vals(&r, B * P * E, half, 6, 1.0f), *op = tu_poisoned(B * P * Eo);
    clattn_decode_args a = {.x = xp, .new_tokens = P, .valid = valid, .out = op};
    cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++) {
        memcpy(seq + b * cap * E, xp + b * P * E, valid[b] * E * sizeof *seq);
        memcpy(got + b * cap * Eo, op + b * P * Eo, valid[b] * Eo * sizeof *got);
        len[b] = valid[b];
        for (size_t t = valid[b]; t < P; t++) /* padding rows: the output projection of a zero context */
            for (size_t o = 0; o < Eo; o++)
                cr_assert_float_eq(op[(b * P + t) * Eo + o], m.bo[o], 1e-6, "padding row b=%zu t=%zu", b, t);
    }
    size_t lens[B];
    cr_assert_eq(clattn_kv_cache_lengths(cache, lens), CLATTN_STATUS_SUCCESS);
    for (size_t b = 0; b < B; b++) cr_assert_eq(lens[b], valid[b]);
    float x1[B * 24], o1[B * 13];
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) { /* drop the last TRUNC tokens of sequences 0 and 2 */
            size_t keep[B] = {len[0] - TRUNC, len[1], len[2] - TRUNC};
            size_t too_many[B] = {len[0], len[1] + 1, len[2]};
            cr_assert_eq(clattn_kv_cache_truncate(cache, too_many), CLATTN_STATUS_INVALID_ARGUMENT);
            cr_assert_eq(clattn_kv_cache_truncate(cache, keep), CLATTN_STATUS_SUCCESS);
            for (size_t b = 0; b < B; b++) len[b] = keep[b];
        }
        for (int s = 0; s < (phase ? MORE : STEPS); s++) {
            for (size_t i = 0; i < B * E; i++) x1[i] = val(&r, half, 6, 1.0f);
            for (size_t i = 0; i < B * Eo; i++) o1[i] = NAN;
            clattn_decode_args a1 = {.x = x1, .new_tokens = 1, .out = o1};
            cr_assert_eq(tu_decode_execute(p, cache, &a1), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            for (size_t b = 0; b < B; b++) {
                memcpy(seq + (b * cap + len[b]) * E, x1 + b * E, E * sizeof *seq);
                memcpy(got + (b * cap + len[b]) * Eo, o1 + b * Eo, Eo * sizeof *got);
                len[b]++;
            }
        }
    }
    for (size_t b = 0; b < B; b++) {
        double *want = expect(&m, 1, len[b], 0, half, seq + b * cap * E);
        char what[100];
        snprintf(what, sizeof what, "sequence %zu (%zu tokens, half=%d, splits=%zu)", b, len[b], half, splits);
        check(got + b * cap * Eo, want, len[b] * Eo, what);
        free(want);
    }
    /* the cache read back holds the projected (and rounded) keys and values of each sequence's tokens */
    expect_cache(cache, &m, B, cap, seq, len, half, "ragged");
    const size_t HK = m.HK, dk = m.dk, dv = m.dv;
    float *kc = tu_poisoned(B * HK * cap * dk), *vc = tu_poisoned(B * HK * cap * dv);
    cr_assert_eq(clattn_kv_cache_read(cache, kc, vc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    /* written into a second cache, it reads back the same, lengths included */
    clattn_kv_cache *copy = make_cache(dev, &m, B, cap, half);
    float *kc2 = tu_poisoned(B * HK * cap * dk), *vc2 = tu_poisoned(B * HK * cap * dv);
    size_t too_long[B] = {len[0], cap + 1, len[2]};
    cr_assert_eq(clattn_kv_cache_write(copy, kc, vc, too_long), CLATTN_STATUS_SHAPE_MISMATCH);
    cr_assert_eq(clattn_kv_cache_write(copy, kc, vc, len), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_read(copy, kc2, vc2), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(memcmp(kc, kc2, B * HK * cap * dk * sizeof *kc), 0, "K written and read back differs");
    cr_assert_eq(memcmp(vc, vc2, B * HK * cap * dv * sizeof *vc), 0, "V written and read back differs");
    size_t lens2[B];
    clattn_kv_cache_lengths(copy, lens2);
    for (size_t b = 0; b < B; b++) cr_assert_eq(lens2[b], len[b]);
    clattn_kv_cache_free(copy);
    free(kc2), free(vc2);
    free(kc), free(vc), free(seq), free(got), free(xp), free(op);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    model_free(&m);
}

Test(decode, ragged_truncate_read_ref)
{
    clattn_device *dev = tu_open_ref();
    ragged(dev, 0, 0);
    ragged(dev, 1, 0);
    clattn_device_free(dev);
}

Test(decode, ragged_truncate_read_opencl)
{
    clattn_device *dev = tu_open_opencl();
    ragged(dev, 0, 0);
    ragged(dev, 1, 0);
    ragged(dev, 0, 4);
    clattn_device_free(dev);
}

/* ---------------------------------------------------------------- caller's buffers */

/* Steps on cl_mem buffers (at offsets, with a user event in the wait list and a completion event) equal the
 * same steps from host arrays on a second cache, bit for bit, the cache read back included, and the host path's
 * outputs equal the oracle's run over each sequence's tokens (padding rows: the output bias); a prefill with valid
 * counts, then steps; refused calls (sizes, overlap, capacity, wait list, the ref device) leave the lengths, the
 * cache and the output buffer unchanged. */
static void buffers_case(clattn_device *dev, int half, size_t splits, size_t page)
{
    enum { B = 3, P = 9, STEPS = 5, OX = 7, OO = 5 };
    const size_t valid[B] = {9, 4, 6};
    tu_rng r = {4242 + (uint64_t)half};
    model m;
    const size_t E = half ? 16 : 24, cap = P + STEPS;
    model_make(&m, &r, E, 4, 2, 8, 8, half);
    const size_t Eo = m.Eo;
    clattn_attention_desc d = model_desc(&m, B, P, 0, half);
    d.kv_page_size = page;
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_decode_plan_set_splits(p, splits), CLATTN_STATUS_SUCCESS);
    clattn_kv_cache *ch = make_paged(dev, &m, B, cap, half, page, 0), *cb = make_paged(dev, &m, B, cap, half, page, 0);
    cl_context ctx = clattn_device_context(dev);
    cl_command_queue q = clattn_device_queue(dev);
    cl_int err;
    cl_mem xb = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (OX + B * P * E) * sizeof(float), NULL, &err);
    cl_mem ob = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (OO + B * P * Eo) * sizeof(float), NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    float *x = vals(&r, B * P * E, half, 6, 1.0f), *oh = tu_poisoned(B * P * Eo), *ob_host = tu_poisoned(OO + B * P * Eo);
    /* seq[b]: sequence b's tokens, seen[b]: the host path's outputs for them (checked against the oracle below) */
    float *seq = calloc(B * cap * E, sizeof *seq), *seen = calloc(B * cap * Eo, sizeof *seen);
    size_t len[B] = {0};
    for (int step = 0; step <= STEPS; step++) {
        const size_t n = step == 0 ? P : 1;
        if (step) for (size_t i = 0; i < B * E; i++) x[i] = val(&r, half, 6, 1.0f);
        for (size_t i = 0; i < B * n * Eo; i++) oh[i] = NAN;
        clattn_decode_args a = {.x = x, .new_tokens = n, .valid = step == 0 ? valid : NULL, .out = oh};
        cr_assert_eq(tu_decode_execute(p, ch, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (size_t b = 0; b < B; b++) {
            const size_t nb = step == 0 ? valid[b] : 1;
            memcpy(seq + (b * cap + len[b]) * E, x + b * n * E, nb * E * sizeof *seq);
            memcpy(seen + (b * cap + len[b]) * Eo, oh + b * n * Eo, nb * Eo * sizeof *seen);
            len[b] += nb;
            for (size_t t = nb; t < n; t++) /* padding rows: the output projection of a zero context */
                for (size_t o = 0; o < Eo; o++)
                    cr_assert_float_eq(oh[(b * n + t) * Eo + o], m.bo[o], 1e-6, "padding row b=%zu t=%zu", b, t);
        }
        cr_assert_eq(clEnqueueWriteBuffer(q, xb, CL_TRUE, OX * sizeof(float), B * n * E * sizeof(float), x, 0, NULL, NULL),
                     CL_SUCCESS);
        cr_assert_eq(clEnqueueWriteBuffer(q, ob, CL_TRUE, 0, (OO + B * P * Eo) * sizeof(float), ob_host, 0, NULL, NULL),
                     CL_SUCCESS); /* poisoned */
        cl_event gate = clCreateUserEvent(ctx, &err), done = NULL;
        cr_assert_eq(err, CL_SUCCESS);
        const clattn_decode_buffers bufs = {.x = {xb, OX}, .out = {ob, OO}};
        cr_assert_eq(clattn_decode_execute_buffers(p, cb, &bufs, n, step == 0 ? valid : NULL, 1, &gate, &done),
                     CLATTN_STATUS_SUCCESS, "step %d: %s", step, clattn_last_error());
        cr_assert_eq(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
        cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS);
        clReleaseEvent(gate), clReleaseEvent(done);
        float *got = tu_poisoned(B * n * Eo);
        cr_assert_eq(clEnqueueReadBuffer(q, ob, CL_TRUE, OO * sizeof(float), B * n * Eo * sizeof(float), got, 0, NULL, NULL),
                     CL_SUCCESS);
        cr_assert_eq(memcmp(got, oh, B * n * Eo * sizeof(float)), 0, "step %d (n = %zu, half %d, splits %zu): the "
                     "buffers' output differs from the host path's", step, n, half, splits);
        free(got);
    }
    for (size_t b = 0; b < B; b++) {
        double *want = expect(&m, 1, len[b], 0, half, seq + b * cap * E);
        char what[100];
        snprintf(what, sizeof what, "sequence %zu (%zu tokens, half=%d, splits=%zu, page %zu)", b, len[b], half,
                 splits, page);
        check(seen + b * cap * Eo, want, len[b] * Eo, what);
        free(want);
    }
    /* both caches read back: the projected keys and values of each sequence's tokens, 0 past its length */
    expect_cache(ch, &m, B, cap, seq, len, half, "buffers: the host path's cache");
    expect_cache(cb, &m, B, cap, seq, len, half, "buffers: the buffers' cache");
    free(seq), free(seen);
    size_t lh[B], lb[B];
    clattn_kv_cache_lengths(ch, lh), clattn_kv_cache_lengths(cb, lb);
    for (size_t b = 0; b < B; b++) cr_assert_eq(lb[b], lh[b], "length of %zu", b);
    const size_t HK = m.HK, nk = B * HK * cap * m.dk, nv = B * HK * cap * m.dv;
    float *k1 = tu_poisoned(nk), *v1 = tu_poisoned(nv), *k2 = tu_poisoned(nk), *v2 = tu_poisoned(nv);
    clattn_kv_cache_read(ch, k1, v1), clattn_kv_cache_read(cb, k2, v2);
    cr_assert_eq(memcmp(k1, k2, nk * sizeof *k1), 0, "the caches' keys differ");
    cr_assert_eq(memcmp(v1, v2, nv * sizeof *v1), 0, "the caches' values differ");

    /* refused calls: nothing enqueued, nothing changed */
    cl_mem small = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 16, NULL, &err);
    const float mark = 1234.5f;
    cr_assert_eq(clEnqueueFillBuffer(q, ob, &mark, sizeof mark, 0, (OO + B * P * Eo) * sizeof(float), 0, NULL, NULL),
                 CL_SUCCESS);
    clFinish(q);
    struct { clattn_decode_buffers b; size_t n; const size_t *valid; cl_uint nwait; clattn_status st; const char *needle; }
        bad[] = {
            {{.x = {small, 0}, .out = {ob, 0}}, 1, NULL, 0, CLATTN_STATUS_SHAPE_MISMATCH, "x"},
            {{.x = {xb, 0}, .out = {small, 0}}, 1, NULL, 0, CLATTN_STATUS_SHAPE_MISMATCH, "out"},
            {{.x = {xb, 0}, .out = {xb, B * E - 1}}, 1, NULL, 0, CLATTN_STATUS_INVALID_ARGUMENT, "share"},
            {{.x = {NULL, 0}, .out = {ob, 0}}, 1, NULL, 0, CLATTN_STATUS_INVALID_ARGUMENT, "x"},
            {{.x = {xb, 0}, .out = {ob, 0}}, 0, NULL, 0, CLATTN_STATUS_INVALID_ARGUMENT, "new_tokens = 0"},
            {{.x = {xb, 0}, .out = {ob, 0}}, P + 1, NULL, 0, CLATTN_STATUS_INVALID_ARGUMENT, "new_tokens"},
            {{.x = {xb, 0}, .out = {ob, 0}}, 2, (const size_t[]){3, 0, 0}, 0, CLATTN_STATUS_INVALID_ARGUMENT, "valid[0]"},
            {{.x = {xb, 0}, .out = {ob, 0}}, P, NULL, 0, CLATTN_STATUS_SHAPE_MISMATCH, "capacity"},
            {{.x = {xb, 0}, .out = {ob, 0}}, 1, NULL, 1, CLATTN_STATUS_INVALID_ARGUMENT, "wait"},
        };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(clattn_decode_execute_buffers(p, cb, &bad[i].b, bad[i].n, bad[i].valid, bad[i].nwait, NULL, NULL),
                     bad[i].st, "case %zu: %s", i, clattn_last_error());
        cr_assert(strstr(clattn_last_error(), bad[i].needle), "case %zu: '%s' lacks '%s'", i, clattn_last_error(),
                  bad[i].needle);
    }
    clattn_kv_cache_lengths(cb, lb);
    for (size_t b = 0; b < B; b++) cr_assert_eq(lb[b], lh[b], "a refused call changed length %zu", b);
    clattn_kv_cache_read(cb, k2, v2);
    cr_assert_eq(memcmp(k1, k2, nk * sizeof *k1), 0, "a refused call changed the keys");
    cr_assert_eq(memcmp(v1, v2, nv * sizeof *v1), 0, "a refused call changed the values");
    float *after = malloc((OO + B * P * Eo) * sizeof *after);
    clEnqueueReadBuffer(q, ob, CL_TRUE, 0, (OO + B * P * Eo) * sizeof(float), after, 0, NULL, NULL);
    for (size_t i = 0; i < OO + B * P * Eo; i++) cr_assert_eq(after[i], mark, "a refused call wrote out[%zu]", i);
    free(after);
    clReleaseMemObject(small);
    /* the ref device has no buffers */
    clattn_device *ref = tu_open_ref();
    clattn_decode_plan *rp = NULL;
    clattn_kv_cache *rc = make_paged(ref, &m, B, cap, half, page, 0);
    cr_assert_eq(tu_decode_plan_create(ref, &d, &m.w, &rp), CLATTN_STATUS_SUCCESS);
    const clattn_decode_buffers any = {.x = {xb, 0}, .out = {ob, 0}};
    cr_assert_eq(clattn_decode_execute_buffers(rp, rc, &any, 1, NULL, 0, NULL, NULL), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "OpenCL"), "%s", clattn_last_error());
    clattn_kv_cache_free(rc);
    clattn_decode_plan_free(rp);
    clattn_device_free(ref);
    free(k1), free(v1), free(k2), free(v2), free(x), free(oh), free(ob_host);
    clReleaseMemObject(xb), clReleaseMemObject(ob);
    clattn_kv_cache_free(ch), clattn_kv_cache_free(cb);
    clattn_decode_plan_free(p);
    model_free(&m);
}

Test(decode, buffers_opencl)
{
    clattn_device *dev = tu_open_opencl();
    buffers_case(dev, 0, 0, 0);
    buffers_case(dev, 1, 3, 0);
    clattn_device_free(dev);
}

/* ---------------------------------------------------------------- packed new tokens (args.cu_new) */

/* Packed steps (args.cu_new): prompts of different lengths (one empty) without padding rows, then steps in which the
 * sequences bring 0 to 7 tokens (new_tokens given, or 0 for the longest), and a step without any token (NULL arrays:
 * nothing changes). Each sequence's outputs equal the oracle's causal run over its own tokens, the cache holds exactly
 * its tokens, and nothing is written past the packed rows of out. On OpenCL the same steps on the caller's buffers
 * (clattn_decode_execute_buffers_varlen, at offsets, behind a user event) give the same bits and the same cache. */
static void packed(clattn_device *dev, int half, size_t splits, size_t page, int plain)
{
    enum { B = 4, P = 13, STEPS = 6, OX = 5, OO = 3, TAIL = 7 };
    static const uint32_t counts[STEPS][B] = {{13, 0, 1, 6}, {1, 1, 1, 1}, {0, 3, 1, 2}, {2, 0, 0, 0}, {0, 0, 0, 0},
                                              {1, 7, 0, 1}};
    static const size_t given[STEPS] = {0, 1, 3, 0, 0, 9}; /* new_tokens: 0 = the longest count */
    tu_rng r = {91 + (uint64_t)half + 7 * page + 13 * (uint64_t)plain};
    model m;
    /* plain: no projections, x holds each token's heads (Q = K = V) and out is the attention output itself, written
     * by the decode core (or the split-K merge) into the caller's rows */
    const size_t E = plain ? 4 * 8 : half ? 16 : 24;
    model_make(&m, &r, E, 4, plain ? 4 : 2, 8, 8, half);
    const size_t Eo = plain ? E : m.Eo, cap = P + 12;
    clattn_attention_desc d = model_desc(&m, B, P, 0, half);
    if (plain) d.out_dim = 0, d.head_dim_qk = d.head_dim_v = 0;
    d.kv_page_size = page;
    const clattn_attention_weights none = {0};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, plain ? NULL : &m.w, &p), CLATTN_STATUS_SUCCESS, "%s",
                 clattn_last_error());
    cr_assert_eq(clattn_decode_plan_set_splits(p, splits), CLATTN_STATUS_SUCCESS);
    clattn_kv_cache *cache = make_paged(dev, &m, B, cap, half, page, 0);
    const int cl = clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL;
    clattn_kv_cache *cb = cl ? make_paged(dev, &m, B, cap, half, page, 0) : NULL;
    cl_context ctx = cl ? clattn_device_context(dev) : NULL;
    cl_command_queue q = cl ? clattn_device_queue(dev) : NULL;
    cl_mem xb = NULL, ob = NULL;
    if (cl) {
        cl_int err;
        xb = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (OX + B * P * E) * sizeof(float), NULL, &err);
        ob = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (OO + B * P * Eo + TAIL) * sizeof(float), NULL, &err);
        cr_assert_eq(err, CL_SUCCESS);
    }
    float *seq = calloc(B * cap * E, sizeof *seq), *got = calloc(B * cap * Eo, sizeof *got);
    size_t len[B] = {0};
    for (int s = 0; s < STEPS; s++) {
        uint32_t cu[B + 1] = {0};
        for (size_t b = 0; b < B; b++) cu[b + 1] = cu[b] + counts[s][b];
        const size_t rows = cu[B];
        float *x = rows ? vals(&r, rows * E, half, 6, 1.0f) : NULL;
        float *out = rows ? tu_poisoned(rows * Eo + TAIL) : NULL; /* TAIL past the packed rows: never written */
        clattn_decode_args a = {.x = x, .new_tokens = given[s], .out = out, .cu_new = cu};
        cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_SUCCESS, "step %d: %s", s, clattn_last_error());
        for (size_t i = rows * Eo; rows && i < rows * Eo + TAIL; i++)
            cr_assert(isnan(out[i]), "step %d: out[%zu], past the packed rows, was written", s, i);
        if (cl) { /* the same step on buffers */
            cr_assert_eq(clEnqueueFillBuffer(q, ob, &(float){NAN}, sizeof(float), 0,
                                             (OO + B * P * Eo + TAIL) * sizeof(float), 0, NULL, NULL), CL_SUCCESS);
            if (rows)
                cr_assert_eq(clEnqueueWriteBuffer(q, xb, CL_TRUE, OX * sizeof(float), rows * E * sizeof(float), x, 0,
                                                  NULL, NULL), CL_SUCCESS);
            cl_int err;
            cl_event gate = clCreateUserEvent(ctx, &err), done = NULL;
            const clattn_decode_buffers bufs = {.x = {rows ? xb : NULL, OX}, .out = {rows ? ob : NULL, OO}};
            cr_assert_eq(clattn_decode_execute_buffers_varlen(p, cb, &bufs, given[s], cu, B + 1, 1, &gate, &done),
                         CLATTN_STATUS_SUCCESS, "step %d on buffers: %s", s, clattn_last_error());
            cr_assert_eq(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
            cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS, "step %d: the completion event", s);
            clReleaseEvent(gate), clReleaseEvent(done);
            float *back = tu_poisoned(OO + B * P * Eo + TAIL);
            cr_assert_eq(clEnqueueReadBuffer(q, ob, CL_TRUE, 0, (OO + B * P * Eo + TAIL) * sizeof(float), back, 0, NULL,
                                             NULL), CL_SUCCESS);
            if (rows)
                cr_assert_eq(memcmp(back + OO, out, rows * Eo * sizeof *out), 0, "step %d (half %d, splits %zu, page "
                             "%zu): the buffers' output differs from the host path's", s, half, splits, page);
            for (size_t i = 0; i < OO + B * P * Eo + TAIL; i++)
                if (i < OO || i >= OO + rows * Eo)
                    cr_assert(isnan(back[i]), "step %d on buffers: out[%zu], outside the packed rows, was written", s,
                              i);
            free(back);
        }
        for (size_t b = 0; rows && b < B; b++) { /* (a step without tokens: nothing to keep) */
            memcpy(seq + (b * cap + len[b]) * E, x + cu[b] * E, counts[s][b] * E * sizeof *seq);
            memcpy(got + (b * cap + len[b]) * Eo, out + cu[b] * Eo, counts[s][b] * Eo * sizeof *got);
            len[b] += counts[s][b];
        }
        free(x), free(out);
    }
    for (size_t b = 0; b < B; b++) {
        if (!len[b]) continue;
        double *want = NULL;
        if (plain) { /* the oracle on the sequence's own tokens, without projections */
            clattn_attention_desc one = d;
            one.batch = 1, one.seq_q = len[b], one.kv_page_size = 0;
            want = malloc(len[b] * Eo * sizeof *want);
            clattn_attention_args oa = {.x = seq + b * cap * E};
            cr_assert_eq(oracle_attention(&one, &none, &oa, want, NULL), 0);
        } else {
            want = expect(&m, 1, len[b], 0, half, seq + b * cap * E);
        }
        char what[140];
        snprintf(what, sizeof what, "packed: sequence %zu (%zu tokens, half %d, splits %zu, page %zu, plain %d)", b,
                 len[b], half, splits, page, plain);
        check(got + b * cap * Eo, want, len[b] * Eo, what);
        free(want);
    }
    if (!plain) expect_cache(cache, &m, B, cap, seq, len, half, "packed");
    if (cl && !plain) expect_cache(cb, &m, B, cap, seq, len, half, "packed, on buffers");
    if (cl) clReleaseMemObject(xb), clReleaseMemObject(ob), clattn_kv_cache_free(cb);
    free(seq), free(got);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    model_free(&m);
}

static void packed_cases(clattn_device *dev)
{
    packed(dev, 0, 0, 0, 0);
    packed(dev, 0, 3, 0, 0); /* split-K: the packed rows merged */
    packed(dev, 1, 0, 0, 0);
    packed(dev, 0, 0, 0, 1); /* no projections: the core writes the caller's rows */
    packed(dev, 0, 3, 0, 1); /* ... and the merge */
}

Test(decode, packed_ref) { clattn_device *d = tu_open_ref(); packed_cases(d); clattn_device_free(d); }
Test(decode, packed_opencl) { clattn_device *d = tu_open_opencl(); packed_cases(d); clattn_device_free(d); }
Test(pages, packed_ref) { clattn_device *d = tu_open_ref(); packed(d, 0, 0, 4, 0); clattn_device_free(d); }
Test(pages, packed_opencl) { clattn_device *d = tu_open_opencl(); packed(d, 0, 2, 4, 0); clattn_device_free(d); }

/* Packed steps refused with the reason, the cache's lengths and contents and out unchanged. */
static void packed_refusals(clattn_device *dev)
{
    enum { B = 3, P = 5 };
    tu_rng r = {404};
    model m;
    model_make(&m, &r, 24, 4, 2, 8, 8, 0);
    const size_t Eo = m.Eo, cap = 7;
    clattn_attention_desc d = model_desc(&m, B, P, 0, 0);
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_kv_cache *cache = make_cache(dev, &m, B, cap, 0);
    /* a decode step's rows are 32-bit in the kernels (their first rows, cu_new's offsets) */
    clattn_attention_desc huge = d;
    huge.batch = (size_t)1 << 17, huge.seq_q = (size_t)1 << 15;
    clattn_decode_plan *hp = NULL;
    cr_assert_eq(clattn_decode_plan_create(dev, &huge, &m.w, &hp), CLATTN_STATUS_SIZE_OVERFLOW, "%s",
                 clattn_last_error());
    cr_assert(strstr(clattn_last_error(), "rows are 32-bit"), "%s", clattn_last_error());
    huge.seq_q = ((size_t)1 << 15) - 1; /* 2^32 - 2^17 rows pass this check (refused later: no weight counts) */
    cr_assert_neq(clattn_decode_plan_create(dev, &huge, &m.w, &hp), CLATTN_STATUS_SUCCESS);
    cr_assert_null(strstr(clattn_last_error(), "32-bit"), "%s", clattn_last_error());
    cr_assert_null(hp);
    const uint32_t ok[B + 1] = {0, 2, 2, 5};
    float *x = vals(&r, B * P * m.E, 0, 0, 1.0f), *out = tu_poisoned(B * P * Eo);
    clattn_decode_args a0 = {.x = x, .out = out, .cu_new = ok};
    cr_assert_eq(tu_decode_execute(p, cache, &a0), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const size_t HK = m.HK, nk = B * HK * cap * m.dk, nv = B * HK * cap * m.dv;
    float *k1 = tu_poisoned(nk), *v1 = tu_poisoned(nv), *k2 = tu_poisoned(nk), *v2 = tu_poisoned(nv);
    clattn_kv_cache_read(cache, k1, v1);
    const size_t valid[B] = {1, 1, 1};
    struct {
        uint32_t cu[B + 1];
        size_t cu_count, n, x_rows;
        const size_t *valid;
        clattn_status st;
        const char *needle;
    } bad[] = {
        {{0, 2, 2, 5}, B + 1, 0, 5, valid, CLATTN_STATUS_INVALID_ARGUMENT, "valid is given with args.cu_new"},
        {{0, 2, 2, 5}, B, 0, 5, NULL, CLATTN_STATUS_SHAPE_MISMATCH, "cu_new has 3 elements"},
        {{1, 2, 2, 5}, B + 1, 0, 4, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "cu_new[0] is 1"},
        {{0, 3, 2, 5}, B + 1, 0, 5, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "cu_new decreases"},
        {{0, 2, 2, 5}, B + 1, 2, 5, NULL, CLATTN_STATUS_SHAPE_MISMATCH, "sequence 2 has 3 rows, past new_tokens = 2"},
        {{0, 6, 6, 6}, B + 1, 0, 6, NULL, CLATTN_STATUS_SHAPE_MISMATCH, "sequence 0 has 6 rows, past seq_q = 5"},
        {{0, 2, 2, 5}, B + 1, P + 1, 5, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "new_tokens = 6: at most seq_q"},
        {{0, 2, 2, 5}, B + 1, 0, 4, NULL, CLATTN_STATUS_SHAPE_MISMATCH, "cu_new[batch] = 5 rows x embed"},
        {{0, 0, 0, 5}, B + 1, 0, 5, NULL, CLATTN_STATUS_SHAPE_MISMATCH, "sequence 2: 3 cached + 5 new tokens exceed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        clattn_decode_args a = {.x = x, .x_count = bad[i].x_rows * m.E, .new_tokens = bad[i].n, .valid = bad[i].valid,
                                .valid_count = bad[i].valid ? B : 0, .out = out, .out_count = bad[i].x_rows * Eo,
                                .cu_new = bad[i].cu, .cu_new_count = bad[i].cu_count};
        for (size_t e = 0; e < B * P * Eo; e++) out[e] = 1234.5f;
        cr_assert_eq(clattn_decode_execute(p, cache, &a), bad[i].st, "case %zu: %s", i, clattn_last_error());
        cr_assert(strstr(clattn_last_error(), bad[i].needle), "case %zu: '%s' lacks '%s'", i, clattn_last_error(),
                  bad[i].needle);
        for (size_t e = 0; e < B * P * Eo; e++) cr_assert_eq(out[e], 1234.5f, "case %zu wrote out[%zu]", i, e);
    }
    /* cu_new_count without cu_new */
    clattn_decode_args a = {.x = x, .new_tokens = 1, .out = out, .cu_new_count = B + 1};
    cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "cu_new is NULL"), "%s", clattn_last_error());
    size_t lens[B];
    clattn_kv_cache_lengths(cache, lens);
    for (size_t b = 0; b < B; b++) cr_assert_eq(lens[b], ok[b + 1] - ok[b], "a refused step changed length %zu", b);
    clattn_kv_cache_read(cache, k2, v2);
    cr_assert_eq(memcmp(k1, k2, nk * sizeof *k1), 0, "a refused step changed the keys");
    cr_assert_eq(memcmp(v1, v2, nv * sizeof *v1), 0, "a refused step changed the values");
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL) {
        cl_int err;
        cl_mem xb = clCreateBuffer(clattn_device_context(dev), CL_MEM_READ_WRITE, 4096, NULL, &err);
        const clattn_decode_buffers bufs = {.x = {xb, 0}, .out = {xb, 512}};
        cr_assert_eq(clattn_decode_execute_buffers_varlen(p, cache, &bufs, 0, NULL, 0, 0, NULL, NULL),
                     CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "cu_new is NULL"), "%s", clattn_last_error());
        cr_assert_eq(clattn_decode_execute_buffers_varlen(p, cache, &bufs, 0, (const uint32_t[]){0, 1, 1}, 3, 0, NULL,
                                                          NULL), CLATTN_STATUS_SHAPE_MISMATCH);
        cr_assert(strstr(clattn_last_error(), "buffers.cu_new has 3 elements"), "%s", clattn_last_error());
        clReleaseMemObject(xb);
    }
    free(k1), free(v1), free(k2), free(v2), free(x), free(out);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    model_free(&m);
}

Test(decode, packed_refusals_ref) { clattn_device *d = tu_open_ref(); packed_refusals(d); clattn_device_free(d); }
Test(decode, packed_refusals_opencl) { clattn_device *d = tu_open_opencl(); packed_refusals(d); clattn_device_free(d); }

/* the same on paged caches: the steps on the caller's buffers (each behind a user event) and from host arrays */
Test(pages, buffers_opencl)
{
    clattn_device *dev = tu_open_opencl();
    buffers_case(dev, 0, 0, 4);
    buffers_case(dev, 1, 3, 4);
    clattn_device_free(dev);
}

/* Stage times of a decode step: every stage that ran has a positive time, COMBINE only with split-K; the ref
 * device refuses profiling, and the names are the documented ones. */
Test(decode, stage_times_opencl)
{
    clattn_device *dev = tu_open_opencl();
    tu_rng r = {31};
    model m;
    model_make(&m, &r, 24, 4, 2, 8, 8, 0);
    clattn_attention_desc d = model_desc(&m, 2, 4, 0, 0);
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_kv_cache *cache = make_cache(dev, &m, 2, 64, 0);
    const clattn_status prof = clattn_decode_plan_set_profiling(p, 1);
    if (tu_profiling_refused(dev, prof, "decode stage times")) cr_skip_test("timestamps not real here (printed above)");
    cr_assert_eq(prof, CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float x[2 * 4 * 24], out[2 * 4 * 13];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = val(&r, 0, 0, 1.0f);
    for (size_t splits = 1; splits <= 3; splits += 2) {
        cr_assert_eq(clattn_decode_plan_set_splits(p, splits), CLATTN_STATUS_SUCCESS);
        clattn_decode_args a = {.x = x, .new_tokens = 1, .out = out};
        cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        double ms[CLATTN_DECODE_STAGE_COUNT];
        for (int s = 0; s < CLATTN_DECODE_STAGE_COUNT; s++) ms[s] = -1.0;
        cr_assert_eq(clattn_decode_plan_stage_times(p, ms), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (int s = 0; s < CLATTN_DECODE_STAGE_COUNT; s++) {
            if (s == CLATTN_DECODE_STAGE_COMBINE && splits == 1)
                cr_assert_eq(ms[s], 0.0, "no split-K, yet combine took %g ms", ms[s]);
            else
                cr_assert_gt(ms[s], 0.0, "splits %zu: stage %s has no time", splits,
                             clattn_decode_stage_name((clattn_decode_stage)s));
        }
    }
    static const char *const names[] = {"projection", "append", "attend", "combine", "out_projection"};
    for (int s = 0; s < CLATTN_DECODE_STAGE_COUNT; s++)
        cr_assert_str_eq(clattn_decode_stage_name((clattn_decode_stage)s), names[s]);
    cr_assert_str_eq(clattn_decode_stage_name(CLATTN_DECODE_STAGE_COUNT), "unknown");
    clattn_device *ref = tu_open_ref();
    clattn_decode_plan *rp = NULL;
    cr_assert_eq(tu_decode_plan_create(ref, &d, &m.w, &rp), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(clattn_decode_plan_set_profiling(rp, 1), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "OpenCL"), "%s", clattn_last_error());
    double ms[CLATTN_DECODE_STAGE_COUNT];
    cr_assert_eq(clattn_decode_plan_stage_times(rp, ms), CLATTN_STATUS_UNSUPPORTED);
    clattn_decode_plan_free(rp);
    clattn_device_free(ref);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    model_free(&m);
    clattn_device_free(dev);
}

/* ---------------------------------------------------------------- validation */

static void errors(clattn_device *dev)
{
    tu_rng r = {9};
    model m;
    model_make(&m, &r, 24, 4, 2, 8, 8, 0);
    clattn_attention_desc good = model_desc(&m, 2, 4, 0, 0);
    clattn_decode_plan *p = NULL;
    /* descriptions a decode plan refuses */
    struct { clattn_attention_desc d; clattn_status st; const char *needle; } bad[8];
    for (int i = 0; i < 8; i++) bad[i].d = good;
    bad[0].d.causal = 0, bad[0].st = CLATTN_STATUS_INVALID_ARGUMENT, bad[0].needle = "causal";
    bad[1].d.cross = 1, bad[1].d.seq_kv = 4, bad[1].st = CLATTN_STATUS_INVALID_ARGUMENT, bad[1].needle = "cross";
    bad[2].d.attn_mask = CLATTN_MASK_BOOL, bad[2].st = CLATTN_STATUS_INVALID_ARGUMENT, bad[2].needle = "attn_mask";
    bad[3].d.dropout = 0.1f, bad[3].st = CLATTN_STATUS_INVALID_ARGUMENT, bad[3].needle = "dropout";
    bad[4].d.need_weights = 1, bad[4].st = CLATTN_STATUS_INVALID_ARGUMENT, bad[4].needle = "weights";
    bad[5].d.algorithm = CLATTN_ALGORITHM_UNFUSED, bad[5].st = CLATTN_STATUS_INVALID_ARGUMENT, bad[5].needle = "UNFUSED";
    bad[6].d.kv_heads = 3, bad[6].st = CLATTN_STATUS_SHAPE_MISMATCH, bad[6].needle = "kv_heads (3) must divide heads (4)";
    bad[7].d.head_dim_qk = 300, bad[7].st = CLATTN_STATUS_UNSUPPORTED, bad[7].needle = "256";
    for (int i = 0; i < 8; i++) {
        clattn_attention_weights w = m.w;
        if (i == 7) { /* a valid description with large heads: weights of that size */
            w.w_query = w.w_key = w.w_value = w.b_query = w.b_key = w.b_value = w.w_out = NULL;
            w.b_out = NULL;
            bad[i].d.out_dim = 0;
            bad[i].d.embed = 1200, bad[i].d.heads = 4, bad[i].d.kv_heads = 4, bad[i].d.head_dim_qk = 0;
            bad[i].d.head_dim_v = 0;
        }
        p = (clattn_decode_plan *)&m;
        cr_assert_eq(tu_decode_plan_create(dev, &bad[i].d, &w, &p), bad[i].st, "case %d: %s", i, clattn_last_error());
        cr_assert_null(p, "case %d: the plan pointer must be NULL after a failure", i);
        cr_assert(strstr(clattn_last_error(), bad[i].needle), "case %d: '%s' lacks '%s'", i, clattn_last_error(),
                  bad[i].needle);
    }
    /* the window needs causal (ordinary plans too) */
    clattn_attention_desc wd = good;
    wd.causal = 0, wd.window = 3;
    clattn_plan *ap = NULL;
    cr_assert_eq(tu_plan_create(dev, &wd, &m.w, &ap), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "window"));
    /* GQA without projections */
    clattn_attention_desc nw = {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4, .kv_heads = 2, .causal = 1};
    cr_assert_eq(tu_plan_create(dev, &nw, NULL, &ap), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "Q/K/V weights"));

    /* caches */
    clattn_kv_cache *c = NULL;
    clattn_kv_cache_desc cd = {.batch = 2, .capacity = 6, .kv_heads = 2, .head_dim_qk = 8, .head_dim_v = 8};
    clattn_kv_cache_desc cbad = cd;
    cbad.capacity = 0;
    cr_assert_eq(clattn_kv_cache_create(dev, &cbad, &c), CLATTN_STATUS_INVALID_ARGUMENT);
    cbad = cd, cbad.type = (clattn_kv_type)7;
    cr_assert_eq(clattn_kv_cache_create(dev, &cbad, &c), CLATTN_STATUS_INVALID_ARGUMENT);
    cbad = cd, cbad.capacity = (size_t)1 << 40;
    cr_assert_eq(clattn_kv_cache_create(dev, &cbad, &c), CLATTN_STATUS_SIZE_OVERFLOW);
    cr_assert_null(c);
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(tu_decode_plan_create(dev, &good, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_decode_plan_set_splits(p, 65), CLATTN_STATUS_INVALID_ARGUMENT);

    float x[2 * 4 * 24], out[2 * 4 * 13];
    tu_fill(&r, x, 2 * 4 * 24, -1, 1);
    for (size_t i = 0; i < 2 * 4 * 13; i++) out[i] = 12345.0f;
    clattn_decode_args a = {.x = x, .new_tokens = 4, .out = out};
    const size_t too_many[2] = {5, 1};
    struct { clattn_decode_args a; clattn_status st; const char *needle; } ba[] = {
        {{.x = NULL, .new_tokens = 4, .out = out}, CLATTN_STATUS_INVALID_ARGUMENT, "args.x"},
        {{.x = x, .new_tokens = 4, .out = NULL}, CLATTN_STATUS_INVALID_ARGUMENT, "args.out"},
        {{.x = x, .new_tokens = 0, .out = out}, CLATTN_STATUS_INVALID_ARGUMENT, "new_tokens = 0"},
        {{.x = x, .new_tokens = 5, .out = out}, CLATTN_STATUS_INVALID_ARGUMENT, "new_tokens = 5"},
        {{.x = x, .new_tokens = 4, .valid = too_many, .out = out}, CLATTN_STATUS_INVALID_ARGUMENT, "valid[0] = 5"},
    };
    for (size_t i = 0; i < sizeof ba / sizeof ba[0]; i++) {
        cr_assert_eq(tu_decode_execute(p, c, &ba[i].a), ba[i].st, "args case %zu", i);
        cr_assert(strstr(clattn_last_error(), ba[i].needle), "args case %zu: '%s'", i, clattn_last_error());
    }
    /* overflow of the capacity: the second call of 4 would reach 8 > 6; nothing changes */
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float before[2 * 4 * 13];
    memcpy(before, out, sizeof before);
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SHAPE_MISMATCH);
    cr_assert(strstr(clattn_last_error(), "capacity (6)"), "%s", clattn_last_error());
    cr_assert_eq(memcmp(before, out, sizeof before), 0, "a refused call wrote the output");
    size_t lens[2];
    clattn_kv_cache_lengths(c, lens);
    cr_assert(lens[0] == 4 && lens[1] == 4, "a refused call changed the lengths");
    cr_assert_eq(clattn_kv_cache_reset(c), CLATTN_STATUS_SUCCESS);
    clattn_kv_cache_lengths(c, lens);
    cr_assert(lens[0] == 0 && lens[1] == 0);
    /* caches that do not match the plan */
    const clattn_kv_cache_desc mism[] = {
        {.batch = 3, .capacity = 6, .kv_heads = 2, .head_dim_qk = 8, .head_dim_v = 8},
        {.batch = 2, .capacity = 6, .kv_heads = 4, .head_dim_qk = 8, .head_dim_v = 8},
        {.batch = 2, .capacity = 6, .kv_heads = 2, .head_dim_qk = 4, .head_dim_v = 8},
        {.batch = 2, .capacity = 6, .kv_heads = 2, .head_dim_qk = 8, .head_dim_v = 4},
        {.batch = 2, .capacity = 6, .kv_heads = 2, .head_dim_qk = 8, .head_dim_v = 8, .type = CLATTN_KV_HALF},
    };
    for (size_t i = 0; i < sizeof mism / sizeof mism[0]; i++) {
        clattn_kv_cache *c2 = NULL;
        cr_assert_eq(tu_kv_cache_create(dev, &mism[i], &c2), CLATTN_STATUS_SUCCESS);
        clattn_status st = tu_decode_execute(p, c2, &a);
        cr_assert(st == CLATTN_STATUS_SHAPE_MISMATCH || st == CLATTN_STATUS_INVALID_ARGUMENT, "mismatch %zu: %d", i, st);
        cr_assert(strstr(clattn_last_error(), i == 4 ? "kv_half" : "does not match"), "%s", clattn_last_error());
        clattn_kv_cache_free(c2);
    }
    cr_assert_eq(tu_decode_execute(NULL, c, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_kv_cache_truncate(c, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_kv_cache_read(NULL, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_kv_cache_free(c);
    clattn_decode_plan_free(p);
    clattn_kv_cache_free(NULL);
    clattn_decode_plan_free(NULL);
    model_free(&m);
}

Test(decode, errors_ref)
{
    clattn_device *dev = tu_open_ref();
    errors(dev);
    clattn_device_free(dev);
}

Test(decode, errors_opencl)
{
    clattn_device *dev = tu_open_opencl();
    errors(dev);
    clattn_device_free(dev);
}

/* ---- the device's loop limit (a driver defect the probes measure: Mesa 22's llvmpipe ends a work-item's loops after
 * 65,535 iterations without an error), lowered here to 20000: a step cuts its keys into split-K parts short enough for
 * it, a long prefill step too, and computes the right answer; a step that would need more parts than it may take is
 * refused with the limit named, and nothing of it is written. */
/* A core CLATTN_CORE forces that states no loop bound is refused under any loop limit: the tests below skip. */
static void skip_unbounded_forced_core(void)
{
    for (int kind = CLATTN_CORE_PREFILL; kind <= CLATTN_CORE_BACKWARD; kind++) {
        const clattn_core_info *f = tu_forced_core_of((clattn_core_kind)kind);
        if (f && !clattn_core_find(f->name)->trips)
            cr_skip_test("CLATTN_CORE forces %s, which has no loop bound: refused under a loop limit (the refusal: "
                         "limits::loop_limit_forced)", f->name);
    }
}

Test(decode, loop_limit_opencl)
{
    skip_unbounded_forced_core();
    clattn_device *dev = tu_open_opencl();
    dev->caps.loop_limit = 20000;
    static const size_t chunks[] = {700, 1, 3, 500, 1};
    decode_case(dev, &(dcase){.B = 2, .T = 1205, .H = 4, .HK = 2, .dk = 8, .dv = 8, .chunks = chunks}, 950);

    /* one step over a cache of `len` keys, every part's bound within the budget */
    tu_rng r = {951};
    model m;
    model_make(&m, &r, 16, 4, 2, 8, 8, 0);
    clattn_attention_desc d = model_desc(&m, 1, 1, 0, 0);
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const size_t cap = 48000, lens[2][1] = {{1500}, {47000}};
    clattn_kv_cache *c = make_cache(dev, &m, 1, cap, 0);
    float *k = vals(&r, 2 * cap * 8, 0, 1, 1.0f), *v = vals(&r, 2 * cap * 8, 0, 1, 1.0f);
    float x[16], out[13];
    tu_fill(&r, x, 16, -1.0f, 1.0f);
    clattn_decode_args a = {.x = x, .new_tokens = 1, .out = out};
    cr_assert_eq(clattn_kv_cache_write(c, k, v, lens[0]), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_core *core = p->base->core;
    const clattn_decode_spec *spec = core->spec;
    if (dev->caps.dclass == CLATTN_CLASS_CPU && !tu_forced_core_of(CLATTN_CORE_DECODE)) /* with fewer rows */
        cr_assert_str_eq(core->name, "decode_attend", "%s (%s)", core->name, p->base->core_params_text);
    clattn_core_params prm = p->base->core_params;
    if (prm.v[spec->rows] > 2) prm.v[spec->rows] = 2; /* a step's 2 rows (GQA) run as the few-rows variant */
    const size_t parts = clattn_decode_plan_last_splits(p), keys = (1501 + parts - 1) / parts;
    cr_assert_leq(spec->part_trips(&p->base->d, &prm, keys), clattn_loop_budget(&dev->caps),
                  "%s (%s): %zu parts of %zu keys run past the budget", core->name, p->base->core_params_text, parts, keys);
    /* one part forced, then a cache of 47000 keys: refused where the core's parts would run past the budget (with
     * decode_attend, AUTO's CPU core: both), else computed */
    for (int i = 0; i < 2; i++) {
        const size_t len0 = i ? lens[1][0] : 1501, most = i ? 64 : 1;
        size_t need = 1;
        while (need <= 64 && spec->part_trips(&p->base->d, &prm, (len0 + 1 + need - 1) / need) >
                                 clattn_loop_budget(&dev->caps))
            need++;
        if (!tu_forced_core_of(CLATTN_CORE_DECODE)) cr_assert_gt(need, most, "case %d runs within the limit", i);
        if (i) cr_assert_eq(clattn_kv_cache_write(c, k, v, lens[1]), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(clattn_decode_plan_set_splits(p, i ? 0 : 1), CLATTN_STATUS_SUCCESS);
        for (int j = 0; j < 13; j++) out[j] = NAN;
        const clattn_status st = tu_decode_execute(p, c, &a);
        if (need <= most) {
            cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            cr_assert_eq(clattn_kv_cache_truncate(c, (size_t[]){len0}), CLATTN_STATUS_SUCCESS);
            continue;
        }
        cr_assert_eq(st, CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "%s", clattn_last_error());
        cr_assert(strstr(clattn_last_error(), "20000") && strstr(clattn_last_error(), "split-K"), "%s",
                  clattn_last_error());
        cr_assert(strstr(clattn_last_error(), i ? "may take 64" : "may take 1 (clattn_decode_plan_set_splits)"), "%s",
                  clattn_last_error());
        size_t now[1];
        cr_assert_eq(clattn_kv_cache_lengths(c, now), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(now[0], len0, "the refused step changed the cache's length");
        for (int j = 0; j < 13; j++) cr_assert(isnan(out[j]), "the refused step wrote its output");
    }
    /* without the limit, the same step runs */
    dev->caps.loop_limit = 0;
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    free(k), free(v);
    clattn_kv_cache_free(c);
    clattn_decode_plan_free(p);
    model_free(&m);
    clattn_device_free(dev);
}

/* A step's projections of a few rows run by their own kernel (linear_small on CPUs), whose work-items loop over E:
 * under a device's loop limit (lowered here to 20000, above the GEMM core's least on CPUs) that kernel gives way to
 * the GEMM core, which cuts E into blocks, when E is long (48000: 18,004 trips for 2 rows), and the steps compute the
 * right answer. And a long step (1400 new tokens over 2901 keys) takes split-K parts for every row, more than the
 * plan's partial buffers hold at creation: they grow. */
Test(decode, loop_limit_projections_opencl)
{
    skip_unbounded_forced_core();
    clattn_device *dev = tu_open_opencl();
    dev->caps.loop_limit = 20000;
    clattn_test_trips_reach(1);
    decode_case(dev, &(dcase){.B = 2, .T = 9, .H = 4, .HK = 2, .dk = 8, .dv = 8, .E = 48000, .P = 5}, 960);
    static const size_t chunks[] = {1500, 1, 1400, 1};
    decode_case(dev, &(dcase){.B = 2, .T = 2902, .H = 4, .HK = 2, .dk = 8, .dv = 8, .chunks = chunks}, 961);
    const size_t reach = clattn_test_trips_reach(0);
    cr_assert(reach > 0 && reach <= clattn_loop_budget(&dev->caps),
              "a few-rows projection of %zu loop iterations per work-item ran; the budget is %zu", reach,
              clattn_loop_budget(&dev->caps));
    clattn_device_free(dev);
}

/* A cache on one device, a plan on another. */
Test(decode, cache_on_other_device)
{
    clattn_device *ref = tu_open_ref(), *cl = tu_open_opencl();
    tu_rng r = {3};
    model m;
    model_make(&m, &r, 24, 4, 2, 8, 8, 0);
    clattn_attention_desc d = model_desc(&m, 1, 2, 0, 0);
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(cl, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_kv_cache *c = make_cache(ref, &m, 1, 4, 0);
    float x[2 * 24] = {0}, out[2 * 13];
    clattn_decode_args a = {.x = x, .new_tokens = 2, .out = out};
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "different devices"));
    clattn_kv_cache_free(c);
    clattn_decode_plan_free(p);
    model_free(&m);
    clattn_device_free(ref);
    clattn_device_free(cl);
}

/* ---------------------------------------------------------------- the edges of state (issue 21) */

/* A cache filled exactly to its capacity, one token at a time past it refused, padding rows at the boundary,
 * truncation and writes at and past the capacity: every refused call leaves the lengths, the cache and the
 * output as they were; every accepted one is read back whole. Key/value heads 1, so sequence 0's position
 * `capacity` would be sequence 1's position 0: a write one past a boundary shows in the neighbour. */
static void capacity_edges(clattn_device *dev, int half)
{
    enum { B = 2, CAP = 6, N = 4 };
    tu_rng r = {131 + (uint64_t)half};
    model m;
    const size_t E = half ? 16 : 24;
    model_make(&m, &r, E, 4, 1, 8, 8, half);
    const size_t Eo = m.Eo;
    clattn_attention_desc d = model_desc(&m, B, N, 0, half);
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_kv_cache *cache = make_cache(dev, &m, B, CAP, half);
    clattn_kv_cache_desc got;
    cr_assert_eq(clattn_kv_cache_desc_get(cache, &got), CLATTN_STATUS_SUCCESS);
    cr_assert(got.batch == B && got.capacity == CAP && got.kv_heads == m.HK && got.head_dim_qk == m.dk &&
              got.head_dim_v == m.dv && got.type == (half ? CLATTN_KV_HALF : CLATTN_KV_FLOAT), "desc_get");
    cr_assert_eq(clattn_kv_cache_desc_get(NULL, &got), CLATTN_STATUS_INVALID_ARGUMENT);
    const size_t payload = B * m.HK * CAP * (m.dk + m.dv) * (half ? 2 : 4);
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL)
        cr_assert_eq(clattn_kv_cache_device_bytes(cache), payload, "%zu bytes", clattn_kv_cache_device_bytes(cache));
    else
        cr_assert_eq(clattn_kv_cache_device_bytes(cache), 0);
    float *seq = vals(&r, B * CAP * E, half, 6, 1.0f);     /* sequence b's tokens: seq[b][0 .. CAP-1] */
    double *want = expect(&m, B, CAP, 0, half, seq);
    float xs[B * N * 24], out[B * N * 13], before[B * N * 13];
    size_t len[B] = {0, 0};
    /* feed tokens t0 .. t0+n-1 of each sequence, valid[b] of them real (NULL: all), the rest noise */
    struct { size_t n; size_t valid[B]; int use_valid; clattn_status st; } steps[] = {
        {4, {0, 0}, 0, CLATTN_STATUS_SUCCESS},             /* 4 of 6 */
        {3, {0, 0}, 0, CLATTN_STATUS_SHAPE_MISMATCH},      /* 7 > 6: one past */
        {3, {2, 3}, 1, CLATTN_STATUS_SHAPE_MISMATCH},      /* sequence 1 one past, sequence 0 fits */
        {4, {2, 2}, 1, CLATTN_STATUS_SUCCESS},             /* exactly full, with padding rows past the boundary */
        {1, {0, 0}, 0, CLATTN_STATUS_SHAPE_MISMATCH},      /* full: one more is refused */
        {1, {0, 0}, 1, CLATTN_STATUS_SUCCESS},             /* nothing appended: allowed when full */
    };
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        const size_t n = steps[s].n;
        for (size_t b = 0; b < B; b++)
            for (size_t t = 0; t < n; t++)
                for (size_t e = 0; e < E; e++)
                    xs[(b * n + t) * E + e] = len[b] + t < CAP && (!steps[s].use_valid || t < steps[s].valid[b])
                                                  ? seq[(b * CAP + len[b] + t) * E + e]
                                                  : val(&r, half, 6, 1.0f);
        for (size_t i = 0; i < B * n * Eo; i++) out[i] = NAN;
        memcpy(before, out, sizeof before);
        clattn_decode_args a = {.x = xs, .new_tokens = n, .valid = steps[s].use_valid ? steps[s].valid : NULL,
                                .out = out};
        const clattn_status st = tu_decode_execute(p, cache, &a);
        char what[80];
        snprintf(what, sizeof what, "step %zu (half=%d)", s, half);
        cr_assert_eq(st, steps[s].st, "%s: %s", what, clattn_last_error());
        if (st != CLATTN_STATUS_SUCCESS) {
            cr_assert(strstr(clattn_last_error(), "capacity (6)"), "%s: %s", what, clattn_last_error());
            cr_assert_eq(memcmp(before, out, B * n * Eo * sizeof *out), 0, "%s: a refused call wrote out", what);
            expect_cache(cache, &m, B, CAP, seq, len, half, what);
            continue;
        }
        for (size_t b = 0; b < B; b++) {
            const size_t real = steps[s].use_valid ? steps[s].valid[b] : n;
            for (size_t t = 0; t < n; t++)
                for (size_t o = 0; o < Eo; o++) {
                    const float g = out[(b * n + t) * Eo + o];
                    if (t < real) {
                        const double w = want[(b * CAP + len[b] + t) * Eo + o];
                        cr_assert(oracle_close(g, w, TU_ATOL, TU_RTOL, 0, 0), "%s: out[b=%zu, t=%zu, %zu] = %.9g, "
                                  "want %.9g", what, b, t, o, g, w);
                    } else {
                        cr_assert_float_eq(g, m.bo[o], 1e-6, "%s: padding row b=%zu t=%zu", what, b, t);
                    }
                }
            len[b] += real;
        }
        expect_cache(cache, &m, B, CAP, seq, len, half, what);
    }
    cr_assert(len[0] == CAP && len[1] == CAP);
    /* truncation: one past a length refused with nothing changed (the valid entry before it included) */
    size_t bad[B] = {CAP - 1, CAP + 1};
    cr_assert_eq(clattn_kv_cache_truncate(cache, bad), CLATTN_STATUS_INVALID_ARGUMENT);
    expect_cache(cache, &m, B, CAP, seq, len, half, "a refused truncate");
    size_t cut[B] = {2, CAP};
    cr_assert_eq(clattn_kv_cache_truncate(cache, cut), CLATTN_STATUS_SUCCESS);
    len[0] = 2;
    expect_cache(cache, &m, B, CAP, seq, len, half, "truncated to 2 and 6"); /* past 2 reads 0, every head */
    /* writes: one past the capacity refused, nothing changed; exactly the capacity accepted */
    const size_t HK = m.HK;
    float *k = tu_poisoned(B * HK * CAP * m.dk), *v = tu_poisoned(B * HK * CAP * m.dv);
    cr_assert_eq(clattn_kv_cache_read(cache, k, v), CLATTN_STATUS_SUCCESS);
    clattn_kv_cache *copy = make_cache(dev, &m, B, CAP, half);
    const size_t start[B] = {1, 3};
    cr_assert_eq(clattn_kv_cache_write(copy, k, v, start), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const size_t past[B] = {2, CAP + 1};
    cr_assert_eq(clattn_kv_cache_write(copy, k, v, past), CLATTN_STATUS_SHAPE_MISMATCH);
    expect_cache(copy, &m, B, CAP, seq, start, half, "a refused write");
    const size_t full[B] = {2, CAP};
    cr_assert_eq(clattn_kv_cache_write(copy, k, v, full), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    expect_cache(copy, &m, B, CAP, seq, full, half, "written to the capacity");
    clattn_kv_cache_free(copy);
    free(k), free(v), free(seq), free(want);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    model_free(&m);
}

Test(edges, capacity_ref) { clattn_device *d = tu_open_ref(); capacity_edges(d, 0); capacity_edges(d, 1); clattn_device_free(d); }
Test(edges, capacity_opencl)
{
    clattn_device *d = tu_open_opencl();
    capacity_edges(d, 0);
    capacity_edges(d, 1);
    clattn_device_free(d);
}

/* clattn_kv_cache_write rounds to half and to bfloat16 exactly as the appends do (to nearest, ties to even), on every
 * device; a FLOAT cache keeps every bit. */
static void write_rounds(clattn_device *dev)
{
    const float vals4[] = {1.0f / 3.0f, 1.0f + 0x1p-11f, 1.0f + 0x1p-11f + 0x1p-13f, -65504.0f, 0x1p-25f, 2049.0f,
                           1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-7f, 3.0e38f}; /* bfloat16 ties, a float's range */
    enum { NV = sizeof vals4 / sizeof vals4[0] };
    for (int half = 0; half < 3; half++) {
        clattn_kv_cache_desc cd = {.batch = 1, .capacity = NV, .kv_heads = 1, .head_dim_qk = 1, .head_dim_v = 1,
                                   .type = (clattn_kv_type)half};
        clattn_kv_cache *c = NULL;
        cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS);
        float k[NV], v[NV], k2[NV], v2[NV];
        for (int i = 0; i < NV; i++) k[i] = vals4[i], v[i] = -vals4[i];
        const size_t len[1] = {NV};
        cr_assert_eq(clattn_kv_cache_write(c, k, v, len), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(clattn_kv_cache_read(c, k2, v2), CLATTN_STATUS_SUCCESS);
        for (int i = 0; i < NV; i++) {
            const double wk = oracle_kv(k[i], half), wv = oracle_kv(v[i], half);
            cr_assert(k2[i] == (float)wk && v2[i] == (float)wv, "half=%d: %.9g read back as %.9g / %.9g, want %.9g",
                      half, (double)k[i], (double)k2[i], (double)v2[i], wk);
        }
        clattn_kv_cache_free(c);
    }
}

Test(edges, write_rounds_ref) { clattn_device *d = tu_open_ref(); write_rounds(d); clattn_device_free(d); }
Test(edges, write_rounds_opencl) { clattn_device *d = tu_open_opencl(); write_rounds(d); clattn_device_free(d); }

/* An INT8 cache (clattn 0.8) written (quantised on the host) and appended to (quantised by kv_append.cl): random rows,
 * a row of zeros and a row with one element far above the rest are valid quantisations of what was given
 * (check_int8_rows); a row holding a NaN or an infinity reads as NaN in every element, whichever path stored it, so
 * that it cannot pass for a number. */
static void int8_rows(clattn_device *dev)
{
    enum { T = 6, HK = 2, D = 12 };
    tu_rng r = {77};
    float *k = tu_random(&r, T * HK * D, -3, 3), *v = tu_random(&r, T * HK * D, -3, 3);
    memset(k + 1 * HK * D, 0, D * sizeof *k);        /* t 1, g 0: zeros */
    v[2 * HK * D + D + 5] = 1e4f;                    /* t 2, g 1: one large element */
    k[3 * HK * D + 4] = NAN, v[4 * HK * D + D] = INFINITY; /* t 3 g 0, t 4 g 1: not numbers */
    const int bad[T][HK] = {[3] = {1, 0}, [4] = {0, 1}};
    const clattn_kv_cache_desc cd = {.batch = 1, .capacity = T, .kv_heads = HK, .head_dim_qk = D, .type = CLATTN_KV_INT8};
    for (int path = 0; path < 2; path++) {
        clattn_kv_cache *c = NULL;
        cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        if (path == 0) { /* written: (B, HK, Tmax, D) */
            float *kw = malloc(sizeof(float) * T * HK * D), *vw = malloc(sizeof(float) * T * HK * D);
            for (size_t t = 0; t < T; t++)
                for (size_t g = 0; g < HK; g++) {
                    memcpy(kw + (g * T + t) * D, k + (t * HK + g) * D, D * sizeof *k);
                    memcpy(vw + (g * T + t) * D, v + (t * HK + g) * D, D * sizeof *v);
                }
            const size_t len[1] = {T};
            cr_assert_eq(clattn_kv_cache_write(c, kw, vw, len), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            free(kw), free(vw);
        } else { /* appended by a decode step with the heads as given */
            const clattn_attention_desc d = {.batch = 1, .seq_q = T, .embed = HK * D, .heads = HK, .causal = 1,
                                             .separate_value = 1, .kv_half = CLATTN_KV_INT8};
            clattn_decode_plan *p = NULL;
            cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            float *out = malloc(sizeof(float) * T * HK * D);
            const clattn_decode_args a = {.x = k, .kv = k, .value = v, .new_tokens = T, .out = out};
            cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            free(out);
            clattn_decode_plan_free(p);
        }
        float *kq = tu_poisoned(T * HK * D), *vq = tu_poisoned(T * HK * D);
        cr_assert_eq(clattn_kv_cache_read(c, kq, vq), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        double *x = malloc(sizeof(double) * T * HK * D);
        const float *src[2] = {k, v}, *got[2] = {kq, vq};
        for (int w = 0; w < 2; w++) {
            float *fin = malloc(sizeof(float) * T * HK * D); /* the rows that are numbers; the others checked here */
            memcpy(fin, got[w], sizeof(float) * T * HK * D);
            for (size_t t = 0; t < T; t++)
                for (size_t g = 0; g < HK; g++) {
                    const int nan_row = bad[t][g] && (w == 0) == (t == 3);
                    for (size_t e = 0; e < D; e++) {
                        const size_t i = (t * HK + g) * D + e, o = (g * T + t) * D + e;
                        x[i] = nan_row ? 0.0 : src[w][i];
                        if (nan_row) {
                            cr_assert(isnan(got[w][o]), "%s path, %s row t %zu g %zu holds a non-number but reads %g",
                                      path ? "append" : "write", w ? "value" : "key", t, g, (double)got[w][o]);
                            fin[o] = 0.0f;
                        }
                    }
                }
            char what[64];
            snprintf(what, sizeof what, "int8 %s, %s", path ? "append" : "write", w ? "values" : "keys");
            check_int8_rows(x, fin, 1, T, HK, D, T, 0.0, what);
            free(fin);
        }
        free(x), free(kq), free(vq);
        clattn_kv_cache_free(c);
    }
    free(k), free(v);
}

/* An INT8 row's codes are the exact quotient x / s rounded to nearest, ties to even, on every path (clattn.h): row 0
 * has s = 1 exactly (max 127), so its halves are ties; row 1 has s = 100 * (float)(1/127) = 0x1.93264cp-1, and values
 * whose float quotient x / s rounds onto a half although the exact one is above or below it (found by search: a
 * division's rint alone gives 2 for the first, 4 for the second; the exact codes are 3 and 3). */
static void int8_rounding(clattn_device *dev)
{
    enum { T = 2, D = 8 };
    const float x[T][D] = {{127.0f, 0.5f, 1.5f, 2.5f, -2.5f, 126.5f, -3.5f, 3.5f},
                           {100.0f, 0x1.f7efe0p+0f, 0x1.60c182p+1f, 0x1.c58b16p+1f, -0x1.f7efe0p+0f, -0x1.60c182p+1f,
                            0x1.c58b14p+1f, -100.0f}};
    const int want[T][D] = {{127, 0, 2, 2, -2, 126, -4, 4}, {127, 3, 3, 5, -3, -3, 4, -127}};
    const float s[T] = {1.0f, 100.0f * (1.0f / 127.0f)};
    cr_assert(s[1] == 0x1.93264cp-1f, "the scale of row 1 is %a", (double)s[1]);
    const clattn_kv_cache_desc cd = {.batch = 1, .capacity = T, .kv_heads = 1, .head_dim_qk = D, .type = CLATTN_KV_INT8};
    for (int path = 0; path < 2; path++) {
        clattn_kv_cache *c = NULL;
        cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        if (path == 0) {
            const size_t len[1] = {T};
            cr_assert_eq(clattn_kv_cache_write(c, &x[0][0], &x[0][0], len), CLATTN_STATUS_SUCCESS, "%s",
                         clattn_last_error());
        } else {
            const clattn_attention_desc d = {.batch = 1, .seq_q = T, .embed = D, .heads = 1, .causal = 1,
                                             .separate_value = 1, .kv_half = CLATTN_KV_INT8};
            clattn_decode_plan *p = NULL;
            cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            float out[T * D];
            const clattn_decode_args a = {.x = &x[0][0], .kv = &x[0][0], .value = &x[0][0], .new_tokens = T,
                                          .out = out};
            cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            clattn_decode_plan_free(p);
        }
        float k[T * D], v[T * D];
        cr_assert_eq(clattn_kv_cache_read(c, k, v), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (size_t t = 0; t < T; t++)
            for (size_t e = 0; e < D; e++) {
                const float w = (float)want[t][e] * s[t];
                cr_assert(k[t * D + e] == w && v[t * D + e] == w, "%s path: %a (%.9g steps) read back as %a / %a, "
                          "want %d steps (%a)", path ? "append" : "write", (double)x[t][e], (double)(x[t][e] / s[t]),
                          (double)k[t * D + e], (double)v[t * D + e], want[t][e], (double)w);
            }
        clattn_kv_cache_free(c);
    }
}

Test(codes, int8_rounding_ref) { clattn_device *d = tu_open_ref(); int8_rounding(d); clattn_device_free(d); }
Test(codes, int8_rounding_opencl) { clattn_device *d = tu_open_opencl(); int8_rounding(d); clattn_device_free(d); }

Test(codes, int8_rows_ref) { clattn_device *d = tu_open_ref(); int8_rows(d); clattn_device_free(d); }
Test(codes, int8_rows_opencl) { clattn_device *d = tu_open_opencl(); int8_rows(d); clattn_device_free(d); }

/* Every host allocation (and, on OpenCL, every buffer creation) a decode call makes, failed in turn: the call
 * reports it, and the lengths, the cache and the output are as before. */
static void failing_steps(clattn_device *dev, size_t page)
{
    enum { B = 2, CAP = 12, N = 4 };
    tu_rng r = {141};
    model m;
    model_make(&m, &r, 24, 4, 2, 8, 8, 0);
    clattn_attention_desc d = model_desc(&m, B, N, 0, 0);
    d.kv_page_size = page;
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, &m.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_kv_cache *cache = make_paged(dev, &m, B, CAP, 0, page, 0);
    size_t used = 0, used_before = 0; /* a paged cache's pages in use */
    float *seq = vals(&r, B * CAP * 24, 0, 6, 1.0f);
    float xs[B * N * 24], out[B * N * 13], before[B * N * 13];
    size_t len[B] = {0, 0};
    const int opencl = clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL;
    long failed[2] = {0, 0};
    for (int buffers = 0; buffers <= opencl; buffers++)
        for (long k = 1; k < 200; k++) {
            const size_t n = 1 + (size_t)k % N; /* calls of 1 .. 4 tokens */
            if (len[0] + n > CAP) break;
            for (size_t b = 0; b < B; b++)
                memcpy(xs + b * n * 24, seq + (b * CAP + len[b]) * 24, n * 24 * sizeof *xs);
            for (size_t i = 0; i < B * n * 13; i++) out[i] = NAN;
            memcpy(before, out, sizeof before);
            clattn_decode_args a = {.x = xs, .new_tokens = n, .out = out};
            if (page) cr_assert_eq(clattn_kv_cache_pages(cache, 0, NULL, NULL, &used_before), CLATTN_STATUS_SUCCESS);
            clattn_test_fail_nth_alloc(buffers ? 0 : k, buffers ? k : 0);
            const clattn_status st = tu_decode_execute(p, cache, &a);
            const int fired = clattn_test_alloc_fault_fired();
            clattn_test_fail_nth_alloc(0, 0);
            if (!fired) {
                cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
                len[0] += n, len[1] += n;
                expect_cache(cache, &m, B, CAP, seq, len, 0, "the call after the failures");
                break; /* the call allocates fewer than k: every failure point was seen */
            }
            cr_assert_neq(st, CLATTN_STATUS_SUCCESS, "allocation %ld failed, the call succeeded", k);
            failed[buffers]++;
            cr_assert_eq(memcmp(before, out, B * n * 13 * sizeof *out), 0, "allocation %ld: out written", k);
            if (page) {
                cr_assert_eq(clattn_kv_cache_pages(cache, 0, NULL, NULL, &used), CLATTN_STATUS_SUCCESS);
                cr_assert_eq(used, used_before, "allocation %ld failed: %zu pages in use, %zu before", k, used,
                             used_before);
            }
            char what[64];
            snprintf(what, sizeof what, "%s %ld failed", buffers ? "buffer" : "allocation", k);
            expect_cache(cache, &m, B, CAP, seq, len, 0, what);
        }
    cr_assert_gt(failed[0], 0, "no host allocation in a decode call was failed");
    cr_log_info("decode call: %ld host allocations and %ld buffer creations failed in turn", failed[0], failed[1]);
    /* and the cache still works */
    for (size_t b = 0; b < B; b++) memcpy(xs + b * 24, seq + (b * CAP + len[b]) * 24, 24 * sizeof *xs);
    clattn_decode_args a = {.x = xs, .new_tokens = 1, .out = out};
    cr_assert_eq(tu_decode_execute(p, cache, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    len[0]++, len[1]++;
    expect_cache(cache, &m, B, CAP, seq, len, 0, "after the failures");
    free(seq);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    model_free(&m);
}

Test(edges, failing_steps_ref) { clattn_device *d = tu_open_ref(); failing_steps(d, 0); clattn_device_free(d); }
Test(edges, failing_steps_opencl) { clattn_device *d = tu_open_opencl(); failing_steps(d, 0); clattn_device_free(d); }
/* a paged cache (pages of 4: the steps cross pages): a failed step gives back the pages it took */
Test(pages, failing_steps_ref) { clattn_device *d = tu_open_ref(); failing_steps(d, 4); clattn_device_free(d); }
Test(pages, failing_steps_opencl) { clattn_device *d = tu_open_opencl(); failing_steps(d, 4); clattn_device_free(d); }

/* Split-K where every score is far below zero (queries = x, keys = -x, scale 32): the combine must start its
 * maximum at the parts' own, not at 0, or every part's weight underflows. */
static void negative_scores(clattn_device *dev)
{
    const size_t E = 8, H = 2, HK = 1, dk = 8, dv = 8, T = 40;
    tu_rng r = {151};
    model m;
    model_make(&m, &r, E, H, HK, dk, dv, 1);
    for (size_t i = 0; i < H * dk * E; i++) m.wq[i] = (i / E) % dk == i % E ? 1.0f : 0.0f;
    for (size_t i = 0; i < HK * dk * E; i++) m.wk[i] = (i / E) % dk == i % E ? -1.0f : 0.0f;
    memset(m.bq, 0, H * dk * sizeof *m.bq), memset(m.bk, 0, HK * dk * sizeof *m.bk);
    m.scale = 32.0f;
    float *x = vals(&r, T * E, 1, 4, 1.0f);
    for (size_t i = 0; i < T * E; i++) x[i] = x[i] * 0.5f + (x[i] < 0 ? -0.5f : 0.5f); /* |x| >= 1/2: scores < -64 */
    double *want = expect(&m, 1, T, 0, 0, x);
    for (size_t splits = 2; splits <= 5; splits++) {
        const dcase c = {.B = 1, .T = T, .H = H, .HK = HK, .dk = dk, .dv = dv, .splits = splits, .P = 12};
        float *out = tu_poisoned(T * m.Eo);
        decode_all(dev, &m, &c, x, out);
        char what[64];
        snprintf(what, sizeof what, "scores far below 0, %zu parts", splits);
        check(out, want, T * m.Eo, what);
        free(out);
    }
    free(x), free(want);
    model_free(&m);
}

Test(edges, negative_scores_ref) { clattn_device *d = tu_open_ref(); negative_scores(d); clattn_device_free(d); }
Test(edges, negative_scores_opencl) { clattn_device *d = tu_open_opencl(); negative_scores(d); clattn_device_free(d); }

/* The device bytes of every cache type, exactly: B * HK * capacity * (dk + dv) elements of 4 (FLOAT), 2 (HALF, BF16)
 * or 1 (INT8, and its B * HK * capacity * 2 float scales) bytes, with dk and dv apart (either one counted twice, or a type's element size for the other's, shows), and 0
 * on ref, which keeps the cache in host memory; a cache's bytes are readable through the cache alone. */
Test(edges, cache_bytes_of_every_type)
{
    static const struct { size_t B, HK, cap, dk, dv; } shapes[] = {{2, 3, 7, 8, 4}, {1, 1, 130, 4, 12}};
    clattn_device *devs[2] = {tu_open_ref(), tu_open_opencl()};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int type = 0; type < 4; type++) {
                static const size_t elem[4] = {4, 2, 2, 1};
                static const char *const name[4] = {"float", "half", "bfloat16", "int8"};
                clattn_kv_cache_desc cd = {.batch = shapes[i].B, .capacity = shapes[i].cap, .kv_heads = shapes[i].HK,
                                           .head_dim_qk = shapes[i].dk, .head_dim_v = shapes[i].dv,
                                           .type = (clattn_kv_type)type};
                clattn_kv_cache *c = NULL;
                cr_assert_eq(tu_kv_cache_create(devs[k], &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
                const size_t rows = shapes[i].B * shapes[i].HK * shapes[i].cap;
                const size_t want = k == 0 ? 0 : rows * (shapes[i].dk + shapes[i].dv) * elem[type] +
                                                     (type == CLATTN_KV_INT8 ? rows * 2 * sizeof(float) : 0);
                cr_assert_eq(clattn_kv_cache_device_bytes(c), want, "%s cache %zu x %zu x %zu x (%zu + %zu) on %s: "
                             "%zu bytes, expected %zu", name[type], shapes[i].B, shapes[i].HK,
                             shapes[i].cap, shapes[i].dk, shapes[i].dv, k ? "opencl" : "ref",
                             clattn_kv_cache_device_bytes(c), want);
                clattn_kv_cache_free(c);
            }
    cr_assert_eq(clattn_kv_cache_device_bytes(NULL), 0);
    clattn_device_free(devs[0]);
    clattn_device_free(devs[1]);
}

/* ---------------------------------------------------------------- half-precision decode plans (desc.dtype) */

/* A decode plan of type t (F16, BF16; projected, or on the heads as given) against the fp32 plan fed the same rounded
 * inputs and weights: every step's output is the fp32 step's rounded once, bit for bit (one fp32 computation), from
 * host arrays, and on OpenCL from the caller's buffers too (at element offsets), in a prefill and single steps. */
static void half_decode(clattn_device *dev, clattn_dtype t, int separate, int kv_half, uint64_t seed)
{
    enum { B = 2, T = 9, P = 5, E = 16, H = 4, HK = 2, DK = 4, DV = 4, OFF = 3 };
    tu_rng r = {seed};
    model m;
    model_make(&m, &r, E, H, HK, DK, DV, 0);
    float **ws[8] = {&m.wq, &m.wk, &m.wv, &m.bq, &m.bk, &m.bv, &m.wo, &m.bo};
    const size_t wn[8] = {H * DK * E, HK * DK * E, HK * DV * E, H * DK, HK * DK, HK * DV, m.Eo * H * DV, m.Eo};
    for (int i = 0; i < 8; i++)
        for (size_t j = 0; j < wn[i]; j++) (*ws[i])[j] = (float)tu_dtype_round((*ws[i])[j], t);
    clattn_attention_desc d = model_desc(&m, B, P, 0, kv_half);
    clattn_attention_weights w32 = m.w, wt = {0};
    if (separate) {
        d = (clattn_attention_desc){.batch = B, .seq_q = P, .embed = H * DK, .heads = H, .kv_heads = HK,
                                    .head_dim_v = DV, .causal = 1, .kv_half = kv_half, .separate_value = 1};
        w32 = (clattn_attention_weights){0};
    } else {
        const void **tw[8] = {&wt.w_query, &wt.w_key, &wt.w_value, &wt.b_query, &wt.b_key, &wt.b_value, &wt.w_out,
                              &wt.b_out};
        for (int i = 0; i < 8; i++) *tw[i] = tu_typed(*ws[i], wn[i], t);
    }
    const size_t ex = separate ? H * DK : E, ow = separate ? H * DV : m.Eo;
    float *x = tu_random(&r, B * T * ex, -2, 2), *k = tu_random(&r, B * T * HK * DK, -2, 2);
    float *v = tu_random(&r, B * T * HK * DV, -2, 2);
    for (size_t i = 0; i < B * T * ex; i++) x[i] = (float)tu_dtype_round(x[i], t);
    for (size_t i = 0; i < B * T * HK * DK; i++) k[i] = (float)tu_dtype_round(k[i], t);
    for (size_t i = 0; i < B * T * HK * DV; i++) v[i] = (float)tu_dtype_round(v[i], t);
    clattn_decode_plan *p32 = NULL, *ph = NULL, *pb = NULL; /* pb: the buffer steps' own plan, nothing staged */
    cr_assert_eq(tu_decode_plan_create(dev, &d, separate ? NULL : &w32, &p32), CLATTN_STATUS_SUCCESS, "%s",
                 clattn_last_error());
    d.dtype = t;
    cr_assert_eq(tu_decode_plan_create(dev, &d, separate ? NULL : &wt, &ph), CLATTN_STATUS_SUCCESS, "%s",
                 clattn_last_error());
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL)
        cr_assert_eq(tu_decode_plan_create(dev, &d, separate ? NULL : &wt, &pb), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = T, .kv_heads = HK, .head_dim_qk = DK, .head_dim_v = DV,
                                     .type = kv_half ? CLATTN_KV_HALF : CLATTN_KV_FLOAT};
    clattn_kv_cache *c32 = NULL, *ch = NULL, *cb = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c32), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &ch), CLATTN_STATUS_SUCCESS);
    const int cl = clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL;
    if (cl) cr_assert_eq(tu_kv_cache_create(dev, &cd, &cb), CLATTN_STATUS_SUCCESS);
    cl_mem bufs[4] = {NULL};
    const size_t cols[3] = {ex, HK * DK, HK * DV};
    for (size_t t0 = 0; t0 < T;) {
        const size_t n = t0 == 0 ? P : 1;
        float xs[B * P * H * DK], ks[B * P * HK * DK], vs[B * P * HK * DV], o32[B * P * 16];
        for (size_t b = 0; b < B; b++) {
            memcpy(xs + b * n * ex, x + (b * T + t0) * ex, n * ex * 4);
            memcpy(ks + b * n * HK * DK, k + (b * T + t0) * HK * DK, n * HK * DK * 4);
            memcpy(vs + b * n * HK * DV, v + (b * T + t0) * HK * DV, n * HK * DV * 4);
        }
        /* every other decode step packed (cu_new), the first sequence bringing no token: one row where the padded
         * step has B (the typed conversions of a packed step's rows, on host arrays and on buffers), the fp32 plan's
         * step packed the same way; its token is the first row of xs, ks, vs */
        const int pk = t0 % 2 == 1;
        const uint32_t cu[B + 1] = {0, 0, 1};
        const size_t rows = pk ? 1 : B * n;
        const clattn_decode_args a32 = {.x = xs, .kv = separate ? ks : NULL, .value = separate ? vs : NULL,
                                        .new_tokens = pk ? 0 : n, .out = o32, .cu_new = pk ? cu : NULL};
        cr_assert_eq(tu_decode_execute(p32, c32, &a32), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        void *xh = tu_typed(xs, rows * ex, t), *kh = tu_typed(ks, rows * HK * DK, t);
        void *vh = tu_typed(vs, rows * HK * DV, t), *oh = tu_poisoned_typed(rows * ow + 1, t);
        const clattn_decode_args ah = {.x = xh, .kv = separate ? kh : NULL, .value = separate ? vh : NULL,
                                       .new_tokens = pk ? 0 : n, .out = oh, .cu_new = pk ? cu : NULL};
        cr_assert_eq(tu_decode_execute(ph, ch, &ah), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert(isnan(tu_dtype_value(((const uint16_t *)oh)[rows * ow], t)), "dtype %d: out written past its %zu rows",
                  (int)t, rows);
        for (size_t i = 0; i < rows * ow; i++)
            cr_assert_eq(((const uint16_t *)oh)[i], tu_dtype_bits((float)tu_dtype_round(o32[i], t), t),
                         "dtype %d separate %d kv_half %d, tokens %zu+%zu, out[%zu]: %g, the fp32 step's %g", (int)t,
                         separate, kv_half, t0, n, i, (double)tu_dtype_value(((const uint16_t *)oh)[i], t),
                         (double)o32[i]);
        if (cl) { /* the same step on buffers, the arrays at element offsets */
            cl_context ctx = clattn_device_context(dev);
            cl_command_queue q = clattn_device_queue(dev);
            const void *src[3] = {xh, kh, vh};
            for (int i = 0; i < 4; i++) {
                const size_t nb = (OFF + rows * (i < 3 ? cols[i] : ow)) * 2;
                cl_int e;
                bufs[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, nb, NULL, &e);
                cr_assert_eq(e, CL_SUCCESS);
                if (i < 3)
                    cr_assert_eq(clEnqueueWriteBuffer(q, bufs[i], CL_TRUE, OFF * 2, nb - OFF * 2, src[i], 0, NULL, NULL),
                                 CL_SUCCESS);
            }
            const clattn_decode_buffers bb = {.x = {bufs[0], OFF}, .kv = {separate ? bufs[1] : NULL, OFF},
                                              .value = {separate ? bufs[2] : NULL, OFF}, .out = {bufs[3], OFF}};
            cr_assert_eq(pk ? clattn_decode_execute_buffers_varlen(pb, cb, &bb, 0, cu, B + 1, 0, NULL, NULL)
                            : clattn_decode_execute_buffers(pb, cb, &bb, n, NULL, 0, NULL, NULL),
                         CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            uint16_t got[B * P * 16];
            cr_assert_eq(clEnqueueReadBuffer(q, bufs[3], CL_TRUE, OFF * 2, rows * ow * 2, got, 0, NULL, NULL),
                         CL_SUCCESS);
            cr_assert(memcmp(got, oh, rows * ow * 2) == 0, "dtype %d separate %d: buffers and host arrays differ",
                      (int)t, separate);
            for (int i = 0; i < 4; i++) clReleaseMemObject(bufs[i]);
        }
        free(xh), free(kh), free(vh), free(oh);
        t0 += n;
    }
    clattn_kv_cache_free(c32), clattn_kv_cache_free(ch), clattn_kv_cache_free(cb);
    clattn_decode_plan_free(p32), clattn_decode_plan_free(ph), clattn_decode_plan_free(pb);
    if (!separate) {
        const void *tw[8] = {wt.w_query, wt.w_key, wt.w_value, wt.b_query, wt.b_key, wt.b_value, wt.w_out, wt.b_out};
        for (int i = 0; i < 8; i++) free((void *)tw[i]);
    }
    free(x), free(k), free(v);
    model_free(&m);
}

static void half_decode_cases(clattn_device *dev)
{
    half_decode(dev, CLATTN_DTYPE_F16, 0, 0, 1700);
    half_decode(dev, CLATTN_DTYPE_BF16, 0, 1, 1701);
    half_decode(dev, CLATTN_DTYPE_F16, 1, 1, 1702);
    half_decode(dev, CLATTN_DTYPE_BF16, 1, 0, 1703);
}

Test(decode, half_types_ref)
{
    clattn_device *dev = tu_open_ref();
    half_decode_cases(dev);
    clattn_device_free(dev);
}

Test(decode, half_types_opencl)
{
    clattn_device *dev = tu_open_opencl();
    half_decode_cases(dev);
    clattn_device_free(dev);
}

/* ---------------------------------------------------------------- paged caches (clattn 0.8) */

/* The decode cases on paged caches (pages of 4 positions, of 16, and of 1 and of 64: a sequence within one page), against
 * the float64 oracle as on contiguous caches: the sequences' pages interleave in the pool as they grow (each step
 * takes the next free page), so every table entry is exercised. Then verify steps with draft trees and their accept
 * on paged caches. The suite's tests share head shapes and page sizes (H = 4, HK = 2, d = 8, pages of 4) where they
 * can: each new one is a kernel program compiled cold, slow on some drivers (llvmpipe, in CI). */
static void paged_cases(clattn_device *dev)
{
    static const size_t uneven[] = {5, 1, 1, 13, 2, 1, 7, 40, 3, 1, 1, 64};
    const dcase cases[] = {
        {.B = 2, .T = 40, .H = 4, .HK = 2, .dk = 8, .dv = 8, .P = 11, .page = 4},               /* GQA */
        {.B = 1, .T = 61, .H = 4, .HK = 4, .dk = 16, .dv = 8, .P = 1, .page = 1},               /* pages of 1 */
        {.B = 2, .T = 50, .H = 4, .HK = 2, .dk = 8, .dv = 8, .window = 9, .P = 17, .page = 4},  /* window */
        {.B = 2, .T = 130, .H = 4, .HK = 2, .dk = 8, .dv = 8, .chunks = uneven, .page = 4},    /* chunks */
        {.B = 2, .T = 70, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 3, .P = 30, .page = 4},  /* split-K */
        /* pages of 16, decode_attend's block: its blocks each within a page, the parts' bounds rounded to blocks */
        {.B = 2, .T = 70, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 3, .P = 30, .page = 16},
        {.B = 2, .T = 130, .H = 4, .HK = 2, .dk = 8, .dv = 8, .chunks = uneven, .page = 16},
        {.B = 2, .T = 20, .H = 4, .HK = 2, .dk = 8, .dv = 8, .splits = 64, .P = 5, .page = 16},  /* empty parts */
        {.B = 1, .T = 45, .H = 32, .HK = 2, .dk = 4, .dv = 4, .P = 30, .page = 4},              /* 16-row groups */
        {.B = 2, .T = 37, .H = 4, .HK = 2, .dk = 8, .dv = 8, .half = 1, .P = 9, .page = 4},     /* half */
        {.B = 2, .T = 30, .H = 4, .HK = 2, .dk = 5, .dv = 3, .E = 21, .half = 2, .P = 7, .page = 64}, /* one page */
        {.B = 2, .T = 45, .H = 8, .HK = 2, .dk = 128, .dv = 64, .half = 3, .splits = 2, .P = 20, .page = 4}, /* int8 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) decode_case(dev, &cases[i], 2100 + i);
    verify_case(dev, 2, 37, 8, 4, 2, 8, 8, 0, 0, 4, 2200, 0);  /* a tree across pages, accept moving rows between them */
    verify_case(dev, 3, 61, 5, 4, 2, 8, 8, 3, 0, 4, 2201, 0);  /* int8 */
}

Test(pages, equals_causal_run_ref)
{
    clattn_device *dev = tu_open_ref();
    paged_cases(dev);
    clattn_device_free(dev);
}

Test(pages, equals_causal_run_opencl)
{
    clattn_device *dev = tu_open_opencl();
    paged_cases(dev);
    clattn_device_free(dev);
}

/* Shared prefixes: sequence 0 takes a prompt of L = 21 tokens (pages of 4: its last page part full); sequences 1, 2
 * and 3 share its first 21, 13 and 20 positions (clattn_kv_cache_share: no page copied, the tables the same), then
 * every sequence takes STEPS tokens of its own, one a step: the shared last pages are copied before they are written
 * (copy-on-write), each sequence's outputs equal the float64 oracle's causal attention over its prefix of the prompt
 * and its own tokens, and equal bit for bit the same run on a contiguous cache (whose share copies the positions);
 * the prompt read back from every sequence is still the prompt. Then truncation and reset give the pages back. */
enum { SH_B = 4, SH_L = 21, SH_STEPS = 5, SH_CAP = 40, SH_H = 4, SH_HK = 2, SH_D = 8, SH_PAGE = 4 };

static void shared_run(clattn_device *dev, size_t page, int kv_type, const float *q, const float *k, const float *v,
                       float *outs /* (SH_STEPS, SH_B, SH_H*SH_D) */)
{
    enum { B = SH_B, H = SH_H, HK = SH_HK, D = SH_D, L = SH_L, T = SH_L + SH_STEPS };
    static const size_t prefix[SH_B] = {SH_L, SH_L, 13, 20};
    const clattn_attention_desc d = {.batch = B, .seq_q = L, .embed = H * D, .heads = H, .kv_heads = HK, .causal = 1,
                                     .separate_value = 1, .kv_half = kv_type, .kv_page_size = page};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = SH_CAP, .kv_heads = HK, .head_dim_qk = D,
                                     .type = (clattn_kv_type)kv_type, .page_size = page};
    clattn_kv_cache *c = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *qs = malloc(B * L * H * D * 4), *ks = malloc(B * L * HK * D * 4), *vs = malloc(B * L * HK * D * 4);
    float *os = tu_poisoned(B * L * H * D);
    /* the prompt: sequence 0's tokens 0 .. L-1 (the others take none) */
    memcpy(qs, q, L * H * D * 4), memcpy(ks, k, L * HK * D * 4), memcpy(vs, v, L * HK * D * 4);
    const size_t prompt_valid[SH_B] = {L, 0, 0, 0};
    clattn_decode_args a = {.x = qs, .kv = ks, .value = vs, .new_tokens = L, .valid = prompt_valid, .out = os};
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 1; b < B; b++)
        cr_assert_eq(clattn_kv_cache_share(c, b, 0, prefix[b]), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    size_t t0[16], tb[16], n0 = 0, nb = 0, used = 0;
    if (page) {
        cr_assert_eq(clattn_kv_cache_pages(c, 0, t0, &n0, &used), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(n0, (L + page - 1) / page);
        cr_assert_eq(used, n0, "sharing took pages: %zu in use, the prompt has %zu", used, n0);
        for (size_t b = 1; b < B; b++) {
            cr_assert_eq(clattn_kv_cache_pages(c, b, tb, &nb, NULL), CLATTN_STATUS_SUCCESS);
            cr_assert_eq(nb, (prefix[b] + page - 1) / page, "sequence %zu: %zu pages", b, nb);
            for (size_t i = 0; i < nb; i++)
                cr_assert_eq(tb[i], t0[i], "sequence %zu's page %zu is %zu, the prompt's %zu", b, i, tb[i], t0[i]);
        }
    }
    /* the steps: sequence b's token s is row (b * SH_STEPS + s) of the tokens after the prompt */
    for (size_t s = 0; s < SH_STEPS; s++) {
        for (size_t b = 0; b < B; b++) {
            const size_t row = L + b * SH_STEPS + s;
            memcpy(qs + b * H * D, q + row * H * D, H * D * 4);
            memcpy(ks + b * HK * D, k + row * HK * D, HK * D * 4);
            memcpy(vs + b * HK * D, v + row * HK * D, HK * D * 4);
        }
        const clattn_decode_args a1 = {.x = qs, .kv = ks, .value = vs, .new_tokens = 1, .out = outs + s * B * H * D};
        cr_assert_eq(tu_decode_execute(p, c, &a1), CLATTN_STATUS_SUCCESS, "step %zu: %s", s, clattn_last_error());
    }
    if (page) { /* step 1 copied sequence 0's shared last page (1 and 0 held it; 1 kept it), 2's page 3 (held by all
                 * four) and gave 3 a new block; each later page boundary a new page per sequence */
        cr_assert_eq(clattn_kv_cache_pages(c, 0, NULL, NULL, &used), CLATTN_STATUS_SUCCESS);
        size_t want = (L + page - 1) / page;
        for (size_t b = 0; b < B; b++) {
            const size_t first = prefix[b] / page, last = (prefix[b] + SH_STEPS - 1) / page; /* blocks written */
            for (size_t i = first; i <= last; i++) {
                const int had = i * page < prefix[b];            /* a shared block */
                const int keeps = b == 1 && i == (L - 1) / page; /* the last holder of the prompt's last page */
                if (!had || !keeps) want += 1;
            }
        }
        cr_assert_eq(used, want, "after the steps: %zu pages in use, expected %zu", used, want);
    }
    /* the prompt read back through every sequence's table */
    float *kr = malloc(B * HK * SH_CAP * D * 4), *vr = malloc(B * HK * SH_CAP * D * 4);
    cr_assert_eq(clattn_kv_cache_read(c, kr, vr), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 1; b < B; b++)
        for (size_t g = 0; g < HK; g++)
            cr_assert(!memcmp(kr + (b * HK + g) * SH_CAP * D, kr + g * SH_CAP * D, prefix[b] * D * 4) &&
                          !memcmp(vr + (b * HK + g) * SH_CAP * D, vr + g * SH_CAP * D, prefix[b] * D * 4),
                      "page %zu: sequence %zu's prefix (KV head %zu) differs from the prompt after the steps", page, b,
                      g);
    if (page) { /* truncation and reset give the pages back */
        size_t lens[SH_B] = {L + SH_STEPS, L + SH_STEPS, 0, 0}, before = used;
        cr_assert_eq(clattn_kv_cache_truncate(c, lens), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(clattn_kv_cache_pages(c, 0, NULL, NULL, &used), CLATTN_STATUS_SUCCESS);
        const size_t own2 = (13 + SH_STEPS - 1) / page - 13 / page + 1, own3 = (20 + SH_STEPS - 1) / page - 20 / page + 1;
        cr_assert_eq(used, before - own2 - own3, "truncating sequences 2 and 3: %zu pages in use of %zu", used, before);
        cr_assert_eq(clattn_kv_cache_reset(c), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(clattn_kv_cache_pages(c, 0, NULL, NULL, &used), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(used, 0, "after reset: %zu pages in use", used);
    }
    (void)T;
    clattn_kv_cache_free(c);
    clattn_decode_plan_free(p);
    free(qs), free(ks), free(vs), free(os), free(kr), free(vr);
}

static void shared_prefix(clattn_device *dev)
{
    enum { B = SH_B, H = SH_H, HK = SH_HK, D = SH_D, L = SH_L, ROWS = SH_L + SH_B * SH_STEPS };
    static const size_t prefix[SH_B] = {SH_L, SH_L, 13, 20};
    for (int kv_type = 0; kv_type < 4; kv_type += 3) { /* float, int8 */
        tu_rng r = {2300 + (uint64_t)kv_type};
        float *q = tu_random(&r, ROWS * H * D, -2, 2), *k = tu_random(&r, ROWS * HK * D, -2, 2);
        float *v = tu_random(&r, ROWS * HK * D, -2, 2);
        float *paged = tu_poisoned(SH_STEPS * B * H * D), *flat = tu_poisoned(SH_STEPS * B * H * D);
        shared_run(dev, SH_PAGE, kv_type, q, k, v, paged);
        shared_run(dev, 0, kv_type, q, k, v, flat);
        cr_assert(!memcmp(paged, flat, SH_STEPS * B * H * D * 4), "kv=%d: the paged cache's steps differ from the "
                  "contiguous cache's", kv_type);
        if (kv_type == 0) { /* float: the oracle over each sequence's keys (INT8: the bit-for-bit equality above) */
            float *kb = malloc((L + SH_STEPS) * HK * D * 4), *vb = malloc((L + SH_STEPS) * HK * D * 4);
            double *want = malloc(H * D * sizeof *want);
            for (size_t b = 0; b < B; b++)
                for (size_t s = 0; s < SH_STEPS; s++) {
                    const size_t n = prefix[b] + s + 1; /* the prefix, its earlier tokens and this one */
                    for (size_t j = 0; j < n; j++) {
                        const size_t row = j < prefix[b] ? j : L + b * SH_STEPS + (j - prefix[b]);
                        memcpy(kb + j * HK * D, k + row * HK * D, HK * D * 4);
                        memcpy(vb + j * HK * D, v + row * HK * D, HK * D * 4);
                    }
                    const clattn_attention_desc od = {.batch = 1, .seq_q = 1, .seq_kv = n, .embed = H * D, .heads = H,
                                                      .kv_heads = HK, .cross = 1, .separate_value = 1};
                    const clattn_attention_args oa = {.x = q + (L + b * SH_STEPS + s) * H * D, .kv = kb, .value = vb};
                    cr_assert_eq(oracle_attention(&od, NULL, &oa, want, NULL), 0);
                    char what[120];
                    snprintf(what, sizeof what, "shared prefix: sequence %zu's step %zu", b, s);
                    check(paged + (s * B + b) * H * D, want, H * D, what);
                }
            free(kb), free(vb), free(want);
        }
        free(q), free(k), free(v), free(paged), free(flat);
    }
}

Test(pages, shared_prefix_ref) { clattn_device *d = tu_open_ref(); shared_prefix(d); clattn_device_free(d); }
Test(pages, shared_prefix_opencl) { clattn_device *d = tu_open_opencl(); shared_prefix(d); clattn_device_free(d); }

/* A pool too small: sequence 0's prompt fills all 6 pages, sequence 1 shares it; a step in which both write needs a
 * copy of the shared last page and there is no free page: refused (TOO_LARGE_FOR_DEVICE) with nothing changed (the
 * lengths, the tables, the pages in use, out). Sequence 1 dropped to 20 positions no longer holds the last page: a step
 * of sequence 0 alone writes into it in place (no page needed), and equals the same step on a contiguous cache.
 * clattn_kv_cache_write refuses lengths that need more pages than the pool has, and writes the others (every page
 * anew): read back, the same floats. */
static void pool_limits(clattn_device *dev)
{
    enum { B = 2, H = 4, HK = 2, D = 8, L = 21, CAP = 24, PAGE = 4 };
    tu_rng r = {2400};
    float *q = tu_random(&r, B * L * H * D, -2, 2), *k = tu_random(&r, B * L * HK * D, -2, 2);
    float *v = tu_random(&r, B * L * HK * D, -2, 2);
    clattn_decode_plan *pp = NULL, *pf = NULL;
    clattn_attention_desc d = {.batch = B, .seq_q = L, .embed = H * D, .heads = H, .kv_heads = HK, .causal = 1,
                               .separate_value = 1, .kv_page_size = PAGE};
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &pp), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    d.kv_page_size = 0;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &pf), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_kv_cache_desc cd = {.batch = B, .capacity = CAP, .kv_heads = HK, .head_dim_qk = D, .page_size = PAGE,
                               .pages = 6};
    clattn_kv_cache *c = NULL, *f = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cd.page_size = 0, cd.pages = 0;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &f), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *out = tu_poisoned(B * L * H * D), *outf = tu_poisoned(B * L * H * D);
    const size_t v0[B] = {L, 0};
    clattn_decode_args a = {.x = q, .kv = k, .value = v, .new_tokens = L, .valid = v0, .out = out};
    cr_assert_eq(tu_decode_execute(pp, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    a.out = outf;
    cr_assert_eq(tu_decode_execute(pf, f, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_share(c, 1, 0, L), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_share(f, 1, 0, L), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    size_t t_before[8], t_after[8], n, used, lens[B];
    cr_assert_eq(clattn_kv_cache_pages(c, 0, t_before, &n, &used), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(used, 6);
    float *o1 = tu_poisoned(B * H * D);
    const clattn_decode_args both = {.x = q + L * H * D, .kv = k + L * HK * D, .value = v + L * HK * D,
                                     .new_tokens = 1, .out = o1};
    cr_assert_eq(tu_decode_execute(pp, c, &both), CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "a step past the pool: %s",
                 clattn_last_error());
    cr_assert(strstr(clattn_last_error(), "0 free pages") && strstr(clattn_last_error(), "needs 1"), "%s",
              clattn_last_error());
    cr_assert_eq(clattn_kv_cache_lengths(c, lens), CLATTN_STATUS_SUCCESS);
    cr_assert(lens[0] == L && lens[1] == L, "a refused step changed the lengths to %zu, %zu", lens[0], lens[1]);
    cr_assert_eq(clattn_kv_cache_pages(c, 0, t_after, &n, &used), CLATTN_STATUS_SUCCESS);
    cr_assert(used == 6 && !memcmp(t_before, t_after, n * sizeof *t_after), "a refused step changed the pages");
    for (size_t i = 0; i < B * H * D; i++) cr_assert(isnan(o1[i]), "a refused step wrote out[%zu]", i);
    /* sequence 1 down to 20: the last page is sequence 0's alone, written in place */
    const size_t down[B] = {L, 20}, one[B] = {1, 0};
    cr_assert_eq(clattn_kv_cache_truncate(c, down), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(clattn_kv_cache_truncate(f, down), CLATTN_STATUS_SUCCESS);
    float *o2 = tu_poisoned(B * H * D);
    clattn_decode_args s0 = both;
    s0.valid = one, s0.valid_count = B;
    cr_assert_eq(tu_decode_execute(pp, c, &s0), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_pages(c, 0, t_after, &n, &used), CLATTN_STATUS_SUCCESS);
    cr_assert(used == 6 && t_after[5] == t_before[5], "the last page was copied though it had one holder");
    s0.out = o2;
    cr_assert_eq(tu_decode_execute(pf, f, &s0), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert(!memcmp(o1, o2, B * H * D * 4), "the step in place differs from the contiguous cache's");
    /* writes: 24 + 1 positions need 6 + 1 pages of a pool of 6; 13 + 8 need 4 + 2 */
    float *kw = tu_random(&r, B * HK * CAP * D, -2, 2), *vw = tu_random(&r, B * HK * CAP * D, -2, 2);
    const size_t too_many[B] = {24, 1}, fit[B] = {13, 8};
    cr_assert_eq(clattn_kv_cache_write(c, kw, vw, too_many), CLATTN_STATUS_TOO_LARGE_FOR_DEVICE);
    cr_assert_eq(clattn_kv_cache_lengths(c, lens), CLATTN_STATUS_SUCCESS);
    cr_assert(lens[0] == L + 1 && lens[1] == 20, "a refused write changed the lengths");
    cr_assert_eq(clattn_kv_cache_write(c, kw, vw, fit), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *kr = malloc(B * HK * CAP * D * 4), *vr = malloc(B * HK * CAP * D * 4);
    cr_assert_eq(clattn_kv_cache_read(c, kr, vr), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++)
        for (size_t g = 0; g < HK; g++)
            for (size_t j = 0; j < CAP; j++)
                for (size_t e = 0; e < D; e++) {
                    const size_t i = ((b * HK + g) * CAP + j) * D + e;
                    cr_assert(kr[i] == (j < fit[b] ? kw[i] : 0.0f) && vr[i] == (j < fit[b] ? vw[i] : 0.0f),
                              "read back after a write: sequence %zu, KV head %zu, position %zu, element %zu", b, g,
                              j, e);
                }
    cr_assert_eq(clattn_kv_cache_pages(c, 0, NULL, NULL, &used), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(used, 6, "after the write: %zu pages in use", used);
    const size_t drop1[B] = {13, 0}; /* the written pages are each sequence's own: dropping sequence 1 frees 2 */
    cr_assert_eq(clattn_kv_cache_truncate(c, drop1), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(clattn_kv_cache_pages(c, 0, NULL, NULL, &used), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(used, 4, "after the write and a truncation: %zu pages in use", used);
    /* the pool's bytes: 6 pages of 4 positions of (4 + 4) floats, and the tables' 2 x 6 entries */
    const size_t bytes = clattn_device_backend(dev) == CLATTN_BACKEND_REF ? 0 : 6 * PAGE * HK * (D + D) * 4 + B * 6 * 4;
    cr_assert_eq(clattn_kv_cache_device_bytes(c), bytes, "%zu bytes, expected %zu", clattn_kv_cache_device_bytes(c),
                 bytes);
    clattn_kv_cache_free(c);
    /* a pool of 7: both holders of the prompt's last page write into it, and one copy (one free page) suffices */
    cd.page_size = PAGE, cd.pages = 7;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    a.out = out;
    cr_assert_eq(tu_decode_execute(pp, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_share(c, 1, 0, L), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_decode_execute(pp, c, &both), CLATTN_STATUS_SUCCESS, "two writers of a page of two holders, one "
                 "free page: %s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_pages(c, 0, NULL, NULL, &used), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(used, 7);
    clattn_kv_cache_free(c), clattn_kv_cache_free(f);
    clattn_decode_plan_free(pp), clattn_decode_plan_free(pf);
    free(q), free(k), free(v), free(out), free(outf), free(o1), free(o2), free(kw), free(vw), free(kr), free(vr);
}

Test(pages, pool_limits_ref) { clattn_device *d = tu_open_ref(); pool_limits(d); clattn_device_free(d); }
Test(pages, pool_limits_opencl) { clattn_device *d = tu_open_opencl(); pool_limits(d); clattn_device_free(d); }

/* accept after a share: sequence 0's step of 4 tokens is shared whole with sequence 1, then sequence 0 keeps tokens 1
 * and 3 of it. The rows move within pages sequence 1 holds too: they are copied first, and sequence 1 reads back
 * exactly what it did before; sequence 0 its context and the two tokens. */
static void accept_after_share(clattn_device *dev)
{
    enum { B = 2, H = 4, HK = 2, D = 8, T0 = 6, N = 4, CAP = 12, PAGE = 4 };
    tu_rng r = {2500};
    float *q = tu_random(&r, (T0 + N) * H * D, -2, 2), *k = tu_random(&r, (T0 + N) * HK * D, -2, 2);
    float *v = tu_random(&r, (T0 + N) * HK * D, -2, 2), *out = tu_poisoned(B * T0 * H * D);
    const clattn_attention_desc d = {.batch = B, .seq_q = T0, .embed = H * D, .heads = H, .kv_heads = HK, .causal = 1,
                                     .separate_value = 1, .kv_page_size = PAGE};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = CAP, .kv_heads = HK, .head_dim_qk = D, .page_size = PAGE};
    clattn_kv_cache *c = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    /* (the rows of sequence 1, which takes no token, are sequence 0's: never read) */
    float *qs = malloc(B * T0 * H * D * 4), *ks = malloc(B * T0 * HK * D * 4), *vs = malloc(B * T0 * HK * D * 4);
    for (size_t b = 0; b < B; b++) {
        memcpy(qs + b * T0 * H * D, q, T0 * H * D * 4);
        memcpy(ks + b * T0 * HK * D, k, T0 * HK * D * 4);
        memcpy(vs + b * T0 * HK * D, v, T0 * HK * D * 4);
    }
    const size_t ctx[B] = {T0, 0}, drafts[B] = {N, 0};
    clattn_decode_args a = {.x = qs, .kv = ks, .value = vs, .new_tokens = T0, .valid = ctx, .out = out};
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++) {
        memcpy(qs + b * N * H * D, q + T0 * H * D, N * H * D * 4);
        memcpy(ks + b * N * HK * D, k + T0 * HK * D, N * HK * D * 4);
        memcpy(vs + b * N * HK * D, v + T0 * HK * D, N * HK * D * 4);
    }
    a.new_tokens = N, a.valid = drafts;
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_share(c, 1, 0, T0 + N), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const size_t n = B * HK * CAP * D, seq = HK * CAP * D; /* the read-back arrays, a sequence's part */
    float *kb = malloc(n * 4), *vb = malloc(n * 4), *ka = malloc(n * 4), *va = malloc(n * 4);
    cr_assert_eq(clattn_kv_cache_read(c, kb, vb), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const size_t from[B] = {T0, T0 + N}, counts[B] = {2, 0}, index[2 * B] = {1, 3, 0, 0};
    cr_assert_eq(clattn_kv_cache_accept(c, from, counts, index, 2), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_kv_cache_read(c, ka, va), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert(!memcmp(ka + seq, kb + seq, seq * 4) && !memcmp(va + seq, vb + seq, seq * 4),
              "accepting sequence 0's tokens changed sequence 1, which shares its pages");
    for (size_t g = 0; g < HK; g++)
        for (size_t j = 0; j < T0 + 2; j++) {
            const size_t src = j < T0 ? j : T0 + index[j - T0], at = g * CAP * D;
            cr_assert(!memcmp(ka + at + j * D, kb + at + src * D, D * 4) &&
                          !memcmp(va + at + j * D, vb + at + src * D, D * 4),
                      "sequence 0's position %zu (KV head %zu) after accepting is not its row %zu", j, g, src);
        }
    clattn_kv_cache_free(c);
    clattn_decode_plan_free(p);
    free(q), free(k), free(v), free(out), free(qs), free(ks), free(vs), free(kb), free(vb), free(ka), free(va);
}

Test(pages, accept_after_share_ref) { clattn_device *d = tu_open_ref(); accept_after_share(d); clattn_device_free(d); }
Test(pages, accept_after_share_opencl)
{
    clattn_device *d = tu_open_opencl();
    accept_after_share(d);
    clattn_device_free(d);
}

/* Pages change hands: sequence 0 takes a prompt of 6 tokens (pages of 4: two pages), sequence 1 one of 4; then each step
 * truncates both to 4 and one sequence takes a token, the two in turn, so the page sequence 0 gave back is sequence 1's
 * next, then sequence 0's again: its table entry returns to what it was two writes of the tables before, while the
 * device's copy holds what the step between wrote (the tables are written only where they differ from that copy).
 * Each step's output row equals bit for bit the same steps on a contiguous cache. */
enum { CH_STEPS = 5, CH_H = 2, CH_D = 8, CH_L = 6 };
static void change_hands_run(clattn_device *dev, size_t page, const float *q, const float *k, const float *v,
                             float *outs /* (CH_STEPS, CH_H*CH_D) */)
{
    enum { B = 2, H = CH_H, HK = 1, D = CH_D, L = CH_L, CAP = 12 };
    const clattn_attention_desc d = {.batch = B, .seq_q = L, .embed = H * D, .heads = H, .kv_heads = HK, .causal = 1,
                                     .separate_value = 1, .kv_page_size = page};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = CAP, .kv_heads = HK, .head_dim_qk = D, .page_size = page};
    clattn_kv_cache *c = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *os = tu_poisoned(B * L * H * D);
    const size_t prompt[B] = {L, 4}, keep[B] = {4, 4};
    /* both prompts from the same rows of q, k, v (their first 6 and 4) */
    float *qs = malloc(B * L * H * D * 4), *ks = malloc(B * L * HK * D * 4), *vs = malloc(B * L * HK * D * 4);
    for (size_t b = 0; b < B; b++) {
        memcpy(qs + b * L * H * D, q, L * H * D * 4);
        memcpy(ks + b * L * HK * D, k, L * HK * D * 4);
        memcpy(vs + b * L * HK * D, v, L * HK * D * 4);
    }
    clattn_decode_args a = {.x = qs, .kv = ks, .value = vs, .new_tokens = L, .valid = prompt, .out = os};
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t s = 0; s < CH_STEPS; s++) {
        const size_t who = (s + 1) % 2, take[B] = {who == 0, who == 1};
        cr_assert_eq(clattn_kv_cache_truncate(c, keep), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        if (page) {
            size_t t[4], n = 0, used = 0;
            cr_assert_eq(clattn_kv_cache_pages(c, 0, t, &n, &used), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            cr_assert_eq(used, 2, "step %zu: after truncating both sequences to 4 positions, %zu pages in use", s, used);
        }
        /* the step's token: row L + s of q, k, v in the stepping sequence's place */
        memcpy(qs + who * H * D, q + (L + s) * H * D, H * D * 4);
        memcpy(ks + who * HK * D, k + (L + s) * HK * D, HK * D * 4);
        memcpy(vs + who * HK * D, v + (L + s) * HK * D, HK * D * 4);
        a.new_tokens = 1, a.valid = take;
        cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        memcpy(outs + s * H * D, os + who * H * D, H * D * 4);
    }
    clattn_kv_cache_free(c);
    clattn_decode_plan_free(p);
    free(qs), free(ks), free(vs), free(os);
}

static void pages_change_hands(clattn_device *dev)
{
    tu_rng r = {2600};
    const size_t n = CH_L + CH_STEPS;
    float *q = tu_random(&r, n * CH_H * CH_D, -2, 2), *k = tu_random(&r, n * CH_D, -2, 2);
    float *v = tu_random(&r, n * CH_D, -2, 2);
    float *paged = tu_poisoned(CH_STEPS * CH_H * CH_D), *flat = tu_poisoned(CH_STEPS * CH_H * CH_D);
    change_hands_run(dev, 4, q, k, v, paged);
    change_hands_run(dev, 0, q, k, v, flat);
    for (size_t i = 0; i < CH_STEPS * CH_H * CH_D; i++)
        cr_assert(!memcmp(&paged[i], &flat[i], 4), "step %zu, element %zu: paged %.9g, contiguous %.9g",
                  i / (CH_H * CH_D), i % (CH_H * CH_D), paged[i], flat[i]);
    free(q), free(k), free(v), free(paged), free(flat);
}

/* A step's pages come back: three sequences (prompts of 5, 8 and 3 positions, pages of 4) each take 6 tokens, are
 * truncated to their prompts, and take 6 tokens again (a rejected draft's positions taken again): every sequence holds
 * the same pages in the same blocks as after the first step (the tables unchanged, not written again), and as many
 * pages are in use. */
static void pages_come_back(clattn_device *dev)
{
    enum { B = 3, H = 2, HK = 1, D = 8, N = 6, CAP = 16, PAGE = 4 };
    const clattn_attention_desc d = {.batch = B, .seq_q = 8, .embed = H * D, .heads = H, .kv_heads = HK, .causal = 1,
                                     .separate_value = 1, .kv_page_size = PAGE};
    clattn_decode_plan *p = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = CAP, .kv_heads = HK, .head_dim_qk = D, .page_size = PAGE};
    clattn_kv_cache *c = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &cd, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    tu_rng r = {2700};
    float *q = tu_random(&r, B * 8 * H * D, -2, 2), *k = tu_random(&r, B * 8 * HK * D, -2, 2);
    float *v = tu_random(&r, B * 8 * HK * D, -2, 2), *out = tu_poisoned(B * 8 * H * D);
    const size_t prompt[B] = {5, 8, 3}, steps[B] = {N, N, N};
    clattn_decode_args a = {.x = q, .kv = k, .value = v, .new_tokens = 8, .valid = prompt, .out = out};
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    a.new_tokens = N, a.valid = steps;
    size_t first[B][CAP / PAGE], count[B], used = 0, used0 = 0;
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++)
        cr_assert_eq(clattn_kv_cache_pages(c, b, first[b], &count[b], &used0), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
    cr_assert_eq(clattn_kv_cache_truncate(c, prompt), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_decode_execute(p, c, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t b = 0; b < B; b++) {
        size_t again[CAP / PAGE], n = 0;
        cr_assert_eq(clattn_kv_cache_pages(c, b, again, &n, &used), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(n, count[b], "sequence %zu: %zu blocks after the step taken again, %zu before", b, n, count[b]);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(again[i], first[b][i], "sequence %zu, block %zu: page %zu after the step taken again, %zu "
                         "before", b, i, again[i], first[b][i]);
    }
    cr_assert_eq(used, used0, "%zu pages in use after the step taken again, %zu before", used, used0);
    clattn_kv_cache_free(c);
    clattn_decode_plan_free(p);
    free(q), free(k), free(v), free(out);
}

Test(pages, come_back_ref) { clattn_device *d = tu_open_ref(); pages_come_back(d); clattn_device_free(d); }
Test(pages, come_back_opencl) { clattn_device *d = tu_open_opencl(); pages_come_back(d); clattn_device_free(d); }

Test(pages, change_hands_ref) { clattn_device *d = tu_open_ref(); pages_change_hands(d); clattn_device_free(d); }
Test(pages, change_hands_opencl) { clattn_device *d = tu_open_opencl(); pages_change_hands(d); clattn_device_free(d); }

/* What a paged cache cannot mean is refused by name, with nothing changed: a page size that is not a power of two
 * from 1 to 65536, pages without a page size, a plan and a cache of different page sizes (either way), a prefill plan
 * with a page size; a share of a sequence with itself, past the batch or past the source's length; the pages of a
 * contiguous cache or of a sequence past the batch. */
static void paged_refusals(clattn_device *dev)
{
    /* (the suite's head shape: H = 4, HK = 2, d = 8; the paged cache's pages of 8, the plans' of 4 or none) */
    const clattn_kv_cache_desc ok = {.batch = 2, .capacity = 8, .kv_heads = 2, .head_dim_qk = 8, .page_size = 8};
    clattn_kv_cache_desc bad[4] = {ok, ok, ok, ok};
    bad[0].page_size = 3, bad[1].page_size = 131072, bad[2].page_size = 0, bad[2].pages = 4, bad[3].page_size = 6;
    for (int i = 0; i < 4; i++) {
        clattn_kv_cache *c = (clattn_kv_cache *)1;
        cr_assert_eq(clattn_kv_cache_create(dev, &bad[i], &c), CLATTN_STATUS_INVALID_ARGUMENT, "case %d", i);
        cr_assert_null(c);
        cr_assert(strstr(clattn_last_error(), i == 2 ? "without page_size" : "power of two"), "case %d: %s", i,
                  clattn_last_error());
    }
    clattn_attention_desc d = {.batch = 2, .seq_q = 2, .embed = 32, .heads = 4, .kv_heads = 2, .causal = 1,
                               .separate_value = 1, .kv_page_size = 6};
    clattn_decode_plan *p = (clattn_decode_plan *)1;
    cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "kv_page_size 6: a power of two"), "%s", clattn_last_error());
    clattn_attention_desc pre = {.batch = 1, .seq_q = 2, .embed = 4, .heads = 1, .kv_page_size = 4};
    clattn_plan *pl = NULL;
    cr_assert_eq(clattn_plan_create(dev, &pre, NULL, &pl), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "kv_page_size = 4 is for decode plans"), "%s", clattn_last_error());
    clattn_kv_cache *paged = NULL, *flat = NULL;
    cr_assert_eq(tu_kv_cache_create(dev, &ok, &paged), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_kv_cache_desc fd = ok;
    fd.page_size = 0;
    cr_assert_eq(tu_kv_cache_create(dev, &fd, &flat), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float x[2 * 2 * 32] = {0}, out[2 * 2 * 32];
    const clattn_decode_args a = {.x = x, .kv = x, .value = x, .new_tokens = 2, .out = out};
    for (size_t pd = 0; pd <= 4; pd += 4) { /* plans of pages of 4 and of contiguous caches, on the others */
        d.kv_page_size = pd;
        cr_assert_eq(tu_decode_plan_create(dev, &d, NULL, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(tu_decode_execute(p, paged, &a), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "desc.kv_page_size"), "%s", clattn_last_error());
        cr_assert_eq(tu_decode_execute(p, flat, &a), pd ? CLATTN_STATUS_INVALID_ARGUMENT : CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        clattn_decode_plan_free(p);
    }
    /* share: flat has 2 positions in each sequence */
    const struct { size_t dst, src, length; const char *why; } sh[] = {
        {1, 1, 1, "both sequence 1"}, {2, 0, 1, "past the batch"}, {0, 2, 1, "past the batch"},
        {1, 0, 3, "past sequence 0's length 2"}};
    size_t lens[2];
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        cr_assert_eq(clattn_kv_cache_share(flat, sh[i].dst, sh[i].src, sh[i].length), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), sh[i].why), "share %zu: %s", i, clattn_last_error());
        cr_assert_eq(clattn_kv_cache_lengths(flat, lens), CLATTN_STATUS_SUCCESS);
        cr_assert(lens[0] == 2 && lens[1] == 2, "a refused share changed the lengths");
    }
    cr_assert_eq(clattn_kv_cache_share(NULL, 0, 1, 0), CLATTN_STATUS_INVALID_ARGUMENT);
    size_t t[2], n;
    cr_assert_eq(clattn_kv_cache_pages(flat, 0, t, &n, NULL), CLATTN_STATUS_UNSUPPORTED);
    cr_assert_eq(clattn_kv_cache_pages(paged, 2, t, &n, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_kv_cache_pages(NULL, 0, t, &n, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_kv_cache_free(paged), clattn_kv_cache_free(flat);
}

Test(pages, refusals_ref) { clattn_device *d = tu_open_ref(); paged_refusals(d); clattn_device_free(d); }
Test(pages, refusals_opencl) { clattn_device *d = tu_open_opencl(); paged_refusals(d); clattn_device_free(d); }
