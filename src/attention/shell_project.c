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
    c->rope_cs_positions = positions;
    if (p->has_qkv) return CLATTN_STATUS_SUCCESS; /* rotated in place, in the projections' rows */
    TRY(clattn_buffer_new(dev, d->batch * d->seq_q * d->embed, sizeof(float), NULL, "Q rotated", &c->rope_q));
    if (d->cross)
        TRY(clattn_buffer_new(dev, d->batch * d->seq_kv * d->kv_embed, sizeof(float), NULL, "K rotated", &c->rope_k));
    return CLATTN_STATUS_SUCCESS;
}

/* The table on the device holding every position the plan's table holds (grown by clattn_plan_positions_reserve
 * for the positions a call gives), renewed only when this call's rows need more than it holds (`needed`): a call
 * whose table the device could not take leaves later calls with smaller positions running. */
static clattn_status rope_table_sync(struct clattn_plan *p, size_t needed)
{
    shell *c = p->backend_state;
    if (needed <= c->rope_cs_positions) return CLATTN_STATUS_SUCCESS;
    return clattn_rope_device_table(p, &c->rope_cs, &c->rope_cs_positions);
}

/* Each row's position into c->rope_pos, Q's r->q rows then K's r->k: the positions given (r->pos_q, r->pos_k), or a
 * varlen batch's rows from 0 in each sequence. 0: neither (the launches take row % period); 1: written. */
static clattn_status rope_positions_put(struct clattn_plan *p, const clattn_rows *r, int *written)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    *written = 0;
    if (!r->pos_q && !r->pos_k && !r->cu_q) return CLATTN_STATUS_SUCCESS;
    const size_t cap = d->batch * (d->seq_q + d->seq_kv); /* r->q + r->k never more */
    if (!c->rope_pos_host && !(c->rope_pos_host = clattn_malloc(cap * sizeof *c->rope_pos_host)))
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "the rows' rotary positions (%zu)", cap);
    if (!c->rope_pos) TRY(clattn_buffer_new(p->device, cap, sizeof(uint32_t), NULL, "the rows' rotary positions",
                                            &c->rope_pos));
    if (c->rope_pos_written) { /* the previous call's upload read the host copy: done before it is refilled */
        const cl_int err = clWaitForEvents(1, &c->rope_pos_written);
        clReleaseEvent(c->rope_pos_written);
        c->rope_pos_written = NULL;
        CL_CHECK(err, "waiting for the previous call's upload of the rows' rotary positions");
    }
    uint32_t *pos = c->rope_pos_host;
    for (int w = 0; w < 2; w++) {
        const size_t n = w ? r->k : r->q, T = w ? d->seq_kv : d->seq_q;
        const uint32_t *given = w ? r->pos_k : r->pos_q, *cu = w ? r->cu_k : r->cu_q;
        for (size_t i = 0, b = 0; i < n; i++) {
            while (cu && i >= cu[b + 1]) b++; /* the sequence of packed row i */
            pos[i] = given ? given[i] : (uint32_t)(cu ? i - cu[b] : i % T);
        }
        pos += n;
    }
    /* not blocking: on the buffers path the queue may wait for the caller's events, completed after this call */
    CL_CHECK(clEnqueueWriteBuffer(p->device->queue, c->rope_pos, CL_FALSE, 0, (r->q + r->k) * sizeof(uint32_t),
                                  c->rope_pos_host, 0, NULL, &c->rope_pos_written),
             "uploading the rows' rotary positions");
    *written = 1;
    return CLATTN_STATUS_SUCCESS;
}

/* One launch of rope_rows: `rows` rows of `heads` heads, row t at position t % period, or at rope_pos[pos_off + t]
 * when `positioned`; the values past the rotated ones copied too when dst is not src (copy_rest); sign -1 rotates
 * back (a gradient). */
static clattn_status rope_launch(struct clattn_plan *p, view src, size_t src_ld, view dst, size_t dst_ld, size_t rows,
                                 size_t period, int positioned, size_t pos_off, size_t heads, int copy_rest,
                                 float sign)
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
    clattn_arg_mem(&a, positioned ? c->rope_pos : c->rope_cs); /* (not read without positions) */
    clattn_arg_u64(&a, positioned ? pos_off : 0);
    clattn_arg_u32(&a, positioned != 0);
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

/* Q and K rotated for the core (forward: sign 1; copy_rest for the rotated buffers without projections), or dQ and
 * dK rotated back (sign -1): the padded batch's rows of each entry from position 0 (period = its length), a varlen
 * batch's from 0 in each sequence, or at the positions given; one launch for Q's rows and one for K's. k_src NULL:
 * self-attention without projections, where K is Q (rotated once). */
static clattn_status rope_both(struct clattn_plan *p, const clattn_rows *r, view q_src, size_t qld, view q_dst,
                               const view *k_src, size_t kld, view k_dst, int copy_rest, float sign)
{
    const clattn_attention_desc *d = &p->d;
    int positioned;
    /* (without positions given, the rows' own are in the first table) */
    TRY(rope_table_sync(p, clattn_positions_most(r->pos_q, r->q, r->pos_k, r->k)));
    TRY(rope_positions_put(p, r, &positioned));
    TRY(rope_launch(p, q_src, qld, q_dst, qld, r->q, d->seq_q, positioned, 0, d->heads, copy_rest, sign));
    if (!k_src) return CLATTN_STATUS_SUCCESS;
    return rope_launch(p, *k_src, kld, k_dst, kld, r->k, d->seq_kv, positioned, r->q, d->kv_heads, copy_rest, sign);
}

/* Q and K rotated for the core: the projections' rows in place, or the inputs into the plan's buffers (cio moved
 * onto them; V stays where it is). */
static clattn_status rope_forward(struct clattn_plan *p, const clattn_rows *r, clattn_core_io *cio)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    const size_t qld = c->lay.q_ld, kld = c->lay.k_ld;
    if (d->rope.kind == CLATTN_ROPE_NONE) return CLATTN_STATUS_SUCCESS;
    if (p->has_qkv) return rope_both(p, r, cio->q, qld, cio->q, &cio->k, kld, cio->k, 0, 1.0f);
    const view q = {c->rope_q, 0}, k = {d->cross ? c->rope_k : c->rope_q, 0};
    /* self-attention: K = Q = x, the same rows at the same positions, rotated once */
    TRY(rope_both(p, r, cio->q, qld, q, d->cross ? &cio->k : NULL, kld, k, 1, 1.0f));
    cio->q = q, cio->k = k;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_shell_rope_grad(struct clattn_plan *p, const clattn_rows *r, view dq, size_t dq_ld, view dk,
                                     size_t dk_ld)
{
    if (p->d.rope.kind == CLATTN_ROPE_NONE) return CLATTN_STATUS_SUCCESS;
    return rope_both(p, r, dq, dq_ld, dq, &dk, dk_ld, dk, 0, -1.0f);
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
