/* test_counts.c: every array comes with its element count (clattn 0.4), and the library checks each one
 * against the description before it reads or writes anything. Each count is made wrong alone (one more, one
 * less) with every other right, on ref and on the OpenCL device: the call is refused with
 * CLATTN_STATUS_SHAPE_MISMATCH naming the field and both numbers, no plan is returned, outputs keep their
 * poison, and a KV cache keeps its lengths. A count without its array, and a caller of 0.3 who gives no
 * counts, are refused with what to do. These tests call the library directly (not the testutil wrappers,
 * which fill the counts in). */
#include "testutil.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clattn_device *open_dev(int k) { return k ? tu_open_opencl() : tu_open_ref(); }

static int all_nan(const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isnan(a[i])) return 0;
    return 1;
}

/* the message names the field and both numbers */
static void expect_named(const char *field, size_t got, size_t want)
{
    char g[32], w[32];
    snprintf(g, sizeof g, "%zu", got);
    snprintf(w, sizeof w, "%zu", want);
    const char *m = clattn_last_error();
    cr_assert(strstr(m, field) && strstr(m, g) && strstr(m, w), "expected %s, %s and %s in: %s", field, g, w, m);
}

/* ---- attention: a description where every array's count differs from the others' */
enum { B = 2, TQ = 3, TK = 5, E = 7, EKV = 6, H = 4, HK = 2, DK = 3, DV = 5, EO = 9 };

static clattn_attention_desc full_desc(void)
{
    return (clattn_attention_desc){.batch = B, .seq_q = TQ, .seq_kv = TK, .embed = E, .kv_embed = EKV, .heads = H,
                                   .kv_heads = HK, .head_dim_qk = DK, .head_dim_v = DV, .out_dim = EO, .cross = 1,
                                   .key_padding_mask = 1, .attn_mask = CLATTN_MASK_FLOAT, .need_weights = 1,
                                   .algorithm = CLATTN_ALGORITHM_UNFUSED};
}

typedef struct weights8 {
    float *a[8];
    clattn_attention_weights w;
    size_t want[8];
} weights8;

static const char *const weight_names[8] = {"w_query", "w_key", "w_value", "b_query",
                                            "b_key", "b_value", "w_out", "b_out"};

static size_t *weight_count(clattn_attention_weights *w, int i)
{
    size_t *c[8] = {&w->w_query_count, &w->w_key_count, &w->w_value_count, &w->b_query_count,
                    &w->b_key_count, &w->b_value_count, &w->w_out_count, &w->b_out_count};
    return c[i];
}

/* each array allocated 8 elements longer than it is, so a count one too large stays inside it */
static void weights8_init(weights8 *s, tu_rng *r)
{
    const size_t want[8] = {H * DK * E, HK * DK * EKV, HK * DV * EKV, H * DK, HK * DK, HK * DV, EO * H * DV, EO};
    for (int i = 0; i < 8; i++) {
        s->want[i] = want[i];
        s->a[i] = tu_random(r, want[i] + 8, -0.5f, 0.5f);
    }
    s->w = (clattn_attention_weights){.w_query = s->a[0], .w_key = s->a[1], .w_value = s->a[2], .b_query = s->a[3],
                                      .b_key = s->a[4], .b_value = s->a[5], .w_out = s->a[6], .b_out = s->a[7]};
    for (int i = 0; i < 8; i++) *weight_count(&s->w, i) = want[i];
}

static void weights8_free(weights8 *s)
{
    for (int i = 0; i < 8; i++) free(s->a[i]);
}

Test(counts, each_weight_count_wrong_alone)
{
    tu_rng r = {101};
    weights8 s;
    weights8_init(&s, &r);
    const clattn_attention_desc d = full_desc();
    for (int k = 0; k < 2; k++) {
        clattn_device *dev = open_dev(k);
        for (int i = 0; i < 8; i++)
            for (int delta = -1; delta <= 1; delta += 2) {
                clattn_attention_weights w = s.w;
                const size_t bad = s.want[i] + (size_t)(ptrdiff_t)delta;
                *weight_count(&w, i) = bad;
                clattn_plan *plan = (clattn_plan *)&r;  /* not NULL: the call must clear it */
                cr_assert_eq(clattn_plan_create(dev, &d, &w, &plan), CLATTN_STATUS_SHAPE_MISMATCH, "%s %+d: %s",
                             weight_names[i], delta, clattn_last_error());
                cr_assert_null(plan);
                char field[32];
                snprintf(field, sizeof field, "weights.%s", weight_names[i]);
                expect_named(field, bad, s.want[i]);
            }
        clattn_plan *plan = NULL;  /* every count right: a plan */
        cr_assert_eq(clattn_plan_create(dev, &d, &s.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_plan_free(plan);
        /* the decode plan checks the same counts */
        clattn_attention_desc dd = {.batch = 1, .seq_q = 2, .embed = E, .heads = H, .kv_heads = HK,
                                    .head_dim_qk = DK, .head_dim_v = DV, .out_dim = EO, .causal = 1};
        clattn_attention_weights w = s.w;
        w.w_key_count = HK * DK * E + 1;  /* self-attention: w_key is (HK*dk, E) */
        w.w_value_count = HK * DV * E;
        clattn_decode_plan *dp = NULL;
        cr_assert_eq(clattn_decode_plan_create(dev, &dd, &w, &dp), CLATTN_STATUS_SHAPE_MISMATCH);
        cr_assert_null(dp);
        expect_named("weights.w_key", HK * DK * E + 1, HK * DK * E);
        clattn_device_free(dev);
    }
    weights8_free(&s);
}

/* The report's case: heads = 5 and head_dim_qk = 16 with 64-row weights. Without counts the plan read 80 rows
 * of a 64-row buffer. */
Test(counts, five_heads_of_sixteen_from_sixty_four_rows)
{
    tu_rng r = {102};
    float *w64 = tu_random(&r, 64 * 64, -0.1f, 0.1f);
    const clattn_attention_desc d = {.batch = 1, .seq_q = 4, .embed = 64, .heads = 5, .head_dim_qk = 16};
    const clattn_attention_weights w = {.w_query = w64, .w_key = w64, .w_value = w64, .w_query_count = 64 * 64,
                                        .w_key_count = 64 * 64, .w_value_count = 64 * 64};
    for (int k = 0; k < 2; k++) {
        clattn_device *dev = open_dev(k);
        clattn_plan *plan = NULL;
        cr_assert_eq(clattn_plan_create(dev, &d, &w, &plan), CLATTN_STATUS_SHAPE_MISMATCH);
        cr_assert_null(plan);
        expect_named("weights.w_query", 4096, 5120);
        clattn_device_free(dev);
    }
    free(w64);
}

Test(counts, count_without_array_and_no_counts_at_all)
{
    tu_rng r = {103};
    weights8 s;
    weights8_init(&s, &r);
    const clattn_attention_desc d = full_desc();
    clattn_device *dev = tu_open_ref();
    clattn_attention_weights w = s.w;
    w.b_query = NULL;  /* a count for an array not given */
    clattn_plan *plan = NULL;
    cr_assert_eq(clattn_plan_create(dev, &d, &w, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "weights.b_query_count is 12, but weights.b_query is NULL"), "%s",
              clattn_last_error());
    /* a caller of clattn 0.3: arrays without counts */
    w = (clattn_attention_weights){.w_query = s.a[0], .w_key = s.a[1], .w_value = s.a[2]};
    clattn_attention_desc d03 = d;
    d03.out_dim = 0;  /* no w_out */
    cr_assert_eq(clattn_plan_create(dev, &d03, &w, &plan), CLATTN_STATUS_SHAPE_MISMATCH, "%s", clattn_last_error());
    cr_assert(strstr(clattn_last_error(), "give every array's element count"), "%s", clattn_last_error());
    cr_assert_null(plan);
    clattn_device_free(dev);
    weights8_free(&s);
}

static const char *const arg_names[6] = {"x", "kv", "key_padding_mask", "attn_mask", "out", "attn"};

static size_t *arg_count(clattn_attention_args *a, int i)
{
    size_t *c[6] = {&a->x_count, &a->kv_count, &a->key_padding_mask_count, &a->attn_mask_count, &a->out_count,
                    &a->attn_count};
    return c[i];
}

Test(counts, each_argument_count_wrong_alone)
{
    tu_rng r = {104};
    weights8 s;
    weights8_init(&s, &r);
    const clattn_attention_desc d = full_desc();
    const size_t want[6] = {B * TQ * E, B * TK * EKV, B * TK, TQ * TK, B * TQ * EO, B * H * TQ * TK};
    float *x = tu_random(&r, want[0] + 8, -1, 1), *kv = tu_random(&r, want[1] + 8, -1, 1);
    float *mask = tu_random(&r, want[3] + 8, -1, 0);
    uint8_t kpm[B * TK + 8] = {0};
    for (int k = 0; k < 2; k++) {
        clattn_device *dev = open_dev(k);
        clattn_plan *plan = NULL;
        cr_assert_eq(clattn_plan_create(dev, &d, &s.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        float *out = tu_poisoned(want[4] + 8), *attn = tu_poisoned(want[5] + 8);
        clattn_attention_args a = {.x = x, .kv = kv, .key_padding_mask = kpm, .attn_mask = mask, .out = out,
                                   .attn = attn};
        for (int i = 0; i < 6; i++) *arg_count(&a, i) = want[i];
        for (int i = 0; i < 6; i++)
            for (int delta = -1; delta <= 1; delta += 2) {
                clattn_attention_args b = a;
                const size_t bad = want[i] + (size_t)(ptrdiff_t)delta;
                *arg_count(&b, i) = bad;
                cr_assert_eq(clattn_plan_execute(plan, &b), CLATTN_STATUS_SHAPE_MISMATCH, "%s %+d", arg_names[i], delta);
                char field[32];
                snprintf(field, sizeof field, "args.%s", arg_names[i]);
                expect_named(field, bad, want[i]);
                cr_assert(all_nan(out, want[4] + 8) && all_nan(attn, want[5] + 8), "a refused call wrote out or attn");
            }
        /* the report's x of width 65 for a module of width 64 is the same check: x's count says so */
        clattn_attention_args b = a;
        b.attn = NULL;
        cr_assert_eq(clattn_plan_execute(plan, &b), CLATTN_STATUS_INVALID_ARGUMENT, "attn_count without attn");
        cr_assert(strstr(clattn_last_error(), "args.attn_count is"), "%s", clattn_last_error());
        cr_assert(all_nan(out, want[4] + 8));
        cr_assert_eq(clattn_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (size_t i = 0; i < want[4]; i++) cr_assert(isfinite(out[i]), "out[%zu] not written", i);
        cr_assert(all_nan(out + want[4], 8) && all_nan(attn + want[5], 8), "written past the counts");
        clattn_plan_free(plan);
        free(out), free(attn);
        clattn_device_free(dev);
    }
    free(x), free(kv), free(mask);
    weights8_free(&s);
}

/* ---- the encoder layer */
enum { EE = 8, EH = 2, EF = 12, EB = 2, ET = 3 };

Test(counts, encoder_counts)
{
    tu_rng r = {105};
    float *a[16];
    const size_t attn_want[4] = {EE * EE, EE * EE, EE * EE, EE * EE};
    const size_t want[8] = {EE, EE, EF * EE, EF, EE * EF, EE, EE, EE};
    static const char *const names[8] = {"ln1_weight", "ln1_bias", "w_ff1", "b_ff1",
                                         "w_ff2", "b_ff2", "ln2_weight", "ln2_bias"};
    for (int i = 0; i < 4; i++) a[i] = tu_random(&r, attn_want[i] + 8, -0.3f, 0.3f);
    for (int i = 0; i < 8; i++) a[4 + i] = tu_random(&r, want[i] + 8, -0.3f, 0.3f);
    clattn_encoder_desc d = {.attn = {.batch = EB, .seq_q = ET, .embed = EE, .heads = EH, .head_dim_qk = EE / EH,
                                      .out_dim = EE,
                                      .key_padding_mask = 1},
                             .ff_dim = EF};
    clattn_encoder_weights w = {
        .attn = {.w_query = a[0], .w_key = a[1], .w_value = a[2], .w_out = a[3], .w_query_count = EE * EE,
                 .w_key_count = EE * EE, .w_value_count = EE * EE, .w_out_count = EE * EE},
        .ln1_weight = a[4], .ln1_bias = a[5], .w_ff1 = a[6], .b_ff1 = a[7], .w_ff2 = a[8], .b_ff2 = a[9],
        .ln2_weight = a[10], .ln2_bias = a[11]};
    size_t *cnt[8] = {&w.ln1_weight_count, &w.ln1_bias_count, &w.w_ff1_count, &w.b_ff1_count,
                      &w.w_ff2_count, &w.b_ff2_count, &w.ln2_weight_count, &w.ln2_bias_count};
    for (int i = 0; i < 8; i++) *cnt[i] = want[i];
    float *x = tu_random(&r, EB * ET * EE + 8, -1, 1);
    uint8_t kpm[EB * ET + 8] = {0};
    for (int k = 0; k < 2; k++) {
        clattn_device *dev = open_dev(k);
        for (int i = 0; i < 8; i++) {
            const size_t keep = *cnt[i];
            *cnt[i] = want[i] + 1;
            clattn_encoder_plan *p = (clattn_encoder_plan *)&r;
            cr_assert_eq(clattn_encoder_plan_create(dev, &d, &w, &p), CLATTN_STATUS_SHAPE_MISMATCH, "%s: %s", names[i], clattn_last_error());
            cr_assert_null(p);
            char field[32];
            snprintf(field, sizeof field, "weights.%s", names[i]);
            expect_named(field, want[i] + 1, want[i]);
            *cnt[i] = keep;
        }
        w.attn.w_out_count--;  /* the attention's own weights, checked by the layer's attention plan */
        clattn_encoder_plan *p = NULL;
        cr_assert_eq(clattn_encoder_plan_create(dev, &d, &w, &p), CLATTN_STATUS_SHAPE_MISMATCH, "%s", clattn_last_error());
        expect_named("w_out", EE * EE - 1, EE * EE);
        w.attn.w_out_count++;
        cr_assert_eq(clattn_encoder_plan_create(dev, &d, &w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        float *out = tu_poisoned(EB * ET * EE + 8);
        const clattn_encoder_args good = {.x = x, .key_padding_mask = kpm, .out = out, .x_count = EB * ET * EE,
                                          .key_padding_mask_count = EB * ET, .out_count = EB * ET * EE};
        const size_t wants[3] = {EB * ET * EE, EB * ET, EB * ET * EE};
        static const char *const an[3] = {"args.x", "args.key_padding_mask", "args.out"};
        for (int i = 0; i < 3; i++) {
            clattn_encoder_args b = good;
            size_t *c[3] = {&b.x_count, &b.key_padding_mask_count, &b.out_count};
            *c[i] = wants[i] - 1;
            cr_assert_eq(clattn_encoder_plan_execute(p, &b), CLATTN_STATUS_SHAPE_MISMATCH, "%s", an[i]);
            expect_named(an[i], wants[i] - 1, wants[i]);
            cr_assert(all_nan(out, EB * ET * EE + 8), "a refused call wrote out");
        }
        cr_assert_eq(clattn_encoder_plan_execute(p, &good), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (size_t i = 0; i < EB * ET * EE; i++) cr_assert(isfinite(out[i]));
        cr_assert(all_nan(out + EB * ET * EE, 8));
        clattn_encoder_plan_free(p);
        free(out);
        clattn_device_free(dev);
    }
    for (int i = 0; i < 12; i++) free(a[i]);
    free(x);
}

/* ---- decoding: a refused call leaves the cache as it was */
Test(counts, decode_counts_leave_the_cache_unchanged)
{
    tu_rng r = {106};
    enum { DB = 2, DE = 8, DH = 2, DD = 4, N = 3, CAP = 8 };
    float *wq = tu_random(&r, DH * DD * DE, -0.4f, 0.4f), *wk = tu_random(&r, DD * DE, -0.4f, 0.4f);
    float *wv = tu_random(&r, DD * DE, -0.4f, 0.4f);
    const clattn_attention_desc d = {.batch = DB, .seq_q = 4, .embed = DE, .heads = DH, .kv_heads = 1,
                                     .head_dim_qk = DD, .causal = 1};
    const clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .w_query_count = DH * DD * DE,
                                        .w_key_count = DD * DE, .w_value_count = DD * DE};
    float *x = tu_random(&r, DB * N * DE + 8, -1, 1);
    size_t valid[DB + 2] = {2, 3};
    for (int k = 0; k < 2; k++) {
        clattn_device *dev = open_dev(k);
        clattn_decode_plan *p = NULL;
        cr_assert_eq(clattn_decode_plan_create(dev, &d, &w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_kv_cache *cache = NULL;
        const clattn_kv_cache_desc cd = {.batch = DB, .capacity = CAP, .kv_heads = 1, .head_dim_qk = DD};
        cr_assert_eq(clattn_kv_cache_create(dev, &cd, &cache), CLATTN_STATUS_SUCCESS);
        float *out = tu_poisoned(DB * N * DH * DD + 8);
        const clattn_decode_args good = {.x = x, .new_tokens = N, .valid = valid, .out = out, .x_count = DB * N * DE,
                                         .valid_count = DB, .out_count = DB * N * DH * DD};
        const size_t wants[3] = {DB * N * DE, DB, DB * N * DH * DD};
        static const char *const an[3] = {"args.x", "args.valid", "args.out"};
        for (int i = 0; i < 3; i++)
            for (int delta = -1; delta <= 1; delta += 2) {
                clattn_decode_args b = good;
                size_t *c[3] = {&b.x_count, &b.valid_count, &b.out_count};
                *c[i] = wants[i] + (size_t)(ptrdiff_t)delta;
                cr_assert_eq(clattn_decode_execute(p, cache, &b), CLATTN_STATUS_SHAPE_MISMATCH, "%s", an[i]);
                expect_named(an[i], wants[i] + (size_t)(ptrdiff_t)delta, wants[i]);
                size_t len[DB] = {99, 99};
                cr_assert_eq(clattn_kv_cache_lengths(cache, len), CLATTN_STATUS_SUCCESS);
                cr_assert(len[0] == 0 && len[1] == 0, "a refused call appended: lengths %zu %zu", len[0], len[1]);
                cr_assert(all_nan(out, DB * N * DH * DD + 8), "a refused call wrote out");
            }
        cr_assert_eq(clattn_decode_execute(p, cache, &good), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        size_t len[DB];
        clattn_kv_cache_lengths(cache, len);
        cr_assert(len[0] == 2 && len[1] == 3);
        cr_assert(all_nan(out + DB * N * DH * DD, 8), "written past out_count");
        clattn_kv_cache_free(cache);
        clattn_decode_plan_free(p);
        free(out);
        clattn_device_free(dev);
    }
    free(wq), free(wk), free(wv), free(x);
}

/* ---- variable-length batches (desc.varlen): what the plan refuses to take with it (training it takes:
 * test_train's backward_varlen), the offsets checked before
 * anything is read or written (each wrong alone), the offsets refused on a plan without varlen; and the reference's
 * own varlen batches against the oracle (the OpenCL cores': test_conformance's prefill/varlen) */
Test(counts, varlen)
{
    for (int k = 0; k < 2; k++) {
        clattn_device *dev = open_dev(k);
        /* what varlen does not take */
        const clattn_attention_desc base = {.batch = 3, .seq_q = 8, .embed = 8, .heads = 2, .varlen = 1};
        clattn_attention_desc bad[4];
        for (int i = 0; i < 4; i++) bad[i] = base;
        bad[0].key_padding_mask = 1, bad[1].attn_mask = CLATTN_MASK_BOOL, bad[2].need_weights = 1, bad[3].varlen = 2;
        const char *named[4] = {"key_padding_mask", "attn_mask", "need_weights", "varlen"};
        for (int i = 0; i < 4; i++) {
            clattn_plan *plan = NULL;
            const clattn_status st = clattn_plan_create(dev, &bad[i], NULL, &plan);
            cr_assert(st == (i == 3 ? CLATTN_STATUS_INVALID_ARGUMENT : CLATTN_STATUS_UNSUPPORTED) && !plan,
                      "varlen with %s: %s", named[i], clattn_status_string(st));
            cr_assert(strstr(clattn_last_error(), named[i]), "%s not named in: %s", named[i], clattn_last_error());
        }
        clattn_attention_desc dd = {.batch = 2, .seq_q = 4, .embed = 8, .heads = 2, .causal = 1, .varlen = 1};
        clattn_decode_plan *dp = NULL;
        cr_assert_eq(clattn_decode_plan_create(dev, &dd, NULL, &dp), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(!dp && strstr(clattn_last_error(), "varlen"), "%s", clattn_last_error());
        /* the offsets: a self-attention plan of 3 sequences of at most 8 rows; out keeps its poison when refused */
        clattn_plan *plan = NULL;
        cr_assert_eq(clattn_plan_create(dev, &base, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        tu_rng r = {77};
        float *x = tu_random(&r, 3 * 8 * 8, -1, 1), *out = tu_poisoned(3 * 8 * 8);
        const uint32_t good[4] = {0, 5, 5, 12};
        const uint32_t wrong[5][4] = {{1, 5, 5, 12}, {0, 5, 4, 12}, {0, 9, 9, 12}, {0, 5, 5, 12}, {0, 5, 5, 12}};
        const char *why[5] = {"[0]", "decreases", "past seq_q", "cu_seqlens_q", "cu_seqlens_kv"};
        for (int i = 0; i < 5; i++) {
            clattn_attention_args a = {.x = x, .x_count = 12 * 8, .out = out, .out_count = 12 * 8,
                                       .cu_seqlens_q = wrong[i], .cu_seqlens_q_count = i == 3 ? 3 : 4};
            if (i == 4) a.cu_seqlens_kv = good, a.cu_seqlens_kv_count = 4; /* self-attention: the queries' own */
            const clattn_status st = clattn_plan_execute(plan, &a);
            cr_assert_neq(st, CLATTN_STATUS_SUCCESS, "offsets %d taken", i);
            cr_assert(strstr(clattn_last_error(), why[i]), "%s not named in: %s", why[i], clattn_last_error());
            cr_assert(all_nan(out, 3 * 8 * 8), "a refused call wrote out");
        }
        clattn_attention_args a = {.x = x, .x_count = 12 * 8, .out = out, .out_count = 12 * 8};
        cr_assert_eq(clattn_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "varlen without offsets taken");
        a.cu_seqlens_q = good, a.cu_seqlens_q_count = 4, a.x_count = 3 * 8 * 8; /* the padded batch's count */
        cr_assert_eq(clattn_plan_execute(plan, &a), CLATTN_STATUS_SHAPE_MISMATCH);
        expect_named("args.x", 3 * 8 * 8, 12 * 8);
        cr_assert(all_nan(out, 3 * 8 * 8), "a refused call wrote out");
        a.x_count = 12 * 8;
        cr_assert_eq(clattn_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert(!isnan(out[12 * 8 - 1]) && all_nan(out + 12 * 8, 3 * 8 * 8 - 12 * 8), "out past the packed rows");
        clattn_plan_free(plan);
        /* offsets on a plan without varlen: refused, not ignored */
        clattn_attention_desc plain = base;
        plain.varlen = 0;
        cr_assert_eq(clattn_plan_create(dev, &plain, NULL, &plan), CLATTN_STATUS_SUCCESS);
        a.x_count = a.out_count = 3 * 8 * 8;
        cr_assert_eq(clattn_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "ignored"), "%s", clattn_last_error());
        clattn_plan_free(plan);
        free(x), free(out);
        /* the reference's varlen batches (OpenCL's: test_conformance) */
        if (k == 0) {
            const tu_attn_case self = {.B = 4, .Tq = 9, .E = 12, .H = 3, .dk = 4, .dv = 5, .Eo = 7, .biases = 1,
                                       .causal = 1, .window = 3};
            const size_t lq[4] = {9, 0, 1, 6};
            tu_varlen_check(dev, &self, lq, NULL, 41, 0);
            const tu_attn_case cross = {.B = 3, .Tq = 5, .Tk = 7, .E = 8, .Ekv = 6, .H = 2, .HK = 1, .dk = 3, .dv = 4,
                                        .Eo = 5, .biases = 1, .cross = 1, .dtype = CLATTN_DTYPE_BF16};
            const size_t cq[3] = {5, 2, 3}, ck[3] = {7, 0, 1};
            tu_varlen_check(dev, &cross, cq, ck, 42, 0);
        }
        clattn_device_free(dev);
    }
}
