/* gemm_cpu.c: which GEMM should a CPU device run? The three candidates of issue 25, on the GEMMs an attention
 * module and an encoder layer make (B=4 T=512 E=512 H=8 F=2048, and a 64-row decode batch), each through the
 * same OpenCL buffers on one device:
 *   gemm_tiles    the library's GEMM core for CPU devices (src/cores/gemm_tiles.c), parameters as forced by
 *                 CLATTN_CORE=gemm_tiles:P=V,... or its defaults
 *   gemm_clblast  CLBlast through the library (its parameters: CLBlast's own for the device, or a tuning
 *                 file's)
 *   host BLAS     cblas_sgemm of a host BLAS (OpenBLAS, dlopen'ed: libopenblas.so.0) called from an OpenCL
 *                 native kernel (clEnqueueNativeKernel) on the same buffers, so that the queue orders it: the
 *                 way a library would run a host BLAS on a CPU device whose buffers live in host memory
 * Each is timed as the median of 7 runs after 2 (enqueue + clFinish), twice: each candidate's runs one after
 * another ("alone", the host BLAS last), then the candidates alternating run by run ("alternating": A B C A B C,
 * where the OpenCL kernels run right after OpenBLAS has returned, while its worker threads still spin); every
 * result is checked against the others' (dyadic inputs: exact). One JSON object per shape, candidate and mode.
 * Experiment only (not built by CMake); from the repository root, after building ./build:
 *   cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -Icl bench/experiments/gemm_cpu.c \
 *      build/libclattn_static.a -lclblast -lOpenCL -lpthread -ldl -lm -o /tmp/gemm_cpu && /tmp/gemm_cpu [rounds]
 * (apt-get install libopenblas0-pthread for the host BLAS; without it, or with GEMM_CPU_NO_BLAS=1, that candidate
 * is skipped.) */
#include "attention/attention.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);
static sgemm_fn cblas_sgemm_p;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

/* the native kernel's arguments: the buffers' handles are replaced by host pointers in OpenCL's copy */
typedef struct native_args {
    cl_mem a, b, c;
    int m, n, k, tb, count;
    size_t sa, sb, sc;
} native_args;

static void native_gemm(void *p)
{
    const native_args *x = p;
    for (int e = 0; e < x->count; e++) /* CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 */
        cblas_sgemm_p(101, 111, x->tb ? 112 : 111, x->m, x->n, x->k, 1.0f, (const float *)x->a + e * x->sa, x->k,
                      (const float *)x->b + e * x->sb, x->tb ? x->k : x->n, 0.0f, (float *)x->c + e * x->sc, x->n);
}

typedef struct shape {
    const char *what;
    size_t m, n, k, count;
    int tb;
} shape;

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 7;
    void *blas = getenv("GEMM_CPU_NO_BLAS") ? NULL : dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (blas) cblas_sgemm_p = (sgemm_fn)dlsym(blas, "cblas_sgemm");
    if (!cblas_sgemm_p) fprintf(stderr, "gemm_cpu: no libopenblas.so.0 with cblas_sgemm: the host BLAS is skipped\n");
    clattn_device *dev = NULL;
    if (clattn_device_open("opencl", &dev) != CLATTN_STATUS_SUCCESS || dev->backend != CLATTN_BACKEND_OPENCL)
        DIE("no OpenCL device: %s", clattn_last_error());
    const clattn_attention_desc d = {.batch = 1, .seq_q = 8, .seq_kv = 8, .embed = 64, .kv_embed = 64, .heads = 1,
                                     .kv_heads = 1, .head_dim_qk = 64, .head_dim_v = 64, .out_dim = 64};
    /* the candidates: gemm_tiles (CLATTN_CORE may set its parameters), gemm_clblast */
    clattn_core_instance inst[2];
    const char *names[2] = {"gemm_tiles", "gemm_clblast"};
    const char *env = getenv("CLATTN_CORE");
    char spec[300];
    for (int i = 0; i < 2; i++) {
        snprintf(spec, sizeof spec, "%s", i == 0 && env && !strncmp(env, "gemm_tiles", 10) ? env : names[i]);
        setenv("CLATTN_CORE", spec, 1);
        if (clattn_core_create(dev, CLATTN_CORE_GEMM, &d, NULL, 0, &inst[i]) != CLATTN_STATUS_SUCCESS)
            DIE("%s: %s", names[i], clattn_last_error());
    }
    char tiles_params[128];
    clattn_core_params_format(inst[0].core, &inst[0].params, tiles_params, sizeof tiles_params);
    const shape shapes[] = {
        {"QKV projection", 2048, 1536, 512, 1, 1},   {"out projection", 2048, 512, 512, 1, 1},
        {"feed-forward 1", 2048, 2048, 512, 1, 1},   {"feed-forward 2", 2048, 512, 2048, 1, 1},
        {"decode batch of 64", 64, 1536, 512, 1, 1}, {"unfused scores", 512, 512, 64, 32, 1},
        {"unfused context", 512, 64, 512, 32, 0},
    };
    cl_context ctx = clattn_device_context(dev);
    cl_command_queue q = clattn_device_queue(dev);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        const size_t sa = s->m * s->k, sb = s->n * s->k, sc = s->m * s->n;
        float *ha = malloc(sa * s->count * 4), *hb = malloc(sb * s->count * 4), *hc[3];
        for (size_t i = 0; i < sa * s->count; i++) ha[i] = (float)(rand() % 129 - 64) / 64.0f;
        for (size_t i = 0; i < sb * s->count; i++) hb[i] = (float)(rand() % 129 - 64) / 64.0f;
        cl_int err;
        cl_mem a = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sa * s->count * 4, ha, &err);
        cl_mem b = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sb * s->count * 4, hb, &err);
        cl_mem c = clCreateBuffer(ctx, 0, sc * s->count * 4, NULL, &err);
        if (err != CL_SUCCESS) DIE("buffers: %d", err);
        const clattn_gemm_call call = {.m = s->m, .n = s->n, .k = s->k, .trans_b = s->tb, .alpha = 1, .beta = 0,
                                       .a = {a, 0}, .b = {b, 0}, .c = {c, 0}, .lda = s->k, .ldb = s->tb ? s->k : s->n,
                                       .ldc = s->n, .count = s->count, .stride_a = sa, .stride_b = sb, .stride_c = sc,
                                       .what = s->what};
        native_args na = {a, b, c, (int)s->m, (int)s->n, (int)s->k, s->tb, (int)s->count, sa, sb, sc};
        const void *locs[3] = {&na.a, &na.b, &na.c};
        cl_mem mems[3] = {a, b, c};
        const int ncand = cblas_sgemm_p ? 3 : 2;
        double t[3][64];
        for (int mode = 0; mode < 2; mode++) {
        /* mode 0: each candidate's runs one after another, host BLAS last; mode 1: the candidates alternating */
        for (int i = 0; i < (rounds + 2) * ncand; i++) {
            const int k = mode ? i % ncand : i / (rounds + 2), r = (mode ? i / ncand : i % (rounds + 2)) - 2;
            {
                const double t0 = now_ms();
                if (k < 2) {
                    const clattn_gemm g = {inst[k].core, inst[k].state};
                    if (clattn_gemm_run(&g, &call) != CLATTN_STATUS_SUCCESS) DIE("%s: %s", names[k], clattn_last_error());
                } else if (clEnqueueNativeKernel(q, native_gemm, &na, sizeof na, 3, mems, locs, 0, NULL, NULL)) {
                    DIE("clEnqueueNativeKernel failed");
                }
                if (clFinish(q) != CL_SUCCESS) DIE("clFinish");
                if (r >= 0) t[k][r] = now_ms() - t0;
                if (r == rounds - 1) { /* the result of each candidate, compared below */
                    hc[k] = malloc(sc * s->count * 4);
                    clEnqueueReadBuffer(q, c, CL_TRUE, 0, sc * s->count * 4, hc[k], 0, NULL, NULL);
                }
            }
        }
        for (int k = 1; k < ncand; k++)
            for (size_t i = 0; i < sc * s->count; i++)
                if (hc[k][i] != hc[0][i]) DIE("%s: candidate %d differs at %zu (%g, %g)", s->what, k, i, hc[k][i], hc[0][i]);
        const double flop = 2.0 * s->m * s->n * s->k * s->count;
        for (int k = 0; k < ncand; k++) {
            qsort(t[k], (size_t)rounds, sizeof t[k][0], cmp_d);
            const double med = t[k][rounds / 2];
            printf("{\"device\":\"%s\",\"shape\":\"%s\",\"m\":%zu,\"n\":%zu,\"k\":%zu,\"count\":%zu,\"candidate\":\"%s\","
                   "\"params\":\"%s\",\"mode\":\"%s\",\"median_ms\":%.3f,\"min_ms\":%.3f,\"max_ms\":%.3f,"
                   "\"gflops\":%.1f}\n", clattn_device_name(dev), s->what, s->m, s->n, s->k, s->count,
                   k == 2 ? "host BLAS (OpenBLAS, native kernel)" : names[k], k == 0 ? tiles_params : "",
                   mode ? "alternating" : "alone", med, t[k][0], t[k][rounds - 1], flop / (med * 1e6));
            fflush(stdout);
            free(hc[k]);
        }
        }
        clReleaseMemObject(a), clReleaseMemObject(b), clReleaseMemObject(c);
        free(ha), free(hb);
    }
    for (int i = 0; i < 2; i++) clattn_core_destroy(&inst[i]);
    clattn_device_free(dev);
    return 0;
}
