/* rope.cl: rotary position embeddings on the rows of Q or K (src/attention/shell_project.c; the math, and the table
 * of cos and sin it reads, in src/attention/rope.c).
 *   rope_rows   one work-item per (row, head, pair) turns the pair by its position's angle: the forward (sign 1) or
 *               the gradient's rotation back (sign -1, the transpose); with rest > 0 the head's last `rest` values
 *               (past the rotated ones) are copied too, one work-item each, for a dst that is not src. Row t (of
 *               the launch) is at position t % period, or pos[pos_off + t] with has_pos (the caller's positions, or
 *               a varlen batch's rows from 0 in each sequence). Pairs (i, i + pairs), or (2i, 2i + 1) when
 *               interleaved.
 * src and dst may be the same rows (in place: each work-item reads its pair before it writes it). Offsets and
 * row strides count floats; cs holds (cos, sin) of each (position, pair). */
__kernel void rope_rows(__global const float *src, ulong src_off, uint src_ld, __global float *dst, ulong dst_off,
                        uint dst_ld, __global const float *cs, uint period, __global const uint *pos, ulong pos_off,
                        uint has_pos, uint heads, uint head_dim, uint pairs, uint interleaved, uint rest, float sign,
                        ulong total)
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
    const ulong at = 2 * ((has_pos ? (ulong)pos[pos_off + row] : row % period) * pairs + e);
    const float co = cs[at], si = sign * cs[at + 1];
    const float a = s[ia], b = s[ib];
    d[ia] = a * co - b * si;
    d[ib] = b * co + a * si;
}

/* rope_step: a decode step's new Q and K rows (src/decode/decode_cl.c), in place in the projection rows (row stride
 * ld; Q's q_heads heads from column 0, K's k_heads right after them): token t of sequence b, row row0[b] + t, at
 * position lens[b] + t, for t < valid[b] (offset x_off floats). One work-item per (sequence, token, head, pair);
 * n tokens per sequence. */
__kernel void rope_step(__global float *x, ulong x_off, uint ld, uint q_heads, uint k_heads, uint head_dim, uint pairs,
                        uint interleaved, __global const float *cs, __global const uint *lens,
                        __global const uint *valid, __global const uint *row0, uint n, ulong total)
{
    const ulong g = get_global_id(0);
    if (g >= total) return;
    const uint per = (q_heads + k_heads) * pairs;
    const ulong bt = g / per;
    const uint in_row = (uint)(g - bt * per), b = (uint)(bt / n), t = (uint)(bt % n);
    if (t >= valid[b]) return;
    const uint head = in_row / pairs, e = in_row % pairs;
    __global float *v = x + x_off + (ulong)(row0[b] + t) * ld + (ulong)head * head_dim; /* K's heads follow Q's */
    const uint ia = interleaved ? 2 * e : e, ib = interleaved ? 2 * e + 1 : e + pairs;
    const ulong at = 2 * ((ulong)(lens[b] + t) * pairs + e);
    const float co = cs[at], si = cs[at + 1];
    const float a = v[ia], bv = v[ib];
    v[ia] = a * co - bv * si;
    v[ib] = bv * co + a * si;
}
