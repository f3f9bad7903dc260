/* test_limits.c: score matrices larger than one device allocation run in chunks;
 * what cannot fit is refused with the limit named; every allocation failure
 * (host or device, walked one by one) is reported and leaks nothing. */
#include "reference.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct problem {
    clattn_attention_desc d;
    clattn_attention_weights w;
    float *buf[8];
    clattn_attention_args a;
    uint8_t *kpm;
} problem;

/* B=2, T=37, E=16, H=4 causal self-attention with key padding mask, dropout, out projection */
static void make(problem *p, float dropout)
{
    tu_rng r = {31};
    memset(p, 0, sizeof *p);
    const size_t B = 2, T = 37, E = 16;
    p->d = (clattn_attention_desc){.batch = B, .seq_q = T, .embed = E, .heads = 4, .head_dim_qk = 4, .out_dim = E,
                                   .causal = 1, .key_padding_mask = 1, .dropout = dropout, .seed = 5};
    p->w.w_query = p->buf[0] = tu_random(&r, E * E, -0.3f, 0.3f);
    p->w.w_key = p->buf[1] = tu_random(&r, E * E, -0.3f, 0.3f);
    p->w.w_value = p->buf[2] = tu_random(&r, E * E, -0.3f, 0.3f);
    p->w.w_out = p->buf[3] = tu_random(&r, E * E, -0.3f, 0.3f);
    p->w.b_out = p->buf[4] = tu_random(&r, E, -0.3f, 0.3f);
    p->a.x = p->buf[5] = tu_random(&r, B * T * E, -1, 1);
    p->kpm = calloc(B * T, 1);
    for (size_t i = 0; i < B * T; i++) p->kpm[i] = i % 7 == 3;
    p->a.key_padding_mask = p->kpm;
}

static void unmake(problem *p)
{
    for (int i = 0; i < 8; i++) free(p->buf[i]);
    free(p->kpm);
}

static void chunked_matches_ref(float dropout)
{
    problem p;
    make(&p, dropout);
    clattn_device *cl = tu_open_opencl(), *ref = tu_open_ref();
    cr_assert(cl, "%s", clattn_last_error());
    const size_t per_pair = 37 * 37 * sizeof(float);
    cl->max_alloc = 3 * per_pair + 100; /* room for 3 of the 8 (b, h) score matrices at once */
    clattn_plan *pc = NULL, *pr = NULL;
    cr_assert_eq(clattn_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_plan_create(ref, &p.d, &p.w, &pr), CLATTN_STATUS_SUCCESS);
    const size_t n_out = 2 * 37 * 16, n_attn = 2 * 4 * 37 * 37;
    float *oc = tu_poisoned(n_out), *orf = tu_poisoned(n_out), *ac = tu_poisoned(n_attn), *ar = tu_poisoned(n_attn);
    clattn_attention_args a = p.a;
    a.out = oc, a.attn = ac;
    cr_assert_eq(clattn_plan_execute(pc, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    a.out = orf, a.attn = ar;
    cr_assert_eq(clattn_plan_execute(pr, &a), CLATTN_STATUS_SUCCESS);
    char msg[256];
    size_t bad = tu_compare(oc, orf, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "out: %s", msg);
    bad = tu_compare(ac, ar, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "attn: %s", msg);
    /* and without asking for the weights */
    float *oc2 = tu_poisoned(n_out);
    a.out = oc2, a.attn = NULL;
    cr_assert_eq(clattn_plan_execute(pc, &a), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(tu_compare(oc2, orf, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s", msg);
    clattn_plan_free(pc);
    clattn_plan_free(pr);
    clattn_device_free(cl);
    clattn_device_free(ref);
    free(oc); free(orf); free(ac); free(ar); free(oc2);
    unmake(&p);
}

Test(limits, scores_in_chunks) { chunked_matches_ref(0.0f); }
Test(limits, scores_in_chunks_with_dropout) { chunked_matches_ref(0.25f); }

Test(limits, refused_with_the_limit_named)
{
    clattn_device *cl = tu_open_opencl();
    float w[4] = {0};
    clattn_attention_desc d = {.batch = 1, .seq_q = 100000, .embed = 1, .heads = 1, .head_dim_qk = 1};
    clattn_attention_weights wt = {.w_query = w, .w_key = w, .w_value = w};
    clattn_plan *plan = NULL;
    cr_assert_eq(clattn_plan_create(cl, &d, &wt, &plan), CLATTN_STATUS_TOO_LARGE_FOR_DEVICE);
    cr_assert_null(plan);
    cr_assert(strstr(clattn_last_error(), "max allocation"), "%s", clattn_last_error());
    /* every score matrix fits (in chunks), but the activations exceed the device's global memory */
    d = (clattn_attention_desc){.batch = 1, .seq_q = 1000, .embed = 256, .heads = 1};
    d.batch = cl->global_mem / (1000 * 256 * sizeof(float)) + 1; /* x alone would fill it */
    cr_assert_eq(clattn_plan_create(cl, &d, NULL, &plan), CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "%s",
                 clattn_last_error());
    cr_assert(strstr(clattn_last_error(), "global memory"), "%s", clattn_last_error());
    clattn_device_free(cl);
}

/* Make the Nth host allocation (or buffer creation) fail, for every N in turn, in plan
 * creation and in execution: the call fails cleanly and leaves outputs untouched. */
static void walk(const char *spec, int buffers)
{
    problem p;
    make(&p, 0.1f);
    clattn_device *dev = NULL;
    cr_assert_eq(clattn_device_open(spec, &dev), CLATTN_STATUS_SUCCESS);
    const size_t n_out = 2 * 37 * 16, n_attn = 2 * 4 * 37 * 37;
    float *out = malloc(n_out * sizeof *out), *attn = malloc(n_attn * sizeof *attn);
    int failures = 0;
    for (long n = 1;; n++) {
        cr_assert(n < 1000, "the walk does not end");
        for (size_t i = 0; i < n_out; i++) out[i] = 7.0f;
        for (size_t i = 0; i < n_attn; i++) attn[i] = 7.0f;
        clattn_test_fail_nth_alloc(buffers ? 0 : n, buffers ? n : 0);
        clattn_plan *plan = NULL;
        clattn_status st = clattn_plan_create(dev, &p.d, &p.w, &plan);
        if (st == CLATTN_STATUS_SUCCESS) {
            clattn_attention_args a = p.a;
            a.out = out, a.attn = attn;
            st = clattn_plan_execute(plan, &a);
        } else {
            cr_assert_null(plan);
        }
        int fired = clattn_test_alloc_fault_fired();
        clattn_test_fail_nth_alloc(0, 0);
        clattn_plan_free(plan);
        if (!fired) {
            cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "N=%ld: %s", n, clattn_last_error());
            break;
        }
        failures++;
        cr_assert_neq(st, CLATTN_STATUS_SUCCESS, "allocation %ld failed but the call succeeded", n);
        cr_assert(st == CLATTN_STATUS_OUT_OF_HOST_MEMORY || st == CLATTN_STATUS_DEVICE_ALLOCATION,
                  "N=%ld: %s (%s)", n, clattn_status_string(st), clattn_last_error());
        for (size_t i = 0; i < n_out; i++) cr_assert_eq(out[i], 7.0f, "N=%ld: out written on failure", n);
        for (size_t i = 0; i < n_attn; i++) cr_assert_eq(attn[i], 7.0f, "N=%ld: attn written on failure", n);
    }
    cr_assert(failures >= 3, "only %d allocations were walked", failures);
    free(out);
    free(attn);
    clattn_device_free(dev);
    unmake(&p);
}

Test(faults, host_allocations_ref) { walk("ref", 0); }
Test(faults, host_allocations_opencl) { walk("opencl", 0); }
Test(faults, device_buffers_opencl) { walk("opencl", 1); }
