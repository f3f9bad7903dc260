/* kv_append.cl: a decode step's new keys and values into the KV cache (src/decode/decode.c), from the
 * projection rows; the layout of the cache is decode_attend.cl's:
 *   K[b, g, j, c] = kc[((b*HK + g)*Tmax + j)*DK + c]     (V likewise with DV)
 * as float, or with KV_HALF 1 as IEEE half (vstore_half_rte: core OpenCL 1.2, no cl_khr_fp16), with KV_HALF 2 as
 * bfloat16 (common/half.cl's clattn_bf16; half.cl goes first), with KV_HALF 3 as int8 codes with a float scale per
 * row, ks[(b*HK + g)*Tmax + j] (vs likewise; clattn.h, clattn_kv_type; src/runtime/numeric.c's
 * clattn_kv_quantize_row is the same rule on the host). A paged cache (PAGE > 0; decode_common.cl): position j of
 * sequence b, KV head g is row (g*Tmax + pages[b*npage + j/PAGE])*PAGE + j % PAGE, Tmax the pool's pages, its page
 * given by decode/cache.c before the step. Specialised by -D: DK, DV, KV_HALF, PAGE. */
#ifndef DK
#define DK 64
#endif
#ifndef DV
#define DV DK
#endif
#ifndef KV_HALF
#define KV_HALF 0
#endif
#ifndef PAGE
#define PAGE 0
#endif
#if KV_HALF == 3
typedef char kv_t;
#elif KV_HALF == 2
typedef ushort kv_t;
#define KV_STORE(x, i, p) ((p)[(i)] = clattn_bf16((x)))
#elif KV_HALF
typedef half kv_t;
#define KV_STORE(x, i, p) vstore_half_rte((x), (i), (p))
#else
typedef float kv_t;
#define KV_STORE(x, i, p) ((p)[(i)] = (x))
#endif
#if KV_HALF == 3
#define KVW 1 /* a work-item per row: its scale depends on the whole row */
#else
#define KVW (DK > DV ? DK : DV)
#endif

#if KV_HALF == 3
/* One element's code from its row's scale: x / s rounded to nearest, ties to even, of the exact quotient (the
 * division's guess corrected by its residual, exact with fma), within -127 .. 127; 0 where s is 0 or NaN. */
inline char int8_code(float x, float s)
{
    if (!(s > 0.0f)) return 0;
    float q = rint(x / s);
    const float r = fma(-q, s, x), r2 = 2.0f * fabs(r);
    if (r2 > s || (r2 == s && fmod(q, 2.0f) != 0.0f)) q += r > 0.0f ? 1.0f : -1.0f;
    return (char)clamp(q, -127.0f, 127.0f);
}

/* One row of D values into codes q and its scale: s = max |x_c| * (1/127 as a float), a product (the same bits on
 * every device), NaN when the row holds a NaN or an infinity (x - x is NaN only there). */
inline void int8_row(__global const float *x, uint D, __global char *q, __global float *scale)
{
    float amax = 0.0f, nonfinite = 0.0f;
    for (uint c = 0; c < D; c++) amax = fmax(amax, fabs(x[c])), nonfinite += x[c] - x[c];
    const float s = amax * (1.0f / 127.0f) + nonfinite;
    for (uint c = 0; c < D; c++) q[c] = int8_code(x[c], s);
    *scale = s;
}
#endif

/* One work-item per (b, t, g, c), c < max(DK, DV): K[b, g, lens[b] + t, c] and V likewise from the
 * projection row first_rows[b] + t of src (b*n + t, or a packed step's cu_new[b] + t; row stride src_ld; K of head g
 * at column k_col + g*DK, V at v_col + g*DV).
 * INT8 (KV_HALF 3): one work-item per (b, t, g), the whole row of K and of V and their scales (ks, vs; unused by
 * the other types). */
__kernel void kv_append(__global const float *src, ulong src_off, uint src_ld, uint k_col, uint v_col,
                        __global kv_t *kc, __global kv_t *vc, __global float *ks, __global float *vs,
                        __global const uint *pages, uint npage, __global const uint *lens,
                        __global const uint *valid, __global const uint *first_rows, uint n, uint HK, uint Tmax,
                        ulong total)
{
    const ulong gid = get_global_id(0);
    if (gid >= total) return;
    ulong x = gid;
    const uint c = (uint)(x % KVW); x /= KVW;
    const uint g = (uint)(x % HK); x /= HK;
    const uint t = (uint)(x % n);
    const ulong b = x / n;
    if (t >= valid[b]) return;
    __global const float *row = src + src_off + (ulong)(first_rows[b] + t) * src_ld; /* (64-bit: rows x src_ld) */
#if PAGE
    const uint j = lens[b] + t;
    const ulong pos = ((ulong)g * Tmax + pages[b * npage + j / PAGE]) * PAGE + j % PAGE; /* Tmax: the pool's pages */
#else
    const ulong pos = ((b * HK + g) * Tmax + lens[b] + t);
#endif
#if KV_HALF == 3
    (void)c;
    int8_row(row + k_col + g * DK, DK, kc + pos * DK, ks + pos);
    int8_row(row + v_col + g * DV, DV, vc + pos * DV, vs + pos);
#else
    if (c < DK) KV_STORE(row[k_col + g * DK + c], pos * DK + c, kc);
    if (c < DV) KV_STORE(row[v_col + g * DV + c], pos * DV + c, vc);
#endif
}
