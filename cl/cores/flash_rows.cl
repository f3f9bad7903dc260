/* flash_rows.cl: the flash core for CPU devices (src/cores/flash_rows.c). One work-item per ROWS query
 * rows, no local memory and no barriers: K/V rows come through the cache. For CPU devices (PoCL), where a
 * work-group runs as a loop and private arrays are cheap. flash_common.cl goes first.
 *   ROWS, BK, VW     query rows per work-item, keys per block, vector width (divides DK and DV)
 */
#ifndef ROWS
#define ROWS 4
#endif
#ifndef BK
#define BK 16
#endif

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
/* Q, K, V and the output in the plan's type: IO_LOADW / IO_STOREW (common/dtype.cl), VW wide */
#if KV_HALF && VW == 8
inline float8 kvr_w(float8 x) { return (float8)(KVR(x.s0), KVR(x.s1), KVR(x.s2), KVR(x.s3), KVR(x.s4), KVR(x.s5), KVR(x.s6), KVR(x.s7)); }
#elif KV_HALF && VW == 4
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
__kernel void flash_rows(FLASH_ARGS)
{
    const ulong g = get_global_id(0);
    if (g >= extent) return;
    const uint nblk = (Tq + ROWS - 1) / ROWS;
    const uint blk = (uint)(g % nblk);
    const ulong bh = g / nblk;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    const uint i0 = blk * ROWS;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, h, H, Tq, Tk);

    vw_t qr[ROWS][NKW], acc[ROWS][NVW];
    float m[ROWS], l[ROWS];
    for (uint r = 0; r < ROWS; r++) {
        const uint i = min(i0 + r, Tq - 1); /* rows past Tq repeat the last one, never written */
        __global const io_t *qp = q + q_off + (b * Tq + i) * q_ld + (ulong)h * DK;
        for (uint c = 0; c < NKW; c++) qr[r][c] = IO_LOADW(c, qp);
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
    __global const io_t *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const io_t *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
    for (uint j0 = jbeg; j0 < jend; j0 += BK) {
        float s[ROWS][BK];
        for (uint jj = 0; jj < BK; jj++) {
            const uint j = j0 + jj;
            if (j < jend) {
                __global const io_t *kp = kb + (ulong)j * k_ld;
                vw_t dot[ROWS]; /* unrolled row loops: the accumulators stay in registers */
                #pragma unroll
                for (uint r = 0; r < ROWS; r++) dot[r] = (vw_t)(0.0f);
                for (uint c = 0; c < NKW; c++) {
                    const vw_t kc = kvr_w(IO_LOADW(c, kp));
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
                s[r][jj] =
                    flash_drop(p, seed_lo, seed_hi, (uint)b + drop_b0, h, i0 + r, j0 + jj, threshold, keep_scale);
            }
#endif
            l[r] = l[r] * corr[r] + sum;
        }
        const uint nj = min((uint)BK, jend - j0);
#define FLASH_VAL(jj, c) kvr_w(IO_LOADW((c), vb + (ulong)(j0 + (jj)) * v_ld))
        CLATTN_VALUE_PASS(vw_t, ROWS, RROWS, NVW, acc, corr, s, nj, FLASH_VAL)
#undef FLASH_VAL
    }
    for (uint r = 0; r < ROWS; r++) {
        if (i0 + r >= Tq) break;
        flash_lse(lse, lse_off, b, h, H, i0 + r, Tq, m[r], l[r], 0);
        __global io_t *op = out + out_off + (b * Tq + i0 + r) * out_ld + (ulong)h * DV;
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r]; /* no visible key: 0; NaN stays NaN */
        for (uint c = 0; c < NVW; c++) IO_STOREW(l[r] == 0.0f ? (vw_t)(0.0f) : acc[r][c] * inv, c, op);
    }
}
