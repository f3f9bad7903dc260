/* decode_ref.c: a decode step on the CPU reference, in double, from the same description: the projections,
 * the append (K and V rounded or quantised as the cache stores them), attention of each new token over its
 * sequence's cached and new keys (causal, sliding window), the output projection. */
#include "decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* out (rows, out_width): sequence b's new token t at row row0[b] + t (a padded step's rows past valid[b]: a zero
 * context); the cache is written only after everything else succeeded. */
static clattn_status ref_execute(clattn_decode_plan *dp, clattn_kv_cache *c, const float *x, const float *kv,
                                 const float *value, const clattn_decode_step *step, float *out)
{
    const clattn_plan *p = dp->base;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, E = d->embed, H = d->heads, HK = d->kv_heads, G = H / HK;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v, Tmax = c->d.capacity;
    const size_t n = step->n, rows = step->rows, *valid = step->valid, *row0 = step->row0;
    const uint8_t *tree = step->tree;
    float *Q = clattn_malloc(rows * H * dk * sizeof *Q);
    float *K = clattn_malloc(rows * HK * dk * sizeof *K);
    float *V = clattn_malloc(rows * HK * dv * sizeof *V);
    float *ctx = clattn_calloc(rows * H * dv, sizeof *ctx);
    double *w = clattn_malloc((Tmax ? Tmax : 1) * sizeof *w);
    if (!Q || !K || !V || !ctx || !w) {
        free(Q); free(K); free(V); free(ctx); free(w);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference decode: allocating Q/K/V");
    }
    /* 1. projections (or x itself), K and V rounded as the cache stores them */
    if (p->has_qkv) {
        clattn_ref_linear(x, rows, E, p->w_query, p->b_query, H * dk, Q);
        clattn_ref_linear(x, rows, E, p->w_key, p->b_key, HK * dk, K);
        clattn_ref_linear(x, rows, E, p->w_value, p->b_value, HK * dv, V);
    } else if (d->separate_value) { /* the heads as given */
        memcpy(Q, x, rows * H * dk * sizeof *Q);
        memcpy(K, kv, rows * HK * dk * sizeof *K);
        memcpy(V, value, rows * HK * dv * sizeof *V);
    } else {
        memcpy(Q, x, rows * E * sizeof *Q);
        memcpy(K, x, rows * E * sizeof *K);
        memcpy(V, x, rows * E * sizeof *V);
    }
    /* rotary embeddings: token t of sequence b at position len + t, or at the step's rope_positions (x's rows), keys
     * rotated before they are cached */
    if (d->rope.kind != CLATTN_ROPE_NONE) {
        const clattn_status st = clattn_rope_reserve(dp->base, step->rope_most, step->rope_limit);
        if (st != CLATTN_STATUS_SUCCESS) {
            free(Q); free(K); free(V); free(ctx); free(w);
            return st;
        }
        for (size_t b = 0; b < B; b++)
            for (size_t t = 0; t < valid[b]; t++) {
                const size_t row = row0[b] + t, at = step->pos ? step->pos[row] : c->len[b] + t;
                clattn_rope_rotate_row(&d->rope, p->rope_cs, Q + row * H * dk, at, H, dk);
                clattn_rope_rotate_row(&d->rope, p->rope_cs, K + row * HK * dk, at, HK, dk);
            }
    }
    clattn_kv_round_rows(K, rows * HK, dk, d->kv_half); /* (an INT8 cache's rows: one per token and KV head) */
    clattn_kv_round_rows(V, rows * HK, dv, d->kv_half);
    /* 2. append: cache (b, g, len + t) = K (b, t, g) for the real tokens */
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < valid[b]; t++)
            for (size_t g = 0; g < HK; g++) {
                const size_t pos = clattn_kv_row(c, b, g, c->len[b] + t); /* (paged: its page given) */
                memcpy(c->k_host + pos * dk, K + (row0[b] + t) * HK * dk + g * dk, dk * sizeof(float));
                memcpy(c->v_host + pos * dv, V + (row0[b] + t) * HK * dv + g * dv, dv * sizeof(float));
            }
    /* 3. token t of sequence b at position P = len + t sees the keys j <= P with P - j < window, and with a draft tree
     * of the new tokens (len <= j) only its ancestors */
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < valid[b]; t++)
            for (size_t h = 0; h < H; h++) {
                const size_t P = c->len[b] + t, g = h / G;
                const size_t lo = d->window && P + 1 > d->window ? P + 1 - d->window : 0;
                const float *q = Q + (row0[b] + t) * H * dk + h * dk;
                double max = -INFINITY;
                int any_nan = 0;
                const uint8_t *tr = tree ? tree + (b * n + t) * n : NULL; /* row t of b's draft tree */
#define HIDDEN(j) (tr && (j) >= c->len[b] && !tr[(j) - c->len[b]])
                for (size_t j = lo; j <= P; j++) {
                    if (HIDDEN(j)) continue;
                    double s = 0.0;
                    const float *kj = c->k_host + clattn_kv_row(c, b, g, j) * dk;
                    for (size_t e = 0; e < dk; e++) s += (double)q[e] * (double)kj[e];
                    w[j] = s * d->scale;
                    if (isnan(w[j])) any_nan = 1;
                    else if (w[j] > max) max = w[j];
                }
                double sum = 0.0;
                for (size_t j = lo; j <= P; j++)
                    if (!HIDDEN(j)) sum += (w[j] = max == -INFINITY ? 0.0 : exp(w[j] - max));
                float *o = ctx + (row0[b] + t) * H * dv + h * dv;
                for (size_t e = 0; e < dv; e++) {
                    double acc = 0.0;
                    for (size_t j = lo; j <= P; j++)
                        if (!HIDDEN(j)) acc += w[j] * (double)c->v_host[clattn_kv_row(c, b, g, j) * dv + e];
                    o[e] = any_nan ? NAN : max == -INFINITY ? 0.0f : (float)(acc / sum);
                }
#undef HIDDEN
            }
    /* 4. output projection */
    if (p->has_out) clattn_ref_linear(ctx, rows, H * dv, p->w_out, p->b_out, d->out_dim, out);
    else memcpy(out, ctx, rows * H * dv * sizeof *out);
    free(Q); free(K); free(V); free(ctx); free(w);
    dp->last_parts = 1;
    return CLATTN_STATUS_SUCCESS;
}

static const char *ref_core(const clattn_decode_plan *plan)
{
    (void)plan;
    return "ref";
}

const clattn_decode_ops clattn_decode_ref = {
    .execute = ref_execute,
    .core = ref_core,
};
