/* test_dropout.c: dropout against oracles that share no code with the library.
 *
 * ref and the OpenCL kernels all compile cl/common/philox.cl and share clattn_dropout_threshold, so
 * comparing them with each other proves nothing about the mask. Here the expectation comes from:
 *   - a Philox4x32-10 written in this file, checked against Random123's published known answers;
 *   - the documented rule: weight (b, h, i, j) is dropped when r0 < floor(p * 2^32), r0 the first
 *     word of Philox(counter (j, i, h, b), key (seed lo, seed hi)); kept weights scaled by 1/(1-p);
 *   - committed mask fixtures (tests/golden/dropout, made by tests/golden/make_dropout_mask.py, a
 *     third Philox, in Python);
 *   - the float64 attention of tests/oracle.c for the weights before dropout.
 * Every element of the weights (unfused, ref) or of the output (fused, which makes no weights) is
 * checked, at thresholds placed exactly on a weight's random word, and the drop counts per key
 * column and per query row are held to binomial bounds. */
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the test's own Philox (tests/oracle.c), not cl/common/philox.cl */
#define own_philox oracle_philox4x32_10
#define word0 oracle_dropout_word
#define threshold_of oracle_dropout_threshold

Test(dropout_oracle, own_philox_known_answers)
{
    const uint32_t(*kat)[10] = oracle_philox_kat; /* Random123 known answers */
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        own_philox(&kat[t][0], &kat[t][4], out);
        for (int w = 0; w < 4; w++) cr_assert_eq(out[w], kat[t][6 + w], "vector %d word %d: %08x", t, w, out[w]);
    }
    /* the example: counter 0, key 0 -> r0 = 0x6627e8d5 */
    cr_assert_eq(word0(0, 0, 0, 0, 0), 0x6627e8d5u);
}

/* ---- one problem: no projections (Q = x, K = V = kv or x), B x H heads of size dk */

typedef struct problem {
    clattn_attention_desc d;
    float *x, *kv;
    size_t n_out, n_attn;
} problem;

static void problem_init(problem *p, size_t B, size_t H, size_t Tq, size_t Tk, size_t dk, uint64_t data_seed)
{
    tu_rng r = {data_seed};
    memset(p, 0, sizeof *p);
    const int cross = Tq != Tk;
    p->d = (clattn_attention_desc){.batch = B, .seq_q = Tq, .seq_kv = cross ? Tk : 0, .embed = H * dk,
                                   .heads = H, .cross = cross};
    /* scores of moderate spread, so that no weight is negligibly small */
    p->x = tu_random(&r, B * Tq * H * dk, -1, 1);
    if (cross) p->kv = tu_random(&r, B * Tk * H * dk, -1, 1);
    p->n_out = B * Tq * H * dk;
    p->n_attn = B * H * Tq * Tk;
}

static void problem_free(problem *p)
{
    free(p->x);
    free(p->kv);
}

/* expected keep flags (B, H, Tq, Tk) from the own Philox and the documented rule */
static uint8_t *oracle_keep(const problem *p, float pdrop, uint64_t seed)
{
    const clattn_attention_desc *d = &p->d;
    const size_t Tk = d->cross ? d->seq_kv : d->seq_q;
    uint8_t *k = malloc(p->n_attn);
    cr_assert_not_null(k);
    const uint64_t t = threshold_of(pdrop);
    size_t e = 0;
    for (uint32_t b = 0; b < d->batch; b++)
        for (uint32_t h = 0; h < d->heads; h++)
            for (uint32_t i = 0; i < d->seq_q; i++)
                for (uint32_t j = 0; j < Tk; j++) k[e++] = word0(seed, b, h, i, j) >= t;
    return k;
}

/* Run on dev with `alg` and check every element against the float64 oracle with `keep` applied:
 * the weights (when the algorithm makes them) are 0 exactly where dropped and eval/(1-p)
 * elsewhere; the output is sum_j weight_ij v_j. */
static void check_run(clattn_device *dev, const problem *p, clattn_algorithm alg, float pdrop, uint64_t seed,
                      const uint8_t *keep, const char *what)
{
    clattn_attention_desc d = p->d;
    d.dropout = pdrop;
    d.seed = seed;
    d.algorithm = alg;
    const int weights = alg != CLATTN_ALGORITHM_FUSED;
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL && !tu_core_applies(alg, weights)) return;
    d.need_weights = weights;
    d.seed = seed ^ 0x9E3779B97F4A7C15ull; /* made with another seed, then given this one: the next executions use it */
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s: %s", what,
                 clattn_last_error());
    cr_assert_eq(clattn_plan_set_seed(plan, seed), CLATTN_STATUS_SUCCESS);
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL)
        cr_assert_eq(clattn_plan_algorithm(plan), alg, "%s: the plan runs %s", what,
                     clattn_algorithm_name(clattn_plan_algorithm(plan)));
    float *out = tu_poisoned(p->n_out), *attn = weights ? tu_poisoned(p->n_attn) : NULL;
    clattn_attention_args a = {.x = p->x, .kv = p->kv, .out = out, .attn = attn};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s: %s", what, clattn_last_error());
    clattn_plan_free(plan);

    /* the oracle: eval weights in float64, then the expected mask */
    clattn_attention_desc e = p->d;
    double *w64 = malloc(p->n_attn * sizeof *w64), *o64 = malloc(p->n_out * sizeof *o64);
    cr_assert(w64 && o64);
    clattn_attention_args ea = {.x = p->x, .kv = p->kv};
    cr_assert_eq(oracle_attention(&e, NULL, &ea, o64, w64), 0);
    const double scale = 1.0 / (1.0 - (double)pdrop);
    for (size_t k = 0; k < p->n_attn; k++) w64[k] = keep[k] ? w64[k] * scale : 0.0;
    const size_t B = e.batch, H = e.heads, Tq = e.seq_q, Tk = e.cross ? e.seq_kv : Tq, dk = e.embed / H;
    const float *v = e.cross ? p->kv : p->x;
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < Tq; i++)
                for (size_t c = 0; c < dk; c++) {
                    double acc = 0.0;
                    for (size_t j = 0; j < Tk; j++)
                        acc += w64[((b * H + h) * Tq + i) * Tk + j] * v[(b * Tk + j) * H * dk + h * dk + c];
                    o64[(b * Tq + i) * H * dk + h * dk + c] = acc;
                }
    char msg[256];
    if (weights)
        for (size_t k = 0; k < p->n_attn; k++) {
            if (!keep[k])
                cr_assert(attn[k] == 0.0f, "%s: weight %zu should be dropped, got %g", what, k, attn[k]);
            else
                cr_assert(attn[k] != 0.0f && fabs(attn[k] - w64[k]) <= TU_ATOL + TU_RTOL * fabs(w64[k]),
                          "%s: weight %zu should be kept: got %.9g, oracle %.9g", what, k, attn[k], w64[k]);
        }
    cr_assert_eq(oracle_compare(out, o64, p->n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s: out: %s", what,
                 msg);
    free(out), free(attn), free(w64), free(o64);
}

/* The algorithms a device runs: ref computes one function whatever the algorithm says. */
static void check_all(const problem *p, float pdrop, uint64_t seed, const uint8_t *keep, const char *what)
{
    char name[160];
    clattn_device *ref = tu_open_ref();
    snprintf(name, sizeof name, "%s on ref", what);
    check_run(ref, p, CLATTN_ALGORITHM_AUTO, pdrop, seed, keep, name);
    clattn_device_free(ref);
    clattn_device *cl = tu_open_opencl();
    snprintf(name, sizeof name, "%s, OpenCL unfused", what);
    check_run(cl, p, CLATTN_ALGORITHM_UNFUSED, pdrop, seed, keep, name);
    snprintf(name, sizeof name, "%s, OpenCL fused", what);
    check_run(cl, p, CLATTN_ALGORITHM_FUSED, pdrop, seed, keep, name);
    clattn_device_free(cl);
}

/* ---- the committed fixtures */

static void fixture(const char *name)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/../dropout/%s.txt", CLATTN_GOLDEN_DIR, name);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    unsigned long long B = 0, H = 0, Tq = 0, Tk = 0, seed = 0, thr = 0;
    double pd = -1;
    char line[256], key[64];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        double v;
        cr_assert_eq(sscanf(line, "%63s %lf", key, &v), 2, "%s: %s", path, line);
        if (!strcmp(key, "batch")) B = (unsigned long long)v;
        else if (!strcmp(key, "heads")) H = (unsigned long long)v;
        else if (!strcmp(key, "seq_q")) Tq = (unsigned long long)v;
        else if (!strcmp(key, "seq_kv")) Tk = (unsigned long long)v;
        else if (!strcmp(key, "p")) pd = v;
        else if (!strcmp(key, "seed")) cr_assert_eq(sscanf(line, "%*s %llu", &seed), 1);
        else if (!strcmp(key, "threshold")) thr = (unsigned long long)v;
    }
    fclose(f);
    cr_assert(B && H && Tq && Tk && pd >= 0, "%s: incomplete", path);
    const float pdrop = (float)pd;
    cr_assert_eq(threshold_of(pdrop), thr, "%s: threshold", path);

    snprintf(path, sizeof path, "%s/../dropout/%s.npy", CLATTN_GOLDEN_DIR, name);
    clattn_npy m;
    cr_assert_eq(clattn_npy_load(path, &m, err, sizeof err), 0, "%s: %s", path, err);
    cr_assert_eq(m.dtype, CLATTN_NPY_U8, "%s: dtype", path);
    cr_assert(m.ndim == 4 && m.shape[0] == B && m.shape[1] == H && m.shape[2] == Tq && m.shape[3] == Tk,
              "%s: shape", path);
    problem p;
    problem_init(&p, B, H, Tq, Tk, 3, 0xD0D0 + B * 31 + Tk);
    /* the two independent Philoxes (Python, C) agree on every flag */
    uint8_t *own = oracle_keep(&p, pdrop, seed);
    const uint8_t *want = m.data;
    size_t kept = 0;
    for (size_t k = 0; k < p.n_attn; k++) {
        cr_assert_eq(own[k], want[k], "%s: flag %zu: the fixture says %u", name, k, want[k]);
        kept += want[k];
    }
    cr_assert(kept > 0 && kept < p.n_attn, "%s: a fixture with both kept and dropped weights", name);
    check_all(&p, pdrop, seed, want, name);
    free(own);
    clattn_npy_free(&m);
    problem_free(&p);
}

Test(dropout_oracle, fixture_b2_h3_q7_k9, .timeout = 600) { fixture("mask_b2_h3_q7_k9"); }
Test(dropout_oracle, fixture_b1_h2_q5_k61, .timeout = 600) { fixture("mask_b1_h2_q5_k61"); }

/* ---- thresholds exactly on a weight's random word
 * p is a float, so floor(p 2^32) is exact only for words with few significant bits; search seeds for
 * a weight whose word r makes r + 1 a float threshold (that weight must be dropped at p = (r+1)/2^32:
 * r < r + 1) and one whose r is itself a float threshold (kept at p = r/2^32: r >= r). */
static int float_threshold(uint64_t t)
{
    if (t == 0 || t >= 4294967296ull) return 0;
    float p = (float)((double)t / 4294967296.0);
    return threshold_of(p) == t;
}

Test(dropout_oracle, thresholds_on_the_boundary, .timeout = 900)
{
    problem p;
    problem_init(&p, 1, 2, 16, 16, 4, 77);
    const size_t T = 16;
    for (int want_drop = 1; want_drop >= 0; want_drop--) {
        uint64_t seed = 0, t = 0;
        size_t at = 0;
        int found = 0;
        for (seed = 1; !found && seed < 100000; seed++)
            for (uint32_t h = 0; !found && h < 2; h++)
                for (uint32_t i = 0; !found && i < T; i++)
                    for (uint32_t j = 0; !found && j < T; j++) {
                        uint64_t r = word0(seed, 0, h, i, j);
                        t = want_drop ? r + 1 : r;
                        /* p in (0.05, 0.95): a weight both ways, and a scale that stays moderate */
                        if (float_threshold(t) && t > 214748364u && t < 4080218931u) {
                            found = 1;
                            at = ((size_t)h * T + i) * T + j;
                        }
                    }
        seed--;
        cr_assert(found, "no boundary weight found");
        const float pdrop = (float)((double)t / 4294967296.0);
        cr_assert_eq(threshold_of(pdrop), t);
        uint8_t *keep = oracle_keep(&p, pdrop, seed);
        cr_assert_eq(keep[at], !want_drop, "own oracle at the boundary");
        char what[160];
        snprintf(what, sizeof what, "seed %llu, p = %.9g, weight %zu %s at threshold = its word%s",
                 (unsigned long long)seed, pdrop, at, want_drop ? "dropped" : "kept", want_drop ? " + 1" : "");
        check_all(&p, pdrop, seed, keep, what);
        free(keep);
    }
    problem_free(&p);
}

/* ---- statistics: drop counts per key column and per query row
 * Over n independent weights each dropped with probability p, the count is Binomial(n, p): mean
 * np, sd sqrt(np(1-p)). A column (or row) here holds n = H*T = 1024 weights; we allow 5.5 sd,
 * P(|Z| > 5.5) = 3.8e-8, so the 2*T = 256 checks per p false-alarm with probability < 1e-5 (and
 * the data are deterministic, so a pass stays a pass). A weight always kept (or dropped) in one
 * column moves that column by np = 256 (p = 1/4) = 18 sd. */
static void counts(clattn_device *dev, clattn_algorithm alg)
{
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL && !tu_core_applies(alg, 1)) return;
    const size_t H = 8, T = 128, n = H * T;
    problem p;
    problem_init(&p, 1, H, T, T, 2, 5);
    const float ps[] = {0.25f, 0.5f};
    for (int k = 0; k < 2; k++) {
        clattn_attention_desc d = p.d;
        d.dropout = ps[k];
        d.seed = 0xC0FFEE + k;
        d.algorithm = alg;
        d.need_weights = 1;
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL) cr_assert_eq(clattn_plan_algorithm(plan), alg);
        float *out = tu_poisoned(p.n_out), *attn = tu_poisoned(p.n_attn);
        clattn_attention_args a = {.x = p.x, .out = out, .attn = attn};
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_plan_free(plan);
        size_t col[128] = {0}, row[128] = {0}, total = 0;
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < T; i++)
                for (size_t j = 0; j < T; j++) {
                    float v = attn[(h * T + i) * T + j];
                    cr_assert(!isnan(v), "weight (%zu, %zu, %zu) not written", h, i, j);
                    if (v == 0.0f) col[j]++, row[i]++, total++;
                }
        const double pd = ps[k], mean = n * pd, sd = sqrt(n * pd * (1 - pd));
        for (size_t j = 0; j < T; j++) {
            cr_assert(fabs((double)col[j] - mean) <= 5.5 * sd, "p = %g: key column %zu: %zu dropped, expected %g +- %g",
                      pd, j, col[j], mean, 5.5 * sd);
            cr_assert(fabs((double)row[j] - mean) <= 5.5 * sd, "p = %g: query row %zu: %zu dropped, expected %g +- %g",
                      pd, j, row[j], mean, 5.5 * sd);
        }
        const double N = (double)n * T, tsd = sqrt(N * pd * (1 - pd));
        cr_assert(fabs((double)total - N * pd) <= 5.5 * tsd, "p = %g: %zu dropped of %g, expected %g +- %g", pd, total,
                  N, N * pd, 5.5 * tsd);
        free(out), free(attn);
    }
    problem_free(&p);
}

Test(dropout_oracle, counts_per_column_and_row_ref) { clattn_device *d = tu_open_ref(); counts(d, CLATTN_ALGORITHM_AUTO); clattn_device_free(d); }
Test(dropout_oracle, counts_per_column_and_row_opencl, .timeout = 600)
{
    clattn_device *d = tu_open_opencl();
    counts(d, CLATTN_ALGORITHM_UNFUSED);
    clattn_device_free(d);
}
