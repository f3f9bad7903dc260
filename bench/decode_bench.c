/* decode_bench.c: `clattn-bench --decode`, timing one decode step against a KV cache.
 *
 * For each context length C: a decode plan (Tn = 1) and a cache of C tokens per sequence, filled with
 * random keys and values through clattn_kv_cache_write (a prefill of 32768 tokens would take minutes
 * on a CPU and is not what is timed). Then:
 *   first step   the first decode step after the plan's creation and a short prefill: what a user waits
 *                for after prompt processing (no kernel may be compiled here)
 *   step         clattn_decode_execute for one new token per sequence (--new-tokens N: N, a speculative
 *                decoding's verify step), from host arrays (upload x, the
 *                step, read back the output), the cache truncated back to C between steps (host only);
 *                median, min, max over --iters steps after --warmup
 * and from those: tokens per second (B * N / step), the KV bytes one step reads (every visible cached key
 * and value of every sequence and KV head: B * HK * min(C + N, W) * (dk + dv) * element size) per second
 * (kv_gbps), next to the device's own bandwidth measured in the same run by a plain copy kernel
 * (copy_gbps: 2 * bytes / time, read + write, median of 7 over 256 MiB or the device's max allocation,
 * measured right before each context's steps, since a shared machine's bandwidth drifts), and their
 * ratio kv_bandwidth_fraction. The step also reads the projection weights (weight_bytes,
 * reported): keep --dim small (default 128) to time the cache, or give a real model's width;
 * step_bandwidth_fraction counts both (KV + weight bytes per step time, over copy_gbps). stages_ms: one more
 * step after the timed ones, with profiling markers between its stages (clattn_decode_plan_stage_times;
 * absent where the device has none). --batch 1,8,64 runs each batch size (tokens/s is the whole batch's);
 * --ragged spreads the sequences' lengths from C down to C/2, as a server's batch of requests. --page-size N: a paged
 * cache (pages of N positions; each sequence's pages in order in the pool, as clattn_kv_cache_write lays them out).
 */
#include "bench_util.h"
#include "decode_bench.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const size_t sweep_ctx[] = {512, 1024, 2048, 4096, 8192, 16384, 32768};
#define NSWEEP (sizeof sweep_ctx / sizeof sweep_ctx[0])

#define MAX_BATCHES 16

typedef struct dopts {
    const char *device;
    size_t batch, context, heads, kv_heads, head_dim, dim, window, splits;
    size_t new_tokens; /* --new-tokens N: N new tokens per sequence and step (a speculative verify's drafts) */
    size_t page_size;  /* --page-size N: a paged cache (0: contiguous) */
    size_t batches[MAX_BATCHES], nbatches; /* --batch B[,B...]: one run per batch size */
    int kv_type, iters, warmup, sweep, json, progress, ragged; /* kv_type: a clattn_kv_type */
    int tree; /* --tree: the N new tokens are a binary draft tree (token i's parent (i-1)/2), args.tree_mask */
} dopts;

typedef struct dres {
    char core[32];          /* the decode core that ran ("ref" on ref) */
    char gemm[32];          /* the GEMM core of its projections above a few rows ("ref" on ref) */
    size_t batch, context, parts, page_size; /* page_size: the cache's own (clattn_kv_cache_desc_get) */
    double copy_gbps; /* measured just before this context's steps: the machine's state then */
    double step_ms, step_min, step_max, first_ms, tokens_per_s, kv_bytes, kv_gbps, weight_bytes, step_gbps;
    double stage_ms[CLATTN_DECODE_STAGE_COUNT]; /* one more step, profiled (all -1: the device has none) */
} dres;

static const char *const kv_names[] = {"float", "half", "bf16", "int8"}; /* by clattn_kv_type */

static size_t dsize(const char *opt, const char *s, size_t min)
{
    if (!s) bench_usage_die("%s needs a value", opt);
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < min || v > 0xFFFFFFFFull)
        bench_usage_die("%s: '%s' is not an integer >= %zu", opt, s, min);
    return (size_t)v;
}

void clattn_bench_decode_usage(FILE *f)
{
    fprintf(f,
            "usage: clattn-bench --decode [--context C | --sweep] [--device SPEC] [--batch B[,B...]] [--ragged]\n"
            "                    [--heads H] [--kv-heads N] [--head-dim D] [--dim E] [--kv-type T] [--window W]\n"
            "                    [--splits N] [--new-tokens N [--tree]] [--page-size N] [--iters N] [--warmup W] [--json]\n"
            "                    [--progress]\n"
            "  Times one decode step (B sequences, one new token each) against a KV cache of C tokens.\n"
            "  --batch 1,8,64: one run per batch size (tokens/s is the whole batch's). --ragged: the sequences'\n"
            "  lengths spread evenly from C down to C/2, as a server's batch of requests.\n"
            "  Defaults: --context 8192 --batch 1 --heads 32 --kv-heads 8 --head-dim 128 --dim 128 --iters 20\n"
            "  --warmup 3. --dim is the width of x (the projections read H*D*E + N*2D*E + E*H*D weights per\n"
            "  step; small by default so that the step is the cache read). --sweep: C = 512 ... 32768.\n"
            "  --kv-type float|half|bf16|int8: the cache's element type (--kv-half = --kv-type half).\n"
            "  --new-tokens N: N new tokens per sequence and step, 1..16 (a speculative verify; default 1);\n"
            "  --tree: they are a binary draft tree (token i's parent (i-1)/2), given as args.tree_mask.\n"
            "  --page-size N: a paged KV cache, pages of N positions (a power of two; default 0, contiguous).\n"
            "  --splits N: split-K parts (0 = automatic). Reports step time, tokens/s, kv_gbps (KV bytes read\n"
            "  per second), copy_gbps (a plain copy kernel on the same device, same run) and their ratio\n"
            "  kv_bandwidth_fraction, and step_bandwidth_fraction over every byte the step reads (KV cache +\n"
            "  projection weights), and one more step's stage times (stages_ms); --json: one object per\n"
            "  context and batch size.\n");
}

static void parse(int argc, char **argv, dopts *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 1, o->context = 8192, o->heads = 32, o->kv_heads = 8, o->head_dim = 128, o->dim = 128;
    o->iters = 20, o->warmup = 3, o->new_tokens = 1;
    int ctx_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--decode")) continue;
        else if (!strcmp(a, "--device")) { if (!v) bench_usage_die("--device needs a value"); o->device = v; i++; }
        else if (!strcmp(a, "--context")) { o->context = dsize(a, v, 1); ctx_given = 1; i++; }
        else if (!strcmp(a, "--batch")) {
            if (!v) bench_usage_die("--batch needs a value");
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            o->nbatches = 0;
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->nbatches == MAX_BATCHES) bench_usage_die("--batch: at most %d sizes", MAX_BATCHES);
                o->batches[o->nbatches++] = dsize(a, t, 1);
            }
            if (!o->nbatches) bench_usage_die("--batch needs a value");
            i++;
        }
        else if (!strcmp(a, "--ragged")) o->ragged = 1;
        else if (!strcmp(a, "--heads")) { o->heads = dsize(a, v, 1); i++; }
        else if (!strcmp(a, "--kv-heads")) { o->kv_heads = dsize(a, v, 1); i++; }
        else if (!strcmp(a, "--head-dim")) { o->head_dim = dsize(a, v, 1); i++; }
        else if (!strcmp(a, "--dim")) { o->dim = dsize(a, v, 1); i++; }
        else if (!strcmp(a, "--window")) { o->window = dsize(a, v, 1); i++; }
        else if (!strcmp(a, "--splits")) { o->splits = dsize(a, v, 0); i++; }
        else if (!strcmp(a, "--new-tokens")) { o->new_tokens = dsize(a, v, 1); i++; }
        else if (!strcmp(a, "--page-size")) { o->page_size = dsize(a, v, 1); i++; }
        else if (!strcmp(a, "--iters")) { o->iters = (int)dsize(a, v, 1); i++; }
        else if (!strcmp(a, "--warmup")) { o->warmup = (int)dsize(a, v, 0); i++; }
        else if (!strcmp(a, "--kv-half")) o->kv_type = CLATTN_KV_HALF;
        else if (!strcmp(a, "--kv-type")) {
            if (!v) bench_usage_die("--kv-type needs a value");
            int t = 0;
            while (t < 4 && strcmp(v, kv_names[t])) t++;
            if (t == 4) bench_usage_die("--kv-type: '%s' is not float, half, bf16 or int8", v);
            o->kv_type = t;
            i++;
        }
        else if (!strcmp(a, "--sweep")) o->sweep = 1;
        else if (!strcmp(a, "--tree")) o->tree = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--progress")) o->progress = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { clattn_bench_decode_usage(stdout); exit(0); }
        else {
            fprintf(stderr, "clattn-bench: --decode: unknown option '%s'\n", a);
            clattn_bench_decode_usage(stderr);
            exit(2);
        }
    }
    if (!o->nbatches) o->batches[o->nbatches++] = o->batch;
    if (o->sweep && ctx_given) bench_usage_die("--context and --sweep do not go together (the sweep sets the context)");
    if (o->heads % o->kv_heads) bench_usage_die("--kv-heads %zu must divide --heads %zu", o->kv_heads, o->heads);
    if (o->splits > 64) bench_usage_die("--splits: at most 64");
    if (o->new_tokens > 16) bench_usage_die("--new-tokens: at most 16");
    if (o->page_size & (o->page_size - 1) || o->page_size > 65536)
        bench_usage_die("--page-size: a power of two from 1 to 65536");
}

static float *rnd(size_t n, float scale, uint64_t *s)
{
    float *a = malloc(n * sizeof *a);
    if (!a) bench_die("out of memory (%zu floats)", n);
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = scale * ((float)(*s >> 40) / (float)(1ull << 24) * 2.0f - 1.0f);
    }
    return a;
}

static int cmpd(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The device's copy bandwidth in GB/s (read + write), from a plain copy kernel; ref: memcpy. */
static double copy_bandwidth(clattn_device *dev)
{
    size_t bytes = (size_t)256 << 20;
    double t[7];
    if (clattn_device_backend(dev) != CLATTN_BACKEND_OPENCL) {
        char *a = malloc(bytes), *b = malloc(bytes);
        if (!a || !b) bench_die("out of memory for the copy measurement");
        memset(a, 1, bytes), memset(b, 0, bytes);
        for (int i = 0; i < 7; i++) {
            const double t0 = bench_now_ms();
            memcpy(b, a, bytes);
            t[i] = bench_now_ms() - t0;
        }
        free(a), free(b);
    } else {
        cl_context ctx = clattn_device_context(dev);
        cl_command_queue q = clattn_device_queue(dev);
        cl_device_id id;
        clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof id, &id, NULL);
        cl_ulong max_alloc = 0;
        clGetDeviceInfo(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
        if (bytes > max_alloc) bytes = (size_t)max_alloc / 16 * 16;
        const char *src = "__kernel void copy4(__global const float4 *a, __global float4 *b) {"
                          " size_t i = get_global_id(0); b[i] = a[i]; }";
        cl_int err;
        cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
        if (err == CL_SUCCESS) err = clBuildProgram(p, 1, &id, "", NULL, NULL);
        cl_kernel k = err == CL_SUCCESS ? clCreateKernel(p, "copy4", &err) : NULL;
        cl_mem a = err == CL_SUCCESS ? clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err) : NULL;
        cl_mem b = err == CL_SUCCESS ? clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err) : NULL;
        if (err != CL_SUCCESS) bench_die("the copy kernel failed to set up (%d)", err);
        const float zero = 0.0f;
        clEnqueueFillBuffer(q, a, &zero, sizeof zero, 0, bytes, 0, NULL, NULL);
        clSetKernelArg(k, 0, sizeof a, &a);
        clSetKernelArg(k, 1, sizeof b, &b);
        size_t global = bytes / 16;
        clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL); /* warm-up */
        clFinish(q);
        for (int i = 0; i < 7; i++) {
            const double t0 = bench_now_ms();
            err = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL);
            if (err == CL_SUCCESS) err = clFinish(q);
            if (err != CL_SUCCESS) bench_die("the copy kernel failed (%d)", err);
            t[i] = bench_now_ms() - t0;
        }
        clReleaseMemObject(a), clReleaseMemObject(b), clReleaseKernel(k), clReleaseProgram(p);
    }
    qsort(t, 7, sizeof t[0], cmpd);
    return 2.0 * (double)bytes / (t[3] * 1e6);
}

/* Sequence b's length: C, or with --ragged from C down to C/2. */
static size_t seq_len(const dopts *o, size_t C, size_t b, size_t B)
{
    if (!o->ragged || B == 1) return C;
    return C - (C / 2) * b / (B - 1);
}

static void measure(clattn_device *dev, const dopts *o, size_t C, size_t B, dres *r)
{
    const size_t H = o->heads, HK = o->kv_heads, D = o->head_dim, E = o->dim, N = o->new_tokens;
    uint64_t seed = 12345;
    float *wq = rnd(H * D * E, 1.0f / sqrtf((float)E), &seed), *wk = rnd(HK * D * E, 1.0f / sqrtf((float)E), &seed);
    float *wv = rnd(HK * D * E, 1.0f / sqrtf((float)E), &seed), *wo = rnd(E * H * D, 1.0f / sqrtf((float)(H * D)), &seed);
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .w_out = wo, .w_query_count = H * D * E,
                                  .w_key_count = HK * D * E, .w_value_count = HK * D * E, .w_out_count = E * H * D};
    const size_t P = 16; /* a short prefill first: its GEMMs and kernels are what a real prompt would warm */
    clattn_attention_desc d = {.batch = B, .seq_q = P, .embed = E, .heads = H, .kv_heads = HK, .head_dim_qk = D,
                               .head_dim_v = D, .out_dim = E, .causal = 1, .window = o->window, .kv_half = o->kv_type,
                               .kv_page_size = o->page_size};
    clattn_decode_plan *plan = NULL;
    bench_plan_check(clattn_decode_plan_create(dev, &d, &w, &plan), "creating the decode plan");
    bench_check(clattn_decode_plan_set_splits(plan, o->splits), "--splits");
    clattn_kv_cache_desc cd = {.batch = B, .capacity = C + P + N, .kv_heads = HK, .head_dim_qk = D, .head_dim_v = D,
                               .type = (clattn_kv_type)o->kv_type, .page_size = o->page_size};
    clattn_kv_cache *cache = NULL;
    bench_check(clattn_kv_cache_create(dev, &cd, &cache), "creating the KV cache");
    clattn_kv_cache_desc made;
    bench_check(clattn_kv_cache_desc_get(cache, &made), "reading the KV cache's description");
    r->page_size = made.page_size;
    float *xp = rnd(B * P * E, 1.0f, &seed), *op = malloc(B * P * E * sizeof *op);
    if (!op) bench_die("out of memory");
    clattn_decode_args pa = {.x = xp, .new_tokens = P, .out = op, .x_count = B * P * E, .out_count = B * P * E};
    if (o->progress) fprintf(stderr, "clattn-bench: C=%zu: plan and cache made; a prefill of %zu tokens, then the "
                             "cache filled ...\n", C, P);
    bench_check(clattn_decode_execute(plan, cache, &pa), "the prefill");
    /* the cache at C tokens, random */
    const size_t nkv = B * HK * cd.capacity * D;
    float *k = rnd(nkv, 1.0f, &seed), *v = rnd(nkv, 1.0f, &seed);
    size_t *lens = malloc(B * sizeof *lens);
    if (!lens) bench_die("out of memory");
    for (size_t b = 0; b < B; b++) lens[b] = seq_len(o, C, b, B);
    bench_check(clattn_kv_cache_write(cache, k, v, lens), "filling the cache");
    free(k), free(v);
    float *x = rnd(B * N * E, 1.0f, &seed), *out = malloc(B * N * E * sizeof *out);
    if (!out) bench_die("out of memory");
    clattn_decode_args a = {.x = x, .new_tokens = N, .out = out, .x_count = B * N * E, .out_count = B * N * E};
    uint8_t *tree = NULL;
    if (o->tree) { /* a binary draft tree: token i sees itself and its ancestors (i-1)/2, ... */
        if (!(tree = calloc(B * N * N, 1))) bench_die("out of memory");
        for (size_t b = 0; b < B; b++)
            for (size_t i = 0; i < N; i++)
                for (size_t j = i;; j = (j - 1) / 2) {
                    tree[(b * N + i) * N + j] = 1;
                    if (j == 0) break;
                }
        a.tree_mask = tree, a.tree_mask_count = B * N * N;
    }
    double t0 = bench_now_ms();
    bench_check(clattn_decode_execute(plan, cache, &a), "the first decode step");
    r->first_ms = bench_now_ms() - t0;
    const int n = o->warmup + o->iters;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) bench_die("out of memory");
    if (o->progress) fprintf(stderr, "clattn-bench: C=%zu: first step %.1f ms; %d steps ...\n", C, r->first_ms, n);
    for (int i = 0; i < n; i++) {
        bench_check(clattn_kv_cache_truncate(cache, lens), "truncating");
        t0 = bench_now_ms();
        bench_check(clattn_decode_execute(plan, cache, &a), "a decode step");
        t[i] = bench_now_ms() - t0;
    }
    qsort(t + o->warmup, (size_t)o->iters, sizeof *t, cmpd);
    /* one more step with stage times (markers between the stages: not among the timed steps) */
    for (int s = 0; s < CLATTN_DECODE_STAGE_COUNT; s++) r->stage_ms[s] = -1.0;
    if (clattn_decode_plan_set_profiling(plan, 1) == CLATTN_STATUS_SUCCESS) {
        bench_check(clattn_kv_cache_truncate(cache, lens), "truncating");
        bench_check(clattn_decode_execute(plan, cache, &a), "a profiled decode step");
        bench_check(clattn_decode_plan_stage_times(plan, r->stage_ms), "the stage times");
        clattn_decode_plan_set_profiling(plan, 0);
    }
    r->context = C;
    r->batch = B;
    r->step_ms = t[o->warmup + o->iters / 2];
    r->step_min = t[o->warmup];
    r->step_max = t[n - 1];
    r->parts = clattn_decode_plan_last_splits(plan);
    snprintf(r->core, sizeof r->core, "%s", clattn_decode_plan_core(plan));
    snprintf(r->gemm, sizeof r->gemm, "%s", clattn_decode_plan_gemm(plan));
    double visible = 0;
    for (size_t b = 0; b < B; b++) {
        const size_t l = lens[b] + N; /* the cache the step's last token sees */
        visible += (double)(o->window && o->window < l ? o->window : l);
    }
    /* per visible position and KV head: a key and a value of D elements (and an INT8 row's two scales) */
    static const double elem[4] = {4.0, 2.0, 2.0, 1.0};
    r->kv_bytes = (double)HK * visible * (2.0 * (double)D * elem[o->kv_type] + (o->kv_type == CLATTN_KV_INT8 ? 8.0 : 0.0));
    r->weight_bytes = 4.0 * ((double)(H * D + 2 * HK * D) * (double)E + (double)E * (double)(H * D));
    r->tokens_per_s = (double)(B * N) / (r->step_ms / 1e3);
    r->kv_gbps = r->kv_bytes / (r->step_ms * 1e6);
    r->step_gbps = (r->kv_bytes + r->weight_bytes) / (r->step_ms * 1e6);
    free(t), free(x), free(out), free(xp), free(op), free(lens), free(tree);
    free(wq), free(wk), free(wv), free(wo);
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(plan);
}


static void print_json(const char *device, const char *driver, const dopts *o, const dres *r)
{
    const double copy_gbps = r->copy_gbps;
    char stamp[32] = "";
    const time_t now = time(NULL);
    struct tm tm_utc;
    if (gmtime_r(&now, &tm_utc)) strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
    printf("{\"mode\":\"decode\",\"clattn_version\":");
    bench_json_string(stdout, clattn_version());
    printf(",\"timestamp\":");
    bench_json_string(stdout, stamp);
    printf(",\"device\":");
    bench_json_string(stdout, device);
    printf(",\"driver\":");
    bench_json_string(stdout, driver);
    printf(",\"core\":");
    bench_json_string(stdout, r->core);
    printf(",\"gemm\":");
    bench_json_string(stdout, r->gemm);
    printf(",\"batch\":%zu,\"context\":%zu,\"heads\":%zu,\"kv_heads\":%zu,\"head_dim\":%zu,\"dim\":%zu,"
           "\"kv_type\":\"%s\",\"window\":%zu,\"splits\":%zu,\"new_tokens\":%zu,\"tree\":%s,\"page_size\":%zu,"
           "\"iters\":%d,\"warmup\":%d", r->batch, r->context, o->heads, o->kv_heads, o->head_dim, o->dim,
           kv_names[o->kv_type], o->window, r->parts, o->new_tokens, o->tree ? "true" : "false", r->page_size, o->iters,
           o->warmup);
    printf(",\"step_ms\":%.6g,\"step_min_ms\":%.6g,\"step_max_ms\":%.6g,\"first_step_ms\":%.6g", r->step_ms,
           r->step_min, r->step_max, r->first_ms);
    if (r->stage_ms[0] >= 0.0) {
        printf(",\"stages_ms\":{");
        for (int s = 0; s < CLATTN_DECODE_STAGE_COUNT; s++)
            printf("%s\"%s\":%.6g", s ? "," : "", clattn_decode_stage_name((clattn_decode_stage)s), r->stage_ms[s]);
        printf("}");
    }
    printf(",\"tokens_per_s\":%.6g,\"kv_bytes\":%.6g,\"weight_bytes\":%.6g,\"kv_gbps\":%.6g,\"copy_gbps\":%.6g,"
           "\"kv_bandwidth_fraction\":%.6g,\"step_gbps\":%.6g,\"step_bandwidth_fraction\":%.6g,\"ragged\":%s}\n",
           r->tokens_per_s, r->kv_bytes, r->weight_bytes, r->kv_gbps, copy_gbps, r->kv_gbps / copy_gbps, r->step_gbps,
           r->step_gbps / copy_gbps, o->ragged ? "true" : "false");
    fflush(stdout);
}

int clattn_bench_decode(int argc, char **argv)
{
    dopts o;
    parse(argc, argv, &o);
    clattn_device *dev = NULL;
    bench_check(clattn_device_open(o.device, &dev), "--device");
    const char *notice = clattn_device_notice(dev);
    if (notice) fprintf(stderr, "clattn-bench: notice: %s\n", notice);
    char driver[128] = "n/a";
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL) {
        cl_device_id id;
        clGetCommandQueueInfo(clattn_device_queue(dev), CL_QUEUE_DEVICE, sizeof id, &id, NULL);
        clGetDeviceInfo(id, CL_DRIVER_VERSION, sizeof driver - 1, driver, NULL);
        driver[sizeof driver - 1] = '\0';
    }
    const char *name = clattn_device_name(dev);
    fprintf(stderr, "clattn-bench: decode on %s (driver %s): B=%zu%s heads=%zu kv_heads=%zu head_dim=%zu dim=%zu kv=%s "
            "window=%zu splits=%s\n", name, driver, o.batches[0], o.nbatches > 1 ? "..." : "", o.heads, o.kv_heads, o.head_dim, o.dim,
            kv_names[o.kv_type], o.window, o.splits ? "forced" : "auto");
    const size_t *ctxs = o.sweep ? sweep_ctx : &o.context;
    const size_t nctx = o.sweep ? NSWEEP : 1;
    const size_t nrun = nctx * o.nbatches;
    dres *rs = calloc(nrun, sizeof *rs);
    if (!rs) bench_die("out of memory");
    for (size_t i = 0; i < nrun; i++) {
        const size_t C = ctxs[i / o.nbatches], B = o.batches[i % o.nbatches];
        if (nrun > 1) fprintf(stderr, "clattn-bench: [%zu/%zu] C=%zu B=%zu ...", i + 1, nrun, C, B), fflush(stderr);
        rs[i].copy_gbps = copy_bandwidth(dev);
        measure(dev, &o, C, B, &rs[i]);
        if (nrun > 1) fprintf(stderr, " %.3f ms (copy %.1f GB/s)\n", rs[i].step_ms, rs[i].copy_gbps);
        if (o.json) print_json(name, driver, &o, &rs[i]);
    }
    if (!o.json) {
        printf("decode step on %s: heads=%zu kv_heads=%zu head_dim=%zu dim=%zu kv=%s window=%zu%s\n", name, o.heads,
               o.kv_heads, o.head_dim, o.dim, kv_names[o.kv_type], o.window, o.ragged ? " ragged" : "");
        printf("%8s %5s %6s %10s %10s %12s %10s %9s %10s %9s %9s\n", "context", "batch", "parts", "step ms", "first ms",
               "tokens/s", "KV MB", "KV GB/s", "copy GB/s", "kv frac", "step frac");
        for (size_t i = 0; i < nrun; i++)
            printf("%8zu %5zu %6zu %10.3f %10.3f %12.1f %10.2f %9.2f %10.2f %9.2f %9.2f\n", rs[i].context, rs[i].batch,
                   rs[i].parts, rs[i].step_ms, rs[i].first_ms, rs[i].tokens_per_s, rs[i].kv_bytes / 1e6, rs[i].kv_gbps,
                   rs[i].copy_gbps, rs[i].kv_gbps / rs[i].copy_gbps, rs[i].step_gbps / rs[i].copy_gbps);
    }
    free(rs);
    clattn_device_free(dev);
    return 0;
}
