/* flash_backward.cl: the fused backward core (src/cores/flash_backward.c), FlashAttention-2's backward in
 * two passes that recompute the weights from Q, K and the forward's log-sum-exp, never a Tq x Tk buffer:
 *
 *   bwd_dot    D_i = dctx_i . ctx_i                         (= sum_j P_ij dP_ij)        one work-item per row
 *   bwd_dq     dQ_i = scale sum_j dS_ij k_j                                            ROWS query rows per item
 *   bwd_dkdv   dK_j = scale sum_i dS_ij q_i, dV_j = sum_i P_ij m_ij dctx_i, over the
 *              GROUP query heads that read key/value head j's (no atomics)             ROWS key rows per item
 * with s_ij = scale q_i.k_j (+ masks, mask.cl), P_ij = exp(s_ij - lse_i), m_ij the dropout factor of the
 * forward's keep decision (keep_scale or 0, philox.cl), dP_ij = m_ij dctx_i.v_j, dS_ij = P_ij (dP_ij - D_i).
 * A hidden key, and every key of a row with no visible key (lse = -inf), has P = 0 and passes no gradient;
 * a NaN row (lse NaN) stays NaN. The reference is src/attention/backward_ref.c.
 *
 * Layout as flash_common.cl's: Q, K, V, dctx, ctx and the gradients are token-major rows with a row stride,
 * head h at column h*DK (Q, K, dQ, dK) or h*DV (V, dV, dctx, ctx); lse and D are (B, H, Tq).
 * Specialised by -D: DK, DV, GROUP, CAUSAL, WINDOW, KPM, MASK_KIND, DROPOUT (philox.cl and mask.cl go
 * first) and the core's tuning parameters:
 *   ROWS   rows per work-item (their gradients, and Q or K/V rows, in registers: each loaded row feeds ROWS)
 *   VW     vector width along the head dimension (divides DK and DV)
 * One work-item streams its rows' partners through the cache, no local memory: the CPU devices' way
 * (like flash_rows). */
#ifndef DK
#define DK 64
#endif
#ifndef DV
#define DV DK
#endif
#ifndef GROUP
#define GROUP 1
#endif
#ifndef ROWS
#define ROWS 4
#endif
#ifndef VW
#define VW 1
#endif

#if VW == 8
typedef float8 bv_t;
#define BV_LOAD(i, p) vload8((i), (p))
#define BV_STORE(x, i, p) vstore8((x), (i), (p))
inline float bv_sum(float8 x) { const float4 t = x.lo + x.hi; const float2 u = t.lo + t.hi; return u.x + u.y; }
#elif VW == 4
typedef float4 bv_t;
#define BV_LOAD(i, p) vload4((i), (p))
#define BV_STORE(x, i, p) vstore4((x), (i), (p))
inline float bv_sum(float4 x) { const float2 u = x.lo + x.hi; return u.x + u.y; }
#else
typedef float bv_t;
#define BV_LOAD(i, p) ((p)[(i)])
#define BV_STORE(x, i, p) ((p)[(i)] = (x))
inline float bv_sum(float x) { return x; }
#endif
#define NK (DK / VW)
#define NV (DV / VW)

/* Every pass's arguments: Q, K, V, the context's gradient, the rows' log-sum-exp and D, the masks, sizes,
 * scale and dropout (src/cores/flash_backward.c's order). extent: the work-items that have work. */
#define BWD_ARGS \
    __global const float *q, ulong q_off, uint q_ld, __global const float *k, ulong k_off, uint k_ld, \
    __global const float *v, ulong v_off, uint v_ld, __global const float *dctx, ulong dctx_off, uint dctx_ld, \
    __global const float *lse, ulong lse_off, __global const float *dd, __global const uchar *kpm, ulong kpm_off, \
    __global const mask_t *mask, ulong mask_off, uint Tq, uint Tk, uint H, float scale, ulong extent, \
    uint seed_lo, uint seed_hi, uint threshold, float keep_scale

/* P = exp(s - lse): 0 for a hidden key (s = -inf) and in a row with no visible key (lse = -inf); NaN in a NaN
 * row. */
inline float bwd_prob(float s, float l)
{
    return isnan(l) ? l : s == -INFINITY || l == -INFINITY ? 0.0f : exp(s - l);
}

/* The dropout factor m_ij of the forward's keep decision for weight (b, h, i, j): keep_scale or 0. */
inline float bwd_keep(uint seed_lo, uint seed_hi, uint b, uint h, uint i, uint j, uint threshold, float keep_scale)
{
#if DROPOUT
    return clattn_dropout_keep(seed_lo, seed_hi, b, h, i, j, threshold) ? keep_scale : 0.0f;
#else
    return 1.0f;
#endif
}

/* D[(b*H + h)*Tq + i] = dctx_i . ctx_i over head h's DV columns; one work-item per (b, h, i): extent of them. */
__kernel void bwd_dot(__global const float *dctx, ulong dctx_off, uint dctx_ld, __global const float *ctx,
                      ulong ctx_off, uint ctx_ld, __global float *dd, uint Tq, uint H, ulong extent)
{
    const ulong g = get_global_id(0);
    if (g >= extent) return;
    const uint i = (uint)(g % Tq);
    const ulong bh = g / Tq;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    __global const float *a = dctx + dctx_off + (b * Tq + i) * dctx_ld + (ulong)h * DV;
    __global const float *c = ctx + ctx_off + (b * Tq + i) * ctx_ld + (ulong)h * DV;
    bv_t s = (bv_t)(0.0f);
    for (uint x = 0; x < NV; x++) s = fma(BV_LOAD(x, a), BV_LOAD(x, c), s);
    dd[g] = bv_sum(s);
}

/* One work-item: query rows i0 .. i0+ROWS-1 of (b, h); global id = (b*H + h)*nblk + block. */
__kernel void bwd_dq(BWD_ARGS, __global float *dq, ulong dq_off, uint dq_ld)
{
    const ulong g = get_global_id(0);
    if (g >= extent) return;
    const uint nblk = (Tq + ROWS - 1) / ROWS;
    const uint i0 = (uint)(g % nblk) * ROWS;
    const ulong bh = g / nblk;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off;
    bv_t qr[ROWS][NK], dc[ROWS][NV], acc[ROWS][NK];
    float lr[ROWS], dr[ROWS];
    for (uint r = 0; r < ROWS; r++) {
        const uint i = min(i0 + r, Tq - 1); /* rows past Tq repeat the last one, never written */
        __global const float *qp = q + q_off + (b * Tq + i) * q_ld + (ulong)h * DK;
        __global const float *cp = dctx + dctx_off + (b * Tq + i) * dctx_ld + (ulong)h * DV;
        for (uint c = 0; c < NK; c++) qr[r][c] = BV_LOAD(c, qp), acc[r][c] = (bv_t)(0.0f);
        for (uint c = 0; c < NV; c++) dc[r][c] = BV_LOAD(c, cp);
        lr[r] = lse[lse_off + bh * Tq + i];
        dr[r] = dd[bh * Tq + i];
    }
    uint jbeg = 0, jend = Tk;
#if CAUSAL
    jend = min(Tk, min(i0 + ROWS, Tq)); /* keys after the block's last query are hidden from all its rows */
#endif
#if WINDOW
    jbeg = i0 >= WINDOW ? i0 - WINDOW + 1 : 0; /* keys before the first query's window are hidden from all */
#endif
    __global const float *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const float *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
    for (uint j = jbeg; j < jend; j++) {
        __global const float *kp = kb + (ulong)j * k_ld, *vp = vb + (ulong)j * v_ld;
        bv_t kj[NK], sd[ROWS], pd[ROWS];
        #pragma unroll
        for (uint r = 0; r < ROWS; r++) sd[r] = (bv_t)(0.0f), pd[r] = (bv_t)(0.0f);
        for (uint c = 0; c < NK; c++) {
            kj[c] = BV_LOAD(c, kp);
            #pragma unroll
            for (uint r = 0; r < ROWS; r++) sd[r] = fma(qr[r][c], kj[c], sd[r]);
        }
        for (uint c = 0; c < NV; c++) {
            const bv_t vc = BV_LOAD(c, vp);
            #pragma unroll
            for (uint r = 0; r < ROWS; r++) pd[r] = fma(dc[r][c], vc, pd[r]);
        }
        float ds[ROWS];
        for (uint r = 0; r < ROWS; r++) {
            const uint i = min(i0 + r, Tq - 1);
            const float p = bwd_prob(clattn_mask_score(bv_sum(sd[r]) * scale, i, j, b, Tk, kpm, mask), lr[r]);
            const float m = bwd_keep(seed_lo, seed_hi, (uint)b, h, i, j, threshold, keep_scale);
            ds[r] = p == 0.0f ? 0.0f : p * (m == 0.0f ? -dr[r] : m * bv_sum(pd[r]) - dr[r]);
        }
        for (uint c = 0; c < NK; c++) {
            #pragma unroll
            for (uint r = 0; r < ROWS; r++) acc[r][c] = fma((bv_t)(ds[r]), kj[c], acc[r][c]);
        }
    }
    for (uint r = 0; r < ROWS && i0 + r < Tq; r++) {
        __global float *op = dq + dq_off + (b * Tq + i0 + r) * dq_ld + (ulong)h * DK;
        for (uint c = 0; c < NK; c++) BV_STORE(acc[r][c] * scale, c, op);
    }
}

/* One work-item: key rows j0 .. j0+ROWS-1 of (b, key/value head hk), their gradients summed over the GROUP
 * query heads that read them; global id = (b*HK + hk)*nblk + block. */
__kernel void bwd_dkdv(BWD_ARGS, __global float *dk, ulong dk_off, uint dk_ld, __global float *dv, ulong dv_off,
                       uint dv_ld)
{
    const ulong g = get_global_id(0);
    if (g >= extent) return;
    const uint HK = H / GROUP;
    const uint nblk = (Tk + ROWS - 1) / ROWS;
    const uint j0 = (uint)(g % nblk) * ROWS;
    const ulong bhk = g / nblk;
    const uint hk = (uint)(bhk % HK);
    const ulong b = bhk / HK;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off;
    bv_t kr[ROWS][NK], vr[ROWS][NV], gk[ROWS][NK], gv[ROWS][NV];
    for (uint r = 0; r < ROWS; r++) {
        const uint j = min(j0 + r, Tk - 1); /* rows past Tk repeat the last one, never written */
        __global const float *kp = k + k_off + (b * Tk + j) * k_ld + (ulong)hk * DK;
        __global const float *vp = v + v_off + (b * Tk + j) * v_ld + (ulong)hk * DV;
        for (uint c = 0; c < NK; c++) kr[r][c] = BV_LOAD(c, kp), gk[r][c] = (bv_t)(0.0f);
        for (uint c = 0; c < NV; c++) vr[r][c] = BV_LOAD(c, vp), gv[r][c] = (bv_t)(0.0f);
    }
    uint ibeg = 0, iend = Tq;
#if CAUSAL
    ibeg = min(j0, Tq); /* queries before the block's first key see none of its keys */
#endif
#if WINDOW
    iend = min(Tq, j0 + ROWS - 1 + WINDOW); /* queries past the last key's window see none of them */
#endif
    for (uint x = 0; x < GROUP; x++) {
        const uint h = hk * GROUP + x;
        const ulong bh = b * H + h;
        for (uint i = ibeg; i < iend; i++) {
            const float l = lse[lse_off + bh * Tq + i], d = dd[bh * Tq + i];
            if (l == -INFINITY) continue; /* a row with no visible key passes no gradient */
            __global const float *qp = q + q_off + (b * Tq + i) * q_ld + (ulong)h * DK;
            __global const float *cp = dctx + dctx_off + (b * Tq + i) * dctx_ld + (ulong)h * DV;
            bv_t qi[NK], ci[NV], sd[ROWS], pd[ROWS];
            #pragma unroll
            for (uint r = 0; r < ROWS; r++) sd[r] = (bv_t)(0.0f), pd[r] = (bv_t)(0.0f);
            for (uint c = 0; c < NK; c++) {
                qi[c] = BV_LOAD(c, qp);
                #pragma unroll
                for (uint r = 0; r < ROWS; r++) sd[r] = fma(kr[r][c], qi[c], sd[r]);
            }
            for (uint c = 0; c < NV; c++) {
                ci[c] = BV_LOAD(c, cp);
                #pragma unroll
                for (uint r = 0; r < ROWS; r++) pd[r] = fma(vr[r][c], ci[c], pd[r]);
            }
            float ds[ROWS], w[ROWS];
            for (uint r = 0; r < ROWS; r++) {
                const uint j = min(j0 + r, Tk - 1);
                const float p = bwd_prob(clattn_mask_score(bv_sum(sd[r]) * scale, i, j, b, Tk, kpm, mask), l);
                const float m = bwd_keep(seed_lo, seed_hi, (uint)b, h, i, j, threshold, keep_scale);
                w[r] = p == 0.0f ? 0.0f : p * m;
                ds[r] = p == 0.0f ? 0.0f : p * (m == 0.0f ? -d : m * bv_sum(pd[r]) - d);
            }
            for (uint c = 0; c < NK; c++) {
                #pragma unroll
                for (uint r = 0; r < ROWS; r++) gk[r][c] = fma((bv_t)(ds[r]), qi[c], gk[r][c]);
            }
            for (uint c = 0; c < NV; c++) {
                #pragma unroll
                for (uint r = 0; r < ROWS; r++) gv[r][c] = fma((bv_t)(w[r]), ci[c], gv[r][c]);
            }
        }
    }
    for (uint r = 0; r < ROWS && j0 + r < Tk; r++) {
        __global float *kp = dk + dk_off + (b * Tk + j0 + r) * dk_ld + (ulong)hk * DK;
        __global float *vp = dv + dv_off + (b * Tk + j0 + r) * dv_ld + (ulong)hk * DV;
        for (uint c = 0; c < NK; c++) BV_STORE(gk[r][c] * scale, c, kp);
        for (uint c = 0; c < NV; c++) BV_STORE(gv[r][c], c, vp);
    }
}
