/* flash_gemm.cl: the register-tiled flash core for GPUs (src/cores/flash_gemm.c). Each tile of flash
 * attention is two small GEMMs around a softmax, S = Q K^T (BQ x BK) and O += P V (BQ x DV), and this kernel
 * computes them the way a GEMM kernel does: a work-group of (BQ/RM) x TC work-items owns BQ query rows of one
 * (batch, head); work-item (ty, tx) keeps in registers a micro-tile of the scores (rows ty*RM .. +RM, keys
 * tx, tx+TC, ... : RN = BK/TC of them) and of the output (the same rows, value vectors tx, tx+TC, ...), so
 * every value it reads from local memory feeds RM or RN FMAs. flash_common.cl goes first.
 *
 *   BQ, BK, RM, TC   query rows per work-group, keys per tile, rows per work-item, work-items per row
 *   VW               vector width along the head dimension (4, or 1 when a head size is not a multiple of 4)
 *   SPLIT            key parts per block, each a work-group of its own, merged by split_combine (1: none)
 *   PF               1: the next K and V tiles are loaded into registers while the current tile's math runs
 *                    (double buffering through registers: local memory has no room for a second tile pair)
 *   KVS              1: the K and V tiles share one local array, V staged once every work-item is past S (at
 *                    the softmax's first barrier: no barrier more), so that larger tiles fit (head size 128)
 *
 * Local memory: the Q block (BQ x DK, read once), a K tile and a V tile (BK rows, loaded with coalesced vector
 * loads; rows padded by one vector so that the work-items of a row read different banks; one array for both
 * with KVS), the tile's weights P (BQ x BK) and the row maxima's partials (BQ x TC).
 *
 * Loads from local memory per warp (32 work-items: 32 / TC values of ty, TC of tx; the defaults TC = 8: 4 and 8),
 * the broadcast pattern that keeps local memory off the critical path:
 *   S, per head vector c: RM Q vectors, each at an address by ty alone: 4 distinct 16-byte words per warp, the
 *     other 28 lanes broadcasts. A work-item row's RM Q rows are QGL = RM QLD + 1 vectors apart, so that the 4
 *     words fall in 4 different groups of banks (RM QLD alone is 0 mod 32 floats at RM = 8): one wavefront.
 *     RN K vectors, by tx: 8 distinct rows, KLD = DKV + 1 vectors apart (4 floats mod 32): 128 bytes over the 32
 *     banks, each word broadcast to the warp's 4 ty: one wavefront. Together RM + RN wavefronts for 4 RM RN FMAs.
 *   P V, per key: RM weights, by ty (rows RM PLD floats apart: 8 mod 32 at RM = 8, BK = 32): one wavefront each;
 *     NVT V vectors, 8 consecutive 16-byte words: one wavefront each. RM + NVT wavefronts for 4 RM NVT FMAs.
 * Defaults at head size 64 (RM = 8, RN = 4, NVT = 2): 12 wavefronts per 128 FMAs and 10 per 64; an SM's local
 * memory serves one wavefront per cycle while its FMA pipes take four warp instructions: 3/8 and 5/8 of the FMA
 * pipe's time, half over the tile. At 128 (RM = RN = NVT = 4): 8 per 64 and 8 per 64, half. Counted without
 * broadcasts (every 16-byte load 4 wavefronts: scripts/gpu-static.sh's figure, an upper bound) local memory is
 * the bound, at 46 and 36 TFLOP/s.
 *
 * The softmax runs in base 2: s2 = (q . k) * scale * log2(e), p = exp2(s2 - m2), which is
 * exp(score - max). Each work-item keeps its rows' running max (the same in all TC work-items of a row,
 * reduced through local memory once per tile) and its own part of the running sum (summed across the
 * row's work-items once, at the end). The accumulators are rescaled only when a row's max grows.
 *
 * Masks: a tile that crosses no edge (causal diagonal, the end of the keys) and a plan without a padding,
 * window or attention mask skips the mask function. With CAUSAL, tiles past a block's last query are never
 * loaded and the blocks are issued last-first (the longest first). */
#ifndef BQ
#define BQ 64
#endif
#ifndef BK
#define BK 32
#endif
#ifndef RM
#define RM 4
#endif
#ifndef TC
#define TC 8
#endif
#ifndef VW
#define VW 4
#endif

#ifndef KVS
#define KVS 0
#endif
/* The S and P V loops: unrolled whole on GPUs (UNROLL_ALL, the core's defines; sm_90: no loop left in the tile but its
 * own, 46 TFLOP/s against 34 with 4 and 2 iterations unrolled), by 4 and 2 on CPUs, whose LLVM (PoCL) takes a
 * third longer over the whole-unrolled kernel (12 s against 8 a program, B=1 T=512 H=8 d=64) for no gain there. */
#ifndef UNROLL_ALL
#define UNROLL_ALL 1
#endif
#if UNROLL_ALL
#define TILE_UNROLL_K _Pragma("unroll")
#define TILE_UNROLL_V _Pragma("unroll")
#else
#define TILE_UNROLL_K _Pragma("unroll 4")
#define TILE_UNROLL_V _Pragma("unroll 2")
#endif
/* the tiles' staging (without PF), unrolled: a fixed count of vectors per work-item (sm_90, clang 15 + ptxas 13:
 * 254 registers at head size 64 with the defaults, 193 at 128, no spill; bursts of 4 took 210 and 168) */
#define STAGE_UNROLL _Pragma("unroll")

#define NTY (BQ / RM)       /* work-item rows */
#define WGS (NTY * TC)      /* work-items per work-group */
#define RN (BK / TC)        /* keys per work-item per tile */
#define DKV (DK / VW)       /* vectors per query or key row */
#define DVV (DV / VW)       /* vectors per value row */
#define NVT ((DVV + TC - 1) / TC) /* value vectors per work-item */
#define QLD (DKV + 1)       /* local row strides, in vectors: one vector of padding */
#define QGL (RM * QLD + 1)  /* a work-item row's RM rows of the Q block, and one vector more (banks, below) */
#define KLD (DKV + 1)
#define VLD (DVV + 1)
#define KVN (BK * (KLD > VLD ? KLD : VLD)) /* vectors of the shared tile array (KVS) */
#define PLD (BK + 1)
#define RLD (TC + 1)
#define LOG2E 1.4426950408889634f
#ifndef PF
#define PF 0
#endif
#define KPI ((BK * DKV + WGS - 1) / WGS) /* K vectors per work-item per tile */
#define VPI ((BK * DVV + WGS - 1) / WGS) /* V vectors per work-item per tile */

#if VW == 4
typedef float4 fv_t;
#define FV_STORE(x, i, p) vstore4((x), (i), (p))
#define FV_DOT(a, b, s) fma((a).s3, (b).s3, fma((a).s2, (b).s2, fma((a).s1, (b).s1, fma((a).s0, (b).s0, (s)))))
#if KV_HALF
inline float4 fv_round(float4 x) { return (float4)(KVR(x.s0), KVR(x.s1), KVR(x.s2), KVR(x.s3)); }
#else
#define fv_round(x) (x)
#endif
#else
typedef float fv_t;
#define FV_STORE(x, i, p) ((p)[(i)] = (x))
#define FV_DOT(a, b, s) fma((a), (b), (s))
#define fv_round(x) KVR(x)
#endif

/* One work-group: query rows i0 .. i0+BQ-1 of (b, h); work-group id = ((b*H + h) * nblk + block')*SPLIT + part + extent,
 * block' counting from the last block under CAUSAL. Every barrier is reached by the whole work-group: the
 * loop bounds and branches around barriers depend only on the group. */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void flash_gemm(FLASH_ARGS)
{
    __local fv_t qs[BQ / RM * QGL];
#if KVS
    __local fv_t kvs[KVN];
    __local fv_t *const ks = kvs, *const vs = kvs;
#else
    __local fv_t ks[BK * KLD];
    __local fv_t vs[BK * VLD];
#endif
    __local float ps[BQ * PLD];
    __local float red[BQ * RLD];
    const uint lid = get_local_id(0);
    const uint tx = lid % TC, ty = lid / TC;
    const flash_block blkd = flash_block_of(extent + get_group_id(0), BQ, BK, Tq, Tk, H);
    const ulong b = blkd.b;
    const uint h = blkd.h, i0 = blkd.i0;
#if SPLIT > 1
    const uint part = blkd.part;
#endif
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, h, H, Tq, Tk);
    const float scale2 = scale * LOG2E;
    /* this work-item's corners of the local arrays: every access below is a constant offset from one */
    __local const fv_t *qme = qs + ty * QGL, *kme = ks + tx * KLD, *vme = vs + tx;
    __local float *pme = ps + ty * RM * PLD, *rme = red + ty * RM * RLD;

    /* the Q block, rows past Tq repeating the last one (never written) */
    for (uint x = lid; x < BQ * DKV; x += WGS) {
        const uint rr = x / DKV, c = x % DKV;
        const uint ii = min(i0 + rr, Tq - 1);
        qs[rr / RM * QGL + rr % RM * QLD + c] = IO_LOADW(c, q + q_off + (b * Tq + ii) * q_ld + (ulong)h * DK);
    }
    fv_t acc[RM][NVT];
    float m[RM], l[RM];
    #pragma unroll
    for (uint r = 0; r < RM; r++) {
        m[r] = -FLT_MAX;
        l[r] = 0.0f;
        #pragma unroll
        for (uint t = 0; t < NVT; t++) acc[r][t] = (fv_t)(0.0f);
    }
    const uint jbeg = blkd.jbeg, jend = blkd.jend;
    __global const io_t *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const io_t *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
/* work-item lid's u-th vector of the tile at key j0 (keys past jend, and slots past the tile, as 0) */
#define K_AT(j0, u) (lid + WGS * (u) < BK * DKV && (j0) + (lid + WGS * (u)) / DKV < jend \
    ? fv_round(IO_LOADW((lid + WGS * (u)) % DKV, kb + (ulong)((j0) + (lid + WGS * (u)) / DKV) * k_ld)) : (fv_t)(0.0f))
#define V_AT(j0, u) (lid + WGS * (u) < BK * DVV && (j0) + (lid + WGS * (u)) / DVV < jend \
    ? fv_round(IO_LOADW((lid + WGS * (u)) % DVV, vb + (ulong)((j0) + (lid + WGS * (u)) / DVV) * v_ld)) : (fv_t)(0.0f))
/* The tile at key j0 into ts (row stride TLD vectors) from base (row stride ld floats), NV vectors a row, PER
 * vectors a work-item: rows past jend as 0. Where the work-group covers whole rows (WGS a multiple of NV), the
 * work-item keeps one column and steps WGS / NV rows: constant offsets, no division per vector. */
#define STAGE(ts, TLD, NV, PER, base, ld) \
    if (WGS % (NV) == 0) { \
        const uint r0_ = lid / (NV), c_ = lid % (NV); \
        STAGE_UNROLL \
        for (uint u = 0; u < (PER); u++) { \
            const uint jj = r0_ + u * (WGS / (NV)); \
            if (BK % (WGS / (NV)) == 0 || jj < BK) \
                (ts)[jj * (TLD) + c_] = j0 + jj < jend ? fv_round(IO_LOADW(c_, (base) + (ulong)(j0 + jj) * (ld))) \
                                                       : (fv_t)(0.0f); \
        } \
    } else { \
        STAGE_UNROLL \
        for (uint u = 0; u < (PER); u++) { \
            const uint x = lid + WGS * u, jj = x / (NV), c = x % (NV); \
            if (x < BK * (NV)) \
                (ts)[jj * (TLD) + c] = j0 + jj < jend ? fv_round(IO_LOADW(c, (base) + (ulong)(j0 + jj) * (ld))) \
                                                      : (fv_t)(0.0f); \
        } \
    }
#if PF
    fv_t kn[KPI], vn[VPI]; /* the next tile, in flight */
    #pragma unroll
    for (uint u = 0; u < KPI; u++) kn[u] = K_AT(jbeg, u);
    #pragma unroll
    for (uint u = 0; u < VPI; u++) vn[u] = V_AT(jbeg, u);
#endif
    for (uint j0 = jbeg; j0 < jend; j0 += BK) {
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's reads are done (and the Q block is in) */
        /* the K and V tiles, keys past jend as 0 */
#if PF
        #pragma unroll
        for (uint u = 0; u < KPI; u++) {
            const uint x = lid + WGS * u;
            if (x < BK * DKV) ks[x / DKV * KLD + x % DKV] = kn[u];
        }
#if !KVS
        #pragma unroll
        for (uint u = 0; u < VPI; u++) {
            const uint x = lid + WGS * u;
            if (x < BK * DVV) vs[x / DVV * VLD + x % DVV] = vn[u];
        }
#endif
#else
        STAGE(ks, KLD, DKV, KPI, kb, k_ld)
#if !KVS
        STAGE(vs, VLD, DVV, VPI, vb, v_ld)
#endif
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
#if PF
        /* the next tile's loads, issued before this tile's math (past jend: zeros, never used) */
        #pragma unroll
        for (uint u = 0; u < KPI; u++) kn[u] = K_AT(j0 + BK, u);
#if !KVS
        #pragma unroll
        for (uint u = 0; u < VPI; u++) vn[u] = V_AT(j0 + BK, u);
#endif
#endif

        /* S micro-tile: rows ty*RM + r, keys j0 + tx + TC*n */
        float s[RM][RN];
        #pragma unroll
        for (uint r = 0; r < RM; r++) {
            #pragma unroll
            for (uint n = 0; n < RN; n++) s[r][n] = 0.0f;
        }
        TILE_UNROLL_K
        for (uint c = 0; c < DKV; c++) {
            fv_t qv[RM], kv[RN];
            #pragma unroll
            for (uint r = 0; r < RM; r++) qv[r] = qme[r * QLD + c];
            #pragma unroll
            for (uint n = 0; n < RN; n++) kv[n] = kme[TC * n * KLD + c];
            #pragma unroll
            for (uint r = 0; r < RM; r++) {
                #pragma unroll
                for (uint n = 0; n < RN; n++) s[r][n] = FV_DOT(qv[r], kv[n], s[r][n]);
            }
        }
        /* scale, masks, and this work-item's part of each row's max */
#if KPM || MASK_KIND || WINDOW
        const int edge = 1;
#elif CAUSAL
        const int edge = j0 + BK > jend || j0 + BK > i0 + 1;
#else
        const int edge = j0 + BK > jend;
#endif
        #pragma unroll
        for (uint r = 0; r < RM; r++) {
            const uint i = min(i0 + ty * RM + r, Tq - 1);
            float pm = -FLT_MAX;
            #pragma unroll
            for (uint n = 0; n < RN; n++) {
                const uint j = j0 + tx + TC * n;
                if (edge)
                    s[r][n] = j < jend ? clattn_mask_score(s[r][n] * scale, i, j, b, Tk, kpm, mask) * LOG2E : -INFINITY;
                else
                    s[r][n] *= scale2;
                pm = fmax(pm, s[r][n]);
            }
            rme[r * RLD + tx] = pm;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#if KVS
        /* every work-item is past S: the V tile over the K tile */
#if PF
        #pragma unroll
        for (uint u = 0; u < VPI; u++) {
            const uint x = lid + WGS * u;
            if (x < BK * DVV) vs[x / DVV * VLD + x % DVV] = vn[u];
        }
        #pragma unroll
        for (uint u = 0; u < VPI; u++) vn[u] = V_AT(j0 + BK, u); /* the next tile's, in flight */
#else
        STAGE(vs, VLD, DVV, VPI, vb, v_ld)
#endif
#endif
        /* the rows' new max; the weights p = exp2(s - max) to local memory (after dropout) */
        #pragma unroll
        for (uint r = 0; r < RM; r++) {
            float mb = m[r];
            for (uint t = 0; t < TC; t++) mb = fmax(mb, rme[r * RLD + t]);
            if (mb > m[r]) { /* fmax skips NaN: a NaN score comes back through exp2 into the sum */
                const float corr = clattn_exp2(m[r] - mb);
                l[r] *= corr;
                #pragma unroll
                for (uint t = 0; t < NVT; t++) acc[r][t] *= corr;
                m[r] = mb;
            }
            float sum = 0.0f;
            #pragma unroll
            for (uint n = 0; n < RN; n++) {
                const float p = clattn_exp2(s[r][n] - mb);
                sum += p;
                pme[r * PLD + tx + TC * n] =
                    flash_drop(p, seed_lo, seed_hi, (uint)b + drop_b0, h, i0 + ty * RM + r, j0 + tx + TC * n, threshold,
                               keep_scale);
            }
            l[r] += sum;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* O micro-tile += P V: rows ty*RM + r, value vectors tx + TC*t */
        /* all BK keys, a constant count: past jend the weights and the V rows are 0 */
        TILE_UNROLL_V
        for (uint jj = 0; jj < BK; jj++) {
            float pr[RM];
            #pragma unroll
            for (uint r = 0; r < RM; r++) pr[r] = pme[r * PLD + jj];
            #pragma unroll
            for (uint t = 0; t < NVT; t++) {
                const uint c = tx + TC * t;
                if (NVT * TC == DVV || c < DVV) {
                    const fv_t vv = vme[jj * VLD + TC * t];
                    #pragma unroll
                    for (uint r = 0; r < RM; r++) acc[r][t] = fma((fv_t)(pr[r]), vv, acc[r][t]);
                }
            }
        }
    }
    /* each row's sum across its TC work-items, then acc / l */
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (uint r = 0; r < RM; r++) rme[r * RLD + tx] = l[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (uint r = 0; r < RM; r++) {
        const uint i = i0 + ty * RM + r;
        float lr = 0.0f;
        for (uint t = 0; t < TC; t++) lr += rme[r * RLD + t];
        if (i >= Tq) continue;
#if SPLIT > 1
        /* one part: the unnormalised output, the row's max (base 2) and sum, for split_combine */
        __global float *row = (__global float *)out + out_off + ((b * Tq + i) * SPLIT + part) * out_ld; /* ws */
        #pragma unroll
        for (uint t = 0; t < NVT; t++) {
            const uint c = tx + TC * t;
            if (NVT * TC == DVV || c < DVV) FV_STORE(acc[r][t], c, row + (ulong)h * DV);
        }
        if (tx == 0) row[H * DV + 2 * h] = m[r], row[H * DV + 2 * h + 1] = lr;
        continue;
#endif
        if (tx == 0) flash_lse(lse, lse_off, b, h, H, i, Tq, m[r], lr, 1);
        __global io_t *op = out + out_off + (b * Tq + i) * out_ld + (ulong)h * DV;
        const float inv = lr == 0.0f ? 0.0f : 1.0f / lr; /* no visible key: 0; NaN stays NaN */
        #pragma unroll
        for (uint t = 0; t < NVT; t++) { /* (a half plan's type: rounded once) */
            const uint c = tx + TC * t;
            if (NVT * TC == DVV || c < DVV) IO_STOREW(lr == 0.0f ? (fv_t)(0.0f) : acc[r][t] * inv, c, op);
        }
    }
}
