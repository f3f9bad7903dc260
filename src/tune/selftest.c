/* selftest.c: clattn_device_selftest (clattn.h, "self-test"): a compact conformance set of every core the device
 * runs. Each core is forced in turn (a table with its kind's `force` set, as clattn_tune's candidates are made) and
 * computes its kind's cases; the ref device computes the same; every element is compared:
 *   prefill   attention plans: odd sizes, causal with key padding and GQA, a window, long rows (cross-attention),
 *             NaN inputs, a head size of 64, the weights (cores that make them)
 *   GEMM      the projections of the first three
 *   decode    steps over a prefilled cache, over a cache written long (split-K), over a half cache
 *   backward  training plans' forward and every gradient
 * A case the core refuses with a status (TOO_LARGE_FOR_DEVICE, UNSUPPORTED: the device's limits, named) counts as
 * refused, not failed; one that ends in another error (out of memory, a driver's error) makes the verdict ERROR, which
 * is not kept. The GEMM cores go first: every other kind's plans run GEMMs, and from then on they run on GEMM cores
 * that did not fail (each failure is marked on the device at once, so AUTO passes over it for the kinds after), and a
 * wrong GEMM is not blamed on the cores that use it; the prefill cores go before the backward core, whose plans run a
 * forward. The environment (CLATTN_CORE) is not read meanwhile. The verdicts (the cores that failed) are kept with the
 * probes' facts (runtime/probes.c), and AUTO passes over a failed core on this device and driver
 * (attention/select.c). */
#include "attention/attention.h"
#include "decode/decode.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 1e-5 /* the fp32 tolerance of the tests */
#define RTOL 1e-4
#define GRAD_ATOL 1e-4 /* gradients: the backward's, as the tests' and clattn_tune's */
#define GRAD_RTOL 1e-3

typedef struct rng { uint64_t s; } rng;

static float uniform(rng *r) /* [-1, 1) */
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / 8388608.0 - 1.0);
}

static float *randoms(rng *r, size_t n, float scale)
{
    float *a = malloc((n ? n : 1) * sizeof *a);
    for (size_t i = 0; a && i < n; i++) a[i] = scale * uniform(r);
    return a;
}

/* One core's running result. */
typedef struct tally {
    clattn_selftest_result *res;
    char where[80]; /* the case being compared, for the detail */
} tally;

/* The case went wrong: `verdict` FAIL (a wrong number) or ERROR (an error that is neither a refusal nor a wrong
 * number). The first failure's detail stays, a FAIL's over an ERROR's. */
static void mark(tally *t, clattn_verdict verdict, const char *fmt, va_list ap)
{
    if (t->res->verdict == CLATTN_VERDICT_FAIL || (t->res->verdict == CLATTN_VERDICT_ERROR && verdict != CLATTN_VERDICT_FAIL))
        return;
    t->res->verdict = verdict;
    char msg[200];
    vsnprintf(msg, sizeof msg, fmt, ap);
    snprintf(t->res->detail, sizeof t->res->detail, "%s: %s", t->where, msg);
}

static void fail(tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(tally *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mark(t, CLATTN_VERDICT_FAIL, fmt, ap);
    va_end(ap);
}

static void error(tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void error(tally *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mark(t, CLATTN_VERDICT_ERROR, fmt, ap);
    va_end(ap);
}

/* A status from the device's side of a case: 1 to go on; 0 when it refused (counted, the first reason kept) or
 * ended in another error (ERROR). */
static int accepted(tally *t, clattn_status st)
{
    if (st == CLATTN_STATUS_SUCCESS) return 1;
    if (st == CLATTN_STATUS_TOO_LARGE_FOR_DEVICE || st == CLATTN_STATUS_UNSUPPORTED) {
        t->res->refused++;
        if (!t->res->detail[0])
            snprintf(t->res->detail, sizeof t->res->detail, "%s refused: %s", t->where, clattn_last_error());
        return 0;
    }
    error(t, "%s (%s)", clattn_status_string(st), clattn_last_error());
    return 0;
}

/* got against ref's want, n elements: a NaN only where want has one, else within atol + rtol |want|. */
static void compare(tally *t, const char *what, const float *got, const float *want, size_t n, double atol,
                    double rtol)
{
    for (size_t i = 0; i < n; i++) {
        const double g = got[i], w = want[i];
        if (isnan(w) || isnan(g)) {
            if (isnan(w) != isnan(g)) fail(t, "%s[%zu] is %.9g where ref has %.9g", what, i, g, w);
            continue;
        }
        const double err = fabs(g - w), ratio = err / (atol + rtol * fabs(w));
        if (isinf(w) || isinf(g)) {
            if (g != w) fail(t, "%s[%zu] is %.9g where ref has %.9g", what, i, g, w);
            continue;
        }
        if (err > t->res->worst_error) t->res->worst_error = err;
        if (ratio > t->res->worst_ratio) t->res->worst_ratio = ratio;
        if (ratio > 1.0) fail(t, "%s[%zu] is %.9g where ref has %.9g (|diff| %.3g > %.3g)", what, i, g, w, err,
                              atol + rtol * fabs(w));
    }
}

/* ---- attention cases (prefill, GEMM and backward cores) */

typedef struct acase {
    const char *what;
    size_t B, Tq, Tk, E, H, HK, dk, dv, window;
    int cross, causal, kpm, nan, weights, training, gemm; /* gemm: a GEMM core's case too */
    int long_rows;                                       /* Tk: the self-test's long rows (1500; quick 700) */
    int full;                                            /* left out of the quick set */
} acase;

static const acase attention_cases[] = {
    {.what = "odd sizes", .B = 2, .Tq = 7, .E = 24, .H = 3, .dk = 8, .dv = 8, .gemm = 1},
    {.what = "causal, key padding, GQA", .B = 2, .Tq = 61, .E = 32, .H = 4, .HK = 2, .dk = 8, .dv = 8, .causal = 1,
     .kpm = 1, .gemm = 1},
    {.what = "long rows", .B = 1, .Tq = 5, .long_rows = 1, .E = 16, .H = 2, .dk = 8, .dv = 8, .cross = 1, .gemm = 1},
    {.what = "NaN inputs", .B = 2, .Tq = 13, .E = 16, .H = 2, .dk = 8, .dv = 8, .nan = 1},
    {.what = "window", .B = 1, .Tq = 130, .E = 32, .H = 4, .HK = 2, .dk = 8, .dv = 8, .causal = 1, .window = 17,
     .full = 1},
    {.what = "head size 64", .B = 1, .Tq = 33, .E = 128, .H = 2, .dk = 64, .dv = 64, .full = 1},
    {.what = "weights", .B = 1, .Tq = 9, .E = 16, .H = 2, .dk = 8, .dv = 8, .weights = 1},
    {.what = "training, causal, key padding", .B = 1, .Tq = 61, .E = 16, .H = 2, .dk = 8, .dv = 8, .causal = 1,
     .kpm = 1, .training = 1},
    {.what = "training, cross, GQA", .B = 2, .Tq = 7, .Tk = 130, .E = 16, .H = 4, .HK = 2, .dk = 4, .dv = 4,
     .cross = 1, .training = 1},
};

/* Does a core of this kind run case c? */
static int takes(const clattn_core *core, const acase *c)
{
    switch (core->kind) {
    case CLATTN_CORE_PREFILL: return !c->training && (!c->weights || core->produces_weights);
    case CLATTN_CORE_GEMM: return c->gemm;
    case CLATTN_CORE_BACKWARD: return c->training;
    default: return 0;
    }
}

typedef struct problem {
    clattn_attention_desc d;
    float *w[8]; /* wq wk wv bq bk bv wo bo */
    clattn_attention_weights wt;
    float *x, *kv, *gout;
    uint8_t *kpm;
    size_t nx, nkv, nout;
} problem;

static void problem_free(problem *p)
{
    for (int i = 0; i < 8; i++) free(p->w[i]);
    free(p->x), free(p->kv), free(p->gout), free(p->kpm);
}

static int problem_make(problem *p, const acase *c, size_t long_keys, rng *r)
{
    memset(p, 0, sizeof *p);
    const size_t Tk = c->cross ? (c->long_rows ? long_keys : c->Tk) : c->Tq, HK = c->HK ? c->HK : c->H;
    p->d = (clattn_attention_desc){.batch = c->B, .seq_q = c->Tq, .seq_kv = c->cross ? Tk : 0, .embed = c->E,
                                   .heads = c->H, .kv_heads = HK, .head_dim_qk = c->dk, .head_dim_v = c->dv,
                                   .out_dim = c->E, .cross = c->cross, .causal = c->causal,
                                   .key_padding_mask = c->kpm, .window = c->window, .need_weights = c->weights,
                                   .training = c->training};
    const size_t E = c->E, n[8] = {c->H * c->dk * E, HK * c->dk * E, HK * c->dv * E, c->H * c->dk, HK * c->dk,
                                   HK * c->dv, E * c->H * c->dv, E};
    const float s = 1.5f / sqrtf((float)E);
    for (int i = 0; i < 8; i++)
        if (!(p->w[i] = randoms(r, n[i], i == 6 || i < 3 ? s : 0.1f))) return 0;
    p->wt = (clattn_attention_weights){.w_query = p->w[0], .w_key = p->w[1], .w_value = p->w[2], .b_query = p->w[3],
                                       .b_key = p->w[4], .b_value = p->w[5], .w_out = p->w[6], .b_out = p->w[7],
                                       .w_query_count = n[0], .w_key_count = n[1], .w_value_count = n[2],
                                       .b_query_count = n[3], .b_key_count = n[4], .b_value_count = n[5],
                                       .w_out_count = n[6], .b_out_count = n[7]};
    p->nx = c->B * c->Tq * E, p->nkv = c->cross ? c->B * Tk * E : 0, p->nout = c->B * c->Tq * E;
    if (!(p->x = randoms(r, p->nx, 1.0f)) || (c->cross && !(p->kv = randoms(r, p->nkv, 1.0f))) ||
        !(p->gout = randoms(r, p->nout, 1.0f)))
        return 0;
    if (c->nan) { /* batch 0: token 3 NaN (its query row, and every row that sees its key); batch 1: an Inf */
        for (size_t e = 0; e < E; e++) p->x[3 * E + e] = NAN;
        p->x[(c->Tq + 5) * E + 2] = INFINITY;
    }
    if (c->kpm) {
        if (!(p->kpm = calloc(c->B * Tk, 1))) return 0;
        for (size_t b = 0; b < c->B; b++)
            for (size_t j = 0; j < Tk; j++) p->kpm[b * Tk + j] = (j * 7 + b * 3) % 5 == 0 && j > 0;
    }
    return 1;
}

/* What one device computes for p: the output, the weights (need_weights), and for training plans the gradients of
 * x (and kv) and of every weight, after one forward. Arrays malloc'd into out[0..*nout), their lengths in len[]. */
#define MAX_OUTS 12
static clattn_status compute(clattn_device *dev, const problem *p, float **out, size_t *len, const char **names,
                             int *nout)
{
    const clattn_attention_desc *d = &p->d;
    const size_t Tk = d->cross ? d->seq_kv : d->seq_q, H = d->heads, E = d->embed;
    clattn_plan *plan = NULL;
    TRY(clattn_plan_create(dev, d, &p->wt, &plan));
    int k = 0;
    len[k] = p->nout, names[k] = "out", out[k++] = malloc(p->nout * sizeof(float));
    if (d->need_weights) len[k] = d->batch * H * d->seq_q * Tk, names[k] = "attn", out[k] = malloc(len[k] * 4), k++;
    clattn_attention_args a = {.x = p->x, .kv = p->kv, .key_padding_mask = p->kpm, .out = out[0],
                               .attn = d->need_weights ? out[1] : NULL, .x_count = p->nx, .kv_count = p->nkv,
                               .key_padding_mask_count = p->kpm ? d->batch * Tk : 0, .out_count = p->nout,
                               .attn_count = d->need_weights ? len[1] : 0};
    *nout = k;
    for (int i = 0; i < k; i++)
        if (!out[i]) {
            clattn_plan_free(plan);
            return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "the self-test's outputs");
        }
    clattn_status st = clattn_plan_execute(plan, &a);
    if (st == CLATTN_STATUS_SUCCESS && d->training) {
        const clattn_attention_weights *w = &p->wt;
        const size_t n[] = {p->nx, p->nkv, w->w_query_count, w->w_key_count, w->w_value_count, w->b_query_count,
                            w->b_key_count, w->b_value_count, w->w_out_count, w->b_out_count};
        static const char *const gname[] = {"grad_x", "grad_kv", "grad_w_query", "grad_w_key", "grad_w_value",
                                            "grad_b_query", "grad_b_key", "grad_b_value", "grad_w_out", "grad_b_out"};
        float *g[10] = {NULL};
        for (int i = 0; i < 10; i++) {
            if (!n[i]) continue;
            names[k] = gname[i], len[k] = n[i], g[i] = out[k] = malloc(n[i] * sizeof(float)), k++;
            if (!g[i]) st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "the self-test's gradients");
        }
        *nout = k;
        const clattn_attention_grads gr = {
            .grad_out = p->gout, .grad_out_count = p->nout, .grad_x = g[0], .grad_x_count = n[0], .grad_kv = g[1],
            .grad_kv_count = n[1], .grad_w_query = g[2], .grad_w_query_count = n[2], .grad_w_key = g[3],
            .grad_w_key_count = n[3], .grad_w_value = g[4], .grad_w_value_count = n[4], .grad_b_query = g[5],
            .grad_b_query_count = n[5], .grad_b_key = g[6], .grad_b_key_count = n[6], .grad_b_value = g[7],
            .grad_b_value_count = n[7], .grad_w_out = g[8], .grad_w_out_count = n[8], .grad_b_out = g[9],
            .grad_b_out_count = n[9]};
        clattn_attention_args in = a; /* the backward takes the inputs only */
        in.out = NULL, in.attn = NULL, in.out_count = in.attn_count = 0;
        if (st == CLATTN_STATUS_SUCCESS) st = clattn_plan_backward(plan, &in, &gr);
    }
    (void)E;
    clattn_plan_free(plan);
    return st;
}

static void free_outs(float **out, int n)
{
    for (int i = 0; i < n; i++) free(out[i]), out[i] = NULL;
}

static void attention_case(clattn_device *dev, clattn_device *ref, const acase *c, size_t long_keys, uint64_t seed,
                           tally *t)
{
    rng r = {seed};
    problem p;
    float *got[MAX_OUTS] = {NULL}, *want[MAX_OUTS] = {NULL};
    size_t len[MAX_OUTS], rlen[MAX_OUTS];
    const char *names[MAX_OUTS], *rnames[MAX_OUTS];
    int n = 0, rn = 0;
    snprintf(t->where, sizeof t->where, "%s", c->what);
    if (!problem_make(&p, c, long_keys, &r)) {
        error(t, "out of host memory");
    } else if (accepted(t, compute(dev, &p, got, len, names, &n))) {
        const clattn_status st = compute(ref, &p, want, rlen, rnames, &rn);
        if (st != CLATTN_STATUS_SUCCESS) {
            error(t, "the ref device: %s", clattn_last_error());
        } else {
            t->res->cases++;
            for (int i = 0; i < n && i < rn; i++)
                compare(t, names[i], got[i], want[i], len[i], i > 0 && p.d.training ? GRAD_ATOL : ATOL,
                        i > 0 && p.d.training ? GRAD_RTOL : RTOL);
        }
    }
    free_outs(got, n);
    free_outs(want, rn);
    problem_free(&p);
}

/* ---- decode cases */

typedef struct dcase {
    const char *what;
    size_t B, H, HK, dk, dv, prefill, steps, written; /* written: the cache written to this length first */
    int half, full;
} dcase;

static const dcase decode_cases[] = {
    {.what = "decode: prefill then steps", .B = 2, .H = 4, .HK = 2, .dk = 8, .dv = 8, .prefill = 7, .steps = 3},
    {.what = "decode: a long cache (split-K)", .B = 1, .H = 4, .HK = 1, .dk = 16, .dv = 16, .written = 1500,
     .steps = 2},
    {.what = "decode: half cache, odd heads", .B = 2, .H = 6, .HK = 3, .dk = 4, .dv = 12, .prefill = 5, .steps = 2,
     .half = 1, .full = 1},
};

/* The outputs of the case's calls, one after another, in out (B*calls*E... as they come). */
static clattn_status decode_run(clattn_device *dev, const dcase *c, const problem *p, const float *kc, const float *vc,
                                size_t written, float *out)
{
    const size_t B = c->B, E = p->d.embed, n0 = c->prefill ? c->prefill : 1, cap = written + n0 + c->steps + 1;
    clattn_decode_plan *plan = NULL;
    clattn_kv_cache *cache = NULL;
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = cap, .kv_heads = c->HK, .head_dim_qk = c->dk,
                                     .head_dim_v = c->dv, .type = c->half ? CLATTN_KV_HALF : CLATTN_KV_FLOAT};
    clattn_status st = clattn_decode_plan_create(dev, &p->d, &p->wt, &plan);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_kv_cache_create(dev, &cd, &cache);
    if (st == CLATTN_STATUS_SUCCESS && written) {
        size_t lens[4];
        for (size_t b = 0; b < B; b++) lens[b] = written - b;
        float *k = calloc(B * c->HK * cap * c->dk, sizeof *k), *v = calloc(B * c->HK * cap * c->dv, sizeof *v);
        if (!k || !v) st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "the self-test's cache");
        for (size_t i = 0; k && v && i < B * c->HK; i++) {
            memcpy(k + i * cap * c->dk, kc + i * written * c->dk, written * c->dk * sizeof *k);
            memcpy(v + i * cap * c->dv, vc + i * written * c->dv, written * c->dv * sizeof *v);
        }
        if (st == CLATTN_STATUS_SUCCESS) st = clattn_kv_cache_write(cache, k, v, lens);
        free(k), free(v);
    }
    const float *x = p->x;
    for (size_t call = 0; st == CLATTN_STATUS_SUCCESS && call <= c->steps; call++) {
        const size_t n = call == 0 ? n0 : 1;
        const clattn_decode_args a = {.x = x, .new_tokens = n, .out = out, .x_count = B * n * E,
                                      .out_count = B * n * E};
        st = clattn_decode_execute(plan, cache, &a);
        x += B * n * E, out += B * n * E;
    }
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(plan);
    return st;
}

static void decode_case(clattn_device *dev, clattn_device *ref, const dcase *c, size_t written, uint64_t seed,
                        tally *t)
{
    rng r = {seed};
    snprintf(t->where, sizeof t->where, "%s", c->what);
    const acase shape = {.B = c->B, .Tq = c->prefill ? c->prefill : 1, .E = 16, .H = c->H, .HK = c->HK, .dk = c->dk,
                         .dv = c->dv};
    problem p;
    const size_t n0 = c->prefill ? c->prefill : 1, rows = c->B * (n0 + c->steps), nout = rows * 16;
    float *got = malloc(nout * sizeof *got), *want = malloc(nout * sizeof *want);
    float *kc = randoms(&r, c->B * c->HK * (written ? written : 1) * c->dk, 1.0f);
    float *vc = randoms(&r, c->B * c->HK * (written ? written : 1) * c->dv, 1.0f);
    if (!problem_make(&p, &shape, 0, &r) || !got || !want || !kc || !vc) {
        error(t, "out of host memory");
    } else {
        p.d.causal = 1, p.d.kv_half = c->half;
        free(p.x);
        if (!(p.x = randoms(&r, rows * 16, 1.0f))) {
            error(t, "out of host memory");
        } else if (accepted(t, decode_run(dev, c, &p, kc, vc, written, got))) {
            if (decode_run(ref, c, &p, kc, vc, written, want) != CLATTN_STATUS_SUCCESS) {
                error(t, "the ref device: %s", clattn_last_error());
            } else {
                t->res->cases++;
                compare(t, "out", got, want, nout, ATOL, RTOL);
            }
        }
        problem_free(&p);
    }
    free(got), free(want), free(kc), free(vc);
}

/* ---- the cores */

/* Can the device run core c at all (for some plan)? If not, why in res->detail. A core that failed an earlier
 * self-test is tested again. */
static int runs_here(const clattn_device *dev, const clattn_core *c, clattn_selftest_result *res)
{
    char why[300] = "";
    if (c->supports(c, &dev->caps, NULL, why, sizeof why) != CLATTN_STATUS_SUCCESS ||
        (c->native && !c->native(c, &dev->caps, why, sizeof why)) ||
        clattn_core_check_trips(c, &dev->caps, NULL, NULL, why, sizeof why) != CLATTN_STATUS_SUCCESS) {
        snprintf(res->detail, sizeof res->detail, "%s", why);
        return 0;
    }
    return 1;
}

static void test_core(clattn_device *dev, clattn_device *ref, const clattn_core *c, int quick,
                      clattn_selftest_result *res)
{
    memset(res, 0, sizeof *res);
    snprintf(res->core, sizeof res->core, "%s", c->name);
    res->kind = (clattn_core_kind)c->kind;
    if (!runs_here(dev, c, res)) {
        res->verdict = CLATTN_VERDICT_NOT_RUN;
        return;
    }
    clattn_tune_table force; /* the tuning file's entries (what plans here run), and the core forced */
    if (dev->tune) force = *dev->tune;
    else clattn_tune_table_init(&force);
    force.force[c->kind] = c;
    force.selftest = 1;
    dev->tune_try = &force;
    tally t = {.res = res};
    const size_t long_keys = quick ? 700 : 1500;
    if (c->kind == CLATTN_CORE_DECODE) {
        for (size_t i = 0; i < sizeof decode_cases / sizeof decode_cases[0]; i++)
            if (!quick || !decode_cases[i].full)
                decode_case(dev, ref, &decode_cases[i], decode_cases[i].written ? long_keys : 0, 4500 + i, &t);
    } else {
        for (size_t i = 0; i < sizeof attention_cases / sizeof attention_cases[0]; i++)
            if (takes(c, &attention_cases[i]) && (!quick || !attention_cases[i].full))
                attention_case(dev, ref, &attention_cases[i], long_keys, 4000 + i, &t);
    }
    dev->tune_try = NULL;
    if (res->verdict == CLATTN_VERDICT_PASS && res->cases == 0 && res->refused == 0) {
        res->verdict = CLATTN_VERDICT_NOT_RUN;
        snprintf(res->detail, sizeof res->detail, "no case of the self-test is one %s takes", c->name);
    }
}

clattn_status clattn_device_selftest(clattn_device *device, int quick, clattn_selftest_result *results,
                                     size_t capacity, size_t *count)
{
    clattn_clear_error();
    if (!device || !count || (capacity && !results))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device, count or results is NULL");
    if (device->backend != CLATTN_BACKEND_OPENCL)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "the self-test checks an OpenCL device against ref; %s is ref",
                           device->name);
    if (device->tune_try)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "clattn_tune is searching on this device");
    *count = clattn_core_total();
    clattn_device *ref = NULL;
    TRY(clattn_device_open("ref", &ref));
    /* a quick run keeps the failures it has no case to contradict; a full run starts again */
    char earlier[sizeof device->caps.selftest_failed];
    snprintf(earlier, sizeof earlier, "%s", quick ? device->caps.selftest_failed : "");
    device->caps.selftest_failed[0] = '\0'; /* from here, this run's failures (AUTO passes over them) */
    static const clattn_core_kind order[] = {CLATTN_CORE_GEMM, CLATTN_CORE_PREFILL, CLATTN_CORE_DECODE,
                                             CLATTN_CORE_BACKWARD};
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++)
        for (size_t i = 0; i < clattn_core_total(); i++) {
            const clattn_core *c = clattn_core_at(i);
            if (c->kind != order[k]) continue;
            clattn_selftest_result r;
            test_core(device, ref, c, quick, &r);
            if (r.verdict == CLATTN_VERDICT_FAIL) clattn_caps_fail(&device->caps, r.core);
            if (i < capacity) results[i] = r;
        }
    clattn_device_free(ref);
    char failed[sizeof device->caps.selftest_failed + sizeof earlier];
    snprintf(failed, sizeof failed, "%s", device->caps.selftest_failed);
    char *save = NULL;
    for (char *w = strtok_r(earlier, " ", &save); w; w = strtok_r(NULL, " ", &save))
        if (!clattn_caps_failed(&device->caps, w)) snprintf(failed + strlen(failed), sizeof failed - strlen(failed), " %s ", w);
    /* "a b c": the words, one space apart */
    char words[sizeof failed] = "";
    for (char *w = strtok_r(failed, " ", &save); w; w = strtok_r(NULL, " ", &save))
        snprintf(words + strlen(words), sizeof words - strlen(words), "%s%s", words[0] ? " " : "", w);
    const int kept = clattn_verdicts_store(device, words);
    clattn_clear_error();
    clattn_set_notice("%s", kept ? "" : "the self-test's verdicts hold for this device object only: the cache "
                      "directory is off or not writable ($CLATTN_CACHE_DIR, CLATTN_PROGRAM_CACHE)");
    return CLATTN_STATUS_SUCCESS;
}
