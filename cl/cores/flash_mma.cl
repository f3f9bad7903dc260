/* flash_mma.cl: the tensor-core flash core (src/cores/flash_mma.c). Both products of a tile, S = Q K^T and
 * O += P V, are warp-level mma.sync.m16n8k8 operations on TF32 operands with fp32 accumulators (PTX ISA,
 * "Matrix Fragments for mma.m16n8k8" with .tf32), issued through inline PTX on NVIDIA GPUs of compute
 * capability 8.0 and newer. flash_common.cl goes first.
 *
 * A work-group is NW warps of 32 work-items; warp w owns the 16 query rows i0 + 16w .. +15 of one (batch,
 * head). Lane l of a warp is in quad g = l / 4 at position t = l % 4, and holds, for every 16 x 8 tile of
 * scores or output, the elements (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1): the C/D fragment.
 *   S = Q K^T:  A = 16 rows of Q by 8 head columns (a0 = (g, t), a1 = (g + 8, t), a2 = (g, t + 4),
 *               a3 = (g + 8, t + 4)); B = K^T, 8 head columns by 8 keys, read from the K tile in local
 *               memory (b0 = (t, g), b1 = (t + 4, g)); one mma per (8 head columns, 8 keys).
 *   O += P V:   A = P, 16 rows by 8 keys, straight from the lane's score fragment: the sum over keys does not
 *               care in which order the 8 keys come, so A's column t is key 2t and column t + 4 is key 2t + 1,
 *               the keys the lane already holds (a0 = c0, a1 = c2, a2 = c1, a3 = c3; no shuffle); B = the V
 *               tile's rows 2t and 2t + 1 (b0, b1) at value column g, in the same key order.
 * The online softmax runs on the fragments: a row's max and sum across the four lanes of its quad through
 * shfl.sync.bfly (xor 1, 2); each lane keeps the max of its two rows and its part of their sums.
 *
 * Precision. fp32 by default, as 3xTF32: each operand x splits into a TF32 high part hi = rna(x) and a TF32
 * low part lo = rna(x - hi), and each product is accumulated as lo*hi + hi*lo + hi*hi (three mma, the small
 * terms first); the dropped lo*lo term is below 2^-22 of the product. With -DTF32=1 (the plan's precision
 * TF32) one mma per product on rna(x): TF32's 10-bit mantissa. rna: round to nearest, ties away from zero,
 * to 10 mantissa bits, as cvt.rna.tf32.f32. An operand whose high part would round past the largest float
 * is split by truncation instead (so that hi + lo stays finite), and an infinite or NaN operand is its own high
 * part with lo = 0. Infinities pass as in fp32 without a test per product:
 *   S = Q K^T: the small terms go to an accumulator of their own, added to the hi*hi sum at the end of the tile
 *     only where finite: an infinite operand reaches the score through hi*hi alone (where the small terms would
 *     make inf - inf or 0 * inf), and small terms can only overflow where hi*hi did.
 *   O += P V: P is finite or NaN, so the V tile is split with its infinities in the low part (hi = 0, lo = inf):
 *     p_hi*v_lo is inf*p where p > 0 and NaN where p = 0, as fp32's p*inf, and the other terms are 0.
 *
 * MMA_NATIVE = 0 (every device without the instruction; forced only, AUTO never picks it there): the same
 * kernel with mma, shfl and cvt emulated in OpenCL C. The emulation keeps the PTX fragment layout: each lane
 * writes its A and B fragments to its warp's part of local memory where the layout puts them (a row of
 * products that share A at a time), a barrier, each lane computes its four D elements of each product (the
 * products exact, as a TF32 product is in fp32, their sum rounded toward zero as the tensor core's: dot_rz), a
 * barrier; the quad reductions go through local memory the same way; TF32 rounding is the same
 * bit operation as cvt.rna. So tiling, fragment bookkeeping, the softmax on fragments, the 3xTF32 split,
 * masks and dropout run the suite on any device; only the instructions differ on NVIDIA.
 *
 * Half precision (HMMA = 1: a plan of type F16 or BF16 whose Q, K, V are its own arrays, IO_DTYPE 1 or 2, and whose
 * kv_half is 0 or the same type; src/cores/flash_mma.c's hmma_of): both products are mma.sync.m16n8k16 with
 * .f16 or .bf16 operands and fp32 accumulators, on the arrays' 16-bit values as they are (no rounding of the
 * inputs; products of two such values are exact in fp32). A = 16 rows by 16 k as four .f16x2 registers (a0 = (g,
 * 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..), the lower half the lower k), B = 16 k
 * by 8 columns as two (b0 = (2t..2t+1, g), b1 = (2t + 8.., g)). Which head column or key a k stands for is the
 * kernel's choice, the same in A and B:
 *   S = Q K^T:  k 2t, 2t+1, 2t+8, 2t+9 of head chunk c are columns 16c + 4t .. 16c + 4t + 3, so that a lane's b0 and
 *               b1 are one 64-bit read of its key's row in the K tile (and a0, a2 of its query rows').
 *   O += P V:   k is the key (16 keys, two 8-key score blocks: a0 = block 2m's c0, c1, a1 = its c2, c3, a2 and a3 block
 *               2m + 1's), P rounded to the type (cvt.rn: FlashAttention's rounding, README "Precision"). Two value
 *               blocks share a 16-column chunk w: column n of block 2w + i is value column 16w + 2n + i, so a lane
 *               reads one 32-bit word (columns 16w + 2g, + 1) of each of its four keys' rows in the V tile and pairs
 *               their halves (b of block 2w: the low halves, of 2w + 1: the high ones); its outputs of a row are the
 *               four columns 16w + 4t .. 16w + 4t + 3.
 * The K and V tiles (and the Q block with QREG = 0) are staged as the arrays' 16-bit values, rows of 32-bit words
 * padded to 8 mod 32 (K, Q: a quad's 64-bit reads hit 32 banks) and 4 mod 16 (V); head sizes padded to 16.
 * The row sums take the weights before their rounding, and dropout's 1/(1 - p) multiplies the output at the end
 * (the rounded weights are those of the softmax, in [0, 1]). PS and TF32 have no part in it (nothing is split).
 * The emulation (MMA_NATIVE = 0) widens the fragments into the exchange area and sums the 16 products of each D
 * element, rounded toward zero once (dot_rz); P's rounding is cvt.rn's, bit for bit (common/half.cl).
 *
 * O is never accumulated in the tensor core: a tile's P V (or each product, OT) starts from 0 and is added to O in
 * fp32. The tensor core's accumulator rounds toward zero at every instruction, so an O kept there lost up to an ulp
 * per 8 keys, all in one direction (H200: 2.3x the fp32 tolerance at 32768 keys, where the CPU cores are at 0.02x).
 * The scores' sums over the head (at most 32 instructions) stay in it.
 *
 * Tuning: NW (warps per work-group: BQ = 16 NW query rows), BK (keys per tile, a multiple of 8), QREG (1:
 * each lane keeps its Q fragments in registers, read once from global memory; 0: the Q block in local
 * memory, read per tile), SPLIT (key parts per block, merged by split_combine, common/combine.cl), PS (1: the K
 * and V tiles, and the Q block when QREG = 0, are split into TF32 high and low parts once, by the whole work-group
 * as it stages them, into local arrays of their own; 0: each warp splits every element it reads, NW times per tile), PF
 * (HMMA only; 1: the next tile's K and V loaded from global memory into registers while this tile's products run,
 * then stored to local memory after the tile; 0: each tile loaded and stored before its products). Head sizes are padded to
 * multiples of 8 with zeros. Local memory: the K and V tiles (rows padded by 4 floats, so that the lanes of a
 * fragment read 32 different banks), the Q block when QREG = 0, each twice with PS in 3xTF32 (the low parts), and
 * with MMA_NATIVE = 0 the exchange area. */
#ifndef NW
#define NW 4
#endif
#ifndef BK
#define BK 32
#endif
#ifndef QREG
#define QREG 1
#endif
#ifndef MMA_NATIVE
#define MMA_NATIVE 0
#endif
#ifndef TF32
#define TF32 0
#endif
#ifndef PS
#define PS 1
#endif
#ifndef HMMA
#define HMMA 0
#endif
#ifndef PF
#define PF 0
#endif
#if PF && !HMMA
#error "PF prefetches HMMA's 16-bit tiles"
#endif
#if HMMA && !(IO_DTYPE == 1 || IO_DTYPE == 2)
#error "HMMA needs a half plan's arrays (IO_DTYPE 1 or 2)"
#endif
#define KV_LO (PS && !TF32 && !HMMA) /* the tiles' low parts in local memory of their own */

#define WGS (32 * NW)            /* work-items per work-group */
#define BQ (16 * NW)             /* query rows per work-group */
#define PADK (HMMA ? 16 : 8)     /* head sizes padded to the products' k (HMMA) or n */
#define DKP ((DK + PADK - 1) / PADK * PADK)
#define DVP ((DV + PADK - 1) / PADK * PADK)
#define NKC (DKP / (HMMA ? 16 : 8)) /* head chunks of Q K^T */
#define NSB (BK / 8)             /* key blocks of a tile */
#define NVB (DVP / 8)            /* value blocks of the output */
#define KLD (DKP + 4)            /* local row strides, in floats: 4 mod 32 */
#define VLD (DVP + 4)
#define QLD (DKP + 4)
#define XCH (256 + 128 * (NSB > NVB ? NSB : NVB)) /* floats of a warp's exchange area (emulation) */
#define KLDW (DKP / 2 + (40 - DKP / 2 % 32) % 32) /* HMMA: row strides in 32-bit words, 8 mod 32 (K, Q), 4 mod 16 (V) */
#define VLDW (DVP / 2 + (20 - DVP / 2 % 16) % 16)
#define QLDW KLDW
#define LOG2E 1.4426950408889634f
/* P V's sums (O is never accumulated in the tensor core, whose accumulator rounds toward zero: README "Precision"):
 * OT = 1, a tile's products summed from 0 in accumulators of their own (ot), added to O after the tile; OT = 0, each
 * product from 0 and added at once (mma_block_add), where O and ot would not both fit in registers. sm_90 (clang +
 * ptxas, scripts/gpu-static.sh): 3xTF32 d=64 238 registers with ot, 255 and a spill adding per product; d=128 spilled
 * 392 B with ot, none per product; f16 d=128 243 registers with ot and 15 % fewer instructions per tile. */
#define OT (HMMA ? DVP <= 128 : DVP <= 64)
/* loops around mma: unrolled natively; kept as loops in the emulation, whose barriers PoCL would otherwise
 * compile region by region (minutes per variant) */
#if MMA_NATIVE
#define MMA_LOOP _Pragma("unroll")
#else
#define MMA_LOOP _Pragma("unroll 1")
#endif

/* ---- the three operations the kernel needs from a warp: TF32 rounding, mma, a quad's reduction */
#if MMA_NATIVE
#define MMA1(d, a, b) \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
                 "{%0,%1,%2,%3};" \
                 : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]) \
                 : "r"(as_uint((a)[0])), "r"(as_uint((a)[1])), "r"(as_uint((a)[2])), "r"(as_uint((a)[3])), \
                   "r"(as_uint((b)[0])), "r"(as_uint((b)[1])))
inline float shfl_xor(float x, uint m)
{
    float y;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(y) : "f"(x), "r"(m));
    return y;
}
#endif

/* x = hi + lo, both TF32 (lo = 0 in TF32 mode, unused): hi = rna(x), lo = rna(x - hi), where rna is
 * cvt.rna.tf32.f32 bit for bit: add half of the 13 dropped bits' weight to the magnitude and drop them (a carry
 * into the exponent is the rounding up). An x whose high part would round past the largest float is split by
 * truncation (both parts), a non-finite x is its own high part with lo = 0.
 * Integer selects only, natively too, not the PTX instruction: ptxas (13, sm_90) expands cvt.rna.tf32.f32 into the
 * same integer operations, and an asm() statement cannot be speculated, so the compiler put a branch (BSSY/BSYNC/BRA) around each conditional split (clang 15 + ptxas 13, sm_90: 412
 * convergence barriers and 224 branches per 32-key tile at d = 64, 60 and 48 without; NVIDIA's own OpenCL
 * compiler may differ). */
inline void tf32_split(float x, float *hi, float *lo)
{
    const uint u = as_uint(x), mag = u & 0x7fffffffu;
    const uint fin = mag < 0x7f800000u;
    const uint up = fin && mag + 0x1000u < 0x7f800000u ? 0x1000u : 0u; /* rounding stays finite: rna, else truncate */
    const float h = as_float((u + up) & (fin ? 0xffffe000u : 0xffffffffu));
    *hi = h;
#if TF32
    *lo = 0.0f;
#else
    const uint r = as_uint(x - h); /* exact */
    *lo = as_float((r + up) & (fin ? 0xffffe000u : 0u));
#endif
}

/* p = hi + lo for a softmax weight (after dropout): finite and far below the largest float, or NaN. rna as
 * tf32_split without its tests for overflow and infinities. A NaN weight (a NaN score's) may split into anything:
 * the row's sum took it before the split and is NaN, and so is the row's output, o / l. */
inline void p_split(float p, float *hi, float *lo)
{
    const float h = as_float((as_uint(p) + 0x1000u) & 0xffffe000u);
    *hi = h;
#if TF32
    *lo = 0.0f;
#else
    *lo = as_float((as_uint(p - h) + 0x1000u) & 0xffffe000u);
#endif
}

/* an infinite x, split as (x, 0), to (0, x): the V tile's form (3xTF32) */
inline void inf_to_lo(float *hi, float *lo)
{
    const int inf = isinf(*hi);
    *lo = inf ? *hi : *lo;
    *hi = inf ? 0.0f : *hi;
}

/* Four consecutive elements of a tile row staged in local memory at hs[at..] (and their low parts at ls[at..]
 * with PS in 3xTF32): src[0..3] where the key is valid (ok) and the column within the head (i < left), else 0;
 * split once (PS), infinities in the low part when inf_lo (the V tile, 3xTF32). at is a multiple of 4. */
inline void stage4(__local float *hs, __local float *ls, uint at, __global const io_t *src, int ok, int left,
                   int inf_lo)
{
    float4 x;
    x.s0 = ok && 0 < left ? KVR(IO_LOAD(0, src)) : 0.0f;
    x.s1 = ok && 1 < left ? KVR(IO_LOAD(1, src)) : 0.0f;
    x.s2 = ok && 2 < left ? KVR(IO_LOAD(2, src)) : 0.0f;
    x.s3 = ok && 3 < left ? KVR(IO_LOAD(3, src)) : 0.0f;
#if PS
    float hi[4], lo[4];
    tf32_split(x.s0, &hi[0], &lo[0]);
    tf32_split(x.s1, &hi[1], &lo[1]);
    tf32_split(x.s2, &hi[2], &lo[2]);
    tf32_split(x.s3, &hi[3], &lo[3]);
#if KV_LO
    if (inf_lo) {
        #pragma unroll
        for (uint e = 0; e < 4; e++) inf_to_lo(&hi[e], &lo[e]);
    }
#else
    (void)inf_lo;
#endif
    vstore4((float4)(hi[0], hi[1], hi[2], hi[3]), 0, hs + at);
#if KV_LO
    vstore4((float4)(lo[0], lo[1], lo[2], lo[3]), 0, ls + at);
#else
    (void)ls;
#endif
#else
    (void)ls, (void)inf_lo;
    vstore4(x, 0, hs + at);
#endif
}
#if KV_LO
#define KV_LO_OR(lo, hi) (lo)
#else
#define KV_LO_OR(lo, hi) (hi)
#endif
/* the tiles' staging: unrolled natively (a fixed count of float4 per work-item), a loop in the emulation */
#if MMA_NATIVE
#define STAGE_LOOP _Pragma("unroll 4")
#else
#define STAGE_LOOP _Pragma("unroll 1")
#endif

/* Two elements of a fragment at offsets i0 and i1 of a tile (or of the Q block), as high and low parts: read (PS)
 * or split here */
#if KV_LO
#define TILE_B(bh, bl, hs, ls, i0, i1) \
    ((bh)[0] = (hs)[i0], (bl)[0] = (ls)[i0], (bh)[1] = (hs)[i1], (bl)[1] = (ls)[i1])
#elif PS
#define TILE_B(bh, bl, hs, ls, i0, i1) ((bh)[0] = (hs)[i0], (bl)[0] = 0.0f, (bh)[1] = (hs)[i1], (bl)[1] = 0.0f)
#else
#define TILE_B(bh, bl, hs, ls, i0, i1) (tf32_split((hs)[i0], &(bh)[0], &(bl)[0]), tf32_split((hs)[i1], &(bh)[1], &(bl)[1]))
#endif
/* the V tile's: its infinities in the low parts (3xTF32), split here unless staged so */
#if PS || TF32
#define TILE_BV TILE_B
#else
#define TILE_BV(bh, bl, hs, ls, i0, i1) \
    (TILE_B(bh, bl, hs, ls, i0, i1), inf_to_lo(&(bh)[0], &(bl)[0]), inf_to_lo(&(bh)[1], &(bl)[1]))
#endif

/* A row of m16n8k8 products that share their A fragment: d[n] += A B[n] for the blocks n of one loop,
 * from the lane's fragments (ah/al: 4 values, bh/bl: 2; high and low parts, the low ones unused in TF32
 * mode): 3xTF32, or one product in TF32 mode. The kernel writes each row as
 *     for (n ...) { ...the lane's B fragment of block n...; mma_block(d[n], dc[n], ah, al, bh, bl, n, xs, lane); }
 *     mma_row_end(d, dc, count, xs, lane);
 * with the small terms (3xTF32) summed into dc, which may be d itself.
 * Natively mma_block issues the instructions and mma_row_end does nothing. The emulation stages the
 * fragments where the PTX layout puts them, in the warp's exchange area xs: A (16 x 8, row-major, the
 * high part then the low part) at xs[0..256), block n's B (8 x 8, stored transposed as [n][k], high then
 * low) at xs[256 + 128 n ...); mma_row_end then computes every lane's D elements of every block between two
 * barriers (a barrier per row rather than per product: PoCL saves every live private value at each). */
#define XA 256
#define XB 128
#if MMA_NATIVE
inline void mma_block(float *d, float *dc, const float *ah, const float *al, const float *bh, const float *bl,
                      uint n, __local float *xs, uint lane)
{
    (void)dc, (void)n, (void)xs, (void)lane;
#if !TF32
    MMA1(dc, al, bh);
    MMA1(dc, ah, bl);
#endif
    MMA1(d, ah, bh);
}
#define mma_row_end(d, dc, count, xs, lane) ((void)0)
/* d += A B as a product of its own: D = 0 + A B in the tensor core (3xTF32: the small terms first), then added to d
 * in fp32 (README "Precision": why O is not kept in the mma's accumulator) */
inline void mma_block_add(float *d, const float *ah, const float *al, const float *bh, const float *bl, uint n,
                          __local float *xs, uint lane)
{
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_block(p, p, ah, al, bh, bl, n, xs, lane);
    d[0] += p[0], d[1] += p[1], d[2] += p[2], d[3] += p[3];
}
#define mma_row_end_add(d, count, xs, lane) ((void)0)
#else
inline void mma_block(float *d, float *dc, const float *ah, const float *al, const float *bh, const float *bl,
                      uint n, __local float *xs, uint lane)
{
    (void)d, (void)dc;
    const uint g = lane >> 2, t = lane & 3;
    if (n == 0) {
        xs[g * 8 + t] = ah[0];
        xs[(g + 8) * 8 + t] = ah[1];
        xs[g * 8 + t + 4] = ah[2];
        xs[(g + 8) * 8 + t + 4] = ah[3];
#if !TF32
        xs[128 + g * 8 + t] = al[0];
        xs[128 + (g + 8) * 8 + t] = al[1];
        xs[128 + g * 8 + t + 4] = al[2];
        xs[128 + (g + 8) * 8 + t + 4] = al[3];
#endif
    }
    __local float *xb = xs + XA + XB * n; /* B as its transpose, [n][k]: b0 = (k t, n g), b1 = (k t + 4, n g) */
    xb[g * 8 + t] = bh[0];
    xb[g * 8 + t + 4] = bh[1];
#if !TF32
    xb[64 + g * 8 + t] = bl[0];
    xb[64 + g * 8 + t + 4] = bl[1];
#endif
}

/* c + sum_k a_k b_k (n products) as a tensor core's fp32 accumulator takes them: the products exact (TF32 or 16-bit
 * operands: their products fit fp32's 24 bits), each addend (c too) aligned to the largest with one bit below its
 * ulp, truncated toward zero, summed, and the sum normalised toward zero. Measured on an H200 (test_mma
 * toward_zero::one_sum): 1 + 1.5*2^-24 gives 1, 1 - 1.25*2^-24 gives 1 - 2^-24 and 1 + 1.5*2^-23
 * gives 1 + 2^-23; as Fasi, Higham, Mikaitis and Pranesh found on earlier tensor cores ("Numerical behavior of NVIDIA
 * tensor cores", PeerJ CS 2021). A long sum kept in the accumulator so loses up to an ulp per instruction, always
 * toward zero (on the H200 an output accumulated over 32768 keys came out at 3.9x the fp32 tolerance; README
 * "Precision"). Modelled without fp64: the truncation by clearing bits, an exact sum by TwoSum, and one ulp toward zero
 * where rounding to nearest took it away from zero. Non-finite sums as in fp32. */
/* x toward zero to a multiple of 2^eg: its significand's bits below 2^eg cleared (0 where |x| < 2^eg) */
inline float trunc_below(float x, int eg)
{
    const uint u = as_uint(x);
    const int drop = eg - ((int)(u >> 23 & 0xffu) - 127) + 23; /* significand bits below 2^eg */
    return drop <= 0 ? x : drop >= 24 ? as_float(u & 0x80000000u) : as_float(u & ~((1u << drop) - 1u));
}
inline float dot_rz(const float *a, const float *b, uint n, float c)
{
    float plain = c, big = fabs(c);
    for (uint k = 0; k < n; k++) plain = fma(a[k], b[k], plain), big = fmax(big, fabs(a[k] * b[k]));
    if (!isfinite(plain)) return plain;
    const int eb = (int)(as_uint(big) >> 23) - 127; /* the largest addend's exponent (-127: 0 or subnormal) */
    float s = 0.0f, err = 0.0f;
    for (uint k = 0; k <= n; k++) {
        float p = k < n ? a[k] * b[k] : c;
        if (eb > -100) p = trunc_below(p, eb - 24); /* to half the largest addend's ulp */
        const float u = s + p, bb = u - s;
        err += (s - (u - bb)) + (p - bb);
        s = u;
    }
    const float r = s + err, rest = (s - r) + err; /* r + rest = s + err (|s| >= |err|) */
    return rest != 0.0f && r != 0.0f && (rest < 0.0f) != (r < 0.0f) ? nextafter(r, 0.0f) : r;
}
/* one m16n8k8 product's D element: c + row r of A (at xa) times column c of B (its transpose's row, at xb) */
inline float dot8_rz(__local const float *xa, __local const float *xb, float c)
{
    float a[8], b[8];
    #pragma unroll
    for (uint k = 0; k < 8; k++) a[k] = xa[k], b[k] = xb[k];
    return dot_rz(a, b, 8, c);
}
/* every D element the lane holds of blocks 0 .. count-1: row g or g + 8, column 2t or 2t + 1, one dot_rz per
 * instruction as the native ones go: the small terms to dc (which may be d), then hi*hi to d. add: each block's
 * product on its own (from 0) and then added to d in fp32, as mma_block_add */
inline void mma_row_end_emul(float (*d)[4], float (*dc)[4], uint count, __local float *xs, uint lane, int add)
{
    const uint g = lane >> 2, t = lane & 3;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint n = 0; n < count; n++) {
        __local const float *xb = xs + XA + XB * n;
        #pragma unroll
        for (uint e = 0; e < 4; e++) {
            const uint r = g + 8 * (e >> 1), c = 2 * t + (e & 1);
            float acc = add ? 0.0f : dc[n][e];
#if !TF32
            acc = dot8_rz(xs + 128 + 8 * r, xb + 8 * c, acc);
            acc = dot8_rz(xs + 8 * r, xb + 64 + 8 * c, acc);
            if (!add) dc[n][e] = acc, acc = d[n][e];
#else
            (void)dc;
            if (!add) acc = d[n][e];
#endif
            acc = dot8_rz(xs + 8 * r, xb + 8 * c, acc);
            d[n][e] = add ? d[n][e] + acc : acc;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#define mma_row_end(d, dc, count, xs, lane) mma_row_end_emul((d), (dc), (count), (xs), (lane), 0)
#define mma_block_add(d, ah, al, bh, bl, n, xs, lane) mma_block((d), (d), (ah), (al), (bh), (bl), (n), (xs), (lane))
#define mma_row_end_add(d, count, xs, lane) mma_row_end_emul((d), (d), (count), (xs), (lane), 1)
#endif

/* The max (op 0) or sum (op 1) of a and of b across the lane's quad (the four lanes of a row). */
inline float2 quad_reduce(float a, float b, int op, __local float *xs, uint lane)
{
#if MMA_NATIVE
    (void)xs;
    (void)lane;
    for (uint m = 1; m <= 2; m <<= 1) {
        const float oa = shfl_xor(a, m), ob = shfl_xor(b, m);
        a = op ? a + oa : fmax(a, oa);
        b = op ? b + ob : fmax(b, ob);
    }
    return (float2)(a, b);
#else
    xs[2 * lane] = a;
    xs[2 * lane + 1] = b;
    barrier(CLK_LOCAL_MEM_FENCE);
    /* the butterfly's order: (l ^ 0 with l ^ 1), then with the other pair */
    const uint q = lane & ~3u;
    const uint l = lane & 3;
    float ra, rb;
    if (op) {
        ra = (xs[2 * (q + (l & 2))] + xs[2 * (q + (l & 2) + 1)]) + (xs[2 * (q + (l & 2 ^ 2))] + xs[2 * (q + (l & 2 ^ 2) + 1)]);
        rb = (xs[2 * (q + (l & 2)) + 1] + xs[2 * (q + (l & 2) + 1) + 1]) +
             (xs[2 * (q + (l & 2 ^ 2)) + 1] + xs[2 * (q + (l & 2 ^ 2) + 1) + 1]);
    } else {
        ra = fmax(fmax(xs[2 * q], xs[2 * q + 2]), fmax(xs[2 * q + 4], xs[2 * q + 6]));
        rb = fmax(fmax(xs[2 * q + 1], xs[2 * q + 3]), fmax(xs[2 * q + 5], xs[2 * q + 7]));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return (float2)(ra, rb);
#endif
}

/* a tile's accumulators of P V (OT): zeroed before its products, added to O after them */
inline void tile_zero(float (*t)[4])
{
    #pragma unroll
    for (uint c = 0; c < NVB; c++) t[c][0] = t[c][1] = t[c][2] = t[c][3] = 0.0f;
}
inline void tile_add(float (*o)[4], float (*t)[4])
{
    #pragma unroll
    for (uint c = 0; c < NVB; c++) o[c][0] += t[c][0], o[c][1] += t[c][1], o[c][2] += t[c][2], o[c][3] += t[c][3];
}

/* ---- HMMA: mma.m16n8k16 on 16-bit values (four A registers, two B, each two values: the lower half the lower k), and
 * the packing of two weights into a register */
#if HMMA
#if BK % 16
#error "HMMA takes tiles of a multiple of 16 keys"
#endif
#if IO_DTYPE == 2
#define HTY "bf16"
#else
#define HTY "f16"
#endif
/* lo and hi rounded to the type (nearest even), lo in the lower half: cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32, whose
 * first source goes to the upper half */
inline uint pack2(float lo, float hi)
{
#if MMA_NATIVE
    uint r;
    asm("cvt.rn." HTY "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#elif IO_DTYPE == 2
    return (uint)clattn_bf16(lo) | (uint)clattn_bf16(hi) << 16;
#else
    return (uint)clattn_half_bits(lo) | (uint)clattn_half_bits(hi) << 16;
#endif
}
/* columns c and c + 1 of a row of 16-bit values as one register (zero past the head) */
inline uint hpair(__global const ushort *row, uint c, uint n)
{
    return (uint)(c < n ? row[c] : 0) | (uint)(c + 1 < n ? row[c + 1] : 0) << 16;
}
/* Eight consecutive 16-bit values of a tile row to local memory at dst (16-byte aligned): src[0..7] where the key is
 * valid (ok) and the column within the head (e < left), else 0. ALIGNED (the host's choice, flash.c): src is 16-byte
 * aligned and the head a multiple of 8 (left is 0 or at least 8): one 16-byte load. */
#ifndef ALIGNED
#define ALIGNED 0
#endif
inline uint4 load8h(__global const ushort *src, int ok, int left)
{
#if ALIGNED
    return ok && left > 0 ? *(__global const uint4 *)src : (uint4)(0u);
#else
    ushort8 x;
    x.s0 = ok && 0 < left ? src[0] : 0;
    x.s1 = ok && 1 < left ? src[1] : 0;
    x.s2 = ok && 2 < left ? src[2] : 0;
    x.s3 = ok && 3 < left ? src[3] : 0;
    x.s4 = ok && 4 < left ? src[4] : 0;
    x.s5 = ok && 5 < left ? src[5] : 0;
    x.s6 = ok && 6 < left ? src[6] : 0;
    x.s7 = ok && 7 < left ? src[7] : 0;
    return as_uint4(x);
#endif
}
inline void stage8h(__local uint *dst, __global const ushort *src, int ok, int left)
{
    *(__local uint4 *)dst = load8h(src, ok, left); /* 16-byte aligned: one 128-bit store */
}
/* PF: a work-item's share of a tile's K (V) rows, NKL (NVL) 16-byte pieces: piece i is x = i*WGS + lid of the tile, row
 * x / (DKP/8), columns x % (DKP/8) * 8 .. + 7 (the staging loop's order) */
#define NKL ((BK * DKP / 8 + WGS - 1) / WGS)
#define NVL ((BK * DVP / 8 + WGS - 1) / WGS)
#define PIECE_K(x) ((BK * DKP / 8) % WGS == 0 || (x) < BK * DKP / 8)
#define PIECE_V(x) ((BK * DVP / 8) % WGS == 0 || (x) < BK * DVP / 8)
#if PF
/* The work-item's pieces of the tile of keys j0 .. j0+BK-1 (kb, vb: its (b, KV head)'s first rows), 0 past jend */
inline void pf_load(uint4 *kr, uint4 *vr, __global const ushort *kb, uint k_ld, __global const ushort *vb, uint v_ld,
                    uint j0, uint jend, uint lid)
{
    #pragma unroll
    for (uint i = 0; i < NKL; i++) {
        const uint x = i * WGS + lid, jj = x / (DKP / 8), c = x % (DKP / 8) * 8;
        kr[i] = PIECE_K(x) ? load8h(kb + (ulong)(j0 + jj) * k_ld + c, j0 + jj < jend, (int)DK - (int)c) : (uint4)(0u);
    }
    #pragma unroll
    for (uint i = 0; i < NVL; i++) {
        const uint x = i * WGS + lid, jj = x / (DVP / 8), c = x % (DVP / 8) * 8;
        vr[i] = PIECE_V(x) ? load8h(vb + (ulong)(j0 + jj) * v_ld + c, j0 + jj < jend, (int)DV - (int)c) : (uint4)(0u);
    }
}
#endif
#if MMA_NATIVE
inline void mma16_block(float *d, const uint *a, const uint *b, uint n, __local float *xs, uint lane)
{
    (void)n, (void)xs, (void)lane;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." HTY "." HTY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#define mma16_row_end(d, count, xs, lane) ((void)0)
/* d += A B as a product of its own, then added in fp32 (mma_block_add) */
inline void mma16_block_add(float *d, const uint *a, const uint *b, uint n, __local float *xs, uint lane)
{
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma16_block(p, a, b, n, xs, lane);
    d[0] += p[0], d[1] += p[1], d[2] += p[2], d[3] += p[3];
}
#define mma16_row_end_add(d, count, xs, lane) ((void)0)
#else
inline float hvalue(uint h)
{
#if IO_DTYPE == 2
    return clattn_bf16_value((ushort)h);
#else
    return clattn_half_value((ushort)h);
#endif
}
/* The emulation, as mma_block: A widened to 16 x 16 floats, row-major, at xs[0..256) (with block 0), block n's B as
 * its transpose [n][k] (8 x 16) at xs[256 + 128 n ...); mma16_row_end sums each D element's 16 products in k order */
inline void mma16_block(float *d, const uint *a, const uint *b, uint n, __local float *xs, uint lane)
{
    (void)d;
    const uint g = lane >> 2, t = lane & 3;
    if (n == 0) {
        #pragma unroll
        for (uint e = 0; e < 4; e++) {
            __local float *at = xs + (g + 8 * (e & 1)) * 16 + 2 * t + 8 * (e >> 1); /* a0 a1 a2 a3 */
            at[0] = hvalue(a[e] & 0xFFFFu);
            at[1] = hvalue(a[e] >> 16);
        }
    }
    __local float *xb = xs + XA + XB * n + g * 16 + 2 * t;
    xb[0] = hvalue(b[0] & 0xFFFFu);
    xb[1] = hvalue(b[0] >> 16);
    xb[8] = hvalue(b[1] & 0xFFFFu);
    xb[9] = hvalue(b[1] >> 16);
}
inline void mma16_row_end_emul(float (*d)[4], uint count, __local float *xs, uint lane, int add)
{
    const uint g = lane >> 2, t = lane & 3;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint n = 0; n < count; n++) {
        __local const float *xb = xs + XA + XB * n;
        #pragma unroll
        for (uint e = 0; e < 4; e++) {
            const uint r = g + 8 * (e >> 1), c = 2 * t + (e & 1);
            float a[16], bv[16];
            #pragma unroll
            for (uint k = 0; k < 16; k++) a[k] = xs[16 * r + k], bv[k] = xb[16 * c + k];
            const float acc = dot_rz(a, bv, 16, add ? 0.0f : d[n][e]); /* one instruction: one rounding */
            d[n][e] = add ? d[n][e] + acc : acc;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#define mma16_row_end(d, count, xs, lane) mma16_row_end_emul((d), (count), (xs), (lane), 0)
#define mma16_block_add mma16_block
#define mma16_row_end_add(d, count, xs, lane) mma16_row_end_emul((d), (count), (xs), (lane), 1)
#endif
/* the value column of element e of output block c: 16-column chunks shared by blocks 2w and 2w + 1 */
#define OCOL(c, e) (16 * ((c) >> 1) + 4 * t + 2 * ((e) & 1) + ((c) & 1))
#else
#define OCOL(c, e) (8 * (c) + 2 * t + ((e) & 1))
#endif
/* dropout's 1/(1 - p): on each weight, or with HMMA on the output (the weights are rounded in [0, 1]) */
#if HMMA && DROPOUT
#define P_KEEP 1.0f
#define O_KEEP keep_scale
#else
#define P_KEEP keep_scale
#define O_KEEP 1.0f
#endif

/* One work-group: query rows i0 .. i0+BQ-1 of (b, h); work-group id = ((b*H + h) * nblk + block')*SPLIT +
 * part + extent, block' counting from the last block under CAUSAL. Every loop bound and branch around a
 * barrier or an mma depends only on the work-group. */
__kernel __attribute__((reqd_work_group_size(WGS, 1, 1)))
void flash_mma(FLASH_ARGS)
{
#if HMMA
    __local uint ks[BK * KLDW] __attribute__((aligned(16))); /* the 16-bit values, two to a word */
    __local uint vs[BK * VLDW] __attribute__((aligned(16)));
#if !QREG
    __local uint qs[BQ * QLDW] __attribute__((aligned(16)));
#endif
#else
    __local float ks[BK * KLD] __attribute__((aligned(16))); /* PS: the high parts (rna), else the values */
    __local float vs[BK * VLD] __attribute__((aligned(16)));
#if KV_LO
    __local float kls[BK * KLD] __attribute__((aligned(16))); /* the low parts */
    __local float vls[BK * VLD] __attribute__((aligned(16)));
#endif
#if !QREG
    __local float qs[BQ * QLD]; /* PS: the high parts (rna), else the values */
#if KV_LO
    __local float qls[BQ * QLD]; /* the low parts */
#endif
#endif
#endif
#if MMA_NATIVE
    __local float *xs = NULL;
#else
    __local float xch[NW * XCH];
#endif
    const uint lid = get_local_id(0);
    const uint warp = lid / 32, lane = lid % 32, g = lane >> 2, t = lane & 3;
#if !MMA_NATIVE
    __local float *xs = xch + warp * XCH;
#endif
    const flash_block blkd = flash_block_of(extent + get_group_id(0), BQ, BK, Tq, Tk, H);
    const ulong b = blkd.b;
    const uint h = blkd.h, i0 = blkd.i0;
#if SPLIT > 1
    const uint part = blkd.part;
#endif
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, h, H, Tq, Tk);
    const float scale2 = scale * LOG2E;
    /* this lane's two rows (rows past Tq compute with the last row and are never written) */
    const uint r0 = i0 + warp * 16 + g, r1 = r0 + 8;
    const uint i_0 = min(r0, Tq - 1), i_1 = min(r1, Tq - 1);
    __global const io_t *q0 = q + q_off + (b * Tq + i_0) * q_ld + (ulong)h * DK;
    __global const io_t *q1 = q + q_off + (b * Tq + i_1) * q_ld + (ulong)h * DK;

#if HMMA
    /* Q's 16-bit values: chunk c's a0, a1, a2, a3 = rows r0, r1 at columns 16c + 4t, + 1, then rows r0, r1 at + 2, + 3 */
#if QREG
    uint qf[NKC][4];
    #pragma unroll
    for (uint c = 0; c < NKC; c++) {
        const uint c0 = 16 * c + 4 * t;
        qf[c][0] = hpair((__global const ushort *)q0, c0, DK);
        qf[c][1] = hpair((__global const ushort *)q1, c0, DK);
        qf[c][2] = hpair((__global const ushort *)q0, c0 + 2, DK);
        qf[c][3] = hpair((__global const ushort *)q1, c0 + 2, DK);
    }
#else
    for (uint x = lid; x < BQ * DKP / 2; x += WGS) {
        const uint rr = x / (DKP / 2), w = x % (DKP / 2);
        const uint ii = min(i0 + rr, Tq - 1);
        qs[rr * QLDW + w] = hpair((__global const ushort *)(q + q_off + (b * Tq + ii) * q_ld + (ulong)h * DK), 2 * w, DK);
    }
    __local const uint *qme = qs + (warp * 16 + g) * QLDW + 2 * t;
#endif
#elif QREG
    /* the lane's Q fragments, read once: chunk c holds (g, 8c+t), (g+8, 8c+t), (g, 8c+t+4), (g+8, 8c+t+4) */
    float qh[NKC][4], ql[NKC][4]; /* high and low parts (the low ones unused in TF32 mode) */
    #pragma unroll
    for (uint c = 0; c < NKC; c++) {
        const uint c0 = 8 * c + t, c1 = c0 + 4;
        tf32_split(c0 < DK ? IO_LOAD(c0, q0) : 0.0f, &qh[c][0], &ql[c][0]);
        tf32_split(c0 < DK ? IO_LOAD(c0, q1) : 0.0f, &qh[c][1], &ql[c][1]);
        tf32_split(c1 < DK ? IO_LOAD(c1, q0) : 0.0f, &qh[c][2], &ql[c][2]);
        tf32_split(c1 < DK ? IO_LOAD(c1, q1) : 0.0f, &qh[c][3], &ql[c][3]);
    }
#else
    for (uint x = lid; x < BQ * DKP; x += WGS) {
        const uint rr = x / DKP, c = x % DKP;
        const uint ii = min(i0 + rr, Tq - 1);
        const float qv = c < DK ? IO_LOAD(q_off + (b * Tq + ii) * q_ld + (ulong)h * DK + c, q) : 0.0f;
#if PS
        float hi, lo;
        tf32_split(qv, &hi, &lo);
        qs[rr * QLD + c] = hi;
#if KV_LO
        qls[rr * QLD + c] = lo;
#endif
#else
        qs[rr * QLD + c] = qv;
#endif
    }
    __local const float *qme = qs + (warp * 16 + g) * QLD + t;
#if KV_LO
    __local const float *qlme = qls + (warp * 16 + g) * QLD + t;
#endif
#endif
    float o[NVB][4];
    #pragma unroll
    for (uint n = 0; n < NVB; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f}; /* rows r0 and r1 */

    const uint jbeg = blkd.jbeg, jend = blkd.jend;
    __global const io_t *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const io_t *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
#if HMMA
    /* the lane's corners of the tiles (words): B of S at key 8n + g, columns 16c + 4t ..; B of P V at key 2t, columns
     * 16w + 2g, + 1 */
    __local const uint *kme = ks + g * KLDW + 2 * t;
    __local const uint *vme = vs + 2 * t * VLDW + g;
#else
    /* the lane's corners of the tiles: B of S at key 8n + g, column 8c + t; B of P V at key 2t, column g */
    __local const float *kme = ks + g * KLD + t;
    __local const float *vme = vs + 2 * t * VLD + g;
#if KV_LO
    __local const float *klme = kls + g * KLD + t;
    __local const float *vlme = vls + 2 * t * VLD + g;
#endif
#endif

#if PF
    /* the first tile's pieces (a block with no key loads nothing: jbeg = jend) */
    uint4 kr[NKL], vr[NVL];
    pf_load(kr, vr, (__global const ushort *)kb, k_ld, (__global const ushort *)vb, v_ld, jbeg, jend, lid);
#endif
    for (uint j0 = jbeg; j0 < jend; j0 += BK) {
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's reads are done (and the Q block is in) */
#if PF
        /* this tile's pieces to local memory, then the next tile's loads, in flight during this tile's products */
        #pragma unroll
        for (uint i = 0; i < NKL; i++) {
            const uint x = i * WGS + lid, jj = x / (DKP / 8), c = x % (DKP / 8) * 8;
            if (PIECE_K(x)) *(__local uint4 *)(ks + jj * KLDW + c / 2) = kr[i];
        }
        #pragma unroll
        for (uint i = 0; i < NVL; i++) {
            const uint x = i * WGS + lid, jj = x / (DVP / 8), c = x % (DVP / 8) * 8;
            if (PIECE_V(x)) *(__local uint4 *)(vs + jj * VLDW + c / 2) = vr[i];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* the next tile (none past jend: every load there is masked to 0) */
        pf_load(kr, vr, (__global const ushort *)kb, k_ld, (__global const ushort *)vb, v_ld, j0 + BK, jend, lid);
#elif HMMA
        STAGE_LOOP
        for (uint x0 = 0; x0 < BK * DKP / 8; x0 += WGS) {
            const uint x = x0 + lid, jj = x / (DKP / 8), c = x % (DKP / 8) * 8;
            if ((BK * DKP / 8) % WGS == 0 || x < BK * DKP / 8)
                stage8h(ks + jj * KLDW + c / 2, (__global const ushort *)(kb + (ulong)(j0 + jj) * k_ld + c),
                        j0 + jj < jend, (int)DK - (int)c);
        }
        STAGE_LOOP
        for (uint x0 = 0; x0 < BK * DVP / 8; x0 += WGS) {
            const uint x = x0 + lid, jj = x / (DVP / 8), c = x % (DVP / 8) * 8;
            if ((BK * DVP / 8) % WGS == 0 || x < BK * DVP / 8)
                stage8h(vs + jj * VLDW + c / 2, (__global const ushort *)(vb + (ulong)(j0 + jj) * v_ld + c),
                        j0 + jj < jend, (int)DV - (int)c);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
#if HMMA

        /* S (16 x BK per warp) = Q K^T, 16 head columns at a time */
        float s[NSB][4];
        #pragma unroll
        for (uint n = 0; n < NSB; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        MMA_LOOP
        for (uint c = 0; c < NKC; c++) {
#if QREG
            const uint a[4] = {qf[c][0], qf[c][1], qf[c][2], qf[c][3]};
#else
            /* 8-byte aligned words (QLDW a multiple of 8, 2t even): 64-bit reads, not vload2's 32-bit pairs */
            const uint2 w0 = *(__local const uint2 *)(qme + 8 * c), w1 = *(__local const uint2 *)(qme + 8 * QLDW + 8 * c);
            const uint a[4] = {w0.x, w1.x, w0.y, w1.y};
#endif
            MMA_LOOP
            for (uint n = 0; n < NSB; n++) {
                const uint2 kw = *(__local const uint2 *)(kme + 8 * n * KLDW + 8 * c); /* one 64-bit read (aligned) */
                const uint bb[2] = {kw.x, kw.y};
                mma16_block(s[n], a, bb, n, xs, lane);
            }
            mma16_row_end(s, NSB, xs, lane);
        }
#else
        STAGE_LOOP
        for (uint x0 = 0; x0 < BK * DKP / 4; x0 += WGS) {
            const uint x = x0 + lid, jj = x / (DKP / 4), c = x % (DKP / 4) * 4;
            if ((BK * DKP / 4) % WGS == 0 || x < BK * DKP / 4)
                stage4(ks, KV_LO_OR(kls, ks), jj * KLD + c, kb + (ulong)(j0 + jj) * k_ld + c, j0 + jj < jend, (int)DK - (int)c, 0);
        }
        STAGE_LOOP
        for (uint x0 = 0; x0 < BK * DVP / 4; x0 += WGS) {
            const uint x = x0 + lid, jj = x / (DVP / 4), c = x % (DVP / 4) * 4;
            if ((BK * DVP / 4) % WGS == 0 || x < BK * DVP / 4)
                stage4(vs, KV_LO_OR(vls, vs), jj * VLD + c, vb + (ulong)(j0 + jj) * v_ld + c, j0 + jj < jend, (int)DV - (int)c, 1);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* S (16 x BK per warp) = Q K^T, head chunk by head chunk; the small terms in sc (3xTF32) */
        float s[NSB][4], sc[NSB][4];
        #pragma unroll
        for (uint n = 0; n < NSB; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        }
        MMA_LOOP
        for (uint c = 0; c < NKC; c++) {
            float ah[4], al[4];
#if QREG
            #pragma unroll
            for (uint e = 0; e < 4; e++) ah[e] = qh[c][e], al[e] = ql[c][e];
#else
            TILE_B(ah, al, qme, qlme, 8 * c, 8 * QLD + 8 * c);
            TILE_B(ah + 2, al + 2, qme, qlme, 8 * c + 4, 8 * QLD + 8 * c + 4);
#endif
            MMA_LOOP
            for (uint n = 0; n < NSB; n++) {
                float bh[2], bl[2];
                TILE_B(bh, bl, kme, klme, 8 * n * KLD + 8 * c, 8 * n * KLD + 8 * c + 4);
                mma_block(s[n], sc[n], ah, al, bh, bl, n, xs, lane);
            }
            mma_row_end(s, sc, NSB, xs, lane);
        }
#if !TF32
        /* the small terms where finite: an infinite operand made them inf or NaN, and its hi*hi the score */
        #pragma unroll
        for (uint n = 0; n < NSB; n++) {
            #pragma unroll
            for (uint e = 0; e < 4; e++) s[n][e] += isfinite(sc[n][e]) ? sc[n][e] : 0.0f;
        }
#endif
#endif /* HMMA */

        /* scale, masks, the rows' maxima: element e of block n is row (e < 2 ? r0 : r1), key 8n + 2t + e%2 */
#if KPM || MASK_KIND || WINDOW
        const int edge = 1;
#elif CAUSAL
        const int edge = j0 + BK > jend || j0 + BK > i0 + 1;
#else
        const int edge = j0 + BK > jend;
#endif
        float pm0 = -FLT_MAX, pm1 = -FLT_MAX;
        #pragma unroll
        for (uint n = 0; n < NSB; n++) {
            #pragma unroll
            for (uint e = 0; e < 4; e++) {
                const uint j = j0 + 8 * n + 2 * t + (e & 1);
                if (edge)
                    s[n][e] = j < jend ? clattn_mask_score(s[n][e] * scale, e < 2 ? i_0 : i_1, j, b, Tk, kpm, mask) * LOG2E
                                       : -INFINITY;
                else
                    s[n][e] *= scale2;
            }
            pm0 = fmax(pm0, fmax(s[n][0], s[n][1]));
            pm1 = fmax(pm1, fmax(s[n][2], s[n][3]));
        }
        const float2 mx = quad_reduce(pm0, pm1, 0, xs, lane);
        /* the rows' new max: rescale the sums and outputs when it grows (fmax skips NaN: a NaN score comes
         * back through exp2 into the sum) */
        const float mn[2] = {mx.x, mx.y};
        #pragma unroll
        for (uint r = 0; r < 2; r++) {
            if (mn[r] > m[r]) {
                const float corr = clattn_exp2(m[r] - mn[r]);
                l[r] *= corr;
                #pragma unroll
                for (uint n = 0; n < NVB; n++) o[n][2 * r] *= corr, o[n][2 * r + 1] *= corr;
                m[r] = mn[r];
            }
        }
        /* the weights p = exp2(s - max), summed before dropout, applied after it */
        #pragma unroll
        for (uint n = 0; n < NSB; n++) {
            #pragma unroll
            for (uint e = 0; e < 4; e++) {
                const float p = clattn_exp2(s[n][e] - m[e >> 1]);
                l[e >> 1] += p;
                s[n][e] = flash_drop(p, seed_lo, seed_hi, (uint)b + drop_b0, h, e < 2 ? r0 : r1,
                                     j0 + 8 * n + 2 * t + (e & 1), threshold, P_KEEP);
            }
        }

#if HMMA
        /* O (16 x DV per warp) += P V, 16 keys at a time: A = the weights of score blocks 2m and 2m + 1, rounded; the
         * tile's sums from 0, added to O in fp32 (OT) */
#if OT
        float ot[NVB][4];
        tile_zero(ot);
#endif
        MMA_LOOP
        for (uint mm = 0; mm < BK / 16; mm++) {
            const uint a[4] = {pack2(s[2 * mm][0], s[2 * mm][1]), pack2(s[2 * mm][2], s[2 * mm][3]),
                               pack2(s[2 * mm + 1][0], s[2 * mm + 1][1]), pack2(s[2 * mm + 1][2], s[2 * mm + 1][3])};
            MMA_LOOP
            for (uint w = 0; w < DVP / 16; w++) {
                __local const uint *vw = vme + 16 * mm * VLDW + 8 * w; /* keys 2t, 2t + 1, 2t + 8, 2t + 9 */
                const uint w0 = vw[0], w1 = vw[VLDW], w2 = vw[8 * VLDW], w3 = vw[9 * VLDW];
                const uint blo[2] = {(w0 & 0xFFFFu) | w1 << 16, (w2 & 0xFFFFu) | w3 << 16};
                const uint bhi[2] = {w0 >> 16 | (w1 & 0xFFFF0000u), w2 >> 16 | (w3 & 0xFFFF0000u)};
#if OT
                mma16_block(ot[2 * w], a, blo, 2 * w, xs, lane);
                mma16_block(ot[2 * w + 1], a, bhi, 2 * w + 1, xs, lane);
#else
                mma16_block_add(o[2 * w], a, blo, 2 * w, xs, lane);
                mma16_block_add(o[2 * w + 1], a, bhi, 2 * w + 1, xs, lane);
#endif
            }
#if OT
            mma16_row_end(ot, NVB, xs, lane);
#else
            mma16_row_end_add(o, NVB, xs, lane);
#endif
        }
#if OT
        tile_add(o, ot);
#endif
#else
        /* O (16 x DV per warp) += P V, key block by key block: A = (c0, c2, c1, c3) of the block; the tile's sums from
         * 0, added to O in fp32 (OT) */
#if OT
        float ot[NVB][4];
        tile_zero(ot);
#endif
        MMA_LOOP
        for (uint n = 0; n < NSB; n++) {
            float ah[4], al[4];
            p_split(s[n][0], &ah[0], &al[0]);
            p_split(s[n][2], &ah[1], &al[1]);
            p_split(s[n][1], &ah[2], &al[2]);
            p_split(s[n][3], &ah[3], &al[3]);
            MMA_LOOP
            for (uint c = 0; c < NVB; c++) {
                float bh[2], bl[2];
                TILE_BV(bh, bl, vme, vlme, 8 * n * VLD + 8 * c, (8 * n + 1) * VLD + 8 * c);
#if OT
                mma_block(ot[c], ot[c], ah, al, bh, bl, c, xs, lane);
#else
                mma_block_add(o[c], ah, al, bh, bl, c, xs, lane);
#endif
            }
#if OT
            mma_row_end(ot, ot, NVB, xs, lane);
#else
            mma_row_end_add(o, NVB, xs, lane);
#endif
        }
#if OT
        tile_add(o, ot);
#endif
#endif
    }

    /* each row's sum across its quad, then o / l; element e of block c is row (e < 2 ? r0 : r1), column
     * 8c + 2t + e%2 */
    const float2 ls = quad_reduce(l[0], l[1], 1, xs, lane);
#if SPLIT > 1
    /* one part: the unnormalised output, the row's max (base 2) and sum, for split_combine */
    #pragma unroll
    for (uint e = 0; e < 4; e += 2) {
        const uint i = e < 2 ? r0 : r1;
        if (i >= Tq) continue;
        __global float *row = (__global float *)out + out_off + ((b * Tq + i) * SPLIT + part) * out_ld; /* ws */
        #pragma unroll
        for (uint c = 0; c < NVB; c++) {
            const uint col0 = OCOL(c, e), col1 = OCOL(c, e + 1);
            if (col0 < DV) row[(ulong)h * DV + col0] = o[c][e] * O_KEEP;
            if (col1 < DV) row[(ulong)h * DV + col1] = o[c][e + 1] * O_KEEP;
        }
        if (t == 0) row[H * DV + 2 * h] = m[e >> 1], row[H * DV + 2 * h + 1] = e < 2 ? ls.x : ls.y;
    }
#else
    #pragma unroll
    for (uint e = 0; e < 4; e += 2) {
        const uint i = e < 2 ? r0 : r1;
        if (i >= Tq) continue;
        const float lr = e < 2 ? ls.x : ls.y;
        if (t == 0) flash_lse(lse, lse_off, b, h, H, i, Tq, m[e >> 1], lr, 1);
        __global io_t *op = out + out_off + (b * Tq + i) * out_ld + (ulong)h * DV;
        const float inv = lr == 0.0f ? 0.0f : O_KEEP / lr; /* no visible key: 0; NaN stays NaN */
        #pragma unroll
        for (uint c = 0; c < NVB; c++) { /* (a half plan's type: rounded once) */
            const uint col0 = OCOL(c, e), col1 = OCOL(c, e + 1);
            if (col0 < DV) IO_STORE(lr == 0.0f ? 0.0f : o[c][e] * inv, col0, op);
            if (col1 < DV) IO_STORE(lr == 0.0f ? 0.0f : o[c][e + 1] * inv, col1, op);
        }
    }
#endif
}
