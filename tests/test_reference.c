/* test_reference.c: Philox known answers, dropout statistics and determinism,
 * fully masked rows, NaN propagation, and plan validation (on ref and OpenCL). */
#include "common/philox.cl"
#include "attention/attention.h"
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Random123's published known-answer vectors for Philox4x32-10. */
Test(philox, known_answers)
{
    const uint32_t(*kat)[10] = oracle_philox_kat; /* Random123 known answers, in tests/oracle.c */
    for (int t = 0; t < 3; t++) {
        clattn_u32 out[4];
        clattn_philox4x32_10(&kat[t][0], &kat[t][4], out);
        for (int w = 0; w < 4; w++) cr_assert_eq(out[w], kat[t][6 + w], "vector %d word %d: %08x", t, w, out[w]);
    }
}

Test(philox, threshold)
{
    cr_assert_eq(clattn_dropout_threshold(0.0f), 0u);
    cr_assert_eq(clattn_dropout_threshold(0.5f), 0x80000000u);
    cr_assert_eq(clattn_dropout_threshold(0.25f), 0x40000000u);
    cr_assert_eq(clattn_dropout_threshold(0.99999994f), 0xFFFFFF00u); /* (1 - 2^-24) 2^32 */
    cr_assert_eq(clattn_dropout_threshold(0.1f), 429496736u);          /* 0.1f = 0x3DCCCCCD: 13421773 2^-27 */
    cr_assert_float_eq(clattn_dropout_keep_scale(0.2f), 1.25f, 1e-6f);
}

/* A self-attention problem of B=2, T=64, E=16, H=4 with weights: 32768 attention weights. */
typedef struct problem {
    clattn_attention_desc d;
    clattn_attention_weights w;
    float *wq, *wk, *wv, *x;
} problem;

#define N_ATTN (2 * 4 * 64 * 64)
#define N_OUT (2 * 64 * 16)

static void problem_init(problem *p, uint64_t seed)
{
    tu_rng r = {seed};
    memset(p, 0, sizeof *p);
    p->d = (clattn_attention_desc){.batch = 2, .seq_q = 64, .embed = 16, .heads = 4, .head_dim_qk = 4};
    p->w.w_query = p->wq = tu_random(&r, 16 * 16, -0.25f, 0.25f);
    p->w.w_key = p->wk = tu_random(&r, 16 * 16, -0.25f, 0.25f);
    p->w.w_value = p->wv = tu_random(&r, 16 * 16, -0.25f, 0.25f);
    p->x = tu_random(&r, 2 * 64 * 16, -1, 1);
}

static void problem_free(problem *p)
{
    free(p->wq); free(p->wk); free(p->wv); free(p->x);
}


static void run(clattn_device *dev, const problem *p, float dropout, uint64_t seed, float *out, float *attn)
{
    clattn_attention_desc d = p->d;
    d.dropout = dropout;
    d.seed = seed;
    d.need_weights = attn != NULL; /* without: AUTO runs the fused kernel on OpenCL */
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, &p->w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t i = 0; i < N_OUT; i++) out[i] = NAN;
    for (size_t i = 0; attn && i < N_ATTN; i++) attn[i] = NAN;
    clattn_attention_args a = {.x = p->x, .out = out, .attn = attn};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_plan_free(plan);
    for (size_t i = 0; i < N_OUT; i++) cr_assert(isfinite(out[i]), "out[%zu] = %g", i, out[i]);
}

static void dropout_statistics(clattn_device *dev)
{
    problem p;
    problem_init(&p, 42);
    static float eval_attn[N_ATTN], a1[N_ATTN], a2[N_ATTN], a3[N_ATTN], out[N_OUT];
    run(dev, &p, 0.0f, 0, out, eval_attn);
    const float ps[] = {0.1f, 0.5f, 0.8f};
    for (int k = 0; k < 3; k++) {
        float pdrop = ps[k];
        run(dev, &p, pdrop, 1234, out, a1);
        run(dev, &p, pdrop, 1234, out, a2);
        run(dev, &p, pdrop, 99, out, a3);
        size_t dropped = 0, differ = 0;
        for (size_t i = 0; i < N_ATTN; i++) {
            cr_assert_eq(memcmp(&a1[i], &a2[i], sizeof(float)), 0, "same seed, different weight at %zu", i);
            differ += (a1[i] == 0.0f) != (a3[i] == 0.0f);
            if (a1[i] == 0.0f) {
                dropped++;
            } else { /* kept weights are the eval weights / (1 - p) */
                float want = eval_attn[i] * clattn_dropout_keep_scale(pdrop);
                cr_assert(fabsf(a1[i] - want) <= 1e-6f + 1e-5f * fabsf(want), "kept weight %zu: %g vs %g", i, a1[i],
                          want);
            }
        }
        /* Binomial(N, p) drops, within 5 sd; two seeds disagree on a weight with probability
         * 2p(1-p), so Binomial(N, 2p(1-p)) disagreements, within 5 sd (the per-column, per-row and
         * exact-mask checks are in test_dropout.c) */
        const double N = N_ATTN, sd = sqrt(N * pdrop * (1 - pdrop)), q = 2 * pdrop * (1 - pdrop);
        cr_assert(fabs((double)dropped - N * pdrop) <= 5 * sd, "p = %g: %zu dropped of %g, expected %g +- %g",
                  pdrop, dropped, N, N * pdrop, 5 * sd);
        cr_assert(fabs((double)differ - N * q) <= 5 * sqrt(N * q * (1 - q)),
                  "p = %g: seeds 1234 and 99 differ on %zu weights, expected %g", pdrop, differ, N * q);
    }
    /* p = 0 is eval mode exactly */
    run(dev, &p, 0.0f, 555, out, a1);
    cr_assert_eq(memcmp(a1, eval_attn, sizeof a1), 0);
    problem_free(&p);
}

Test(dropout, statistics_ref)
{
    clattn_device *dev = tu_open_ref();
    dropout_statistics(dev);
    clattn_device_free(dev);
}

Test(dropout, statistics_opencl)
{
    clattn_device *dev = tu_open_opencl();
    cr_assert(dev, "%s", clattn_last_error());
    dropout_statistics(dev);
    clattn_device_free(dev);
}

/* Same seed: the same mask on ref and OpenCL, bit for bit. */
Test(dropout, same_mask_everywhere)
{
    clattn_device *cl = tu_open_opencl(), *ref = tu_open_ref();
    cr_assert(cl, "%s", clattn_last_error());
    problem p;
    problem_init(&p, 7);
    static float ar[N_ATTN], ac[N_ATTN], out[N_OUT], out_ref[N_OUT], out_fused[N_OUT];
    const uint64_t seeds[] = {0, 1, 0xFFFFFFFFull, 0x123456789ABCDEFull};
    for (int s = 0; s < 4; s++) {
        run(ref, &p, 0.3f, seeds[s], out_ref, ar);
        run(cl, &p, 0.3f, seeds[s], out, ac);
        for (size_t i = 0; i < N_ATTN; i++)
            cr_assert_eq(ar[i] == 0.0f, ac[i] == 0.0f, "seed %d: mask differs at %zu", s, i);
        char msg0[256];
        cr_assert_eq(tu_compare(ac, ar, N_ATTN, TU_ATOL, TU_RTOL, msg0, sizeof msg0), 0, "seed %d: attn: %s", s, msg0);
        cr_assert_eq(tu_compare(out, out_ref, N_OUT, TU_ATOL, TU_RTOL, msg0, sizeof msg0), 0, "seed %d: unfused out: %s",
                     s, msg0);
        /* the fused kernel makes no weights; its output matches only with the same keep decisions */
        run(cl, &p, 0.3f, seeds[s], out_fused, NULL);
        char msg[256];
        cr_assert_eq(tu_compare(out_fused, out_ref, N_OUT, TU_ATOL, TU_RTOL, msg, sizeof msg), 0,
                     "seed %d: fused out: %s", s, msg);
    }
    problem_free(&p);
    clattn_device_free(cl);
    clattn_device_free(ref);
}

/* Rows with no visible key give weights 0 and output 0 (PyTorch would give NaN). */
static void fully_masked(clattn_device *dev)
{
    tu_rng r = {3};
    const size_t B = 2, T = 5, E = 4;
    float *x = tu_random(&r, B * T * E, -1, 1);
    uint8_t kpm[2 * 5] = {0, 1, 0, 1, 0, 1, 1, 1, 1, 1}; /* batch entry 1: every key ignored */
    uint8_t mask[5 * 5] = {0};
    for (size_t j = 0; j < T; j++) mask[2 * T + j] = 1; /* query 2 sees nothing */
    clattn_attention_desc d = {.batch = B, .seq_q = T, .embed = E, .heads = 1, .key_padding_mask = 1,
                               .attn_mask = CLATTN_MASK_BOOL, .causal = 1, .need_weights = 1};
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *out = tu_poisoned(B * T * E), *attn = tu_poisoned(B * T * T);
    clattn_attention_args a = {.x = x, .key_padding_mask = kpm, .attn_mask = mask, .out = out, .attn = attn};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t i = 0; i < T; i++)
        for (size_t c = 0; c < E; c++) {
            float o1 = out[(1 * T + i) * E + c];
            cr_assert_eq(o1, 0.0f, "batch 1 (all keys padded), query %zu: out %g", i, o1);
            if (i == 2) cr_assert_eq(out[(0 * T + 2) * E + c], 0.0f, "query 2 (masked row): out %g", out[2 * E + c]);
            else cr_assert(isfinite(out[(0 * T + i) * E + c]) && out[(0 * T + i) * E + c] != 0.0f);
        }
    for (size_t j = 0; j < T; j++) cr_assert_eq(attn[(1 * T + 3) * T + j], 0.0f);
    /* batch 0 query 0 sees only key 0 (causal): weight exactly 1 */
    cr_assert_float_eq(attn[0], 1.0f, 1e-6f);
    /* and every element of out and attn against the float64 oracle (rows of zeros included) */
    double o64[2 * 5 * 4], a64[2 * 5 * 5];
    cr_assert_eq(oracle_attention(&d, NULL, &a, o64, a64), 0);
    char msg[256];
    cr_assert_eq(oracle_compare(out, o64, B * T * E, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "out: %s", msg);
    cr_assert_eq(oracle_compare(attn, a64, B * T * T, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "attn: %s", msg);
    for (size_t i = 0; i < B * T * T; i++)
        if (a64[i] == 0.0) cr_assert(attn[i] == 0.0f, "attn[%zu] = %g, expected exactly 0", i, attn[i]);
    clattn_plan_free(plan);
    /* the fused kernel (OpenCL): the same zeros, the same other rows */
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL) {
        d.need_weights = 0;
        d.algorithm = CLATTN_ALGORITHM_FUSED;
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(clattn_plan_algorithm(plan), CLATTN_ALGORITHM_FUSED);
        float *of = tu_poisoned(B * T * E);
        a.out = of, a.attn = NULL;
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (size_t i = 0; i < B * T * E; i++)
            cr_assert(of[i] == out[i] || fabsf(of[i] - out[i]) <= 1e-5f + 1e-4f * fabsf(out[i]),
                      "fused out[%zu] = %g, unfused %g", i, of[i], out[i]);
        free(of);
        clattn_plan_free(plan);
    }
    free(x); free(out); free(attn);
}

Test(masks, fully_masked_rows_ref) { clattn_device *d = tu_open_ref(); fully_masked(d); clattn_device_free(d); }
Test(masks, fully_masked_rows_opencl)
{
    clattn_device *d = tu_open_opencl();
    cr_assert(d, "%s", clattn_last_error());
    fully_masked(d);
    clattn_device_free(d);
}

/* A NaN in x propagates exactly as in PyTorch, and never crashes. */
static void nan_propagates(clattn_device *dev)
{
    tu_rng r = {5};
    float *x = tu_random(&r, 1 * 4 * 4, -1, 1);
    x[1 * 4 + 2] = NAN; /* token 1 */
    clattn_attention_desc d = {.batch = 1, .seq_q = 4, .embed = 4, .heads = 1, .causal = 1};
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS);
    float out[16];
    for (int i = 0; i < 16; i++) out[i] = -7.0f; /* a finite poison: the NaNs below must be written */
    clattn_attention_args a = {.x = x, .out = out};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS);
    /* query 0 sees key 0 only, with weight 1: its finite columns are token 0's */
    for (int c = 0; c < 4; c++)
        if (c != 2) cr_assert(fabsf(out[c] - x[c]) <= 1e-6f, "query 0, column %d: %g, expected %g", c, out[c], x[c]);
    /* As in PyTorch: query 0 does not see token 1 (causal), but its context still multiplies
     * weight 0 by V's NaN (0 * NaN = NaN) in column 2; queries 1..3 get NaN scores, so NaN rows. */
    for (int c = 0; c < 4; c++) cr_assert_eq(isnan(out[c]), c == 2, "query 0, column %d: %g", c, out[c]);
    for (int i = 1; i < 4; i++)
        for (int c = 0; c < 4; c++) cr_assert(isnan(out[i * 4 + c]), "query %d sees the NaN token", i);
    clattn_plan_free(plan);
    free(x);
}

Test(nan, propagates_ref) { clattn_device *d = tu_open_ref(); nan_propagates(d); clattn_device_free(d); }
Test(nan, propagates_opencl)
{
    clattn_device *d = tu_open_opencl();
    cr_assert(d, "%s", clattn_last_error());
    nan_propagates(d);
    clattn_device_free(d);
}

/* ---- validation: bad descriptions fail before any work with a named reason */

static float W[64 * 64];

static void expect_reject(clattn_attention_desc d, clattn_attention_weights w, clattn_status want, const char *needle)
{
    clattn_device *dev = tu_open_ref();
    clattn_plan *plan = (clattn_plan *)(uintptr_t)1;
    clattn_status st = tu_plan_create(dev, &d, &w, &plan);
    cr_assert_eq(st, want, "expected %s, got %s (%s)", clattn_status_string(want), clattn_status_string(st),
                 clattn_last_error());
    cr_assert_null(plan, "the plan pointer must be NULL after a failure");
    cr_assert(strstr(clattn_last_error(), needle), "message '%s' should mention '%s'", clattn_last_error(), needle);
    clattn_device_free(dev);
}

Test(validation, bad_descriptions)
{
    const clattn_attention_desc ok = {.batch = 2, .seq_q = 3, .embed = 8, .heads = 2, .head_dim_qk = 4};
    const clattn_attention_weights w = {.w_query = W, .w_key = W, .w_value = W};
    clattn_attention_desc d;
    d = ok; d.batch = 0; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "batch");
    d = ok; d.seq_q = 0; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "seq_q");
    d = ok; d.embed = 0; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "embed");
    d = ok; d.heads = 0; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "heads");
    d = ok; d.head_dim_qk = 0; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "head_dim_qk");
    d = ok; d.dropout = -0.1f; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "dropout");
    d = ok; d.dropout = 1.0f; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "dropout");
    d = ok; d.dropout = NAN; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "dropout");
    d = ok; d.dropout = INFINITY; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "dropout");
    d = ok; d.scale = NAN; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "scale");
    d = ok; d.scale = -INFINITY; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "scale");
    d = ok; d.causal = 2; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "causal");
    d = ok; d.layout = (clattn_layout)7; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "layout");
    d = ok; d.attn_mask = (clattn_mask_kind)9; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "attn_mask");
    d = ok; d.seq_kv = 5; expect_reject(d, w, CLATTN_STATUS_SHAPE_MISMATCH, "seq_kv");
    d = ok; d.cross = 1; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "seq_kv");
    d = ok; d.out_dim = 4; expect_reject(d, w, CLATTN_STATUS_INVALID_ARGUMENT, "out_dim");
    d = ok; expect_reject(d, (clattn_attention_weights){.w_query = W, .w_key = W}, CLATTN_STATUS_INVALID_ARGUMENT,
                          "w_value");
    d = ok; expect_reject(d, (clattn_attention_weights){.w_query = W, .w_key = W, .w_value = W, .b_out = W},
                          CLATTN_STATUS_INVALID_ARGUMENT, "b_out");
    d = ok; expect_reject(d, (clattn_attention_weights){.w_query = W, .w_key = W, .w_value = W, .w_out = W},
                          CLATTN_STATUS_INVALID_ARGUMENT, "out_dim");
    d = ok; d.head_dim_qk = 0; d.heads = 3; /* no weights: heads must divide embed */
    expect_reject(d, (clattn_attention_weights){0}, CLATTN_STATUS_SHAPE_MISMATCH, "divide");
    d = ok; d.head_dim_qk = 0; expect_reject(d, (clattn_attention_weights){.b_query = W},
                                             CLATTN_STATUS_INVALID_ARGUMENT, "biases");
    d = ok; d.batch = SIZE_MAX / 2; d.seq_q = SIZE_MAX / 4;
    expect_reject(d, w, CLATTN_STATUS_SIZE_OVERFLOW, "overflow");
    d = ok; d.seq_q = (size_t)1 << 33; expect_reject(d, w, CLATTN_STATUS_SIZE_OVERFLOW, "overflow"); /* Tq*Tk */
}

Test(validation, null_arguments)
{
    clattn_device *dev = tu_open_ref();
    clattn_attention_desc d = {.batch = 1, .seq_q = 2, .embed = 2, .heads = 1};
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(NULL, &d, NULL, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_plan_create(dev, NULL, NULL, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_plan_create(dev, &d, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS);
    float x[4] = {1, 2, 3, 4}, out[4] = {-7, -7, -7, -7};
    clattn_attention_args a = {.x = x, .out = NULL};
    cr_assert_eq(tu_plan_execute(NULL, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_plan_execute(plan, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    a.out = out;
    a.x = NULL;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
    for (int i = 0; i < 4; i++) cr_assert_eq(out[i], -7.0f, "a failed call must leave out untouched");
    cr_assert_eq(clattn_plan_execute_buffers(plan, &(clattn_attention_buffers){0}, 0, NULL, NULL),
                 CLATTN_STATUS_UNSUPPORTED, "buffers on a ref plan");
    cr_assert_eq(clattn_plan_set_seed(NULL, 1), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_stage_times(NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_plan_free(plan);
    clattn_plan_free(NULL);
    clattn_device_free(NULL);
    clattn_device_free(dev);
}

/* On ref the algorithm is not a choice: clattn_plan_algorithm says AUTO whatever the description asked. */
Test(validation, ref_plans_report_auto)
{
    clattn_device *dev = tu_open_ref();
    const clattn_algorithm asked[] = {CLATTN_ALGORITHM_AUTO, CLATTN_ALGORITHM_FUSED, CLATTN_ALGORITHM_UNFUSED};
    for (int k = 0; k < 3; k++) {
        clattn_attention_desc d = {.batch = 1, .seq_q = 2, .embed = 2, .heads = 1, .algorithm = asked[k]};
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(clattn_plan_algorithm(plan), CLATTN_ALGORITHM_AUTO, "asked %s", clattn_algorithm_name(asked[k]));
        clattn_plan_free(plan);
    }
    cr_assert_eq(clattn_plan_algorithm(NULL), CLATTN_ALGORITHM_AUTO);
    clattn_device_free(dev);
}

/* half-precision plans on the ref device (desc.dtype): inputs widened, fp32 attention, outputs rounded once, against
 * the oracle on the same rounded values with the type's bound; the OpenCL cores run test_conformance's half_types */
Test(half, types_ref)
{
    static const tu_attn_case cases[] = {
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .Eo = 16, .causal = 1, .biases = 1, .kpm = 1,
         .dtype = CLATTN_DTYPE_F16},
        {.B = 2, .Tq = 7, .Tk = 130, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_FLOAT, .mask_pb = 1, .dtype = CLATTN_DTYPE_BF16},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1, .causal = 1,
         .kpm = 1, .need_weights = 1, .dropout = 0.2f, .layout = CLATTN_LAYOUT_RAW, .dtype = CLATTN_DTYPE_BF16},
        {.B = 1, .Tq = 1, .E = 8, .H = 2, .dk = 4, .dv = 4, .kv_half = 1, .need_weights = 1, .dtype = CLATTN_DTYPE_F16},
    };
    clattn_device *dev = tu_open_ref();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) tu_attention_check(dev, &cases[i], 700 + i);
    clattn_device_free(dev);
}

/* attention sinks (desc.sinks) on the ref device against the oracle (which adds each head's sink as one more logit of
 * the row, gpt-oss's way): GQA with the window and rope, cross-attention with rows without a visible key, dropout, one
 * row, a bfloat16 plan; the OpenCL cores run test_conformance's prefill/sinks */
Test(sinks, ref)
{
    static const tu_attn_case cases[] = {
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .window = 5, .causal = 1, .sinks = 1,
         .rope = {.kind = CLATTN_ROPE_HALF}},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1, .causal = 1,
         .kpm = 1, .mask = CLATTN_MASK_FLOAT, .biases = 1, .sinks = 1},
        {.B = 2, .Tq = 17, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .dropout = 0.2f, .sinks = 1},
        {.B = 1, .Tq = 1, .E = 8, .H = 2, .dk = 4, .dv = 4, .sinks = 1},
        {.B = 2, .Tq = 7, .Tk = 61, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
         .dtype = CLATTN_DTYPE_BF16, .sinks = 1},
    };
    clattn_device *dev = tu_open_ref();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) tu_attention_check(dev, &cases[i], 720 + i);
    clattn_device_free(dev);
}

/* clattn_dtype_convert (the plans' rounding, public for callers): known values at the edges (ties to even, half's
 * overflow to inf and its subnormals, NaN kept, -0), a million random floats against the tests' own rounding
 * (tu_dtype_round, frexp and nearbyint), widening exact, half to bfloat16, and the refusals */
Test(half, convert)
{
    if (getenv("CLATTN_CORE") && *getenv("CLATTN_CORE"))
        cr_skip_test("the conversion is no core's: the plain entry runs it (not once per core)");
    const struct { float f; uint16_t h, b; } known[] = {
        {1.0f, 0x3C00, 0x3F80},
        {-0.0f, 0x8000, 0x8000},
        {65504.0f, 0x7BFF, 0x4780},
        {65519.0f, 0x7BFF, 0x4780},
        {65520.0f, 0x7C00, 0x4780},
        {5.9604644775390625e-8f, 0x0001, 0x3380},    /* 2^-24: half's smallest subnormal */
        {2.98023223876953125e-8f, 0x0000, 0x3300},   /* 2^-25: a tie, to even (0) */
        {8.94069671630859375e-8f, 0x0002, 0x33C0},   /* 3 2^-25: a tie, to even (2) */
        {1.00048828125f, 0x3C00, 0x3F80},            /* 1 + 2^-11: a half tie, to even */
        {1.00146484375f, 0x3C02, 0x3F80},            /* 1 + 3 2^-11 */
        {1.00390625f, 0x3C04, 0x3F80},               /* 1 + 2^-8: a bfloat16 tie, to even */
        {1.01171875f, 0x3C0C, 0x3F82},               /* 1 + 3 2^-8 */
        {3.4028234663852886e38f, 0x7C00, 0x7F80},    /* FLT_MAX rounds up to inf in both */
        {INFINITY, 0x7C00, 0x7F80},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        uint16_t h, b;
        cr_assert_eq(clattn_dtype_convert(&known[i].f, CLATTN_DTYPE_F32, &h, CLATTN_DTYPE_F16, 1), 0);
        cr_assert_eq(clattn_dtype_convert(&known[i].f, CLATTN_DTYPE_F32, &b, CLATTN_DTYPE_BF16, 1), 0);
        cr_assert_eq(h, known[i].h, "%.9g to half: 0x%04x, want 0x%04x", (double)known[i].f, h, known[i].h);
        cr_assert_eq(b, known[i].b, "%.9g to bfloat16: 0x%04x, want 0x%04x", (double)known[i].f, b, known[i].b);
    }
    const uint32_t nan_bits[] = {0x7FC00000u, 0x7F800001u, 0xFF800100u}; /* quiet, and payloads the rounding drops */
    for (int i = 0; i < 3; i++) {
        float f, back;
        memcpy(&f, &nan_bits[i], 4);
        for (int t = 1; t <= 2; t++) {
            uint16_t h;
            cr_assert_eq(clattn_dtype_convert(&f, CLATTN_DTYPE_F32, &h, (clattn_dtype)t, 1), 0);
            cr_assert_eq(clattn_dtype_convert(&h, (clattn_dtype)t, &back, CLATTN_DTYPE_F32, 1), 0);
            cr_assert(isnan(back), "NaN 0x%08x to type %d and back: %g", nan_bits[i], t, (double)back);
        }
    }
    enum { N = 1 << 20 };
    float *f = malloc(N * sizeof *f), *w = malloc(N * sizeof *w);
    uint16_t *h = malloc(N * sizeof *h), *g = malloc(N * sizeof *g);
    tu_rng r = {77};
    for (size_t i = 0; i < N; i++) { /* magnitudes from 2^-30 to 2^17: half's subnormals, normals and overflow */
        const double m = ldexp(1.0 + (double)(tu_next(&r) >> 11) * 0x1p-53, (int)(tu_next(&r) % 48) - 30);
        f[i] = (float)(tu_next(&r) & 1 ? -m : m);
    }
    for (int t = 1; t <= 2; t++) {
        const clattn_dtype ty = (clattn_dtype)t;
        cr_assert_eq(clattn_dtype_convert(f, CLATTN_DTYPE_F32, h, ty, N), 0);
        cr_assert_eq(clattn_dtype_convert(h, ty, w, CLATTN_DTYPE_F32, N), 0);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < N; i++) {
            const double want = tu_dtype_round(f[i], ty);
            if (!((double)w[i] == want) || tu_dtype_value(h[i], ty) != w[i]) {
                if (!bad++) first = i;
            }
        }
        cr_assert_eq(bad, 0, "type %d: %zu of %d rounded otherwise, first %.9g -> %.9g (want %.9g)", t, bad, N,
                     (double)f[first], (double)w[first], tu_dtype_round(f[first], ty));
    }
    /* half to bfloat16: through the float, one rounding */
    cr_assert_eq(clattn_dtype_convert(f, CLATTN_DTYPE_F32, h, CLATTN_DTYPE_F16, N), 0);
    cr_assert_eq(clattn_dtype_convert(h, CLATTN_DTYPE_F16, g, CLATTN_DTYPE_BF16, N), 0);
    for (size_t i = 0; i < N; i++) {
        const float hv = tu_dtype_value(h[i], CLATTN_DTYPE_F16);
        cr_assert_eq(tu_dtype_value(g[i], CLATTN_DTYPE_BF16), (float)tu_dtype_round(hv, CLATTN_DTYPE_BF16),
                     "%.9g", (double)hv);
    }
    cr_assert_eq(clattn_dtype_convert(f, CLATTN_DTYPE_F32, f, CLATTN_DTYPE_F16, 8), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "overlap"), "%s", clattn_last_error());
    cr_assert_eq(clattn_dtype_convert(f, (clattn_dtype)7, h, CLATTN_DTYPE_F16, 8), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "dtype 7"), "%s", clattn_last_error());
    cr_assert_eq(clattn_dtype_convert(NULL, CLATTN_DTYPE_F32, h, CLATTN_DTYPE_F16, 8), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_dtype_convert(NULL, CLATTN_DTYPE_F32, NULL, CLATTN_DTYPE_F16, 0), CLATTN_STATUS_SUCCESS);
    free(f), free(w), free(h), free(g);
}
