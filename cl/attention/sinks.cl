/* sinks.cl: attention sinks (desc.sinks, gpt-oss) applied to a core's output rows (src/attention/shell_sinks.c).
 * A core gives row i of head h its output o = sum_j exp(s_ij - L) v_j and L = log sum_j exp(s_ij) (its lse). The
 * sink logit s_h joins the softmax's denominator and has no value, so the row's output is
 *   o' = o exp(L) / (exp(L) + exp(s_h)) = o / (1 + exp(s_h - L))
 * A row with no visible key (L = -inf) keeps o = 0; a NaN row stays NaN; s_h = -inf changes nothing.
 *   sink_rows   one work-item per output value, g = ((b*T + i)*H + h)*dv + c < total = B*T*H*dv (neighbours in a row's
 *               columns, so that a GPU's loads and stores coalesce): out[out_off + (b*T + i)*out_ld + h*dv + c] scaled
 *               by its row's L = lse[lse_off + (b*H + h)*T + i]. The row's share is computed again by each of its dv
 *               work-items: an exp and a division against a load and a store of the value.
 *   sink_lse    (training plans, after sink_rows) one work-item per row, g = (b*H + h)*T + i < total = B*H*T: the
 *               row's lse becomes that of its weights with the sink, L' = log(exp(L) + exp(s_h)): s_h for a row with
 *               no visible key, L where s_h = -inf, NaN where L is NaN. The backward takes L' and o' as a training
 *               plan's statistics: P = exp(s - L') are the weights, and D = dO . o' their row sum with dP, as the
 *               sink has no value. */
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

__kernel void sink_lse(__global float *lse, ulong lse_off, __global const float *sinks, uint H, uint T, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const uint h = (uint)(g / T % H);
    const float L = lse[lse_off + g], s = sinks[h];
    if (isnan(L) || s == -INFINITY) return;
    const float m = fmax(L, s); /* (L = -inf: s) */
    lse[lse_off + g] = m + log(exp(L - m) + exp(s - m));
}
