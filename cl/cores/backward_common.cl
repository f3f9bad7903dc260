/* backward_common.cl: what the backward cores (flash_backward.cl, flash_backward_gemm.cl) share: their passes'
 * arguments, and the first pass, D_i = dctx_i . ctx_i = sum_j P_ij dP_ij, one work-item per row. DV by -D; philox.cl
 * and mask.cl go first. */
/* Every pass's arguments: Q, K, V, the context's gradient, the rows' log-sum-exp and D, the masks, sizes, scale and
 * dropout (src/cores/flash_backward.c's and flash_backward_gemm.c's order; drop_b0 as flash_common.cl's). extent: the
 * work-items that have work (flash_backward.cl), or the launch's first work-group (flash_backward_gemm.cl's, launched
 * by groups). */
#define BWD_ARGS \
    __global const float *q, ulong q_off, uint q_ld, __global const float *k, ulong k_off, uint k_ld, \
    __global const float *v, ulong v_off, uint v_ld, __global const float *dctx, ulong dctx_off, uint dctx_ld, \
    __global const float *lse, ulong lse_off, __global const float *dd, __global const uchar *kpm, ulong kpm_off, \
    __global const mask_t *mask, ulong mask_off, uint Tq, uint Tk, uint H, float scale, ulong extent, \
    uint seed_lo, uint seed_hi, uint threshold, float keep_scale, uint drop_b0

/* D[(b*H + h)*Tq + i] = dctx_i . ctx_i over head h's DV columns; one work-item per (b, h, i): extent of them. */
__kernel void bwd_dot(__global const float *dctx, ulong dctx_off, uint dctx_ld, __global const float *ctx,
                      ulong ctx_off, uint ctx_ld, __global float *dd, uint Tq, uint H, ulong extent)
{
    const ulong g = get_global_id(0);
    if (g >= extent) return;
    const uint i = (uint)(g % Tq);
    const ulong bh = g / Tq;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    __global const float *a = dctx + dctx_off + (b * Tq + i) * dctx_ld + (ulong)h * DV;
    __global const float *c = ctx + ctx_off + (b * Tq + i) * ctx_ld + (ulong)h * DV;
    float s = 0.0f;
    for (uint x = 0; x < DV; x++) s = fma(a[x], c[x], s);
    dd[g] = s;
}
