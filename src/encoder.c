/* encoder.c: the transformer encoder layer (torch.nn.TransformerEncoderLayer,
 * batch_first, eval mode): validation, plan, and the OpenCL pass.
 *
 * The plan holds an attention plan (the self-attention with its output
 * projection) and the rest of the layer. On an OpenCL device (N = B*T rows):
 *
 *   post-norm                                   pre-norm
 *   1. a = SA(x)         attention plan         1. n = LN1(x)        residual_layernorm
 *   2. y = LN1(x + a)    residual_layernorm     2. a = SA(n)         attention plan
 *   3. h = y W1^T        CLBlast SGEMM          3. y = x + a, n = LN2(y)   residual_layernorm
 *      h = act(h + b1)   bias_act               4. h = act(n W1^T + b1)    SGEMM + bias_act
 *   4. a = h W2^T        CLBlast SGEMM          5. a = h W2^T        SGEMM
 *   5. out = LN2(y + a + b2)  residual_layernorm 6. out = y + a + b2  residual_bias
 *
 * Everything stays on the device between the input upload and the output read.
 */
#include "backend.h"
#include "reference.h"

#include <clblast_c.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef clattn_view view;

typedef struct ln_kernel {
    cl_program prog;
    cl_kernel k;
    size_t wg;
    int cache_row;
} ln_kernel;

struct clattn_encoder_cl {
    ln_kernel ln1, ln2;
    cl_program ffn_prog;
    cl_kernel k_act, k_resid;
    /* weights */
    cl_mem ln1_w, ln1_b, w_ff1, b_ff1, w_ff2, b_ff2, ln2_w, ln2_b;
    /* workspace: a (N, E) is the attention output, then the second GEMM's; y (N, E) the residual
     * stream after the first block; n (N, E) pre-norm's normalised inputs; h (N, F) the hidden layer */
    cl_mem a, y, n, h;
    /* staging for execution from host arrays */
    cl_mem x_in, kpm_in, out_buf;
};

/* ---------------------------------------------------------------- validation */

static clattn_status validate(const clattn_encoder_desc *in, const clattn_encoder_weights *w, clattn_encoder_desc *d)
{
    *d = *in;
    const clattn_attention_desc *a = &d->attn;
    if (a->cross != 0)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.attn.cross must be 0: the encoder layer is self-attention");
    if (isnan(a->dropout))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.attn.dropout is NaN (it must be 0)");
    if (a->dropout != 0.0f)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED,
                           "desc.attn.dropout is %g: the encoder layer runs in eval mode only (dropout must be 0)",
                           (double)a->dropout);
    if (a->attn_mask != CLATTN_MASK_NONE)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT,
                           "desc.attn.attn_mask must be CLATTN_MASK_NONE: the encoder layer takes causal and "
                           "key_padding_mask only");
    if (d->ff_dim == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.ff_dim must be >= 1");
    if (d->activation != CLATTN_ACTIVATION_RELU && d->activation != CLATTN_ACTIVATION_GELU)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT,
                           "desc.activation %d is not CLATTN_ACTIVATION_RELU or CLATTN_ACTIVATION_GELU",
                           (int)d->activation);
    if ((unsigned)d->norm_first > 1)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.norm_first must be 0 or 1, got %d", d->norm_first);
    if (!(isfinite(d->eps) && d->eps >= 0.0f))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.eps must be finite and > 0 (0 = 1e-5), got %g",
                           (double)d->eps);
    if (d->eps == 0.0f) d->eps = 1e-5f;
    if (!w->attn.w_out)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT,
                           "weights.attn.w_out is NULL: the encoder layer needs the attention's output projection");
    if (a->out_dim != a->embed)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "desc.attn.out_dim (%zu) must equal desc.attn.embed (%zu)",
                           a->out_dim, a->embed);
    const struct { const float *p; const char *name; } need[] = {
        {w->ln1_weight, "ln1_weight"}, {w->ln1_bias, "ln1_bias"}, {w->w_ff1, "w_ff1"}, {w->b_ff1, "b_ff1"},
        {w->w_ff2, "w_ff2"},           {w->b_ff2, "b_ff2"},       {w->ln2_weight, "ln2_weight"},
        {w->ln2_bias, "ln2_bias"}};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i].p) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights.%s is NULL", need[i].name);

    /* sizes of the encoder's own buffers (the attention plan checks its own) */
    size_t n, rows;
    const size_t E = a->embed, F = d->ff_dim;
    if (clattn_mul_overflows(a->batch, a->seq_q, &rows) || clattn_mul_overflows(rows, E, &n) ||
        clattn_mul_overflows(n, 4 * sizeof(float), &n) || clattn_mul_overflows(rows, F, &n) ||
        clattn_mul_overflows(n, sizeof(float), &n) || clattn_mul_overflows(F, E, &n) ||
        clattn_mul_overflows(n, 2 * sizeof(float), &n))
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "the encoder's buffers for these dimensions overflow size_t");
    if (F > 0xFFFFFFFFu || E > 0xFFFFFFFFu)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "ff_dim or embed exceeds 2^32-1");
    return CLATTN_STATUS_SUCCESS;
}

/* The encoder's device memory, checked before any device work. */
static clattn_status check_device_memory(const clattn_device *dev, const clattn_encoder_desc *d)
{
    const size_t rows = d->attn.batch * d->attn.seq_q, E = d->attn.embed, F = d->ff_dim;
    const struct { size_t floats; const char *what; } big[] = {
        {rows * F, "the feed-forward hidden layer (B*T x ff_dim floats)"},
        {rows * E, "one (B*T x embed) activation"},
        {F * E, "one feed-forward weight (ff_dim x embed floats)"}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        if (big[i].floats * sizeof(float) > dev->max_alloc)
            return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                               "%s needs %zu bytes, more than the device's max allocation (%zu bytes)", big[i].what,
                               big[i].floats * sizeof(float), dev->max_alloc);
    const size_t total = rows * F + (d->norm_first ? 6 : 5) * rows * E + 2 * F * E + F + 5 * E;
    if (total > dev->global_mem / sizeof(float))
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "the encoder needs about %zu bytes of device memory besides its attention, more than "
                           "the device's global memory (%zu bytes)", total * sizeof(float), dev->global_mem);
    return CLATTN_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- kernels */

static void ln_release(ln_kernel *l)
{
    if (l->k) clReleaseKernel(l->k);
    if (l->prog) clReleaseProgram(l->prog);
    l->k = NULL;
    l->prog = NULL;
}

/* Build the residual_layernorm variant for rows of E. row_cache: -1 auto, 0 off, 1 on. */
static clattn_status ln_build(const clattn_device *dev, size_t E, int residual, int has_bias, int write_sum,
                              int row_cache, ln_kernel *l)
{
    size_t wg = 1;
    while (wg < E && wg < 256) wg *= 2;
    cl_ulong local_mem = 0;
    CL_CHECK(clGetDeviceInfo(dev->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local_mem, &local_mem, NULL),
             "clGetDeviceInfo (CL_DEVICE_LOCAL_MEM_SIZE)");
    /* the row, the reduction array and some slack for the implementation */
    const int fits = (cl_ulong)(E + 256) * sizeof(float) + 1024 <= local_mem;
    if (row_cache == 1 && !fits)
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "a row of %zu floats does not fit the device's local memory (%llu bytes)", E,
                           (unsigned long long)local_mem);
    l->cache_row = row_cache < 0 ? fits : row_cache;
    char opts[200];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DRESIDUAL=%d -DHAS_BIAS=%d -DWRITE_SUM=%d -DCACHE_ROW=%d", residual,
             has_bias, write_sum, l->cache_row);
    const char *src[] = {"layernorm"};
    TRY(clattn_program_build_wg(dev, src, 1, opts, "residual_layernorm", &wg, &l->prog, &l->k));
    l->wg = wg;
    return CLATTN_STATUS_SUCCESS;
}

/* out = LN((x + r) + bias) * gamma + beta over rows of E; sum = (x + r) + bias when the variant writes it. */
static clattn_status ln_enqueue(const clattn_device *dev, const ln_kernel *l, size_t rows, size_t E, view x, view r,
                                cl_mem bias, cl_mem gamma, cl_mem beta, view sum, view out, float eps)
{
    cl_kernel k = l->k;
    cl_ulong x_off = x.off, r_off = r.off, sum_off = sum.off, out_off = out.off;
    cl_uint E32 = (cl_uint)E;
    cl_int e = clSetKernelArg(k, 0, sizeof(cl_mem), &x.mem);
    e |= clSetKernelArg(k, 1, sizeof x_off, &x_off);
    e |= clSetKernelArg(k, 2, sizeof(cl_mem), r.mem ? &r.mem : NULL);
    e |= clSetKernelArg(k, 3, sizeof r_off, &r_off);
    e |= clSetKernelArg(k, 4, sizeof(cl_mem), bias ? &bias : NULL);
    e |= clSetKernelArg(k, 5, sizeof(cl_mem), &gamma);
    e |= clSetKernelArg(k, 6, sizeof(cl_mem), &beta);
    e |= clSetKernelArg(k, 7, sizeof(cl_mem), sum.mem ? &sum.mem : NULL);
    e |= clSetKernelArg(k, 8, sizeof sum_off, &sum_off);
    e |= clSetKernelArg(k, 9, sizeof(cl_mem), &out.mem);
    e |= clSetKernelArg(k, 10, sizeof out_off, &out_off);
    e |= clSetKernelArg(k, 11, sizeof E32, &E32);
    e |= clSetKernelArg(k, 12, sizeof eps, &eps);
    e |= clSetKernelArg(k, 13, (l->cache_row ? E : 1) * sizeof(float), NULL);
    if (e != CL_SUCCESS) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "setting residual_layernorm arguments failed");
    size_t local = l->wg, global = rows * local;
    CL_CHECK(clEnqueueNDRangeKernel(dev->queue, k, 1, NULL, &global, &local, 0, NULL, NULL),
             "enqueue residual_layernorm");
    return CLATTN_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- OpenCL plan */

static void cl_release(struct clattn_encoder_plan *p)
{
    struct clattn_encoder_cl *c = p->cl;
    if (!c) return;
    cl_mem *mems[] = {&c->ln1_w, &c->ln1_b, &c->w_ff1, &c->b_ff1, &c->w_ff2, &c->b_ff2, &c->ln2_w, &c->ln2_b,
                      &c->a,     &c->y,     &c->n,     &c->h,     &c->x_in,  &c->kpm_in, &c->out_buf};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) clattn_mem_release(mems[i]);
    ln_release(&c->ln1);
    ln_release(&c->ln2);
    if (c->k_act) clReleaseKernel(c->k_act);
    if (c->k_resid) clReleaseKernel(c->k_resid);
    if (c->ffn_prog) clReleaseProgram(c->ffn_prog);
    free(c);
    p->cl = NULL;
}

static clattn_status cl_init(struct clattn_encoder_plan *p)
{
    const clattn_device *dev = p->device;
    const size_t N = p->rows, E = p->E, F = p->F;
    struct clattn_encoder_cl *c = clattn_calloc(1, sizeof *c);
    if (!c) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the encoder's OpenCL state");
    p->cl = c;

    /* kernels: post-norm LN1(x + a), LN2(y + f + b2); pre-norm LN1(x), LN2(x + a) writing the sum too */
    if (!p->d.norm_first) {
        TRY(ln_build(dev, E, 1, 0, 0, -1, &c->ln1));
        TRY(ln_build(dev, E, 1, 1, 0, -1, &c->ln2));
    } else {
        TRY(ln_build(dev, E, 0, 0, 0, -1, &c->ln1));
        TRY(ln_build(dev, E, 1, 0, 1, -1, &c->ln2));
    }
    char opts[64];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DACT=%d", p->d.activation == CLATTN_ACTIVATION_GELU);
    const char *src[] = {"ffn"};
    TRY(clattn_program_build(dev, src, 1, opts, &c->ffn_prog));
    cl_int err;
    c->k_act = clCreateKernel(c->ffn_prog, "bias_act", &err);
    if (err == CL_SUCCESS) c->k_resid = clCreateKernel(c->ffn_prog, "residual_bias", &err);
    CL_CHECK(err, "clCreateKernel (ffn)");

    /* weights, uploaded once; then the workspace and the staging buffers */
    TRY(clattn_buffer_new(dev, E, sizeof(float), p->ln1_w, "ln1_weight", &c->ln1_w));
    TRY(clattn_buffer_new(dev, E, sizeof(float), p->ln1_b, "ln1_bias", &c->ln1_b));
    TRY(clattn_buffer_new(dev, F * E, sizeof(float), p->w_ff1, "w_ff1", &c->w_ff1));
    TRY(clattn_buffer_new(dev, F, sizeof(float), p->b_ff1, "b_ff1", &c->b_ff1));
    TRY(clattn_buffer_new(dev, E * F, sizeof(float), p->w_ff2, "w_ff2", &c->w_ff2));
    TRY(clattn_buffer_new(dev, E, sizeof(float), p->b_ff2, "b_ff2", &c->b_ff2));
    TRY(clattn_buffer_new(dev, E, sizeof(float), p->ln2_w, "ln2_weight", &c->ln2_w));
    TRY(clattn_buffer_new(dev, E, sizeof(float), p->ln2_b, "ln2_bias", &c->ln2_b));
    TRY(clattn_buffer_new(dev, N * E, sizeof(float), NULL, "the attention output", &c->a));
    TRY(clattn_buffer_new(dev, N * E, sizeof(float), NULL, "the residual stream", &c->y));
    if (p->d.norm_first) TRY(clattn_buffer_new(dev, N * E, sizeof(float), NULL, "the normalised inputs", &c->n));
    TRY(clattn_buffer_new(dev, N * F, sizeof(float), NULL, "the feed-forward hidden layer", &c->h));
    TRY(clattn_buffer_new(dev, N * E, sizeof(float), NULL, "the x staging buffer", &c->x_in));
    if (p->d.attn.key_padding_mask)
        TRY(clattn_buffer_new(dev, N, 1, NULL, "the key padding mask staging buffer", &c->kpm_in));
    TRY(clattn_buffer_new(dev, N * E, sizeof(float), NULL, "the output staging buffer", &c->out_buf));
    return CLATTN_STATUS_SUCCESS;
}

/* h = act(h + b1), in place */
static clattn_status bias_act(struct clattn_encoder_plan *p)
{
    struct clattn_encoder_cl *c = p->cl;
    cl_kernel k = c->k_act;
    cl_ulong off = 0, total = (cl_ulong)p->rows * p->F;
    cl_uint cols = (cl_uint)p->F;
    cl_int e = clSetKernelArg(k, 0, sizeof(cl_mem), &c->h);
    e |= clSetKernelArg(k, 1, sizeof off, &off);
    e |= clSetKernelArg(k, 2, sizeof(cl_mem), &c->b_ff1);
    e |= clSetKernelArg(k, 3, sizeof cols, &cols);
    e |= clSetKernelArg(k, 4, sizeof total, &total);
    if (e != CL_SUCCESS) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "setting bias_act arguments failed");
    return clattn_enqueue_1d(p->device, k, (size_t)total, "enqueue bias_act");
}

/* dst = (a + b) + b2 */
static clattn_status residual_bias(struct clattn_encoder_plan *p, view dst, view a, view b)
{
    struct clattn_encoder_cl *c = p->cl;
    cl_kernel k = c->k_resid;
    cl_ulong dst_off = dst.off, a_off = a.off, b_off = b.off, total = (cl_ulong)p->rows * p->E;
    cl_uint cols = (cl_uint)p->E;
    cl_int e = clSetKernelArg(k, 0, sizeof(cl_mem), &dst.mem);
    e |= clSetKernelArg(k, 1, sizeof dst_off, &dst_off);
    e |= clSetKernelArg(k, 2, sizeof(cl_mem), &a.mem);
    e |= clSetKernelArg(k, 3, sizeof a_off, &a_off);
    e |= clSetKernelArg(k, 4, sizeof(cl_mem), &b.mem);
    e |= clSetKernelArg(k, 5, sizeof b_off, &b_off);
    e |= clSetKernelArg(k, 6, sizeof(cl_mem), &c->b_ff2);
    e |= clSetKernelArg(k, 7, sizeof cols, &cols);
    e |= clSetKernelArg(k, 8, sizeof total, &total);
    if (e != CL_SUCCESS) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "setting residual_bias arguments failed");
    return clattn_enqueue_1d(p->device, k, (size_t)total, "enqueue residual_bias");
}

/* C (m, n) = A (m, k) * W^T with W (n, k) in nn.Linear layout, row-major. */
static clattn_status linear(struct clattn_encoder_plan *p, size_t m, size_t n, size_t k, view a, cl_mem w, view cmat,
                            const char *what)
{
    return clattn_blas_sgemm(p->device, CLBlastTransposeYes, m, n, k, 1.0f, a.mem, a.off, k, w, 0, k, 0.0f,
                             cmat.mem, cmat.off, n, what);
}

/* The self-attention on device buffers: dst = SA(src). */
static clattn_status attention(struct clattn_encoder_plan *p, view src, view kpm, view dst)
{
    clattn_attention_buffers b = {.x = {src.mem, src.off}, .key_padding_mask = {kpm.mem, kpm.off},
                                  .out = {dst.mem, dst.off}};
    return p->attn->ops->execute_buffers(p->attn, &b, 0, NULL, NULL);
}

/* The whole layer, enqueued on the device queue. */
static clattn_status run(struct clattn_encoder_plan *p, view x, view kpm, view out)
{
    struct clattn_encoder_cl *c = p->cl;
    const clattn_device *dev = p->device;
    const size_t N = p->rows, E = p->E, F = p->F;
    const float eps = p->d.eps;
    const view a = {c->a, 0}, y = {c->y, 0}, n = {c->n, 0}, h = {c->h, 0}, none = {NULL, 0};
    if (!p->d.norm_first) {
        TRY(attention(p, x, kpm, a));                                                        /* 1 */
        TRY(ln_enqueue(dev, &c->ln1, N, E, x, a, NULL, c->ln1_w, c->ln1_b, none, y, eps));   /* 2 */
        TRY(linear(p, N, F, E, y, c->w_ff1, h, "feed-forward GEMM 1"));                      /* 3 */
        TRY(bias_act(p));
        TRY(linear(p, N, E, F, h, c->w_ff2, a, "feed-forward GEMM 2"));                      /* 4 */
        TRY(ln_enqueue(dev, &c->ln2, N, E, y, a, c->b_ff2, c->ln2_w, c->ln2_b, none, out, eps)); /* 5 */
    } else {
        TRY(ln_enqueue(dev, &c->ln1, N, E, x, none, NULL, c->ln1_w, c->ln1_b, none, n, eps)); /* 1 */
        TRY(attention(p, n, kpm, a));                                                         /* 2 */
        TRY(ln_enqueue(dev, &c->ln2, N, E, x, a, NULL, c->ln2_w, c->ln2_b, y, n, eps));       /* 3 */
        TRY(linear(p, N, F, E, n, c->w_ff1, h, "feed-forward GEMM 1"));                       /* 4 */
        TRY(bias_act(p));
        TRY(linear(p, N, E, F, h, c->w_ff2, a, "feed-forward GEMM 2"));                       /* 5 */
        TRY(residual_bias(p, out, y, a));                                                     /* 6 */
    }
    return CLATTN_STATUS_SUCCESS;
}

typedef struct pass_ctx {
    struct clattn_encoder_plan *p;
    view x, kpm, out;
} pass_ctx;

static clattn_status pass(void *ctx)
{
    const pass_ctx *pc = ctx;
    return run(pc->p, pc->x, pc->kpm, pc->out);
}

static clattn_status cl_execute_host(struct clattn_encoder_plan *p, const clattn_encoder_args *args)
{
    struct clattn_encoder_cl *c = p->cl;
    const size_t N = p->rows, E = p->E;
    const clattn_transfer in[] = {
        {c->x_in, N * E * sizeof(float), (void *)args->x, "x"},
        {p->d.attn.key_padding_mask ? c->kpm_in : NULL, N, (void *)args->key_padding_mask, "the key padding mask"}};
    const clattn_transfer out = {c->out_buf, N * E * sizeof(float), args->out, "the output"};
    pass_ctx pc = {p, {c->x_in, 0}, {c->kpm_in, 0}, {c->out_buf, 0}};
    return clattn_exec_host(p->device, in, 2, pass, &pc, &out);
}

/* ---------------------------------------------------------------- public API */

void clattn_encoder_plan_free(clattn_encoder_plan *plan)
{
    if (!plan) return;
    cl_release(plan);
    clattn_plan_free(plan->attn);
    free(plan->ln1_w); free(plan->ln1_b); free(plan->w_ff1); free(plan->b_ff1);
    free(plan->w_ff2); free(plan->b_ff2); free(plan->ln2_w); free(plan->ln2_b);
    free(plan);
}

clattn_status clattn_encoder_plan_create(clattn_device *device, const clattn_encoder_desc *desc,
                                         const clattn_encoder_weights *weights, clattn_encoder_plan **plan)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    *plan = NULL;
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    if (!desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc is NULL");
    if (!weights) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights is NULL");
    clattn_encoder_desc d;
    clattn_status st = validate(desc, weights, &d);
    if (st) return st;
    if (device->backend == CLATTN_BACKEND_OPENCL && (st = check_device_memory(device, &d))) return st;

    clattn_encoder_plan *p = clattn_calloc(1, sizeof *p);
    if (!p) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the encoder plan");
    p->device = device;
    p->d = d;
    p->rows = d.attn.batch * d.attn.seq_q;
    p->E = d.attn.embed;
    p->F = d.ff_dim;
    /* the self-attention, run on the encoder's buffers only: validates desc.attn and weights.attn
     * before its own device work */
    st = clattn_plan_create_device_resident(device, &d.attn, &weights->attn, &p->attn);
    if (st) {
        char why[1024];
        snprintf(why, sizeof why, "%s", clattn_last_error());
        clattn_encoder_plan_free(p);
        return clattn_fail(st, "self-attention: %s", why);
    }
    const size_t E = p->E, F = p->F;
    const clattn_layout layout = d.attn.layout;
    int oom = !(p->ln1_w = clattn_vector_copy(weights->ln1_weight, E));
    oom |= !(p->ln1_b = clattn_vector_copy(weights->ln1_bias, E));
    oom |= !(p->w_ff1 = clattn_weight_copy(weights->w_ff1, F, E, layout));
    oom |= !(p->b_ff1 = clattn_vector_copy(weights->b_ff1, F));
    oom |= !(p->w_ff2 = clattn_weight_copy(weights->w_ff2, E, F, layout));
    oom |= !(p->b_ff2 = clattn_vector_copy(weights->b_ff2, E));
    oom |= !(p->ln2_w = clattn_vector_copy(weights->ln2_weight, E));
    oom |= !(p->ln2_b = clattn_vector_copy(weights->ln2_bias, E));
    if (oom) {
        clattn_encoder_plan_free(p);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "copying the encoder weights");
    }
    if (device->backend == CLATTN_BACKEND_OPENCL && (st = cl_init(p))) {
        clattn_encoder_plan_free(p);
        return st;
    }
    *plan = p;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_encoder_plan_execute(clattn_encoder_plan *plan, const clattn_encoder_args *args)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (!args) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args is NULL");
    if (!args->x) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.x is NULL");
    if (!args->out) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.out is NULL");
    if (plan->d.attn.key_padding_mask && !args->key_padding_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.key_padding_mask is NULL (the plan expects one)");
    if (plan->cl) return cl_execute_host(plan, args);
    return clattn_ref_encoder_execute(plan, args, args->out);
}

clattn_status clattn_encoder_plan_execute_buffers(clattn_encoder_plan *plan, const clattn_encoder_buffers *buffers,
                                                  cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                  cl_event *event)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (!buffers) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers is NULL");
    if (!plan->cl)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED,
                           "execution on cl_mem buffers needs an OpenCL device (this plan is on ref)");
    if ((num_events_in_wait_list == 0) != (event_wait_list == NULL))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "num_events_in_wait_list and event_wait_list disagree");
    const size_t N = plan->rows, E = plan->E;
    TRY(clattn_buffer_check(buffers->x.mem, buffers->x.offset, N * E, sizeof(float), "x"));
    if (plan->d.attn.key_padding_mask)
        TRY(clattn_buffer_check(buffers->key_padding_mask.mem, buffers->key_padding_mask.offset, N, 1, "key_padding_mask"));
    TRY(clattn_buffer_check(buffers->out.mem, buffers->out.offset, N * E, sizeof(float), "out"));
    pass_ctx pc = {plan, {buffers->x.mem, buffers->x.offset},
                   {buffers->key_padding_mask.mem, buffers->key_padding_mask.offset},
                   {buffers->out.mem, buffers->out.offset}};
    return clattn_exec_buffers(plan->device, num_events_in_wait_list, event_wait_list, pass, &pc, event);
}

/* ---------------------------------------------------------------- the LayerNorm kernel alone */

clattn_status clattn_residual_layernorm_rows(clattn_device *dev, size_t rows, size_t E, const float *x,
                                             const float *r, const float *bias, const float *gamma,
                                             const float *beta, float eps, int row_cache, float *sum_out,
                                             float *out)
{
    clattn_clear_error();
    if (!dev || !x || !gamma || !beta || !out)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "dev, x, gamma, beta and out must not be NULL");
    if (rows == 0 || E == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rows and E must be >= 1");
    if (!(isfinite(eps) && eps > 0.0f)) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "eps must be finite and > 0");
    if (row_cache < -1 || row_cache > 1) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "row_cache must be -1, 0 or 1");
    size_t n;
    if (clattn_mul_overflows(rows, E, &n) || clattn_mul_overflows(n, sizeof(float), &n) || E > 0xFFFFFFFFu)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "rows x E overflows");
    if (dev->backend != CLATTN_BACKEND_OPENCL) {
        clattn_ref_residual_layernorm(rows, E, x, r, bias, gamma, beta, eps, sum_out, out);
        return CLATTN_STATUS_SUCCESS;
    }
    ln_kernel l = {0};
    cl_mem bx = NULL, br = NULL, bb = NULL, bg = NULL, bbeta = NULL, bsum = NULL, bout = NULL;
    clattn_status st = ln_build(dev, E, r != NULL, bias != NULL, sum_out != NULL, row_cache, &l);
    if (!st) st = clattn_buffer_new(dev, rows * E, sizeof(float), x, "x", &bx);
    if (!st && r) st = clattn_buffer_new(dev, rows * E, sizeof(float), r, "r", &br);
    if (!st && bias) st = clattn_buffer_new(dev, E, sizeof(float), bias, "bias", &bb);
    if (!st) st = clattn_buffer_new(dev, E, sizeof(float), gamma, "gamma", &bg);
    if (!st) st = clattn_buffer_new(dev, E, sizeof(float), beta, "beta", &bbeta);
    if (!st && sum_out) st = clattn_buffer_new(dev, rows * E, sizeof(float), NULL, "sum", &bsum);
    if (!st) st = clattn_buffer_new(dev, rows * E, sizeof(float), NULL, "out", &bout);
    if (!st)
        st = ln_enqueue(dev, &l, rows, E, (view){bx, 0}, (view){br, 0}, bb, bg, bbeta, (view){bsum, 0},
                        (view){bout, 0}, eps);
    cl_int err = clFinish(dev->queue);
    if (!st && err != CL_SUCCESS) st = clattn_fail((clattn_status)err, "running residual_layernorm failed (%d)", err);
    if (!st && sum_out) {
        err = clEnqueueReadBuffer(dev->queue, bsum, CL_TRUE, 0, rows * E * sizeof(float), sum_out, 0, NULL, NULL);
        if (err != CL_SUCCESS) st = clattn_fail((clattn_status)err, "reading the sums failed (%d)", err);
    }
    if (!st) {
        err = clEnqueueReadBuffer(dev->queue, bout, CL_TRUE, 0, rows * E * sizeof(float), out, 0, NULL, NULL);
        if (err != CL_SUCCESS) st = clattn_fail((clattn_status)err, "reading the output failed (%d)", err);
    }
    cl_mem *mems[] = {&bx, &br, &bb, &bg, &bbeta, &bsum, &bout};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) clattn_mem_release(mems[i]);
    ln_release(&l);
    return st;
}
