/* subbuf_probe.c: do writes through one sub-buffer show through an overlapping one on this OpenCL driver?
 * clattn's CLBlast calls address a caller's sub-buffer past CLBlast's index range through a second sub-buffer of
 * the same parent (runtime/blas.c rebase); test_gemm's lowered_limits case failed on NVIDIA's OpenCL (H200,
 * 2026-11-26) with C never written as seen through the caller's sub-buffer. This tells which step loses the data.
 * Build: cc -O1 -o subbuf_probe subbuf_probe.c -lclblast -lOpenCL -lm; run: ./subbuf_probe (first GPU, else first device). */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("%s: %d\n", #x, e_); return 1; } } while (0)

static const char *src = "kernel void neg(global float *p, int o) { size_t i = get_global_id(0); p[o + i] = -p[o + i]; }";

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    cl_platform_id plats[8]; cl_uint np = 0;
    CHECK(clGetPlatformIDs(8, plats, &np));
    cl_device_id dev = NULL;
    for (cl_uint i = 0; i < np && !dev; i++)
        if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_GPU, 1, &dev, NULL) != CL_SUCCESS) dev = NULL;
    if (!dev) CHECK(clGetDeviceIDs(plats[0], CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    char name[256]; cl_uint align_bits = 0;
    clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    const size_t align = align_bits / 8;
    printf("device %s, base address alignment %zu bytes\n", name, align);
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err);
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err); CHECK(err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err); CHECK(err);
    CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "neg", &err); CHECK(err);
    const size_t n = 40000, o1 = 3 * align, at = 20003, len = 64;
    float *h = malloc(n * sizeof *h), *back = malloc(n * sizeof *back);
    for (size_t i = 0; i < n; i++) h[i] = (float)i + 1;
    int bad = 0;
    { /* what the driver reports of a sub-buffer: its parent, origin and size (runtime/blas.c rebase reads these) */
        cl_mem p = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * align + n * 4, NULL, &err); CHECK(err);
        const size_t origins[3] = {o1, align, 40 * align};
        for (int i = 0; i < 3; i++) {
            cl_buffer_region r = {origins[i], n * 4};
            cl_mem s = clCreateSubBuffer(p, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &err); CHECK(err);
            cl_mem par = NULL; size_t off = 12345, size = 0;
            cl_int e1 = clGetMemObjectInfo(s, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof par, &par, NULL);
            cl_int e2 = clGetMemObjectInfo(s, CL_MEM_OFFSET, sizeof off, &off, NULL);
            cl_int e3 = clGetMemObjectInfo(s, CL_MEM_SIZE, sizeof size, &size, NULL);
            const int right = !e1 && !e2 && !e3 && par == p && off == origins[i] && size == n * 4;
            printf("sub-buffer at origin %zu, size %zu: parent %s (%d), CL_MEM_OFFSET %zu (%d), CL_MEM_SIZE %zu (%d): %s\n",
                   origins[i], n * 4, par == p ? "right" : "WRONG", e1, off, e2, size, e3, right ? "right" : "WRONG");
            bad += !right;
            clReleaseMemObject(s);
        }
        cl_mem par = (cl_mem)1; size_t off = 12345;
        clGetMemObjectInfo(p, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof par, &par, NULL);
        clGetMemObjectInfo(p, CL_MEM_OFFSET, sizeof off, &off, NULL);
        printf("a whole buffer: parent %p, CL_MEM_OFFSET %zu\n", (void *)par, off);
        clReleaseMemObject(p);
    }
    for (int variant = 0; variant < 4; variant++) {
        /* 0: S1 sub-buffer of P written by the host, the kernel through S2 (a sibling), read through S1
         * 1: the same, read through P; 2: the same, read through S2; 3: the host writes P, kernel through S2, read P */
        cl_mem p = clCreateBuffer(ctx, CL_MEM_READ_WRITE, o1 + n * 4 + 4096, NULL, &err); CHECK(err);
        cl_buffer_region r1 = {o1, n * 4};
        cl_mem s1 = clCreateSubBuffer(p, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r1, &err); CHECK(err);
        const size_t byte = o1 + at * 4, origin = byte / align * align;
        cl_buffer_region r2 = {origin, byte - origin + len * 4};
        cl_mem s2 = clCreateSubBuffer(p, 0, CL_BUFFER_CREATE_TYPE_REGION, &r2, &err); CHECK(err);
        if (variant < 3) CHECK(clEnqueueWriteBuffer(q, s1, CL_TRUE, 0, n * 4, h, 0, NULL, NULL));
        else CHECK(clEnqueueWriteBuffer(q, p, CL_TRUE, o1, n * 4, h, 0, NULL, NULL));
        const cl_int off = (cl_int)((byte - origin) / 4);
        CHECK(clSetKernelArg(k, 0, sizeof s2, &s2));
        CHECK(clSetKernelArg(k, 1, sizeof off, &off));
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &len, NULL, 0, NULL, NULL));
        CHECK(clFinish(q));
        size_t first = 0, wrong = 0;
        float got0 = 0;
        if (variant == 0) CHECK(clEnqueueReadBuffer(q, s1, CL_TRUE, 0, n * 4, back, 0, NULL, NULL));
        else if (variant == 1 || variant == 3) CHECK(clEnqueueReadBuffer(q, p, CL_TRUE, o1, n * 4, back, 0, NULL, NULL));
        if (variant == 2) {
            CHECK(clEnqueueReadBuffer(q, s2, CL_TRUE, (byte - origin), len * 4, back + at, 0, NULL, NULL));
            for (size_t i = at; i < at + len; i++)
                if (back[i] != -h[i]) { if (!wrong++) first = i, got0 = back[i]; }
        } else {
            for (size_t i = 0; i < n; i++) {
                const float want = i >= at && i < at + len ? -h[i] : h[i];
                if (back[i] != want) { if (!wrong++) first = i, got0 = back[i]; }
            }
        }
        static const char *what[] = {"host->S1, kernel on S2, read S1", "host->S1, kernel on S2, read parent",
                                     "host->S1, kernel on S2, read S2", "host->parent, kernel on S2, read parent"};
        if (wrong) printf("%-42s: %zu wrong, first element %zu: got %g want %g\n", what[variant], wrong, first, got0,
                          first >= at && first < at + len ? -h[first] : h[first]);
        else printf("%-42s: right\n", what[variant]);
        bad += wrong != 0;
        clReleaseMemObject(s2); clReleaseMemObject(s1); clReleaseMemObject(p);
    }
    /* CLBlast on the same shapes as test_gemm's failing case: A and C inside callers' sub-buffers at elements 20001
     * and 20003, each addressed through a sibling sub-buffer from the aligned origin below it, as rebase does */
    {
        const size_t m = 70, nn = 90, kk = 130, offa = 20001, offc = 20003;
        const size_t na = offa + m * kk + 5, nb = nn * kk, nc = offc + m * nn + 5;
        float *a = malloc(na * 4), *b = malloc(nb * 4), *c = malloc(nc * 4), *got = malloc(nc * 4);
        for (size_t i = 0; i < na; i++) a[i] = (float)((int)(i * 7919 % 129) - 64) / 64.0f;
        for (size_t i = 0; i < nb; i++) b[i] = (float)((int)(i * 104729 % 129) - 64) / 64.0f;
        for (size_t i = 0; i < nc; i++) c[i] = NAN;
        static const int order[] = {0, 1, 4, 2, 3};
        for (int oi = 0; oi < 5; oi++) {
            const int mode = order[oi];
            /* mode 0: whole buffers; 1: callers' sub-buffers (A, B, C) at 3 alignments, one call; 2: the same in blocks
             * of 22 rows (CLBlast's direct kernel), each block's sub-buffers released right after its call, as
             * runtime/blas.c did; 3: as 2, released only after clFinish; 4: each block waited for (its event) before
             * its sub-buffers are released and the next block's made, as runtime/blas.c does now */
            const int sub = mode > 0;
            cl_mem pa = clCreateBuffer(ctx, CL_MEM_READ_WRITE, o1 + na * 4 + 64, NULL, &err); CHECK(err);
            cl_mem pb = clCreateBuffer(ctx, CL_MEM_READ_WRITE, o1 + nb * 4 + 64, NULL, &err); CHECK(err);
            cl_mem pc = clCreateBuffer(ctx, CL_MEM_READ_WRITE, o1 + nc * 4 + 64, NULL, &err); CHECK(err);
            cl_mem sa = pa, sb = pb, sc = pc;
            if (sub) {
                cl_buffer_region ra = {o1, na * 4}, rb = {o1, nb * 4}, rc = {o1, nc * 4};
                sa = clCreateSubBuffer(pa, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &ra, &err); CHECK(err);
                sb = clCreateSubBuffer(pb, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &rb, &err); CHECK(err);
                sc = clCreateSubBuffer(pc, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &rc, &err); CHECK(err);
            }
            CHECK(clEnqueueWriteBuffer(q, sa, CL_TRUE, 0, na * 4, a, 0, NULL, NULL));
            CHECK(clEnqueueWriteBuffer(q, sb, CL_TRUE, 0, nb * 4, b, 0, NULL, NULL));
            CHECK(clEnqueueWriteBuffer(q, sc, CL_TRUE, 0, nc * 4, c, 0, NULL, NULL));
            size_t qa = 0, qc = 0; /* the callers' origins as the driver reports them */
            if (sub) {
                CHECK(clGetMemObjectInfo(sa, CL_MEM_OFFSET, sizeof qa, &qa, NULL));
                CHECK(clGetMemObjectInfo(sc, CL_MEM_OFFSET, sizeof qc, &qc, NULL));
            }
            const size_t rows = mode >= 2 ? 22 : m;
            cl_event ev = NULL;
            cl_mem keep[16]; int nkeep = 0;
            CLBlastStatusCode st = CLBlastSuccess;
            for (size_t r0 = 0; r0 < m && st == CLBlastSuccess; r0 += rows) {
                const size_t mc = m - r0 < rows ? m - r0 : rows;
                const size_t ba = qa + (offa + r0 * kk) * 4, bc = qc + (offc + r0 * nn) * 4;
                cl_buffer_region r2a = {ba / align * align, ba - ba / align * align + mc * kk * 4};
                cl_buffer_region r2c = {bc / align * align, bc - bc / align * align + mc * nn * 4};
                cl_mem s2a = clCreateSubBuffer(pa, 0, CL_BUFFER_CREATE_TYPE_REGION, &r2a, &err); CHECK(err);
                cl_mem s2c = clCreateSubBuffer(pc, 0, CL_BUFFER_CREATE_TYPE_REGION, &r2c, &err); CHECK(err);
                st = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, mc, nn, kk, 1.0f, s2a,
                                  (ba - r2a.origin) / 4, kk, sb, 0, kk, 0.0f, s2c, (bc - r2c.origin) / 4, nn, &q, mode == 4 ? &ev : NULL);
                if (ev) { CHECK(clWaitForEvents(1, &ev)); clReleaseEvent(ev); ev = NULL; }
                if (mode == 3) keep[nkeep++] = s2a, keep[nkeep++] = s2c;
                else clReleaseMemObject(s2a), clReleaseMemObject(s2c);
            }
            CHECK(clFinish(q));
            for (int i = 0; i < nkeep; i++) clReleaseMemObject(keep[i]);
            CHECK(clEnqueueReadBuffer(q, sc, CL_TRUE, 0, nc * 4, got, 0, NULL, NULL));
            size_t wrong = 0, nan = 0, first = 0, outside = 0;
            for (size_t i = 0; i < nc; i++) {
                const int in = i >= offc && i < offc + m * nn;
                if (!in) { outside += !isnan(got[i]); continue; }
                double s = 0;
                const size_t r = (i - offc) / nn, j = (i - offc) % nn;
                for (size_t t = 0; t < kk; t++) s += (double)a[offa + r * kk + t] * b[j * kk + t];
                if (got[i] != (float)s) { if (!wrong++) first = i - offc; nan += isnan(got[i]); }
            }
            static const char *modes[] = {"whole buffers, one call", "callers' sub-buffers, one call",
                                          "callers' sub-buffers, 22-row blocks, early release",
                                          "callers' sub-buffers, 22-row blocks, released after finish",
                                          "callers' sub-buffers, 22-row blocks, each waited for"};
            printf("CLBlast, %-58s: status %d, %zu of %zu wrong (%zu NaN, first %zu), %zu written outside C\n",
                   modes[mode], (int)st, wrong, m * nn, nan, first, outside);
            bad += wrong != 0 || outside != 0 || st != CLBlastSuccess;
            if (sub) clReleaseMemObject(sa), clReleaseMemObject(sb), clReleaseMemObject(sc);
            clReleaseMemObject(pa); clReleaseMemObject(pb); clReleaseMemObject(pc);
        }
    }
    printf("subbuf_probe: %s\n", bad ? "something above is wrong" : "every view right");
    return bad != 0;
}
