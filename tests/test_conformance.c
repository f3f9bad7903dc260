/* test_conformance.c: a prefill core's conformance: what an attention core computes, on the OpenCL device, against the
 * float64 oracle (tests/oracle.c, sharing no code with the library), every element of every output checked after
 * poisoning. The README's test command runs it once per registered prefill core and test configuration (ctest
 * entries test_conformance_core_<core>[_<config>], CLATTN_CORE set; cmake/core_tests.cmake.in) and once plain (the device's
 * own choice). One case a distinct kernel (cold kernel caches compile each): every mask, the shape edges (one row,
 * odd lengths past a tile, dk != dv, a lone head of 128), GQA, the window, cross attention, dropout (the oracle's
 * keep decisions), kv_half, the weights where the core returns them, and training plans' lse and context.
 * The other families (test_opencl, test_golden, test_encoder, test_cli, ...) run per core under the ctest label
 * `matrix` (CI). */
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clattn_device *dev;

static void setup(void) { dev = tu_open_opencl(); }
static void teardown(void) { clattn_device_free(dev); }

TestSuite(prefill, .init = setup, .fini = teardown);

/* The case on the core (its algorithm when one is forced, else AUTO's choice for it): out, and attn when asked for
 * and the core returns it, and for training cases lse and context, each against the oracle. */
static void check(const tu_attn_case *c, uint64_t seed)
{
    const clattn_core_info *forced = tu_forced_core();
    tu_attn_case cc = *c;
    if (forced && cc.need_weights && !forced->produces_weights) cc.need_weights = 0;
    tu_problem p;
    tu_problem_make(&p, &cc, seed);
    clattn_attention_desc d = p.d;
    d.algorithm = forced ? forced->algorithm : CLATTN_ALGORITHM_AUTO;
    clattn_plan *plan = NULL;
    clattn_status st = tu_plan_create(dev, &d, &p.w, &plan);
    char what[32];
    snprintf(what, sizeof what, "case %llu", (unsigned long long)seed);
    if (tu_refused_by_device(dev, st, what)) {
        tu_problem_free(&p);
        return;
    }
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "case %llu: plan: %s: %s\n%s", (unsigned long long)seed,
                 clattn_status_string(st), clattn_last_error(), clattn_last_build_log());
    if (forced) cr_assert_str_eq(clattn_plan_core(plan), forced->name);
    const size_t B = d.batch, Tq = d.seq_q, Tk = d.cross ? d.seq_kv : Tq, H = d.heads;
    const size_t dv = cc.noproj && !cc.separate_value ? d.embed / H : d.head_dim_v, ow = clattn_plan_out_width(plan);
    const size_t n_out = B * Tq * ow, n_attn = B * H * Tq * Tk, n_lse = B * H * Tq, n_ctx = B * Tq * H * dv;
    float *out = tu_poisoned(n_out), *attn = tu_poisoned(n_attn), *lse = tu_poisoned(n_lse), *ctx = tu_poisoned(n_ctx);
    double *o64 = malloc(n_out * sizeof *o64), *a64 = malloc(n_attn * sizeof *a64), *l64 = malloc(n_lse * sizeof *l64),
           *c64 = malloc(n_ctx * sizeof *c64);
    cr_assert(o64 && a64 && l64 && c64);
    cr_assert_eq(oracle_attention_stats(&d, &p.w, &p.a, o64, a64, l64, c64), 0);
    clattn_attention_args a = p.a;
    a.out = out;
    if (cc.need_weights) a.attn = attn;
    if (cc.training) a.lse = lse, a.context = ctx;
    st = tu_plan_execute(plan, &a);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "case %llu (%s): execute: %s: %s", (unsigned long long)seed,
                 clattn_plan_core(plan), clattn_status_string(st), clattn_last_error());
    char msg[256];
    int nonzero = 0;
    for (size_t i = 0; i < n_out; i++) nonzero |= o64[i] != 0.0;
    cr_assert(nonzero, "case %llu: the oracle's output is all zero", (unsigned long long)seed);
    size_t bad = oracle_compare(out, o64, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "case %llu (%s) out: %zu of %zu differ; %s", (unsigned long long)seed, clattn_plan_core(plan),
                 bad, n_out, msg);
    if (cc.need_weights) {
        bad = oracle_compare(attn, a64, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %llu (%s) attn: %zu of %zu differ; %s", (unsigned long long)seed,
                     clattn_plan_core(plan), bad, n_attn, msg);
    }
    if (cc.training) {
        bad = oracle_compare(ctx, c64, n_ctx, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %llu (%s) context: %zu of %zu differ; %s", (unsigned long long)seed,
                     clattn_plan_core(plan), bad, n_ctx, msg);
        bad = oracle_compare_nonfinite(lse, l64, n_lse, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %llu (%s) lse: %zu of %zu differ; %s", (unsigned long long)seed,
                     clattn_plan_core(plan), bad, n_lse, msg);
    }
    clattn_plan_free(plan);
    free(out); free(attn); free(lse); free(ctx); free(o64); free(a64); free(l64); free(c64);
    tu_problem_free(&p);
}

static void check_all(const tu_attn_case *cases, size_t n, uint64_t seed0)
{
    for (size_t i = 0; i < n; i++) check(&cases[i], seed0 + i);
}
#define CHECK_ALL(cases, seed0) check_all(cases, sizeof cases / sizeof cases[0], seed0)

Test(prefill, shapes)
{
    static const tu_attn_case cases[] = {
        {.B = 1, .Tq = 1, .E = 8, .H = 2, .dk = 4, .dv = 4},                                /* one row, one key */
        {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .need_weights = 1},
        {.B = 2, .Tq = 130, .E = 24, .H = 8, .dk = 3, .dv = 5, .layout = CLATTN_LAYOUT_RAW}, /* dk != dv, odd */
        {.B = 1, .Tq = 61, .E = 64, .H = 1, .dk = 64, .dv = 64, .Eo = 32, .biases = 1},     /* vector paths */
        {.B = 1, .Tq = 33, .E = 128, .H = 1, .dk = 128, .dv = 128},                         /* a lone head of 128 */
        {.B = 2, .Tq = 9, .E = 8, .H = 2, .noproj = 1, .need_weights = 1},                  /* x is Q, K and V */
    };
    CHECK_ALL(cases, 100);
}

Test(prefill, masks)
{
    static const tu_attn_case cases[] = {
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .causal = 1, .biases = 1},
        {.B = 3, .Tq = 130, .E = 16, .H = 4, .dk = 8, .dv = 8, .Eo = 16, .kpm = 1, .need_weights = 1},
        {.B = 2, .Tq = 9, .E = 8, .H = 2, .dk = 4, .dv = 4, .mask = CLATTN_MASK_BOOL},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1, .causal = 1,
         .kpm = 1, .mask = CLATTN_MASK_FLOAT, .need_weights = 1},
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .window = 5, .causal = 1}, /* GQA + window */
    };
    CHECK_ALL(cases, 200);
}

Test(prefill, dropout_and_half)
{
    static const tu_attn_case cases[] = {
        {.B = 2, .Tq = 17, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .dropout = 0.2f, .need_weights = 1},
        {.B = 2, .Tq = 19, .E = 16, .H = 2, .dk = 8, .dv = 8, .kv_half = 1, .causal = 1},
    };
    CHECK_ALL(cases, 300);
}

/* the heads as torch's scaled_dot_product_attention takes them (no weights; K and V apart, GQA, dv != dk), and
 * masks per batch entry and per head: every mask kind with each layout, projected plans too */
Test(prefill, heads_and_batched_masks)
{
    static const tu_attn_case cases[] = {
        {.B = 2, .Tq = 7, .Tk = 61, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_FLOAT, .mask_pb = 1, .mask_ph = 1},
        {.B = 3, .Tq = 9, .Tk = 13, .E = 8, .H = 2, .HK = 1, .cross = 1, .causal = 1, .noproj = 1, .separate_value = 1,
         .kpm = 1, .mask = CLATTN_MASK_BOOL, .mask_pb = 1, .need_weights = 1},
        {.B = 2, .Tq = 130, .Tk = 130, .E = 128, .H = 2, .dv = 64, .cross = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_BOOL, .mask_ph = 1, .training = 1},
        {.B = 2, .Tq = 17, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .mask = CLATTN_MASK_FLOAT, .mask_pb = 1,
         .mask_ph = 1, .need_weights = 1},
    };
    CHECK_ALL(cases, 500);
}

/* training plans: each row's log-sum-exp (-inf for a fully masked row) and the context before the output
 * projection */
Test(prefill, training)
{
    static const tu_attn_case cases[] = {
        {.B = 1, .Tq = 1, .E = 4, .H = 2, .dk = 1, .dv = 1, .Eo = 4, .training = 1},
        {.B = 2, .Tq = 61, .E = 9, .H = 3, .dk = 3, .dv = 5, .causal = 1, .training = 1},
        {.B = 3, .Tq = 8, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .kpm = 1, .training = 1},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1,
         .mask = CLATTN_MASK_BOOL, .training = 1},
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 4, .window = 7, .causal = 1, .dropout = 0.3f,
         .training = 1},
        {.B = 1, .Tq = 130, .E = 64, .H = 2, .dk = 64, .dv = 64, .Eo = 32, .biases = 1, .training = 1},
    };
    CHECK_ALL(cases, 400);
}
