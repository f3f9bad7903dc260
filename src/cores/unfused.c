/* unfused.c: the unfused prefill core, the one that can return the attention weights. Through a score
 * matrix, in chunks that fit the device's max allocation:
 *   scores       strided-batched GEMMs on the plan's GEMM core, S = scale * Q K^T, reading Q and K where the
 *                projections (or the caller) left them: token-major rows, head h at column h*d, one batch per
 *                batch entry b (and per residue of the head mod G under grouped-query attention)
 *   softmax      softmax_rows (a work-group per row) or softmax_rows_item (a work-item per row):
 *                masks, softmax, dropout, in place (cl/cores/unfused_softmax.cl); a training plan's rows'
 *                log-sum-exp too
 *   context      the same batches: C = W V, written straight into the merged rows (B, Tq, H*dv)
 * The projections add the biases (adds_biases 0). A plan whose K and V are rounded to a half cache's type
 * (kv_half), or whose K and V rows a CLBlast call could not address in place (in_place_fits), copies them
 * instead: head split (split_heads, cl/cores/unfused_heads.cl: (B, T, H*d) rows -> (B, H, T, d), rounded,
 * key/value heads repeated for their G query heads), one batch over B*H, head merge (merge_heads:
 * (B, H, Tq, dv) -> (B, Tq, H*dv)).
 * Parameters: SOFTMAX, rows (a work-group per row, for GPUs) or item (a work-item per row, for CPUs); HEADS, a
 * kv_half plan's splits and merge with a work-item per element (elements, for GPUs: neighbours read neighbours) or
 * per row of the head (rows, for CPUs: float8 copies, the index arithmetic once per row). */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef clattn_view view;

enum { SOFTMAX, HEADS };
enum { SOFTMAX_ROWS = 0, SOFTMAX_ITEM = 1 };
enum { HEADS_ELEMENTS = 0, HEADS_ROWS = 1 };
static const size_t softmax_v[] = {SOFTMAX_ROWS, SOFTMAX_ITEM}, heads_v[] = {HEADS_ELEMENTS, HEADS_ROWS};
static const char *const softmax_labels[] = {"rows", "item"}, *const heads_labels[] = {"elements", "rows"};
static const clattn_core_param params[] = {
    [SOFTMAX] = {"SOFTMAX", softmax_v, 2, softmax_v, 2, softmax_labels},
    [HEADS] = {"HEADS", heads_v, 2, heads_v, 2, heads_labels},
};
/* a GPU's kernels, and a CPU's (the defaults there) */
static const char *const test_configs[] = {"SOFTMAX=rows,HEADS=elements", "SOFTMAX=item,HEADS=rows", NULL};

typedef struct unfused_state {
    const clattn_device *dev;
    const clattn_gemm *gemm; /* the plan's GEMM core (the layout's) */
    clattn_attention_desc d;
    clattn_core_layout lay;
    cl_program heads_prog, softmax_prog;
    cl_kernel k_split, k_merge, k_softmax;
    int heads_rows;      /* HEADS=rows: k_split and k_merge take a work-item per row of a head */
    size_t softmax_wg;   /* 0: k_softmax is softmax_rows_item, one work-item per row */
    int split;           /* kv_half, or K and V past CLBlast's reach: Q, K, V copied head-major (a kv_half plan's K
                            and V rounded), the context merged after */
    size_t chunk;        /* (b, h) pairs whose scores fit the score buffer at once */
    size_t rows_blk;     /* query rows per block: Tq, or fewer when one pair does not fit (chunk 1) */
    cl_mem q, k, v;      /* split: head-major (B, H, T, d) */
    cl_mem s;            /* scores (chunk * rows_blk, Tk) */
    cl_mem ctx;          /* split: (B, H, Tq, dv) */
} unfused_state;

/* The score matrices of all B*H (batch, head) pairs in one buffer when it fits the device's max
 * allocation, else in chunks of pairs, else (one pair does not fit) one pair at a time in blocks of query
 * rows. The GEMMs on them are split further to CLBlast's index range (runtime/blas.c). */
static void blocking(const clattn_caps *caps, const clattn_attention_desc *d, size_t *chunk, size_t *rows_blk)
{
    const size_t BH = d->batch * d->heads, Tq = d->seq_q;
    const size_t rows_fit = caps->max_alloc / (d->seq_kv * sizeof(float));
    if (rows_fit >= Tq) {
        *rows_blk = Tq;
        *chunk = rows_fit / Tq < BH ? rows_fit / Tq : BH;
    } else {
        *rows_blk = rows_fit;
        *chunk = 1;
    }
}

/* Can the GEMM core read K and V where they are? A CLBlast call takes B (Tk rows of the row stride) whole, within its
 * 32-bit indices (runtime/blas.c); past that the split's compact copies are what it can address. */
static int in_place_fits(const clattn_caps *caps, const clattn_attention_desc *d, const clattn_core_layout *lay)
{
    if (lay->gemm && !lay->gemm->core->uses_clblast) return 1; /* gemm_tiles: 64-bit indices */
    const size_t lim = clattn_blas_call_limit(caps), ld = lay->k_ld > lay->v_ld ? lay->k_ld : lay->v_ld;
    return d->seq_kv <= lim / ld;
}

static clattn_status supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                              char *why, size_t len)
{
    (void)core;
    const size_t row_bytes = d ? d->seq_kv * sizeof(float) : 0;
    if (d && row_bytes > caps->max_alloc) {
        snprintf(why, len, "one query's row of scores (Tk = %zu floats, %zu bytes) exceeds the device's max "
                 "allocation (%zu bytes)", d->seq_kv, row_bytes, caps->max_alloc);
        return CLATTN_STATUS_TOO_LARGE_FOR_DEVICE;
    }
    return CLATTN_STATUS_SUCCESS;
}

/* softmax_rows' work-group for rows of Tk scores: a power of two covering the row, from 16 to 256, within the
 * device's work-group limit (the compiled kernel may take fewer: build_kernels) */
static size_t softmax_wg(const clattn_caps *caps, size_t tk)
{
    size_t wg = 1;
    while (wg < tk && wg < 256) wg *= 2;
    wg = wg < 16 && tk > 1 ? 16 : wg;
    return caps && wg > caps->max_work_group ? clattn_pow2_at_most(caps->max_work_group) : wg;
}

/* A softmax work-item's loop iterations over rows of tk scores (its GEMMs are the GEMM core's), a Philox draw (10
 * rounds) per score under dropout: softmax_rows_item (wg 0) makes at most five passes over its row; a work-item of
 * softmax_rows' wg makes two over its share of the row, and the reduction's halvings. */
static size_t softmax_trips(const clattn_attention_desc *d, size_t tk, size_t wg)
{
    const size_t drop = d->dropout > 0.0f ? 11 : 0;
    if (!wg) return tk * (5 + drop) + 64;
    size_t halvings = 0;
    for (size_t w = wg; w > 1; w /= 2) halvings++;
    return (tk + wg - 1) / wg * (2 + drop) + halvings + 64;
}

/* The splits' and the merge's: a row's head elements with HEADS=rows (float8 pieces, then at most 7 one by one). */
static size_t heads_trips(const clattn_attention_desc *d, size_t heads)
{
    const size_t dmax = d->head_dim_qk > d->head_dim_v ? d->head_dim_qk : d->head_dim_v;
    return heads == HEADS_ROWS ? dmax / 8 + 7 : 1;
}

static size_t trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    const clattn_core_params *p)
{
    (void)core;
    const size_t tk = d->seq_kv ? d->seq_kv : d->seq_q;
    const size_t sm = softmax_trips(d, tk, p->v[SOFTMAX] == SOFTMAX_ITEM ? 0 : softmax_wg(caps, tk));
    const size_t hd = heads_trips(d, p->v[HEADS]);
    return sm > hd ? sm : hd;
}

/* SOFTMAX: a work-item per row on CPU devices (measured on PoCL: bench/experiments/softmax_variants.c), a work-group
 * per row elsewhere, and where one work-item's passes over a row would run past the driver's loop limit (long rows on
 * Mesa's llvmpipe). HEADS: a work-item per row of a head on CPU devices (PoCL, B4 T512 E512 H8, when every plan still
 * split its heads: the three splits 9.5 ms with a work-item per element, 1.6 per row, the merge 2.35 and 0.2;
 * bench/results/pocl-2core-reshape.md), per element elsewhere (neighbouring work-items read neighbours). */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    const int cpu = caps->dclass == CLATTN_CLASS_CPU;
    p->v[SOFTMAX] = cpu ? SOFTMAX_ITEM : SOFTMAX_ROWS;
    p->v[HEADS] = cpu ? HEADS_ROWS : HEADS_ELEMENTS;
    if (d && trips(core, caps, d, p) > clattn_loop_budget(caps)) p->v[SOFTMAX] = SOFTMAX_ROWS;
    if (d && trips(core, caps, d, p) > clattn_loop_budget(caps)) p->v[HEADS] = HEADS_ELEMENTS;
    return 1;
}

static size_t workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay)
{
    (void)core;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, H = d->heads;
    size_t chunk, rows_blk;
    blocking(caps, d, &chunk, &rows_blk);
    const int split = d->kv_half || !in_place_fits(caps, d, lay);
    const size_t copies = split ? B * H * (Tq + Tk) * (d->head_dim_qk + d->head_dim_v) : 0;
    return chunk * rows_blk * Tk + copies;
}

static void release(void *state)
{
    unfused_state *s = state;
    if (!s) return;
    cl_mem *mems[] = {&s->q, &s->k, &s->v, &s->s, &s->ctx};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) clattn_mem_release(mems[i]);
    clattn_kernel_release(&s->k_split);
    clattn_kernel_release(&s->k_merge);
    clattn_kernel_release(&s->k_softmax);
    clattn_program_release(&s->heads_prog);
    clattn_program_release(&s->softmax_prog);
    free(s);
}

static size_t device_bytes(const void *state)
{
    const unfused_state *s = state;
    return clattn_mem_bytes(s->q) + clattn_mem_bytes(s->k) + clattn_mem_bytes(s->v) + clattn_mem_bytes(s->s) +
           clattn_mem_bytes(s->ctx);
}

static clattn_status build_kernels(unfused_state *s, const clattn_core_params *p)
{
    const clattn_attention_desc *d = &s->d;
    const char *heads_src[] = {"common/half", "cores/unfused_heads"};
    TRY(clattn_program_build(s->dev, heads_src, 2, "-cl-std=CL1.2", &s->heads_prog));
    s->heads_rows = p->v[HEADS] == HEADS_ROWS;
    TRY(clattn_kernel_create(s->heads_prog, s->heads_rows ? "split_heads_rows" : "split_heads", &s->k_split));
    TRY(clattn_kernel_create(s->heads_prog, s->heads_rows ? "merge_heads_rows" : "merge_heads", &s->k_merge));
    size_t wg = softmax_wg(NULL, d->seq_kv);
    char opts[256];
    clattn_core_attention_defines(d, CLATTN_DEFINES_MASKS | CLATTN_DEFINES_TRAIN, opts, sizeof opts);
    const char *softmax_src[] = {"common/philox", "common/mask", "cores/unfused_softmax"};
    TRY(clattn_program_build_wg(s->dev, softmax_src, 3, opts, "softmax_rows", &wg, &s->softmax_prog,
                                &s->k_softmax));
    s->softmax_wg = wg;
    if (p->v[SOFTMAX] == SOFTMAX_ITEM) {
        clattn_kernel_release(&s->k_softmax);
        TRY(clattn_kernel_create(s->softmax_prog, "softmax_rows_item", &s->k_softmax));
        s->softmax_wg = 0;
    }
    /* the bound trips() counted, with the work-group the compiled kernel took */
    char what[96];
    snprintf(what, sizeof what, "unfused's softmax (SOFTMAX=%s, Tk = %zu, %zu work-items per row)",
             s->softmax_wg ? "rows" : "item", d->seq_kv, s->softmax_wg ? s->softmax_wg : (size_t)1);
    TRY(clattn_loop_check(&s->dev->caps, softmax_trips(d, d->seq_kv, s->softmax_wg), what));
    snprintf(what, sizeof what, "unfused's head split and merge (HEADS=rows, heads of %zu and %zu)", d->head_dim_qk,
             d->head_dim_v);
    return clattn_loop_check(&s->dev->caps, heads_trips(d, p->v[HEADS]), what);
}

static clattn_status build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                           const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, H = d->heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    if (!lay->gemm) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s needs the plan's GEMM core", core->name);
    unfused_state *s = clattn_calloc(1, sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the %s state", core->name);
    s->dev = dev, s->d = *d, s->lay = *lay, s->gemm = lay->gemm;
    s->split = d->kv_half || !in_place_fits(&dev->caps, d, lay);
    blocking(&dev->caps, d, &s->chunk, &s->rows_blk);
    clattn_status st = build_kernels(s, p);
    if (!st && s->split && !(st = clattn_buffer_new(dev, B * H * Tq * dk, sizeof(float), NULL, "Q", &s->q)) &&
        !(st = clattn_buffer_new(dev, B * H * Tk * dk, sizeof(float), NULL, "K", &s->k)) &&
        !(st = clattn_buffer_new(dev, B * H * Tk * dv, sizeof(float), NULL, "V", &s->v)))
        st = clattn_buffer_new(dev, B * H * Tq * dv, sizeof(float), NULL, "the context", &s->ctx);
    if (!st)
        st = clattn_buffer_new(dev, s->chunk * s->rows_blk * Tk, sizeof(float), NULL, "the attention scores", &s->s);
    if (st) {
        release(s);
        return st;
    }
    *state = s;
    return CLATTN_STATUS_SUCCESS;
}

/* dst (B, H, T, D) from token-major src rows of width ld, head h at column h*D; G > 1 repeats key/value head h/G
 * for G query heads. */
static clattn_status split(const unfused_state *s, view src, size_t ld, cl_mem dst, size_t T, size_t D, size_t G,
                           int round_half)
{
    const size_t total = s->d.batch * s->d.heads * T * (s->heads_rows ? 1 : D);
    clattn_args a;
    clattn_args_begin(&a, s->k_split, "split_heads");
    clattn_arg_view(&a, src);
    clattn_arg_u32(&a, (cl_uint)ld);
    clattn_arg_u32(&a, 0);
    clattn_arg_view(&a, (view){dst, 0});
    clattn_arg_u32(&a, (cl_uint)T);
    clattn_arg_u32(&a, (cl_uint)s->d.heads);
    clattn_arg_u32(&a, (cl_uint)D);
    clattn_arg_u32(&a, (cl_uint)G);
    clattn_arg_u32(&a, (cl_uint)round_half);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(s->dev, s->k_split, total, "enqueue split_heads");
}

static clattn_status merge(const unfused_state *s, view src, view dst)
{
    const clattn_attention_desc *d = &s->d;
    const size_t total = d->batch * d->heads * d->seq_q * (s->heads_rows ? 1 : d->head_dim_v);
    clattn_args a;
    clattn_args_begin(&a, s->k_merge, "merge_heads");
    clattn_arg_view(&a, src);
    clattn_arg_view(&a, dst);
    clattn_arg_u32(&a, (cl_uint)d->seq_q);
    clattn_arg_u32(&a, (cl_uint)d->heads);
    clattn_arg_u32(&a, (cl_uint)d->head_dim_v);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(s->dev, s->k_merge, total, "enqueue merge_heads");
}

/* Softmax over the rows row0 .. row0 + rows - 1, stored from sc on: one launch of at most
 * max_launch_items work-items (the kernels take their first row as an argument). */
static clattn_status softmax_launch(const unfused_state *s, view sc, size_t row0, size_t rows,
                                    const clattn_core_io *io)
{
    const clattn_attention_desc *d = &s->d;
    clattn_args a;
    clattn_args_begin(&a, s->k_softmax, s->softmax_wg ? "softmax_rows" : "softmax_rows_item");
    clattn_arg_view(&a, sc);
    clattn_core_arg_masks(&a, io->kpm, io->mask, d);
    clattn_arg_u64(&a, row0);
    if (s->softmax_wg == 0) clattn_arg_u64(&a, rows);
    clattn_core_arg_dropout(&a, d, io->seed, io->drop_b0);
    clattn_arg_view(&a, io->lse); /* each row's log-sum-exp (training plans), indexed by the global row */
    TRY(clattn_args_end(&a));
    size_t global = s->softmax_wg ? rows * s->softmax_wg : rows;
    TRY(clattn_device_runs(s->dev, "enqueue softmax_rows"));
    clattn_note_launch(global);
    if (s->softmax_wg == 0) { /* one work-item per row */
        CL_CHECK(clEnqueueNDRangeKernel(s->dev->queue, s->k_softmax, 1, NULL, &global, NULL, 0, NULL, NULL),
                 "enqueue softmax_rows_item");
        return CLATTN_STATUS_SUCCESS;
    }
    size_t local = s->softmax_wg;
    CL_CHECK(clEnqueueNDRangeKernel(s->dev->queue, s->k_softmax, 1, NULL, &global, &local, 0, NULL, NULL),
             "enqueue softmax_rows");
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status softmax(const unfused_state *s, view sc, size_t row0, size_t rows, const clattn_core_io *io)
{
    const size_t per_row = s->softmax_wg ? s->softmax_wg : 1;
    size_t step = s->dev->caps.max_launch_items / per_row;
    if (step == 0) step = 1;
    for (size_t r = 0; r < rows; r += step) {
        const size_t n = rows - r < step ? rows - r : step;
        TRY(softmax_launch(s, (view){sc.mem, sc.off + r * s->d.seq_kv}, row0 + r, n, io));
    }
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status gemm_batched(const unfused_state *s, int trans_b, size_t m, size_t n, size_t k, float alpha,
                                  view a, size_t lda, size_t sa, view b, size_t ldb, size_t sb, view c, size_t ldc,
                                  size_t sc, size_t count, const char *what)
{
    const clattn_gemm_call g = {.m = m, .n = n, .k = k, .trans_b = trans_b, .alpha = alpha, .beta = 0.0f, .a = a,
                                .b = b, .c = c, .lda = lda, .ldb = ldb, .ldc = ldc, .count = count, .stride_a = sa,
                                .stride_b = sb, .stride_c = sc, .what = what};
    return clattn_gemm_run(s->gemm, &g);
}

enum { SCORES, CONTEXT };

/* One product (SCORES: S = scale Q K^T; CONTEXT: out = S V) of the pairs g0 .. g0+n-1 (pair b*H + h), query rows
 * i0 .. i0+r-1 of each, S holding their scores pair after pair (r rows of Tk each). Split: Q, K, V and the context
 * head-major, one batch. Else Q, K, V and the output where they are, token-major rows with head h at column h*d:
 * a batch per batch entry b and per residue of h mod G (heads h, h+G, ... of b read key/value heads h/G, h/G+1, ...
 * and write every G-th block of S). */
static clattn_status product(const unfused_state *s, const clattn_core_io *io, int which, view S, size_t g0, size_t n,
                             size_t i0, size_t r)
{
    const clattn_attention_desc *d = &s->d;
    const size_t Tq = d->seq_q, Tk = d->seq_kv, H = d->heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    const size_t sz = r * Tk, row0 = g0 * Tq + i0; /* S's floats per pair; the first pair's first row */
    if (s->split) {
        if (which == SCORES)
            return gemm_batched(s, 1, r, Tk, dk, d->scale, (view){s->q, row0 * dk}, dk, Tq * dk,
                                (view){s->k, g0 * Tk * dk}, dk, Tk * dk, S, Tk, sz, n, "scores GEMM");
        return gemm_batched(s, 0, r, dv, Tk, 1.0f, S, Tk, sz, (view){s->v, g0 * Tk * dv}, dv, Tk * dv,
                            (view){s->ctx, row0 * dv}, dv, Tq * dv, n, "context GEMM");
    }
    const size_t G = H / d->kv_heads, ql = s->lay.q_ld, kl = s->lay.k_ld, vl = s->lay.v_ld, ol = s->lay.out_ld;
    for (size_t p = g0; p < g0 + n;) {
        const size_t b = p / H, h_lo = p % H, h_hi = H - h_lo < g0 + n - p ? H : h_lo + (g0 + n - p);
        for (size_t h = h_lo; h < h_lo + G && h < h_hi; h++) { /* heads h, h+G, ... below h_hi */
            const size_t count = (h_hi - h + G - 1) / G;
            const view Sh = {S.mem, S.off + (b * H + h - g0) * sz};
            if (which == SCORES)
                TRY(gemm_batched(s, 1, r, Tk, dk, d->scale,
                                 (view){io->q.mem, io->q.off + (b * Tq + i0) * ql + h * dk}, ql, G * dk,
                                 (view){io->k.mem, io->k.off + b * Tk * kl + h / G * dk}, kl, dk, Sh, Tk, G * sz, count,
                                 "scores GEMM"));
            else
                TRY(gemm_batched(s, 0, r, dv, Tk, 1.0f, Sh, Tk, G * sz,
                                 (view){io->v.mem, io->v.off + b * Tk * vl + h / G * dv}, vl, dv,
                                 (view){io->out.mem, io->out.off + (b * Tq + i0) * ol + h * dv}, ol, G * dv, count,
                                 "context GEMM"));
        }
        p += h_hi - h_lo;
    }
    return CLATTN_STATUS_SUCCESS;
}

/* Per chunk of (b, h) pairs whose scores fit the score buffer (all of them, usually), or per block of query rows of
 * one pair: scores, softmax in place, context. With a caller's attn buffer the blocks are computed in place there.
 * A plan that copies the heads (split: kv_half, or K and V past CLBlast's reach) splits them first and merges them
 * last. */
static clattn_status run_shape(const unfused_state *s, const clattn_core_io *io)
{
    const clattn_attention_desc *d = &s->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    const size_t H = d->heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    if (s->split) {
        const size_t G = H / d->kv_heads; /* K and V expanded to H heads: the batched GEMMs see plain MHA */
        TRY(split(s, io->q, s->lay.q_ld, s->q, Tq, dk, 1, 0));
        TRY(split(s, io->k, s->lay.k_ld, s->k, Tk, dk, G, d->kv_half));
        TRY(split(s, io->v, s->lay.v_ld, s->v, Tk, dv, G, d->kv_half));
        TRY(clattn_core_mark(io, CLATTN_STAGE_HEAD_SPLIT));
    }
    const size_t BH = B * H, chunk = s->chunk, rb = s->rows_blk;
    int first = 1;
    for (size_t g0 = 0; g0 < BH; g0 += chunk) {
        const size_t n = BH - g0 < chunk ? BH - g0 : chunk;
        for (size_t i0 = 0; i0 < Tq; i0 += rb) { /* one block when rb = Tq (then n pairs are contiguous) */
            const size_t r = Tq - i0 < rb ? Tq - i0 : rb, row0 = g0 * Tq + i0;
            view S = io->attn.mem ? (view){io->attn.mem, io->attn.off + row0 * Tk} : (view){s->s, 0};
            TRY(product(s, io, SCORES, S, g0, n, i0, r));
            if (first) TRY(clattn_core_mark(io, CLATTN_STAGE_SCORES));
            TRY(softmax(s, S, row0, n * r, io));
            if (first) TRY(clattn_core_mark(io, CLATTN_STAGE_SOFTMAX));
            first = 0;
            if (io->attn_host)
                CL_CHECK(clEnqueueReadBuffer(s->dev->queue, S.mem, CL_FALSE, S.off * sizeof(float),
                                             n * r * Tk * sizeof(float), io->attn_host + row0 * Tk, 0, NULL, NULL),
                         "reading the attention weights");
            TRY(product(s, io, CONTEXT, S, g0, n, i0, r));
        }
    }
    TRY(clattn_core_mark(io, CLATTN_STAGE_CONTEXT));
    if (s->split) {
        TRY(merge(s, (view){s->ctx, 0}, io->out));
        TRY(clattn_core_mark(io, CLATTN_STAGE_HEAD_MERGE));
    }
    return CLATTN_STATUS_SUCCESS;
}

/* A varlen batch's sequence (io->seq_q): the same on a copy of the state whose description is the sequence's, a batch of
 * one of its lengths (its buffers, made for the plan's longest, hold it). */
static clattn_status run(void *state, const clattn_core_io *io)
{
    unfused_state s = *(const unfused_state *)state;
    s.d = clattn_core_shape(&s.d, io->seq_q, io->seq_kv);
    return run_shape(&s, io);
}

const clattn_core clattn_core_unfused = {
    .name = "unfused",
    .kind = CLATTN_CORE_PREFILL,
    .algorithm = CLATTN_ALGORITHM_UNFUSED,
    .produces_weights = 1,
    .saves_row_stats = 1,
    .params = params,
    .nparams = 2,
    .test_configs = test_configs,
    .supports = supports,
    .defaults = defaults,
    .trips = trips,
    .workspace = workspace,
    .build = build,
    .run = run,
    .device_bytes = device_bytes,
    .release = release,
};
