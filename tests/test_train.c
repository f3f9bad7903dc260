/* test_train.c: a training plan's forward statistics (clattn 0.5): each query row's log-sum-exp (args.lse) and the
 * heads' output before the output projection (args.context), on the ref device and on OpenCL with both algorithms,
 * against the float64 oracle (tests/oracle.c, no code shared); and clattn_attention_merge: attention over key
 * shards, merged, equals one call over all the keys. Every element checked, outputs poisoned first. */
#include "oracle.h"
#include "cores/core.h"
#include "runtime/runtime.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clattn_device *cl_dev, *ref_dev;

static void setup(void)
{
    cl_dev = tu_open_opencl();
    ref_dev = tu_open_ref();
    cr_assert(cl_dev && ref_dev);
}

static void teardown(void)
{
    clattn_device_free(cl_dev);
    clattn_device_free(ref_dev);
}

TestSuite(train, .init = setup, .fini = teardown);

/* the shared case and problem of the attention families (testutil.h); every problem here is a training plan's */
typedef tu_attn_case config;
typedef tu_problem problem;

/* A plan of p (with d, its algorithm chosen) holding p's weights and dropout seed: created with them, or with p->first
 * and then given them by clattn_plan_set_weights; with dropout, created with another seed and given d's. NULL: the
 * device refused it for its own limit (tu_refused_by_device: printed), and the caller skips the case. */
static clattn_plan *plan_of(const problem *p, clattn_device *dev, const clattn_attention_desc *d, const char *what)
{
    clattn_plan *plan = NULL;
    clattn_attention_desc made = *d;
    if (d->dropout > 0.0f) made.seed = ~d->seed; /* made with another seed and given this one (clattn_plan_set_seed) */
    /* a half plan's weights in its type (p's floats hold the rounded values the oracle reads) */
    clattn_attention_weights w0 = p->first ? *p->first : p->w, w1 = p->w;
    void *typed[18] = {0};
    int nt = tu_weights_typed(&w0, d, d->dtype, typed);
    nt += tu_weights_typed(&w1, d, d->dtype, typed + nt);
    clattn_status st = tu_plan_create(dev, &made, &w0, &plan);
    if (tu_refused_by_device(dev, st, what)) { /* the caller skips the case */
        for (int k = 0; k < nt; k++) free(typed[k]);
        return NULL;
    }
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s plan: %s: %s", what, clattn_status_string(st), clattn_last_error());
    if (d->dropout > 0.0f) cr_assert_eq(clattn_plan_set_seed(plan, d->seed), CLATTN_STATUS_SUCCESS);
    if (p->first) {
        clattn_attention_weights w = w1;
        tu_count_weights(&w, d);
        st = clattn_plan_set_weights(plan, &w);
        cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s set_weights: %s: %s", what, clattn_status_string(st),
                     clattn_last_error());
    }
    for (int k = 0; k < nt; k++) free(typed[k]);
    return plan;
}

static void problem_make(problem *p, const config *c, uint64_t seed)
{
    tu_problem_make(p, c, seed);
    p->d.training = 1;
}

static void problem_free(problem *p) { tu_problem_free(p); }

/* Run p on dev with alg; compare out, lse and context with the oracle's. */
static void check_on(const problem *p, clattn_device *dev, clattn_algorithm alg, const char *what)
{
    clattn_attention_desc d = p->d;
    d.algorithm = alg;
    clattn_plan *plan = plan_of(p, dev, &d, what);
    if (!plan) return;
    clattn_status st;
    const size_t B = d.batch, Tq = d.seq_q, H = d.heads, dv = d.head_dim_v, ow = clattn_plan_out_width(plan);
    const size_t n_out = B * Tq * ow, n_lse = B * H * Tq, n_ctx = B * Tq * H * dv;
    float *out = tu_poisoned(n_out), *lse = tu_poisoned(n_lse), *ctx = tu_poisoned(n_ctx);
    double *o64 = malloc(n_out * sizeof *o64), *l64 = malloc(n_lse * sizeof *l64), *c64 = malloc(n_ctx * sizeof *c64);
    cr_assert(o64 && l64 && c64);
    cr_assert_eq(oracle_attention_stats(&d, &p->w, &p->a, o64, NULL, l64, c64), 0);
    clattn_attention_args a = p->a;
    a.out = out, a.lse = lse, a.context = ctx;
    st = tu_plan_execute(plan, &a);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s execute: %s: %s", what, clattn_status_string(st), clattn_last_error());
    char msg[256];
    size_t bad = oracle_compare(out, o64, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s (%s) out: %zu of %zu differ; %s", what, clattn_plan_core(plan), bad, n_out, msg);
    bad = oracle_compare(ctx, c64, n_ctx, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s (%s) context: %zu of %zu differ; %s", what, clattn_plan_core(plan), bad, n_ctx, msg);
    for (size_t i = 0; i < n_lse; i++) cr_assert(!isnan(l64[i]), "oracle lse[%zu] is NaN", i);
    bad = oracle_compare_nonfinite(lse, l64, n_lse, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s (%s) lse: %zu of %zu differ; %s", what, clattn_plan_core(plan), bad, n_lse, msg);
    /* the output alone (no lse, no context) is the same call */
    float *out2 = tu_poisoned(n_out);
    clattn_attention_args a2 = p->a;
    a2.out = out2;
    cr_assert_eq(tu_plan_execute(plan, &a2), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    bad = oracle_compare(out2, o64, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s out without the statistics: %s", what, msg);
    free(out2);
    free(out); free(lse); free(ctx); free(o64); free(l64); free(c64);
    clattn_plan_free(plan);
}

static void check(const config *c, uint64_t seed)
{
    problem p;
    problem_make(&p, c, seed);
    if (!tu_forced_core_of(CLATTN_CORE_PREFILL)) check_on(&p, ref_dev, CLATTN_ALGORITHM_AUTO, "ref");
    if (tu_core_applies(CLATTN_ALGORITHM_FUSED, 0)) check_on(&p, cl_dev, CLATTN_ALGORITHM_FUSED, "opencl fused");
    if (tu_core_applies(CLATTN_ALGORITHM_UNFUSED, 0)) check_on(&p, cl_dev, CLATTN_ALGORITHM_UNFUSED, "opencl unfused");
    problem_free(&p);
}

Test(train, lse_and_context_shapes)
{
    static const config cfgs[] = {
        {.B = 1, .Tq = 1, .E = 4, .H = 2, .dk = 1, .dv = 1, .Eo = 4, .biases = 1},
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1},
        {.B = 2, .Tq = 61, .E = 9, .H = 3, .dk = 3, .dv = 5, .causal = 1},
        {.B = 1, .Tq = 130, .E = 64, .H = 2, .dk = 64, .dv = 64, .Eo = 32, .causal = 1, .biases = 1},
        {.B = 1, .Tq = 61, .E = 128, .H = 1, .dk = 128, .dv = 128, .biases = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 100 + i);
}

Test(train, lse_and_context_masks)
{
    static const config cfgs[] = {
        {.B = 3, .Tq = 8, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1},
        {.B = 2, .Tq = 7, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 8, .biases = 1, .mask = CLATTN_MASK_BOOL},
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .Eo = 16, .causal = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_FLOAT},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1, .causal = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_BOOL},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 200 + i);
}

/* GQA, the sliding window, dropout: lse is over the visible scores before dropout (what the backward recomputes
 * P from); the context is the dropped-out weights' */
Test(train, lse_and_context_gqa_window_dropout)
{
    static const config cfgs[] = {
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .Eo = 16, .causal = 1, .biases = 1},
        {.B = 1, .Tq = 61, .E = 16, .H = 4, .HK = 1, .dk = 4, .dv = 4, .window = 5, .causal = 1, .biases = 1},
        /* a window longer than a work-item's 16 rows: some steps of partner rows cross its edge, others not; the
         * dQ pass's steps of keys start off the rows' alignment (at i0 - W + 1), one ending on the diagonal (W = 23:
         * 3 mod 4 and 7 mod 8, so with 4 partners per step (GPUs) and with 8 (CPUs)) */
        {.B = 1, .Tq = 61, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 4, .Eo = 16, .window = 23, .causal = 1, .biases = 1},
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .dropout = 0.3f},
        {.B = 2, .Tq = 6, .Tk = 8, .E = 10, .Ekv = 6, .H = 2, .dk = 3, .dv = 5, .Eo = 7, .cross = 1, .causal = 1, .biases = 1, .kpm = 1, .layout = CLATTN_LAYOUT_RAW},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check(&cfgs[i], 300 + i);
}

/* long rows with one batch entry and few heads: the fused cores split the keys over work-groups and combine,
 * and the combine writes lse */
Test(train, lse_split_keys)
{
    static const config c = {.B = 1, .Tq = 1000, .E = 32, .H = 2, .dk = 16, .dv = 16, .causal = 1, .biases = 1};
    check(&c, 400);
    static const config x = {.B = 1, .Tq = 3, .Tk = 1000, .E = 16, .Ekv = 16, .H = 2, .dk = 8, .dv = 8, .Eo = 16, .cross = 1, .biases = 1, .kpm = 1};
    check(&x, 401);
}

/* ---- partial attention over key shards */

/* out (rows, Eo) = ctx (rows, width) w_out^T + b_out, in double: a merged context's output projection */
static void project_out(const clattn_attention_weights *w, const float *ctx, size_t rows, size_t width, size_t Eo,
                        float *out)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t e = 0; e < Eo; e++) {
            double s = ((const float *)w->b_out)[e];
            for (size_t k = 0; k < width; k++)
                s += (double)ctx[r * width + k] * ((const float *)w->w_out)[e * width + k];
            out[r * Eo + e] = (float)s;
        }
}

/* Cross-attention over kv split into `parts` shards of the given lengths: each shard on its own training plan
 * (kv, key padding mask and attention mask cut to its keys), merged with clattn_attention_merge, equals one call
 * over all keys: the context and lse, and the output projected from the merged context. Then with attention sinks (one more part). */
static void check_shards(clattn_device *dev, size_t parts, const size_t *lens, uint64_t seed)
{
    const size_t B = 2, Tq = 9, E = 12, Ekv = 10, H = 3, dk = 4, dv = 5, Eo = 7;
    size_t Tk = 0;
    cr_assert(parts < 8, "at most 7 shards (and the sinks' part)");
    for (size_t s = 0; s < parts; s++) Tk += lens[s];
    const config c = {.B = B, .Tq = Tq, .Tk = Tk, .E = E, .Ekv = Ekv, .H = H, .dk = dk, .dv = dv, .Eo = Eo, .cross = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_BOOL};
    problem p;
    problem_make(&p, &c, seed);
    const size_t n_lse = B * H * Tq, n_ctx = B * Tq * H * dv, n_out = B * Tq * Eo;
    /* one call */
    clattn_plan *full = NULL;
    cr_assert_eq(tu_plan_create(dev, &p.d, &p.w, &full), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *out1 = tu_poisoned(n_out), *lse1 = tu_poisoned(n_lse), *ctx1 = tu_poisoned(n_ctx);
    clattn_attention_args a1 = p.a;
    a1.out = out1, a1.lse = lse1, a1.context = ctx1;
    cr_assert_eq(tu_plan_execute(full, &a1), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    /* the shards */
    float *ctxs[8], *lses[8];
    size_t k0 = 0;
    for (size_t s = 0; s < parts; s++) {
        const size_t n = lens[s];
        float *kv = malloc(B * n * Ekv * sizeof *kv), *o = tu_poisoned(n_out);
        uint8_t *kpm = malloc(B * n), *mask = malloc(Tq * n);
        for (size_t b = 0; b < B; b++) {
            memcpy(kv + b * n * Ekv, (const float *)p.a.kv + (b * Tk + k0) * Ekv, n * Ekv * sizeof *kv);
            memcpy(kpm + b * n, p.kpm + b * Tk + k0, n);
        }
        for (size_t i = 0; i < Tq; i++) memcpy(mask + i * n, p.bmask + i * Tk + k0, n);
        clattn_attention_desc d = p.d;
        d.seq_kv = n;
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(dev, &d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        ctxs[s] = tu_poisoned(n_ctx), lses[s] = tu_poisoned(n_lse);
        clattn_attention_args a = p.a;
        a.kv = kv, a.key_padding_mask = kpm, a.attn_mask = mask, a.out = o, a.lse = lses[s], a.context = ctxs[s];
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "shard %zu: %s", s, clattn_last_error());
        clattn_plan_free(plan);
        free(kv); free(o); free(kpm); free(mask);
        k0 += n;
    }
    float *ctx = tu_poisoned(n_ctx), *lse = tu_poisoned(n_lse);
    cr_assert_eq(clattn_attention_merge(parts, (const float *const *)ctxs, (const float *const *)lses, B, Tq, H, dv,
                                        ctx, lse),
                 CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    char msg[256];
    cr_assert_eq(tu_compare(ctx, ctx1, n_ctx, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%zu shards: context: %s", parts,
                 msg);
    cr_assert_eq(tu_compare(lse, lse1, n_lse, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%zu shards: lse: %s", parts, msg);
    /* and against the oracle: the last batch entry is fully masked (lse -inf, context 0) */
    double *l64 = malloc(n_lse * sizeof *l64), *c64 = malloc(n_ctx * sizeof *c64);
    cr_assert(l64 && c64);
    cr_assert_eq(oracle_attention_stats(&p.d, &p.w, &p.a, NULL, NULL, l64, c64), 0);
    cr_assert_eq(oracle_compare(ctx, c64, n_ctx, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "merged context: %s", msg);
    cr_assert_eq(oracle_compare_nonfinite(lse, l64, n_lse, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "merged lse: %s",
                 msg);
    cr_assert(isinf(lse[n_lse - 1]) && lse[n_lse - 1] < 0, "a fully masked row's lse is -inf, got %g", lse[n_lse - 1]);
    /* the output projection of the merged context: the full call's out */
    float *out = malloc(n_out * sizeof *out);
    project_out(&p.w, ctx, B * Tq, H * dv, Eo, out);
    cr_assert_eq(tu_compare(out, out1, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%zu shards: out: %s", parts, msg);
    /* attention sinks (gpt-oss) across shards: one more part, output 0 and each row's lse its head's sink, merges
     * into attention with the sinks (README, "Attention sinks"): against the oracle's, and the projection of the
     * merged context against an inference plan with desc.sinks over all the keys; head 0 without a sink (-inf) */
    const float sinks[3] = {-INFINITY, 0.75f, -1.25f};
    float *none = calloc(n_ctx, sizeof *none), *sl = malloc(n_lse * sizeof *sl);
    cr_assert(none && sl && H == 3);
    for (size_t r = 0; r < n_lse; r++) sl[r] = sinks[r / Tq % H];
    ctxs[parts] = none, lses[parts] = sl;
    for (size_t i = 0; i < n_ctx; i++) ctx[i] = NAN;
    cr_assert_eq(clattn_attention_merge(parts + 1, (const float *const *)ctxs, (const float *const *)lses, B, Tq, H,
                                        dv, ctx, lse),
                 CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_attention_desc ds = p.d;
    clattn_attention_weights ws = p.w;
    ds.sinks = 1, ws.sinks = sinks, ws.sinks_count = H;
    cr_assert_eq(oracle_attention_stats(&ds, &ws, &p.a, NULL, NULL, l64, c64), 0);
    cr_assert_eq(oracle_compare(ctx, c64, n_ctx, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%zu shards and the sinks: "
                 "context: %s", parts, msg);
    cr_assert_eq(oracle_compare_nonfinite(lse, l64, n_lse, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%zu shards and the "
                 "sinks: lse: %s", parts, msg);
    ds.training = 0;
    clattn_plan *with_sinks = NULL;
    cr_assert_eq(tu_plan_create(dev, &ds, &ws, &with_sinks), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *out_s = tu_poisoned(n_out);
    clattn_attention_args as = p.a;
    as.out = out_s;
    cr_assert_eq(tu_plan_execute(with_sinks, &as), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    project_out(&p.w, ctx, B * Tq, H * dv, Eo, out);
    cr_assert_eq(tu_compare(out, out_s, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%zu shards and the sinks: out "
                 "against a plan with desc.sinks: %s", parts, msg);
    clattn_plan_free(with_sinks);
    free(out_s), free(none), free(sl);
    for (size_t s = 0; s < parts; s++) free(ctxs[s]), free(lses[s]);
    free(out); free(ctx); free(lse); free(l64); free(c64); free(out1); free(lse1); free(ctx1);
    clattn_plan_free(full);
    problem_free(&p);
}

Test(train, merge_shards)
{
    static const size_t one[] = {61}, two[] = {30, 31}, five[] = {13, 1, 20, 7, 20};
    clattn_device *devs[2] = {ref_dev, cl_dev};
    for (int i = tu_forced_core_of(CLATTN_CORE_PREFILL) ? 1 : 0; i < 2; i++) {
        check_shards(devs[i], 1, one, 500);
        check_shards(devs[i], 2, two, 501);
        check_shards(devs[i], 5, five, 502);
    }
}

/* The merge's own rules: rows no shard saw a key of, a NaN row, the weights exp(lse_p - L) at large lse, and its
 * refusals (nothing written). */
Test(train, merge_rules)
{
    /* B=1 Tq=3 H=1 dv=2; row 0: two shards with lse 1000 and 1000+log 3 (weights 1/4, 3/4); row 1: both -inf;
     * row 2: a NaN lse */
    const float o0[] = {1, 2, 5, 6, 1, 1}, o1[] = {3, 4, 7, 8, 1, 1};
    const float l0[] = {1000.0f, -INFINITY, NAN}, l1[] = {1000.0f + logf(3.0f), -INFINITY, 0.0f};
    const float *outs[] = {o0, o1}, *lses[] = {l0, l1};
    float out[6], lse[3];
    for (int i = 0; i < 6; i++) out[i] = NAN;
    cr_assert_eq(clattn_attention_merge(2, outs, lses, 1, 3, 1, 2, out, lse), CLATTN_STATUS_SUCCESS, "%s",
                 clattn_last_error());
    cr_assert_float_eq(out[0], 0.25f * 1 + 0.75f * 3, 1e-5);
    cr_assert_float_eq(out[1], 0.25f * 2 + 0.75f * 4, 1e-5);
    cr_assert_float_eq(lse[0], 1000.0f + logf(4.0f), 1e-3);
    cr_assert(out[2] == 0.0f && out[3] == 0.0f && isinf(lse[1]) && lse[1] < 0, "unseen row: %g %g %g", out[2], out[3],
              lse[1]);
    cr_assert(isnan(out[4]) && isnan(out[5]) && isnan(lse[2]), "NaN row: %g %g %g", out[4], out[5], lse[2]);
    /* either output alone */
    float lse_only[3];
    cr_assert_eq(clattn_attention_merge(2, outs, lses, 1, 3, 1, 2, NULL, lse_only), CLATTN_STATUS_SUCCESS);
    cr_assert_float_eq(lse_only[0], lse[0], 0);
    /* refusals */
    float keep[6];
    for (int i = 0; i < 6; i++) keep[i] = out[i] = -7.0f;
    cr_assert_eq(clattn_attention_merge(0, outs, lses, 1, 3, 1, 2, out, lse), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_attention_merge(2, NULL, lses, 1, 3, 1, 2, out, lse), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_attention_merge(2, outs, lses, 1, 3, 1, 2, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_attention_merge(2, outs, lses, 1, 0, 1, 2, out, lse), CLATTN_STATUS_INVALID_ARGUMENT);
    const float *holes[] = {o0, NULL};
    cr_assert_eq(clattn_attention_merge(2, holes, lses, 1, 3, 1, 2, out, lse), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "part 1"), "%s", clattn_last_error());
    cr_assert_eq(clattn_attention_merge(2, outs, lses, 1, 3, 1, 2, (float *)o1, lse), CLATTN_STATUS_INVALID_ARGUMENT,
                 "an output over an input is refused");
    cr_assert_eq(clattn_attention_merge(2, outs, lses, SIZE_MAX / 2, 3, 1, 2, out, lse), CLATTN_STATUS_SIZE_OVERFLOW);
    /* an lse of +inf (a sum that overflowed float) cannot be weighed: refused, naming its part and row, where the
     * arithmetic would give NaN */
    const float linf[] = {0.0f, -INFINITY, INFINITY}, *lses_inf[] = {l0, linf};
    cr_assert_eq(clattn_attention_merge(2, outs, lses_inf, 1, 3, 1, 2, out, lse), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "lses[1][2] is +inf"), "%s", clattn_last_error());
    cr_assert(!memcmp(out, keep, sizeof out), "a refused merge wrote its output");
}

/* ---- what a training plan refuses, and what other plans refuse */

Test(train, refusals)
{
    tu_rng r = {9};
    const size_t B = 1, T = 5, E = 8, H = 2;
    float *x = tu_random(&r, B * T * E, -1, 1), *out = tu_poisoned(B * T * E), *lse = tu_poisoned(B * H * T);
    float *ctx = tu_poisoned(B * T * E);
    clattn_device *devs[2] = {ref_dev, cl_dev};
    for (int i = 0; i < 2; i++) {
        clattn_attention_desc d = {.batch = B, .seq_q = T, .embed = E, .heads = H};
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(devs[i], &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        /* lse or context from a plan made without training: refused, not ignored */
        clattn_attention_args a = {.x = x, .out = out, .lse = lse};
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "training"), "%s", clattn_last_error());
        a.lse = NULL, a.context = ctx;
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
        for (size_t k = 0; k < B * T * E; k++) cr_assert(isnan(out[k]), "out written by a refused call");
        clattn_plan_free(plan);
        /* wrong counts are refused */
        d.training = 1;
        cr_assert_eq(tu_plan_create(devs[i], &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_attention_args c = {.x = x, .out = out, .lse = lse, .lse_count = B * H * T - 1};
        cr_assert_eq(tu_plan_execute(plan, &c), CLATTN_STATUS_SHAPE_MISMATCH, "%s", clattn_last_error());
        c.lse_count = 0, c.context = ctx, c.context_count = B * T * E + 1;
        cr_assert_eq(tu_plan_execute(plan, &c), CLATTN_STATUS_SHAPE_MISMATCH, "%s", clattn_last_error());
        clattn_plan_free(plan);
        /* training is 0 or 1; not with half K/V or TF32 products */
        d.training = 2;
        cr_assert_eq(tu_plan_create(devs[i], &d, NULL, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
        d.training = 1, d.kv_half = 1;
        cr_assert_eq(tu_plan_create(devs[i], &d, NULL, &plan), CLATTN_STATUS_UNSUPPORTED);
        d.kv_half = 0, d.precision = CLATTN_PRECISION_TF32;
        cr_assert_eq(tu_plan_create(devs[i], &d, NULL, &plan), CLATTN_STATUS_UNSUPPORTED);
        cr_assert_null(plan);
        /* decode plans do not train */
        d.precision = CLATTN_PRECISION_FP32, d.causal = 1;
        clattn_decode_plan *dp = NULL;
        cr_assert_neq(tu_decode_plan_create(devs[i], &d, NULL, &dp), CLATTN_STATUS_SUCCESS);
        cr_assert(strstr(clattn_last_error(), "training"), "%s", clattn_last_error());
        cr_assert_null(dp);
    }
    free(x); free(out); free(lse); free(ctx);
}

/* The buffer form: lse and context into caller buffers at offsets, the rest of those buffers untouched. */
Test(train, buffers_at_offsets)
{
    const config c = {.B = 2, .Tq = 61, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .Eo = 8, .causal = 1, .biases = 1, .kpm = 1};
    problem p;
    problem_make(&p, &c, 600);
    const size_t B = 2, Tq = 61, E = 16, H = 4, dv = 6, Eo = 8;
    const size_t n_x = B * Tq * E, n_out = B * Tq * Eo, n_lse = B * H * Tq, n_ctx = B * Tq * H * dv, off = 37;
    double *o64 = malloc(n_out * sizeof *o64), *l64 = malloc(n_lse * sizeof *l64), *c64 = malloc(n_ctx * sizeof *c64);
    cr_assert_eq(oracle_attention_stats(&p.d, &p.w, &p.a, o64, NULL, l64, c64), 0);
    for (int alg = 0; alg < 2; alg++) {
        clattn_attention_desc d = p.d;
        d.algorithm = alg ? CLATTN_ALGORITHM_UNFUSED : CLATTN_ALGORITHM_FUSED;
        if (!tu_core_applies(d.algorithm, 0)) continue;
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(cl_dev, &d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cl_context ctx = clattn_device_context(cl_dev);
        cl_command_queue q = clattn_device_queue(cl_dev);
        const size_t n[5] = {n_x, B * Tq, n_out, n_lse, n_ctx};
        cl_mem m[5];
        float *host[5];
        for (int i = 0; i < 5; i++) {
            cl_int err;
            m[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (off + n[i] + 5) * 4, NULL, &err);
            cr_assert_eq(err, CL_SUCCESS);
            host[i] = tu_poisoned(off + n[i] + 5);
        }
        memcpy(host[0] + off, p.a.x, n_x * 4);
        memcpy(host[1], p.kpm, B * Tq); /* the mask's bytes at offset 0 of its buffer */
        for (int i = 0; i < 5; i++)
            cr_assert_eq(clEnqueueWriteBuffer(q, m[i], CL_TRUE, 0, (off + n[i] + 5) * 4, host[i], 0, NULL, NULL),
                         CL_SUCCESS);
        clattn_attention_buffers bufs = {.x = {m[0], off}, .key_padding_mask = {m[1], 0}, .out = {m[2], off},
                                         .lse = {m[3], off}, .context = {m[4], off}};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &bufs, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        char msg[256];
        for (int i = 2; i < 5; i++) {
            float *got = malloc((off + n[i] + 5) * 4);
            cr_assert_eq(clEnqueueReadBuffer(q, m[i], CL_TRUE, 0, (off + n[i] + 5) * 4, got, 0, NULL, NULL),
                         CL_SUCCESS);
            for (size_t k = 0; k < off; k++) cr_assert(isnan(got[k]), "buffer %d written before its offset", i);
            for (size_t k = 0; k < 5; k++) cr_assert(isnan(got[off + n[i] + k]), "buffer %d written past its end", i);
            const double *want = i == 2 ? o64 : i == 3 ? l64 : c64;
            size_t bad = oracle_compare_nonfinite(got + off, want, n[i], TU_ATOL, TU_RTOL, msg, sizeof msg);
            cr_assert_eq(bad, 0, "%s buffer %d: %s", clattn_plan_core(plan), i, msg);
            free(got);
        }
        /* the buffers' overlap is refused */
        clattn_attention_buffers over = bufs;
        over.lse = (clattn_buffer){m[2], off}; /* lse over out */
        cr_assert_eq(clattn_plan_execute_buffers(plan, &over, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        for (int i = 0; i < 5; i++) clReleaseMemObject(m[i]), free(host[i]);
        clattn_plan_free(plan);
    }
    free(o64); free(l64); free(c64);
    problem_free(&p);
}

/* ---- the backward pass */

#define GRAD_ATOL 1e-4
#define GRAD_RTOL 1e-3

/* Every gradient the problem has, from the plan on dev (alg), against the oracle's float64 gradients. With
 * `saved`, the forward's lse and context (from the same plan) go in; else the backward recomputes them. */
static void check_backward_on(const problem *p, clattn_device *dev, clattn_algorithm alg, int saved, uint64_t seed,
                              const char *what)
{
    clattn_attention_desc d = p->d;
    d.algorithm = alg;
    clattn_plan *plan = plan_of(p, dev, &d, what);
    if (!plan) return;
    clattn_status st;
    clattn_plan_desc(plan, &d);
    const size_t B = d.batch, Tq = d.seq_q, Tk = d.seq_kv, E = d.embed, Ekv = d.kv_embed, H = d.heads;
    const size_t HK = d.kv_heads, dk = d.head_dim_qk, dv = d.head_dim_v, ow = clattn_plan_out_width(plan);
    tu_rng rng = {seed};
    float *dout = tu_random(&rng, B * Tq * ow, -1.0f, 1.0f);
    /* a half plan (p->d.dtype): its inputs, dOut and gradients in the type (the oracle reads the rounded floats) */
    const clattn_dtype t = d.dtype;
    for (size_t k = 0; k < B * Tq * ow; k++) dout[k] = (float)tu_dtype_round(dout[k], t);
    /* the gradients and their sizes: x, kv, wq, wk, wv, bq, bk, bv, wo, bo, value */
    enum { NG = 11 };
    const size_t n[NG] = {B * Tq * E, B * Tk * Ekv, H * dk * E, HK * dk * Ekv, HK * dv * Ekv, H * dk, HK * dk,
                          HK * dv, d.out_dim * H * dv, d.out_dim, B * Tk * HK * dv};
    const int has[NG] = {1, d.cross, p->w.w_query != NULL, p->w.w_key != NULL, p->w.w_value != NULL,
                         p->w.b_query != NULL, p->w.b_key != NULL, p->w.b_value != NULL, p->w.w_out != NULL,
                         p->w.b_out != NULL, d.separate_value};
    static const char *names[NG] = {"x", "kv", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out",
                                    "b_out", "value"};
    void *got[NG] = {0};
    double *want[NG] = {0};
    for (int i = 0; i < NG; i++)
        if (has[i]) got[i] = tu_poisoned_typed(n[i], t), want[i] = malloc(n[i] * sizeof(double));
    oracle_grads og = {want[0], want[1], want[2], want[3], want[4], want[5], want[6], want[7], want[8], want[9],
                       want[10]};
    cr_assert_eq(oracle_attention_backward(&p->d, &p->w, &p->a, dout, &og), 0);
    void *dout_typed = tu_typed(dout, B * Tq * ow, t);
    clattn_attention_grads g = {.grad_out = dout_typed, .grad_x = got[0], .grad_kv = got[1], .grad_w_query = got[2],
                                .grad_w_key = got[3], .grad_w_value = got[4], .grad_b_query = got[5],
                                .grad_b_key = got[6], .grad_b_value = got[7], .grad_w_out = got[8],
                                .grad_b_out = got[9], .grad_value = got[10]};
    g.grad_out_count = B * Tq * ow;
    size_t *counts[NG] = {&g.grad_x_count, &g.grad_kv_count, &g.grad_w_query_count, &g.grad_w_key_count,
                          &g.grad_w_value_count, &g.grad_b_query_count, &g.grad_b_key_count, &g.grad_b_value_count,
                          &g.grad_w_out_count, &g.grad_b_out_count, &g.grad_value_count};
    for (int i = 0; i < NG; i++) *counts[i] = has[i] ? n[i] : 0;
    /* the plan's inputs in its type */
    clattn_attention_args a = p->a;
    void *tin[3] = {0};
    if (t != CLATTN_DTYPE_F32) {
        a.x = tin[0] = tu_typed(p->a.x, B * Tq * E, t);
        if (p->a.kv) a.kv = tin[1] = tu_typed(p->a.kv, B * Tk * Ekv, t);
        if (p->a.value) a.value = tin[2] = tu_typed(p->a.value, B * Tk * HK * dv, t);
    }
    float *lse = NULL, *ctx = NULL;
    void *out = NULL;
    if (saved) {
        lse = tu_poisoned(B * H * Tq), ctx = tu_poisoned(B * Tq * H * dv), out = tu_poisoned_typed(B * Tq * ow, t);
        clattn_attention_args fa = a;
        fa.out = out, fa.lse = lse, fa.context = ctx;
        cr_assert_eq(tu_plan_execute(plan, &fa), CLATTN_STATUS_SUCCESS, "%s forward: %s", what, clattn_last_error());
        g.lse = lse, g.context = ctx, g.lse_count = B * H * Tq, g.context_count = B * Tq * H * dv;
    }
    tu_count_args(plan, &a);
    st = clattn_plan_backward(plan, &a, &g);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s backward: %s: %s", what, clattn_status_string(st), clattn_last_error());
    /* the backward's fp32 bound, and for a half plan one rounding of each gradient to its type */
    double atol, rtol;
    tu_dtype_tolerance_of(t, GRAD_ATOL, GRAD_RTOL, &atol, &rtol);
    char msg[256];
    float *gotf[NG] = {0};
    for (int i = 0; i < NG; i++) {
        if (!has[i]) continue;
        gotf[i] = tu_widened(got[i], n[i], t);
        const size_t bad = oracle_compare(gotf[i], want[i], n[i], atol, rtol, msg, sizeof msg);
        cr_assert_eq(bad, 0, "%s (%s%s, %s) grad_%s: %zu of %zu differ; %s", what, clattn_plan_core(plan),
                     saved ? ", saved statistics" : "", clattn_dtype_name(t), names[i], bad, n[i], msg);
    }
    /* a fully masked batch entry (the problems' last, with a key padding mask and self-attention): x reaches
     * the output only through rows with no visible key, so its gradient is exactly 0 */
    if (p->kpm && B > 1 && !d.cross)
        for (size_t k = (B - 1) * Tq * E; k < B * Tq * E; k++)
            cr_assert(gotf[0][k] == 0.0f, "%s: grad_x[%zu] = %g in a fully masked batch entry", what, k, gotf[0][k]);
    for (int i = 0; i < NG; i++) free(got[i]), free(gotf[i]), free(want[i]);
    for (int i = 0; i < 3; i++) free(tin[i]);
    free(dout); free(dout_typed); free(lse); free(ctx); free(out);
    clattn_plan_free(plan);
}

/* The backward core behind each forward algorithm: with the forward's statistics, and recomputing them. */
static void check_backward_opencl(const problem *p, uint64_t seed)
{
    for (int saved = 0; saved < 2; saved++) {
        if (tu_core_applies(CLATTN_ALGORITHM_FUSED, 0))
            check_backward_on(p, cl_dev, CLATTN_ALGORITHM_FUSED, saved, seed, "opencl fused");
        if (tu_core_applies(CLATTN_ALGORITHM_UNFUSED, 0))
            check_backward_on(p, cl_dev, CLATTN_ALGORITHM_UNFUSED, saved, seed, "opencl unfused");
    }
}

static void check_backward(const config *c, uint64_t seed)
{
    problem p;
    problem_make(&p, c, seed);
    if (!tu_forced_core_of(CLATTN_CORE_PREFILL) && !tu_forced_core_of(CLATTN_CORE_BACKWARD)) {
        check_backward_on(&p, ref_dev, CLATTN_ALGORITHM_AUTO, 0, seed, "ref");
        check_backward_on(&p, ref_dev, CLATTN_ALGORITHM_AUTO, 1, seed, "ref");
    }
    check_backward_opencl(&p, seed);
    problem_free(&p);
}

Test(train, backward_shapes)
{
    static const config cfgs[] = {
        {.B = 1, .Tq = 1, .E = 4, .H = 2, .dk = 1, .dv = 1, .Eo = 4, .biases = 1},
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1},
        {.B = 2, .Tq = 61, .E = 9, .H = 3, .dk = 3, .dv = 5, .causal = 1},
        {.B = 1, .Tq = 130, .E = 16, .H = 2, .dk = 64, .dv = 64, .Eo = 16, .causal = 1, .biases = 1},
        {.B = 1, .Tq = 7, .E = 16, .H = 1, .dk = 128, .dv = 128, .Eo = 8, .biases = 1},
        /* without projections: x is Q, K and V (dx sums their gradients), or kv is K and V */
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .causal = 1, .noproj = 1},
        {.B = 2, .Tq = 5, .Tk = 9, .E = 8, .Ekv = 8, .H = 2, .dk = 4, .dv = 4, .cross = 1, .kpm = 1, .noproj = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_backward(&cfgs[i], 700 + i);
}

Test(train, backward_masks_cross)
{
    static const config cfgs[] = {
        {.B = 3, .Tq = 8, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1},
        {.B = 2, .Tq = 7, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 8, .biases = 1, .mask = CLATTN_MASK_BOOL},
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .Eo = 16, .causal = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_FLOAT},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 7, .cross = 1, .causal = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_BOOL},
        {.B = 2, .Tq = 7, .Tk = 61, .E = 8, .Ekv = 5, .H = 2, .dk = 3, .dv = 4, .cross = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_backward(&cfgs[i], 800 + i);
}

Test(train, backward_gqa_window_dropout)
{
    static const config cfgs[] = {
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .Eo = 16, .causal = 1, .biases = 1},
        {.B = 1, .Tq = 61, .E = 16, .H = 4, .HK = 1, .dk = 4, .dv = 4, .window = 5, .causal = 1, .biases = 1},
        /* a window longer than a work-item's 16 rows: some steps of partner rows cross its edge, others not; the
         * dQ pass's steps of keys start off the rows' alignment (at i0 - W + 1), one ending on the diagonal (W = 23:
         * 3 mod 4 and 7 mod 8, so with 4 partners per step (GPUs) and with 8 (CPUs)) */
        {.B = 1, .Tq = 61, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 4, .Eo = 16, .window = 23, .causal = 1, .biases = 1},
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .dropout = 0.3f},
        {.B = 2, .Tq = 9, .Tk = 11, .E = 12, .Ekv = 7, .H = 3, .dk = 4, .dv = 4, .Eo = 5, .cross = 1, .biases = 1, .dropout = 0.5f},
        {.B = 2, .Tq = 6, .Tk = 8, .E = 10, .Ekv = 6, .H = 2, .dk = 3, .dv = 5, .Eo = 7, .cross = 1, .causal = 1, .biases = 1, .kpm = 1, .layout = CLATTN_LAYOUT_RAW},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_backward(&cfgs[i], 900 + i);
}

/* The heads as given (no weights, K and V apart: grad_kv is K's gradient, grad_value V's), with GQA, dv != dk and
 * masks per batch entry and per head; a projected plan with a (B, H, Tq, Tk) mask */
Test(train, backward_heads_and_batched_masks)
{
    static const config cfgs[] = {
        {.B = 2, .Tq = 7, .Tk = 13, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1},
        {.B = 2, .Tq = 33, .Tk = 33, .E = 16, .H = 4, .HK = 1, .cross = 1, .causal = 1, .noproj = 1,
         .separate_value = 1, .mask = CLATTN_MASK_FLOAT, .mask_pb = 1, .mask_ph = 1},
        {.B = 3, .Tq = 9, .Tk = 13, .E = 8, .H = 2, .cross = 1, .noproj = 1, .separate_value = 1, .kpm = 1,
         .mask = CLATTN_MASK_BOOL, .mask_pb = 1, .dropout = 0.25f},
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .mask = CLATTN_MASK_BOOL,
         .mask_pb = 1, .mask_ph = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_backward(&cfgs[i], 980 + i);
}

/* Rotary embeddings (desc.rope) in training: the forward's statistics (ref and OpenCL), then every gradient through
 * the rotation (dQ and dK rotated back before the projections' gradients and the inputs'): each layout and scaling,
 * partial rotary dims, with projections and biases, without (x is Q, K and V: Q and K rotated, V not), cross-attention
 * (K's positions its own), GQA with the window, dropout, masks, a half plan. The shapes are the backward tests'. */
#define ROPE_HALF CLATTN_ROPE_HALF
#define ROPE_INTER CLATTN_ROPE_INTERLEAVED
static const config rope_cfgs[] = {
    {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .rope = {.kind = ROPE_HALF}},
    {.B = 1, .Tq = 130, .E = 16, .H = 2, .dk = 64, .dv = 64, .Eo = 16, .causal = 1, .biases = 1,
     .rope = {.kind = ROPE_HALF, .dims = 32, .scaling = CLATTN_ROPE_SCALING_YARN, .factor = 4.0,
              .original_max_position = 64}},
    {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .causal = 1, .noproj = 1,
     .rope = {.kind = ROPE_INTER, .dims = 2}},
    {.B = 2, .Tq = 5, .Tk = 9, .E = 8, .Ekv = 8, .H = 2, .dk = 4, .dv = 4, .cross = 1, .kpm = 1, .noproj = 1,
     .rope = {.kind = ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_LINEAR, .factor = 2.0}},
    {.B = 1, .Tq = 61, .E = 16, .H = 4, .HK = 1, .dk = 4, .dv = 4, .window = 5, .causal = 1, .biases = 1,
     .rope = {.kind = ROPE_INTER, .theta = 100.0}},
    {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .dropout = 0.3f,
     .rope = {.kind = ROPE_HALF, .dims = 2}},
    {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 7, .cross = 1, .causal = 1,
     .biases = 1, .kpm = 1, .mask = CLATTN_MASK_BOOL, .rope = {.kind = ROPE_INTER, .scaling = CLATTN_ROPE_SCALING_NTK,
                                                               .factor = 3.0}},
    {.B = 2, .Tq = 7, .Tk = 13, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
     .rope = {.kind = ROPE_HALF}},
    /* each row's position given (args.rope_positions; tu_problem_make's: left padding, positions past the table) */
    {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .rope = {.kind = ROPE_HALF},
     .rope_pos = 1},
    {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .causal = 1, .noproj = 1,
     .rope = {.kind = ROPE_INTER, .dims = 2}, .rope_pos = 1},
    {.B = 2, .Tq = 7, .Tk = 13, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
     .rope = {.kind = ROPE_HALF}, .rope_pos = 1},
};

Test(train, rope_statistics)
{
    for (size_t i = 0; i < sizeof rope_cfgs / sizeof rope_cfgs[0]; i++) check(&rope_cfgs[i], 1300 + i);
}

Test(train, rope_backward)
{
    for (size_t i = 0; i < sizeof rope_cfgs / sizeof rope_cfgs[0]; i++) check_backward(&rope_cfgs[i], 1320 + i);
}

/* Attention sinks (desc.sinks, gpt-oss) in training: lse is that of the weights with the sink (the sink alone in a row
 * with no visible key: tu_problem_make's key padding mask hides the last batch entry whole), the context the scaled
 * rows; the backward takes them as any training plan's statistics (given, or computed again with the sinks), the
 * sinks constants (no gradient of their own). Head 0 without a sink (-inf). */
static const config sinks_cfgs[] = {
    {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .sinks = 1},
    {.B = 1, .Tq = 1, .E = 4, .H = 2, .dk = 1, .dv = 1, .Eo = 4, .biases = 1, .sinks = 1},
    {.B = 3, .Tq = 8, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .sinks = 1},
    {.B = 2, .Tq = 61, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .Eo = 16, .window = 5, .causal = 1, .biases = 1,
     .sinks = 1},
    {.B = 1, .Tq = 130, .E = 16, .H = 2, .dk = 64, .dv = 64, .Eo = 16, .causal = 1, .biases = 1, .sinks = 1},
    {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .dropout = 0.3f,
     .sinks = 1},
    {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 7, .cross = 1, .causal = 1,
     .biases = 1, .kpm = 1, .mask = CLATTN_MASK_BOOL, .sinks = 1},
    {.B = 2, .Tq = 7, .Tk = 13, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
     .sinks = 1},
};

Test(train, sinks_statistics)
{
    for (size_t i = 0; i < sizeof sinks_cfgs / sizeof sinks_cfgs[0]; i++) check(&sinks_cfgs[i], 1400 + i);
}

Test(train, sinks_backward)
{
    for (size_t i = 0; i < sizeof sinks_cfgs / sizeof sinks_cfgs[0]; i++) check_backward(&sinks_cfgs[i], 1420 + i);
}

/* Half-precision training plans (desc.dtype F16 and BF16): x, kv, value, out, grad_out, the weights and every gradient
 * in the type, lse and context fp32; against the float64 oracle on the same rounded values, the forward with the
 * type's bound (context and lse: fp32's), each gradient with the backward's bound plus one rounding to the type.
 * Projected (self, cross, RAW layout, biases, GQA, the window, dropout) and not (x as Q, K and V; K and V apart). */
#define F16 CLATTN_DTYPE_F16
#define BF16 CLATTN_DTYPE_BF16
static const config half_cfgs[] = {
    {.B = 3, .Tq = 8, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .dtype = F16},
    {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .Eo = 16, .causal = 1, .biases = 1, .kpm = 1,
     .mask = CLATTN_MASK_FLOAT, .dtype = BF16},
    {.B = 2, .Tq = 6, .Tk = 8, .E = 10, .Ekv = 6, .H = 2, .dk = 3, .dv = 5, .Eo = 7, .cross = 1, .causal = 1,
     .biases = 1, .kpm = 1, .layout = CLATTN_LAYOUT_RAW, .dtype = F16},
    {.B = 1, .Tq = 61, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 4, .Eo = 16, .window = 19, .causal = 1, .biases = 1,
     .dtype = BF16},
    {.B = 2, .Tq = 9, .Tk = 11, .E = 12, .Ekv = 7, .H = 3, .dk = 4, .dv = 4, .Eo = 5, .cross = 1, .biases = 1,
     .dropout = 0.5f, .dtype = BF16},
    /* the output (16 columns) wider than the Q|K|V rows (6) */
    {.B = 2, .Tq = 7, .E = 8, .H = 1, .dk = 2, .dv = 2, .Eo = 16, .biases = 1, .causal = 1, .dtype = F16},
    {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .causal = 1, .noproj = 1, .dtype = F16},
    {.B = 2, .Tq = 7, .Tk = 13, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
     .kpm = 1, .dtype = BF16},
    /* without Q/K/V weights but with an output projection */
    {.B = 2, .Tq = 13, .E = 16, .H = 4, .Eo = 8, .biases = 1, .noproj = 1, .causal = 1, .dtype = BF16},
    /* attention sinks (in the type: rounded as the other arrays) */
    {.B = 3, .Tq = 8, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .dtype = F16, .sinks = 1},
    {.B = 2, .Tq = 7, .Tk = 13, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
     .causal = 1, .dtype = BF16, .sinks = 1},
};

Test(train, half_statistics)
{
    for (size_t i = 0; i < sizeof half_cfgs / sizeof half_cfgs[0]; i++) {
        config c = half_cfgs[i];
        c.training = 1;
        if (!tu_forced_core_of(CLATTN_CORE_PREFILL)) tu_attention_check(ref_dev, &c, 1500 + i);
        tu_attention_check(cl_dev, &c, 1500 + i);
    }
}

Test(train, half_backward)
{
    for (size_t i = 0; i < sizeof half_cfgs / sizeof half_cfgs[0]; i++) check_backward(&half_cfgs[i], 1600 + i);
}

/* Long rows: T = 1000 (keys beyond every block and vector size), causal and not, heads of 64 with GQA; OpenCL
 * only (ref's backward is the same loops as on short rows, and slow here). */
Test(train, backward_long)
{
    static const config cfgs[] = {
        {.B = 1, .Tq = 1000, .E = 16, .H = 2, .dk = 8, .dv = 8, .Eo = 16, .causal = 1, .biases = 1, .kpm = 1},
        {.B = 1, .Tq = 130, .Tk = 1000, .E = 16, .Ekv = 12, .H = 4, .HK = 2, .dk = 64, .dv = 64, .Eo = 16, .cross = 1, .biases = 1, .dropout = 0.2f},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        problem p;
        problem_make(&p, &cfgs[i], 950 + i);
        check_backward_opencl(&p, 950 + i);
        problem_free(&p);
    }
}

/* clattn_plan_backward_buffers: inputs and gradients in caller buffers at offsets (one buffer each, poisoned
 * around them), the forward's statistics from the buffer forward, a wait list and an event; every gradient against
 * the oracle's and nothing written outside its range; overlaps and missing buffers refused. */
Test(train, backward_buffers_at_offsets)
{
    const config c = {.B = 2, .Tq = 13, .Tk = 9, .E = 12, .Ekv = 10, .H = 3, .dk = 4, .dv = 4, .Eo = 7, .cross = 1, .causal = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_FLOAT, .dropout = 0.25f, .layout = CLATTN_LAYOUT_RAW};
    problem p;
    problem_make(&p, &c, 640);
    const size_t B = 2, Tq = 13, Tk = 9, E = 12, Ekv = 10, H = 3, dk = 4, dv = 4, Eo = 7, off = 11, pad = 5;
    float *dout = tu_random(&(tu_rng){641}, B * Tq * Eo, -1.0f, 1.0f);
    /* inputs: x, kv, kpm (bytes), mask, dout, lse, context; gradients: x, kv, wq, wk, wv, bq, bk, bv, wo, bo */
    enum { NI = 7, NG = 10 };
    const size_t n[NI + NG] = {B * Tq * E, B * Tk * Ekv, B * Tk, Tq * Tk, B * Tq * Eo, B * H * Tq, B * Tq * H * dv,
                               B * Tq * E, B * Tk * Ekv, H * dk * E, H * dk * Ekv, H * dv * Ekv, H * dk, H * dk, H * dv,
                               Eo * H * dv, Eo};
    const void *src[NI] = {p.a.x, p.a.kv, p.kpm, p.a.attn_mask, dout, NULL, NULL};
    double *want[NG];
    for (int i = 0; i < NG; i++) want[i] = malloc(n[NI + i] * sizeof(double));
    oracle_grads og = {want[0], want[1], want[2], want[3], want[4], want[5], want[6], want[7], want[8], want[9], NULL};
    cr_assert_eq(oracle_attention_backward(&p.d, &p.w, &p.a, dout, &og), 0);
    for (int alg = 0; alg < 2; alg++) {
        clattn_attention_desc d = p.d;
        d.algorithm = alg ? CLATTN_ALGORITHM_UNFUSED : CLATTN_ALGORITHM_FUSED;
        if (!tu_core_applies(d.algorithm, 0)) continue;
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(cl_dev, &d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cl_context ctx = clattn_device_context(cl_dev);
        cl_command_queue q = clattn_device_queue(cl_dev);
        cl_mem m[NI + NG], fout;
        cl_int err;
        for (int i = 0; i < NI + NG; i++) {
            float *host = tu_poisoned(off + n[i] + pad);
            if (i < NI && src[i]) memcpy(host + off, src[i], n[i] * (i == 2 ? 1 : 4));
            m[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (off + n[i] + pad) * 4, host, &err);
            cr_assert_eq(err, CL_SUCCESS);
            free(host);
        }
        fout = clCreateBuffer(ctx, CL_MEM_READ_WRITE, B * Tq * Eo * 4, NULL, &err);
        cr_assert_eq(err, CL_SUCCESS);
        /* the forward on the same buffers writes lse and context at their offsets */
        clattn_attention_buffers in = {.x = {m[0], off}, .kv = {m[1], off}, .key_padding_mask = {m[2], off * 4},
                                       .attn_mask = {m[3], off}};
        clattn_attention_buffers fw = in;
        fw.out = (clattn_buffer){fout, 0}, fw.lse = (clattn_buffer){m[5], off}, fw.context = (clattn_buffer){m[6], off};
        cl_event fwd_done = NULL, done = NULL;
        cr_assert_eq(clattn_plan_execute_buffers(plan, &fw, 0, NULL, &fwd_done), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        clattn_attention_grad_buffers g = {.grad_out = {m[4], off}, .lse = {m[5], off}, .context = {m[6], off}};
        clattn_buffer *slots[NG] = {&g.grad_x, &g.grad_kv, &g.grad_w_query, &g.grad_w_key, &g.grad_w_value,
                                    &g.grad_b_query, &g.grad_b_key, &g.grad_b_value, &g.grad_w_out, &g.grad_b_out};
        for (int i = 0; i < NG; i++) *slots[i] = (clattn_buffer){m[NI + i], off};
        /* refusals first: nothing may be written */
        clattn_attention_grad_buffers bad = g;
        bad.grad_w_key = (clattn_buffer){m[0], off}; /* a gradient over x */
        cr_assert_eq(clattn_plan_backward_buffers(plan, &in, &bad, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        bad = g, bad.grad_b_out = (clattn_buffer){m[NI + 8], off}; /* two gradients in one range */
        cr_assert_eq(clattn_plan_backward_buffers(plan, &in, &bad, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        bad = g, bad.grad_out = (clattn_buffer){NULL, 0};
        cr_assert_eq(clattn_plan_backward_buffers(plan, &in, &bad, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        bad = g, bad.lse = (clattn_buffer){NULL, 0}; /* context without lse */
        cr_assert_eq(clattn_plan_backward_buffers(plan, &in, &bad, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        bad = g, bad.grad_x.offset = off + pad + 1; /* past the buffer's end */
        cr_assert_neq(clattn_plan_backward_buffers(plan, &in, &bad, 0, NULL, NULL), CLATTN_STATUS_SUCCESS);
        clattn_attention_buffers with_out = in;
        with_out.out = (clattn_buffer){fout, 0};
        cr_assert_eq(clattn_plan_backward_buffers(plan, &with_out, &g, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clattn_plan_backward_buffers(plan, &in, &g, 1, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clattn_plan_backward_buffers(plan, &in, &g, 1, &fwd_done, &done), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS);
        char msg[256];
        static const char *names[NG] = {"x", "kv", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value",
                                        "w_out", "b_out"};
        for (int i = 0; i < NG; i++) {
            const size_t len = off + n[NI + i] + pad;
            float *got = malloc(len * 4);
            cr_assert_eq(clEnqueueReadBuffer(q, m[NI + i], CL_TRUE, 0, len * 4, got, 0, NULL, NULL), CL_SUCCESS);
            for (size_t k = 0; k < off; k++) cr_assert(isnan(got[k]), "grad_%s written before its offset", names[i]);
            for (size_t k = 0; k < pad; k++) cr_assert(isnan(got[off + n[NI + i] + k]), "grad_%s written past its end",
                                                      names[i]);
            const size_t nbad = oracle_compare(got + off, want[i], n[NI + i], GRAD_ATOL, GRAD_RTOL, msg, sizeof msg);
            cr_assert_eq(nbad, 0, "%s buffers grad_%s: %s", clattn_plan_core(plan), names[i], msg);
            free(got);
        }
        clReleaseEvent(fwd_done), clReleaseEvent(done);
        for (int i = 0; i < NI + NG; i++) clReleaseMemObject(m[i]);
        clReleaseMemObject(fout);
        clattn_plan_free(plan);
    }
    for (int i = 0; i < NG; i++) free(want[i]);
    free(dout);
    problem_free(&p);
}

/* A half training plan's backward on cl_mem buffers at odd element offsets (x, kv, grad_out and the gradients 16-bit
 * elements, lse and context fp32, as the forward on the same buffers wrote them): the host path's gradients bit for
 * bit (half_backward holds those to the oracle), nothing written outside them. */
Test(train, half_backward_buffers)
{
    static const config cfgs[] = {
        {.B = 2, .Tq = 13, .Tk = 9, .E = 12, .Ekv = 10, .H = 3, .dk = 4, .dv = 4, .Eo = 7, .cross = 1, .causal = 1,
         .biases = 1, .kpm = 1, .dropout = 0.25f, .layout = CLATTN_LAYOUT_RAW, .dtype = F16},
        {.B = 2, .Tq = 7, .Tk = 13, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
         .dtype = BF16},
        {.B = 2, .Tq = 11, .E = 16, .H = 2, .dk = 8, .dv = 8, .Eo = 16, .biases = 1, .dtype = BF16},
    };
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        problem p;
        problem_make(&p, &cfgs[ci], 1700 + ci);
        const clattn_attention_desc *d = &p.d;
        const clattn_dtype t = d->dtype;
        if (!tu_core_applies(CLATTN_ALGORITHM_AUTO, 0)) {
            problem_free(&p);
            continue;
        }
        clattn_plan *plan = plan_of(&p, cl_dev, d, "half buffers");
        if (!plan) {
            problem_free(&p);
            continue;
        }
        clattn_attention_desc pd;
        clattn_plan_desc(plan, &pd);
        const size_t B = pd.batch, Tq = pd.seq_q, Tk = pd.seq_kv, E = pd.embed, Ekv = pd.kv_embed, H = pd.heads;
        const size_t HK = pd.kv_heads, dk = pd.head_dim_qk, dv = pd.head_dim_v, ow = clattn_plan_out_width(plan);
        const size_t off = 7, pad = 5;
        /* inputs: x, kv, value, grad_out; gradients: x, kv, wq, wk, wv, bq, bk, bv, wo, bo, value */
        enum { NI = 4, NG = 11 };
        const int has[NG] = {1, pd.cross, p.w.w_query != NULL, p.w.w_key != NULL, p.w.w_value != NULL,
                             p.w.b_query != NULL, p.w.b_key != NULL, p.w.b_value != NULL, p.w.w_out != NULL,
                             p.w.b_out != NULL, pd.separate_value};
        const size_t n[NI + NG] = {B * Tq * E, B * Tk * Ekv, B * Tk * HK * dv, B * Tq * ow, B * Tq * E, B * Tk * Ekv,
                                   H * dk * E, HK * dk * Ekv, HK * dv * Ekv, H * dk, HK * dk, HK * dv,
                                   pd.out_dim * H * dv, pd.out_dim, B * Tk * HK * dv};
        float *dout = tu_random(&(tu_rng){1750 + ci}, n[3], -1.0f, 1.0f);
        const float *src[NI] = {p.a.x, p.a.kv, p.a.value, dout};
        void *typed_in[NI] = {0}, *host_g[NG] = {0};
        for (int i = 0; i < NI; i++)
            if (src[i]) typed_in[i] = tu_typed(src[i], n[i], t);
        for (int i = 0; i < NG; i++)
            if (has[i]) host_g[i] = tu_poisoned_typed(n[NI + i], t);
        /* the host path */
        clattn_attention_args a = {.x = typed_in[0], .kv = typed_in[1], .value = typed_in[2],
                                   .key_padding_mask = p.a.key_padding_mask, .attn_mask = p.a.attn_mask};
        tu_count_args(plan, &a);
        clattn_attention_grads g = {.grad_out = typed_in[3], .grad_out_count = n[3]};
        void **gslots[NG] = {&g.grad_x, &g.grad_kv, &g.grad_w_query, &g.grad_w_key, &g.grad_w_value, &g.grad_b_query,
                             &g.grad_b_key, &g.grad_b_value, &g.grad_w_out, &g.grad_b_out, &g.grad_value};
        size_t *gcounts[NG] = {&g.grad_x_count, &g.grad_kv_count, &g.grad_w_query_count, &g.grad_w_key_count,
                               &g.grad_w_value_count, &g.grad_b_query_count, &g.grad_b_key_count,
                               &g.grad_b_value_count, &g.grad_w_out_count, &g.grad_b_out_count, &g.grad_value_count};
        for (int i = 0; i < NG; i++)
            if (has[i]) *gslots[i] = host_g[i], *gcounts[i] = n[NI + i];
        cr_assert_eq(clattn_plan_backward(plan, &a, &g), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        /* the buffer path: each array at `off` elements into a buffer poisoned (0xFFFF) around it */
        cl_context cx = clattn_device_context(cl_dev);
        cl_command_queue q = clattn_device_queue(cl_dev);
        cl_mem m[NI + NG] = {0}, kpm = NULL, lse, ctx, fout;
        cl_int err;
        for (int i = 0; i < NI + NG; i++) {
            if (i < NI ? !src[i] : !has[i - NI]) continue;
            const size_t len = (off + n[i] + pad) * 2;
            uint16_t *h = malloc(len);
            memset(h, 0xFF, len);
            if (i < NI) memcpy(h + off, typed_in[i], n[i] * 2);
            m[i] = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, len, h, &err);
            cr_assert_eq(err, CL_SUCCESS);
            free(h);
        }
        if (p.a.key_padding_mask) {
            kpm = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, B * Tk, (void *)p.a.key_padding_mask,
                                 &err);
            cr_assert_eq(err, CL_SUCCESS);
        }
        lse = clCreateBuffer(cx, CL_MEM_READ_WRITE, B * H * Tq * 4, NULL, &err);
        ctx = clCreateBuffer(cx, CL_MEM_READ_WRITE, B * Tq * H * dv * 4, NULL, &err);
        fout = clCreateBuffer(cx, CL_MEM_READ_WRITE, n[3] * 2, NULL, &err);
        clattn_attention_buffers in = {.x = {m[0], off}, .kv = {m[1], off}, .value = {m[2], off},
                                       .key_padding_mask = {kpm, 0}};
        clattn_attention_buffers fw = in;
        fw.out = (clattn_buffer){fout, 0}, fw.lse = (clattn_buffer){lse, 0}, fw.context = (clattn_buffer){ctx, 0};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &fw, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        clattn_attention_grad_buffers gb = {.grad_out = {m[3], off}, .lse = {lse, 0}, .context = {ctx, 0}};
        clattn_buffer *bslots[NG] = {&gb.grad_x, &gb.grad_kv, &gb.grad_w_query, &gb.grad_w_key, &gb.grad_w_value,
                                     &gb.grad_b_query, &gb.grad_b_key, &gb.grad_b_value, &gb.grad_w_out,
                                     &gb.grad_b_out, &gb.grad_value};
        for (int i = 0; i < NG; i++)
            if (has[i]) *bslots[i] = (clattn_buffer){m[NI + i], off};
        cr_assert_eq(clattn_plan_backward_buffers(plan, &in, &gb, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        for (int i = 0; i < NG; i++) {
            if (!has[i]) continue;
            const size_t len = off + n[NI + i] + pad;
            uint16_t *got = malloc(len * 2);
            cr_assert_eq(clEnqueueReadBuffer(q, m[NI + i], CL_TRUE, 0, len * 2, got, 0, NULL, NULL), CL_SUCCESS);
            for (size_t k = 0; k < off; k++) cr_assert_eq(got[k], 0xFFFF, "gradient %d written before its offset", i);
            for (size_t k = 0; k < pad; k++)
                cr_assert_eq(got[off + n[NI + i] + k], 0xFFFF, "gradient %d written past its end", i);
            const uint16_t *want = host_g[i];
            for (size_t k = 0; k < n[NI + i]; k++)
                cr_assert_eq(got[off + k], want[k], "case %zu (%s, %s) gradient %d element %zu: buffers 0x%04x, host "
                             "0x%04x", ci, clattn_plan_core(plan), clattn_dtype_name(t), i, k, got[off + k], want[k]);
            free(got);
        }
        for (int i = 0; i < NI + NG; i++)
            if (m[i]) clReleaseMemObject(m[i]);
        if (kpm) clReleaseMemObject(kpm);
        clReleaseMemObject(lse), clReleaseMemObject(ctx), clReleaseMemObject(fout);
        for (int i = 0; i < NI; i++) free(typed_in[i]);
        for (int i = 0; i < NG; i++) free(host_g[i]);
        free(dout);
        clattn_plan_free(plan);
        problem_free(&p);
    }
}

/* The oracle's backward against its own forward, by central differences on tiny shapes: L = sum(out o dOut),
 * each input element moved by h = 2^-10 (exact in float for |x| < 2), (L+ - L-) / 2h against dL/dx. */
static double loss(const clattn_attention_desc *d, const clattn_attention_weights *w, const clattn_attention_args *a,
                   const float *dout, size_t n_out)
{
    double *o = malloc(n_out * sizeof *o), L = 0.0;
    cr_assert_eq(oracle_attention(d, w, a, o, NULL), 0);
    for (size_t i = 0; i < n_out; i++) L += o[i] * dout[i];
    free(o);
    return L;
}

Test(train, oracle_backward_finite_differences)
{
    static const config cfgs[] = {
        {.B = 2, .Tq = 5, .E = 6, .H = 2, .dk = 3, .dv = 2, .Eo = 4, .causal = 1, .biases = 1, .kpm = 1, .mask = CLATTN_MASK_FLOAT, .dropout = 0.25f},
        {.B = 1, .Tq = 4, .Tk = 6, .E = 4, .Ekv = 5, .H = 2, .HK = 1, .dk = 3, .dv = 3, .Eo = 3, .cross = 1, .biases = 1, .mask = CLATTN_MASK_BOOL},
        /* rotary embeddings: the rotation's transpose on dQ and dK (b_key's gradient passes through it) */
        {.B = 2, .Tq = 5, .E = 6, .H = 2, .dk = 4, .dv = 2, .Eo = 4, .causal = 1, .biases = 1,
         .rope = {.kind = CLATTN_ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_YARN, .factor = 4.0, .original_max_position = 8}},
        {.B = 1, .Tq = 4, .Tk = 6, .E = 4, .Ekv = 5, .H = 2, .HK = 1, .dk = 4, .dv = 3, .Eo = 3, .cross = 1, .biases = 1,
         .rope = {.kind = CLATTN_ROPE_INTERLEAVED, .dims = 2, .theta = 10.0}},
    };
    for (size_t t = 0; t < sizeof cfgs / sizeof cfgs[0]; t++) {
        problem p;
        problem_make(&p, &cfgs[t], 950 + t);
        const config *c = &cfgs[t];
        const size_t Tk = c->cross ? c->Tk : c->Tq, Ekv = c->cross ? c->Ekv : c->E, HK = c->HK ? c->HK : c->H;
        const size_t n_out = c->B * c->Tq * c->Eo;
        tu_rng rng = {960 + t};
        float *dout = tu_random(&rng, n_out, -1, 1);
        const size_t n[6] = {c->B * c->Tq * c->E, c->B * Tk * Ekv, c->H * c->dk * c->E, HK * c->dv * Ekv,
                             c->Eo * c->H * c->dv, HK * c->dk};
        float *in[6] = {(float *)p.a.x, (float *)p.a.kv, (float *)p.w.w_query, (float *)p.w.w_value,
                        (float *)p.w.w_out, (float *)p.w.b_key};
        double *want[6];
        for (int i = 0; i < 6; i++) want[i] = malloc(n[i] * sizeof(double));
        oracle_grads og = {.x = want[0], .kv = c->cross ? want[1] : NULL, .w_query = want[2], .w_value = want[3],
                           .w_out = want[4], .b_key = want[5]};
        cr_assert_eq(oracle_attention_backward(&p.d, &p.w, &p.a, dout, &og), 0);
        const double h = 1.0 / 1024;
        for (int i = 0; i < 6; i++) {
            if (!in[i]) continue;
            for (size_t k = 0; k < n[i]; k++) {
                const float keep = in[i][k];
                in[i][k] = keep + (float)h;
                const double lp = loss(&p.d, &p.w, &p.a, dout, n_out);
                in[i][k] = keep - (float)h;
                const double lm = loss(&p.d, &p.w, &p.a, dout, n_out);
                in[i][k] = keep;
                const double fd = (lp - lm) / (2 * h);
                cr_assert(fabs(fd - want[i][k]) <= 1e-5 + 1e-4 * fabs(want[i][k]), "case %zu input %d element %zu: "
                          "finite difference %.9g, oracle backward %.9g", t, i, k, fd, want[i][k]);
            }
        }
        for (int i = 0; i < 6; i++) free(want[i]);
        free(dout);
        problem_free(&p);
    }
}

/* Under a device's loop limit (lowered here to 20000, above the GEMM core's least on CPUs: 8,172 trips on PoCL,
 * 12,404 on llvmpipe; Mesa 22's llvmpipe ends a work-item's loops after 65,535, fewer than the rows of 128 sequences
 * of 512 tokens), the biases' gradients sum their B*T = 20000 rows in blocks within it; every gradient against the
 * oracle's. */
Test(train, backward_loop_limit)
{
    const size_t limit = cl_dev->caps.loop_limit;
    cl_dev->caps.loop_limit = 20000;
    const size_t budget = clattn_loop_budget(&cl_dev->caps);
    problem p;
    /* Eo 24: the output bias's gradient sums a CPU's 16-column vector and 8 more columns one at a time */
    problem_make(&p, &(config){.B = 100, .Tq = 200, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 24, .causal = 1, .biases = 1},
                 996);
    clattn_test_trips_reach(1);
    check_backward_opencl(&p, 996);
    const size_t reach = clattn_test_trips_reach(0);
    /* flash_backward on a CPU driver with a loop limit (Mesa's llvmpipe) takes 4 partner rows per step: that compiler
     * does not finish the 8-partner kernels (flash_backward.c's defaults) */
    clattn_plan *plan = NULL;
    if (!tu_forced_core_of(CLATTN_CORE_BACKWARD) && tu_plan_create(cl_dev, &p.d, &p.w, &plan) == CLATTN_STATUS_SUCCESS &&
        strcmp(clattn_plan_backward_core(plan), "flash_backward") == 0)
        cr_expect(strstr(clattn_plan_backward_core_params(plan), "PART=4"), "under a loop limit: %s",
                  clattn_plan_backward_core_params(plan));
    clattn_plan_free(plan);
    cl_dev->caps.loop_limit = limit;
    problem_free(&p);
    cr_assert_leq(reach, budget, "a work-item of %zu loop iterations ran; the budget is %zu", reach, budget);
    const char *forced = getenv("CLATTN_CORE"); /* a forced core may be one the limit refuses (printed above) */
    if (forced && *forced) return;
    if (reach == 0 && cl_dev->caps.dclass != CLATTN_CLASS_CPU) /* refused (printed above): a GPU's GEMM core (CLBlast) */
        cr_log_info("no GEMM core of this device bounds its loops: the plans were refused at the limit");
    else
        cr_assert_gt(reach, 0, "no bias gradient was computed");
}

/* Under a device's limit on work-items per launch (lowered here to 256: four work-groups of the GPU backward core's
 * defaults, against its 12 of each pass here), every kernel of the backward goes in launches within it, the tiled
 * passes each at its first work-group; every gradient against the oracle's. */
Test(train, backward_launch_limit)
{
    const size_t items = cl_dev->caps.max_launch_items;
    cl_dev->caps.max_launch_items = 256;
    problem p;
    problem_make(&p, &(config){.B = 3, .Tq = 37, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 8, .causal = 1, .biases = 1},
                 997);
    clattn_test_launch_reach(1);
    check_backward_opencl(&p, 997);
    const size_t reach = clattn_test_launch_reach(0);
    cl_dev->caps.max_launch_items = items;
    problem_free(&p);
    cr_assert_leq(reach, 256, "a launch of %zu work-items; the limit is 256", reach);
}

/* What the backward refuses, before it writes anything. */
/* The backward core a plan names: the one that runs on OpenCL training plans (CLATTN_CORE's when it forces one),
 * "ref" on ref, none for a plan that does not train. */
Test(train, backward_core_named)
{
    config c = {.B = 2, .Tq = 5, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 8, .causal = 1, .biases = 1};
    problem p;
    problem_make(&p, &c, 995);
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(cl_dev, &p.d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_core_info *forced = tu_forced_core_of(CLATTN_CORE_BACKWARD);
    /* else AUTO's backward core for head size 4 on this device (the registry's order: flash_backward on CPUs,
     * flash_backward_gemm on NVIDIA's GPUs) */
    clattn_core_info auto_core = {0};
    cr_assert(forced || tu_auto_core(cl_dev, CLATTN_CORE_BACKWARD, clattn_head_class(4, 4), &auto_core),
              "no backward core is AUTO's for head size 4");
    if (!forced && cl_dev->caps.dclass == CLATTN_CLASS_CPU) cr_assert_str_eq(auto_core.name, "flash_backward");
    cr_assert_str_eq(clattn_plan_backward_core(plan), forced ? forced->name : auto_core.name);
    /* its parameters, each of the core's by name */
    const char *params = clattn_plan_backward_core_params(plan);
    char names[128];
    snprintf(names, sizeof names, "%s", forced ? forced->params : auto_core.params);
    for (char *save = NULL, *n = strtok_r(names, " ", &save); n; n = strtok_r(NULL, " ", &save)) {
        char want[40];
        snprintf(want, sizeof want, "%s=", n);
        cr_assert(strstr(params, want), "parameters '%s' without %s", params, n);
    }
    cr_assert(params[0], "no parameters");
    clattn_plan_free(plan);
    cr_assert_eq(tu_plan_create(ref_dev, &p.d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_str_eq(clattn_plan_backward_core(plan), "ref");
    cr_assert_str_eq(clattn_plan_backward_core_params(plan), "");
    clattn_plan_free(plan);
    clattn_attention_desc inference = p.d;
    inference.training = 0;
    cr_assert_eq(tu_plan_create(cl_dev, &inference, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_str_eq(clattn_plan_backward_core(plan), "");
    cr_assert_str_eq(clattn_plan_backward_core_params(plan), "");
    clattn_plan_free(plan);
    cr_assert_str_eq(clattn_plan_backward_core(NULL), "");
    cr_assert_str_eq(clattn_plan_backward_core_params(NULL), "");
    problem_free(&p);
}

Test(train, backward_refusals)
{
    const config c = {.B = 2, .Tq = 5, .Tk = 7, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 4, .Eo = 8, .cross = 1};
    problem p;
    problem_make(&p, &c, 990);
    const size_t B = 2, Tq = 5, E = 8;
    float *dout = tu_random(&(tu_rng){991}, B * Tq * 8, -1, 1), *gx = tu_poisoned(B * Tq * E);
    float *junk = tu_poisoned(4096);
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(ref_dev, &p.d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_attention_args a = p.a;
    tu_count_args(plan, &a);
    const clattn_attention_grads ok = {.grad_out = dout, .grad_out_count = B * Tq * 8, .grad_x = gx,
                                       .grad_x_count = B * Tq * E};
    clattn_attention_grads g = ok;
    g.grad_out = NULL;
    cr_assert_eq(clattn_plan_backward(plan, &a, &g), CLATTN_STATUS_INVALID_ARGUMENT);
    g = ok, g.grad_out_count--;
    cr_assert_eq(clattn_plan_backward(plan, &a, &g), CLATTN_STATUS_SHAPE_MISMATCH);
    g = ok, g.grad_b_out = junk, g.grad_b_out_count = 8; /* the plan has no b_out */
    cr_assert_eq(clattn_plan_backward(plan, &a, &g), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "b_out"), "%s", clattn_last_error());
    g = ok, g.lse = junk, g.lse_count = 2 * 2 * 5; /* lse without context */
    cr_assert_eq(clattn_plan_backward(plan, &a, &g), CLATTN_STATUS_INVALID_ARGUMENT);
    g = ok;
    clattn_attention_args wo = a;
    wo.out = junk, wo.out_count = B * Tq * 8; /* an output among the backward's inputs */
    cr_assert_eq(clattn_plan_backward(plan, &wo, &g), CLATTN_STATUS_INVALID_ARGUMENT);
    wo = a, wo.kv = NULL, wo.kv_count = 0;
    cr_assert_eq(clattn_plan_backward(plan, &wo, &g), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_backward(plan, &a, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_backward(NULL, &a, &g), CLATTN_STATUS_INVALID_ARGUMENT);
    for (size_t k = 0; k < B * Tq * E; k++) cr_assert(isnan(gx[k]), "grad_x written by a refused call");
    clattn_plan_free(plan);
    /* a plan made without training has no backward */
    clattn_attention_desc d = p.d;
    d.training = 0;
    cr_assert_eq(tu_plan_create(ref_dev, &d, &p.w, &plan), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(clattn_plan_backward(plan, &a, &ok), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "training"), "%s", clattn_last_error());
    clattn_plan_free(plan);
    /* the buffer form is OpenCL's: on ref it is refused, naming the device */
    clattn_attention_desc dt = p.d;
    cr_assert_eq(tu_plan_create(ref_dev, &dt, &p.w, &plan), CLATTN_STATUS_SUCCESS);
    const clattn_attention_buffers nb = {0};
    const clattn_attention_grad_buffers ng = {0};
    cr_assert_eq(clattn_plan_backward_buffers(plan, &nb, &ng, 0, NULL, NULL), CLATTN_STATUS_UNSUPPORTED);
    clattn_plan_free(plan);
    free(dout); free(gx); free(junk);
    problem_free(&p);
}

/* ---- new weights in a plan (clattn_plan_set_weights): a training step's updated parameters */

/* Plans created with another problem's weights (same shapes, other values) and given p's: the forward and the
 * backward, on ref and OpenCL, against the oracle with p's weights (self-attention into the Q|K|V blocks, cross into
 * Q and K|V, RAW layout normalised, with and without biases and an output projection). */
Test(train, set_weights)
{
    /* B Tq Tk E Ekv H HK dk dv Eo window | cross causal biases kpm | mask dropout | layout */
    static const config cfgs[] = {
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .causal = 1, .biases = 1},
        {.B = 2, .Tq = 6, .Tk = 8, .E = 10, .Ekv = 6, .H = 2, .HK = 1, .dk = 3, .dv = 5, .Eo = 7, .cross = 1, .biases = 1, .kpm = 1, .layout = CLATTN_LAYOUT_RAW},
        {.B = 1, .Tq = 9, .E = 8, .H = 2, .dk = 4, .dv = 4, .causal = 1},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        problem p, other;
        problem_make(&p, &cfgs[i], 1200 + i);
        problem_make(&other, &cfgs[i], 1300 + i);
        p.first = &other.w;
        if (!tu_forced_core_of(CLATTN_CORE_PREFILL)) check_on(&p, ref_dev, CLATTN_ALGORITHM_AUTO, "ref, new weights");
        if (tu_core_applies(CLATTN_ALGORITHM_FUSED, 0)) check_on(&p, cl_dev, CLATTN_ALGORITHM_FUSED, "opencl fused, new weights");
        if (tu_core_applies(CLATTN_ALGORITHM_UNFUSED, 0))
            check_on(&p, cl_dev, CLATTN_ALGORITHM_UNFUSED, "opencl unfused, new weights");
        if (!tu_forced_core_of(CLATTN_CORE_PREFILL) && !tu_forced_core_of(CLATTN_CORE_BACKWARD))
            check_backward_on(&p, ref_dev, CLATTN_ALGORITHM_AUTO, 1, 1400 + i, "ref, new weights");
        check_backward_opencl(&p, 1400 + i);
        problem_free(&p);
        problem_free(&other);
    }
}

/* What set_weights refuses: another set of arrays than the plan's, a count that is not the plan's, NULL; after each
 * refusal the plan computes with its old weights, bit for bit. */
static void set_weights_refusals_on(clattn_device *dev)
{
    const config c = {.B = 2, .Tq = 5, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 6, .causal = 1, .biases = 1};
    problem p, other;
    problem_make(&p, &c, 1500);
    problem_make(&other, &c, 1501);
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &p.d, &p.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const size_t n_out = 2 * 5 * 6;
    float *before = tu_poisoned(n_out), *after = tu_poisoned(n_out);
    clattn_attention_args a = p.a;
    a.out = before;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_attention_weights w = other.w;
    tu_count_weights(&w, &p.d);
    clattn_attention_weights bad = w;
    bad.b_key = NULL, bad.b_key_count = 0; /* the plan has b_key: left out it would keep its old value */
    cr_assert_eq(clattn_plan_set_weights(plan, &bad), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "weights.b_key is NULL"), "%s", clattn_last_error());
    bad = w, bad.w_query = NULL, bad.w_query_count = 0;
    cr_assert_eq(clattn_plan_set_weights(plan, &bad), CLATTN_STATUS_INVALID_ARGUMENT);
    bad = w, bad.w_out_count--;
    cr_assert_eq(clattn_plan_set_weights(plan, &bad), CLATTN_STATUS_SHAPE_MISMATCH);
    cr_assert(strstr(clattn_last_error(), "w_out"), "%s", clattn_last_error());
    cr_assert_eq(clattn_plan_set_weights(plan, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_set_weights(NULL, &w), CLATTN_STATUS_INVALID_ARGUMENT);
    a.out = after;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert(memcmp(before, after, n_out * sizeof(float)) == 0, "a refused set_weights changed the plan's output");
    clattn_plan_free(plan);
    /* a plan without b_out (nor biases) refuses them */
    clattn_attention_weights nob = p.w;
    nob.b_query = nob.b_key = nob.b_value = nob.b_out = NULL;
    cr_assert_eq(tu_plan_create(dev, &p.d, &nob, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_plan_set_weights(plan, &w), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "weights.b_query is given, but the plan was created without it"), "%s",
              clattn_last_error());
    clattn_plan_free(plan);
    free(before), free(after);
    problem_free(&p);
    problem_free(&other);
}

Test(train, set_weights_refusals)
{
    set_weights_refusals_on(ref_dev);
    set_weights_refusals_on(cl_dev);
}

/* PyTorch's autograd gradients (tests/golden/backward, made by make_golden_backward.py: nn.MultiheadAttention in
 * float64): every gradient of each case, from every device that has a backward pass. */
#define BACKWARD_DIR CLATTN_GOLDEN_DIR "/../backward"

static void check_fixture(clattn_device *dev, const char *name, clattn_algorithm alg)
{
    char dir[512], msg[256];
    snprintf(dir, sizeof dir, "%s/%s", BACKWARD_DIR, name);
    tu_case c;
    cr_assert_eq(tu_case_load(dir, &c, msg, sizeof msg), 0, "%s", msg);
    c.desc.training = 1;
    c.desc.algorithm = alg;
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &c.desc, &c.weights, &plan), CLATTN_STATUS_SUCCESS, "%s: %s", name,
                 clattn_last_error());
    static const char *names[10] = {"x", "kv", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out",
                                    "b_out"};
    clattn_npy want[10], dout;
    float *got[10] = {0};
    char path[640], err[256];
    snprintf(path, sizeof path, "%s/grad_out.npy", dir);
    cr_assert_eq(clattn_npy_load(path, &dout, err, sizeof err), 0, "%s", err);
    clattn_attention_grads g = {.grad_out = (const float *)dout.data, .grad_out_count = dout.count};
    void **slots[10] = {&g.grad_x, &g.grad_kv, &g.grad_w_query, &g.grad_w_key, &g.grad_w_value, &g.grad_b_query,
                         &g.grad_b_key, &g.grad_b_value, &g.grad_w_out, &g.grad_b_out};
    size_t *counts[10] = {&g.grad_x_count, &g.grad_kv_count, &g.grad_w_query_count, &g.grad_w_key_count,
                          &g.grad_w_value_count, &g.grad_b_query_count, &g.grad_b_key_count, &g.grad_b_value_count,
                          &g.grad_w_out_count, &g.grad_b_out_count};
    int have[10], n_have = 0;
    for (int i = 0; i < 10; i++) {
        snprintf(path, sizeof path, "%s/grad_%s.npy", dir, names[i]);
        FILE *f = fopen(path, "rb");
        have[i] = f != NULL;
        if (!f) continue;
        fclose(f);
        n_have++;
        cr_assert_eq(clattn_npy_load(path, &want[i], err, sizeof err), 0, "%s", err);
        got[i] = tu_poisoned(want[i].count);
        *slots[i] = got[i], *counts[i] = want[i].count;
    }
    cr_assert_geq(n_have, 5, "%s: too few gradients", name);
    clattn_attention_args a = c.args;
    tu_count_args(plan, &a);
    cr_assert_eq(clattn_plan_backward(plan, &a, &g), CLATTN_STATUS_SUCCESS, "%s: %s", name, clattn_last_error());
    for (int i = 0; i < 10; i++) {
        if (!have[i]) continue;
        const size_t bad = tu_compare(got[i], (const float *)want[i].data, want[i].count, GRAD_ATOL, GRAD_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "%s (%s) grad_%s vs PyTorch: %zu of %zu differ; %s", name, clattn_plan_core(plan), names[i],
                     bad, want[i].count, msg);
        clattn_npy_free(&want[i]);
        free(got[i]);
    }
    clattn_npy_free(&dout);
    clattn_plan_free(plan);
    tu_case_free(&c);
}

Test(train, backward_pytorch_fixtures)
{
    static const char *cases[] = {"mha_causal_kpm", "mha_cross_float_mask", "mha_nobias_bool_mask", "mha_causal_t130",
                                  "mha_head1_t1"};
    const int ref = !tu_forced_core_of(CLATTN_CORE_PREFILL) && !tu_forced_core_of(CLATTN_CORE_BACKWARD);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (ref) check_fixture(ref_dev, cases[i], CLATTN_ALGORITHM_AUTO);
        if (tu_core_applies(CLATTN_ALGORITHM_FUSED, 0)) check_fixture(cl_dev, cases[i], CLATTN_ALGORITHM_FUSED);
        if (tu_core_applies(CLATTN_ALGORITHM_UNFUSED, 0)) check_fixture(cl_dev, cases[i], CLATTN_ALGORITHM_UNFUSED);
    }
}

/* Random combinations of every option a training plan takes (tu_case_random): the forward's statistics (fp32
 * cases) and every gradient, on ref (plain entries) and OpenCL, with the forward's statistics and recomputing them. A
 * fixed series, case k seeded 2000 + k and described on stderr first; CLATTN_TEST_SWEEP=N runs N of them from
 * CLATTN_TEST_SWEEP_BASE (scripts/mutate.sh: none; a core's entries: none unless asked). Before it was added, 60 such
 * cases passed with AUTO's backward core and 10 more with flash_backward_gemm (and 223 of an earlier generator); it
 * keeps 3 in every run. */
Test(train, sweep, .timeout = 1800)
{
    int base;
    const int n = tu_sweep_count(3, &base);
    for (int k = base; k < base + n; k++) {
        config c;
        tu_case_random(&c, (uint64_t)k, 1);
        char line[512]; /* on stderr, which ctest shows when the entry fails */
        tu_case_describe(&c, line, sizeof line);
        fprintf(stderr, "sweep case %d (seed %d): %s\n", k, 2000 + k, line);
        if (c.dtype == CLATTN_DTYPE_F32) check(&c, 2000 + (uint64_t)k);
        check_backward(&c, 2000 + (uint64_t)k);
    }
}

/* Variable-length batches (desc.varlen) in training: the forward's lse and context and every gradient against the
 * oracle run on each sequence alone (tu_varlen_train_check), on ref and the OpenCL device: GQA with a causal window
 * over sequences of 7, 0, 61 and 1 rows; cross-attention whose sequences have 7 queries on 61 keys, 3 on none, none
 * on 20, and a batch without a key at all; without projections (Q, K, V the rows of x); dropout in both (keyed by the
 * sequence's index). The shapes are backward_gqa_window_dropout's and backward_masks_cross's (their kernels). */
Test(train, backward_varlen)
{
    static const tu_attn_case self = {.B = 4, .Tq = 61, .E = 16, .H = 4, .HK = 1, .dk = 4, .dv = 4, .Eo = 16,
                                      .causal = 1, .window = 5, .biases = 1};
    static const tu_attn_case cross = {.B = 3, .Tq = 7, .Tk = 61, .E = 8, .Ekv = 5, .H = 2, .dk = 3, .dv = 4,
                                       .Eo = 6, .biases = 1, .cross = 1};
    static const tu_attn_case heads = {.B = 3, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .causal = 1, .noproj = 1};
    /* dropout: each sequence's weights kept as the padded batch's entry b's, in the forward and the backward */
    static const tu_attn_case self_drop = {.B = 4, .Tq = 61, .E = 16, .H = 4, .HK = 1, .dk = 4, .dv = 4, .Eo = 16,
                                           .causal = 1, .window = 5, .biases = 1, .dropout = 0.3f};
    static const tu_attn_case cross_drop = {.B = 3, .Tq = 7, .Tk = 61, .E = 8, .Ekv = 5, .H = 2, .dk = 3, .dv = 4,
                                            .Eo = 6, .biases = 1, .cross = 1, .dropout = 0.5f};
    const size_t sq[4] = {7, 0, 61, 1}, cq[3] = {7, 3, 0}, ck[3] = {61, 0, 20}, none[3] = {0, 0, 0}, hq[3] = {7, 2, 5};
    const size_t dq[3] = {2, 7, 5}, dk[3] = {0, 40, 61}; /* the first without keys: the others' index is not their place */
    clattn_device *devs[2] = {ref_dev, cl_dev};
    for (int k = !!(tu_forced_core_of(CLATTN_CORE_PREFILL) || tu_forced_core_of(CLATTN_CORE_BACKWARD)); k < 2; k++) {
        tu_varlen_train_check(devs[k], &self, sq, NULL, 1201);
        tu_varlen_train_check(devs[k], &cross, cq, ck, 1202);
        tu_varlen_train_check(devs[k], &cross, cq, none, 1203); /* no keys at all: out = b_out */
        tu_varlen_train_check(devs[k], &heads, hq, NULL, 1204); /* x is Q, K and V: rows of E, gradients of 3 blocks */
        tu_varlen_train_check(devs[k], &self_drop, sq, NULL, 1205);
        tu_varlen_train_check(devs[k], &cross_drop, dq, dk, 1206);
        /* rotary embeddings: each sequence's positions from 0 (their rows' places in the packed batch differ) */
        tu_attn_case self_rope = self, heads_rope = heads;
        self_rope.rope = (clattn_rope){.kind = CLATTN_ROPE_HALF, .dims = 2};
        heads_rope.rope = (clattn_rope){.kind = CLATTN_ROPE_INTERLEAVED};
        tu_varlen_train_check(devs[k], &self_rope, sq, NULL, 1207);
        tu_varlen_train_check(devs[k], &heads_rope, hq, NULL, 1208);
        self_rope.rope_pos = heads_rope.rope_pos = 1; /* at the positions given, packed as the rows are */
        tu_varlen_train_check(devs[k], &self_rope, sq, NULL, 1209);
        tu_varlen_train_check(devs[k], &heads_rope, hq, NULL, 1210);
        /* attention sinks: each sequence's lse with its heads' sinks, one launch per sequence (an empty one too) */
        tu_attn_case self_sinks = self, cross_sinks = cross;
        self_sinks.sinks = cross_sinks.sinks = 1;
        tu_varlen_train_check(devs[k], &self_sinks, sq, NULL, 1211);
        tu_varlen_train_check(devs[k], &cross_sinks, cq, ck, 1212);
    }
}
