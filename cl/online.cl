/* online.cl: pieces of the online softmax shared by flash.cl (flash_rows) and decode.cl, which both keep
 * per query row a running max m and sum l over blocks of BK scores (private arrays). */
#ifndef CLATTN_ONLINE_CL
#define CLATTN_ONLINE_CL

/* max(m, s[0..n-1]); fmax skips NaN, and exp(NaN) brings it back into the sum. */
inline float clattn_block_max(const float *s, uint n, float m)
{
    for (uint j = 0; j < n; j++) m = fmax(m, s[j]);
    return m;
}

/* The same for a block of 16 scores, as one float16 reduction. */
inline float clattn_block_max16(const float *s, float m)
{
    const float16 v = vload16(0, s);
    const float8 a = fmax(v.lo, v.hi);
    const float4 b = fmax(a.lo, a.hi);
    const float2 c = fmax(b.lo, b.hi);
    return fmax(m, fmax(c.x, c.y));
}

/* s[j] = exp(s[j] - mb) for a block of 16 scores, as one float16 (one vector exp on a CPU); their sum. */
inline float clattn_exp16_sum(float *s, float mb)
{
    const float16 p = exp(vload16(0, s) - mb);
    const float8 p8 = p.lo + p.hi;
    const float4 p4 = p8.lo + p8.hi;
    vstore16(p, 0, s);
    return (p4.x + p4.y) + (p4.z + p4.w);
}

#endif
