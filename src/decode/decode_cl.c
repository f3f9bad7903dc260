/* decode_cl.c: a decode step on an OpenCL device:
 *   1. projections      x (rows, E) -> [Q | K | V] rows (rows: B*n, or a packed step's cu_new[B]), one GEMM
 *                       (biases as prefilled rows), or for a
 *                       step's few rows linear_small (attention/linear.c); with separate_value the given Q, K
 *                       and V copied into those rows' columns (rectangular copies, no kernel)
 *   1b. rope            with desc.rope, the new tokens' Q and K rotated in place at their positions (rope_step,
 *                       cl/attention/rope.cl; without projections x is first copied into Q|K|V rows), or at the
 *                       step's rope_positions (rope_rows over the step's rows, each row's position uploaded)
 *   2. append           kv_append (cl/decode/kv_append.cl): each real token's K and V into the cache at
 *                       lens[b] + t (float, half, bfloat16, or int8 codes and a scale per row)
 *   3. attend           the decode core select.c chose (src/cores/decode_attend.c)
 *   4. out projection   as 1.
 * Everything is launched once with no work at plan creation, so that the driver compiles it then and not
 * in the first step. */
#include "decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef clattn_view view;

struct clattn_decode_cl {
    clattn_linear lin;
    clattn_core_instance core;
    clattn_core_layout lay;
    cl_program append_prog;
    cl_kernel k_append;
    cl_program rope_prog;      /* desc.rope: rope_step, and the plan's table of cos and sin on the device */
    cl_kernel k_rope;
    cl_kernel k_rope_rows;     /* desc.rope, a step with rope_positions: rope_rows at pos_buf's positions */
    cl_mem pos_buf;            /* (B*seq_q) uint: such a step's positions, one per row */
    cl_mem rope_cs;
    size_t rope_positions;     /* the positions rope_cs holds */
    size_t n_qkv;              /* columns of the projection rows: H*dk + HK*(dk + dv) */
    cl_mem w_proj, b_proj, w_out, b_out;
    cl_mem x_in, proj, merged, out_buf, lens_buf, valid_buf;
    cl_mem row0_buf;           /* (B) uint: each sequence's first row of x and out (b*n, or a packed step's cu_new) */
    cl_mem tree_buf;           /* a verify step's draft tree (B, n, n) bytes, made at the first such step, grown */
    size_t tree_bytes;
    cl_mem kv32, value32;      /* a half plan with separate_value, on buffers: the step's K and V widened */
    cl_uint *counts;           /* (3B, + B*seq_q with rope) the lengths, token counts, first rows (and rope_positions)
                                  a step on buffers uploads from */
    cl_event counts_written;   /* that upload (NULL: none pending): the next step waits for it first */
    clattn_marks marks;        /* profiling markers of the last step */
};

/* A marker at the end of `stage` (-1: the step's start, which drops the last step's markers). */
static clattn_status mark(struct clattn_decode_cl *c, const clattn_device *dev, int stage)
{
    return clattn_marks_put(&c->marks, dev->queue, stage);
}

/* One step's pass (or the warm-up at plan creation: every launch with no work). */
typedef struct decode_pass {
    clattn_decode_plan *dp;
    clattn_decode_io io;       /* the core's: cache, lengths, n, rows, ... */
    clattn_view x, out;        /* (rows, E) and (rows, out_width): the staging buffers or the caller's */
    /* separate_value: Q, K and V from the host (hq, hk, hv) or from the caller's buffers (x, kv, value) */
    const float *hq, *hk, *hv;
    clattn_view kv, value;
    int warm;
    int positioned;            /* the step's rows rotated at pos_buf's positions (rope_positions given) */
    /* a half plan on the caller's buffers (desc.dtype F16, BF16): its x, kv, value and out, converted around the pass
     * from and to the fp32 views above */
    clattn_view tx, tkv, tvalue, tout;
} decode_pass;

/* separate_value: one of Q (col 0), K or V (the step's rows of `width` floats) into its columns of the projection rows,
 * from the host (h) or a buffer (src). */
static clattn_status copy_columns(const clattn_device *dev, cl_mem proj, size_t ld, size_t col, size_t rows,
                                  size_t width, const float *h, clattn_view src, const char *what)
{
    const size_t dst_origin[3] = {col * sizeof(float), 0, 0}, region[3] = {width * sizeof(float), rows, 1};
    cl_int err;
    if (h) {
        const size_t host_origin[3] = {0, 0, 0};
        err = clEnqueueWriteBufferRect(dev->queue, proj, CL_FALSE, dst_origin, host_origin, region, ld * sizeof(float),
                                       0, width * sizeof(float), 0, h, 0, NULL, NULL);
    } else {
        const size_t src_origin[3] = {src.off * sizeof(float), 0, 0};
        err = clEnqueueCopyBufferRect(dev->queue, src.mem, proj, src_origin, dst_origin, region,
                                      width * sizeof(float), 0, ld * sizeof(float), 0, 0, NULL, NULL);
    }
    if (err != CL_SUCCESS)
        return clattn_fail((clattn_status)err, "copying %s into the decode step's rows failed (%d: %s)", what, err,
                           clattn_status_string(err));
    return CLATTN_STATUS_SUCCESS;
}

/* desc.rope: the step's new Q and K rows rotated in place at their positions (rope_step; the warm-up launches none). */
static clattn_status rope_step(decode_pass *dpass, view rows)
{
    struct clattn_decode_cl *c = dpass->dp->cl;
    const clattn_attention_desc *d = &dpass->dp->base->d;
    const size_t pairs = d->rope.dims / 2, n = dpass->io.n;
    const size_t total = dpass->warm ? 0 : d->batch * n * (d->heads + d->kv_heads) * pairs;
    clattn_args a;
    clattn_args_begin(&a, c->k_rope, "rope_step");
    clattn_core_arg_rows(&a, rows, c->n_qkv);
    clattn_arg_u32(&a, (cl_uint)d->heads);
    clattn_arg_u32(&a, (cl_uint)d->kv_heads);
    clattn_arg_u32(&a, (cl_uint)d->head_dim_qk);
    clattn_arg_u32(&a, (cl_uint)pairs);
    clattn_arg_u32(&a, d->rope.kind == CLATTN_ROPE_INTERLEAVED);
    clattn_arg_mem(&a, c->rope_cs);
    clattn_arg_mem(&a, c->lens_buf);
    clattn_arg_mem(&a, c->valid_buf);
    clattn_arg_mem(&a, c->row0_buf);
    clattn_arg_u32(&a, (cl_uint)n);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(dpass->dp->base->device, c->k_rope, total, "enqueue rope_step");
}

/* desc.rope, a step with rope_positions: its rows' Q and K heads (contiguous: K's follow Q's) rotated in place, row r
 * at pos_buf[r] (rope_rows). */
static clattn_status rope_positioned(decode_pass *dpass, view rows)
{
    struct clattn_decode_cl *c = dpass->dp->cl;
    const clattn_attention_desc *d = &dpass->dp->base->d;
    const size_t pairs = d->rope.dims / 2, heads = d->heads + d->kv_heads;
    const size_t total = dpass->warm ? 0 : dpass->io.rows * heads * pairs; /* (the warm-up launches none) */
    clattn_args a;
    clattn_args_begin(&a, c->k_rope_rows, "rope_rows");
    clattn_core_arg_rows(&a, rows, c->n_qkv); /* src */
    clattn_core_arg_rows(&a, rows, c->n_qkv); /* dst: the same rows */
    clattn_arg_mem(&a, c->rope_cs);
    clattn_arg_u32(&a, 1);                    /* period (not read: positions given) */
    clattn_arg_mem(&a, c->pos_buf);
    clattn_arg_u64(&a, 0);
    clattn_arg_u32(&a, 1);                    /* has_pos */
    clattn_arg_u32(&a, (cl_uint)heads);
    clattn_arg_u32(&a, (cl_uint)d->head_dim_qk);
    clattn_arg_u32(&a, (cl_uint)pairs);
    clattn_arg_u32(&a, d->rope.kind == CLATTN_ROPE_INTERLEAVED);
    clattn_arg_u32(&a, 0);                    /* rest: in place, nothing to copy */
    clattn_arg_f32(&a, 1.0f);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(dpass->dp->base->device, c->k_rope_rows, total, "enqueue rope_rows");
}

/* desc.rope: the table on the device holding every position of the step (max_len, or the largest given), grown with
 * the plan's (up to `limit`: the cache's capacity, or past the largest position a token may be given). */
static clattn_status rope_table(clattn_decode_plan *dp, size_t max_len, size_t limit)
{
    struct clattn_decode_cl *c = dp->cl;
    clattn_plan *p = dp->base;
    if (!c->k_rope || max_len <= c->rope_positions) return CLATTN_STATUS_SUCCESS;
    TRY(clattn_rope_reserve(p, max_len, limit));
    return clattn_rope_device_table(p, &c->rope_cs, &c->rope_positions);
}

static clattn_status core_mark(void *ctx, clattn_decode_stage stage)
{
    decode_pass *dpass = ctx;
    return mark(dpass->dp->cl, dpass->dp->base->device, (int)stage);
}

static clattn_status pass_run(void *ctx)
{
    decode_pass *dpass = ctx;
    struct clattn_decode_cl *c = dpass->dp->cl;
    const clattn_plan *p = dpass->dp->base;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, n = dpass->io.n, rows = dpass->io.rows, E = d->embed, H = d->heads, HK = d->kv_heads;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v;
    const int warm = dpass->warm, prof = dpass->dp->profiling && !warm;
    if (prof) {
        TRY(mark(c, p->device, -1));
        dpass->io.mark = core_mark, dpass->io.mark_ctx = dpass;
    }
    /* 1. projections */
    view src = dpass->x;
    size_t k_col = 0, v_col = 0;
    if (p->has_qkv) {
        TRY(clattn_linear_run(&c->lin, rows, c->n_qkv, E, src, c->w_proj, c->b_proj, (view){c->proj, 0}, 1, warm,
                              "QKV projection"));
        src = (view){c->proj, 0}, k_col = H * dk, v_col = (H + HK) * dk;
    } else if (d->separate_value) {
        if (!warm) {
            const clattn_device *dev = p->device;
            TRY(copy_columns(dev, c->proj, c->n_qkv, 0, rows, H * dk, dpass->hq, dpass->x, "Q"));
            TRY(copy_columns(dev, c->proj, c->n_qkv, H * dk, rows, HK * dk, dpass->hk, dpass->kv, "K"));
            TRY(copy_columns(dev, c->proj, c->n_qkv, (H + HK) * dk, rows, HK * dv, dpass->hv, dpass->value, "V"));
        }
        src = (view){c->proj, 0}, k_col = H * dk, v_col = (H + HK) * dk;
    } else if (c->k_rope) { /* x is Q, K and V: copied into the rows, as only Q and K rotate */
        for (int part = 0; part < 3 && !warm; part++)
            TRY(copy_columns(p->device, c->proj, c->n_qkv, part * E, rows, E, NULL, dpass->x, "x"));
        src = (view){c->proj, 0}, k_col = H * dk, v_col = (H + HK) * dk;
    }
    if (c->k_rope && (dpass->warm || !dpass->positioned)) TRY(rope_step(dpass, src));
    if (c->k_rope && (dpass->warm || dpass->positioned)) TRY(rope_positioned(dpass, src));
    if (prof) TRY(mark(c, p->device, CLATTN_DECODE_STAGE_PROJECTION));
    /* 2. append */
    const size_t kvw = d->kv_half == CLATTN_KV_INT8 ? 1 : dk > dv ? dk : dv; /* INT8: a work-item per row */
    const size_t n_app = warm ? 0 : B * n * HK * kvw;
    clattn_args a;
    clattn_args_begin(&a, c->k_append, "kv_append");
    clattn_core_arg_rows(&a, src, c->lay.q_ld);
    clattn_arg_u32(&a, (cl_uint)k_col);
    clattn_arg_u32(&a, (cl_uint)v_col);
    clattn_arg_mem(&a, dpass->io.cache_k);
    clattn_arg_mem(&a, dpass->io.cache_v);
    clattn_arg_mem(&a, dpass->io.cache_ks);
    clattn_arg_mem(&a, dpass->io.cache_vs);
    clattn_arg_mem(&a, dpass->io.pages ? dpass->io.pages : c->lens_buf); /* (contiguous: never read) */
    clattn_arg_u32(&a, (cl_uint)dpass->io.npage);
    clattn_arg_mem(&a, c->lens_buf);
    clattn_arg_mem(&a, c->valid_buf);
    clattn_arg_mem(&a, c->row0_buf);
    clattn_arg_u32(&a, (cl_uint)n);
    clattn_arg_u32(&a, (cl_uint)HK);
    clattn_arg_u32(&a, (cl_uint)dpass->io.capacity);
    clattn_arg_u64(&a, n_app);
    TRY(clattn_args_end(&a));
    TRY(clattn_enqueue_1d(p->device, c->k_append, n_app, "enqueue kv_append"));
    if (prof) TRY(mark(c, p->device, CLATTN_DECODE_STAGE_APPEND));
    /* 3. attend */
    dpass->io.q = src;
    dpass->io.out = p->has_out ? (view){c->merged, 0} : dpass->out;
    TRY(c->core.core->run_decode(c->core.state, &dpass->io));
    /* 4. output projection */
    if (p->has_out)
        TRY(clattn_linear_run(&c->lin, rows, d->out_dim, H * dv, (view){c->merged, 0}, c->w_out, c->b_out,
                              dpass->out, 1, warm, "output projection"));
    if (prof && p->has_out) TRY(mark(c, p->device, CLATTN_DECODE_STAGE_OUT_PROJECTION));
    return CLATTN_STATUS_SUCCESS;
}

/* A half plan's step on the caller's buffers: its arrays widened into the plan's fp32 staging (x, K, V), the fp32
 * pass, the output narrowed into the caller's out (dtype_widen, dtype_narrow: attention/linear.c). */
static clattn_status pass_typed(void *ctx)
{
    decode_pass *dpass = ctx;
    struct clattn_decode_cl *c = dpass->dp->cl;
    const clattn_attention_desc *d = &dpass->dp->base->d;
    const size_t rows = dpass->io.rows, HK = d->kv_heads;
    TRY(clattn_linear_convert(&c->lin, dpass->tx, dpass->x, rows * d->embed, d->dtype, 0));
    if (d->separate_value) {
        TRY(clattn_linear_convert(&c->lin, dpass->tkv, dpass->kv, rows * HK * d->head_dim_qk, d->dtype, 0));
        TRY(clattn_linear_convert(&c->lin, dpass->tvalue, dpass->value, rows * HK * d->head_dim_v, d->dtype, 0));
    }
    TRY(pass_run(dpass));
    return clattn_linear_convert(&c->lin, dpass->out, dpass->tout, rows * dpass->dp->base->out_width, d->dtype, 1);
}

static void cl_release(clattn_decode_plan *dp)
{
    struct clattn_decode_cl *c = dp->cl;
    if (!c) return;
    clattn_core_destroy(&c->core);
    clattn_linear_release(&c->lin);
    clattn_kernel_release(&c->k_append);
    if (c->counts_written) clReleaseEvent(c->counts_written);
    clattn_marks_release(&c->marks);
    free(c->counts);
    clattn_program_release(&c->append_prog);
    clattn_kernel_release(&c->k_rope);
    clattn_kernel_release(&c->k_rope_rows);
    clattn_program_release(&c->rope_prog);
    cl_mem *mems[] = {&c->w_proj, &c->b_proj, &c->w_out, &c->b_out, &c->x_in, &c->proj, &c->merged, &c->out_buf,
                      &c->lens_buf, &c->valid_buf, &c->row0_buf, &c->kv32, &c->value32, &c->tree_buf, &c->rope_cs,
                      &c->pos_buf};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) clattn_mem_release(mems[i]);
    free(c);
    dp->cl = NULL;
}

static clattn_status cl_init(clattn_decode_plan *dp)
{
    clattn_plan *p = dp->base;
    const clattn_device *dev = p->device;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tn = d->seq_q, E = d->embed, H = d->heads, HK = d->kv_heads;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v;
    struct clattn_decode_cl *c = clattn_calloc(1, sizeof *c);
    if (!c) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the decode plan's OpenCL state");
    dp->cl = c;
    const int rope = d->rope.kind != CLATTN_ROPE_NONE;
    /* Q|K|V rows: projected, or copied from the inputs (with rope also x as Q, K and V: only Q and K rotate) */
    const int qkv_rows = p->has_qkv || d->separate_value || rope;
    c->n_qkv = qkv_rows ? H * dk + HK * (dk + dv) : 0;
    const size_t ld = qkv_rows ? c->n_qkv : E;
    c->lay = (clattn_core_layout){.q_ld = ld, .k_ld = ld, .v_ld = ld, .out_ld = H * dv};
    const size_t own = c->n_qkv * (E + 1 + B * Tn) + (p->has_out ? d->out_dim * (H * dv + 1) + B * Tn * H * dv : 0) +
                       B * Tn * (E + p->out_width) + 3 * B + (rope ? B * Tn : 0);
    TRY(clattn_core_create(dev, CLATTN_CORE_DECODE, &p->d, &c->lay, own, &c->core));
    p->core = c->core.core;
    p->core_params = c->core.params;
    clattn_core_params_format(p->core, &p->core_params, p->core_params_text, sizeof p->core_params_text);
    p->d.algorithm = p->core->algorithm;
    TRY(clattn_linear_build(dev, &p->d, &c->lin));
    clattn_linear_gemm_describe(&c->lin, &p->gemm, p->gemm_params_text, sizeof p->gemm_params_text);
    char opts[160];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDK=%zu -DDV=%zu -DKV_HALF=%d -DPAGE=%zu", dk, dv, d->kv_half,
             d->kv_page_size);
    const char *src[] = {"common/half", "decode/kv_append"};
    TRY(clattn_program_build(dev, src, 2, opts, &c->append_prog));
    TRY(clattn_kernel_create(c->append_prog, "kv_append", &c->k_append));
    if (rope) {
        const char *rsrc[] = {"attention/rope"};
        TRY(clattn_program_build(dev, rsrc, 1, "-cl-std=CL1.2", &c->rope_prog));
        TRY(clattn_kernel_create(c->rope_prog, "rope_step", &c->k_rope));
        TRY(clattn_kernel_create(c->rope_prog, "rope_rows", &c->k_rope_rows));
        TRY(clattn_buffer_new(dev, B * Tn, 4, NULL, "the new tokens' rotary positions", &c->pos_buf));
        TRY(rope_table(dp, p->rope_positions, 0));
    }

    /* weights: [Wq; Wk; Wv] and the biases as one row ([bq | bk | bv], zeros where absent) */
    if (d->separate_value || (rope && !p->has_qkv))
        TRY(clattn_buffer_new(dev, B * Tn * c->n_qkv, 4, NULL, "the Q|K|V rows", &c->proj));
    if (p->has_qkv) {
        const size_t rows[3] = {H * dk, HK * dk, HK * dv};
        const float *w[3] = {p->w_query, p->w_key, p->w_value}, *b[3] = {p->b_query, p->b_key, p->b_value};
        TRY(clattn_upload_blocks(dev, w, rows, 3, E, "the Q|K|V weights", &c->w_proj));
        if (b[0] || b[1] || b[2]) TRY(clattn_upload_blocks(dev, b, rows, 3, 1, "the Q|K|V biases", &c->b_proj));
        TRY(clattn_buffer_new(dev, B * Tn * c->n_qkv, 4, NULL, "the Q|K|V projections", &c->proj));
    }
    if (p->has_out) {
        TRY(clattn_buffer_new(dev, d->out_dim * H * dv, 4, p->w_out, "w_out", &c->w_out));
        if (p->b_out) TRY(clattn_buffer_new(dev, d->out_dim, 4, p->b_out, "b_out", &c->b_out));
        TRY(clattn_buffer_new(dev, B * Tn * H * dv, 4, NULL, "the attention output", &c->merged));
    }
    TRY(clattn_buffer_new(dev, B * Tn * E, 4, NULL, "the x staging buffer", &c->x_in));
    TRY(clattn_buffer_new(dev, B * Tn * p->out_width, 4, NULL, "the output staging buffer", &c->out_buf));
    if (d->dtype != CLATTN_DTYPE_F32 && d->separate_value) { /* (host steps are widened on the host: decode.c) */
        TRY(clattn_buffer_new(dev, B * Tn * HK * dk, 4, NULL, "the step's keys widened", &c->kv32));
        TRY(clattn_buffer_new(dev, B * Tn * HK * dv, 4, NULL, "the step's values widened", &c->value32));
    }
    TRY(clattn_buffer_new(dev, B, 4, NULL, "the cache lengths", &c->lens_buf));
    TRY(clattn_buffer_new(dev, B, 4, NULL, "the valid token counts", &c->valid_buf));
    TRY(clattn_buffer_new(dev, B, 4, NULL, "the sequences' first rows", &c->row0_buf));
    if (!(c->counts = clattn_malloc((3 * B + (rope ? B * Tn : 0)) * sizeof *c->counts)))
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the token counts");
    /* every kernel launched once with no work: compiled now, not in the first decode step */
    decode_pass warm = {.dp = dp, .warm = 1, .x = {c->x_in, 0}, .out = {c->out_buf, 0},
                        .io = {.cache_k = c->out_buf, .cache_v = c->out_buf, .capacity = 1, .lens = c->lens_buf,
                               .valid = c->valid_buf, .row0 = c->row0_buf, .n = 1, .rows = B, .max_len = 1,
                               .warm = 1}};
    TRY(pass_run(&warm));
    CL_CHECK(clFinish(dev->queue), "warming the decode kernels");
    return CLATTN_STATUS_SUCCESS;
}

/* The step's split-K parts chosen and checked by the core before anything of the step is enqueued: a step the device
 * cannot run (its loop limit) is refused with nothing written. */
static clattn_status check_parts(const clattn_decode_plan *dp, const clattn_decode_io *io)
{
    const struct clattn_decode_cl *c = dp->cl;
    clattn_decode_io check = *io;
    check.check_only = 1;
    return c->core.core->run_decode(c->core.state, &check);
}

/* The step's lengths, token counts and first rows as the kernels read them (3B uints). */
static void step_counts(const clattn_kv_cache *cache, const clattn_decode_step *step, size_t B, cl_uint *to)
{
    for (size_t b = 0; b < B; b++)
        to[b] = (cl_uint)cache->len[b], to[B + b] = (cl_uint)step->valid[b], to[2 * B + b] = (cl_uint)step->row0[b];
}

/* The core's view of a step on this cache (the plan's buffers of lengths, counts and first rows). */
static clattn_decode_io step_io(const clattn_decode_plan *dp, const clattn_kv_cache *cache,
                                const clattn_decode_step *step)
{
    const struct clattn_decode_cl *c = dp->cl;
    return (clattn_decode_io){.cache_k = cache->k, .cache_v = cache->v, .cache_ks = cache->ks, .cache_vs = cache->vs,
                              .capacity = cache->d.page_size ? cache->d.pages : cache->d.capacity,
                              .pages = cache->table_mem, .npage = cache->npage, .lens = c->lens_buf,
                              .valid = c->valid_buf, .row0 = c->row0_buf, .packed = step->packed,
                              .tree = step->tree ? c->tree_buf : NULL, .n = step->n, .rows = step->rows,
                              .max_len = step->max_len, .max_parts = dp->max_parts};
}

static clattn_status cl_execute(clattn_decode_plan *dp, clattn_kv_cache *cache, const float *x, const float *kv,
                                const float *value, const clattn_decode_step *step, float *out)
{
    struct clattn_decode_cl *c = dp->cl;
    const clattn_plan *p = dp->base;
    const size_t B = p->d.batch, n = step->n, rows = step->rows;
    const uint8_t *tree = step->tree;
    if (tree && B * n * n > c->tree_bytes) { /* a buffer for the draft tree, before anything of the step */
        cl_mem m = NULL;
        TRY(clattn_buffer_new(p->device, B * n * n, 1, NULL, "the draft tree", &m));
        clattn_mem_release(&c->tree_buf);
        c->tree_buf = m, c->tree_bytes = B * n * n;
    }
    const int sv = p->d.separate_value;
    decode_pass dpass = {.dp = dp, .x = {c->x_in, 0}, .out = {c->out_buf, 0}, .io = step_io(dp, cache, step),
                         .hq = sv ? x : NULL, .hk = kv, .hv = value, .positioned = step->pos != NULL};
    TRY(check_parts(dp, &dpass.io));
    TRY(rope_table(dp, step->rope_most, step->rope_limit));
    cl_uint *counts = clattn_malloc(3 * B * sizeof *counts);
    if (!counts) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the token counts");
    step_counts(cache, step, B, counts);
    const clattn_transfer in[] = {{sv ? NULL : c->x_in, rows * p->d.embed * sizeof(float), (void *)x, "x"},
                                  {c->lens_buf, B * sizeof(cl_uint), counts, "the cache lengths"},
                                  {c->valid_buf, B * sizeof(cl_uint), counts + B, "the token counts"},
                                  {c->row0_buf, B * sizeof(cl_uint), counts + 2 * B, "the first rows"},
                                  {tree ? c->tree_buf : NULL, B * n * n, (void *)tree, "the draft tree"},
                                  {step->pos ? c->pos_buf : NULL, rows * sizeof(cl_uint), (void *)step->pos,
                                   "the rotary positions"}};
    const clattn_transfer o = {c->out_buf, rows * p->out_width * sizeof(float), out, "the output"};
    const clattn_status st = clattn_exec_host(p->device, in, 6, pass_run, &dpass, &o, 1);
    free(counts);
    if (st == CLATTN_STATUS_SUCCESS) dp->last_parts = dpass.io.parts;
    return st;
}

/* On the caller's buffers: the lengths, token counts and first rows uploaded from the plan's own host array (after
 * the previous step's upload of it has completed), the caller's wait list, the pass, a completion event. */
static clattn_status cl_execute_buffers(clattn_decode_plan *dp, clattn_kv_cache *cache,
                                        const clattn_decode_buffers *buffers, const clattn_decode_step *step,
                                        cl_uint nwait, const cl_event *wait, cl_event *event)
{
    struct clattn_decode_cl *c = dp->cl;
    const clattn_plan *p = dp->base;
    const clattn_device *dev = p->device;
    const size_t B = p->d.batch;
    decode_pass dpass = {.dp = dp, .x = {buffers->x.mem, buffers->x.offset},
                         .out = {buffers->out.mem, buffers->out.offset}, .io = step_io(dp, cache, step),
                         .kv = {buffers->kv.mem, buffers->kv.offset},
                         .value = {buffers->value.mem, buffers->value.offset}, .positioned = step->pos != NULL};
    TRY(check_parts(dp, &dpass.io));
    TRY(rope_table(dp, step->rope_most, step->rope_limit));
    if (c->counts_written) {
        const cl_int err = clWaitForEvents(1, &c->counts_written);
        clReleaseEvent(c->counts_written);
        c->counts_written = NULL;
        CL_CHECK(err, "waiting for the previous step's upload of the token counts");
    }
    step_counts(cache, step, B, c->counts);
    const size_t npos = step->pos ? step->rows : 0; /* (rows <= B*seq_q: the room counts has past 3B) */
    if (npos) memcpy(c->counts + 3 * B, step->pos, npos * sizeof(cl_uint));
    /* (the last upload from counts gives the event the next step waits for; when one fails, the queue is drained
     * before the error returns, so that no upload still reads counts when the next step rewrites it) */
    cl_int err = clEnqueueWriteBuffer(dev->queue, c->lens_buf, CL_FALSE, 0, B * sizeof(cl_uint), c->counts, 0, NULL,
                                      NULL);
    const char *what = "uploading the cache lengths";
    if (err == CL_SUCCESS)
        err = clEnqueueWriteBuffer(dev->queue, c->valid_buf, CL_FALSE, 0, B * sizeof(cl_uint), c->counts + B, 0, NULL,
                                   NULL), what = "uploading the token counts";
    if (err == CL_SUCCESS)
        err = clEnqueueWriteBuffer(dev->queue, c->row0_buf, CL_FALSE, 0, B * sizeof(cl_uint), c->counts + 2 * B, 0,
                                   NULL, npos ? NULL : &c->counts_written), what = "uploading the first rows";
    if (err == CL_SUCCESS && npos)
        err = clEnqueueWriteBuffer(dev->queue, c->pos_buf, CL_FALSE, 0, npos * sizeof(cl_uint), c->counts + 3 * B, 0,
                                   NULL, &c->counts_written), what = "uploading the rotary positions";
    if (err != CL_SUCCESS) clFinish(dev->queue);
    CL_CHECK(err, what);
    const int typed = p->d.dtype != CLATTN_DTYPE_F32;
    if (typed) { /* the caller's arrays converted around the pass, through the plan's fp32 staging */
        dpass.tx = dpass.x, dpass.tout = dpass.out, dpass.tkv = dpass.kv, dpass.tvalue = dpass.value;
        dpass.x = (view){c->x_in, 0}, dpass.out = (view){c->out_buf, 0};
        dpass.kv = (view){c->kv32, 0}, dpass.value = (view){c->value32, 0};
    }
    TRY(clattn_exec_buffers(dev, nwait, wait, typed ? pass_typed : pass_run, &dpass, event));
    dp->last_parts = dpass.io.parts;
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status cl_stage_times(clattn_decode_plan *dp, double *ms)
{
    return clattn_marks_times(&dp->cl->marks, ms, CLATTN_DECODE_STAGE_COUNT);
}

static const char *cl_core(const clattn_decode_plan *dp) { return dp->base->core ? dp->base->core->name : ""; }

const clattn_decode_ops clattn_decode_opencl = {
    .init = cl_init,
    .release = cl_release,
    .execute = cl_execute,
    .execute_buffers = cl_execute_buffers,
    .stage_times = cl_stage_times,
    .core = cl_core,
};
