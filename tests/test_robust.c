/* test_robust.c: robustness of the public API (issue 5).
 *   leaks      1000 plans created, executed and freed leave host memory and the OpenCL
 *              objects of the caller's context where they were
 *   threads    plans used concurrently from two threads (one device, two devices) give the
 *              reference's results
 *   nonfinite  NaN and +-Inf inputs: no crash, the README's propagation, on ref and OpenCL
 *   dims       zero, one and inconsistent dimensions, bad dropout and scale, fully masked rows
 *   nulls      NULL for every pointer argument of every public function: a status, never a
 *              crash, outputs untouched
 * CLATTN_ROBUST_PLANS overrides the 1000 plans of the leak loop (for quick local runs). */
#include "runtime/runtime.h"
#include "oracle.h"
#include "testutil.h"

#include <clblast_c.h>
#include <criterion/criterion.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define ROBUST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ROBUST_ASAN 1
#endif
#endif
#ifndef ROBUST_ASAN
#define ROBUST_ASAN 0
#endif

/* ------------------------------------------------------------------ a test problem */

/* One attention problem: a description, weights and inputs, all random but reproducible. */
typedef struct tcase {
    clattn_attention_desc d;
    size_t B, Tq, Tk, E, Ekv, H, dk, dv, Eo;
    float *wq, *wk, *wv, *bq, *bk, *bv, *wo, *bo;
    float *x, *kv;
    uint8_t *kpm;
    void *mask;
    size_t n_x, n_kv, n_out, n_attn, n_mask;
    clattn_attention_weights w;
} tcase;

enum { TC_QKV = 1, TC_BIAS = 2, TC_OUT = 4, TC_OUT_BIAS = 8 };

/* d: the description (its defaults resolved here as the library does); what: TC_* flags. */
static void tcase_init(tcase *c, clattn_attention_desc d, int what, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    tu_rng r = {seed};
    c->d = d;
    c->d.need_weights = 1; /* the weights are compared too (tcase_run: only when asked for) */
    c->B = d.batch, c->Tq = d.seq_q, c->E = d.embed, c->H = d.heads;
    c->Tk = d.cross ? d.seq_kv : d.seq_q;
    c->Ekv = d.cross && d.kv_embed ? d.kv_embed : d.embed;
    c->dk = (what & TC_QKV) ? d.head_dim_qk : d.embed / d.heads;
    c->dv = (what & TC_QKV) && d.head_dim_v ? d.head_dim_v : c->dk;
    c->Eo = (what & TC_OUT) ? d.out_dim : c->H * c->dv;
    const size_t H = c->H, dk = c->dk, dv = c->dv;
    if (what & TC_QKV) {
        c->w.w_query = c->wq = tu_random(&r, H * dk * c->E, -0.5f, 0.5f);
        c->w.w_key = c->wk = tu_random(&r, H * dk * c->Ekv, -0.5f, 0.5f);
        c->w.w_value = c->wv = tu_random(&r, H * dv * c->Ekv, -0.5f, 0.5f);
        if (what & TC_BIAS) {
            c->w.b_query = c->bq = tu_random(&r, H * dk, -0.5f, 0.5f);
            c->w.b_key = c->bk = tu_random(&r, H * dk, -0.5f, 0.5f);
            c->w.b_value = c->bv = tu_random(&r, H * dv, -0.5f, 0.5f);
        }
    }
    if (what & TC_OUT) {
        c->w.w_out = c->wo = tu_random(&r, c->Eo * H * dv, -0.5f, 0.5f);
        if (what & TC_OUT_BIAS) c->w.b_out = c->bo = tu_random(&r, c->Eo, -0.5f, 0.5f);
    }
    c->n_x = c->B * c->Tq * c->E;
    c->n_kv = c->B * c->Tk * c->Ekv;
    c->n_out = c->B * c->Tq * c->Eo;
    c->n_attn = c->B * H * c->Tq * c->Tk;
    c->n_mask = c->Tq * c->Tk;
    c->x = tu_random(&r, c->n_x, -1, 1);
    if (d.cross) c->kv = tu_random(&r, c->n_kv, -1, 1);
    if (d.key_padding_mask) {
        c->kpm = malloc(c->B * c->Tk);
        for (size_t i = 0; i < c->B * c->Tk; i++) c->kpm[i] = tu_next(&r) % 4 == 0;
    }
    if (d.attn_mask == CLATTN_MASK_BOOL) {
        uint8_t *m = malloc(c->n_mask);
        for (size_t i = 0; i < c->n_mask; i++) m[i] = tu_next(&r) % 4 == 0;
        c->mask = m;
    } else if (d.attn_mask == CLATTN_MASK_FLOAT) {
        float *m = malloc(c->n_mask * sizeof *m);
        for (size_t i = 0; i < c->n_mask; i++) m[i] = tu_next(&r) % 5 == 0 ? -INFINITY : tu_uniform(&r, -1, 1);
        c->mask = m;
    }
}

static void tcase_free(tcase *c)
{
    free(c->wq); free(c->wk); free(c->wv); free(c->bq); free(c->bk); free(c->bv); free(c->wo); free(c->bo);
    free(c->x); free(c->kv); free(c->kpm); free(c->mask);
    memset(c, 0, sizeof *c);
}

static clattn_attention_args tcase_args(const tcase *c, float *out, float *attn)
{
    return (clattn_attention_args){.x = c->x, .kv = c->kv, .key_padding_mask = c->kpm, .attn_mask = c->mask,
                                   .out = out, .attn = attn};
}

/* Plan, execute once, free. Returns the first failing status (and keeps clattn_last_error). */
static clattn_status tcase_run(clattn_device *dev, const tcase *c, float *out, float *attn)
{
    clattn_plan *plan = NULL;
    clattn_attention_desc d = c->d;
    d.need_weights = attn != NULL; /* without: AUTO runs the fused kernel on OpenCL */
    clattn_status st = tu_plan_create(dev, &d, &c->w, &plan);
    if (st != CLATTN_STATUS_SUCCESS) return st;
    clattn_attention_args a = tcase_args(c, out, attn);
    st = tu_plan_execute(plan, &a);
    clattn_plan_free(plan);
    return st;
}

/* out (and attn when given) against the float64 oracle of tests/oracle.c; nonfinite: NaN and Inf
 * are expected where the oracle has them (and nowhere else) */
static void tcase_oracle_check(const tcase *c, const float *out, const float *attn, int nonfinite, const char *what)
{
    double *o64 = malloc(c->n_out * sizeof *o64), *a64 = malloc(c->n_attn * sizeof *a64);
    cr_assert(o64 && a64);
    clattn_attention_args a = tcase_args(c, NULL, NULL);
    cr_assert_eq(oracle_attention(&c->d, &c->w, &a, o64, a64), 0);
    size_t (*cmp)(const float *, const double *, size_t, double, double, char *, size_t) =
        nonfinite ? oracle_compare_nonfinite : oracle_compare;
    char msg[256];
    cr_assert_eq(cmp(out, o64, c->n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s: out vs float64: %s", what, msg);
    if (attn)
        cr_assert_eq(cmp(attn, a64, c->n_attn, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s: attn vs float64: %s",
                     what, msg);
    free(o64);
    free(a64);
}

/* A buffer the test needs: its creation is asserted. */
static cl_mem test_buffer(cl_context ctx, cl_mem_flags flags, size_t bytes, void *host)
{
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx, flags, bytes, host, &err);
    cr_assert_eq(err, CL_SUCCESS, "clCreateBuffer(%zu bytes): %s", bytes, clattn_status_string(err));
    return m;
}

static clattn_device *open_cl(void)
{
    clattn_device *dev = tu_open_opencl();
    cr_assert(dev, "no OpenCL device: %s", clattn_last_error());
    return dev;
}

/* ------------------------------------------------------------------ leaks */

static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Bytes of heap in use (glibc's arenas); 0 when malloc is not glibc's (AddressSanitizer). */
static size_t heap_bytes(void)
{
    if (ROBUST_ASAN) return 0;
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static cl_uint context_refs(cl_context ctx)
{
    cl_uint n = 0;
    cr_assert_eq(clGetContextInfo(ctx, CL_CONTEXT_REFERENCE_COUNT, sizeof n, &n, NULL), CL_SUCCESS);
    return n;
}

static cl_uint queue_refs(cl_command_queue q)
{
    cl_uint n = 0;
    cr_assert_eq(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof n, &n, NULL), CL_SUCCESS);
    return n;
}

/* A reference count that the implementation may drop a little later (PoCL releases an event's
 * hold on its queue from a worker thread after the event completes): poll until it reads
 * `want`, for at most two seconds, and return the last reading. */
static cl_uint settled(cl_uint (*read)(void *), void *obj, cl_uint want)
{
    cl_uint n = read(obj);
    for (int k = 0; k < 2000 && n != want; k++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        n = read(obj);
    }
    return n;
}
/* A count no longer moving: two readings 20 ms apart agree (at most two seconds). */
static cl_uint steady(cl_uint (*read)(void *), void *obj)
{
    cl_uint n = read(obj), prev;
    int k = 0;
    do {
        prev = n;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
        n = read(obj);
    } while (n != prev && ++k < 100);
    return n;
}
static cl_uint read_ctx(void *c) { return context_refs((cl_context)c); }
static cl_uint read_queue(void *q) { return queue_refs((cl_command_queue)q); }

/* Which reference counts can tell a leak here? The spec leaves open whether a buffer or a
 * program holds its context (PoCL: yes; NVIDIA: no) and whether an event holds its queue.
 * Each class is probed on its own, after the counts settle, so the answer does not depend on
 * timing: REFS_CONTEXT when creating and releasing a buffer and a program moves the context's
 * count up by one and back, REFS_QUEUE when an event does that to its queue's count. */
enum { REFS_CONTEXT = 1, REFS_QUEUE = 2 };
static int refcounts_track_objects(cl_context ctx, cl_command_queue q)
{
    cl_int err;
    const cl_uint c0 = steady(read_ctx, ctx), q0 = steady(read_queue, q);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    int ctx_ok = context_refs(ctx) == c0 + 1;
    clReleaseMemObject(m);
    ctx_ok &= settled(read_ctx, ctx, c0) == c0;
    const char *src = "__kernel void k(__global float *a) { a[0] = 1.0f; }";
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    ctx_ok &= context_refs(ctx) == c0 + 1;
    clReleaseProgram(p);
    ctx_ok &= settled(read_ctx, ctx, c0) == c0;
    cl_event ev = NULL;
    cr_assert_eq(clEnqueueMarkerWithWaitList(q, 0, NULL, &ev), CL_SUCCESS);
    cr_assert_eq(clFinish(q), CL_SUCCESS);
    int q_ok = settled(read_queue, q, q0 + 1) == q0 + 1;
    clReleaseEvent(ev);
    q_ok &= settled(read_queue, q, q0) == q0;
    return (ctx_ok ? REFS_CONTEXT : 0) | (q_ok ? REFS_QUEUE : 0);
}

/* The shapes the leak loop cycles through: each backend path, masks, dropout, profiling,
 * execution from host arrays and from buffers (with a returned event). */
#define N_LOOP_CASES 4
static void loop_cases(tcase cs[N_LOOP_CASES])
{
    tcase_init(&cs[0], (clattn_attention_desc){.batch = 2, .seq_q = 5, .embed = 8, .heads = 2, .head_dim_qk = 3,
                                               .head_dim_v = 2, .out_dim = 6, .key_padding_mask = 1},
               TC_QKV | TC_BIAS | TC_OUT | TC_OUT_BIAS, 11);
    tcase_init(&cs[1], (clattn_attention_desc){.batch = 1, .seq_q = 4, .cross = 1, .seq_kv = 7, .embed = 6,
                                               .kv_embed = 5, .heads = 3, .head_dim_qk = 2,
                                               .attn_mask = CLATTN_MASK_FLOAT, .dropout = 0.25f, .seed = 9},
               TC_QKV, 12);
    tcase_init(&cs[2], (clattn_attention_desc){.batch = 3, .seq_q = 6, .embed = 4, .heads = 2, .causal = 1,
                                               .attn_mask = CLATTN_MASK_BOOL},
               0, 13);
    tcase_init(&cs[3], (clattn_attention_desc){.batch = 2, .seq_q = 3, .embed = 5, .heads = 1}, 0, 14);
}

/* One iteration: plan, a host execution, a buffer execution (OpenCL), a failing plan, free. */
static void loop_once(clattn_device *dev, tcase *c, int k, float *out, float *attn)
{
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &c->d, &c->w, &plan), CLATTN_STATUS_SUCCESS, "plan %d: %s", k,
                 clattn_last_error());
    int profiling = k % 2;
    const clattn_status prof = clattn_plan_set_profiling(plan, profiling);
    if (profiling && prof == CLATTN_STATUS_UNSUPPORTED && !dev->caps.profiling_ok) { /* timestamps not real here */
        static int said; /* the reason checked and printed once */
        if (!said) said = tu_profiling_refused(dev, prof, "the loop's profiled plans");
        cr_assert(said, "%s", clattn_last_error());
        profiling = 0;
    } else {
        cr_assert_eq(prof, CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    }
    clattn_attention_args a = tcase_args(c, out, k % 3 == 0 ? attn : NULL);
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "execute %d: %s", k, clattn_last_error());
    if (profiling) {
        double ms[CLATTN_STAGE_COUNT];
        cr_assert_eq(clattn_plan_stage_times(plan, ms), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    }
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL && k % 4 == 1) {
        cl_context ctx = clattn_device_context(dev);
        cl_command_queue q = clattn_device_queue(dev);
        cl_mem bx = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c->n_x * 4, c->x);
        cl_mem bkv = c->kv ? test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c->n_kv * 4, c->kv)
                           : NULL;
        cl_mem bkpm = c->kpm ? test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c->B * c->Tk, c->kpm) : NULL;
        size_t mask_bytes = c->n_mask * (c->d.attn_mask == CLATTN_MASK_FLOAT ? 4 : 1);
        cl_mem bmask = c->mask ? test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, mask_bytes, c->mask) : NULL;
        cl_mem bout = test_buffer(ctx, CL_MEM_READ_WRITE, c->n_out * 4, NULL);
        cl_mem battn = test_buffer(ctx, CL_MEM_READ_WRITE, c->n_attn * 4, NULL);
        clattn_attention_buffers b = {.x = {bx, 0}, .kv = {bkv, 0}, .key_padding_mask = {bkpm, 0},
                                      .attn_mask = {bmask, 0}, .out = {bout, 0}, .attn = {battn, 0}};
        cl_event ev = NULL;
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, &ev), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        cr_assert_eq(clEnqueueReadBuffer(q, bout, CL_TRUE, 0, c->n_out * 4, out, 1, &ev, NULL), CL_SUCCESS);
        clReleaseEvent(ev);
        cl_mem all[] = {bx, bkv, bkpm, bmask, bout, battn};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]) clReleaseMemObject(all[i]);
    }
    clattn_plan_free(plan);

    /* failure paths release what they made: a score matrix beyond the device's max
     * allocation (OpenCL: fails after the plan state exists) and a validation failure */
    clattn_attention_desc big = {.batch = 1, .seq_q = 2000, .embed = 1, .heads = 1};
    const size_t saved_alloc = dev->caps.max_alloc;
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL)
        dev->caps.max_alloc = 1000 * sizeof(float); /* below one row of scores: refused, whatever the device */
    plan = (clattn_plan *)(uintptr_t)1;
    clattn_status st = tu_plan_create(dev, &big, NULL, &plan);
    dev->caps.max_alloc = saved_alloc;
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL)
        cr_assert_eq(st, CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "%s: %s", clattn_status_string(st), clattn_last_error());
    if (st == CLATTN_STATUS_SUCCESS) clattn_plan_free(plan);
    else cr_assert_null(plan);
    clattn_attention_desc bad = c->d;
    bad.dropout = 2.0f;
    cr_assert_eq(tu_plan_create(dev, &bad, &c->w, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
}

static long loop_count(void)
{
    const char *s = getenv("CLATTN_ROBUST_PLANS");
    long n = s && *s ? strtol(s, NULL, 10) : 1000;
    return n > 0 ? n : 1000;
}

typedef struct loop_cl {
    cl_device_id id;
    cl_context ctx;
    cl_command_queue q;
    clattn_device *dev;
    cl_uint ctx_refs, q_refs;   /* before clattn_device_from_queue */
} loop_cl;

/* Our own context and queue, and a clattn device on them. */
static void loop_cl_open(loop_cl *l, cl_device_id id)
{
    cl_int err;
    l->id = id;
    l->ctx = clCreateContext(NULL, 1, &id, NULL, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    l->q = clCreateCommandQueue(l->ctx, id, CL_QUEUE_PROFILING_ENABLE, &err);
    cr_assert_eq(err, CL_SUCCESS);
    l->ctx_refs = context_refs(l->ctx);
    l->q_refs = queue_refs(l->q);
    cr_assert_eq(clattn_device_from_queue(l->q, &l->dev), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
}

/* Free the clattn device; with track, check that only our own references remain. */
static void loop_cl_close(loop_cl *l, int track)
{
    clattn_device_free(l->dev);
    /* CLBlast keeps its compiled programs (which retain the context) until its cache is cleared */
    CLBlastClearCache();
    if (track & REFS_CONTEXT) {
        const cl_uint n = settled(read_ctx, l->ctx, l->ctx_refs);
        cr_assert_eq(n, l->ctx_refs, "after clattn_device_free: context references %u, expected %u", n, l->ctx_refs);
    }
    if (track & REFS_QUEUE) {
        const cl_uint n = settled(read_queue, l->q, l->q_refs);
        cr_assert_eq(n, l->q_refs, "after clattn_device_free: queue references %u, expected %u", n, l->q_refs);
    }
    clReleaseCommandQueue(l->q);
    clReleaseContext(l->ctx);
}

static void run_plans(clattn_device *dev, tcase cs[N_LOOP_CASES], long n, float *out, float *attn)
{
    for (long k = 0; k < n; k++) loop_once(dev, &cs[k % N_LOOP_CASES], (int)k, out, attn);
}

/* On a device wrapping our own context and queue: after 20 warm-up plans, 1000 more leave the
 * context's and the queue's reference counts where they were (every buffer and program
 * retains the context in PoCL, every event the queue: checked first on this platform), and
 * after the context is gone the heap is where it was before it was made.
 * (PoCL keeps about 1 KB per program build in the context until the context is released,
 * also with plain OpenCL calls, so the heap is compared across the context's whole life.
 * The first round warms up what lives as long as the process: PoCL's device, LLVM,
 * CLBlast's tables.) */
Test(leaks, plan_loop_opencl, .timeout = 1500)
{
    clattn_device *probe = open_cl();
    cl_device_id id = NULL;
    cr_assert_eq(clGetCommandQueueInfo(clattn_device_queue(probe), CL_QUEUE_DEVICE, sizeof id, &id, NULL),
                 CL_SUCCESS);
    clattn_device_free(probe);
    tcase cs[N_LOOP_CASES];
    loop_cases(cs);
    float *out = malloc(4096 * sizeof *out), *attn = malloc(4096 * sizeof *attn);
    const long n = loop_count(), warmup = 20;

    loop_cl l;
    loop_cl_open(&l, id);
    /* A check this implementation cannot support is skipped and named (an info line: Criterion
     * 2.4 exits 1 after any warning, whatever the assertions said). Host memory is always checked. */
    const int track = refcounts_track_objects(l.ctx, l.q);
    if (!(track & REFS_CONTEXT))
        cr_log_info("skipped: the context's reference count (buffers and programs do not hold the context "
                    "on this implementation); leaked buffers/programs show as host memory only");
    if (!(track & REFS_QUEUE))
        cr_log_info("skipped: the queue's reference count (events do not hold the queue on this "
                    "implementation); leaked events show as host memory only");
    run_plans(l.dev, cs, warmup, out, attn);
    loop_cl_close(&l, track);

    const size_t heap0 = heap_bytes();
    loop_cl_open(&l, id);
    run_plans(l.dev, cs, warmup, out, attn);
    cr_assert_eq(clFinish(l.q), CL_SUCCESS);
    /* RSS from here, the new context's programs built: what a driver keeps of compiling them is not a plan's (Mesa's
     * rusticl: about 20 MB of LLVM's memory for a context's programs compiled from a cold kernel cache) */
    const size_t rss0 = rss_bytes();
    const cl_uint ctx0 = steady(read_ctx, l.ctx), q0 = steady(read_queue, l.q);
    const size_t heap_in0 = heap_bytes();
    run_plans(l.dev, cs, n, out, attn);
    const size_t heap_in1 = heap_bytes();
    if (track & REFS_CONTEXT) {
        const cl_uint c1 = settled(read_ctx, l.ctx, ctx0);
        cr_assert_eq(c1, ctx0, "%ld plans: the context's reference count went from %u to %u: buffers or programs "
                     "were not released", n, ctx0, c1);
    }
    if (track & REFS_QUEUE) {
        const cl_uint q1 = settled(read_queue, l.q, q0);
        cr_assert_eq(q1, q0, "%ld plans: the queue's reference count went from %u to %u: events were not "
                     "released", n, q0, q1);
    }
    loop_cl_close(&l, track);
    const size_t heap1 = heap_bytes(), rss1 = rss_bytes();
    cr_log_info("%ld plans on %s: heap %+ld KiB while the context lived, %+ld KiB after; RSS %+ld KiB", n,
                "the OpenCL device", ((long)heap_in1 - (long)heap_in0) / 1024,
                ((long)heap1 - (long)heap0) / 1024, ((long)rss1 - (long)rss0) / 1024);
    /* Slack: PoCL's LLVM keeps some bytes per program build for the whole process
     * (llvm::sys::RemoveFileOnSignal entries): about 115 KiB for 1000 plans here. A leaked
     * plan is >= 1 KB (plan, OpenCL state, weight copies). Under AddressSanitizer, malloc is
     * not glibc's and freed memory sits in a quarantine: LeakSanitizer checks at exit instead. */
    if (!ROBUST_ASAN) {
        const size_t heap_slack = (size_t)n * 256 + (128 << 10), rss_slack = 16 << 20;
        cr_assert(heap1 <= heap0 + heap_slack, "%ld plans: the heap grew by %zu bytes (from %zu to %zu)", n,
                  heap1 - heap0, heap0, heap1);
        cr_assert(rss1 <= rss0 + rss_slack, "%ld plans: RSS grew by %zu KiB (from %zu KiB to %zu KiB)", n,
                  (rss1 - rss0) >> 10, rss0 >> 10, rss1 >> 10);
    }
    for (int i = 0; i < N_LOOP_CASES; i++) tcase_free(&cs[i]);
    free(out);
    free(attn);
}

/* On ref there is no context: the heap does not grow at all over 1000 plans. */
Test(leaks, plan_loop_ref, .timeout = 600)
{
    clattn_device *dev = tu_open_ref();
    tcase cs[N_LOOP_CASES];
    loop_cases(cs);
    float *out = malloc(4096 * sizeof *out), *attn = malloc(4096 * sizeof *attn);
    run_plans(dev, cs, 20, out, attn);
    const size_t heap0 = heap_bytes(), rss0 = rss_bytes();
    const long n = loop_count();
    run_plans(dev, cs, n, out, attn);
    const size_t heap1 = heap_bytes(), rss1 = rss_bytes();
    cr_log_info("%ld plans on ref: heap %+ld KiB, RSS %+ld KiB", n, ((long)heap1 - (long)heap0) / 1024,
                ((long)rss1 - (long)rss0) / 1024);
    if (!ROBUST_ASAN) {
        cr_assert(heap1 <= heap0 + (16 << 10), "%ld plans: the heap grew by %zu bytes", n, heap1 - heap0);
        cr_assert(rss1 <= rss0 + (1 << 20), "%ld plans: RSS grew by %zu KiB", n, (rss1 - rss0) >> 10);
    }
    for (int i = 0; i < N_LOOP_CASES; i++) tcase_free(&cs[i]);
    free(out);
    free(attn);
    clattn_device_free(dev);
}

/* Opening and freeing devices leaves nothing behind either. */
Test(leaks, device_open_free)
{
    for (int k = 0; k < 5; k++) {
        clattn_device *dev = open_cl();
        clattn_device_free(dev);
    }
    size_t rss0 = rss_bytes(), heap0 = heap_bytes();
    for (int k = 0; k < 50; k++) {
        clattn_device *dev = open_cl(), *ref = tu_open_ref();
        clattn_device_free(dev);
        clattn_device_free(ref);
    }
    size_t rss1 = rss_bytes(), heap1 = heap_bytes();
    if (!ROBUST_ASAN) {
        cr_assert(heap1 <= heap0 + (64 << 10), "50 devices: heap grew by %zu bytes", heap1 - heap0);
        cr_assert(rss1 <= rss0 + (4 << 20), "50 devices: RSS grew by %zu KiB", (rss1 - rss0) >> 10);
    }
}

/* ------------------------------------------------------------------ threads */

typedef struct worker {
    clattn_device *dev;
    tcase *c;
    const float *ref_out, *ref_attn;
    int iterations;
    pthread_barrier_t *start;   /* both plans made: the first executions start together */
    /* results, checked by the main thread (Criterion's asserts belong to the test's thread) */
    int failures;
    char msg[512];
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    tcase *c = w->c;
    clattn_plan *plan = NULL;
    clattn_status st = tu_plan_create(w->dev, &c->d, &c->w, &plan);
    if (st != CLATTN_STATUS_SUCCESS) {
        snprintf(w->msg, sizeof w->msg, "plan: %s", clattn_last_error());
        w->failures++;
    }
    pthread_barrier_wait(w->start);
    if (st != CLATTN_STATUS_SUCCESS) return NULL;
    float *out = malloc(c->n_out * sizeof *out), *attn = malloc(c->n_attn * sizeof *attn);
    for (int it = 0; it < w->iterations; it++) {
        for (size_t i = 0; i < c->n_out; i++) out[i] = NAN;
        for (size_t i = 0; i < c->n_attn; i++) attn[i] = NAN;
        clattn_attention_args a = tcase_args(c, out, attn);
        st = tu_plan_execute(plan, &a);
        char m[256];
        if (st != CLATTN_STATUS_SUCCESS) {
            if (!w->failures++) snprintf(w->msg, sizeof w->msg, "iteration %d: %s", it, clattn_last_error());
        } else if (tu_compare(out, w->ref_out, c->n_out, TU_ATOL, TU_RTOL, m, sizeof m) ||
                   tu_compare(attn, w->ref_attn, c->n_attn, TU_ATOL, TU_RTOL, m, sizeof m)) {
            if (!w->failures++) snprintf(w->msg, sizeof w->msg, "iteration %d: %s", it, m);
        }
        /* the error detail is per thread: a failure here is not seen by the other thread */
        if (it % 10 == 0) {
            clattn_attention_desc bad = c->d;
            bad.scale = NAN;
            clattn_plan *p2 = NULL;
            if (tu_plan_create(w->dev, &bad, &c->w, &p2) != CLATTN_STATUS_INVALID_ARGUMENT ||
                !strstr(clattn_last_error(), "scale")) {
                if (!w->failures++) snprintf(w->msg, sizeof w->msg, "iteration %d: bad scale not reported", it);
            }
        }
    }
    free(out);
    free(attn);
    clattn_plan_free(plan);
    return NULL;
}

/* Two problems of different shapes and their reference results, computed on ref. */
typedef struct pair {
    tcase c[2];
    float *ref_out[2], *ref_attn[2];
} pair;

static void pair_init(pair *p)
{
    tcase_init(&p->c[0], (clattn_attention_desc){.batch = 2, .seq_q = 17, .embed = 12, .heads = 3,
                                                 .head_dim_qk = 4, .out_dim = 12, .causal = 1,
                                                 .key_padding_mask = 1},
               TC_QKV | TC_BIAS | TC_OUT | TC_OUT_BIAS, 21);
    tcase_init(&p->c[1], (clattn_attention_desc){.batch = 3, .seq_q = 9, .cross = 1, .seq_kv = 23, .embed = 8,
                                                 .kv_embed = 10, .heads = 2, .head_dim_qk = 5, .head_dim_v = 3,
                                                 .attn_mask = CLATTN_MASK_FLOAT, .dropout = 0.2f, .seed = 77},
               TC_QKV, 22);
    clattn_device *ref = tu_open_ref();
    for (int k = 0; k < 2; k++) {
        p->ref_out[k] = tu_poisoned(p->c[k].n_out);
        p->ref_attn[k] = tu_poisoned(p->c[k].n_attn);
        cr_assert_eq(tcase_run(ref, &p->c[k], p->ref_out[k], p->ref_attn[k]), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        /* the threads compare with ref; ref itself with the independent oracle */
        tcase_oracle_check(&p->c[k], p->ref_out[k], p->ref_attn[k], 0, k ? "problem 1 on ref" : "problem 0 on ref");
    }
    clattn_device_free(ref);
}

static void pair_free(pair *p)
{
    for (int k = 0; k < 2; k++) {
        free(p->ref_out[k]);
        free(p->ref_attn[k]);
        tcase_free(&p->c[k]);
    }
}

/* Thread k runs problem k on dev[k]; returns the number of failures, the first described in msg. */
static int two_threads(pair *p, clattn_device *dev_a, clattn_device *dev_b, int iterations, char *msg,
                       size_t len)
{
    pthread_barrier_t start;
    if (pthread_barrier_init(&start, NULL, 2) != 0) return snprintf(msg, len, "pthread_barrier_init"), 1;
    worker w[2];
    pthread_t t[2];
    for (int k = 0; k < 2; k++)
        w[k] = (worker){.dev = k ? dev_b : dev_a, .c = &p->c[k], .ref_out = p->ref_out[k],
                        .ref_attn = p->ref_attn[k], .iterations = iterations, .start = &start};
    if (pthread_create(&t[0], NULL, worker_main, &w[0]) != 0) return snprintf(msg, len, "pthread_create"), 1;
    if (pthread_create(&t[1], NULL, worker_main, &w[1]) != 0) abort(); /* thread 0 waits at the barrier */
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    pthread_barrier_destroy(&start);
    msg[0] = '\0';
    for (int k = 1; k >= 0; k--)
        if (w[k].failures) snprintf(msg, len, "thread %c: %d failures; first: %s", 'A' + k, w[k].failures, w[k].msg);
    return w[0].failures + w[1].failures;
}

/* One execution of a small plan with projections, so that CLBlast has run in this process. */
static void warm_up(clattn_device *dev)
{
    tcase c;
    tcase_init(&c, (clattn_attention_desc){.batch = 1, .seq_q = 3, .embed = 4, .heads = 2, .head_dim_qk = 2,
                                           .out_dim = 4},
               TC_QKV | TC_OUT, 23);
    float out[12];
    for (int i = 0; i < 12; i++) out[i] = NAN;
    cr_assert_eq(tcase_run(dev, &c, out, NULL), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    tcase_oracle_check(&c, out, NULL, 0, "warm-up");
    tcase_free(&c);
}

/* Steady state: after a first execution in this process, two threads with a plan each, on one
 * device or on two, 50 executions each, every result equal to the reference. */
static void steady_state(clattn_device *a, clattn_device *b)
{
    pair p;
    pair_init(&p);
    if (clattn_device_backend(a) == CLATTN_BACKEND_OPENCL) warm_up(a);
    char msg[600];
    int failures = two_threads(&p, a, b, 50, msg, sizeof msg);
    cr_assert_eq(failures, 0, "%s", msg);
    pair_free(&p);
}

Test(threads, one_opencl_device_two_plans, .timeout = 600)
{
    clattn_device *dev = open_cl();
    steady_state(dev, dev);
    clattn_device_free(dev);
}

Test(threads, two_opencl_devices_same_spec, .timeout = 600)
{
    clattn_device *a = open_cl(), *b = open_cl();
    steady_state(a, b);
    clattn_device_free(a);
    clattn_device_free(b);
}

Test(threads, ref_device_two_plans)
{
    clattn_device *dev = tu_open_ref();
    steady_state(dev, dev);
    clattn_device_free(dev);
}

/* Cold start: in a fresh process, two threads make their plans and start executing at the same
 * moment, so the process's first CLBlast calls come from two threads at once. CLBlast 1.5.3
 * initialises a static table on first use without a lock (clblast::Database::Database), so
 * clattn has to serialise that first use itself. Each trial is a new process: this binary run
 * again with only cold_start_trial, which runs the two threads when COLD_START_VAR names the
 * device (a fork alone would leave the child doing everything in a copy of a process with
 * Criterion's threads: tu_env_with says why that can hang). The race is narrow, hence many trials. */
#define COLD_START_VAR "CLATTN_TEST_COLD_START_DEVICE"

Test(threads, cold_start_trial, .timeout = 300)
{
    const char *spec = getenv(COLD_START_VAR);
    if (!spec) cr_skip_test("cold_start_two_threads runs this in its trials' processes (" COLD_START_VAR ")");
    /* CLBlast for every GEMM: AUTO's GEMM core on a CPU is gemm_tiles, which would leave CLBlast's first use alone */
    setenv("CLATTN_CORE", "gemm_clblast", 1);
    pair p;
    pair_init(&p);
    clattn_device *dev = NULL;
    cr_assert_eq(clattn_device_open(spec, &dev), CLATTN_STATUS_SUCCESS, "%s: %s", spec, clattn_last_error());
    char msg[600];
    const int failures = two_threads(&p, dev, dev, 2, msg, sizeof msg);
    cr_assert_eq(failures, 0, "cold start: %s", msg);
    clattn_device_free(dev);
    pair_free(&p);
}

Test(threads, cold_start_two_threads, .timeout = 900)
{
    /* the ref device would make this a test of nothing: skipped */
    const char *spec = getenv("CLATTN_TEST_DEVICE");
    if (!spec || !*spec) spec = "opencl";
    if (strcmp(spec, "ref") == 0) cr_skip_test("CLATTN_TEST_DEVICE=ref is not an OpenCL device; this test needs one");
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(len > 0 && (size_t)len < sizeof self - 1, "cannot read /proc/self/exe");
    self[len] = '\0';
    const char *argv[] = {self, "--filter", "threads/cold_start_trial", "-j1", NULL};
    char log_path[] = "/tmp/clattn_test_cold_start_XXXXXX";
    const int log_fd = mkstemp(log_path);
    cr_assert(log_fd >= 0, "mkstemp failed");
    tu_child_env env = tu_env_with(COLD_START_VAR, spec);
    const int trials = 24;
    int failed = 0;
    for (int t = 0; t < trials; t++) {
        cr_assert(ftruncate(log_fd, 0) == 0 && lseek(log_fd, 0, SEEK_SET) == 0);
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_neq(pid, -1, "fork");
        if (pid == 0) { /* async-signal-safe calls only, up to the exec */
            if (dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0) _exit(126);
            execve(self, (char *const *)argv, env.vars);
            _exit(127);
        }
        int status = 0;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed++;
            char text[4096];
            const ssize_t got = pread(log_fd, text, sizeof text - 1, 0);
            text[got > 0 ? got : 0] = '\0';
            if (WIFSIGNALED(status)) fprintf(stderr, "cold start trial %d: killed by signal %d\n", t, WTERMSIG(status));
            else fprintf(stderr, "cold start trial %d: exit %d:\n%s\n", t, WEXITSTATUS(status), text);
        } else {
            /* the trial ran (not skipped, not filtered away): Criterion's summary names one passing test */
            char text[4096];
            const ssize_t got = pread(log_fd, text, sizeof text - 1, 0);
            text[got > 0 ? got : 0] = '\0';
            cr_assert(strstr(text, "Tested: 1 | Passing: 1 | Failing: 0 | Crashing: 0"),
                      "cold start trial %d did not run its test:\n%s", t, text);
        }
    }
    tu_env_free(&env);
    close(log_fd);
    unlink(log_path);
    cr_assert_eq(failed, 0, "%d of %d cold starts failed (details on stderr): concurrent first executions in a "
                 "process are not safe", failed, trials);
}

/* ------------------------------------------------------------------ NaN and Inf */

/* A NaN score (here from a float mask entry) makes its row's weights NaN, and that query's
 * output; every other row is finite and sums to 1. */
static void nan_score_row(clattn_device *dev, int weights)
{
    tcase c;
    tcase_init(&c, (clattn_attention_desc){.batch = 2, .seq_q = 6, .embed = 8, .heads = 2, .head_dim_qk = 4,
                                           .out_dim = 8, .attn_mask = CLATTN_MASK_FLOAT},
               TC_QKV | TC_BIAS | TC_OUT | TC_OUT_BIAS, 31);
    float *m = c.mask;
    for (size_t i = 0; i < c.n_mask; i++) m[i] = 0.0f; /* no -inf: every row has keys */
    const size_t i0 = 2, j0 = 4;
    m[i0 * c.Tk + j0] = NAN;
    float *out = tu_poisoned(c.n_out), *attn = tu_poisoned(c.n_attn);
    for (size_t i = 0; i < c.n_out; i++) out[i] = -7.0f; /* finite poison: the NaN rows must be written */
    for (size_t i = 0; i < c.n_attn; i++) attn[i] = -7.0f;
    cr_assert_eq(tcase_run(dev, &c, out, weights ? attn : NULL), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    tcase_oracle_check(&c, out, weights ? attn : NULL, 1, clattn_device_name(dev));
    for (size_t bh = 0; weights && bh < c.B * c.H; bh++)
        for (size_t i = 0; i < c.Tq; i++) {
            double sum = 0.0;
            for (size_t j = 0; j < c.Tk; j++) {
                float w = attn[(bh * c.Tq + i) * c.Tk + j];
                if (i == i0) cr_assert(isnan(w), "(b*H+h) %zu, row %zu: weight %zu is %g, not NaN", bh, i, j, w);
                else cr_assert(isfinite(w), "(b*H+h) %zu, row %zu: weight %zu is %g", bh, i, j, w);
                sum += w;
            }
            if (i != i0) cr_assert(fabs(sum - 1.0) < 1e-5, "row %zu sums to %g", i, sum);
        }
    for (size_t b = 0; b < c.B; b++)
        for (size_t i = 0; i < c.Tq; i++)
            for (size_t e = 0; e < c.Eo; e++) {
                float o = out[(b * c.Tq + i) * c.Eo + e];
                cr_assert(i == i0 ? isnan(o) : isfinite(o), "batch %zu query %zu column %zu: %g", b, i, e, o);
            }
    free(out); free(attn);
    tcase_free(&c);
}

/* A NaN in V reaches every query's context even where its weight is 0 (0 * NaN = NaN):
 * no weights, 2 heads of size 2, x[token 3][column 1] = NaN and key 3 padded away. */
static void nan_in_v(clattn_device *dev, float *out, float *attn)
{
    tcase c;
    tcase_init(&c, (clattn_attention_desc){.batch = 1, .seq_q = 5, .embed = 4, .heads = 2, .key_padding_mask = 1},
               0, 32);
    const size_t t = 3, T = 5;
    memset(c.kpm, 0, T);
    c.kpm[t] = 1;
    c.x[t * 4 + 1] = NAN;
    for (size_t i = 0; i < c.n_out; i++) out[i] = -7.0f;
    for (size_t i = 0; i < c.n_attn; i++) attn[i] = -7.0f;
    cr_assert_eq(tcase_run(dev, &c, out, attn), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t h = 0; h < 2; h++)
        for (size_t i = 0; i < T; i++)
            for (size_t j = 0; j < T; j++) {
                float w = attn[(h * T + i) * T + j];
                if (h == 0 && i == t) /* query 3's head-0 query holds the NaN: its row is NaN */
                    cr_assert(isnan(w), "head 0 row 3 weight %zu: %g", j, w);
                else if (j == t)
                    cr_assert_eq(w, 0.0f, "head %zu row %zu: the padded key has weight %g", h, i, w);
                else
                    cr_assert(isfinite(w) && w > 0.0f, "head %zu row %zu key %zu: %g", h, i, j, w);
            }
    for (size_t i = 0; i < T; i++) {
        cr_assert(isnan(out[i * 4 + 1]), "query %zu, column 1 (V's NaN column): %g", i, out[i * 4 + 1]);
        cr_assert(i == t ? isnan(out[i * 4 + 0]) : isfinite(out[i * 4 + 0]), "query %zu column 0: %g", i,
                  out[i * 4]);
        cr_assert(isfinite(out[i * 4 + 2]) && isfinite(out[i * 4 + 3]), "query %zu, head 1 is finite", i);
    }
    /* -7 above is a finite poison: every NaN checked was written; every value vs the oracle */
    tcase_oracle_check(&c, out, attn, 1, clattn_device_name(dev));
    tcase_free(&c);
}

/* +-Inf in x: success, no crash; on OpenCL each element is in the same class (NaN, +Inf,
 * -Inf, finite) as the reference's and finite ones match it. */
static void inf_in_x(clattn_device *dev, int what, uint64_t seed, int causal, float *out, float *attn)
{
    tcase c;
    clattn_attention_desc d = {.batch = 2, .seq_q = 4, .embed = 6, .heads = 2, .causal = causal};
    if (what & TC_QKV) d.head_dim_qk = 3;
    if (what & TC_OUT) d.out_dim = 5;
    tcase_init(&c, d, what, seed);
    c.x[1 * 6 + 2] = INFINITY;           /* batch 0, token 1 */
    c.x[(4 + 2) * 6 + 4] = -INFINITY;    /* batch 1, token 2 */
    c.x[(4 + 3) * 6 + 0] = INFINITY;     /* batch 1, token 3 */
    c.x[(4 + 3) * 6 + 1] = -INFINITY;
    for (size_t i = 0; i < c.n_out; i++) out[i] = -7.0f; /* finite poison: the oracle check sees it */
    for (size_t i = 0; attn && i < c.n_attn; i++) attn[i] = -7.0f;
    cr_assert_eq(tcase_run(dev, &c, out, attn), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    tcase_oracle_check(&c, out, attn, 1, clattn_device_name(dev));
    tcase_free(&c);
}

static int fclass(float v) { return isnan(v) ? 0 : isinf(v) ? (v > 0 ? 1 : 2) : 3; }

static void expect_same_classes(const float *got, const float *ref, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(fclass(got[i]), fclass(ref[i]), "%s[%zu]: OpenCL %g, ref %g", what, i, got[i], ref[i]);
        if (isfinite(ref[i]))
            cr_assert(fabs(got[i] - ref[i]) <= TU_ATOL + TU_RTOL * fabs(ref[i]), "%s[%zu]: OpenCL %g, ref %g",
                      what, i, got[i], ref[i]);
    }
}

Test(nonfinite, nan_score_row_ref) { clattn_device *d = tu_open_ref(); nan_score_row(d, 1); clattn_device_free(d); }
Test(nonfinite, nan_score_row_opencl) { clattn_device *d = open_cl(); nan_score_row(d, 1); clattn_device_free(d); }
Test(nonfinite, nan_score_row_fused) { clattn_device *d = open_cl(); nan_score_row(d, 0); clattn_device_free(d); }

/* The fused kernel: a NaN in V reaches every query that sees that key (here every query:
 * no mask), as on ref; and a NaN query row makes that query's head NaN. (For a masked key
 * the algorithms differ; the README says how.) */
Test(nonfinite, nan_in_visible_v_fused)
{
    clattn_device *ref = tu_open_ref(), *cl = open_cl();
    float ro[20], co[20];
    for (int dev = 0; dev < 2; dev++) {
        tcase c;
        tcase_init(&c, (clattn_attention_desc){.batch = 1, .seq_q = 5, .embed = 4, .heads = 2}, 0, 33);
        c.x[3 * 4 + 1] = NAN;
        float *o = dev ? co : ro;
        for (size_t i = 0; i < 20; i++) o[i] = -7.0f;
        cr_assert_eq(tcase_run(dev ? cl : ref, &c, o, NULL), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        tcase_oracle_check(&c, o, NULL, 1, dev ? "fused" : "ref");
        tcase_free(&c);
    }
    for (size_t i = 0; i < 5; i++) {
        cr_assert(isnan(ro[i * 4 + 1]), "ref: query %zu column 1: %g", i, ro[i * 4 + 1]);
        cr_assert(isfinite(ro[i * 4 + 2]) && isfinite(ro[i * 4 + 3]), "ref: query %zu head 1", i);
    }
    expect_same_classes(co, ro, 20, "fused out");
    clattn_device_free(ref);
    clattn_device_free(cl);
}

Test(nonfinite, nan_in_v_ref_and_opencl)
{
    clattn_device *ref = tu_open_ref(), *cl = open_cl();
    float ro[20], ra[50], co[20], ca[50];
    nan_in_v(ref, ro, ra);
    nan_in_v(cl, co, ca);
    expect_same_classes(co, ro, 20, "out");
    expect_same_classes(ca, ra, 50, "attn");
    clattn_device_free(ref);
    clattn_device_free(cl);
}

/* ref and OpenCL on the three weight configurations; weights = 0: the fused kernel (out only). */
static void inf_cases(int causal, uint64_t seed0, int weights)
{
    clattn_device *ref = tu_open_ref(), *cl = open_cl();
    const int whats[] = {0, TC_QKV, TC_QKV | TC_BIAS | TC_OUT | TC_OUT_BIAS};
    for (int k = 0; k < 3; k++) {
        float ro[2 * 4 * 6], ra[2 * 2 * 4 * 4], co[2 * 4 * 6], ca[2 * 2 * 4 * 4];
        inf_in_x(ref, whats[k], seed0 + k, causal, ro, ra);
        inf_in_x(cl, whats[k], seed0 + k, causal, co, weights ? ca : NULL);
        size_t n_out = 2 * 4 * (whats[k] & TC_OUT ? 5 : 6);
        int nonfinite = 0;
        for (size_t i = 0; i < n_out; i++) nonfinite += !isfinite(ro[i]);
        cr_assert(nonfinite > 0, "case %d: the infinities should reach the output", k);
        expect_same_classes(co, ro, n_out, weights ? "out" : "fused out");
        if (weights) expect_same_classes(ca, ra, sizeof ra / sizeof ra[0], "attn");
    }
    clattn_device_free(ref);
    clattn_device_free(cl);
}

Test(nonfinite, inf_in_x_ref_and_opencl) { inf_cases(1, 40, 1); }

/* The same through the fused kernel, without a causal mask (with one, an infinity in V at a
 * hidden key reaches ref's context through 0 * inf and not the fused kernel's; the README says so). */
Test(nonfinite, inf_in_x_fused) { inf_cases(0, 50, 0); }

/* ------------------------------------------------------------------ dimensions and values */

static void expect_rejected(clattn_device *dev, const clattn_attention_desc *d, const clattn_attention_weights *w,
                            clattn_status want, const char *what)
{
    clattn_plan *plan = (clattn_plan *)(uintptr_t)1;
    clattn_status st = tu_plan_create(dev, d, w, &plan);
    cr_assert_eq(st, want, "%s: expected %s, got %s (%s)", what, clattn_status_string(want),
                 clattn_status_string(st), clattn_last_error());
    cr_assert_null(plan, "%s: *plan must be NULL after a failure", what);
    cr_assert(clattn_last_error()[0], "%s: no error detail", what);
}

static float Wbig[4096];

static void zero_dims(clattn_device *dev)
{
    const clattn_attention_weights w = {.w_query = Wbig, .w_key = Wbig, .w_value = Wbig, .w_out = Wbig};
    const clattn_attention_desc ok = {.batch = 2, .seq_q = 3, .cross = 1, .seq_kv = 4, .embed = 4, .kv_embed = 5,
                                      .heads = 2, .head_dim_qk = 2, .head_dim_v = 3, .out_dim = 4};
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &ok, &w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_plan_free(plan);
    clattn_attention_desc zero = {0};
    expect_rejected(dev, &zero, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "all zero, no weights");
    expect_rejected(dev, &zero, &w, CLATTN_STATUS_INVALID_ARGUMENT, "all zero, weights");
    clattn_attention_desc d;
    d = ok; d.batch = 0; expect_rejected(dev, &d, &w, CLATTN_STATUS_INVALID_ARGUMENT, "batch 0");
    d = ok; d.seq_q = 0; expect_rejected(dev, &d, &w, CLATTN_STATUS_INVALID_ARGUMENT, "seq_q 0");
    d = ok; d.seq_kv = 0; expect_rejected(dev, &d, &w, CLATTN_STATUS_INVALID_ARGUMENT, "seq_kv 0 (cross)");
    d = ok; d.embed = 0; expect_rejected(dev, &d, &w, CLATTN_STATUS_INVALID_ARGUMENT, "embed 0");
    d = ok; d.heads = 0; expect_rejected(dev, &d, &w, CLATTN_STATUS_INVALID_ARGUMENT, "heads 0");
    d = ok; d.head_dim_qk = 0; expect_rejected(dev, &d, &w, CLATTN_STATUS_INVALID_ARGUMENT, "head_dim_qk 0");
    d = ok; d.out_dim = 0; expect_rejected(dev, &d, &w, CLATTN_STATUS_INVALID_ARGUMENT, "out_dim 0 with w_out");
    /* 0 = default where documented: kv_embed (= E), head_dim_v (= dk) */
    d = ok; d.kv_embed = 0; d.head_dim_v = 0;
    cr_assert_eq(tu_plan_create(dev, &d, &w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_attention_desc got;
    cr_assert_eq(clattn_plan_desc(plan, &got), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(got.kv_embed, 4);
    cr_assert_eq(got.head_dim_v, 2);
    clattn_plan_free(plan);
}

Test(dims, zero_ref) { clattn_device *d = tu_open_ref(); zero_dims(d); clattn_device_free(d); }
Test(dims, zero_opencl) { clattn_device *d = open_cl(); zero_dims(d); clattn_device_free(d); }

/* Every dimension 1, with every weight and bias, self and cross, masks too: OpenCL = ref, and
 * both = the closed form (one key: weight 1, or 0 when masked). */
Test(dims, all_ones)
{
    clattn_device *ref = tu_open_ref(), *cl = open_cl();
    for (int variant = 0; variant < 4; variant++) {
        clattn_attention_desc d = {.batch = 1, .seq_q = 1, .embed = 1, .heads = 1, .head_dim_qk = 1,
                                   .head_dim_v = 1, .out_dim = 1};
        if (variant & 1) d.cross = 1, d.seq_kv = 1, d.kv_embed = 1;
        if (variant & 2) d.causal = 1, d.key_padding_mask = 1, d.attn_mask = CLATTN_MASK_BOOL;
        tcase c;
        tcase_init(&c, d, TC_QKV | TC_BIAS | TC_OUT | TC_OUT_BIAS, 50 + variant);
        if (c.kpm) c.kpm[0] = 0;
        if (c.mask) ((uint8_t *)c.mask)[0] = 0;
        float ro = NAN, ra = NAN, co = NAN, ca = NAN;
        cr_assert_eq(tcase_run(ref, &c, &ro, &ra), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_eq(tcase_run(cl, &c, &co, &ca), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const float src = c.kv ? c.kv[0] : c.x[0];
        const float v = src * c.wv[0] + c.bv[0];
        const float want = v * c.wo[0] + c.bo[0];
        cr_assert_float_eq(ra, 1.0f, 0.0f, "variant %d: ref weight %g", variant, ra);
        cr_assert_float_eq(ca, 1.0f, 1e-6f, "variant %d: OpenCL weight %g", variant, ca);
        cr_assert_float_eq(ro, want, 1e-5f, "variant %d: ref %g, want %g", variant, ro, want);
        cr_assert_float_eq(co, want, 1e-5f, "variant %d: OpenCL %g, want %g", variant, co, want);
        if (variant & 2) { /* the one key masked: weight 0, output b_out */
            c.kpm[0] = 1;
            cr_assert_eq(tcase_run(ref, &c, &ro, &ra), CLATTN_STATUS_SUCCESS);
            cr_assert_eq(tcase_run(cl, &c, &co, &ca), CLATTN_STATUS_SUCCESS);
            cr_assert(ra == 0.0f && ca == 0.0f && ro == c.bo[0] && co == c.bo[0],
                      "masked: weights %g %g, out %g %g, b_out %g", ra, ca, ro, co, c.bo[0]);
        }
        tcase_free(&c);
    }
    /* the no-weights module with one of everything */
    clattn_attention_desc d = {.batch = 1, .seq_q = 1, .embed = 1, .heads = 1};
    tcase c;
    tcase_init(&c, d, 0, 59);
    float ro = NAN, co = NAN;
    cr_assert_eq(tcase_run(ref, &c, &ro, NULL), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(tcase_run(cl, &c, &co, NULL), CLATTN_STATUS_SUCCESS);
    cr_assert(ro == c.x[0] && fabsf(co - c.x[0]) <= 1e-6f, "x %g: ref %g, OpenCL %g", c.x[0], ro, co);
    tcase_free(&c);
    clattn_device_free(ref);
    clattn_device_free(cl);
}

static void bad_values(clattn_device *dev)
{
    const clattn_attention_desc ok = {.batch = 1, .seq_q = 3, .embed = 6, .heads = 2};
    clattn_attention_desc d = ok;
    d.heads = 4; /* 6 % 4 != 0, no weights */
    expect_rejected(dev, &d, NULL, CLATTN_STATUS_SHAPE_MISMATCH, "heads 4 do not divide embed 6");
    d.heads = 7;
    expect_rejected(dev, &d, NULL, CLATTN_STATUS_SHAPE_MISMATCH, "heads 7 > embed 6");
    const float bad_p[] = {-0.1f, 1.0f, 1.5f, NAN, INFINITY, -INFINITY, -NAN};
    for (size_t i = 0; i < sizeof bad_p / sizeof bad_p[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "dropout %g", (double)bad_p[i]);
        d = ok;
        d.dropout = bad_p[i];
        expect_rejected(dev, &d, NULL, CLATTN_STATUS_INVALID_ARGUMENT, what);
        cr_assert(strstr(clattn_last_error(), "dropout"), "%s: '%s'", what, clattn_last_error());
    }
    const float bad_scale[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 3; i++) {
        d = ok;
        d.scale = bad_scale[i];
        expect_rejected(dev, &d, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "scale");
        cr_assert(strstr(clattn_last_error(), "scale"), "'%s'", clattn_last_error());
    }
    /* scale 0 means 1/sqrt(dk); dropout just below 1 and -0 are valid */
    clattn_plan *plan = NULL;
    d = ok;
    d.scale = 0.0f;
    d.dropout = nextafterf(1.0f, 0.0f);
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_attention_desc got;
    cr_assert_eq(clattn_plan_desc(plan, &got), CLATTN_STATUS_SUCCESS);
    cr_assert_float_eq(got.scale, 1.0f / sqrtf(3.0f), 1e-7f, "default scale %g", got.scale);
    float x[18], out[18];
    for (int i = 0; i < 18; i++) x[i] = (float)i / 10.0f;
    clattn_attention_args a = {.x = x, .out = out};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (int i = 0; i < 18; i++) out[i] = NAN;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    {
        double o64[18];
        cr_assert_eq(oracle_attention(&d, NULL, &a, o64, NULL), 0);
        char msg[256];
        cr_assert_eq(oracle_compare(out, o64, 18, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "p = 1 - ulp: %s", msg);
    }
    clattn_plan_free(plan);
    d = ok;
    d.dropout = -0.0f;
    d.scale = -2.0f; /* negative scales are finite, hence valid */
    cr_assert_eq(tu_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_plan_free(plan);
    /* flags and enums outside their range */
    d = ok; d.cross = -1; expect_rejected(dev, &d, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "cross -1");
    d = ok; d.key_padding_mask = 2; expect_rejected(dev, &d, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "kpm 2");
    d = ok; d.attn_mask = (clattn_mask_kind)-1; expect_rejected(dev, &d, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "mask -1");
    d = ok; d.layout = (clattn_layout)2; expect_rejected(dev, &d, NULL, CLATTN_STATUS_INVALID_ARGUMENT, "layout 2");
    /* sizes that overflow, alone and in products */
    d = ok; d.embed = SIZE_MAX; d.heads = 1;
    expect_rejected(dev, &d, NULL, CLATTN_STATUS_SIZE_OVERFLOW, "embed SIZE_MAX");
    d = ok; d.batch = (size_t)1 << 40; d.seq_q = (size_t)1 << 30;
    expect_rejected(dev, &d, NULL, CLATTN_STATUS_SIZE_OVERFLOW, "B*T overflows");
    const clattn_attention_weights w = {.w_query = Wbig, .w_key = Wbig, .w_value = Wbig};
    d = ok; d.head_dim_qk = SIZE_MAX; d.head_dim_v = 1;
    expect_rejected(dev, &d, &w, CLATTN_STATUS_SIZE_OVERFLOW, "dk SIZE_MAX (dk + dv wraps)");
    d = ok; d.head_dim_qk = SIZE_MAX / 2 + 1; d.head_dim_v = SIZE_MAX / 2 + 1;
    expect_rejected(dev, &d, &w, CLATTN_STATUS_SIZE_OVERFLOW, "dk + dv wraps to 0");
}

Test(dims, bad_values_ref) { clattn_device *d = tu_open_ref(); bad_values(d); clattn_device_free(d); }
Test(dims, bad_values_opencl) { clattn_device *d = open_cl(); bad_values(d); clattn_device_free(d); }

/* A fully masked row and a fully masked batch entry: weights 0; output b_out with an output
 * projection, else 0, on ref and OpenCL. */
static void fully_masked(clattn_device *dev, int with_out, int weights)
{
    clattn_attention_desc d = {.batch = 2, .seq_q = 4, .embed = 6, .heads = 2, .head_dim_qk = 3, .head_dim_v = 2,
                               .key_padding_mask = 1, .attn_mask = CLATTN_MASK_BOOL};
    if (with_out) d.out_dim = 5;
    tcase c;
    tcase_init(&c, d, TC_QKV | TC_BIAS | (with_out ? TC_OUT | TC_OUT_BIAS : 0), 60 + with_out);
    memset(c.kpm, 0, c.B * c.Tk);
    memset(c.kpm + c.Tk, 1, c.Tk);                  /* batch entry 1: every key padded */
    memset(c.mask, 0, c.n_mask);
    memset((uint8_t *)c.mask + 1 * c.Tk, 1, c.Tk);  /* query 1: no key allowed */
    float *out = tu_poisoned(c.n_out), *attn = tu_poisoned(c.n_attn);
    for (size_t i = 0; i < c.n_out; i++) out[i] = -7.0f; /* finite poison: the NaN rows must be written */
    for (size_t i = 0; i < c.n_attn; i++) attn[i] = -7.0f;
    cr_assert_eq(tcase_run(dev, &c, out, weights ? attn : NULL), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    tcase_oracle_check(&c, out, weights ? attn : NULL, 1, clattn_device_name(dev));
    for (size_t b = 0; weights && b < c.B; b++)
        for (size_t h = 0; h < c.H; h++)
            for (size_t i = 0; i < c.Tq; i++) {
                int masked = b == 1 || i == 1;
                double sum = 0;
                for (size_t j = 0; j < c.Tk; j++) {
                    float w = attn[((b * c.H + h) * c.Tq + i) * c.Tk + j];
                    if (masked) cr_assert_eq(w, 0.0f, "b %zu h %zu i %zu j %zu: %g", b, h, i, j, w);
                    sum += w;
                }
                if (!masked) cr_assert(fabs(sum - 1.0) < 1e-5, "b %zu h %zu i %zu: sum %g", b, h, i, sum);
            }
    for (size_t b = 0; b < c.B; b++)
        for (size_t i = 0; i < c.Tq; i++)
            for (size_t e = 0; e < c.Eo; e++) {
                float o = out[(b * c.Tq + i) * c.Eo + e];
                if (b == 1 || i == 1)
                    cr_assert_eq(o, with_out ? c.bo[e] : 0.0f, "b %zu i %zu e %zu: %g", b, i, e, o);
                else
                    cr_assert(isfinite(o), "b %zu i %zu e %zu: %g", b, i, e, o);
            }
    free(out); free(attn);
    tcase_free(&c);
}

Test(dims, fully_masked_ref)
{
    clattn_device *d = tu_open_ref();
    fully_masked(d, 0, 1);
    fully_masked(d, 1, 1);
    clattn_device_free(d);
}

Test(dims, fully_masked_opencl)
{
    clattn_device *d = open_cl();
    fully_masked(d, 0, 1);
    fully_masked(d, 1, 1);
    fully_masked(d, 0, 0); /* the fused kernel */
    fully_masked(d, 1, 0);
    clattn_device_free(d);
}

/* ------------------------------------------------------------------ NULL arguments */

#define SENTINEL (-7.0f)

static void fill(float *a, size_t n, float v) { for (size_t i = 0; i < n; i++) a[i] = v; }

static void expect_untouched(const float *a, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) cr_assert_eq(a[i], SENTINEL, "%s: element %zu was written (%g)", what, i, a[i]);
}

Test(nulls, devices)
{
    size_t count = 12345;
    cr_assert_eq(clattn_device_list(NULL, 0, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_device_list(NULL, 3, &count), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(count, 12345, "count written by a failing call");
    clattn_device_info info[2];
    cr_assert_eq(clattn_device_list(info, 2, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_device_list(NULL, 0, &count), CLATTN_STATUS_SUCCESS, "capacity 0 may pass NULL");

    cr_assert_eq(clattn_device_open("ref", NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_device_open(NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_device *dev = (clattn_device *)(uintptr_t)1;
    cr_assert_eq(clattn_device_from_queue(NULL, &dev), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_null(dev, "*device must be NULL after a failure");
    clattn_device *cl = open_cl();
    cr_assert_eq(clattn_device_from_queue(clattn_device_queue(cl), NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_device_from_queue(NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    /* spec NULL is the documented default, not an error */
    dev = NULL;
    cr_assert_eq(clattn_device_open(NULL, &dev), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_device_free(dev);

    /* the accessors accept NULL */
    clattn_device_free(NULL);
    cr_assert_eq(clattn_device_backend(NULL), CLATTN_BACKEND_REF);
    cr_assert_str_eq(clattn_device_name(NULL), "");
    cr_assert_null(clattn_device_notice(NULL));
    cr_assert_null(clattn_device_context(NULL));
    cr_assert_null(clattn_device_queue(NULL));
    cr_assert_not_null(clattn_status_string(0));
    cr_assert_not_null(clattn_status_string(-123456));
    cr_assert_not_null(clattn_status_string(1 << 30));
    cr_assert_str_eq(clattn_stage_name((clattn_stage)-1), "unknown");
    cr_assert_str_eq(clattn_stage_name((clattn_stage)clattn_stage_count()), "unknown");
    cr_assert_str_eq(clattn_stage_name(CLATTN_STAGE_ATTENTION), "attention");
    cr_assert_not_null(clattn_last_error());
    cr_assert_not_null(clattn_last_build_log());
    clattn_device_free(cl);
}

/* Every pointer argument of the plan functions, on a plan that declares kv and both masks. */
static void plan_nulls(clattn_device *dev, clattn_mask_kind mask_kind)
{
    tcase c;
    tcase_init(&c, (clattn_attention_desc){.batch = 2, .seq_q = 3, .cross = 1, .seq_kv = 4, .embed = 4,
                                           .kv_embed = 3, .heads = 2, .head_dim_qk = 2, .out_dim = 5,
                                           .key_padding_mask = 1, .attn_mask = mask_kind},
               TC_QKV | TC_BIAS | TC_OUT | TC_OUT_BIAS, 70);
    clattn_plan *plan = (clattn_plan *)(uintptr_t)1;
    cr_assert_eq(tu_plan_create(NULL, &c.d, &c.w, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_null(plan);
    plan = (clattn_plan *)(uintptr_t)1;
    cr_assert_eq(tu_plan_create(dev, NULL, &c.w, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_null(plan);
    cr_assert_eq(tu_plan_create(dev, &c.d, &c.w, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_plan_create(NULL, NULL, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    /* weights NULL means "no weights": this description (kv_embed != embed, out_dim) needs them */
    plan = (clattn_plan *)(uintptr_t)1;
    cr_assert_neq(tu_plan_create(dev, &c.d, NULL, &plan), CLATTN_STATUS_SUCCESS);
    cr_assert_null(plan);
    /* each weight pointer missing in turn */
    const void **ptrs[] = {&c.w.w_query, &c.w.w_key, &c.w.w_value, &c.w.w_out};
    for (int k = 0; k < 4; k++) {
        const void *keep = *ptrs[k];
        *ptrs[k] = NULL;
        plan = (clattn_plan *)(uintptr_t)1;
        cr_assert_eq(tu_plan_create(dev, &c.d, &c.w, &plan), CLATTN_STATUS_INVALID_ARGUMENT,
                     "weight %d NULL: %s", k, clattn_last_error());
        cr_assert_null(plan);
        *ptrs[k] = keep;
    }
    cr_assert_eq(tu_plan_create(dev, &c.d, &c.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());

    float *out = malloc(c.n_out * sizeof *out), *attn = malloc(c.n_attn * sizeof *attn);
    fill(out, c.n_out, SENTINEL);
    fill(attn, c.n_attn, SENTINEL);
    clattn_attention_args full = tcase_args(&c, out, attn), a;
    cr_assert_eq(tu_plan_execute(NULL, &full), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_plan_execute(plan, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_plan_execute(NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    a = full; a.x = NULL;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "x NULL");
    cr_assert(strstr(clattn_last_error(), "x"), "'%s'", clattn_last_error());
    a = full; a.kv = NULL;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "kv NULL on a cross plan");
    a = full; a.key_padding_mask = NULL;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "key_padding_mask NULL");
    a = full; a.attn_mask = NULL;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "attn_mask NULL");
    a = full; a.out = NULL;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "out NULL");
    expect_untouched(out, c.n_out, "out");
    expect_untouched(attn, c.n_attn, "attn");
    /* attn NULL is allowed */
    a = full; a.attn = NULL;
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    expect_untouched(attn, c.n_attn, "attn (not asked for)");
    tcase_oracle_check(&c, out, NULL, 0, "the call after the refused ones");

    cr_assert_eq(clattn_plan_set_seed(NULL, 5), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_set_profiling(NULL, 1), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_set_profiling(NULL, 0), CLATTN_STATUS_INVALID_ARGUMENT);
    double ms[CLATTN_STAGE_COUNT];
    for (int s = 0; s < CLATTN_STAGE_COUNT; s++) ms[s] = -7.0;
    cr_assert_eq(clattn_plan_stage_times(NULL, ms), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_stage_times(plan, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    for (int s = 0; s < CLATTN_STAGE_COUNT; s++) cr_assert_eq(ms[s], -7.0, "ms[%d] written", s);
    clattn_attention_desc dd;
    memset(&dd, 0xAB, sizeof dd);
    unsigned char before[sizeof dd];
    memcpy(before, &dd, sizeof dd);
    cr_assert_eq(clattn_plan_desc(NULL, &dd), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(memcmp(before, &dd, sizeof dd), 0, "desc written by a failing call");
    cr_assert_eq(clattn_plan_desc(plan, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_out_width(NULL), 0);
    cr_assert_eq(clattn_plan_out_width(plan), 5);

    /* buffers */
    cl_event ev = (cl_event)(uintptr_t)0x5e5e;
    if (clattn_device_backend(dev) == CLATTN_BACKEND_REF) {
        clattn_attention_buffers b = {0};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, &ev), CLATTN_STATUS_UNSUPPORTED);
        cr_assert_eq(clattn_plan_execute_buffers(NULL, &b, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clattn_plan_execute_buffers(plan, NULL, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(ev, (cl_event)(uintptr_t)0x5e5e, "event written by a failing call");
    } else {
        cl_context ctx = clattn_device_context(dev);
        cl_command_queue q = clattn_device_queue(dev);
        size_t mask_bytes = c.n_mask * (mask_kind == CLATTN_MASK_FLOAT ? 4 : 1);
        fill(out, c.n_out, SENTINEL); /* the device copies of out and attn start as sentinels */
        fill(attn, c.n_attn, SENTINEL);
        cl_mem bx = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.n_x * 4, c.x);
        cl_mem bkv = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.n_kv * 4, c.kv);
        cl_mem bkpm = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.B * c.Tk, c.kpm);
        cl_mem bmask = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, mask_bytes, c.mask);
        cl_mem bout = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.n_out * 4, out);
        cl_mem battn = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.n_attn * 4, attn);
        const clattn_attention_buffers fb = {.x = {bx, 0}, .kv = {bkv, 0}, .key_padding_mask = {bkpm, 0},
                                             .attn_mask = {bmask, 0}, .out = {bout, 0}, .attn = {battn, 0}};
        clattn_attention_buffers b;
        cr_assert_eq(clattn_plan_execute_buffers(NULL, &fb, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clattn_plan_execute_buffers(plan, NULL, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clattn_plan_execute_buffers(NULL, NULL, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        const char *names[] = {"x", "kv", "key_padding_mask", "attn_mask", "out"};
        cl_mem *mems[] = {&b.x.mem, &b.kv.mem, &b.key_padding_mask.mem, &b.attn_mask.mem, &b.out.mem};
        for (int k = 0; k < 5; k++) {
            b = fb;
            *mems[k] = NULL;
            cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT,
                         "buffers.%s.mem NULL: %s", names[k], clattn_last_error());
            cr_assert(strstr(clattn_last_error(), names[k]), "'%s' should name %s", clattn_last_error(), names[k]);
        }
        /* the wait list and its length must agree */
        cr_assert_eq(clattn_plan_execute_buffers(plan, &fb, 1, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cl_event dummy = NULL;
        cr_assert_eq(clattn_plan_execute_buffers(plan, &fb, 0, &dummy, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(ev, (cl_event)(uintptr_t)0x5e5e, "event written by a failing call");
        cr_assert_eq(clFinish(q), CL_SUCCESS);
        cr_assert_eq(clEnqueueReadBuffer(q, bout, CL_TRUE, 0, c.n_out * 4, out, 0, NULL, NULL), CL_SUCCESS);
        cr_assert_eq(clEnqueueReadBuffer(q, battn, CL_TRUE, 0, c.n_attn * 4, attn, 0, NULL, NULL), CL_SUCCESS);
        expect_untouched(out, c.n_out, "buffers.out");
        expect_untouched(attn, c.n_attn, "buffers.attn");
        /* attn.mem NULL and event NULL are allowed */
        b = fb;
        b.attn.mem = NULL;
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        cr_assert_eq(clFinish(q), CL_SUCCESS);
        cr_assert_eq(clEnqueueReadBuffer(q, bout, CL_TRUE, 0, c.n_out * 4, out, 0, NULL, NULL), CL_SUCCESS);
        tcase_oracle_check(&c, out, NULL, 0, "buffers: the call after the refused ones");
        cl_mem all[] = {bx, bkv, bkpm, bmask, bout, battn};
        for (int k = 0; k < 6; k++) clReleaseMemObject(all[k]);
    }
    clattn_plan_free(plan);
    clattn_plan_free(NULL);
    free(out);
    free(attn);
    tcase_free(&c);
}

Test(nulls, plans_ref)
{
    clattn_device *d = tu_open_ref();
    plan_nulls(d, CLATTN_MASK_BOOL);
    plan_nulls(d, CLATTN_MASK_FLOAT);
    clattn_device_free(d);
}

Test(nulls, plans_opencl)
{
    clattn_device *d = open_cl();
    plan_nulls(d, CLATTN_MASK_BOOL);
    plan_nulls(d, CLATTN_MASK_FLOAT);
    clattn_device_free(d);
}

/* The encoder layer's functions, every pointer argument in turn. */
static void encoder_nulls(clattn_device *dev)
{
    const size_t B = 2, T = 3, E = 4, F = 6, N = B * T * E;
    clattn_encoder_desc d = {.attn = {.batch = B, .seq_q = T, .embed = E, .heads = 2, .head_dim_qk = 2,
                                      .out_dim = E, .key_padding_mask = 1},
                             .ff_dim = F};
    clattn_encoder_weights w = {.attn = {.w_query = Wbig, .w_key = Wbig, .w_value = Wbig, .w_out = Wbig},
                                .ln1_weight = Wbig, .ln1_bias = Wbig, .w_ff1 = Wbig, .b_ff1 = Wbig,
                                .w_ff2 = Wbig, .b_ff2 = Wbig, .ln2_weight = Wbig, .ln2_bias = Wbig};
    clattn_encoder_plan *plan = (clattn_encoder_plan *)(uintptr_t)1;
    cr_assert_eq(tu_encoder_plan_create(NULL, &d, &w, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_null(plan);
    plan = (clattn_encoder_plan *)(uintptr_t)1;
    cr_assert_eq(tu_encoder_plan_create(dev, NULL, &w, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_null(plan);
    plan = (clattn_encoder_plan *)(uintptr_t)1;
    cr_assert_eq(tu_encoder_plan_create(dev, &d, NULL, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_null(plan);
    cr_assert_eq(tu_encoder_plan_create(dev, &d, &w, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_encoder_plan_create(NULL, NULL, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    const void **ptrs[] = {&w.attn.w_query, &w.attn.w_key, &w.attn.w_value, &w.attn.w_out, &w.ln1_weight,
                           &w.ln1_bias, &w.w_ff1, &w.b_ff1, &w.w_ff2, &w.b_ff2, &w.ln2_weight, &w.ln2_bias};
    for (size_t k = 0; k < sizeof ptrs / sizeof ptrs[0]; k++) {
        const void *keep = *ptrs[k];
        *ptrs[k] = NULL;
        plan = (clattn_encoder_plan *)(uintptr_t)1;
        clattn_status st = tu_encoder_plan_create(dev, &d, &w, &plan);
        cr_assert_eq(st, CLATTN_STATUS_INVALID_ARGUMENT, "encoder weight %zu NULL: %s (%s)", k,
                     clattn_status_string(st), clattn_last_error());
        cr_assert_null(plan);
        *ptrs[k] = keep;
    }
    cr_assert_eq(tu_encoder_plan_create(dev, &d, &w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());

    float x[24], out[24];
    for (size_t i = 0; i < N; i++) x[i] = 0.25f * (float)(i % 7) - 0.5f;
    uint8_t kpm[6] = {0, 0, 1, 0, 1, 0};
    fill(out, N, SENTINEL);
    const clattn_encoder_args full = {.x = x, .key_padding_mask = kpm, .out = out};
    clattn_encoder_args a;
    cr_assert_eq(tu_encoder_plan_execute(NULL, &full), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(tu_encoder_plan_execute(plan, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    a = full; a.x = NULL;
    cr_assert_eq(tu_encoder_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "x NULL");
    a = full; a.key_padding_mask = NULL;
    cr_assert_eq(tu_encoder_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "key_padding_mask NULL");
    a = full; a.out = NULL;
    cr_assert_eq(tu_encoder_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT, "out NULL");
    expect_untouched(out, N, "encoder out");

    cl_event ev = (cl_event)(uintptr_t)0x5e5e;
    if (clattn_device_backend(dev) == CLATTN_BACKEND_REF) {
        clattn_encoder_buffers b;
        memset(&b, 0, sizeof b);
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, &b, 0, NULL, &ev), CLATTN_STATUS_UNSUPPORTED);
        cr_assert_eq(clattn_encoder_plan_execute_buffers(NULL, &b, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, NULL, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
    } else {
        cl_context ctx = clattn_device_context(dev);
        cl_command_queue q = clattn_device_queue(dev);
        cl_mem bx = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, N * 4, x);
        cl_mem bkpm = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, B * T, kpm);
        cl_mem bout = test_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, N * 4, out);
        const clattn_encoder_buffers fb = {.x = {bx, 0}, .key_padding_mask = {bkpm, 0}, .out = {bout, 0}};
        clattn_encoder_buffers b;
        cr_assert_eq(clattn_encoder_plan_execute_buffers(NULL, &fb, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, NULL, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        const char *names[] = {"x", "key_padding_mask", "out"};
        cl_mem *mems[] = {&b.x.mem, &b.key_padding_mask.mem, &b.out.mem};
        for (int k = 0; k < 3; k++) {
            b = fb;
            *mems[k] = NULL;
            cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, &b, 0, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT,
                         "buffers.%s.mem NULL: %s", names[k], clattn_last_error());
            cr_assert(strstr(clattn_last_error(), names[k]), "'%s' should name %s", clattn_last_error(), names[k]);
        }
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, &fb, 1, NULL, &ev), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert_eq(clFinish(q), CL_SUCCESS);
        cr_assert_eq(clEnqueueReadBuffer(q, bout, CL_TRUE, 0, N * 4, out, 0, NULL, NULL), CL_SUCCESS);
        expect_untouched(out, N, "encoder buffers.out");
        cr_assert_eq(clattn_encoder_plan_execute_buffers(plan, &fb, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        cr_assert_eq(clFinish(q), CL_SUCCESS);
        clReleaseMemObject(bx);
        clReleaseMemObject(bkpm);
        clReleaseMemObject(bout);
    }
    cr_assert_eq(ev, (cl_event)(uintptr_t)0x5e5e, "event written by a failing call");
    a = full;
    cr_assert_eq(tu_encoder_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    double want[24];
    cr_assert_eq(oracle_encoder(&d, &w, x, kpm, want), 0);
    char msg[256];
    cr_assert_eq(oracle_compare(out, want, N, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "encoder out: %s", msg);
    clattn_encoder_plan_free(plan);
    clattn_encoder_plan_free(NULL);
}

Test(nulls, encoder_ref)
{
    clattn_device *d = tu_open_ref();
    encoder_nulls(d);
    clattn_device_free(d);
}

Test(nulls, encoder_opencl)
{
    clattn_device *d = open_cl();
    encoder_nulls(d);
    clattn_device_free(d);
}

/* ------------------------------------------------------------------ misuse (issue 21) */

/* One plan entered from four threads at once: its calls are serialised (a lock per plan), so every result
 * is the reference's, on OpenCL and on ref. */
typedef struct shared_worker {
    clattn_plan *plan;
    const tcase *c;
    const float *ref_out;
    float scale;          /* this thread's x is c->x * scale: each thread's result differs */
    pthread_barrier_t *start;
    int failures;
    char msg[300];
} shared_worker;

static void *shared_main(void *arg)
{
    shared_worker *w = arg;
    const tcase *c = w->c;
    float *x = malloc(c->n_x * sizeof *x), *out = malloc(c->n_out * sizeof *out);
    for (size_t i = 0; i < c->n_x; i++) x[i] = c->x[i] * w->scale;
    pthread_barrier_wait(w->start);
    for (int it = 0; it < 20; it++) {
        for (size_t i = 0; i < c->n_out; i++) out[i] = NAN;
        clattn_attention_args a = tcase_args(c, out, NULL);
        a.x = x;
        const clattn_status st = tu_plan_execute(w->plan, &a);
        char m[256];
        if (st != CLATTN_STATUS_SUCCESS) {
            if (!w->failures++) snprintf(w->msg, sizeof w->msg, "iteration %d: %s", it, clattn_last_error());
        } else if (tu_compare(out, w->ref_out, c->n_out, TU_ATOL, TU_RTOL, m, sizeof m)) {
            if (!w->failures++) snprintf(w->msg, sizeof w->msg, "iteration %d: %s", it, m);
        }
    }
    free(x), free(out);
    return NULL;
}

static void one_plan_four_threads(clattn_device *dev)
{
    tcase c;
    tcase_init(&c, (clattn_attention_desc){.batch = 2, .seq_q = 33, .embed = 16, .heads = 2, .head_dim_qk = 8,
                                           .out_dim = 16, .causal = 1},
               TC_QKV | TC_BIAS | TC_OUT, 31);
    clattn_device *ref = tu_open_ref();
    enum { NT = 4 };
    shared_worker w[NT];
    float *ref_out[NT];
    pthread_barrier_t start;
    cr_assert_eq(pthread_barrier_init(&start, NULL, NT), 0);
    clattn_plan *plan = NULL, *rp = NULL;
    c.d.need_weights = 0;
    cr_assert_eq(tu_plan_create(dev, &c.d, &c.w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_plan_create(ref, &c.d, &c.w, &rp), CLATTN_STATUS_SUCCESS);
    float *x = malloc(c.n_x * sizeof *x);
    for (int k = 0; k < NT; k++) {
        const float scale = 0.5f + 0.5f * (float)k;
        for (size_t i = 0; i < c.n_x; i++) x[i] = c.x[i] * scale;
        ref_out[k] = tu_poisoned(c.n_out);
        clattn_attention_args a = tcase_args(&c, ref_out[k], NULL);
        a.x = x;
        cr_assert_eq(tu_plan_execute(rp, &a), CLATTN_STATUS_SUCCESS);
        w[k] = (shared_worker){.plan = plan, .c = &c, .ref_out = ref_out[k], .scale = scale, .start = &start};
    }
    pthread_t t[NT];
    for (int k = 0; k < NT; k++) cr_assert_eq(pthread_create(&t[k], NULL, shared_main, &w[k]), 0);
    for (int k = 0; k < NT; k++) pthread_join(t[k], NULL);
    for (int k = 0; k < NT; k++) cr_assert_eq(w[k].failures, 0, "thread %d: %d failures; first: %s", k, w[k].failures,
                                              w[k].msg);
    pthread_barrier_destroy(&start);
    for (int k = 0; k < NT; k++) free(ref_out[k]);
    free(x);
    clattn_plan_free(plan);
    clattn_plan_free(rp);
    clattn_device_free(ref);
    tcase_free(&c);
}

Test(misuse, one_plan_from_four_threads_opencl, .timeout = 600)
{
    clattn_device *dev = open_cl();
    one_plan_four_threads(dev);
    clattn_device_free(dev);
}

Test(misuse, one_plan_from_four_threads_ref)
{
    clattn_device *dev = tu_open_ref();
    one_plan_four_threads(dev);
    clattn_device_free(dev);
}

/* Inputs the description does not declare would be ignored: refused, naming the field, output untouched. */
Test(misuse, undeclared_inputs_refused)
{
    clattn_device *devs[2] = {tu_open_ref(), open_cl()};
    tcase c;
    tcase_init(&c, (clattn_attention_desc){.batch = 1, .seq_q = 4, .embed = 4, .heads = 2}, 0, 41);
    uint8_t kpm[4] = {0};
    float fmask[16] = {0}, kv[16] = {0};
    for (int k = 0; k < 2; k++) {
        clattn_plan *plan = NULL;
        c.d.need_weights = 0;
        cr_assert_eq(tu_plan_create(devs[k], &c.d, NULL, &plan), CLATTN_STATUS_SUCCESS);
        float *out = tu_poisoned(c.n_out);
        const struct { const char *needle; clattn_attention_args a; } bad[] = {
            {"args.key_padding_mask", {.x = c.x, .out = out, .key_padding_mask = kpm}},
            {"args.attn_mask", {.x = c.x, .out = out, .attn_mask = fmask}},
            {"args.kv", {.x = c.x, .out = out, .kv = kv}},
            {"args.value", {.x = c.x, .out = out, .value = kv}},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            cr_assert_eq(tu_plan_execute(plan, &bad[i].a), CLATTN_STATUS_INVALID_ARGUMENT, "%s", bad[i].needle);
            cr_assert(strstr(clattn_last_error(), bad[i].needle) && strstr(clattn_last_error(), "ignored"), "%s",
                      clattn_last_error());
            for (size_t j = 0; j < c.n_out; j++) cr_assert(isnan(out[j]), "out written by a refused call");
        }
        clattn_plan_free(plan);
        free(out);
    }
    /* the same on buffers */
    clattn_device *cl = devs[1];
    cl_context ctx = clattn_device_context(cl);
    cl_int e;
    cl_mem bx = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, c.n_x * 4, c.x, &e);
    cl_mem bo = clCreateBuffer(ctx, CL_MEM_READ_WRITE, c.n_out * 4, NULL, &e);
    cl_mem bm = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &e);
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(cl, &c.d, NULL, &plan), CLATTN_STATUS_SUCCESS);
    const struct { const char *needle; clattn_attention_buffers b; } badb[] = {
        {"buffers.key_padding_mask", {.x = {bx, 0}, .out = {bo, 0}, .key_padding_mask = {bm, 0}}},
        {"buffers.attn_mask", {.x = {bx, 0}, .out = {bo, 0}, .attn_mask = {bm, 0}}},
        {"buffers.kv", {.x = {bx, 0}, .out = {bo, 0}, .kv = {bm, 0}}},
        {"buffers.value", {.x = {bx, 0}, .out = {bo, 0}, .value = {bm, 0}}},
    };
    for (size_t i = 0; i < sizeof badb / sizeof badb[0]; i++) {
        cr_assert_eq(clattn_plan_execute_buffers(plan, &badb[i].b, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), badb[i].needle), "%s", clattn_last_error());
    }
    clattn_plan_free(plan);
    clReleaseMemObject(bx), clReleaseMemObject(bo), clReleaseMemObject(bm);
    tcase_free(&c);
    clattn_device_free(devs[0]);
    clattn_device_free(devs[1]);
}

/* The heads as given (separate_value) and masks per batch entry / head: what the description cannot mean is refused
 * at plan creation with the field named; a value, mask or gradient of the wrong size at execution, before anything
 * is written. */
Test(misuse, heads_as_given_refusals)
{
    clattn_device *devs[2] = {tu_open_ref(), open_cl()};
    const clattn_attention_desc ok = {.batch = 2, .seq_q = 3, .seq_kv = 5, .embed = 8, .heads = 4, .kv_heads = 2,
                                      .head_dim_v = 3, .cross = 1, .separate_value = 1, .attn_mask = CLATTN_MASK_BOOL,
                                      .attn_mask_per_batch = 1, .training = 1};
    float w[64] = {0};
    const struct { const char *needle; clattn_attention_desc d; const float *wq; } bad[] = {
        {"separate_value needs cross", {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4, .separate_value = 1}, NULL},
        {"separate_value takes no Q/K/V weights", {.batch = 1, .seq_q = 3, .seq_kv = 3, .embed = 8, .heads = 4,
                                                   .head_dim_qk = 2, .cross = 1, .separate_value = 1}, w},
        {"another needs separate_value", {.batch = 1, .seq_q = 3, .seq_kv = 3, .embed = 8, .heads = 4, .head_dim_v = 3,
                                          .cross = 1}, NULL},
        {"needs cross = 1", {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4, .kv_heads = 2}, NULL},
        {"kv_embed (8) must be kv_heads", {.batch = 1, .seq_q = 3, .seq_kv = 3, .embed = 8, .kv_embed = 8, .heads = 4,
                                           .kv_heads = 2, .cross = 1}, NULL},
        {"attn_mask_per_batch without an attn_mask", {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4,
                                                      .attn_mask_per_batch = 1}, NULL},
        {"must be 0 or 1", {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4, .attn_mask = CLATTN_MASK_BOOL,
                            .attn_mask_per_head = 2}, NULL},
    };
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            clattn_attention_weights wt = {.w_query = bad[i].wq, .w_key = bad[i].wq, .w_value = bad[i].wq};
            clattn_plan *plan = NULL;
            const clattn_status st = tu_plan_create(devs[k], &bad[i].d, &wt, &plan);
            cr_assert_neq(st, CLATTN_STATUS_SUCCESS, "%s: accepted", bad[i].needle);
            cr_assert(strstr(clattn_last_error(), bad[i].needle), "%s: %s", bad[i].needle, clattn_last_error());
            cr_assert_null(plan);
        }
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(devs[k], &ok, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_attention_desc r;
        cr_assert_eq(clattn_plan_desc(plan, &r), CLATTN_STATUS_SUCCESS);
        cr_assert(r.kv_embed == 4 && r.head_dim_qk == 2 && r.head_dim_v == 3, "kv_embed %zu dk %zu dv %zu",
                  r.kv_embed, r.head_dim_qk, r.head_dim_v);
        float x[2 * 3 * 8] = {0}, kv[2 * 5 * 4] = {0}, val[2 * 5 * 6] = {0};
        uint8_t mask[2 * 3 * 5] = {0};
        float *out = tu_poisoned(2 * 3 * 12);
        const clattn_attention_args good = {.x = x, .kv = kv, .value = val, .attn_mask = mask, .out = out,
                                            .x_count = 48, .kv_count = 40, .value_count = 60, .attn_mask_count = 30,
                                            .out_count = 72};
        const struct { const char *needle; clattn_attention_args a; } wrong[] = {
            {"args.value is NULL", {.x = x, .kv = kv, .attn_mask = mask, .out = out, .x_count = 48, .kv_count = 40,
                                    .attn_mask_count = 30, .out_count = 72}},
            {"value_count", {.x = x, .kv = kv, .value = val, .attn_mask = mask, .out = out, .x_count = 48,
                             .kv_count = 40, .value_count = 59, .attn_mask_count = 30, .out_count = 72}},
            {"batch x seq_q x seq_kv = 2 x 3 x 5", {.x = x, .kv = kv, .value = val, .attn_mask = mask, .out = out,
                                                    .x_count = 48, .kv_count = 40, .value_count = 60,
                                                    .attn_mask_count = 15, .out_count = 72}},
        };
        for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
            cr_assert_neq(clattn_plan_execute(plan, &wrong[i].a), CLATTN_STATUS_SUCCESS, "%s", wrong[i].needle);
            cr_assert(strstr(clattn_last_error(), wrong[i].needle), "%s: %s", wrong[i].needle, clattn_last_error());
            for (size_t j = 0; j < 72; j++) cr_assert(isnan(out[j]), "out written by a refused call");
        }
        cr_assert_eq(clattn_plan_execute(plan, &good), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        /* the backward: grad_value's count checked, and refused on a plan without a value input */
        float gout[72] = {0}, gval[60];
        clattn_attention_args a = good;
        a.out = NULL, a.out_count = 0;
        clattn_attention_grads g = {.grad_out = gout, .grad_out_count = 72, .grad_value = gval,
                                    .grad_value_count = 61};
        cr_assert_eq(clattn_plan_backward(plan, &a, &g), CLATTN_STATUS_SHAPE_MISMATCH);
        cr_assert(strstr(clattn_last_error(), "grad_value"), "%s", clattn_last_error());
        g.grad_value_count = 60;
        cr_assert_eq(clattn_plan_backward(plan, &a, &g), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_plan_free(plan);
        free(out);
        const clattn_attention_desc nv = {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4, .training = 1};
        cr_assert_eq(tu_plan_create(devs[k], &nv, NULL, &plan), CLATTN_STATUS_SUCCESS);
        float x1[24] = {0}, go1[24] = {0}, gv1[24];
        const clattn_attention_args a1 = {.x = x1, .x_count = 24};
        const clattn_attention_grads g1 = {.grad_out = go1, .grad_out_count = 24, .grad_value = gv1,
                                           .grad_value_count = 24};
        cr_assert_eq(clattn_plan_backward(plan, &a1, &g1), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "grads.grad_value is given"), "%s", clattn_last_error());
        clattn_plan_free(plan);
    }
    clattn_device_free(devs[0]);
    clattn_device_free(devs[1]);
}

/* Each description refused on dev, with its needle in the error and no plan. */
typedef struct refusal { const char *needle; clattn_attention_desc d; } refusal;
static void refused_all(clattn_device *dev, const refusal *bad, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        clattn_plan *plan = NULL;
        cr_assert_neq(tu_plan_create(dev, &bad[i].d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", bad[i].needle);
        cr_assert(strstr(clattn_last_error(), bad[i].needle), "%s: %s", bad[i].needle, clattn_last_error());
        cr_assert_null(plan);
    }
}

/* desc.dtype (clattn 0.7): a type that is none of the three (attention, decode and encoder plans), a half training
 * plan with kv_half (training never takes kv_half), and kv_half outside 0..3 or INT8 in a prefill plan, refused by name
 * on both backends; a half plan's output that
 * overlaps its input by one element (2 bytes, not 4) refused */
Test(misuse, dtype_refusals)
{
    clattn_device *devs[2] = {tu_open_ref(), open_cl()};
    const refusal bad[] = {
        {"dtype 3 is not CLATTN_DTYPE_F32", {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4, .dtype = 3}},
        {"training with kv_half", {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4, .training = 1, .kv_half = 1,
                                   .dtype = CLATTN_DTYPE_BF16}},
        /* an int8 KV cache (clattn 0.8) is for decode plans: a prefill plan's kv_half rounds element by element */
        {"(CLATTN_KV_INT8) is for decode plans", {.batch = 1, .seq_q = 3, .embed = 8, .heads = 4, .causal = 1,
                                                  .kv_half = CLATTN_KV_INT8}},
        {"kv_half must be 0, 1 (CLATTN_KV_HALF), 2 (CLATTN_KV_BF16) or 3", {.batch = 1, .seq_q = 3, .embed = 8,
                                                                             .heads = 4, .kv_half = 4}},
    };
    for (int k = 0; k < 2; k++) {
        refused_all(devs[k], bad, sizeof bad / sizeof bad[0]);
        const clattn_attention_desc dd = {.batch = 1, .seq_q = 1, .embed = 8, .heads = 2, .causal = 1, .dtype = 5};
        clattn_decode_plan *dp = NULL;
        cr_assert_eq(clattn_decode_plan_create(devs[k], &dd, NULL, &dp), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "dtype 5 is not"), "%s", clattn_last_error());
        cr_assert_null(dp);
        const clattn_encoder_desc ed = {.attn = {.batch = 1, .seq_q = 2, .embed = 8, .heads = 2, .out_dim = 8,
                                                 .dtype = 9}, .ff_dim = 16};
        clattn_encoder_plan *ep = NULL;
        const clattn_encoder_weights ew = {0}; /* the type is refused before the weights are read */
        cr_assert_eq(clattn_encoder_plan_create(devs[k], &ed, &ew, &ep), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "desc.attn.dtype 9 is not"), "%s", clattn_last_error());
        cr_assert_null(ep);
        /* x (1, 3, 8) and out (1, 3, 8) halves in one array: out one element into x is refused, right after it runs */
        const clattn_attention_desc hd = {.batch = 1, .seq_q = 3, .embed = 8, .heads = 2, .dtype = CLATTN_DTYPE_F16};
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(devs[k], &hd, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        uint16_t mem[48] = {0};
        clattn_attention_args a = {.x = mem, .x_count = 24, .out = mem + 23, .out_count = 24};
        cr_assert_eq(clattn_plan_execute(plan, &a), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "args.out"), "%s", clattn_last_error());
        a.out = mem + 24;
        cr_assert_eq(clattn_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_plan_free(plan);
    }
    clattn_device_free(devs[0]);
    clattn_device_free(devs[1]);
}

/* desc.rope (clattn 0.8): each bad field refused by name on both backends before anything is built (a kind or scaling
 * out of range, odd or too many rotary dims, a base or factor out of range, a field set that its kind or scaling
 * would ignore, YaRN without the original context length); decode and encoder plans refuse it; the edges accepted */
Test(misuse, rope_refusals)
{
    clattn_device *devs[2] = {tu_open_ref(), open_cl()};
#define D(...) {.batch = 1, .seq_q = 3, .embed = 8, .heads = 2, .rope = {__VA_ARGS__}} /* head size 4 */
    const refusal bad[] = {
        {"rope.kind 3 is not", D(.kind = 3)},
        {"rope.scaling 4 is not", D(.kind = CLATTN_ROPE_HALF, .scaling = 4)},
        {"rope.dims (6) exceeds head_dim_qk (4)", D(.kind = CLATTN_ROPE_HALF, .dims = 6)},
        {"rope.dims 3 is odd", D(.kind = CLATTN_ROPE_INTERLEAVED, .dims = 3)},
        {"rope.theta 1: the base", D(.kind = CLATTN_ROPE_HALF, .theta = 1.0)},
        {"rope.theta -5", D(.kind = CLATTN_ROPE_HALF, .theta = -5.0)},
        {"rope.theta nan", D(.kind = CLATTN_ROPE_HALF, .theta = NAN)},
        {"rope.factor 0.5", D(.kind = CLATTN_ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_LINEAR, .factor = 0.5)},
        {"rope.factor inf", D(.kind = CLATTN_ROPE_HALF, .scaling = CLATTN_ROPE_SCALING_LINEAR, .factor = INFINITY)},
        {"rope.factor 2 without rope.scaling", D(.kind = CLATTN_ROPE_HALF, .factor = 2.0)},
        {"rope.scaling NTK with rope.dims 2", D(.kind = CLATTN_ROPE_HALF, .dims = 2,
                                                .scaling = CLATTN_ROPE_SCALING_NTK, .factor = 2.0)},
        {"rope.scaling YARN needs rope.original_max_position", D(.kind = CLATTN_ROPE_HALF,
                                                                 .scaling = CLATTN_ROPE_SCALING_YARN, .factor = 2.0)},
        {"rope.original_max_position (64) is YARN's", D(.kind = CLATTN_ROPE_HALF, .original_max_position = 64)},
        {"rope.dims is set while rope.kind is CLATTN_ROPE_NONE", D(.dims = 4)},
        {"rope.theta is set while rope.kind is CLATTN_ROPE_NONE", D(.theta = 500.0)},
        {"rope.scaling is set while", D(.scaling = CLATTN_ROPE_SCALING_LINEAR)},
        {"rope.factor is set while", D(.factor = 2.0)},
        {"rope.original_max_position is set while", D(.original_max_position = 8)},
        /* without projections the head size is embed / heads: 6 / 2 = 3, odd, so dims 0 cannot take it */
        {"rope.dims 3 is odd: values rotate in pairs (rope.dims 0 takes head_dim_qk",
         {.batch = 1, .seq_q = 3, .embed = 6, .heads = 2, .rope = {.kind = CLATTN_ROPE_HALF}}},
    };
    const clattn_attention_desc good[] = {
        D(.kind = CLATTN_ROPE_HALF, .dims = 4, .theta = 1.5, .scaling = CLATTN_ROPE_SCALING_NTK, .factor = 1.0),
        D(.kind = CLATTN_ROPE_INTERLEAVED, .dims = 2, .scaling = CLATTN_ROPE_SCALING_YARN, .factor = 1.0,
          .original_max_position = 1),
        {.batch = 1, .seq_q = 3, .embed = 6, .heads = 2, .rope = {.kind = CLATTN_ROPE_HALF, .dims = 2}},
    };
#undef D
    for (int k = 0; k < 2; k++) {
        refused_all(devs[k], bad, sizeof bad / sizeof bad[0]);
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
            clattn_plan *plan = NULL;
            cr_assert_eq(tu_plan_create(devs[k], &good[i], NULL, &plan), CLATTN_STATUS_SUCCESS, "good %zu: %s", i,
                         clattn_last_error());
            clattn_attention_desc d;
            cr_assert_eq(clattn_plan_desc(plan, &d), CLATTN_STATUS_SUCCESS);
            cr_assert(d.rope.theta >= 1.5 && d.rope.factor == 1.0 && d.rope.dims == good[i].rope.dims);
            clattn_plan_free(plan);
        }
        /* a decode plan checks its rope the same way; a verify step's draft tree is refused with rope */
        clattn_attention_desc dd = {.batch = 1, .seq_q = 2, .embed = 8, .heads = 2, .causal = 1,
                                    .rope = {.kind = CLATTN_ROPE_HALF, .dims = 3}};
        clattn_decode_plan *dp = NULL;
        cr_assert_eq(clattn_decode_plan_create(devs[k], &dd, NULL, &dp), CLATTN_STATUS_SHAPE_MISMATCH);
        cr_assert(strstr(clattn_last_error(), "rope.dims 3 is odd"), "%s", clattn_last_error());
        cr_assert_null(dp);
        dd.rope.dims = 0;
        cr_assert_eq(clattn_decode_plan_create(devs[k], &dd, NULL, &dp), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        const clattn_kv_cache_desc cd = {.batch = 1, .capacity = 4, .kv_heads = 2, .head_dim_qk = 4};
        clattn_kv_cache *cache = NULL;
        cr_assert_eq(clattn_kv_cache_create(devs[k], &cd, &cache), CLATTN_STATUS_SUCCESS);
        float x[16] = {0}, out[16];
        const uint8_t tree[4] = {1, 0, 1, 1};
        const clattn_decode_args a = {.x = x, .x_count = 16, .new_tokens = 2, .tree_mask = tree, .tree_mask_count = 4,
                                      .out = out, .out_count = 16};
        cr_assert_eq(clattn_decode_execute(dp, cache, &a), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(strstr(clattn_last_error(), "args.tree_mask with rope"), "%s", clattn_last_error());
        size_t len = 9;
        cr_assert_eq(clattn_kv_cache_lengths(cache, &len), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(len, 0, "the refused step changed the cache");
        clattn_kv_cache_free(cache);
        clattn_decode_plan_free(dp);
        const clattn_encoder_desc ed = {.attn = {.batch = 1, .seq_q = 2, .embed = 8, .heads = 2, .out_dim = 8,
                                                 .rope = {.kind = CLATTN_ROPE_HALF}}, .ff_dim = 16};
        clattn_encoder_plan *ep = NULL;
        const clattn_encoder_weights ew = {0};
        cr_assert_eq(clattn_encoder_plan_create(devs[k], &ed, &ew, &ep), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(strstr(clattn_last_error(), "desc.attn.rope"), "%s", clattn_last_error());
        cr_assert_null(ep);
    }
    clattn_device_free(devs[0]);
    clattn_device_free(devs[1]);
}

/* attention sinks (desc.sinks): what clattn 0.8 cannot compute with them refused by name (the weights out, decode and
 * encoder plans; training plans take them, as constants: test_train's sinks_*), weights.sinks only with desc.sinks
 * and with one finite (or -inf) logit per head, and clattn_plan_set_weights replacing them (refused without them,
 * and a NaN keeps the old ones): the new sinks' output against the oracle's, on both backends */
Test(misuse, sinks_refused)
{
    clattn_device *devs[2] = {tu_open_ref(), open_cl()};
#define D(...) {.batch = 1, .seq_q = 3, .embed = 8, .heads = 2, __VA_ARGS__}
    const refusal bad[] = {
        {"sinks must be 0 or 1", D(.sinks = 2)},
        {"sinks with need_weights", D(.sinks = 1, .need_weights = 1)},
        {"desc.sinks = 1 needs weights.sinks: one logit per query head (2)", D(.sinks = 1)},
    };
#undef D
    const clattn_attention_desc d = {.batch = 1, .seq_q = 3, .embed = 8, .heads = 2, .sinks = 1};
    const clattn_attention_desc plain = {.batch = 1, .seq_q = 3, .embed = 8, .heads = 2};
    float sinks[3] = {-INFINITY, 0.5f, 9.0f};
    for (int k = 0; k < 2; k++) {
        refused_all(devs[k], bad, sizeof bad / sizeof bad[0]);
        clattn_plan *plan = NULL;
        clattn_attention_weights w = {.sinks = sinks, .sinks_count = 2};
        cr_assert_eq(clattn_plan_create(devs[k], &plain, &w, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "weights.sinks is given, but desc.sinks = 0: they would be ignored"),
                  "%s", clattn_last_error());
        w.sinks_count = 3;
        cr_assert_eq(clattn_plan_create(devs[k], &d, &w, &plan), CLATTN_STATUS_SHAPE_MISMATCH);
        cr_assert(strstr(clattn_last_error(), "weights.sinks has 3 elements"), "%s", clattn_last_error());
        w.sinks_count = 2;
        const float nonfinite[2] = {NAN, INFINITY};
        for (int n = 0; n < 2; n++) {
            const float s2[2] = {0.0f, nonfinite[n]};
            const clattn_attention_weights wn = {.sinks = s2, .sinks_count = 2};
            cr_assert_eq(clattn_plan_create(devs[k], &d, &wn, &plan), CLATTN_STATUS_INVALID_ARGUMENT);
            cr_assert(strstr(clattn_last_error(), n ? "weights.sinks[1] is inf" : "weights.sinks[1] is nan"), "%s",
                      clattn_last_error());
            cr_assert_null(plan);
        }
        /* decode and encoder plans have no sinks */
        const clattn_attention_desc dd = {.batch = 1, .seq_q = 2, .embed = 8, .heads = 2, .causal = 1, .sinks = 1};
        clattn_decode_plan *dp = NULL;
        cr_assert_eq(clattn_decode_plan_create(devs[k], &dd, &w, &dp), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(strstr(clattn_last_error(), "a decode plan has no attention sinks"), "%s", clattn_last_error());
        cr_assert_null(dp);
        const clattn_encoder_desc ed = {.attn = {.batch = 1, .seq_q = 2, .embed = 8, .heads = 2, .out_dim = 8,
                                                 .sinks = 1}, .ff_dim = 16};
        clattn_encoder_plan *ep = NULL;
        const clattn_encoder_weights ew = {0};
        cr_assert_eq(clattn_encoder_plan_create(devs[k], &ed, &ew, &ep), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(strstr(clattn_last_error(), "desc.attn.sinks"), "%s", clattn_last_error());
        cr_assert_null(ep);
        /* set_weights: the sinks are the plan's arrays like the others */
        clattn_plan *without = NULL;
        cr_assert_eq(clattn_plan_create(devs[k], &plain, NULL, &without), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        cr_assert_eq(clattn_plan_set_weights(without, &w), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "weights.sinks is given, but the plan was created without them"), "%s",
                  clattn_last_error());
        clattn_plan_free(without);
        /* a plan of a problem created with other sinks, given the problem's: its output is the oracle's with these */
        const tu_attn_case c = {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .causal = 1, .sinks = 1};
        tu_problem p;
        tu_problem_make(&p, &c, 77);
        clattn_attention_weights first = p.w;
        const float other[3] = {3.0f, -INFINITY, -1.0f};
        first.sinks = other;
        cr_assert_eq(tu_plan_create(devs[k], &p.d, &first, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        clattn_attention_weights none = {0};
        cr_assert_eq(clattn_plan_set_weights(plan, &none), CLATTN_STATUS_INVALID_ARGUMENT);
        clattn_attention_weights given = p.w;
        tu_count_weights(&given, &p.d);
        given.sinks = NULL, given.sinks_count = 0;
        cr_assert_eq(clattn_plan_set_weights(plan, &given), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "weights.sinks is NULL, but the plan was created with them"), "%s",
                  clattn_last_error());
        given.sinks = p.w.sinks, given.sinks_count = 3;
        cr_assert_eq(clattn_plan_set_weights(plan, &given), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const float bad_sinks[3] = {0.0f, 0.0f, NAN};
        clattn_attention_weights nan_given = given;
        nan_given.sinks = bad_sinks;
        cr_assert_eq(clattn_plan_set_weights(plan, &nan_given), CLATTN_STATUS_INVALID_ARGUMENT); /* the last kept */
        const size_t n = 2 * 7 * 12;
        float *out = tu_poisoned(n);
        double *want = malloc(n * sizeof *want);
        cr_assert_eq(oracle_attention(&p.d, &p.w, &p.a, want, NULL), 0);
        clattn_attention_args a = p.a;
        a.out = out;
        cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        char msg[256];
        const size_t bad_n = oracle_compare(out, want, n, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad_n, 0, "device %d: the sinks set: %zu of %zu differ; %s", k, bad_n, n, msg);
        free(out), free(want);
        clattn_plan_free(plan);
        tu_problem_free(&p);
    }
    clattn_device_free(devs[0]);
    clattn_device_free(devs[1]);
}

/* args.rope_positions (and _kv) that the plan cannot take are refused, naming them, with out untouched: on a plan
 * without rope (it would be ignored), _kv on self-attention, one of the two on cross-attention, the wrong count, a
 * position past CLATTN_ROPE_MAX_POSITION; and the same on buffers. Positions that it can take run. */
Test(misuse, rope_positions_refused)
{
    clattn_device *devs[2] = {tu_open_ref(), open_cl()};
    const clattn_rope half = {.kind = CLATTN_ROPE_HALF};
    const clattn_attention_desc plain = {.batch = 1, .seq_q = 3, .embed = 8, .heads = 2};
    clattn_attention_desc self = plain, cross = plain;
    self.rope = half;
    cross.rope = half, cross.cross = 1, cross.seq_kv = 4;
    const uint32_t pq[3] = {5, 6, 7}, pk[4] = {0, 1, 2, 3}, far[3] = {0, CLATTN_ROPE_MAX_POSITION + 1u, 2};
    const struct {
        const clattn_attention_desc *d;
        const uint32_t *q, *k;
        size_t nq, nk;
        clattn_status st;
        const char *needle;
    } bad[] = {
        {&plain, pq, NULL, 3, 0, CLATTN_STATUS_INVALID_ARGUMENT, "args.rope_positions is given, but the plan has no "
                                                                 "rotary embeddings"},
        {&self, pq, pk, 3, 4, CLATTN_STATUS_INVALID_ARGUMENT, "args.rope_positions_kv is given, but the plan is "
                                                              "self-attention"},
        {&cross, pq, NULL, 3, 0, CLATTN_STATUS_INVALID_ARGUMENT, "args.rope_positions_kv is NULL but "
                                                                 "args.rope_positions is given"},
        {&cross, NULL, pk, 0, 4, CLATTN_STATUS_INVALID_ARGUMENT, "args.rope_positions is NULL but args.rope_positions_kv "
                                                                 "is given"},
        {&self, pq, NULL, 2, 0, CLATTN_STATUS_SHAPE_MISMATCH, "args.rope_positions has 2 elements"},
        {&cross, pq, pk, 3, 3, CLATTN_STATUS_SHAPE_MISMATCH, "args.rope_positions_kv has 3 elements"},
        {&self, far, NULL, 3, 0, CLATTN_STATUS_INVALID_ARGUMENT, "args.rope_positions[1] is 4194304, past the largest"},
    };
    float x[3 * 8], kv[4 * 8], out[3 * 8];
    for (size_t i = 0; i < 3 * 8; i++) x[i] = (float)i / 10.0f;
    for (size_t i = 0; i < 4 * 8; i++) kv[i] = (float)i / 20.0f;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            clattn_plan *plan = NULL;
            cr_assert_eq(tu_plan_create(devs[k], bad[i].d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s",
                         clattn_last_error());
            for (size_t j = 0; j < 3 * 8; j++) out[j] = -7.0f;
            clattn_attention_args a = {.x = x, .x_count = 3 * 8, .out = out, .out_count = 3 * 8,
                                       .rope_positions = bad[i].q, .rope_positions_count = bad[i].nq,
                                       .rope_positions_kv = bad[i].k, .rope_positions_kv_count = bad[i].nk};
            if (bad[i].d->cross) a.kv = kv, a.kv_count = 4 * 8;
            cr_assert_eq(clattn_plan_execute(plan, &a), bad[i].st, "bad %zu: %s", i, clattn_last_error());
            cr_assert(strstr(clattn_last_error(), bad[i].needle), "bad %zu: %s", i, clattn_last_error());
            for (size_t j = 0; j < 3 * 8; j++) cr_assert_eq(out[j], -7.0f, "bad %zu wrote out", i);
            if (k == 1) { /* the buffers' arrays, checked the same way before anything is enqueued */
                cl_context cx = clattn_device_context(devs[k]);
                cl_int e;
                cl_mem bx = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof x, x, &e);
                cl_mem bkv = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof kv, kv, &e);
                cl_mem bo = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof out, out, &e);
                clattn_attention_buffers b = {.x = {bx, 0}, .out = {bo, 0}, .rope_positions = bad[i].q,
                                              .rope_positions_count = bad[i].nq, .rope_positions_kv = bad[i].k,
                                              .rope_positions_kv_count = bad[i].nk};
                if (bad[i].d->cross) b.kv = (clattn_buffer){bkv, 0};
                cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), bad[i].st, "bad %zu on buffers: %s",
                             i, clattn_last_error());
                char want[160];
                snprintf(want, sizeof want, "buffers.%s", strstr(bad[i].needle, "rope_positions"));
                want[strcspn(want, " [")] = 0;
                cr_assert(strstr(clattn_last_error(), want), "bad %zu on buffers: %s (wanted %s)", i,
                          clattn_last_error(), want);
                clReleaseMemObject(bx), clReleaseMemObject(bkv), clReleaseMemObject(bo);
            }
            clattn_plan_free(plan);
        }
    /* on buffers behind a user event that completes after the call: the call returns (the positions' upload does
     * not block on the queue), then computes what the host call does */
    {
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(devs[1], &self, NULL, &plan), CLATTN_STATUS_SUCCESS);
        float host[24], got[24];
        const clattn_attention_args ha = {.x = x, .x_count = 24, .out = host, .out_count = 24, .rope_positions = pq,
                                          .rope_positions_count = 3};
        cr_assert_eq(clattn_plan_execute(plan, &ha), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cl_context cx = clattn_device_context(devs[1]);
        cl_int e;
        cl_mem bx = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof x, x, &e);
        cl_mem bo = clCreateBuffer(cx, CL_MEM_READ_WRITE, sizeof got, NULL, &e);
        cl_event gate = clCreateUserEvent(cx, &e), done = NULL;
        cr_assert_eq(e, CL_SUCCESS);
        const clattn_attention_buffers b = {.x = {bx, 0}, .out = {bo, 0}, .rope_positions = pq,
                                            .rope_positions_count = 3};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 1, &gate, &done), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        clSetUserEventStatus(gate, CL_COMPLETE);
        cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS);
        cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(devs[1]), bo, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL),
                     CL_SUCCESS);
        cr_assert(memcmp(got, host, sizeof got) == 0, "positions on buffers differ from the host call's");
        clReleaseEvent(gate), clReleaseEvent(done);
        clReleaseMemObject(bx), clReleaseMemObject(bo);
        clattn_plan_free(plan);
    }
    /* positions it can take: every row at 0 is the rotation by 0, the same output as a plan without rope */
    const uint32_t zero[3] = {0, 0, 0};
    for (int k = 0; k < 2; k++) {
        float want[3 * 8];
        clattn_plan *p0 = NULL, *p1 = NULL;
        cr_assert_eq(tu_plan_create(devs[k], &plain, NULL, &p0), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(tu_plan_create(devs[k], &self, NULL, &p1), CLATTN_STATUS_SUCCESS);
        const clattn_attention_args a0 = {.x = x, .x_count = 24, .out = want, .out_count = 24};
        cr_assert_eq(clattn_plan_execute(p0, &a0), CLATTN_STATUS_SUCCESS);
        const clattn_attention_args a1 = {.x = x, .x_count = 24, .out = out, .out_count = 24, .rope_positions = zero,
                                          .rope_positions_count = 3};
        cr_assert_eq(clattn_plan_execute(p1, &a1), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (size_t j = 0; j < 24; j++) cr_assert_float_eq(out[j], want[j], 1e-6f, "position 0: element %zu", j);
        clattn_plan_free(p0), clattn_plan_free(p1);
    }
    clattn_device_free(devs[0]);
    clattn_device_free(devs[1]);
}

/* A decode step's rope_positions (clattn 0.8) refused with the reason, the output and the cache's lengths untouched,
 * on host arrays and on buffers: given to a plan without rope (it would be ignored), the wrong count (a padded step's
 * B*n rows, a packed step's cu_new[B]), a position past CLATTN_ROPE_MAX_POSITION. The largest position is taken: a
 * step at positions up to it computes what a prefill plan computes at the same positions. */
Test(misuse, decode_positions_refused)
{
    clattn_device *devs[2] = {tu_open_ref(), open_cl()};
    enum { B = 2, N = 2, E = 8 }; /* x is each token's Q, K and V: 2 heads of 4 */
    const clattn_attention_desc plain = {.batch = B, .seq_q = N, .embed = E, .heads = 2, .causal = 1};
    clattn_attention_desc roped = plain;
    roped.rope = (clattn_rope){.kind = CLATTN_ROPE_HALF};
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = 8, .kv_heads = 2, .head_dim_qk = 4, .head_dim_v = 4};
    const uint32_t four[4] = {1, 2, 3, 4}, far[4] = {1, 2, CLATTN_ROPE_MAX_POSITION + 1u, 4};
    const uint32_t cu[B + 1] = {0, 1, 3};
    const struct {
        const clattn_attention_desc *d;
        const uint32_t *pos, *cu;
        size_t npos;
        clattn_status st;
        const char *needle;
    } bad[] = {
        {&plain, four, NULL, 4, CLATTN_STATUS_INVALID_ARGUMENT, "rope_positions is given, but the plan has no rotary"},
        {&roped, four, NULL, 3, CLATTN_STATUS_SHAPE_MISMATCH, "rope_positions has 3 elements"},
        {&roped, four, cu, 4, CLATTN_STATUS_SHAPE_MISMATCH, "rope_positions has 4 elements"},
        {&roped, far, NULL, 4, CLATTN_STATUS_INVALID_ARGUMENT, "rope_positions[2] is 4194304, past the largest"},
    };
    float x[B * N * E], out[B * N * E];
    for (size_t i = 0; i < B * N * E; i++) x[i] = (float)i / 10.0f - 1.0f;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            clattn_decode_plan *plan = NULL;
            clattn_kv_cache *cache = NULL;
            cr_assert_eq(tu_decode_plan_create(devs[k], bad[i].d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s",
                         clattn_last_error());
            cr_assert_eq(clattn_kv_cache_create(devs[k], &cd, &cache), CLATTN_STATUS_SUCCESS);
            const size_t rows = bad[i].cu ? bad[i].cu[B] : B * N;
            for (size_t j = 0; j < B * N * E; j++) out[j] = -7.0f;
            clattn_decode_args a = {.x = x, .x_count = rows * E, .new_tokens = N, .out = out, .out_count = rows * E,
                                    .cu_new = bad[i].cu, .cu_new_count = bad[i].cu ? B + 1 : 0,
                                    .rope_positions = bad[i].pos, .rope_positions_count = bad[i].npos};
            cr_assert_eq(clattn_decode_execute(plan, cache, &a), bad[i].st, "bad %zu: %s", i, clattn_last_error());
            cr_assert(strstr(clattn_last_error(), bad[i].needle), "bad %zu: %s", i, clattn_last_error());
            cr_assert(strstr(clattn_last_error(), "args.rope_positions"), "bad %zu: %s", i, clattn_last_error());
            for (size_t j = 0; j < B * N * E; j++) cr_assert_eq(out[j], -7.0f, "bad %zu wrote out", i);
            if (k == 1) { /* on buffers, checked before anything is enqueued */
                cl_context cx = clattn_device_context(devs[k]);
                cl_int e;
                cl_mem bx = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof x, x, &e);
                cl_mem bo = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof out, out, &e);
                const clattn_decode_buffers b = {.x = {bx, 0}, .out = {bo, 0}, .rope_positions = bad[i].pos,
                                                 .rope_positions_count = bad[i].npos};
                const clattn_status st = bad[i].cu ? clattn_decode_execute_buffers_varlen(plan, cache, &b, N, cu, B + 1,
                                                                                         0, NULL, NULL)
                                                   : clattn_decode_execute_buffers(plan, cache, &b, N, NULL, 0, NULL,
                                                                                   NULL);
                cr_assert_eq(st, bad[i].st, "bad %zu on buffers: %s", i, clattn_last_error());
                cr_assert(strstr(clattn_last_error(), "buffers.rope_positions"), "bad %zu on buffers: %s", i,
                          clattn_last_error());
                float back[B * N * E];
                cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(devs[k]), bo, CL_TRUE, 0, sizeof back, back, 0,
                                                 NULL, NULL), CL_SUCCESS);
                for (size_t j = 0; j < B * N * E; j++) cr_assert_eq(back[j], -7.0f, "bad %zu on buffers wrote out", i);
                clReleaseMemObject(bx), clReleaseMemObject(bo);
            }
            size_t lens[B];
            cr_assert_eq(clattn_kv_cache_lengths(cache, lens), CLATTN_STATUS_SUCCESS);
            cr_assert(lens[0] == 0 && lens[1] == 0, "bad %zu changed the cache's lengths", i);
            clattn_kv_cache_free(cache);
            clattn_decode_plan_free(plan);
        }
    /* positions inside out (the step would overwrite them as it writes out): refused, nothing written */
    for (int k = 0; k < 2; k++) {
        clattn_decode_plan *plan = NULL;
        clattn_kv_cache *cache = NULL;
        cr_assert_eq(tu_decode_plan_create(devs[k], &roped, NULL, &plan), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(clattn_kv_cache_create(devs[k], &cd, &cache), CLATTN_STATUS_SUCCESS);
        /* (allocated memory: out's floats and, at byte 32, the positions, each stored as its own type) */
        unsigned char *mem = malloc(B * N * E * sizeof(float)), before[B * N * E * sizeof(float)];
        for (size_t j = 0; j < B * N * E; j++) memcpy(mem + j * sizeof(float), &(float){-7.0f}, sizeof(float));
        memcpy(mem + 8 * sizeof(float), four, sizeof four); /* valid positions, in out's memory */
        memcpy(before, mem, sizeof before);
        const clattn_decode_args a = {.x = x, .x_count = B * N * E, .new_tokens = N, .out = mem,
                                      .out_count = B * N * E, .rope_positions = (const uint32_t *)(mem + 32),
                                      .rope_positions_count = B * N};
        cr_assert_eq(clattn_decode_execute(plan, cache, &a), CLATTN_STATUS_INVALID_ARGUMENT, "%s", clattn_last_error());
        cr_assert(strstr(clattn_last_error(), "args.out overlaps args.rope_positions"), "%s", clattn_last_error());
        cr_assert_eq(memcmp(before, mem, sizeof before), 0, "the refused step wrote out");
        free(mem);
        clattn_kv_cache_free(cache);
        clattn_decode_plan_free(plan);
    }
    /* the largest position taken: the step equals a prefill plan's run at the same positions */
    const uint32_t top[B * N] = {CLATTN_ROPE_MAX_POSITION - 1u, CLATTN_ROPE_MAX_POSITION, 3, 1};
    for (int k = 0; k < 2; k++) {
        clattn_decode_plan *plan = NULL;
        clattn_kv_cache *cache = NULL;
        clattn_plan *prefill = NULL;
        cr_assert_eq(tu_decode_plan_create(devs[k], &roped, NULL, &plan), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(clattn_kv_cache_create(devs[k], &cd, &cache), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(tu_plan_create(devs[k], &roped, NULL, &prefill), CLATTN_STATUS_SUCCESS);
        float want[B * N * E];
        const clattn_attention_args pa = {.x = x, .x_count = B * N * E, .out = want, .out_count = B * N * E,
                                          .rope_positions = top, .rope_positions_count = B * N};
        cr_assert_eq(clattn_plan_execute(prefill, &pa), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const clattn_decode_args a = {.x = x, .x_count = B * N * E, .new_tokens = N, .out = out,
                                      .out_count = B * N * E, .rope_positions = top, .rope_positions_count = B * N};
        cr_assert_eq(clattn_decode_execute(plan, cache, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        for (size_t j = 0; j < B * N * E; j++)
            cr_assert_float_eq(out[j], want[j], 1e-5f, "device %d: element %zu at the largest positions", k, j);
        clattn_plan_free(prefill);
        clattn_kv_cache_free(cache);
        clattn_decode_plan_free(plan);
    }
    clattn_device_free(devs[0]);
    clattn_device_free(devs[1]);
}

/* An output that shares memory with an input (or with the other output) is refused on every algorithm
 * (the fused kernels read Q, K and V while they write the output); one that only shares the buffer, in
 * ranges apart, runs and computes the oracle's numbers. Sub-buffers are seen through. */
Test(misuse, overlapping_buffers_refused)
{
    clattn_device *cl = open_cl();
    tcase c;
    tcase_init(&c, (clattn_attention_desc){.batch = 2, .seq_q = 9, .embed = 8, .heads = 2}, 0, 43);
    cl_context ctx = clattn_device_context(cl);
    cl_command_queue q = clattn_device_queue(cl);
    const size_t nx = c.n_x, no = c.n_out, na = c.n_attn;
    cl_int e;
    /* one buffer: x at 0, room after it */
    const size_t total = nx + no + na + 64;
    cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE, total * 4, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(q, big, CL_TRUE, 0, nx * 4, c.x, 0, NULL, NULL), CL_SUCCESS);
    static const clattn_algorithm algs[] = {CLATTN_ALGORITHM_FUSED, CLATTN_ALGORITHM_UNFUSED};
    for (int k = 0; k < 2; k++) {
        clattn_attention_desc d = c.d;
        d.algorithm = algs[k];
        d.need_weights = algs[k] == CLATTN_ALGORITHM_UNFUSED;
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(cl, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        /* out over x (in place), out starting inside x */
        clattn_attention_buffers b = {.x = {big, 0}, .out = {big, 0}};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(clattn_last_error(), "buffers.out overlaps buffers.x"), "%s", clattn_last_error());
        b.out.offset = nx - 1;
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        /* a sub-buffer of the same memory as out */
        cl_buffer_region reg = {0, nx * 4};
        cl_mem sub = clCreateSubBuffer(big, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
        cr_assert_eq(e, CL_SUCCESS);
        b.out = (clattn_buffer){sub, 0};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
        clReleaseMemObject(sub);
        /* the weights over the output */
        if (d.need_weights) {
            b = (clattn_attention_buffers){.x = {big, 0}, .out = {big, nx}, .attn = {big, nx + no - 1}};
            cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
            cr_assert(strstr(clattn_last_error(), "buffers.out overlaps buffers.attn"), "%s", clattn_last_error());
        }
        /* ranges apart in one buffer: runs, right */
        b = (clattn_attention_buffers){.x = {big, 0}, .out = {big, nx}, .attn = {d.need_weights ? big : NULL, nx + no}};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &b, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        float *out = tu_poisoned(no);
        cr_assert_eq(clEnqueueReadBuffer(q, big, CL_TRUE, nx * 4, no * 4, out, 0, NULL, NULL), CL_SUCCESS);
        tcase_oracle_check(&c, out, NULL, 0, clattn_algorithm_name(algs[k]));
        free(out);
        clattn_plan_free(plan);
    }
    clReleaseMemObject(big);
    tcase_free(&c);
    clattn_device_free(cl);
}
