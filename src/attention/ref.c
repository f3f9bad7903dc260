/* ref.c: the plain-C CPU reference. It is the `ref` device and the
 * oracle of every test, so it is written to be read, not to be fast:
 * float storage, double accumulation, one numbered pass per step.
 *
 * Shapes (row-major):
 *   x (B, Tq, E), kv (B, Tk, Ekv)
 *   Q (B, Tq, H*dk), K (B, Tk, HK*dk), V (B, Tk, HK*dv)   token-major, head h at columns h*d..
 *   query head h reads key/value head h / (H/HK)
 *   attn (B, H, Tq, Tk), ctx (B, Tq, H*dv), out (B, Tq, Eo or H*dv)
 */
#include "attention.h"

#include "common/philox.cl"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

clattn_status clattn_ref_execute(struct clattn_plan *plan, const clattn_attention_args *a, float *out,
                                 float *attn, float *lse, float *context)
{
    const clattn_attention_desc *d = &plan->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    const size_t H = d->heads, HK = d->kv_heads, G = H / HK, dk = d->head_dim_qk, dv = d->head_dim_v;
    const uint32_t seed_lo = (uint32_t)d->seed, seed_hi = (uint32_t)(d->seed >> 32);
    const uint32_t threshold = clattn_dropout_threshold(d->dropout);
    const float keep_scale = clattn_dropout_keep_scale(d->dropout);

    float *Q = clattn_malloc(B * Tq * H * dk * sizeof *Q);
    float *K = clattn_malloc(B * Tk * HK * dk * sizeof *K);
    float *V = clattn_malloc(B * Tk * HK * dv * sizeof *V);
    float *ctx = clattn_malloc(B * Tq * H * dv * sizeof *ctx);
    double *w = clattn_malloc(Tk * sizeof *w);
    if (!Q || !K || !V || !ctx || !w) {
        free(Q); free(K); free(V); free(ctx); free(w);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference: allocating Q/K/V");
    }
    double t0 = now_ms();

    /* 1. projections: Q = x Wq^T + bq, K = kv Wk^T + bk, V = kv Wv^T + bv (or the inputs themselves; K and V
     * rounded to half with kv_half, the values a half KV cache holds) */
    clattn_ref_qkv(plan, a, Q, K, V);
    double t1 = now_ms();

    /* 2. per (b, h, i): scores, masks, softmax, dropout, context */
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < Tq; i++) {
                /* 2a. scaled scores, masked entries -inf */
                int any_nan;
                const double max = clattn_ref_scores(plan, a, Q, K, b, h, i, w, &any_nan);
                /* 2b. softmax; a row with no visible key gets weights 0, a NaN score makes the row NaN. With
                 * desc.sinks the head's sink logit joins the denominator (exp(sink - max)), valueless */
                double sum = 0.0;
                for (size_t j = 0; j < Tk; j++) {
                    w[j] = max == -INFINITY ? 0.0 : exp(w[j] - max);
                    sum += w[j];
                }
                if (plan->sinks && max != -INFINITY) sum += exp((double)plan->sinks[h] - max);
                /* the row's log-sum-exp (training plans): -inf with no visible key; with a sink, that of the
                 * weights with it (the sink alone, s_h, in a row with no visible key) */
                if (lse) {
                    double l = max == -INFINITY ? -INFINITY : max + log(sum);
                    if (plan->sinks && max == -INFINITY) l = plan->sinks[h];
                    lse[(b * H + h) * Tq + i] = any_nan ? NAN : (float)l;
                }
                for (size_t j = 0; j < Tk; j++) {
                    float p = any_nan ? NAN : max == -INFINITY ? 0.0f : (float)(w[j] / sum);
                    /* 2c. dropout, keyed by the logical position (b, h, i, j), b from a varlen sequence's index */
                    if (d->dropout > 0.0f)
                        p = clattn_dropout_keep(seed_lo, seed_hi, (uint32_t)(plan->drop_b0 + b), (uint32_t)h,
                                                (uint32_t)i, (uint32_t)j, threshold) ? p * keep_scale : 0.0f;
                    w[j] = p;
                    if (attn) attn[((b * H + h) * Tq + i) * Tk + j] = p;
                }
                /* 2d. context = weights . V */
                for (size_t c = 0; c < dv; c++) {
                    double acc = 0.0;
                    for (size_t j = 0; j < Tk; j++) acc += w[j] * (double)V[(b * Tk + j) * HK * dv + (h / G) * dv + c];
                    ctx[(b * Tq + i) * H * dv + h * dv + c] = (float)acc;
                }
            }
    double t2 = now_ms();

    /* 3. output projection, or the merged heads themselves */
    if (plan->has_out)
        clattn_ref_linear(ctx, B * Tq, H * dv, plan->w_out, plan->b_out, d->out_dim, out);
    else
        memcpy(out, ctx, B * Tq * H * dv * sizeof *out);
    if (context) memcpy(context, ctx, B * Tq * H * dv * sizeof *context);
    double t3 = now_ms();

    if (plan->profiling) {
        for (int s = 0; s < CLATTN_NSTAGES; s++) plan->stage_ms[s] = 0.0;
        plan->stage_ms[CLATTN_STAGE_QKV_PROJECTION] = t1 - t0;
        plan->stage_ms[CLATTN_STAGE_SOFTMAX] = t2 - t1; /* scores, softmax and context in one loop */
        plan->stage_ms[CLATTN_STAGE_OUT_PROJECTION] = t3 - t2;
    }
    free(Q); free(K); free(V); free(ctx); free(w);
    return CLATTN_STATUS_SUCCESS;
}

/* ---- the ref backend */

/* A half-precision plan (desc.dtype F16 or BF16): its inputs widened to float (exactly), the fp32 function, its outputs
 * rounded to the type once (to nearest even). A training plan's lse and context are fp32, written as they are. */
static clattn_status ref_execute_typed(struct clattn_plan *p, const clattn_attention_args *a)
{
    const clattn_attention_desc *d = &p->d;
    const clattn_dtype t = d->dtype;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    const size_t n_x = B * Tq * d->embed, n_kv = d->cross ? B * Tk * d->kv_embed : 0, n_v = clattn_plan_value_elems(d);
    const size_t n_out = B * Tq * p->out_width, n_attn = a->attn ? B * d->heads * Tq * Tk : 0;
    float *x = clattn_malloc(n_x * sizeof *x), *kv = n_kv ? clattn_malloc(n_kv * sizeof *kv) : NULL;
    float *v = n_v ? clattn_malloc(n_v * sizeof *v) : NULL, *out = clattn_malloc(n_out * sizeof *out);
    float *attn = n_attn ? clattn_malloc(n_attn * sizeof *attn) : NULL;
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (!x || !out || (n_kv && !kv) || (n_v && !v) || (n_attn && !attn)) {
        st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference: widening the %s inputs", clattn_dtype_name(t));
    } else {
        clattn_attention_args wide = *a;
        clattn_dtype_widen(a->x, n_x, t, x);
        wide.x = x;
        if (kv) clattn_dtype_widen(a->kv, n_kv, t, kv), wide.kv = kv;
        if (v) clattn_dtype_widen(a->value, n_v, t, v), wide.value = v;
        st = clattn_ref_execute(p, &wide, out, attn, a->lse, a->context);
        if (st == CLATTN_STATUS_SUCCESS) {
            clattn_dtype_narrow(out, n_out, t, a->out);
            if (attn) clattn_dtype_narrow(attn, n_attn, t, a->attn);
        }
    }
    free(x); free(kv); free(v); free(out); free(attn);
    return st;
}

static clattn_status ref_execute_host(struct clattn_plan *p, const clattn_attention_args *a);

/* A varlen plan (desc.varlen): each sequence alone, as a plan of batch 1 and its own lengths would compute it (the
 * definition of a variable-length batch), on its rows of the packed arrays (a training plan's lse: the sequence's
 * (H, L) rows at H * its first row). A sequence with queries and no keys: its rows' context is 0, so each output
 * row is b_out (or 0), and their lse -inf. */
static clattn_status ref_execute_varlen(struct clattn_plan *p, const clattn_attention_args *a)
{
    const clattn_attention_desc *d = &p->d;
    const clattn_rows r = clattn_plan_rows_of(p, a->cu_seqlens_q, a->cu_seqlens_kv);
    const size_t es = clattn_dtype_size(d->dtype), W = p->out_width, H = d->heads, C = H * d->head_dim_v;
    const size_t v_row = d->separate_value ? d->kv_heads * d->head_dim_v : 0;
    double ms[CLATTN_NSTAGES] = {0};
    for (size_t b = 0; b < d->batch; b++) {
        const size_t q0 = r.cu_q[b], nq = r.cu_q[b + 1] - q0, k0 = r.cu_k[b], nk = r.cu_k[b + 1] - k0;
        if (nq == 0) continue;
        char *out = (char *)a->out + q0 * W * es;
        if (nk == 0) {
            float *row = clattn_calloc(W, sizeof *row);
            if (!row) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference: an output row");
            if (p->has_out && p->b_out) memcpy(row, p->b_out, W * sizeof *row);
            for (size_t i = 0; i < nq; i++) clattn_dtype_narrow(row, W, d->dtype, out + i * W * es);
            free(row);
            for (size_t i = 0; a->lse && i < H * nq; i++) /* (its H rows of nq: the sink alone, or none) */
                a->lse[H * q0 + i] = p->sinks ? p->sinks[i / nq] : -INFINITY;
            if (a->context) memset(a->context + q0 * C, 0, nq * C * sizeof *a->context);
            continue;
        }
        /* the plan of this sequence alone: a copy read by the reference's functions only (its lock is never used) */
        struct clattn_plan sub = *p;
        sub.d.varlen = 0, sub.d.batch = 1, sub.d.seq_q = nq, sub.d.seq_kv = d->cross ? nk : nq, sub.drop_b0 = b;
        clattn_attention_args s = {
            .x = (const char *)a->x + q0 * d->embed * es, .x_count = nq * d->embed, .out = out, .out_count = nq * W};
        if (d->cross) s.kv = (const char *)a->kv + k0 * d->kv_embed * es, s.kv_count = nk * d->kv_embed;
        if (d->separate_value) s.value = (const char *)a->value + k0 * v_row * es, s.value_count = nk * v_row;
        if (a->rope_positions) s.rope_positions = a->rope_positions + q0, s.rope_positions_count = nq;
        if (a->rope_positions_kv) s.rope_positions_kv = a->rope_positions_kv + k0, s.rope_positions_kv_count = nk;
        if (a->lse) s.lse = a->lse + H * q0, s.lse_count = H * nq;
        if (a->context) s.context = a->context + q0 * C, s.context_count = nq * C;
        TRY(ref_execute_host(&sub, &s));
        for (int st = 0; st < CLATTN_NSTAGES; st++) ms[st] += sub.stage_ms[st];
    }
    if (p->profiling) memcpy(p->stage_ms, ms, sizeof ms);
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status ref_execute_host(struct clattn_plan *p, const clattn_attention_args *a)
{
    if (p->d.varlen) return ref_execute_varlen(p, a);
    if (p->d.dtype != CLATTN_DTYPE_F32) return ref_execute_typed(p, a);
    return clattn_ref_execute(p, a, a->out, a->attn, a->lse, a->context);
}

static clattn_status ref_stage_times(struct clattn_plan *p, double ms[CLATTN_NSTAGES])
{
    for (int s = 0; s < CLATTN_NSTAGES; s++) ms[s] = p->profiling ? p->stage_ms[s] : 0.0;
    return CLATTN_STATUS_SUCCESS;
}

static int ref_produces_weights(const struct clattn_plan *p)
{
    (void)p;
    return 1;
}

const clattn_backend_ops clattn_backend_ref = {
    .name = "ref",
    .produces_weights = ref_produces_weights,
    .execute_host = ref_execute_host,
    .stage_times = ref_stage_times,
    .backward_host = clattn_ref_backward,
};
