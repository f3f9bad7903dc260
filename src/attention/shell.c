/* shell.c: the OpenCL backend of attention plans: the shell around a core.
 *
 *   1. projections     the plan's GEMM core (gemm_tiles on CPUs, CLBlast on GPUs): self-attention one GEMM
 *                      against [Wq|Wk|Wv], cross-attention Q = x Wq^T and [K|V] = kv [Wk|Wv]^T; the biases
 *                      as rows the GEMMs add to (beta = 1), unless the core adds them itself
 *   2. the core        softmax(Q K^T * scale + masks) V from the projections' rows to merged rows
 *                      (B, Tq, H*dv): whichever core select.c chose (src/cores/)
 *   3. out projection  fill_rows(bias) + a GEMM with beta = 1
 * Everything stays on the device between the input upload and the output read. Without projections the
 * core reads x (and kv) where they are.
 */
#include "shell.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static shell *state(const struct clattn_plan *p) { return p->backend_state; }

/* ---- plan creation */

/* The plan's own device memory in floats (inputs, projections, output and staging), before the core's. */
static size_t shell_floats(const struct clattn_plan *p)
{
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    size_t total = B * Tq * E + (d->cross ? B * Tk * Ekv : 0) + clattn_plan_value_elems(d) + B * Tq * p->out_width;
    if (p->has_qkv) total += B * Tq * H * dk + B * Tk * HK * (dk + dv) + H * dk * E + HK * (dk + dv) * Ekv;
    if (p->has_out) total += B * Tq * H * dv + d->out_dim * H * dv;
    if (d->rope.kind != CLATTN_ROPE_NONE) /* the table, and without projections Q and K rotated */
        total += (Tq > Tk ? Tq : Tk) * d->rope.dims + (p->has_qkv ? 0 : B * Tq * E + (d->cross ? B * Tk * Ekv : 0));
    /* a half-precision plan: its inputs and output in fp32 beside them (half the floats again for the staging's
     * half arrays are counted as floats here: an upper bound) */
    if (d->dtype != CLATTN_DTYPE_F32)
        total += B * Tq * E + (d->cross ? B * Tk * Ekv : 0) + clattn_plan_value_elems(d) + B * Tq * p->out_width;
    return total;
}

/* Does the core add the Q/K/V biases? Not on a training plan, whose backward reads Q, K and V with them, nor with
 * rotary embeddings, which rotate Q and K with their biases. */
static int adds_biases(const struct clattn_plan *p)
{
    return state(p)->core.core->adds_biases && !p->d.training && p->d.rope.kind == CLATTN_ROPE_NONE;
}

/* Where the core finds Q, K and V: the inputs themselves, or the projections' rows. */
static clattn_core_layout layout(const struct clattn_plan *p)
{
    const clattn_attention_desc *d = &p->d;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    const int biases = !d->training && d->rope.kind == CLATTN_ROPE_NONE; /* else the projections add them
                                                                              (adds_biases) */
    clattn_core_layout l = {.out_ld = H * dv, .bias_q = biases && p->b_query, .bias_k = biases && p->b_key,
                            .bias_v = biases && p->b_value};
    if (!p->has_qkv) l.q_ld = d->embed, l.k_ld = d->kv_embed, l.v_ld = d->separate_value ? HK * dv : d->kv_embed;
    else if (!d->cross) l.q_ld = l.k_ld = l.v_ld = H * dk + HK * (dk + dv);
    else l.q_ld = H * dk, l.k_ld = l.v_ld = HK * (dk + dv);
    /* without projections a half plan's own arrays are Q, K, V and the output: a core that reads the type takes them
     * as they are (select.c clears this for the others); not a training plan's, whose context (the output before
     * it is rounded) and backward core are fp32; nor with rope, whose rotated Q and K are fp32 */
    if (!p->has_qkv && !p->has_out && !d->training && d->rope.kind == CLATTN_ROPE_NONE && !d->sinks)
        l.io_dtype = d->dtype; /* (nor with sinks, which scale the fp32 rows: shell_sinks.c) */
    return l;
}

/* The Q/K/V weights and their biases, uploaded at plan creation and written again by clattn_plan_set_weights (every
 * buffer made when it is NULL, else written: clattn_buffer_put), and the projections' outputs. */
static clattn_status upload_projections(struct clattn_plan *p)
{
    shell *c = state(p);
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    const clattn_device *dev = p->device;
    if (!p->has_qkv) return CLATTN_STATUS_SUCCESS;
    const size_t rows[3] = {H * dk, HK * dk, HK * dv};
    const float *w[3] = {p->w_query, p->w_key, p->w_value}, *b[3] = {p->b_query, p->b_key, p->b_value};
    if (adds_biases(p)) {
        if (b[0]) TRY(clattn_buffer_put(dev, rows[0], sizeof(float), b[0], "b_query", &c->b_q));
        if (b[1]) TRY(clattn_buffer_put(dev, rows[1], sizeof(float), b[1], "b_key", &c->b_k));
        if (b[2]) TRY(clattn_buffer_put(dev, rows[2], sizeof(float), b[2], "b_value", &c->b_v));
    }
    const int biased = !adds_biases(p);
    const clattn_dtype wt = c->typed_proj ? d->dtype : CLATTN_DTYPE_F32; /* the weights' type on the device */
    if (!d->cross) {
        c->n_qkv = rows[0] + rows[1] + rows[2];
        TRY(clattn_upload_blocks_typed(dev, w, rows, 3, E, wt, "the Q|K|V weights", &c->w_proj));
        if (biased && (b[0] || b[1] || b[2])) TRY(clattn_upload_blocks(dev, b, rows, 3, 1, "the Q|K|V biases", &c->b_proj));
        return clattn_buffer_put(dev, B * Tq * c->n_qkv, sizeof(float), NULL, "the Q|K|V projections", &c->proj);
    }
    TRY(clattn_upload_blocks_typed(dev, w, rows, 1, E, wt, "the Q weights", &c->w_proj));
    TRY(clattn_upload_blocks_typed(dev, w + 1, rows + 1, 2, Ekv, wt, "the K|V weights", &c->w_kv));
    if (biased && b[0]) TRY(clattn_buffer_put(dev, rows[0], sizeof(float), b[0], "the Q bias", &c->b_proj));
    if (biased && (b[1] || b[2])) TRY(clattn_upload_blocks(dev, b + 1, rows + 1, 2, 1, "the K|V biases", &c->b_proj_kv));
    TRY(clattn_buffer_put(dev, B * Tq * H * dk, sizeof(float), NULL, "the Q projection", &c->proj));
    return clattn_buffer_put(dev, B * Tk * HK * (dk + dv), sizeof(float), NULL, "the K|V projections", &c->proj_kv);
}

/* The output projection's weights (uploaded or written again, as above) and its input, the merged heads. */
static clattn_status upload_out_projection(struct clattn_plan *p)
{
    shell *c = state(p);
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, H = d->heads, dv = d->head_dim_v;
    if (!p->has_out) return CLATTN_STATUS_SUCCESS;
    const float *w[1] = {p->w_out};
    const size_t rows[1] = {d->out_dim};
    TRY(clattn_upload_blocks_typed(p->device, w, rows, 1, H * dv, c->typed_proj ? d->dtype : CLATTN_DTYPE_F32, "w_out",
                                   &c->w_out));
    if (p->b_out) TRY(clattn_buffer_put(p->device, d->out_dim, sizeof(float), p->b_out, "b_out", &c->b_out));
    return clattn_buffer_put(p->device, B * Tq * H * dv, sizeof(float), NULL, "the merged heads", &c->merged);
}

/* clattn_plan_set_weights: the plan's host copies (already replaced) into its weight buffers. */
static clattn_status shell_set_weights(struct clattn_plan *p)
{
    TRY(upload_projections(p));
    TRY(clattn_shell_sinks_upload(p));
    return upload_out_projection(p);
}

/* For execution from host arrays: the inputs and the output on the device. */
static clattn_status staging_buffers(struct clattn_plan *p)
{
    shell *c = state(p);
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const clattn_device *dev = p->device;
    const size_t es = clattn_dtype_size(d->dtype); /* x, kv, value and out in the plan's type */
    TRY(clattn_buffer_new(dev, B * Tq * E, es, NULL, "the x staging buffer", &c->x_in));
    if (d->cross) TRY(clattn_buffer_new(dev, B * Tk * Ekv, es, NULL, "the kv staging buffer", &c->kv_in));
    if (d->separate_value)
        TRY(clattn_buffer_new(dev, clattn_plan_value_elems(d), es, NULL, "the value staging buffer", &c->value_in));
    if (d->key_padding_mask)
        TRY(clattn_buffer_new(dev, B * Tk, 1, NULL, "the key padding mask staging buffer", &c->kpm_in));
    if (d->attn_mask)
        TRY(clattn_buffer_new(dev, clattn_plan_mask_elems(d), d->attn_mask == CLATTN_MASK_FLOAT ? 4 : 1, NULL,
                              "the attention mask staging buffer", &c->mask_in));
    return clattn_buffer_new(dev, B * Tq * p->out_width, es, NULL, "the output staging buffer", &c->out_buf);
}

/* A half-precision plan's fp32 work buffers: its inputs widened (unless its projections read them as they are), its
 * output before it is narrowed (with typed projections in the Q|K|V projections' buffer where that is large enough:
 * the core has read them by the time the output projection writes). */
static clattn_status typed_buffers(struct clattn_plan *p)
{
    shell *c = state(p);
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    const clattn_device *dev = p->device;
    if (d->dtype == CLATTN_DTYPE_F32 || c->native_io) return CLATTN_STATUS_SUCCESS;
    if (!(c->typed_proj && p->has_qkv)) {
        TRY(clattn_buffer_new(dev, B * Tq * d->embed, sizeof(float), NULL, "x widened to fp32", &c->x32));
        if (d->cross)
            TRY(clattn_buffer_new(dev, B * Tk * d->kv_embed, sizeof(float), NULL, "kv widened to fp32", &c->kv32));
        if (d->separate_value)
            TRY(clattn_buffer_new(dev, clattn_plan_value_elems(d), sizeof(float), NULL, "value widened to fp32",
                                  &c->value32));
    }
    const size_t n_out = B * Tq * p->out_width;
    const size_t n_proj = B * Tq * (d->cross ? d->heads * d->head_dim_qk : c->n_qkv);
    if (c->typed_proj && p->has_qkv && p->has_out && n_proj >= n_out) {
        c->out_f32 = (view){c->proj, 0};
        return CLATTN_STATUS_SUCCESS;
    }
    TRY(clattn_buffer_new(dev, n_out, sizeof(float), NULL, "the fp32 output", &c->out32));
    c->out_f32 = (view){c->out32, 0};
    return CLATTN_STATUS_SUCCESS;
}

/* Build the linear kernels and the core (the device memory checked first), upload the weights, make the
 * workspace: everything before the first execution. */
static clattn_status shell_init(struct clattn_plan *p)
{
    shell *c = clattn_calloc(1, sizeof *c);
    if (!c) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the OpenCL plan state");
    p->backend_state = c;
    /* the GEMM core first: the attention core may run its GEMMs on it (the unfused core) */
    TRY(clattn_linear_build(p->device, &p->d, &c->lin));
    c->typed_proj = p->d.dtype != CLATTN_DTYPE_F32 && (p->has_qkv || p->has_out) && clattn_linear_reads_dtypes(&c->lin);
    clattn_linear_gemm_describe(&c->lin, &p->gemm, p->gemm_params_text, sizeof p->gemm_params_text);
    c->lay = layout(p);
    c->lay.gemm = &c->lin.gemm;
    TRY(clattn_core_create(p->device, CLATTN_CORE_PREFILL, &p->d, &c->lay, shell_floats(p), &c->core));
    p->core = c->core.core;
    p->core_params = c->core.params;
    c->native_io = c->lay.io_dtype != CLATTN_DTYPE_F32 && p->core->reads_dtypes;
    clattn_core_params_format(p->core, &p->core_params, p->core_params_text, sizeof p->core_params_text);
    p->d.algorithm = p->core->algorithm;
    p->tuned = c->core.tuned || (c->lin.gemm_core.tuned && (p->has_qkv || p->has_out));
    /* CLBlast's parameters from the tuning file (set on the device at open) run its GEMMs */
    const clattn_tune_table *tn = clattn_tune_active(p->device);
    if (tn && (tn->has_blas[CLATTN_BLAS_XGEMM] || tn->has_blas[CLATTN_BLAS_XGEMM_DIRECT]) &&
        c->lin.gemm_core.core && c->lin.gemm_core.core->uses_clblast && (p->has_qkv || p->has_out))
        p->tuned = 1;
    TRY(upload_projections(p));
    TRY(upload_out_projection(p));
    TRY(typed_buffers(p));
    TRY(clattn_shell_rope_init(p));
    TRY(clattn_shell_sinks_init(p));
    /* a training plan's cores (and those of a plan with sinks) write the rows' log-sum-exp at every execution: here
     * when the caller takes none */
    if (p->d.training || p->d.sinks)
        TRY(clattn_buffer_new(p->device, p->d.batch * p->d.heads * p->d.seq_q, sizeof(float), NULL,
                              "the rows' log-sum-exp", &c->lse_buf));
    if (p->d.training) TRY(clattn_shell_train_init(p));
    return p->host_staging ? staging_buffers(p) : CLATTN_STATUS_SUCCESS;
}

const clattn_linear *clattn_plan_linear(const struct clattn_plan *p)
{
    return p->ops == &clattn_backend_opencl && p->backend_state ? &state(p)->lin : NULL;
}

#define SHELL_MEMS(c)                                                                                         \
    {&c->w_proj, &c->w_kv, &c->b_proj, &c->b_proj_kv, &c->b_q, &c->b_k, &c->b_v, &c->w_out, &c->b_out, &c->proj, \
     &c->proj_kv, &c->merged, &c->x_in, &c->kv_in, &c->kpm_in, &c->mask_in, &c->out_buf, &c->lse_buf, &c->value_in,  \
     &c->x32, &c->kv32, &c->value32, &c->out32, &c->attn32, &c->rope_cs, &c->rope_q, &c->rope_k, &c->rope_pos,   \
     &c->sinks_buf}

static size_t shell_device_bytes(const struct clattn_plan *p)
{
    shell *c = state(p);
    if (!c) return 0;
    cl_mem *mems[] = SHELL_MEMS(c);
    size_t total = 0;
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) total += clattn_mem_bytes(*mems[i]);
    const clattn_core *core = c->core.core;
    if (core && core->device_bytes) total += core->device_bytes(c->core.state);
    return total + clattn_shell_train_bytes(&c->train);
}

static void shell_release(struct clattn_plan *p)
{
    shell *c = state(p);
    if (!c) return;
    clattn_marks_release(&c->marks);
    clattn_shell_train_release(&c->train);
    clattn_core_destroy(&c->core);
    cl_mem *mems[] = SHELL_MEMS(c);
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) clattn_mem_release(mems[i]);
    clattn_kernel_release(&c->rope);
    clattn_program_release(&c->rope_prog);
    clattn_kernel_release(&c->sinks_k);
    clattn_kernel_release(&c->sinks_lse_k);
    clattn_program_release(&c->sinks_prog);
    if (c->rope_pos_written) {
        clWaitForEvents(1, &c->rope_pos_written);
        clReleaseEvent(c->rope_pos_written);
    }
    free(c->rope_pos_host);
    clattn_linear_release(&c->lin);
    free(c);
    p->backend_state = NULL;
}

/* ---- execution */


/* A profiling marker at the end of `stage` (-1: the start of the pass, which drops the last
 * pass's markers). Stage s's time is its marker's minus the marker before it. */
static clattn_status mark(struct clattn_plan *p, int stage)
{
    if (!p->profiling) return CLATTN_STATUS_SUCCESS;
    return clattn_marks_put(&state(p)->marks, p->device->queue, stage);
}

static clattn_status core_mark(void *ctx, clattn_stage stage) { return mark(ctx, (int)stage); }

/* The whole forward pass, enqueued on the device queue. */
static clattn_status run(struct clattn_plan *p, const run_io *io)
{
    shell *c = state(p);
    const clattn_attention_desc *d = &p->d;
    const size_t rq = io->rows.q, H = d->heads, dv = d->head_dim_v; /* rq: B*Tq, or a varlen batch's rows */
    TRY(mark(p, -1));
    clattn_core_io cio = {.b_q = c->b_q, .b_k = c->b_k, .b_v = c->b_v, .kpm = io->kpm, .mask = io->mask,
                          .attn = io->attn, .attn_host = io->attn_host, .lse = io->lse, .seed = d->seed};
    if (p->profiling) cio.mark = core_mark, cio.mark_ctx = p;
    TRY(clattn_shell_project(p, io, &cio));
    if (p->has_qkv) TRY(mark(p, CLATTN_STAGE_QKV_PROJECTION));
    /* the merged heads: straight into the caller's context buffer when it wants them and an output projection
     * reads them from there */
    cio.out = !p->has_out ? io->out : io->context.mem ? io->context : (view){c->merged, 0};
    /* 2. the core */
    if (d->varlen)
        TRY(clattn_shell_core_varlen(p, &io->rows, &cio));
    else
        TRY(c->core.core->run(c->core.state, &cio));
    TRY(clattn_shell_sinks(p, &io->rows, cio.out, cio.lse)); /* desc.sinks: the rows scaled (else nothing) */
    if (!p->has_out && io->context.mem) /* no output projection: the context is the output */
        CL_CHECK(clEnqueueCopyBuffer(p->device->queue, io->out.mem, io->context.mem, io->out.off * sizeof(float),
                                     io->context.off * sizeof(float), rq * H * dv * sizeof(float), 0, NULL, NULL),
                 "copying the output to the context");
    /* 3. output projection: out = merged Wo^T + bo */
    if (p->has_out) {
        const clattn_dtype wt = c->typed_proj ? d->dtype : CLATTN_DTYPE_F32;
        TRY(clattn_linear_run_typed(&c->lin, rq, d->out_dim, H * dv, cio.out, CLATTN_DTYPE_F32, c->w_out, wt,
                                    c->b_out, io->out, "output projection"));
        TRY(mark(p, CLATTN_STAGE_OUT_PROJECTION));
    }
    return CLATTN_STATUS_SUCCESS;
}

/* A half-precision plan's pass (desc.dtype F16 or BF16): its inputs widened into the fp32 work buffers (or read as they
 * are by typed projections), the fp32 pass, its output (and the weights, on buffers) narrowed into the caller's. */
/* The pass's fp32 output (and weights) narrowed into the caller's arrays. */
static clattn_status narrow_outputs(struct clattn_plan *p, const run_io *io, const run_io *w)
{
    shell *c = state(p);
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    TRY(clattn_linear_convert(&c->lin, w->out, io->out, io->rows.q * p->out_width, d->dtype, 1));
    if (io->attn.mem) TRY(clattn_linear_convert(&c->lin, w->attn, io->attn, B * d->heads * Tq * Tk, d->dtype, 1));
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status run_typed(struct clattn_plan *p, const run_io *io)
{
    shell *c = state(p);
    run_io w = *io;
    w.out = c->out_f32;
    if (io->attn.mem) w.attn = (view){c->attn32, 0};
    TRY(clattn_shell_widen_inputs(p, &io->rows, &w.x, &w.kv, &w.value));
    TRY(run(p, &w));
    return narrow_outputs(p, io, &w);
}

typedef struct pass_ctx {
    struct clattn_plan *p;
    const run_io *io;
} pass_ctx;

static clattn_status pass(void *ctx)
{
    const pass_ctx *pc = ctx;
    if (pc->io->rows.q == 0) return CLATTN_STATUS_SUCCESS; /* a varlen batch of empty sequences: nothing to compute */
    const int boundary = pc->p->d.dtype != CLATTN_DTYPE_F32 && !state(pc->p)->native_io;
    return boundary ? run_typed(pc->p, pc->io) : run(pc->p, pc->io);
}

static clattn_status shell_execute_host(struct clattn_plan *p, const clattn_attention_args *a)
{
    shell *c = state(p);
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv;
    if (!p->host_staging)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "this plan runs on device buffers only (no staging buffers)");
    /* the weights are read block by block into a staging array, copied out only on success */
    const size_t n_attn = B * d->heads * Tq * Tk;
    float *attn_host = NULL;
    if (a->attn && !(attn_host = clattn_malloc(n_attn * sizeof *attn_host)))
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "staging the attention weights (%zu floats)", n_attn);
    const size_t es = clattn_dtype_size(d->dtype);
    const clattn_rows rows = clattn_rows_positioned(clattn_plan_rows_of(p, a->cu_seqlens_q, a->cu_seqlens_kv), d,
                                                    a->rope_positions, a->rope_positions_kv);
    const clattn_transfer in[] = {
        {c->x_in, rows.q * d->embed * es, (void *)a->x, "x"},
        {d->cross ? c->kv_in : NULL, rows.k * d->kv_embed * es, (void *)a->kv, "kv"},
        {d->key_padding_mask ? c->kpm_in : NULL, B * Tk, (void *)a->key_padding_mask, "the key padding mask"},
        {d->attn_mask ? c->mask_in : NULL, clattn_plan_mask_elems(d) * (d->attn_mask == CLATTN_MASK_FLOAT ? 4 : 1),
         (void *)a->attn_mask, "the attention mask"},
        {c->value_in, clattn_rows_value_elems(d, &rows) * es, (void *)a->value, "value"}};
    const size_t H = d->heads, dv = d->head_dim_v;
    const clattn_transfer out[] = {
        {c->out_buf, rows.q * p->out_width * es, a->out, "the output"},
        {c->lse_buf, H * rows.q * sizeof(float), a->lse, "the rows' log-sum-exp"},
        {p->has_out ? c->merged : c->out32 ? c->out32 : c->out_buf, rows.q * H * dv * sizeof(float), a->context,
         "the context"}}; /* without an output projection the output itself, before a half plan narrows it */
    run_io io = {.x = {c->x_in, 0}, .kv = {c->kv_in, 0}, .kpm = {c->kpm_in, 0}, .mask = {c->mask_in, 0},
                 .out = {c->out_buf, 0}, .attn = {NULL, 0}, .attn_host = attn_host, .lse = {c->lse_buf, 0},
                 .value = {c->value_in, 0}, .rows = rows};
    pass_ctx pc = {p, &io};
    clattn_status st = clattn_exec_host(p->device, in, 5, pass, &pc, out, 3);
    if (st == CLATTN_STATUS_SUCCESS && a->attn) clattn_dtype_narrow(attn_host, n_attn, d->dtype, a->attn);
    free(attn_host);
    return st;
}

static clattn_status shell_execute_buffers(struct clattn_plan *p, const clattn_attention_buffers *b, cl_uint nwait,
                                           const cl_event *wait, cl_event *event)
{
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, es = clattn_dtype_size(d->dtype);
    const clattn_rows rows = clattn_rows_positioned(clattn_plan_rows_of(p, b->cu_seqlens_q, b->cu_seqlens_kv), d,
                                                    b->rope_positions, b->rope_positions_kv);
    if (rows.q) TRY(clattn_buffer_check(b->x.mem, b->x.offset, rows.q * d->embed, es, "x")); /* none: varlen's empty */
    if (d->cross && rows.k) TRY(clattn_buffer_check(b->kv.mem, b->kv.offset, rows.k * d->kv_embed, es, "kv"));
    if (d->key_padding_mask)
        TRY(clattn_buffer_check(b->key_padding_mask.mem, b->key_padding_mask.offset, B * Tk, 1, "key_padding_mask"));
    if (d->attn_mask)
        TRY(clattn_buffer_check(b->attn_mask.mem, b->attn_mask.offset, clattn_plan_mask_elems(d),
                                d->attn_mask == CLATTN_MASK_FLOAT ? 4 : 1, "attn_mask"));
    if (d->separate_value && rows.k)
        TRY(clattn_buffer_check(b->value.mem, b->value.offset, clattn_rows_value_elems(d, &rows), es, "value"));
    if (rows.q) TRY(clattn_buffer_check(b->out.mem, b->out.offset, rows.q * p->out_width, es, "out"));
    if (b->attn.mem) TRY(clattn_buffer_check(b->attn.mem, b->attn.offset, B * d->heads * Tq * Tk, es, "attn"));
    const size_t n_lse = rows.q * d->heads, n_ctx = rows.q * d->heads * d->head_dim_v; /* B*Tq rows, or varlen's */
    if (b->lse.mem) TRY(clattn_buffer_check(b->lse.mem, b->lse.offset, n_lse, 4, "lse"));
    if (b->context.mem) TRY(clattn_buffer_check(b->context.mem, b->context.offset, n_ctx, 4, "context"));
    shell *c = state(p);
    /* a half-precision plan's weights in fp32 before they are narrowed into buffers.attn: made at the first call
     * that asks for them (the host path reads them block by block instead) */
    if (d->dtype != CLATTN_DTYPE_F32 && b->attn.mem && !c->attn32)
        TRY(clattn_buffer_new(p->device, B * d->heads * Tq * Tk, sizeof(float), NULL, "the fp32 attention weights",
                              &c->attn32));
    run_io io = {.x = {b->x.mem, b->x.offset}, .kv = {b->kv.mem, b->kv.offset},
                 .kpm = {b->key_padding_mask.mem, b->key_padding_mask.offset},
                 .mask = {b->attn_mask.mem, b->attn_mask.offset}, .out = {b->out.mem, b->out.offset},
                 .attn = {b->attn.mem, b->attn.offset},
                 .lse = b->lse.mem ? (view){b->lse.mem, b->lse.offset} : (view){c->lse_buf, 0},
                 .context = {b->context.mem, b->context.offset}, .value = {b->value.mem, b->value.offset},
                 .rows = rows};
    pass_ctx pc = {p, &io};
    return clattn_exec_buffers(p->device, nwait, wait, pass, &pc, event);
}

static clattn_status shell_stage_times(struct clattn_plan *p, double ms[CLATTN_NSTAGES])
{
    if (!p->profiling) {
        for (int s = 0; s < CLATTN_NSTAGES; s++) ms[s] = 0.0;
        return CLATTN_STATUS_SUCCESS;
    }
    return clattn_marks_times(&state(p)->marks, ms, CLATTN_NSTAGES);
}

static int shell_produces_weights(const struct clattn_plan *p) { return p->core && p->core->produces_weights; }

const clattn_backend_ops clattn_backend_opencl = {
    .name = "opencl",
    .init = shell_init,
    .release = shell_release,
    .produces_weights = shell_produces_weights,
    .execute_host = shell_execute_host,
    .execute_buffers = shell_execute_buffers,
    .stage_times = shell_stage_times,
    .device_bytes = shell_device_bytes,
    .backward_host = clattn_shell_backward_host,
    .backward_buffers = clattn_shell_backward_buffers,
    .set_weights = shell_set_weights,
};
