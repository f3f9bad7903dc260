/* ffn.cl: the encoder layer's feed-forward network around its two GEMMs.
 *
 *   bias_act       after the first GEMM, in place: h = act(h + b1), one work-item per element
 *   residual_bias  the pre-norm layer's last residual: dst = (a + b) + bias (the second GEMM's bias)
 *                  (the post-norm layer adds that bias in layernorm.cl instead)
 *
 * Specialised by -D (defaults let the file compile alone):
 *   ACT   0: ReLU (NaN stays NaN, as torch.relu); 1: GELU, erf form as PyTorch's default,
 *         written 0.5 v erfc(-v / sqrt 2), which equals 0.5 v (1 + erf(v / sqrt 2)) without the
 *         cancellation of 1 + erf for negative v
 * Offsets count elements; 64-bit indices.
 */
#ifndef ACT
#define ACT 0
#endif

__kernel void bias_act(__global float *h, ulong h_off, __global const float *bias, uint cols, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    float v = h[h_off + g] + bias[g % cols];
#if ACT == 1
    v = 0.5f * v * erfc(-v * 0.70710678118654752f);
#else
    v = v < 0.0f ? 0.0f : v;
#endif
    h[h_off + g] = v;
}

__kernel void residual_bias(__global float *dst, ulong dst_off, __global const float *a, ulong a_off,
                            __global const float *b, ulong b_off, __global const float *bias, uint cols,
                            ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    float v = a[a_off + g] + b[b_off + g];
    v += bias[g % cols];
    dst[dst_off + g] = v;
}
