/* program.c: build OpenCL programs from the kernels embedded at build time (cl/, listed by the generated
 * clattn_kernels.h), through the compiled-program cache. */
#include "runtime.h"

#include "clattn_kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const clattn_embedded_source *find_source(const char *name)
{
    for (size_t i = 0; i < sizeof clattn_cl_sources / sizeof clattn_cl_sources[0]; i++)
        if (strcmp(clattn_cl_sources[i].name, name) == 0) return &clattn_cl_sources[i];
    return NULL;
}

/* ---- programs shared within a context. The same embedded sources with the same options are built once per
 * (context, device) and handed to every plan that asks for them, each with a reference of its own (clRetainProgram;
 * a plan releases its own). The table holds one more reference per entry: dropped when a device on the context is
 * freed (clattn_program_forget, before the context is released: a context at the same address later never meets a
 * stale entry) or when the table is full (the oldest entry goes). Building takes time on every driver, and some keep
 * memory per program created until the process ends (Mesa 22's rusticl: 1-2 KB each). */
#define SHARED_SLOTS 128
static struct shared_program {
    cl_context ctx;
    cl_device_id dev;
    char *key;          /* the sources' names and the options */
    cl_program prog;
} shared[SHARED_SLOTS];
static size_t shared_next; /* the slot the next new entry takes (round robin: the oldest goes) */
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic long n_shared;

static int shared_key(const char *const *names, int count, const char *options, char *key, size_t len)
{
    size_t used = 0;
    for (int i = 0; i < count; i++) {
        const int n = snprintf(key + used, len - used, "%s+", names[i]);
        if (n < 0 || (size_t)n >= len - used) return 0;
        used += (size_t)n;
    }
    const int n = snprintf(key + used, len - used, "\n%s", options ? options : "");
    return n >= 0 && (size_t)n < len - used;
}

/* The shared program for key on dev, retained for the caller (NULL: none yet). */
static cl_program shared_get(const clattn_device *dev, const char *key)
{
    cl_program p = NULL;
    pthread_mutex_lock(&shared_lock);
    for (size_t i = 0; i < SHARED_SLOTS && !p; i++)
        if (shared[i].prog && shared[i].ctx == dev->context && shared[i].dev == dev->device &&
            strcmp(shared[i].key, key) == 0 && clRetainProgram(shared[i].prog) == CL_SUCCESS)
            p = shared[i].prog;
    pthread_mutex_unlock(&shared_lock);
    if (p) atomic_fetch_add(&n_shared, 1);
    return p;
}

/* Keep p for key on dev (the table's own reference; best effort: no memory, no entry). */
static void shared_put(const clattn_device *dev, const char *key, cl_program p)
{
    char *k = strdup(key);
    if (!k || clRetainProgram(p) != CL_SUCCESS) {
        free(k);
        return;
    }
    pthread_mutex_lock(&shared_lock);
    struct shared_program *e = &shared[shared_next];
    shared_next = (shared_next + 1) % SHARED_SLOTS;
    cl_program old = e->prog;
    char *old_key = e->key;
    *e = (struct shared_program){.ctx = dev->context, .dev = dev->device, .key = k, .prog = p};
    pthread_mutex_unlock(&shared_lock);
    if (old) clReleaseProgram(old);
    free(old_key);
}

void clattn_program_forget(cl_context context)
{
    pthread_mutex_lock(&shared_lock);
    for (size_t i = 0; i < SHARED_SLOTS; i++)
        if (shared[i].prog && shared[i].ctx == context) {
            clReleaseProgram(shared[i].prog);
            free(shared[i].key);
            shared[i] = (struct shared_program){0};
        }
    pthread_mutex_unlock(&shared_lock);
}

long clattn_test_programs_shared(int reset) { return reset ? atomic_exchange(&n_shared, 0) : atomic_load(&n_shared); }

/* Build (or load from the cache, when cached) the program of the embedded sources `names`. quiet: a failure
 * records no error and no build log (the caller only wants to know whether the device takes the source). */
static clattn_status build(const clattn_device *dev, const char *const *names, int count, const char *options,
                           int quiet, int cached, cl_program *program)
{
    const char *texts[8];
    size_t lens[8];
    if (count < 1 || count > 8)
        return quiet ? CLATTN_STATUS_INVALID_ARGUMENT : clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "bad source count");
    for (int i = 0; i < count; i++) {
        const clattn_embedded_source *e = find_source(names[i]);
        if (!e)
            return quiet ? CLATTN_STATUS_INVALID_ARGUMENT
                         : clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "no embedded kernel source '%s'", names[i]);
        texts[i] = (const char *)e->text;
        lens[i] = e->len;
    }
    char skey[1024];
    const int share = cached && shared_key(names, count, options, skey, sizeof skey);
    if (share && (*program = shared_get(dev, skey)) != NULL) return CLATTN_STATUS_SUCCESS;
    char key[2048] = "";
    if (cached) clattn_program_cache_key(dev, names, texts, lens, count, options, key, sizeof key);
    cl_program loaded = key[0] ? clattn_program_cache_load(dev, key, options) : NULL;
    if (loaded) {
        if (share) shared_put(dev, skey, loaded);
        *program = loaded;
        return CLATTN_STATUS_SUCCESS;
    }
    if (!quiet) clattn_notify_build(dev);
    cl_int err;
    cl_program p = clCreateProgramWithSource(dev->context, (cl_uint)count, texts, lens, &err);
    if (err != CL_SUCCESS)
        return quiet ? (clattn_status)err
                     : clattn_fail((clattn_status)err, "clCreateProgramWithSource failed (%d)", err);
    err = clBuildProgram(p, 1, &dev->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        if (quiet) {
            clReleaseProgram(p);
            return (clattn_status)err;
        }
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
    if (key[0]) clattn_program_cache_store(dev, key, p);
    if (share) shared_put(dev, skey, p);
    *program = p;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_program_build(const clattn_device *dev, const char *const *names, int count,
                                   const char *options, cl_program *program)
{
    return build(dev, names, count, options, 0, 1, program);
}

cl_program clattn_program_try_build(const clattn_device *dev, const char *const *names, int count,
                                    const char *options)
{
    cl_program p = NULL;
    return build(dev, names, count, options, 1, 1, &p) == CLATTN_STATUS_SUCCESS ? p : NULL;
}

cl_program clattn_program_try_build_uncached(const clattn_device *dev, const char *const *names, int count,
                                             const char *options)
{
    cl_program p = NULL;
    return build(dev, names, count, options, 1, 0, &p) == CLATTN_STATUS_SUCCESS ? p : NULL;
}

clattn_status clattn_kernel_create(cl_program prog, const char *name, cl_kernel *k)
{
    cl_int err;
    *k = clCreateKernel(prog, name, &err);
    if (err != CL_SUCCESS) {
        *k = NULL;
        return clattn_fail((clattn_status)err, "creating kernel %s failed (%d: %s)", name, err,
                           clattn_status_string(err));
    }
    return CLATTN_STATUS_SUCCESS;
}

void clattn_kernel_release(cl_kernel *k)
{
    if (*k) clReleaseKernel(*k);
    *k = NULL;
}

void clattn_program_release(cl_program *p)
{
    if (*p) clReleaseProgram(*p);
    *p = NULL;
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
    size_t size = *wg > dev->caps.max_work_group ? clattn_pow2_at_most(dev->caps.max_work_group) : *wg;
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

