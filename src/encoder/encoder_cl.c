/* encoder_cl.c: the encoder layer on an OpenCL device (src/encoder/encoder.c draws its passes): the
 * self-attention plan on the layer's buffers, residual + LayerNorm (cl/encoder/layernorm.cl), the
 * feed-forward GEMMs with bias + activation and residual kernels (cl/encoder/ffn.cl). Everything stays on
 * the device between the input upload and the output read. */
#include "encoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef clattn_view view;

typedef struct ln_kernel {
    cl_program prog;
    cl_kernel k;
    size_t wg;
    int cache_row;
    size_t trips; /* a work-item's loop iterations (clattn_loop_check) */
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

/* The encoder's device memory, checked before any device work. */
static clattn_status check_device_memory(const clattn_device *dev, const clattn_encoder_desc *d)
{
    const size_t rows = d->attn.batch * d->attn.seq_q, E = d->attn.embed, F = d->ff_dim;
    const struct { size_t floats; const char *what; } big[] = {
        {rows * F, "the feed-forward hidden layer (B*T x ff_dim floats)"},
        {rows * E, "one (B*T x embed) activation"},
        {F * E, "one feed-forward weight (ff_dim x embed floats)"}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        if (big[i].floats * sizeof(float) > dev->caps.max_alloc)
            return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                               "%s needs %zu bytes, more than the device's max allocation (%zu bytes)", big[i].what,
                               big[i].floats * sizeof(float), dev->caps.max_alloc);
    const size_t total = rows * F + (d->norm_first ? 6 : 5) * rows * E + 2 * F * E + F + 5 * E;
    if (total > dev->caps.global_mem / sizeof(float))
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "the encoder needs about %zu bytes of device memory besides its attention, more than "
                           "the device's global memory (%zu bytes)", total * sizeof(float), dev->caps.global_mem);
    return CLATTN_STATUS_SUCCESS;
}


static void ln_release(ln_kernel *l)
{
    clattn_kernel_release(&l->k);
    clattn_program_release(&l->prog);
}

/* Build the residual_layernorm variant for rows of E. row_cache: -1 auto, 0 off, 1 on. */
static clattn_status ln_build(const clattn_device *dev, size_t E, int residual, int has_bias, int write_sum,
                              int row_cache, ln_kernel *l)
{
    size_t wg = 1;
    while (wg < E && wg < 256) wg *= 2;
    const size_t local_mem = dev->caps.local_mem;
    /* the row, the reduction array and some slack for the implementation */
    const int fits = (E + 256) * sizeof(float) + 1024 <= local_mem;
    if (row_cache == 1 && !fits)
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "a row of %zu floats does not fit the device's local memory (%zu bytes)", E, local_mem);
    l->cache_row = row_cache < 0 ? fits : row_cache;
    char opts[200];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DRESIDUAL=%d -DHAS_BIAS=%d -DWRITE_SUM=%d -DCACHE_ROW=%d", residual,
             has_bias, write_sum, l->cache_row);
    const char *src[] = {"encoder/layernorm"};
    TRY(clattn_program_build_wg(dev, src, 1, opts, "residual_layernorm", &wg, &l->prog, &l->k));
    l->wg = wg;
    /* each work-item's loops: the row's passes (the copy to local memory, the mean, the variance, the output) over
     * its share of E, and the two reductions' halvings */
    size_t halvings = 0;
    for (size_t w = wg; w > 1; w /= 2) halvings++;
    char what[96];
    snprintf(what, sizeof what, "residual_layernorm (rows of E = %zu, %zu work-items per row)", E, wg);
    l->trips = (size_t)(3 + l->cache_row) * ((E + wg - 1) / wg) + 2 * halvings;
    return clattn_loop_check(&dev->caps, l->trips, what);
}

/* out = LN((x + r) + bias) * gamma + beta over rows of E; sum = (x + r) + bias when the variant writes it. */
static clattn_status ln_enqueue(const clattn_device *dev, const ln_kernel *l, size_t rows, size_t E, view x, view r,
                                cl_mem bias, cl_mem gamma, cl_mem beta, view sum, view out, float eps)
{
    clattn_note_trips(l->trips);
    clattn_args a;
    clattn_args_begin(&a, l->k, "residual_layernorm");
    clattn_arg_view(&a, x);
    clattn_arg_view(&a, r);
    clattn_arg_mem(&a, bias);
    clattn_arg_mem(&a, gamma);
    clattn_arg_mem(&a, beta);
    clattn_arg_view(&a, sum);
    clattn_arg_view(&a, out);
    clattn_arg_u32(&a, (cl_uint)E);
    clattn_arg_f32(&a, eps);
    clattn_arg_local(&a, (l->cache_row ? E : 1) * sizeof(float));
    TRY(clattn_args_end(&a));
    size_t local = l->wg, global = rows * local;
    TRY(clattn_device_runs(dev, "enqueue residual_layernorm"));
    clattn_note_launch(global);
    CL_CHECK(clEnqueueNDRangeKernel(dev->queue, l->k, 1, NULL, &global, &local, 0, NULL, NULL),
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
    clattn_kernel_release(&c->k_act);
    clattn_kernel_release(&c->k_resid);
    clattn_program_release(&c->ffn_prog);
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
    const char *src[] = {"encoder/ffn"};
    TRY(clattn_program_build(dev, src, 1, opts, &c->ffn_prog));
    TRY(clattn_kernel_create(c->ffn_prog, "bias_act", &c->k_act));
    TRY(clattn_kernel_create(c->ffn_prog, "residual_bias", &c->k_resid));

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
    const size_t total = p->rows * p->F;
    clattn_args a;
    clattn_args_begin(&a, c->k_act, "bias_act");
    clattn_arg_view(&a, (view){c->h, 0});
    clattn_arg_mem(&a, c->b_ff1);
    clattn_arg_u32(&a, (cl_uint)p->F);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(p->device, c->k_act, total, "enqueue bias_act");
}

/* dst = (a + b) + b2 */
static clattn_status residual_bias(struct clattn_encoder_plan *p, view dst, view a_, view b)
{
    struct clattn_encoder_cl *c = p->cl;
    const size_t total = p->rows * p->E;
    clattn_args a;
    clattn_args_begin(&a, c->k_resid, "residual_bias");
    clattn_arg_view(&a, dst);
    clattn_arg_view(&a, a_);
    clattn_arg_view(&a, b);
    clattn_arg_mem(&a, c->b_ff2);
    clattn_arg_u32(&a, (cl_uint)p->E);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(p->device, c->k_resid, total, "enqueue residual_bias");
}

/* C (m, n) = A (m, k) * W^T with W (n, k) in nn.Linear layout, row-major: on the GEMM core of the layer's
 * attention plan. */
static clattn_status linear(struct clattn_encoder_plan *p, size_t m, size_t n, size_t k, view a, cl_mem w, view cmat,
                            const char *what)
{
    return clattn_linear_run(clattn_plan_linear(p->attn), m, n, k, a, w, NULL, cmat, 0, 0, what);
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
    return clattn_exec_host(p->device, in, 2, pass, &pc, &out, 1);
}


/* A half layer on the caller's buffers: x widened into the plan's fp32 staging, the fp32 pass, the output narrowed
 * from it into the caller's out (dtype_widen / dtype_narrow, the attention plan's linear helpers). */
typedef struct typed_ctx {
    pass_ctx pc;
    view tx, tout;
} typed_ctx;

static clattn_status pass_typed(void *ctx)
{
    typed_ctx *tc = ctx;
    const struct clattn_encoder_plan *p = tc->pc.p;
    const clattn_linear *lin = clattn_plan_linear(p->attn);
    const size_t n = p->rows * p->E;
    TRY(clattn_linear_convert(lin, tc->tx, tc->pc.x, n, p->d.attn.dtype, 0));
    TRY(pass(&tc->pc));
    return clattn_linear_convert(lin, tc->pc.out, tc->tout, n, p->d.attn.dtype, 1);
}

static clattn_status cl_execute_buffers(struct clattn_encoder_plan *p, const clattn_encoder_buffers *buffers,
                                        cl_uint nwait, const cl_event *wait, cl_event *event)
{
    pass_ctx pc = {p, {buffers->x.mem, buffers->x.offset},
                   {buffers->key_padding_mask.mem, buffers->key_padding_mask.offset},
                   {buffers->out.mem, buffers->out.offset}};
    if (p->d.attn.dtype == CLATTN_DTYPE_F32) return clattn_exec_buffers(p->device, nwait, wait, pass, &pc, event);
    struct clattn_encoder_cl *c = p->cl;
    typed_ctx tc = {pc, pc.x, pc.out};
    tc.pc.x = (view){c->x_in, 0}, tc.pc.out = (view){c->out_buf, 0};
    return clattn_exec_buffers(p->device, nwait, wait, pass_typed, &tc, event);
}
/* ---------------------------------------------------------------- the LayerNorm kernel alone */

static clattn_status cl_layernorm_rows(clattn_device *dev, size_t rows, size_t E, const float *x, const float *r,
                                       const float *bias, const float *gamma, const float *beta, float eps,
                                       int row_cache, float *sum_out, float *out)
{
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

const clattn_encoder_ops clattn_encoder_opencl = {
    .check = check_device_memory,
    .init = cl_init,
    .release = cl_release,
    .execute_host = cl_execute_host,
    .execute_buffers = cl_execute_buffers,
    .layernorm_rows = cl_layernorm_rows,
};
