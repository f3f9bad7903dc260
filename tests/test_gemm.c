/* test_gemm.c: the GEMM cores (src/cores/gemm*.c) called directly, C = alpha * op(A) op(B) + beta * C, against
 * products computed in float64 here. The core is the one a plan gets (AUTO's for the device: gemm_tiles on a
 * CPU, CLBlast on a GPU), or the one CLATTN_CORE forces (the entries test_gemm_core_<core>...).
 *   shapes     m, n, k from 1 to 300 (tile edges, odd sizes), every transposition, alpha and beta (beta = 0 over
 *              a C full of NaN: never read), a bias row added as C is stored (refused by a core that does not
 *              add one), row strides longer than the rows, operands at element offsets;
 *              every element of C compared, and the elements between C's rows and after it untouched
 *   batches    strided batches (the unfused core's), B shared by every entry (stride 0)
 *   values     dyadic inputs (multiples of 1/64 in [-1, 1]): every product and sum exact in float, so any
 *              order of summation gives the float64 answer exactly, and a wrong element cannot hide in a
 *              tolerance; then ordinary random floats at the suite's tolerance
 *   limits     the device's limits lowered (one allocation: gemm_tiles' blocks of rows, columns, depth and batch
 *              entries; CLBlast's 32-bit index range: sub-buffers past it; launches of a few work-items); the
 *              operands as sub-buffers
 *   types      A and B in F16 and BF16 (typed_operands: a half plan's projections read its inputs and weights as
 *              they are), refused by a core without reads_dtypes
 *   refusals   sizes of 0, row strides shorter than a row and an unknown dtype: INVALID_ARGUMENT naming the GEMM,
 *              C untouched; an operand that ends one element past its buffer (a row stride, a batch stride, a
 *              transposed A): SHAPE_MISMATCH naming it, C untouched, and a batch that ends exactly at the end computed */
#include "attention/attention.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(gemm, .timeout = 600);

/* The GEMM core of a plan on dev (AUTO's, or the forced one), built. */
static clattn_core_instance gemm_core(const clattn_device *dev)
{
    const clattn_attention_desc d = {.batch = 1, .seq_q = 8, .seq_kv = 8, .embed = 64, .kv_embed = 64, .heads = 1,
                                     .kv_heads = 1, .head_dim_qk = 64, .head_dim_v = 64, .out_dim = 64};
    clattn_core_instance inst;
    cr_assert_eq(clattn_core_create(dev, CLATTN_CORE_GEMM, &d, NULL, 0, &inst), CLATTN_STATUS_SUCCESS, "%s",
                 clattn_last_error());
    const clattn_core_info *forced = tu_forced_core_of(CLATTN_CORE_GEMM);
    if (forced) cr_assert_str_eq(inst.core->name, forced->name);
    return inst;
}

/* A test's device and its GEMM core. */
typedef struct fixture {
    clattn_device *dev;
    clattn_core_instance inst;
    clattn_gemm core;
} fixture;

static fixture fixture_open(void)
{
    fixture f = {.dev = tu_open_opencl()};
    f.inst = gemm_core(f.dev);
    f.core = (clattn_gemm){f.inst.core, f.inst.state};
    return f;
}

static void fixture_close(fixture *f)
{
    clattn_core_destroy(&f->inst);
    clattn_device_free(f->dev);
}

/* A value in units of 1/64 in [-1, 1] (dyadic: exact products and sums), or an ordinary float in [-1, 1]. */
static float value(tu_rng *r, int dyadic)
{
    if (!dyadic) return tu_uniform(r, -1.0f, 1.0f);
    return (float)((int)(tu_next(r) % 129) - 64) / 64.0f;
}

/* One call: the shapes and strides, the operands' offsets; its expectation computed here. */
typedef struct gemm_case {
    size_t m, n, k, count;
    int ta, tb;
    float alpha, beta;
    size_t pad_a, pad_b, pad_c;     /* row strides beyond the rows */
    size_t off_a, off_b, off_c;     /* element offsets */
    size_t gap;                     /* elements between batch entries, beyond one entry's extent */
    int shared_b;                   /* stride_b = 0 */
    size_t bias_off;                /* a bias row at this offset (0: none) */
    clattn_dtype type_a, type_b;    /* the operands' element types (F16 / BF16: the values rounded to them first) */
} gemm_case;

static size_t rows_a(const gemm_case *g) { return g->ta ? g->k : g->m; }
static size_t cols_a(const gemm_case *g) { return g->ta ? g->m : g->k; }
static size_t rows_b(const gemm_case *g) { return g->tb ? g->n : g->k; }
static size_t cols_b(const gemm_case *g) { return g->tb ? g->k : g->n; }

/* Run g on the core (and, with a nonzero lowered limits pointer, the device's limits lowered before the core
 * is built). sub: the operands as sub-buffers of larger buffers. Every element of C's buffer compared. */
static void run_case(clattn_device *dev, const clattn_gemm *core, const gemm_case *g, int dyadic, uint64_t seed,
                     int sub)
{
    tu_rng r = {seed};
    const size_t lda = cols_a(g) + g->pad_a, ldb = cols_b(g) + g->pad_b, ldc = g->n + g->pad_c;
    const size_t ea = (rows_a(g) - 1) * lda + cols_a(g), eb = (rows_b(g) - 1) * ldb + cols_b(g);
    const size_t ec = (g->m - 1) * ldc + g->n;
    const size_t sa = ea + g->gap, sb = g->shared_b ? 0 : eb + g->gap, sc = ec + g->gap;
    const size_t na = g->off_a + (g->count - 1) * sa + ea + 5, nb = g->off_b + (g->count - 1) * sb + eb + 5;
    const size_t nc = g->off_c + (g->count - 1) * sc + ec + 5;
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
    float *want = malloc(nc * sizeof *want), *bias = malloc((g->bias_off + g->n) * sizeof *bias);
    cr_assert(a && b && c && want && bias);
    /* a typed operand holds the values rounded to its type (the dyadic ones are exact in both), its expectation too */
    for (size_t i = 0; i < na; i++) a[i] = (float)tu_dtype_round(value(&r, dyadic), g->type_a);
    for (size_t i = 0; i < nb; i++) b[i] = (float)tu_dtype_round(value(&r, dyadic), g->type_b);
    for (size_t i = 0; i < g->bias_off + g->n; i++) bias[i] = value(&r, dyadic);
    /* C: NaN where beta = 0 (never read) and around C everywhere (never written); values where beta reads them */
    for (size_t i = 0; i < nc; i++) c[i] = g->beta == 0.0f ? NAN : value(&r, dyadic);
    memcpy(want, c, nc * sizeof *want);
    for (size_t e = 0; e < g->count; e++)
        for (size_t i = 0; i < g->m; i++)
            for (size_t j = 0; j < g->n; j++) {
                double s = 0;
                for (size_t kk = 0; kk < g->k; kk++) {
                    const size_t ia = g->off_a + e * sa + (g->ta ? kk * lda + i : i * lda + kk);
                    const size_t ib = g->off_b + e * sb + (g->tb ? j * ldb + kk : kk * ldb + j);
                    s += (double)a[ia] * (double)b[ib];
                }
                const size_t ic = g->off_c + e * sc + i * ldc + j;
                want[ic] = (float)((double)g->alpha * s + (g->beta == 0.0f ? 0.0 : (double)g->beta * (double)c[ic]) +
                                   (g->bias_off ? (double)bias[g->bias_off + j] : 0.0));
            }
    cl_context ctx = clattn_device_context(dev);
    cl_command_queue q = clattn_device_queue(dev);
    cl_int err;
    cl_mem mem[3], parent[3] = {NULL, NULL, NULL}, bmem = NULL;
    if (g->bias_off) {
        bmem = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, (g->bias_off + g->n) * 4, bias, &err);
        cr_assert_eq(err, CL_SUCCESS);
    }
    void *typed_a = tu_typed(a, na, g->type_a), *typed_b = tu_typed(b, nb, g->type_b);
    const void *host[3] = {typed_a, typed_b, c};
    const size_t count[3] = {na, nb, nc};
    const size_t es[3] = {clattn_dtype_size(g->type_a), clattn_dtype_size(g->type_b), 4};
    for (int i = 0; i < 3; i++) {
        if (sub) { /* a sub-buffer at an aligned origin inside a larger buffer */
            cl_uint align_bits = 0;
            cl_device_id id;
            clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof id, &id, NULL);
            clGetDeviceInfo(id, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
            const size_t origin = 3 * (align_bits / 8);
            parent[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, origin + count[i] * es[i] + 64, NULL, &err);
            cr_assert_eq(err, CL_SUCCESS);
            cl_buffer_region reg = {origin, count[i] * es[i]};
            mem[i] = clCreateSubBuffer(parent[i], CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &err);
            cr_assert_eq(err, CL_SUCCESS, "sub-buffer: %d", err);
        } else {
            mem[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, count[i] * es[i], NULL, &err);
            cr_assert_eq(err, CL_SUCCESS);
        }
        cr_assert_eq(clEnqueueWriteBuffer(q, mem[i], CL_TRUE, 0, count[i] * es[i], host[i], 0, NULL, NULL),
                     CL_SUCCESS);
    }
    const clattn_gemm_call call = {.m = g->m, .n = g->n, .k = g->k, .trans_a = g->ta, .trans_b = g->tb,
                                   .alpha = g->alpha, .beta = g->beta, .a = {mem[0], g->off_a},
                                   .b = {mem[1], g->off_b}, .c = {mem[2], g->off_c}, .lda = lda, .ldb = ldb,
                                   .ldc = ldc, .count = g->count, .stride_a = sa, .stride_b = sb, .stride_c = sc,
                                   .bias = {bmem, g->bias_off}, .type_a = g->type_a, .type_b = g->type_b,
                                   .what = "test GEMM"};
    /* a caller's sub-buffer reaching past CLBlast's index range, where sub-buffers beside it lose what is written
     * through them (caps.sibling_subbuffers: NVIDIA's OpenCL): refused before anything is enqueued */
    const size_t lim = dev->caps.blas_max_elems;
    const int sibling_refused = sub && core->core->uses_clblast && !dev->caps.sibling_subbuffers &&
                                (g->off_a + (g->count - 1) * sa + ea > lim || g->off_b + (g->count - 1) * sb + eb > lim ||
                                 g->off_c + (g->count - 1) * sc + ec > lim);
    const int typed = g->type_a != CLATTN_DTYPE_F32 || g->type_b != CLATTN_DTYPE_F32;
    if (typed && !core->core->reads_dtypes) { /* refused, nothing written: the caller widens the operands first */
        cr_assert_eq(clattn_gemm_run(core, &call), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "does not read"), "%s", clattn_last_error());
        for (size_t i = 0; i < nc; i++) want[i] = c[i];
    } else if (bmem && !core->core->adds_biases) { /* refused, nothing written: the caller fills C with the bias instead */
        cr_assert_eq(clattn_gemm_run(core, &call), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "bias"), "%s", clattn_last_error());
        for (size_t i = 0; i < nc; i++) want[i] = c[i];
    } else if (sibling_refused) {
        cr_assert_eq(clattn_gemm_run(core, &call), CLATTN_STATUS_UNSUPPORTED, "a sub-buffer past element %zu: %s", lim,
                     clattn_last_error());
        cr_assert(strstr(clattn_last_error(), "sub-buffer") && strstr(clattn_last_error(), "whole buffer"), "%s",
                  clattn_last_error());
        for (size_t i = 0; i < nc; i++) want[i] = c[i];
    } else {
        cr_assert_eq(clattn_gemm_run(core, &call), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    }
    cr_assert_eq(clFinish(q), CL_SUCCESS);
    float *got = malloc(nc * sizeof *got);
    cr_assert_eq(clEnqueueReadBuffer(q, mem[2], CL_TRUE, 0, nc * 4, got, 0, NULL, NULL), CL_SUCCESS);
    char desc[200];
    snprintf(desc, sizeof desc, "%s m=%zu n=%zu k=%zu count=%zu ta=%d tb=%d alpha=%g beta=%g ld+%zu/%zu/%zu "
             "off %zu/%zu/%zu%s%s%s A %s B %s", core->core->name, g->m, g->n, g->k, g->count, g->ta, g->tb, g->alpha,
             g->beta, g->pad_a, g->pad_b, g->pad_c, g->off_a, g->off_b, g->off_c, g->shared_b ? " shared B" : "",
             sub ? " sub-buffers" : "", g->bias_off ? " bias" : "", clattn_dtype_name(g->type_a),
             clattn_dtype_name(g->type_b));
    for (size_t i = 0; i < nc; i++) {
        if (isnan(want[i])) { /* outside C (or beta = 0 poison that C's elements replaced) */
            cr_assert(isnan(got[i]), "%s: element %zu outside C was written (%g)", desc, i, got[i]);
            continue;
        }
        const double tol = dyadic ? 0.0 : TU_ATOL + TU_RTOL * fabs((double)want[i]);
        cr_assert(fabs((double)got[i] - (double)want[i]) <= tol, "%s: element %zu: got %.9g, want %.9g", desc, i,
                  got[i], want[i]);
    }
    for (int i = 0; i < 3; i++) {
        clReleaseMemObject(mem[i]);
        if (parent[i]) clReleaseMemObject(parent[i]);
    }
    if (bmem) clReleaseMemObject(bmem);
    free(a), free(b), free(c), free(want), free(got), free(bias), free(typed_a), free(typed_b);
}

/* Every shape of `sizes` as m, n and k in turn with the others at fixed odd sizes, and a sweep of products; typed:
 * the operands' types in turn F16 and F16, BF16 and BF16, F16 and F32, F32 and BF16 (else both F32). */
static void shapes(clattn_device *dev, const clattn_gemm *core, int dyadic, int sub, int typed)
{
    static const clattn_dtype types[4][2] = {{CLATTN_DTYPE_F16, CLATTN_DTYPE_F16},
                                             {CLATTN_DTYPE_BF16, CLATTN_DTYPE_BF16},
                                             {CLATTN_DTYPE_F16, CLATTN_DTYPE_F32},
                                             {CLATTN_DTYPE_F32, CLATTN_DTYPE_BF16}};
    static const size_t sizes[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 48, 61, 64, 65, 100, 130, 257, 300};
    const size_t ns = sizeof sizes / sizeof sizes[0];
    uint64_t seed = 1;
    for (int t = 0; t < 4; t++) {
        const int ta = t & 1, tb = t >> 1;
        for (size_t i = 0; i < ns; i++) {
            const gemm_case cases[3] = {
                {.m = sizes[i], .n = 37, .k = 29, .count = 1, .ta = ta, .tb = tb, .alpha = 1, .beta = 0},
                {.m = 23, .n = sizes[i], .k = 41, .count = 1, .ta = ta, .tb = tb, .alpha = 0.5f, .beta = 1,
                 .pad_a = 3, .pad_c = 5, .off_a = 7, .off_c = 11},
                {.m = 19, .n = 45, .k = sizes[i], .count = 1, .ta = ta, .tb = tb, .alpha = -2, .beta = -0.75f,
                 .pad_b = 2, .off_b = 13, .bias_off = 1 + i % 5},
            };
            for (int c = 0; c < 3; c++) {
                gemm_case g = cases[c];
                if (typed) g.type_a = types[(i + c) % 4][0], g.type_b = types[(i + c) % 4][1];
                run_case(dev, core, &g, dyadic, seed++, sub);
            }
        }
    }
}

Test(gemm, shapes_exact)
{
    fixture f = fixture_open();
    shapes(f.dev, &f.core, 1, 0, 0);
    /* larger products, every transposition, C accumulated (beta = 1) and written (beta = 0) */
    uint64_t seed = 100;
    for (int t = 0; t < 4; t++) {
        const gemm_case g = {.m = 300, .n = 257, .k = 300, .count = 1, .ta = t & 1, .tb = t >> 1, .alpha = 1,
                             .beta = t == 2 ? 0.0f : 1.0f, .pad_a = 1, .pad_b = 17, .pad_c = 3, .off_c = 1,
                             .bias_off = t == 3 ? 0 : 2};
        run_case(f.dev, &f.core, &g, 1, seed++, 0);
    }
    fixture_close(&f);
}

/* F16 and BF16 operands (a half plan's inputs and weights, read as they are by a core with reads_dtypes): every shape
 * of shapes_exact with dyadic values (exact in both types: the core must widen them exactly), at element offsets
 * that are odd in 16-bit units, strided batches, sub-buffers and ordinary floats rounded to the types. A core
 * without reads_dtypes (CLBlast) refuses every such call, C untouched. */
Test(gemm, typed_operands)
{
    fixture f = fixture_open();
    shapes(f.dev, &f.core, 1, 0, 1);
    uint64_t seed = 600;
    const gemm_case cases[] = {
        {.m = 61, .n = 61, .k = 8, .count = 3, .tb = 1, .alpha = 1, .beta = 0, .off_a = 3, .off_b = 5, .gap = 1,
         .type_a = CLATTN_DTYPE_F16, .type_b = CLATTN_DTYPE_BF16},
        {.m = 40, .n = 33, .k = 50, .count = 4, .ta = 1, .tb = 1, .alpha = 1, .beta = 1, .shared_b = 1, .gap = 3,
         .type_a = CLATTN_DTYPE_BF16, .type_b = CLATTN_DTYPE_F16},
        {.m = 130, .n = 192, .k = 64, .count = 1, .tb = 1, .alpha = 1, .beta = 0, .bias_off = 3,
         .type_a = CLATTN_DTYPE_F16, .type_b = CLATTN_DTYPE_F16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(f.dev, &f.core, &cases[i], 1, seed++, 0);
        run_case(f.dev, &f.core, &cases[i], 1, seed++, 1);
        run_case(f.dev, &f.core, &cases[i], 0, seed++, 0);
    }
    fixture_close(&f);
}

Test(gemm, batches)
{
    fixture f = fixture_open();
    uint64_t seed = 200;
    /* the unfused core's: scores Q K^T over (b, h) pairs and the context W V */
    static const size_t shape[][3] = {{61, 61, 8}, {61, 8, 61}, {1, 130, 64}, {130, 1, 3}, {33, 17, 300}};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        for (int t = 0; t < 4; t++) {
            const gemm_case g = {.m = shape[i][0], .n = shape[i][1], .k = shape[i][2], .count = 3 + i, .ta = t & 1,
                                 .tb = t >> 1, .alpha = t == 3 ? 0.125f : 1.0f, .beta = t == 1 ? 1.0f : 0.0f,
                                 .gap = i, .off_a = 2, .off_b = 3, .off_c = 4, .pad_c = i % 2};
            run_case(f.dev, &f.core, &g, 1, seed++, 0);
        }
    const gemm_case shared = {.m = 40, .n = 33, .k = 50, .count = 4, .tb = 1, .alpha = 1, .beta = 0,
                              .shared_b = 1, .gap = 3};
    run_case(f.dev, &f.core, &shared, 1, seed++, 0);
    fixture_close(&f);
}

Test(gemm, floats_at_the_tolerance)
{
    fixture f = fixture_open();
    /* nn.Linear-like: x (m, k) W^T, W (n, k); and the attention shapes */
    const gemm_case cases[] = {
        {.m = 130, .n = 192, .k = 64, .count = 1, .tb = 1, .alpha = 1, .beta = 1},
        {.m = 130, .n = 192, .k = 64, .count = 1, .tb = 1, .alpha = 1, .beta = 0, .bias_off = 3},
        {.m = 61, .n = 61, .k = 16, .count = 6, .tb = 1, .alpha = 0.25f, .beta = 0},
        {.m = 61, .n = 16, .k = 61, .count = 6, .alpha = 1, .beta = 0},
        {.m = 7, .n = 300, .k = 100, .count = 1, .ta = 1, .tb = 1, .alpha = 1, .beta = 0, .off_a = 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(f.dev, &f.core, &cases[i], 0, 300 + i, 0);
    fixture_close(&f);
}

/* The device's limits lowered before the core is built: for gemm_tiles one allocation of 6000 floats (it packs
 * in blocks of rows, columns, depth and batch entries), for CLBlast its index range at 20000 elements with
 * operands beyond it (sub-buffers, row blocks); launches of at most 7 work-items; the operands as sub-buffers too. */
Test(gemm, lowered_limits)
{
    fixture f = fixture_open();
    const int clblast = strcmp(f.inst.core->name, "gemm_clblast") == 0;
    clattn_core_destroy(&f.inst);
    clattn_device *dev = f.dev;
    /* CLBlast pads its operands to 128 in temporaries (runtime/blas.c): its limit is the index range */
    const size_t lim = 20000; /* CLBlast's index range (its B operand is never split: it must fit whole) */
    /* one call's limit is the index range less the base alignment (room for a sub-buffer's residual offset:
     * runtime/blas.c's call_limit): 32 floats on PoCL, 128 on NVIDIA's OpenCL. Set so that it is lim - 32 on every
     * device, as the cases are sized: the third's transposed A (20000 elements) then goes in row blocks, one row of it
     * (19901) fitting */
    if (clblast) dev->caps.blas_max_elems = lim - 32 + dev->caps.base_align / sizeof(float);
    else dev->caps.max_alloc = 6000 * sizeof(float);
    dev->caps.max_launch_items = 7;
    f.inst = gemm_core(dev);
    f.core = (clattn_gemm){f.inst.core, f.inst.state};
    clattn_test_launch_reach(1);
    clattn_test_blas_reach(1);
    uint64_t seed = 400;
    const gemm_case cases[] = {
        {.m = 70, .n = 90, .k = 130, .count = 1, .tb = 1, .alpha = 1, .beta = 0, .off_a = lim + 1, .off_c = lim + 3},
        {.m = 33, .n = 20, .k = 77, .count = 5, .ta = 1, .alpha = 1, .beta = 1, .off_b = lim + 100, .gap = 1},
        {.m = 100, .n = 3, .k = 200, .count = 2, .ta = 1, .tb = 1, .alpha = -1, .beta = 0},
        {.m = 5, .n = 130, .k = 9, .count = 1, .alpha = 2, .beta = 0.5f, .pad_c = 4},
        {.m = 37, .n = 50, .k = 500, .count = 1, .tb = 1, .alpha = 1, .beta = 0, .bias_off = 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(dev, &f.core, &cases[i], 1, seed++, 0);
        run_case(dev, &f.core, &cases[i], 1, seed++, 1);
    }
    /* where sub-buffers beside a caller's lose their writes (NVIDIA's OpenCL; here by setting the fact), the cases
     * whose operands pass the limit are refused in sub-buffers, nothing written, and still computed in whole buffers;
     * a case within the limit (the fourth) still computed in sub-buffers */
    if (clblast && dev->caps.sibling_subbuffers) {
        dev->caps.sibling_subbuffers = 0;
        for (size_t i = 0; i < 4; i++) {
            if (i == 2) continue; /* its A reaches past the limit too: nothing the first two do not cover */
            run_case(dev, &f.core, &cases[i], 1, seed++, 1);
            run_case(dev, &f.core, &cases[i], 1, seed++, 0);
        }
        dev->caps.sibling_subbuffers = 1;
    }
    const size_t launches = clattn_test_launch_reach(0), reach = clattn_test_blas_reach(0);
    if (clblast) {
        cr_assert(reach > 0 && reach <= dev->caps.blas_max_elems, "a CLBlast call touched element %zu (index range %zu)",
                  reach, dev->caps.blas_max_elems);
    } else {
        cr_assert(launches > 0 && launches <= 7, "a launch of %zu work-items (limit 7)", launches);
        cr_assert_eq(reach, 0u, "%s called CLBlast", f.inst.core->name);
    }
    fixture_close(&f);
}

Test(gemm, shapes_sub_buffers)
{
    fixture f = fixture_open();
    uint64_t seed = 500;
    for (int t = 0; t < 4; t++) {
        const gemm_case g = {.m = 45, .n = 67, .k = 33, .count = 2, .ta = t & 1, .tb = t >> 1, .alpha = 1,
                             .beta = 0, .off_a = 5, .off_b = 6, .off_c = 7, .gap = 2};
        run_case(f.dev, &f.core, &g, 1, seed++, 1);
    }
    fixture_close(&f);
}

Test(gemm, refusals)
{
    fixture f = fixture_open();
    float host[64];
    for (int i = 0; i < 64; i++) host[i] = 7.0f;
    cl_int err;
    cl_mem m = clCreateBuffer(clattn_device_context(f.dev), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host,
                              &err);
    cr_assert_eq(err, CL_SUCCESS);
    const clattn_gemm_call ok = {.m = 2, .n = 2, .k = 2, .alpha = 1, .a = {m, 0}, .b = {m, 8}, .c = {m, 16},
                                 .lda = 2, .ldb = 2, .ldc = 2, .count = 1, .what = "the refused GEMM"};
    clattn_gemm_call bad[7] = {ok, ok, ok, ok, ok, ok, ok};
    bad[0].m = 0, bad[1].k = 0, bad[2].count = 0, bad[3].lda = 1, bad[4].ldc = 1, bad[5].trans_b = 1, bad[5].ldb = 1;
    bad[6].type_b = (clattn_dtype)3;
    for (int i = 0; i < 7; i++) {
        cr_assert_eq(clattn_gemm_run(&f.core, &bad[i]), CLATTN_STATUS_INVALID_ARGUMENT, "case %d", i);
        cr_assert(strstr(clattn_last_error(), "the refused GEMM"), "case %d: %s", i, clattn_last_error());
    }
    /* operands that end past the buffer's 64 floats by one element (and a batch whose stride overflows size_t):
     * SHAPE_MISMATCH naming the GEMM and the operand, nothing enqueued */
    clattn_gemm_call past[6] = {ok, ok, ok, ok, ok, ok};
    past[0].c.off = 61;                                          /* C: 61 + 2 + 2 */
    past[1].c.off = 59, past[1].ldc = 4;                         /* C's row stride: 59 + 4 + 2 */
    past[2].count = 2, past[2].stride_c = 45;                    /* C's second product: 16 + 45 + 2 + 2 */
    past[3].count = 2, past[3].stride_b = 53;                    /* B's second product: 8 + 53 + 2 + 2 */
    past[4].trans_a = 1, past[4].k = 3, past[4].a.off = 59;      /* A stored (k, m) = (3, 2): 59 + 2 * 2 + 2 */
    past[5].count = 3, past[5].stride_a = (size_t)-1 / 2 + 1;    /* (count - 1) * stride overflows */
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(clattn_gemm_run(&f.core, &past[i]), CLATTN_STATUS_SHAPE_MISMATCH, "past %d: %s", i,
                     clattn_last_error());
        cr_assert(strstr(clattn_last_error(), "the refused GEMM: operand ") &&
                      strstr(clattn_last_error(), "does not fit its buffer of 256 bytes"),
                  "past %d: %s", i, clattn_last_error());
    }
    cr_assert(strstr((clattn_gemm_run(&f.core, &past[4]), clattn_last_error()), "operand A"));
    float back[64];
    cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(f.dev), m, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL),
                 CL_SUCCESS);
    for (int i = 0; i < 64; i++) cr_assert_eq(back[i], 7.0f, "element %d written by a refused call", i);
    /* the last products of a batch that ends exactly at the buffer's end: computed (7 * 7 * 2 = 98) */
    clattn_gemm_call fits = ok;
    fits.count = 2, fits.stride_c = 44, fits.stride_b = 0;       /* C at 16 and 60: 60 + 2 + 2 = 64 */
    cr_assert_eq(clattn_gemm_run(&f.core, &fits), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(f.dev), m, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL),
                 CL_SUCCESS);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(back[i], (i >= 16 && i < 20) || i >= 60 ? 98.0f : 7.0f, "element %d", i);
    const clattn_gemm none = {NULL, NULL};
    cr_assert_eq(clattn_gemm_run(&none, &ok), CLATTN_STATUS_INVALID_ARGUMENT);
    clReleaseMemObject(m);
    fixture_close(&f);
}
