/* flash.cl: fused attention core. For each (batch, head) and block of queries, stream the
 * keys and values once, keeping per query row a running max m, a running sum l of
 * exp(score - m) and an unnormalised output acc in fp32 (online softmax: when m grows,
 * l and acc are rescaled by exp(m_old - m_new)); write acc / l once. No score matrix in
 * global memory.
 *
 * Layout: Q, K and V are read where the projections left them, token-major rows with a
 * row stride (ld) and head h at columns h*DK (Q, K) or h*DV (V):
 *   Q[b, t, h, c] = q[q_off + (b*Tq + t)*q_ld + h*DK + c]      (K, V likewise over Tk)
 * and the output goes to the merged layout out[out_off + (b*Tq + i)*out_ld + h*DV + c].
 *
 * Semantics (those of the reference, ref.c): score = (q . k) * scale (+ float mask);
 * hidden keys (causal j > i, key padding, bool mask) get weight 0; a row with no visible
 * key (or only -inf scores) gives output 0; a NaN score or a +inf score makes the row NaN;
 * dropout keeps weight (b, h, i, j) by clattn_dropout_keep (philox.cl) and scales it.
 * The running max starts at -FLT_MAX, a finite value, so a fully hidden block computes
 * exp(-inf - m) = 0 and never inf - inf.
 *
 * Two variants of the same function, chosen per device class by the host:
 *   flash_rows   one work-item per ROWS query rows, no local memory and no barriers: K/V
 *                rows come through the cache. For CPU devices (PoCL), where a work-group
 *                runs as a loop and private arrays are cheap.
 *   flash_tiled  a work-group per BQ query rows, NS work-items per row sharing the row's
 *                value columns; K and V tiles of BK keys staged in local memory. For GPUs.
 * With CAUSAL, key blocks wholly after the block's last query are never visited; only the
 * blocks that cross the diagonal are masked.
 *
 * With a sliding WINDOW, key blocks wholly before the block's first query's window are skipped too.
 *
 * Specialised by -D (philox.cl, half.cl, mask.cl and online.cl go first; defaults let each compile alone):
 *   DK, DV           head sizes of queries/keys and of values
 *   GROUP            query heads per key/value head (grouped-query attention): head h reads K/V head h/GROUP
 *   KV_ROUND         1: K and V rounded to half as they are read (kv_half plans; half.cl)
 *   CAUSAL, WINDOW, KPM, MASK_KIND (0 none, 1 bool, 2 float), DROPOUT   the masks and dropout (mask.cl)
 *   ROWS, BK, VW     flash_rows: query rows per work-item, keys per block, vector width (divides DK, DV)
 *   BQ, BKT, NS      flash_tiled: query rows per work-group, keys per tile, work-items per row
 */
#ifndef DK
#define DK 64
#endif
#ifndef DV
#define DV DK
#endif
#ifndef GROUP
#define GROUP 1
#endif
#ifndef KV_ROUND
#define KV_ROUND 0
#endif
#if KV_ROUND
#define KVR(x) clattn_round_half(x)
#else
#define KVR(x) (x)
#endif
#ifndef ROWS
#define ROWS 4
#endif
#ifndef BK
#define BK 16
#endif
#ifndef BQ
#define BQ 16
#endif
#ifndef BKT
#define BKT 32
#endif
#ifndef NS
#define NS 4
#endif

#define DVS ((DV + NS - 1) / NS) /* value columns per work-item in flash_tiled */
#define KVW (DK > DV ? DK : DV)  /* width of a staged K or V row */

/* The weight applied to V: p, or after dropout p * keep_scale or 0. */
inline float flash_drop(float p, uint seed_lo, uint seed_hi, uint b, uint h, uint i, uint j, uint threshold,
                        float keep_scale)
{
#if DROPOUT
    return clattn_dropout_keep(seed_lo, seed_hi, b, h, i, j, threshold) ? p * keep_scale : 0.0f;
#else
    return p;
#endif
}

/* acc / l, with 0 for a row that saw no visible key (l = 0); NaN stays NaN. */
inline float flash_out(float acc, float l)
{
    return l == 0.0f ? 0.0f : acc / l;
}

/* flash_rows works on VW-wide vectors along the head dimension (VW divides DK and DV; 1 = scalar)
 * and exponentiates a block of BK = 16 scores as one float16 where it can: on a CPU, the vector
 * units and a vector exp do the work. */
#ifndef VW
#define VW 1
#endif
#if VW == 8
typedef float8 vw_t;
#define VLOADW(i, p) vload8((i), (p))
#define VSTOREW(v, i, p) vstore8((v), (i), (p))
inline float hsum(float8 v) { float4 t = v.lo + v.hi; float2 u = t.lo + t.hi; return u.x + u.y; }
#elif VW == 4
typedef float4 vw_t;
#define VLOADW(i, p) vload4((i), (p))
#define VSTOREW(v, i, p) vstore4((v), (i), (p))
inline float hsum(float4 v) { float2 u = v.lo + v.hi; return u.x + u.y; }
#else
typedef float vw_t;
#define VLOADW(i, p) ((p)[(i)])
#define VSTOREW(v, i, p) ((p)[(i)] = (v))
inline float hsum(float v) { return v; }
#endif
#if KV_ROUND && VW == 8
inline float8 kvr_w(float8 x) { return (float8)(KVR(x.s0), KVR(x.s1), KVR(x.s2), KVR(x.s3), KVR(x.s4), KVR(x.s5), KVR(x.s6), KVR(x.s7)); }
#elif KV_ROUND && VW == 4
inline float4 kvr_w(float4 x) { return (float4)(KVR(x.s0), KVR(x.s1), KVR(x.s2), KVR(x.s3)); }
#else
#define kvr_w(x) KVR(x)
#endif
#define NKW (DK / VW)
#define NVW (DV / VW)
/* flash_rows applies the values RROWS rows at a time, their RROWS*NVW accumulators in registers */
#if ROWS % 2 == 0 && NVW <= 8
#define RROWS 2
#else
#define RROWS 1
#endif

/* One work-item: query rows i0 .. i0+ROWS-1 of (b, h); global id = ((b*H + h) * nblk + block). */
__kernel void flash_rows(__global const float *q, ulong q_off, uint q_ld,
                         __global const float *k, ulong k_off, uint k_ld,
                         __global const float *v, ulong v_off, uint v_ld,
                         __global float *out, ulong out_off, uint out_ld,
                         __global const uchar *kpm, ulong kpm_off,
                         __global const mask_t *mask, ulong mask_off,
                         uint Tq, uint Tk, uint H, float scale, ulong total,
                         uint seed_lo, uint seed_hi, uint threshold, float keep_scale)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const uint nblk = (Tq + ROWS - 1) / ROWS;
    const uint blk = (uint)(g % nblk);
    const ulong bh = g / nblk;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    const uint i0 = blk * ROWS;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off;

    vw_t qr[ROWS][NKW], acc[ROWS][NVW];
    float m[ROWS], l[ROWS];
    for (uint r = 0; r < ROWS; r++) {
        const uint i = min(i0 + r, Tq - 1); /* rows past Tq repeat the last one, never written */
        __global const float *qp = q + q_off + (b * Tq + i) * q_ld + (ulong)h * DK;
        for (uint c = 0; c < NKW; c++) qr[r][c] = VLOADW(c, qp);
        for (uint c = 0; c < NVW; c++) acc[r][c] = (vw_t)(0.0f);
        m[r] = -FLT_MAX;
        l[r] = 0.0f;
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
    for (uint j0 = jbeg; j0 < jend; j0 += BK) {
        float s[ROWS][BK];
        for (uint jj = 0; jj < BK; jj++) {
            const uint j = j0 + jj;
            if (j < jend) {
                __global const float *kp = kb + (ulong)j * k_ld;
                vw_t dot[ROWS]; /* unrolled row loops: the accumulators stay in registers */
                #pragma unroll
                for (uint r = 0; r < ROWS; r++) dot[r] = (vw_t)(0.0f);
                for (uint c = 0; c < NKW; c++) {
                    const vw_t kc = kvr_w(VLOADW(c, kp));
                    #pragma unroll
                    for (uint r = 0; r < ROWS; r++) dot[r] = fma(qr[r][c], kc, dot[r]);
                }
                float hs[ROWS];
#if VW == 8 && ROWS % 4 == 0
                #pragma unroll
                for (uint r = 0; r < ROWS; r += 4) {
                    const float4 h4 = clattn_hsum4_8(dot[r], dot[r + 1], dot[r + 2], dot[r + 3]);
                    hs[r] = h4.x, hs[r + 1] = h4.y, hs[r + 2] = h4.z, hs[r + 3] = h4.w;
                }
#else
                #pragma unroll
                for (uint r = 0; r < ROWS; r++) hs[r] = hsum(dot[r]);
#endif
                for (uint r = 0; r < ROWS; r++)
                    s[r][jj] = clattn_mask_score(hs[r] * scale, min(i0 + r, Tq - 1), j, b, Tk, kpm, mask);
            } else {
                for (uint r = 0; r < ROWS; r++) s[r][jj] = -INFINITY;
            }
        }
        float corr[ROWS];
        for (uint r = 0; r < ROWS; r++) {
            const float mb = clattn_block_max(s[r], BK, m[r]);
            corr[r] = exp(m[r] - mb);
            m[r] = mb;
            float sum = 0.0f;
#if BK == 16 && !DROPOUT
            sum = clattn_exp16_sum(s[r], mb);
#else
            for (uint jj = 0; jj < BK; jj++) {
                const float p = exp(s[r][jj] - mb);
                sum += p;
                s[r][jj] = flash_drop(p, seed_lo, seed_hi, (uint)b, h, i0 + r, j0 + jj, threshold, keep_scale);
            }
#endif
            l[r] = l[r] * corr[r] + sum;
        }
        const uint nj = min((uint)BK, jend - j0);
#define FLASH_VAL(jj, c) kvr_w(VLOADW((c), vb + (ulong)(j0 + (jj)) * v_ld))
        CLATTN_VALUE_PASS(vw_t, ROWS, RROWS, NVW, acc, corr, s, nj, FLASH_VAL)
#undef FLASH_VAL
    }
    for (uint r = 0; r < ROWS; r++) {
        if (i0 + r >= Tq) break;
        __global float *op = out + out_off + (b * Tq + i0 + r) * out_ld + (ulong)h * DV;
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r]; /* no visible key: 0; NaN stays NaN */
        for (uint c = 0; c < NVW; c++) VSTOREW(l[r] == 0.0f ? (vw_t)(0.0f) : acc[r][c] * inv, c, op);
    }
}

/* One work-group of BQ*NS work-items: query rows i0 .. i0+BQ-1 of (b, h), work-group id =
 * ((b*H + h) * nblk + block) + group0. Work-item (r, sp) owns row r and value columns
 * sp, sp+NS, ... Every barrier is reached by the whole work-group: the loop bounds depend
 * only on the group. */
__kernel __attribute__((reqd_work_group_size(BQ * NS, 1, 1)))
void flash_tiled(__global const float *q, ulong q_off, uint q_ld,
                 __global const float *k, ulong k_off, uint k_ld,
                 __global const float *v, ulong v_off, uint v_ld,
                 __global float *out, ulong out_off, uint out_ld,
                 __global const uchar *kpm, ulong kpm_off,
                 __global const mask_t *mask, ulong mask_off,
                 uint Tq, uint Tk, uint H, float scale, ulong group0,
                 uint seed_lo, uint seed_hi, uint threshold, float keep_scale)
{
    __local float qs[BQ][DK];
    __local float kvs[BKT][KVW + 1]; /* +1: rows fall in different banks */
    __local float ss[BQ][BKT + 1];
    const uint lid = get_local_id(0);
    const uint r = lid / NS, sp = lid % NS;
    const ulong g = group0 + get_group_id(0);
    const uint nblk = (Tq + BQ - 1) / BQ;
    const uint blk = (uint)(g % nblk);
    const ulong bh = g / nblk;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    const uint i0 = blk * BQ, i = i0 + r;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off;

    for (uint x = lid; x < BQ * DK; x += BQ * NS) {
        const uint rr = x / DK, c = x % DK;
        const uint ii = min(i0 + rr, Tq - 1);
        qs[rr][c] = q[q_off + (b * Tq + ii) * q_ld + (ulong)h * DK + c];
    }
    float acc[DVS];
    for (uint t = 0; t < DVS; t++) acc[t] = 0.0f;
    float m = -FLT_MAX, l = 0.0f;
    uint jbeg = 0, jend = Tk;
#if CAUSAL
    jend = min(Tk, min(i0 + BQ, Tq));
#endif
#if WINDOW
    jbeg = i0 >= WINDOW ? i0 - WINDOW + 1 : 0;
#endif
    __global const float *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const float *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint j0 = jbeg; j0 < jend; j0 += BKT) {
        /* K tile */
        for (uint x = lid; x < BKT * DK; x += BQ * NS) {
            const uint jj = x / DK, c = x % DK;
            kvs[jj][c] = j0 + jj < jend ? KVR(kb[(ulong)(j0 + jj) * k_ld + c]) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* scores of row r for keys sp, sp+NS, ... */
        for (uint jj = sp; jj < BKT; jj += NS) {
            float dot = 0.0f;
            for (uint c = 0; c < DK; c++) dot = fma(qs[r][c], kvs[jj][c], dot);
            const uint j = j0 + jj;
            ss[r][jj] = j < jend ? clattn_mask_score(dot * scale, min(i, Tq - 1), j, b, Tk, kpm, mask) : -INFINITY;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* V tile over the K tile */
        for (uint x = lid; x < BKT * DV; x += BQ * NS) {
            const uint jj = x / DV, c = x % DV;
            kvs[jj][c] = j0 + jj < jend ? KVR(vb[(ulong)(j0 + jj) * v_ld + c]) : 0.0f;
        }
        /* this row's statistics (each of its NS work-items computes the same) */
        float mb = m;
        for (uint jj = 0; jj < BKT; jj++) mb = fmax(mb, ss[r][jj]);
        const float corr = exp(m - mb);
        m = mb;
        for (uint t = 0; t < DVS; t++) acc[t] *= corr;
        barrier(CLK_LOCAL_MEM_FENCE);
        float sum = 0.0f;
        for (uint jj = 0; jj < BKT; jj++) {
            const float p = exp(ss[r][jj] - mb);
            sum += p;
            const float pd = flash_drop(p, seed_lo, seed_hi, (uint)b, h, i, j0 + jj, threshold, keep_scale);
            for (uint t = 0; t < DVS; t++) {
                const uint c = sp + t * NS;
                if (c < DV) acc[t] = fma(pd, kvs[jj][c], acc[t]);
            }
        }
        l = l * corr + sum;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (i < Tq) {
        __global float *op = out + out_off + (b * Tq + i) * out_ld + (ulong)h * DV;
        for (uint t = 0; t < DVS; t++) {
            const uint c = sp + t * NS;
            if (c < DV) op[c] = flash_out(acc[t], l);
        }
    }
}
