/* layernorm.cl: the encoder layer's residual add fused with LayerNorm.
 *
 * Rows of E values, one work-group of WG items per row:
 *   v_j   = (x_j + r_j) + bias_j          float additions in this order (the reference does the same)
 *   pass 1: mean of the row               work-group reduction in local memory
 *   pass 2: biased variance around it     second reduction, of (v_j - mean)^2
 *   pass 3: out_j = (v_j - mean) / sqrt(var + eps) * gamma_j + beta_j   (and sum_j = v_j)
 * Two passes, never the one-pass E[v^2] - E[v]^2, which loses every digit of
 * the variance when the row has a large common offset (1e4 + small noise).
 * For the same reason the mean is kept relative to the row's first value
 * (shift = v_0): pass 1 sums v_j - shift, which is exact when the values are
 * close to each other, and the mean itself is never rounded to a float at
 * the row's magnitude.
 *
 * Specialised by -D (defaults let the file compile alone):
 *   WG         work-group size, a power of two
 *   RESIDUAL   1: add r (the residual branch) to x
 *   HAS_BIAS   1: add bias (E), e.g. the feed-forward's second bias
 *   WRITE_SUM  1: also write v to sum_out (the pre-norm layer keeps the residual stream)
 *   CACHE_ROW  1: keep the row in local memory (`row`, E floats, given at launch);
 *              0: recompute v_j from global memory in each pass (rows too long for local memory)
 * Offsets count elements; 64-bit indices.
 */
#ifndef WG
#define WG 64
#endif
#ifndef RESIDUAL
#define RESIDUAL 1
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef WRITE_SUM
#define WRITE_SUM 0
#endif
#ifndef CACHE_ROW
#define CACHE_ROW 1
#endif

/* v_j of this row */
inline float row_value(__global const float *xr, __global const float *rr, __global const float *bias, uint j)
{
    float v = xr[j];
#if RESIDUAL
    v += rr[j];
#endif
#if HAS_BIAS
    v += bias[j];
#endif
    return v;
}

/* The sum of every item's v over the work-group, returned to every item. */
inline float group_sum(float v, __local float *part)
{
    const uint lid = get_local_id(0);
    part[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint stride = WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride) part[lid] += part[lid + stride];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = part[0];
    barrier(CLK_LOCAL_MEM_FENCE); /* part is reused by the next reduction */
    return total;
}

#if CACHE_ROW
#define VALUE(j) row[j]
#else
#define VALUE(j) row_value(xr, rr, bias, j)
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void residual_layernorm(__global const float *x, ulong x_off,
                        __global const float *r, ulong r_off,
                        __global const float *bias,
                        __global const float *gamma, __global const float *beta,
                        __global float *sum_out, ulong sum_off,
                        __global float *out, ulong out_off,
                        uint E, float eps, __local float *row)
{
    __local float part[WG];
    const uint lid = get_local_id(0);
    const ulong base = (ulong)get_group_id(0) * E;
    __global const float *xr = x + x_off + base;
#if RESIDUAL
    __global const float *rr = r + r_off + base;
#else
    __global const float *rr = xr; /* unused */
#endif

#if CACHE_ROW
    for (uint j = lid; j < E; j += WG) row[j] = row_value(xr, rr, bias, j);
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    const float shift = VALUE(0);

    /* pass 1: the mean, as shift + mean_d */
    float acc = 0.0f;
    for (uint j = lid; j < E; j += WG) acc += VALUE(j) - shift;
    const float mean_d = group_sum(acc, part) / (float)E;

    /* pass 2: the biased variance around the mean */
    acc = 0.0f;
    for (uint j = lid; j < E; j += WG) {
        const float c = (VALUE(j) - shift) - mean_d;
        acc += c * c;
    }
    const float rstd = 1.0f / sqrt(group_sum(acc, part) / (float)E + eps);

    /* pass 3: normalise, scale and shift */
    for (uint j = lid; j < E; j += WG) {
        const float v = VALUE(j);
        out[out_off + base + j] = ((v - shift) - mean_d) * rstd * gamma[j] + beta[j];
#if WRITE_SUM
        sum_out[sum_off + base + j] = v;
#endif
    }
}
