/* flash_lanes.cl: the flash core for CPU devices with the query rows along the vector lanes
 * (src/cores/flash_lanes.c). One work-item per VW query rows of one (batch, head), no local memory, no
 * barriers. Where flash_rows puts the head dimension along the lanes (a dot product per key and row, then
 * a horizontal sum), this kernel keeps everything per row in the lanes of one vector:
 *   Q^T    qt[c]: column c of the VW rows' queries (transposed once, at the start)
 *   scores s_j = scale * sum_c K[j][c] * qt[c]: one broadcast of K[j][c] and one FMA per (key, column),
 *          KG keys at a time (KG accumulators), no horizontal sum anywhere
 *   softmax the running max, the sum and the rescaling are lane-wise: m = max(m, s_j), p_j = exp(s_j - m)
 *   O^T    acc[c] += p_j * V[j][c]: one broadcast of V[j][c] and one FMA per (key, column), DC columns at a
 *          time (DC accumulators) over the block's keys
 * Per FMA one load (a broadcast from L1), as a GEMM micro-kernel with a register tile of KG (or DC) x VW.
 * flash_common.cl goes first.
 *   VW   query rows per work-item (the lanes: the device's native float width, 8 or 16)
 *   BK   keys per block (one rescaling of the output per block)
 *   KG   keys per score group (KG accumulators)
 */
#ifndef VW
#define VW 16
#endif
#ifndef BK
#define BK 32
#endif
#ifndef KG
#define KG 8
#endif
#if BK % KG != 0
#error "BK must be a multiple of KG"
#endif
#define CK 8 /* head columns per partial sum of a score */

#if VW == 16
typedef float16 lv_t;
typedef int16 li_t;
#define LLOAD(i, p) vload16((i), (p))
#define LSTORE(v, i, p) vstore16((v), (i), (p))
#define LANES ((li_t)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))
#define vload_li(p) vload16(0, (p))
#elif VW == 8
typedef float8 lv_t;
typedef int8 li_t;
#define LLOAD(i, p) vload8((i), (p))
#define LSTORE(v, i, p) vstore8((v), (i), (p))
#define LANES ((li_t)(0, 1, 2, 3, 4, 5, 6, 7))
#define vload_li(p) vload8(0, (p))
#else
#error "VW must be 8 or 16"
#endif

/* value columns per chunk of the P V pass: the widest of 16, 8, 4, 2, 1 dividing DV */
#if DV % 16 == 0
#define DC 16
#elif DV % 8 == 0
#define DC 8
#elif DV % 4 == 0
#define DC 4
#elif DV % 2 == 0
#define DC 2
#else
#define DC 1
#endif

#define K_AT(j, c) kvr_s(IO_LOAD((c), kb + (ulong)(j) * k_ld))
inline float kvr_s(float x) { return KVR(x); }

/* One work-item: query rows i0 .. i0+VW-1 of (b, h); global id = ((b*H + h) * nblk + block). */
__kernel void flash_lanes(FLASH_ARGS)
{
    const ulong g = get_global_id(0);
    if (g >= extent) return;
    const uint nblk = (Tq + VW - 1) / VW;
    const uint blk = (uint)(g % nblk);
    const ulong bh = g / nblk;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    const uint i0 = blk * VW;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, h, H, Tq, Tk);
    const li_t rows = (li_t)((int)i0) + LANES; /* each lane's query row (past Tq: repeats, never written) */

    /* Q^T: qt[c * VW + r] = Q[i0 + r][c] */
    float qt[DK * VW];
    for (uint r = 0; r < VW; r++) {
        const uint i = min(i0 + r, Tq - 1);
        __global const io_t *qp = q + q_off + (b * Tq + i) * q_ld + (ulong)h * DK;
        for (uint c = 0; c < DK; c++) qt[c * VW + r] = IO_LOAD(c, qp);
    }
    float acc[DV * VW]; /* O^T, unnormalised: acc[c * VW + r] */
    for (uint c = 0; c < DV; c++) LSTORE((lv_t)(0.0f), c, acc);
    lv_t m = (lv_t)(-FLT_MAX), l = (lv_t)(0.0f);

    uint jbeg = 0, jend = Tk;
#if CAUSAL
    jend = min(Tk, min(i0 + VW, Tq)); /* keys after the block's last query are hidden from all its rows */
#endif
#if WINDOW
    jbeg = i0 >= WINDOW ? i0 - WINDOW + 1 : 0; /* keys before the first query's window are hidden from all */
#endif
    __global const io_t *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const io_t *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
    for (uint j0 = jbeg; j0 < jend; j0 += BK) {
        const uint nj = min((uint)BK, jend - j0);
        lv_t s[BK];
        /* scores, KG keys at a time; keys past jend read the last key and are hidden below */
        for (uint u0 = 0; u0 < BK; u0 += KG) {
            lv_t sg[KG];
            #pragma unroll
            for (uint u = 0; u < KG; u++) sg[u] = (lv_t)(0.0f);
            uint jr[KG];
            #pragma unroll
            for (uint u = 0; u < KG; u++) jr[u] = min(j0 + u0 + u, jend - 1);
            /* the columns in chunks of CK, each summed apart and then added: a score's rounding error grows with about
             * CK + DK/CK additions rather than DK, as a blocked dot product's (flash_rows' vectors, a GEMM's) */
            for (uint c0 = 0; c0 < DK; c0 += CK) {
                lv_t t[KG];
                #pragma unroll
                for (uint u = 0; u < KG; u++) t[u] = (lv_t)(0.0f);
                for (uint c = c0; c < min(c0 + CK, (uint)DK); c++) {
                    const lv_t qc = LLOAD(c, qt);
                    #pragma unroll
                    for (uint u = 0; u < KG; u++) t[u] = fma((lv_t)(K_AT(jr[u], c)), qc, t[u]);
                }
                #pragma unroll
                for (uint u = 0; u < KG; u++) sg[u] += t[u];
            }
            #pragma unroll
            for (uint u = 0; u < KG; u++) s[u0 + u] = sg[u] * scale;
        }
        /* the masks, lane-wise where they depend on the row */
        for (uint u = 0; u < BK; u++) {
            const uint j = j0 + u;
            li_t hidden = (li_t)(u >= nj ? -1 : 0);
#if CAUSAL
            hidden |= (li_t)((int)j) > rows;
#endif
#if WINDOW
            hidden |= (li_t)((int)j) <= rows && rows - (li_t)((int)j) >= (li_t)(WINDOW);
#endif
#if KPM
            if (u < nj && kpm[b * Tk + j] != 0) hidden = (li_t)(-1);
#endif
#if MASK_KIND == 1
            if (u < nj) {
                int mk[VW];
                for (uint r = 0; r < VW; r++) mk[r] = mask[(ulong)min(i0 + r, Tq - 1) * Tk + j] != 0 ? -1 : 0;
                hidden |= vload_li(mk);
            }
#elif MASK_KIND == 2
            if (u < nj) {
                float mk[VW];
                for (uint r = 0; r < VW; r++) mk[r] = mask[(ulong)min(i0 + r, Tq - 1) * Tk + j];
                s[u] += LLOAD(0, mk);
            }
#endif
            s[u] = select(s[u], (lv_t)(-INFINITY), hidden);
        }
        /* online softmax, lane-wise */
        lv_t mb = m;
        for (uint u = 0; u < BK; u++) mb = fmax(mb, s[u]);
        const lv_t corr = exp(m - mb);
        m = mb;
        lv_t sum = (lv_t)(0.0f);
        for (uint u = 0; u < BK; u++) {
            const lv_t p = exp(s[u] - mb);
            sum += p;
#if DROPOUT
            float pd[VW];
            LSTORE(p, 0, pd);
            for (uint r = 0; r < VW; r++)
                pd[r] = flash_drop(pd[r], seed_lo, seed_hi, (uint)b + drop_b0, h, i0 + r, j0 + u, threshold,
                                   keep_scale);
            s[u] = LLOAD(0, pd);
#else
            s[u] = p;
#endif
        }
        l = l * corr + sum;
        /* O^T += P V, DC value columns at a time over the block's keys */
        for (uint c0 = 0; c0 < DV; c0 += DC) {
            lv_t a[DC];
            #pragma unroll
            for (uint t = 0; t < DC; t++) a[t] = LLOAD(c0 + t, acc) * corr;
            for (uint u = 0; u < nj; u++) {
                __global const io_t *vr = vb + (ulong)(j0 + u) * v_ld + c0;
                const lv_t p = s[u];
                #pragma unroll
                for (uint t = 0; t < DC; t++) a[t] = fma(p, (lv_t)(kvr_s(IO_LOAD(t, vr))), a[t]);
            }
            #pragma unroll
            for (uint t = 0; t < DC; t++) LSTORE(a[t], c0 + t, acc);
        }
    }
    float mf[VW], lf[VW];
    LSTORE(m, 0, mf);
    LSTORE(l, 0, lf);
    for (uint r = 0; r < VW; r++) {
        if (i0 + r >= Tq) break;
        flash_lse(lse, lse_off, b, h, H, i0 + r, Tq, mf[r], lf[r], 0);
        __global io_t *op = out + out_off + (b * Tq + i0 + r) * out_ld + (ulong)h * DV;
        const float inv = lf[r] == 0.0f ? 0.0f : 1.0f / lf[r]; /* no visible key: 0; NaN stays NaN */
        for (uint c = 0; c < DV; c++) IO_STORE(lf[r] == 0.0f ? 0.0f : acc[c * VW + r] * inv, c, op);
    }
}
