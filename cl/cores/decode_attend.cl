/* decode_attend.cl: the decode core for CPUs (src/cores/decode_attend.c): attention over a KV cache for
 * decode plans (src/decode/). decode_common.cl (the cache layout, loads, the block of a work-item), combine.cl and online.cl
 * go first.
 *
 *   decode_attend   one work-item per (b, g, block of R query rows, part). The rows of a block run
 *                   over (token, head in the group): row q -> token q / GROUP, head g*GROUP + q % GROUP,
 *                   so one pass over a key serves every query head that shares it. The block's key
 *                   range is cut into `parts` equal parts (split-K): with parts = 1 the work-item writes
 *                   the output rows; otherwise each part writes its running max m, sum l and unnormalised
 *                   acc (online softmax, as the flash kernels) and split_combine (combine.cl) merges them.
 *
 * Specialised by -D (beyond decode_common.cl's): R (rows per work-item), BK (keys per block); KP and
 * RV (below) have defaults from these.
 */
#ifndef R
#define R 4
#endif
#ifndef BK
#define BK 16
#endif
/* keys per step of the score loop (divides BK). Two keys share each query vector loaded: measured
 * on PoCL (Zen 4), about 10 % faster for a half cache, which is compute-bound there, but 30 % slower
 * for a float cache, which is bound by memory bandwidth. */
#ifndef KP
#if R <= 4 && KV_HALF == 1
#define KP 2
#else
#define KP 1
#endif
#endif
#define NCH (KP * R >= 8 ? 1 : 2) /* FMA chains per key and row */
/* rows per pass over a block's values: RV*DNVW accumulators in registers */
#ifndef RV
#if R % 2 == 0 && DNVW <= 8
#define RV 2
#else
#define RV 1
#endif
#endif

/* q: the queries at column 0 of head 0, rows (first_rows[b] + t) of stride q_ld, head h at h*DK.
 * out: merged rows (first_rows[b] + t) of stride out_ld, head h at h*DV (parts = 1).
 * part_ml (rows*parts, 2) and part_acc (rows*parts, DV), row = (first_rows[b] + t)*H + h (parts > 1). */
__kernel void decode_attend(__global const float *q, ulong q_off, uint q_ld,
                            __global const kv_t *kc, __global const kv_t *vc,
                            __global const float *ks, __global const float *vs,
                            __global const uint *pages, uint npage,
                            __global const uint *lens, __global const uint *valid,
                            __global const uint *first_rows, uint packed,
                            __global const uchar *tree, uint tree_on,
                            __global float *out, ulong out_off, uint out_ld,
                            __global float *part_ml, __global float *part_acc,
                            uint n, uint H, uint HK, uint Tmax, uint parts, float scale, ulong total)
{
    const ulong gid = get_global_id(0);
    if (gid >= total) return;
    const dec_block blk = dec_block_of(gid, R, n, HK, parts, lens, valid, first_rows, packed);
    if (blk.q0 >= blk.nrows) return; /* a packed step's sequence with fewer tokens */
    const ulong b = blk.b;
    const uint r0 = blk.r0; /* (a decode plan has at most 2^32 - 1 rows) */
    const uint g = blk.g, part = blk.part, nrows = blk.nrows, len = blk.len, nv = blk.nv, q0 = blk.q0;

    vw_t qr[R][DNKW], acc[R][DNVW];
    float m[R], l[R];
    uint pos[R];
    for (uint r = 0; r < R; r++) {
        const uint qq = min(q0 + r, nrows - 1); /* rows past the end repeat the last one, never written */
        const uint t = qq / GROUP, h = g * GROUP + qq % GROUP;
        pos[r] = len + t;
        __global const float *qp = q + q_off + (ulong)(r0 + t) * q_ld + (ulong)h * DK;
        for (uint c = 0; c < DNKW; c++) qr[r][c] = QLOADW(c, qp);
        for (uint c = 0; c < DNVW; c++) acc[r][c] = (vw_t)(0.0f);
        m[r] = -FLT_MAX;
        l[r] = 0.0f;
    }
    const uint q_last = blk.q_last, js = blk.js, je = blk.je;

    __global const kv_t *kb = kc + DEC_BASE(b, g) * DK; /* position j's row: kb + DEC_POS(b, g, j) * DK */
    __global const kv_t *vb = vc + DEC_BASE(b, g) * DV;
    __global const float *ksb = ks + DEC_BASE(b, g), *vsb = vs + DEC_BASE(b, g); /* INT8 */
    /* a block of keys that every row sees whole needs no mask: all its keys precede the first row's
     * position (and, with a window, lie within the last row's window) */
    const uint p_first = len + q0 / GROUP, p_last = len + q_last / GROUP;
    for (uint j0 = js; j0 < je; j0 += BK) {
#if DEC_ALIGNED
        const ulong row0 = DEC_POS(b, g, j0); /* the block's keys j are rows row0 + (j - j0) of one page */
#define DEC_ROW_OF(j) (row0 + ((j) - j0))
#else
#define DEC_ROW_OF(j) DEC_POS(b, g, (j))
#endif
#if WINDOW
        const int whole = j0 + BK <= je && j0 + BK - 1 <= p_first && p_last - j0 < WINDOW;
#else
        const int whole = j0 + BK <= je && j0 + BK - 1 <= p_first && (!tree_on || j0 + BK <= len);
#endif
        float s[R][BK];
        for (uint jj = 0; jj < BK; jj += KP) {
            /* KP keys at a time: each query vector loaded serves KP keys. KP*R accumulators are as
             * many independent FMA chains; with fewer than 8, each key gets a second one (odd c). */
            __global const kv_t *kp[KP];
            vw_t dot[KP][R];
#if NCH == 2
            vw_t dot2[KP][R];
#endif
            #pragma unroll
            for (uint kk = 0; kk < KP; kk++) {
                kp[kk] = kb + DEC_ROW_OF(min(j0 + jj + kk, je - 1)) * DK; /* keys past je: a valid key, masked */
                #pragma unroll
                for (uint r = 0; r < R; r++) dot[kk][r] = (vw_t)(0.0f);
#if NCH == 2
                #pragma unroll
                for (uint r = 0; r < R; r++) dot2[kk][r] = (vw_t)(0.0f);
#endif
            }
            uint c = 0;
            for (; c + NCH <= DNKW; c += NCH) {
                vw_t kv[KP];
                #pragma unroll
                for (uint kk = 0; kk < KP; kk++) kv[kk] = KLOADW(c, kp[kk]);
                #pragma unroll
                for (uint r = 0; r < R; r++) {
                    #pragma unroll
                    for (uint kk = 0; kk < KP; kk++) dot[kk][r] = fma(qr[r][c], kv[kk], dot[kk][r]);
                }
#if NCH == 2
                #pragma unroll
                for (uint kk = 0; kk < KP; kk++) kv[kk] = KLOADW(c + 1, kp[kk]);
                #pragma unroll
                for (uint r = 0; r < R; r++) {
                    #pragma unroll
                    for (uint kk = 0; kk < KP; kk++) dot2[kk][r] = fma(qr[r][c + 1], kv[kk], dot2[kk][r]);
                }
#endif
            }
#if NCH == 2
            if (c < DNKW) {
                #pragma unroll
                for (uint kk = 0; kk < KP; kk++) {
                    const vw_t kv = KLOADW(c, kp[kk]);
                    #pragma unroll
                    for (uint r = 0; r < R; r++) dot[kk][r] = fma(qr[r][c], kv, dot[kk][r]);
                }
            }
            #pragma unroll
            for (uint kk = 0; kk < KP; kk++) {
                #pragma unroll
                for (uint r = 0; r < R; r++) dot[kk][r] += dot2[kk][r];
            }
#endif
            #pragma unroll
            for (uint kk = 0; kk < KP; kk++) {
                float hs[R];
#if VW == 8 && R % 4 == 0
                #pragma unroll
                for (uint r = 0; r < R; r += 4) {
                    const float4 h4 = clattn_hsum4_8(dot[kk][r], dot[kk][r + 1], dot[kk][r + 2], dot[kk][r + 3]);
                    hs[r] = h4.x, hs[r + 1] = h4.y, hs[r + 2] = h4.z, hs[r + 3] = h4.w;
                }
#else
                #pragma unroll
                for (uint r = 0; r < R; r++) hs[r] = dhsum(dot[kk][r]);
#endif
                const uint j = j0 + jj + kk;
                const float sk = scale * KSCALE(ksb, DEC_ROW_OF(min(j, je - 1))); /* an INT8 key's scale */
                if (whole) {
                    #pragma unroll
                    for (uint r = 0; r < R; r++) s[r][jj + kk] = hs[r] * sk;
                } else {
                    #pragma unroll
                    for (uint r = 0; r < R; r++)
                        s[r][jj + kk] = j < je && dec_visible(j, pos[r]) && dec_tree(tree, tree_on, b, n, len, pos[r], j)
                                      ? hs[r] * sk : -INFINITY;
                }
            }
        }
        float corr[R];
        for (uint r = 0; r < R; r++) {
            const float mb = clattn_block_max(s[r], BK, m[r]);
            corr[r] = exp(m[r] - mb);
            m[r] = mb;
            float sum = 0.0f;
#if BK == 16
            sum = clattn_exp16_sum(s[r], mb);
#else
            for (uint jj = 0; jj < BK; jj++) {
                const float p = exp(s[r][jj] - mb);
                sum += p;
                s[r][jj] = p;
            }
#endif
            l[r] = l[r] * corr[r] + sum;
        }
#if KV_HALF == 3
        { /* an INT8 value's scale on its weight, after the sums (keys past je have weight 0) */
            float vsj[BK];
            for (uint jj = 0; jj < BK; jj++) vsj[jj] = vsb[DEC_ROW_OF(min(j0 + jj, je - 1))];
            for (uint r = 0; r < R; r++)
                for (uint jj = 0; jj < BK; jj++) s[r][jj] *= vsj[jj];
        }
#endif
        const uint nj = min((uint)BK, je - j0);
#if PAGE && !DEC_ALIGNED
        ulong vrow[BK]; /* the block's value rows (a block may cross a page) */
        for (uint jj = 0; jj < BK; jj++) vrow[jj] = DEC_POS(b, g, min(j0 + jj, je - 1)) * DV;
#define DEC_VAL(jj, c) KLOADW((c), vb + vrow[(jj)])
#else
        __global const kv_t *vp0 = vb + DEC_ROW_OF(j0) * DV;
#define DEC_VAL(jj, c) KLOADW((c), vp0 + (jj) * DV)
#endif
        CLATTN_VALUE_PASS(vw_t, R, RV, DNVW, acc, corr, s, nj, DEC_VAL)
#undef DEC_VAL
#undef DEC_ROW_OF
    }
    for (uint r = 0; r < R; r++) {
        const uint qq = q0 + r;
        if (qq >= nrows) break;
        const uint t = qq / GROUP, h = g * GROUP + qq % GROUP;
        if (parts == 1) {
            __global float *op = out + out_off + (ulong)(r0 + t) * out_ld + (ulong)h * DV;
            const int zero = t >= nv || l[r] == 0.0f; /* padding token, or no visible key */
            const float inv = zero ? 0.0f : 1.0f / l[r];
            for (uint c = 0; c < DNVW; c++) OSTOREW(zero ? (vw_t)(0.0f) : acc[r][c] * inv, c, op);
        } else {
            const ulong slot = ((ulong)(r0 + t) * H + h) * parts + part;
            part_ml[slot * 2] = m[r];
            part_ml[slot * 2 + 1] = l[r];
            __global float *ap = part_acc + slot * DV;
            for (uint c = 0; c < DNVW; c++) OSTOREW(acc[r][c], c, ap);
        }
    }
}

