/* test_mma.c: the tensor-core core flash_mma and the precision field (issue 24).
 *
 * Every attention family already runs with flash_mma forced (ctest entries *_core_flash_mma*), at the
 * ordinary fp32 tolerance: there its 3xTF32 products must be as good as fp32. This file adds what those do
 * not cover:
 *   tf32::       precision TF32: within its documented tolerance of the float64 oracle, and really TF32 (its
 *                rounding bit for bit against a formula written here; the result differs from fp32's)
 *   precision::  who takes and who refuses TF32 (every other core, AUTO's cores, the ref device, decode
 *                plans), and a precision that is not one
 *   fp32::       infinities (in queries, keys and values) pass through 3xTF32 as through fp32; the Q block in
 *                local memory (a tuned configuration no default takes)
 *   auto::       AUTO never picks flash_mma where it would run as an emulation, and the public list says why
 *   toward_zero:: the tensor core's sums, rounded toward zero, as the emulation models them (one sum), and 32768 keys
 *                per row at fp32 accuracy (last in the run: the other suites catch most of flash_mma's mutants sooner)
 * On a device without tensor cores flash_mma runs its emulation (the same kernel with mma, shfl and cvt in
 * OpenCL C); on an NVIDIA GPU of compute capability 8.0 or newer, the instructions. */
#include "clattn.h"
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* TF32 mode's documented tolerance (README, "Precision"): |got - ref| <= 1e-3 + 1e-3 |ref| for scores and values
 * of order 1. Each product's operands lose up to 2^-11 each, so a weight is off by about 2^-10 of the scores'
 * size and an output by 2^-10 of the values' size: 1e-3. Measured (PoCL, the emulation, the cases below):
 * at most 2.5e-4 in TF32 mode, 2.8e-7 in fp32 mode (3xTF32). */
#define TF32_ATOL 1e-3
#define TF32_RTOL 1e-3

static void force_mma(void) { setenv("CLATTN_CORE", "flash_mma", 1); }

/* Does flash_mma run natively on dev (the instructions, not the emulation)? There AUTO may choose it. */
static int mma_native(clattn_device *dev)
{
    for (size_t i = 0; i < clattn_core_count(); i++) {
        clattn_core_info c;
        cr_assert_eq(clattn_core_describe(dev, i, &c), CLATTN_STATUS_SUCCESS);
        if (strcmp(c.name, "flash_mma") == 0) return c.supported && !c.emulated;
    }
    return 0;
}

typedef struct mma_case {
    size_t B, T, E, H, HK, dk, dv;
    int causal;
} mma_case;

/* A module with Q/K/V projections on x (weights of scale 1/sqrt(E), so projections of order 1), run with the
 * given precision on dev; out (B, T, H*dv) filled, poisoned first. */
static clattn_status run_case(clattn_device *dev, const mma_case *c, clattn_precision prec, uint64_t seed,
                              float *out, double *want)
{
    tu_rng r = {seed};
    const size_t B = c->B, T = c->T, E = c->E, H = c->H, HK = c->HK, dk = c->dk, dv = c->dv;
    const float ws = 1.0f / sqrtf((float)E);
    float *x = tu_random(&r, B * T * E, -1.0f, 1.0f);
    float *wq = tu_random(&r, H * dk * E, -ws, ws), *wk = tu_random(&r, HK * dk * E, -ws, ws);
    float *wv = tu_random(&r, HK * dv * E, -ws, ws);
    clattn_attention_desc d = {.batch = B, .seq_q = T, .embed = E, .heads = H, .kv_heads = HK, .head_dim_qk = dk,
                               .head_dim_v = dv, .causal = c->causal, .precision = prec,
                               .algorithm = CLATTN_ALGORITHM_FUSED};
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv};
    const size_t n = B * T * H * dv;
    for (size_t i = 0; i < n; i++) out[i] = NAN;
    clattn_attention_args a = {.x = x, .out = out};
    clattn_plan *plan = NULL;
    clattn_status st = tu_plan_create(dev, &d, &w, &plan);
    if (st == CLATTN_STATUS_SUCCESS) {
        cr_assert_str_eq(clattn_plan_core(plan), "flash_mma");
        st = tu_plan_execute(plan, &a);
    }
    clattn_plan_free(plan);
    if (want) {
        clattn_attention_desc od = d;
        od.precision = CLATTN_PRECISION_FP32;
        tu_count_weights(&w, &od);
        cr_assert_eq(oracle_attention(&od, &w, &a, want, NULL), 0);
    }
    free(x), free(wq), free(wk), free(wv);
    return st;
}

static const mma_case cases[] = {
    {2, 61, 64, 2, 2, 32, 32, 0},   {1, 130, 128, 2, 1, 64, 64, 1}, {3, 7, 48, 3, 3, 16, 24, 0},
    {1, 1, 40, 1, 1, 40, 40, 0},    {1, 33, 96, 2, 2, 40, 8, 1},
    /* head size class <=128: Q fragments in registers, 8-key tiles in 3xTF32, 16 in TF32 mode (the defaults) */
    {1, 37, 128, 2, 1, 128, 96, 1},
};

/* TF32 mode against the float64 oracle at its tolerance, and against fp32 mode: the two differ (by more than
 * fp32's own error: TF32 really ran) and fp32 mode meets the ordinary tolerance on the same inputs. */
Test(tf32, within_tolerance_and_not_fp32)
{
    force_mma();
    clattn_device *dev = tu_open_opencl();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const mma_case *c = &cases[k];
        const size_t n = c->B * c->T * c->H * c->dv;
        float *tf = malloc(n * sizeof *tf), *fp = malloc(n * sizeof *fp);
        double *want = malloc(n * sizeof *want);
        cr_assert_eq(run_case(dev, c, CLATTN_PRECISION_TF32, 100 + k, tf, want), CLATTN_STATUS_SUCCESS, "case %zu: %s",
                     k, clattn_last_error());
        cr_assert_eq(run_case(dev, c, CLATTN_PRECISION_FP32, 100 + k, fp, NULL), CLATTN_STATUS_SUCCESS, "case %zu: %s",
                     k, clattn_last_error());
        char msg[300];
        size_t bad = oracle_compare(tf, want, n, TF32_ATOL, TF32_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %zu, TF32: %zu elements off: %s", k, bad, msg);
        bad = oracle_compare(fp, want, n, 1e-5, 1e-4, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %zu, fp32 (3xTF32): %zu elements off: %s", k, bad, msg);
        double diff = 0.0, err = 0.0, tf_err = 0.0;
        for (size_t i = 0; i < n; i++) {
            diff = fmax(diff, fabs((double)tf[i] - fp[i]));
            err = fmax(err, fabs((double)fp[i] - want[i]));
            tf_err = fmax(tf_err, fabs((double)tf[i] - want[i]));
        }
        cr_log_info("case %zu: largest error TF32 %.3g, fp32 %.3g", k, tf_err, err);
        cr_assert(diff > 1e-5 && diff > 20.0 * err, "case %zu: TF32 and fp32 differ by %g (fp32's error %g): TF32 "
                  "products did not run", k, diff, err);
        free(tf), free(fp), free(want);
    }
    clattn_device_free(dev);
}

/* The Q block in local memory, split once as staged (QREG = 0, PS = 1: no default takes it since the Q fragments
 * fit in registers up to head size 128, but a tuned plan may), fp32 and TF32 modes against the float64 oracle. */
Test(fp32, q_block_in_local_memory)
{
    setenv("CLATTN_CORE", "flash_mma:NW=2,BK=16,QREG=0,PS=1", 1);
    clattn_device *dev = tu_open_opencl();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int tf = 0; tf < 2; tf++) {
            const mma_case *c = &cases[k];
            const size_t n = c->B * c->T * c->H * c->dv;
            float *got = malloc(n * sizeof *got);
            double *want = malloc(n * sizeof *want);
            const clattn_status st = run_case(dev, c, tf ? CLATTN_PRECISION_TF32 : CLATTN_PRECISION_FP32, 300 + k, got,
                                              want);
            /* head size 128 in 3xTF32: the K and V tiles and the Q block of 32 rows, each with its low parts, take
             * 63.5 KiB of local memory, more than some devices have (NVIDIA's OpenCL: 48 KiB); refused, never run */
            if (st == CLATTN_STATUS_UNSUPPORTED && c->dk > 64 && strstr(clattn_last_error(), "bytes of local memory")) {
                cr_log_info("case %zu, %s: refused on this device: %s", k, tf ? "TF32" : "fp32", clattn_last_error());
                free(got), free(want);
                continue;
            }
            cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "case %zu: %s", k, clattn_last_error());
            char msg[300];
            const size_t bad = oracle_compare(got, want, n, tf ? TF32_ATOL : 1e-5, tf ? TF32_RTOL : 1e-4, msg,
                                              sizeof msg);
            cr_assert_eq(bad, 0, "case %zu, %s: %zu elements off: %s", k, tf ? "TF32" : "fp32", bad, msg);
            free(got), free(want);
        }
    clattn_device_free(dev);
}

/* One query of zeros (every score 0, every weight 1) against the keys and values kv (cross-attention, no projections:
 * K = V = kv, one head of d->embed) at precision prec on dev: out (d->embed values) poisoned, then the output. */
static void zero_query(clattn_device *dev, clattn_attention_desc d, clattn_precision prec, const float *kv, float *out)
{
    float zero[64] = {0};
    cr_assert(d.embed <= 64);
    d.precision = prec;
    for (size_t i = 0; i < d.embed; i++) out[i] = NAN;
    clattn_attention_args a = {.x = zero, .kv = kv, .out = out};
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_plan_free(plan);
}

/* cvt.rna.tf32.f32 written from its definition: x to 10 mantissa bits, to nearest, ties away from zero
 * (C's round()), in double; flash_mma keeps the truncation where that would overflow. */
static float rna_tf32(float x)
{
    if (!isfinite(x) || x == 0.0f) return x;
    int e;
    (void)frexp((double)x, &e); /* x = f 2^e, 0.5 <= |f| < 1: 11 significant bits are multiples of 2^(e-11) */
    const double q = round(ldexp((double)x, 11 - e));
    const double r = ldexp(q, e - 11);
    if (r > FLT_MAX || r < -FLT_MAX) return ldexp(trunc(ldexp((double)x, 11 - e)), e - 11);
    return (float)r;
}

/* One key: the weight is exactly 1 and the output is V's row as the products see it: in TF32 mode rna(v),
 * bit for bit, on values chosen at and around the rounding ties (ties go away from zero), negative ones,
 * the largest floats (which keep their truncation) and random ones; in fp32 mode v itself (to fp32
 * tolerance). */
Test(tf32, rounds_to_nearest_away_bit_for_bit)
{
    force_mma();
    clattn_device *dev = tu_open_opencl();
    enum { D = 64 };
    float v[D];
    const uint32_t bits[] = {0x3f801000u, 0x3f800fffu, 0x3f803000u, 0xbf801000u, 0xbf802fffu, 0x40490fdbu,
                             0x7f7fffffu, 0xff7ff000u, 0x3f7ff000u, 0x3f7fefffu, 0x00801000u, 0x3eaaaaabu};
    tu_rng r = {7};
    for (size_t i = 0; i < D; i++) {
        if (i < sizeof bits / sizeof bits[0]) memcpy(&v[i], &bits[i], sizeof v[i]);
        else v[i] = tu_uniform(&r, -3.0f, 3.0f);
    }
    /* one key: the output is v itself, through the products */
    const clattn_attention_desc d = {.batch = 1, .seq_q = 1, .seq_kv = 1, .embed = D, .kv_embed = D, .heads = 1,
                                     .cross = 1};
    for (int prec = 1; prec >= 0; prec--) {
        float out[D];
        zero_query(dev, d, (clattn_precision)prec, v, out);
        for (size_t i = 0; i < D; i++) {
            const float want = prec ? rna_tf32(v[i]) : v[i];
            uint32_t g, w;
            memcpy(&g, &out[i], 4), memcpy(&w, &want, 4);
            if (prec)
                cr_assert_eq(g, w, "TF32, v[%zu] = %a (0x%08x): got %a (0x%08x), want %a (0x%08x)", i, (double)v[i],
                             i < sizeof bits / sizeof bits[0] ? bits[i] : 0, (double)out[i], g, (double)want, w);
            else
                cr_assert(oracle_close(out[i], want, 1e-5, 1e-4, 0, 0), "fp32, v[%zu] = %a: got %a", i, (double)v[i],
                          (double)out[i]);
        }
    }
    clattn_device_free(dev);
}

/* Who refuses TF32, with the reason: the ref device, AUTO (no core of its order has TF32 products), a core
 * forced that computes in fp32, a decode plan; a precision that is not one is an invalid argument. */
Test(precision, refusals)
{
    clattn_attention_desc d = {.batch = 1, .seq_q = 5, .embed = 16, .heads = 2, .precision = CLATTN_PRECISION_TF32};
    clattn_plan *plan = NULL;
    clattn_device *ref = tu_open_ref();
    cr_assert_eq(tu_plan_create(ref, &d, NULL, &plan), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(plan == NULL);
    cr_assert(strstr(clattn_last_error(), "precision TF32") && strstr(clattn_last_error(), "ref device"), "%s",
              clattn_last_error());
    clattn_device_free(ref);

    clattn_device *dev = tu_open_opencl();
    unsetenv("CLATTN_CORE");
    const int native = mma_native(dev);
    if (native) { /* AUTO's order starts with flash_mma here (head sizes up to 128): it takes TF32 */
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_str_eq(clattn_plan_core(plan), "flash_mma");
        clattn_plan_free(plan);
        plan = NULL;
    } else {
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(plan == NULL);
        cr_assert(strstr(clattn_last_error(), "fp32 only") && strstr(clattn_last_error(), "flash_mma"), "%s",
                  clattn_last_error());
        cr_assert(!strstr(strstr(clattn_last_error(), "fp32 only") + 1, "fp32 only"),
                  "the reason once, not per core: %s", clattn_last_error());
    }
    static const char *const fp32_cores[] = {"unfused", "flash_rows", "flash_tiled", "flash_gemm"};
    for (size_t i = 0; i < sizeof fp32_cores / sizeof fp32_cores[0]; i++) {
        setenv("CLATTN_CORE", fp32_cores[i], 1);
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_UNSUPPORTED, "%s", fp32_cores[i]);
        cr_assert(strstr(clattn_last_error(), fp32_cores[i]) && strstr(clattn_last_error(), "fp32 only"), "%s",
                  clattn_last_error());
    }
    unsetenv("CLATTN_CORE");
    clattn_decode_plan *dp = NULL;
    clattn_attention_desc dd = d;
    dd.causal = 1;
    cr_assert_neq(tu_decode_plan_create(dev, &dd, NULL, &dp), CLATTN_STATUS_SUCCESS);
    cr_assert(dp == NULL);
    cr_assert(strstr(clattn_last_error(), "fp32 only") || strstr(clattn_last_error(), "TF32"), "%s",
              clattn_last_error());
    d.precision = (clattn_precision)2;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "precision 2"), "%s", clattn_last_error());
    /* fp32 plans are unchanged: AUTO serves them (with the emulation's flash_mma never) */
    d.precision = CLATTN_PRECISION_FP32;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    if (!native) cr_assert_str_neq(clattn_plan_core(plan), "flash_mma");
    clattn_plan_free(plan);
    clattn_device_free(dev);
}

/* Where flash_mma would be an emulation, the public list says it is not supported, that forcing it runs an
 * emulation, and that AUTO gives it no head-size class; AUTO's plans never get it. */
Test(auto, never_picks_the_emulation)
{
    unsetenv("CLATTN_CORE");
    clattn_device *dev = tu_open_opencl();
    for (size_t i = 0; i < clattn_core_count(); i++) {
        clattn_core_info c;
        cr_assert_eq(clattn_core_describe(dev, i, &c), CLATTN_STATUS_SUCCESS);
        if (strcmp(c.name, "flash_mma") != 0) {
            cr_assert_eq(c.emulated, 0, "%s", c.name);
            continue;
        }
        if (c.supported && !c.emulated) {
            cr_log_info("flash_mma runs natively here (%s): the emulation checks do not apply",
                        clattn_device_name(dev));
            clattn_device_free(dev);
            return;
        }
        cr_assert_eq(c.default_for, 0u, "AUTO gives the emulated flash_mma head-size classes 0x%x", c.default_for);
        if (!c.emulated && strstr(c.reason, "loops after") && strstr(c.reason, "without an error")) {
            /* a driver that ends long loops (the probes' loop limit): refused for it, never run, not even emulated */
            cr_log_info("flash_mma is refused here for the driver's loop limit: %s", c.reason);
        } else {
            cr_assert_eq(c.emulated, 1, "flash_mma: %s", c.reason);
            cr_assert(strstr(c.reason, "emulation"), "%s", c.reason);
        }
    }
    static const size_t heads[] = {16, 64, 128, 256};
    for (size_t k = 0; k < sizeof heads / sizeof heads[0]; k++) {
        clattn_attention_desc d = {.batch = 1, .seq_q = 9, .embed = 2 * heads[k], .heads = 2};
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_str_neq(clattn_plan_core(plan), "flash_mma", "head %zu", heads[k]);
        clattn_plan_free(plan);
    }
    clattn_device_free(dev);
}

/* fp32 mode (3xTF32) passes infinities as fp32 does, against the ref device's fp32 reference on the same
 * inputs (cross-attention, no projections: Q = x, K = V = kv, one query):
 *   A  an infinite query element over keys whose element is negative, with low parts of both signs and 0:
 *      every score -inf, so the row is 0 (an infinity meets the keys only through hi*hi, never lo*inf);
 *   B  head size 3 (padded to 8 in the fragments) next to a head with an infinite query element: the padded
 *      columns are zeros, never the neighbour's values, so head 0 stays finite. */
Test(fp32, infinities_pass_as_in_fp32)
{
    force_mma();
    clattn_device *dev = tu_open_opencl(), *ref = tu_open_ref();
    enum { TK = 5 };
    static const float kcol0[TK] = {-0.9999f, -1.0001f, -2.9999f, -0.5f, -0.75f};
    for (int which = 0; which < 2; which++) {
        const size_t E = which ? 6 : 8, H = which ? 2 : 1;
        float x[8], kv[TK * 8];
        tu_rng r = {900u + (uint64_t)which};
        tu_fill(&r, x, E, -1.0f, 1.0f);
        tu_fill(&r, kv, TK * E, -1.0f, 1.0f);
        if (which == 0) {
            x[0] = INFINITY;
            for (size_t j = 0; j < TK; j++) kv[j * E] = kcol0[j];
        } else {
            x[4] = INFINITY; /* head 1's second element */
        }
        clattn_attention_desc d = {.batch = 1, .seq_q = 1, .seq_kv = TK, .embed = E, .kv_embed = E, .heads = H,
                                   .cross = 1};
        float got[8], want_f[8];
        double want[8];
        for (size_t i = 0; i < 8; i++) got[i] = want_f[i] = NAN;
        for (int side = 0; side < 2; side++) {
            clattn_attention_args a = {.x = x, .kv = kv, .out = side ? got : want_f};
            clattn_plan *plan = NULL;
            cr_assert_eq(tu_plan_create(side ? dev : ref, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s",
                         clattn_last_error());
            cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            clattn_plan_free(plan);
        }
        for (size_t i = 0; i < E; i++) want[i] = want_f[i];
        if (which == 0)
            for (size_t i = 0; i < E; i++) cr_assert_eq(want_f[i], 0.0f, "case A: the reference's row is not 0");
        else
            for (size_t i = 0; i < 3; i++) cr_assert(isfinite(want_f[i]), "case B: the reference's head 0");
        char msg[300];
        const size_t bad = oracle_compare_nonfinite(got, want, E, 1e-5, 1e-4, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %c: %zu elements differ from fp32's: %s", 'A' + which, bad, msg);
    }
    clattn_device_free(dev);
    clattn_device_free(ref);
}

/* Infinite values (a value bias of +inf and -inf on two columns, Q and K finite) pass as in fp32: every weight is
 * positive, so those columns are +inf and -inf and the others stay finite. The V tile carries an infinity in its
 * low part (hi = 0): were it split as (inf, 0), a weight whose low part is 0 (the row's max, weight 1) would make
 * 0 * inf = NaN in the column. Both ways of splitting: the tiles split once as staged (the defaults) and each
 * warp splitting what it reads (PS = 0). */
Test(fp32, infinite_values_pass_as_in_fp32)
{
    static const char *const configs[] = {"flash_mma", "flash_mma:NW=1,BK=8,QREG=0,PS=0"};
    clattn_device *ref = tu_open_ref();
    enum { B = 1, T = 11, E = 16, H = 2, DK = 8 };
    tu_rng r = {917u};
    const float ws = 0.25f;
    float *x = tu_random(&r, B * T * E, -1.0f, 1.0f);
    float *wq = tu_random(&r, H * DK * E, -ws, ws), *wk = tu_random(&r, H * DK * E, -ws, ws);
    float *wv = tu_random(&r, H * DK * E, -ws, ws), *bv = tu_random(&r, H * DK, -1.0f, 1.0f);
    bv[2] = INFINITY, bv[DK + 5] = -INFINITY;
    clattn_attention_desc d = {.batch = B, .seq_q = T, .embed = E, .heads = H, .head_dim_qk = DK,
                               .algorithm = CLATTN_ALGORITHM_FUSED};
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .b_value = bv};
    enum { N = B * T * H * DK };
    float got[N], want[N];
    for (size_t k = 0; k < 2; k++) {
        setenv("CLATTN_CORE", configs[k], 1);
        clattn_device *dev = tu_open_opencl();
        for (int side = 0; side < 2; side++) {
            float *out = side ? got : want;
            for (size_t i = 0; i < N; i++) out[i] = NAN;
            clattn_attention_args a = {.x = x, .out = out};
            clattn_plan *plan = NULL;
            cr_assert_eq(tu_plan_create(side ? dev : ref, &d, &w, &plan), CLATTN_STATUS_SUCCESS, "%s",
                         clattn_last_error());
            if (side) cr_assert_str_eq(clattn_plan_core(plan), "flash_mma");
            cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            clattn_plan_free(plan);
        }
        for (size_t i = 0; i < N; i++) {
            const size_t col = i % (H * DK);
            if (col == 2 || col == DK + 5) {
                cr_assert(isinf(want[i]) && (want[i] > 0) == (col == 2), "the reference's element %zu: %g", i,
                          want[i]);
                cr_assert_eq(got[i], want[i], "%s, element %zu (an infinite column): %g, want %g", configs[k], i,
                             got[i], want[i]);
            } else {
                cr_assert(isfinite(want[i]), "the reference's element %zu: %g", i, want[i]);
                cr_assert(fabsf(got[i] - want[i]) <= 1e-5f + 1e-4f * fabsf(want[i]), "%s, element %zu: %g, want %g",
                          configs[k], i, got[i], want[i]);
            }
        }
        clattn_device_free(dev);
    }
    free(x), free(wq), free(wk), free(wv), free(bv);
    clattn_device_free(ref);
}

/* A head size that is no multiple of 4 (3 here, padded to 8): the tile staging reads no column past the head, so
 * another head's infinite keys and values (head 1, right after head 0 in each row) do not reach head 0, whose
 * output stays the reference's. (Read past the head, 0 * inf in the padding makes NaN.) */
Test(fp32, another_heads_infinities_stay_there)
{
    force_mma();
    clattn_device *dev = tu_open_opencl(), *ref = tu_open_ref();
    enum { TK = 7, E = 6, H = 2 };
    float x[E], kv[TK * E];
    tu_rng r = {911u};
    tu_fill(&r, x, E, -1.0f, 1.0f);
    tu_fill(&r, kv, TK * E, -1.0f, 1.0f);
    for (size_t j = 0; j < TK; j++) kv[j * E + 4] = INFINITY, kv[j * E + 5] = -INFINITY;
    clattn_attention_desc d = {.batch = 1, .seq_q = 1, .seq_kv = TK, .embed = E, .kv_embed = E, .heads = H,
                               .cross = 1};
    float got[E], want[E];
    for (int side = 0; side < 2; side++) {
        float *out = side ? got : want;
        for (size_t i = 0; i < E; i++) out[i] = NAN;
        clattn_attention_args a = {.x = x, .kv = kv, .out = out};
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(side ? dev : ref, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_plan_free(plan);
    }
    for (size_t i = 0; i < 3; i++) {
        cr_assert(isfinite(want[i]), "the reference's head 0: %g", want[i]);
        cr_assert(fabsf(got[i] - want[i]) <= 1e-5f + 1e-4f * fabsf(want[i]), "head 0, element %zu: %g, want %g", i,
                  got[i], want[i]);
    }
    clattn_device_free(dev);
    clattn_device_free(ref);
}

/* ---- toward_zero:: long rows keep their precision. A tensor core's accumulator rounds toward zero at every
 * instruction (README "Precision"): an O kept in it over S keys drifts by up to S/8 ulps, all one way, where the
 * values share a sign (H200: the whole module at 2.3x the tolerance at 32768 keys). One block of queries against
 * S = 32768 keys (cross-attention, no projections, scores within +-1 so that every key counts), values in
 * [0.5, 1.5]: fp32 mode at the ordinary tolerance, half plans at it plus P's and the output's roundings
 * (u·Σⱼ aᵢⱼ·|vⱼ| + u·|o|), and the outputs' mean error (a drift is one-sided). The emulation rounds its sums as the
 * tensor core does, so PoCL sees the drift too. */
static void long_row_case(clattn_device *dev, clattn_dtype t, size_t D)
{
    static const char *const names[] = {"fp32", "f16", "bf16"};
    enum { TQ = 20, S = 32768 };
    tu_rng r = {7000u + (uint64_t)t + D};
    float *q = tu_random(&r, TQ * D, -1.0f, 1.0f), *k = tu_random(&r, (size_t)S * D, -1.0f, 1.0f);
    float *v = tu_random(&r, (size_t)S * D, 0.5f, 1.5f);
    for (size_t i = 0; i < TQ * D; i++) q[i] = (float)tu_dtype_round(q[i], t);
    for (size_t i = 0; i < (size_t)S * D; i++)
        k[i] = (float)tu_dtype_round(k[i], t), v[i] = (float)tu_dtype_round(v[i], t);
    clattn_attention_desc d = {.batch = 1, .seq_q = TQ, .seq_kv = S, .embed = D, .heads = 1, .kv_heads = 1,
                               .head_dim_v = D, .cross = 1, .separate_value = 1, .dtype = t};
    void *xq = tu_typed(q, TQ * D, t), *xk = tu_typed(k, (size_t)S * D, t), *xv = tu_typed(v, (size_t)S * D, t);
    void *out = tu_poisoned_typed(TQ * D, t);
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_str_eq(clattn_plan_core(plan), "flash_mma");
    clattn_attention_args a = {.x = xq, .kv = xk, .value = xv, .out = out};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *got = tu_widened(out, TQ * D, t);
    const double u = t == CLATTN_DTYPE_F16 ? ldexp(1.0, -11) : t == CLATTN_DTYPE_BF16 ? ldexp(1.0, -8) : 0.0;
    double *w = malloc(S * sizeof *w), worst = -1.0, bias = 0.0;
    cr_assert(w);
    size_t wi = 0, wc = 0;
    for (size_t i = 0; i < TQ; i++) {
        double mx = -INFINITY, l = 0.0;
        for (size_t j = 0; j < S; j++) {
            double sc = 0.0;
            for (size_t c = 0; c < D; c++) sc += (double)q[i * D + c] * k[j * D + c];
            w[j] = sc / sqrt((double)D);
            mx = fmax(mx, w[j]);
        }
        for (size_t j = 0; j < S; j++) l += w[j] = exp(w[j] - mx);
        for (size_t c = 0; c < D; c++) {
            double o = 0.0, oa = 0.0;
            for (size_t j = 0; j < S; j++) o += w[j] * v[j * D + c], oa += w[j] * fabs((double)v[j * D + c]);
            o /= l, oa /= l;
            const double bound = 1e-5 + 1e-4 * fabs(o) + u * (oa + fabs(o));
            const double ratio = fabs(got[i * D + c] - o) / bound;
            bias += (got[i * D + c] - o) / o / (TQ * D);
            if (!(ratio <= worst)) worst = ratio, wi = i, wc = c;
            cr_assert(ratio <= 1.0, "%s: row %zu column %zu: got %.9g, float64 %.9g (%.3g of the bound)",
                      names[t], i, c, got[i * D + c], o, ratio);
        }
    }
    cr_log_info("%s d=%zu, %d keys: worst error %.3g of the bound (row %zu column %zu), mean relative error %.3g",
                names[t], D, (int)S, worst, wi, wc, bias);
    /* the drift is one-sided (the values are positive): in F16 it shows as a mean beyond the roundings' noise (about
     * 8e-6 over these 320 outputs; with O in the accumulator, emulated: -4.6e-5 or more; u/20 = 2.4e-5). BF16's
     * output rounding (u = 2^-8) leaves a mean of about 1.3e-4 either way: held only to u/16. */
    const double most = t == CLATTN_DTYPE_F32 ? 1e-6 : t == CLATTN_DTYPE_F16 ? u / 20.0 : u / 16.0;
    cr_assert(fabs(bias) <= most,
              "%s: the outputs' mean relative error is %.3g (at most %.3g): a sum that drifts one way", names[t], bias,
              most);
    free(w), free(got), free(q), free(k), free(v), free(xq), free(xk), free(xv), free(out);
    clattn_plan_free(plan);
}

/* The model behind the emulation, checked where it runs natively too: one m16n8k8 sum as the tensor core takes it
 * (flash_mma.cl's dot_rz: each addend truncated toward zero to half the largest one's ulp, the sum normalised toward
 * zero). Q = 0 (every weight 1), two keys, K = V = kv: output column c is (v0c + v1c) / 2, from one product of
 * 1·v0c + 1·v1c (all TF32 values, no low parts) started at 0. Where fp32 would round otherwise:
 *   1 + 1.5·2^-24    fp32 1 + 2^-23,  the tensor core 1
 *  -1 - 1.5·2^-24    fp32 -1 - 2^-23, the tensor core -1
 *   1 - 1.25·2^-24   fp32 1 - 2^-24,  the tensor core 1 - 2^-24 (the addend truncated to 2^-24 first: toward zero
 *                    from the exact sum it would be 1 - 2^-23)
 *   1 + 1.5·2^-23    fp32 1 + 2^-22 (a tie, to even), the tensor core 1 + 2^-23
 * The H200 gave the first three (2026-11-27). */
Test(toward_zero, one_sum)
{
    force_mma();
    clattn_device *dev = tu_open_opencl();
    enum { D = 8 };
    float kv[2 * D] = {1.0f, -1.0f, 1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f, /* key 0 */
                       (float)ldexp(1.5, -24), (float)ldexp(-1.5, -24), (float)ldexp(-1.25, -24), (float)ldexp(1.5, -23),
                       0.0f, 0.0f, 0.0f, 0.0f};
    const float want[4] = {0.5f, -0.5f, (float)((1.0 - ldexp(1.0, -24)) / 2.0), (float)((1.0 + ldexp(1.0, -23)) / 2.0)};
    const clattn_attention_desc d = {.batch = 1, .seq_q = 1, .seq_kv = 2, .embed = D, .kv_embed = D, .heads = 1,
                                     .cross = 1};
    for (int prec = 0; prec <= 1; prec++) {
        float out[D];
        zero_query(dev, d, (clattn_precision)prec, kv, out);
        for (size_t c = 0; c < 4; c++)
            cr_assert_eq(out[c], want[c], "%s, column %zu: got %a, the tensor core's sum %a", prec ? "TF32" : "fp32", c,
                         (double)out[c], (double)want[c]);
    }
    clattn_device_free(dev);
}

Test(toward_zero, long_rows)
{
    force_mma();
    clattn_device *dev = tu_open_opencl();
    for (int t = 0; t <= 2; t++) long_row_case(dev, (clattn_dtype)t, 16);
    long_row_case(dev, CLATTN_DTYPE_F32, 72); /* past 64 the products are added one by one (flash_mma.cl's OT) */
    clattn_device_free(dev);
}

/* ---- half:: a half plan's own arrays (no projections): m16n8k16 fp16/bf16 products, P rounded to the type */

/* Q (T x 16), K (S x 16), V = the identity (S x S) of a half plan: out[i][j] = round(P~[i][j] / l_i), the rounded
 * weights themselves. Column 0 gives key 0 the largest score of every row (q[i][0] = 1, k[0][0] = 8, the other keys'
 * |k[j][0]| <= 1 and columns 1..15 in +-0.5), so every row's max is known from the first tile on and P is rounded
 * where the oracle below computes it: p = exp((s - s_0) / 4), in [0.04, 0.45]. The rounding is the type's to nearest
 * even: over the outputs, their relative error against the exact weights (P's rounding and the output's, each at
 * most u) has no bias (truncation's is about -u/2: -2.4e-4 for F16), and none exceeds 2u. */
static void p_rounding_case(clattn_device *dev, clattn_dtype t, const char *core)
{
    enum { T = 48, S = 32, DK = 16 };
    setenv("CLATTN_CORE", core, 1);
    tu_rng r = {t == CLATTN_DTYPE_F16 ? 4242u : 4343u};
    float q[T * DK], k[S * DK], v[S * S];
    tu_fill(&r, q, T * DK, -0.5f, 0.5f);
    tu_fill(&r, k, S * DK, -0.5f, 0.5f);
    for (size_t i = 0; i < T; i++) q[i * DK] = 1.0f;
    for (size_t j = 0; j < S; j++) k[j * DK] = j ? 2.0f * k[j * DK] : 8.0f;
    for (size_t i = 0; i < T * DK; i++) q[i] = (float)tu_dtype_round(q[i], t);
    for (size_t i = 0; i < S * DK; i++) k[i] = (float)tu_dtype_round(k[i], t);
    for (size_t j = 0; j < S * S; j++) v[j] = j / S == j % S ? 1.0f : 0.0f;
    clattn_attention_desc d = {.batch = 1, .seq_q = T, .seq_kv = S, .embed = DK, .heads = 1, .kv_heads = 1,
                               .head_dim_v = S, .cross = 1, .separate_value = 1, .dtype = t};
    void *xq = tu_typed(q, T * DK, t), *xk = tu_typed(k, S * DK, t), *xv = tu_typed(v, S * S, t);
    void *out = tu_poisoned_typed(T * S, t);
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s: %s", core, clattn_last_error());
    cr_assert_str_eq(clattn_plan_core(plan), "flash_mma");
    clattn_attention_args a = {.x = xq, .kv = xk, .value = xv, .out = out};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *got = tu_widened(out, T * S, t);
    const double u = t == CLATTN_DTYPE_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    double bias = 0.0, worst = 0.0;
    for (size_t i = 0; i < T; i++) {
        double s[S], l = 0.0;
        for (size_t j = 0; j < S; j++) {
            s[j] = 0.0;
            for (size_t c = 0; c < DK; c++) s[j] += (double)q[i * DK + c] * k[j * DK + c];
        }
        for (size_t j = 0; j < S; j++) {
            cr_assert(s[j] <= s[0], "row %zu: key %zu's score %g above key 0's %g", i, j, s[j], s[0]);
            l += exp((s[j] - s[0]) / 4.0);
        }
        for (size_t j = 0; j < S; j++) {
            const double w = exp((s[j] - s[0]) / 4.0) / l, e = got[i * S + j] / w - 1.0;
            bias += e;
            worst = fmax(worst, fabs(e));
        }
    }
    bias /= T * S;
    cr_log_info("%s %s: relative error of the weights: mean %.3g, largest %.3g (u = %.3g)", core,
                t == CLATTN_DTYPE_F16 ? "f16" : "bf16", bias, worst, u);
    cr_assert(worst <= 2.0 * u + 1e-6, "%s: an output off by %.3g of itself, more than P's and the output's roundings "
              "(2u = %.3g)", core, worst, 2.0 * u);
    cr_assert(fabs(bias) <= u / 8.0, "%s: the weights' rounding is biased (mean relative error %.3g; to nearest even "
              "it is about 0, truncation's about -u/2 = %.3g)", core, bias, -u / 2.0);
    cr_assert(worst > 1.1 * u, "%s: no output is off by more than one rounding (largest %.3g, u = %.3g): P was not "
              "rounded to the type (the fp16/bf16 products did not run)", core, worst, u);
    free(got), free(xq), free(xk), free(xv), free(out);
    clattn_plan_free(plan);
}

Test(half, p_rounded_to_nearest_even)
{
    clattn_device *dev = tu_open_opencl();
    for (int t = 1; t <= 2; t++) {
        p_rounding_case(dev, (clattn_dtype)t, "flash_mma");
        p_rounding_case(dev, (clattn_dtype)t, "flash_mma:NW=1,BK=16,QREG=0,SPLIT=1");
    }
    unsetenv("CLATTN_CORE");
    clattn_device_free(dev);
}

/* PF = 1 (the next tile's K and V in registers while this tile's products run) changes when the tiles are loaded,
 * not what the products see: its outputs equal PF = 0's bit for bit, in f16 and bf16, for tiles of 16 keys over
 * 61 and 21 keys (a last tile part full, masked), split parts (some of them empty under the causal mask), GQA, head
 * sizes that are no multiple of 16 (padded with zeros) or of 8 (the general kernel, 16-bit loads one by one). A
 * float plan is refused PF = 1 by name. */
Test(half, prefetch_equals_staging)
{
    clattn_device *dev = tu_open_opencl();
    static const char *const base[] = {"flash_mma:NW=1,BK=16,QREG=0,SPLIT=1", "flash_mma:NW=2,BK=32,SPLIT=4"};
    static const struct { size_t T, S, H, HK, dk, dv; int causal; } shapes[] = {{61, 61, 4, 2, 24, 40, 1},
                                                                            {7, 21, 2, 2, 20, 12, 0}};
    for (int t = 1; t <= 2; t++)
        for (size_t k = 0; k < 2; k++) {
            const size_t sh = (t + k) % 2; /* each type with both configurations and both shapes (a kernel each) */
            const size_t B = 2, T = shapes[sh].T, S = shapes[sh].S, H = shapes[sh].H, HK = shapes[sh].HK;
            const size_t dk = shapes[sh].dk, dv = shapes[sh].dv;
            const clattn_dtype dt = (clattn_dtype)t;
            tu_rng r = {900u + 10u * (unsigned)t + (unsigned)(2 * k + sh)};
            float *q = tu_random(&r, B * T * H * dk, -2.0f, 2.0f), *kk = tu_random(&r, B * S * HK * dk, -2.0f, 2.0f);
            float *v = tu_random(&r, B * S * HK * dv, -2.0f, 2.0f);
            void *hq = tu_typed(q, B * T * H * dk, dt), *hk = tu_typed(kk, B * S * HK * dk, dt);
            void *hv = tu_typed(v, B * S * HK * dv, dt);
            void *out[2];
            for (int pf = 0; pf < 2; pf++) {
                char spec[96];
                snprintf(spec, sizeof spec, "%s%s", base[k], pf ? ",PF=1" : "");
                setenv("CLATTN_CORE", spec, 1);
                clattn_attention_desc d = {.batch = B, .seq_q = T, .seq_kv = S, .embed = H * dk, .heads = H,
                                           .kv_heads = HK, .head_dim_qk = dk, .head_dim_v = dv, .cross = 1,
                                           .separate_value = 1, .causal = shapes[sh].causal, .dtype = dt};
                clattn_plan *plan = NULL;
                cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s: %s", spec,
                             clattn_last_error());
                cr_assert(strstr(clattn_plan_core_params(plan), pf ? "PF=1" : "PF=0"), "%s: ran %s", spec,
                          clattn_plan_core_params(plan));
                out[pf] = tu_poisoned_typed(B * T * H * dv, dt);
                clattn_attention_args a = {.x = hq, .kv = hk, .value = hv, .out = out[pf]};
                cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s: %s", spec, clattn_last_error());
                clattn_plan_free(plan);
            }
            const uint16_t *o0 = out[0], *o1 = out[1];
            for (size_t i = 0; i < B * T * H * dv; i++)
                cr_assert_eq(o0[i], o1[i], "%s %s, shape %zu: element %zu: PF=1 gives 0x%04x, PF=0 0x%04x",
                             t == 1 ? "f16" : "bf16", base[k], sh, i, o1[i], o0[i]);
            free(q), free(kk), free(v), free(hq), free(hk), free(hv), free(out[0]), free(out[1]);
        }
    setenv("CLATTN_CORE", "flash_mma:PF=1", 1);
    clattn_attention_desc f = {.batch = 1, .seq_q = 8, .embed = 32, .heads = 2};
    clattn_plan *plan = NULL;
    cr_assert_neq(clattn_plan_create(dev, &f, NULL, &plan), CLATTN_STATUS_SUCCESS, "a float plan took PF=1");
    cr_assert(strstr(clattn_last_error(), "PF=1 does not fit this plan"), "%s", clattn_last_error());
    cr_assert_null(plan);
    unsetenv("CLATTN_CORE");
    clattn_device_free(dev);
}

/* K and V in cl_mem buffers at an offset that is no multiple of 8 values (K's, V's or both): the plan's kernel reads
 * 16-byte rows (its head sizes and strides are multiples of 8), so such a call takes the general kernel, built then;
 * both give the host arrays' bits, and so do aligned offsets */
Test(half, unaligned_offsets_take_the_general_kernel)
{
    force_mma();
    clattn_device *dev = tu_open_opencl();
    enum { B = 2, T = 21, S = 19, E = 32, H = 2, DV = 24 };
    const clattn_dtype t = CLATTN_DTYPE_F16;
    tu_rng r = {777u};
    float *x = tu_random(&r, B * T * E, -2.0f, 2.0f), *kv = tu_random(&r, B * S * E, -2.0f, 2.0f);
    float *val = tu_random(&r, B * S * H * DV, -2.0f, 2.0f);
    void *hx = tu_typed(x, B * T * E, t), *hkv = tu_typed(kv, B * S * E, t), *hv = tu_typed(val, B * S * H * DV, t);
    void *want = tu_poisoned_typed(B * T * H * DV, t);
    clattn_attention_desc d = {.batch = B, .seq_q = T, .seq_kv = S, .embed = E, .heads = H, .head_dim_v = DV,
                               .cross = 1, .separate_value = 1, .causal = 1, .dtype = t};
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_attention_args a = {.x = hx, .kv = hkv, .value = hv, .out = want};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cl_context cx = clattn_device_context(dev);
    cl_command_queue q = clattn_device_queue(dev);
    /* offsets of x, kv (K), value (V) and out */
    const size_t offs[4][4] = {{3, 3, 3, 3}, {8, 8, 16, 8}, {0, 8, 13, 5}, {0, 11, 8, 0}};
    for (size_t o = 0; o < 4; o++) {
        const size_t n[4] = {B * T * E, B * S * E, B * S * H * DV, B * T * H * DV};
        const void *src[4] = {hx, hkv, hv, NULL};
        cl_mem m[4];
        for (int i = 0; i < 4; i++) {
            const size_t off = offs[o][i];
            cl_int e;
            m[i] = clCreateBuffer(cx, CL_MEM_READ_WRITE, (off + n[i]) * 2, NULL, &e);
            cr_assert_eq(e, CL_SUCCESS);
            uint16_t *fill = calloc(off + n[i], 2);
            if (src[i]) memcpy(fill + off, src[i], n[i] * 2);
            cr_assert_eq(clEnqueueWriteBuffer(q, m[i], CL_TRUE, 0, (off + n[i]) * 2, fill, 0, NULL, NULL), CL_SUCCESS);
            free(fill);
        }
        const clattn_attention_buffers b = {.x = {m[0], offs[o][0]}, .kv = {m[1], offs[o][1]},
                                            .value = {m[2], offs[o][2]}, .out = {m[3], offs[o][3]}};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "offsets %zu: %s",
                     o, clattn_last_error());
        uint16_t *got = malloc(n[3] * 2);
        cr_assert_eq(clEnqueueReadBuffer(q, m[3], CL_TRUE, offs[o][3] * 2, n[3] * 2, got, 0, NULL, NULL), CL_SUCCESS);
        cr_assert(memcmp(got, want, n[3] * 2) == 0, "offsets %zu (K %zu, V %zu): the output differs from the host "
                  "arrays'", o, offs[o][1], offs[o][2]);
        free(got);
        for (int i = 0; i < 4; i++) clReleaseMemObject(m[i]);
    }
    clattn_plan_free(plan);
    free(x), free(kv), free(val), free(hx), free(hkv), free(hv), free(want);
    clattn_device_free(dev);
}

/* precision TF32 is for fp32 arrays: a half plan that flash_mma would run on its own arrays is refused, naming why */
Test(half, tf32_refused)
{
    force_mma();
    clattn_device *dev = tu_open_opencl();
    clattn_attention_desc d = {.batch = 1, .seq_q = 8, .embed = 32, .heads = 2, .dtype = CLATTN_DTYPE_BF16,
                               .precision = CLATTN_PRECISION_TF32};
    clattn_plan *plan = NULL;
    cr_assert_eq(clattn_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "precision TF32 is for fp32 arrays"), "%s", clattn_last_error());
    cr_assert_null(plan);
    clattn_device_free(dev);
}

/* Another head's infinite queries, keys and values (head 1, right after head 0 in each row) stay out of head 0 in a
 * half plan: the staging and the Q fragments read no column past the head (dk = 8: the 16-byte loads of ALIGNED,
 * whose padding to 16 is a whole 8 columns past the head; dk = 6: the general kernel's per-value bounds). Head 0's
 * output is the ref device's within P's rounding (u = 2^-11, values in +-1) and the output's. */
Test(half, another_heads_infinities_stay_there)
{
    force_mma();
    clattn_device *dev = tu_open_opencl(), *ref = tu_open_ref();
    const clattn_dtype t = CLATTN_DTYPE_F16;
    for (size_t dk = 6; dk <= 8; dk += 2) {
        enum { TQ = 5, TK = 19, H = 2 };
        const size_t E = H * dk;
        float x[TQ * 16], kv[TK * 16];
        tu_rng r = {912u + dk};
        tu_fill(&r, x, TQ * E, -1.0f, 1.0f);
        tu_fill(&r, kv, TK * E, -1.0f, 1.0f);
        for (size_t c = dk; c < E; c++) {
            for (size_t i = 0; i < TQ; i++) x[i * E + c] = c % 2 ? INFINITY : -INFINITY;
            for (size_t j = 0; j < TK; j++) kv[j * E + c] = c % 2 ? -INFINITY : INFINITY;
        }
        void *hx = tu_typed(x, TQ * E, t), *hkv = tu_typed(kv, TK * E, t);
        clattn_attention_desc d = {.batch = 1, .seq_q = TQ, .seq_kv = TK, .embed = E, .kv_embed = E, .heads = H,
                                   .cross = 1, .dtype = t};
        float *res[2];
        for (int side = 0; side < 2; side++) {
            void *out = tu_poisoned_typed(TQ * E, t);
            clattn_attention_args a = {.x = hx, .kv = hkv, .out = out};
            clattn_plan *plan = NULL;
            cr_assert_eq(tu_plan_create(side ? dev : ref, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s",
                         clattn_last_error());
            cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            res[side] = tu_widened(out, TQ * E, t);
            clattn_plan_free(plan);
            free(out);
        }
        for (size_t i = 0; i < TQ; i++)
            for (size_t c = 0; c < dk; c++) {
                const float w = res[0][i * E + c], g = res[1][i * E + c];
                cr_assert(isfinite(w), "the reference's head 0: %g", w);
                cr_assert(fabsf(g - w) <= 2e-3f, "dk %zu, row %zu, head 0 column %zu: %g, want %g", dk, i, c, g, w);
            }
        free(res[0]), free(res[1]), free(hx), free(hkv);
    }
    clattn_device_free(dev);
    clattn_device_free(ref);
}
