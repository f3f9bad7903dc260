/* unfused_softmax.cl: the unfused core's softmax (src/cores/unfused.c), one fused pass family over the
 * attention scores.
 *
 * s holds B*H*Tq rows of Tk scores, already multiplied by the scale (the
 * scores GEMM's alpha). One work-group of WG items owns one row:
 *   pass 1: apply the masks (masked entries become -INFINITY by select), and
 *           keep a running (max, sum of exp) pair per item: online softmax;
 *   reduce: combine the pairs across the work-group in local memory;
 *   pass 2: weight = exp(score - max) / sum, then dropout, written in place.
 * Two passes over the row, nothing else touches the T x T scores.
 * A row whose every key is masked gets weights 0 (PyTorch would give NaN).
 *
 * Specialised by -D (philox.cl and mask.cl go first; defaults let the three compile alone):
 *   WG        work-group size, a power of two
 *   CAUSAL, KPM, MASK_KIND, DROPOUT   the masks and dropout (mask.cl)
 *   LSE       1: each row's log-sum-exp, max + log(sum) before dropout (-inf for a row with no visible key, NaN
 *             for a NaN row), to lse[lse_off + row], row = (b*H + h)*Tq + i: a training plan's statistics
 */
#ifndef WG
#define WG 64
#endif
#ifndef LSE
#define LSE 0
#endif

/* Row `row`'s log-sum-exp from its max m and sum of exp(v - m) (training plans). */
inline void store_lse(__global float *lse, ulong lse_off, ulong row, float m, float sum, int bad)
{
#if LSE
    lse[lse_off + row] = bad ? NAN : m == -INFINITY ? -INFINITY : m + log(sum);
#endif
}
/* The masked, scaled score of key j for query i of batch entry b (mask.cl). */
inline float masked_score(__global const float *row, uint j, uint i, ulong b, uint Tk,
                          __global const uchar *kpm, __global const mask_t *mask)
{
    return clattn_mask_score(row[j], i, j, b, Tk, kpm, mask);
}

/* (m, l) = running max and sum of exp(v - m); combine two such pairs.
 * A NaN score makes the whole row NaN, as in PyTorch (fmax alone would drop it). */
inline float2 combine(float2 a, float2 b)
{
    if (isnan(a.x) || isnan(b.x)) return (float2)(NAN, NAN);
    float m = fmax(a.x, b.x);
    if (m == -INFINITY) return (float2)(-INFINITY, 0.0f);
    return (float2)(m, a.y * exp(a.x - m) + b.y * exp(b.x - m));
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void softmax_rows(__global float *s, ulong s_off,
                  __global const uchar *kpm, ulong kpm_off,
                  __global const mask_t *mask, ulong mask_off,
                  uint Tq, uint Tk, uint H, ulong row0,
                  uint seed_lo, uint seed_hi, uint drop_threshold, float keep_scale, uint drop_b0,
                  __global float *lse, ulong lse_off)
{
    /* s + s_off holds the rows row0, row0 + 1, ... of this launch (a chunk of (b, h) pairs) */
    __local float2 part[WG];
    const ulong row = row0 + get_group_id(0);   /* (b*H + h)*Tq + i */
    const uint lid = get_local_id(0);
    const uint i = (uint)(row % Tq);
    const ulong bh = row / Tq;
    const ulong b = bh / H;
    __global float *r = s + s_off + (ulong)get_group_id(0) * Tk;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, bh % H, H, Tq, Tk);

    /* pass 1: online max and sum over this item's keys */
    float2 acc = (float2)(-INFINITY, 0.0f);
    for (uint j = lid; j < Tk; j += WG) {
        float v = masked_score(r, j, i, b, Tk, kpm, mask);
        acc = combine(acc, (float2)(v, v == -INFINITY ? 0.0f : 1.0f));
    }
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint stride = WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride) part[lid] = combine(part[lid], part[lid + stride]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float row_max = part[0].x;
    const float inv_sum = row_max == -INFINITY ? 0.0f : 1.0f / part[0].y;
    if (lid == 0) store_lse(lse, lse_off, row, row_max, part[0].y, isnan(row_max));

    /* pass 2: normalise (and drop), in place */
    for (uint j = lid; j < Tk; j += WG) {
        float v = masked_score(r, j, i, b, Tk, kpm, mask);
        float w = row_max == -INFINITY ? 0.0f : exp(v - row_max) * inv_sum;
#if DROPOUT
        const uint h = (uint)(bh % H);
        w = clattn_dropout_keep(seed_lo, seed_hi, (uint)b + drop_b0, h, i, j, drop_threshold) ? keep_scale * w : 0.0f;
#endif
        r[j] = w;
    }
}

/* The same function with one work-item per row, for CPU devices (PoCL and the
 * like): there a work-group of WG items per row runs as a loop over the items
 * around each barrier-free region, the strided j loops do not vectorise, and
 * combine() costs two exp per score. Here each item walks its row contiguously:
 *   pass 1: max (and a NaN flag) over the visible scores;
 *   pass 2: e = exp(score - max), summed and stored in place (one exp per score);
 *   pass 3: scale by 1/sum (then dropout), zeros for masked entries.
 * Without key padding / attention masks and dropout the passes use float16 loads (PoCL, B4 T2048 E512 H8: the
 * softmax 49 ms with float8, 36 with float16, bench/results/pocl-2core-reshape.md)
 * and, when causal, stop at the visible prefix (keys 0..i). Same results as
 * softmax_rows: masked -> 0, a fully masked row -> 0, a NaN visible score -> NaN row. */
__kernel void softmax_rows_item(__global float *s, ulong s_off,
                                __global const uchar *kpm, ulong kpm_off,
                                __global const mask_t *mask, ulong mask_off,
                                uint Tq, uint Tk, uint H, ulong row0, ulong nrows,
                                uint seed_lo, uint seed_hi, uint drop_threshold, float keep_scale, uint drop_b0,
                                __global float *lse, ulong lse_off)
{
    const ulong g = get_global_id(0);
    if (g >= nrows) return;
    const ulong row = row0 + g;
    const uint i = (uint)(row % Tq);
    const ulong bh = row / Tq;
    const ulong b = bh / H;
    __global float *r = s + s_off + (ulong)g * Tk;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, bh % H, H, Tq, Tk);
#if !KPM && MASK_KIND == 0 && !DROPOUT && !WINDOW
    const uint n = CAUSAL ? min(i + 1, Tk) : Tk;   /* visible keys 0 .. n-1 */
    const uint n16 = n & ~15u;
    float16 m16 = (float16)(-INFINITY);
    int16 bad16 = (int16)(0);
    for (uint j = 0; j < n16; j += 16) {
        float16 v = vload16(0, r + j);
        bad16 |= isnan(v);
        m16 = fmax(m16, v);
    }
    const float8 m8 = fmax(m16.lo, m16.hi);
    float m = fmax(fmax(fmax(m8.s0, m8.s1), fmax(m8.s2, m8.s3)), fmax(fmax(m8.s4, m8.s5), fmax(m8.s6, m8.s7)));
    int bad = any(bad16);
    for (uint j = n16; j < n; j++) {
        bad |= isnan(r[j]);
        m = fmax(m, r[j]);
    }
    if (bad || m == -INFINITY) {
        const float f = bad ? NAN : 0.0f;
        for (uint j = 0; j < Tk; j++) r[j] = f;
        store_lse(lse, lse_off, row, m, 0.0f, bad);
        return;
    }
    float16 s16 = (float16)(0.0f);
    for (uint j = 0; j < n16; j += 16) {
        float16 e = exp(vload16(0, r + j) - m);
        s16 += e;
        vstore16(e, 0, r + j);
    }
    const float8 s8 = s16.lo + s16.hi;
    float sum = ((s8.s0 + s8.s1) + (s8.s2 + s8.s3)) + ((s8.s4 + s8.s5) + (s8.s6 + s8.s7));
    for (uint j = n16; j < n; j++) {
        float e = exp(r[j] - m);
        sum += e;
        r[j] = e;
    }
    store_lse(lse, lse_off, row, m, sum, 0);
    const float inv = 1.0f / sum;
    for (uint j = 0; j < n16; j += 16) vstore16(vload16(0, r + j) * inv, 0, r + j);
    for (uint j = n16; j < n; j++) r[j] *= inv;
    /* hidden keys: 0, or NaN when the sum is (a +inf score makes exp(inf - inf) NaN). A select, not 0 * inv:
     * Mesa 22's rusticl folds 0.0f * x to 0 even when x is NaN (issue 45). */
    const float hidden = isnan(inv) ? NAN : 0.0f;
    for (uint j = n; j < Tk; j++) r[j] = hidden;
#else
    float m = -INFINITY;
    int bad = 0;
    for (uint j = 0; j < Tk; j++) {
        float v = masked_score(r, j, i, b, Tk, kpm, mask);
        bad |= isnan(v);
        m = fmax(m, v);
    }
    float sum = 0.0f;
    for (uint j = 0; j < Tk; j++) {
        float v = masked_score(r, j, i, b, Tk, kpm, mask);
        float e = bad || m == -INFINITY ? 0.0f : exp(v - m);
        sum += e;
        r[j] = e;
    }
    store_lse(lse, lse_off, row, m, sum, bad);
    const float inv = 1.0f / sum;
    for (uint j = 0; j < Tk; j++) {
        float w = bad ? NAN : m == -INFINITY ? 0.0f : r[j] * inv;
#if DROPOUT
        const uint h = (uint)(bh % H);
        w = clattn_dropout_keep(seed_lo, seed_hi, (uint)b + drop_b0, h, i, j, drop_threshold) ? w * keep_scale : 0.0f;
#endif
        r[j] = w;
    }
#endif
}
