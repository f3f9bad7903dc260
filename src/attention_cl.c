/* attention_cl.c: the attention forward pass on an OpenCL device.
 *
 *   1. projections     CLBlast SGEMM: self-attention one GEMM against [Wq|Wk|Wv],
 *                      cross-attention Q = x Wq^T and [K|V] = kv [Wk|Wv]^T
 *   2. head split      split_heads: (B, T, H*d) -> (B, H, T, d), + bias
 *   3. scores          CLBlast strided-batched SGEMM over B*H: S = scale * Q K^T
 *   4. softmax         softmax_rows (a work-group per row) or, on CPU devices,
 *                      softmax_rows_item (a work-item per row): masks, softmax,
 *                      dropout, in place
 *   5. context         CLBlast strided-batched SGEMM: C = W V
 *   6. head merge      merge_heads: (B, H, T, dv) -> (B, T, H*dv)
 *   7. out projection  fill_rows(bias) + CLBlast SGEMM with beta = 1
 * With one head, a layout that already is head-major skips 2 and 6.
 * The fused algorithm replaces 2-6 with one kernel (attention_fused.c, cl/flash.cl) that reads
 * Q, K and V where the projections left them and writes the merged rows; the projection
 * biases are then put in by the GEMMs (rows filled with the bias, beta = 1).
 * Everything stays on the device between the input upload and the output read.
 */
#include "attention_fused.h"
#include "backend.h"
#include "reference.h"

#include <clblast_c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef clattn_view view;

struct clattn_cl_state {
    cl_program heads_prog, softmax_prog;
    cl_kernel k_split, k_merge, k_fill, k_softmax;
    size_t softmax_wg;            /* 0: k_softmax is softmax_rows_item, one work-item per row */
    int fused;                    /* the fused core instead of stages 2-6 */
    clattn_fused flash;
    cl_mem b_proj, b_proj_kv;     /* fused: the biases as projection rows ([bq|bk|bv]; cross [bq], [bk|bv]) */
    size_t n_qkv;                 /* self: H*(2dk+dv) columns of the fused projection */
    size_t chunk;                 /* (b, h) pairs whose scores fit the score buffer at once */
    size_t rows_blk;              /* query rows per block: Tq, or fewer when one pair does not fit (chunk 1) */
    /* weights (LINEAR layout) */
    cl_mem w_proj;                /* self: [Wq;Wk;Wv] (n_qkv, E); cross: Wq (H*dk, E) */
    cl_mem w_kv;                  /* cross: [Wk;Wv] (H*(dk+dv), Ekv) */
    cl_mem b_q, b_k, b_v, w_out, b_out;
    /* workspace */
    cl_mem proj, proj_kv;         /* projection outputs, token-major */
    cl_mem q, k, v;               /* head-major (B, H, T, d) */
    cl_mem s;                     /* (B, H, Tq, Tk) */
    cl_mem ctx, merged;           /* (B, H, Tq, dv), (B, Tq, H*dv) */
    /* staging for execution from host arrays */
    cl_mem x_in, kv_in, kpm_in, mask_in, out_buf;
    /* profiling markers: marks[0] at the start, marks[k] at the end of stage mark_stage[k] */
    cl_event marks[16];
    int mark_stage[16];
    int nmarks;
};

/* ---- plan creation */

static clattn_status build_kernels(struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    cl_int err;
    const char *heads_src[] = {"half", "heads"};
    TRY(clattn_program_build(p->device, heads_src, 2, "-cl-std=CL1.2", &c->heads_prog));
    c->k_split = clCreateKernel(c->heads_prog, "split_heads", &err);
    if (err == CL_SUCCESS) c->k_merge = clCreateKernel(c->heads_prog, "merge_heads", &err);
    if (err == CL_SUCCESS) c->k_fill = clCreateKernel(c->heads_prog, "fill_rows", &err);
    CL_CHECK(err, "clCreateKernel (heads)");
    if (c->fused) {
        TRY(clattn_fused_init(p->device, d, &c->flash));
        p->tuned = c->flash.tuned;
        return CLATTN_STATUS_SUCCESS;
    }

    /* softmax work-group: a power of two covering the row, from 16 to 256 (and the device's limit) */
    size_t wg = 1;
    while (wg < d->seq_kv && wg < 256) wg *= 2;
    wg = wg < 16 && d->seq_kv > 1 ? 16 : wg;
    char opts[256];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DCAUSAL=%d -DWINDOW=%zu -DKPM=%d -DMASK_KIND=%d -DDROPOUT=%d",
             d->causal, d->window, d->key_padding_mask, (int)d->attn_mask, d->dropout > 0.0f);
    const char *softmax_src[] = {"philox", "mask", "softmax"};
    TRY(clattn_program_build_wg(p->device, softmax_src, 3, opts, "softmax_rows", &wg, &c->softmax_prog,
                                &c->k_softmax));
    c->softmax_wg = wg;
    /* CPU devices: one work-item per row (see softmax_rows_item); CLATTN_SOFTMAX=rows|item overrides */
    cl_device_type type = 0;
    clGetDeviceInfo(p->device->device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    const char *pick = getenv("CLATTN_SOFTMAX");
    const clattn_tune_table *tn = clattn_tune_active(p->device);
    int per_item = (type & CL_DEVICE_TYPE_CPU) != 0;
    if (pick && *pick) per_item = strcmp(pick, "item") == 0;
    else if (tn && tn->softmax >= 0) per_item = tn->softmax, p->tuned = 1; /* the device's tuning file */
    if (per_item) {
        cl_kernel k = clCreateKernel(c->softmax_prog, "softmax_rows_item", &err);
        CL_CHECK(err, "clCreateKernel (softmax_rows_item)");
        clReleaseKernel(c->k_softmax);
        c->k_softmax = k;
        c->softmax_wg = 0;
    }
    return CLATTN_STATUS_SUCCESS;
}

static int one_head_view(const struct clattn_plan *p)
{
    return p->d.heads == 1 && !p->d.kv_half; /* kv_half: the head split rounds K and V */
}

/* Fused: the projection biases as the rows the projection GEMMs start from (zeros where a bias
 * is absent); NULL buffers when the GEMM has no bias at all. */
static clattn_status fused_biases(struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    const size_t nq = H * dk, nk = HK * dk, nv = HK * dv;
    int any_q = p->b_query != NULL, any_kv = p->b_key || p->b_value;
    if (!any_q && !any_kv) return CLATTN_STATUS_SUCCESS;
    float *b = clattn_calloc(nq + nk + nv, sizeof *b);
    if (!b) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "concatenating the projection biases");
    if (p->b_query) memcpy(b, p->b_query, nq * sizeof *b);
    if (p->b_key) memcpy(b + nq, p->b_key, nk * sizeof *b);
    if (p->b_value) memcpy(b + nq + nk, p->b_value, nv * sizeof *b);
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (!d->cross) {
        st = clattn_buffer_new(p->device, nq + nk + nv, sizeof(float), b, "the Q|K|V biases", &c->b_proj);
    } else {
        if (any_q) st = clattn_buffer_new(p->device, nq, sizeof(float), b, "the Q bias", &c->b_proj);
        if (!st && any_kv)
            st = clattn_buffer_new(p->device, nk + nv, sizeof(float), b + nq, "the K|V biases", &c->b_proj_kv);
    }
    free(b);
    return st;
}

static clattn_status upload_projections(struct clattn_plan *p);
static clattn_status unfused_biases(struct clattn_plan *p);
static clattn_status upload_out_projection(struct clattn_plan *p);
static clattn_status unfused_workspace(struct clattn_plan *p);
static clattn_status staging_buffers(struct clattn_plan *p);

/* Validate the plan against the device's memory, build the kernels, upload the weights, make the
 * workspace: everything before the first execution. */
static clattn_status clattn_cl_plan_init(struct clattn_plan *p)
{
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    struct clattn_cl_state *c = clattn_calloc(1, sizeof *c);
    if (!c) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the OpenCL plan state");
    p->cl = c;
    c->fused = p->ops == &clattn_backend_fused;

    /* The score matrices of all B*H (batch, head) pairs in one buffer when it fits the device's
     * max allocation, else in chunks of pairs, else (one pair does not fit) one pair at a time in
     * blocks of query rows. The GEMMs on them are split further to CLBlast's index range (blas.c). */
    const size_t row_bytes = Tk * sizeof(float);
    if (c->fused) {
        c->rows_blk = c->chunk = 0; /* no score matrix */
    } else if (row_bytes > p->device->max_alloc)
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "one query's row of scores (Tk = %zu floats, %zu bytes) exceeds the device's max "
                           "allocation (%zu bytes)", Tk, row_bytes, p->device->max_alloc);
    else {
        const size_t rows_fit = p->device->max_alloc / row_bytes;
        if (rows_fit >= Tq) {
            c->rows_blk = Tq;
            c->chunk = rows_fit / Tq < B * H ? rows_fit / Tq : B * H;
        } else {
            c->rows_blk = rows_fit;
            c->chunk = 1;
        }
    }

    /* device memory budget, checked before any allocation */
    size_t total = B * Tq * E + (d->cross ? B * Tk * Ekv : 0) + B * Tq * p->out_width;
    if (!c->fused) total += c->chunk * c->rows_blk * Tk + B * H * Tq * dk + B * H * Tk * (dk + dv) + B * H * Tq * dv;
    if (p->has_qkv) total += B * Tq * H * dk + B * Tk * HK * (dk + dv) + H * dk * E + HK * (dk + dv) * Ekv;
    if (p->has_out) total += B * Tq * H * dv + d->out_dim * H * dv;
    if (total > p->device->global_mem / sizeof(float))
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "these dimensions need about %zu bytes of device memory, more than its global memory "
                           "(%zu bytes)", total * sizeof(float), p->device->global_mem);

    TRY(build_kernels(p));
    /* CLBlast's Xgemm parameters from the tuning file (set on the device at open) run the projections */
    const clattn_tune_table *tn = clattn_tune_active(p->device);
    if (tn && tn->xgemm >= 0 && (p->has_qkv || p->has_out)) p->tuned = 1;
    TRY(upload_projections(p));
    TRY(c->fused ? fused_biases(p) : unfused_biases(p));
    TRY(upload_out_projection(p));
    if (!c->fused) TRY(unfused_workspace(p));
    return p->host_staging ? staging_buffers(p) : CLATTN_STATUS_SUCCESS;
}

/* The Q/K/V weights, uploaded once, and the projections' outputs. */
static clattn_status upload_projections(struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    clattn_status st;
    if (p->has_qkv) {
        if (!d->cross) {
            c->n_qkv = H * dk + HK * (dk + dv);
            float *w = clattn_malloc(c->n_qkv * E * sizeof *w);
            if (!w) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "concatenating Q/K/V weights");
            memcpy(w, p->w_query, H * dk * E * sizeof *w);
            memcpy(w + H * dk * E, p->w_key, HK * dk * E * sizeof *w);
            memcpy(w + (H + HK) * dk * E, p->w_value, HK * dv * E * sizeof *w);
            st = clattn_buffer_new(p->device, c->n_qkv * E, sizeof(float), w, "the Q|K|V weights", &c->w_proj);
            free(w);
            if (st) return st;
            if ((st = clattn_buffer_new(p->device, B * Tq * c->n_qkv, sizeof(float), NULL, "the Q|K|V projections", &c->proj)))
                return st;
        } else {
            float *w = clattn_malloc(HK * (dk + dv) * Ekv * sizeof *w);
            if (!w) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "concatenating K/V weights");
            memcpy(w, p->w_key, HK * dk * Ekv * sizeof *w);
            memcpy(w + HK * dk * Ekv, p->w_value, HK * dv * Ekv * sizeof *w);
            st = clattn_buffer_new(p->device, HK * (dk + dv) * Ekv, sizeof(float), w, "the K|V weights", &c->w_kv);
            free(w);
            if (st) return st;
            if ((st = clattn_buffer_new(p->device, H * dk * E, sizeof(float), p->w_query, "the Q weights", &c->w_proj)) ||
                (st = clattn_buffer_new(p->device, B * Tq * H * dk, sizeof(float), NULL, "the Q projection", &c->proj)) ||
                (st = clattn_buffer_new(p->device, B * Tk * HK * (dk + dv), sizeof(float), NULL, "the K|V projections",
                                  &c->proj_kv)))
                return st;
        }
    }
    return CLATTN_STATUS_SUCCESS;
}

/* Unfused: the biases the head split adds. */
static clattn_status unfused_biases(struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    const size_t H = p->d.heads, HK = p->d.kv_heads, dk = p->d.head_dim_qk, dv = p->d.head_dim_v;
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if ((p->b_query && (st = clattn_buffer_new(p->device, H * dk, sizeof(float), p->b_query, "b_query", &c->b_q))) ||
        (p->b_key && (st = clattn_buffer_new(p->device, HK * dk, sizeof(float), p->b_key, "b_key", &c->b_k))) ||
        (p->b_value && (st = clattn_buffer_new(p->device, HK * dv, sizeof(float), p->b_value, "b_value", &c->b_v))))
        return st;
    return CLATTN_STATUS_SUCCESS;
}

/* The output projection's weights and its input, the merged heads. */
static clattn_status upload_out_projection(struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, H = d->heads, dv = d->head_dim_v;
    clattn_status st;
    if (p->has_out) {
        if ((st = clattn_buffer_new(p->device, d->out_dim * H * dv, sizeof(float), p->w_out, "w_out", &c->w_out)) ||
            (p->b_out && (st = clattn_buffer_new(p->device, d->out_dim, sizeof(float), p->b_out, "b_out", &c->b_out))) ||
            (st = clattn_buffer_new(p->device, B * Tq * H * dv, sizeof(float), NULL, "the merged heads", &c->merged)))
            return st;
    }
    return CLATTN_STATUS_SUCCESS;
}

/* Unfused: head-major Q, K, V (not needed with one head and no projection: the inputs are the
 * views), the context and the score buffer. */
static clattn_status unfused_workspace(struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, H = d->heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    clattn_status st;
    if (!(one_head_view(p) && !p->has_qkv)) {
        if ((st = clattn_buffer_new(p->device, B * H * Tq * dk, sizeof(float), NULL, "Q", &c->q)) ||
            (st = clattn_buffer_new(p->device, B * H * Tk * dk, sizeof(float), NULL, "K", &c->k)) ||
            (st = clattn_buffer_new(p->device, B * H * Tk * dv, sizeof(float), NULL, "V", &c->v)))
            return st;
    }
    if (!one_head_view(p) && (st = clattn_buffer_new(p->device, B * H * Tq * dv, sizeof(float), NULL, "the context", &c->ctx)))
        return st;
    if ((st = clattn_buffer_new(p->device, c->chunk * c->rows_blk * Tk, sizeof(float), NULL, "the attention scores",
                                &c->s)))
        return st;
    return CLATTN_STATUS_SUCCESS;
}

/* For execution from host arrays: the inputs and the output on the device. */
static clattn_status staging_buffers(struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    clattn_status st;
    if ((st = clattn_buffer_new(p->device, B * Tq * E, sizeof(float), NULL, "the x staging buffer", &c->x_in)) ||
        (d->cross && (st = clattn_buffer_new(p->device, B * Tk * Ekv, sizeof(float), NULL, "the kv staging buffer", &c->kv_in))) ||
        (d->key_padding_mask &&
         (st = clattn_buffer_new(p->device, B * Tk, 1, NULL, "the key padding mask staging buffer", &c->kpm_in))) ||
        (d->attn_mask && (st = clattn_buffer_new(p->device, Tq * Tk, d->attn_mask == CLATTN_MASK_FLOAT ? 4 : 1, NULL,
                                           "the attention mask staging buffer", &c->mask_in))) ||
        (st = clattn_buffer_new(p->device, B * Tq * p->out_width, sizeof(float), NULL, "the output staging buffer", &c->out_buf)))
        return st;
    return CLATTN_STATUS_SUCCESS;
}

static void release_marks(struct clattn_cl_state *c)
{
    for (int i = 0; i < c->nmarks; i++)
        if (c->marks[i]) clReleaseEvent(c->marks[i]);
    c->nmarks = 0;
}

#define PLAN_MEMS(c)                                                                                          \
    {&c->b_proj, &c->b_proj_kv, &c->w_proj, &c->w_kv, &c->b_q, &c->b_k, &c->b_v, &c->w_out, &c->b_out, &c->proj, \
     &c->proj_kv, &c->q, &c->k, &c->v, &c->s, &c->ctx, &c->merged, &c->x_in, &c->kv_in, &c->kpm_in, &c->mask_in,  \
     &c->out_buf}

size_t clattn_cl_device_bytes(const struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    if (!c) return 0;
    cl_mem *mems[] = PLAN_MEMS(c);
    size_t total = 0;
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) {
        size_t size = 0;
        if (*mems[i] && clGetMemObjectInfo(*mems[i], CL_MEM_SIZE, sizeof size, &size, NULL) == CL_SUCCESS)
            total += size;
    }
    return total;
}

static void clattn_cl_plan_release(struct clattn_plan *p)
{
    struct clattn_cl_state *c = p->cl;
    if (!c) return;
    release_marks(c);
    clattn_fused_release(&c->flash);
    cl_mem *mems[] = PLAN_MEMS(c);
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) clattn_mem_release(mems[i]);
    if (c->k_split) clReleaseKernel(c->k_split);
    if (c->k_merge) clReleaseKernel(c->k_merge);
    if (c->k_fill) clReleaseKernel(c->k_fill);
    if (c->k_softmax) clReleaseKernel(c->k_softmax);
    if (c->heads_prog) clReleaseProgram(c->heads_prog);
    if (c->softmax_prog) clReleaseProgram(c->softmax_prog);
    free(c);
    p->cl = NULL;
}

/* ---- execution */

typedef struct run_io {
    view x, kv, kpm, mask, out, attn; /* attn.mem NULL: use the plan's own score buffer */
    float *attn_host;                 /* host path: where to read the weights, chunk by chunk (or NULL) */
} run_io;

/* A profiling marker at the end of `stage` (-1: the start of the pass, which drops the last
 * pass's markers). Stage s's time is its marker's minus the marker before it. */
static clattn_status mark(struct clattn_plan *p, int stage)
{
    if (!p->profiling) return CLATTN_STATUS_SUCCESS;
    struct clattn_cl_state *c = p->cl;
    if (stage < 0) release_marks(c);
    if (c->nmarks >= (int)(sizeof c->marks / sizeof c->marks[0]))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "too many profiling markers");
    CL_CHECK(clEnqueueMarkerWithWaitList(p->device->queue, 0, NULL, &c->marks[c->nmarks]),
             "clEnqueueMarkerWithWaitList");
    c->mark_stage[c->nmarks++] = stage;
    return CLATTN_STATUS_SUCCESS;
}

/* dst (B, H, T, D) from token-major src rows of width ld, columns col0 + h*D + d, plus bias. */
static clattn_status split(struct clattn_plan *p, view src, size_t ld, size_t col0, cl_mem bias, view dst,
                           size_t T, size_t D, size_t G, int round_half)
{
    const size_t total = p->d.batch * p->d.heads * T * D;
    clattn_args a;
    clattn_args_begin(&a, p->cl->k_split, "split_heads");
    clattn_arg_mem(&a, src.mem);
    clattn_arg_u64(&a, src.off);
    clattn_arg_u32(&a, (cl_uint)ld);
    clattn_arg_u32(&a, (cl_uint)col0);
    clattn_arg_mem(&a, bias);
    clattn_arg_u32(&a, bias != NULL);
    clattn_arg_mem(&a, dst.mem);
    clattn_arg_u64(&a, dst.off);
    clattn_arg_u32(&a, (cl_uint)T);
    clattn_arg_u32(&a, (cl_uint)p->d.heads);
    clattn_arg_u32(&a, (cl_uint)D);
    clattn_arg_u32(&a, (cl_uint)G);
    clattn_arg_u32(&a, (cl_uint)round_half);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(p->device, p->cl->k_split, total, "enqueue split_heads");
}

static clattn_status merge(struct clattn_plan *p, view src, view dst)
{
    const clattn_attention_desc *d = &p->d;
    const size_t total = d->batch * d->heads * d->seq_q * d->head_dim_v;
    clattn_args a;
    clattn_args_begin(&a, p->cl->k_merge, "merge_heads");
    clattn_arg_mem(&a, src.mem);
    clattn_arg_u64(&a, src.off);
    clattn_arg_mem(&a, dst.mem);
    clattn_arg_u64(&a, dst.off);
    clattn_arg_u32(&a, (cl_uint)d->seq_q);
    clattn_arg_u32(&a, (cl_uint)d->heads);
    clattn_arg_u32(&a, (cl_uint)d->head_dim_v);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(p->device, p->cl->k_merge, total, "enqueue merge_heads");
}

static clattn_status fill_bias(struct clattn_plan *p, view dst, cl_mem bias, size_t rows, size_t cols)
{
    clattn_args a;
    clattn_args_begin(&a, p->cl->k_fill, "fill_rows");
    clattn_arg_mem(&a, dst.mem);
    clattn_arg_u64(&a, dst.off);
    clattn_arg_mem(&a, bias);
    clattn_arg_u32(&a, (cl_uint)cols);
    clattn_arg_u64(&a, rows * cols);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(p->device, p->cl->k_fill, rows * cols, "enqueue fill_rows");
}

/* Softmax over the rows row0 .. row0 + rows - 1, stored from s on: one launch of at most
 * dev->max_launch_items work-items at a time (the kernels take their first row as an argument). */
static clattn_status softmax_launch(struct clattn_plan *p, view s, size_t row0, size_t rows, const run_io *io)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    cl_kernel k = c->k_softmax;
    clattn_args a;
    clattn_args_begin(&a, k, c->softmax_wg ? "softmax_rows" : "softmax_rows_item");
    clattn_arg_mem(&a, s.mem);
    clattn_arg_u64(&a, s.off);
    clattn_arg_masks(&a, io->kpm, io->mask, d);
    clattn_arg_u64(&a, row0);
    if (c->softmax_wg == 0) clattn_arg_u64(&a, rows);
    clattn_arg_dropout(&a, d);
    TRY(clattn_args_end(&a));
    if (c->softmax_wg == 0) { /* one work-item per row */
        size_t global = rows;
        clattn_note_launch(global);
        CL_CHECK(clEnqueueNDRangeKernel(p->device->queue, k, 1, NULL, &global, NULL, 0, NULL, NULL),
                 "enqueue softmax_rows_item");
        return CLATTN_STATUS_SUCCESS;
    }
    size_t local = c->softmax_wg, global = rows * local;
    clattn_note_launch(global);
    CL_CHECK(clEnqueueNDRangeKernel(p->device->queue, k, 1, NULL, &global, &local, 0, NULL, NULL),
             "enqueue softmax_rows");
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status softmax(struct clattn_plan *p, view s, size_t row0, size_t rows, const run_io *io)
{
    const size_t per_row = p->cl->softmax_wg ? p->cl->softmax_wg : 1;
    size_t step = p->device->max_launch_items / per_row;
    if (step == 0) step = 1;
    for (size_t r = 0; r < rows; r += step) {
        const size_t n = rows - r < step ? rows - r : step;
        TRY(softmax_launch(p, (view){s.mem, s.off + r * p->d.seq_kv}, row0 + r, n, io));
    }
    return CLATTN_STATUS_SUCCESS;
}

/* C (m, n) = alpha * A (m, k) * op(B) + beta * C, row-major. */
static clattn_status gemm(struct clattn_plan *p, CLBlastTranspose tb, size_t m, size_t n, size_t k, float alpha,
                          view a, size_t lda, view b, size_t ldb, float beta, view cmat, size_t ldc,
                          const char *what)
{
    return clattn_blas_sgemm(p->device, tb, m, n, k, alpha, a.mem, a.off, lda, b.mem, b.off, ldb, beta,
                             cmat.mem, cmat.off, ldc, what);
}

static clattn_status gemm_batched(struct clattn_plan *p, CLBlastTranspose tb, size_t m, size_t n, size_t k,
                                  float alpha, view a, size_t lda, size_t sa, view b, size_t ldb, size_t sb,
                                  view cmat, size_t ldc, size_t sc, size_t count, const char *what)
{
    return clattn_blas_sgemm_strided_batched(p->device, tb, m, n, k, alpha, a.mem, a.off, lda, sa, b.mem,
                                             b.off, ldb, sb, 0.0f, cmat.mem, cmat.off, ldc, sc, count, what);
}

/* Where the projections left Q, K and V: token-major rows of width ld, head h at column col + h*d. */
typedef struct qkv_src {
    view q, k, v;
    size_t q_ld, kv_ld, q_col, k_col, v_col;
} qkv_src;

/* 1. projections (or the inputs themselves). The fused core takes the biases here: the rows are
 * first filled with them and the GEMM adds (beta = 1); the unfused head split adds them later. */
static clattn_status project(struct clattn_plan *p, const run_io *io, qkv_src *src)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    if (!p->has_qkv) {
        src->q = io->x;
        src->k = src->v = d->cross ? io->kv : io->x;
        src->q_ld = E;
        src->kv_ld = Ekv;
        src->q_col = src->k_col = src->v_col = 0;
        return CLATTN_STATUS_SUCCESS;
    }
    view proj = {c->proj, 0};
    if (!d->cross) {
        if (c->b_proj) TRY(fill_bias(p, proj, c->b_proj, B * Tq, c->n_qkv));
        TRY(gemm(p, CLBlastTransposeYes, B * Tq, c->n_qkv, E, 1.0f, io->x, E, (view){c->w_proj, 0}, E,
                 c->b_proj ? 1.0f : 0.0f, proj, c->n_qkv, "QKV projection"));
        src->q = src->k = src->v = proj;
        src->q_ld = src->kv_ld = c->n_qkv;
        src->q_col = 0, src->k_col = H * dk, src->v_col = (H + HK) * dk;
    } else {
        view proj_kv = {c->proj_kv, 0};
        if (c->b_proj) TRY(fill_bias(p, proj, c->b_proj, B * Tq, H * dk));
        TRY(gemm(p, CLBlastTransposeYes, B * Tq, H * dk, E, 1.0f, io->x, E, (view){c->w_proj, 0}, E,
                 c->b_proj ? 1.0f : 0.0f, proj, H * dk, "Q projection"));
        if (c->b_proj_kv) TRY(fill_bias(p, proj_kv, c->b_proj_kv, B * Tk, HK * (dk + dv)));
        TRY(gemm(p, CLBlastTransposeYes, B * Tk, HK * (dk + dv), Ekv, 1.0f, io->kv, Ekv, (view){c->w_kv, 0}, Ekv,
                 c->b_proj_kv ? 1.0f : 0.0f, proj_kv, HK * (dk + dv), "K|V projection"));
        src->q = proj;
        src->k = src->v = proj_kv;
        src->q_ld = H * dk;
        src->kv_ld = HK * (dk + dv);
        src->q_col = 0, src->k_col = 0, src->v_col = HK * dk;
    }
    return mark(p, CLATTN_STAGE_QKV_PROJECTION);
}

/* 2-6, unfused: head split, then per chunk of (b, h) pairs whose scores fit the score buffer (all of
 * them, usually), or per block of query rows of one pair: 3. scores S = scale * Q K^T; 4. masks +
 * softmax + dropout, in place; 5. context C = W V (one head: straight into (B, Tq, dv) rows); then
 * 6. head merge into `merged`. With a caller's attn buffer the blocks are computed in place there. */
static clattn_status core_unfused(struct clattn_plan *p, const run_io *io, const qkv_src *src, view merged)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    const size_t H = d->heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    view Q, K, V;
    if (one_head_view(p) && !p->has_qkv) {
        Q = src->q, K = src->k, V = src->v; /* (B, T, E) is (B, 1, T, E) already */
    } else {
        Q = (view){c->q, 0}, K = (view){c->k, 0}, V = (view){c->v, 0};
        const size_t G = H / d->kv_heads; /* K and V expanded to H heads: the batched GEMMs see plain MHA */
        TRY(split(p, src->q, src->q_ld, src->q_col, c->b_q, Q, Tq, dk, 1, 0));
        TRY(split(p, src->k, src->kv_ld, src->k_col, c->b_k, K, Tk, dk, G, d->kv_half));
        TRY(split(p, src->v, src->kv_ld, src->v_col, c->b_v, V, Tk, dv, G, d->kv_half));
        TRY(mark(p, CLATTN_STAGE_HEAD_SPLIT));
    }
    view C = one_head_view(p) ? merged : (view){c->ctx, 0};
    const size_t BH = B * H, chunk = c->chunk, rb = c->rows_blk;
    int first = 1;
    for (size_t g0 = 0; g0 < BH; g0 += chunk) {
        const size_t n = BH - g0 < chunk ? BH - g0 : chunk;
        for (size_t i0 = 0; i0 < Tq; i0 += rb) { /* one block when rb = Tq (then n pairs are contiguous) */
            const size_t r = Tq - i0 < rb ? Tq - i0 : rb, row0 = g0 * Tq + i0;
            view S = io->attn.mem ? (view){io->attn.mem, io->attn.off + row0 * Tk} : (view){c->s, 0};
            view Qg = {Q.mem, Q.off + row0 * dk}, Kg = {K.mem, K.off + g0 * Tk * dk};
            view Vg = {V.mem, V.off + g0 * Tk * dv}, Cg = {C.mem, C.off + row0 * dv};
            TRY(gemm_batched(p, CLBlastTransposeYes, r, Tk, dk, d->scale, Qg, dk, Tq * dk, Kg, dk, Tk * dk, S, Tk,
                             r * Tk, n, "scores GEMM"));
            if (first) TRY(mark(p, CLATTN_STAGE_SCORES));
            TRY(softmax(p, S, row0, n * r, io));
            if (first) TRY(mark(p, CLATTN_STAGE_SOFTMAX));
            first = 0;
            if (io->attn_host)
                CL_CHECK(clEnqueueReadBuffer(p->device->queue, S.mem, CL_FALSE, S.off * sizeof(float),
                                             n * r * Tk * sizeof(float), io->attn_host + row0 * Tk, 0, NULL, NULL),
                         "reading the attention weights");
            TRY(gemm_batched(p, CLBlastTransposeNo, r, dv, Tk, 1.0f, S, Tk, r * Tk, Vg, dv, Tk * dv, Cg, dv,
                             Tq * dv, n, "context GEMM"));
        }
    }
    TRY(mark(p, CLATTN_STAGE_CONTEXT));
    if (!one_head_view(p)) {
        TRY(merge(p, C, merged));
        TRY(mark(p, CLATTN_STAGE_HEAD_MERGE));
    }
    return CLATTN_STATUS_SUCCESS;
}

/* 2-6, fused: one kernel from the projections' rows to the merged rows. */
static clattn_status core_fused(struct clattn_plan *p, const run_io *io, const qkv_src *src, view merged)
{
    const clattn_attention_desc *d = &p->d;
    clattn_fused_io f = {.q = {src->q.mem, src->q.off + src->q_col},
                         .k = {src->k.mem, src->k.off + src->k_col},
                         .v = {src->v.mem, src->v.off + src->v_col},
                         .out = merged,
                         .kpm = io->kpm,
                         .mask = io->mask,
                         .q_ld = src->q_ld,
                         .k_ld = src->kv_ld,
                         .v_ld = src->kv_ld,
                         .out_ld = d->heads * d->head_dim_v};
    TRY(clattn_fused_run(p->device, d, &p->cl->flash, &f));
    return mark(p, CLATTN_STAGE_ATTENTION);
}

/* The whole forward pass, enqueued on the device queue. */
static clattn_status run(struct clattn_plan *p, const run_io *io)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, H = d->heads, dv = d->head_dim_v;
    TRY(mark(p, -1));
    qkv_src src;
    TRY(project(p, io, &src));
    view merged = p->has_out ? (view){c->merged, 0} : io->out;
    TRY(c->fused ? core_fused(p, io, &src, merged) : core_unfused(p, io, &src, merged));
    /* 7. output projection: out = merged Wo^T + bo */
    if (p->has_out) {
        if (c->b_out) TRY(fill_bias(p, io->out, c->b_out, B * Tq, d->out_dim));
        TRY(gemm(p, CLBlastTransposeYes, B * Tq, d->out_dim, H * dv, 1.0f, merged, H * dv, (view){c->w_out, 0},
                 H * dv, c->b_out ? 1.0f : 0.0f, io->out, d->out_dim, "output projection"));
        TRY(mark(p, CLATTN_STAGE_OUT_PROJECTION));
    }
    return CLATTN_STATUS_SUCCESS;
}

typedef struct pass_ctx {
    struct clattn_plan *p;
    const run_io *io;
} pass_ctx;

static clattn_status pass(void *ctx)
{
    const pass_ctx *pc = ctx;
    return run(pc->p, pc->io);
}

static clattn_status clattn_cl_execute_host(struct clattn_plan *p, const clattn_attention_args *a)
{
    struct clattn_cl_state *c = p->cl;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    if (!p->host_staging)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "this plan runs on device buffers only (no staging buffers)");
    /* the weights are read chunk by chunk into a staging array, copied out only on success */
    const size_t n_attn = B * d->heads * Tq * Tk;
    float *attn_host = NULL;
    if (a->attn && !(attn_host = clattn_malloc(n_attn * sizeof *attn_host)))
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "staging the attention weights (%zu floats)", n_attn);
    const clattn_transfer in[] = {
        {c->x_in, B * Tq * d->embed * sizeof(float), (void *)a->x, "x"},
        {d->cross ? c->kv_in : NULL, B * Tk * d->kv_embed * sizeof(float), (void *)a->kv, "kv"},
        {d->key_padding_mask ? c->kpm_in : NULL, B * Tk, (void *)a->key_padding_mask, "the key padding mask"},
        {d->attn_mask ? c->mask_in : NULL, Tq * Tk * (d->attn_mask == CLATTN_MASK_FLOAT ? sizeof(float) : 1),
         (void *)a->attn_mask, "the attention mask"}};
    const clattn_transfer out = {c->out_buf, B * Tq * p->out_width * sizeof(float), a->out, "the output"};
    run_io io = {.x = {c->x_in, 0}, .kv = {c->kv_in, 0}, .kpm = {c->kpm_in, 0}, .mask = {c->mask_in, 0},
                 .out = {c->out_buf, 0}, .attn = {NULL, 0}, .attn_host = attn_host};
    pass_ctx pc = {p, &io};
    clattn_status st = clattn_exec_host(p->device, in, 4, pass, &pc, &out);
    if (st == CLATTN_STATUS_SUCCESS && a->attn) memcpy(a->attn, attn_host, n_attn * sizeof *attn_host);
    free(attn_host);
    return st;
}

static clattn_status clattn_cl_execute_buffers(struct clattn_plan *p, const clattn_attention_buffers *b, cl_uint nwait,
                                        const cl_event *wait, cl_event *event)
{
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    TRY(clattn_buffer_check(b->x.mem, b->x.offset, B * Tq * d->embed, 4, "x"));
    if (d->cross) TRY(clattn_buffer_check(b->kv.mem, b->kv.offset, B * Tk * d->kv_embed, 4, "kv"));
    if (d->key_padding_mask) TRY(clattn_buffer_check(b->key_padding_mask.mem, b->key_padding_mask.offset, B * Tk, 1,
                                              "key_padding_mask"));
    if (d->attn_mask) TRY(clattn_buffer_check(b->attn_mask.mem, b->attn_mask.offset, Tq * Tk,
                                       d->attn_mask == CLATTN_MASK_FLOAT ? 4 : 1, "attn_mask"));
    TRY(clattn_buffer_check(b->out.mem, b->out.offset, B * Tq * p->out_width, 4, "out"));
    if (b->attn.mem) TRY(clattn_buffer_check(b->attn.mem, b->attn.offset, B * d->heads * Tq * Tk, 4, "attn"));
    run_io io = {.x = {b->x.mem, b->x.offset}, .kv = {b->kv.mem, b->kv.offset},
                 .kpm = {b->key_padding_mask.mem, b->key_padding_mask.offset},
                 .mask = {b->attn_mask.mem, b->attn_mask.offset}, .out = {b->out.mem, b->out.offset},
                 .attn = {b->attn.mem, b->attn.offset}};
    pass_ctx pc = {p, &io};
    return clattn_exec_buffers(p->device, nwait, wait, pass, &pc, event);
}

static clattn_status clattn_cl_stage_times(struct clattn_plan *p, double ms[CLATTN_NSTAGES])
{
    struct clattn_cl_state *c = p->cl;
    for (int s = 0; s < CLATTN_NSTAGES; s++) ms[s] = 0.0;
    if (!p->profiling || c->nmarks == 0) return CLATTN_STATUS_SUCCESS;
    CL_CHECK(clWaitForEvents((cl_uint)c->nmarks, c->marks), "waiting for the profiled pass");
    cl_ulong prev = 0;
    for (int k = 0; k < c->nmarks; k++) {
        cl_ulong t = 0;
        CL_CHECK(clGetEventProfilingInfo(c->marks[k], CL_PROFILING_COMMAND_END, sizeof t, &t, NULL),
                 "reading profiling timestamps");
        if (k > 0 && t > prev) ms[c->mark_stage[k]] += (double)(t - prev) * 1e-6;
        prev = t;
    }
    return CLATTN_STATUS_SUCCESS;
}

/* ---- the two OpenCL backends: one shell (projections, output projection, staging), two cores */

#define CL_BACKEND(NAME, WEIGHTS)                                                                       \
    {.name = NAME, .produces_weights = WEIGHTS, .init = clattn_cl_plan_init, .release = clattn_cl_plan_release, \
     .execute_host = clattn_cl_execute_host, .execute_buffers = clattn_cl_execute_buffers,                     \
     .stage_times = clattn_cl_stage_times}
const clattn_backend_ops clattn_backend_unfused = CL_BACKEND("unfused", 1);
const clattn_backend_ops clattn_backend_fused = CL_BACKEND("fused", 0);
