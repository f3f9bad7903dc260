/* encoder.c: the transformer encoder layer (torch.nn.TransformerEncoderLayer, batch_first, eval mode):
 * validation and the plan; it runs on the device's backend (encoder_ref.c, encoder_cl.c).
 *
 * The plan holds an attention plan (the self-attention with its output projection) and the rest of the
 * layer. On an OpenCL device (N = B*T rows):
 *
 *   post-norm                                   pre-norm
 *   1. a = SA(x)         attention plan         1. n = LN1(x)        residual_layernorm
 *   2. y = LN1(x + a)    residual_layernorm     2. a = SA(n)         attention plan
 *   3. h = y W1^T        CLBlast SGEMM          3. y = x + a, n = LN2(y)   residual_layernorm
 *      h = act(h + b1)   bias_act               4. h = act(n W1^T + b1)    SGEMM + bias_act
 *   4. a = h W2^T        CLBlast SGEMM          5. a = h W2^T        SGEMM
 *   5. out = LN2(y + a + b2)  residual_layernorm 6. out = y + a + b2  residual_bias
 *
 * Everything stays on the device between the input upload and the output read.
 */
#include "encoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The backend of each kind of device. */
static const clattn_encoder_ops *const backends[] = {
    [CLATTN_BACKEND_REF] = &clattn_encoder_ref,
    [CLATTN_BACKEND_OPENCL] = &clattn_encoder_opencl,
};

static const clattn_encoder_ops *backend_of(const clattn_device *dev) { return backends[dev->backend]; }

/* ---------------------------------------------------------------- validation */

static clattn_status validate(const clattn_encoder_desc *in, const clattn_encoder_weights *w, clattn_encoder_desc *d)
{
    *d = *in;
    const clattn_attention_desc *a = &d->attn;
    if (a->cross != 0)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.attn.cross must be 0: the encoder layer is self-attention");
    if (isnan(a->dropout))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.attn.dropout is NaN (it must be 0)");
    if (a->dropout != 0.0f)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED,
                           "desc.attn.dropout is %g: the encoder layer runs in eval mode only (dropout must be 0)",
                           (double)a->dropout);
    if (a->training)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "desc.attn.training is 1: the encoder layer runs in eval mode only "
                           "(an attention plan trains: clattn_plan_backward)");
    if (a->dtype != CLATTN_DTYPE_F32 && a->dtype != CLATTN_DTYPE_F16 && a->dtype != CLATTN_DTYPE_BF16)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.attn.dtype %d is not CLATTN_DTYPE_F32, _F16 or _BF16",
                           (int)a->dtype);
    if (a->rope.kind != CLATTN_ROPE_NONE)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "desc.attn.rope: the encoder layer (torch's "
                           "TransformerEncoderLayer) has no rotary embeddings (desc.attn.rope.kind must be NONE)");
    if (a->sinks)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "desc.attn.sinks: the encoder layer (torch's "
                           "TransformerEncoderLayer) has no attention sinks (desc.attn.sinks must be 0)");
    if (a->varlen)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "desc.attn.varlen is 1: the encoder layer runs padded batches "
                           "(key_padding_mask); variable-length batches are an attention plan's");
    if (a->attn_mask != CLATTN_MASK_NONE)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT,
                           "desc.attn.attn_mask must be CLATTN_MASK_NONE: the encoder layer takes causal and "
                           "key_padding_mask only");
    if (d->ff_dim == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.ff_dim must be >= 1");
    if (d->activation != CLATTN_ACTIVATION_RELU && d->activation != CLATTN_ACTIVATION_GELU)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT,
                           "desc.activation %d is not CLATTN_ACTIVATION_RELU or CLATTN_ACTIVATION_GELU",
                           (int)d->activation);
    if ((unsigned)d->norm_first > 1)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.norm_first must be 0 or 1, got %d", d->norm_first);
    if (!(isfinite(d->eps) && d->eps >= 0.0f))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc.eps must be finite and > 0 (0 = 1e-5), got %g",
                           (double)d->eps);
    if (d->eps == 0.0f) d->eps = 1e-5f;
    if (!w->attn.w_out)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT,
                           "weights.attn.w_out is NULL: the encoder layer needs the attention's output projection");
    if (a->out_dim != a->embed)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "desc.attn.out_dim (%zu) must equal desc.attn.embed (%zu)",
                           a->out_dim, a->embed);
    const size_t E = a->embed, F = d->ff_dim;
    const struct { const void *p; size_t count, want; const char *name, *how; } need[] = {
        {w->ln1_weight, w->ln1_weight_count, E, "ln1_weight", "embed"},
        {w->ln1_bias, w->ln1_bias_count, E, "ln1_bias", "embed"},
        {w->w_ff1, w->w_ff1_count, F * E, "w_ff1", "ff_dim x embed"},
        {w->b_ff1, w->b_ff1_count, F, "b_ff1", "ff_dim"},
        {w->w_ff2, w->w_ff2_count, E * F, "w_ff2", "embed x ff_dim"},
        {w->b_ff2, w->b_ff2_count, E, "b_ff2", "embed"},
        {w->ln2_weight, w->ln2_weight_count, E, "ln2_weight", "embed"},
        {w->ln2_bias, w->ln2_bias_count, E, "ln2_bias", "embed"}};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        if (!need[i].p) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights.%s is NULL", need[i].name);
        TRY(clattn_count_check("weights", need[i].name, need[i].p, need[i].count, need[i].want, need[i].how));
    }

    /* sizes of the encoder's own buffers (the attention plan checks its own) */
    size_t n, rows;
    if (clattn_mul_overflows(a->batch, a->seq_q, &rows) || clattn_mul_overflows(rows, E, &n) ||
        clattn_mul_overflows(n, 4 * sizeof(float), &n) || clattn_mul_overflows(rows, F, &n) ||
        clattn_mul_overflows(n, sizeof(float), &n) || clattn_mul_overflows(F, E, &n) ||
        clattn_mul_overflows(n, 2 * sizeof(float), &n))
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "the encoder's buffers for these dimensions overflow size_t");
    if (F > 0xFFFFFFFFu || E > 0xFFFFFFFFu)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "ff_dim or embed exceeds 2^32-1");
    return CLATTN_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- public API */

void clattn_encoder_plan_free(clattn_encoder_plan *plan)
{
    if (!plan) return;
    if (plan->ops && plan->ops->release) plan->ops->release(plan);
    clattn_plan_free(plan->attn);
    free(plan->ln1_w); free(plan->ln1_b); free(plan->w_ff1); free(plan->b_ff1);
    free(plan->w_ff2); free(plan->b_ff2); free(plan->ln2_w); free(plan->ln2_b);
    pthread_mutex_destroy(&plan->lock);
    free(plan);
}

/* The layer's self-attention plan (device resident). A half layer's (desc dtype F16, BF16) is an fp32 plan: its
 * description and weights as a plan of the type validates and widens them (clattn_plan_prepare), then made in fp32
 * (LINEAR, the host copies' layout): the layer converts at its own boundary. */
static clattn_status attention_of(clattn_device *device, const clattn_attention_desc *d,
                                  const clattn_attention_weights *w, clattn_plan **out)
{
    if (d->dtype == CLATTN_DTYPE_F32) return clattn_plan_create_device_resident(device, d, w, out);
    clattn_plan *typed = NULL;
    TRY(clattn_plan_prepare(device, d, w, 0, &typed));
    clattn_attention_desc d32 = typed->d;
    d32.dtype = CLATTN_DTYPE_F32, d32.layout = CLATTN_LAYOUT_LINEAR;
    const size_t H = d32.heads, HK = d32.kv_heads, dk = d32.head_dim_qk, dv = d32.head_dim_v, Eo = d32.out_dim;
    const clattn_attention_weights w32 = {
        .w_query = typed->w_query, .w_key = typed->w_key, .w_value = typed->w_value, .b_query = typed->b_query,
        .b_key = typed->b_key, .b_value = typed->b_value, .w_out = typed->w_out, .b_out = typed->b_out,
        .w_query_count = typed->w_query ? H * dk * d32.embed : 0, .w_key_count = typed->w_key ? HK * dk * d32.kv_embed : 0,
        .w_value_count = typed->w_value ? HK * dv * d32.kv_embed : 0, .b_query_count = typed->b_query ? H * dk : 0,
        .b_key_count = typed->b_key ? HK * dk : 0, .b_value_count = typed->b_value ? HK * dv : 0,
        .w_out_count = typed->w_out ? Eo * H * dv : 0, .b_out_count = typed->b_out ? Eo : 0};
    const clattn_status st = clattn_plan_create_device_resident(device, &d32, &w32, out);
    clattn_plan_free(typed);
    return st;
}

clattn_status clattn_encoder_plan_create(clattn_device *device, const clattn_encoder_desc *desc,
                                         const clattn_encoder_weights *weights, clattn_encoder_plan **plan)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    *plan = NULL;
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    if (!desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc is NULL");
    if (!weights) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "weights is NULL");
    clattn_encoder_desc d;
    clattn_status st = validate(desc, weights, &d);
    if (st) return st;
    const clattn_encoder_ops *ops = backend_of(device);
    if (ops->check && (st = ops->check(device, &d))) return st;

    clattn_encoder_plan *p = clattn_calloc(1, sizeof *p);
    if (!p) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the encoder plan");
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "creating the encoder plan's lock");
    }
    p->device = device;
    p->ops = ops;
    p->d = d;
    p->rows = d.attn.batch * d.attn.seq_q;
    p->E = d.attn.embed;
    p->F = d.ff_dim;
    /* the self-attention, run on the encoder's buffers only: validates desc.attn and weights.attn
     * before its own device work; a half layer's is an fp32 plan on its weights widened */
    st = attention_of(device, &d.attn, &weights->attn, &p->attn);
    if (st) {
        char why[1024];
        snprintf(why, sizeof why, "%s", clattn_last_error());
        clattn_encoder_plan_free(p);
        return clattn_fail(st, "self-attention: %s", why);
    }
    const size_t E = p->E, F = p->F;
    const clattn_layout layout = d.attn.layout;
    /* the layer's own weights (their counts checked by validate), widened to float for a half layer */
    const clattn_dtype t = d.attn.dtype;
    const void *src[8] = {weights->ln1_weight, weights->ln1_bias, weights->w_ff1, weights->b_ff1, weights->w_ff2,
                          weights->b_ff2, weights->ln2_weight, weights->ln2_bias};
    const size_t cnt[8] = {E, E, F * E, F, E * F, E, E, E};
    float *wide[8] = {NULL};
    int oom = 0;
    for (int i = 0; i < 8 && t != CLATTN_DTYPE_F32; i++) {
        if (!(wide[i] = clattn_malloc(cnt[i] * sizeof(float)))) oom = 1;
        else clattn_dtype_widen(src[i], cnt[i], t, wide[i]);
    }
    const float *f[8];
    for (int i = 0; i < 8; i++) f[i] = t != CLATTN_DTYPE_F32 ? wide[i] : src[i];
    oom |= !(p->ln1_w = oom ? NULL : clattn_vector_copy(f[0], E));
    oom |= !(p->ln1_b = oom ? NULL : clattn_vector_copy(f[1], E));
    oom |= !(p->w_ff1 = oom ? NULL : clattn_weight_copy(f[2], F, E, layout));
    oom |= !(p->b_ff1 = oom ? NULL : clattn_vector_copy(f[3], F));
    oom |= !(p->w_ff2 = oom ? NULL : clattn_weight_copy(f[4], E, F, layout));
    oom |= !(p->b_ff2 = oom ? NULL : clattn_vector_copy(f[5], E));
    oom |= !(p->ln2_w = oom ? NULL : clattn_vector_copy(f[6], E));
    oom |= !(p->ln2_b = oom ? NULL : clattn_vector_copy(f[7], E));
    for (int i = 0; i < 8; i++) free(wide[i]);
    if (oom) {
        clattn_encoder_plan_free(p);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "copying the encoder weights");
    }
    if (ops->init && (st = ops->init(p))) {
        clattn_encoder_plan_free(p);
        return st;
    }
    *plan = p;
    return CLATTN_STATUS_SUCCESS;
}

/* The layer's output against its inputs, host form (a) or buffer form (b): one list for both forms. */
static clattn_status layer_no_overlap(const clattn_encoder_plan *p, const clattn_encoder_args *a,
                                      const clattn_encoder_buffers *b)
{
    const size_t N = p->rows, E = p->E, es = clattn_dtype_size(p->d.attn.dtype);
    const char *o = a ? "args" : "buffers";
    const clattn_mem_range ins[] = {CLATTN_RANGE(o, a, b, x, N * E, es),
                                    CLATTN_RANGE(o, a, b, key_padding_mask, p->d.attn.key_padding_mask ? N : 0, 1)};
    const clattn_mem_range outs[] = {CLATTN_RANGE(o, a, b, out, N * E, es)};
    return clattn_check_no_overlap(outs, 1, ins, 2);
}

/* A half layer from host arrays: x widened on the host (exactly), the fp32 layer, its output rounded once. */
static clattn_status execute_typed(clattn_encoder_plan *plan, const clattn_encoder_args *args)
{
    const size_t n = plan->rows * plan->E;
    const clattn_dtype t = plan->d.attn.dtype;
    float *buf = clattn_malloc(2 * n * sizeof *buf);
    if (!buf) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "widening the layer's %s input", clattn_dtype_name(t));
    clattn_dtype_widen(args->x, n, t, buf);
    clattn_encoder_args wide = *args;
    wide.x = buf, wide.out = buf + n;
    const clattn_status st = plan->ops->execute_host(plan, &wide);
    if (st == CLATTN_STATUS_SUCCESS) clattn_dtype_narrow(buf + n, n, t, args->out);
    free(buf);
    return st;
}

clattn_status clattn_encoder_plan_execute(clattn_encoder_plan *plan, const clattn_encoder_args *args)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (!args) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args is NULL");
    if (!args->x) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.x is NULL");
    if (!args->out) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.out is NULL");
    if (plan->d.attn.key_padding_mask && !args->key_padding_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.key_padding_mask is NULL (the plan expects one)");
    if (!plan->d.attn.key_padding_mask && args->key_padding_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.key_padding_mask is given, but the plan was created "
                           "without one (desc.attn.key_padding_mask = 0): it would be ignored");
    const size_t N = plan->rows, E = plan->E;
    TRY(clattn_count_check("args", "x", args->x, args->x_count, N * E, "batch*seq_q x embed"));
    TRY(clattn_count_check("args", "key_padding_mask", args->key_padding_mask, args->key_padding_mask_count, N,
                           "batch x seq_q"));
    TRY(clattn_count_check("args", "out", args->out, args->out_count, N * E, "batch*seq_q x embed"));
    TRY(layer_no_overlap(plan, args, NULL));
    pthread_mutex_lock(&plan->lock);
    const clattn_status st = plan->d.attn.dtype != CLATTN_DTYPE_F32 ? execute_typed(plan, args)
                                                                     : plan->ops->execute_host(plan, args);
    pthread_mutex_unlock(&plan->lock);
    return st;
}

clattn_status clattn_encoder_plan_execute_buffers(clattn_encoder_plan *plan, const clattn_encoder_buffers *buffers,
                                                  cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                  cl_event *event)
{
    clattn_clear_error();
    TRY(clattn_buffers_call_check(plan, buffers, plan && plan->ops->execute_buffers, plan ? plan->device : NULL,
                                  num_events_in_wait_list, event_wait_list));
    const size_t N = plan->rows, E = plan->E;
    const size_t es = clattn_dtype_size(plan->d.attn.dtype);
    TRY(clattn_buffer_check(buffers->x.mem, buffers->x.offset, N * E, es, "x"));
    if (plan->d.attn.key_padding_mask)
        TRY(clattn_buffer_check(buffers->key_padding_mask.mem, buffers->key_padding_mask.offset, N, 1, "key_padding_mask"));
    TRY(clattn_buffer_check(buffers->out.mem, buffers->out.offset, N * E, es, "out"));
    if (!plan->d.attn.key_padding_mask && buffers->key_padding_mask.mem)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers.key_padding_mask is given, but the plan was "
                           "created without one (desc.attn.key_padding_mask = 0): it would be ignored");
    TRY(layer_no_overlap(plan, NULL, buffers));
    pthread_mutex_lock(&plan->lock);
    const clattn_status st = plan->ops->execute_buffers(plan, buffers, num_events_in_wait_list, event_wait_list,
                                                        event);
    pthread_mutex_unlock(&plan->lock);
    return st;
}


const char *clattn_encoder_plan_core(const clattn_encoder_plan *plan) { return plan ? clattn_plan_core(plan->attn) : ""; }

const char *clattn_encoder_plan_gemm(const clattn_encoder_plan *plan) { return plan ? clattn_plan_gemm(plan->attn) : ""; }

clattn_status clattn_residual_layernorm_rows(clattn_device *dev, size_t rows, size_t E, const float *x,
                                             const float *r, const float *bias, const float *gamma,
                                             const float *beta, float eps, int row_cache, float *sum_out,
                                             float *out)
{
    clattn_clear_error();
    if (!dev || !x || !gamma || !beta || !out)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "dev, x, gamma, beta and out must not be NULL");
    if (rows == 0 || E == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rows and E must be >= 1");
    if (!(isfinite(eps) && eps > 0.0f)) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "eps must be finite and > 0");
    if (row_cache < -1 || row_cache > 1) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "row_cache must be -1, 0 or 1");
    size_t n;
    if (clattn_mul_overflows(rows, E, &n) || clattn_mul_overflows(n, sizeof(float), &n) || E > 0xFFFFFFFFu)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "rows x E overflows");
    return backend_of(dev)->layernorm_rows(dev, rows, E, x, r, bias, gamma, beta, eps, row_cache, sum_out, out);
}
