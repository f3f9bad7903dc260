/* decode_common.cl: what the decode cores' kernels share (cl/cores/decode_attend.cl, decode_group.cl;
 * src/cores/decode_family.c): the cache's element type and vector loads, the visibility rule, and a unit of
 * work's block and key range (the split-K parts are merged by common/combine.cl).
 *
 * The cache, per sequence b and key/value head g, holds positions 0 .. Tmax-1 contiguously:
 *   K[b, g, j, c] = kc[((b*HK + g)*Tmax + j)*DK + c]     (V likewise with DV)
 * as float, or with KV_HALF 1 as IEEE half (vstore_half_rte / vload_half: core OpenCL 1.2, no
 * cl_khr_fp16), with KV_HALF 2 as bfloat16 (a ushort, widened by a shift; common/half.cl goes first), with KV_HALF 3
 * as int8 codes whose row (b, g, j) has the scale ks[DEC_BASE(b, g) + DEC_POS(b, g, j)] (vs likewise): the loads give the codes
 * as floats, and the kernels apply a key's scale to its score and a value's scale to its softmax weight (KSCALE
 * below reads either; 1 for the other types, folded away). lens[b] is sequence b's length before the step; the
 * step brings n new tokens per sequence, of which the first valid[b] are real (the rest are padding: not appended,
 * output 0). Sequence b's new token t is row first_rows[b] + t of q and out: b*n + t in a padded step; in a packed
 * step (packed = 1, clattn_decode_args.cu_new) only its valid[b] real rows exist, and the padding tokens are neither
 * read nor written. New
 * token t of sequence b sits at position p = lens[b] + t and sees the keys j <= p with p - j < WINDOW
 * (when WINDOW > 0), and in a verify step with a draft tree only its ancestors among the new tokens (dec_tree). The
 * decode plan appends the new tokens first (decode/kv_append.cl).
 *
 * Split-K parts: query row (first_rows[b] + t)*H + h, part p has slot row*parts + p: part_ml[slot*2] its running
 * max m (natural-log units), part_ml[slot*2 + 1] its sum l, part_acc[slot*DV ..] its unnormalised output.
 * common/combine.cl's split_combine merges them (out = sum_p acc_p e^(m_p - M) / sum_p l_p e^(m_p - M), M = max_p m_p;
 * 0 when no key).
 *
 * A paged cache (PAGE > 0, clattn 0.8): the rows are (HK, pool pages, PAGE), Tmax the pool's pages, and position j of
 * sequence b is row j % PAGE of page pages[b*npage + j / PAGE] of KV head g (its block table; decode/cache.c gives
 * every position a kernel reads a page). Head-major, so that a sequence's consecutive pages are one stream per head
 * wherever they are consecutive in the pool, as in a contiguous cache (a page of all heads interleaved cost PoCL
 * 15-45 % of a step).
 * DEC_BASE(b, g) is the first row of (b, g) in a contiguous cache (0 when paged) and DEC_POS(b, g, j) the row of
 * position j from there; the kernels' arguments pages, npage, HK and Tmax are in scope.
 *
 * Specialised by -D: DK, DV, GROUP (query heads per KV head), WINDOW, KV_HALF, PAGE (0: contiguous), VW (vector
 * width along the head dimension; divides DK and DV). */
#ifndef DK
#define DK 64
#endif
#ifndef DV
#define DV DK
#endif
#ifndef GROUP
#define GROUP 1
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef KV_HALF
#define KV_HALF 0
#endif
#ifndef VW
#define VW 1
#endif
#ifndef PAGE
#define PAGE 0
#endif
/* decode_attend on a paged cache without a window, pages a multiple of its blocks of BK keys: the split-K parts'
 * bounds are multiples of BK (dec_block_of), so a block lies in one page and its keys' rows follow each other (one
 * table read a block, the contiguous cache's addressing within it). Else each key's row from the table. */
#define DEC_ALIGNED 0
#if PAGE && !WINDOW && defined(BK)
#if PAGE % BK == 0
#undef DEC_ALIGNED
#define DEC_ALIGNED 1
#endif
#endif
#if PAGE
#define DEC_BASE(b, g) 0
#define DEC_POS(b, g, j) (((ulong)(g) * Tmax + pages[(b) * npage + (j) / PAGE]) * PAGE + (j) % PAGE)
#else
#define DEC_BASE(b, g) (((b) * HK + (g)) * (ulong)Tmax)
#define DEC_POS(b, g, j) ((ulong)(j))
#endif

#if KV_HALF == 3
typedef char kv_t;
#define KSCALE(sb, j) ((sb)[(j)]) /* a row's scale, sb = ks or vs + DEC_BASE(b, g), j a DEC_POS */
#elif KV_HALF == 2
typedef ushort kv_t;
#elif KV_HALF
typedef half kv_t;
#else
typedef float kv_t;
#endif
#ifndef KSCALE
#define KSCALE(sb, j) 1.0f
#endif

#if VW == 8
typedef float8 vw_t;
#define QLOADW(i, p) vload8((i), (p))
#define OSTOREW(v, i, p) vstore8((v), (i), (p))
#if KV_HALF == 3
#define KLOADW(i, p) convert_float8(vload8((i), (p)))
#elif KV_HALF == 2
#define KLOADW(i, p) as_float8(convert_uint8(vload8((i), (p))) << 16)
#elif KV_HALF
#define KLOADW(i, p) vload_half8((i), (p))
#else
#define KLOADW(i, p) vload8((i), (p))
#endif
inline float dhsum(float8 v) { float4 t = v.lo + v.hi; float2 u = t.lo + t.hi; return u.x + u.y; }
#elif VW == 4
typedef float4 vw_t;
#define QLOADW(i, p) vload4((i), (p))
#define OSTOREW(v, i, p) vstore4((v), (i), (p))
#if KV_HALF == 3
#define KLOADW(i, p) convert_float4(vload4((i), (p)))
#elif KV_HALF == 2
#define KLOADW(i, p) as_float4(convert_uint4(vload4((i), (p))) << 16)
#elif KV_HALF
#define KLOADW(i, p) vload_half4((i), (p))
#else
#define KLOADW(i, p) vload4((i), (p))
#endif
inline float dhsum(float4 v) { float2 u = v.lo + v.hi; return u.x + u.y; }
#else
typedef float vw_t;
#define QLOADW(i, p) ((p)[(i)])
#define OSTOREW(v, i, p) ((p)[(i)] = (v))
#if KV_HALF == 3
#define KLOADW(i, p) convert_float((p)[(i)])
#elif KV_HALF == 2
#define KLOADW(i, p) clattn_bf16_value((p)[(i)])
#elif KV_HALF
#define KLOADW(i, p) vload_half((i), (p))
#else
#define KLOADW(i, p) ((p)[(i)])
#endif
inline float dhsum(float v) { return v; }
#endif
#define DNKW (DK / VW)
#define DNVW (DV / VW)

/* Is key j visible from position p? (j <= p always holds inside the ranges below, except at the
 * block's upper edge.) */
inline int dec_visible(uint j, uint p)
{
#if WINDOW
    return j <= p && p - j < WINDOW;
#else
    return j <= p;
#endif
}

/* A verify step's draft tree (clattn 0.8; tree_on = 0: none, a chain): may the new token at position p >= len of
 * sequence b see the new token at position j (len <= j <= p)? tree (B, n, n): row p - len, column j - len nonzero.
 * Cached keys (j < len) are always visible. The plan refuses a tree with a window. */
inline int dec_tree(__global const uchar *tree, uint tree_on, ulong b, uint n, uint len, uint p, uint j)
{
    return !tree_on || j < len || tree[(b * n + (p - len)) * n + (j - len)] != 0;
}

/* A decode kernel's unit of work (a work-item of decode_attend, a work-group of decode_group), x in
 * 0 .. B*HK*nblk*parts: its sequence b, KV head g, block of `rows` query rows from q0 (rows run over (token, head
 * in the group): row q -> token q / GROUP, head g*GROUP + q % GROUP; nrows = n*GROUP of them), its part of the
 * block's keys [js, je): up to its last token's position (never past the appended ones), from its first token's
 * window on, cut into `parts` equal parts (split-K). len and nv: the sequence's cached and real new tokens; r0 its
 * first row of q and out. In a packed step the rows are clamped to the real tokens' (nrows = nv*GROUP; none: the block
 * has nothing to do, and returns). */
typedef struct dec_block {
    ulong b;
    uint r0, g, part, q0, q_last, nrows, len, nv, js, je;
} dec_block;

inline dec_block dec_block_of(ulong x, uint rows, uint n, uint HK, uint parts, __global const uint *lens,
                              __global const uint *valid, __global const uint *first_rows, uint packed)
{
    dec_block k;
    k.nrows = n * GROUP;
    const uint nblk = (k.nrows + rows - 1) / rows;
    k.part = (uint)(x % parts);
    x /= parts;
    const uint blk = (uint)(x % nblk);
    x /= nblk;
    k.g = (uint)(x % HK);
    k.b = x / HK;
    k.len = lens[k.b];
    k.nv = valid[k.b];
    k.r0 = first_rows[k.b];
    if (packed) k.nrows = k.nv * GROUP; /* (the blocks past it: q0 >= nrows) */
    k.q0 = blk * rows;
    k.q_last = min(k.q0 + rows, k.nrows) - 1;
    const uint hi = min(k.len + k.q_last / GROUP + 1, k.len + k.nv);
#if WINDOW
    const uint first = k.len + k.q0 / GROUP;
    const uint lo = first >= WINDOW ? first - WINDOW + 1 : 0;
#else
    const uint lo = 0;
#endif
    const uint span = hi > lo ? hi - lo : 0;
#if DEC_ALIGNED
    const uint per = ((span + parts - 1) / parts + BK - 1) / BK * BK; /* (lo is 0: no window) */
#else
    const uint per = (span + parts - 1) / parts;
#endif
    k.js = min(hi, lo + k.part * per);
    k.je = min(hi, k.js + per);
    return k;
}
