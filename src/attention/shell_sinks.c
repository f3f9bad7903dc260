/* shell_sinks.c: attention sinks (desc.sinks) on OpenCL: the core's output rows scaled by the share the sink leaves
 * them, from the rows' log-sum-exp the core writes, and a training plan's lse made that of the weights with the sink
 * (cl/attention/sinks.cl has the math). The plan's cores save their rows' statistics (select.c), and its core writes
 * fp32 rows (shell.c's layout). */
#include "shell.h"

clattn_status clattn_shell_sinks_init(struct clattn_plan *p)
{
    shell *c = p->backend_state;
    if (!p->d.sinks) return CLATTN_STATUS_SUCCESS;
    const char *src[] = {"attention/sinks"};
    TRY(clattn_program_build(p->device, src, 1, "-cl-std=CL1.2", &c->sinks_prog));
    TRY(clattn_kernel_create(c->sinks_prog, "sink_rows", &c->sinks_k));
    if (p->d.training) TRY(clattn_kernel_create(c->sinks_prog, "sink_lse", &c->sinks_lse_k));
    return clattn_shell_sinks_upload(p);
}

clattn_status clattn_shell_sinks_upload(struct clattn_plan *p)
{
    shell *c = p->backend_state;
    if (!p->d.sinks) return CLATTN_STATUS_SUCCESS;
    return clattn_buffer_put(p->device, p->d.heads, sizeof(float), p->sinks, "the sinks", &c->sinks_buf);
}

/* One launch over `batch` entries of T rows: the output rows from out (row stride ld), their lse from lse */
static clattn_status sinks_launch(struct clattn_plan *p, view out, size_t ld, view lse, size_t batch, size_t T)
{
    shell *c = p->backend_state;
    const size_t H = p->d.heads, total = batch * T * H * p->d.head_dim_v;
    clattn_args a;
    clattn_args_begin(&a, c->sinks_k, "sink_rows");
    clattn_arg_view(&a, out);
    clattn_arg_u32(&a, (cl_uint)ld);
    clattn_arg_view(&a, lse);
    clattn_arg_mem(&a, c->sinks_buf);
    clattn_arg_u32(&a, (cl_uint)H);
    clattn_arg_u32(&a, (cl_uint)p->d.head_dim_v);
    clattn_arg_u32(&a, (cl_uint)T);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    TRY(clattn_enqueue_1d(p->device, c->sinks_k, total, "enqueue sink_rows"));
    if (!p->d.training) return CLATTN_STATUS_SUCCESS;
    /* then (in order, after every value of a row read its L) the rows' lse with the sinks */
    const size_t rows = batch * H * T;
    clattn_args_begin(&a, c->sinks_lse_k, "sink_lse");
    clattn_arg_view(&a, lse);
    clattn_arg_mem(&a, c->sinks_buf);
    clattn_arg_u32(&a, (cl_uint)H);
    clattn_arg_u32(&a, (cl_uint)T);
    clattn_arg_u64(&a, rows);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(p->device, c->sinks_lse_k, rows, "enqueue sink_lse");
}

clattn_status clattn_shell_sinks(struct clattn_plan *p, const clattn_rows *r, view out, view lse)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    if (!d->sinks) return CLATTN_STATUS_SUCCESS;
    const size_t ld = c->lay.out_ld;
    if (!d->varlen) return sinks_launch(p, out, ld, lse, d->batch, d->seq_q);
    for (size_t b = 0; b < d->batch; b++) { /* each sequence's (H, L) rows of lse at H times its first row */
        const size_t q0 = r->cu_q[b], n = r->cu_q[b + 1] - q0;
        if (!n) continue;
        TRY(sinks_launch(p, (view){out.mem, out.off + q0 * ld}, ld, (view){lse.mem, lse.off + d->heads * q0}, 1, n));
    }
    return CLATTN_STATUS_SUCCESS;
}
