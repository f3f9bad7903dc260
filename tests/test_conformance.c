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

static void check_all(const tu_attn_case *cases, size_t n, uint64_t seed0)
{
    for (size_t i = 0; i < n; i++) tu_attention_check(dev, &cases[i], seed0 + i);
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
        /* a bfloat16 cache's values (kv_half 2): K and V the inputs themselves, so that the library's fp32 values and
         * the oracle's float64 ones round alike */
        {.B = 2, .Tq = 19, .E = 16, .H = 2, .noproj = 1, .kv_half = 2, .causal = 1},
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

/* rotary embeddings (desc.rope) on Q and K before the core: each layout, partial rotary dims, every scaling, with
 * projections (rotated in place, biases before the rotation) and without (self: Q = K = x rotated, V not; cross: K
 * of HK heads), GQA and the window, masks, dropout, the weights, training statistics, a half KV cache's rounding
 * after the rotation and a half plan. The shapes are those of the cases above (no new core kernels). */
#define ROPE_HALF CLATTN_ROPE_HALF
#define ROPE_INTER CLATTN_ROPE_INTERLEAVED
Test(prefill, rope)
{
    static const tu_attn_case cases[] = {
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .causal = 1, .biases = 1, .rope = {.kind = ROPE_HALF}},
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .window = 5, .causal = 1,
         .rope = {.kind = ROPE_INTER, .dims = 2, .theta = 500.0}},
        {.B = 1, .Tq = 61, .E = 64, .H = 1, .dk = 64, .dv = 64, .Eo = 32, .biases = 1,
         .rope = {.kind = ROPE_HALF, .dims = 32, .scaling = CLATTN_ROPE_SCALING_LINEAR, .factor = 4.0}},
        {.B = 1, .Tq = 33, .E = 128, .H = 1, .dk = 128, .dv = 128,
         .rope = {.kind = ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_YARN, .factor = 8.0,
                  .original_max_position = 4096}},
        {.B = 2, .Tq = 9, .E = 8, .H = 2, .noproj = 1, .need_weights = 1, .rope = {.kind = ROPE_INTER, .dims = 2}},
        {.B = 2, .Tq = 7, .Tk = 61, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_FLOAT, .mask_pb = 1, .mask_ph = 1, .rope = {.kind = ROPE_HALF, .theta = 1e6}},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1, .causal = 1,
         .kpm = 1, .mask = CLATTN_MASK_FLOAT, .need_weights = 1, .rope = {.kind = ROPE_INTER}},
        {.B = 1, .Tq = 130, .E = 64, .H = 2, .dk = 64, .dv = 64, .Eo = 32, .biases = 1, .training = 1,
         .rope = {.kind = ROPE_HALF, .theta = 1e6, .scaling = CLATTN_ROPE_SCALING_NTK, .factor = 2.0}},
        {.B = 2, .Tq = 17, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .dropout = 0.2f, .need_weights = 1,
         .rope = {.kind = ROPE_HALF}},
        {.B = 2, .Tq = 19, .E = 16, .H = 2, .dk = 8, .dv = 8, .kv_half = 1, .causal = 1,
         .rope = {.kind = ROPE_HALF, .dims = 4}},
        {.B = 2, .Tq = 17, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .dtype = CLATTN_DTYPE_F16,
         .rope = {.kind = ROPE_INTER}},
        /* each row's position given (args.rope_positions, tu_problem_make's: left padding, positions past the plan's
         * first table): projected, the heads as given (self: K is Q), cross-attention's keys at their own */
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .causal = 1, .biases = 1, .rope = {.kind = ROPE_HALF},
         .rope_pos = 1},
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .window = 5, .causal = 1,
         .rope = {.kind = ROPE_INTER, .dims = 2, .theta = 500.0}, .rope_pos = 1},
        {.B = 2, .Tq = 9, .E = 8, .H = 2, .noproj = 1, .need_weights = 1, .rope = {.kind = ROPE_INTER, .dims = 2},
         .rope_pos = 1},
        {.B = 2, .Tq = 7, .Tk = 61, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_FLOAT, .mask_pb = 1, .mask_ph = 1, .rope = {.kind = ROPE_HALF, .theta = 1e6},
         .rope_pos = 1},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1, .causal = 1,
         .kpm = 1, .mask = CLATTN_MASK_FLOAT, .need_weights = 1, .rope = {.kind = ROPE_INTER}, .rope_pos = 1},
    };
    CHECK_ALL(cases, 1100);
}

/* attention sinks (desc.sinks, gpt-oss): a logit per head in the softmax's denominator, head 0 without one
 * (tu_problem_make). Projected and not (a separate value), GQA with the window and rotary embeddings, cross-attention
 * with padding and a float mask (rows with no visible key: 0), dropout, a half KV cache, half plans (a core that reads
 * the type gets fp32 rows with sinks), one row. The shapes are those of the cases above. */
Test(prefill, sinks)
{
    static const tu_attn_case cases[] = {
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .causal = 1, .biases = 1, .sinks = 1},
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .window = 5, .causal = 1, .sinks = 1,
         .rope = {.kind = ROPE_HALF}},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1, .causal = 1,
         .kpm = 1, .mask = CLATTN_MASK_FLOAT, .biases = 1, .sinks = 1},
        {.B = 2, .Tq = 7, .Tk = 61, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_FLOAT, .mask_pb = 1, .mask_ph = 1, .sinks = 1},
        {.B = 2, .Tq = 17, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .dropout = 0.2f, .sinks = 1},
        {.B = 1, .Tq = 130, .E = 64, .H = 2, .dk = 64, .dv = 64, .Eo = 32, .biases = 1, .sinks = 1},
        {.B = 2, .Tq = 19, .E = 16, .H = 2, .dk = 8, .dv = 8, .kv_half = 1, .causal = 1, .sinks = 1},
        {.B = 1, .Tq = 1, .E = 8, .H = 2, .dk = 4, .dv = 4, .sinks = 1},
        {.B = 2, .Tq = 17, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .dtype = CLATTN_DTYPE_F16,
         .sinks = 1},
        {.B = 1, .Tq = 67, .E = 256, .H = 2, .noproj = 1, .causal = 1, .dtype = CLATTN_DTYPE_BF16, .sinks = 1},
    };
    CHECK_ALL(cases, 1200);
}

/* half-precision plans (desc.dtype F16 and BF16): inputs, weights and outputs in the type, against the oracle on the
 * same rounded values with the type's bound (tu_dtype_tolerance): projected and not, every mask, GQA, the weights,
 * one row, odd lengths, kv_half */
#define F16 CLATTN_DTYPE_F16
#define BF16 CLATTN_DTYPE_BF16
Test(prefill, half_types)
{
    static const tu_attn_case cases[] = {
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .Eo = 16, .causal = 1, .biases = 1, .kpm = 1,
         .dtype = F16},
        {.B = 2, .Tq = 61, .E = 16, .H = 4, .dk = 4, .dv = 4, .Eo = 16, .causal = 1, .biases = 1, .kpm = 1,
         .dtype = BF16},
        {.B = 1, .Tq = 1, .E = 8, .H = 2, .dk = 4, .dv = 4, .dtype = BF16},
        {.B = 2, .Tq = 7, .Tk = 130, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_FLOAT, .mask_pb = 1, .dtype = F16},
        {.B = 2, .Tq = 9, .Tk = 13, .E = 8, .H = 2, .HK = 1, .cross = 1, .causal = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_BOOL, .need_weights = 1, .dtype = BF16},
        {.B = 2, .Tq = 5, .Tk = 13, .E = 8, .Ekv = 6, .H = 2, .dk = 4, .dv = 3, .Eo = 8, .cross = 1, .causal = 1,
         .kpm = 1, .need_weights = 1, .layout = CLATTN_LAYOUT_RAW, .dtype = F16},
        {.B = 2, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 6, .window = 5, .causal = 1, .kv_half = 1,
         .dtype = F16},
        {.B = 1, .Tq = 130, .E = 64, .H = 1, .dk = 64, .dv = 64, .noproj = 1, .causal = 1, .dtype = BF16},
        /* heads of 136: flash_mma's fp16 products add each product to O on its own above 128 (flash_mma.cl's OT) */
        {.B = 1, .Tq = 20, .Tk = 37, .E = 272, .H = 2, .HK = 1, .cross = 1, .noproj = 1, .separate_value = 1,
         .causal = 1, .dtype = F16},
        /* without projections a core with reads_dtypes (flash_rows) reads and writes the types itself: each vector
         * width of its loads and stores (8, 4, 1: by the head sizes) in both types */
        {.B = 1, .Tq = 33, .Tk = 61, .E = 128, .H = 2, .HK = 1, .dv = 64, .cross = 1, .noproj = 1, .separate_value = 1,
         .causal = 1, .dtype = F16},
        {.B = 2, .Tq = 9, .Tk = 21, .E = 8, .H = 2, .cross = 1, .noproj = 1, .separate_value = 1,
         .mask = CLATTN_MASK_FLOAT, .mask_ph = 1, .dtype = F16},
        {.B = 2, .Tq = 9, .Tk = 21, .E = 8, .H = 2, .dv = 12, .cross = 1, .noproj = 1, .separate_value = 1, .kpm = 1,
         .dtype = BF16},
        {.B = 2, .Tq = 11, .Tk = 5, .E = 6, .H = 2, .dv = 5, .cross = 1, .noproj = 1, .separate_value = 1,
         .dtype = BF16},
        /* projections whose output is wider than the Q|K|V projections' buffer (self: 6 columns, cross: Q's 6), which
         * then cannot hold the fp32 output before it is narrowed */
        {.B = 2, .Tq = 11, .E = 8, .H = 1, .dk = 2, .dv = 2, .Eo = 16, .biases = 1, .causal = 1, .dtype = F16},
        {.B = 2, .Tq = 9, .Tk = 14, .E = 8, .Ekv = 6, .H = 2, .dk = 3, .dv = 4, .Eo = 12, .cross = 1, .biases = 1,
         .kpm = 1, .dtype = BF16},
        /* no Q/K/V weights but an output projection: the core's output is the plan's fp32 merged rows */
        {.B = 2, .Tq = 13, .E = 16, .H = 4, .Eo = 8, .biases = 1, .noproj = 1, .causal = 1, .dtype = F16},
        /* the cores' own arrays with dropout (flash_mma's fp16/bf16 products: 1/(1 - p) on the output), the window,
         * kv_half of the plan's type (flash_mma: its fp16 products) and of the other (flash_mma: 3xTF32), and a head of
         * 128 over several tiles */
        {.B = 2, .Tq = 37, .E = 32, .H = 2, .noproj = 1, .dropout = 0.25f, .kpm = 1, .dtype = F16},
        {.B = 1, .Tq = 70, .E = 64, .H = 2, .noproj = 1, .dropout = 0.3f, .causal = 1, .window = 9, .dtype = BF16},
        {.B = 2, .Tq = 19, .E = 32, .H = 2, .noproj = 1, .kv_half = 1, .causal = 1, .dtype = F16},
        {.B = 2, .Tq = 19, .E = 32, .H = 2, .noproj = 1, .kv_half = 2, .dtype = F16},
        {.B = 1, .Tq = 67, .E = 256, .H = 2, .noproj = 1, .causal = 1, .dtype = F16},
    };
    CHECK_ALL(cases, 600);
}

/* Variable-length batches (desc.varlen): sequences of their own lengths packed without padding, each against the oracle
 * run on it alone. Odd lengths past a tile, a sequence of one row, an empty one; cross-attention with its own key
 * lengths (fewer keys than queries, one sequence without keys); GQA and the window per sequence; dropout keyed by the
 * sequence's index; a half plan; the buffer form at an offset. The
 * shapes are those of cases above (the same kernels: nothing new to compile). */
Test(prefill, varlen)
{
    static const struct {
        tu_attn_case c;
        size_t q[5], k[5];
        int on_buffers;
    } cases[] = {
        {{.B = 5, .Tq = 130, .E = 16, .H = 4, .dk = 4, .dv = 4, .causal = 1, .biases = 1, .Eo = 16},
         {7, 1, 130, 0, 61}, {0}, 1},
        {{.B = 3, .Tq = 33, .Tk = 40, .E = 16, .H = 4, .HK = 2, .dv = 6, .cross = 1, .causal = 1, .window = 5,
          .noproj = 1, .separate_value = 1}, {9, 1, 33}, {5, 0, 40}, 1}, /* 9 queries on 5 keys: the last see all */
        {{.B = 3, .Tq = 130, .E = 128, .H = 2, .noproj = 1}, {61, 130, 1}, {0}, 0},
        /* dropout: sequence b's weights kept as the padded batch's entry b's (the oracle keys each sequence by its
         * index; an empty one first, so that index and position differ) */
        {{.B = 4, .Tq = 33, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 4, .window = 7, .causal = 1, .dropout = 0.3f},
         {0, 9, 33, 1}, {0}, 1},
        {{.B = 2, .Tq = 17, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .biases = 1, .dtype = CLATTN_DTYPE_F16},
         {17, 3}, {0}, 1},
        /* a half plan without projections: a core with reads_dtypes (flash_rows) reads and writes the caller's halves
         * at each sequence's rows, and zeroes those of a sequence without keys in the type */
        {{.B = 3, .Tq = 33, .Tk = 61, .E = 128, .H = 2, .HK = 1, .dv = 64, .cross = 1, .noproj = 1,
          .separate_value = 1, .causal = 1, .dtype = CLATTN_DTYPE_F16}, {33, 1, 20}, {61, 7, 0}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        tu_varlen_check(dev, &cases[i].c, cases[i].q, cases[i].c.cross ? cases[i].k : NULL, 1000 + i,
                        cases[i].on_buffers);
    /* rotary embeddings: each sequence's positions from 0, not its rows' places in the packed batch */
    tu_attn_case self = cases[0].c, cross = cases[1].c;
    self.rope = (clattn_rope){.kind = CLATTN_ROPE_HALF};
    cross.rope = (clattn_rope){.kind = CLATTN_ROPE_INTERLEAVED, .scaling = CLATTN_ROPE_SCALING_LINEAR, .factor = 2.0};
    tu_varlen_check(dev, &self, cases[0].q, NULL, 1010, 1);
    tu_varlen_check(dev, &cross, cases[1].q, cases[1].k, 1011, 1);
    /* and at the positions given (args.rope_positions, packed as the rows are) */
    self.rope_pos = cross.rope_pos = 1;
    tu_varlen_check(dev, &self, cases[0].q, NULL, 1012, 1);
    tu_varlen_check(dev, &cross, cases[1].q, cases[1].k, 1013, 1);
    /* attention sinks: each sequence's rows scaled from its own rows' statistics */
    self.rope_pos = cross.rope_pos = 0, self.sinks = cross.sinks = 1;
    tu_varlen_check(dev, &self, cases[0].q, NULL, 1014, 1);
    tu_varlen_check(dev, &cross, cases[1].q, cases[1].k, 1015, 1);
}

/* A half plan on cl_mem buffers at element offsets (x, kv, value in the type, out and the weights written in it):
 * the same numbers as from host arrays, bit for bit, and nothing written outside out and attn */
static cl_mem typed_buffer(cl_context cx, cl_command_queue q, const void *host, size_t n, size_t off)
{
    cl_int e;
    cl_mem m = clCreateBuffer(cx, CL_MEM_READ_WRITE, (off + n + 3) * 2, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    uint16_t *fill = malloc((off + n + 3) * 2);
    memset(fill, 0x5A, (off + n + 3) * 2);
    if (host) memcpy(fill + off, host, n * 2);
    cr_assert_eq(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, (off + n + 3) * 2, fill, 0, NULL, NULL), CL_SUCCESS);
    free(fill);
    return m;
}

Test(prefill, half_types_buffers)
{
    const clattn_core_info *forced = tu_forced_core();
    for (int k = 0; k < 2; k++) {
        const clattn_dtype t = k ? BF16 : F16;
        const tu_attn_case c = {.B = 2, .Tq = 9, .Tk = 13, .E = 8, .H = 2, .HK = 1, .dv = 6, .cross = 1, .causal = 1,
                                .noproj = 1, .separate_value = 1, .need_weights = !forced || forced->produces_weights,
                                .dtype = t};
        tu_problem p;
        tu_problem_make(&p, &c, 800 + k);
        clattn_attention_desc d = p.d;
        d.algorithm = forced ? forced->algorithm : CLATTN_ALGORITHM_AUTO;
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const size_t nx = 2 * 9 * 8, nkv = 2 * 13 * 4, nv = 2 * 13 * 6, no = 2 * 9 * 12, na = 2 * 2 * 9 * 13, off = 5;
        void *x = tu_typed(p.a.x, nx, t), *kv = tu_typed(p.a.kv, nkv, t), *v = tu_typed(p.a.value, nv, t);
        void *out = tu_poisoned_typed(no, t), *attn = tu_poisoned_typed(na, t);
        clattn_attention_args a = {.x = x, .kv = kv, .value = v, .out = out, .attn = c.need_weights ? attn : NULL};
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cl_context cx = clattn_device_context(dev);
        cl_command_queue q = clattn_device_queue(dev);
        cl_mem bx = typed_buffer(cx, q, x, nx, off), bkv = typed_buffer(cx, q, kv, nkv, off);
        cl_mem bv = typed_buffer(cx, q, v, nv, off), bo = typed_buffer(cx, q, NULL, no, off);
        cl_mem ba = typed_buffer(cx, q, NULL, na, off);
        const clattn_attention_buffers b = {.x = {bx, off}, .kv = {bkv, off}, .value = {bv, off}, .out = {bo, off},
                                            .attn = {c.need_weights ? ba : NULL, off}};
        clattn_plan_free(plan); /* a fresh plan: nothing the host call staged or converted */
        plan = NULL;
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        const cl_mem outs[2] = {bo, ba};
        const size_t ns[2] = {no, na};
        const void *want[2] = {out, attn};
        for (int i = 0; i < (c.need_weights ? 2 : 1); i++) {
            uint16_t *got = malloc((off + ns[i] + 3) * 2);
            cr_assert_eq(clEnqueueReadBuffer(q, outs[i], CL_TRUE, 0, (off + ns[i] + 3) * 2, got, 0, NULL, NULL),
                         CL_SUCCESS);
            cr_assert(memcmp(got + off, want[i], ns[i] * 2) == 0, "%s %s: buffers and host arrays differ",
                      k ? "bf16" : "f16", i ? "attn" : "out");
            for (size_t j = 0; j < off; j++) cr_assert_eq(got[j], 0x5A5A, "written before the offset");
            for (size_t j = 0; j < 3; j++) cr_assert_eq(got[off + ns[i] + j], 0x5A5A, "written past the end");
            free(got);
        }
        clReleaseMemObject(bx), clReleaseMemObject(bkv), clReleaseMemObject(bv), clReleaseMemObject(bo);
        clReleaseMemObject(ba);
        clattn_plan_free(plan);
        free(x), free(kv), free(v), free(out), free(attn);
        tu_problem_free(&p);
    }
}

/* A core that reads and writes the types itself (flash_rows: reads_dtypes) runs a half plan without projections on the
 * caller's arrays: no fp32 copies, so the plan holds at most 0.55x the fp32 plan's device bytes (the target);
 * the other cores convert at the boundary and hold more (README, "Data types") */
Test(prefill, half_types_memory)
{
    const clattn_core_info *forced = tu_forced_core();
    clattn_attention_desc d = {.batch = 2, .seq_q = 64, .seq_kv = 96, .embed = 64, .heads = 2, .kv_heads = 1,
                               .head_dim_v = 32, .cross = 1, .separate_value = 1, .causal = 1,
                               .algorithm = forced ? forced->algorithm : CLATTN_ALGORITHM_AUTO};
    size_t bytes[3] = {0};
    char core[3][32];
    int split = 0;
    for (int t = 0; t < 3; t++) {
        d.dtype = (clattn_dtype)t;
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        bytes[t] = clattn_plan_device_bytes(plan);
        snprintf(core[t], sizeof core[t], "%s", clattn_plan_core(plan));
        const char *sp = strstr(clattn_plan_core_params(plan), "SPLIT=");
        split = split || (sp && atoi(sp + 6) > 1);
        clattn_plan_free(plan);
    }
    cr_assert(!strcmp(core[0], core[1]) && !strcmp(core[0], core[2]), "%s %s %s", core[0], core[1], core[2]);
    int reads = -1;
    for (size_t i = 0; i < clattn_core_count(); i++) {
        clattn_core_info info;
        cr_assert_eq(clattn_core_describe(dev, i, &info), CLATTN_STATUS_SUCCESS);
        if (!strcmp(info.name, core[0])) reads = info.reads_dtypes;
    }
    cr_assert_neq(reads, -1, "the plan's core %s is not in the registry", core[0]);
    for (int t = 1; t < 3; t++) {
        const double ratio = (double)bytes[t] / (double)bytes[0];
        printf("[----] %s (reads_dtypes %d): dtype %d plan holds %.2fx the fp32 plan's device bytes\n", core[0], reads,
               t, ratio);
        /* a core splitting the keys (SPLIT > 1, a forced configuration here) holds its parts' fp32 workspace in both
         * plans: no fp32 copies of the arrays still means less than the fp32 plan (the boundary route holds more) */
        if (reads && split) cr_assert(bytes[t] < bytes[0], "%s: dtype %d: %zu bytes, fp32 %zu", core[0], t, bytes[t],
                                      bytes[0]);
        else if (reads) cr_assert(ratio <= 0.55, "%s: dtype %d: %zu bytes, fp32 %zu", core[0], t, bytes[t], bytes[0]);
    }
}

/* A half plan with projections on a GEMM core that reads the types (gemm_tiles: reads_dtypes): its x, output and
 * weights are held in the type and nothing else is added (the projections read x as it is; the fp32 output goes
 * into the Q|K|V projections' buffer, free by then, where that holds it): exactly 2 bytes per element of x, out and
 * the weights fewer than the fp32 plan, or 4 per output element more where the projections' buffer is too small.
 * The Q|K|V rows and the merged heads stay fp32 (README, "Data types"). A GEMM core without reads_dtypes (CLBlast)
 * widens at the boundary instead: only reported. */
Test(prefill, half_types_memory_projected)
{
    const clattn_core_info *forced = tu_forced_core();
    static const clattn_attention_desc shapes[] = {
        {.batch = 2, .seq_q = 48, .embed = 32, .heads = 4, .kv_heads = 2, .head_dim_qk = 8, .head_dim_v = 8,
         .out_dim = 32, .causal = 1},
        {.batch = 2, .seq_q = 40, .seq_kv = 56, .embed = 24, .kv_embed = 16, .heads = 2, .kv_heads = 2,
         .head_dim_qk = 4, .head_dim_v = 8, .out_dim = 20, .cross = 1},
        {.batch = 1, .seq_q = 33, .embed = 16, .heads = 1, .kv_heads = 1, .head_dim_qk = 2, .head_dim_v = 2,
         .out_dim = 16}, /* the output (16 columns) wider than the Q|K|V rows (6) */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        clattn_attention_desc d = shapes[i];
        d.algorithm = forced ? forced->algorithm : CLATTN_ALGORITHM_AUTO;
        const size_t B = d.batch, Tq = d.seq_q, Tk = d.cross ? d.seq_kv : Tq, E = d.embed;
        const size_t Ekv = d.cross ? d.kv_embed : E, H = d.heads, HK = d.kv_heads, dk = d.head_dim_qk;
        const size_t dv = d.head_dim_v, Eo = d.out_dim;
        /* the weights made here (nn.Linear layout), every value a small dyadic number */
        const size_t nw[4] = {H * dk * E, HK * dk * Ekv, HK * dv * Ekv, Eo * H * dv};
        float *w[4];
        for (int k = 0; k < 4; k++) {
            w[k] = malloc(nw[k] * sizeof *w[k]);
            for (size_t j = 0; j < nw[k]; j++) w[k][j] = (float)((int)(j % 7) - 3) / 8.0f;
        }
        size_t bytes[3] = {0};
        char gemm[3][32];
        for (int t = 0; t < 3; t++) {
            d.dtype = (clattn_dtype)t;
            void *wt[4];
            for (int k = 0; k < 4; k++) wt[k] = tu_typed(w[k], nw[k], d.dtype);
            const clattn_attention_weights aw = {.w_query = wt[0], .w_key = wt[1], .w_value = wt[2], .w_out = wt[3]};
            clattn_plan *plan = NULL;
            cr_assert_eq(tu_plan_create(dev, &d, &aw, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            bytes[t] = clattn_plan_device_bytes(plan);
            snprintf(gemm[t], sizeof gemm[t], "%s", clattn_plan_gemm(plan));
            clattn_plan_free(plan);
            for (int k = 0; k < 4; k++) free(wt[k]);
        }
        int reads = -1;
        for (size_t c = 0; c < clattn_core_count(); c++) {
            clattn_core_info info;
            cr_assert_eq(clattn_core_describe(dev, c, &info), CLATTN_STATUS_SUCCESS);
            if (!strcmp(info.name, gemm[0])) reads = info.reads_dtypes;
        }
        cr_assert_neq(reads, -1, "the plan's GEMM core %s is not in the registry", gemm[0]);
        const size_t n_x = B * Tq * E + (d.cross ? B * Tk * Ekv : 0), n_out = B * Tq * Eo;
        const size_t n_w = nw[0] + nw[1] + nw[2] + nw[3];
        const size_t n_proj = d.cross ? B * Tq * H * dk : B * Tq * (H * dk + HK * (dk + dv));
        const size_t want_saved = 2 * (n_x + n_out + n_w), want_added = n_proj >= n_out ? 0 : 4 * n_out;
        for (int t = 1; t < 3; t++) {
            printf("[----] %s (reads_dtypes %d), shape %zu: dtype %d projected plan holds %.2fx the fp32 plan's bytes\n",
                   gemm[0], reads, i, t, (double)bytes[t] / (double)bytes[0]);
            if (reads)
                cr_assert_eq(bytes[t], bytes[0] - want_saved + want_added, "shape %zu dtype %d: %zu bytes, fp32 %zu, "
                             "expected %zu fewer and %zu more", i, t, bytes[t], bytes[0], want_saved, want_added);
        }
        for (int k = 0; k < 4; k++) free(w[k]);
    }
}

/* Random combinations of every option at once (tu_case_random), a fixed series: case k (seeded 1000 + k, the
 * failure message's "case") is described on stderr first. CLATTN_TEST_SWEEP=N runs N of them from
 * CLATTN_TEST_SWEEP_BASE (scripts/mutate.sh: none), on ref and AUTO's cores; a core's entries run none unless
 * asked (tu_sweep_count). Before it was added, 60 such cases passed on ref and AUTO's cores, 12 more on each prefill
 * and GEMM core forced (4 on the emulated flash_mma), and 4 on each core llvmpipe runs; it keeps 4 in every run. */
Test(prefill, sweep, .timeout = 1800)
{
    int base;
    const int n = tu_sweep_count(4, &base);
    clattn_device *ref = tu_forced_core() ? NULL : tu_open_ref();
    for (int k = base; k < base + n; k++) {
        tu_attn_case c;
        tu_case_random(&c, (uint64_t)k, 0);
        char line[512]; /* on stderr, which ctest shows when the entry fails */
        tu_case_describe(&c, line, sizeof line);
        fprintf(stderr, "sweep case %d (seed %d): %s\n", k, 1000 + k, line);
        if (ref) tu_attention_check(ref, &c, 1000 + (uint64_t)k);
        tu_attention_check(dev, &c, 1000 + (uint64_t)k);
    }
    if (ref) clattn_device_free(ref);
}
