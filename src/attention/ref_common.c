/* ref_common.c: the steps the CPU reference's forward (ref.c) and backward (backward_ref.c) both take: the
 * projections, and one query row's scaled, masked scores. Float storage, double accumulation, as ref.c. */
#include "attention.h"

#include <math.h>
#include <string.h>

/* y (rows, n) = a (rows, k) * w^T + bias, with w (n, k) in nn.Linear layout. */
void clattn_ref_linear(const float *a, size_t rows, size_t k, const float *w, const float *bias, size_t n,
                       float *y)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t o = 0; o < n; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (size_t c = 0; c < k; c++) acc += (double)a[r * k + c] * (double)w[o * k + c];
            y[r * n + o] = (float)acc;
        }
}

void clattn_ref_qkv(const struct clattn_plan *plan, const clattn_attention_args *a, float *Q, float *K, float *V)
{
    const clattn_attention_desc *d = &plan->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    const float *kv = d->cross ? a->kv : a->x;
    if (plan->has_qkv) {
        clattn_ref_linear(a->x, B * Tq, E, plan->w_query, plan->b_query, H * dk, Q);
        clattn_ref_linear(kv, B * Tk, Ekv, plan->w_key, plan->b_key, HK * dk, K);
        clattn_ref_linear(kv, B * Tk, Ekv, plan->w_value, plan->b_value, HK * dv, V);
    } else {
        memcpy(Q, a->x, B * Tq * E * sizeof *Q);
        memcpy(K, kv, B * Tk * Ekv * sizeof *K);
        memcpy(V, d->separate_value ? a->value : kv, B * Tk * HK * dv * sizeof *V);
    }
    if (d->rope.kind != CLATTN_ROPE_NONE) { /* rotary embeddings: Q and K by their rows' positions (rope.c) */
        clattn_rope_rotate(&d->rope, plan->rope_cs, Q, B * Tq, H * dk, Tq, a->rope_positions, H, dk);
        clattn_rope_rotate(&d->rope, plan->rope_cs, K, B * Tk, HK * dk, Tk, clattn_rope_key_positions(d, a), HK, dk);
    }
    if (d->kv_half) { /* the values a half (or bfloat16) KV cache holds */
        for (size_t n = 0; n < B * Tk * HK * dk; n++) K[n] = clattn_round_kv(K[n], d->kv_half);
        for (size_t n = 0; n < B * Tk * HK * dv; n++) V[n] = clattn_round_kv(V[n], d->kv_half);
    }
}

/* Where head h of batch entry b finds its (Tq, Tk) mask: per batch entry and/or head, or one for all. */
static size_t mask_at(const clattn_attention_desc *d, size_t b, size_t h)
{
    const size_t nh = d->attn_mask_per_head ? d->heads : 1;
    return ((d->attn_mask_per_batch ? b : 0) * nh + (d->attn_mask_per_head ? h : 0)) * d->seq_q * d->seq_kv;
}

/* Is key j hidden from query i of batch entry b, head h? */
static int hidden(const clattn_attention_desc *d, const clattn_attention_args *a, size_t b, size_t h, size_t i,
                  size_t j)
{
    if (d->causal && j > i) return 1;
    if (d->window && i - j >= d->window) return 1; /* j <= i here: window needs causal */
    if (d->key_padding_mask && a->key_padding_mask[b * d->seq_kv + j]) return 1;
    if (d->attn_mask == CLATTN_MASK_BOOL && ((const uint8_t *)a->attn_mask)[mask_at(d, b, h) + i * d->seq_kv + j])
        return 1;
    return 0;
}

double clattn_ref_scores(const struct clattn_plan *plan, const clattn_attention_args *a, const float *Q,
                         const float *K, size_t b, size_t h, size_t i, double *s, int *any_nan)
{
    const clattn_attention_desc *d = &plan->d;
    const size_t Tq = d->seq_q, Tk = d->seq_kv, H = d->heads, HK = d->kv_heads, G = H / HK, dk = d->head_dim_qk;
    const float *q = &Q[(b * Tq + i) * H * dk + h * dk];
    double max = -INFINITY;
    *any_nan = 0;
    for (size_t j = 0; j < Tk; j++) {
        const float *k = &K[(b * Tk + j) * HK * dk + (h / G) * dk];
        double v = 0.0;
        for (size_t c = 0; c < dk; c++) v += (double)q[c] * (double)k[c];
        v *= d->scale;
        if (d->attn_mask == CLATTN_MASK_FLOAT) v += ((const float *)a->attn_mask)[mask_at(d, b, h) + i * Tk + j];
        s[j] = hidden(d, a, b, h, i, j) ? -INFINITY : v;
        if (isnan(s[j])) *any_nan = 1;
        else if (s[j] > max) max = s[j];
    }
    return max;
}
