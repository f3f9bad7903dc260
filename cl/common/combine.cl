/* combine.cl: the split-K merge of the prefill and decode cores, one kernel for both: the parts of the flash
 * family (src/cores/flash.c, SPLIT key parts per block) and of the decode family (src/cores/decode_family.c).
 * src/attention/merge.c (clattn_attention_merge) is its host twin, over parts given as (out_p, lse_p).
 *
 * For output element (row, h, c), row = b*n + t (n rows per sequence), part p left its unnormalised output
 *   acc[a_off + row*a_row + p*a_part + h*a_head + c]
 * and its running max m and sum l at st[s_off + row*s_row + p*s_part + h*s_head] and + 1, m in base 2 (base2 = 1: the
 * flash kernels' exp2) or in natural units (the decode kernels'). Then
 *   out = sum_p acc_p b^(m_p - M) / sum_p l_p b^(m_p - M),   M = max_p m_p
 * the result one pass over all keys gives: 0 where no part saw a key (sum 0) and, with valid, for the padding
 * tokens t >= valid[b] (decode steps); a NaN sum or output stays NaN. With lse (not NULL) each row's log-sum-exp
 * in natural units, M + log(L) (-inf with no key), at lse[lse_off + (b*H + h)*n + t]. One work-item per output
 * element, total = rows*H*dv. out is io_t (common/dtype.cl, included before this): a flash program built for a half
 * plan's own arrays (IO_DTYPE) writes them rounded once; float everywhere else. */
__kernel void split_combine(__global const float *acc, ulong a_off, ulong a_row, uint a_part, uint a_head,
                            __global const float *st, ulong s_off, ulong s_row, uint s_part, uint s_head, uint parts,
                            uint base2, uint H, uint dv, uint n, __global const uint *valid, __global io_t *out,
                            ulong out_off, uint out_ld, __global float *lse, ulong lse_off, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const uint c = (uint)(g % dv);
    const ulong rh = g / dv;
    const uint h = (uint)(rh % H);
    const ulong row = rh / H;
    const ulong b = row / n;
    const uint t = (uint)(row % n);
    __global const float *a = acc + a_off + row * a_row + (ulong)h * a_head + c;
    __global const float *s = st + s_off + row * s_row + (ulong)h * s_head;
    float M = -FLT_MAX;
    for (uint p = 0; p < parts; p++) M = fmax(M, s[(ulong)p * s_part]);
    float L = 0.0f, sum = 0.0f;
    for (uint p = 0; p < parts; p++) {
        const float f = base2 ? exp2(s[(ulong)p * s_part] - M) : exp(s[(ulong)p * s_part] - M);
        L += s[(ulong)p * s_part + 1] * f;
        sum += a[(ulong)p * a_part] * f;
    }
    const int pad = valid && t >= valid[b];
    IO_STORE(pad || L == 0.0f ? 0.0f : sum / L, out_off + row * out_ld + (ulong)h * dv + c, out); /* rounded once */
    if (lse && c == 0)
        lse[lse_off + (b * H + h) * (ulong)n + t] = L == 0.0f ? -INFINITY : (base2 ? M * M_LN2_F : M) + log(L);
}
