/* backward_ref.c: the backward pass on the CPU: the ref device's, and what the OpenCL backward is checked
 * against next to the test oracle. Written to be read: float storage, double accumulation, one numbered pass per
 * step, the forward's own row loop (ref.c) run again with the gradient beside it.
 *
 * Forward (ref.c), per batch b, head h (key/value head h/G), query i, key j:
 *   s_ij = scale q_i.k_j (+ float mask), -inf where hidden;  P_ij = exp(s_ij - lse_i);  m_ij = keep_ij/(1-p) or 0
 *   ctx_i = sum_j P_ij m_ij v_j;  out = ctx Wo^T + bo
 * Backward, from dOut:
 *   dctx = dOut Wo;  dWo = dOut^T ctx;  dbo = sum_rows dOut
 *   dP_ij = m_ij dctx_i.v_j;  D_i = dctx_i.ctx_i (= sum_j P_ij dP_ij);  dS_ij = P_ij (dP_ij - D_i)
 *   dq_i = scale sum_j dS_ij k_j;  dk_j += scale dS_ij q_i;  dv_j += P_ij m_ij dctx_i   (summed over a group's heads)
 *   dWq = dQ^T x, dbq = sum_rows dQ (K and V from kv);  dx = dQ Wq (+ dK Wk + dV Wv for self-attention)
 *   with rotary embeddings (q = R x Wq^T ...): dQ and dK rotated back by R^T first (rope.c)
 * Shapes as in ref.c: Q (B, Tq, H*dk), K (B, Tk, HK*dk), V (B, Tk, HK*dv), ctx (B, Tq, H*dv). */
#include "attention.h"

#include "common/philox.cl"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* out (m, n) = a^T b for a (rows, m) and b (rows, n): a weight's gradient, written in `layout` (RAW: (n, m)). */
static void grad_weight(const double *a, const float *b, size_t rows, size_t m, size_t n, clattn_layout layout,
                        float *out)
{
    for (size_t o = 0; o < m; o++)
        for (size_t c = 0; c < n; c++) {
            double acc = 0.0;
            for (size_t r = 0; r < rows; r++) acc += a[r * m + o] * (double)b[r * n + c];
            out[layout == CLATTN_LAYOUT_RAW ? c * m + o : o * n + c] = (float)acc;
        }
}

/* out (m) = the sum of a's rows (rows, m): a bias's gradient. */
static void grad_bias(const double *a, size_t rows, size_t m, float *out)
{
    for (size_t o = 0; o < m; o++) {
        double acc = 0.0;
        for (size_t r = 0; r < rows; r++) acc += a[r * m + o];
        out[o] = (float)acc;
    }
}

/* acc (rows, n) += a (rows, m) w, w (m, n) in nn.Linear layout [out = m, in = n]: an input's gradient through a
 * projection; without weights (w NULL, m = n) acc += a. */
static void grad_input(const double *a, const float *w, size_t rows, size_t m, size_t n, double *acc)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < n; c++) {
            double s = 0.0;
            if (w)
                for (size_t o = 0; o < m; o++) s += a[r * m + o] * (double)w[o * n + c];
            else
                s = a[r * m + c];
            acc[r * n + c] += s;
        }
}

static void store(const double *a, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) out[i] = (float)a[i];
}

static clattn_status ref_backward_f32(struct clattn_plan *plan, const clattn_attention_args *a,
                                     const clattn_attention_grads *g)
{
    const clattn_attention_desc *d = &plan->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const size_t H = d->heads, HK = d->kv_heads, G = H / HK, dk = d->head_dim_qk, dv = d->head_dim_v;
    const size_t Eo = plan->out_width, Hdv = H * dv;
    const float *kv = d->cross ? a->kv : a->x;
    const uint32_t seed_lo = (uint32_t)d->seed, seed_hi = (uint32_t)(d->seed >> 32);
    const uint32_t threshold = clattn_dropout_threshold(d->dropout);
    const float keep_scale = clattn_dropout_keep_scale(d->dropout);

    float *Q = clattn_malloc(B * Tq * H * dk * sizeof *Q), *K = clattn_malloc(B * Tk * HK * dk * sizeof *K);
    float *V = clattn_malloc(B * Tk * HK * dv * sizeof *V), *ctx = clattn_malloc(B * Tq * Hdv * sizeof *ctx);
    double *dout = clattn_malloc(B * Tq * Eo * sizeof *dout), *dctx = clattn_malloc(B * Tq * Hdv * sizeof *dctx);
    double *dQ = calloc(B * Tq * H * dk, sizeof *dQ), *dK = calloc(B * Tk * HK * dk, sizeof *dK);
    double *dV = calloc(B * Tk * HK * dv, sizeof *dV), *P = clattn_malloc(Tk * sizeof *P);
    double *m = clattn_malloc(Tk * sizeof *m), *gx = calloc(B * Tq * E, sizeof *gx);
    double *gkv = d->cross ? calloc(B * Tk * Ekv, sizeof *gkv) : NULL;
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (!Q || !K || !V || !ctx || !dout || !dctx || !dQ || !dK || !dV || !P || !m || !gx || (d->cross && !gkv)) {
        st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference backward: allocating its arrays");
        goto done;
    }

    /* 1. the forward's projections again: Q, K, V */
    clattn_ref_qkv(plan, a, Q, K, V);

    /* 2. through the output projection: dctx = dOut Wo (or dOut itself) */
    const float *gout = g->grad_out;
    for (size_t n = 0; n < B * Tq * Eo; n++) dout[n] = gout[n];
    memset(dctx, 0, B * Tq * Hdv * sizeof *dctx);
    grad_input(dout, plan->has_out ? plan->w_out : NULL, B * Tq, Eo, Hdv, dctx);

    /* 3. per (b, h, i): the row's weights again, then its gradient */
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < Tq; i++) {
                const float *q = &Q[(b * Tq + i) * H * dk + h * dk];
                const double *dc = &dctx[(b * Tq + i) * Hdv + h * dv];
                float *c_row = &ctx[(b * Tq + i) * Hdv + h * dv];
                double *dq = &dQ[(b * Tq + i) * H * dk + h * dk];
                /* 3a. scaled, masked scores into P; the row's log-sum-exp, or the forward's */
                int any_nan;
                const double max = clattn_ref_scores(plan, a, Q, K, b, h, i, P, &any_nan);
                double lse;
                if (g->lse) {
                    lse = g->lse[(b * H + h) * Tq + i];
                } else {
                    double sum = 0.0;
                    for (size_t j = 0; j < Tk; j++) sum += max == -INFINITY ? 0.0 : exp(P[j] - max);
                    /* with desc.sinks, the sink joins the sum (the forward's lse: ref.c) */
                    if (plan->sinks && max != -INFINITY) sum += exp((double)plan->sinks[h] - max);
                    lse = any_nan ? NAN : max == -INFINITY ? -INFINITY : max + log(sum);
                }
                /* 3b. P = exp(s - lse): 0 for a hidden key and in a row with none visible, NaN in a NaN row;
                 * m: the dropout factor keep/(1-p), keyed by (b, h, i, j) as in the forward */
                for (size_t j = 0; j < Tk; j++) {
                    P[j] = isnan(lse) ? NAN : lse == -INFINITY || P[j] == -INFINITY ? 0.0 : exp(P[j] - lse);
                    m[j] = 1.0;
                    if (d->dropout > 0.0f)
                        m[j] = clattn_dropout_keep(seed_lo, seed_hi, (uint32_t)(plan->drop_b0 + b), (uint32_t)h,
                                                   (uint32_t)i, (uint32_t)j, threshold) ? keep_scale : 0.0;
                }
                /* 3c. the row's context: the forward's, or again (a dropped weight is 0 even in a NaN row) */
                for (size_t c = 0; c < dv; c++) {
                    double acc = 0.0;
                    if (g->context) {
                        acc = g->context[(b * Tq + i) * Hdv + h * dv + c];
                    } else {
                        for (size_t j = 0; j < Tk; j++)
                            if (m[j] != 0.0)
                                acc += P[j] * m[j] * (double)V[(b * Tk + j) * HK * dv + (h / G) * dv + c];
                    }
                    c_row[c] = (float)acc;
                }
                /* 3d. D = dctx . ctx */
                double D = 0.0;
                for (size_t c = 0; c < dv; c++) D += dc[c] * (double)c_row[c];
                /* 3e. dP, dS, and their products with K, Q and dctx */
                for (size_t j = 0; j < Tk; j++) {
                    const float *k = &K[(b * Tk + j) * HK * dk + (h / G) * dk];
                    const float *v = &V[(b * Tk + j) * HK * dv + (h / G) * dv];
                    double *dkj = &dK[(b * Tk + j) * HK * dk + (h / G) * dk];
                    double *dvj = &dV[(b * Tk + j) * HK * dv + (h / G) * dv];
                    if (P[j] == 0.0) continue; /* a hidden or underflowed key: no gradient flows through it */
                    double dp = 0.0;
                    if (m[j] != 0.0) {
                        for (size_t c = 0; c < dv; c++) dp += dc[c] * (double)v[c];
                        dp *= m[j];
                        for (size_t c = 0; c < dv; c++) dvj[c] += P[j] * m[j] * dc[c];
                    }
                    const double ds = P[j] * (dp - D) * d->scale;
                    for (size_t c = 0; c < dk; c++) {
                        dq[c] += ds * (double)k[c];
                        dkj[c] += ds * (double)q[c];
                    }
                }
            }

    /* 3b. rotary embeddings: dQ and dK were the rotated Q's and K's, rotated back (the rotation's transpose) */
    if (d->rope.kind != CLATTN_ROPE_NONE) {
        clattn_rope_rotate_grad(&d->rope, plan->rope_cs, dQ, B * Tq, H * dk, Tq, a->rope_positions, H, dk);
        clattn_rope_rotate_grad(&d->rope, plan->rope_cs, dK, B * Tk, HK * dk, Tk, clattn_rope_key_positions(d, a), HK,
                                dk);
    }

    /* 4. the weights' and biases' gradients */
    if (g->grad_w_out) grad_weight(dout, ctx, B * Tq, Eo, Hdv, d->layout, g->grad_w_out);
    if (g->grad_b_out) grad_bias(dout, B * Tq, Eo, g->grad_b_out);
    if (g->grad_w_query) grad_weight(dQ, a->x, B * Tq, H * dk, E, d->layout, g->grad_w_query);
    if (g->grad_w_key) grad_weight(dK, kv, B * Tk, HK * dk, Ekv, d->layout, g->grad_w_key);
    if (g->grad_w_value) grad_weight(dV, kv, B * Tk, HK * dv, Ekv, d->layout, g->grad_w_value);
    if (g->grad_b_query) grad_bias(dQ, B * Tq, H * dk, g->grad_b_query);
    if (g->grad_b_key) grad_bias(dK, B * Tk, HK * dk, g->grad_b_key);
    if (g->grad_b_value) grad_bias(dV, B * Tk, HK * dv, g->grad_b_value);

    /* 5. the inputs' gradients: x feeds Q (and K and V in self-attention), kv feeds K and V */
    if (g->grad_x || g->grad_kv) {
        double *kv_acc = d->cross ? gkv : gx;
        const int qkv = plan->has_qkv;
        grad_input(dQ, qkv ? plan->w_query : NULL, B * Tq, H * dk, E, gx);
        grad_input(dK, qkv ? plan->w_key : NULL, B * Tk, HK * dk, Ekv, kv_acc);
        if (!d->separate_value) grad_input(dV, qkv ? plan->w_value : NULL, B * Tk, HK * dv, Ekv, kv_acc);
        if (g->grad_x) store(gx, B * Tq * E, g->grad_x);
        if (g->grad_kv) store(gkv, B * Tk * Ekv, g->grad_kv);
    }
    if (g->grad_value) store(dV, B * Tk * HK * dv, g->grad_value); /* separate_value: V is the value input */
done:
    free(Q); free(K); free(V); free(ctx); free(dout); free(dctx); free(dQ); free(dK); free(dV); free(P); free(m);
    free(gx); free(gkv);
    return st;
}

/* A varlen training plan (desc.varlen), in fp32: each sequence's backward alone (a plan of batch 1 and its lengths) on
 * its rows, the inputs' gradients written in their rows, the parameters' summed over the sequences (in double). A
 * sequence with queries and no keys: its output rows are b_out, so grad_x's rows are 0 and grad_out's rows add to
 * b_out's gradient; one with keys and no queries: its grad_kv (grad_value) rows are 0. */
static clattn_status ref_backward_varlen(struct clattn_plan *plan, const clattn_attention_args *a,
                                         const clattn_attention_grads *g)
{
    const clattn_attention_desc *d = &plan->d;
    const clattn_rows r = clattn_plan_rows_of(plan, a->cu_seqlens_q, a->cu_seqlens_kv);
    const size_t E = d->embed, Ekv = d->kv_embed, H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk;
    const size_t dv = d->head_dim_v, W = plan->out_width, C = H * dv, Vw = d->separate_value ? HK * dv : 0;
    enum { NP = 8 };
    float *const out[NP] = {g->grad_w_query, g->grad_w_key, g->grad_w_value, g->grad_b_query, g->grad_b_key,
                            g->grad_b_value, g->grad_w_out, g->grad_b_out};
    const size_t n[NP] = {H * dk * E, HK * dk * Ekv, HK * dv * Ekv, H * dk, HK * dk, HK * dv, d->out_dim * C, d->out_dim};
    double *sum[NP] = {0};
    float *one[NP] = {0};
    clattn_status st = CLATTN_STATUS_SUCCESS;
    for (int i = 0; i < NP && !st; i++)
        if (out[i] && (!(sum[i] = calloc(n[i], sizeof *sum[i])) || !(one[i] = clattn_malloc(n[i] * sizeof *one[i]))))
            st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference backward: a parameter's gradient");
    const float *x = a->x, *kv = a->kv, *value = a->value, *gout = g->grad_out;
    float *gx = g->grad_x, *gkv = g->grad_kv, *gvalue = g->grad_value;
    for (size_t b = 0; b < d->batch && !st; b++) {
        const size_t q0 = r.cu_q[b], nq = r.cu_q[b + 1] - q0, k0 = r.cu_k[b], nk = r.cu_k[b + 1] - k0;
        if (nq == 0 || nk == 0) {
            if (gkv && nq == 0) memset(gkv + k0 * Ekv, 0, nk * Ekv * sizeof *gkv);
            if (gvalue && nq == 0) memset(gvalue + k0 * Vw, 0, nk * Vw * sizeof *gvalue);
            if (gx && nk == 0) memset(gx + q0 * E, 0, nq * E * sizeof *gx);
            for (size_t i = 0; sum[7] && nk == 0 && i < nq * W; i++) sum[7][i % W] += gout[q0 * W + i];
            continue;
        }
        struct clattn_plan sub = *plan; /* read by the reference only (its lock is never used) */
        sub.d.varlen = 0, sub.d.batch = 1, sub.d.seq_q = nq, sub.d.seq_kv = d->cross ? nk : nq, sub.drop_b0 = b;
        clattn_attention_args sa = {.x = x + q0 * E};
        if (d->cross) sa.kv = kv + k0 * Ekv;
        if (a->rope_positions) sa.rope_positions = a->rope_positions + q0;
        if (a->rope_positions_kv) sa.rope_positions_kv = a->rope_positions_kv + k0;
        if (Vw) sa.value = value + k0 * Vw;
        clattn_attention_grads sg = {.grad_out = gout + q0 * W};
        if (g->lse) sg.lse = g->lse + H * q0, sg.context = g->context + q0 * C;
        if (gx) sg.grad_x = gx + q0 * E;
        if (gkv) sg.grad_kv = gkv + k0 * Ekv;
        if (gvalue) sg.grad_value = gvalue + k0 * Vw;
        sg.grad_w_query = one[0], sg.grad_w_key = one[1], sg.grad_w_value = one[2], sg.grad_b_query = one[3];
        sg.grad_b_key = one[4], sg.grad_b_value = one[5], sg.grad_w_out = one[6], sg.grad_b_out = one[7];
        st = ref_backward_f32(&sub, &sa, &sg);
        for (int i = 0; i < NP && !st; i++)
            for (size_t j = 0; one[i] && j < n[i]; j++) sum[i][j] += one[i][j];
    }
    for (int i = 0; i < NP && !st; i++)
        if (out[i]) store(sum[i], n[i], out[i]);
    for (int i = 0; i < NP; i++) free(sum[i]), free(one[i]);
    return st;
}

static clattn_status backward_fp32(struct clattn_plan *plan, const clattn_attention_args *a,
                                   const clattn_attention_grads *g)
{
    return plan->d.varlen ? ref_backward_varlen(plan, a, g) : ref_backward_f32(plan, a, g);
}

/* A half-precision training plan (desc.dtype F16 or BF16): x, kv, value and grad_out widened to float (exactly), the
 * fp32 backward above, each gradient rounded to the type once (to nearest even); lse and context are fp32 as given. */
static clattn_status ref_backward_typed(struct clattn_plan *plan, const clattn_attention_args *a,
                                       const clattn_attention_grads *g)
{
    const clattn_attention_desc *d = &plan->d;
    const clattn_dtype t = d->dtype;
    const size_t H = d->heads, HK = d->kv_heads;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v;
    const clattn_rows r = clattn_plan_rows_of(plan, a->cu_seqlens_q, a->cu_seqlens_kv); /* B*Tq, B*Tk or varlen's */
    enum { NIN = 4, NG = 11 };
    /* the inputs: x, kv, value, grad_out */
    const void *in[NIN] = {a->x, d->cross ? a->kv : NULL, d->separate_value ? a->value : NULL, g->grad_out};
    const size_t n_in[NIN] = {r.q * d->embed, r.k * d->kv_embed, clattn_rows_value_elems(d, &r),
                              r.q * plan->out_width};
    /* the gradients, in clattn_attention_grads' order after grad_out */
    void *const out[NG] = {g->grad_x, g->grad_kv, g->grad_w_query, g->grad_w_key, g->grad_w_value, g->grad_b_query,
                           g->grad_b_key, g->grad_b_value, g->grad_w_out, g->grad_b_out, g->grad_value};
    const size_t n_out[NG] = {r.q * d->embed, r.k * d->kv_embed, H * dk * d->embed, HK * dk * d->kv_embed,
                              HK * dv * d->kv_embed, H * dk, HK * dk, HK * dv, d->out_dim * H * dv, d->out_dim,
                              clattn_rows_value_elems(d, &r)};
    float *wide[NIN] = {0}, *grad[NG] = {0};
    clattn_status st = CLATTN_STATUS_SUCCESS;
    for (int i = 0; i < NIN && !st; i++)
        if (in[i] && !(wide[i] = clattn_malloc((n_in[i] ? n_in[i] : 1) * sizeof(float))))
            st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference backward: widening the %s inputs",
                             clattn_dtype_name(t));
    for (int i = 0; i < NG && !st; i++)
        if (out[i] && !(grad[i] = clattn_malloc((n_out[i] ? n_out[i] : 1) * sizeof(float))))
            st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference backward: the fp32 gradients");
    if (!st) {
        for (int i = 0; i < NIN; i++)
            if (in[i]) clattn_dtype_widen(in[i], n_in[i], t, wide[i]);
        clattn_attention_args wa = *a;
        wa.x = wide[0];
        if (wide[1]) wa.kv = wide[1];
        if (wide[2]) wa.value = wide[2];
        clattn_attention_grads wg = *g;
        wg.grad_out = wide[3];
        void **const slots[NG] = {&wg.grad_x, &wg.grad_kv, &wg.grad_w_query, &wg.grad_w_key, &wg.grad_w_value,
                                   &wg.grad_b_query, &wg.grad_b_key, &wg.grad_b_value, &wg.grad_w_out,
                                   &wg.grad_b_out, &wg.grad_value};
        for (int i = 0; i < NG; i++) *slots[i] = grad[i];
        st = backward_fp32(plan, &wa, &wg);
        for (int i = 0; i < NG && !st; i++)
            if (out[i]) clattn_dtype_narrow(grad[i], n_out[i], t, out[i]);
    }
    for (int i = 0; i < NIN; i++) free(wide[i]);
    for (int i = 0; i < NG; i++) free(grad[i]);
    return st;
}

clattn_status clattn_ref_backward(struct clattn_plan *plan, const clattn_attention_args *a,
                                  const clattn_attention_grads *g)
{
    if (plan->d.dtype != CLATTN_DTYPE_F32) return ref_backward_typed(plan, a, g);
    return backward_fp32(plan, a, g);
}
