/* flash_common.cl: what the flash family's kernels share (src/cores/flash.c builds each member after it).
 * For each (batch, head) and block of queries, a flash kernel streams the keys and values once, keeping per
 * query row a running max m, a running sum l of exp(score - m) and an unnormalised output acc in fp32
 * (online softmax: when m grows, l and acc are rescaled by exp(m_old - m_new)); it writes acc / l once.
 * No score matrix in global memory.
 *
 * Layout: Q, K and V are read where the projections left them, token-major rows with a row stride (ld)
 * and head h at columns h*DK (Q, K) or h*DV (V):
 *   Q[b, t, h, c] = q[q_off + (b*Tq + t)*q_ld + h*DK + c]      (K, V likewise over Tk)
 * and the output goes to the merged layout out[out_off + (b*Tq + i)*out_ld + h*DV + c].
 * Every member takes the same arguments (src/cores/flash.c lists them).
 *
 * Semantics (those of the reference, src/attention/ref.c): score = (q . k) * scale (+ float mask); hidden keys (causal
 * j > i, sliding window, key padding, bool mask) get weight 0; a row with no visible key (or only -inf scores) gives
 * output 0; a NaN score or a +inf score makes the row NaN; dropout keeps weight (b + drop_b0, h, i, j) by
 * clattn_dropout_keep (philox.cl) and scales it (drop_b0: a varlen sequence's index). The running max starts at
 * -FLT_MAX, a finite value, so a fully hidden block computes exp(-inf - m) = 0 and never inf - inf. With CAUSAL, key
 * blocks wholly after the block's last query are never visited, and with a sliding WINDOW those wholly before the
 * block's first query's window; only the blocks that cross an edge are masked.
 *
 * Specialised by -D (philox.cl, half.cl, mask.cl and online.cl go first; defaults let each compile alone):
 *   DK, DV           head sizes of queries/keys and of values
 *   GROUP            query heads per key/value head (grouped-query attention): head h reads K/V head h/GROUP
 *   KV_HALF          1 / 2: the plan's keys and values are half / bfloat16 values (kv_half, the KV cache's type):
 *                    the float K and V are rounded to it as they are read (half.cl);
 *                    to half as they are read (half.cl); the decode kernels read a half cache (decode_common.cl)
 *   CAUSAL, WINDOW, KPM, MASK_KIND (0 none, 1 bool, 2 float), DROPOUT   the masks and dropout (mask.cl)
 *   IO_DTYPE         0: Q, K, V and the output float; 1 / 2: half / bfloat16, read and written as they are by
 *                    members with reads_dtypes (flash_rows) for a half plan without projections (common/dtype.cl)
 *   LSE              1 (training plans): each row's log-sum-exp, m + log(l) in natural units, to
 *                    lse[lse_off + (b*H + h)*Tq + i] (flash_lse below; split rows: common/combine.cl)
 * and by each member's own tuning parameters (src/cores/<member>.c).
 */
#ifndef DK
#define DK 64
#endif
#ifndef DV
#define DV DK
#endif
#ifndef GROUP
#define GROUP 1
#endif
#ifndef KV_HALF
#define KV_HALF 0
#endif
#ifndef SPLIT
#define SPLIT 1
#endif
#ifndef LSE
#define LSE 0
#endif
#if KV_HALF == 2
#define KVR(x) clattn_round_bf16(x)
#elif KV_HALF
#define KVR(x) clattn_round_half(x)
#else
#define KVR(x) (x)
#endif

/* The family's kernel arguments, in flash.c's order. extent: the launch's first work-group (PER_GROUP members) or the
 * work-items in all (PER_ITEM); drop_b0: the batch index dropout keys entry 0 by (a varlen batch's sequence, run as a
 * batch of one: its index; else 0); lse, lse_off: the rows' log-sum-exp (LSE). Q, K, V and the output are io_t
 * (common/dtype.cl): float, or with IO_DTYPE (a member with reads_dtypes, a half plan's own arrays) half or bfloat16. */
#define FLASH_ARGS \
    __global const io_t *q, ulong q_off, uint q_ld, __global const io_t *k, ulong k_off, uint k_ld, \
    __global const io_t *v, ulong v_off, uint v_ld, __global io_t *out, ulong out_off, uint out_ld, \
    __global const uchar *kpm, ulong kpm_off, __global const mask_t *mask, ulong mask_off, uint Tq, uint Tk, \
    uint H, float scale, ulong extent, uint seed_lo, uint seed_hi, uint threshold, float keep_scale, \
    uint drop_b0, __global float *lse, ulong lse_off

/* What one work-group of a PER_GROUP member with key parts (flash_gemm, flash_mma) computes: work-group id
 * g = ((b*H + h) * nblk + block')*SPLIT + part, block' counting from the last block under CAUSAL (the
 * longest blocks first); query rows i0 .. i0+bq-1 of (b, h) and keys jbeg .. jend-1: under CAUSAL up to the
 * block's last row, with a WINDOW from its first row's window, and of those this part's share of the tiles
 * of bk keys. */
typedef struct flash_block {
    ulong b;
    uint h, i0, jbeg, jend, part;
} flash_block;

inline flash_block flash_block_of(ulong g, uint bq, uint bk, uint Tq, uint Tk, uint H)
{
    flash_block f;
    f.part = (uint)(g % SPLIT);
    g /= SPLIT;
    const uint nblk = (Tq + bq - 1) / bq;
    uint blk = (uint)(g % nblk);
#if CAUSAL
    blk = nblk - 1 - blk; /* the longest blocks first */
#endif
    const ulong bh = g / nblk;
    f.h = (uint)(bh % H);
    f.b = bh / H;
    f.i0 = blk * bq;
    f.jbeg = 0;
    f.jend = Tk;
#if CAUSAL
    f.jend = min(Tk, min(f.i0 + bq, Tq));
#endif
#if WINDOW
    f.jbeg = f.i0 >= WINDOW ? f.i0 - WINDOW + 1 : 0;
#endif
#if SPLIT > 1
    { /* this part's share of the block's key tiles */
        const uint tiles = f.jend > f.jbeg ? (f.jend - f.jbeg + bk - 1) / bk : 0;
        const uint t0 = f.part * tiles / SPLIT, t1 = (f.part + 1) * tiles / SPLIT;
        f.jend = min(f.jend, f.jbeg + t1 * bk);
        f.jbeg += t0 * bk;
    }
#endif
    return f;
}

/* The weight applied to V: p, or after dropout p * keep_scale or 0. */
inline float flash_drop(float p, uint seed_lo, uint seed_hi, uint b, uint h, uint i, uint j, uint threshold,
                        float keep_scale)
{
#if DROPOUT
    return clattn_dropout_keep(seed_lo, seed_hi, b, h, i, j, threshold) ? p * keep_scale : 0.0f;
#else
    return p;
#endif
}

/* Training plans (LSE): row i of (b, h)'s log-sum-exp from its running max m and sum l of exp(s - m), natural
 * units, or base 2 (m in log2 units, l of exp2) when base2: -inf for a row that saw no visible key (l = 0), NaN
 * stays NaN. */
inline void flash_lse(__global float *lse, ulong lse_off, ulong b, uint h, uint H, uint i, uint Tq, float m, float l,
                      int base2)
{
#if LSE
    lse[lse_off + (b * H + h) * (ulong)Tq + i] = l == 0.0f ? -INFINITY : base2 ? (m + log2(l)) * M_LN2_F : m + log(l);
#endif
}

/* acc / l, with 0 for a row that saw no visible key (l = 0); NaN stays NaN. */
inline float flash_out(float acc, float l)
{
    return l == 0.0f ? 0.0f : acc / l;
}
