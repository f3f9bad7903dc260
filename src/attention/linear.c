/* linear.c: the projections' helpers on an OpenCL device, one set for every plan (attention, decode,
 * encoder): weights and biases concatenated into one buffer, and y = x W^T + b as a bias fill and a CLBlast
 * GEMM with beta = 1, or for a decode step's few rows linear_small (cl/attention/linear.cl). */
#include "attention.h"

#include <stdlib.h>
#include <string.h>

clattn_status clattn_linear_build(const clattn_device *dev, clattn_linear *l)
{
    memset(l, 0, sizeof *l);
    l->dev = dev;
    const char *src[] = {"attention/linear"};
    TRY(clattn_program_build(dev, src, 1, "-cl-std=CL1.2 -DVW=8", &l->prog));
    TRY(clattn_kernel_create(l->prog, "fill_rows", &l->fill));
    return clattn_kernel_create(l->prog, "linear_small", &l->small);
}

void clattn_linear_release(clattn_linear *l)
{
    clattn_kernel_release(&l->fill);
    clattn_kernel_release(&l->small);
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

static clattn_status linear_small(const clattn_linear *l, size_t m, size_t n, size_t k, clattn_view x, cl_mem w,
                                  cl_mem bias, clattn_view y, int warm)
{
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
    return clattn_enqueue_1d(l->dev, l->small, warm ? 0 : n, "enqueue linear_small");
}

clattn_status clattn_linear_run(const clattn_linear *l, size_t m, size_t n, size_t k, clattn_view x, cl_mem w,
                                cl_mem bias, clattn_view y, int few_rows, int warm, const char *what)
{
    if (few_rows && (m <= CLATTN_LINEAR_SMALL_ROWS || warm)) return linear_small(l, m, n, k, x, w, bias, y, warm);
    if (bias) TRY(clattn_linear_fill(l, y, bias, m, n));
    return clattn_blas_sgemm(l->dev, CLBlastTransposeYes, m, n, k, 1.0f, x.mem, x.off, k, w, 0, k, bias ? 1.0f : 0.0f,
                             y.mem, y.off, n, what);
}

clattn_status clattn_upload_blocks(const clattn_device *dev, const float *const *parts, const size_t *rows, int n,
                                   size_t cols, const char *what, cl_mem *out)
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
    const clattn_status st = clattn_buffer_new(dev, total * cols, sizeof(float), buf, what, out);
    free(buf);
    return st;
}
