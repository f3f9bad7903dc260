/* linear.cl: the projections' own kernels (src/attention/linear.c).
 *   fill_rows      every row of a GEMM's C = the bias, for a GEMM with beta = 1 that adds x W^T to it
 *   linear_small   y (m, n) = x (m, k) W^T (+ bias) for a few rows m (decode steps, where a GEMM library pads
 * m to its tile and does dozens of times the work): one work-item per output column o, reading its weight
 * row W[o, :] (nn.Linear layout, contiguous) once for up to 8 rows of x at a time (passes of 8, then 4,
 * 2 and 1 rows: fixed counts whose accumulators stay in registers). Row strides ldx, ldy; offsets in
 * elements. Specialised by -D: VW (vector width along k: 8, 4 or 1). */
#ifndef VW
#define VW 1
#endif
#if VW == 8
typedef float8 lw_t;
#define LLOAD(i, p) vload8((i), (p))
inline float lsum(float8 v) { float4 t = v.lo + v.hi; float2 u = t.lo + t.hi; return u.x + u.y; }
#elif VW == 4
typedef float4 lw_t;
#define LLOAD(i, p) vload4((i), (p))
inline float lsum(float4 v) { float2 u = v.lo + v.hi; return u.x + u.y; }
#else
typedef float lw_t;
#define LLOAD(i, p) ((p)[(i)])
inline float lsum(float v) { return v; }
#endif

/* y[r0 .. r0+NR-1, o] for a fixed NR */
#define LINEAR_ROWS(NR)                                                                                     \
    inline void linear_rows##NR(__global const float *xb, uint ldx, __global const float *wr, uint k, float b,  \
                                __global float *yo, uint ldy)                                               \
    {                                                                                                       \
        lw_t acc[NR];                                                                                       \
        float tail[NR];                                                                                     \
        _Pragma("unroll") for (uint r = 0; r < NR; r++) acc[r] = (lw_t)(0.0f), tail[r] = 0.0f;              \
        const uint kv = k / VW;                                                                             \
        for (uint c = 0; c < kv; c++) {                                                                     \
            const lw_t wv = LLOAD(c, wr);                                                                   \
            _Pragma("unroll") for (uint r = 0; r < NR; r++)                                                 \
                acc[r] = fma(LLOAD(c, xb + (ulong)r * ldx), wv, acc[r]);                                    \
        }                                                                                                   \
        for (uint c = kv * VW; c < k; c++) {                                                                \
            _Pragma("unroll") for (uint r = 0; r < NR; r++)                                                 \
                tail[r] = fma(xb[(ulong)r * ldx + c], wr[c], tail[r]);                                      \
        }                                                                                                   \
        _Pragma("unroll") for (uint r = 0; r < NR; r++) yo[(ulong)r * ldy] = lsum(acc[r]) + tail[r] + b;     \
    }
LINEAR_ROWS(8)
LINEAR_ROWS(4)
LINEAR_ROWS(2)
LINEAR_ROWS(1)

__kernel void linear_small(__global const float *x, ulong x_off, uint ldx,
                           __global const float *w, __global const float *bias, uint has_bias,
                           __global float *y, ulong y_off, uint ldy, uint m, uint n, uint k)
{
    const uint o = get_global_id(0);
    if (o >= n) return;
    __global const float *wr = w + (ulong)o * k;
    const float b = has_bias ? bias[o] : 0.0f;
    __global const float *xb = x + x_off;
    __global float *yo = y + y_off + o;
    uint r = 0;
    for (; r + 8 <= m; r += 8) linear_rows8(xb + (ulong)r * ldx, ldx, wr, k, b, yo + (ulong)r * ldy, ldy);
    if (m - r >= 4) linear_rows4(xb + (ulong)r * ldx, ldx, wr, k, b, yo + (ulong)r * ldy, ldy), r += 4;
    if (m - r >= 2) linear_rows2(xb + (ulong)r * ldx, ldx, wr, k, b, yo + (ulong)r * ldy, ldy), r += 2;
    if (m - r >= 1) linear_rows1(xb + (ulong)r * ldx, ldx, wr, k, b, yo + (ulong)r * ldy, ldy);
}

/* dst (rows, cols) with row stride cols: every row = bias. Prepares C for a GEMM with beta = 1. */
__kernel void fill_rows(__global float *dst, ulong dst_off, __global const float *bias,
                        uint cols, ulong total)
{
    ulong g = get_global_id(0);
    if (g >= total) return;
    dst[dst_off + g] = bias[g % cols];
}
