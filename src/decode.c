/* decode.c: the KV cache and decode plans (clattn.h, "KV cache and decoding").
 *
 * A decode execution with n new tokens per sequence:
 *   1. projections      x (B*n, E) -> [Q | K | V] rows, one CLBlast GEMM (biases as prefilled rows)
 *   2. append           kv_append: each real token's K and V into the cache at lens[b] + t (float or half)
 *   3. attend           decode_attend over the cache (cl/decode.cl), split-K into `parts` when few
 *                       work-items would otherwise stream a long cache; decode_combine merges the parts
 *   4. out projection   CLBlast GEMM (bias as prefilled rows)
 * The reference does the same on the host, in double, from the same description.
 * Cache lengths live on the host (the caller knows them anyway) and are uploaded with each call; they
 * change only when a call succeeds.
 */
#include "backend.h"
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DECODE_MAX_HEAD 256  /* dk and dv the decode kernel takes */
#define DECODE_MAX_PARTS 64  /* split-K parts per query row */

struct clattn_kv_cache {
    clattn_device *device;
    clattn_kv_cache_desc d;
    size_t *len;               /* (B) current lengths */
    float *k_host, *v_host;    /* ref: (B, HK, Tmax, dk|dv), already rounded when HALF */
    cl_mem k, v;               /* OpenCL: the same layout, float or half */
};

/* ---------------------------------------------------------------- the cache */

static size_t kv_elem_size(const clattn_kv_cache_desc *d) { return d->type == CLATTN_KV_HALF ? 2 : 4; }

clattn_status clattn_kv_cache_create(clattn_device *device, const clattn_kv_cache_desc *desc, clattn_kv_cache **cache)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    *cache = NULL;
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    if (!desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc is NULL");
    clattn_kv_cache_desc d = *desc;
    if (d.type != CLATTN_KV_FLOAT && d.type != CLATTN_KV_HALF)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "type %d is not CLATTN_KV_FLOAT or CLATTN_KV_HALF", (int)d.type);
    if (d.batch == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "batch must be >= 1");
    if (d.capacity == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "capacity must be >= 1");
    if (d.kv_heads == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "kv_heads must be >= 1");
    if (d.head_dim_qk == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "head_dim_qk must be >= 1");
    if (d.head_dim_v == 0) d.head_dim_v = d.head_dim_qk;
    if (d.capacity > 0xFFFFFFFFu || d.batch > 0xFFFFFFFFu || d.kv_heads > 0xFFFFFFFFu)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "capacity, batch and kv_heads must fit 32 bits");
    size_t nk, nv, t;
    if (clattn_mul_overflows(d.batch, d.kv_heads, &t) || clattn_mul_overflows(t, d.capacity, &t) ||
        clattn_mul_overflows(t, d.head_dim_qk, &nk) || clattn_mul_overflows(t, d.head_dim_v, &nv) ||
        clattn_mul_overflows(nk + nv, 4, &t) || nk + nv < nk)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "the cache's size overflows size_t");

    clattn_kv_cache *c = clattn_calloc(1, sizeof *c);
    if (!c) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache");
    c->device = device;
    c->d = d;
    c->len = clattn_calloc(d.batch, sizeof *c->len);
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (!c->len) {
        st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache lengths");
    } else if (device->backend == CLATTN_BACKEND_REF) {
        c->k_host = clattn_calloc(nk, sizeof(float));
        c->v_host = clattn_calloc(nv, sizeof(float));
        if (!c->k_host || !c->v_host)
            st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache (%zu floats)", nk + nv);
    } else {
        const size_t es = kv_elem_size(&d);
        if ((nk + nv) * es > device->global_mem)
            st = clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "the cache needs %zu bytes, more than the device's "
                             "global memory (%zu bytes)", (nk + nv) * es, device->global_mem);
        else if ((st = clattn_buffer_new(device, nk, es, NULL, "the key cache", &c->k)) == CLATTN_STATUS_SUCCESS)
            st = clattn_buffer_new(device, nv, es, NULL, "the value cache", &c->v);
    }
    if (st != CLATTN_STATUS_SUCCESS) {
        clattn_kv_cache_free(c);
        return st;
    }
    *cache = c;
    return CLATTN_STATUS_SUCCESS;
}

void clattn_kv_cache_free(clattn_kv_cache *cache)
{
    if (!cache) return;
    clattn_mem_release(&cache->k);
    clattn_mem_release(&cache->v);
    free(cache->k_host);
    free(cache->v_host);
    free(cache->len);
    free(cache);
}

clattn_status clattn_kv_cache_desc_get(const clattn_kv_cache *cache, clattn_kv_cache_desc *desc)
{
    clattn_clear_error();
    if (!cache || !desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache or desc is NULL");
    *desc = cache->d;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_reset(clattn_kv_cache *cache)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    for (size_t b = 0; b < cache->d.batch; b++) cache->len[b] = 0;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_truncate(clattn_kv_cache *cache, const size_t *lengths)
{
    clattn_clear_error();
    if (!cache || !lengths) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache or lengths is NULL");
    for (size_t b = 0; b < cache->d.batch; b++)
        if (lengths[b] > cache->len[b])
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "truncate: lengths[%zu] = %zu is more than the "
                               "sequence's length %zu (truncation only drops the tail)", b, lengths[b], cache->len[b]);
    for (size_t b = 0; b < cache->d.batch; b++) cache->len[b] = lengths[b];
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_lengths(const clattn_kv_cache *cache, size_t *lengths)
{
    clattn_clear_error();
    if (!cache || !lengths) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache or lengths is NULL");
    memcpy(lengths, cache->len, cache->d.batch * sizeof *lengths);
    return CLATTN_STATUS_SUCCESS;
}

size_t clattn_kv_cache_device_bytes(const clattn_kv_cache *cache)
{
    if (!cache || !cache->k) return 0;
    const size_t rows = cache->d.batch * cache->d.kv_heads * cache->d.capacity;
    return rows * (cache->d.head_dim_qk + cache->d.head_dim_v) * kv_elem_size(&cache->d);
}

/* One of the two tensors (B, HK, Tmax, D) as float into dst, zero past each sequence's length. */
static clattn_status cache_read_one(const clattn_kv_cache *c, cl_mem m, const float *host, size_t D, float *dst,
                                    const char *what)
{
    const clattn_kv_cache_desc *d = &c->d;
    const size_t rows = d->batch * d->kv_heads * d->capacity, n = rows * D;
    if (host) {
        memcpy(dst, host, n * sizeof *dst);
    } else {
        const size_t es = kv_elem_size(d);
        void *raw = clattn_malloc(n * es);
        if (!raw) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reading the %s (%zu bytes)", what, n * es);
        cl_int err = clEnqueueReadBuffer(c->device->queue, m, CL_TRUE, 0, n * es, raw, 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            free(raw);
            return clattn_fail((clattn_status)err, "reading the %s failed (%d: %s)", what, err, clattn_status_string(err));
        }
        for (size_t i = 0; i < n; i++)
            dst[i] = es == 2 ? clattn_half_to_float(((const uint16_t *)raw)[i]) : ((const float *)raw)[i];
        free(raw);
    }
    for (size_t b = 0; b < d->batch; b++)
        for (size_t g = 0; g < d->kv_heads; g++) {
            float *p = dst + ((b * d->kv_heads + g) * d->capacity + c->len[b]) * D;
            memset(p, 0, (d->capacity - c->len[b]) * D * sizeof *p);
        }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_read(const clattn_kv_cache *cache, float *k, float *v)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    if (k) TRY(cache_read_one(cache, cache->k, cache->k_host, cache->d.head_dim_qk, k, "key cache"));
    if (v) TRY(cache_read_one(cache, cache->v, cache->v_host, cache->d.head_dim_v, v, "value cache"));
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_write(clattn_kv_cache *cache, const float *k, const float *v, const size_t *lengths)
{
    clattn_clear_error();
    if (!cache || !k || !v || !lengths)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache, k, v or lengths is NULL");
    const clattn_kv_cache_desc *d = &cache->d;
    for (size_t b = 0; b < d->batch; b++)
        if (lengths[b] > d->capacity)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "lengths[%zu] = %zu exceeds the capacity (%zu)", b,
                               lengths[b], d->capacity);
    const size_t rows = d->batch * d->kv_heads * d->capacity;
    const size_t nk = rows * d->head_dim_qk, nv = rows * d->head_dim_v;
    if (cache->k_host) {
        for (size_t i = 0; i < nk; i++) cache->k_host[i] = d->type == CLATTN_KV_HALF ? clattn_round_half(k[i]) : k[i];
        for (size_t i = 0; i < nv; i++) cache->v_host[i] = d->type == CLATTN_KV_HALF ? clattn_round_half(v[i]) : v[i];
    } else {
        const size_t es = kv_elem_size(d);
        const float *src[2] = {k, v};
        const size_t n[2] = {nk, nv};
        cl_mem dst[2] = {cache->k, cache->v};
        for (int t = 0; t < 2; t++) {
            void *raw = (void *)src[t];
            if (es == 2) {
                uint16_t *h = clattn_malloc(n[t] * sizeof *h);
                if (!h) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "converting the cache to half");
                for (size_t i = 0; i < n[t]; i++) h[i] = clattn_float_to_half(src[t][i]);
                raw = h;
            }
            cl_int err = clEnqueueWriteBuffer(cache->device->queue, dst[t], CL_TRUE, 0, n[t] * es, raw, 0, NULL, NULL);
            if (es == 2) free(raw);
            if (err != CL_SUCCESS)
                return clattn_fail((clattn_status)err, "writing the %s cache failed (%d: %s)", t ? "value" : "key", err,
                                   clattn_status_string(err));
        }
    }
    memcpy(cache->len, lengths, d->batch * sizeof *cache->len);
    return CLATTN_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- the decode plan */

typedef struct decode_attend_kernel {
    cl_program prog;
    cl_kernel attend;
    size_t rows;                 /* R: query rows per work-item */
} decode_attend_kernel;

struct clattn_decode_plan {
    clattn_plan *base;           /* the description (resolved) and the weights, LINEAR */
    size_t max_parts;            /* 0 = automatic */
    size_t last_parts;
    /* OpenCL */
    decode_attend_kernel dec, pre; /* few rows per work-item (decode) and many (prefill); both built at creation */
    cl_kernel k_append, k_combine, k_fill, k_linear;
    cl_program heads_prog, linear_prog;
    size_t vw;
    size_t n_qkv;                /* columns of the projection rows: H*dk + HK*(dk + dv) */
    cl_mem w_proj, b_proj, w_out, b_out;
    cl_mem x_in, proj, merged, out_buf, lens_buf, valid_buf, part_ml, part_acc;
    size_t part_slots;           /* (row, part) slots of part_ml / part_acc */
};

static clattn_status validate_decode(const clattn_attention_desc *d)
{
    if (d->cross) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan is self-attention (cross = 0)");
    if (!d->causal) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan needs causal = 1");
    if (d->attn_mask != CLATTN_MASK_NONE || d->key_padding_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan takes no attn_mask or key_padding_mask (the "
                           "cache lengths and args.valid say which positions exist)");
    if (d->dropout != 0.0f) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan takes no dropout");
    if (d->need_weights)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan does not return the attention weights");
    if (d->algorithm == CLATTN_ALGORITHM_UNFUSED)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan runs its own fused kernel: algorithm "
                           "UNFUSED is not available (use AUTO)");
    return CLATTN_STATUS_SUCCESS;
}

void clattn_decode_plan_free(clattn_decode_plan *plan)
{
    if (!plan) return;
    decode_attend_kernel *ks[] = {&plan->dec, &plan->pre};
    for (int i = 0; i < 2; i++) {
        if (ks[i]->attend) clReleaseKernel(ks[i]->attend);
        if (ks[i]->prog) clReleaseProgram(ks[i]->prog);
    }
    if (plan->k_append) clReleaseKernel(plan->k_append);
    if (plan->k_combine) clReleaseKernel(plan->k_combine);
    if (plan->k_fill) clReleaseKernel(plan->k_fill);
    if (plan->k_linear) clReleaseKernel(plan->k_linear);
    if (plan->heads_prog) clReleaseProgram(plan->heads_prog);
    if (plan->linear_prog) clReleaseProgram(plan->linear_prog);
    cl_mem *mems[] = {&plan->w_proj, &plan->b_proj, &plan->w_out, &plan->b_out, &plan->x_in, &plan->proj,
                      &plan->merged, &plan->out_buf, &plan->lens_buf, &plan->valid_buf, &plan->part_ml,
                      &plan->part_acc};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) clattn_mem_release(mems[i]);
    clattn_plan_free(plan->base);
    free(plan);
}

/* Build decode.cl for R rows per work-item; the first build also yields kv_append and decode_combine. */
static clattn_status build_attend(clattn_decode_plan *dp, size_t rows, decode_attend_kernel *k, int with_helpers)
{
    const clattn_device *dev = dp->base->device;
    const clattn_attention_desc *d = &dp->base->d;
    char opts[300];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDK=%zu -DDV=%zu -DGROUP=%zu -DWINDOW=%zu -DKV_HALF=%d -DR=%zu -DBK=16 "
             "-DVW=%zu", d->head_dim_qk, d->head_dim_v, d->heads / d->kv_heads, d->window, d->kv_half, rows, dp->vw);
    const char *src[] = {"online", "decode"};
    TRY(clattn_program_build(dev, src, 2, opts, &k->prog));
    k->rows = rows;
    cl_int err;
    k->attend = clCreateKernel(k->prog, "decode_attend", &err);
    if (err == CL_SUCCESS && with_helpers) dp->k_append = clCreateKernel(k->prog, "kv_append", &err);
    if (err == CL_SUCCESS && with_helpers) dp->k_combine = clCreateKernel(k->prog, "decode_combine", &err);
    CL_CHECK(err, "clCreateKernel (decode)");
    return CLATTN_STATUS_SUCCESS;
}

/* One execution's pass (decode_pass_run), or the warm-up at plan creation. */
typedef struct decode_pass {
    clattn_decode_plan *dp;
    cl_mem cache_k, cache_v;
    size_t Tmax, n, parts;
    const decode_attend_kernel *k;
    int warm;        /* plan creation: every launch with no work (totals 0), to compile the kernels */
} decode_pass;

static clattn_status decode_pass_run(void *ctx);

static clattn_status decode_cl_init(clattn_decode_plan *dp)
{
    clattn_plan *p = dp->base;
    const clattn_device *dev = p->device;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tn = d->seq_q, E = d->embed, H = d->heads, HK = d->kv_heads;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v, G = H / HK;
    dp->vw = dk % 8 == 0 && dv % 8 == 0 ? 8 : dk % 4 == 0 && dv % 4 == 0 ? 4 : 1;
    const size_t r_pre = dv > 128 ? 8 : 16;
    const size_t r_dec = G < r_pre ? G : r_pre;
    TRY(build_attend(dp, r_dec, &dp->dec, 1));
    TRY(build_attend(dp, r_pre, &dp->pre, 0));
    const char *heads_src[] = {"half", "heads"};
    TRY(clattn_program_build(dev, heads_src, 2, "-cl-std=CL1.2", &dp->heads_prog));
    cl_int err;
    dp->k_fill = clCreateKernel(dp->heads_prog, "fill_rows", &err);
    CL_CHECK(err, "clCreateKernel (fill_rows)");
    const char *linear_src[] = {"linear"};
    TRY(clattn_program_build(dev, linear_src, 1, "-cl-std=CL1.2 -DVW=8", &dp->linear_prog));
    dp->k_linear = clCreateKernel(dp->linear_prog, "linear_small", &err);
    CL_CHECK(err, "clCreateKernel (linear_small)");

    /* weights: [Wq; Wk; Wv] and the biases as one row ([bq | bk | bv], zeros where absent) */
    if (p->has_qkv) {
        dp->n_qkv = H * dk + HK * (dk + dv);
        float *w = clattn_malloc(dp->n_qkv * E * sizeof *w);
        if (!w) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "concatenating Q/K/V weights");
        memcpy(w, p->w_query, H * dk * E * sizeof *w);
        memcpy(w + H * dk * E, p->w_key, HK * dk * E * sizeof *w);
        memcpy(w + (H + HK) * dk * E, p->w_value, HK * dv * E * sizeof *w);
        clattn_status st = clattn_buffer_new(dev, dp->n_qkv * E, 4, w, "the Q|K|V weights", &dp->w_proj);
        free(w);
        TRY(st);
        if (p->b_query || p->b_key || p->b_value) {
            float *b = clattn_calloc(dp->n_qkv, sizeof *b);
            if (!b) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "concatenating the Q/K/V biases");
            if (p->b_query) memcpy(b, p->b_query, H * dk * sizeof *b);
            if (p->b_key) memcpy(b + H * dk, p->b_key, HK * dk * sizeof *b);
            if (p->b_value) memcpy(b + (H + HK) * dk, p->b_value, HK * dv * sizeof *b);
            st = clattn_buffer_new(dev, dp->n_qkv, 4, b, "the Q|K|V biases", &dp->b_proj);
            free(b);
            TRY(st);
        }
        TRY(clattn_buffer_new(dev, B * Tn * dp->n_qkv, 4, NULL, "the Q|K|V projections", &dp->proj));
    }
    if (p->has_out) {
        TRY(clattn_buffer_new(dev, d->out_dim * H * dv, 4, p->w_out, "w_out", &dp->w_out));
        if (p->b_out) TRY(clattn_buffer_new(dev, d->out_dim, 4, p->b_out, "b_out", &dp->b_out));
        TRY(clattn_buffer_new(dev, B * Tn * H * dv, 4, NULL, "the attention output", &dp->merged));
    }
    TRY(clattn_buffer_new(dev, B * Tn * E, 4, NULL, "the x staging buffer", &dp->x_in));
    TRY(clattn_buffer_new(dev, B * Tn * p->out_width, 4, NULL, "the output staging buffer", &dp->out_buf));
    TRY(clattn_buffer_new(dev, B, 4, NULL, "the cache lengths", &dp->lens_buf));
    TRY(clattn_buffer_new(dev, B, 4, NULL, "the valid token counts", &dp->valid_buf));
    /* split-K partials: enough for calls of up to 4 new tokens with DECODE_MAX_PARTS parts each */
    const size_t rows = B * (Tn < 4 ? Tn : 4) * H;
    dp->part_slots = rows * DECODE_MAX_PARTS;
    TRY(clattn_buffer_new(dev, dp->part_slots * 2, 4, NULL, "the split-K partial sums", &dp->part_ml));
    TRY(clattn_buffer_new(dev, dp->part_slots * dv, 4, NULL, "the split-K partial outputs", &dp->part_acc));
    /* every kernel launched once with no work: compiled now, not in the first decode step */
    decode_pass warm = {dp, dp->part_acc, dp->part_acc, 1, 1, 2, &dp->dec, 1};
    TRY(decode_pass_run(&warm));
    CL_CHECK(clFinish(dev->queue), "warming the decode kernels");
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_decode_plan_create(clattn_device *device, const clattn_attention_desc *desc,
                                        const clattn_attention_weights *weights, clattn_decode_plan **plan)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    *plan = NULL;
    if (!desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc is NULL");
    TRY(validate_decode(desc));
    clattn_plan *base = NULL;
    TRY(clattn_plan_prepare(device, desc, weights, 0, &base));
    const size_t dk = base->d.head_dim_qk, dv = base->d.head_dim_v;
    if (dk > DECODE_MAX_HEAD || dv > DECODE_MAX_HEAD) {
        clattn_plan_free(base);
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "the decode kernel takes head sizes up to %d (dk = %zu, dv = %zu)",
                           DECODE_MAX_HEAD, dk, dv);
    }
    clattn_decode_plan *dp = clattn_calloc(1, sizeof *dp);
    if (!dp) {
        clattn_plan_free(base);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the decode plan");
    }
    dp->base = base;
    dp->last_parts = 1;
    if (device->backend == CLATTN_BACKEND_OPENCL) {
        base->d.algorithm = CLATTN_ALGORITHM_FUSED;
        clattn_status st = decode_cl_init(dp);
        if (st != CLATTN_STATUS_SUCCESS) {
            clattn_decode_plan_free(dp);
            return st;
        }
    }
    *plan = dp;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_decode_plan_set_splits(clattn_decode_plan *plan, size_t max_parts)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (max_parts > DECODE_MAX_PARTS)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "max_parts %zu: at most %d", max_parts, DECODE_MAX_PARTS);
    plan->max_parts = max_parts;
    return CLATTN_STATUS_SUCCESS;
}

size_t clattn_decode_plan_last_splits(const clattn_decode_plan *plan) { return plan ? plan->last_parts : 0; }

/* ---- the reference */

/* out (B, n, out_width); the cache is written only after everything else succeeded. */
static clattn_status decode_ref(clattn_decode_plan *dp, clattn_kv_cache *c, const float *x, size_t n,
                                const size_t *valid, float *out)
{
    const clattn_plan *p = dp->base;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, E = d->embed, H = d->heads, HK = d->kv_heads, G = H / HK;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v, Tmax = c->d.capacity;
    float *Q = clattn_malloc(B * n * H * dk * sizeof *Q);
    float *K = clattn_malloc(B * n * HK * dk * sizeof *K);
    float *V = clattn_malloc(B * n * HK * dv * sizeof *V);
    float *ctx = clattn_calloc(B * n * H * dv, sizeof *ctx);
    double *w = clattn_malloc((Tmax ? Tmax : 1) * sizeof *w);
    if (!Q || !K || !V || !ctx || !w) {
        free(Q); free(K); free(V); free(ctx); free(w);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference decode: allocating Q/K/V");
    }
    /* 1. projections (or x itself), K and V rounded as the cache stores them */
    if (p->has_qkv) {
        clattn_ref_linear(x, B * n, E, p->w_query, p->b_query, H * dk, Q);
        clattn_ref_linear(x, B * n, E, p->w_key, p->b_key, HK * dk, K);
        clattn_ref_linear(x, B * n, E, p->w_value, p->b_value, HK * dv, V);
    } else {
        memcpy(Q, x, B * n * E * sizeof *Q);
        memcpy(K, x, B * n * E * sizeof *K);
        memcpy(V, x, B * n * E * sizeof *V);
    }
    if (d->kv_half) {
        for (size_t i = 0; i < B * n * HK * dk; i++) K[i] = clattn_round_half(K[i]);
        for (size_t i = 0; i < B * n * HK * dv; i++) V[i] = clattn_round_half(V[i]);
    }
    /* 2. append: cache (b, g, len + t) = K (b, t, g) for the real tokens */
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < valid[b]; t++)
            for (size_t g = 0; g < HK; g++) {
                const size_t pos = (b * HK + g) * Tmax + c->len[b] + t;
                memcpy(c->k_host + pos * dk, K + (b * n + t) * HK * dk + g * dk, dk * sizeof(float));
                memcpy(c->v_host + pos * dv, V + (b * n + t) * HK * dv + g * dv, dv * sizeof(float));
            }
    /* 3. token t of sequence b at position P = len + t sees the keys j <= P with P - j < window */
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < valid[b]; t++)
            for (size_t h = 0; h < H; h++) {
                const size_t P = c->len[b] + t, g = h / G;
                const size_t lo = d->window && P + 1 > d->window ? P + 1 - d->window : 0;
                const float *q = Q + (b * n + t) * H * dk + h * dk;
                const float *kb = c->k_host + (b * HK + g) * Tmax * dk, *vb = c->v_host + (b * HK + g) * Tmax * dv;
                double max = -INFINITY;
                int any_nan = 0;
                for (size_t j = lo; j <= P; j++) {
                    double s = 0.0;
                    for (size_t e = 0; e < dk; e++) s += (double)q[e] * (double)kb[j * dk + e];
                    w[j] = s * d->scale;
                    if (isnan(w[j])) any_nan = 1;
                    else if (w[j] > max) max = w[j];
                }
                double sum = 0.0;
                for (size_t j = lo; j <= P; j++) sum += (w[j] = max == -INFINITY ? 0.0 : exp(w[j] - max));
                float *o = ctx + (b * n + t) * H * dv + h * dv;
                for (size_t e = 0; e < dv; e++) {
                    double acc = 0.0;
                    for (size_t j = lo; j <= P; j++) acc += w[j] * (double)vb[j * dv + e];
                    o[e] = any_nan ? NAN : max == -INFINITY ? 0.0f : (float)(acc / sum);
                }
            }
    /* 4. output projection */
    if (p->has_out) clattn_ref_linear(ctx, B * n, H * dv, p->w_out, p->b_out, d->out_dim, out);
    else memcpy(out, ctx, B * n * H * dv * sizeof *out);
    free(Q); free(K); free(V); free(ctx); free(w);
    return CLATTN_STATUS_SUCCESS;
}

/* ---- OpenCL */


/* Launch `total` work-items of k: one per work-group on a CPU for the attention kernel (per_item: its few
 * long work-items spread over the cores), else in work-groups of 64. total = 0 launches one work-group
 * that does nothing (the kernels check their bound): drivers that compile a kernel for its work-group
 * size at the first launch (PoCL) do it then, at plan creation, not in the first decode step. */
static clattn_status run_1d(const clattn_device *dev, cl_kernel k, size_t total, int per_item, const char *what)
{
    const int one = per_item && dev->dclass == CLATTN_CLASS_CPU;
    if (total == 0) {
        size_t local = one ? 1 : dev->max_work_group < 64 ? dev->max_work_group : 64, global = local;
        CL_CHECK(clEnqueueNDRangeKernel(dev->queue, k, 1, NULL, &global, &local, 0, NULL, NULL), what);
        return CLATTN_STATUS_SUCCESS;
    }
    if (!one) return clattn_enqueue_1d(dev, k, total, what);
    const size_t step = dev->max_launch_items;
    for (size_t start = 0; start < total; start += step) {
        size_t global = total - start < step ? total - start : step, local = 1, offset = start;
        clattn_note_launch(global);
        CL_CHECK(clEnqueueNDRangeKernel(dev->queue, k, 1, &offset, &global, &local, 0, NULL, NULL), what);
    }
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status fill_rows(const clattn_decode_plan *dp, cl_mem dst, cl_mem bias, size_t rows, size_t cols)
{
    clattn_args a;
    clattn_args_begin(&a, dp->k_fill, "fill_rows");
    clattn_arg_mem(&a, dst);
    clattn_arg_u64(&a, 0);
    clattn_arg_mem(&a, bias);
    clattn_arg_u32(&a, (cl_uint)cols);
    clattn_arg_u64(&a, rows * cols);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(dp->base->device, dp->k_fill, rows * cols, "enqueue fill_rows");
}

#define DECODE_SMALL_ROWS 16 /* up to this many rows, projections run linear_small instead of a CLBlast GEMM */

static clattn_status linear_small(const clattn_decode_plan *dp, size_t m, size_t n, size_t k, cl_mem x, cl_mem w,
                                  cl_mem bias, cl_mem y, int warm)
{
    if (warm) n = 0;
    clattn_args a;
    clattn_args_begin(&a, dp->k_linear, "linear_small");
    clattn_arg_mem(&a, x);
    clattn_arg_u64(&a, 0);
    clattn_arg_u32(&a, (cl_uint)k);
    clattn_arg_mem(&a, w);
    clattn_arg_mem(&a, bias);
    clattn_arg_u32(&a, bias != NULL);
    clattn_arg_mem(&a, y);
    clattn_arg_u64(&a, 0);
    clattn_arg_u32(&a, (cl_uint)n);
    clattn_arg_u32(&a, (cl_uint)m);
    clattn_arg_u32(&a, (cl_uint)n);
    clattn_arg_u32(&a, (cl_uint)k);
    TRY(clattn_args_end(&a));
    return run_1d(dp->base->device, dp->k_linear, n, 0, "enqueue linear_small");
}

/* y (m, n) = x (m, k) W^T + bias: linear_small for a decode step's few rows, else CLBlast (bias rows first). */
static clattn_status project(const clattn_decode_plan *dp, size_t m, size_t n, size_t k, cl_mem x, cl_mem w,
                             cl_mem bias, cl_mem y, const char *what, int warm)
{
    if (m <= DECODE_SMALL_ROWS || warm) return linear_small(dp, m, n, k, x, w, bias, y, warm);
    if (bias) TRY(fill_rows(dp, y, bias, m, n));
    return clattn_blas_sgemm(dp->base->device, CLBlastTransposeYes, m, n, k, 1.0f, x, 0, k, w, 0, k,
                             bias ? 1.0f : 0.0f, y, 0, n, what);
}

static clattn_status decode_pass_run(void *ctx)
{
    const decode_pass *dpass = ctx;
    clattn_decode_plan *dp = dpass->dp;
    const clattn_plan *p = dp->base;
    const clattn_device *dev = p->device;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, n = dpass->n, E = d->embed, H = d->heads, HK = d->kv_heads;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v, Tmax = dpass->Tmax;
    const int warm = dpass->warm;
    /* 1. projections */
    cl_mem src = dp->x_in;
    size_t ld = E, k_col = 0, v_col = 0;
    if (p->has_qkv) {
        TRY(project(dp, B * n, dp->n_qkv, E, dp->x_in, dp->w_proj, dp->b_proj, dp->proj, "QKV projection", warm));
        src = dp->proj, ld = dp->n_qkv, k_col = H * dk, v_col = (H + HK) * dk;
    }
    /* 2. append */
    const size_t kvw = dk > dv ? dk : dv, n_app = warm ? 0 : B * n * HK * kvw;
    clattn_args a;
    clattn_args_begin(&a, dp->k_append, "kv_append");
    clattn_arg_mem(&a, src);
    clattn_arg_u64(&a, 0);
    clattn_arg_u32(&a, (cl_uint)ld);
    clattn_arg_u32(&a, (cl_uint)k_col);
    clattn_arg_u32(&a, (cl_uint)v_col);
    clattn_arg_mem(&a, dpass->cache_k);
    clattn_arg_mem(&a, dpass->cache_v);
    clattn_arg_mem(&a, dp->lens_buf);
    clattn_arg_mem(&a, dp->valid_buf);
    clattn_arg_u32(&a, (cl_uint)n);
    clattn_arg_u32(&a, (cl_uint)HK);
    clattn_arg_u32(&a, (cl_uint)Tmax);
    clattn_arg_u64(&a, n_app);
    TRY(clattn_args_end(&a));
    TRY(run_1d(dev, dp->k_append, n_app, 0, "enqueue kv_append"));
    /* 3. attend (+ combine) */
    cl_mem merged = p->has_out ? dp->merged : dp->out_buf;
    const decode_attend_kernel *ks[2] = {dpass->k, warm ? &dp->pre : NULL}; /* warm: both variants */
    const size_t parts = dpass->parts;
    for (int v = 0; v < 2 && ks[v]; v++) {
    const decode_attend_kernel *k = ks[v];
    const size_t nblk = (n * (H / HK) + k->rows - 1) / k->rows;
    const size_t n_att = warm ? 0 : B * HK * nblk * parts;
    clattn_args_begin(&a, k->attend, "decode_attend");
    clattn_arg_mem(&a, src);
    clattn_arg_u64(&a, 0);
    clattn_arg_u32(&a, (cl_uint)ld);
    clattn_arg_mem(&a, dpass->cache_k);
    clattn_arg_mem(&a, dpass->cache_v);
    clattn_arg_mem(&a, dp->lens_buf);
    clattn_arg_mem(&a, dp->valid_buf);
    clattn_arg_mem(&a, merged);
    clattn_arg_u64(&a, 0);
    clattn_arg_u32(&a, (cl_uint)(H * dv));
    clattn_arg_mem(&a, dp->part_ml);
    clattn_arg_mem(&a, dp->part_acc);
    clattn_arg_u32(&a, (cl_uint)n);
    clattn_arg_u32(&a, (cl_uint)H);
    clattn_arg_u32(&a, (cl_uint)HK);
    clattn_arg_u32(&a, (cl_uint)Tmax);
    clattn_arg_u32(&a, (cl_uint)parts);
    clattn_arg_f32(&a, d->scale);
    clattn_arg_u64(&a, n_att);
    TRY(clattn_args_end(&a));
    TRY(run_1d(dev, k->attend, n_att, 1, "enqueue decode_attend"));
    }
    if (parts > 1) {
        const size_t n_comb = warm ? 0 : B * n * H * dv;
        clattn_args_begin(&a, dp->k_combine, "decode_combine");
        clattn_arg_mem(&a, dp->part_ml);
        clattn_arg_mem(&a, dp->part_acc);
        clattn_arg_mem(&a, dp->valid_buf);
        clattn_arg_mem(&a, merged);
        clattn_arg_u64(&a, 0);
        clattn_arg_u32(&a, (cl_uint)(H * dv));
        clattn_arg_u32(&a, (cl_uint)n);
        clattn_arg_u32(&a, (cl_uint)H);
        clattn_arg_u32(&a, (cl_uint)parts);
        clattn_arg_u64(&a, n_comb);
        TRY(clattn_args_end(&a));
        TRY(run_1d(dev, dp->k_combine, n_comb, 0, "enqueue decode_combine"));
    }
    /* 4. output projection */
    if (p->has_out)
        TRY(project(dp, B * n, d->out_dim, H * dv, dp->merged, dp->w_out, dp->b_out, dp->out_buf, "output projection",
                    warm));
    return CLATTN_STATUS_SUCCESS;
}

/* Split-K parts for a call: enough work-items for the device (a few per compute unit on a CPU, many
 * on a GPU), each part at least a few hundred keys, within the partial buffers. */
static size_t choose_parts(const clattn_decode_plan *dp, size_t n, size_t rows, size_t max_len)
{
    const clattn_device *dev = dp->base->device;
    const clattn_attention_desc *d = &dp->base->d;
    const size_t B = d->batch, H = d->heads, HK = d->kv_heads;
    const size_t items = B * HK * ((n * (H / HK) + rows - 1) / rows);
    const size_t slots_per_part = B * n * H;
    size_t cap = dp->part_slots / slots_per_part;
    if (cap > DECODE_MAX_PARTS) cap = DECODE_MAX_PARTS;
    if (dp->max_parts) {
        const size_t forced = dp->max_parts < cap ? dp->max_parts : cap;
        return forced ? forced : 1;
    }
    const int cpu = dev->dclass == CLATTN_CLASS_CPU;
    const size_t target = (size_t)(dev->compute_units ? dev->compute_units : 1) * (cpu ? 2 : 16);
    size_t parts = (target + items - 1) / items;
    const size_t min_keys = cpu ? 1024 : 256;
    const size_t by_len = (max_len + min_keys - 1) / min_keys;
    if (parts > by_len) parts = by_len;
    if (parts > cap) parts = cap;
    return parts ? parts : 1;
}

clattn_status clattn_decode_execute(clattn_decode_plan *plan, clattn_kv_cache *cache, const clattn_decode_args *args)
{
    clattn_clear_error();
    if (!plan || !cache || !args) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan, cache or args is NULL");
    if (!args->x) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.x is NULL");
    if (!args->out) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.out is NULL");
    clattn_plan *p = plan->base;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, n = args->new_tokens;
    if (cache->device != p->device)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "the cache and the plan are on different devices");
    const clattn_kv_cache_desc *cd = &cache->d;
    if (cd->batch != B || cd->kv_heads != d->kv_heads || cd->head_dim_qk != d->head_dim_qk ||
        cd->head_dim_v != d->head_dim_v)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "the cache (batch %zu, kv_heads %zu, dk %zu, dv %zu) does not "
                           "match the plan (batch %zu, kv_heads %zu, dk %zu, dv %zu)", cd->batch, cd->kv_heads,
                           cd->head_dim_qk, cd->head_dim_v, B, d->kv_heads, d->head_dim_qk, d->head_dim_v);
    if ((cd->type == CLATTN_KV_HALF) != (d->kv_half != 0))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "the cache stores %s but the plan has kv_half = %d",
                           cd->type == CLATTN_KV_HALF ? "half" : "float", d->kv_half);
    if (n == 0 || n > d->seq_q)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.new_tokens = %zu: must be 1 .. seq_q (%zu)", n, d->seq_q);
    size_t *valid = clattn_malloc(B * sizeof *valid);
    if (!valid) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the token counts");
    size_t max_len = 0;
    for (size_t b = 0; b < B; b++) {
        valid[b] = args->valid ? args->valid[b] : n;
        if (valid[b] > n) {
            free(valid);
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.valid[%zu] = %zu is more than new_tokens (%zu)", b,
                               args->valid[b], n);
        }
        if (cache->len[b] + valid[b] > cd->capacity) {
            const size_t l = cache->len[b], v = valid[b];
            free(valid);
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "sequence %zu: %zu cached + %zu new tokens exceed the "
                               "cache's capacity (%zu)", b, l, v, cd->capacity);
        }
        if (cache->len[b] + n > max_len) max_len = cache->len[b] + n;
    }
    clattn_status st;
    if (p->device->backend == CLATTN_BACKEND_REF) {
        st = decode_ref(plan, cache, args->x, n, valid, args->out);
        plan->last_parts = 1;
    } else {
        cl_uint *lens32 = clattn_malloc(2 * B * sizeof *lens32);
        if (!lens32) {
            free(valid);
            return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the token counts");
        }
        for (size_t b = 0; b < B; b++) lens32[b] = (cl_uint)cache->len[b], lens32[B + b] = (cl_uint)valid[b];
        decode_pass dpass = {plan, cache->k, cache->v, cache->d.capacity, n, 1, NULL, 0};
        dpass.k = n * (d->heads / d->kv_heads) <= plan->dec.rows ? &plan->dec : &plan->pre;
        dpass.parts = choose_parts(plan, n, dpass.k->rows, max_len);
        const clattn_transfer in[] = {{plan->x_in, B * n * d->embed * sizeof(float), (void *)args->x, "x"},
                                      {plan->lens_buf, B * sizeof(cl_uint), lens32, "the cache lengths"},
                                      {plan->valid_buf, B * sizeof(cl_uint), lens32 + B, "the token counts"}};
        const clattn_transfer out = {plan->out_buf, B * n * p->out_width * sizeof(float), args->out, "the output"};
        st = clattn_exec_host(p->device, in, 3, decode_pass_run, &dpass, &out);
        free(lens32);
        if (st == CLATTN_STATUS_SUCCESS) plan->last_parts = dpass.parts;
    }
    if (st == CLATTN_STATUS_SUCCESS)
        for (size_t b = 0; b < B; b++) cache->len[b] += valid[b];
    free(valid);
    return st;
}
