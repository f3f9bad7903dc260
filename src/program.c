/* program.c: build OpenCL programs from the kernels embedded at build time. */
#include "internal.h"

#include <stdatomic.h>

#include "clattn_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct embedded { const char *name; const unsigned char *text; size_t len; } embedded;

static const embedded sources[] = {
    {"philox", clattn_cl_philox, sizeof clattn_cl_philox - 1},
    {"heads", clattn_cl_heads, sizeof clattn_cl_heads - 1},
    {"softmax", clattn_cl_softmax, sizeof clattn_cl_softmax - 1},
    {"mask", clattn_cl_mask, sizeof clattn_cl_mask - 1},
    {"flash", clattn_cl_flash, sizeof clattn_cl_flash - 1},
    {"layernorm", clattn_cl_layernorm, sizeof clattn_cl_layernorm - 1},
    {"ffn", clattn_cl_ffn, sizeof clattn_cl_ffn - 1},
    {"half", clattn_cl_half, sizeof clattn_cl_half - 1},
    {"decode", clattn_cl_decode, sizeof clattn_cl_decode - 1},
    {"linear", clattn_cl_linear, sizeof clattn_cl_linear - 1},
    {"online", clattn_cl_online, sizeof clattn_cl_online - 1},
};

static const embedded *find_source(const char *name)
{
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++)
        if (strcmp(sources[i].name, name) == 0) return &sources[i];
    return NULL;
}

clattn_status clattn_program_build(const clattn_device *dev, const char *const *names, int count,
                                   const char *options, cl_program *program)
{
    const char *texts[8];
    size_t lens[8];
    if (count < 1 || count > 8) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "bad source count");
    for (int i = 0; i < count; i++) {
        const embedded *e = find_source(names[i]);
        if (!e) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "no embedded kernel source '%s'", names[i]);
        texts[i] = (const char *)e->text;
        lens[i] = e->len;
    }
    char key[2048];
    clattn_program_cache_key(dev, names, texts, lens, count, options, key, sizeof key);
    cl_program cached = clattn_program_cache_load(dev, key, options);
    if (cached) {
        *program = cached;
        return CLATTN_STATUS_SUCCESS;
    }
    clattn_notify_build(dev);
    cl_int err;
    cl_program p = clCreateProgramWithSource(dev->context, (cl_uint)count, texts, lens, &err);
    if (err != CL_SUCCESS) return clattn_fail((clattn_status)err, "clCreateProgramWithSource failed (%d)", err);
    err = clBuildProgram(p, 1, &dev->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        size_t size = 0;
        char *log = NULL;
        if (clGetProgramBuildInfo(p, dev->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size) == CL_SUCCESS &&
            (log = clattn_malloc(size + 1)) != NULL) {
            if (clGetProgramBuildInfo(p, dev->device, CL_PROGRAM_BUILD_LOG, size, log, NULL) != CL_SUCCESS)
                size = 0;
            log[size] = '\0';
        }
        clattn_set_build_log(log ? log : "(no build log)");
        free(log);
        clReleaseProgram(p);
        return clattn_fail(err == CL_BUILD_PROGRAM_FAILURE ? CLATTN_STATUS_BUILD_FAILURE : (clattn_status)err,
                           "building kernels '%s'%s with options \"%s\" failed (%d); see clattn_last_build_log()",
                           names[0], count > 1 ? " and others" : "", options ? options : "", err);
    }
    clattn_program_cache_store(dev, key, p);
    *program = p;
    return CLATTN_STATUS_SUCCESS;
}

size_t clattn_pow2_at_most(size_t n)
{
    size_t p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}

clattn_status clattn_program_build_wg(const clattn_device *dev, const char *const *names, int count,
                                      const char *options, const char *kernel, size_t *wg, cl_program *program,
                                      cl_kernel *k)
{
    size_t size = *wg > dev->max_work_group ? clattn_pow2_at_most(dev->max_work_group) : *wg;
    for (;;) {
        char opts[512];
        if (snprintf(opts, sizeof opts, "%s -DWG=%zu", options, size) >= (int)sizeof opts)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "build options too long");
        cl_program prog = NULL;
        TRY(clattn_program_build(dev, names, count, opts, &prog));
        cl_int err;
        cl_kernel kern = clCreateKernel(prog, kernel, &err);
        size_t allowed = 0;
        if (err == CL_SUCCESS)
            err = clGetKernelWorkGroupInfo(kern, dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof allowed, &allowed,
                                           NULL);
        if (err == CL_SUCCESS && (size <= allowed || size == 1)) {
            *program = prog;
            *k = kern;
            *wg = size;
            return CLATTN_STATUS_SUCCESS;
        }
        if (kern) clReleaseKernel(kern);
        clReleaseProgram(prog);
        if (err != CL_SUCCESS)
            return clattn_fail((clattn_status)err, "creating kernel %s failed (%d: %s)", kernel, err,
                               clattn_status_string(err));
        size = clattn_pow2_at_most(allowed); /* the compiled kernel allows less than asked: rebuild smaller */
    }
}

static _Atomic size_t launch_max;
void clattn_note_launch(size_t items)
{
    size_t cur = atomic_load(&launch_max);
    while (items > cur && !atomic_compare_exchange_weak(&launch_max, &cur, items)) {}
}
size_t clattn_test_launch_reach(int reset)
{
    return reset ? atomic_exchange(&launch_max, 0) : atomic_load(&launch_max);
}

clattn_status clattn_enqueue_1d(const clattn_device *dev, cl_kernel k, size_t total, const char *what)
{
    /* in launches of at most max_launch_items work-items, each at its global offset: drivers
     * differ in how large one NDRange may be, and get_global_id includes the offset */
    size_t local = dev->max_work_group < 64 ? dev->max_work_group : 64;
    size_t step = dev->max_launch_items / local * local;
    if (step == 0) step = local;
    for (size_t start = 0; start < total; start += step) {
        size_t n = total - start < step ? total - start : step;
        size_t global = (n + local - 1) / local * local, offset = start;
        clattn_note_launch(global);
        CL_CHECK(clEnqueueNDRangeKernel(dev->queue, k, 1, &offset, &global, &local, 0, NULL, NULL), what);
    }
    return CLATTN_STATUS_SUCCESS;
}

/* ---- kernel arguments */

void clattn_args_begin(clattn_args *a, cl_kernel k, const char *kernel)
{
    a->k = k;
    a->kernel = kernel;
    a->n = 0;
    a->err = CL_SUCCESS;
    a->bad = 0;
}

static void push(clattn_args *a, size_t size, const void *value)
{
    if (a->err == CL_SUCCESS) {
        cl_int e = clSetKernelArg(a->k, a->n, size, value);
        if (e != CL_SUCCESS) {
            a->err = e;
            a->bad = a->n;
        }
    }
    a->n++;
}

void clattn_arg_mem(clattn_args *a, cl_mem m) { push(a, sizeof(cl_mem), m ? &m : NULL); }
void clattn_arg_u32(clattn_args *a, cl_uint v) { push(a, sizeof v, &v); }
void clattn_arg_u64(clattn_args *a, cl_ulong v) { push(a, sizeof v, &v); }
void clattn_arg_f32(clattn_args *a, cl_float v) { push(a, sizeof v, &v); }

clattn_status clattn_args_end(const clattn_args *a)
{
    if (a->err == CL_SUCCESS) return CLATTN_STATUS_SUCCESS;
    return clattn_fail((clattn_status)a->err, "setting argument %u of kernel %s failed (%d: %s)", a->bad, a->kernel,
                       a->err, clattn_status_string(a->err));
}
