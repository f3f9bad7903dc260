/* backward.c: clattn_plan_backward (clattn.h, "training: the backward pass"): the call's checks, then the
 * backend's backward_host. Every refusal comes before anything is written. */
#include "attention.h"

#include <stdio.h>

/* A gradient given for an input the plan does not have would never be written: refused. */
static clattn_status check_has(const void *grad, int has, const char *name, const char *why)
{
    if (grad && !has)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads.%s is given, but %s: it would not be written",
                           name, why);
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status check_grads(const clattn_plan *plan, const clattn_attention_grads *g)
{
    const clattn_attention_desc *d = &plan->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, E = d->embed, Ekv = d->kv_embed, H = d->heads;
    const size_t dv = d->head_dim_v;
    if (!g) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads is NULL");
    if (!g->grad_out) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads.grad_out is NULL");
    if ((g->lse != NULL) != (g->context != NULL))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads.%s is given without grads.%s: give the forward's "
                           "lse and context together, or neither (the backward then recomputes them)",
                           g->lse ? "lse" : "context", g->lse ? "context" : "lse");
    TRY(check_has(g->grad_kv, d->cross, "grad_kv", "the plan is self-attention (its keys and values come from x)"));
    const void *const arrays[8] = {g->grad_w_query, g->grad_w_key, g->grad_w_value, g->grad_b_query, g->grad_b_key,
                                   g->grad_b_value, g->grad_w_out, g->grad_b_out};
    const size_t counts[8] = {g->grad_w_query_count, g->grad_w_key_count, g->grad_w_value_count,
                              g->grad_b_query_count, g->grad_b_key_count, g->grad_b_value_count, g->grad_w_out_count,
                              g->grad_b_out_count};
    /* the plan's own parameters, in the same order: a gradient for one it lacks is refused */
    static const char *names[8] = {"grad_w_query", "grad_w_key", "grad_w_value", "grad_b_query", "grad_b_key",
                                   "grad_b_value", "grad_w_out", "grad_b_out"};
    static const char *lacks[8] = {"the plan has no projection weights", "the plan has no projection weights",
                                   "the plan has no projection weights", "the plan has no b_query",
                                   "the plan has no b_key", "the plan has no b_value",
                                   "the plan has no output projection", "the plan has no b_out"};
    const int has[8] = {plan->has_qkv, plan->has_qkv, plan->has_qkv, plan->b_query != NULL, plan->b_key != NULL,
                        plan->b_value != NULL, plan->has_out, plan->b_out != NULL};
    for (int i = 0; i < 8; i++) TRY(check_has(arrays[i], has[i], names[i], lacks[i]));
    char how[120];
    snprintf(how, sizeof how, "batch x seq_q x out width = %zu x %zu x %zu", B, Tq, plan->out_width);
    TRY(clattn_count_check("grads", "grad_out", g->grad_out, g->grad_out_count, B * Tq * plan->out_width, how));
    snprintf(how, sizeof how, "batch x heads x seq_q = %zu x %zu x %zu", B, H, Tq);
    TRY(clattn_count_check("grads", "lse", g->lse, g->lse_count, B * H * Tq, how));
    snprintf(how, sizeof how, "batch x seq_q x heads*head_dim_v = %zu x %zu x %zu*%zu", B, Tq, H, dv);
    TRY(clattn_count_check("grads", "context", g->context, g->context_count, B * Tq * H * dv, how));
    snprintf(how, sizeof how, "batch x seq_q x embed = %zu x %zu x %zu", B, Tq, E);
    TRY(clattn_count_check("grads", "grad_x", g->grad_x, g->grad_x_count, B * Tq * E, how));
    snprintf(how, sizeof how, "batch x seq_kv x kv_embed = %zu x %zu x %zu", B, Tk, Ekv);
    TRY(clattn_count_check("grads", "grad_kv", g->grad_kv, g->grad_kv_count, B * Tk * Ekv, how));
    return clattn_weight_counts_check(d, "grads", "grad_", arrays, counts);
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
    TRY(check_grads(plan, grads));
    if (!plan->ops->backward_host)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "the %s backend has no backward pass in this version: the ref "
                           "device computes the gradients (the OpenCL backward core is not written yet)",
                           plan->ops->name);
    pthread_mutex_lock(&plan->lock);
    const clattn_status st = plan->ops->backward_host(plan, args, grads);
    pthread_mutex_unlock(&plan->lock);
    return st;
}
