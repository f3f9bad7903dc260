/* clattn_bench.c: `clattn-bench`, timing the attention module on one device.
 *
 * For each configuration (the op of attention_op.h):
 *   first call     plan creation + the first execute from host arrays, with
 *                  CLBlast's in-process kernel cache cleared first (what a user
 *                  feels first; an OpenCL driver's own on-disk cache, such as
 *                  PoCL's, is outside our control)
 *   device         clattn_plan_execute_buffers on cl_mem buffers, timed on the
 *                  host around execute + clFinish (OpenCL only), profiling off
 *   stages         the same, with clattn's profiling on: marker events between
 *                  the stages, device timestamps
 *   host           clattn_plan_execute from host arrays (upload, run, read back)
 *   SGEMM          CLBlastSgemm on square-ish matrices with the attention call's
 *                  FLOP count, timed like "device" (OpenCL only)
 * Each timed quantity: median and min-max over --iters runs after --warmup runs.
 * With --encoder the whole encoder layer (clattn_encoder_plan_*) is timed the
 * same way, except for the stages: the encoder plan has no profiling, so it is
 * timed as a whole.
 * The program prints; errors go to stderr with a nonzero exit.
 */
#include "args.h"
#include "attention_op.h"
#include "bench_util.h"
#include "backward_bench.h"
#include "decode_bench.h"

#include <clblast_c.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NSTAGES (CLATTN_STAGE_ATTENTION + 1) /* every stage of this version (clattn_plan_stage_times_n) */

static const size_t sweep_seqs[] = {64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
#define NSWEEP (sizeof sweep_seqs / sizeof sweep_seqs[0])

typedef struct options {
    const char *device;
    clattn_op op;
    int iters, warmup;
    int sweep, json, seq_given, ff_given, activation_given, norm_first_given, progress;
    int core_given;    /* --core or --gemm set CLATTN_CORE (a second one appends to it) */
    const char *csv;
    double budget_s;   /* --sweep: stop before a configuration projected to take longer */
    double settle_s;   /* wait up to this long for idle CPUs before each configuration (0: no wait) */
} options;

typedef struct stats {
    double median, min, max;
    int valid;
} stats;

typedef struct result {
    clattn_op op;
    clattn_op_flop_count flops;
    double softmax_bytes;
    double first_call_ms;
    stats dev, host, stage[NSTAGES], sgemm;
    double gflops, host_gflops, gemm_share, softmax_gbps, sgemm_gflops, sgemm_fraction;
    int gemm_share_valid, softmax_valid;
    size_t sgemm_m, sgemm_n, sgemm_k;
    double stage_sum_ms;  /* sum of the stage medians */
    clattn_algorithm algorithm; /* the attention plan's (resolved); AUTO for ref and the encoder */
    clattn_precision precision; /* the plan's (--precision) */
    char core[32];        /* the core that ran ("ref" on ref): the attention plan's, or the encoder's attention's */
    char core_params[128];/* its parameters ("" on ref and for the encoder) */
    char gemm[32];        /* the GEMM core of its projections ("ref" on ref) */
    char gemm_params[128];/* its parameters ("" on ref, for the encoder, or when it has none) */
    double proj_ms;       /* the projections' stages (qkv_projection + out_projection, their bias fills included) */
    int proj_valid;
    int tuned;            /* the attention plan uses the device's tuning file (-1: the encoder, not known) */
    size_t device_bytes;  /* device memory the attention plan holds (0: ref or the encoder) */
    double core_ms;       /* the attention core's stages (fused: attention; unfused: scores + softmax + context) */
    int core_valid;
    double wall_s;        /* how long measuring this configuration took */
    double interference;  /* share of all CPUs that other processes used meanwhile (Linux), < 0 unknown */
    char profiling[300];  /* why the stages were not timed ("" when they were, or on ref) */
} result;

/* ------------------------------------------------------------------ helpers */

static void check_cl(cl_int err, const char *what)
{
    if (err != CL_SUCCESS) bench_die("%s failed: %s (%d)", what, clattn_status_string(err), (int)err);
}


/* Busy time of all CPUs (seconds, from /proc/stat) and this process's own CPU time, to tell how much
 * of the machine other processes took while we measured: on a shared machine that skews every figure. */
typedef struct cpu_sample { double all_busy_s, own_s, wall_ms; int ok; } cpu_sample;

static cpu_sample cpu_now(void)
{
    cpu_sample c = {0, 0, bench_now_ms(), 0};
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (f) {
        c.ok = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                      &v[7]) == 8;
        fclose(f);
    }
    long tck = sysconf(_SC_CLK_TCK);
    if (tck <= 0) c.ok = 0;
    /* user nice system (idle iowait) irq softirq steal */
    if (c.ok) c.all_busy_s = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)tck;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    c.own_s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    return c;
}

static double interference(cpu_sample a, cpu_sample b)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double wall = (b.wall_ms - a.wall_ms) / 1e3;
    if (!a.ok || !b.ok || ncpu <= 0 || wall <= 0) return -1.0;
    double others = (b.all_busy_s - a.all_busy_s) - (b.own_s - a.own_s);
    if (others < 0) others = 0;
    return others / (wall * (double)ncpu);
}

/* Wait (at most max_s seconds) until other processes leave the CPUs >= 95% idle for two 1 s windows in a row.
 * Returns 1 when they did, 0 on timeout or without /proc/stat. */
static int settle(double max_s)
{
    const double t_end = bench_now_ms() + max_s * 1e3;
    int quiet = 0;
    cpu_sample a = cpu_now();
    if (!a.ok) return 0;
    while (bench_now_ms() < t_end) {
        struct timespec one = {1, 0};
        nanosleep(&one, NULL);
        cpu_sample b = cpu_now();
        quiet = interference(a, b) <= 0.05 ? quiet + 1 : 0;
        if (quiet >= 2) return 1;
        a = b;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static stats summarize(const double *v, int n)
{
    stats s = {0, 0, 0, 0};
    if (n <= 0) return s;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) bench_die("out of memory");
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    s.median = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    s.min = c[0];
    s.max = c[n - 1];
    s.valid = 1;
    free(c);
    return s;
}

static int is_gemm_stage(int s)
{
    return s == CLATTN_STAGE_QKV_PROJECTION || s == CLATTN_STAGE_SCORES || s == CLATTN_STAGE_CONTEXT ||
           s == CLATTN_STAGE_OUT_PROJECTION;
}

static double stage_flops(const result *r, int s)
{
    switch (s) {
    case CLATTN_STAGE_QKV_PROJECTION: return r->flops.qkv_projection;
    case CLATTN_STAGE_SCORES: return r->flops.scores;
    case CLATTN_STAGE_CONTEXT: return r->flops.context;
    case CLATTN_STAGE_OUT_PROJECTION: return r->flops.out_projection;
    case CLATTN_STAGE_ATTENTION: return r->flops.core;
    default: return 0.0;
    }
}

/* --progress: a phase line on stderr at its start, then at most one a second within it */
static double progress_last;
static void progress(const options *o, int force, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void progress(const options *o, int force, const char *fmt, ...)
{
    if (!o->progress) return;
    const double t = bench_now_ms();
    if (!force && t - progress_last < 1000.0) return;
    progress_last = t;
    va_list ap;
    va_start(ap, fmt);
    bench_vsay(fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ options */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clattn-bench [--device SPEC] [--batch B] [--seq T] [--dim E] [--heads H] [--causal]\n"
            "                    [--algorithm auto|fused|unfused] [--core NAME[:P=V,...]] [--gemm NAME[:P=V,...]]\n"
            "                    [--precision fp32|tf32] [--dtype f32|f16|bf16] [--no-proj]\n"
            "                    [--dropout P] [--iters N] [--warmup W] [--sweep] [--budget S] [--json]\n"
            "                    [--csv FILE] [--settle S] [--progress]\n"
            "                    [--encoder [--ff F] [--activation relu|gelu] [--norm-first]]\n"
            "  Times self-attention (Q/K/V + output projections with biases, LINEAR layout, random\n"
            "  weights) on one device. Defaults: --batch 4 --seq 512 --dim 512 --heads 8 --iters 10\n"
            "  --warmup 2; device SPEC as for `clattn` (ref, opencl, opencl:P:D, gpu, cpu, name=TEXT;\n"
            "  default $CLATTN_DEVICE, else opencl, else ref).\n"
            "  --encoder   time a whole encoder layer instead (nn.TransformerEncoderLayer, eval): that\n"
            "              attention + residuals + 2 LayerNorms + feed-forward E -> F -> E, F = --ff\n"
            "              (default 4E), ReLU unless --activation gelu, post-norm unless --norm-first.\n"
            "              Timed as a whole: the encoder plan has no per-stage profiling\n"
            "  --sweep     sequence lengths 64 128 ... 65536 (not with --seq); stops before a configuration\n"
            "              projected to take more than --budget seconds (default 20), or one the device\n"
            "              refuses for its memory (CLATTN_STATUS_TOO_LARGE_FOR_DEVICE)\n"
            "  --core      run this core (`clattn cores`), as CLATTN_CORE=NAME[:P=V,...] does; the JSON's\n"
            "              \"core\" and \"core_params\" name what ran\n"
            "  --gemm      run the GEMMs on this GEMM core (gemm_tiles, gemm_clblast), beside --core; the JSON's\n"
            "              \"gemm\" and \"gemm_params\" name what ran, \"projection_gflops\" its projections' rate\n"
            "  --dtype     the plan's arrays (x, out, every weight; --encoder too) in float32 (default), IEEE half\n"
            "              or bfloat16; the JSON's \"dtype\" says which and \"device_bytes\" what the attention\n"
            "              plan holds on the device (null for --encoder)\n"
            "  --no-proj   the attention core alone, as torch's scaled_dot_product_attention: no weights, x holds\n"
            "              Q, K and V (H heads of E/H), the output the heads' merged rows (JSON \"no_proj\": true)\n"
            "  --json      one JSON object per configuration, one line each, on stdout\n"
            "  --csv FILE  append one row per configuration (header when the file is new)\n"
            "  --progress  say on stderr which phase a configuration is in (first call, device runs i/N,\n"
            "              stages, host runs, SGEMM), at most once a second within a phase\n"
            "  --settle S  on a shared machine: before each configuration wait up to S seconds for the\n"
            "              CPUs to be idle (Linux /proc/stat); every result reports how much of the CPUs\n"
            "              other processes used while it was measured (\"interference\")\n"
            "FLOPs: projections 2*M*N*K each, attention core 4*B*H*T^2*d (halved when causal),\n"
            "encoder feed-forward 4*B*T*F*E.\n"
            "Softmax bytes: B*H*T^2 floats read twice and written once (+ masks).\n"
            "--decode: a decode step against a KV cache instead (clattn-bench --decode --help).\n"
            "--backward: a training plan's forward and backward instead (clattn-bench --backward --help).\n");
}

static size_t parse_size(const char *opt, const char *s)
{
    if (!s) bench_usage_die("%s needs a value", opt);
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v == 0 || v > 0xFFFFFFFFull)
        bench_usage_die("%s: '%s' is not a positive integer", opt, s);
    return (size_t)v;
}

static int parse_int(const char *opt, const char *s, int min)
{
    if (!s) bench_usage_die("%s needs a value", opt);
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > 1000000) bench_usage_die("%s: '%s' is not an integer >= %d", opt, s, min);
    return (int)v;
}

static double parse_double(const char *opt, const char *s)
{
    if (!s) bench_usage_die("%s needs a value", opt);
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) bench_usage_die("%s: '%s' is not a number", opt, s);
    return v;
}

static void parse_options(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->op.batch = 4;
    o->op.seq = 512;
    o->op.dim = 512;
    o->op.heads = 8;
    o->iters = 10;
    o->warmup = 2;
    o->budget_s = 20.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device")) { if (!v) bench_usage_die("--device needs a value"); o->device = v; i++; }
        else if (!strcmp(a, "--batch")) { o->op.batch = parse_size(a, v); i++; }
        else if (!strcmp(a, "--seq")) { o->op.seq = parse_size(a, v); o->seq_given = 1; i++; }
        else if (!strcmp(a, "--dim")) { o->op.dim = parse_size(a, v); i++; }
        else if (!strcmp(a, "--heads")) { o->op.heads = parse_size(a, v); i++; }
        else if (!strcmp(a, "--causal")) o->op.causal = 1;
        else if (!strcmp(a, "--no-proj")) o->op.no_proj = 1;
        else if (!strcmp(a, "--core") || !strcmp(a, "--gemm")) { /* CLATTN_CORE holds both, ';' between */
            if (!v || !*v) bench_usage_die("%s needs a value (a core `clattn cores` lists)", a);
            char spec[600];
            const char *have = getenv("CLATTN_CORE");
            if (snprintf(spec, sizeof spec, "%s%s%s", have && *have && o->core_given ? have : "",
                         have && *have && o->core_given ? ";" : "", v) >= (int)sizeof spec)
                bench_usage_die("%s '%s': too long", a, v);
            if (setenv("CLATTN_CORE", spec, 1) != 0) bench_die("%s: cannot set CLATTN_CORE", a);
            o->core_given = 1;
            i++;
        }
        else if (!strcmp(a, "--precision")) {
            if (!v) bench_usage_die("--precision needs a value");
            if (!strcmp(v, "fp32")) o->op.precision = CLATTN_PRECISION_FP32;
            else if (!strcmp(v, "tf32")) o->op.precision = CLATTN_PRECISION_TF32;
            else bench_usage_die("--precision '%s': must be fp32 or tf32", v);
            i++;
        }
        else if (!strcmp(a, "--dtype")) {
            if (!v) bench_usage_die("--dtype needs a value");
            if (!strcmp(v, "f32")) o->op.dtype = CLATTN_DTYPE_F32;
            else if (!strcmp(v, "f16")) o->op.dtype = CLATTN_DTYPE_F16;
            else if (!strcmp(v, "bf16")) o->op.dtype = CLATTN_DTYPE_BF16;
            else bench_usage_die("--dtype '%s': must be f32, f16 or bf16", v);
            i++;
        }
        else if (!strcmp(a, "--algorithm")) {
            if (!v) bench_usage_die("--algorithm needs a value");
            if (!strcmp(v, "auto")) o->op.algorithm = CLATTN_ALGORITHM_AUTO;
            else if (!strcmp(v, "fused")) o->op.algorithm = CLATTN_ALGORITHM_FUSED;
            else if (!strcmp(v, "unfused")) o->op.algorithm = CLATTN_ALGORITHM_UNFUSED;
            else bench_usage_die("--algorithm '%s': must be auto, fused or unfused", v);
            i++;
        }
        else if (!strcmp(a, "--dropout")) { o->op.dropout = (float)parse_double(a, v); i++; }
        else if (!strcmp(a, "--encoder")) o->op.encoder = 1;
        else if (!strcmp(a, "--ff")) { o->op.ff_dim = parse_size(a, v); o->ff_given = 1; i++; }
        else if (!strcmp(a, "--activation")) {
            if (!v) bench_usage_die("--activation needs a value");
            if (!strcmp(v, "relu")) o->op.activation = CLATTN_ACTIVATION_RELU;
            else if (!strcmp(v, "gelu")) o->op.activation = CLATTN_ACTIVATION_GELU;
            else bench_usage_die("--activation: '%s' is not relu or gelu", v);
            o->activation_given = 1;
            i++;
        }
        else if (!strcmp(a, "--norm-first")) { o->op.norm_first = 1; o->norm_first_given = 1; }
        else if (!strcmp(a, "--iters")) { o->iters = parse_int(a, v, 1); i++; }
        else if (!strcmp(a, "--warmup")) { o->warmup = parse_int(a, v, 0); i++; }
        else if (!strcmp(a, "--budget")) {
            o->budget_s = parse_double(a, v);
            if (o->budget_s <= 0) bench_usage_die("--budget must be > 0 seconds");
            i++;
        }
        else if (!strcmp(a, "--settle")) {
            o->settle_s = parse_double(a, v);
            if (o->settle_s < 0) bench_usage_die("--settle must be >= 0 seconds");
            i++;
        }
        else if (!strcmp(a, "--sweep")) o->sweep = 1;
        else if (!strcmp(a, "--progress")) o->progress = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--csv")) { if (!v) bench_usage_die("--csv needs a file name"); o->csv = v; i++; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        else {
            fprintf(stderr, "clattn-bench: unknown option '%s'\n", a);
            usage(stderr);
            exit(2);
        }
    }
    if (o->sweep && o->seq_given) bench_usage_die("--seq and --sweep do not go together (the sweep sets the sequence length)");
    if (!o->op.encoder && (o->ff_given || o->activation_given || o->norm_first_given))
        bench_usage_die("--ff, --activation and --norm-first describe the encoder layer: add --encoder");
    if (o->op.encoder && o->op.dropout != 0.0f) bench_usage_die("--dropout: the encoder layer is timed in eval mode (no dropout)");
    char msg[128];
    if (clattn_op_check(&o->op, msg, sizeof msg)) bench_usage_die("%s", msg);
}

/* ------------------------------------------------------------------ measuring */

typedef struct bench_ctx {
    clattn_device *dev;
    int opencl;
    cl_context ctx;
    cl_command_queue queue;
    char device_name[320];
    char driver[128];
} bench_ctx;

static cl_mem make_buffer_of(const bench_ctx *b, size_t n, size_t elem, const void *init, const char *what)
{
    cl_int err;
    cl_mem m = clCreateBuffer(b->ctx, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), n * elem, (void *)init,
                              &err);
    if (err != CL_SUCCESS) bench_die("clCreateBuffer for %s (%zu bytes) failed: %s (%d)", what, n * elem,
                               clattn_status_string(err), (int)err);
    return m;
}

static cl_mem make_buffer(const bench_ctx *b, size_t floats, const float *init, const char *what)
{
    return make_buffer_of(b, floats, sizeof(float), init, what);
}

/* The SGEMM's largest side: 8192 keeps each operand at 256 MiB, within every device's allocation limit and
 * far from CLBlast's 32-bit indices (a call the size of T = 131072 attention would need 4 GiB operands). A
 * GEMM that large runs at its full rate already: the figure compared is the rate. */
#define SGEMM_MAX_SIDE 8192

/* CLBlast SGEMM with the FLOP count of one attention call, on square-ish matrices (each side at most
 * SGEMM_MAX_SIDE: bigger calls are measured at that size). */
static void measure_sgemm(const bench_ctx *b, const options *o, result *r)
{
    double n_real = cbrt(r->flops.total / 2.0);
    size_t n = (size_t)(n_real / 16.0 + 0.5) * 16;
    if (n < 16) n = 16;
    if (n > SGEMM_MAX_SIDE) n = SGEMM_MAX_SIDE;
    size_t k = (size_t)(r->flops.total / (2.0 * (double)n * (double)n) / 16.0 + 0.5) * 16;
    if (k < 16) k = 16;
    if (k > SGEMM_MAX_SIDE) k = SGEMM_MAX_SIDE;
    r->sgemm_m = r->sgemm_n = n;
    r->sgemm_k = k;
    float *host = malloc((n > k ? n : k) * k * sizeof *host);
    if (!host) bench_die("out of memory (SGEMM operands)");
    for (size_t i = 0; i < (n > k ? n : k) * k; i++) host[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    cl_mem A = make_buffer(b, n * k, host, "SGEMM A"), B = make_buffer(b, k * n, host, "SGEMM B");
    cl_mem C = make_buffer(b, n * n, NULL, "SGEMM C");
    free(host);
    cl_command_queue q = b->queue;
    double *t = malloc((size_t)o->iters * sizeof *t);
    if (!t) bench_die("out of memory");
    for (int i = -1 - o->warmup; i < o->iters; i++) { /* one extra untimed call: CLBlast compiles on the first */
        double t0 = bench_now_ms();
        CLBlastStatusCode s = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, n, n, k, 1.0f,
                                           A, 0, k, B, 0, n, 0.0f, C, 0, n, &q, NULL);
        if (s != CLBlastSuccess) bench_die("CLBlastSgemm %zux%zux%zu failed: %s (%d)", n, n, k, clattn_status_string(s), (int)s);
        check_cl(clFinish(q), "clFinish after SGEMM");
        if (i >= 0) t[i] = bench_now_ms() - t0;
    }
    r->sgemm = summarize(t, o->iters);
    r->sgemm_gflops = 2.0 * (double)n * (double)n * (double)k / (r->sgemm.median * 1e6);
    free(t);
    clReleaseMemObject(A);
    clReleaseMemObject(B);
    clReleaseMemObject(C);
}

/* The timed object: the attention plan, or with --encoder the encoder layer plan. */
typedef struct runner {
    int encoder;
    clattn_plan *attn;
    clattn_encoder_plan *enc;
    const void *x;  /* in the op's type */
    void *out;
    size_t count;   /* x's and out's element count (self-attention: both (B, T, E)) */
} runner;

static void runner_create(runner *run, const bench_ctx *b, const clattn_op_data *data)
{
    if (run->encoder)
        bench_plan_check(clattn_encoder_plan_create(b->dev, &data->encoder_desc, &data->encoder_weights, &run->enc),
                 "clattn_encoder_plan_create");
    else
        bench_plan_check(clattn_plan_create(b->dev, &data->desc, &data->weights, &run->attn), "clattn_plan_create");
}

/* Does the device take a plan for `op`? 0 with the reason in note when it refuses it for its size. */
static int fits_device(const bench_ctx *b, const clattn_op *op, char *note, size_t len)
{
    clattn_op_data data;
    char msg[160];
    if (clattn_op_make(op, 1, &data, msg, sizeof msg)) bench_die("%s", msg);
    clattn_plan *ap = NULL;
    clattn_encoder_plan *ep = NULL;
    clattn_status st = op->encoder ? clattn_encoder_plan_create(b->dev, &data.encoder_desc, &data.encoder_weights, &ep)
                                   : clattn_plan_create(b->dev, &data.desc, &data.weights, &ap);
    clattn_plan_free(ap);
    clattn_encoder_plan_free(ep);
    clattn_op_data_free(&data);
    if (st == CLATTN_STATUS_TOO_LARGE_FOR_DEVICE) {
        snprintf(note, len, "sweep stopped before T=%zu: %s", op->seq, clattn_last_error());
        return 0;
    }
    bench_plan_check(st, "clattn_plan_create");
    return 1;
}

/* execute from host arrays; `what` names the call in errors (NULL: a timed repeat) */
static void runner_host(runner *run, const char *what)
{
    char name[96];
    snprintf(name, sizeof name, "%s%s%s%s", run->encoder ? "clattn_encoder_plan_execute" : "clattn_plan_execute",
             what ? " (" : "", what ? what : "", what ? ")" : "");
    if (run->encoder) {
        clattn_encoder_args args = {.x = run->x, .out = run->out, .x_count = run->count, .out_count = run->count};
        bench_check(clattn_encoder_plan_execute(run->enc, &args), name);
    } else {
        clattn_attention_args args = {.x = run->x, .out = run->out, .x_count = run->count, .out_count = run->count};
        bench_check(clattn_plan_execute(run->attn, &args), name);
    }
}

/* execute on device buffers (OpenCL only), no wait list, no event */
static void runner_buffers(runner *run, cl_mem x, cl_mem out)
{
    if (run->encoder) {
        clattn_encoder_buffers bufs = {0};
        bufs.x.mem = x;
        bufs.out.mem = out;
        bench_check(clattn_encoder_plan_execute_buffers(run->enc, &bufs, 0, NULL, NULL),
                 "clattn_encoder_plan_execute_buffers");
    } else {
        clattn_attention_buffers bufs = {0};
        bufs.x.mem = x;
        bufs.out.mem = out;
        bench_check(clattn_plan_execute_buffers(run->attn, &bufs, 0, NULL, NULL), "clattn_plan_execute_buffers");
    }
}

static void runner_free(runner *run)
{
    clattn_plan_free(run->attn);
    clattn_encoder_plan_free(run->enc);
    run->attn = NULL;
    run->enc = NULL;
}

static void measure(const bench_ctx *b, const options *o, const clattn_op *op, result *r)
{
    if (o->settle_s > 0 && !settle(o->settle_s))
        fprintf(stderr, "clattn-bench: the CPUs did not become idle within --settle %g s; measuring anyway\n",
                o->settle_s);
    const cpu_sample cpu0 = cpu_now();
    memset(r, 0, sizeof *r);
    r->op = *op;
    r->flops = clattn_op_flops(op);
    r->softmax_bytes = clattn_op_softmax_bytes(op);

    clattn_op_data data;
    char msg[160];
    if (clattn_op_make(op, 0x0C1A77E5EEDull + op->seq, &data, msg, sizeof msg)) bench_die("%s", msg);
    void *out = malloc(data.out_count * data.elem);
    double *t = malloc((size_t)o->iters * sizeof *t);
    double *st = calloc((size_t)o->iters * NSTAGES, sizeof *st); /* 0: a stage not timed */
    if (!out || !t || !st) bench_die("out of memory (output of %zu floats)", data.out_count);
    runner run = {.encoder = op->encoder, .x = data.x_in, .out = out, .count = data.x_count};

    /* first call: plan creation (kernel builds, weight upload) + first execute */
    if (b->opencl) CLBlastClearCache();
    progress(o, 1, "T=%zu: first call (plan creation, kernel builds, first execute) ...", op->seq);
    double t0 = bench_now_ms();
    runner_create(&run, b, &data);
    runner_host(&run, "first call");
    r->first_call_ms = bench_now_ms() - t0;
    progress(o, 1, "T=%zu: first call took %.0f ms", op->seq, r->first_call_ms);
    r->algorithm = run.attn ? clattn_plan_algorithm(run.attn) : CLATTN_ALGORITHM_AUTO;
    r->precision = op->precision;
    snprintf(r->core, sizeof r->core, "%s", run.attn ? clattn_plan_core(run.attn) : clattn_encoder_plan_core(run.enc));
    snprintf(r->core_params, sizeof r->core_params, "%s", run.attn ? clattn_plan_core_params(run.attn) : "");
    snprintf(r->gemm, sizeof r->gemm, "%s", run.attn ? clattn_plan_gemm(run.attn) : clattn_encoder_plan_gemm(run.enc));
    snprintf(r->gemm_params, sizeof r->gemm_params, "%s", run.attn ? clattn_plan_gemm_params(run.attn) : "");
    r->tuned = run.attn ? clattn_plan_tuned(run.attn) : -1;
    r->device_bytes = run.attn ? clattn_plan_device_bytes(run.attn) : 0;

    if (b->opencl) {
        cl_mem xb = make_buffer_of(b, data.x_count, data.elem, data.x_in, "x");
        cl_mem ob = make_buffer_of(b, data.out_count, data.elem, NULL, "out");
        /* device-resident, profiling off */
        for (int i = -o->warmup; i < o->iters; i++) {
            progress(o, i == -o->warmup, "T=%zu: device runs %d/%d (after %d warm-up)", op->seq, i < 0 ? 0 : i,
                     o->iters, o->warmup);
            double t1 = bench_now_ms();
            runner_buffers(&run, xb, ob);
            check_cl(clFinish(b->queue), "clFinish");
            if (i >= 0) t[i] = bench_now_ms() - t1;
        }
        r->dev = summarize(t, o->iters);
        /* stages: the same with marker events between the stages (the attention plan only) */
        const clattn_status prof = run.attn ? clattn_plan_set_profiling(run.attn, 1) : CLATTN_STATUS_SUCCESS;
        if (prof == CLATTN_STATUS_UNSUPPORTED) /* the stages stay "not timed", and the result says why */
            snprintf(r->profiling, sizeof r->profiling, "%s", clattn_last_error());
        else if (run.attn) {
            bench_check(prof, "clattn_plan_set_profiling");
            for (int i = 0; i < o->iters; i++) {
                progress(o, i == 0, "T=%zu: profiled runs %d/%d", op->seq, i, o->iters);
                runner_buffers(&run, xb, ob);
                check_cl(clFinish(b->queue), "clFinish");
                bench_check(clattn_plan_stage_times_n(run.attn, st + (size_t)i * NSTAGES, NSTAGES), "clattn_plan_stage_times_n");
            }
            bench_check(clattn_plan_set_profiling(run.attn, 0), "clattn_plan_set_profiling");
        }
        clReleaseMemObject(xb);
        clReleaseMemObject(ob);
        /* host-to-host */
        for (int i = -o->warmup; i < o->iters; i++) {
            progress(o, i == -o->warmup, "T=%zu: host runs %d/%d", op->seq, i < 0 ? 0 : i, o->iters);
            double t1 = bench_now_ms();
            runner_host(&run, NULL);
            if (i >= 0) t[i] = bench_now_ms() - t1;
        }
        r->host = summarize(t, o->iters);
    } else {
        /* ref: host-to-host only; its attention profiling is host wall time per stage, at no cost */
        if (run.attn) bench_check(clattn_plan_set_profiling(run.attn, 1), "clattn_plan_set_profiling");
        for (int i = -o->warmup; i < o->iters; i++) {
            progress(o, i == -o->warmup, "T=%zu: host runs %d/%d", op->seq, i < 0 ? 0 : i, o->iters);
            double t1 = bench_now_ms();
            runner_host(&run, NULL);
            if (i >= 0) {
                t[i] = bench_now_ms() - t1;
                if (run.attn)
                    bench_check(clattn_plan_stage_times_n(run.attn, st + (size_t)i * NSTAGES, NSTAGES), "clattn_plan_stage_times_n");
            }
        }
        r->host = summarize(t, o->iters);
    }
    runner_free(&run);

    /* per stage: median over the iterations; a stage that never ran (0 ms) is "not timed" */
    double *v = malloc((size_t)o->iters * sizeof *v);
    if (!v) bench_die("out of memory");
    double gemm = 0.0, all = 0.0;
    for (int s = 0; s < NSTAGES && !op->encoder; s++) {
        int any = 0;
        for (int i = 0; i < o->iters; i++) {
            v[i] = st[(size_t)i * NSTAGES + s];
            any |= v[i] > 0.0;
        }
        if (!any) continue;
        r->stage[s] = summarize(v, o->iters);
        all += r->stage[s].median;
        if (is_gemm_stage(s)) gemm += r->stage[s].median;
    }
    free(v);
    r->stage_sum_ms = all;
    {
        const int core[] = {CLATTN_STAGE_SCORES, CLATTN_STAGE_SOFTMAX, CLATTN_STAGE_CONTEXT, CLATTN_STAGE_ATTENTION};
        r->core_ms = 0.0;
        for (int k = 0; k < 4; k++)
            if (r->stage[core[k]].valid) r->core_ms += r->stage[core[k]].median;
        r->core_valid = r->core_ms > 0.0;
        r->proj_valid = r->stage[CLATTN_STAGE_QKV_PROJECTION].valid && r->stage[CLATTN_STAGE_OUT_PROJECTION].valid;
        r->proj_ms = r->proj_valid ? r->stage[CLATTN_STAGE_QKV_PROJECTION].median +
                                         r->stage[CLATTN_STAGE_OUT_PROJECTION].median
                                   : 0.0;
    }
    /* ref runs scores + softmax + context as one loop (reported under softmax): no GEMM share, no softmax rate */
    if (b->opencl && all > 0.0) {
        r->gemm_share = gemm / all;
        r->gemm_share_valid = 1;
    }
    if (b->opencl && r->stage[CLATTN_STAGE_SOFTMAX].valid && r->stage[CLATTN_STAGE_SOFTMAX].median > 0.0) {
        r->softmax_gbps = r->softmax_bytes / (r->stage[CLATTN_STAGE_SOFTMAX].median * 1e6);
        r->softmax_valid = 1;
    }
    r->host_gflops = r->flops.total / (r->host.median * 1e6);
    r->gflops = r->dev.valid ? r->flops.total / (r->dev.median * 1e6) : r->host_gflops;
    if (b->opencl) {
        progress(o, 1, "T=%zu: the SGEMM of the same FLOPs, for comparison", op->seq);
        measure_sgemm(b, o, r);
        r->sgemm_fraction = r->gflops / r->sgemm_gflops;
    }
    free(out);
    free(t);
    free(st);
    clattn_op_data_free(&data);
    const cpu_sample cpu1 = cpu_now();
    r->wall_s = (cpu1.wall_ms - cpu0.wall_ms) / 1e3;
    r->interference = interference(cpu0, cpu1);
}

/* ------------------------------------------------------------------ output */


static void json_num(FILE *f, const char *key, double v, int valid)
{
    if (valid) fprintf(f, ",\"%s\":%.6g", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

static void print_json(const bench_ctx *b, const options *o, const result *r)
{
    FILE *f = stdout;
    char stamp[32] = "";
    const time_t now = time(NULL);
    struct tm tm_utc;
    if (gmtime_r(&now, &tm_utc)) strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
    fprintf(f, "{\"clattn_version\":");
    bench_json_string(f, clattn_version());
    fprintf(f, ",\"timestamp\":");
    bench_json_string(f, stamp);
    fprintf(f, ",\"device\":");
    bench_json_string(f, b->device_name);
    fprintf(f, ",\"driver\":");
    bench_json_string(f, b->driver);
    fprintf(f, ",\"batch\":%zu,\"seq\":%zu,\"dim\":%zu,\"heads\":%zu,\"causal\":%s,\"dropout\":%g", r->op.batch,
            r->op.seq, r->op.dim, r->op.heads, r->op.causal ? "true" : "false", (double)r->op.dropout);
    fprintf(f, ",\"iters\":%d,\"warmup\":%d", o->iters, o->warmup);
    json_num(f, "first_call_ms", r->first_call_ms, 1);
    json_num(f, "median_ms", r->dev.median, r->dev.valid);
    json_num(f, "min_ms", r->dev.min, r->dev.valid);
    json_num(f, "max_ms", r->dev.max, r->dev.valid);
    json_num(f, "host_median_ms", r->host.median, 1);
    json_num(f, "host_min_ms", r->host.min, 1);
    json_num(f, "host_max_ms", r->host.max, 1);
    json_num(f, "flops", r->flops.total, 1);
    json_num(f, "projection_flops", r->flops.projections, 1);
    json_num(f, "core_flops", r->flops.core, 1);
    if (r->algorithm == CLATTN_ALGORITHM_AUTO) fprintf(f, ",\"algorithm\":null");
    else fprintf(f, ",\"algorithm\":\"%s\"", clattn_algorithm_name(r->algorithm));
    fprintf(f, ",\"precision\":\"%s\"", r->precision == CLATTN_PRECISION_TF32 ? "tf32" : "fp32");
    fprintf(f, ",\"dtype\":\"%s\"", r->op.dtype == CLATTN_DTYPE_F16 ? "f16" : r->op.dtype == CLATTN_DTYPE_BF16 ? "bf16" : "f32");
    fprintf(f, ",\"no_proj\":%s", r->op.no_proj ? "true" : "false");
    fprintf(f, ",\"core\":");
    bench_json_string(f, r->core);
    fprintf(f, ",\"core_params\":");
    if (r->core_params[0]) bench_json_string(f, r->core_params);
    else fprintf(f, "null");
    fprintf(f, ",\"gemm\":");
    bench_json_string(f, r->gemm);
    fprintf(f, ",\"gemm_params\":");
    if (r->gemm_params[0]) bench_json_string(f, r->gemm_params);
    else fprintf(f, "null");
    json_num(f, "projection_ms", r->proj_ms, r->proj_valid);
    json_num(f, "projection_gflops", r->proj_valid ? r->flops.projections / (r->proj_ms * 1e6) : 0.0, r->proj_valid);
    json_num(f, "device_bytes", (double)r->device_bytes, r->device_bytes > 0);
    fprintf(f, ",\"tuned\":%s", r->tuned < 0 ? "null" : r->tuned ? "true" : "false");
    json_num(f, "core_ms", r->core_ms, r->core_valid);
    json_num(f, "core_gflops", r->core_valid ? r->flops.core / (r->core_ms * 1e6) : 0.0, r->core_valid);
    fprintf(f, ",\"encoder\":%s", r->op.encoder ? "true" : "false");
    if (r->op.encoder)
        fprintf(f, ",\"ff_dim\":%zu,\"activation\":\"%s\",\"norm_first\":%s", clattn_op_ff_dim(&r->op),
                r->op.activation == CLATTN_ACTIVATION_GELU ? "gelu" : "relu", r->op.norm_first ? "true" : "false");
    else
        fprintf(f, ",\"ff_dim\":null,\"activation\":null,\"norm_first\":null");
    json_num(f, "ffn_flops", r->flops.ffn, r->op.encoder);
    json_num(f, "gflops", r->gflops, 1);
    fprintf(f, ",\"gflops_basis\":\"%s\"", r->dev.valid ? "device" : "host");
    json_num(f, "host_gflops", r->host_gflops, 1);
    json_num(f, "gemm_share", r->gemm_share, r->gemm_share_valid);
    json_num(f, "sgemm_gflops", r->sgemm_gflops, r->sgemm.valid);
    json_num(f, "sgemm_fraction", r->sgemm_fraction, r->sgemm.valid);
    if (r->sgemm.valid) fprintf(f, ",\"sgemm_mnk\":[%zu,%zu,%zu]", r->sgemm_m, r->sgemm_n, r->sgemm_k);
    else fprintf(f, ",\"sgemm_mnk\":null");
    json_num(f, "softmax_gbps", r->softmax_gbps, r->softmax_valid);
    json_num(f, "softmax_bytes", r->softmax_bytes, 1);
    json_num(f, "interference", r->interference, r->interference >= 0);
    json_num(f, "wall_s", r->wall_s, 1);
    if (r->profiling[0]) {
        fprintf(f, ",\"stages_unsupported\":");
        bench_json_string(f, r->profiling);
    } else {
        fprintf(f, ",\"stages_unsupported\":null");
    }
    const char *groups[3] = {"stages", "stages_min", "stages_max"};
    for (int g = 0; g < 3; g++) {
        fprintf(f, ",\"%s\":{", groups[g]);
        for (int s = 0; s < NSTAGES; s++) {
            const stats *x = &r->stage[s];
            double val = g == 0 ? x->median : g == 1 ? x->min : x->max;
            fprintf(f, "%s\"%s\":", s ? "," : "", clattn_stage_name((clattn_stage)s));
            if (x->valid) fprintf(f, "%.6g", val);
            else fprintf(f, "null");
        }
        fprintf(f, "}");
    }
    fprintf(f, "}\n");
    fflush(f);
}

static void csv_field_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_num(FILE *f, double v, int valid)
{
    if (valid) fprintf(f, ",%.6g", v);
    else fprintf(f, ",");
}

static void append_csv(const bench_ctx *b, const options *o, const result *r)
{
    struct stat sb;
    int fresh = stat(o->csv, &sb) != 0 || sb.st_size == 0;
    FILE *f = fopen(o->csv, "a");
    if (!f) bench_die("--csv %s: cannot open for appending: %s", o->csv, strerror(errno));
    if (fresh) {
        fprintf(f, "device,driver,batch,seq,dim,heads,causal,dropout,iters,warmup,first_call_ms,median_ms,min_ms,"
                   "max_ms,host_median_ms,host_min_ms,host_max_ms,flops,gflops,host_gflops,gemm_share,"
                   "sgemm_m,sgemm_n,sgemm_k,sgemm_gflops,sgemm_fraction,softmax_gbps,interference");
        for (int s = 0; s < NSTAGES; s++) fprintf(f, ",%s_ms", clattn_stage_name((clattn_stage)s));
        fprintf(f, ",encoder,ff_dim,activation,norm_first,ffn_flops\n");
    }
    csv_field_str(f, b->device_name);
    fputc(',', f);
    csv_field_str(f, b->driver);
    fprintf(f, ",%zu,%zu,%zu,%zu,%d,%g,%d,%d", r->op.batch, r->op.seq, r->op.dim, r->op.heads, r->op.causal,
            (double)r->op.dropout, o->iters, o->warmup);
    csv_num(f, r->first_call_ms, 1);
    csv_num(f, r->dev.median, r->dev.valid);
    csv_num(f, r->dev.min, r->dev.valid);
    csv_num(f, r->dev.max, r->dev.valid);
    csv_num(f, r->host.median, 1);
    csv_num(f, r->host.min, 1);
    csv_num(f, r->host.max, 1);
    csv_num(f, r->flops.total, 1);
    csv_num(f, r->gflops, 1);
    csv_num(f, r->host_gflops, 1);
    csv_num(f, r->gemm_share, r->gemm_share_valid);
    csv_num(f, (double)r->sgemm_m, r->sgemm.valid);
    csv_num(f, (double)r->sgemm_n, r->sgemm.valid);
    csv_num(f, (double)r->sgemm_k, r->sgemm.valid);
    csv_num(f, r->sgemm_gflops, r->sgemm.valid);
    csv_num(f, r->sgemm_fraction, r->sgemm.valid);
    csv_num(f, r->softmax_gbps, r->softmax_valid);
    csv_num(f, r->interference, r->interference >= 0);
    for (int s = 0; s < NSTAGES; s++) csv_num(f, r->stage[s].median, r->stage[s].valid);
    if (r->op.encoder)
        fprintf(f, ",1,%zu,%s,%d,%.6g\n", clattn_op_ff_dim(&r->op),
                r->op.activation == CLATTN_ACTIVATION_GELU ? "gelu" : "relu", r->op.norm_first, r->flops.ffn);
    else
        fprintf(f, ",0,,,,\n");
    if (fclose(f) != 0) bench_die("--csv %s: write failed: %s", o->csv, strerror(errno));
}

static void print_header(const bench_ctx *b, const options *o)
{
    const clattn_op *op = &o->op;
    printf("device: %s (driver %s)\n", b->device_name, b->driver);
    if (op->encoder)
        printf("module: encoder layer (nn.TransformerEncoderLayer, eval, %s), F=%zu, %s; its self-attention has\n"
               "        Q/K/V + output projections with biases, LINEAR layout, random weights\n",
               op->norm_first ? "pre-norm" : "post-norm", clattn_op_ff_dim(op),
               op->activation == CLATTN_ACTIVATION_GELU ? "GELU" : "ReLU");
    else if (op->no_proj)
        printf("module: the attention core alone (no weights: x holds Q, K and V), as scaled_dot_product_attention\n");
    else
        printf("module: self-attention, Q/K/V + output projections with biases, LINEAR layout, random weights\n");
    char tbuf[32];
    if (o->sweep) snprintf(tbuf, sizeof tbuf, "T=sweep");
    else snprintf(tbuf, sizeof tbuf, "T=%zu", op->seq);
    printf("config: B=%zu %s E=%zu H=%zu (d=%zu), %s, dropout %g; %d iterations after %d warm-up\n", op->batch,
           tbuf, op->dim, op->heads, op->dim / op->heads, op->causal ? "causal" : "non-causal",
           (double)op->dropout, o->iters, o->warmup);
    printf("FLOPs: projections 2*M*N*K each (QKV 2*(B*T)*(3E)*E, out 2*(B*T)*E*E); core 4*B*H*T^2*d%s%s\n",
           op->causal ? ", halved for causal (FlashAttention convention)" : "",
           op->encoder ? "; feed-forward 4*(B*T)*F*E" : "");
    printf("softmax bytes: the B*H*T^2 float scores read twice + written once; GEMM share = GEMM stages' device "
           "time / all stages'\n");
}

static void fmt_opt(char *buf, size_t len, const char *fmt, double v, int valid)
{
    if (valid) snprintf(buf, len, fmt, v);
    else snprintf(buf, len, "-");
}

static void print_interference(const result *r)
{
    if (r->interference < 0) return;
    printf("other processes used %.1f%% of the CPUs during these %.1f s%s\n", 100.0 * r->interference, r->wall_s,
           r->interference > 0.05 ? " (the figures above are skewed by them)" : "");
}

/* The attention plan's per-stage table and GEMM share. */
static void print_stages(const bench_ctx *b, const result *r)
{
    if (r->profiling[0]) {
        printf("stages: not timed (%s)\n", r->profiling);
        return;
    }
    printf("%-16s %10s %10s %10s %7s  %s\n", "stage", "median ms", "min ms", "max ms", "share", "rate");
    for (int s = 0; s < NSTAGES; s++) {
        const stats *x = &r->stage[s];
        const char *name = clattn_stage_name((clattn_stage)s);
        if (!x->valid) {
            printf("%-16s %10s %10s %10s %7s  %s\n", name, "-", "-", "-", "-",
                   b->opencl ? "(did not run)" : "(not timed apart on ref)");
            continue;
        }
        char rate[64] = "";
        if (is_gemm_stage(s) || s == CLATTN_STAGE_ATTENTION)
            snprintf(rate, sizeof rate, "%.2f GFLOP/s", stage_flops(r, s) / (x->median * 1e6));
        else if (s == CLATTN_STAGE_SOFTMAX && r->softmax_valid) snprintf(rate, sizeof rate, "%.2f GB/s", r->softmax_gbps);
        else if (s == CLATTN_STAGE_SOFTMAX) snprintf(rate, sizeof rate, "(ref: scores + softmax + context)");
        printf("%-16s %10.3f %10.3f %10.3f %6.1f%%  %s\n", name, x->median, x->min, x->max,
               r->stage_sum_ms > 0 ? 100.0 * x->median / r->stage_sum_ms : 0.0, rate);
    }
    printf("%-16s %10.3f   (%s)\n\n", "sum of stages", r->stage_sum_ms,
           b->opencl ? "profiled runs, marker events between the stages" : "host wall time per stage");
    if (r->gemm_share_valid)
        printf("GEMM share: %.1f%% of the stages' device time (non-GEMM stages %.1f%%)\n", 100.0 * r->gemm_share,
               100.0 * (1.0 - r->gemm_share));
    else
        printf("GEMM share: - (ref times scores, softmax and context as one loop)\n");
}

static void print_text(const bench_ctx *b, const options *o, const result *r)
{
    const clattn_op *op = &r->op;
    print_header(b, o);
    printf("T=%zu: %.4g GFLOP per call = projections %.4g (QKV %.4g + out %.4g) + core %.4g", op->seq,
           r->flops.total / 1e9, r->flops.projections / 1e9, r->flops.qkv_projection / 1e9,
           r->flops.out_projection / 1e9, r->flops.core / 1e9);
    if (op->encoder) printf(" + feed-forward %.4g", r->flops.ffn / 1e9);
    printf("\n\n");
    if (r->algorithm != CLATTN_ALGORITHM_AUTO)
        printf("algorithm: %s, core %s (%s); the plan holds %.1f MiB of device memory\n",
               clattn_algorithm_name(r->algorithm), r->core, r->core_params, (double)r->device_bytes / 1048576.0);
    if (r->core_valid)
        printf("attention core: %.3f ms, %.2f GFLOP/s\n", r->core_ms, r->flops.core / (r->core_ms * 1e6));
    printf("GEMM core: %s%s%s%s", r->gemm, r->gemm_params[0] ? " (" : "", r->gemm_params, r->gemm_params[0] ? ")" : "");
    if (r->proj_valid)
        printf("; projections %.3f ms, %.2f GFLOP/s", r->proj_ms, r->flops.projections / (r->proj_ms * 1e6));
    printf("\n");
    printf("first call (plan creation + first execute): %.1f ms\n", r->first_call_ms);
    if (r->dev.valid)
        printf("whole call, device-resident (execute_buffers + clFinish): median %.2f ms (min %.2f, max %.2f)  "
               "%.2f GFLOP/s\n", r->dev.median, r->dev.min, r->dev.max, r->gflops);
    else
        printf("whole call, device-resident: - (ref has no device buffers)\n");
    printf("whole call, host-to-host (execute from host arrays):  median %.2f ms (min %.2f, max %.2f)  "
           "%.2f GFLOP/s\n\n", r->host.median, r->host.min, r->host.max, r->host_gflops);

    if (op->encoder)
        printf("stages: - (the encoder layer is timed as a whole; its plan has no per-stage profiling;\n"
               "        run without --encoder for the attention module's stages)\n");
    else
        print_stages(b, r);
    if (r->sgemm.valid)
        printf("CLBlast SGEMM %zux%zux%zu (same FLOPs, same timing): median %.2f ms (min %.2f, max %.2f)  "
               "%.2f GFLOP/s; %s reaches %.2f of it\n",
               r->sgemm_m, r->sgemm_n, r->sgemm_k, r->sgemm.median, r->sgemm.min, r->sgemm.max, r->sgemm_gflops,
               op->encoder ? "the encoder layer" : "attention", r->sgemm_fraction);
    else
        printf("CLBlast SGEMM: - (ref)\n");
    print_interference(r);
}

static void print_sweep_table(const bench_ctx *b, const options *o, const result *rs, int n, const char *note)
{
    print_header(b, o);
    printf("\n%6s %10s %10s %21s %10s %9s %7s %9s %9s %6s %7s\n", "T", "GFLOP", "first ms", "median ms (min-max)",
           "host ms", "GFLOP/s", "GEMM%", "smax GB/s", "SGEMM", "frac", "others");
    for (int i = 0; i < n; i++) {
        const result *r = &rs[i];
        char med[64], share[16], smax[16], sg[16], frac[16], oth[16];
        if (r->dev.valid) snprintf(med, sizeof med, "%.2f (%.2f-%.2f)", r->dev.median, r->dev.min, r->dev.max);
        else snprintf(med, sizeof med, "-");
        fmt_opt(share, sizeof share, "%.1f", 100.0 * r->gemm_share, r->gemm_share_valid);
        fmt_opt(smax, sizeof smax, "%.2f", r->softmax_gbps, r->softmax_valid);
        fmt_opt(sg, sizeof sg, "%.2f", r->sgemm_gflops, r->sgemm.valid);
        fmt_opt(frac, sizeof frac, "%.2f", r->sgemm_fraction, r->sgemm.valid);
        fmt_opt(oth, sizeof oth, "%.1f%%", 100.0 * r->interference, r->interference >= 0);
        printf("%6zu %10.4g %10.1f %21s %10.2f %9.2f %7s %9s %9s %6s %7s\n", r->op.seq, r->flops.total / 1e9,
               r->first_call_ms, med, r->host.median, r->gflops, share, smax, sg, frac, oth);
    }
    printf("GFLOP/s: device-resident where there is one, else host-to-host (ref); SGEMM in GFLOP/s;\n"
           "others: share of the CPUs other processes used while the row was measured\n");
    if (note) printf("%s\n", note);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
    argv = clattn_args_split_equals(&argc, argv);  /* --opt=value as --opt value */
    if (!argv) bench_die("out of memory reading the arguments");
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--decode")) return clattn_bench_decode(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--backward")) return clattn_bench_backward(argc, argv);
    options o;
    parse_options(argc, argv, &o);

    bench_ctx b;
    memset(&b, 0, sizeof b);
    bench_check(clattn_device_open(o.device, &b.dev), "--device");
    const char *notice = clattn_device_notice(b.dev);
    if (notice) fprintf(stderr, "clattn-bench: notice: %s\n", notice);
    b.opencl = clattn_device_backend(b.dev) == CLATTN_BACKEND_OPENCL;
    snprintf(b.device_name, sizeof b.device_name, "%s", clattn_device_name(b.dev));
    snprintf(b.driver, sizeof b.driver, "n/a");
    if (b.opencl) {
        b.ctx = clattn_device_context(b.dev);
        b.queue = clattn_device_queue(b.dev);
        cl_device_id id = NULL;
        check_cl(clGetCommandQueueInfo(b.queue, CL_QUEUE_DEVICE, sizeof id, &id, NULL), "clGetCommandQueueInfo");
        char drv[sizeof b.driver] = "";
        check_cl(clGetDeviceInfo(id, CL_DRIVER_VERSION, sizeof drv - 1, drv, NULL), "clGetDeviceInfo(CL_DRIVER_VERSION)");
        drv[sizeof drv - 1] = '\0';
        snprintf(b.driver, sizeof b.driver, "%s", drv);
    }

    /* what is about to be measured, before anything long starts */
    char tdesc[64];
    if (o.sweep) snprintf(tdesc, sizeof tdesc, "%zu..%zu (sweep)", sweep_seqs[0], sweep_seqs[NSWEEP - 1]);
    else snprintf(tdesc, sizeof tdesc, "%zu", o.op.seq);
    fprintf(stderr, "clattn-bench: device %s (driver %s)\n", b.device_name, b.driver);
    fprintf(stderr, "clattn-bench: %s B=%zu T=%s E=%zu H=%zu %s, algorithm %s, dropout %g; %d iterations after %d "
            "warm-up\n", o.op.encoder ? "encoder layer" : "self-attention", o.op.batch, tdesc, o.op.dim, o.op.heads,
            o.op.causal ? "causal" : "non-causal", clattn_algorithm_name(o.op.algorithm), (double)o.op.dropout,
            o.iters, o.warmup);
    if (!o.sweep) {
        result r;
        measure(&b, &o, &o.op, &r);
        if (o.json) print_json(&b, &o, &r);
        else print_text(&b, &o, &r);
        if (o.csv) append_csv(&b, &o, &r);
        clattn_device_free(b.dev);
        return 0;
    }

    result rs[NSWEEP];
    int n = 0;
    char note[512] = "";
    for (size_t i = 0; i < NSWEEP; i++) {
        clattn_op op = o.op;
        op.seq = sweep_seqs[i];
        if (n > 0) {
            /* projection: the steady part scales with the FLOPs, the first call's compile part does not */
            const result *prev = &rs[n - 1];
            double ratio = clattn_op_flops(&op).total / prev->flops.total;
            double fixed = prev->first_call_ms / 1e3;
            double projected = fixed + (prev->wall_s - fixed) * ratio;
            if (projected > o.budget_s) {
                snprintf(note, sizeof note,
                         "sweep stopped before T=%zu: projected %.0f s for that configuration, over the %.0f s budget "
                         "(--budget)", op.seq, projected, o.budget_s);
                fprintf(stderr, "clattn-bench: %s\n", note);
                break;
            }
        }
        /* memory: a plan the device refuses ends the sweep (anything else is an error, as always) */
        if (!fits_device(&b, &op, note, sizeof note)) {
            fprintf(stderr, "clattn-bench: %s\n", note);
            break;
        }
        fprintf(stderr, "clattn-bench: [%zu/%zu] B=%zu T=%zu E=%zu H=%zu ...", i + 1, NSWEEP, op.batch, op.seq, op.dim,
                op.heads);
        fflush(stderr);
        measure(&b, &o, &op, &rs[n]);
        fprintf(stderr, " %.2f ms, %.2f GFLOP/s (%.1f s)\n", rs[n].dev.valid ? rs[n].dev.median : rs[n].host.median,
                rs[n].gflops, rs[n].wall_s);
        if (o.json) print_json(&b, &o, &rs[n]);
        if (o.csv) append_csv(&b, &o, &rs[n]);
        n++;
    }
    if (!o.json) print_sweep_table(&b, &o, rs, n, note[0] ? note : NULL);
    clattn_device_free(b.dev);
    return 0;
}
