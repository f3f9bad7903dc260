/* test_fused.c: the attention core at the shapes where the fused kernel's blocking shows.
 *   shapes   both algorithms against ref, and against the float64 oracle of tests/oracle.c, on fresh random inputs: T in {1, 7, 61, 130, 1000},
 *            head sizes {1, 3, 64, 80, 128, 256} with dk != dv, cross-attention with Tq != Tk,
 *            every mask with and without causal, a fully masked batch entry, dropout;
 *            every element of out, poisoned first
 *   long     T = 8192 and 32768 (B = 1, E = 128, H = 2, nn.Linear weights with biases and an output
 *            projection) on sampled rows against a float64 row-by-row computation written here,
 *            independent of ref.c and of the library
 * The ctest entries test_fused_core_<core> run the shapes on each core (CLATTN_CORE); the long suite runs
 * once, in the plain entry. */
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- shapes, against ref */

typedef struct shape {
    size_t B, Tq, Tk, H, dk, dv; /* Tk = 0: self-attention */
    int causal, kpm;
    clattn_mask_kind mask;
    float dropout;
} shape;

static void against_ref(const shape *s, uint64_t seed, clattn_algorithm alg)
{
    if (!tu_core_applies(alg, 0)) return;
    tu_rng r = {seed};
    const int cross = s->Tk != 0;
    const size_t B = s->B, Tq = s->Tq, Tk = cross ? s->Tk : s->Tq, H = s->H, dk = s->dk, dv = s->dv;
    const size_t E = 24, Ekv = cross ? 17 : E, Eo = 19;
    clattn_attention_desc d = {.batch = B, .seq_q = Tq, .cross = cross, .seq_kv = cross ? Tk : 0, .embed = E,
                               .kv_embed = cross ? Ekv : 0, .heads = H, .head_dim_qk = dk, .head_dim_v = dv,
                               .out_dim = Eo, .causal = s->causal, .key_padding_mask = s->kpm, .attn_mask = s->mask,
                               .dropout = s->dropout, .seed = seed * 31 + 7, .algorithm = alg};
    const float wq = 1.0f / sqrtf((float)E), wkv = 1.0f / sqrtf((float)Ekv);
    float *w_q = tu_random(&r, H * dk * E, -wq, wq), *w_k = tu_random(&r, H * dk * Ekv, -wkv, wkv);
    float *w_v = tu_random(&r, H * dv * Ekv, -wkv, wkv), *w_o = tu_random(&r, Eo * H * dv, -0.3f, 0.3f);
    float *b_q = tu_random(&r, H * dk, -0.5f, 0.5f), *b_v = tu_random(&r, H * dv, -0.5f, 0.5f);
    float *b_o = tu_random(&r, Eo, -0.5f, 0.5f);
    clattn_attention_weights w = {.w_query = w_q, .w_key = w_k, .w_value = w_v, .b_query = b_q, .b_value = b_v,
                                  .w_out = w_o, .b_out = b_o};
    float *x = tu_random(&r, B * Tq * E, -1, 1), *kv = cross ? tu_random(&r, B * Tk * Ekv, -1, 1) : NULL;
    uint8_t *kpm = NULL, *bmask = NULL;
    float *fmask = NULL;
    clattn_attention_args a = {.x = x, .kv = kv};
    if (s->kpm) {
        kpm = malloc(B * Tk);
        for (size_t i = 0; i < B * Tk; i++) kpm[i] = tu_next(&r) % 5 == 0;
        if (B > 1) memset(kpm + (B - 1) * Tk, 1, Tk); /* the last batch entry sees no key: 0 (+ b_out) */
        a.key_padding_mask = kpm;
    }
    if (s->mask == CLATTN_MASK_BOOL) {
        bmask = malloc(Tq * Tk);
        for (size_t i = 0; i < Tq * Tk; i++) bmask[i] = tu_next(&r) % 4 == 0;
        memset(bmask + (Tq / 2) * Tk, 1, Tk); /* one query row sees nothing */
        a.attn_mask = bmask;
    } else if (s->mask == CLATTN_MASK_FLOAT) {
        fmask = tu_random(&r, Tq * Tk, -3, 3);
        for (size_t i = 0; i < Tq * Tk; i++)
            if (tu_next(&r) % 6 == 0) fmask[i] = -INFINITY;
        a.attn_mask = fmask;
    }
    clattn_device *ref = tu_open_ref(), *cl = tu_open_opencl();
    clattn_plan *pr = NULL, *pc = NULL;
    cr_assert_eq(tu_plan_create(ref, &d, &w, &pr), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_status st = tu_plan_create(cl, &d, &w, &pc);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: %s\n%s", clattn_status_string(st), clattn_last_error(),
                 clattn_last_build_log());
    cr_assert_eq(clattn_plan_algorithm(pc), alg);
    const size_t n = B * Tq * Eo;
    float *oref = tu_poisoned(n), *ocl = tu_poisoned(n);
    a.out = oref;
    cr_assert_eq(tu_plan_execute(pr, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    a.out = ocl;
    cr_assert_eq(tu_plan_execute(pc, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    int varied = 0;
    for (size_t i = 1; i < n && !varied; i++) varied = oref[i] != oref[0];
    cr_assert(varied, "the reference output is constant: the case proves nothing");
    char msg[256];
    size_t bad = tu_compare(ocl, oref, n, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s B=%zu Tq=%zu Tk=%zu H=%zu dk=%zu dv=%zu causal=%d kpm=%d mask=%d p=%g: %zu of %zu "
                 "differ; %s", clattn_algorithm_name(alg), B, Tq, Tk, H, dk, dv, s->causal, s->kpm, (int)s->mask,
                 (double)s->dropout, bad, n, msg);
    {
        double *o64 = malloc(n * sizeof *o64);
        cr_assert_not_null(o64);
        cr_assert_eq(oracle_attention(&d, &w, &a, o64, NULL), 0);
        bad = oracle_compare(ocl, o64, n, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "%s vs float64: B=%zu Tq=%zu Tk=%zu H=%zu dk=%zu dv=%zu causal=%d kpm=%d mask=%d: %zu "
                     "of %zu differ; %s", clattn_algorithm_name(alg), B, Tq, Tk, H, dk, dv, s->causal, s->kpm,
                     (int)s->mask, bad, n, msg);
        free(o64);
    }
    clattn_plan_free(pr);
    clattn_plan_free(pc);
    clattn_device_free(ref);
    clattn_device_free(cl);
    free(w_q); free(w_k); free(w_v); free(w_o); free(b_q); free(b_v); free(b_o); free(x); free(kv);
    free(kpm); free(bmask); free(fmask); free(oref); free(ocl);
}

static void both(const shape *s, uint64_t seed)
{
    against_ref(s, seed, CLATTN_ALGORITHM_FUSED);
    against_ref(s, seed, CLATTN_ALGORITHM_UNFUSED);
}

/* B, Tq, Tk, H, dk, dv | causal kpm mask dropout */
Test(fused, sequence_lengths)
{
    const size_t Ts[] = {1, 7, 61, 130, 1000};
    for (size_t k = 0; k < 5; k++) {
        const size_t T = Ts[k];
        both(&(shape){2, T, 0, 2, 8, 8, 0, 0, CLATTN_MASK_NONE, 0}, 100 + k);
        both(&(shape){2, T, 0, 2, 16, 8, 1, 1, CLATTN_MASK_NONE, 0}, 200 + k);
    }
}

Test(fused, head_sizes)
{
    const size_t ds[][2] = {{1, 1}, {3, 3}, {64, 64}, {80, 80}, {128, 128}, {256, 256}, {3, 64}, {64, 3},
                            {80, 128}, {256, 40}, {5, 12}};
    for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        both(&(shape){1, 37, 0, 2, ds[k][0], ds[k][1], 0, 0, CLATTN_MASK_NONE, 0}, 300 + k);
        both(&(shape){2, 29, 0, 1, ds[k][0], ds[k][1], 1, 1, CLATTN_MASK_NONE, 0}, 400 + k);
    }
}

Test(fused, cross_attention)
{
    both(&(shape){2, 5, 131, 3, 16, 8, 0, 1, CLATTN_MASK_NONE, 0}, 500);
    both(&(shape){2, 131, 5, 3, 16, 8, 1, 1, CLATTN_MASK_FLOAT, 0}, 501); /* causal with Tq > Tk: top-left */
    both(&(shape){1, 61, 200, 2, 64, 32, 1, 0, CLATTN_MASK_BOOL, 0}, 502);
    both(&(shape){3, 1, 1000, 2, 8, 8, 0, 1, CLATTN_MASK_NONE, 0}, 503);
}

Test(fused, masks)
{
    const clattn_mask_kind kinds[] = {CLATTN_MASK_NONE, CLATTN_MASK_BOOL, CLATTN_MASK_FLOAT};
    for (int causal = 0; causal < 2; causal++)
        for (int kpm = 0; kpm < 2; kpm++)
            for (int m = 0; m < 3; m++)
                both(&(shape){3, 45, 0, 2, 8, 16, causal, kpm, kinds[m], 0}, 600 + causal * 10 + kpm * 5 + m);
}

Test(fused, dropout)
{
    both(&(shape){2, 61, 0, 3, 8, 8, 0, 0, CLATTN_MASK_NONE, 0.3f}, 700);
    both(&(shape){2, 130, 0, 2, 64, 64, 1, 1, CLATTN_MASK_BOOL, 0.1f}, 701);
    both(&(shape){1, 17, 33, 2, 3, 5, 0, 1, CLATTN_MASK_FLOAT, 0.5f}, 702);
}

/* ---------------------------------------------------------------- long sequences, float64 rows */

typedef struct longcase {
    size_t T, E, H, d;
    float *x, *wq, *wk, *wv, *bq, *bk, *bv, *wo, *bo;
    uint8_t *kpm;
    double *K, *V; /* (T, H*d) float64 projections of every token */
} longcase;

static void long_make(longcase *c, size_t T, int kpm, uint64_t seed)
{
    tu_rng r = {seed};
    memset(c, 0, sizeof *c);
    c->T = T, c->E = 128, c->H = 2, c->d = 64;
    const size_t E = c->E, HD = c->H * c->d;
    const float s = 1.0f / sqrtf((float)E);
    c->x = tu_random(&r, T * E, -1, 1);
    c->wq = tu_random(&r, HD * E, -s, s), c->wk = tu_random(&r, HD * E, -s, s), c->wv = tu_random(&r, HD * E, -s, s);
    c->bq = tu_random(&r, HD, -0.2f, 0.2f), c->bk = tu_random(&r, HD, -0.2f, 0.2f), c->bv = tu_random(&r, HD, -0.2f, 0.2f);
    c->wo = tu_random(&r, E * HD, -0.1f, 0.1f), c->bo = tu_random(&r, E, -0.2f, 0.2f);
    /* scores spread over a few units: softmax neither flat nor one-hot */
    for (size_t i = 0; i < HD * E; i++) c->wq[i] *= 4.0f;
    if (kpm) {
        c->kpm = malloc(T);
        for (size_t j = 0; j < T; j++) c->kpm[j] = tu_next(&r) % 3 == 0;
    }
    c->K = malloc(T * HD * sizeof *c->K);
    c->V = malloc(T * HD * sizeof *c->V);
    cr_assert(c->K && c->V);
    for (size_t t = 0; t < T; t++)
        for (size_t o = 0; o < HD; o++) {
            double k = c->bk[o], v = c->bv[o];
            for (size_t e = 0; e < E; e++) {
                k += (double)c->x[t * E + e] * c->wk[o * E + e];
                v += (double)c->x[t * E + e] * c->wv[o * E + e];
            }
            c->K[t * HD + o] = k, c->V[t * HD + o] = v;
        }
}

static void long_free(longcase *c)
{
    free(c->x); free(c->wq); free(c->wk); free(c->wv); free(c->bq); free(c->bk); free(c->bv); free(c->wo);
    free(c->bo); free(c->kpm); free(c->K); free(c->V);
}

/* Output row i in float64: q = x_i Wq^T + bq; per head softmax over the visible keys of
 * (q . k_j) / sqrt(d); context; out = context Wo^T + bo. */
static void long_row(const longcase *c, size_t i, int causal, double *out)
{
    const size_t T = c->T, E = c->E, H = c->H, dd = c->d, HD = H * dd;
    double q[256], ctx[256];
    double *s = malloc(T * sizeof *s);
    for (size_t o = 0; o < HD; o++) {
        q[o] = c->bq[o];
        for (size_t e = 0; e < E; e++) q[o] += (double)c->x[i * E + e] * c->wq[o * E + e];
    }
    for (size_t h = 0; h < H; h++) {
        double m = -INFINITY;
        for (size_t j = 0; j < T; j++) {
            int hidden = (causal && j > i) || (c->kpm && c->kpm[j]);
            double v = 0;
            for (size_t k = 0; k < dd; k++) v += q[h * dd + k] * c->K[j * HD + h * dd + k];
            s[j] = hidden ? -INFINITY : v / sqrt((double)dd);
            if (s[j] > m) m = s[j];
        }
        double sum = 0;
        for (size_t j = 0; j < T; j++) sum += s[j] = m == -INFINITY ? 0 : exp(s[j] - m);
        for (size_t k = 0; k < dd; k++) {
            double acc = 0;
            for (size_t j = 0; j < T; j++)
                if (s[j] != 0) acc += s[j] * c->V[j * HD + h * dd + k];
            ctx[h * dd + k] = sum > 0 ? acc / sum : 0;
        }
    }
    for (size_t e = 0; e < E; e++) {
        out[e] = c->bo[e];
        for (size_t o = 0; o < HD; o++) out[e] += ctx[o] * c->wo[e * HD + o];
    }
    free(s);
}

static void long_check(size_t T, int causal, int kpm, clattn_algorithm alg)
{
    longcase c;
    long_make(&c, T, kpm, 9000 + T + (uint64_t)causal);
    clattn_attention_desc d = {.batch = 1, .seq_q = T, .embed = c.E, .heads = c.H, .head_dim_qk = c.d,
                               .out_dim = c.E, .causal = causal, .key_padding_mask = kpm, .algorithm = alg};
    clattn_attention_weights w = {.w_query = c.wq, .w_key = c.wk, .w_value = c.wv, .b_query = c.bq, .b_key = c.bk,
                                  .b_value = c.bv, .w_out = c.wo, .b_out = c.bo};
    clattn_device *cl = tu_open_opencl();
    clattn_plan *plan = NULL;
    clattn_status st = tu_plan_create(cl, &d, &w, &plan);
    char what[64];
    snprintf(what, sizeof what, "T=%zu %s", T, clattn_algorithm_name(alg));
    if (tu_refused_by_device(cl, st, what)) { /* a driver's loop limit (llvmpipe: the fused cores at T = 8192) */
        clattn_device_free(cl);
        long_free(&c);
        return;
    }
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "T=%zu %s: %s: %s", T, clattn_algorithm_name(alg),
                 clattn_status_string(st), clattn_last_error());
    cr_assert_eq(clattn_plan_algorithm(plan), alg, "T=%zu: the plan runs %s", T,
                 clattn_algorithm_name(clattn_plan_algorithm(plan)));
    float *out = tu_poisoned(T * c.E);
    clattn_attention_args a = {.x = c.x, .key_padding_mask = c.kpm, .out = out};
    st = tu_plan_execute(plan, &a);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "T=%zu %s: %s: %s", T, clattn_algorithm_name(alg),
                 clattn_status_string(st), clattn_last_error());
    /* every element was written (no NaN poison left: the inputs are finite) */
    for (size_t i = 0; i < T * c.E; i++) cr_assert(isfinite(out[i]), "T=%zu: out[%zu] = %g", T, i, out[i]);
    /* sampled rows: the first (sees key 0 only when causal), the last, and 14 spread between */
    size_t rows[16] = {0, 1, T - 1, T / 2, T / 3, 2 * T / 3, 4095, 4096, 8191 % T, T - 2};
    tu_rng r = {T};
    for (int k = 10; k < 16; k++) rows[k] = tu_next(&r) % T;
    /* every sampled element checked; the worst (error over its tolerance) named, and logged when it passes */
    double want[128], worst = -1, worst_got = 0, worst_want = 0;
    size_t worst_i = 0, worst_e = 0;
    for (int k = 0; k < 16; k++) {
        const size_t i = rows[k] % T;
        long_row(&c, i, causal, want);
        for (size_t e = 0; e < c.E; e++) {
            const double got = out[i * c.E + e], ratio = fabs(got - want[e]) / (TU_ATOL + TU_RTOL * fabs(want[e]));
            if (!isnan(worst) && !(ratio <= worst)) worst = ratio, worst_i = i, worst_e = e, worst_got = got, worst_want = want[e];
        }
    }
    cr_log_info("T=%zu %s causal=%d on %s: worst error %.3g of the tolerance (row %zu column %zu)", T,
                clattn_algorithm_name(alg), causal, clattn_plan_core(plan), worst, worst_i, worst_e);
    cr_assert(worst <= 1, "T=%zu %s causal=%d row %zu column %zu: got %.9g, float64 %.9g (%.3g of the tolerance)", T,
              clattn_algorithm_name(alg), causal, worst_i, worst_e, worst_got, worst_want, worst);
    clattn_plan_free(plan);
    clattn_device_free(cl);
    free(out);
    long_free(&c);
}

Test(long, t8192_fused, .timeout = 900) { long_check(8192, 0, 1, CLATTN_ALGORITHM_FUSED); }
Test(long, t8192_unfused, .timeout = 900) { long_check(8192, 1, 0, CLATTN_ALGORITHM_UNFUSED); }
Test(long, t32768_causal_fused, .timeout = 1200) { long_check(32768, 1, 0, CLATTN_ALGORITHM_FUSED); }
/* The case that once gave every row wrong without an error (a 4 GiB score matrix per head): now in
 * blocks of query rows within one allocation, every CLBlast call within its index range. */
Test(long, t32768_causal_unfused, .timeout = 1800) { long_check(32768, 1, 0, CLATTN_ALGORITHM_UNFUSED); }
