/* online.cl: pieces of the online softmax shared by cores/flash_rows.cl and cores/decode_attend.cl, which both keep
 * per query row a running max m and sum l over blocks of BK scores (private arrays). */
#ifndef CLATTN_ONLINE_CL
#define CLATTN_ONLINE_CL

/* max(m, s[0..15]) as one float16 reduction. */
inline float clattn_block_max16(const float *s, float m)
{
    const float16 v = vload16(0, s);
    const float8 a = fmax(v.lo, v.hi);
    const float4 b = fmax(a.lo, a.hi);
    const float2 c = fmax(b.lo, b.hi);
    return fmax(m, fmax(c.x, c.y));
}

/* max(m, s[0..n-1]); fmax skips NaN, and exp(NaN) brings it back into the sum. A block of 16 (n is
 * the kernel's constant BK) takes the vector form. */
inline float clattn_block_max(const float *s, uint n, float m)
{
    if (n == 16) return clattn_block_max16(s, m);
    for (uint j = 0; j < n; j++) m = fmax(m, s[j]);
    return m;
}

/* The lane sums of four float8 (a, b, c, d) as one float4, by a transposing reduction: cheaper than
 * four separate ones. */
inline float4 clattn_hsum4_8(float8 a, float8 b, float8 c, float8 d)
{
    const float8 ab = (float8)(a.lo + a.hi, b.lo + b.hi), cd = (float8)(c.lo + c.hi, d.lo + d.hi);
    const float8 x = (float8)(ab.even + ab.odd, cd.even + cd.odd);
    return x.even + x.odd;
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

/* The value pass of a block (flash_rows.cl, decode_attend.cl): for rows r < NROWS and value vectors
 * c < NV of type VT, acc[r][c] = acc[r][c] * corr[r] + sum_{jj < nj} p[r][jj] VAL(jj, c), where
 * VAL(jj, c) loads vector c of the block's key jj. RVP rows at a time (RVP divides NROWS), so that
 * their RVP*NV accumulators stay in registers while the values stream through in memory order
 * (loops with compile-time counts, unrolled: PoCL otherwise keeps the accumulators on the stack). */
#define CLATTN_VALUE_PASS(VT, NROWS, RVP, NV, acc, corr, p, nj, VAL)                                       \
    for (uint r0_ = 0; r0_ < (NROWS); r0_ += (RVP)) {                                                  \
        VT a_[RVP][NV];                                                                               \
        _Pragma("unroll") for (uint rr_ = 0; rr_ < (RVP); rr_++) {                                    \
            _Pragma("unroll") for (uint c_ = 0; c_ < (NV); c_++)                                      \
                a_[rr_][c_] = (acc)[r0_ + rr_][c_] * (corr)[r0_ + rr_];                               \
        }                                                                                             \
        for (uint jj_ = 0; jj_ < (nj); jj_++) {                                                       \
            _Pragma("unroll") for (uint c_ = 0; c_ < (NV); c_++) {                                    \
                const VT v_ = VAL(jj_, c_);                                                           \
                _Pragma("unroll") for (uint rr_ = 0; rr_ < (RVP); rr_++)                              \
                    a_[rr_][c_] = fma((VT)((p)[r0_ + rr_][jj_]), v_, a_[rr_][c_]);                    \
            }                                                                                         \
        }                                                                                             \
        _Pragma("unroll") for (uint rr_ = 0; rr_ < (RVP); rr_++) {                                    \
            _Pragma("unroll") for (uint c_ = 0; c_ < (NV); c_++) (acc)[r0_ + rr_][c_] = a_[rr_][c_];  \
        }                                                                                             \
    }

#endif
