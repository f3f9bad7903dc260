/* decode.c: decode plans (clattn.h, "KV cache and decoding"). A decode execution with n new tokens per
 * sequence: the Q/K/V projections, the new keys and values appended to the cache at lens[b] + t, attention
 * of each new token over its sequence's keys (a decode core: src/cores/), the output projection. The plan
 * validates and checks the call here and runs on its device's backend (decode_ref.c, decode_cl.c). Cache
 * lengths live on the host (the caller knows them anyway) and change only when a call succeeds. */
#include "decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The backend of each kind of device. */
static const clattn_decode_ops *const backends[] = {
    [CLATTN_BACKEND_REF] = &clattn_decode_ref,
    [CLATTN_BACKEND_OPENCL] = &clattn_decode_opencl,
};

static clattn_status validate_decode(const clattn_attention_desc *d)
{
    if (d->cross) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan is self-attention (cross = 0)");
    if (!d->causal) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan needs causal = 1");
    if (d->attn_mask != CLATTN_MASK_NONE || d->key_padding_mask)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan takes no attn_mask or key_padding_mask (the "
                           "cache lengths and args.valid say which positions exist)");
    if (d->dropout != 0.0f) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan takes no dropout");
    if (d->varlen)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "varlen: a decode plan's sequences have lengths of their own "
                           "already (the cache's lengths, args.valid); desc.varlen is for prefill plans");
    if (d->training)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan does not train (desc.training must be 0)");
    if (d->need_weights)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan does not return the attention weights");
    if (d->sinks)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "sinks: a decode plan has no attention sinks in clattn 0.8 (its "
                           "split-K combine does not add them yet); prefill plans take them");
    if (d->seq_q && d->batch > UINT32_MAX / d->seq_q)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "batch x seq_q = %zu x %zu rows: a decode step's rows are "
                           "32-bit in its kernels (at most %u)", d->batch, d->seq_q, (unsigned)UINT32_MAX);
    if (d->algorithm == CLATTN_ALGORITHM_UNFUSED)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "a decode plan runs its own fused kernel: algorithm "
                           "UNFUSED is not available (use AUTO)");
    return CLATTN_STATUS_SUCCESS;
}

/* A decode plan is one a registered decode core can compute, on every device (ref answers the plans the
 * OpenCL devices answer). */
static clattn_status check_cores(const clattn_device *dev, const clattn_attention_desc *d)
{
    char reasons[600] = "";
    for (size_t i = 0; i < clattn_core_total(); i++) {
        const clattn_core *c = clattn_core_at(i);
        char why[300] = "";
        if (c->kind != CLATTN_CORE_DECODE) continue;
        if (c->supports(c, &dev->caps, d, why, sizeof why) == CLATTN_STATUS_SUCCESS) return CLATTN_STATUS_SUCCESS;
        snprintf(reasons + strlen(reasons), sizeof reasons - strlen(reasons), "%s%s", reasons[0] ? "; " : "", why);
    }
    return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "no decode core takes this plan: %s", reasons);
}

void clattn_decode_plan_free(clattn_decode_plan *plan)
{
    if (!plan) return;
    if (plan->ops && plan->ops->release) plan->ops->release(plan);
    clattn_plan_free(plan->base);
    pthread_mutex_destroy(&plan->lock);
    free(plan);
}

clattn_status clattn_decode_plan_create(clattn_device *device, const clattn_attention_desc *desc,
                                        const clattn_attention_weights *weights, clattn_decode_plan **plan)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    *plan = NULL;
    if (!desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc is NULL");
    TRY(validate_decode(desc));
    clattn_plan *base = NULL;
    TRY(clattn_plan_prepare(device, desc, weights, 0, &base));
    clattn_status st = check_cores(device, &base->d);
    clattn_decode_plan *dp = NULL;
    if (st == CLATTN_STATUS_SUCCESS && !(dp = clattn_calloc(1, sizeof *dp)))
        st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the decode plan");
    if (st != CLATTN_STATUS_SUCCESS) {
        clattn_plan_free(base);
        return st;
    }
    if (pthread_mutex_init(&dp->lock, NULL) != 0) {
        free(dp);
        clattn_plan_free(base);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "creating the decode plan's lock");
    }
    dp->base = base;
    dp->last_parts = 1;
    dp->ops = backends[device->backend];
    if (dp->ops->init && (st = dp->ops->init(dp)) != CLATTN_STATUS_SUCCESS) {
        clattn_decode_plan_free(dp);
        return st;
    }
    const char *ran[2] = {clattn_decode_plan_core(dp), clattn_decode_plan_gemm(dp)};
    clattn_core_env_note(device, ran, 2);
    *plan = dp;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_decode_plan_set_splits(clattn_decode_plan *plan, size_t max_parts)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (max_parts > CLATTN_DECODE_MAX_PARTS)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "max_parts %zu: at most %d", max_parts,
                           CLATTN_DECODE_MAX_PARTS);
    pthread_mutex_lock(&plan->lock);
    plan->max_parts = max_parts;
    pthread_mutex_unlock(&plan->lock);
    return CLATTN_STATUS_SUCCESS;
}

const char *clattn_decode_stage_name(clattn_decode_stage stage)
{
    static const char *names[CLATTN_DECODE_STAGE_COUNT] = {"projection", "append", "attend", "combine",
                                                           "out_projection"};
    return (unsigned)stage < CLATTN_DECODE_STAGE_COUNT ? names[stage] : "unknown";
}

clattn_status clattn_decode_plan_set_profiling(clattn_decode_plan *plan, int enable)
{
    clattn_clear_error();
    if (!plan) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
    if (enable && !plan->ops->stage_times)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "decode stage times need an OpenCL device (this plan is on %s)",
                           plan->base->device->name);
    if (enable) TRY(clattn_profiling_check(plan->base->device));
    pthread_mutex_lock(&plan->lock);
    plan->profiling = enable != 0;
    pthread_mutex_unlock(&plan->lock);
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_decode_plan_stage_times(clattn_decode_plan *plan, double ms[CLATTN_DECODE_STAGE_COUNT])
{
    clattn_clear_error();
    if (!plan || !ms) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan or ms is NULL");
    if (!plan->ops->stage_times)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "decode stage times need an OpenCL device (this plan is on %s)",
                           plan->base->device->name);
    pthread_mutex_lock(&plan->lock);
    const clattn_status st = plan->ops->stage_times(plan, ms);
    pthread_mutex_unlock(&plan->lock);
    return st;
}

size_t clattn_decode_plan_last_splits(const clattn_decode_plan *plan) { return plan ? plan->last_parts : 0; }

const char *clattn_decode_plan_core(const clattn_decode_plan *plan) { return plan ? plan->ops->core(plan) : ""; }

const char *clattn_decode_plan_gemm(const clattn_decode_plan *plan) { return plan ? clattn_plan_gemm(plan->base) : ""; }

/* A step's shape from its arguments (owner "args" or "buffers" in messages), checked against the plan: n new tokens
 * per sequence at most (new_tokens), each sequence's count (valid, NULL: all n) and first row, b*n; or with packed
 * offsets cu (B+1 of them: args.cu_new) each sequence's count and first row from them, and n = new_tokens or, given
 * as 0, the longest count. s->valid and s->row0 point into room (2B entries). */
static clattn_status step_shape(const clattn_plan *p, size_t n, const size_t *valid, const uint32_t *cu,
                                size_t cu_count, const char *owner, size_t *room, clattn_decode_step *s)
{
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch;
    size_t *v = room, *r0 = room + B;
    if (cu) {
        if (valid)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.valid is given with %s.cu_new: the offsets give "
                               "each sequence's count of new tokens, so valid would be ignored", owner, owner);
        if (n > d->seq_q)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "new_tokens = %zu: at most seq_q (%zu), or 0 for the "
                               "longest of cu_new's sequences", n, d->seq_q);
        TRY(clattn_offsets_check(owner, "cu_new", cu, cu_count, B, n ? n : d->seq_q, n ? "new_tokens" : "seq_q",
                                 n ? "the most this step brings" : "the most new tokens a step may bring"));
        size_t most = 0;
        for (size_t b = 0; b < B; b++) {
            v[b] = cu[b + 1] - cu[b], r0[b] = cu[b];
            if (v[b] > most) most = v[b];
        }
        *s = (clattn_decode_step){.n = n ? n : most ? most : 1, .rows = cu[B], .packed = 1};
    } else {
        TRY(clattn_count_check(owner, "cu_new", cu, cu_count, B + 1, "batch + 1"));
        if (n == 0 || n > d->seq_q)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "new_tokens = %zu: must be 1 .. seq_q (%zu)", n,
                               d->seq_q);
        for (size_t b = 0; b < B; b++) {
            v[b] = valid ? valid[b] : n, r0[b] = b * n;
            if (v[b] > n)
                return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "valid[%zu] = %zu is more than new_tokens (%zu)", b,
                                   valid[b], n);
        }
        *s = (clattn_decode_step){.n = n, .rows = B * n};
    }
    s->valid = v, s->row0 = r0;
    return CLATTN_STATUS_SUCCESS;
}

/* The cache against the plan, and a step of that shape against the cache: the longest sequence after it into
 * s->max_len. */
static clattn_status check_step(const clattn_decode_plan *plan, const clattn_kv_cache *cache, clattn_decode_step *s)
{
    const clattn_plan *p = plan->base;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch;
    if (cache->device != p->device)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "the cache and the plan are on different devices");
    const clattn_kv_cache_desc *cd = &cache->d;
    if (cd->batch != B || cd->kv_heads != d->kv_heads || cd->head_dim_qk != d->head_dim_qk ||
        cd->head_dim_v != d->head_dim_v)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "the cache (batch %zu, kv_heads %zu, dk %zu, dv %zu) does not "
                           "match the plan (batch %zu, kv_heads %zu, dk %zu, dv %zu)", cd->batch, cd->kv_heads,
                           cd->head_dim_qk, cd->head_dim_v, B, d->kv_heads, d->head_dim_qk, d->head_dim_v);
    if ((int)cd->type != d->kv_half)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "the cache stores %s but the plan has kv_half = %d",
                           cd->type == CLATTN_KV_HALF ? "half" : cd->type == CLATTN_KV_BF16 ? "bfloat16" :
                           cd->type == CLATTN_KV_INT8 ? "int8" : "float", d->kv_half);
    if (cd->page_size != d->kv_page_size)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "the cache has %s%zu%s but the plan was made for %s "
                           "(desc.kv_page_size = %zu)", cd->page_size ? "pages of " : "", cd->page_size,
                           cd->page_size ? " positions" : " pages (contiguous)",
                           d->kv_page_size ? "paged caches" : "contiguous caches", d->kv_page_size);
    s->max_len = 0;
    for (size_t b = 0; b < B; b++) {
        if (cache->len[b] + s->valid[b] > cd->capacity)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "sequence %zu: %zu cached + %zu new tokens exceed the "
                               "cache's capacity (%zu)", b, cache->len[b], s->valid[b], cd->capacity);
        if (cache->len[b] + s->n > s->max_len) s->max_len = cache->len[b] + s->n;
    }
    if (s->pos)
        s->rope_most = clattn_positions_most(s->pos, s->rows, NULL, 0), s->rope_limit = CLATTN_ROPE_MAX_POSITION + 1;
    else
        s->rope_most = s->max_len, s->rope_limit = cd->capacity;
    return CLATTN_STATUS_SUCCESS;
}

/* A step's rope_positions (owner's: "args" or "buffers"): given only with rope, one per row of x, each at most
 * CLATTN_ROPE_MAX_POSITION; into s->pos. */
static clattn_status step_positions(const clattn_plan *p, const uint32_t *pos, size_t count, const char *owner,
                                    const char *lead, clattn_decode_step *s)
{
    if (pos && p->d.rope.kind == CLATTN_ROPE_NONE)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.rope_positions is given, but the plan has no rotary "
                           "embeddings (desc.rope.kind = CLATTN_ROPE_NONE): it would be ignored", owner);
    char how[96];
    snprintf(how, sizeof how, "%s rows, one per new token", lead);
    TRY(clattn_count_check(owner, "rope_positions", pos, count, s->rows, how));
    TRY(clattn_positions_max_check(pos, s->rows, owner, "rope_positions", "a token"));
    s->pos = pos;
    return CLATTN_STATUS_SUCCESS;
}

/* kv and value: given exactly when the plan has separate_value (else they would be ignored). */
static clattn_status check_separate(const clattn_plan *p, int kv, int value, const char *owner)
{
    if (p->d.separate_value && (!kv || !value))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.%s is NULL (the plan has desc.separate_value: the new "
                           "tokens' keys and values come as kv and value)", owner, !kv ? "kv" : "value");
    if (!p->d.separate_value && (kv || value))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s.%s is given, but the plan was created without "
                           "desc.separate_value = 1: it would be ignored", owner, kv ? "kv" : "value");
    return CLATTN_STATUS_SUCCESS;
}

/* A step's output against its inputs, host form (a) or buffer form (b and the host array valid): one list for both
 * forms. rows: x's and out's rows (B*n, or a packed step's). */
static clattn_status step_no_overlap(const clattn_plan *p, size_t rows, const clattn_decode_args *a,
                                     const clattn_decode_buffers *b, const size_t *valid)
{
    const size_t B = p->d.batch, es = clattn_dtype_size(p->d.dtype);
    const char *o = a ? "args" : "buffers";
    const size_t sv = p->d.separate_value, HK = p->d.kv_heads;
    const clattn_mem_range ins[] = {CLATTN_RANGE(o, a, b, x, rows * p->d.embed, es),
                                    clattn_range(a ? "args" : "", "valid", a ? a->valid : valid, NULL,
                                                 a ? a->valid_count : valid ? B : 0, sizeof(size_t)),
                                    CLATTN_RANGE(o, a, b, kv, sv * rows * HK * p->d.head_dim_qk, es),
                                    CLATTN_RANGE(o, a, b, value, sv * rows * HK * p->d.head_dim_v, es),
                                    clattn_range(a ? "args" : "", "cu_new", a ? a->cu_new : NULL, NULL,
                                                 a ? a->cu_new_count : 0, sizeof(uint32_t)),
                                    clattn_range(a ? "args" : "", "rope_positions", a ? a->rope_positions : NULL, NULL,
                                                 a ? a->rope_positions_count : 0, sizeof(uint32_t))};
    const clattn_mem_range outs[] = {CLATTN_RANGE(o, a, b, out, rows * p->out_width, es)};
    return clattn_check_no_overlap(outs, 1, ins, 6);
}

/* A verify step's draft tree (args.tree_mask, (B, n, n)): each new token sees itself (a nonzero diagonal) and only
 * tokens before it (zeros above the diagonal); not with a window, which counts cache positions that a draft tree's
 * branches do not have; with rope only when the step gives its tokens' positions (positioned). A packed step's rows
 * past a sequence's count are no token's: not read, not checked (count: its counts, NULL for a padded step, whose
 * every row is computed). */
static clattn_status check_tree(const clattn_attention_desc *d, const uint8_t *tree, size_t n, const size_t *count,
                                int positioned)
{
    if (!tree) return CLATTN_STATUS_SUCCESS;
    if (d->rope.kind != CLATTN_ROPE_NONE && !positioned)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "args.tree_mask with rope and no args.rope_positions: a draft "
                           "tree's tokens sit at their depths in the tree, not at their slots length + t where a step "
                           "rotates them by default; give each draft token its position (the length + its depth) in "
                           "args.rope_positions (a chain of drafts needs no tree_mask)");
    if (d->window)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "args.tree_mask with a window (desc.window = %zu): the window "
                           "counts cache positions, and a draft tree's branches are not consecutive positions",
                           d->window);
    for (size_t b = 0; b < d->batch; b++)
        for (size_t i = 0; i < (count ? count[b] : n); i++)
            for (size_t j = i; j < n; j++) {
                const uint8_t m = tree[(b * n + i) * n + j];
                if (j == i && !m)
                    return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.tree_mask[%zu][%zu][%zu] is 0: a draft "
                                       "token sees itself (the diagonal must be nonzero)", b, i, j);
                if (j > i && m)
                    return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.tree_mask[%zu][%zu][%zu] is nonzero: a "
                                       "draft token sees only tokens before it (its ancestors), so the entries above "
                                       "the diagonal must be 0", b, i, j);
            }
    return CLATTN_STATUS_SUCCESS;
}

/* A checked step's pages: each sequence's new positions len .. len + valid - 1 given pages of its own (a paged cache;
 * refused with nothing changed when the pool has too few), the tables written to the device before the step. */
static clattn_status reserve_step(clattn_kv_cache *cache, const size_t *valid)
{
    const size_t B = cache->d.batch;
    if (!cache->d.page_size) return CLATTN_STATUS_SUCCESS;
    size_t *to = clattn_malloc(B * sizeof *to);
    if (!to) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the step's ranges");
    for (size_t b = 0; b < B; b++) to[b] = cache->len[b] + valid[b];
    clattn_status st = clattn_kv_cache_reserve(cache, cache->len, to);
    free(to);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_kv_cache_sync_table(cache);
    return st;
}

/* A half-precision plan's step from host arrays (desc.dtype F16 or BF16): a step's few rows widened to float on the
 * host (exactly), the fp32 step, its output rounded to the type once. */
static clattn_status execute_typed(clattn_decode_plan *plan, clattn_kv_cache *cache, const clattn_decode_args *args,
                                   const clattn_decode_step *step)
{
    const clattn_plan *p = plan->base;
    const clattn_attention_desc *d = &p->d;
    const size_t rows = step->rows, sv = d->separate_value, HK = d->kv_heads;
    const size_t nx = rows * d->embed, nk = sv * rows * HK * d->head_dim_qk, nv = sv * rows * HK * d->head_dim_v;
    const size_t no = rows * p->out_width;
    float *buf = clattn_malloc((nx + nk + nv + no) * sizeof *buf);
    if (!buf) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "widening the step's %s arrays",
                                 clattn_dtype_name(d->dtype));
    float *x = buf, *kv = x + nx, *value = kv + nk, *out = value + nv;
    clattn_dtype_widen(args->x, nx, d->dtype, x);
    if (sv) clattn_dtype_widen(args->kv, nk, d->dtype, kv), clattn_dtype_widen(args->value, nv, d->dtype, value);
    const clattn_status st = plan->ops->execute(plan, cache, x, sv ? kv : NULL, sv ? value : NULL, step, out);
    if (st == CLATTN_STATUS_SUCCESS) clattn_dtype_narrow(out, no, d->dtype, args->out);
    free(buf);
    return st;
}

static clattn_status no_pass(void *ctx)
{
    (void)ctx;
    return CLATTN_STATUS_SUCCESS;
}

/* The step checked and run, its pages reserved (and given back when it fails); the lengths advance when it succeeds.
 * A packed step without a token changes nothing. */
static clattn_status run_step(clattn_decode_plan *plan, clattn_kv_cache *cache, clattn_decode_step *step,
                              const clattn_decode_args *args, const clattn_decode_buffers *buffers, cl_uint nwait,
                              const cl_event *wait, cl_event *event)
{
    const size_t B = plan->base->d.batch;
    TRY(check_step(plan, cache, step));
    if (!step->rows) /* (on buffers: the event still completes after the wait list) */
        return buffers ? clattn_exec_buffers(plan->base->device, nwait, wait, no_pass, NULL, event)
                       : CLATTN_STATUS_SUCCESS;
    clattn_status st = reserve_step(cache, step->valid);
    if (st == CLATTN_STATUS_SUCCESS && buffers)
        st = plan->ops->execute_buffers(plan, cache, buffers, step, nwait, wait, event);
    else if (st == CLATTN_STATUS_SUCCESS && plan->base->d.dtype != CLATTN_DTYPE_F32)
        st = execute_typed(plan, cache, args, step);
    else if (st == CLATTN_STATUS_SUCCESS)
        st = plan->ops->execute(plan, cache, args->x, args->kv, args->value, step, args->out);
    if (st == CLATTN_STATUS_SUCCESS)
        for (size_t b = 0; b < B; b++) cache->len[b] += step->valid[b];
    else
        clattn_kv_cache_unreserve(cache); /* pages a refused step took, back to the pool */
    return st;
}

/* A step from host arrays with the plan's and the cache's locks held; room: 2B entries for the step's shape. */
static clattn_status execute_locked(clattn_decode_plan *plan, clattn_kv_cache *cache, const clattn_decode_args *args,
                                    size_t *room)
{
    clattn_plan *p = plan->base;
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch;
    TRY(clattn_count_check("args", "valid", args->valid, args->valid_count, B, "batch"));
    clattn_decode_step step;
    TRY(step_shape(p, args->new_tokens, args->valid, args->cu_new, args->cu_new_count, "args", room, &step));
    const size_t n = step.n, rows = step.rows;
    if (rows && !args->x) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.x is NULL");
    if (rows && !args->out) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "args.out is NULL");
    const int sv_empty = !rows && d->separate_value; /* a packed step without a token may leave kv and value NULL */
    TRY(check_separate(p, args->kv || sv_empty, args->value || sv_empty, "args"));
    char how[160], lead[64];
    if (step.packed) snprintf(lead, sizeof lead, "cu_new[batch] = %zu", rows);
    else snprintf(lead, sizeof lead, "batch x new_tokens = %zu x %zu", B, n);
    snprintf(how, sizeof how, "%s rows x embed %zu", lead, d->embed);
    TRY(clattn_count_check("args", "x", args->x, args->x_count, rows * d->embed, how));
    snprintf(how, sizeof how, "%s rows x out_width %zu", lead, p->out_width);
    TRY(clattn_count_check("args", "out", args->out, args->out_count, rows * p->out_width, how));
    const size_t sv = d->separate_value, HK = d->kv_heads;
    snprintf(how, sizeof how, "%s rows x kv_heads*head_dim_qk %zu*%zu", lead, HK, d->head_dim_qk);
    TRY(clattn_count_check("args", "kv", args->kv, args->kv_count, sv * rows * HK * d->head_dim_qk, how));
    snprintf(how, sizeof how, "%s rows x kv_heads*head_dim_v %zu*%zu", lead, HK, d->head_dim_v);
    TRY(clattn_count_check("args", "value", args->value, args->value_count, sv * rows * HK * d->head_dim_v, how));
    snprintf(how, sizeof how, "batch x new_tokens x new_tokens = %zu x %zu x %zu", B, n, n);
    TRY(clattn_count_check("args", "tree_mask", args->tree_mask, args->tree_mask_count, B * n * n, how));
    TRY(step_positions(p, args->rope_positions, args->rope_positions_count, "args", lead, &step));
    TRY(check_tree(d, args->tree_mask, n, step.packed ? step.valid : NULL, step.pos != NULL));
    TRY(step_no_overlap(p, rows, args, NULL, NULL));
    step.tree = args->tree_mask;
    return run_step(plan, cache, &step, args, NULL, 0, NULL, NULL);
}

/* A step on buffers (valid or cu: host arrays), checked before anything is enqueued. */
static clattn_status execute_buffers(clattn_decode_plan *plan, clattn_kv_cache *cache,
                                     const clattn_decode_buffers *buffers, size_t new_tokens, const size_t *valid,
                                     const uint32_t *cu, size_t cu_count, cl_uint nwait, const cl_event *wait,
                                     cl_event *event)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    TRY(clattn_buffers_call_check(plan, buffers, plan && plan->ops->execute_buffers,
                                  plan ? plan->base->device : NULL, nwait, wait));
    const clattn_plan *p = plan->base;
    const size_t B = p->d.batch;
    size_t *room = clattn_malloc(2 * B * sizeof *room);
    if (!room) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the token counts");
    clattn_decode_step step = {0};
    clattn_status st = step_shape(p, new_tokens, valid, cu, cu_count, "buffers", room, &step);
    const size_t rows = step.rows, es = clattn_dtype_size(p->d.dtype), HK = p->d.kv_heads;
    /* (a packed step without a token: its buffers may be NULL) */
    if (!st && rows) st = clattn_buffer_check(buffers->x.mem, buffers->x.offset, rows * p->d.embed, es, "x");
    if (!st && rows) st = clattn_buffer_check(buffers->out.mem, buffers->out.offset, rows * p->out_width, es, "out");
    const int sv_empty = !rows && p->d.separate_value;
    if (!st) st = check_separate(p, buffers->kv.mem || sv_empty, buffers->value.mem || sv_empty, "buffers");
    if (!st && rows && p->d.separate_value)
        st = clattn_buffer_check(buffers->kv.mem, buffers->kv.offset, rows * HK * p->d.head_dim_qk, es, "kv");
    if (!st && rows && p->d.separate_value)
        st = clattn_buffer_check(buffers->value.mem, buffers->value.offset, rows * HK * p->d.head_dim_v, es, "value");
    char lead[64];
    if (step.packed) snprintf(lead, sizeof lead, "cu_new[batch] = %zu", rows);
    else snprintf(lead, sizeof lead, "batch x new_tokens = %zu x %zu", B, step.n);
    if (!st)
        st = step_positions(p, buffers->rope_positions, buffers->rope_positions_count, "buffers", lead, &step);
    if (!st) st = step_no_overlap(p, rows, NULL, buffers, valid);
    if (!st) {
        pthread_mutex_lock(&plan->lock);
        pthread_mutex_lock(&cache->lock);
        st = run_step(plan, cache, &step, NULL, buffers, nwait, wait, event);
        pthread_mutex_unlock(&cache->lock);
        pthread_mutex_unlock(&plan->lock);
    }
    free(room);
    return st;
}

clattn_status clattn_decode_execute_buffers(clattn_decode_plan *plan, clattn_kv_cache *cache,
                                            const clattn_decode_buffers *buffers, size_t new_tokens,
                                            const size_t *valid, cl_uint num_events_in_wait_list,
                                            const cl_event *event_wait_list, cl_event *event)
{
    return execute_buffers(plan, cache, buffers, new_tokens, valid, NULL, 0, num_events_in_wait_list,
                           event_wait_list, event);
}

clattn_status clattn_decode_execute_buffers_varlen(clattn_decode_plan *plan, clattn_kv_cache *cache,
                                                   const clattn_decode_buffers *buffers, size_t new_tokens,
                                                   const uint32_t *cu_new, size_t cu_new_count,
                                                   cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                   cl_event *event)
{
    if (!cu_new) {
        clattn_clear_error();
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cu_new is NULL (clattn_decode_execute_buffers takes a "
                           "step without offsets)");
    }
    return execute_buffers(plan, cache, buffers, new_tokens, NULL, cu_new, cu_new_count, num_events_in_wait_list,
                           event_wait_list, event);
}

clattn_status clattn_decode_execute(clattn_decode_plan *plan, clattn_kv_cache *cache, const clattn_decode_args *args)
{
    clattn_clear_error();
    if (!plan || !cache || !args) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "plan, cache or args is NULL");
    size_t *room = clattn_malloc(2 * plan->base->d.batch * sizeof *room);
    if (!room) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the token counts");
    /* the plan, then the cache: every step takes them in this order, so two steps cannot wait on each other */
    pthread_mutex_lock(&plan->lock);
    pthread_mutex_lock(&cache->lock);
    const clattn_status st = execute_locked(plan, cache, args, room);
    pthread_mutex_unlock(&cache->lock);
    pthread_mutex_unlock(&plan->lock);
    free(room);
    return st;
}
