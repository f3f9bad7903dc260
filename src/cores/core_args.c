/* core_args.c: what every attention kernel is specialised by (-D) and takes as arguments, shared by the
 * cores: the masks, dropout, row-major tensors; and the head-size classes (below the registry, which the cores
 * must not use). */
#include "core.h"

#include <limits.h>
#include <stdio.h>

void clattn_core_arg_masks(clattn_args *a, clattn_view kpm, clattn_view mask, const clattn_attention_desc *d)
{
    clattn_arg_view(a, kpm);
    clattn_arg_view(a, mask);
    clattn_arg_u32(a, (cl_uint)d->seq_q);
    clattn_arg_u32(a, (cl_uint)d->seq_kv);
    clattn_arg_u32(a, (cl_uint)d->heads);
}

void clattn_core_arg_dropout(clattn_args *a, const clattn_attention_desc *d, uint64_t seed, size_t b0)
{
    clattn_arg_u32(a, (cl_uint)seed);
    clattn_arg_u32(a, (cl_uint)(seed >> 32));
    clattn_arg_u32(a, clattn_dropout_threshold(d->dropout));
    clattn_arg_f32(a, clattn_dropout_keep_scale(d->dropout));
    clattn_arg_u32(a, (cl_uint)b0);
}

void clattn_core_arg_rows(clattn_args *a, clattn_view t, size_t ld)
{
    clattn_arg_view(a, t);
    clattn_arg_u32(a, (cl_uint)ld);
}

void clattn_core_arg_backward(clattn_args *a, const clattn_backward_io *io, const clattn_core_layout *lay, cl_mem dd,
                              const clattn_attention_desc *d, uint64_t extent, int pass)
{
    clattn_core_arg_rows(a, io->q, lay->q_ld);
    clattn_core_arg_rows(a, io->k, lay->k_ld);
    clattn_core_arg_rows(a, io->v, lay->v_ld);
    clattn_core_arg_rows(a, io->dctx, io->dctx_ld);
    clattn_arg_view(a, io->lse);
    clattn_arg_mem(a, dd);
    clattn_core_arg_masks(a, io->kpm, io->mask, d);
    clattn_arg_f32(a, d->scale);
    clattn_arg_u64(a, extent);
    clattn_core_arg_dropout(a, d, io->seed, io->drop_b0);
    if (pass == 0) {
        clattn_core_arg_rows(a, io->dq, io->dq_ld);
    } else {
        clattn_core_arg_rows(a, io->dk, io->dkv_ld);
        clattn_core_arg_rows(a, io->dv, io->dkv_ld);
    }
}

clattn_status clattn_core_backward_dot(const clattn_device *dev, cl_kernel k, const clattn_backward_io *io, cl_mem dd,
                                       const clattn_attention_desc *d)
{
    const size_t rows = d->batch * d->heads * d->seq_q;
    clattn_args a;
    clattn_args_begin(&a, k, "bwd_dot");
    clattn_core_arg_rows(&a, io->dctx, io->dctx_ld);
    clattn_core_arg_rows(&a, io->ctx, io->ctx_ld);
    clattn_arg_mem(&a, dd);
    clattn_arg_u32(&a, (cl_uint)d->seq_q);
    clattn_arg_u32(&a, (cl_uint)d->heads);
    clattn_arg_u64(&a, rows);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(dev, k, rows, "enqueue bwd_dot");
}

int clattn_core_attention_defines(const clattn_attention_desc *d, unsigned what, char *opts, size_t len)
{
    size_t n = 0;
#define PUT(...)                                                                          \
    do {                                                                                  \
        const int w_ = snprintf(opts + (n < len ? n : len), n < len ? len - n : 0, __VA_ARGS__); \
        if (w_ < 0) return w_;                                                            \
        n += (size_t)w_;                                                                  \
    } while (0)
    PUT("-cl-std=CL1.2");
    if (what & CLATTN_DEFINES_SHAPE)
        PUT(" -DDK=%zu -DDV=%zu -DGROUP=%zu -DKV_HALF=%d", d->head_dim_qk, d->head_dim_v, d->heads / d->kv_heads,
            d->kv_half);
    if ((what & CLATTN_DEFINES_SHAPE) && d->kv_page_size) PUT(" -DPAGE=%zu", d->kv_page_size); /* decode: paged */
    if (what & (CLATTN_DEFINES_SHAPE | CLATTN_DEFINES_MASKS)) PUT(" -DWINDOW=%zu", d->window);
    if (what & CLATTN_DEFINES_MASKS)
        PUT(" -DCAUSAL=%d -DKPM=%d -DMASK_KIND=%d", d->causal, d->key_padding_mask, (int)d->attn_mask);
    if ((what & CLATTN_DEFINES_MASKS) && (d->attn_mask_per_batch || d->attn_mask_per_head)) /* else 0 (mask.cl) */
        PUT(" -DMASK_PB=%d -DMASK_PH=%d", d->attn_mask_per_batch, d->attn_mask_per_head);
    if (what & CLATTN_DEFINES_TRAIN) /* LSE with sinks too: shell_sinks.c reads it */
        PUT(" -DDROPOUT=%d -DLSE=%d", d->dropout > 0.0f, d->training || d->sinks);
    if (what & CLATTN_DEFINES_TF32) PUT(" -DTF32=%d", d->precision == CLATTN_PRECISION_TF32);
#undef PUT
    return n > INT_MAX ? INT_MAX : (int)n;
}

int clattn_core_param_defines(const clattn_core *core, const clattn_core_params *p, int rows, size_t rows_value,
                              char *opts, size_t len)
{
    size_t n = 0;
    for (int i = 0; i < core->nparams; i++) {
        const int w = snprintf(opts + (n < len ? n : len), n < len ? len - n : 0, " -D%s=%zu", core->params[i].name,
                               i == rows ? rows_value : p->v[i]);
        if (w < 0) return w;
        n += (size_t)w;
    }
    return n > INT_MAX ? INT_MAX : (int)n;
}

size_t clattn_core_head_vector(size_t dk, size_t dv)
{
    return dk % 8 == 0 && dv % 8 == 0 ? 8 : dk % 4 == 0 && dv % 4 == 0 ? 4 : 1;
}

size_t clattn_core_register_rows(size_t dv) { return dv > 128 ? 8 : 16; }

size_t clattn_core_rows_trips(size_t rows, size_t nk, size_t nv, size_t keys, size_t bk, size_t extra_per_key)
{
    const size_t r = rows, blocks = (keys + bk - 1) / bk;
    const size_t key = 1 + 3 * r + nk * (1 + r) + 2 * r + r * (1 + 2 * nv) + extra_per_key;
    return blocks * (bk * key + 1 + 2 * r + 2 * r * nv) + r * (2 + nk + 2 * nv);
}

clattn_status clattn_core_supports_heads(const clattn_core *core, const clattn_caps *caps,
                                         const clattn_attention_desc *d, size_t max_head, int fit_defaults, char *why,
                                         size_t len)
{
    if (d && (d->head_dim_qk > max_head || d->head_dim_v > max_head)) {
        snprintf(why, len, "%s takes head sizes up to %zu (dk = %zu, dv = %zu)", core->name, max_head, d->head_dim_qk,
                 d->head_dim_v);
        return CLATTN_STATUS_UNSUPPORTED;
    }
    const clattn_attention_desc one = {.head_dim_qk = 1, .head_dim_v = 1};
    clattn_core_params p;
    if (fit_defaults && !core->defaults(core, caps, d ? d : &one, &p)) {
        snprintf(why, len, "%s's work-groups do not fit this device (local memory %zu bytes, max work-group %zu)",
                 core->name, caps->local_mem, caps->max_work_group);
        return CLATTN_STATUS_UNSUPPORTED;
    }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_core_combine(const clattn_device *dev, cl_kernel k, const clattn_split_combine *c)
{
    const size_t total = c->rows * c->heads * c->dv;
    clattn_args a;
    clattn_args_begin(&a, k, "split_combine");
    clattn_arg_view(&a, c->acc);
    clattn_arg_u64(&a, c->a_row);
    clattn_arg_u32(&a, (cl_uint)c->a_part);
    clattn_arg_u32(&a, (cl_uint)c->a_head);
    clattn_arg_view(&a, c->st);
    clattn_arg_u64(&a, c->s_row);
    clattn_arg_u32(&a, (cl_uint)c->s_part);
    clattn_arg_u32(&a, (cl_uint)c->s_head);
    clattn_arg_u32(&a, (cl_uint)c->parts);
    clattn_arg_u32(&a, (cl_uint)c->base2);
    clattn_arg_u32(&a, (cl_uint)c->heads);
    clattn_arg_u32(&a, (cl_uint)c->dv);
    clattn_arg_u32(&a, (cl_uint)c->n);
    clattn_arg_mem(&a, c->valid);
    clattn_core_arg_rows(&a, c->out, c->out_ld);
    clattn_arg_view(&a, c->lse);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_1d(dev, k, total, "enqueue split_combine");
}

void clattn_core_fit_trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                           clattn_core_params *p, int param)
{
    if (!caps || !caps->loop_limit || !core->trips) return;
    const size_t budget = clattn_loop_budget(caps);
    const clattn_core_param *q = &core->params[param];
    for (size_t i = q->nvalues; i-- > 0 && core->trips(core, caps, d, p) > budget;)
        if (q->values[i] < p->v[param] && q->values[i] > 0) p->v[param] = q->values[i];
}

clattn_status clattn_core_check_local(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                                      const clattn_core_params *p, cl_kernel k)
{
    if (clattn_device_simulated(dev)) return CLATTN_STATUS_SUCCESS; /* the host compiled it, not the target */
    cl_ulong used = 0;
    CL_CHECK(clGetKernelWorkGroupInfo(k, dev->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof used, &used, NULL),
             "querying a kernel's local memory");
    const size_t counted = core->local_bytes ? core->local_bytes(core, &dev->caps, d, p) : 0;
    /* what the kernel declares, from what the driver reports (the probes' scale: rusticl reports twice) */
    if (dev->caps.local_report > 4096) used = used * 4096 / dev->caps.local_report;
    if (used > (cl_ulong)counted + CLATTN_LOCAL_SLACK) {
        char params[200];
        clattn_core_param_defines(core, p, -1, 0, params, sizeof params);
        return clattn_fail(CLATTN_STATUS_BUILD_FAILURE, "%s (%s, dk = %zu, dv = %zu): its kernel uses %llu bytes of "
                           "local memory, its description counts %zu (+%d): the C side's tile geometry and the "
                           "kernel's __local arrays disagree", core->name, params, d->head_dim_qk, d->head_dim_v,
                           (unsigned long long)used, counted, CLATTN_LOCAL_SLACK);
    }
    return CLATTN_STATUS_SUCCESS;
}

clattn_attention_desc clattn_core_shape(const clattn_attention_desc *d, size_t seq_q, size_t seq_kv)
{
    clattn_attention_desc s = *d;
    if (seq_q) s.batch = 1, s.seq_q = seq_q, s.seq_kv = seq_kv;
    return s;
}

clattn_status clattn_core_mark(const clattn_core_io *io, clattn_stage stage)
{
    return io->mark ? io->mark(io->mark_ctx, stage) : CLATTN_STATUS_SUCCESS;
}

/* ---- head-size classes (core.h): here, below the registry and every core that reads them */
int clattn_head_class(size_t dk, size_t dv)
{
    const size_t d = dk > dv ? dk : dv;
    return d <= 32 ? 0 : d <= 64 ? 1 : d <= 128 ? 2 : d <= 256 ? 3 : 4;
}

const char *clattn_head_class_name(int cls)
{
    static const char *names[CLATTN_HEAD_CLASSES] = {"<=32", "<=64", "<=128", "<=256", ">256"};
    return cls >= 0 && cls < CLATTN_HEAD_CLASSES ? names[cls] : "?";
}
