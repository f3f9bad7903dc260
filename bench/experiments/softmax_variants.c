/* softmax_variants.c: time cl/softmax.cl's softmax_rows against the candidate
 * kernels of softmax_variants.cl on one OpenCL device, on the score matrix of
 * one attention call (B*H*T rows of T), and check every variant against a
 * plain-C softmax. Experiment only (not built by CMake):
 *
 *   cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L bench/experiments/softmax_variants.c \
 *      -o /tmp/softmax_variants -lOpenCL -lm
 *   /tmp/softmax_variants [--rows-of B H] [--seq T] [--causal] [--iters N]   (run from the repo root)
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(e, what) do { cl_int e_ = (e); if (e_ != CL_SUCCESS) { fprintf(stderr, "%s: %d\n", what, e_); exit(1); } } while (0)

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s (run from the repo root)\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) exit(1);
    s[n] = 0;
    fclose(f);
    return s;
}

static cl_context ctx;
static cl_device_id dev;
static cl_command_queue q;

static cl_program build(int nsrc, const char **srcs, const char *opts)
{
    cl_int err;
    cl_program p = clCreateProgramWithSource(ctx, (cl_uint)nsrc, srcs, NULL, &err);
    CHECK(err, "clCreateProgramWithSource");
    err = clBuildProgram(p, 1, &dev, opts, NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[16384];
        clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        fprintf(stderr, "build failed (%s):\n%s\n", opts, log);
        exit(1);
    }
    return p;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median device time (ms) of `iters` launches, after 2 warm-up launches, on fresh copies of the input */
static double run(cl_kernel k, size_t global, size_t local, cl_mem s, cl_mem src, size_t bytes, int iters)
{
    double t[64];
    for (int it = -2; it < iters; it++) {
        CHECK(clEnqueueCopyBuffer(q, src, s, 0, 0, bytes, 0, NULL, NULL), "copy");
        cl_event ev;
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, local ? &local : NULL, 0, NULL, &ev), "launch");
        CHECK(clWaitForEvents(1, &ev), "wait");
        cl_ulong a, b;
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL);
        clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL);
        clReleaseEvent(ev);
        if (it >= 0) t[it] = (double)(b - a) * 1e-6;
    }
    qsort(t, (size_t)iters, sizeof t[0], cmpd);
    return iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
}

static double check(cl_mem s, const float *ref, size_t n)
{
    float *got = malloc(n * sizeof *got);
    CHECK(clEnqueueReadBuffer(q, s, CL_TRUE, 0, n * sizeof *got, got, 0, NULL, NULL), "read");
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= worst)) worst = d;   /* NaN shows as NaN */
    }
    free(got);
    return worst;
}

int main(int argc, char **argv)
{
    size_t B = 4, H = 8, T = 512;
    int causal = 0, iters = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows-of") && i + 2 < argc) { B = strtoul(argv[i + 1], 0, 10); H = strtoul(argv[i + 2], 0, 10); i += 2; }
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = strtoul(argv[++i], 0, 10);
        else if (!strcmp(argv[i], "--causal")) causal = 1;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--rows-of B H] [--seq T] [--causal] [--iters N]\n", argv[0]); return 2; }
    }
    if (iters < 1 || iters > 64) iters = 10;
    cl_platform_id plat;
    CHECK(clGetPlatformIDs(1, &plat, NULL), "platform");
    CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL), "device");
    cl_int err;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err, "context");
    q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    CHECK(err, "queue");

    const size_t rows = B * H * T, n = rows * T, bytes = n * sizeof(float);
    float *x = malloc(bytes), *ref = malloc(bytes);
    unsigned long long st = 12345;
    for (size_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((st >> 40) * (1.0 / 16777216.0)) * 8.0f - 4.0f;
    }
    for (size_t r = 0; r < rows; r++) {   /* plain-C reference, double accumulation */
        const float *a = x + r * T;
        float *o = ref + r * T;
        size_t i = r % T, vis = causal ? (i + 1 < T ? i + 1 : T) : T;
        double m = -INFINITY, sum = 0;
        for (size_t j = 0; j < vis; j++) m = a[j] > m ? a[j] : m;
        for (size_t j = 0; j < vis; j++) sum += exp((double)a[j] - m);
        for (size_t j = 0; j < T; j++) o[j] = j < vis ? (float)(exp((double)a[j] - m) / sum) : 0.0f;
    }
    cl_mem src = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, x, &err);
    CHECK(err, "src");
    cl_mem s = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    CHECK(err, "s");
    const double gb = 3.0 * (double)bytes / 1e9;   /* the bench's convention: read twice, written once */
    printf("rows %zu (B=%zu H=%zu T=%zu) of %zu, %s; %.1f MB of scores; median of %d\n", rows, B, H, T, T,
           causal ? "causal" : "non-causal", bytes / 1e6, iters);
    printf("%-34s %10s %9s %12s\n", "kernel", "ms", "GB/s", "max |err|");

    char *philox = slurp("cl/philox.cl"), *orig = slurp("cl/softmax.cl"), *var = slurp("bench/experiments/softmax_variants.cl");
    cl_uint Tq = (cl_uint)T, Tk = (cl_uint)T, Hh = (cl_uint)H, zero = 0, rows32 = (cl_uint)rows;
    cl_ulong z64 = 0;
    cl_float one = 1.0f;
    size_t wgs[] = {16, 32, 64, 128, 256};
    for (size_t w = 0; w < sizeof wgs / sizeof wgs[0]; w++) {
        char opts[200];
        snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DWG=%zu -DCAUSAL=%d -DKPM=0 -DMASK_KIND=0 -DDROPOUT=0", wgs[w], causal);
        const char *srcs[] = {philox, orig};
        cl_program p = build(2, srcs, opts);
        cl_kernel k = clCreateKernel(p, "softmax_rows", &err);
        CHECK(err, "kernel");
        clSetKernelArg(k, 0, sizeof s, &s);
        clSetKernelArg(k, 1, sizeof z64, &z64);
        clSetKernelArg(k, 2, sizeof(cl_mem), NULL);
        clSetKernelArg(k, 3, sizeof z64, &z64);
        clSetKernelArg(k, 4, sizeof(cl_mem), NULL);
        clSetKernelArg(k, 5, sizeof z64, &z64);
        clSetKernelArg(k, 6, sizeof Tq, &Tq);
        clSetKernelArg(k, 7, sizeof Tk, &Tk);
        clSetKernelArg(k, 8, sizeof Hh, &Hh);
        clSetKernelArg(k, 9, sizeof z64, &z64);
        clSetKernelArg(k, 10, sizeof zero, &zero);
        clSetKernelArg(k, 11, sizeof zero, &zero);
        clSetKernelArg(k, 12, sizeof zero, &zero);
        clSetKernelArg(k, 13, sizeof one, &one);
        double ms = run(k, rows * wgs[w], wgs[w], s, src, bytes, iters);
        char name[64];
        snprintf(name, sizeof name, "softmax_rows (library) WG=%zu", wgs[w]);
        printf("%-34s %10.2f %9.2f %12.3g\n", name, ms, gb / (ms * 1e-3), check(s, ref, n));
        clReleaseKernel(k);
        clReleaseProgram(p);
    }
    for (size_t w = 0; w < sizeof wgs / sizeof wgs[0]; w++) {
        char opts[200];
        snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DWG=%zu -DCAUSAL=%d", wgs[w], causal);
        const char *srcs[] = {var};
        cl_program p = build(1, srcs, opts);
        cl_kernel k = clCreateKernel(p, "wg3", &err);
        CHECK(err, "kernel");
        clSetKernelArg(k, 0, sizeof s, &s);
        clSetKernelArg(k, 1, sizeof Tq, &Tq);
        clSetKernelArg(k, 2, sizeof Tk, &Tk);
        double ms = run(k, rows * wgs[w], wgs[w], s, src, bytes, iters);
        char name[64];
        snprintf(name, sizeof name, "A wg3 (3 passes) WG=%zu", wgs[w]);
        printf("%-34s %10.2f %9.2f %12.3g\n", name, ms, gb / (ms * 1e-3), check(s, ref, n));
        clReleaseKernel(k);
        clReleaseProgram(p);
    }
    {
        char opts[200];
        snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DCAUSAL=%d", causal);
        const char *srcs[] = {var};
        cl_program p = build(1, srcs, opts);
        cl_kernel k = clCreateKernel(p, "item", &err);
        CHECK(err, "kernel");
        clSetKernelArg(k, 0, sizeof s, &s);
        clSetKernelArg(k, 1, sizeof Tq, &Tq);
        clSetKernelArg(k, 2, sizeof Tk, &Tk);
        clSetKernelArg(k, 3, sizeof rows32, &rows32);
        size_t locals[] = {0, 1, 8, 64};
        for (size_t l = 0; l < sizeof locals / sizeof locals[0]; l++) {
            size_t lo = locals[l], global = lo ? (rows + lo - 1) / lo * lo : rows;
            double ms = run(k, global, lo, s, src, bytes, iters);
            char name[64];
            if (lo) snprintf(name, sizeof name, "B item (row per work-item) local=%zu", lo);
            else snprintf(name, sizeof name, "B item (row per work-item) local=auto");
            printf("%-34s %10.2f %9.2f %12.3g\n", name, ms, gb / (ms * 1e-3), check(s, ref, n));
        }
        clReleaseKernel(k);
        clReleaseProgram(p);
    }
    return 0;
}
