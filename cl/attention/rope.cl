/* rope.cl: rotary position embeddings on the rows of Q or K (src/attention/shell_project.c; the math, and the table
 * of cos and sin it reads, in src/attention/rope.c).
 *   rope_rows   one work-item per (row, head, pair) turns the pair by its position's angle: the forward (sign 1) or
 *               the gradient's rotation back (sign -1, the transpose); with rest > 0 the head's last `rest` values
 *               (past the rotated ones) are copied too, one work-item each, for a dst that is not src. Row t (of
 *               the launch) is at position t % period. Pairs (i, i + pairs), or (2i, 2i + 1) when interleaved.
 * src and dst may be the same rows (in place: each work-item reads its pair before it writes it). Offsets and
 * row strides count floats; cs holds (cos, sin) of each (position, pair). */
__kernel void rope_rows(__global const float *src, ulong src_off, uint src_ld, __global float *dst, ulong dst_off,
                        uint dst_ld, __global const float *cs, uint period, uint heads, uint head_dim, uint pairs,
                        uint interleaved, uint rest, float sign, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const uint per = pairs + rest;
    const ulong row = g / ((ulong)heads * per);
    const uint in_row = (uint)(g - row * heads * per);
    const uint h = in_row / per, e = in_row % per;
    __global const float *s = src + src_off + row * src_ld + (ulong)h * head_dim;
    __global float *d = dst + dst_off + row * dst_ld + (ulong)h * head_dim;
    if (e >= pairs) { /* a value past the rotated ones, copied */
        const uint col = 2 * pairs + (e - pairs);
        d[col] = s[col];
        return;
    }
    const uint ia = interleaved ? 2 * e : e, ib = interleaved ? 2 * e + 1 : e + pairs;
    const ulong at = 2 * ((row % period) * pairs + e);
    const float co = cs[at], si = sign * cs[at + 1];
    const float a = s[ia], b = s[ib];
    d[ia] = a * co - b * si;
    d[ib] = b * co + a * si;
}
