/* shell_project.c: the OpenCL shell's first step, the Q/K/V projections (shell.h), which the forward (shell.c)
 * and the backward (shell_backward.c) both run: self-attention one GEMM against [Wq|Wk|Wv], cross-attention
 * Q = x Wq^T and [K|V] = kv [Wk|Wv]^T, or without projections the inputs themselves (V the value input with
 * separate_value). */
#include "shell.h"

clattn_status clattn_shell_project(struct clattn_plan *p, const run_io *io, clattn_core_io *cio)
{
    shell *c = p->backend_state;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed;
    const size_t H = d->heads, HK = d->kv_heads, dk = d->head_dim_qk;
    if (!p->has_qkv) {
        cio->q = io->x;
        cio->k = cio->v = d->cross ? io->kv : io->x;
        if (d->separate_value) cio->v = io->value;
        return CLATTN_STATUS_SUCCESS;
    }
    view proj = {c->proj, 0};
    if (!d->cross) {
        TRY(clattn_linear_run(&c->lin, B * Tq, c->n_qkv, E, io->x, c->w_proj, c->b_proj, proj, 0, 0,
                              "QKV projection"));
        cio->q = proj;
        cio->k = (view){c->proj, H * dk};
        cio->v = (view){c->proj, (H + HK) * dk};
    } else {
        view proj_kv = {c->proj_kv, 0};
        TRY(clattn_linear_run(&c->lin, B * Tq, H * dk, E, io->x, c->w_proj, c->b_proj, proj, 0, 0, "Q projection"));
        TRY(clattn_linear_run(&c->lin, B * Tk, c->lay.k_ld, Ekv, io->kv, c->w_kv, c->b_proj_kv, proj_kv, 0, 0,
                              "K|V projection"));
        cio->q = proj;
        cio->k = proj_kv;
        cio->v = (view){c->proj_kv, HK * dk};
    }
    return CLATTN_STATUS_SUCCESS;
}
