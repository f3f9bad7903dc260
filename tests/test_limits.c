/* test_limits.c: every plan the library accepts computes the right answer within the
 * device's limits, and what cannot fit is refused with the limit named.
 *   - score matrices larger than one allocation run in chunks of (batch, head) pairs, or
 *     one pair at a time in blocks of query rows;
 *   - no CLBlast call touches an element past its 32-bit index range (offsets included:
 *     sub-buffers), nor makes a padded temporary larger than one allocation (with gemm_clblast:
 *     test_limits_core_gemm_clblast); gemm_tiles packs within one allocation, in blocks;
 *   - no kernel launch has more work-items than the device's launch limit.
 * The limits live in the (internal) device struct; the tests lower them so that a few
 * hundred tokens walk every chunking path, compared element by element with ref and with the
 * float64 oracle of tests/oracle.c (shares no code with either).
 * And every allocation failure (host or device, walked one by one) is reported and leaks
 * nothing. */
#include "oracle.h"
#include "attention/attention.h"
#include "cores/core.h"
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
                                   .causal = 1, .key_padding_mask = 1, .dropout = dropout, .seed = 5,
                                   .need_weights = 1};
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
    const size_t per_pair = 37 * 37 * sizeof(float);
    cl->caps.max_alloc = 3 * per_pair + 100; /* room for 3 of the 8 (b, h) score matrices at once */
    clattn_plan *pc = NULL, *pr = NULL;
    cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_plan_create(ref, &p.d, &p.w, &pr), CLATTN_STATUS_SUCCESS);
    const size_t n_out = 2 * 37 * 16, n_attn = 2 * 4 * 37 * 37;
    float *oc = tu_poisoned(n_out), *orf = tu_poisoned(n_out), *ac = tu_poisoned(n_attn), *ar = tu_poisoned(n_attn);
    clattn_attention_args a = p.a;
    a.out = oc, a.attn = ac;
    cr_assert_eq(tu_plan_execute(pc, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    a.out = orf, a.attn = ar;
    cr_assert_eq(tu_plan_execute(pr, &a), CLATTN_STATUS_SUCCESS);
    char msg[256];
    size_t bad = tu_compare(oc, orf, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "out: %s", msg);
    bad = tu_compare(ac, ar, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "attn: %s", msg);
    {
        double *o64 = malloc(n_out * sizeof *o64), *a64 = malloc(n_attn * sizeof *a64);
        cr_assert(o64 && a64);
        cr_assert_eq(oracle_attention(&p.d, &p.w, &p.a, o64, a64), 0);
        cr_assert_eq(oracle_compare(oc, o64, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "out vs float64: %s", msg);
        cr_assert_eq(oracle_compare(ac, a64, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "attn vs float64: %s",
                     msg);
        free(o64);
        free(a64);
    }
    /* and without asking for the weights */
    float *oc2 = tu_poisoned(n_out);
    a.out = oc2, a.attn = NULL;
    cr_assert_eq(tu_plan_execute(pc, &a), CLATTN_STATUS_SUCCESS);
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
    /* one query's row of scores (Tk floats) larger than one allocation: no chunking helps */
    clattn_attention_desc d = {.batch = 1, .seq_q = 3000, .embed = 1, .heads = 1, .head_dim_qk = 1};
    clattn_attention_weights wt = {.w_query = w, .w_key = w, .w_value = w};
    clattn_plan *plan = NULL;
    const size_t saved = cl->caps.max_alloc;
    cl->caps.max_alloc = 2999 * sizeof(float);
    cr_assert_eq(tu_plan_create(cl, &d, &wt, &plan), CLATTN_STATUS_TOO_LARGE_FOR_DEVICE);
    cr_assert_null(plan);
    cr_assert(strstr(clattn_last_error(), "max allocation"), "%s", clattn_last_error());
    /* the weights wanted: only the unfused core makes them, and it refuses a row of scores beyond one
     * allocation (before any buffer is made), with that status whatever core AUTO tried first */
    d.need_weights = 1;
    cr_assert_eq(tu_plan_create(cl, &d, &wt, &plan), CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "%s", clattn_last_error());
    cr_assert(strstr(clattn_last_error(), "row of scores"), "%s", clattn_last_error());
    d.need_weights = 0;
    cl->caps.max_alloc = saved;
    /* every score matrix fits (in chunks), but the activations exceed the device's global memory */
    d = (clattn_attention_desc){.batch = 1, .seq_q = 1000, .embed = 256, .heads = 1};
    d.batch = cl->caps.global_mem / (1000 * 256 * sizeof(float)) + 1; /* x alone would fill it */
    cr_assert_eq(tu_plan_create(cl, &d, NULL, &plan), CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "%s",
                 clattn_last_error());
    cr_assert(strstr(clattn_last_error(), "global memory"), "%s", clattn_last_error());
    clattn_device_free(cl);
}

/* ---- a few hundred tokens under lowered limits, element by element against ref */

typedef struct lowered {
    const char *what;
    size_t max_alloc;     /* bytes (0 = the device's) */
    size_t blas_elems;    /* CLBlast index limit (0 = the device's) */
    size_t launch_items;  /* work-items per launch (0 = the device's) */
} lowered;

/* B=2, Tq=173, Tk=211 (cross) or Tq=Tk=211 (self), E=12, H=3, dk=5, dv=3, out projection,
 * key padding mask, bool mask, causal, dropout: every chunking path under `lim`, executed from
 * host arrays and from buffers at large offsets (x, kv, out and attn beyond the lowered index
 * limit), out and attn compared with ref element by element; then the reach spies prove that
 * no CLBlast call and no launch passed the lowered limits. */
static void lowered_matches_ref(const lowered *lim, int cross, int causal, float dropout)
{
    tu_rng r = {977 + (uint64_t)cross * 13 + (uint64_t)causal};
    const size_t B = 2, Tq = cross ? 173 : 211, Tk = 211, E = 12, Ekv = cross ? 7 : 12, H = 3, dk = 5, dv = 3,
                 Eo = 10;
    clattn_attention_desc d = {.batch = B, .seq_q = Tq, .cross = cross, .seq_kv = cross ? Tk : 0, .embed = E,
                               .kv_embed = cross ? Ekv : 0, .heads = H, .head_dim_qk = dk, .head_dim_v = dv,
                               .out_dim = Eo, .causal = causal, .key_padding_mask = 1,
                               .attn_mask = CLATTN_MASK_BOOL, .dropout = dropout, .seed = 4242,
                               .need_weights = 1};
    float *wq = tu_random(&r, H * dk * E, -0.4f, 0.4f), *wk = tu_random(&r, H * dk * Ekv, -0.4f, 0.4f);
    float *wv = tu_random(&r, H * dv * Ekv, -0.4f, 0.4f), *wo = tu_random(&r, Eo * H * dv, -0.4f, 0.4f);
    float *bq = tu_random(&r, H * dk, -0.2f, 0.2f), *bo = tu_random(&r, Eo, -0.2f, 0.2f);
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .b_query = bq, .w_out = wo,
                                  .b_out = bo};
    float *x = tu_random(&r, B * Tq * E, -1, 1), *kv = tu_random(&r, B * Tk * Ekv, -1, 1);
    uint8_t *kpm = malloc(B * Tk), *mask = malloc(Tq * Tk);
    for (size_t i = 0; i < B * Tk; i++) kpm[i] = tu_uniform(&r, 0, 1) < 0.1f;
    for (size_t i = 0; i < Tq * Tk; i++) mask[i] = tu_uniform(&r, 0, 1) < 0.15f;
    for (size_t j = 0; j < Tk; j++) kpm[Tk + j] = 1; /* batch entry 1: every key hidden (rows of zeros) */
    kpm[Tk + 17] = 0;                                 /* but one */
    const size_t n_out = B * Tq * Eo, n_attn = B * H * Tq * Tk;
    clattn_attention_args a = {.x = x, .kv = cross ? kv : NULL, .key_padding_mask = kpm, .attn_mask = mask};

    clattn_device *ref = tu_open_ref();
    clattn_plan *pr = NULL;
    cr_assert_eq(tu_plan_create(ref, &d, &w, &pr), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *oref = tu_poisoned(n_out), *aref = tu_poisoned(n_attn);
    a.out = oref, a.attn = aref;
    cr_assert_eq(tu_plan_execute(pr, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    int nonzero = 0;
    for (size_t i = 0; i < n_out && !nonzero; i++) nonzero = oref[i] != 0.0f && isfinite(oref[i]);
    cr_assert(nonzero, "the reference output is all zero: the test would prove nothing");
    /* the expectation is checked against the float64 oracle first */
    char msg[256];
    {
        double *o64 = malloc(n_out * sizeof *o64), *a64 = malloc(n_attn * sizeof *a64);
        cr_assert(o64 && a64);
        clattn_attention_args oa = a;
        cr_assert_eq(oracle_attention(&d, &w, &oa, o64, a64), 0);
        cr_assert_eq(oracle_compare(oref, o64, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "ref out vs float64: %s",
                     msg);
        cr_assert_eq(oracle_compare(aref, a64, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg), 0,
                     "ref attn vs float64: %s", msg);
        free(o64);
        free(a64);
    }

    clattn_device *cl = tu_open_opencl();
    if (lim->max_alloc) cl->caps.max_alloc = lim->max_alloc;
    if (lim->blas_elems) cl->caps.blas_max_elems = lim->blas_elems;
    if (lim->launch_items) cl->caps.max_launch_items = lim->launch_items;
    clattn_test_blas_reach(1);
    clattn_test_launch_reach(1);
    clattn_plan *pc = NULL;
    cr_assert_eq(tu_plan_create(cl, &d, &w, &pc), CLATTN_STATUS_SUCCESS, "%s: %s", lim->what,
                 clattn_last_error());
    cr_assert_eq(clattn_plan_algorithm(pc), CLATTN_ALGORITHM_UNFUSED, "%s: need_weights runs unfused", lim->what);
    /* from host arrays, with and without the weights */
    for (int want_attn = 1; want_attn >= 0; want_attn--) {
        float *o = tu_poisoned(n_out), *at = want_attn ? tu_poisoned(n_attn) : NULL;
        a.out = o, a.attn = at;
        cr_assert_eq(tu_plan_execute(pc, &a), CLATTN_STATUS_SUCCESS, "%s: %s", lim->what, clattn_last_error());
        cr_assert_eq(tu_compare(o, oref, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s (host, attn %d) out: %s",
                     lim->what, want_attn, msg);
        if (at)
            cr_assert_eq(tu_compare(at, aref, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s (host) attn: %s",
                         lim->what, msg);
        free(o);
        free(at);
    }
    /* from buffers, every tensor at an offset past the lowered index limit */
    cl_context ctx = clattn_device_context(cl);
    cl_command_queue q = clattn_device_queue(cl);
    const size_t off = (lim->blas_elems ? lim->blas_elems : 4096) + 37;
    const size_t nx = B * Tq * E, nkv = B * Tk * Ekv;
    cl_int err;
    cl_mem mems[6];
    const size_t sizes[6] = {(off + nx) * 4, (off + nkv) * 4, 3 + B * Tk, 5 + Tq * Tk, (off + n_out) * 4,
                             (off + n_attn) * 4};
    for (int i = 0; i < 6; i++) {
        mems[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizes[i], NULL, &err);
        cr_assert_eq(err, CL_SUCCESS, "buffer %d: %s", i, clattn_status_string(err));
    }
    cl_mem bx = mems[0], bkv = mems[1], bkpm = mems[2], bmask = mems[3], bout = mems[4], battn = mems[5];
    float *o = tu_poisoned(n_out), *at = tu_poisoned(n_attn);
    cr_assert_eq(clEnqueueWriteBuffer(q, bx, CL_TRUE, off * 4, nx * 4, x, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(q, bkv, CL_TRUE, off * 4, nkv * 4, kv, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(q, bkpm, CL_TRUE, 3, B * Tk, kpm, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(q, bmask, CL_TRUE, 5, Tq * Tk, mask, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(q, bout, CL_TRUE, off * 4, n_out * 4, o, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(q, battn, CL_TRUE, off * 4, n_attn * 4, at, 0, NULL, NULL), CL_SUCCESS);
    clattn_attention_buffers bufs = {.x = {bx, off}, .kv = {cross ? bkv : NULL, off}, .key_padding_mask = {bkpm, 3},
                                     .attn_mask = {bmask, 5}, .out = {bout, off}, .attn = {battn, off}};
    cr_assert_eq(clattn_plan_execute_buffers(pc, &bufs, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s: %s", lim->what,
                 clattn_last_error());
    cr_assert_eq(clFinish(q), CL_SUCCESS);
    cr_assert_eq(clEnqueueReadBuffer(q, bout, CL_TRUE, off * 4, n_out * 4, o, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueReadBuffer(q, battn, CL_TRUE, off * 4, n_attn * 4, at, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(tu_compare(o, oref, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s (buffers) out: %s", lim->what,
                 msg);
    cr_assert_eq(tu_compare(at, aref, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s (buffers) attn: %s",
                 lim->what, msg);
    /* the fused algorithm under the same limits (it has no weights to give): from host arrays and
     * from the same buffers at their offsets */
    clattn_attention_desc df = d;
    df.need_weights = 0;
    df.algorithm = CLATTN_ALGORITHM_FUSED;
    clattn_plan *pf = NULL;
    cr_assert_eq(tu_plan_create(cl, &df, &w, &pf), CLATTN_STATUS_SUCCESS, "%s (fused): %s", lim->what,
                 clattn_last_error());
    cr_assert_eq(clattn_plan_algorithm(pf), CLATTN_ALGORITHM_FUSED, "%s: the plan does not run fused", lim->what);
    float *of = tu_poisoned(n_out);
    a.out = of, a.attn = NULL;
    cr_assert_eq(tu_plan_execute(pf, &a), CLATTN_STATUS_SUCCESS, "%s (fused): %s", lim->what, clattn_last_error());
    cr_assert_eq(tu_compare(of, oref, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s (fused, host) out: %s",
                 lim->what, msg);
    for (size_t i = 0; i < n_out; i++) of[i] = NAN; /* the read below must bring every value */
    cr_assert_eq(clEnqueueWriteBuffer(q, bout, CL_TRUE, off * 4, n_out * 4, of, 0, NULL, NULL), CL_SUCCESS);
    bufs.attn = (clattn_buffer){NULL, 0};
    cr_assert_eq(clattn_plan_execute_buffers(pf, &bufs, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s (fused): %s",
                 lim->what, clattn_last_error());
    cr_assert_eq(clEnqueueReadBuffer(q, bout, CL_TRUE, off * 4, n_out * 4, of, 0, NULL, NULL), CL_SUCCESS);
    cr_assert_eq(tu_compare(of, oref, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s (fused, buffers) out: %s",
                 lim->what, msg);
    clattn_plan_free(pf);
    free(of);

    /* the spies: no CLBlast call reached past the limit (when CLBlast runs the GEMMs: gemm_tiles indexes with
     * 64 bits and has no such limit), no launch was larger */
    if (lim->blas_elems && strcmp(clattn_plan_gemm(pc), "gemm_clblast") == 0) {
        const size_t reach = clattn_test_blas_reach(0);
        cr_assert(reach > 0, "%s: the CLBlast spy saw no call", lim->what);
        cr_assert(reach <= lim->blas_elems, "%s: a CLBlast call touched element %zu, past the limit %zu", lim->what,
                  reach, lim->blas_elems);
    }
    if (lim->launch_items) {
        const size_t reach = clattn_test_launch_reach(0);
        cr_assert(reach > 0, "%s: the launch spy saw no launch", lim->what);
        cr_assert(reach <= lim->launch_items, "%s: a launch of %zu work-items, past the limit %zu", lim->what,
                  reach, lim->launch_items);
    }
    free(o); free(at);
    for (int i = 0; i < 6; i++) clReleaseMemObject(mems[i]);
    clattn_plan_free(pc);
    clattn_plan_free(pr);
    clattn_device_free(cl);
    clattn_device_free(ref);
    free(oref); free(aref); free(wq); free(wk); free(wv); free(wo); free(bq); free(bo); free(x); free(kv);
    free(kpm); free(mask);
}

/* 80 rows of scores per allocation (blocks of 80 query rows, the last one shorter); the
 * projections and activations still fit (the largest is 2*211*39 floats) */
static const lowered row_blocks = {"row blocks", 80 * 211 * 4 + 12, 0, 0};
/* CLBlast may touch 3000 elements: every GEMM in row blocks and batch groups, operands past
 * element 3000 through sub-buffers */
static const lowered blas_index = {"CLBlast index limit", 0, 3000, 0};
/* at most 300 work-items per launch (above the work-group softmax's 256 per row; the softmax
 * too runs in several launches) */
static const lowered launches = {"launch limit", 0, 0, 300};
/* all of them at once */
static const lowered all_limits = {"all limits", 80 * 211 * 4 + 12, 3000, 300};

Test(limits, row_blocks_self) { lowered_matches_ref(&row_blocks, 0, 1, 0.0f); }
Test(limits, row_blocks_cross_dropout) { lowered_matches_ref(&row_blocks, 1, 0, 0.2f); }
Test(limits, blas_index_self) { lowered_matches_ref(&blas_index, 0, 1, 0.1f); }
Test(limits, blas_index_cross) { lowered_matches_ref(&blas_index, 1, 1, 0.0f); }
Test(limits, launches_self) { lowered_matches_ref(&launches, 0, 0, 0.3f); }
Test(limits, all_limits_self) { lowered_matches_ref(&all_limits, 0, 1, 0.2f); }
Test(limits, all_limits_cross) { lowered_matches_ref(&all_limits, 1, 1, 0.0f); }

/* Make the Nth host allocation (or buffer creation) fail, for every N in turn, in plan
 * creation and in execution: the call fails cleanly and leaves outputs untouched. */
static void walk(int opencl, int buffers, clattn_algorithm alg)
{
    if (opencl && !tu_core_applies(alg, alg != CLATTN_ALGORITHM_FUSED)) return;
    problem p;
    make(&p, 0.1f);
    p.d.algorithm = alg;
    p.d.need_weights = alg != CLATTN_ALGORITHM_FUSED;
    const int weights = p.d.need_weights;
    clattn_device *dev = opencl ? tu_open_opencl() : tu_open_ref();
    const size_t n_out = 2 * 37 * 16, n_attn = 2 * 4 * 37 * 37;
    /* what the successful call at the end of the walk must give: ref's output (same dropout bits) */
    float *want_out = tu_poisoned(n_out), *want_attn = tu_poisoned(n_attn);
    {
        clattn_device *ref = tu_open_ref();
        clattn_plan *pr = NULL;
        cr_assert_eq(tu_plan_create(ref, &p.d, &p.w, &pr), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_attention_args a = p.a;
        a.out = want_out, a.attn = want_attn;
        cr_assert_eq(tu_plan_execute(pr, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_plan_free(pr);
        clattn_device_free(ref);
    }
    float *out = malloc(n_out * sizeof *out), *attn = malloc(n_attn * sizeof *attn);
    int failures = 0;
    for (long n = 1;; n++) {
        cr_assert(n < 1000, "the walk does not end");
        for (size_t i = 0; i < n_out; i++) out[i] = 7.0f;
        for (size_t i = 0; i < n_attn; i++) attn[i] = 7.0f;
        clattn_test_fail_nth_alloc(buffers ? 0 : n, buffers ? n : 0);
        clattn_plan *plan = NULL;
        clattn_status st = tu_plan_create(dev, &p.d, &p.w, &plan);
        if (st == CLATTN_STATUS_SUCCESS) {
            if (opencl) cr_assert_eq(clattn_plan_algorithm(plan), alg, "N=%ld: the plan runs another algorithm", n);
            clattn_attention_args a = p.a;
            a.out = out, a.attn = weights ? attn : NULL;
            st = tu_plan_execute(plan, &a);
        } else {
            cr_assert_null(plan);
        }
        int fired = clattn_test_alloc_fault_fired();
        clattn_test_fail_nth_alloc(0, 0);
        clattn_plan_free(plan);
        if (!fired) {
            cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "N=%ld: %s", n, clattn_last_error());
            char msg[256];
            cr_assert_eq(tu_compare(out, want_out, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0,
                         "the call after the walk: out: %s", msg);
            if (weights)
                cr_assert_eq(tu_compare(attn, want_attn, n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg), 0,
                             "the call after the walk: attn: %s", msg);
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
    free(want_out);
    free(want_attn);
    clattn_device_free(dev);
    unmake(&p);
}

Test(faults, host_allocations_ref) { walk(0, 0, CLATTN_ALGORITHM_AUTO); }
Test(faults, host_allocations_opencl) { walk(1, 0, CLATTN_ALGORITHM_UNFUSED); }
Test(faults, device_buffers_opencl) { walk(1, 1, CLATTN_ALGORITHM_UNFUSED); }
Test(faults, host_allocations_opencl_fused) { walk(1, 0, CLATTN_ALGORITHM_FUSED); }
Test(faults, device_buffers_opencl_fused) { walk(1, 1, CLATTN_ALGORITHM_FUSED); }

/* ---- the device's loop limit (a driver defect the probes measure: Mesa 22's llvmpipe ends a work-item's loops
 * after 65,535 iterations without an error). Lowered here to a few thousand, a plan must run with parameters whose
 * bound (the core's trips) keeps within clattn_loop_budget and compute the right answer, or be refused with the
 * bound, the sizes and the limit named. */

/* The core `name` ran with `params` ("P=V,..."): its bound for d within the device's budget. */
static void assert_within_budget(const clattn_device *cl, const char *name, const char *params,
                                 const clattn_attention_desc *d)
{
    const clattn_core *c = clattn_core_find(name);
    cr_assert(c, "no core %s", name);
    cr_assert(c->trips, "%s ran on a device with a loop limit but has no bound on its loops", name);
    clattn_core_params p;
    memset(&p, 0, sizeof p);
    c->defaults(c, &cl->caps, d, &p);
    char why[200];
    cr_assert(clattn_core_params_parse(c, params, &p, why, sizeof why), "%s: %s", params, why);
    const size_t n = c->trips(c, &cl->caps, d, &p);
    cr_assert_leq(n, clattn_loop_budget(&cl->caps), "%s (%s): %zu loop iterations, beyond the budget %zu", name,
                  params, n, clattn_loop_budget(&cl->caps));
}

static void assert_loop_refusal(clattn_status st, size_t limit)
{
    char lim[32];
    snprintf(lim, sizeof lim, "%zu", limit);
    cr_assert_eq(st, CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "%s", clattn_last_error());
    cr_assert(strstr(clattn_last_error(), "loop") && strstr(clattn_last_error(), lim), "%s", clattn_last_error());
}

/* A GPU's GEMM core (CLBlast) cannot bound its work-items' loops: at a loop limit every plan with projections is
 * refused for the GEMM's sake, with the limit named, before an attention core is asked. CPUs have gemm_tiles, which
 * bounds them: there this must never happen. */
static int gemm_refused_at_limit(const clattn_device *cl, clattn_status st, size_t limit)
{
    if (st == CLATTN_STATUS_SUCCESS || !strstr(clattn_last_error(), "no gemm core can compute")) return 0;
    cr_assert_neq(cl->caps.dclass, CLATTN_CLASS_CPU, "a CPU's GEMM core refused a loop limit: %s", clattn_last_error());
    assert_loop_refusal(st, limit);
    cr_log_info("no GEMM core of this device bounds its loops: refused, the limit named (%s)", clattn_last_error());
    return 1;
}

Test(limits, loop_limit)
{
    clattn_device *cl = tu_open_opencl(), *ref = tu_open_ref();
    cl->caps.loop_limit = 20000;
    const tu_attn_case cases[] = {
        {.B = 2, .Tq = 130, .E = 32, .H = 2, .dk = 16, .dv = 16, .Eo = 32, .causal = 1, .kpm = 1},
        {.B = 1, .Tq = 61, .Tk = 300, .E = 24, .Ekv = 24, .H = 3, .dk = 8, .dv = 8, .Eo = 24, .cross = 1,
         .dropout = 0.25f},
        {.B = 1, .Tq = 45, .E = 16, .H = 2, .dk = 8, .dv = 8, .Eo = 16, .training = 1},
        /* too long for a fused core's work-item at this limit, and for one work-item per row of the unfused
         * core's softmax: its defaults take a work-group per row */
        {.B = 1, .Tq = 4000, .E = 8, .H = 1, .dk = 8, .dv = 8, .Eo = 8},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        tu_problem p;
        tu_problem_make(&p, &cases[ci], 60 + ci);
        clattn_plan *pc = NULL, *pr = NULL;
        const char *forced = getenv("CLATTN_CORE"); /* a core of any kind forced (the matrix's entries) */
        const int any_forced = forced && *forced;
        if (ci == 3 && !any_forced) { /* the fused algorithm asked for: refused with the limit named, no plan */
            clattn_attention_desc fused = p.d;
            fused.algorithm = CLATTN_ALGORITHM_FUSED;
            assert_loop_refusal(tu_plan_create(cl, &fused, &p.w, &pc), 20000);
            cr_assert_null(pc);
        }
        const clattn_status st = tu_plan_create(cl, &p.d, &p.w, &pc);
        if (gemm_refused_at_limit(cl, st, 20000)) {
            cr_assert_null(pc);
            tu_problem_free(&p);
            continue;
        }
        if (st != CLATTN_STATUS_SUCCESS) { /* refused (a forced core): with the limit named, never a plan */
            assert_loop_refusal(st, 20000);
            cr_assert(ci != 3 || any_forced, "AUTO refused T = 4000");
            cr_assert_null(pc);
            tu_problem_free(&p);
            continue;
        }
        if (ci == 3 && !any_forced)
            cr_assert(strcmp(clattn_plan_core(pc), "unfused") == 0 &&
                      strncmp(clattn_plan_core_params(pc), "SOFTMAX=rows,", 13) == 0, "T = 4000 ran on %s (%s)",
                      clattn_plan_core(pc), clattn_plan_core_params(pc));
        assert_within_budget(cl, clattn_plan_core(pc), clattn_plan_core_params(pc), &p.d);
        if (strcmp(clattn_plan_gemm(pc), "ref") != 0 && clattn_core_find(clattn_plan_gemm(pc)))
            assert_within_budget(cl, clattn_plan_gemm(pc), clattn_plan_gemm_params(pc), &p.d);
        if (p.d.training && clattn_plan_backward_core(pc)[0])
            assert_within_budget(cl, clattn_plan_backward_core(pc), clattn_plan_backward_core_params(pc), &p.d);
        cr_assert_eq(tu_plan_create(ref, &p.d, &p.w, &pr), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const size_t n = p.d.batch * p.d.seq_q * p.d.out_dim;
        float *oc = tu_poisoned(n), *orf = tu_poisoned(n);
        clattn_attention_args a = p.a;
        a.out = oc;
        cr_assert_eq(tu_plan_execute(pc, &a), CLATTN_STATUS_SUCCESS, "case %zu: %s", ci, clattn_last_error());
        a.out = orf;
        cr_assert_eq(tu_plan_execute(pr, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        char msg[256];
        cr_assert_eq(tu_compare(oc, orf, n, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "case %zu (%s %s): %s", ci,
                     clattn_plan_core(pc), clattn_plan_core_params(pc), msg);
        free(oc);
        free(orf);
        clattn_plan_free(pc);
        clattn_plan_free(pr);
        tu_problem_free(&p);
    }
    clattn_device_free(cl);
    clattn_device_free(ref);
}

/* Parameters past the limit that the caller names are refused with it named; a core with no bound is refused
 * on such a device whatever the sizes; without a limit the same parameters run. */
Test(limits, loop_limit_forced)
{
    if (tu_forced_core()) cr_skip_test("sets CLATTN_CORE itself");
    clattn_device *cl = tu_open_opencl();
    tu_problem p;
    tu_problem_make(&p, &(tu_attn_case){.B = 1, .Tq = 200, .E = 16, .H = 1, .dk = 16, .dv = 16, .Eo = 16}, 71);
    clattn_plan *pc = NULL;
    cl->caps.loop_limit = 20000;
    setenv("CLATTN_CORE", "flash_rows:ROWS=16", 1);
    const clattn_status st = tu_plan_create(cl, &p.d, &p.w, &pc);
    if (gemm_refused_at_limit(cl, st, 20000)) { /* the cores' own refusals are not reached on this device */
        unsetenv("CLATTN_CORE");
        tu_problem_free(&p);
        clattn_device_free(cl);
        return;
    }
    assert_loop_refusal(st, 20000);
    cr_assert(strstr(clattn_last_error(), "ROWS=16"), "%s", clattn_last_error());
    setenv("CLATTN_CORE", "flash_tiled", 1);
    assert_loop_refusal(tu_plan_create(cl, &p.d, &p.w, &pc), 20000);
    cr_assert(strstr(clattn_last_error(), "no bound"), "%s", clattn_last_error());
    cl->caps.loop_limit = 0;
    setenv("CLATTN_CORE", "flash_rows:ROWS=16", 1);
    cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_str_eq(clattn_plan_core_params(pc), "ROWS=16,BK=16,VW=8");
    clattn_plan_free(pc);
    unsetenv("CLATTN_CORE");
    /* the GEMM core's blocks of k: all of k without a limit, shallow ones with it */
    if (cl->caps.dclass == CLATTN_CLASS_CPU) {
        cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert(strstr(clattn_plan_gemm_params(pc), "KC=0"), "%s", clattn_plan_gemm_params(pc));
        clattn_plan_free(pc);
        cl->caps.loop_limit = 20000;
        cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert(!strstr(clattn_plan_gemm_params(pc), "KC=0"), "%s", clattn_plan_gemm_params(pc));
        /* and CPUs' prefill core keeps running, with fewer rows per work-item */
        cr_assert_str_eq(clattn_plan_core(pc), "flash_rows", "%s", clattn_plan_core(pc));
        cr_assert(!strstr(clattn_plan_core_params(pc), "ROWS=16"), "%s", clattn_plan_core_params(pc));
        clattn_plan_free(pc);
    }
    tu_problem_free(&p);
    clattn_device_free(cl);
}

/* Profiling on a device whose timestamps the probes found not real: refused with the reason, never zeros. */
Test(limits, fake_timestamps)
{
    clattn_device *cl = tu_open_opencl();
    tu_problem p;
    tu_problem_make(&p, &(tu_attn_case){.B = 1, .Tq = 7, .E = 8, .H = 2, .dk = 4, .dv = 4, .Eo = 8}, 72);
    clattn_plan *pc = NULL;
    cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_status prof = clattn_plan_set_profiling(pc, 1);
    if (!tu_profiling_refused(cl, prof, "fake timestamps")) /* a device whose timestamps are real: faked below */
        cr_assert_eq(prof, CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cl->caps.profiling_ok = 0;
    snprintf(cl->caps.probe_note, sizeof cl->caps.probe_note, "timestamps 1 ns apart");
    cr_assert_eq(clattn_plan_set_profiling(pc, 1), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "not real") && strstr(clattn_last_error(), "1 ns"), "%s", clattn_last_error());
    cr_assert_eq(clattn_plan_set_profiling(pc, 0), CLATTN_STATUS_SUCCESS);
    clattn_plan_free(pc);
    tu_problem_free(&p);
    clattn_device_free(cl);
}

/* ---- the self-test's verdicts: kept with the probes' facts (in a private cache directory here), read again when the
 * device opens; AUTO passes over a core that failed, CLATTN_CORE still forces it, `clattn cores` says why; a new
 * self-test (every core passes here) records new verdicts. */
static const char *core_reason(const clattn_device *dev, const char *name, int *supported)
{
    static clattn_core_info c;
    for (size_t i = 0; i < clattn_core_count(); i++)
        if (clattn_core_describe(dev, i, &c) == CLATTN_STATUS_SUCCESS && strcmp(c.name, name) == 0) {
            *supported = c.supported;
            return c.reason;
        }
    cr_assert_fail("no core %s", name);
    return "";
}

Test(limits, selftest_verdicts)
{
    if (tu_forced_core()) cr_skip_test("sets the cores itself");
    char dir[] = "/tmp/clattn-verdicts-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp failed");
    setenv("CLATTN_CACHE_DIR", dir, 1);
    unsetenv("CLATTN_PROGRAM_CACHE"); /* the verdicts are kept in the cache directory (the sanitizer stage turns it off) */
    clattn_device *cl = tu_open_opencl();
    tu_problem p;
    tu_problem_make(&p, &(tu_attn_case){.B = 1, .Tq = 19, .E = 16, .H = 2, .dk = 8, .dv = 8, .Eo = 16}, 73);
    clattn_plan *pc = NULL;
    cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    char first[32];
    snprintf(first, sizeof first, "%s", clattn_plan_core(pc));
    clattn_plan_free(pc);
    clattn_verdicts_store(cl, first); /* as a self-test that saw it fail */
    for (int reopened = 0; reopened < 2; reopened++) {
        if (reopened) {
            clattn_device_free(cl);
            cl = tu_open_opencl();
        }
        cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_str_neq(clattn_plan_core(pc), first, "AUTO took %s, which failed the self-test here", first);
        clattn_plan_free(pc);
        int sup = 1;
        const char *why = core_reason(cl, first, &sup);
        cr_assert(!sup && strstr(why, "failed clattn selftest"), "%s: %s", first, why);
        cr_assert(strstr(clattn_device_facts(cl), first), "%s", clattn_device_facts(cl));
    }
    char force[64];
    snprintf(force, sizeof force, "%s", first);
    setenv("CLATTN_CORE", force, 1);
    cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_str_eq(clattn_plan_core(pc), first);
    clattn_plan_free(pc);
    /* a quick self-test, with a CLATTN_CORE no plan could take (the self-test does not read it): every core passes,
     * and the earlier failure stays (a quick run has fewer cases: it proves no failure wrong) */
    setenv("CLATTN_CORE", "no_such_core", 1);
    clattn_selftest_result r[32];
    size_t n = 0;
    for (int quick = 1; quick >= 0; quick--) {
        cr_assert_eq(clattn_device_selftest(cl, quick, r, 32, &n), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(n, clattn_core_count());
        int ran = 0;
        for (size_t i = 0; i < n; i++) {
            cr_assert(r[i].verdict == CLATTN_VERDICT_PASS || r[i].verdict == CLATTN_VERDICT_NOT_RUN, "%s: %s", r[i].core,
                      r[i].detail);
            if (r[i].verdict == CLATTN_VERDICT_PASS) {
                cr_assert_gt(r[i].cases + r[i].refused, 0, "%s", r[i].core);
                cr_assert_leq(r[i].worst_ratio, 1.0, "%s", r[i].core);
                ran++;
            }
        }
        cr_assert_geq(ran, 4, "only %d cores ran", ran);
        unsetenv("CLATTN_CORE");
        cr_assert_eq(tu_plan_create(cl, &p.d, &p.w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        if (quick) /* kept */
            cr_assert_str_neq(clattn_plan_core(pc), first, "a quick self-test dropped the earlier failure of %s", first);
        else /* a full self-test replaces the verdicts: AUTO is back to its choice */
            cr_assert_str_eq(clattn_plan_core(pc), first);
        clattn_plan_free(pc);
    }
    /* a case that ends in an error (a host allocation failed) is an error, not a failure: nothing is kept */
    clattn_test_fail_nth_alloc(40, 0);
    cr_assert_eq(clattn_device_selftest(cl, 1, r, 32, &n), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert(clattn_test_alloc_fault_fired(), "the 40th allocation never came");
    clattn_test_fail_nth_alloc(0, 0);
    int errors = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_neq(r[i].verdict, CLATTN_VERDICT_FAIL, "%s: %s", r[i].core, r[i].detail);
        errors += r[i].verdict == CLATTN_VERDICT_ERROR;
    }
    cr_assert_eq(errors, 1, "the failed allocation made %d errors", errors);
    cr_assert(strstr(clattn_device_facts(cl), "self-test failures: none"), "%s", clattn_device_facts(cl));
    cr_assert_eq(clattn_device_selftest(NULL, 1, r, 32, &n), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_device *ref = tu_open_ref();
    cr_assert_eq(clattn_device_selftest(ref, 1, r, 32, &n), CLATTN_STATUS_UNSUPPORTED);
    clattn_device_free(ref);
    tu_problem_free(&p);
    clattn_device_free(cl);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    cr_assert_eq(system(rm), 0);
}
