/* search.c: clattn_tune (clattn.h, "tuning"): measures, on one device, what the tuning file
 * (device/tune_file.c) then holds for it:
 *   1. per shape (its head-size class), each prefill core that can take it, in the device's order of
 *      preference: its defaults, then every combination of its parameters' `tried` values that fits,
 *      the best kept when it beats the defaults by the margin in three alternating comparisons;
 *   2. then the core AUTO should give that class: the fastest of them, kept only when it beats AUTO's
 *      default choice the same way;
 *   3. the decode cores the same way, on a decode step derived from the first shape: B sequences of T cached
 *      tokens, E, H heads sharing H/4 KV heads (H where 4 does not divide H), one new token per sequence;
 *   4. the backward cores the same way, on a training plan of the first shape: its backward (every gradient, from
 *      the forward's saved statistics) timed, its grad_x checked (the backward's tolerance, 1e-4 + 1e-3 |ref|);
 *   5. the GEMM cores the same way, on the first shape's attention call (its projections);
 *   6. where CLBlast runs the device's GEMMs (or options->clblast asks): CLBlast's own parameters, a random
 *      search of the spaces its tuners search (runtime/blas_params.c), Xgemm on the first shape's attention call
 *      and XgemmDirect on its unfused call (whose batched score and context GEMMs are the small ones).
 * Each candidate is a plan made with a candidate table (dev->tune_try) that names its core and parameters;
 * its output is checked against the defaults' before it is timed, and one that differs is rejected. */
#include "attention/attention.h"
#include "decode/decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct search {
    clattn_device *dev;
    const clattn_tune_options *o;
    double t0, budget_ms, margin;
    double deadline;     /* the current phase's end (ms, now_ms clock) */
    float *x, *wq, *wk, *wv, *wo, *bq, *bo, *ref, *out;
    clattn_attention_desc d;
    int cls;             /* the shape's head-size class */
    clattn_core_kind kind; /* the cores searched: PREFILL or GEMM (an attention plan on d), DECODE (a step) or
                              BACKWARD (a training plan's backward) */
    /* DECODE: a step of d (seq_q = 1) over a cache of s->context tokens per sequence, from the same x rows */
    size_t context;
    float *kc, *vc;      /* the cache's contents (B, HK, context + 1, dk) */
    /* BACKWARD: d.training = 1; the output's gradient (B, T, E) and the forward's lse (B, H, T) and context
     * (B, T, E), which the backward then reads; ref and out hold grad_x */
    float *gout, *lse, *ctx;
    char ran_params[160]; /* the parameters the last candidate's plan ran, as text (clattn_core_params_format) */
} search;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void say(const search *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const search *s, const char *fmt, ...)
{
    if (!s->o->progress) return;
    char line[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->o->progress(line, s->o->user);
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A candidate: AUTO's core for the class (NULL: AUTO's own choice) and its parameters (NULL: defaults). The
 * tables of the attention cores keep what was kept so far (s->kept) when GEMM cores are searched. */
typedef struct candidate {
    const clattn_core *core;
    const clattn_core_params *params;
} candidate;

static void candidate_table(const search *s, const candidate *c, clattn_tune_table *t)
{
    clattn_tune_table_init(t);
    if (c->core) t->auto_core[s->kind][s->cls] = c->core;
    if (c->core && c->params) clattn_tune_set_params(t, c->core, s->cls, c->params);
}

/* The search's weights (E x E projections, as the description's heads * head size = E), with their counts. */
static clattn_attention_weights search_weights(const search *s)
{
    const size_t E = s->d.embed, EE = E * E;
    const size_t EK = s->d.kv_heads && s->d.kv_heads != s->d.heads ? s->d.kv_heads * (E / s->d.heads) * E : EE;
    return (clattn_attention_weights){.w_query = s->wq, .w_key = s->wk, .w_value = s->wv, .b_query = s->bq,
                                      .w_out = s->wo, .b_out = s->bo, .w_query_count = EE, .w_key_count = EK,
                                      .w_value_count = EK, .b_query_count = E, .w_out_count = EE, .b_out_count = E};
}

/* The median of at least 3 and 0.3 s of step(ctx) in ms (-1: a step failed). */
static double time_steps(clattn_status (*step)(void *ctx), void *ctx)
{
    double t[64];
    int k = 0;
    const double start = now_ms();
    while (k < 64 && (k < 3 || now_ms() - start < 300.0)) {
        const double t1 = now_ms();
        if (step(ctx) != CLATTN_STATUS_SUCCESS) return -1;
        t[k++] = now_ms() - t1;
    }
    qsort(t, (size_t)k, sizeof t[0], cmp_d);
    return t[k / 2];
}

/* Does out differ from s->ref beyond the fp32 tolerance (gradients: the backward's, 1e-4 + 1e-3 |ref|, as the
 * tests': their sums run in another order from one candidate to the next)? */
static int differs(const search *s, const float *out, size_t n)
{
    const double abs_tol = s->kind == CLATTN_CORE_BACKWARD ? 1e-4 : 1e-5;
    const double rel_tol = s->kind == CLATTN_CORE_BACKWARD ? 1e-3 : 1e-4;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)out[i] - (double)s->ref[i]) <= abs_tol + rel_tol * fabs((double)s->ref[i]))) return 1;
    return 0;
}

/* Did the plan run candidate c (its core and parameters, where c names them)? */
static int ran(const candidate *c, const clattn_core *core, const clattn_core_params *params)
{
    return (!c->core || core == c->core) && (!c->params || memcmp(params, c->params, sizeof *c->params) == 0);
}

/* An attention plan of the shape made with candidate c's table. */
static clattn_status plan_with(search *s, const candidate *c, clattn_plan **p)
{
    clattn_tune_table try;
    candidate_table(s, c, &try);
    s->dev->tune_try = &try;
    const clattn_attention_weights w = search_weights(s);
    const clattn_status st = clattn_plan_create(s->dev, &s->d, &w, p);
    s->dev->tune_try = NULL;
    return st;
}

typedef struct decode_run {
    clattn_decode_plan *plan;
    clattn_kv_cache *cache;
    const size_t *lens;
    clattn_decode_args a;
} decode_run;

/* One decode step after the cache is truncated back to its context (host only). */
static clattn_status decode_step(void *ctx)
{
    decode_run *r = ctx;
    TRY(clattn_kv_cache_truncate(r->cache, r->lens));
    return clattn_decode_execute(r->plan, r->cache, &r->a);
}

/* run_candidate for the decode cores: a decode plan and a cache filled from s->kc, s->vc. */
static double run_decode_candidate(search *s, const candidate *c, int check, float *out)
{
    clattn_tune_table try;
    candidate_table(s, c, &try);
    s->dev->tune_try = &try;
    const clattn_attention_weights w = search_weights(s);
    clattn_decode_plan *p = NULL;
    clattn_status st = clattn_decode_plan_create(s->dev, &s->d, &w, &p);
    s->dev->tune_try = NULL;
    if (st != CLATTN_STATUS_SUCCESS) return -1;
    snprintf(s->ran_params, sizeof s->ran_params, "%s", p->base->core_params_text);
    if (!ran(c, p->base->core, &p->base->core_params)) {
        clattn_decode_plan_free(p);
        return -3;
    }
    const size_t B = s->d.batch, dk = s->d.head_dim_qk;
    clattn_kv_cache_desc cd = {.batch = B, .capacity = s->context + 1, .kv_heads = s->d.kv_heads, .head_dim_qk = dk,
                               .head_dim_v = dk};
    clattn_kv_cache *cache = NULL;
    size_t *lens = malloc(B * sizeof *lens);
    double ms = -1;
    if (lens && clattn_kv_cache_create(s->dev, &cd, &cache) == CLATTN_STATUS_SUCCESS) {
        for (size_t b = 0; b < B; b++) lens[b] = s->context;
        decode_run r = {.plan = p, .cache = cache, .lens = lens,
                        .a = {.x = s->x, .new_tokens = 1, .out = out, .x_count = B * s->d.embed,
                              .out_count = B * s->d.out_dim}};
        if (clattn_kv_cache_write(cache, s->kc, s->vc, lens) == CLATTN_STATUS_SUCCESS &&
            decode_step(&r) == CLATTN_STATUS_SUCCESS)
            ms = check && differs(s, out, B * s->d.out_dim) ? -2 : time_steps(decode_step, &r);
    }
    free(lens);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(p);
    return ms;
}

typedef struct backward_run {
    clattn_plan *plan;
    clattn_attention_args a;
    clattn_attention_grads g;
} backward_run;

static clattn_status backward_step(void *ctx)
{
    backward_run *r = ctx;
    return clattn_plan_backward(r->plan, &r->a, &r->g);
}

/* run_candidate for the backward cores: a training plan's forward (the statistics), then its backward timed. */
static double run_backward_candidate(search *s, const candidate *c, int check, float *out)
{
    clattn_plan *p = NULL;
    if (plan_with(s, c, &p) != CLATTN_STATUS_SUCCESS) return -1;
    snprintf(s->ran_params, sizeof s->ran_params, "%s", p->backward_core_params_text);
    if (!ran(c, p->backward_core, &p->backward_core_params)) {
        clattn_plan_free(p);
        return -3;
    }
    const size_t B = s->d.batch, T = s->d.seq_q, E = s->d.embed, H = s->d.heads, n = B * T * E;
    backward_run r = {.plan = p,
                      .a = {.x = s->x, .x_count = n},
                      .g = {.grad_out = s->gout, .lse = s->lse, .context = s->ctx, .grad_x = out,
                            .grad_out_count = n, .lse_count = B * H * T, .context_count = n, .grad_x_count = n}};
    clattn_attention_args fw = {.x = s->x, .out = s->out, .lse = s->lse, .context = s->ctx, .x_count = n,
                                .out_count = n, .lse_count = B * H * T, .context_count = n};
    double ms = -1;
    if (clattn_plan_execute(p, &fw) == CLATTN_STATUS_SUCCESS && backward_step(&r) == CLATTN_STATUS_SUCCESS)
        ms = check && differs(s, out, n) ? -2 : time_steps(backward_step, &r);
    clattn_plan_free(p);
    return ms;
}

typedef struct plan_run {
    clattn_plan *plan;
    clattn_attention_args a;
    clattn_attention_buffers b; /* b.x.mem set: the device-resident call is timed */
    cl_command_queue q;
} plan_run;

static clattn_status plan_step(void *ctx)
{
    plan_run *r = ctx;
    if (!r->b.x.mem) return clattn_plan_execute(r->plan, &r->a);
    TRY(clattn_plan_execute_buffers(r->plan, &r->b, 0, NULL, NULL));
    const cl_int err = clFinish(r->q);
    return err == CL_SUCCESS ? CLATTN_STATUS_SUCCESS
                             : clattn_fail((clattn_status)err, "tune: clFinish failed (%d: %s)", err,
                                           clattn_status_string(err));
}

/* The median of plan_step on device buffers holding the shape's x (the call an application keeping its arrays on
 * the device makes, as clattn-bench's median_ms): the host call's copies of x and out in and out of the device
 * are the same for every candidate and on a GPU larger than the core (NVIDIA H200, B4 T2048 E1024: 13 ms against
 * 4.8 on device buffers), so timing them buried the cores' differences in the copies' spread. Where buffers
 * cannot be made (the ref device), the host call. */
static double time_plan(const search *s, clattn_plan *p, const clattn_attention_args *a)
{
    plan_run r = {.plan = p, .a = *a};
    const cl_context ctx = clattn_device_context(s->dev);
    cl_mem x = NULL, out = NULL;
    if (ctx) {
        cl_int e1 = CL_SUCCESS, e2 = CL_SUCCESS;
        x = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, a->x_count * sizeof(float), s->x, &e1);
        out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, a->out_count * sizeof(float), NULL, &e2);
        if (e1 == CL_SUCCESS && e2 == CL_SUCCESS) {
            r.b.x.mem = x;
            r.b.out.mem = out;
            r.q = clattn_device_queue(s->dev);
        }
    }
    double ms = time_steps(plan_step, &r);
    if (ms < 0 && r.b.x.mem) { /* the device call failed where the host call ran: time that */
        clattn_clear_error();
        r.b.x.mem = NULL;
        ms = time_steps(plan_step, &r);
    }
    if (x) clReleaseMemObject(x);
    if (out) clReleaseMemObject(out);
    return ms;
}

/* Plan the shape with candidate c, check its output against s->ref (when check), and time it: the median
 * of at least 3 runs and 0.3 s. Returns the median in ms, -1 when the plan failed, -2 when its output
 * differed, -3 when the candidate did not apply (another core or other parameters ran). */
static double run_candidate(search *s, const candidate *c, int check, float *out)
{
    if (s->kind == CLATTN_CORE_DECODE) return run_decode_candidate(s, c, check, out);
    if (s->kind == CLATTN_CORE_BACKWARD) return run_backward_candidate(s, c, check, out);
    clattn_plan *p = NULL;
    if (plan_with(s, c, &p) != CLATTN_STATUS_SUCCESS) return -1;
    int applies;
    snprintf(s->ran_params, sizeof s->ran_params, "%s",
             s->kind == CLATTN_CORE_GEMM ? p->gemm_params_text : p->core_params_text);
    if (s->kind == CLATTN_CORE_GEMM) {
        char text[128] = "";
        if (c->core && c->params) clattn_core_params_format(c->core, c->params, text, sizeof text);
        applies = (!c->core || strcmp(p->gemm, c->core->name) == 0) &&
                  (!c->params || strcmp(p->gemm_params_text, text) == 0);
    } else {
        applies = ran(c, p->core, &p->core_params);
    }
    if (!applies) {
        clattn_plan_free(p);
        return -3;
    }
    const size_t n = s->d.batch * s->d.seq_q * s->d.out_dim;
    clattn_attention_args a = {.x = s->x, .out = out, .x_count = s->d.batch * s->d.seq_q * s->d.embed, .out_count = n};
    if (clattn_plan_execute(p, &a) != CLATTN_STATUS_SUCCESS) {
        clattn_plan_free(p);
        return -1;
    }
    const double ms = check && differs(s, out, n) ? -2 : time_plan(s, p, &a);
    clattn_plan_free(p);
    return ms;
}

/* The core a plan of the shape gets with table t (NULL: none would be made). */
static const clattn_core *probe_core(search *s, const clattn_tune_table *t)
{
    const clattn_attention_weights w = search_weights(s);
    const clattn_core *own = NULL;
    s->dev->tune_try = t;
    if (s->kind == CLATTN_CORE_DECODE) {
        clattn_decode_plan *dp = NULL;
        if (clattn_decode_plan_create(s->dev, &s->d, &w, &dp) == CLATTN_STATUS_SUCCESS) own = dp->base->core;
        clattn_decode_plan_free(dp);
    } else {
        clattn_plan *p = NULL;
        if (clattn_plan_create(s->dev, &s->d, &w, &p) == CLATTN_STATUS_SUCCESS)
            own = s->kind == CLATTN_CORE_GEMM       ? clattn_core_find(p->gemm)
                  : s->kind == CLATTN_CORE_BACKWARD ? p->backward_core
                                                    : p->core;
        clattn_plan_free(p);
    }
    s->dev->tune_try = NULL;
    clattn_clear_error();
    return own;
}

static int over_budget(const search *s) { return now_ms() > s->deadline || now_ms() - s->t0 > s->budget_ms; }

/* Keep `best` over `base` only if it wins by the margin in three alternating comparisons. */
static int confirm(search *s, const candidate *base, const candidate *best, const char *what)
{
    for (int round = 0; round < 3; round++) {
        const double d = run_candidate(s, base, 1, s->out), b = run_candidate(s, best, 1, s->out);
        say(s, "  confirm %s, round %d: default %.2f ms, candidate %.2f ms", what, round + 1, d, b);
        if (d <= 0 || b <= 0 || b > d * (1.0 - s->margin)) return 0;
    }
    return 1;
}

static const char *verdict(double ms) { return ms == -2 ? "WRONG OUTPUT, rejected " : ms < 0 ? "not applicable " : ""; }

/* Core c's parameters on the shape within the time until `end`: its defaults, then the combinations of its
 * tried values (odometer order) that fit. Keeps the best in `keep` when confirmed; returns the time of
 * what c runs with afterwards (tuned or default; <= 0: c did not run). */
static double search_core(search *s, const clattn_core *c, clattn_tune_table *keep, double end)
{
    const candidate base = {c, NULL};
    const double base_ms = run_candidate(s, &base, 1, s->out);
    say(s, "  %s, defaults: %s%.2f ms", c->name, verdict(base_ms), base_ms < 0 ? 0.0 : base_ms);
    if (base_ms <= 0) return base_ms;
    size_t idx[CLATTN_CORE_MAX_PARAMS] = {0};
    int searchable = c->nparams > 0;
    for (int i = 0; i < c->nparams; i++) searchable &= c->params[i].ntried > 0;
    if (!searchable) return base_ms;
    char dflt[sizeof s->ran_params]; /* what the defaults ran: not measured again as a candidate */
    snprintf(dflt, sizeof dflt, "%s", s->ran_params);
    clattn_core_params best_p = {{0}};
    double best_ms = base_ms;
    int tried = 0, wrong = 0, have = 0;
    s->deadline = end;
    for (int done = 0; !done && !over_budget(s);) {
        clattn_core_params p = {{0}};
        for (int i = 0; i < c->nparams; i++) p.v[i] = c->params[i].tried[idx[i]];
        char text[160];
        clattn_core_params_format(c, &p, text, sizeof text);
        char why[400];
        if (strcmp(text, dflt) != 0 && (!c->fits || c->fits(c, &s->dev->caps, &s->d, &p)) &&
            clattn_core_check_trips(c, &s->dev->caps, &s->d, &p, why, sizeof why) == CLATTN_STATUS_SUCCESS) {
            const candidate cand = {c, &p};
            const double ms = run_candidate(s, &cand, 1, s->out);
            say(s, "  %s %s: %s%.2f ms", c->name, text, verdict(ms), ms < 0 ? 0.0 : ms);
            tried++;
            wrong += ms == -2;
            if (ms > 0 && ms < best_ms) best_ms = ms, best_p = p, have = 1;
        }
        int i = 0; /* next combination */
        while (i < c->nparams && ++idx[i] == c->params[i].ntried) idx[i++] = 0;
        done = i == c->nparams;
    }
    say(s, "  %s: %d candidates, %d rejected for their output; best %.2f ms against %.2f ms", c->name, tried, wrong,
        best_ms, base_ms);
    const candidate best = {c, &best_p};
    if (have && confirm(s, &base, &best, c->name)) {
        clattn_tune_set_params(keep, c, s->cls, &best_p);
        say(s, "  kept for head-size class %d", s->cls);
        return best_ms;
    }
    say(s, "  %s keeps its defaults for head-size class %d", c->name, s->cls);
    return base_ms;
}

/* One shape's head-size class within shape_ms: each core's parameters, then AUTO's core. */
static void search_shape(search *s, clattn_tune_table *keep, double shape_ms)
{
    const clattn_attention_desc *d = &s->d;
    const double start = now_ms();
    s->deadline = start + shape_ms;
    const candidate automatic = {NULL, NULL};
    const double auto_ms = run_candidate(s, &automatic, 0, s->ref); /* the reference output */
    if (s->kind == CLATTN_CORE_DECODE)
        say(s, "decode step, B=%zu context=%zu E=%zu H=%zu KV heads %zu (head-size class %d): AUTO's defaults %.2f ms",
            d->batch, s->context, d->embed, d->heads, d->kv_heads, s->cls, auto_ms);
    else if (s->kind == CLATTN_CORE_BACKWARD)
        say(s, "backward cores, on a training plan of B=%zu T=%zu E=%zu H=%zu (head-size class %d): AUTO's defaults "
            "%.2f ms", d->batch, d->seq_q, d->embed, d->heads, s->cls, auto_ms);
    else if (s->kind == CLATTN_CORE_GEMM)
        say(s, "GEMM cores, on B=%zu T=%zu E=%zu H=%zu (head-size class %d): AUTO's defaults %.2f ms", d->batch,
            d->seq_q, d->embed, d->heads, s->cls, auto_ms);
    else
        say(s, "B=%zu T=%zu E=%zu H=%zu (head-size class %d): AUTO's defaults %.2f ms", d->batch, d->seq_q, d->embed,
            d->heads, s->cls, auto_ms);
    if (auto_ms <= 0) return;
    const clattn_core *cores[8];
    size_t n = 0;
    for (const clattn_core *c; n < 8 && (c = clattn_core_preferred(s->kind, s->dev->caps.dclass, s->cls, n));)
        cores[n++] = c;
    const clattn_core *fastest = NULL;
    double fastest_ms = 0;
    for (size_t i = 0; i < n && !over_budget(s); i++) {
        const double end = now_ms() + 0.8 * (start + shape_ms - now_ms()) / (double)(n - i);
        const double ms = search_core(s, cores[i], keep, end);
        s->deadline = start + shape_ms;
        if (ms > 0 && (!fastest || ms < fastest_ms)) fastest = cores[i], fastest_ms = ms;
    }
    keep->auto_core[s->kind][s->cls] = NULL;
    if (!fastest || over_budget(s)) return;
    /* AUTO: the fastest core, when it is not AUTO's own choice already and beats it */
    clattn_tune_table with_keep = *keep;
    with_keep.auto_core[s->kind][s->cls] = NULL;
    const clattn_core_params *kp = clattn_tune_params(keep, fastest, s->cls);
    const candidate fast = {fastest, kp};
    const clattn_core *own = probe_core(s, &with_keep);
    if (own == fastest || !own) {
        say(s, "  AUTO keeps %s for head-size class %d", own ? own->name : "its choice", s->cls);
        return;
    }
    const candidate theirs = {own, clattn_tune_params(keep, own, s->cls)};
    if (confirm(s, &theirs, &fast, "AUTO's core")) {
        keep->auto_core[s->kind][s->cls] = fastest;
        say(s, "  AUTO gives head-size class %d %s instead of %s", s->cls, fastest->name, own->name);
    } else {
        say(s, "  AUTO keeps %s for head-size class %d", own->name, s->cls);
    }
}

static void fill(float *a, size_t n, float scale, uint64_t *st)
{
    for (size_t i = 0; i < n; i++) {
        *st = *st * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = scale * ((float)(*st >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
    }
}

/* The data of shape q = (B, T, E, H): x, the weights, and the output buffers. */
static clattn_status make_shape(search *s, const size_t *q, uint64_t seed)
{
    const size_t B = q[0], T = q[1], E = q[2], H = q[3];
    s->d = (clattn_attention_desc){.batch = B, .seq_q = T, .embed = E, .heads = H, .head_dim_qk = E / H, .out_dim = E};
    s->cls = clattn_head_class(E / H, E / H);
    const float ws = 1.0f / sqrtf((float)E);
    s->x = malloc(B * T * E * sizeof(float)), s->wq = malloc(E * E * sizeof(float));
    s->wk = malloc(E * E * sizeof(float)), s->wv = malloc(E * E * sizeof(float));
    s->wo = malloc(E * E * sizeof(float)), s->bq = malloc(E * sizeof(float)), s->bo = malloc(E * sizeof(float));
    s->ref = malloc(B * T * E * sizeof(float)), s->out = malloc(B * T * E * sizeof(float));
    if (!s->x || !s->wq || !s->wk || !s->wv || !s->wo || !s->bq || !s->bo || !s->ref || !s->out)
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "tuning: the shape's arrays");
    fill(s->x, B * T * E, 1.0f, &seed), fill(s->wq, E * E, ws, &seed), fill(s->wk, E * E, ws, &seed);
    fill(s->wv, E * E, ws, &seed), fill(s->wo, E * E, ws, &seed), fill(s->bq, E, 0.1f, &seed);
    fill(s->bo, E, 0.1f, &seed);
    return CLATTN_STATUS_SUCCESS;
}

static void free_shape(search *s)
{
    free(s->x), free(s->wq), free(s->wk), free(s->wv), free(s->wo), free(s->bq), free(s->bo), free(s->ref);
    free(s->out), free(s->kc), free(s->vc), free(s->gout), free(s->lse), free(s->ctx);
    s->x = s->wq = s->wk = s->wv = s->wo = s->bq = s->bo = s->ref = s->out = s->kc = s->vc = NULL;
    s->gout = s->lse = s->ctx = NULL;
    s->kind = CLATTN_CORE_PREFILL;
}

/* The decode step of shape q = (B, T, E, H): B sequences of T cached tokens (random keys and values), H
 * heads sharing H/4 KV heads (H when 4 does not divide H), one new token each; projections of E x E where
 * the KV heads are all H (make_shape's), else E x (E/4) for K and V (the first rows of make_shape's). */
static clattn_status make_decode(search *s, const size_t *q, uint64_t seed)
{
    TRY(make_shape(s, q, seed));
    const size_t B = q[0], T = q[1], E = q[2], H = q[3], HK = H % 4 ? H : H / 4, dk = E / H;
    s->kind = CLATTN_CORE_DECODE;
    s->context = T;
    s->d.seq_q = 1, s->d.kv_heads = HK, s->d.causal = 1;
    const size_t n = B * HK * (T + 1) * dk;
    s->kc = malloc(n * sizeof(float)), s->vc = malloc(n * sizeof(float));
    if (!s->kc || !s->vc) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "tuning: the decode cache's arrays");
    fill(s->kc, n, 1.0f, &seed), fill(s->vc, n, 1.0f, &seed);
    return CLATTN_STATUS_SUCCESS;
}

/* The training plan of shape q = (B, T, E, H): make_shape's, d.training = 1, a random output gradient. */
static clattn_status make_backward(search *s, const size_t *q, uint64_t seed)
{
    TRY(make_shape(s, q, seed));
    const size_t B = q[0], T = q[1], E = q[2], H = q[3];
    s->kind = CLATTN_CORE_BACKWARD;
    s->d.training = 1;
    s->gout = malloc(B * T * E * sizeof(float)), s->lse = malloc(B * H * T * sizeof(float));
    s->ctx = malloc(B * T * E * sizeof(float));
    if (!s->gout || !s->lse || !s->ctx)
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "tuning: the backward's arrays");
    fill(s->gout, B * T * E, 1.0f, &seed);
    return CLATTN_STATUS_SUCCESS;
}

/* The GEMM core that runs CLBlast (the registry's flag; NULL: none registered). */
static const clattn_core *clblast_core(void)
{
    for (size_t i = 0; clattn_core_at(i); i++)
        if (clattn_core_at(i)->kind == CLATTN_CORE_GEMM && clattn_core_at(i)->uses_clblast) return clattn_core_at(i);
    return NULL;
}

/* CLBlast's own parameters for kernel k (runtime/blas_params.c) within phase_ms: the shape's attention call
 * (Xgemm: its projections), or its unfused call (XgemmDirect: the batched score and context GEMMs), timed with
 * CLBlast running the GEMMs, for random sets drawn from the space CLBlast's tuner searches. What CLBlast runs
 * now (the file's parameters, or CLBlast's own for the device) is measured once first: CLBlast cannot be set
 * back to its own entry for the device, so a set kept must beat it and, in every one of three alternating
 * rounds, CLBlast's generic parameters. The process is left with the kept set, or the file's, or the generic. */
static void search_blas(search *s, clattn_tune_table *keep, double phase_ms, clattn_blas_kernel k)
{
    if (!clblast_core()) return;
    const double start = now_ms();
    s->deadline = start + 0.8 * phase_ms;
    const clattn_algorithm saved = s->d.algorithm;
    if (k == CLATTN_BLAS_XGEMM_DIRECT) s->d.algorithm = CLATTN_ALGORITHM_UNFUSED;
    s->kind = CLATTN_CORE_GEMM;
    const candidate blas = {clblast_core(), NULL};
    const char *name = clattn_blas_kernel_name(k);
    const double base = run_candidate(s, &blas, 0, s->ref);
    say(s, "CLBlast %s parameters, on B=%zu T=%zu E=%zu H=%zu (%s): what CLBlast runs now %.2f ms", name, s->d.batch,
        s->d.seq_q, s->d.embed, s->d.heads, s->d.algorithm == CLATTN_ALGORITHM_UNFUSED ? "unfused" : "AUTO", base);
    size_t best[CLATTN_BLAS_MAX_PARAMS], v[CLATTN_BLAS_MAX_PARAMS], generic[CLATTN_BLAS_MAX_PARAMS];
    clattn_blas_params_generic(k, generic);
    double best_ms = base;
    int have = 0, tried = 0, wrong = 0;
    uint64_t rng = 0x5eed0000ull + (uint64_t)k;
    char text[400];
    while (base > 0 && !over_budget(s)) {
        clattn_blas_params_random(&s->dev->caps, k, &rng, v);
        clattn_blas_params_format(k, v, text, sizeof text);
        if (clattn_blas_use_params(s->dev, k, v) != CLATTN_STATUS_SUCCESS) {
            say(s, "  %s: refused by CLBlast (%s)", text, clattn_last_error());
            continue;
        }
        const double ms = run_candidate(s, &blas, 1, s->out);
        say(s, "  %s: %s%.2f ms", text, verdict(ms), ms < 0 ? 0.0 : ms);
        tried++;
        wrong += ms == -2;
        if (ms > 0 && ms < best_ms) best_ms = ms, memcpy(best, v, sizeof best), have = 1;
    }
    say(s, "  %s: %d candidates, %d rejected for their output; best %.2f ms against %.2f ms", name, tried, wrong,
        best_ms, base);
    s->deadline = start + phase_ms;
    int kept = 0;
    if (have && !over_budget(s)) {
        kept = best_ms <= base * (1.0 - s->margin);
        for (int round = 0; round < 3 && kept; round++) {
            clattn_blas_use_params(s->dev, k, generic);
            const double z = run_candidate(s, &blas, 0, s->out);
            clattn_blas_use_params(s->dev, k, best);
            const double t = run_candidate(s, &blas, 1, s->out);
            say(s, "  confirm, round %d: before the search %.2f ms (once), CLBlast's generic %.2f ms, the best %.2f ms",
                round + 1, base, z, t);
            kept = t > 0 && z > 0 && t <= base * (1.0 - s->margin) && t <= z * (1.0 - s->margin);
        }
    }
    clattn_clear_error();
    if (kept) {
        memcpy(keep->blas[k], best, sizeof best);
        keep->has_blas[k] = 1;
        clattn_blas_use_params(s->dev, k, best);
        clattn_blas_params_format(k, best, text, sizeof text);
        say(s, "  kept %s", text);
    } else {
        clattn_blas_use_params(s->dev, k, keep->has_blas[k] ? keep->blas[k] : generic);
        say(s, "  CLBlast keeps %s %s parameters", keep->has_blas[k] ? "the file's" : "its generic", name);
    }
    clattn_clear_error();
    s->d.algorithm = saved;
}

/* Would the GEMMs of the first shape's plans run on CLBlast after the search (AUTO's GEMM core)? */
static int clblast_runs_gemms(search *s, const clattn_tune_table *keep)
{
    s->kind = CLATTN_CORE_GEMM;
    const clattn_core *c = probe_core(s, keep);
    return c && c->uses_clblast;
}

clattn_status clattn_tune(clattn_device *device, const clattn_tune_options *options)
{
    clattn_clear_error();
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    if (device->backend != CLATTN_BACKEND_OPENCL || !device->tune)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "tuning needs an OpenCL device (this is %s)", device->name);
    const clattn_tune_options defaults = {0};
    const clattn_tune_options *o = options ? options : &defaults;
    if (o->budget_s < 0 || isnan(o->budget_s) || o->margin < 0 || o->margin >= 1 || isnan(o->margin))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "budget_s must be >= 0 and margin in [0, 1)");
    if (o->clblast < -1 || o->clblast > 1)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "clblast is %d: -1 (never), 0 (where CLBlast runs the "
                           "GEMMs) or 1 (always)", o->clblast);
    static const size_t preset[4] = {4, 512, 512, 8};
    const size_t *shapes = o->shapes ? o->shapes : preset;
    const size_t n_shapes = o->shapes ? o->n_shapes : 1;
    if (n_shapes == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "n_shapes is 0");
    for (size_t i = 0; i < n_shapes; i++) {
        const size_t *q = shapes + 4 * i;
        if (!q[0] || !q[1] || !q[2] || !q[3] || q[2] % q[3] || q[0] > 4096 || q[1] > 65536 || q[2] > 65536)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "shape %zu (B=%zu, T=%zu, E=%zu, H=%zu): every value "
                               ">= 1 and H dividing E", i, q[0], q[1], q[2], q[3]);
    }
    static const char *const forcing[] = {"CLATTN_CORE", "CLATTN_FLASH", "CLATTN_ATTENTION", "CLATTN_SOFTMAX"};
    for (size_t i = 0; i < sizeof forcing / sizeof forcing[0]; i++) {
        const char *v = getenv(forcing[i]);
        if (v && *v)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s=%s forces a core or its parameters over what the "
                               "search tries: unset it to tune", forcing[i], v);
    }
    search s = {.dev = device, .o = o, .t0 = now_ms(), .budget_ms = 1e3 * (o->budget_s > 0 ? o->budget_s : 120.0),
                .margin = o->margin > 0 ? o->margin : 0.03};
    clattn_tune_table keep = *device->tune; /* the file's other entries stay */
    keep.notice[0] = '\0';
    clattn_status st = CLATTN_STATUS_SUCCESS;
    /* the shapes' prefill cores share 35% of the budget; then the decode cores on the first shape (until 45%), the
     * backward cores on it (until 52%), the GEMM cores on it (until 60%, or the end when CLBlast's parameters are
     * not searched), CLBlast's parameters the rest (each of its candidates compiles CLBlast's kernels anew) */
    const double kernels_ms = 0.35 * s.budget_ms;
    for (size_t i = 0; i < n_shapes && now_ms() - s.t0 < kernels_ms && st == CLATTN_STATUS_SUCCESS; i++) {
        const double shape_ms = (kernels_ms - (now_ms() - s.t0)) / (double)(n_shapes - i);
        if ((st = make_shape(&s, shapes + 4 * i, 42 + i)) == CLATTN_STATUS_SUCCESS) search_shape(&s, &keep, shape_ms);
        free_shape(&s);
    }
    if (st == CLATTN_STATUS_SUCCESS && (st = make_decode(&s, shapes, 42)) == CLATTN_STATUS_SUCCESS)
        search_shape(&s, &keep, 0.45 * s.budget_ms - (now_ms() - s.t0));
    free_shape(&s);
    if (st == CLATTN_STATUS_SUCCESS && (st = make_backward(&s, shapes, 42)) == CLATTN_STATUS_SUCCESS)
        search_shape(&s, &keep, 0.52 * s.budget_ms - (now_ms() - s.t0));
    free_shape(&s);
    if (st == CLATTN_STATUS_SUCCESS && (st = make_shape(&s, shapes, 42)) == CLATTN_STATUS_SUCCESS) {
        /* CLBlast's own parameters where CLBlast runs the GEMMs (after the GEMM search), or when asked */
        const int likely = o->clblast > 0 || (o->clblast == 0 && clblast_runs_gemms(&s, &keep));
        s.kind = CLATTN_CORE_GEMM;
        search_shape(&s, &keep, (likely ? 0.60 : 1.0) * s.budget_ms - (now_ms() - s.t0));
        if (o->clblast > 0 || (o->clblast == 0 && clblast_runs_gemms(&s, &keep))) {
            const double rest = s.budget_ms - (now_ms() - s.t0);
            search_blas(&s, &keep, 0.6 * rest, CLATTN_BLAS_XGEMM);
            search_blas(&s, &keep, s.budget_ms - (now_ms() - s.t0), CLATTN_BLAS_XGEMM_DIRECT);
        } else {
            say(&s, "CLBlast's parameters: not searched (%s)", o->clblast < 0 ? "asked not to" : "another GEMM core "
                "runs the GEMMs here; options->clblast = 1 (clattn tune --clblast always) searches them");
        }
    }
    free_shape(&s);
    if (st != CLATTN_STATUS_SUCCESS) return st;
    char path[1024];
    TRY(clattn_tune_write(device, &keep, path, sizeof path));
    say(&s, "wrote %s (%.0f s)", path, (now_ms() - s.t0) / 1e3);
    /* the device uses it from now on, as a new process would */
    clattn_tune_table *old = device->tune;
    device->tune = NULL;
    clattn_tune_load(device);
    if (!device->tune) device->tune = old;
    else free(old);
    return CLATTN_STATUS_SUCCESS;
}
