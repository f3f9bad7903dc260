/* numeric.c: the numeric conventions that the kernels and the CPU reference share: IEEE half rounding
 * (what vstore_half_rte stores, and what half.cl's clattn_round_half computes) and dropout's threshold and
 * keep scale (philox.cl draws the words they are compared with). */
#include "runtime.h"

#include <math.h>
#include <string.h>

uint32_t clattn_dropout_threshold(float p)
{
    double t = floor((double)p * 4294967296.0);
    return t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}

float clattn_dropout_keep_scale(float p)
{
    return (float)(1.0 / (1.0 - (double)p));
}

/* IEEE half, round to nearest even (what vstore_half_rte stores), from the bits. */
uint16_t clattn_float_to_half(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu)); /* NaN stays NaN */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);   /* >= 65520 (and inf): inf */
    if (a < 0x38800000u) {                                      /* below 2^-14: subnormal half */
        /* value = a as float; the half's units are 2^-24: round a / 2^-24 to nearest even */
        float af;
        memcpy(&af, &a, 4);
        const double units = (double)af * 16777216.0;           /* exact */
        double r = floor(units);
        const double frac = units - r;
        if (frac > 0.5 || (frac == 0.5 && fmod(r, 2.0) != 0.0)) r += 1.0;
        return (uint16_t)(sign | (uint16_t)r);                  /* r = 1024 is the smallest normal: right bits */
    }
    /* normal: drop 13 mantissa bits, round to nearest even, re-bias the exponent (127 -> 15) */
    const uint32_t lsb = (a >> 13) & 1u;
    const uint32_t r = (a + 0x0FFFu + lsb) >> 13;
    return (uint16_t)(sign | (uint16_t)(r - ((127u - 15u) << 10)));
}

float clattn_half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t u;
    if (e == 0x1F) {
        u = sign | 0x7F800000u | (m << 13);
    } else if (e == 0) { /* zero or subnormal: m * 2^-24 */
        const float v = (float)m * 5.9604644775390625e-8f;
        memcpy(&u, &v, 4);
        u |= sign;
    } else {
        u = sign | ((e + 127u - 15u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float clattn_round_half(float f) { return clattn_half_to_float(clattn_float_to_half(f)); }

float clattn_round_kv(float f, int kv_type)
{
    return kv_type == 1 ? clattn_round_half(f) : kv_type == 2 ? clattn_bf16_to_float(clattn_float_to_bf16(f)) : f;
}

/* An INT8 row's scale, s = max |x_c| * (1/127 as a float): a product, so the same bits on every device (a division
 * need not be correctly rounded in OpenCL); NaN when an element is NaN or infinite (x - x is NaN only there). */
static float int8_scale(const float *x, size_t n)
{
    float amax = 0.0f, nonfinite = 0.0f;
    for (size_t c = 0; c < n; c++) {
        amax = fmaxf(amax, fabsf(x[c]));
        nonfinite += x[c] - x[c];
    }
    return amax * (1.0f / 127.0f) + nonfinite;
}

/* x / s rounded to nearest, ties to even, of the exact quotient (the first guess from a division is corrected by its
 * residual x - q s, which fma computes exactly), within -127 .. 127; 0 where s is 0 or NaN. kv_append.cl's int8_code
 * is the same steps. */
static int8_t int8_code(float x, float s)
{
    if (!(s > 0.0f)) return 0;
    float q = nearbyintf(x / s);
    const float r = fmaf(-q, s, x), r2 = 2.0f * fabsf(r);
    if (r2 > s || (r2 == s && fmodf(q, 2.0f) != 0.0f)) q += r > 0.0f ? 1.0f : -1.0f;
    return (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
}

float clattn_kv_quantize_row(const float *x, size_t n, int8_t *q)
{
    const float s = int8_scale(x, n);
    for (size_t c = 0; c < n; c++) q[c] = int8_code(x[c], s);
    return s;
}

void clattn_kv_round_rows(float *x, size_t rows, size_t n, int kv_type)
{
    for (size_t r = 0; r < rows; r++) {
        float *row = x + r * n;
        if (kv_type == CLATTN_KV_INT8) {
            const float s = int8_scale(row, n);
            for (size_t c = 0; c < n; c++) row[c] = (float)int8_code(row[c], s) * s;
        } else if (kv_type) {
            for (size_t c = 0; c < n; c++) row[c] = clattn_round_kv(row[c], kv_type);
        }
    }
}

/* bfloat16, round to nearest even: the upper 16 bits of the float after adding half a unit of the 16 dropped
 * (plus one when the kept part is odd); NaN keeps a quiet NaN's bits (the carry could make it inf). */
uint16_t clattn_float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float clattn_bf16_to_float(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

size_t clattn_dtype_size(clattn_dtype t) { return t == CLATTN_DTYPE_F32 ? 4 : 2; }

const char *clattn_dtype_name(clattn_dtype t)
{
    return t == CLATTN_DTYPE_F16 ? "f16" : t == CLATTN_DTYPE_BF16 ? "bf16" : t == CLATTN_DTYPE_F32 ? "f32" : "?";
}

void clattn_dtype_widen(const void *src, size_t n, clattn_dtype t, float *dst)
{
    const uint16_t *h = src;
    if (t == CLATTN_DTYPE_F32) memcpy(dst, src, n * sizeof *dst);
    else if (t == CLATTN_DTYPE_F16) for (size_t i = 0; i < n; i++) dst[i] = clattn_half_to_float(h[i]);
    else for (size_t i = 0; i < n; i++) dst[i] = clattn_bf16_to_float(h[i]);
}

void clattn_dtype_narrow(const float *src, size_t n, clattn_dtype t, void *dst)
{
    uint16_t *h = dst;
    if (t == CLATTN_DTYPE_F32) memcpy(dst, src, n * sizeof *src);
    else if (t == CLATTN_DTYPE_F16) for (size_t i = 0; i < n; i++) h[i] = clattn_float_to_half(src[i]);
    else for (size_t i = 0; i < n; i++) h[i] = clattn_float_to_bf16(src[i]);
}

clattn_status clattn_dtype_convert(const void *src, clattn_dtype from, void *dst, clattn_dtype to, size_t n)
{
    clattn_clear_error();
    const int ok_from = from == CLATTN_DTYPE_F32 || from == CLATTN_DTYPE_F16 || from == CLATTN_DTYPE_BF16;
    const int ok_to = to == CLATTN_DTYPE_F32 || to == CLATTN_DTYPE_F16 || to == CLATTN_DTYPE_BF16;
    if (!ok_from || !ok_to)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "dtype %d is not CLATTN_DTYPE_F32, _F16 or _BF16",
                           (int)(ok_from ? to : from));
    if (n == 0) return CLATTN_STATUS_SUCCESS;
    if (!src || !dst) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s is NULL", src ? "dst" : "src");
    if (from == to) {
        if (src != dst) memmove(dst, src, n * clattn_dtype_size(to));
        return CLATTN_STATUS_SUCCESS;
    }
    const uintptr_t s0 = (uintptr_t)src, d0 = (uintptr_t)dst;
    if (s0 < d0 + n * clattn_dtype_size(to) && d0 < s0 + n * clattn_dtype_size(from))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "src and dst overlap (types %s and %s)",
                           clattn_dtype_name(from), clattn_dtype_name(to));
    if (from == CLATTN_DTYPE_F32) {
        clattn_dtype_narrow(src, n, to, dst);
        return CLATTN_STATUS_SUCCESS;
    }
    if (to == CLATTN_DTYPE_F32) {
        clattn_dtype_widen(src, n, from, dst);
        return CLATTN_STATUS_SUCCESS;
    }
    /* half to bfloat16 or back: through float, one element at a time (exact, then one rounding) */
    const uint16_t *h = src;
    uint16_t *o = dst;
    for (size_t i = 0; i < n; i++) {
        float f;
        clattn_dtype_widen(h + i, 1, from, &f);
        clattn_dtype_narrow(&f, 1, to, o + i);
    }
    return CLATTN_STATUS_SUCCESS;
}
