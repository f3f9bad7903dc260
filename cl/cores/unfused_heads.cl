/* unfused_heads.cl: the unfused core's reshuffles (src/cores/unfused.c): moving activations between the token-major layout the projections
 * produce, (B, T, H*D) rows of width `ld`, and the head-major layout the
 * batched GEMMs use, (B, H, T, D). Offsets count elements; 64-bit indices. */

/* dst (B, H, T, D) = src[b, t, col0 + (h/G)*D + d], rounded to half when round_half is 1,
 * to bfloat16 when it is 2 (kv_half: the KV cache's type; half.cl). G > 1: grouped-query keys/values, source head
 * h/G repeated for G heads.
 * One work-item per dst element. */
__kernel void split_heads(__global const float *src, ulong src_off, uint src_ld, uint col0,
                          __global float *dst, ulong dst_off,
                          uint T, uint H, uint D, uint G, uint round_half, ulong total)
{
    ulong g = get_global_id(0);
    if (g >= total) return;
    ulong n = g;
    uint d = (uint)(n % D); n /= D;
    uint t = (uint)(n % T); n /= T;
    uint hs = (uint)(n % H) / G;
    ulong b = n / H;
    const float v = src[src_off + (b * T + t) * (ulong)src_ld + col0 + (ulong)hs * D + d];
    dst[dst_off + g] = round_half == 2 ? clattn_round_bf16(v) : round_half ? clattn_round_half(v) : v;
}

/* The same split with one work-item per dst row (b, h, t): its D elements copied in float8 pieces, then one by one
 * (rounded ones one by one). For CPUs, where a work-item per element spends its time on the index divisions
 * (unfused.c's HEADS). rows = B*H*T. */
__kernel void split_heads_rows(__global const float *src, ulong src_off, uint src_ld, uint col0,
                               __global float *dst, ulong dst_off,
                               uint T, uint H, uint D, uint G, uint round_half, ulong rows)
{
    const ulong g = get_global_id(0);
    if (g >= rows) return;
    const uint t = (uint)(g % T);
    const ulong bh = g / T;
    const uint hs = (uint)(bh % H) / G;
    const ulong b = bh / H;
    __global const float *s = src + src_off + (b * T + t) * (ulong)src_ld + col0 + (ulong)hs * D;
    __global float *o = dst + dst_off + g * D;
    uint d = 0;
    for (; !round_half && d + 8 <= D; d += 8) vstore8(vload8(0, s + d), 0, o + d);
    for (; d < D; d++) o[d] = round_half == 2 ? clattn_round_bf16(s[d]) : round_half ? clattn_round_half(s[d]) : s[d];
}

/* dst[b, t, h*D + d] (rows of width H*D) = src (B, H, T, D). One work-item per dst element. */
__kernel void merge_heads(__global const float *src, ulong src_off,
                          __global float *dst, ulong dst_off,
                          uint T, uint H, uint D, ulong total)
{
    ulong g = get_global_id(0);
    if (g >= total) return;
    ulong n = g;
    uint d = (uint)(n % D); n /= D;
    uint h = (uint)(n % H); n /= H;
    uint t = (uint)(n % T);
    ulong b = n / T;
    dst[dst_off + g] = src[src_off + ((b * H + h) * T + t) * (ulong)D + d];
}

/* The same merge with one work-item per dst row segment (b, t, h) of D elements, in float8 pieces then one by
 * one (split_heads_rows' way). rows = B*T*H. */
__kernel void merge_heads_rows(__global const float *src, ulong src_off,
                               __global float *dst, ulong dst_off,
                               uint T, uint H, uint D, ulong rows)
{
    const ulong g = get_global_id(0);
    if (g >= rows) return;
    const uint h = (uint)(g % H);
    const ulong bt = g / H;
    const uint t = (uint)(bt % T);
    const ulong b = bt / T;
    __global const float *s = src + src_off + ((b * H + h) * T + t) * (ulong)D;
    __global float *o = dst + dst_off + g * D;
    uint d = 0;
    for (; d + 8 <= D; d += 8) vstore8(vload8(0, s + d), 0, o + d);
    for (; d < D; d++) o[d] = s[d];
}
