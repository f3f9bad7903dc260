/* sinks.cl: attention sinks (desc.sinks, gpt-oss) applied to a core's output rows (src/attention/shell_sinks.c).
 * A core gives row i of head h its output o = sum_j exp(s_ij - L) v_j and L = log sum_j exp(s_ij) (its lse). The
 * sink logit s_h joins the softmax's denominator and has no value, so the row's output is
 *   o' = o exp(L) / (exp(L) + exp(s_h)) = o / (1 + exp(s_h - L))
 * A row with no visible key (L = -inf) keeps o = 0; a NaN row stays NaN; s_h = -inf changes nothing.
 *   sink_rows   one work-item per (batch entry b, head h, row i), g = (b*H + h)*T + i < total = B*H*T: the row's dv
 *               values at out[out_off + (b*T + i)*out_ld + h*dv ..] scaled by its L = lse[lse_off + g]. */
__kernel void sink_rows(__global float *out, ulong out_off, uint out_ld, __global const float *lse, ulong lse_off,
                        __global const float *sinks, uint H, uint dv, uint T, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const ulong bh = g / T, b = bh / H;
    const uint i = (uint)(g - bh * T), h = (uint)(bh - b * H);
    const float L = lse[lse_off + g], s = sinks[h];
    if (isnan(L)) return;
    /* the share the row's keys keep: 1 / (1 + exp(s - L)), 0 with no key (and where exp overflows) */
    const float keep = L == -INFINITY ? 0.0f : 1.0f / (1.0f + exp(s - L));
    __global float *o = out + out_off + (b * T + i) * out_ld + (ulong)h * dv;
    for (uint c = 0; c < dv; c++) o[c] *= keep;
}
