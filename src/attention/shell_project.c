/* shell_project.c: what the forward (shell.c) and the backward (shell_backward.c) both run: a varlen batch's core,
 * sequence by sequence, and the OpenCL shell's first step: a half plan's inputs widened where its projections do not read them as they are, then self-attention one GEMM against [Wq|Wk|Wv], cross-attention
 * Q = x Wq^T and [K|V] = kv [Wk|Wv]^T, or without projections the inputs themselves (V the value input with
 * separate_value). */
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
        return CLATTN_STATUS_SUCCESS;
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
    return CLATTN_STATUS_SUCCESS;
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
