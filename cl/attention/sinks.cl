/* sinks.cl: attention sinks (desc.sinks, gpt-oss) applied to a core's output rows (src/attention/shell_sinks.c).
 * A core gives row i of head h its output o = sum_j exp(s_ij - L) v_j and L = log sum_j exp(s_ij) (its lse). The
 * sink logit s_h joins the softmax's denominator and has no value, so the row's output is
 *   o' = o exp(L) / (exp(L) + exp(s_h)) = o / (1 + exp(s_h - L))
 * A row with no visible key (L = -inf) keeps o = 0; a NaN row stays NaN; s_h = -inf changes nothing.
 *   sink_rows   one work-item per output value, g = ((b*T + i)*H + h)*dv + c < total = B*T*H*dv (neighbours in a row's
 *               columns, so that a GPU's loads and stores coalesce): out[out_off + (b*T + i)*out_ld + h*dv + c] scaled
 *               by its row's L = lse[lse_off + (b*H + h)*T + i]. The row's share is computed again by each of its dv
 *               work-items: an exp and a division against a load and a store of the value. */
__kernel void sink_rows(__global float *out, ulong out_off, uint out_ld, __global const float *lse, ulong lse_off,
                        __global const float *sinks, uint H, uint dv, uint T, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const ulong hd = (ulong)H * dv, row = g / hd, b = row / T; /* row = b*T + i */
    const uint col = (uint)(g - row * hd), h = col / dv, i = (uint)(row - b * T);
    const float L = lse[lse_off + (b * H + h) * T + i], s = sinks[h];
    if (isnan(L)) return; /* a NaN row stays NaN */
    /* the share the row's keys keep: 1 / (1 + exp(s - L)), 0 with no key (and where exp overflows) */
    const float keep = L == -INFINITY ? 0.0f : 1.0f / (1.0f + exp(s - L));
    out[out_off + row * out_ld + col] *= keep;
}
