/* half.cl: the 16-bit types' rounding, on the bits. IEEE half for plans with kv_half 1 (keys and values used with
 * the values a half-precision KV cache holds); bfloat16 (the upper 16 bits of a float) for kv_half 2 (a bfloat16
 * cache) and for half plans' arrays (common/dtype.cl, which comes after this file). The KV cache itself stores half with vstore_half_rte and
 * reads it with vload_half (decode.cl); this is the same rounding for values that stay float, done on
 * the bits because a private half variable needs cl_khr_fp16. Round to nearest even; above 65504
 * (from 65520 on) inf; NaN stays NaN; below 2^-14 the half subnormals (units of 2^-24). */
#ifndef CLATTN_HALF_CL
#define CLATTN_HALF_CL

inline float clattn_round_half(float f)
{
    const uint u = as_uint(f), a = u & 0x7FFFFFFFu, sign = u & 0x80000000u;
    if (a > 0x7F800000u) return f;
    if (a >= 0x477FF000u) return as_float(sign | 0x7F800000u);
    if (a < 0x38800000u) return rint(f * 16777216.0f) * 5.9604644775390625e-8f; /* both scalings exact */
    return as_float(sign | ((a + 0x0FFFu + ((a >> 13) & 1u)) & ~0x1FFFu));
}

/* bfloat16: a float's upper 16 bits after rounding to nearest even (NaN kept a quiet NaN: the carry could make it
 * inf); the host's clattn_float_to_bf16 (src/runtime/numeric.c). */
inline ushort clattn_bf16(float f)
{
    const uint u = as_uint(f);
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? (ushort)((u >> 16) | 0x40u) : (ushort)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float clattn_bf16_value(ushort b) { return as_float((uint)b << 16); }

inline float clattn_round_bf16(float f) { return clattn_bf16_value(clattn_bf16(f)); }

/* IEEE half as its 16 bits: f rounded to nearest even (clattn_round_half), then encoded (a NaN stays a quiet NaN); and
 * back, exactly. For kernels that hold half values in integers (flash_mma's fp16 fragments). */
inline ushort clattn_half_bits(float f)
{
    const float r = clattn_round_half(f);
    const uint u = as_uint(r), a = u & 0x7FFFFFFFu, s = (u >> 16) & 0x8000u;
    if (a > 0x7F800000u) return (ushort)(s | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a == 0x7F800000u) return (ushort)(s | 0x7C00u);
    if (a < 0x38800000u) return (ushort)(s | (uint)(as_float(a) * 16777216.0f)); /* subnormal: units of 2^-24, exact */
    return (ushort)(s | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3FFu));
}

inline float clattn_half_value(ushort h)
{
    const uint s = ((uint)h & 0x8000u) << 16, e = ((uint)h >> 10) & 0x1Fu, m = (uint)h & 0x3FFu;
    if (e == 0) return as_float(s | as_uint((float)m * 5.9604644775390625e-8f)); /* subnormal or zero: m 2^-24 */
    if (e == 31) return as_float(s | 0x7F800000u | (m << 13));
    return as_float(s | ((e + 112u) << 23) | (m << 13));
}

#endif
