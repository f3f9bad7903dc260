/* backward.c: clattn_plan_backward (clattn.h, "training: the backward pass"): the call's checks, then the
 * backend's backward_host. Every refusal comes before anything is written. */
#include "attention.h"

#include <stdio.h>

/* A gradient given for an input the plan does not have would never be written: refused. */
static clattn_status check_has(int grad, int has, const char *name, const char *why)
{
    if (grad && !has)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads.%s is given, but %s: it would not be written",
                           name, why);
    return CLATTN_STATUS_SUCCESS;
}

/* What a backward call's gradients must agree with, either form: the forward's lse and context both or neither,
 * and no gradient for an input the plan lacks. given[]: grad_kv, then the eight parameters in
 * clattn_attention_grads' order, then grad_value. */
static clattn_status check_given(const clattn_plan *plan, const char *owner, int lse, int context, const int given[10])
{
    const clattn_attention_desc *d = &plan->d;
    if (lse != context)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.%s is given without %s.%s: give the forward's lse "
                           "and context together, or neither (the backward then recomputes them)", owner,
                           lse ? "lse" : "context", owner, lse ? "context" : "lse");
    TRY(check_has(given[0], d->cross, "grad_kv", "the plan is self-attention (its keys and values come from x)"));
    TRY(check_has(given[9], d->separate_value, "grad_value", "the plan has no value input (desc.separate_value = 0)"));
    /* the plan's own parameters, in the same order: a gradient for one it lacks is refused */
    static const char *names[8] = {"grad_w_query", "grad_w_key", "grad_w_value", "grad_b_query", "grad_b_key",
                                   "grad_b_value", "grad_w_out", "grad_b_out"};
    static const char *lacks[8] = {"the plan has no projection weights", "the plan has no projection weights",
                                   "the plan has no projection weights", "the plan has no b_query",
                                   "the plan has no b_key", "the plan has no b_value",
                                   "the plan has no output projection", "the plan has no b_out"};
    const int has[8] = {plan->has_qkv, plan->has_qkv, plan->has_qkv, plan->b_query != NULL, plan->b_key != NULL,
                        plan->b_value != NULL, plan->has_out, plan->b_out != NULL};
    for (int i = 0; i < 8; i++) TRY(check_has(given[1 + i], has[i], names[i], lacks[i]));
    return CLATTN_STATUS_SUCCESS;
}

/* The gradients against the inputs (x, kv, the masks, grad_out, lse, context) and each other, host form (a, g) or
 * buffer form (b, gb): one list for both forms. */
static clattn_status backward_no_overlap(const clattn_plan *p, const clattn_attention_args *a,
                                         const clattn_attention_grads *g, const clattn_attention_buffers *b,
                                         const clattn_attention_grad_buffers *gb)
{
    const clattn_attention_desc *d = &p->d;
    const size_t H = d->heads, HK = d->kv_heads;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v, Eo = d->out_dim, es = clattn_dtype_size(d->dtype);
    const clattn_rows r = a ? clattn_plan_rows_of(p, a->cu_seqlens_q, a->cu_seqlens_kv) /* B*Tq, B*Tk, or varlen's */
                            : clattn_plan_rows_of(p, b->cu_seqlens_q, b->cu_seqlens_kv);
    enum { N = CLATTN_PLAN_INPUTS };
    clattn_mem_range ins[N + 3];
    clattn_plan_input_ranges(p, a, b, ins);
    /* grad_out and the gradients in the plan's type; lse and context fp32 */
    ins[N] = CLATTN_RANGE("grads", g, gb, grad_out, r.q * p->out_width, es);
    ins[N + 1] = CLATTN_RANGE("grads", g, gb, lse, H * r.q, 4);
    ins[N + 2] = CLATTN_RANGE("grads", g, gb, context, r.q * H * dv, 4);
    const clattn_mem_range outs[] = {
        CLATTN_RANGE("grads", g, gb, grad_value, clattn_rows_value_elems(d, &r), es),
        CLATTN_RANGE("grads", g, gb, grad_x, r.q * d->embed, es),
        CLATTN_RANGE("grads", g, gb, grad_kv, d->cross ? r.k * d->kv_embed : 0, es),
        CLATTN_RANGE("grads", g, gb, grad_w_query, p->has_qkv ? H * dk * d->embed : 0, es),
        CLATTN_RANGE("grads", g, gb, grad_w_key, p->has_qkv ? HK * dk * d->kv_embed : 0, es),
        CLATTN_RANGE("grads", g, gb, grad_w_value, p->has_qkv ? HK * dv * d->kv_embed : 0, es),
        CLATTN_RANGE("grads", g, gb, grad_b_query, p->b_query ? H * dk : 0, es),
        CLATTN_RANGE("grads", g, gb, grad_b_key, p->b_key ? HK * dk : 0, es),
        CLATTN_RANGE("grads", g, gb, grad_b_value, p->b_value ? HK * dv : 0, es),
        CLATTN_RANGE("grads", g, gb, grad_w_out, p->has_out ? Eo * H * dv : 0, es),
        CLATTN_RANGE("grads", g, gb, grad_b_out, p->b_out ? Eo : 0, es)};
    return clattn_check_no_overlap(outs, (int)(sizeof outs / sizeof outs[0]), ins, N + 3);
}

static clattn_status check_grads(const clattn_plan *plan, const clattn_attention_args *a,
                                 const clattn_attention_grads *g)
{
    const clattn_attention_desc *d = &plan->d;
    const clattn_rows r = clattn_plan_rows_of(plan, a->cu_seqlens_q, a->cu_seqlens_kv); /* checked with the inputs */
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed, H = d->heads;
    const size_t dv = d->head_dim_v;
    if (!g) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads is NULL");
    if (!g->grad_out && r.q) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads.grad_out is NULL");
    const void *const arrays[8] = {g->grad_w_query, g->grad_w_key, g->grad_w_value, g->grad_b_query, g->grad_b_key,
                                   g->grad_b_value, g->grad_w_out, g->grad_b_out};
    const size_t counts[8] = {g->grad_w_query_count, g->grad_w_key_count, g->grad_w_value_count,
                              g->grad_b_query_count, g->grad_b_key_count, g->grad_b_value_count, g->grad_w_out_count,
                              g->grad_b_out_count};
    int given[10] = {g->grad_kv != NULL};
    for (int i = 0; i < 8; i++) given[1 + i] = arrays[i] != NULL;
    given[9] = g->grad_value != NULL;
    TRY(check_given(plan, "grads", g->lse != NULL, g->context != NULL, given));
    char how[120];
    /* the query rows (B x Tq, or a varlen batch's cu_seqlens_q[batch]) and the key rows, in messages */
    char qr[64], kr[64];
    if (d->varlen)
        snprintf(qr, sizeof qr, "cu_seqlens_q[batch] (%zu)", r.q), snprintf(kr, sizeof kr, "%s (%zu)",
                                                                            d->cross ? "cu_seqlens_kv[batch]" :
                                                                            "cu_seqlens_q[batch]", r.k);
    else
        snprintf(qr, sizeof qr, "batch x seq_q (%zu x %zu)", B, Tq), snprintf(kr, sizeof kr, "batch x seq_kv (%zu x %zu)",
                                                                               B, Tk);
    snprintf(how, sizeof how, "%s x out width %zu", qr, plan->out_width);
    TRY(clattn_count_check("grads", "grad_out", g->grad_out, g->grad_out_count, r.q * plan->out_width, how));
    snprintf(how, sizeof how, "heads %zu x %s", H, qr);
    TRY(clattn_count_check("grads", "lse", g->lse, g->lse_count, H * r.q, how));
    snprintf(how, sizeof how, "%s x heads*head_dim_v %zu*%zu", qr, H, dv);
    TRY(clattn_count_check("grads", "context", g->context, g->context_count, r.q * H * dv, how));
    snprintf(how, sizeof how, "%s x embed %zu", qr, E);
    TRY(clattn_count_check("grads", "grad_x", g->grad_x, g->grad_x_count, r.q * E, how));
    snprintf(how, sizeof how, "%s x kv_embed %zu", kr, Ekv);
    TRY(clattn_count_check("grads", "grad_kv", g->grad_kv, g->grad_kv_count, r.k * Ekv, how));
    snprintf(how, sizeof how, "%s x kv_heads*head_dim_v %zu*%zu", kr, d->kv_heads, dv);
    TRY(clattn_count_check("grads", "grad_value", g->grad_value, g->grad_value_count, clattn_rows_value_elems(d, &r),
                           how));
    return clattn_weight_counts_check(d, "grads", "grad_", arrays, counts);
}

/* The buffer form: every given buffer holds its array past its offset. */
static clattn_status check_grad_buffers(const clattn_plan *plan, const clattn_attention_buffers *b,
                                        const clattn_attention_grad_buffers *g)
{
    const clattn_attention_desc *d = &plan->d;
    const size_t B = d->batch, Tk = d->seq_kv, H = d->heads, HK = d->kv_heads;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v, Eo = d->out_dim, es = clattn_dtype_size(d->dtype);
    const clattn_rows r = clattn_plan_rows_of(plan, b->cu_seqlens_q, b->cu_seqlens_kv); /* checked: declared() */
    if (!g) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads is NULL");
    if (!g->grad_out.mem && r.q) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads.grad_out.mem is NULL");
    if (b->out.mem || b->attn.mem || b->lse.mem || b->context.mem)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers.%s is given to the backward pass, which writes "
                           "gradients only (the forward's lse and context go in grads)",
                           b->out.mem ? "out" : b->attn.mem ? "attn" : b->lse.mem ? "lse" : "context");
    const clattn_buffer ps[10] = {g->grad_kv, g->grad_w_query, g->grad_w_key, g->grad_w_value, g->grad_b_query,
                                  g->grad_b_key, g->grad_b_value, g->grad_w_out, g->grad_b_out, g->grad_value};
    int given[10];
    for (int i = 0; i < 10; i++) given[i] = ps[i].mem != NULL;
    TRY(check_given(plan, "grads", g->lse.mem != NULL, g->context.mem != NULL, given));
    const size_t mask_size = d->attn_mask == CLATTN_MASK_FLOAT ? 4 : 1;
    /* x, kv, value, grad_out and the gradients in the plan's type; lse and context fp32 */
    const struct { clattn_buffer buf; size_t elems, size; const char *what; } all[] = {
        {b->x, r.q * d->embed, es, "x"},
        {b->kv, d->cross ? r.k * d->kv_embed : 0, es, "kv"},
        {b->key_padding_mask, d->key_padding_mask ? B * Tk : 0, 1, "key_padding_mask"},
        {b->attn_mask, clattn_plan_mask_elems(d), mask_size, "attn_mask"},
        {b->value, clattn_rows_value_elems(d, &r), es, "value"},
        {g->grad_out, r.q * plan->out_width, es, "grad_out"},
        {g->lse, H * r.q, 4, "lse"},
        {g->context, r.q * H * dv, 4, "context"},
        {g->grad_x, r.q * d->embed, es, "grad_x"},
        {g->grad_kv, r.k * d->kv_embed, es, "grad_kv"},
        {g->grad_w_query, H * dk * d->embed, es, "grad_w_query"},
        {g->grad_w_key, HK * dk * d->kv_embed, es, "grad_w_key"},
        {g->grad_w_value, HK * dv * d->kv_embed, es, "grad_w_value"},
        {g->grad_b_query, H * dk, es, "grad_b_query"},
        {g->grad_b_key, HK * dk, es, "grad_b_key"},
        {g->grad_b_value, HK * dv, es, "grad_b_value"},
        {g->grad_w_out, Eo * H * dv, es, "grad_w_out"},
        {g->grad_b_out, Eo, es, "grad_b_out"},
        {g->grad_value, clattn_rows_value_elems(d, &r), es, "grad_value"}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if ((i < 5 || i >= 8) && !all[i].elems) continue; /* an input the plan lacks (refused before), or no rows */
        if (i == 5 && !all[i].elems) continue; /* a varlen batch without rows: no grad_out needed */
        if (i == 0 || i == 5 || all[i].buf.mem)
            TRY(clattn_buffer_check(all[i].buf.mem, all[i].buf.offset, all[i].elems, all[i].size, all[i].what));
    }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_plan_backward(clattn_plan *plan, const clattn_attention_args *args,
                                   const clattn_attention_grads *grads)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (!plan->d.training)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "the plan was created without desc.training = 1: only a "
                           "training plan has a backward pass");
    TRY(clattn_plan_check_inputs(plan, args));
    if (args->out || args->attn || args->lse || args->context)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.%s is given to the backward pass, which writes "
                           "gradients only (the forward's lse and context go in grads)",
                           args->out ? "out" : args->attn ? "attn" : args->lse ? "lse" : "context");
    TRY(check_grads(plan, args, grads));
    TRY(backward_no_overlap(plan, args, grads, NULL, NULL));
    pthread_mutex_lock(&plan->lock);
    const clattn_rows r = clattn_plan_rows_of(plan, args->cu_seqlens_q, args->cu_seqlens_kv);
    clattn_status st = clattn_plan_positions_reserve(plan, args->rope_positions, args->rope_positions_kv, &r);
    if (st == CLATTN_STATUS_SUCCESS) st = plan->ops->backward_host(plan, args, grads);
    pthread_mutex_unlock(&plan->lock);
    return st;
}

clattn_status clattn_plan_backward_buffers(clattn_plan *plan, const clattn_attention_buffers *buffers,
                                          const clattn_attention_grad_buffers *grads, cl_uint num_events_in_wait_list,
                                          const cl_event *event_wait_list, cl_event *event)
{
    clattn_clear_error();
    TRY(clattn_buffers_call_check(plan, buffers, plan && plan->ops->backward_buffers, plan ? plan->device : NULL,
                                  num_events_in_wait_list, event_wait_list));
    if (!plan->d.training)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "the plan was created without desc.training = 1: only a "
                           "training plan has a backward pass");
    TRY(clattn_plan_check_buffers_declared(plan, buffers));
    TRY(check_grad_buffers(plan, buffers, grads));
    TRY(backward_no_overlap(plan, NULL, NULL, buffers, grads));
    pthread_mutex_lock(&plan->lock);
    const clattn_rows r = clattn_plan_rows_of(plan, buffers->cu_seqlens_q, buffers->cu_seqlens_kv);
    clattn_status st = clattn_plan_positions_reserve(plan, buffers->rope_positions, buffers->rope_positions_kv, &r);
    if (st == CLATTN_STATUS_SUCCESS)
        st = plan->ops->backward_buffers(plan, buffers, grads, num_events_in_wait_list, event_wait_list, event);
    pthread_mutex_unlock(&plan->lock);
    return st;
}
