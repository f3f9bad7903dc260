/* gemm_tiles.cl: the GEMM core for CPU devices (src/cores/gemm_tiles.c), C = alpha * op(A) op(B) + beta * C,
 * row-major, in the way a CPU BLAS works: both operands are first packed into panels (gemm_pack_a: MR rows of
 * op(A) side by side for each k; gemm_pack_b: NR columns of op(B) side by side for each k), so that the
 * micro-kernel streams each panel once, in order; then one work-item computes an MR x NR tile of C in registers
 * (MR * NV accumulators of VW floats), for QP column panels in turn while its row panel stays in the L1 cache.
 * Each k step loads NV vectors of B and broadcasts MR values of A: MR * NV fused multiply-adds per NV + MR
 * loads. The loop counts are compile-time constants, so the accumulators stay in registers (PoCL unrolls the
 * r and v loops; no private array is indexed at run time).
 *   MR   rows of a tile (and of an A panel)
 *   VW   vector width (4, 8, 16: the device's native float vector width)
 *   NV   vectors across a tile: NR = NV * VW columns (and of a B panel)
 *   QP   column panels per work-item
 * Work-items are numbered entry-major, then by group of QP column panels, then by row panel: consecutive
 * work-items (which a CPU runs one after another on one core) share their B panels, which stay in the L2
 * cache while the A panels stream. Sizes past the edges: packed panels are padded with zeros, so the
 * micro-kernel never branches; only the stores of edge tiles are guarded. beta = 0 never reads C.
 * A and B may hold F16 or BF16 (a half-precision plan's inputs and weights, read as they are: the pack kernels'
 * _f16 and _bf16 forms widen them exactly into the fp32 panels); C, the bias and the arithmetic are fp32.
 * common/half.cl goes first. */
#ifndef MR
#define MR 8
#endif
#ifndef VW
#define VW 16
#endif
#ifndef NV
#define NV 2
#endif
#ifndef QP
#define QP 4
#endif
#define NR (NV * VW)

#if VW == 16
typedef float16 gvec;
#define GLOAD(i, p) vload16((i), (p))
#define GSTORE(v, i, p) vstore16((v), (i), (p))
#elif VW == 8
typedef float8 gvec;
#define GLOAD(i, p) vload8((i), (p))
#define GSTORE(v, i, p) vstore8((v), (i), (p))
#elif VW == 4
typedef float4 gvec;
#define GLOAD(i, p) vload4((i), (p))
#define GSTORE(v, i, p) vstore4((v), (i), (p))
#else
#error "VW must be 4, 8 or 16"
#endif

/* Panels of P rows of a matrix X whose element (r, c) is x[x_off + e * xe + r * rs + c * cs], for rows
 * 0 .. R-1 and columns 0 .. KC-1 of each of the entries: panel p of entry e holds, for each column c, its P
 * rows side by side at dst[dst_off + e * de + p * KC * P + c * P]; rows past R are zeros. One work-item per (entry,
 * panel), `panels` panels per entry, `total` work-items. X's elements are of type T, read by LOAD(x, index) as
 * floats: float, or a half-precision plan's F16 (vload_half) or BF16 (a shift) widened exactly as they are packed,
 * so that the tiles see the very floats a widened copy would hold (the _f16 and _bf16 kernels). */
#define PACK_F32(p, i) ((p)[(i)])
#define PACK_F16(p, i) vload_half((i), (p))
#define PACK_BF16(p, i) clattn_bf16_value((p)[(i)])
#define GEMM_PACK(NAME, P, T, LOAD)                                                                               \
    __kernel void NAME(__global const T *x, ulong x_off, ulong rs, ulong cs, ulong xe, uint R, uint KC,          \
                       __global float *dst, ulong dst_off, ulong de, uint panels, ulong total)                    \
    {                                                                                                             \
        const ulong g = get_global_id(0);                                                                         \
        if (g >= total) return;                                                                                   \
        const ulong e = g / panels;                                                                               \
        const uint p = (uint)(g % panels), r0 = p * (P);                                                          \
        __global const T *src = x + x_off + e * xe + (ulong)r0 * rs;                                              \
        __global float *d = dst + dst_off + e * de + (ulong)p * KC * (P);                                         \
        const uint rows = min((uint)(P), R - r0);                                                                 \
        if (rows == (P)) {                                                                                        \
            for (uint c = 0; c < KC; c++) {                                                                       \
                _Pragma("unroll") for (uint r = 0; r < (P); r++) d[(ulong)c * (P) + r] = LOAD(src, r * rs + c * cs); \
            }                                                                                                     \
        } else {                                                                                                  \
            for (uint c = 0; c < KC; c++)                                                                         \
                for (uint r = 0; r < (P); r++) d[(ulong)c * (P) + r] = r < rows ? LOAD(src, r * rs + c * cs) : 0.0f; \
        }                                                                                                         \
    }

GEMM_PACK(gemm_pack_a, MR, float, PACK_F32)
GEMM_PACK(gemm_pack_b, NR, float, PACK_F32)
GEMM_PACK(gemm_pack_a_f16, MR, half, PACK_F16)
GEMM_PACK(gemm_pack_b_f16, NR, half, PACK_F16)
GEMM_PACK(gemm_pack_a_bf16, MR, ushort, PACK_BF16)
GEMM_PACK(gemm_pack_b_bf16, NR, ushort, PACK_BF16)

/* C (M, N) at c + c_off (+ e * ce per entry), row stride ldc, from the packed panels of one block: mp row panels
 * of A (ap + ap_off + e * ae) and np column panels of B (bp + bp_off + e * be), KC deep; plus, when has_bias, the
 * row bias[bias_off ...] (N) on every row. One work-item per (entry, group of QP column panels, row panel), `total`
 * in all. */
__kernel void gemm_tiles(__global const float *ap, ulong ap_off, ulong ae, __global const float *bp, ulong bp_off,
                         ulong be, __global float *c, ulong c_off, ulong ldc, ulong ce, uint M, uint N, uint KC,
                         float alpha, float beta, __global const float *bias, ulong bias_off, uint has_bias, uint mp,
                         uint np, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const uint groups = (np + QP - 1) / QP;
    const ulong per_entry = (ulong)mp * groups;
    const ulong e = g / per_entry;
    const uint rem = (uint)(g % per_entry), p = rem % mp, q0 = rem / mp * QP;
    __global const float *a = ap + ap_off + e * ae + (ulong)p * KC * MR;
    __global float *cb = c + c_off + e * ce;
    const uint i0 = p * MR;
    for (uint q = q0; q < q0 + QP && q < np; q++) {
        __global const float *b = bp + bp_off + e * be + (ulong)q * KC * NR;
        gvec acc[MR][NV];
        #pragma unroll
        for (uint r = 0; r < MR; r++)
            #pragma unroll
            for (uint v = 0; v < NV; v++) acc[r][v] = (gvec)(0.0f);
        for (uint k = 0; k < KC; k++) {
            gvec bv[NV];
            #pragma unroll
            for (uint v = 0; v < NV; v++) bv[v] = GLOAD(v, b + (ulong)k * NR);
            #pragma unroll
            for (uint r = 0; r < MR; r++) {
                const gvec av = (gvec)(a[(ulong)k * MR + r]);
                #pragma unroll
                for (uint v = 0; v < NV; v++) acc[r][v] = fma(av, bv[v], acc[r][v]);
            }
        }
        const uint j0 = q * NR;
        if (i0 + MR <= M && j0 + NR <= N) { /* a whole tile: vector stores */
            gvec bb[NV];
            #pragma unroll
            for (uint v = 0; v < NV; v++) bb[v] = has_bias ? GLOAD(v, bias + bias_off + j0) : (gvec)(0.0f);
            #pragma unroll
            for (uint r = 0; r < MR; r++) {
                __global float *cr = cb + (ulong)(i0 + r) * ldc + j0;
                #pragma unroll
                for (uint v = 0; v < NV; v++) {
                    gvec o = fma((gvec)(alpha), acc[r][v], bb[v]);
                    if (beta != 0.0f) o = fma((gvec)(beta), GLOAD(v, cr), o);
                    GSTORE(o, v, cr);
                }
            }
        } else { /* an edge tile: the elements inside C only */
            for (uint r = 0; r < MR && i0 + r < M; r++) {
                __global float *cr = cb + (ulong)(i0 + r) * ldc;
                for (uint v = 0; v < NV; v++) {
                    float t[VW];
                    GSTORE(acc[r][v], 0, t);
                    for (uint l = 0; l < VW; l++) {
                        const uint j = j0 + v * VW + l;
                        if (j >= N) continue;
                        float o = fma(alpha, t[l], has_bias ? bias[bias_off + j] : 0.0f);
                        if (beta != 0.0f) o = fma(beta, cr[j], o);
                        cr[j] = o;
                    }
                }
            }
        }
    }
}
