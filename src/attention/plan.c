/* plan.c: validate an attention description, copy and normalise the weights, hand the plan to its
 * device's backend (ref.c or shell.c, through clattn_backend_ops); execution entry points. */
#include "attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* *out = a*b*c*d (pass 1 for unused factors); 1 on overflow. */
static int mul4(size_t a, size_t b, size_t c, size_t d, size_t *out)
{
    size_t t;
    return clattn_mul_overflows(a, b, &t) || clattn_mul_overflows(t, c, &t) || clattn_mul_overflows(t, d, out);
}

/* Copy a weight (rows_out, cols_in) given in `layout` into a new LINEAR [out, in] array. */
float *clattn_weight_copy(const float *src, size_t rows_out, size_t cols_in, clattn_layout layout)
{
    float *w = clattn_malloc(rows_out * cols_in * sizeof *w);
    if (!w) return NULL;
    if (layout == CLATTN_LAYOUT_LINEAR) {
        memcpy(w, src, rows_out * cols_in * sizeof *w);
    } else { /* RAW is [in, out]: transpose */
        for (size_t o = 0; o < rows_out; o++)
            for (size_t i = 0; i < cols_in; i++) w[o * cols_in + i] = src[i * rows_out + o];
    }
    return w;
}

float *clattn_vector_copy(const float *src, size_t n)
{
    float *v = clattn_malloc(n * sizeof *v);
    if (v) memcpy(v, src, n * sizeof *v);
    return v;
}

/* An array given with its count: 0 when the count is the one wanted (or the array is absent with count 0),
 * else the refusal, naming both numbers and how the wanted one comes from the description. */
clattn_status clattn_count_check(const char *owner, const char *name, const void *p, size_t count, size_t want,
                                 const char *how)
{
    if (!p) {
        if (count)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.%s_count is %zu, but %s.%s is NULL", owner, name,
                               count, owner, name);
        return CLATTN_STATUS_SUCCESS;
    }
    if (count != want)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "%s.%s has %zu elements (%s.%s_count), the description needs "
                           "%zu (%s)%s", owner, name, count, owner, name, want, how,
                           count == 0 ? ": give every array's element count (clattn 0.4)" : "");
    return CLATTN_STATUS_SUCCESS;
}

/* The eight weight-shaped arrays' counts against the resolved description: the weights (owner "weights", prefix "")
 * and their gradients (owner "grads", prefix "grad_"), in clattn_attention_weights' order. */
clattn_status clattn_weight_counts_check(const clattn_attention_desc *d, const char *owner, const char *prefix,
                                         const void *const arrays[8], const size_t counts[8])
{
    static const char *names[8] = {"w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out", "b_out"};
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v, E = d->embed;
    const size_t Ekv = d->kv_embed, Eo = d->out_dim;
    const size_t want[8] = {H * dk * E, HK * dk * Ekv, HK * dv * Ekv, H * dk, HK * dk, HK * dv, Eo * H * dv, Eo};
    char how[8][96], name[32];
    snprintf(how[0], sizeof how[0], "heads*head_dim_qk x embed = %zu*%zu x %zu", H, dk, E);
    snprintf(how[1], sizeof how[1], "kv_heads*head_dim_qk x kv_embed = %zu*%zu x %zu", HK, dk, Ekv);
    snprintf(how[2], sizeof how[2], "kv_heads*head_dim_v x kv_embed = %zu*%zu x %zu", HK, dv, Ekv);
    snprintf(how[3], sizeof how[3], "heads*head_dim_qk = %zu*%zu", H, dk);
    snprintf(how[4], sizeof how[4], "kv_heads*head_dim_qk = %zu*%zu", HK, dk);
    snprintf(how[5], sizeof how[5], "kv_heads*head_dim_v = %zu*%zu", HK, dv);
    snprintf(how[6], sizeof how[6], "out_dim x heads*head_dim_v = %zu x %zu*%zu", Eo, H, dv);
    snprintf(how[7], sizeof how[7], "out_dim = %zu", Eo);
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, names[i]);
        TRY(clattn_count_check(owner, name, arrays[i], counts[i], want[i], how[i]));
    }
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status check_weight_counts(const clattn_attention_desc *d, const clattn_attention_weights *w)
{
    const void *const arrays[8] = {w->w_query, w->w_key, w->w_value, w->b_query, w->b_key, w->b_value, w->w_out,
                                   w->b_out};
    const size_t counts[8] = {w->w_query_count, w->w_key_count, w->w_value_count, w->b_query_count, w->b_key_count,
                              w->b_value_count, w->w_out_count, w->b_out_count};
    TRY(clattn_weight_counts_check(d, "weights", "", arrays, counts));
    char how[48];
    snprintf(how, sizeof how, "heads = %zu", d->heads);
    return clattn_count_check("weights", "sinks", w->sinks, w->sinks_count, d->heads, how);
}

/* A new float copy of weights.sinks (checked: finite or -inf) into *out (NULL when not given). */
static clattn_status copy_sinks(const clattn_attention_desc *d, const clattn_attention_weights *w, float **out)
{
    *out = NULL;
    if (!w->sinks) return CLATTN_STATUS_SUCCESS;
    float *s = clattn_malloc(d->heads * sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "copying the sinks");
    if (d->dtype != CLATTN_DTYPE_F32) clattn_dtype_widen(w->sinks, d->heads, d->dtype, s);
    else memcpy(s, w->sinks, d->heads * sizeof *s);
    for (size_t h = 0; h < d->heads; h++)
        if (isnan(s[h]) || s[h] == INFINITY) {
            const double v = s[h];
            free(s);
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights.sinks[%zu] is %g: a sink is a finite logit, or "
                               "-inf for a head without one", h, v);
        }
    *out = s;
    return CLATTN_STATUS_SUCCESS;
}

/* Resolve defaults and check every field, in a fixed order, before any allocation. */
static clattn_status validate(const clattn_attention_desc *in, const clattn_attention_weights *w,
                              clattn_attention_desc *d, int *has_qkv, int *has_out)
{
    *d = *in;
    if (d->layout != CLATTN_LAYOUT_LINEAR && d->layout != CLATTN_LAYOUT_RAW)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "layout %d is not CLATTN_LAYOUT_LINEAR or _RAW", (int)d->layout);
    if (d->attn_mask != CLATTN_MASK_NONE && d->attn_mask != CLATTN_MASK_BOOL && d->attn_mask != CLATTN_MASK_FLOAT)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "attn_mask kind %d is not NONE, BOOL or FLOAT", (int)d->attn_mask);
    if ((unsigned)d->cross > 1 || (unsigned)d->causal > 1 || (unsigned)d->key_padding_mask > 1 ||
        (unsigned)d->need_weights > 1)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cross, causal, key_padding_mask and need_weights must be 0 or 1");
    if (d->algorithm != CLATTN_ALGORITHM_AUTO && d->algorithm != CLATTN_ALGORITHM_FUSED &&
        d->algorithm != CLATTN_ALGORITHM_UNFUSED)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "algorithm %d is not CLATTN_ALGORITHM_AUTO, _FUSED or _UNFUSED",
                           (int)d->algorithm);
    if (d->algorithm == CLATTN_ALGORITHM_FUSED && d->need_weights)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "need_weights with algorithm FUSED: the fused kernel does not "
                           "produce the attention weights (use AUTO or UNFUSED)");
    if ((unsigned)d->separate_value > 1 || (unsigned)d->attn_mask_per_batch > 1 || (unsigned)d->attn_mask_per_head > 1)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "separate_value, attn_mask_per_batch and attn_mask_per_head "
                           "must be 0 or 1");
    if ((d->attn_mask_per_batch || d->attn_mask_per_head) && d->attn_mask == CLATTN_MASK_NONE)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "attn_mask_per_%s without an attn_mask (desc.attn_mask = "
                           "CLATTN_MASK_NONE): it would be ignored", d->attn_mask_per_batch ? "batch" : "head");
    if ((unsigned)d->kv_half > 3)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "kv_half must be 0, 1 (CLATTN_KV_HALF), 2 (CLATTN_KV_BF16) "
                           "or 3 (CLATTN_KV_INT8)");
    if (d->kv_page_size > 65536 || (d->kv_page_size & (d->kv_page_size - 1)))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "kv_page_size %zu: a power of two from 1 to 65536 (a paged "
                           "cache's page_size), or 0 for contiguous caches", d->kv_page_size);
    if ((unsigned)d->training > 1) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "training must be 0 or 1");
    if ((unsigned)d->varlen > 1) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "varlen must be 0 or 1");
    if ((unsigned)d->sinks > 1) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "sinks must be 0 or 1");
    if (d->sinks && d->need_weights)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "sinks with need_weights: clattn 0.8 runs attention sinks "
                           "without the weights out (the weights a sink leaves are not returned yet)");
    if (d->varlen && (d->key_padding_mask || d->attn_mask || d->need_weights))
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "varlen with %s: variable-length batches run without masks "
                           "or the weights (the lengths say which keys a sequence has; README, "
                           "\"Variable-length batches\")",
                           d->key_padding_mask ? "key_padding_mask" : d->attn_mask ? "attn_mask" : "need_weights");
    if (d->training && d->kv_half)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "training with kv_half: half keys and values are a KV cache's "
                           "storage; a training plan computes them in fp32 (kv_half = 0)");
    if (d->dtype != CLATTN_DTYPE_F32 && d->dtype != CLATTN_DTYPE_F16 && d->dtype != CLATTN_DTYPE_BF16)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "dtype %d is not CLATTN_DTYPE_F32, _F16 or _BF16",
                           (int)d->dtype);
    if (d->precision != CLATTN_PRECISION_FP32 && d->precision != CLATTN_PRECISION_TF32)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "precision %d is not CLATTN_PRECISION_FP32 or _TF32",
                           (int)d->precision);
    if (d->batch == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "batch must be >= 1");
    if (d->seq_q == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "seq_q must be >= 1");
    if (d->embed == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "embed must be >= 1");
    if (d->heads == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "heads must be >= 1");
    if (d->kv_heads == 0) d->kv_heads = d->heads;
    if (d->kv_heads > d->heads || d->heads % d->kv_heads)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "kv_heads (%zu) must divide heads (%zu)", d->kv_heads, d->heads);
    if (d->window && !d->causal)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "window (%zu) needs causal = 1: the sliding window limits "
                           "how far back a query sees", d->window);
    if (d->cross) {
        if (d->seq_kv == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "seq_kv must be >= 1 for cross-attention");
        if (d->kv_embed == 0) d->kv_embed = d->embed;
    } else {
        if (d->seq_kv != 0 && d->seq_kv != d->seq_q)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "self-attention: seq_kv (%zu) must be 0 or seq_q (%zu)", d->seq_kv, d->seq_q);
        if (d->kv_embed != 0 && d->kv_embed != d->embed)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "self-attention: kv_embed (%zu) must be 0 or embed (%zu)", d->kv_embed, d->embed);
        d->seq_kv = d->seq_q;
        d->kv_embed = d->embed;
    }

    /* weights present? */
    const clattn_attention_weights none = {0};
    if (!w) w = &none;
    int nqkv = (w->w_query != NULL) + (w->w_key != NULL) + (w->w_value != NULL);
    if (nqkv != 0 && nqkv != 3)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "w_query, w_key and w_value must be given together (missing %s)",
                           !w->w_query ? "w_query" : !w->w_key ? "w_key" : "w_value");
    *has_qkv = nqkv == 3;
    if (d->separate_value && *has_qkv)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "separate_value takes no Q/K/V weights (keys from kv, values "
                           "from value: the heads as given)");
    if (!*has_qkv && (w->b_query || w->b_key || w->b_value))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "Q/K/V biases given without Q/K/V weights");
    if (*has_qkv) {
        if (d->head_dim_qk == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "head_dim_qk must be >= 1 with Q/K/V weights");
        if (d->head_dim_v == 0) d->head_dim_v = d->head_dim_qk;
    } else {
        /* Q = x, K = kv (or x), V = value (separate_value) or K: the heads as given */
        if (d->kv_heads != d->heads && !d->cross && !d->separate_value)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "kv_heads (%zu) != heads (%zu) without Q/K/V weights needs "
                               "cross = 1 (keys and values of kv_heads heads in kv)", d->kv_heads, d->heads);
        if (d->embed % d->heads)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "without Q/K/V weights, heads (%zu) must divide embed (%zu)", d->heads, d->embed);
        size_t hd = d->embed / d->heads;
        if (d->head_dim_qk && d->head_dim_qk != hd)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "without Q/K/V weights the head size is embed/heads = %zu", hd);
        if (d->head_dim_v && d->head_dim_v != hd && !d->separate_value)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "without Q/K/V weights head_dim_v is embed/heads = %zu "
                               "(another needs separate_value)", hd);
        d->head_dim_qk = hd;
        if (d->head_dim_v == 0) d->head_dim_v = hd;
        /* kv is K (and V) of kv_heads heads; in desc its width was resolved to embed when 0 */
        if (d->cross && in->kv_embed == 0) d->kv_embed = d->kv_heads * hd;
        if (d->cross && d->kv_embed != d->kv_heads * hd)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "without Q/K/V weights, kv_embed (%zu) must be kv_heads*"
                               "head_dim_qk = %zu*%zu", d->kv_embed, d->kv_heads, hd);
    }
    *has_out = w->w_out != NULL;
    if (!*has_out && w->b_out) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "b_out given without w_out");
    if (*has_out && d->out_dim == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "out_dim must be >= 1 with w_out");
    if (!*has_out && d->out_dim != 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "out_dim given without w_out");

    TRY(clattn_rope_resolve(d));
    if (!d->sinks && w->sinks)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights.sinks is given, but desc.sinks = 0: they would be "
                           "ignored");
    if (d->sinks && !w->sinks)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.sinks = 1 needs weights.sinks: one logit per query "
                           "head (%zu)", d->heads);

    if (isnan(d->scale) || isinf(d->scale))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "scale must be finite (0 = 1/sqrt(head_dim_qk))");
    if (d->scale == 0.0f) d->scale = (float)(1.0 / sqrt((double)d->head_dim_qk));
    if (!(d->dropout >= 0.0f && d->dropout < 1.0f))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "dropout p must be in [0, 1), got %g", (double)d->dropout);

    /* sizes: every product in size_t, every kernel-side dimension in 32 bits */
    size_t n;
    if (mul4(d->batch, d->heads, d->seq_q, d->seq_kv, &n) || clattn_mul_overflows(n, 4 * 256, &n) ||
        mul4(d->batch, d->seq_q, d->embed, 4, &n) || mul4(d->batch, d->seq_kv, d->kv_embed, 4, &n) ||
        mul4(d->batch, d->seq_kv, d->heads, d->head_dim_qk + d->head_dim_v, &n) || clattn_mul_overflows(n, 8, &n) ||
        mul4(d->batch, d->seq_q, d->heads, d->head_dim_qk + d->head_dim_v, &n) || clattn_mul_overflows(n, 8, &n) ||
        mul4(d->heads, d->head_dim_qk + d->head_dim_v, d->embed + d->kv_embed, 8, &n) ||
        mul4(d->batch, d->seq_q, d->out_dim + 1, 4, &n) || mul4(d->out_dim + 1, d->heads, d->head_dim_v, 4, &n))
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "the buffers for these dimensions overflow size_t");
    const size_t lim = 0xFFFFFFFFu;
    if (d->batch > lim || d->seq_q > lim || d->seq_kv > lim || d->embed > lim || d->kv_embed > lim ||
        d->heads > lim || d->head_dim_qk > lim || d->head_dim_v > lim || d->out_dim > lim || d->window > lim ||
        d->heads * (2 * d->head_dim_qk + d->head_dim_v) > lim)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "a dimension exceeds 2^32-1");
    return check_weight_counts(d, w);
}

void clattn_plan_free(clattn_plan *plan)
{
    if (!plan) return;
    if (plan->ops && plan->ops->release) plan->ops->release(plan);
    free(plan->w_query); free(plan->w_key); free(plan->w_value);
    free(plan->b_query); free(plan->b_key); free(plan->b_value);
    free(plan->w_out); free(plan->b_out);
    free(plan->sinks);
    free(plan->rope_cs);
    pthread_mutex_destroy(&plan->lock);
    free(plan);
}

/* The backend of each kind of device: the one place a plan's device decides how it runs. */
static const clattn_backend_ops *const backends[] = {
    [CLATTN_BACKEND_REF] = &clattn_backend_ref,
    [CLATTN_BACKEND_OPENCL] = &clattn_backend_opencl,
};

const clattn_backend_ops *clattn_backend_of(const clattn_device *dev) { return backends[dev->backend]; }

clattn_status clattn_buffers_call_check(const void *plan, const void *buffers, int on_buffers, const clattn_device *dev,
                                        cl_uint nwait, const cl_event *wait)
{
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (!buffers) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers is NULL");
    if (!on_buffers)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "execution on cl_mem buffers needs an OpenCL device (this plan "
                           "is on %s)", dev->name);
    if ((nwait == 0) != (wait == NULL))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "num_events_in_wait_list and event_wait_list disagree");
    return CLATTN_STATUS_SUCCESS;
}

/* The plan's host copies of its weights, in clattn_attention_weights' order (the sinks last). */
#define WEIGHT_SLOTS(p)                                                                                               \
    {&(p)->w_query, &(p)->w_key, &(p)->w_value, &(p)->b_query, &(p)->b_key, &(p)->b_value, &(p)->w_out, &(p)->b_out, \
     &(p)->sinks}

/* New copies of the given weights (validated against the resolved d), normalised to LINEAR, into *out[i] (NULL for an
 * array not given); on failure nothing is kept. */
static clattn_status copy_weights(const clattn_attention_desc *d, const clattn_attention_weights *w, float **out[8])
{
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v, Eo = d->out_dim;
    const void *src[8] = {w->w_query, w->w_key, w->w_value, w->b_query, w->b_key, w->b_value, w->w_out, w->b_out};
    const size_t rows[8] = {H * dk, HK * dk, HK * dv, H * dk, HK * dk, HK * dv, Eo, Eo};
    const size_t cols[8] = {d->embed, d->kv_embed, d->kv_embed, 0, 0, 0, H * dv, 0}; /* 0: a vector */
    int oom = 0;
    for (int i = 0; i < 8; i++) {
        *out[i] = NULL;
        if (!src[i] || oom) continue;
        /* half weights are widened (exactly) first: the plan keeps and computes with fp32 copies */
        const size_t n = rows[i] * (cols[i] ? cols[i] : 1);
        float *wide = NULL;
        if (d->dtype != CLATTN_DTYPE_F32) {
            if (!(wide = clattn_malloc(n * sizeof *wide))) {
                oom = 1;
                continue;
            }
            clattn_dtype_widen(src[i], n, d->dtype, wide);
        }
        const float *f = wide ? wide : src[i];
        oom = !(*out[i] = cols[i] ? clattn_weight_copy(f, rows[i], cols[i], d->layout) : clattn_vector_copy(f, rows[i]));
        free(wide);
    }
    if (!oom) return CLATTN_STATUS_SUCCESS;
    for (int i = 0; i < 8; i++) free(*out[i]), *out[i] = NULL;
    return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "copying the weights");
}

clattn_status clattn_plan_prepare(clattn_device *device, const clattn_attention_desc *desc,
                                  const clattn_attention_weights *weights, int host_staging, clattn_plan **plan)
{
    *plan = NULL;
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    if (!desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc is NULL");
    clattn_attention_desc d;
    int has_qkv = 0, has_out = 0;
    clattn_status st = validate(desc, weights, &d, &has_qkv, &has_out);
    if (st != CLATTN_STATUS_SUCCESS) return st;
    if (d.precision == CLATTN_PRECISION_TF32 && d.training)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "training with precision TF32: a training plan computes in fp32 "
                           "(precision FP32)");
    if (d.precision == CLATTN_PRECISION_TF32 && device->backend != CLATTN_BACKEND_OPENCL)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "precision TF32: the ref device computes in fp32 and float64 "
                           "only (TF32 products are a core's: flash_mma)");

    clattn_plan *p = clattn_calloc(1, sizeof *p);
    if (!p) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the plan");
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "creating the plan's lock");
    }
    p->device = device;
    p->d = d;
    p->has_qkv = has_qkv;
    p->has_out = has_out;
    p->out_width = has_out ? d.out_dim : d.heads * d.head_dim_v;
    p->host_staging = host_staging;
    float **slots[9] = WEIGHT_SLOTS(p);
    const clattn_attention_weights none = {0};
    if (copy_weights(&d, weights ? weights : &none, slots) != CLATTN_STATUS_SUCCESS) {
        clattn_plan_free(p);
        return CLATTN_STATUS_OUT_OF_HOST_MEMORY;
    }
    if ((st = copy_sinks(&d, weights ? weights : &none, &p->sinks)) != CLATTN_STATUS_SUCCESS) {
        clattn_plan_free(p);
        return st;
    }
    p->rope_positions = d.seq_q > d.seq_kv ? d.seq_q : d.seq_kv;
    if (d.rope.kind != CLATTN_ROPE_NONE && !(p->rope_cs = clattn_rope_table(&d.rope, p->rope_positions))) {
        clattn_plan_free(p);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "the rotary embeddings' table of cos and sin");
    }
    *plan = p;
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status plan_create(clattn_device *device, const clattn_attention_desc *desc,
                                 const clattn_attention_weights *weights, int host_staging, clattn_plan **plan)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    *plan = NULL;
    if (desc && desc->separate_value && !desc->cross) /* (a decode plan takes them as self-attention's new tokens) */
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "separate_value needs cross = 1 (keys from kv, values from "
                           "value)");
    if (desc && desc->kv_half == CLATTN_KV_INT8)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "kv_half = 3 (CLATTN_KV_INT8) is for decode plans: an int8 KV "
                           "cache quantises each appended row as a whole, and a prefill plan rounds keys and values "
                           "element by element (kv_half 0, 1 or 2); prefill into an int8 cache with a decode plan");
    if (desc && desc->kv_page_size)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "kv_page_size = %zu is for decode plans, which run on a paged KV "
                           "cache; a prefill plan keeps no cache (kv_page_size 0)", desc->kv_page_size);
    clattn_plan *p = NULL;
    clattn_status st = clattn_plan_prepare(device, desc, weights, host_staging, &p);
    if (st != CLATTN_STATUS_SUCCESS) return st;
    p->ops = clattn_backend_of(device);
    if (p->ops->init && (st = p->ops->init(p)) != CLATTN_STATUS_SUCCESS) {
        clattn_plan_free(p);
        return st;
    }
    const char *ran[3] = {p->core ? p->core->name : NULL, p->gemm, p->backward_core ? p->backward_core->name : NULL};
    clattn_core_env_note(device, ran, 3);
    *plan = p;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_plan_create(clattn_device *device, const clattn_attention_desc *desc,
                                 const clattn_attention_weights *weights, clattn_plan **plan)
{
    return plan_create(device, desc, weights, 1, plan);
}

clattn_status clattn_plan_create_device_resident(clattn_device *device, const clattn_attention_desc *desc,
                                                 const clattn_attention_weights *weights, clattn_plan **plan)
{
    return plan_create(device, desc, weights, 0, plan);
}

clattn_status clattn_plan_set_weights(clattn_plan *plan, const clattn_attention_weights *weights)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (!weights) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights is NULL");
    static const char *names[8] = {"w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out", "b_out"};
    const void *given[8] = {weights->w_query, weights->w_key, weights->w_value, weights->b_query, weights->b_key,
                            weights->b_value, weights->w_out, weights->b_out};
    const int has[8] = {plan->has_qkv, plan->has_qkv, plan->has_qkv, plan->b_query != NULL, plan->b_key != NULL,
                        plan->b_value != NULL, plan->has_out, plan->b_out != NULL};
    /* the arrays the plan was created with, no more and no fewer: a weight left out would keep its old value */
    for (int i = 0; i < 8; i++)
        if (!given[i] != !has[i])
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights.%s is %s, but the plan was created %s it: "
                               "clattn_plan_set_weights replaces the arrays the plan has, all of them and no other",
                               names[i], given[i] ? "given" : "NULL", has[i] ? "with" : "without");
    if (!weights->sinks != !plan->sinks)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights.sinks is %s, but the plan was created %s them: "
                           "clattn_plan_set_weights replaces the arrays the plan has, all of them and no other",
                           weights->sinks ? "given" : "NULL", plan->sinks ? "with" : "without");
    TRY(check_weight_counts(&plan->d, weights));
    float *fresh[9], **fslots[8];
    for (int i = 0; i < 8; i++) fslots[i] = &fresh[i];
    TRY(copy_sinks(&plan->d, weights, &fresh[8]));
    clattn_status st = copy_weights(&plan->d, weights, fslots);
    if (st != CLATTN_STATUS_SUCCESS) {
        free(fresh[8]);
        return st;
    }
    pthread_mutex_lock(&plan->lock);
    float **slots[9] = WEIGHT_SLOTS(plan), *old[9];
    for (int i = 0; i < 9; i++) old[i] = *slots[i], *slots[i] = fresh[i];
    st = plan->ops->set_weights ? plan->ops->set_weights(plan) : CLATTN_STATUS_SUCCESS;
    if (st != CLATTN_STATUS_SUCCESS) { /* a device error: the old weights back, on the host and (if it can) the device */
        for (int i = 0; i < 9; i++) *slots[i] = old[i], old[i] = fresh[i];
        (void)plan->ops->set_weights(plan);
    }
    pthread_mutex_unlock(&plan->lock);
    for (int i = 0; i < 9; i++) free(old[i]);
    return st;
}

clattn_status clattn_plan_desc(const clattn_plan *plan, clattn_attention_desc *desc)
{
    clattn_clear_error();
    if (!plan || !desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan or desc is NULL");
    *desc = plan->d;
    return CLATTN_STATUS_SUCCESS;
}

size_t clattn_plan_out_width(const clattn_plan *plan) { return plan ? plan->out_width : 0; }

size_t clattn_plan_device_bytes(const clattn_plan *plan)
{
    if (!plan || !plan->ops || !plan->ops->device_bytes) return 0;
    clattn_plan *p = (clattn_plan *)plan; /* the lock is the plan's own state: a call may renew its buffers */
    pthread_mutex_lock(&p->lock);
    const size_t n = plan->ops->device_bytes(plan);
    pthread_mutex_unlock(&p->lock);
    return n;
}

clattn_algorithm clattn_plan_algorithm(const clattn_plan *plan)
{
    /* the ref device computes one function whatever the description asked for: AUTO, as the header says */
    return plan && plan->core ? plan->d.algorithm : CLATTN_ALGORITHM_AUTO;
}

const char *clattn_plan_core(const clattn_plan *plan)
{
    return !plan ? "" : plan->core ? plan->core->name : "ref";
}

const char *clattn_plan_core_params(const clattn_plan *plan) { return plan ? plan->core_params_text : ""; }

const char *clattn_plan_backward_core(const clattn_plan *plan)
{
    return !plan || !plan->d.training ? "" : plan->backward_core ? plan->backward_core->name : "ref";
}

const char *clattn_plan_backward_core_params(const clattn_plan *plan)
{
    return plan && plan->backward_core ? plan->backward_core_params_text : "";
}

const char *clattn_plan_gemm(const clattn_plan *plan)
{
    return !plan ? "" : plan->gemm ? plan->gemm : "ref";
}

const char *clattn_plan_gemm_params(const clattn_plan *plan) { return plan ? plan->gemm_params_text : ""; }

int clattn_plan_tuned(const clattn_plan *plan) { return plan ? plan->tuned : 0; }

const char *clattn_algorithm_name(clattn_algorithm a)
{
    switch (a) {
    case CLATTN_ALGORITHM_AUTO: return "auto";
    case CLATTN_ALGORITHM_FUSED: return "fused";
    case CLATTN_ALGORITHM_UNFUSED: return "unfused";
    }
    return "unknown";
}

/* The attention weights come only from the reference and the cores that make them (unfused). */
static clattn_status check_weights_wanted(const clattn_plan *plan)
{
    if (!plan->ops->produces_weights(plan))
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "this plan runs core %s, which does not produce the "
                           "attention weights: create it with need_weights = 1 (or algorithm UNFUSED)",
                           clattn_plan_core(plan));
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_plan_set_seed(clattn_plan *plan, uint64_t seed)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    pthread_mutex_lock(&plan->lock);
    plan->d.seed = seed;
    pthread_mutex_unlock(&plan->lock);
    return CLATTN_STATUS_SUCCESS;
}

/* lse and context are a training plan's outputs: refused (not ignored) on any other. */
static clattn_status check_training_outputs(const clattn_plan *plan, int lse, int context, const char *owner)
{
    if ((lse || context) && !plan->d.training)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.%s is given, but the plan was created without "
                           "desc.training = 1: a plan keeps the rows' statistics and the context for training only",
                           owner, lse ? "lse" : "context");
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_offsets_check(const char *owner, const char *name, const uint32_t *cu, size_t n, size_t B,
                                  size_t max, const char *max_name, const char *max_why)
{
    char how[64];
    snprintf(how, sizeof how, "batch + 1 = %zu + 1", B);
    TRY(clattn_count_check(owner, name, cu, n, B + 1, how));
    if (cu[0] != 0)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.%s[0] is %u: the first sequence starts at row 0", owner,
                           name, (unsigned)cu[0]);
    for (size_t b = 0; b < B; b++) {
        if (cu[b + 1] < cu[b])
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.%s decreases: [%zu] = %u after [%zu] = %u (offsets "
                               "must not decrease)", owner, name, b + 1, (unsigned)cu[b + 1], b, (unsigned)cu[b]);
        if (cu[b + 1] - cu[b] > max)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "%s.%s: sequence %zu has %u rows, past %s = %zu (%s)",
                               owner, name, b, (unsigned)(cu[b + 1] - cu[b]), max_name, max, max_why);
    }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_plan_rows(const clattn_plan *p, const uint32_t *cu_q, size_t nq, const uint32_t *cu_k, size_t nk,
                               const char *owner, clattn_rows *r)
{
    const clattn_attention_desc *d = &p->d;
    if (!d->varlen) {
        if (cu_q || cu_k)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.cu_seqlens_%s is given, but the plan was created "
                               "without desc.varlen = 1: it would be ignored", owner, cu_q ? "q" : "kv");
    } else {
        if (!cu_q)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.cu_seqlens_q is NULL (the plan has desc.varlen)",
                               owner);
        TRY(clattn_offsets_check(owner, "cu_seqlens_q", cu_q, nq, d->batch, d->seq_q, "seq_q",
                                 "the longest the plan takes"));
        if (d->cross) {
            if (!cu_k)
                return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.cu_seqlens_kv is NULL (a varlen cross-attention "
                                   "plan: the keys' sequences have lengths of their own)", owner);
            TRY(clattn_offsets_check(owner, "cu_seqlens_kv", cu_k, nk, d->batch, d->seq_kv, "seq_kv",
                                     "the longest the plan takes"));
        } else if (cu_k) {
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.cu_seqlens_kv is given, but the plan is "
                               "self-attention: the keys are the queries' rows (cu_seqlens_q); it would be ignored",
                               owner);
        }
    }
    if (r) *r = clattn_plan_rows_of(p, cu_q, cu_k);
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_positions_max_check(const uint32_t *pos, size_t n, const char *owner, const char *name,
                                        const char *what)
{
    for (size_t i = 0; pos && i < n; i++)
        if (pos[i] > CLATTN_ROPE_MAX_POSITION)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.%s[%zu] is %u, past the largest position %s may be "
                               "given (CLATTN_ROPE_MAX_POSITION = %u)", owner, name, i, (unsigned)pos[i], what,
                               CLATTN_ROPE_MAX_POSITION);
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_plan_positions_check(const clattn_plan *p, const uint32_t *pq, size_t nq, const uint32_t *pk,
                                         size_t nk, const clattn_rows *r, const char *owner)
{
    const clattn_attention_desc *d = &p->d;
    if ((pq || pk) && d->rope.kind == CLATTN_ROPE_NONE)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.rope_positions%s is given, but the plan has no rotary "
                           "embeddings (desc.rope.kind = CLATTN_ROPE_NONE): it would be ignored", owner,
                           pq ? "" : "_kv");
    if (pk && !d->cross)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.rope_positions_kv is given, but the plan is "
                           "self-attention: the keys are the queries' rows, at rope_positions; it would be ignored",
                           owner);
    if (d->cross && !pq != !pk)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.rope_positions%s is NULL but %s.rope_positions%s is "
                           "given: a cross-attention plan takes both (the queries' and the keys' positions) or neither",
                           owner, pq ? "_kv" : "", owner, pq ? "" : "_kv");
    char how[96];
    if (d->varlen) snprintf(how, sizeof how, "cu_seqlens_q[batch] = %zu", r->q);
    else snprintf(how, sizeof how, "batch x seq_q = %zu x %zu", d->batch, d->seq_q);
    TRY(clattn_count_check(owner, "rope_positions", pq, nq, r->q, how));
    if (d->varlen) snprintf(how, sizeof how, "cu_seqlens_kv[batch] = %zu", r->k);
    else snprintf(how, sizeof how, "batch x seq_kv = %zu x %zu", d->batch, d->seq_kv);
    TRY(clattn_count_check(owner, "rope_positions_kv", pk, nk, r->k, how));
    TRY(clattn_positions_max_check(pq, r->q, owner, "rope_positions", "a row"));
    TRY(clattn_positions_max_check(pk, r->k, owner, "rope_positions_kv", "a row"));
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_plan_positions_reserve(clattn_plan *p, const uint32_t *pq, const uint32_t *pk,
                                            const clattn_rows *r)
{
    return clattn_rope_reserve(p, clattn_positions_most(pq, r->q, pk, r->k), (size_t)CLATTN_ROPE_MAX_POSITION + 1);
}

clattn_status clattn_plan_check_inputs(const clattn_plan *plan, const clattn_attention_args *a)
{
    if (!a) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args is NULL");
    clattn_rows r = {0}; /* B*Tq and B*Tk, or a varlen batch's rows: there may be none, and then NULL arrays */
    TRY(clattn_plan_rows(plan, a->cu_seqlens_q, a->cu_seqlens_q_count, a->cu_seqlens_kv, a->cu_seqlens_kv_count, "args",
                         &r));
    if (!a->x && r.q) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.x is NULL");
    if (plan->d.cross && !a->kv && r.k)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.kv is NULL (cross-attention plan)");
    if (plan->d.key_padding_mask && !a->key_padding_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.key_padding_mask is NULL (the plan expects one)");
    if (plan->d.attn_mask != CLATTN_MASK_NONE && !a->attn_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.attn_mask is NULL (the plan expects one)");
    /* what the description does not declare would be ignored: refused instead */
    if (!plan->d.cross && a->kv)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.kv is given, but the plan is self-attention "
                           "(desc.cross = 0): it would be ignored");
    if (!plan->d.key_padding_mask && a->key_padding_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.key_padding_mask is given, but the plan was created "
                           "without one (desc.key_padding_mask = 0): it would be ignored");
    if (plan->d.attn_mask == CLATTN_MASK_NONE && a->attn_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.attn_mask is given, but the plan was created "
                           "without one (desc.attn_mask = CLATTN_MASK_NONE): it would be ignored");
    if (plan->d.separate_value && !a->value && r.k)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.value is NULL (the plan has desc.separate_value)");
    if (!plan->d.separate_value && a->value)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.value is given, but the plan was created without "
                           "desc.separate_value = 1: it would be ignored");
    /* every array's count (0 for one not given), before anything is read or written */
    const clattn_attention_desc *d = &plan->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    char how[120];
    if (d->varlen)
        snprintf(how, sizeof how, "cu_seqlens_q[batch] x embed = %zu x %zu", r.q, d->embed);
    else
        snprintf(how, sizeof how, "batch x seq_q x embed = %zu x %zu x %zu", B, Tq, d->embed);
    TRY(clattn_count_check("args", "x", a->x, a->x_count, r.q * d->embed, how));
    if (d->varlen)
        snprintf(how, sizeof how, "cu_seqlens_kv[batch] x kv_embed = %zu x %zu", r.k, d->kv_embed);
    else
        snprintf(how, sizeof how, "batch x seq_kv x kv_embed = %zu x %zu x %zu", B, Tk, d->kv_embed);
    TRY(clattn_count_check("args", "kv", a->kv, a->kv_count, r.k * d->kv_embed, how));
    snprintf(how, sizeof how, "batch x seq_kv = %zu x %zu", B, Tk);
    TRY(clattn_count_check("args", "key_padding_mask", a->key_padding_mask, a->key_padding_mask_count, B * Tk, how));
    {
        char pre[64] = "";
        if (d->attn_mask_per_batch) snprintf(pre, sizeof pre, "%zu x ", B);
        if (d->attn_mask_per_head) snprintf(pre + strlen(pre), sizeof pre - strlen(pre), "%zu x ", d->heads);
        snprintf(how, sizeof how, "%s%sseq_q x seq_kv = %s%zu x %zu", d->attn_mask_per_batch ? "batch x " : "",
                 d->attn_mask_per_head ? "heads x " : "", pre, Tq, Tk);
    }
    TRY(clattn_count_check("args", "attn_mask", a->attn_mask, a->attn_mask_count, clattn_plan_mask_elems(d), how));
    snprintf(how, sizeof how, "%s x kv_heads*head_dim_v = %zu x %zu*%zu", d->varlen ? "cu_seqlens_kv[batch]" :
             "batch x seq_kv", r.k, d->kv_heads, d->head_dim_v);
    TRY(clattn_count_check("args", "value", a->value, a->value_count, clattn_rows_value_elems(d, &r), how));
    return clattn_plan_positions_check(plan, a->rope_positions, a->rope_positions_count, a->rope_positions_kv,
                                       a->rope_positions_kv_count, &r, "args");
}

void clattn_plan_input_ranges(const clattn_plan *p, const clattn_attention_args *a, const clattn_attention_buffers *b,
                              clattn_mem_range ins[CLATTN_PLAN_INPUTS])
{
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tk = d->seq_kv;
    const char *o = a ? "args" : "buffers";
    const size_t es = clattn_dtype_size(d->dtype);
    const clattn_rows r = a ? clattn_plan_rows_of(p, a->cu_seqlens_q, a->cu_seqlens_kv)
                            : clattn_plan_rows_of(p, b->cu_seqlens_q, b->cu_seqlens_kv);
    ins[0] = CLATTN_RANGE(o, a, b, x, r.q * d->embed, es);
    ins[1] = CLATTN_RANGE(o, a, b, kv, d->cross ? r.k * d->kv_embed : 0, es);
    ins[2] = CLATTN_RANGE(o, a, b, key_padding_mask, d->key_padding_mask ? B * Tk : 0, 1);
    ins[3] = CLATTN_RANGE(o, a, b, attn_mask, clattn_plan_mask_elems(d), d->attn_mask == CLATTN_MASK_FLOAT ? 4 : 1);
    ins[4] = CLATTN_RANGE(o, a, b, value, clattn_rows_value_elems(d, &r), es);
}

/* The forward's outputs against its inputs and each other, from host args (a) or buffers (b): one list for both
 * forms. */
static clattn_status forward_no_overlap(const clattn_plan *p, const clattn_attention_args *a,
                                        const clattn_attention_buffers *b)
{
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, H = d->heads;
    const char *o = a ? "args" : "buffers";
    clattn_mem_range ins[CLATTN_PLAN_INPUTS];
    clattn_plan_input_ranges(p, a, b, ins);
    const size_t es = clattn_dtype_size(d->dtype);
    const clattn_rows r = a ? clattn_plan_rows_of(p, a->cu_seqlens_q, a->cu_seqlens_kv)
                            : clattn_plan_rows_of(p, b->cu_seqlens_q, b->cu_seqlens_kv);
    const clattn_mem_range outs[] = {CLATTN_RANGE(o, a, b, out, r.q * p->out_width, es),
                                     CLATTN_RANGE(o, a, b, attn, B * H * Tq * Tk, es),
                                     CLATTN_RANGE(o, a, b, lse, H * r.q, 4),
                                     CLATTN_RANGE(o, a, b, context, r.q * H * d->head_dim_v, 4)};
    return clattn_check_no_overlap(outs, 4, ins, CLATTN_PLAN_INPUTS);
}

static clattn_status check_args(const clattn_plan *plan, const clattn_attention_args *a)
{
    TRY(clattn_plan_check_inputs(plan, a));
    const clattn_attention_desc *d = &plan->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    const clattn_rows r = clattn_plan_rows_of(plan, a->cu_seqlens_q, a->cu_seqlens_kv); /* checked with the inputs */
    if (!a->out && r.q) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.out is NULL");
    char how[120];
    if (d->varlen)
        snprintf(how, sizeof how, "cu_seqlens_q[batch] x %s = %zu x %zu", plan->has_out ? "out_dim" : "heads*head_dim_v",
                 r.q, plan->out_width);
    else
        snprintf(how, sizeof how, "batch x seq_q x %s = %zu x %zu x %zu", plan->has_out ? "out_dim" : "heads*head_dim_v",
                 B, Tq, plan->out_width);
    TRY(clattn_count_check("args", "out", a->out, a->out_count, r.q * plan->out_width, how));
    snprintf(how, sizeof how, "batch x heads x seq_q x seq_kv = %zu x %zu x %zu x %zu", B, d->heads, Tq, Tk);
    TRY(clattn_count_check("args", "attn", a->attn, a->attn_count, B * d->heads * Tq * Tk, how));
    TRY(check_training_outputs(plan, a->lse != NULL, a->context != NULL, "args"));
    if (d->varlen) /* each sequence's (H, L) rows, one after another */
        snprintf(how, sizeof how, "heads x cu_seqlens_q[batch] = %zu x %zu", d->heads, r.q);
    else
        snprintf(how, sizeof how, "batch x heads x seq_q = %zu x %zu x %zu", B, d->heads, Tq);
    TRY(clattn_count_check("args", "lse", a->lse, a->lse_count, r.q * d->heads, how));
    if (d->varlen)
        snprintf(how, sizeof how, "cu_seqlens_q[batch] x heads*head_dim_v = %zu x %zu*%zu", r.q, d->heads,
                 d->head_dim_v);
    else
        snprintf(how, sizeof how, "batch x seq_q x heads*head_dim_v = %zu x %zu x %zu*%zu", B, Tq, d->heads,
                 d->head_dim_v);
    TRY(clattn_count_check("args", "context", a->context, a->context_count, r.q * d->heads * d->head_dim_v, how));
    return forward_no_overlap(plan, a, NULL);
}

/* What the description does not declare, on the buffer path: refused, never ignored. */
clattn_status clattn_plan_check_buffers_declared(const clattn_plan *plan, const clattn_attention_buffers *b)
{
    if (!plan->d.cross && b->kv.mem)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers.kv is given, but the plan is self-attention "
                           "(desc.cross = 0): it would be ignored");
    if (!plan->d.key_padding_mask && b->key_padding_mask.mem)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers.key_padding_mask is given, but the plan was "
                           "created without one (desc.key_padding_mask = 0): it would be ignored");
    if (plan->d.attn_mask == CLATTN_MASK_NONE && b->attn_mask.mem)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers.attn_mask is given, but the plan was created "
                           "without one (desc.attn_mask = CLATTN_MASK_NONE): it would be ignored");
    if (!plan->d.separate_value && b->value.mem)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers.value is given, but the plan was created without "
                           "desc.separate_value = 1: it would be ignored");
    clattn_rows r;
    TRY(clattn_plan_rows(plan, b->cu_seqlens_q, b->cu_seqlens_q_count, b->cu_seqlens_kv, b->cu_seqlens_kv_count,
                         "buffers", &r));
    TRY(clattn_plan_positions_check(plan, b->rope_positions, b->rope_positions_count, b->rope_positions_kv,
                                    b->rope_positions_kv_count, &r, "buffers"));
    return check_training_outputs(plan, b->lse.mem != NULL, b->context.mem != NULL, "buffers");
}

clattn_status clattn_plan_execute(clattn_plan *plan, const clattn_attention_args *args)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    clattn_status st = check_args(plan, args);
    if (st != CLATTN_STATUS_SUCCESS) return st;
    if (args->attn) TRY(check_weights_wanted(plan));
    pthread_mutex_lock(&plan->lock); /* the staging buffers are the plan's: one pass at a time */
    const clattn_rows r = clattn_plan_rows_of(plan, args->cu_seqlens_q, args->cu_seqlens_kv);
    st = clattn_plan_positions_reserve(plan, args->rope_positions, args->rope_positions_kv, &r);
    if (st == CLATTN_STATUS_SUCCESS) st = plan->ops->execute_host(plan, args);
    pthread_mutex_unlock(&plan->lock);
    return st;
}

clattn_status clattn_plan_execute_buffers(clattn_plan *plan, const clattn_attention_buffers *buffers,
                                          cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                          cl_event *event)
{
    clattn_clear_error();
    TRY(clattn_buffers_call_check(plan, buffers, plan && plan->ops->execute_buffers, plan ? plan->device : NULL,
                                  num_events_in_wait_list, event_wait_list));
    TRY(clattn_plan_check_buffers_declared(plan, buffers));
    if (buffers->attn.mem) TRY(check_weights_wanted(plan));
    TRY(forward_no_overlap(plan, NULL, buffers));
    pthread_mutex_lock(&plan->lock);
    const clattn_rows r = clattn_plan_rows_of(plan, buffers->cu_seqlens_q, buffers->cu_seqlens_kv);
    clattn_status st = clattn_plan_positions_reserve(plan, buffers->rope_positions, buffers->rope_positions_kv, &r);
    if (st == CLATTN_STATUS_SUCCESS)
        st = plan->ops->execute_buffers(plan, buffers, num_events_in_wait_list, event_wait_list, event);
    pthread_mutex_unlock(&plan->lock);
    return st;
}

const char *clattn_stage_name(clattn_stage stage)
{
    static const char *names[CLATTN_NSTAGES] = {"qkv_projection", "head_split", "scores", "softmax",
                                                "context", "head_merge", "out_projection", "attention"};
    return (unsigned)stage < CLATTN_NSTAGES ? names[stage] : "unknown";
}

size_t clattn_stage_count(void) { return CLATTN_NSTAGES; }

clattn_status clattn_plan_set_profiling(clattn_plan *plan, int enable)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (enable && plan->core) TRY(clattn_profiling_check(plan->device));
    pthread_mutex_lock(&plan->lock);
    plan->profiling = enable != 0;
    for (int s = 0; s < CLATTN_NSTAGES; s++) plan->stage_ms[s] = 0.0;
    pthread_mutex_unlock(&plan->lock);
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_plan_stage_times_n(const clattn_plan *plan, double *ms, size_t n)
{
    clattn_clear_error();
    if (!plan || !ms) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan or ms is NULL");
    double all[CLATTN_NSTAGES];
    clattn_plan *p = (clattn_plan *)plan; /* the lock is the plan's own state */
    pthread_mutex_lock(&p->lock);
    const clattn_status st = plan->ops->stage_times(p, all);
    pthread_mutex_unlock(&p->lock);
    TRY(st);
    for (size_t s = 0; s < n && s < CLATTN_NSTAGES; s++) ms[s] = all[s];
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_plan_stage_times(const clattn_plan *plan, double ms[CLATTN_STAGE_COUNT])
{
    return clattn_plan_stage_times_n(plan, ms, CLATTN_STAGE_COUNT);
}
