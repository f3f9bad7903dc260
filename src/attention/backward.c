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
    const size_t HK = d->kv_heads, dk = d->head_dim_qk, dv = d->head_dim_v, Eo = d->out_dim;
    if (!g) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads is NULL");
    if (!g->grad_out) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads.grad_out is NULL");
    if ((g->lse != NULL) != (g->context != NULL))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "grads.%s is given without grads.%s: give the forward's "
                           "lse and context together, or neither (the backward then recomputes them)",
                           g->lse ? "lse" : "context", g->lse ? "context" : "lse");
    const int qkv = plan->has_qkv;
    TRY(check_has(g->grad_kv, d->cross, "grad_kv", "the plan is self-attention (its keys and values come from x)"));
    TRY(check_has(g->grad_w_query, qkv, "grad_w_query", "the plan has no projection weights"));
    TRY(check_has(g->grad_w_key, qkv, "grad_w_key", "the plan has no projection weights"));
    TRY(check_has(g->grad_w_value, qkv, "grad_w_value", "the plan has no projection weights"));
    TRY(check_has(g->grad_b_query, plan->b_query != NULL, "grad_b_query", "the plan has no b_query"));
    TRY(check_has(g->grad_b_key, plan->b_key != NULL, "grad_b_key", "the plan has no b_key"));
    TRY(check_has(g->grad_b_value, plan->b_value != NULL, "grad_b_value", "the plan has no b_value"));
    TRY(check_has(g->grad_w_out, plan->has_out, "grad_w_out", "the plan has no output projection"));
    TRY(check_has(g->grad_b_out, plan->b_out != NULL, "grad_b_out", "the plan has no b_out"));
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
    snprintf(how, sizeof how, "heads*head_dim_qk x embed = %zu*%zu x %zu", H, dk, E);
    TRY(clattn_count_check("grads", "grad_w_query", g->grad_w_query, g->grad_w_query_count, H * dk * E, how));
    snprintf(how, sizeof how, "kv_heads*head_dim_qk x kv_embed = %zu*%zu x %zu", HK, dk, Ekv);
    TRY(clattn_count_check("grads", "grad_w_key", g->grad_w_key, g->grad_w_key_count, HK * dk * Ekv, how));
    snprintf(how, sizeof how, "kv_heads*head_dim_v x kv_embed = %zu*%zu x %zu", HK, dv, Ekv);
    TRY(clattn_count_check("grads", "grad_w_value", g->grad_w_value, g->grad_w_value_count, HK * dv * Ekv, how));
    snprintf(how, sizeof how, "heads*head_dim_qk = %zu*%zu", H, dk);
    TRY(clattn_count_check("grads", "grad_b_query", g->grad_b_query, g->grad_b_query_count, H * dk, how));
    snprintf(how, sizeof how, "kv_heads*head_dim_qk = %zu*%zu", HK, dk);
    TRY(clattn_count_check("grads", "grad_b_key", g->grad_b_key, g->grad_b_key_count, HK * dk, how));
    snprintf(how, sizeof how, "kv_heads*head_dim_v = %zu*%zu", HK, dv);
    TRY(clattn_count_check("grads", "grad_b_value", g->grad_b_value, g->grad_b_value_count, HK * dv, how));
    snprintf(how, sizeof how, "out_dim x heads*head_dim_v = %zu x %zu*%zu", Eo, H, dv);
    TRY(clattn_count_check("grads", "grad_w_out", g->grad_w_out, g->grad_w_out_count, Eo * H * dv, how));
    snprintf(how, sizeof how, "out_dim = %zu", Eo);
    return clattn_count_check("grads", "grad_b_out", g->grad_b_out, g->grad_b_out_count, Eo, how);
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
