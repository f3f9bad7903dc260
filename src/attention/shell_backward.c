/* shell_backward.c: the OpenCL backward pass of a training plan (clattn_plan_backward, _buffers), the shell
 * around its backward core. Shapes as in backward_ref.c, which computes the same on the CPU:
 *
 *   1. the forward's projections again: Q, K, V with their biases (a training plan's projections add them)
 *   2. the forward's statistics: the caller's lse and context, or the prefill core run again for them
 *   3. through the output projection: dctx = dOut Wo (GEMM); dWo = dOut^T ctx; dbo = dOut's column sums
 *   4. the backward core (select.c chose it: flash_backward): dQ, dK, dV into rows laid out like the
 *      projections' (self-attention one buffer [dQ|dK|dV], cross [dQ] and [dK|dV])
 *   5. the projections' gradients: dW = dY^T x for each weight (RAW layout: x^T dY), db = dY's column sums;
 *      dx = [dQ|dK|dV] [Wq;Wk;Wv], one GEMM (cross: dx = dQ Wq, dkv = [dK|dV] [Wk;Wv]); without projections
 *      x is Q, K and V at once, and dx the sum of their gradients' blocks.
 * Every step is enqueued; nothing is read back before the end. */
#include "shell.h"

#include <stdlib.h>
#include <string.h>

enum { GW_Q, GW_K, GW_V, GB_Q, GB_K, GB_V, GW_OUT, GB_OUT, NGRAD }; /* clattn_attention_grads' order */

/* One backward pass: where its inputs are and where its gradients go (mem NULL: not wanted; ctx NULL: the
 * forward's statistics are recomputed). */
typedef struct bwd_io {
    view x, kv, kpm, mask, value;
    view gout, lse, ctx;
    view gx, gkv, gvalue;
    view gw[NGRAD];
    clattn_rows rows; /* B*Tq and B*Tk, or a varlen batch's rows and offsets */
} bwd_io;

/* Elements of each parameter's gradient (0: the plan has no such parameter). */
static void grad_sizes(const struct clattn_plan *p, size_t n[NGRAD])
{
    const clattn_attention_desc *d = &p->d;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    const size_t qkv = p->has_qkv;
    n[GW_Q] = qkv * H * dk * d->embed;
    n[GW_K] = qkv * HK * dk * d->kv_embed;
    n[GW_V] = qkv * HK * dv * d->kv_embed;
    n[GB_Q] = p->b_query ? H * dk : 0;
    n[GB_K] = p->b_key ? HK * dk : 0;
    n[GB_V] = p->b_value ? HK * dv : 0;
    n[GW_OUT] = p->has_out ? d->out_dim * H * dv : 0;
    n[GB_OUT] = p->b_out ? d->out_dim : 0;
}

/* Columns of the dQ rows (self-attention: the whole [dQ|dK|dV]) and of the [dK|dV] rows. */
static size_t dq_cols(const clattn_attention_desc *d)
{
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    return d->cross ? H * dk : H * dk + HK * (dk + dv);
}

clattn_status clattn_shell_train_init(struct clattn_plan *p)
{
    shell *c = p->backend_state;
    shell_train *t = &c->train;
    const clattn_attention_desc *d = &p->d;
    const clattn_device *dev = p->device;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, H = d->heads, HK = d->kv_heads;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v;
    TRY(clattn_core_create(dev, CLATTN_CORE_BACKWARD, d, &c->lay, 0, &t->core));
    p->backward_core = t->core.core;
    p->backward_core_params = t->core.params;
    clattn_core_params_format(p->backward_core, &p->backward_core_params, p->backward_core_params_text,
                              sizeof p->backward_core_params_text);
    p->tuned |= t->core.tuned;
    TRY(clattn_buffer_new(dev, B * Tq * dq_cols(d), sizeof(float), NULL, "the Q|K|V gradients", &t->dproj));
    if (d->cross) TRY(clattn_buffer_new(dev, B * Tk * HK * (dk + dv), sizeof(float), NULL, "the K|V gradients", &t->dproj_kv));
    TRY(clattn_buffer_new(dev, B * Tq * H * dv, sizeof(float), NULL, p->has_out ? "the context's gradient" :
                          "the recomputed context", p->has_out ? &t->dctx : &t->ctx));
    size_t n[NGRAD];
    grad_sizes(p, n);
    if (d->dtype != CLATTN_DTYPE_F32) { /* the fp32 pass's dOut and gradients, converted at the boundary */
        TRY(clattn_buffer_new(dev, B * Tq * p->out_width, sizeof(float), NULL, "grad_out widened to fp32", &t->gout32));
        TRY(clattn_buffer_new(dev, B * Tq * d->embed, sizeof(float), NULL, "the fp32 grad_x", &t->gx32));
        if (d->cross)
            TRY(clattn_buffer_new(dev, B * Tk * d->kv_embed, sizeof(float), NULL, "the fp32 grad_kv", &t->gkv32));
        if (d->separate_value)
            TRY(clattn_buffer_new(dev, clattn_plan_value_elems(d), sizeof(float), NULL, "the fp32 grad_value",
                                  &t->gvalue32));
        for (int i = 0; i < NGRAD; i++)
            if (n[i]) TRY(clattn_buffer_new(dev, n[i], sizeof(float), NULL, "a parameter's fp32 gradient", &t->gw32[i]));
    }
    if (!p->host_staging) return CLATTN_STATUS_SUCCESS;
    const size_t es = clattn_dtype_size(d->dtype); /* grad_out and the gradients in the plan's type */
    TRY(clattn_buffer_new(dev, B * Tq * p->out_width, es, NULL, "the grad_out staging buffer", &t->gout_in));
    TRY(clattn_buffer_new(dev, B * Tq * d->embed, es, NULL, "the grad_x staging buffer", &t->gx_out));
    if (d->cross) TRY(clattn_buffer_new(dev, B * Tk * d->kv_embed, es, NULL, "the grad_kv staging buffer", &t->gkv_out));
    if (d->separate_value)
        TRY(clattn_buffer_new(dev, clattn_plan_value_elems(d), es, NULL, "the grad_value staging buffer",
                              &t->gvalue_out));
    for (int i = 0; i < NGRAD; i++)
        if (n[i]) TRY(clattn_buffer_new(dev, n[i], es, NULL, "a parameter gradient's staging buffer", &t->gw[i]));
    return CLATTN_STATUS_SUCCESS;
}

#define TRAIN_MEMS(t) \
    {&t->dproj, &t->dproj_kv, &t->dctx, &t->ctx, &t->gout_in, &t->gx_out, &t->gkv_out, &t->gw[0], &t->gw[1], \
     &t->gw[2], &t->gw[3], &t->gw[4], &t->gw[5], &t->gw[6], &t->gw[7], &t->gvalue_out, &t->gout32, &t->gx32, \
     &t->gkv32, &t->gvalue32, &t->gw32[0], &t->gw32[1], &t->gw32[2], &t->gw32[3], &t->gw32[4], &t->gw32[5], \
     &t->gw32[6], &t->gw32[7]}

void clattn_shell_train_release(shell_train *t)
{
    clattn_core_destroy(&t->core);
    cl_mem *mems[] = TRAIN_MEMS(t);
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) clattn_mem_release(mems[i]);
}

size_t clattn_shell_train_bytes(const shell_train *t)
{
    shell_train *u = (shell_train *)t;
    cl_mem *mems[] = TRAIN_MEMS(u);
    size_t total = 0;
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++) total += clattn_mem_bytes(*mems[i]);
    if (t->core.core && t->core.core->device_bytes) total += t->core.core->device_bytes(t->core.state);
    return total;
}

/* dst (rows, n) = a (rows, k; row stride lda) W (k, n), W a LINEAR [out = k, in = n] weight of type tw (a half plan's
 * typed projections keep it in its type): an input's gradient through a projection. */
static clattn_status grad_input(const clattn_linear *l, view a, size_t lda, cl_mem w, clattn_dtype tw, size_t rows,
                                size_t k, size_t n, view dst, const char *what)
{
    const clattn_gemm_call g = {.m = rows, .n = n, .k = k, .alpha = 1.0f, .a = a, .b = {w, 0}, .c = dst, .lda = lda,
                                .ldb = n, .ldc = n, .count = 1, .type_b = tw, .what = what};
    return clattn_gemm_run(&l->gemm, &g);
}

/* n elements of es bytes from v on, zero bits (0 in float, half and bfloat16) */
static clattn_status zero_view(const struct clattn_plan *p, view v, size_t n, size_t es, const char *what)
{
    const cl_uchar zero = 0;
    if (!v.mem || !n) return CLATTN_STATUS_SUCCESS;
    CL_CHECK(clEnqueueFillBuffer(p->device->queue, v.mem, &zero, 1, v.off * es, n * es, 0, NULL, NULL), what);
    return CLATTN_STATUS_SUCCESS;
}

/* A varlen batch without query rows, or without key rows: no query sees a key, so every output row is b_out (or 0);
 * b_out's gradient is grad_out's column sums, every other gradient 0. */
static clattn_status bwd_no_scores(struct clattn_plan *p, const bwd_io *io)
{
    const clattn_attention_desc *d = &p->d;
    const clattn_rows *r = &io->rows;
    size_t n[NGRAD];
    grad_sizes(p, n);
    for (int i = 0; i < NGRAD; i++)
        if (i != GB_OUT || !r->q) TRY(zero_view(p, io->gw[i], n[i], sizeof(float), "zeroing a parameter's gradient"));
    if (r->q && io->gw[GB_OUT].mem)
        TRY(clattn_linear_colsum(&((shell *)p->backend_state)->lin, io->gout, p->out_width, r->q, p->out_width,
                                 io->gw[GB_OUT]));
    TRY(zero_view(p, io->gx, r->q * d->embed, sizeof(float), "zeroing grad_x"));
    TRY(zero_view(p, io->gkv, r->k * d->kv_embed, sizeof(float), "zeroing grad_kv"));
    return zero_view(p, io->gvalue, clattn_rows_value_elems(d, r), sizeof(float), "zeroing grad_value");
}

/* A varlen batch's backward core: once per sequence (clattn_backward_io.seq_q, seq_kv) on its rows; a sequence with
 * queries and no keys gets dQ 0, one with keys and no queries dK and dV 0. */
static clattn_status bwd_core_varlen(struct clattn_plan *p, const bwd_io *io, const clattn_backward_io *bio)
{
    shell_train *t = &((shell *)p->backend_state)->train;
    const clattn_attention_desc *d = &p->d;
    const clattn_rows *r = &io->rows;
    const size_t H = d->heads;
    for (size_t b = 0; b < d->batch; b++) {
        const size_t q0 = r->cu_q[b], nq = r->cu_q[b + 1] - q0, k0 = r->cu_k[b], nk = r->cu_k[b + 1] - k0;
        clattn_backward_io s = *bio;
        const clattn_core_layout *lay = &((shell *)p->backend_state)->lay; /* Q, K and V's row strides */
        s.q.off += q0 * lay->q_ld, s.k.off += k0 * lay->k_ld, s.v.off += k0 * lay->v_ld;
        s.dq.off += q0 * bio->dq_ld, s.dk.off += k0 * bio->dkv_ld, s.dv.off += k0 * bio->dkv_ld;
        if (nq == 0 || nk == 0) { /* cross-attention only (self: both 0): whole rows of dQ, or of [dK|dV] */
            if (nk == 0) TRY(zero_view(p, s.dq, nq * bio->dq_ld, sizeof(float), "zeroing dQ"));
            if (nq == 0) TRY(zero_view(p, s.dk, nk * bio->dkv_ld, sizeof(float), "zeroing dK and dV"));
            continue;
        }
        s.ctx.off += q0 * bio->ctx_ld, s.dctx.off += q0 * bio->dctx_ld, s.lse.off += H * q0;
        s.seq_q = nq, s.seq_kv = nk, s.drop_b0 = b;
        TRY(t->core.core->run_backward(t->core.state, &s));
    }
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status bwd_run(struct clattn_plan *p, const bwd_io *io)
{
    shell *c = p->backend_state;
    shell_train *t = &c->train;
    const clattn_linear *l = &c->lin;
    const clattn_attention_desc *d = &p->d;
    if (!io->rows.q || !io->rows.k) return bwd_no_scores(p, io); /* (a varlen batch's edge) */
    const size_t rq = io->rows.q, rk = io->rows.k, E = d->embed, Ekv = d->kv_embed; /* B*Tq, B*Tk or varlen's */
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v;
    const size_t Hdv = H * dv, Eo = p->out_width;
    /* a half plan's typed projections (shell.h): the weights in the type, and x and kv read as the caller's */
    const clattn_dtype tw = c->typed_proj ? d->dtype : CLATTN_DTYPE_F32;
    const clattn_dtype tx = c->typed_proj && p->has_qkv ? d->dtype : CLATTN_DTYPE_F32;
    /* 1. Q, K, V */
    clattn_core_io cio = {.kpm = io->kpm, .mask = io->mask, .seed = d->seed};
    const run_io rio = {.x = io->x, .kv = io->kv, .value = io->value, .rows = io->rows};
    TRY(clattn_shell_project(p, &rio, &cio));
    /* 2. the forward's lse and context */
    view ctx = io->ctx, lse = io->lse;
    if (!ctx.mem) {
        ctx = p->has_out ? (view){c->merged, 0} : (view){t->ctx, 0};
        lse = (view){c->lse_buf, 0};
        cio.out = ctx;
        cio.lse = lse;
        if (d->varlen)
            TRY(clattn_shell_core_varlen(p, &io->rows, &cio));
        else
            TRY(c->core.core->run(c->core.state, &cio));
        TRY(clattn_shell_sinks(p, &io->rows, ctx, lse)); /* desc.sinks: the forward's rows and lse (else nothing) */
    }
    /* 3. the output projection's gradients, and the context's */
    view dctx = io->gout;
    if (p->has_out) {
        dctx = (view){t->dctx, 0};
        TRY(grad_input(l, io->gout, Eo, c->w_out, tw, rq, Eo, Hdv, dctx, "the context's gradient"));
        if (io->gw[GW_OUT].mem)
            TRY(clattn_linear_grad_weight(l, io->gout, Eo, ctx, Hdv, CLATTN_DTYPE_F32, rq, Eo, Hdv, d->layout,
                                          io->gw[GW_OUT],
                                          "w_out's gradient"));
        if (io->gw[GB_OUT].mem) TRY(clattn_linear_colsum(l, io->gout, Eo, rq, Eo, io->gw[GB_OUT]));
    }
    /* 4. the backward core */
    const int self = !d->cross;
    const size_t nq = dq_cols(d), nkv = self ? nq : HK * (dk + dv);
    const view dq = {t->dproj, 0};
    const view dK = self ? (view){t->dproj, H * dk} : (view){t->dproj_kv, 0};
    const view dV = self ? (view){t->dproj, (H + HK) * dk} : (view){t->dproj_kv, HK * dk};
    const clattn_backward_io bio = {.q = cio.q, .k = cio.k, .v = cio.v, .ctx = ctx, .dctx = dctx, .ctx_ld = Hdv,
                                    .dctx_ld = Hdv, .lse = lse, .kpm = io->kpm, .mask = io->mask, .dq = dq, .dk = dK,
                                    .dv = dV, .dq_ld = nq, .dkv_ld = nkv, .seed = d->seed};
    if (d->varlen)
        TRY(bwd_core_varlen(p, io, &bio));
    else
        TRY(t->core.core->run_backward(t->core.state, &bio));
    /* 4b. rotary embeddings: the rotated Q's and K's gradients rotated back (in place) */
    TRY(clattn_shell_rope_grad(p, &io->rows, dq, nq, dK, nkv));
    /* 5. the projections' gradients and the inputs' */
    const view kvin = self ? io->x : io->kv;
    if (!p->has_qkv) {
        if (io->gx.mem) TRY(clattn_linear_sum_blocks(l, dq, nq, self ? 3 : 1, E, io->gx, E, rq));
        /* K = V = kv: dkv = dK + dV; separate_value: dkv = dK, dvalue = dV */
        const size_t sv = d->separate_value;
        if (io->gkv.mem) TRY(clattn_linear_sum_blocks(l, dK, nkv, sv ? 1 : 2, Ekv, io->gkv, Ekv, rk));
        if (io->gvalue.mem) TRY(clattn_linear_sum_blocks(l, dV, nkv, 1, HK * dv, io->gvalue, HK * dv, rk));
        return CLATTN_STATUS_SUCCESS;
    }
    const clattn_layout lay = d->layout;
    if (io->gw[GW_Q].mem)
        TRY(clattn_linear_grad_weight(l, dq, nq, io->x, E, tx, rq, H * dk, E, lay, io->gw[GW_Q],
                                      "w_query's gradient"));
    if (io->gw[GW_K].mem)
        TRY(clattn_linear_grad_weight(l, dK, nkv, kvin, Ekv, tx, rk, HK * dk, Ekv, lay, io->gw[GW_K],
                                      "w_key's gradient"));
    if (io->gw[GW_V].mem)
        TRY(clattn_linear_grad_weight(l, dV, nkv, kvin, Ekv, tx, rk, HK * dv, Ekv, lay, io->gw[GW_V],
                                      "w_value's gradient"));
    if (io->gw[GB_Q].mem) TRY(clattn_linear_colsum(l, dq, nq, rq, H * dk, io->gw[GB_Q]));
    if (io->gw[GB_K].mem) TRY(clattn_linear_colsum(l, dK, nkv, rk, HK * dk, io->gw[GB_K]));
    if (io->gw[GB_V].mem) TRY(clattn_linear_colsum(l, dV, nkv, rk, HK * dv, io->gw[GB_V]));
    if (io->gx.mem) TRY(grad_input(l, dq, nq, c->w_proj, tw, rq, nq, E, io->gx, "x's gradient"));
    if (io->gkv.mem) TRY(grad_input(l, dK, nkv, c->w_kv, tw, rk, nkv, Ekv, io->gkv, "kv's gradient"));
    return CLATTN_STATUS_SUCCESS;
}

/* A half-precision plan's backward (desc.dtype F16 or BF16): dOut widened (and x, kv, value where the forward widens
 * them: shell.c's typed_buffers), the fp32 pass into fp32 gradients, each narrowed into the caller's once. */
static clattn_status bwd_typed(struct clattn_plan *p, const bwd_io *io)
{
    shell *c = p->backend_state;
    shell_train *t = &c->train;
    const clattn_linear *l = &c->lin;
    const clattn_attention_desc *d = &p->d;
    const clattn_dtype ty = d->dtype;
    const size_t rq = io->rows.q, rk = io->rows.k; /* B*Tq and B*Tk, or a varlen batch's */
    size_t n[NGRAD];
    grad_sizes(p, n);
    bwd_io w = *io;
    w.gout = (view){t->gout32, 0};
    if (rq) TRY(clattn_linear_convert(l, io->gout, w.gout, rq * p->out_width, ty, 0));
    TRY(clattn_shell_widen_inputs(p, &io->rows, &w.x, &w.kv, &w.value));
    if (io->gx.mem) w.gx = (view){t->gx32, 0};
    if (io->gkv.mem) w.gkv = (view){t->gkv32, 0};
    if (io->gvalue.mem) w.gvalue = (view){t->gvalue32, 0};
    for (int i = 0; i < NGRAD; i++)
        if (io->gw[i].mem) w.gw[i] = (view){t->gw32[i], 0};
    TRY(bwd_run(p, &w));
    if (io->gx.mem && rq) TRY(clattn_linear_convert(l, w.gx, io->gx, rq * d->embed, ty, 1));
    if (io->gkv.mem && rk) TRY(clattn_linear_convert(l, w.gkv, io->gkv, rk * d->kv_embed, ty, 1));
    if (io->gvalue.mem && rk)
        TRY(clattn_linear_convert(l, w.gvalue, io->gvalue, clattn_rows_value_elems(d, &io->rows), ty, 1));
    for (int i = 0; i < NGRAD; i++)
        if (io->gw[i].mem) TRY(clattn_linear_convert(l, w.gw[i], io->gw[i], n[i], ty, 1));
    return CLATTN_STATUS_SUCCESS;
}

/* The pass for clattn_exec_host and _buffers. It sets no profiling markers: the stage times stay the forward's. */
static clattn_status bwd_pass(void *ctx)
{
    void **pc = ctx;
    const struct clattn_plan *p = pc[0];
    return p->d.dtype != CLATTN_DTYPE_F32 ? bwd_typed(pc[0], pc[1]) : bwd_run(pc[0], pc[1]);
}

clattn_status clattn_shell_backward_host(struct clattn_plan *p, const clattn_attention_args *a,
                                         const clattn_attention_grads *g)
{
    shell *c = p->backend_state;
    shell_train *t = &c->train;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tk = d->seq_kv, H = d->heads, dv = d->head_dim_v;
    if (!p->host_staging)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "this plan runs on device buffers only (no staging buffers)");
    const clattn_rows rows = clattn_rows_positioned(clattn_plan_rows_of(p, a->cu_seqlens_q, a->cu_seqlens_kv), d,
                                                    a->rope_positions, a->rope_positions_kv);
    const size_t rq = rows.q, rk = rows.k;
    const int saved = g->lse != NULL;
    const cl_mem ctx_buf = p->has_out ? c->merged : t->ctx;
    const size_t es = clattn_dtype_size(d->dtype); /* x, kv, value, grad_out and the gradients in the plan's type */
    const clattn_transfer in[] = {
        {c->x_in, rq * d->embed * es, (void *)a->x, "x"},
        {d->cross ? c->kv_in : NULL, rk * d->kv_embed * es, (void *)a->kv, "kv"},
        {d->key_padding_mask ? c->kpm_in : NULL, B * Tk, (void *)a->key_padding_mask, "the key padding mask"},
        {d->attn_mask ? c->mask_in : NULL, clattn_plan_mask_elems(d) * (d->attn_mask == CLATTN_MASK_FLOAT ? 4 : 1),
         (void *)a->attn_mask, "the attention mask"},
        {c->value_in, clattn_rows_value_elems(d, &rows) * es, (void *)a->value, "value"},
        {t->gout_in, rq * p->out_width * es, (void *)g->grad_out, "grad_out"},
        {saved ? c->lse_buf : NULL, H * rq * sizeof(float), (void *)g->lse, "lse"},
        {saved ? ctx_buf : NULL, rq * H * dv * sizeof(float), (void *)g->context, "context"}};
    size_t n[NGRAD];
    grad_sizes(p, n);
    void *const host[NGRAD] = {g->grad_w_query, g->grad_w_key, g->grad_w_value, g->grad_b_query, g->grad_b_key,
                                g->grad_b_value, g->grad_w_out, g->grad_b_out};
    clattn_transfer out[3 + NGRAD] = {
        {t->gx_out, rq * d->embed * es, g->grad_x, "grad_x"},
        {t->gkv_out, rk * d->kv_embed * es, g->grad_kv, "grad_kv"},
        {t->gvalue_out, clattn_rows_value_elems(d, &rows) * es, g->grad_value, "grad_value"}};
    bwd_io io = {.x = {c->x_in, 0}, .kv = {c->kv_in, 0}, .kpm = {c->kpm_in, 0}, .mask = {c->mask_in, 0},
                 .value = {c->value_in, 0}, .gout = {t->gout_in, 0}, .lse = {saved ? c->lse_buf : NULL, 0},
                 .ctx = {saved ? ctx_buf : NULL, 0}, .gx = {g->grad_x ? t->gx_out : NULL, 0},
                 .gkv = {g->grad_kv ? t->gkv_out : NULL, 0}, .gvalue = {g->grad_value ? t->gvalue_out : NULL, 0},
                 .rows = rows};
    for (int i = 0; i < NGRAD; i++) {
        out[3 + i] = (clattn_transfer){t->gw[i], n[i] * es, host[i], "a parameter's gradient"};
        io.gw[i] = (view){host[i] ? t->gw[i] : NULL, 0};
    }
    void *pc[2] = {p, &io};
    return clattn_exec_host(p->device, in, 8, bwd_pass, pc, out, 3 + NGRAD);
}

clattn_status clattn_shell_backward_buffers(struct clattn_plan *p, const clattn_attention_buffers *b,
                                            const clattn_attention_grad_buffers *g, cl_uint nwait,
                                            const cl_event *wait, cl_event *event)
{
    const clattn_buffer gws[NGRAD] = {g->grad_w_query, g->grad_w_key, g->grad_w_value, g->grad_b_query, g->grad_b_key,
                                      g->grad_b_value, g->grad_w_out, g->grad_b_out};
    bwd_io io = {.x = {b->x.mem, b->x.offset}, .kv = {b->kv.mem, b->kv.offset},
                 .kpm = {b->key_padding_mask.mem, b->key_padding_mask.offset},
                 .mask = {b->attn_mask.mem, b->attn_mask.offset}, .gout = {g->grad_out.mem, g->grad_out.offset},
                 .lse = {g->lse.mem, g->lse.offset}, .ctx = {g->context.mem, g->context.offset},
                 .gx = {g->grad_x.mem, g->grad_x.offset}, .gkv = {g->grad_kv.mem, g->grad_kv.offset},
                 .value = {b->value.mem, b->value.offset}, .gvalue = {g->grad_value.mem, g->grad_value.offset},
                 .rows = clattn_rows_positioned(clattn_plan_rows_of(p, b->cu_seqlens_q, b->cu_seqlens_kv), &p->d,
                                                b->rope_positions, b->rope_positions_kv)};
    for (int i = 0; i < NGRAD; i++) io.gw[i] = (view){gws[i].mem, gws[i].offset};
    void *pc[2] = {p, &io};
    return clattn_exec_buffers(p->device, nwait, wait, bwd_pass, pc, event);
}
