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

/* linear_gemv: the same y = x W^T (+ bias) for m <= GV_MAXR rows on a GPU, where linear_small's work-items
 * (one weight row each, read along k) would read addresses k apart and stream the weights at a few percent
 * of the memory's bandwidth. A work-group of GV_WG work-items is GV_WG / GV_LK column groups of GV_LK lanes;
 * a column group owns GV_COLS consecutive output columns, and its lanes split k: lane l reads the float4s
 * l, l + GV_LK, ... of each of its weight rows, so that the lanes of a group read consecutive addresses.
 * Every row of x is served from that one read of the weights (m guarded, not looped), and each x vector
 * loaded serves GV_COLS columns. The lanes' partial sums (GV_MAXR x GV_COLS per work-item) are reduced in
 * local memory at the end. Launched with ceil(n / (GV_COLS * GV_WG / GV_LK)) work-groups. */
#ifndef GV_WG
#define GV_WG 64
#endif
#ifndef GV_LK
#define GV_LK 32
#endif
#ifndef GV_COLS
#define GV_COLS 4
#endif
#ifndef GV_MAXR
#define GV_MAXR 16
#endif
#define GV_GROUPS (GV_WG / GV_LK)

__kernel __attribute__((reqd_work_group_size(GV_WG, 1, 1)))
void linear_gemv(__global const float *x, ulong x_off, uint ldx,
                 __global const float *w, __global const float *bias, uint has_bias,
                 __global float *y, ulong y_off, uint ldy, uint m, uint n, uint k)
{
    __local float red[GV_WG * GV_MAXR * GV_COLS];
    if (n == 0) return; /* the warm-up launch: no work (the whole work-group together) */
    const uint lid = get_local_id(0), lane = lid % GV_LK, cg = lid / GV_LK;
    const uint o0 = (get_group_id(0) * GV_GROUPS + cg) * GV_COLS;
    __global const float *xb = x + x_off;
    __global const float *wr[GV_COLS];
    #pragma unroll
    for (uint i = 0; i < GV_COLS; i++) wr[i] = w + (ulong)min(o0 + i, n - 1) * k; /* past n: a valid row, unused */
    float acc[GV_MAXR][GV_COLS];
    #pragma unroll
    for (uint r = 0; r < GV_MAXR; r++) {
        #pragma unroll
        for (uint i = 0; i < GV_COLS; i++) acc[r][i] = 0.0f;
    }
    const uint kv = k / 4;
    for (uint c = lane; c < kv; c += GV_LK) {
        float4 wv[GV_COLS];
        #pragma unroll
        for (uint i = 0; i < GV_COLS; i++) wv[i] = vload4(c, wr[i]);
        #pragma unroll
        for (uint r = 0; r < GV_MAXR; r++) {
            if (r < m) {
                const float4 xv = vload4(c, xb + (ulong)r * ldx);
                #pragma unroll
                for (uint i = 0; i < GV_COLS; i++) {
                    float a = fma(xv.x, wv[i].x, acc[r][i]);
                    a = fma(xv.y, wv[i].y, a);
                    a = fma(xv.z, wv[i].z, a);
                    acc[r][i] = fma(xv.w, wv[i].w, a);
                }
            }
        }
    }
    for (uint c = kv * 4 + lane; c < k; c += GV_LK) { /* k % 4 tail */
        #pragma unroll
        for (uint r = 0; r < GV_MAXR; r++) {
            if (r < m) {
                const float xs = xb[(ulong)r * ldx + c];
                #pragma unroll
                for (uint i = 0; i < GV_COLS; i++) acc[r][i] = fma(xs, wr[i][c], acc[r][i]);
            }
        }
    }
    /* red[(cg * GV_MAXR + r) * GV_COLS + i][lane]: each (column, row) sum's lanes contiguous */
    #pragma unroll
    for (uint r = 0; r < GV_MAXR; r++) {
        #pragma unroll
        for (uint i = 0; i < GV_COLS; i++) red[((cg * GV_MAXR + r) * GV_COLS + i) * GV_LK + lane] = acc[r][i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint t = lid; t < GV_GROUPS * GV_MAXR * GV_COLS; t += GV_WG) {
        const uint i = t % GV_COLS, r = (t / GV_COLS) % GV_MAXR, g = t / (GV_COLS * GV_MAXR);
        const uint o = (get_group_id(0) * GV_GROUPS + g) * GV_COLS + i;
        if (r >= m || o >= n) continue;
        float sum = 0.0f;
        for (uint l = 0; l < GV_LK; l++) sum += red[t * GV_LK + l];
        y[y_off + (ulong)r * ldy + o] = sum + (has_bias ? bias[o] : 0.0f);
    }
}

/* dst (rows, cols) with row stride cols: every row = bias. Prepares C for a GEMM with beta = 1. */
__kernel void fill_rows(__global float *dst, ulong dst_off, __global const float *bias,
                        uint cols, ulong total)
{
    ulong g = get_global_id(0);
    if (g >= total) return;
    dst[dst_off + g] = bias[g % cols];
}

/* The projections' gradients (training plans, src/attention/shell_backward.c):
 * grad_colsum: dst[c] = sum of src's rows (rows, cols; row stride ld) in column c, CW neighbouring columns per
 * work-item (a bias's gradient, the sum of its output's gradient over the rows); with add, dst[c] + that sum (the
 * host cuts the rows into blocks where the device ends long loops: clattn_linear_colsum). CW 1 on GPUs (neighbours
 * read neighbours), 16 on CPUs (a row's 16 columns are one cache line, summed as one vector). */
#ifndef CW
#define CW 1
#endif
#if CW == 16
typedef float16 cw_t;
#define CW_LOAD(p) vload16(0, (p))
#define CW_STORE(x, p) vstore16((x), 0, (p))
#elif CW == 1
typedef float cw_t;
#define CW_LOAD(p) (*(p))
#define CW_STORE(x, p) (*(p) = (x))
#else
#error "grad_colsum: CW is 1 or 16"
#endif
/* Kahan: thousands of rows */
#define COLSUM_ADD(s, e, x) \
    do { \
        const cw_t y_ = (x) - (e), t_ = (s) + y_; \
        (e) = (t_ - (s)) - y_; \
        (s) = t_; \
    } while (0)
__kernel void grad_colsum(__global const float *src, ulong src_off, uint ld, ulong rows, uint cols,
                          __global float *dst, ulong dst_off, uint add)
{
    const uint c0 = get_global_id(0) * CW;
    if (c0 >= cols) return;
    __global const float *p = src + src_off + c0;
    __global float *o = dst + dst_off + c0;
    if (c0 + CW <= cols) {
        cw_t s = (cw_t)(0.0f), e = (cw_t)(0.0f);
        for (ulong r = 0; r < rows; r++) COLSUM_ADD(s, e, CW_LOAD(p + r * ld));
        CW_STORE(add ? CW_LOAD(o) + s : s, o);
        return;
    }
    for (uint c = 0; c < cols - c0; c++) { /* the last columns, one at a time */
        float s = 0.0f, e = 0.0f;
        for (ulong r = 0; r < rows; r++) {
            const float y = p[r * ld + c] - e, t = s + y;
            e = (t - s) - y;
            s = t;
        }
        o[c] = add ? o[c] + s : s;
    }
}

/* dst (rows, width; row stride dst_ld) = the sum of `blocks` column blocks of src (rows; row stride src_ld),
 * block b at column b*width: the gradient of an input read as several of the core's operands without
 * projections (self-attention: x is Q, K and V). One work-item per CW neighbouring elements of a row of dst
 * (grad_colsum's CW: one vector on CPUs; a row's last ones one at a time); total = rows * ceil(width / CW). */
__kernel void grad_sum_blocks(__global const float *src, ulong src_off, uint src_ld, uint blocks, uint width,
                              __global float *dst, ulong dst_off, uint dst_ld, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const uint chunks = (width + CW - 1) / CW;
    const ulong r = g / chunks;
    const uint c0 = (uint)(g % chunks) * CW;
    __global const float *p = src + src_off + r * src_ld + c0;
    __global float *o = dst + dst_off + r * dst_ld + c0;
    if (c0 + CW <= width) {
        cw_t s = (cw_t)(0.0f);
        for (uint b = 0; b < blocks; b++) s += CW_LOAD(p + (ulong)b * width);
        CW_STORE(s, o);
        return;
    }
    for (uint c = 0; c < width - c0; c++) {
        float s = 0.0f;
        for (uint b = 0; b < blocks; b++) s += p[(ulong)b * width + c];
        o[c] = s;
    }
}

/* Element types at a plan's boundary (desc.dtype F16 or BF16; clattn_linear_convert): the plan's inputs widened to
 * float where its kernels read them, its outputs narrowed from float where they are written. n elements from element
 * offsets; type 1: IEEE half, type 2: bfloat16 (common/half.cl and common/dtype.cl go first). */
__kernel void dtype_widen(__global const ushort *src, ulong src_off, __global float *dst, ulong dst_off, ulong n,
                          uint type)
{
    const ulong g = get_global_id(0);
    if (g >= n) return;
    dst[dst_off + g] = type == 1 ? vload_half(src_off + g, (__global const half *)src)
                                 : clattn_bf16_value(src[src_off + g]);
}

__kernel void dtype_narrow(__global const float *src, ulong src_off, __global ushort *dst, ulong dst_off, ulong n,
                           uint type)
{
    const ulong g = get_global_id(0);
    if (g >= n) return;
    const float f = src[src_off + g];
    if (type == 1) {
        vstore_half_rte(f, dst_off + g, (__global half *)dst);
        return;
    }
    dst[dst_off + g] = clattn_bf16(f);
}
