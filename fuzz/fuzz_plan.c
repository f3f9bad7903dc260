/* fuzz_plan.c: libFuzzer harness for plan creation and execution on the `ref` device.
 *
 * The input bytes decode into a clattn_attention_desc (dimensions mostly small, sometimes
 * 0, huge or odd; flags and enums sometimes out of range; scale and dropout sometimes
 * NaN, Inf, negative or >= 1) and a set of weight pointers with their element counts. Every
 * weight pointer given points to a heap block of exactly its count, mostly the size the
 * description implies and sometimes a few elements more or fewer, or anything (so
 * AddressSanitizer catches any read past what the caller gave); a weight whose size would pass
 * FUZZ_MAX_WEIGHT floats is left out (NULL), which the library must then reject or treat as
 * absent. A plan is made only when every count is the one the description needs. Then:
 *   - a failed clattn_plan_create returns one of clattn's validation statuses, leaves
 *     *plan NULL and says why in clattn_last_error();
 *   - a created plan's resolved description satisfies every documented constraint;
 *   - when its buffers are small, the plan runs once on random finite inputs (masks
 *     when the description declares them) and must succeed with finite outputs, attention
 *     weights in [0, 1/(1-p)], each row summing to 1 or (fully masked) 0 without dropout;
 *     in "non-finite" mode some inputs are NaN/Inf and only the absence of crashes counts;
 *   - calls with a missing required argument fail with CLATTN_STATUS_INVALID_ARGUMENT,
 *     and calls with an array whose count is not the plan's (the array exactly that long)
 *     with CLATTN_STATUS_SHAPE_MISMATCH, and leave the outputs untouched.
 * A violated property aborts (a crash for libFuzzer). The byte layout is in decode(). */
#include "clattn.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_WEIGHT ((size_t)1 << 16)  /* floats per weight matrix */
#define FUZZ_MAX_ELEMS ((size_t)1 << 16)   /* floats per input/output array to execute */
#define FUZZ_MAX_WORK ((size_t)1 << 22)    /* multiply-adds of one reference execution */

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz_plan: property violated: %s (%s:%d); last error: %s\n", #cond, \
                    __FILE__, __LINE__, clattn_last_error());                                  \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

/* ---- reading the input */

typedef struct reader { const uint8_t *p; size_t n; } reader;

static uint8_t u8(reader *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static uint32_t u32(reader *r)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)u8(r) << (8 * i);
    return v;
}

static uint64_t u64(reader *r) { return (uint64_t)u32(r) | (uint64_t)u32(r) << 32; }

static float bits_to_float(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* A dimension: usually 0..8, sometimes 0..64, sometimes a value near a limit. */
static size_t dim(reader *r)
{
    static const size_t special[16] = {
        0, 1, 2, 3, 255, 256, 65535, 65536, 0x7FFFFFFFu, 0xFFFFFFFFu, (size_t)1 << 32, ((size_t)1 << 32) + 1,
        (size_t)1 << 62, SIZE_MAX / 2 + 1, SIZE_MAX - 1, SIZE_MAX};
    uint8_t b = u8(r);
    if (b < 0xC0) return b % 9;
    if (b < 0xF0) return b % 65;
    return special[b & 15];
}

static float scale_value(reader *r)
{
    uint8_t b = u8(r);
    if (b < 0x80) return 0.0f; /* the default */
    if (b < 0xF0) return (float)(int8_t)u8(r) / 16.0f;
    const float special[16] = {NAN, -NAN, INFINITY, -INFINITY, -0.0f, FLT_MIN, 1e-45f, FLT_MAX,
                               -FLT_MAX, 1e-30f, 1e30f, 1.0f, -1.0f, 0.125f, 1e-8f, 0.0f};
    if ((b & 15) == 15) return bits_to_float(u32(r));
    return special[b & 15];
}

static float dropout_value(reader *r)
{
    uint8_t b = u8(r);
    if (b < 0xA0) return 0.0f;
    if (b < 0xF0) return (float)u8(r) / 256.0f; /* [0, 1) */
    const float special[16] = {1.0f, 1.5f, -0.1f, NAN, INFINITY, -INFINITY, -0.0f, 0.99999994f,
                               0.5f, 1e-38f, -1e-38f, 2.0f, 0.9999f, 1e-7f, 1.0000001f, 0.0f};
    if ((b & 15) == 15) return bits_to_float(u32(r));
    return special[b & 15];
}

/* ---- arithmetic that reports overflow */

static int mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return 1;
    *out = a * b;
    return 0;
}

static int mul3(size_t a, size_t b, size_t c, size_t *out)
{
    size_t t;
    return mul(a, b, &t) || mul(t, c, out);
}

static int mul4(size_t a, size_t b, size_t c, size_t d, size_t *out)
{
    size_t t;
    return mul3(a, b, c, &t) || mul(t, d, out);
}

/* ---- a deterministic generator for the data */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next(s) >> 40) * (1.0 / 16777216.0));
}

static float *random_floats(uint64_t *s, size_t n, float lo, float hi)
{
    float *a = malloc((n ? n : 1) * sizeof *a);
    CHECK(a);
    for (size_t i = 0; i < n; i++) a[i] = rng_uniform(s, lo, hi);
    return a;
}

/* ---- the decoded case */

enum { W_QUERY, W_KEY, W_VALUE, B_QUERY, B_KEY, B_VALUE, W_OUT, B_OUT, N_W };

typedef struct fcase {
    clattn_attention_desc d;
    const float *w[N_W];
    float *owned[N_W];
    size_t count[N_W];    /* each weight's element count: its block's length */
    int counts_right;     /* every count given is the one the description implies */
    int want_attn, profiling, reseed, nonfinite, inf_mask;
    uint64_t new_seed, data_seed;
} fcase;

/* Byte layout (missing bytes read as 0):
 *   9 dims (batch, seq_q, seq_kv, embed, kv_embed, heads, head_dim_qk, head_dim_v, out_dim)
 *   flags: bit0 cross, bit1 causal, bit2 key_padding_mask, bits3-4 attn_mask (3 = invalid),
 *          bit5 layout RAW, bits6-7 == 3: then 4 more bytes give raw (int8) cross, causal,
 *          key_padding_mask and (int8) attn_mask kind, and 1 byte a raw layout
 *   scale, dropout (see scale_value, dropout_value), seed (8 bytes)
 *   weights: bits0-1: 0 none, 1-2 all of Q/K/V, 3: bits2-4 pick Q, K, V one by one;
 *            bits5-7: biases q, k, v
 *   out: bit0 w_out, bit1 b_out
 *   exec: bit0 attn wanted, bit1 profiling, bit2 set a new seed (8 more bytes),
 *         bit3 -inf entries in a float mask, bit4 non-finite inputs
 *   counts: per weight 2 bits (0-1: the implied count, 2: a few off, 3: anything up to twice it),
 *           then 1 byte per weight of the offset
 *   the rest: seed of the data generator */
static void decode(reader *r, fcase *c)
{
    memset(c, 0, sizeof *c);
    clattn_attention_desc *d = &c->d;
    d->batch = dim(r);
    d->seq_q = dim(r);
    d->seq_kv = dim(r);
    d->embed = dim(r);
    d->kv_embed = dim(r);
    d->heads = dim(r);
    d->head_dim_qk = dim(r);
    d->head_dim_v = dim(r);
    d->out_dim = dim(r);
    uint8_t f = u8(r);
    d->cross = f & 1;
    d->causal = (f >> 1) & 1;
    d->key_padding_mask = (f >> 2) & 1;
    d->attn_mask = (clattn_mask_kind)((f >> 3) & 3);
    d->layout = (f >> 5) & 1 ? CLATTN_LAYOUT_RAW : CLATTN_LAYOUT_LINEAR;
    if ((f >> 6) == 3) {
        d->cross = (int8_t)u8(r);
        d->causal = (int8_t)u8(r);
        d->key_padding_mask = (int8_t)u8(r);
        d->attn_mask = (clattn_mask_kind)(int8_t)u8(r);
        d->layout = (clattn_layout)(int8_t)u8(r);
    }
    d->scale = scale_value(r);
    d->dropout = dropout_value(r);
    d->seed = u64(r);
    uint8_t wm = u8(r), om = u8(r), ex = u8(r);
    int q = 0, k = 0, v = 0;
    switch (wm & 3) {
    case 0: break;
    case 1: case 2: q = k = v = 1; break;
    default: q = (wm >> 2) & 1, k = (wm >> 3) & 1, v = (wm >> 4) & 1;
    }
    int has[N_W] = {q, k, v, (wm >> 5) & 1, (wm >> 6) & 1, (wm >> 7) & 1, om & 1, (om >> 1) & 1};
    c->want_attn = ex & 1;
    c->profiling = (ex >> 1) & 1;
    c->reseed = (ex >> 2) & 1;
    c->inf_mask = (ex >> 3) & 1;
    c->nonfinite = (ex >> 4) & 1;
    if (c->reseed) c->new_seed = u64(r);
    const uint16_t how = (uint16_t)(u8(r) | u8(r) << 8);
    uint8_t off[N_W];
    for (int i = 0; i < N_W; i++) off[i] = u8(r);
    c->data_seed = u64(r);
    for (size_t i = 0; i < r->n; i++) c->data_seed = c->data_seed * 31 + r->p[i];

    /* Sizes of the weights as the description implies them (the library's defaults:
     * self-attention Tk = Tq, Ekv = E; cross Ekv = E when 0; dv = dk when 0; no Q/K/V
     * weights: dk = dv = E/H). Where the description is invalid these are guesses, and
     * the library must reject it before reading a weight. */
    const size_t E = d->embed, H = d->heads;
    const size_t Ekv = d->cross == 1 && d->kv_embed ? d->kv_embed : E;
    const int all_qkv = q && k && v;
    size_t dk = d->head_dim_qk, dv = d->head_dim_v ? d->head_dim_v : dk;
    if (!all_qkv) dk = dv = H ? E / H : 0;
    size_t need[N_W];
    int over[N_W] = {0};
    over[W_QUERY] = mul3(H, dk, E, &need[W_QUERY]);
    over[W_KEY] = mul3(H, dk, Ekv, &need[W_KEY]);
    over[W_VALUE] = mul3(H, dv, Ekv, &need[W_VALUE]);
    over[B_QUERY] = mul(H, dk, &need[B_QUERY]);
    over[B_KEY] = mul(H, dk, &need[B_KEY]);
    over[B_VALUE] = mul(H, dv, &need[B_VALUE]);
    over[W_OUT] = mul3(d->out_dim, H, dv, &need[W_OUT]);
    need[B_OUT] = d->out_dim;
    uint64_t s = c->data_seed ^ 0x5DEECE66Dull;
    c->counts_right = 1;
    for (int i = 0; i < N_W; i++) {
        if (!has[i] || over[i] || need[i] > FUZZ_MAX_WEIGHT) continue;
        size_t n = need[i];
        switch ((how >> (2 * i)) & 3) {
        case 2: n = need[i] + (off[i] % 5) - 2; break;              /* a few off (or right) */
        case 3: n = need[i] ? off[i] * need[i] / 128 : off[i]; break; /* anything up to twice it */
        default: break;
        }
        if (n > FUZZ_MAX_WEIGHT || n + 2 < n) continue;
        c->counts_right &= n == need[i];
        c->owned[i] = random_floats(&s, n, -1.0f, 1.0f);
        c->w[i] = c->owned[i];
        c->count[i] = n;
    }
}

static void fcase_free(fcase *c)
{
    for (int i = 0; i < N_W; i++) free(c->owned[i]);
}

/* ---- properties */

static void check_failure(clattn_status st, const clattn_plan *plan)
{
    CHECK(st == CLATTN_STATUS_INVALID_ARGUMENT || st == CLATTN_STATUS_SHAPE_MISMATCH ||
          st == CLATTN_STATUS_SIZE_OVERFLOW || st == CLATTN_STATUS_OUT_OF_HOST_MEMORY);
    CHECK(plan == NULL);
    CHECK(clattn_last_error()[0] != '\0');
}

/* The resolved description obeys the README's rules. */
static void check_resolved(const clattn_attention_desc *in, const clattn_attention_desc *d, const fcase *c)
{
    CHECK(d->batch == in->batch && d->seq_q == in->seq_q && d->embed == in->embed && d->heads == in->heads);
    CHECK(d->batch >= 1 && d->seq_q >= 1 && d->seq_kv >= 1 && d->embed >= 1 && d->kv_embed >= 1);
    CHECK(d->heads >= 1 && d->head_dim_qk >= 1 && d->head_dim_v >= 1);
    CHECK(d->cross == 0 || d->cross == 1);
    CHECK(d->causal == 0 || d->causal == 1);
    CHECK(d->key_padding_mask == 0 || d->key_padding_mask == 1);
    CHECK(d->attn_mask == CLATTN_MASK_NONE || d->attn_mask == CLATTN_MASK_BOOL || d->attn_mask == CLATTN_MASK_FLOAT);
    CHECK(d->layout == CLATTN_LAYOUT_LINEAR || d->layout == CLATTN_LAYOUT_RAW);
    if (!d->cross) CHECK(d->seq_kv == d->seq_q && d->kv_embed == d->embed);
    CHECK(isfinite(d->scale) && d->scale != 0.0f);
    if (in->scale != 0.0f) CHECK(d->scale == in->scale);
    CHECK(d->dropout >= 0.0f && d->dropout < 1.0f);
    const int has_qkv = c->w[W_QUERY] != NULL;
    if (!has_qkv) CHECK(d->head_dim_qk * d->heads == d->embed && d->head_dim_v == d->head_dim_qk);
    CHECK((c->w[W_OUT] != NULL) == (d->out_dim != 0));
    /* every buffer of the plan has a size that fits size_t, every dimension 32 bits */
    size_t n;
    CHECK(!mul4(d->batch, d->heads, d->seq_q, d->seq_kv, &n) && !mul(n, 4, &n));
    CHECK(!mul4(d->batch, d->seq_q, d->embed, 4, &n));
    CHECK(!mul4(d->batch, d->seq_kv, d->kv_embed, 4, &n));
    CHECK(!mul4(d->batch, d->seq_q, d->heads, d->head_dim_v, &n) && !mul(n, 4, &n));
    const size_t lim = 0xFFFFFFFFu;
    CHECK(d->batch <= lim && d->seq_q <= lim && d->seq_kv <= lim && d->embed <= lim && d->kv_embed <= lim);
    CHECK(d->heads <= lim && d->head_dim_qk <= lim && d->head_dim_v <= lim && d->out_dim <= lim);
}

static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

static size_t sat_mul(size_t a, size_t b)
{
    size_t r;
    return mul(a, b, &r) ? SIZE_MAX : r;
}

/* Run the plan once when it is small enough; check the outputs. */
static void execute(clattn_plan *plan, const fcase *c)
{
    clattn_attention_desc d;
    CHECK(clattn_plan_desc(plan, &d) == CLATTN_STATUS_SUCCESS);
    const size_t B = d.batch, Tq = d.seq_q, Tk = d.seq_kv, E = d.embed, Ekv = d.kv_embed, H = d.heads;
    const size_t dk = d.head_dim_qk, dv = d.head_dim_v, W = clattn_plan_out_width(plan);
    CHECK(W == (d.out_dim ? d.out_dim : H * dv));
    const size_t n_x = sat_mul(sat_mul(B, Tq), E), n_kv = sat_mul(sat_mul(B, Tk), Ekv);
    const size_t n_out = sat_mul(sat_mul(B, Tq), W), n_attn = sat_mul(sat_mul(B, H), sat_mul(Tq, Tk));
    const size_t n_q = sat_mul(sat_mul(B, Tq), sat_mul(H, dk)), n_v = sat_mul(sat_mul(B, Tk), sat_mul(H, dv));
    size_t work = sat_mul(n_q, E);                                           /* Q projection */
    work = sat_add(work, sat_mul(sat_mul(sat_mul(B, Tk), Ekv), sat_mul(H, dk + dv))); /* K, V */
    work = sat_add(work, sat_mul(n_attn, dk + dv));                          /* scores, context */
    work = sat_add(work, sat_mul(sat_mul(B, Tq), sat_mul(sat_mul(H, dv), W))); /* output projection */
    if (n_x > FUZZ_MAX_ELEMS || n_kv > FUZZ_MAX_ELEMS || n_out > FUZZ_MAX_ELEMS || n_attn > FUZZ_MAX_ELEMS ||
        n_q > FUZZ_MAX_ELEMS || n_v > FUZZ_MAX_ELEMS || work > FUZZ_MAX_WORK)
        return;

    uint64_t s = c->data_seed;
    float *x = random_floats(&s, n_x, -1.0f, 1.0f);
    float *kv = d.cross ? random_floats(&s, n_kv, -1.0f, 1.0f) : NULL;
    uint8_t *kpm = NULL;
    void *mask = NULL;
    if (d.key_padding_mask) {
        kpm = malloc(B * Tk);
        CHECK(kpm);
        for (size_t i = 0; i < B * Tk; i++) kpm[i] = rng_next(&s) % 4 == 0 ? (uint8_t)(1 + rng_next(&s) % 255) : 0;
    }
    if (d.attn_mask == CLATTN_MASK_BOOL) {
        uint8_t *m = malloc(Tq * Tk);
        CHECK(m);
        for (size_t i = 0; i < Tq * Tk; i++) m[i] = rng_next(&s) % 4 == 0 ? (uint8_t)(1 + rng_next(&s) % 255) : 0;
        mask = m;
    } else if (d.attn_mask == CLATTN_MASK_FLOAT) {
        float *m = random_floats(&s, Tq * Tk, -2.0f, 2.0f);
        if (c->inf_mask)
            for (size_t i = 0; i < Tq * Tk; i++)
                if (rng_next(&s) % 3 == 0) m[i] = -INFINITY;
        mask = m;
    }
    if (c->nonfinite) {
        static const float bad[4] = {NAN, INFINITY, -INFINITY, FLT_MAX};
        for (int k = 0; k < 3; k++) {
            x[rng_next(&s) % n_x] = bad[rng_next(&s) % 4];
            if (kv) kv[rng_next(&s) % n_kv] = bad[rng_next(&s) % 4];
        }
    }
    float *out = malloc((n_out ? n_out : 1) * sizeof *out);
    float *attn = c->want_attn ? malloc((n_attn ? n_attn : 1) * sizeof *attn) : NULL;
    CHECK(out && (attn || !c->want_attn));
    for (size_t i = 0; i < n_out; i++) out[i] = -7.0f;
    for (size_t i = 0; i < n_attn && attn; i++) attn[i] = -7.0f;

    /* a missing required argument: rejected, outputs untouched */
    clattn_attention_args a = {.x = x, .kv = kv, .key_padding_mask = kpm, .attn_mask = mask, .out = out,
                               .attn = attn, .x_count = n_x, .kv_count = kv ? n_kv : 0,
                               .key_padding_mask_count = kpm ? B * Tk : 0, .attn_mask_count = mask ? Tq * Tk : 0,
                               .out_count = n_out, .attn_count = attn ? n_attn : 0};
    clattn_attention_args bad = a;
    const int which = (int)(rng_next(&s) % 5);
    if (which == 0) bad.x = NULL;
    if (which == 1) bad.out = NULL;
    if (which == 2) bad.kv = NULL;
    if (which == 3) bad.key_padding_mask = NULL;
    if (which == 4) bad.attn_mask = NULL;
    const int required = which < 2 || (which == 2 && d.cross) || (which == 3 && d.key_padding_mask) ||
                         (which == 4 && d.attn_mask != CLATTN_MASK_NONE);
    if (required) {
        CHECK(clattn_plan_execute(plan, &bad) == CLATTN_STATUS_INVALID_ARGUMENT);
        for (size_t i = 0; i < n_out; i++) CHECK(out[i] == -7.0f);
        for (size_t i = 0; i < n_attn && attn; i++) CHECK(attn[i] == -7.0f);
    }
    /* an array one element short or long, exactly that long, with that count: refused, nothing read or
     * written past it (ASan), the outputs untouched */
    {
        const int pick = (int)(rng_next(&s) % 2);
        const size_t n_short = pick ? n_x - 1 : n_x + 1;
        float *xs = random_floats(&s, n_short, -1.0f, 1.0f);
        clattn_attention_args wrong = a;
        wrong.x = xs, wrong.x_count = n_short;
        CHECK(clattn_plan_execute(plan, &wrong) == CLATTN_STATUS_SHAPE_MISMATCH);
        free(xs);
        float *os = malloc((n_out + 1) * sizeof *os);
        CHECK(os);
        for (size_t i = 0; i <= n_out; i++) os[i] = -7.0f;
        wrong = a;
        wrong.out = os, wrong.out_count = pick ? n_out - 1 : n_out + 1;
        CHECK(clattn_plan_execute(plan, &wrong) == CLATTN_STATUS_SHAPE_MISMATCH);
        for (size_t i = 0; i <= n_out; i++) CHECK(os[i] == -7.0f);
        free(os);
        for (size_t i = 0; i < n_out; i++) CHECK(out[i] == -7.0f);
    }

    if (c->reseed) CHECK(clattn_plan_set_seed(plan, c->new_seed) == CLATTN_STATUS_SUCCESS);
    CHECK(clattn_plan_set_profiling(plan, c->profiling) == CLATTN_STATUS_SUCCESS);
    clattn_status st = clattn_plan_execute(plan, &a);
    CHECK(st == CLATTN_STATUS_SUCCESS);
    double ms[CLATTN_STAGE_COUNT];
    CHECK(clattn_plan_stage_times(plan, ms) == CLATTN_STATUS_SUCCESS);
    for (int i = 0; i < CLATTN_STAGE_COUNT; i++) CHECK(ms[i] >= 0.0 && (c->profiling || ms[i] == 0.0));

    if (!c->nonfinite) {
        /* finite inputs and weights in [-1, 1], finite scale: finite outputs */
        for (size_t i = 0; i < n_out; i++) CHECK(isfinite(out[i]));
        if (attn) {
            const double top = 1.0 / (1.0 - (double)d.dropout) * (1.0 + 1e-5);
            for (size_t row = 0; row < B * H * Tq; row++) {
                double sum = 0.0;
                for (size_t j = 0; j < Tk; j++) {
                    float w = attn[row * Tk + j];
                    CHECK(isfinite(w) && w >= 0.0f && w <= top);
                    sum += w;
                }
                if (d.dropout == 0.0f) CHECK(sum == 0.0 || fabs(sum - 1.0) <= 1e-4);
            }
        }
    }
    clattn_attention_buffers bufs;
    memset(&bufs, 0, sizeof bufs);
    CHECK(clattn_plan_execute_buffers(plan, &bufs, 0, NULL, NULL) == CLATTN_STATUS_UNSUPPORTED);
    free(x); free(kv); free(kpm); free(mask); free(out); free(attn);
}

static clattn_device *ref_device(void)
{
    static clattn_device *dev;
    if (!dev) CHECK(clattn_device_open("ref", &dev) == CLATTN_STATUS_SUCCESS); /* lives until exit */
    return dev;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    fcase c;
    decode(&r, &c);
    clattn_attention_weights w = {c.w[W_QUERY], c.w[W_KEY], c.w[W_VALUE], c.w[B_QUERY], c.w[B_KEY], c.w[B_VALUE],
                                  c.w[W_OUT], c.w[B_OUT], c.count[W_QUERY], c.count[W_KEY], c.count[W_VALUE],
                                  c.count[B_QUERY], c.count[B_KEY], c.count[B_VALUE], c.count[W_OUT],
                                  c.count[B_OUT]};
    const int no_weights = memcmp(&w, &(clattn_attention_weights){0}, sizeof w) == 0;
    clattn_plan *plan = (clattn_plan *)(uintptr_t)1;
    /* weights NULL and all-NULL weights are the same module */
    clattn_status st = clattn_plan_create(ref_device(), &c.d, no_weights && (size & 1) ? NULL : &w, &plan);
    if (st != CLATTN_STATUS_SUCCESS) {
        check_failure(st, plan);
    } else {
        CHECK(c.counts_right); /* a plan is made only from counts the description implies */
        clattn_attention_desc d;
        CHECK(clattn_plan_desc(plan, &d) == CLATTN_STATUS_SUCCESS);
        check_resolved(&c.d, &d, &c);
        execute(plan, &c);
        clattn_plan_free(plan);
    }
    fcase_free(&c);
    return 0;
}
