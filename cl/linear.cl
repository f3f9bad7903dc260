/* linear.cl: y (m, n) = x (m, k) W^T (+ bias) for a few rows m (decode steps, where a GEMM library pads
 * m to its tile and does dozens of times the work): one work-item per output column o, reading its weight
 * row W[o, :] (nn.Linear layout, contiguous) once for up to MB rows of x at a time. Row strides ldx, ldy;
 * offsets in elements. Specialised by -D: VW (vector width along k: 8, 4 or 1), MB (rows per pass). */
#ifndef VW
#define VW 1
#endif
#ifndef MB
#define MB 8
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

__kernel void linear_small(__global const float *x, ulong x_off, uint ldx,
                           __global const float *w, __global const float *bias, uint has_bias,
                           __global float *y, ulong y_off, uint ldy, uint m, uint n, uint k)
{
    const uint o = get_global_id(0);
    if (o >= n) return;
    __global const float *wr = w + (ulong)o * k;
    const uint kv = k / VW;
    for (uint r0 = 0; r0 < m; r0 += MB) {
        const uint nr = min((uint)MB, m - r0);
        lw_t acc[MB];
        float tail[MB];
        for (uint r = 0; r < MB; r++) acc[r] = (lw_t)(0.0f), tail[r] = 0.0f;
        __global const float *xb = x + x_off + (ulong)r0 * ldx;
        for (uint c = 0; c < kv; c++) {
            const lw_t wv = LLOAD(c, wr);
            for (uint r = 0; r < MB; r++)
                if (r < nr) acc[r] = fma(LLOAD(c, xb + (ulong)r * ldx), wv, acc[r]);
        }
        for (uint c = kv * VW; c < k; c++)
            for (uint r = 0; r < nr; r++) tail[r] = fma(xb[(ulong)r * ldx + c], wr[c], tail[r]);
        for (uint r = 0; r < nr; r++)
            y[y_off + (ulong)(r0 + r) * ldy + o] = lsum(acc[r]) + tail[r] + (has_bias ? bias[o] : 0.0f);
    }
}
