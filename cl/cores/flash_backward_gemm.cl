/* flash_backward_gemm.cl: the backward core for GPUs (src/cores/flash_backward_gemm.c): FlashAttention-2's backward
 * in flash_gemm.cl's shape. Tiles of the other side's rows in local memory, each work-item a register micro-tile of
 * every product, so that each value it reads from local memory feeds several FMAs:
 *
 *   bwd_dot         D_i = dctx_i . ctx_i (backward_dot.cl)
 *   bwd_dq_tiles    a work-group of (BQ/RQ) x TC work-items per BQ query rows of (b, h), its Q and dctx rows in local
 *                   memory; per tile of BK keys (K and V in local memory): S = Q K^T and dP = dctx V^T as RM x RN
 *                   micro-tiles (RM = RQ; rows ty*RM + r, keys tx + TC*n, RN = BK/TC), dS = P (m dP - D) to local
 *                   memory, then dQ += dS K as an RM x (DK/TC) micro-tile (columns tx + TC*t)
 *   bwd_dkdv_tiles  a work-group of (BK/RK) x TC work-items (RM = RK) per BK key rows of (b, key/value head hk), its K and V
 *                   rows in local memory; per tile of BQ query rows of each of the GROUP query heads reading hk
 *                   (Q, dctx, their lse and D in local memory): S^T = K Q^T and dP^T = V dctx^T (keys ty*RM + r,
 *                   queries tx + TC*n, BQ/TC of them), W = P m and dS to local memory, then dV += W^T dctx and
 *                   dK += dS^T Q as RM x (DV/TC) and RM x (DK/TC) micro-tiles (no atomics: one work-group per key
 *                   block, summing the GROUP heads itself)
 * with s_ij = scale q_i.k_j (+ masks, mask.cl), P_ij = exp(s_ij - lse_i) (base 2: common/exp2.cl), m_ij the dropout
 * factor of the forward's keep decision (philox.cl), dS_ij = P_ij (m_ij dP_ij - D_i); dQ and dK scaled at the end.
 * A hidden key, a row past the end and every key of a row with no visible key (lse = -inf) have P = 0 and pass no
 * gradient; a NaN row (lse NaN) stays NaN. The reference is src/attention/backward_ref.c.
 *
 * Local arrays are rows of floats with odd strides (DK + 1, DV + 1, BQ + 1, BK + 1): the TC work-items of a warp
 * that read TC different rows at one column read TC different banks, and the rows a work-item row (ty) reads
 * are RM strides apart, 4 banks apart for the RM = 4 of the defaults (4 (DK + 1) = 4 mod 32 at DK = 64 or 128): the
 * warp's 32 / TC values of ty read different banks too, and each address is a broadcast to its TC or 32 / TC
 * work-items. Every loop over head columns and tile rows has a constant count, unrolled. */
#ifndef BQ
#define BQ 32
#endif
#ifndef BK
#define BK 32
#endif
#ifndef RQ
#define RQ 4 /* rows per work-item of the dQ pass: RM there */
#endif
#ifndef RK
#define RK 4 /* of the dK/dV pass (its accumulators are RK (DK + DV) / TC) */
#endif
#ifndef TC
#define TC 8
#endif

/* vectors along the head dimension: 4 where both head sizes allow (S and dP read float4 from local memory), else 1 */
#if DK % 4 == 0 && DV % 4 == 0
#define VW 4
typedef float4 fv_t;
#define FV_AT(p, c) vload4((c), (p))
#define FV_DOT(a, b, s) fma((a).s3, (b).s3, fma((a).s2, (b).s2, fma((a).s1, (b).s1, fma((a).s0, (b).s0, (s)))))
#else
#define VW 1
typedef float fv_t;
#define FV_AT(p, c) ((p)[(c)])
#define FV_DOT(a, b, s) fma((a), (b), (s))
#endif
#define LDK (DK + VW)           /* local row strides, in floats: one vector of padding */
#define LDV (DV + VW)
#define GLK (RM * LDK + VW)     /* a work-item row's RM rows of a block read by ty, and one vector more (banks) */
#define GLV (RM * LDV + VW)
#define BQP (BQ + 1)
#define BKP (BK + 1)
#define WGQ (BQ / RQ * TC)      /* work-items of bwd_dq_tiles */
#define WGK (BK / RK * TC)      /* work-items of bwd_dkdv_tiles */
#define RNQ (BQ / TC)           /* queries per work-item in bwd_dkdv_tiles */
#define RNK (BK / TC)           /* keys per work-item in bwd_dq_tiles */
#define NKC ((DK + TC - 1) / TC) /* gradient columns per work-item */
#define NVC ((DV + TC - 1) / TC)
#define LOG2E 1.4426950408889634f
/* the S and dP products' loops over head vectors: unrolled by 8 (sm_90, clang 15 + ptxas 13, the defaults at head
 * size 64: 220 and 254 registers, no spill; unrolled whole, LLVM hoists every load of the loop and both passes
 * spill 4-7 KiB) */
#define BWD_CUNROLL _Pragma("unroll 8")

/* rows r0 .. r0+ROWS-1 of a (row stride ld) into ts (row stride tld, NC columns): rows at or past rend as 0; the
 * work-group's WG work-items take consecutive 4-column vectors (coalesced 16-byte loads) where NC is a multiple of
 * 4, else consecutive columns. G: the rows grouped by RM, groups gl floats apart (BWD_ROW), for a block whose rows
 * the work-items read by ty. */
#define BWD_ROW(rr, tld, gl, G) ((G) ? (rr) / RM * (gl) + (rr) % RM * (tld) : (rr) * (tld))
#define BWD_STAGE(ts, tld, gl, G, a, ld, r0, ROWS, rend, NC, WG) \
    if ((NC) % 4 == 0) { \
        _Pragma("unroll") for (uint u_ = 0; u_ < ((ROWS) * (NC) / 4 + (WG) - 1) / (WG); u_++) { \
            const uint x_ = lid + (WG) * u_, rr_ = x_ / ((NC) / 4), c_ = x_ % ((NC) / 4) * 4; \
            if (((ROWS) * (NC) / 4) % (WG) == 0 || x_ < (ROWS) * (NC) / 4) { \
                const float4 v_ = (r0) + rr_ < (rend) ? vload4(0, (a) + (ulong)((r0) + rr_) * (ld) + c_) : (float4)(0.0f); \
                __local float *t_ = (ts) + BWD_ROW(rr_, tld, gl, G) + c_; \
                t_[0] = v_.s0, t_[1] = v_.s1, t_[2] = v_.s2, t_[3] = v_.s3; \
            } \
        } \
    } else { \
        _Pragma("unroll 4") for (uint u_ = 0; u_ < ((ROWS) * (NC) + (WG) - 1) / (WG); u_++) { \
            const uint x_ = lid + (WG) * u_, rr_ = x_ / (NC), c_ = x_ % (NC); \
            if (((ROWS) * (NC)) % (WG) == 0 || x_ < (ROWS) * (NC)) \
                (ts)[BWD_ROW(rr_, tld, gl, G) + c_] = (r0) + rr_ < (rend) ? (a)[(ulong)((r0) + rr_) * (ld) + c_] : 0.0f; \
        } \
    }

/* acc[r][n] += (row r of a) . (row TC n of b) over NC head columns, a's rows lda floats apart and b's ldb: an RM x NN
 * micro-tile of S or dP, each vector loaded feeding NN or RM FMAs (unrolled by BWD_CUNROLL) */
#define BWD_DOTS(acc, a, lda, b, ldb, NN, NC) \
    do { \
        BWD_CUNROLL for (uint c_ = 0; c_ < (NC) / VW; c_++) { \
            fv_t a_[RM], b_[NN]; \
            _Pragma("unroll") for (uint r_ = 0; r_ < RM; r_++) a_[r_] = FV_AT((a) + r_ * (lda), c_); \
            _Pragma("unroll") for (uint n_ = 0; n_ < (NN); n_++) b_[n_] = FV_AT((b) + TC * n_ * (ldb), c_); \
            _Pragma("unroll") for (uint r_ = 0; r_ < RM; r_++) \
                _Pragma("unroll") for (uint n_ = 0; n_ < (NN); n_++) (acc)[r_][n_] = FV_DOT(a_[r_], b_[n_], (acc)[r_][n_]); \
        } \
    } while (0)

/* The dropout factor of (i, j) in head h: keep_scale or 0 by the forward's keep decision; 1 without dropout. */
inline float bwd_keep_of(uint seed_lo, uint seed_hi, uint b, uint h, uint i, uint j, uint threshold, float keep_scale)
{
#if DROPOUT
    return clattn_dropout_keep(seed_lo, seed_hi, b, h, i, j, threshold) ? keep_scale : 0.0f;
#else
    return 1.0f;
#endif
}

/* P = 2^(s log2(e) - lse log2(e)) of a scaled score s (hidden: -inf), l2 = lse log2(e): 0 where the row saw no
 * visible key (l2 = -inf), NaN in a NaN row */
inline float bwd_p(float s, float l2) { return l2 == -INFINITY ? 0.0f : clattn_exp2(s * LOG2E - l2); }

/* One work-group: query rows i0 .. i0+BQ-1 of (b, h); group id = (b*H + h) * nblk + block. */
#define RM RQ
__kernel __attribute__((reqd_work_group_size(WGQ, 1, 1)))
void bwd_dq_tiles(BWD_ARGS, __global float *dq, ulong dq_off, uint dq_ld)
{
    __local float qs[BQ / RM * GLK] __attribute__((aligned(16))), os[BQ / RM * GLV] __attribute__((aligned(16)));
    __local float ks[BK * LDK] __attribute__((aligned(16))), vs[BK * LDV] __attribute__((aligned(16)));
    __local float dss[BQ * BKP];
    const uint lid = get_local_id(0), tx = lid % TC, ty = lid / TC;
    const ulong g = extent + get_group_id(0); /* extent: the launch's first group */
    const uint nblk = (Tq + BQ - 1) / BQ;
    const uint i0 = (uint)(g % nblk) * BQ, i1 = min(i0 + BQ, Tq) - 1;
    const ulong bh = g / nblk;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, h, H, Tq, Tk);
    BWD_STAGE(qs, LDK, GLK, 1, q + q_off + b * Tq * q_ld + (ulong)h * DK, q_ld, i0, BQ, Tq, DK, WGQ)
    BWD_STAGE(os, LDV, GLV, 1, dctx + dctx_off + b * Tq * dctx_ld + (ulong)h * DV, dctx_ld, i0, BQ, Tq, DV, WGQ)
    float l2[RM], dr[RM], acc[RM][NKC];
    #pragma unroll
    for (uint r = 0; r < RM; r++) {
        const uint i = i0 + ty * RM + r;
        l2[r] = i < Tq ? lse[lse_off + bh * Tq + i] * LOG2E : -INFINITY; /* rows past Tq: P 0 */
        dr[r] = i < Tq ? dd[bh * Tq + i] : 0.0f;
        #pragma unroll
        for (uint t = 0; t < NKC; t++) acc[r][t] = 0.0f;
    }
    uint jbeg = 0, jend = Tk;
#if CAUSAL
    jend = min(Tk, i1 + 1); /* keys after the block's last query are hidden from all its rows */
#endif
#if WINDOW
    jbeg = i0 >= WINDOW ? i0 - WINDOW + 1 : 0; /* keys before the first query's window are hidden from all */
#endif
    __global const float *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const float *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
    __local const float *qme = qs + ty * GLK, *ome = os + ty * GLV, *kme = ks + tx * LDK;
    __local const float *vme = vs + tx * LDV;
    __local float *dsme = dss + ty * RM * BKP;
    for (uint j0 = jbeg; j0 < jend; j0 += BK) {
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's reads are done (and the block is in) */
        BWD_STAGE(ks, LDK, 0, 0, kb, k_ld, j0, BK, jend, DK, WGQ)
        BWD_STAGE(vs, LDV, 0, 0, vb, v_ld, j0, BK, jend, DV, WGQ)
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[RM][RNK], dp[RM][RNK];
        #pragma unroll
        for (uint r = 0; r < RM; r++) {
            #pragma unroll
            for (uint n = 0; n < RNK; n++) s[r][n] = dp[r][n] = 0.0f;
        }
        BWD_DOTS(s, qme, LDK, kme, LDK, RNK, DK);
        BWD_DOTS(dp, ome, LDV, vme, LDV, RNK, DV);
        /* dS; the masks only on a tile that crosses an edge (keys past jend, the causal diagonal) or with a mask */
#if KPM || MASK_KIND || WINDOW
        const int masked = 1;
#elif CAUSAL
        const int masked = j0 + BK > jend || j0 + BK - 1 > i0;
#else
        const int masked = j0 + BK > jend;
#endif
        #pragma unroll
        for (uint r = 0; r < RM; r++) {
            const uint i = min(i0 + ty * RM + r, Tq - 1);
            #pragma unroll
            for (uint n = 0; n < RNK; n++) {
                const uint j = j0 + tx + TC * n;
                float sc = s[r][n] * scale;
                if (masked) sc = j < jend ? clattn_mask_score(sc, i, j, b, Tk, kpm, mask) : -INFINITY;
                const float p = bwd_p(sc, l2[r]);
                const float ds =
                    p * (bwd_keep_of(seed_lo, seed_hi, (uint)b + drop_b0, h, i, j, threshold, keep_scale) * dp[r][n] -
                         dr[r]);
                dsme[r * BKP + tx + TC * n] = p == 0.0f ? 0.0f : ds; /* a hidden key passes nothing */
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* dQ += dS K: all BK keys, a constant count (past jend dS and the K rows are 0) */
        #pragma unroll
        for (uint jj = 0; jj < BK; jj++) {
            float d[RM];
            #pragma unroll
            for (uint r = 0; r < RM; r++) d[r] = dsme[r * BKP + jj];
            #pragma unroll
            for (uint t = 0; t < NKC; t++) {
                const uint col = tx + TC * t;
                if (NKC * TC == DK || col < DK) {
                    const float kv = ks[jj * LDK + col];
                    #pragma unroll
                    for (uint r = 0; r < RM; r++) acc[r][t] = fma(d[r], kv, acc[r][t]);
                }
            }
        }
    }
    #pragma unroll
    for (uint r = 0; r < RM; r++) {
        const uint i = i0 + ty * RM + r;
        if (i >= Tq) continue;
        __global float *row = dq + dq_off + (b * Tq + i) * dq_ld + (ulong)h * DK;
        #pragma unroll
        for (uint t = 0; t < NKC; t++) {
            const uint col = tx + TC * t;
            if (NKC * TC == DK || col < DK) row[col] = acc[r][t] * scale;
        }
    }
}

#undef RM
#define RM RK
/* One work-group: key rows j0 .. j0+BK-1 of (b, key/value head hk), their gradients summed over the GROUP query
 * heads that read them; group id = (b*HK + hk) * nblk + block. */
__kernel __attribute__((reqd_work_group_size(WGK, 1, 1)))
void bwd_dkdv_tiles(BWD_ARGS, __global float *dk, ulong dk_off, uint dk_ld, __global float *dv, ulong dv_off,
                    uint dv_ld)
{
    __local float ks[BK / RM * GLK] __attribute__((aligned(16))), vs[BK / RM * GLV] __attribute__((aligned(16)));
    __local float qs[BQ * LDK] __attribute__((aligned(16))), os[BQ * LDV] __attribute__((aligned(16)));
    __local float ws[BK * BQP], dss[BK * BQP];
    __local float ls[BQ], dds[BQ]; /* the query tile's lse (base 2) and D */
    const uint lid = get_local_id(0), tx = lid % TC, ty = lid / TC;
    const ulong g = extent + get_group_id(0);
    const uint HK = H / GROUP;
    const uint nblk = (Tk + BK - 1) / BK;
    const uint j0 = (uint)(g % nblk) * BK, j1 = j0 + BK - 1; /* j1 may pass Tk: those keys are hidden */
    const ulong bhk = g / nblk;
    const uint hk = (uint)(bhk % HK);
    const ulong b = bhk / HK;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off; /* + each query head's CLATTN_MASK_AT: mh below */
    BWD_STAGE(ks, LDK, GLK, 1, k + k_off + b * Tk * k_ld + (ulong)hk * DK, k_ld, j0, BK, Tk, DK, WGK)
    BWD_STAGE(vs, LDV, GLV, 1, v + v_off + b * Tk * v_ld + (ulong)hk * DV, v_ld, j0, BK, Tk, DV, WGK)
    float gk[RM][NKC], gv[RM][NVC];
    #pragma unroll
    for (uint r = 0; r < RM; r++) {
        #pragma unroll
        for (uint t = 0; t < NKC; t++) gk[r][t] = 0.0f;
        #pragma unroll
        for (uint t = 0; t < NVC; t++) gv[r][t] = 0.0f;
    }
    uint ibeg = 0, iend = Tq;
#if CAUSAL
    ibeg = min(j0, Tq); /* queries before the block's first key see none of its keys */
#endif
#if WINDOW
    iend = min(Tq, j1 + WINDOW); /* queries past the last key's window see none of them */
#endif
    __local const float *kme = ks + ty * GLK, *vme = vs + ty * GLV, *qme = qs + tx * LDK;
    __local const float *ome = os + tx * LDV;
    __local float *wme = ws + ty * RM * BQP, *dsme = dss + ty * RM * BQP;
    for (uint x = 0; x < GROUP; x++) {
        const uint h = hk * GROUP + x;
        const ulong bh = b * H + h;
        __global const mask_t *mh = mask + CLATTN_MASK_AT(b, h, H, Tq, Tk); /* this head's mask */
        __global const float *qb = q + q_off + b * Tq * q_ld + (ulong)h * DK;
        __global const float *ob = dctx + dctx_off + b * Tq * dctx_ld + (ulong)h * DV;
        for (uint i0 = ibeg; i0 < iend; i0 += BQ) {
            barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's reads are done (and the block is in) */
            BWD_STAGE(qs, LDK, 0, 0, qb, q_ld, i0, BQ, iend, DK, WGK)
            BWD_STAGE(os, LDV, 0, 0, ob, dctx_ld, i0, BQ, iend, DV, WGK)
            for (uint y = lid; y < BQ; y += WGK) { /* rows past iend: P 0 */
                ls[y] = i0 + y < iend ? lse[lse_off + bh * Tq + i0 + y] * LOG2E : -INFINITY;
                dds[y] = i0 + y < iend ? dd[bh * Tq + i0 + y] : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            float s[RM][RNQ], dp[RM][RNQ];
            #pragma unroll
            for (uint r = 0; r < RM; r++) {
                #pragma unroll
                for (uint n = 0; n < RNQ; n++) s[r][n] = dp[r][n] = 0.0f;
            }
            BWD_DOTS(s, kme, LDK, qme, LDK, RNQ, DK);
            BWD_DOTS(dp, vme, LDV, ome, LDV, RNQ, DV);
            /* W = P m and dS; the masks only on a tile that crosses an edge or with a mask */
#if KPM || MASK_KIND || WINDOW
            const int masked = 1;
#elif CAUSAL
            const int masked = i0 + BQ > iend || j1 >= Tk || j1 > i0;
#else
            const int masked = i0 + BQ > iend || j1 >= Tk;
#endif
            #pragma unroll
            for (uint r = 0; r < RM; r++) {
                const uint j = j0 + ty * RM + r;
                #pragma unroll
                for (uint n = 0; n < RNQ; n++) {
                    const uint y = tx + TC * n, i = i0 + y;
                    float sc = s[r][n] * scale;
                    if (masked) sc = j < Tk && i < iend ? clattn_mask_score(sc, i, j, b, Tk, kpm, mh) : -INFINITY;
                    const float p = bwd_p(sc, ls[y]);
                    const float m = bwd_keep_of(seed_lo, seed_hi, (uint)b + drop_b0, h, i, j, threshold, keep_scale);
                    wme[r * BQP + y] = p == 0.0f ? 0.0f : p * m;
                    dsme[r * BQP + y] = p == 0.0f ? 0.0f : p * (m * dp[r][n] - dds[y]);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            /* dV += W^T dctx, dK += dS^T Q: all BQ rows, a constant count (past iend W, dS and the rows are 0) */
            #pragma unroll
            for (uint y = 0; y < BQ; y++) {
                float w[RM], d[RM];
                #pragma unroll
                for (uint r = 0; r < RM; r++) w[r] = wme[r * BQP + y], d[r] = dsme[r * BQP + y];
                #pragma unroll
                for (uint t = 0; t < NVC; t++) {
                    const uint col = tx + TC * t;
                    if (NVC * TC == DV || col < DV) {
                        const float ov = os[y * LDV + col];
                        #pragma unroll
                        for (uint r = 0; r < RM; r++) gv[r][t] = fma(w[r], ov, gv[r][t]);
                    }
                }
                #pragma unroll
                for (uint t = 0; t < NKC; t++) {
                    const uint col = tx + TC * t;
                    if (NKC * TC == DK || col < DK) {
                        const float qv = qs[y * LDK + col];
                        #pragma unroll
                        for (uint r = 0; r < RM; r++) gk[r][t] = fma(d[r], qv, gk[r][t]);
                    }
                }
            }
        }
    }
    #pragma unroll
    for (uint r = 0; r < RM; r++) {
        const uint j = j0 + ty * RM + r;
        if (j >= Tk) continue;
        __global float *krow = dk + dk_off + (b * Tk + j) * dk_ld + (ulong)hk * DK;
        __global float *vrow = dv + dv_off + (b * Tk + j) * dv_ld + (ulong)hk * DV;
        #pragma unroll
        for (uint t = 0; t < NKC; t++) {
            const uint col = tx + TC * t;
            if (NKC * TC == DK || col < DK) krow[col] = gk[r][t] * scale;
        }
        #pragma unroll
        for (uint t = 0; t < NVC; t++) {
            const uint col = tx + TC * t;
            if (NVC * TC == DV || col < DV) vrow[col] = gv[r][t];
        }
    }
}
