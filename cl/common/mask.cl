/* mask.cl: the masks of an attention score, shared by the unfused softmax and the flash kernels (this file goes
 * before them, after philox.cl). Specialised by -D (defaults let it compile alone):
 *   CAUSAL    1: key j is hidden from query i when j > i (top-left aligned)
 *   WINDOW    W > 0 (with CAUSAL): key j is also hidden when i - j >= W (sliding window); 0 = none
 *   KPM       1: key padding mask (B, Tk) of uchar, nonzero = hidden
 *   MASK_KIND 0 none, 1 bool (Tq, Tk) uchar nonzero = hidden, 2 float (Tq, Tk) added
 *   MASK_PB   1: one (Tq, Tk) mask per batch entry; MASK_PH 1: one per query head ((B,) (H,) Tq, Tk: CLATTN_MASK_AT)
 *   DROPOUT   1: training-mode dropout (philox.cl) */
#ifndef CLATTN_MASK_CL
#define CLATTN_MASK_CL

#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef KPM
#define KPM 0
#endif
#ifndef MASK_KIND
#define MASK_KIND 0
#endif
#ifndef DROPOUT
#define DROPOUT 0
#endif
#ifndef MASK_PB
#define MASK_PB 0
#endif
#ifndef MASK_PH
#define MASK_PH 0
#endif

/* Where query head h of batch entry b finds its (Tq, Tk) mask, in elements from the mask's first: 0 for a mask all
 * share, else past the masks of the batch entries (MASK_PB) and heads (MASK_PH) before it. */
#define CLATTN_MASK_AT(b, h, H, Tq, Tk)                                                                     \
    (((MASK_PB ? (ulong)(b) : 0ul) * (MASK_PH ? (ulong)(H) : 1ul) + (MASK_PH ? (ulong)(h) : 0ul)) * (ulong)(Tq) * \
     (ulong)(Tk))

#if MASK_KIND == 2
typedef float mask_t;
#else
typedef uchar mask_t;
#endif

/* Score v (already scaled) of key j for query i of batch entry b, after the masks: -INFINITY
 * when hidden, v + mask[i, j] with a float mask. kpm and mask point at element 0. */
inline float clattn_mask_score(float v, uint i, uint j, ulong b, uint Tk, __global const uchar *kpm,
                               __global const mask_t *mask)
{
    int hidden = 0;
#if CAUSAL
    hidden |= j > i;
#endif
#if WINDOW
    hidden |= j <= i && i - j >= WINDOW;
#endif
#if KPM
    hidden |= kpm[b * Tk + j] != 0;
#endif
#if MASK_KIND == 1
    hidden |= mask[(ulong)i * Tk + j] != 0;
#elif MASK_KIND == 2
    v += mask[(ulong)i * Tk + j];
#endif
    return hidden ? -INFINITY : v;
}

#endif
