/* philox.cl: the Philox4x32-10 counter-based generator (Salmon, Moraes, Dror
 * and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 *
 * This one file is compiled both as OpenCL C (prepended to the attention kernels) and as
 * C (#included by the CPU reference), so that one seed gives the same dropout
 * mask on every device, bit for bit. */
#ifndef CLATTN_PHILOX_CL
#define CLATTN_PHILOX_CL

#ifdef __OPENCL_VERSION__
typedef uint clattn_u32;
typedef ulong clattn_u64;
#define CLATTN_PHILOX_FN inline
#else
#include <stdint.h>
typedef uint32_t clattn_u32;
typedef uint64_t clattn_u64;
#define CLATTN_PHILOX_FN static inline
#endif

#define CLATTN_PHILOX_M0 0xD2511F53u
#define CLATTN_PHILOX_M1 0xCD9E8D57u
#define CLATTN_PHILOX_W0 0x9E3779B9u
#define CLATTN_PHILOX_W1 0xBB67AE85u

/* out = Philox4x32-10(counter c, key k). */
CLATTN_PHILOX_FN void clattn_philox4x32_10(const clattn_u32 c_in[4], const clattn_u32 k_in[2],
                                           clattn_u32 out[4])
{
    clattn_u32 c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3];
    clattn_u32 k0 = k_in[0], k1 = k_in[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) { /* bump the key between rounds */
            k0 += CLATTN_PHILOX_W0;
            k1 += CLATTN_PHILOX_W1;
        }
        clattn_u64 p0 = (clattn_u64)CLATTN_PHILOX_M0 * (clattn_u64)c0;
        clattn_u64 p1 = (clattn_u64)CLATTN_PHILOX_M1 * (clattn_u64)c2;
        clattn_u32 hi0 = (clattn_u32)(p0 >> 32), lo0 = (clattn_u32)p0;
        clattn_u32 hi1 = (clattn_u32)(p1 >> 32), lo1 = (clattn_u32)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Dropout keep decision for attention weight (b, h, i, j): the counter is the
 * logical position, the key the 64-bit seed; the weight is dropped when the
 * first output word is below `threshold` = floor(p * 2^32). Integers only. */
CLATTN_PHILOX_FN int clattn_dropout_keep(clattn_u32 seed_lo, clattn_u32 seed_hi, clattn_u32 b, clattn_u32 h,
                                         clattn_u32 i, clattn_u32 j, clattn_u32 threshold)
{
    clattn_u32 c[4] = {j, i, h, b};
    clattn_u32 k[2] = {seed_lo, seed_hi};
    clattn_u32 r[4];
    clattn_philox4x32_10(c, k, r);
    return r[0] >= threshold;
}

#endif
