/* shell_project.c: what the forward (shell.c) and the backward (shell_backward.c) both run: a varlen batch's core,
 * sequence by sequence, and the OpenCL shell's first step: a half plan's inputs widened where its projections do not read them as they are, then self-attention one GEMM against [Wq|Wk|Wv], cross-attention
 * Q = x Wq^T and [K|V] = kv [Wk|Wv]^T, or without projections the inputs themselves (V the value input with
 * separate_value); with desc.rope, Q and K rotated (rope_rows, cl/attention/rope.cl). */
#include "shell.h"

#include <math.h>

clattn_status clattn_shell_core_varlen(struct clattn_plan *p, const clattn_rows *r, const clattn_core_io *cio)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    cl_command_queue q = p->device->queue;
    for (size_t b = 0; b < d->batch; b++) {
        const size_t q0 = r->cu_q[b], nq = r->cu_q[b + 1] - q0, k0 = r->cu_k[b], nk = r->cu_k[b + 1] - k0;
        if (nq == 0) continue;
        clattn_core_io s = *cio;
        s.out.off += q0 * c->lay.out_ld;
        s.lse.off += d->heads * q0;
        s.mark = NULL; /* marked once below */
        if (nk == 0) { /* zero bits: 0 in float, half and bfloat16 (a core writing the plan's type: native_io) */
            const cl_uchar zero = 0;
            const size_t es = c->native_io ? clattn_dtype_size(d->dtype) : sizeof(float);
            CL_CHECK(clEnqueueFillBuffer(q, s.out.mem, &zero, 1, s.out.off * es, nq * c->lay.out_ld * es, 0, NULL, NULL),
                     "writing the context of a sequence without keys");
            const cl_float none = -INFINITY;
            if (s.lse.mem)
                CL_CHECK(clEnqueueFillBuffer(q, s.lse.mem, &none, sizeof none, s.lse.off * sizeof none,
                                             d->heads * nq * sizeof none, 0, NULL, NULL),
                         "writing the log-sum-exp of a sequence without keys");
            continue;
        }
        s.q.off += q0 * c->lay.q_ld, s.k.off += k0 * c->lay.k_ld, s.v.off += k0 * c->lay.v_ld;
        s.seq_q = nq, s.seq_kv = nk, s.drop_b0 = b;
        TRY(c->core.core->run(c->core.state, &s));
    }
    return clattn_core_mark(cio, CLATTN_STAGE_ATTENTION);
}

/* ---- rotary embeddings (desc.rope): cl/attention/rope.cl on the plan's table (rope.c) */

clattn_status clattn_shell_rope_init(struct clattn_plan *p)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    const clattn_device *dev = p->device;
    if (d->rope.kind == CLATTN_ROPE_NONE) return CLATTN_STATUS_SUCCESS;
    const char *src[] = {"attention/rope"};
    TRY(clattn_program_build(dev, src, 1, "-cl-std=CL1.2", &c->rope_prog));
    TRY(clattn_kernel_create(c->rope_prog, "rope_rows", &c->rope));
    const size_t positions = d->seq_q > d->seq_kv ? d->seq_q : d->seq_kv;
    TRY(clattn_buffer_new(dev, positions * d->rope.dims, sizeof(float), p->rope_cs,
                          "the rotary embeddings' cos and sin", &c->rope_cs));
    if (p->has_qkv) return CLATTN_STATUS_SUCCESS; /* rotated in place, in the projections' rows */
    TRY(clattn_buffer_new(dev, d->batch * d->seq_q * d->embed, sizeof(float), NULL, "Q rotated", &c->rope_q));
    if (d->cross)
        TRY(clattn_buffer_new(dev, d->batch * d->seq_kv * d->kv_embed, sizeof(float), NULL, "K rotated", &c->rope_k));
    return CLATTN_STATUS_SUCCESS;
}

/* One launch of rope_rows: `rows` rows of `heads` heads, row t at position t % period; the values past the rotated
 * ones copied too when dst is not src (copy_rest); sign -1 rotates back (a gradient). */
static clattn_status rope_launch(struct clattn_plan *p, view src, size_t src_ld, view dst, size_t dst_ld, size_t rows,
                                 size_t period, size_t heads, int copy_rest, float sign)
{
    shell *c = p->backend_state;
    const clattn_rope *r = &p->d.rope;
    const size_t dk = p->d.head_dim_qk, half = r->dims / 2, rest = copy_rest ? dk - r->dims : 0;
    if (!rows || !(half + rest)) return CLATTN_STATUS_SUCCESS;
    clattn_args a;
    clattn_args_begin(&a, c->rope, "rope_rows");
    clattn_arg_view(&a, src);
    clattn_arg_u32(&a, (cl_uint)src_ld);
    clattn_arg_view(&a, dst);
    clattn_arg_u32(&a, (cl_uint)dst_ld);
    clattn_arg_mem(&a, c->rope_cs);
    clattn_arg_u32(&a, (cl_uint)period);
    clattn_arg_u32(&a, (cl_uint)heads);
    clattn_arg_u32(&a, (cl_uint)dk);
    clattn_arg_u32(&a, (cl_uint)half);
    clattn_arg_u32(&a, r->kind == CLATTN_ROPE_INTERLEAVED);
    clattn_arg_u32(&a, (cl_uint)rest);
    clattn_arg_f32(&a, sign);
    const size_t total = rows * heads * (half + rest);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(p->device, c->rope, total, "enqueue rope_rows");
}

/* The rows of Q (or K): the padded batch's, each entry from position 0 (period = its length), or a varlen batch's
 * sequences (cu: B+1 offsets), each from position 0 too. */
static clattn_status rope_rows(struct clattn_plan *p, const uint32_t *cu, size_t rows, size_t period, view src,
                               size_t src_ld, view dst, size_t dst_ld, size_t heads, int copy_rest, float sign)
{
    if (!cu) return rope_launch(p, src, src_ld, dst, dst_ld, rows, period, heads, copy_rest, sign);
    for (size_t b = 0; b < p->d.batch; b++) {
        const size_t n = cu[b + 1] - cu[b];
        const view s = {src.mem, src.off + cu[b] * src_ld}, t = {dst.mem, dst.off + cu[b] * dst_ld};
        TRY(rope_launch(p, s, src_ld, t, dst_ld, n, n, heads, copy_rest, sign));
    }
    return CLATTN_STATUS_SUCCESS;
}

/* Q and K rotated for the core: the projections' rows in place, or the inputs into the plan's buffers (cio moved
 * onto them; V stays where it is). */
static clattn_status rope_forward(struct clattn_plan *p, const clattn_rows *r, clattn_core_io *cio)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    const size_t H = d->heads, HK = d->kv_heads, qld = c->lay.q_ld, kld = c->lay.k_ld;
    if (d->rope.kind == CLATTN_ROPE_NONE) return CLATTN_STATUS_SUCCESS;
    if (p->has_qkv) {
        TRY(rope_rows(p, r->cu_q, r->q, d->seq_q, cio->q, qld, cio->q, qld, H, 0, 1.0f));
        return rope_rows(p, r->cu_k, r->k, d->seq_kv, cio->k, kld, cio->k, kld, HK, 0, 1.0f);
    }
    const view q = {c->rope_q, 0};
    TRY(rope_rows(p, r->cu_q, r->q, d->seq_q, cio->q, qld, q, qld, H, 1, 1.0f));
    cio->q = q;
    if (!d->cross) { /* K = Q = x: the same rows at the same positions */
        cio->k = q;
        return CLATTN_STATUS_SUCCESS;
    }
    const view k = {c->rope_k, 0};
    TRY(rope_rows(p, r->cu_k, r->k, d->seq_kv, cio->k, kld, k, kld, HK, 1, 1.0f));
    cio->k = k;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_shell_rope_grad(struct clattn_plan *p, const clattn_rows *r, view dq, size_t dq_ld, view dk,
                                     size_t dk_ld)
{
    const clattn_attention_desc *d = &p->d;
    if (d->rope.kind == CLATTN_ROPE_NONE) return CLATTN_STATUS_SUCCESS;
    TRY(rope_rows(p, r->cu_q, r->q, d->seq_q, dq, dq_ld, dq, dq_ld, d->heads, 0, -1.0f));
    return rope_rows(p, r->cu_k, r->k, d->seq_kv, dk, dk_ld, dk, dk_ld, d->kv_heads, 0, -1.0f);
}

clattn_status clattn_shell_project(struct clattn_plan *p, const run_io *io, clattn_core_io *cio)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    const size_t rq = io->rows.q, rk = io->rows.k, E = d->embed, Ekv = d->kv_embed; /* B*Tq, B*Tk or varlen's */
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk;
    if (!p->has_qkv) {
        cio->q = io->x;
        cio->k = cio->v = d->cross ? io->kv : io->x;
        if (d->separate_value) cio->v = io->value;
        return rope_forward(p, &io->rows, cio);
    }
    view proj = {c->proj, 0};
    /* a half plan's x, kv and weights as they are, where the GEMM core reads the type (shell.h: typed_proj) */
    const clattn_dtype t = c->typed_proj ? d->dtype : CLATTN_DTYPE_F32;
    if (!d->cross) {
        TRY(clattn_linear_run_typed(&c->lin, rq, c->n_qkv, E, io->x, t, c->w_proj, t, c->b_proj, proj,
                                    "QKV projection"));
        cio->q = proj;
        cio->k = (view){c->proj, H * dk};
        cio->v = (view){c->proj, (H + HK) * dk};
    } else {
        view proj_kv = {c->proj_kv, 0};
        TRY(clattn_linear_run_typed(&c->lin, rq, H * dk, E, io->x, t, c->w_proj, t, c->b_proj, proj,
                                    "Q projection"));
        if (rk) /* a varlen batch may have no keys at all */
            TRY(clattn_linear_run_typed(&c->lin, rk, c->lay.k_ld, Ekv, io->kv, t, c->w_kv, t, c->b_proj_kv, proj_kv,
                                        "K|V projection"));
        cio->q = proj;
        cio->k = proj_kv;
        cio->v = (view){c->proj_kv, HK * dk};
    }
    return rope_forward(p, &io->rows, cio);
}

clattn_status clattn_shell_widen_inputs(struct clattn_plan *p, const clattn_rows *rows, view *x, view *kv, view *value)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    const clattn_dtype t = d->dtype;
    if (!c->x32) return CLATTN_STATUS_SUCCESS; /* the projections read x and kv in the type (clattn_shell_project) */
    if (rows->q) TRY(clattn_linear_convert(&c->lin, *x, (view){c->x32, 0}, rows->q * d->embed, t, 0));
    *x = (view){c->x32, 0};
    if (d->cross) {
        if (rows->k) TRY(clattn_linear_convert(&c->lin, *kv, (view){c->kv32, 0}, rows->k * d->kv_embed, t, 0));
        *kv = (view){c->kv32, 0};
    }
    if (d->separate_value) {
        if (rows->k)
            TRY(clattn_linear_convert(&c->lin, *value, (view){c->value32, 0}, clattn_rows_value_elems(d, rows), t, 0));
        *value = (view){c->value32, 0};
    }
    return CLATTN_STATUS_SUCCESS;
}
