/* kv_append.cl: a decode step's new keys and values into the KV cache (src/decode/decode.c), from the
 * projection rows; the layout of the cache is decode_attend.cl's:
 *   K[b, g, j, c] = kc[((b*HK + g)*Tmax + j)*DK + c]     (V likewise with DV)
 * as float, or with KV_HALF 1 as IEEE half (vstore_half_rte: core OpenCL 1.2, no cl_khr_fp16), with KV_HALF 2 as
 * bfloat16 (common/half.cl's clattn_bf16; half.cl goes first). Specialised by -D: DK, DV, KV_HALF. */
#ifndef DK
#define DK 64
#endif
#ifndef DV
#define DV DK
#endif
#ifndef KV_HALF
#define KV_HALF 0
#endif
#if KV_HALF == 2
typedef ushort kv_t;
#define KV_STORE(x, i, p) ((p)[(i)] = clattn_bf16((x)))
#elif KV_HALF
typedef half kv_t;
#define KV_STORE(x, i, p) vstore_half_rte((x), (i), (p))
#else
typedef float kv_t;
#define KV_STORE(x, i, p) ((p)[(i)] = (x))
#endif
#define KVW (DK > DV ? DK : DV)

/* One work-item per (b, t, g, c), c < max(DK, DV): K[b, g, lens[b] + t, c] and V likewise from the
 * projection row (b*n + t) of src (row stride src_ld; K of head g at column k_col + g*DK, V at v_col + g*DV). */
__kernel void kv_append(__global const float *src, ulong src_off, uint src_ld, uint k_col, uint v_col,
                        __global kv_t *kc, __global kv_t *vc, __global const uint *lens, __global const uint *valid,
                        uint n, uint HK, uint Tmax, ulong total)
{
    const ulong gid = get_global_id(0);
    if (gid >= total) return;
    ulong x = gid;
    const uint c = (uint)(x % KVW); x /= KVW;
    const uint g = (uint)(x % HK); x /= HK;
    const uint t = (uint)(x % n);
    const ulong b = x / n;
    if (t >= valid[b]) return;
    __global const float *row = src + src_off + (b * n + t) * src_ld;
    const ulong pos = ((b * HK + g) * Tmax + lens[b] + t);
    if (c < DK) KV_STORE(row[k_col + g * DK + c], pos * DK + c, kc);
    if (c < DV) KV_STORE(row[v_col + g * DV + c], pos * DV + c, vc);
}
