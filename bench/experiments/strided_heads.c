/* strided_heads.c: can the batched attention GEMMs read Q/K/V straight from the
 * token-major QKV projection, and write the context straight into the merged
 * (B, T, H*d) rows, so that the head_split and head_merge passes go away?
 * Times, on one OpenCL device, with CLBlast:
 *   head-major   the library's way: scores S = Q K^T and context C = W V as one
 *                strided-batched GEMM each over B*H pairs, on contiguous (B, H, T, d)
 *   token-major  per batch entry b, one strided-batched GEMM over the H heads,
 *                reading the (B*T, 3E) projection with ld = 3E (head stride d) and
 *                writing C into the (B*T, E) merged rows with ld = E
 * Experiment only (not built by CMake):
 *   cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L bench/experiments/strided_heads.c -o /tmp/strided_heads \
 *      -lclblast -lOpenCL -lm && /tmp/strided_heads [B T E H iters]     (from the repo root: reads cl/heads.cl)
 * It also times what the two layouts need besides the GEMMs: the library's split_heads
 * (x3, with bias) and merge_heads, against one fill_rows of the (B*T, 3E) projection
 * with the Q|K|V bias (the projection GEMM would then run with beta = 1, as the output
 * projection already does).
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <clblast_c.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(e, what) do { long e_ = (long)(e); if (e_ != 0) { fprintf(stderr, "%s: %ld\n", what, e_); exit(1); } } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

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

static void launch(cl_command_queue q, cl_kernel k, size_t total)
{
    size_t local = 64, global = (total + 63) / 64 * 64;   /* as the library's enqueue_1d */
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL), "launch");
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t B = argc > 1 ? strtoul(argv[1], 0, 10) : 4, T = argc > 2 ? strtoul(argv[2], 0, 10) : 512;
    size_t E = argc > 3 ? strtoul(argv[3], 0, 10) : 512, H = argc > 4 ? strtoul(argv[4], 0, 10) : 8;
    int iters = argc > 5 ? atoi(argv[5]) : 10;
    if (iters < 1 || iters > 100) iters = 10;
    size_t d = E / H;
    cl_platform_id plat;
    cl_device_id dev;
    cl_int err;
    CHECK(clGetPlatformIDs(1, &plat, NULL), "platform");
    CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL), "device");
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err, "context");
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
    CHECK(err, "queue");
    size_t n_proj = B * T * 3 * E, n_s = B * H * T * T, n_c = B * T * E;
    float *host = malloc(n_s * sizeof *host);
    for (size_t i = 0; i < n_s; i++) host[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    cl_mem proj = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n_proj * 4, host, &err);
    cl_mem qh = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n_c * 4, host, &err);
    cl_mem kh = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n_c * 4, host, &err);
    cl_mem vh = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n_c * 4, host, &err);
    cl_mem s = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n_s * 4, host, &err);
    cl_mem c = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n_c * 4, NULL, &err);
    CHECK(err, "buffers");
    const float scale = 0.125f;
    double t_hm_s[100], t_hm_c[100], t_tm_s[100], t_tm_c[100];
    for (int it = -2; it < iters; it++) {
        double t0 = now_ms();
        /* head-major: what the library runs */
        CHECK(CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, T, T, d, scale,
                                         qh, 0, d, T * d, kh, 0, d, T * d, 0.0f, s, 0, T, T * T, B * H, &q, NULL), "hm scores");
        clFinish(q);
        double t1 = now_ms();
        CHECK(CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, T, d, T, 1.0f,
                                         s, 0, T, T * T, vh, 0, d, T * d, 0.0f, c, 0, d, T * d, B * H, &q, NULL), "hm context");
        clFinish(q);
        double t2 = now_ms();
        /* token-major: per batch entry, heads strided by d inside rows of 3E (Q at col 0, K at E, V at 2E) */
        for (size_t b = 0; b < B; b++)
            CHECK(CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, T, T, d, scale,
                                             proj, b * T * 3 * E, 3 * E, d, proj, b * T * 3 * E + E, 3 * E, d, 0.0f,
                                             s, b * H * T * T, T, T * T, H, &q, NULL), "tm scores");
        clFinish(q);
        double t3 = now_ms();
        for (size_t b = 0; b < B; b++)
            CHECK(CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, T, d, T, 1.0f,
                                             s, b * H * T * T, T, T * T, proj, b * T * 3 * E + 2 * E, 3 * E, d, 0.0f,
                                             c, b * T * E, E, d, H, &q, NULL), "tm context");
        clFinish(q);
        double t4 = now_ms();
        if (it >= 0) {
            t_hm_s[it] = t1 - t0;
            t_hm_c[it] = t2 - t1;
            t_tm_s[it] = t3 - t2;
            t_tm_c[it] = t4 - t3;
        }
    }
    /* the reshuffles: split_heads x3 + merge_heads (library) vs fill_rows (token-major) */
    const char *src = slurp("cl/heads.cl");
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err, "program");
    CHECK(clBuildProgram(prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL), "build heads.cl");
    cl_kernel ks = clCreateKernel(prog, "split_heads", &err), km = clCreateKernel(prog, "merge_heads", &err);
    cl_kernel kf = clCreateKernel(prog, "fill_rows", &err);
    CHECK(err, "kernels");
    cl_mem bias = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, 3 * E * 4, host, &err);
    cl_mem merged = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n_c * 4, NULL, &err);
    CHECK(err, "buffers");
    double t_split[100], t_merge[100], t_fill[100];
    for (int it = -2; it < iters; it++) {
        double t0 = now_ms();
        cl_mem dst[3] = {qh, kh, vh};
        for (int w = 0; w < 3; w++) {
            cl_ulong src_off = 0, dst_off = 0, total = (cl_ulong)B * H * T * d;
            cl_uint ld = (cl_uint)(3 * E), col0 = (cl_uint)(w * E), has_bias = 1, T32 = (cl_uint)T, H32 = (cl_uint)H, D32 = (cl_uint)d;
            clSetKernelArg(ks, 0, sizeof proj, &proj);
            clSetKernelArg(ks, 1, sizeof src_off, &src_off);
            clSetKernelArg(ks, 2, sizeof ld, &ld);
            clSetKernelArg(ks, 3, sizeof col0, &col0);
            clSetKernelArg(ks, 4, sizeof bias, &bias);
            clSetKernelArg(ks, 5, sizeof has_bias, &has_bias);
            clSetKernelArg(ks, 6, sizeof dst[w], &dst[w]);
            clSetKernelArg(ks, 7, sizeof dst_off, &dst_off);
            clSetKernelArg(ks, 8, sizeof T32, &T32);
            clSetKernelArg(ks, 9, sizeof H32, &H32);
            clSetKernelArg(ks, 10, sizeof D32, &D32);
            clSetKernelArg(ks, 11, sizeof total, &total);
            launch(q, ks, (size_t)total);
        }
        clFinish(q);
        double t1 = now_ms();
        {
            cl_ulong off = 0, total = (cl_ulong)B * H * T * d;
            cl_uint T32 = (cl_uint)T, H32 = (cl_uint)H, D32 = (cl_uint)d;
            clSetKernelArg(km, 0, sizeof c, &c);
            clSetKernelArg(km, 1, sizeof off, &off);
            clSetKernelArg(km, 2, sizeof merged, &merged);
            clSetKernelArg(km, 3, sizeof off, &off);
            clSetKernelArg(km, 4, sizeof T32, &T32);
            clSetKernelArg(km, 5, sizeof H32, &H32);
            clSetKernelArg(km, 6, sizeof D32, &D32);
            clSetKernelArg(km, 7, sizeof total, &total);
            launch(q, km, (size_t)total);
        }
        clFinish(q);
        double t2 = now_ms();
        {
            cl_ulong off = 0, total = (cl_ulong)B * T * 3 * E;
            cl_uint cols = (cl_uint)(3 * E);
            clSetKernelArg(kf, 0, sizeof proj, &proj);
            clSetKernelArg(kf, 1, sizeof off, &off);
            clSetKernelArg(kf, 2, sizeof bias, &bias);
            clSetKernelArg(kf, 3, sizeof cols, &cols);
            clSetKernelArg(kf, 4, sizeof total, &total);
            launch(q, kf, (size_t)total);
        }
        clFinish(q);
        double t3 = now_ms();
        if (it >= 0) {
            t_split[it] = t1 - t0;
            t_merge[it] = t2 - t1;
            t_fill[it] = t3 - t2;
        }
    }
    double *all[7] = {t_hm_s, t_hm_c, t_tm_s, t_tm_c, t_split, t_merge, t_fill};
    const char *names[7] = {"head-major scores (library)", "head-major context (library)",
                            "token-major scores (B calls, ld 3E)", "token-major context (B calls, ld 3E -> E)",
                            "split_heads x3 with bias (library)", "merge_heads (library)",
                            "fill_rows (B*T, 3E) with the QKV bias"};
    printf("B=%zu T=%zu E=%zu H=%zu d=%zu, median (min-max) of %d, ms\n", B, T, E, H, d, iters);
    for (int k = 0; k < 7; k++) {
        qsort(all[k], (size_t)iters, sizeof(double), cmpd);
        printf("%-44s %8.2f (%.2f-%.2f)\n", names[k], all[k][iters / 2], all[k][0], all[k][iters - 1]);
    }
    return 0;
}
