/* linear.c: the projections' helpers on an OpenCL device, one set for every plan (attention, decode,
 * encoder): weights and biases concatenated into one buffer, the plan's GEMM core (chosen by select.c), and
 * y = x W^T + b as a bias fill and a GEMM with beta = 1, or for a decode step's few rows linear_small (CPUs) or
 * linear_gemv (GPUs) (cl/attention/linear.cl). */
#include "attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* linear_gemv's shape (cl/attention/linear.cl's defaults): 64 work-items, 32 lanes along k, 4 columns per
 * group of lanes: 8 columns per work-group, so that a decode step's 6144 projection columns (E = 4096, 32 + 2
 * x 8 heads of 128) are 768 work-groups; 16 KiB of local memory for the lanes' partial sums of 16 rows. */
#define GEMV_WG 64
#define GEMV_LK 32
#define GEMV_COLS 4
/* grad_colsum's and grad_sum_blocks' columns per work-item on CPUs: a cache line of each row (PoCL, B4 T1024 E512
 * H8, each kernel timed alone: a bias gradient 3.2 ms with one column per work-item, 0.5 with 16; the sum of Q, K
 * and V's gradient blocks 5-6.6 ms with one element per work-item, 1.4 with 16; bench/results/pocl-2core-reshape.md) */
#define COLSUM_CW_CPU 16

clattn_status clattn_linear_build(const clattn_device *dev, const clattn_attention_desc *d, clattn_linear *l)
{
    memset(l, 0, sizeof *l);
    l->dev = dev;
    TRY(clattn_core_create(dev, CLATTN_CORE_GEMM, d, NULL, 0, &l->gemm_core));
    l->gemm = (clattn_gemm){l->gemm_core.core, l->gemm_core.state};
    const char *src[] = {"common/half", "common/dtype", "attention/linear"};
    char opts[192];
    l->colsum_cw = dev->caps.dclass == CLATTN_CLASS_CPU ? COLSUM_CW_CPU : 1;
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DVW=8 -DGV_WG=%d -DGV_LK=%d -DGV_COLS=%d -DGV_MAXR=%d -DCW=%zu",
             GEMV_WG, GEMV_LK, GEMV_COLS, CLATTN_LINEAR_SMALL_ROWS, l->colsum_cw);
    TRY(clattn_program_build(dev, src, 3, opts, &l->prog));
    TRY(clattn_kernel_create(l->prog, "fill_rows", &l->fill));
    TRY(clattn_kernel_create(l->prog, "grad_colsum", &l->colsum));
    TRY(clattn_kernel_create(l->prog, "grad_sum_blocks", &l->sum_blocks));
    TRY(clattn_kernel_create(l->prog, "dtype_widen", &l->widen));
    TRY(clattn_kernel_create(l->prog, "dtype_narrow", &l->narrow));
    /* a CPU runs linear_small's work-items one after another, each streaming its own weight row; a GPU
     * runs them side by side, where only linear_gemv's reads are coalesced */
    l->gemv = dev->caps.dclass != CLATTN_CLASS_CPU;
    const char *env = getenv("CLATTN_FEW_ROWS"); /* tests and benchmarks: either kernel on any device */
    if (env && *env) {
        if (strcmp(env, "gemv") && strcmp(env, "small"))
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_FEW_ROWS='%.40s': the values are gemv and "
                               "small (unset: by the device's class)", env);
        l->gemv = strcmp(env, "gemv") == 0;
    }
    return clattn_kernel_create(l->prog, l->gemv ? "linear_gemv" : "linear_small", &l->small);
}

void clattn_linear_release(clattn_linear *l)
{
    clattn_core_destroy(&l->gemm_core);
    l->gemm = (clattn_gemm){NULL, NULL};
    clattn_kernel_release(&l->fill);
    clattn_kernel_release(&l->small);
    clattn_kernel_release(&l->colsum);
    clattn_kernel_release(&l->sum_blocks);
    clattn_kernel_release(&l->widen);
    clattn_kernel_release(&l->narrow);
    clattn_program_release(&l->prog);
}

clattn_status clattn_linear_fill(const clattn_linear *l, clattn_view dst, cl_mem bias, size_t rows, size_t cols)
{
    clattn_args a;
    clattn_args_begin(&a, l->fill, "fill_rows");
    clattn_arg_view(&a, dst);
    clattn_arg_mem(&a, bias);
    clattn_arg_u32(&a, (cl_uint)cols);
    clattn_arg_u64(&a, rows * cols);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(l->dev, l->fill, rows * cols, "enqueue fill_rows");
}

clattn_status clattn_linear_convert(const clattn_linear *l, clattn_view src, clattn_view dst, size_t n, clattn_dtype t,
                                    int narrow)
{
    if (n == 0) return CLATTN_STATUS_SUCCESS;
    cl_kernel k = narrow ? l->narrow : l->widen;
    const char *name = narrow ? "dtype_narrow" : "dtype_widen";
    clattn_args a;
    clattn_args_begin(&a, k, name);
    clattn_arg_view(&a, src);
    clattn_arg_view(&a, dst);
    clattn_arg_u64(&a, n);
    clattn_arg_u32(&a, t == CLATTN_DTYPE_F16 ? 1u : 2u);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(l->dev, k, n, narrow ? "enqueue dtype_narrow" : "enqueue dtype_widen");
}

/* The loop iterations of one work-item of linear_small (VW 8) or linear_gemv for m rows and k columns of x, every
 * loop counted whether or not a compiler unrolls it (core.h's trips). */
static size_t small_pass_trips(size_t nr, size_t k)
{
    const size_t kv = k / 8;
    return 2 * nr + (kv + (k - kv * 8)) * (1 + nr); /* the accumulators set and stored; the vectors and the tail */
}

static size_t linear_few_trips(const clattn_linear *l, size_t m, size_t k)
{
    if (l->gemv) {
        const size_t kv = k / 4, per_row = 1 + GEMV_COLS, groups = GEMV_WG / GEMV_LK;
        const size_t rows = CLATTN_LINEAR_SMALL_ROWS, sums = groups * rows * GEMV_COLS;
        return GEMV_COLS + 2 * rows * per_row + (kv + GEMV_LK - 1) / GEMV_LK * (1 + GEMV_COLS + rows * per_row) +
               (k % 4 ? 1 + rows * per_row : 0) + (sums + GEMV_WG - 1) / GEMV_WG * (1 + GEMV_LK);
    }
    size_t t = m / 8 * (1 + small_pass_trips(8, k)), r = m % 8;
    for (size_t nr = 4; nr; nr /= 2)
        if (r >= nr) t += small_pass_trips(nr, k), r -= nr;
    return t;
}

static clattn_status linear_small(const clattn_linear *l, size_t m, size_t n, size_t k, clattn_view x, cl_mem w,
                                  cl_mem bias, clattn_view y, int warm)
{
    if (!warm) clattn_note_trips(linear_few_trips(l, m, k));
    clattn_args a;
    clattn_args_begin(&a, l->small, "linear_small");
    clattn_arg_view(&a, x);
    clattn_arg_u32(&a, (cl_uint)k);
    clattn_arg_mem(&a, w);
    clattn_arg_mem(&a, bias);
    clattn_arg_u32(&a, bias != NULL);
    clattn_arg_view(&a, y);
    clattn_arg_u32(&a, (cl_uint)n);
    clattn_arg_u32(&a, (cl_uint)m);
    clattn_arg_u32(&a, warm ? 0 : (cl_uint)n);
    clattn_arg_u32(&a, (cl_uint)k);
    TRY(clattn_args_end(&a));
    if (warm && clattn_device_simulated(l->dev)) return CLATTN_STATUS_SUCCESS; /* nothing runs there */
    if (!warm) TRY(clattn_device_runs(l->dev, "enqueue linear_gemv"));
    if (l->gemv) {
        /* warm: one work-group with n = 0, which returns at once */
        const size_t cols = GEMV_COLS * GEMV_WG / GEMV_LK, groups = warm ? 1 : (n + cols - 1) / cols;
        size_t local = GEMV_WG, global = groups * GEMV_WG;
        clattn_note_launch(global);
        CL_CHECK(clEnqueueNDRangeKernel(l->dev->queue, l->small, 1, NULL, &global, &local, 0, NULL, NULL),
                 "enqueue linear_gemv");
        return CLATTN_STATUS_SUCCESS;
    }
    return clattn_enqueue_1d(l->dev, l->small, warm ? 0 : n, "enqueue linear_small");
}

clattn_status clattn_linear_run(const clattn_linear *l, size_t m, size_t n, size_t k, clattn_view x, cl_mem w,
                                cl_mem bias, clattn_view y, int few_rows, int warm, const char *what)
{
    /* a few rows by their own kernel, unless its loops would run past the device's limit: then by the GEMM core,
     * which cuts k into blocks within it */
    if (few_rows && (warm || (m <= CLATTN_LINEAR_SMALL_ROWS &&
                              linear_few_trips(l, m, k) <= clattn_loop_budget(&l->dev->caps))))
        return linear_small(l, m, n, k, x, w, bias, y, warm);
    return clattn_linear_run_typed(l, m, n, k, x, CLATTN_DTYPE_F32, w, CLATTN_DTYPE_F32, bias, y, what);
}

int clattn_linear_reads_dtypes(const clattn_linear *l) { return l->gemm.core && l->gemm.core->reads_dtypes; }

clattn_status clattn_linear_run_typed(const clattn_linear *l, size_t m, size_t n, size_t k, clattn_view x,
                                      clattn_dtype tx, cl_mem w, clattn_dtype tw, cl_mem bias, clattn_view y,
                                      const char *what)
{
    /* the bias: added by the GEMM core as it stores C, or C filled with it first and the product added (beta 1) */
    const int fused = l->gemm.core->adds_biases;
    if (bias && !fused) TRY(clattn_linear_fill(l, y, bias, m, n));
    const clattn_gemm_call c = {.m = m, .n = n, .k = k, .trans_b = 1, .alpha = 1.0f, .beta = bias && !fused ? 1.0f : 0.0f,
                                .a = x, .b = {w, 0}, .c = y, .lda = k, .ldb = k, .ldc = n, .count = 1,
                                .bias = {fused ? bias : NULL, 0}, .type_a = tx, .type_b = tw, .what = what};
    return clattn_gemm_run(&l->gemm, &c);
}

clattn_status clattn_linear_grad_weight(const clattn_linear *l, clattn_view dy, size_t ldy, clattn_view x, size_t ldx,
                                        clattn_dtype tx, size_t rows, size_t m, size_t n, clattn_layout layout,
                                        clattn_view out, const char *what)
{
    const int raw = layout == CLATTN_LAYOUT_RAW;
    const clattn_gemm_call c = {.m = raw ? n : m, .n = raw ? m : n, .k = rows, .trans_a = 1, .alpha = 1.0f,
                                .a = raw ? x : dy, .b = raw ? dy : x, .c = out, .lda = raw ? ldx : ldy,
                                .ldb = raw ? ldy : ldx, .ldc = raw ? m : n, .count = 1,
                                .type_a = raw ? tx : CLATTN_DTYPE_F32, .type_b = raw ? CLATTN_DTYPE_F32 : tx,
                                .what = what};
    return clattn_gemm_run(&l->gemm, &c);
}

clattn_status clattn_linear_colsum(const clattn_linear *l, clattn_view src, size_t ld, size_t rows, size_t cols,
                                   clattn_view out)
{
    /* one work-item per column loops over the rows: in blocks of rows that keep it within the device's loop limit,
     * each launch adding its block's sums to the last's (one launch where there is no limit) */
    const size_t budget = clattn_loop_budget(&l->dev->caps), block = rows < budget ? rows : budget;
    size_t r0 = 0;
    do {
        const size_t n = rows - r0 < block ? rows - r0 : block;
        clattn_args a;
        clattn_args_begin(&a, l->colsum, "grad_colsum");
        clattn_arg_view(&a, (clattn_view){src.mem, src.off + r0 * ld});
        clattn_arg_u32(&a, (cl_uint)ld);
        clattn_arg_u64(&a, n);
        clattn_arg_u32(&a, (cl_uint)cols);
        clattn_arg_view(&a, out);
        clattn_arg_u32(&a, r0 > 0);
        TRY(clattn_args_end(&a));
        clattn_note_trips(n);
        const size_t items = (cols + l->colsum_cw - 1) / l->colsum_cw;
        TRY(l->colsum_cw > 1 ? clattn_enqueue_items(l->dev, l->colsum, items, "enqueue grad_colsum")
                             : clattn_enqueue_1d(l->dev, l->colsum, items, "enqueue grad_colsum"));
        r0 += n;
    } while (r0 < rows);
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_linear_sum_blocks(const clattn_linear *l, clattn_view src, size_t src_ld, size_t blocks,
                                       size_t width, clattn_view dst, size_t dst_ld, size_t rows)
{
    clattn_args a;
    clattn_args_begin(&a, l->sum_blocks, "grad_sum_blocks");
    clattn_arg_view(&a, src);
    clattn_arg_u32(&a, (cl_uint)src_ld);
    clattn_arg_u32(&a, (cl_uint)blocks);
    clattn_arg_u32(&a, (cl_uint)width);
    clattn_arg_view(&a, dst);
    clattn_arg_u32(&a, (cl_uint)dst_ld);
    const size_t items = rows * ((width + l->colsum_cw - 1) / l->colsum_cw);
    clattn_arg_u64(&a, items);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(l->dev, l->sum_blocks, items, "enqueue grad_sum_blocks");
}

void clattn_linear_gemm_describe(const clattn_linear *l, const char **name, char *params, size_t len)
{
    const clattn_core *c = l->gemm_core.core;
    *name = c ? c->name : "";
    if (c) clattn_core_params_format(c, &l->gemm_core.params, params, len);
    else if (len) params[0] = '\0';
}

clattn_status clattn_upload_blocks(const clattn_device *dev, const float *const *parts, const size_t *rows, int n,
                                   size_t cols, const char *what, cl_mem *out)
{
    return clattn_upload_blocks_typed(dev, parts, rows, n, cols, CLATTN_DTYPE_F32, what, out);
}

clattn_status clattn_upload_blocks_typed(const clattn_device *dev, const float *const *parts, const size_t *rows,
                                         int n, size_t cols, clattn_dtype t, const char *what, cl_mem *out)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += rows[i];
    float *buf = clattn_calloc(total * cols, sizeof *buf);
    if (!buf) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "concatenating %s", what);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (parts[i]) memcpy(buf + at, parts[i], rows[i] * cols * sizeof *buf);
        at += rows[i] * cols;
    }
    void *host = buf;
    if (t != CLATTN_DTYPE_F32) { /* the 16-bit elements (exact: a half plan's fp32 copies were widened from them) */
        uint16_t *h = clattn_calloc(total * cols > 0 ? total * cols : 1, sizeof *h);
        if (!h) {
            free(buf);
            return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "narrowing %s", what);
        }
        clattn_dtype_narrow(buf, total * cols, t, h);
        free(buf);
        host = h;
    }
    const clattn_status st = clattn_buffer_put(dev, total * cols, clattn_dtype_size(t), host, what, out);
    free(host);
    return st;
}
