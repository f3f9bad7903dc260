/* flash_backward.cl: the fused backward core (src/cores/flash_backward.c), FlashAttention-2's backward in
 * two passes that recompute the weights from Q, K and the forward's log-sum-exp, never a Tq x Tk buffer:
 *
 *   bwd_dot    D_i = dctx_i . ctx_i                         (= sum_j P_ij dP_ij)        cores/backward_common.cl
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
 *   ROWS   rows per work-item, the lanes of its vectors (1, 2, 4, 8, 16): its rows are kept transposed, one
 *          ROWS-wide vector per head column, so that a partner row's element, broadcast, feeds ROWS lanes and
 *          the scores, exp and dS of ROWS rows are one vector each (no horizontal sums)
 *   PART   partner rows per step (1, 2, 4, 8): the other side's rows a work-item takes at once, so that each of
 *          its own rows' vectors, loaded, feeds PART FMAs, and each gradient vector is loaded and stored once per
 *          PART partners; the dot products run 2 * PART independent FMA chains. The last step's partners past
 *          the range repeat the last row and pass nothing (P 0: the masks hide keys past the range, a row past
 *          it has lse -inf)
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
#define ROWS 8
#endif
#ifndef PART
#define PART 4
#endif

#if ROWS == 16
typedef float16 rv_t;
#define RV_LOAD(p) vload16(0, (p))
#define RV_STORE(x, p) vstore16((x), 0, (p))
#elif ROWS == 8
typedef float8 rv_t;
#define RV_LOAD(p) vload8(0, (p))
#define RV_STORE(x, p) vstore8((x), 0, (p))
#elif ROWS == 4
typedef float4 rv_t;
#define RV_LOAD(p) vload4(0, (p))
#define RV_STORE(x, p) vstore4((x), 0, (p))
#elif ROWS == 2
typedef float2 rv_t;
#define RV_LOAD(p) vload2(0, (p))
#define RV_STORE(x, p) vstore2((x), 0, (p))
#else
typedef float rv_t;
#define RV_LOAD(p) (*(p))
#define RV_STORE(x, p) (*(p) = (x))
#endif

/* The PART partner rows u of one step, spelled out as variables (private arrays indexed by u stay in memory on
 * PoCL): PARTS(X, S, B) is X(0, S, B) .. X(PART-1, S, B). */
#if PART == 1
#define PARTS(X, S, B) X(0, S, B)
#elif PART == 2
#define PARTS(X, S, B) X(0, S, B) X(1, S, B)
#elif PART == 4
#define PARTS(X, S, B) X(0, S, B) X(1, S, B) X(2, S, B) X(3, S, B)
#else
#define PARTS(X, S, B) X(0, S, B) X(1, S, B) X(2, S, B) X(3, S, B) X(4, S, B) X(5, S, B) X(6, S, B) X(7, S, B)
#endif

/* S##u = sum_c a[c] * B##u[c] over n columns for every partner u: a[c] (the transposed rows) loaded once for PART
 * FMAs, two chains per partner (even and odd columns: a CPU's FMA latency is several issue intervals). */
#define BWD_DOT_ZERO(u, S, B) z0##u = (rv_t)(0.0f), z1##u = (rv_t)(0.0f),
#define BWD_DOT_EVEN(u, S, B) z0##u = fma(a0_, (rv_t)(B##u[c_]), z0##u);
#define BWD_DOT_ODD(u, S, B) z1##u = fma(a1_, (rv_t)(B##u[c_ + 1]), z1##u);
#define BWD_DOT_SUM(u, S, B) S##u = z0##u + z1##u;
#define BWD_DOTS(a, n, S, B) \
    do { \
        rv_t PARTS(BWD_DOT_ZERO, S, B) a0_, a1_; \
        uint c_ = 0; \
        for (; c_ + 2 <= (n); c_ += 2) { \
            a0_ = a[c_], a1_ = a[c_ + 1]; \
            PARTS(BWD_DOT_EVEN, S, B) PARTS(BWD_DOT_ODD, S, B) \
        } \
        if (c_ < (n)) { \
            a0_ = a[c_]; \
            PARTS(BWD_DOT_EVEN, S, B) \
        } \
        PARTS(BWD_DOT_SUM, S, B) \
    } while (0)

/* acc[c] += sum_u W##u * R##u[c] over n columns: each gradient vector loaded and stored once for the PART
 * partners' FMAs. */
#define BWD_ACC_TERM(u, W, R) x_ = fma(W##u, (rv_t)(R##u[c_]), x_);
#define BWD_ACCUM(acc, n, W, R) \
    for (uint c_ = 0; c_ < (n); c_++) { \
        rv_t x_ = acc[c_]; \
        PARTS(BWD_ACC_TERM, W, R) \
        acc[c_] = x_; \
    }

/* Does any pair of query rows i0..i1 and keys j0..j1 need the masks (or lie past the keys' end)? Else the
 * scores are q.k * scale as they are. */
inline int bwd_masked(uint i0, uint i1, uint j0, uint j1, uint Tk)
{
    int m = KPM || (bool)MASK_KIND || j1 >= Tk; /* (bool): a mask kind of 2 as an operand of || makes PoCL print a warning */
#if CAUSAL
    m |= j1 > i0; /* some key after some row */
#endif
#if WINDOW
    m |= i1 >= j0 + WINDOW; /* some key out of some row's window */
#endif
    return m;
}

/* The scaled, masked scores of lanes r = row/key pairs (i0 + r*di, j0 + r*dj): lanes past the keys' end hidden. */
inline rv_t bwd_scores(rv_t s, float scale, uint i0, uint di, uint j0, uint dj, uint Tq, uint Tk, ulong b, int masked,
                       __global const uchar *kpm, __global const mask_t *mask)
{
    s *= scale;
    if (!masked) return s;
    float a[ROWS];
    RV_STORE(s, a);
    for (uint r = 0; r < ROWS; r++) {
        const uint i = min(i0 + r * di, Tq - 1), j = j0 + r * dj;
        a[r] = j < Tk ? clattn_mask_score(a[r], i, j, b, Tk, kpm, mask) : -INFINITY;
    }
    return RV_LOAD(a);
}

/* The dropout factors m of the lanes' pairs (as bwd_scores): keep_scale or 0 by the forward's keep decision. */
inline rv_t bwd_keep(uint seed_lo, uint seed_hi, uint b, uint h, uint i0, uint di, uint j0, uint dj, uint threshold,
                     float keep_scale)
{
#if DROPOUT
    float a[ROWS];
    for (uint r = 0; r < ROWS; r++)
        a[r] = clattn_dropout_keep(seed_lo, seed_hi, b, h, i0 + r * di, j0 + r * dj, threshold) ? keep_scale : 0.0f;
    return RV_LOAD(a);
#else
    return (rv_t)(1.0f);
#endif
}

/* dS = P (m dP' - D), m dP' the dropout factor times dctx_i . v_j: 0 where P is 0 (a hidden key passes nothing,
 * whatever dP is). */
inline rv_t bwd_ds(rv_t p, rv_t m, rv_t dp, rv_t d)
{
    const rv_t ds = p * (m * dp - d);
    return p == (rv_t)(0.0f) ? (rv_t)(0.0f) : ds;
}

/* One work-item: query rows i0 .. i0+ROWS-1 of (b, h), the lanes; global id = (b*H + h)*nblk + block. */
__kernel void bwd_dq(BWD_ARGS, __global float *dq, ulong dq_off, uint dq_ld)
{
    const ulong g = get_global_id(0);
    if (g >= extent) return;
    const uint nblk = (Tq + ROWS - 1) / ROWS;
    const uint i0 = (uint)(g % nblk) * ROWS, i1 = min(i0 + ROWS, Tq) - 1;
    const ulong bh = g / nblk;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, h, H, Tq, Tk);
    /* the rows transposed: qt[c] lane r = Q[i0 + r, c] (rows past Tq repeat the last one, never written) */
    rv_t qt[DK], ct[DV], acc[DK];
    float t[ROWS];
    for (uint c = 0; c < DK; c++) {
        for (uint r = 0; r < ROWS; r++) t[r] = q[q_off + (b * Tq + min(i0 + r, Tq - 1)) * q_ld + (ulong)h * DK + c];
        qt[c] = RV_LOAD(t), acc[c] = (rv_t)(0.0f);
    }
    for (uint c = 0; c < DV; c++) {
        for (uint r = 0; r < ROWS; r++)
            t[r] = dctx[dctx_off + (b * Tq + min(i0 + r, Tq - 1)) * dctx_ld + (ulong)h * DV + c];
        ct[c] = RV_LOAD(t);
    }
    for (uint r = 0; r < ROWS; r++) t[r] = lse[lse_off + bh * Tq + min(i0 + r, Tq - 1)];
    const rv_t lr = RV_LOAD(t);
    for (uint r = 0; r < ROWS; r++) t[r] = dd[bh * Tq + min(i0 + r, Tq - 1)];
    const rv_t dr = RV_LOAD(t);
    uint jbeg = 0, jend = Tk;
#if CAUSAL
    jend = min(Tk, i1 + 1); /* keys after the block's last query are hidden from all its rows */
#endif
#if WINDOW
    jbeg = i0 >= WINDOW ? i0 - WINDOW + 1 : 0; /* keys before the first query's window are hidden from all */
#endif
    __global const float *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const float *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
    /* keys j .. j+PART-1; those past jend read key jend-1's row, and the masks hide them (P 0, so dS 0): past Tk
     * (bwd_scores), or after every row of the block (CAUSAL's jend), bwd_masked true for the step either way */
    for (uint j = jbeg; j < jend; j += PART) {
        const int masked = bwd_masked(i0, i1, j, j + PART - 1, Tk);
#define DQ_ROWS(u, S, B) \
    __global const float *kp##u = kb + (ulong)min(j + u, jend - 1) * k_ld; \
    __global const float *vp##u = vb + (ulong)min(j + u, jend - 1) * v_ld; \
    rv_t s##u, dp##u, ds##u;
        PARTS(DQ_ROWS, , )
        BWD_DOTS(qt, DK, s, kp);
        BWD_DOTS(ct, DV, dp, vp);
        /* dS; P = exp(s - lse): 0 in a row with no visible key (lse -inf), NaN in a NaN row */
#define DQ_DS(u, S, B) \
    s##u = bwd_scores(s##u, scale, i0, 1, j + u, 0, Tq, Tk, b, masked, kpm, mask); \
    ds##u = bwd_ds(lr == (rv_t)(-INFINITY) ? (rv_t)(0.0f) : exp(s##u - lr), \
                   bwd_keep(seed_lo, seed_hi, (uint)b + drop_b0, h, i0, 1, j + u, 0, threshold, keep_scale), dp##u, dr);
        PARTS(DQ_DS, , )
        BWD_ACCUM(acc, DK, ds, kp)
    }
    for (uint c = 0; c < DK; c++) {
        RV_STORE(acc[c] * scale, t);
        for (uint r = 0; r < ROWS && i0 + r < Tq; r++) dq[dq_off + (b * Tq + i0 + r) * dq_ld + (ulong)h * DK + c] = t[r];
    }
}

/* One work-item: key rows j0 .. j0+ROWS-1 of (b, key/value head hk), the lanes, their gradients summed over the
 * GROUP query heads that read them; global id = (b*HK + hk)*nblk + block. */
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
    if (MASK_KIND) mask += mask_off; /* + each query head's CLATTN_MASK_AT: mh below */
    rv_t kt[DK], vt[DV], gk[DK], gv[DV];
    float t[ROWS];
    for (uint c = 0; c < DK; c++) {
        for (uint r = 0; r < ROWS; r++) t[r] = k[k_off + (b * Tk + min(j0 + r, Tk - 1)) * k_ld + (ulong)hk * DK + c];
        kt[c] = RV_LOAD(t), gk[c] = (rv_t)(0.0f);
    }
    for (uint c = 0; c < DV; c++) {
        for (uint r = 0; r < ROWS; r++) t[r] = v[v_off + (b * Tk + min(j0 + r, Tk - 1)) * v_ld + (ulong)hk * DV + c];
        vt[c] = RV_LOAD(t), gv[c] = (rv_t)(0.0f);
    }
    const uint j1 = j0 + ROWS - 1; /* may pass Tk: those lanes are hidden, never written */
    uint ibeg = 0, iend = Tq;
#if CAUSAL
    ibeg = min(j0, Tq); /* queries before the block's first key see none of its keys */
#endif
#if WINDOW
    iend = min(Tq, j1 + WINDOW); /* queries past the last key's window see none of them */
#endif
    for (uint x = 0; x < GROUP; x++) {
        const uint h = hk * GROUP + x;
        const ulong bh = b * H + h;
        __global const mask_t *mh = mask + CLATTN_MASK_AT(b, h, H, Tq, Tk); /* this head's mask */
        for (uint i = ibeg; i < iend; i += PART) { /* query rows i .. i+PART-1, those past iend with P 0 */
            const int masked = bwd_masked(i, min(i + PART - 1, iend - 1), j0, j1, Tk);
#define KV_ROWS(u, S, B) \
    const ulong i##u = min(i + u, iend - 1); \
    __global const float *qp##u = q + q_off + (b * Tq + i##u) * q_ld + (ulong)h * DK; \
    __global const float *cp##u = dctx + dctx_off + (b * Tq + i##u) * dctx_ld + (ulong)h * DV; \
    const float l##u = i + u < iend ? lse[lse_off + bh * Tq + i##u] : -INFINITY; \
    rv_t s##u, dp##u, ds##u, w##u;
            PARTS(KV_ROWS, , )
            BWD_DOTS(kt, DK, s, qp);
            BWD_DOTS(vt, DV, dp, cp);
            /* dS and P m; a row with no visible key (lse -inf), and a row past iend, passes no gradient */
#define KV_DS(u, S, B) \
    { \
        s##u = bwd_scores(s##u, scale, (uint)i##u, 0, j0, 1, Tq, Tk, b, masked, kpm, mh); \
        const rv_t p = l##u == -INFINITY ? (rv_t)(0.0f) : exp(s##u - l##u); \
        const rv_t m = bwd_keep(seed_lo, seed_hi, (uint)b + drop_b0, h, (uint)i##u, 0, j0, 1, threshold, keep_scale); \
        ds##u = bwd_ds(p, m, dp##u, (rv_t)(dd[bh * Tq + i##u])); \
        w##u = p == (rv_t)(0.0f) ? (rv_t)(0.0f) : p * m; \
    }
            PARTS(KV_DS, , )
            BWD_ACCUM(gk, DK, ds, qp)
            BWD_ACCUM(gv, DV, w, cp)
        }
    }
    for (uint c = 0; c < DK; c++) {
        RV_STORE(gk[c] * scale, t);
        for (uint r = 0; r < ROWS && j0 + r < Tk; r++) dk[dk_off + (b * Tk + j0 + r) * dk_ld + (ulong)hk * DK + c] = t[r];
    }
    for (uint c = 0; c < DV; c++) {
        RV_STORE(gv[c], t);
        for (uint r = 0; r < ROWS && j0 + r < Tk; r++) dv[dv_off + (b * Tk + j0 + r) * dv_ld + (ulong)hk * DV + c] = t[r];
    }
}
