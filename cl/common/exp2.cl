/* exp2.cl: 2^x where a softmax needs it, on the special-function unit where the compiler lets us say so. */
/* 2^x for a softmax's weights and rescale factors. EX2_PTX = 1 (NVIDIA with inline PTX; a core's defines): the
 * special-function unit's ex2.approx.ftz.f32 (MUFU.EX2, relative error below 2^-22), results below 2^-126 flushed
 * to 0, where such a weight is below fp32's resolution against the row's sum (at least 1, the max's own weight).
 * Not exp2() there: clang + libclc compile it to a software routine (a polynomial, a division and a call: 25 and
 * more instructions per weight on sm_90); NVIDIA's OpenCL compiler may map exp2 to MUFU.EX2 itself, with its own
 * handling of subnormal results. Elsewhere exp2(). */
#ifndef EX2_PTX
#define EX2_PTX 0
#endif
#if EX2_PTX
inline float clattn_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#else
#define clattn_exp2(x) exp2(x)
#endif
