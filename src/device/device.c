/* device.c: enumerate OpenCL devices, parse device specs, open or wrap a device. Opening reads the device's
 * capabilities (runtime/caps.c) and its tuning file (tune_file.c), once. */
#include "device.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

/* One pass over every platform and device, in the order `clattn devices` prints. */
typedef struct device_entry {
    unsigned p, d;
    cl_platform_id platform;
    cl_device_id device;
    cl_device_type type;
} device_entry;

static size_t enumerate(device_entry *out, size_t cap, cl_int *err_out)
{
    cl_platform_id platforms[MAX_PLATFORMS];
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(MAX_PLATFORMS, platforms, &np);
    *err_out = err;
    if (err != CL_SUCCESS) return 0;
    size_t n = 0;
    for (cl_uint p = 0; p < np && p < MAX_PLATFORMS; p++) {
        cl_device_id devs[MAX_DEVICES];
        cl_uint nd = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, MAX_DEVICES, devs, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint d = 0; d < nd && d < MAX_DEVICES; d++) {
            if (n < cap) {
                out[n].p = p;
                out[n].d = d;
                out[n].platform = platforms[p];
                out[n].device = devs[d];
                cl_device_type t = 0;
                clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof t, &t, NULL);
                out[n].type = t;
            }
            n++;
        }
    }
    return n < cap ? n : cap;
}

static const char *type_name(cl_device_type t)
{
    if (t & CL_DEVICE_TYPE_GPU) return "gpu";
    if (t & CL_DEVICE_TYPE_CPU) return "cpu";
    if (t & CL_DEVICE_TYPE_ACCELERATOR) return "accelerator";
    return "other";
}

clattn_status clattn_device_list(clattn_device_info *infos, size_t capacity, size_t *count)
{
    clattn_clear_error();
    if (!count) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "count is NULL");
    if (!infos && capacity) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "infos is NULL");
    device_entry e[MAX_DEVICES];
    cl_int err;
    size_t n = enumerate(e, MAX_DEVICES, &err);
    *count = n;
    for (size_t i = 0; i < n && i < capacity; i++) {
        clattn_device_info *info = &infos[i];
        memset(info, 0, sizeof *info);
        snprintf(info->selector, sizeof info->selector, "opencl:%u:%u", e[i].p, e[i].d);
        info->platform[0] = '\0';
        clGetPlatformInfo(e[i].platform, CL_PLATFORM_NAME, sizeof info->platform, info->platform, NULL);
        info->platform[sizeof info->platform - 1] = '\0';
        clattn_device_string(e[i].device, CL_DEVICE_NAME, info->name, sizeof info->name);
        snprintf(info->type, sizeof info->type, "%s", type_name(e[i].type));
        cl_uint cu = 0;
        clGetDeviceInfo(e[i].device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
        info->compute_units = cu;
        cl_ulong v = 0;
        clGetDeviceInfo(e[i].device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof v, &v, NULL);
        info->global_mem_bytes = v;
        v = 0;
        clGetDeviceInfo(e[i].device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof v, &v, NULL);
        info->max_alloc_bytes = v;
        clattn_device_string(e[i].device, CL_DEVICE_OPENCL_C_VERSION, info->opencl_c_version,
                   sizeof info->opencl_c_version);
        info->fp16 = clattn_device_has_extension(e[i].device, "cl_khr_fp16");
        info->fp64 = clattn_device_has_extension(e[i].device, "cl_khr_fp64");
    }
    /* No platform at all (CL_PLATFORM_NOT_FOUND_KHR and friends) is an empty list, not an error. */
    return CLATTN_STATUS_SUCCESS;
}

/* ---- device objects */

static clattn_device *device_new(clattn_backend backend)
{
    clattn_device *dev = clattn_calloc(1, sizeof *dev);
    if (dev) dev->backend = backend;
    return dev;
}

static clattn_status open_opencl(cl_device_id id, clattn_device **out)
{
    clattn_device *dev = device_new(CLATTN_BACKEND_OPENCL);
    if (!dev) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the device object");
    cl_int err;
    dev->device = id;
    dev->context = clCreateContext(NULL, 1, &id, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        free(dev);
        return clattn_fail((clattn_status)err, "clCreateContext failed (%d)", err);
    }
    dev->queue = clCreateCommandQueue(dev->context, id, CL_QUEUE_PROFILING_ENABLE, &err);
    dev->queue_profiling = 1;
    if (err != CL_SUCCESS) {
        dev->queue = clCreateCommandQueue(dev->context, id, 0, &err);
        dev->queue_profiling = 0;
    }
    if (err != CL_SUCCESS) {
        clReleaseContext(dev->context);
        free(dev);
        return clattn_fail((clattn_status)err, "clCreateCommandQueue failed (%d)", err);
    }
    clattn_caps_read(dev);
    clattn_tune_load(dev);
    *out = dev;
    return CLATTN_STATUS_SUCCESS;
}

static int parse_uint(const char *s, const char **end, unsigned *v)
{
    if (!isdigit((unsigned char)*s)) return 0;
    unsigned long x = 0;
    while (isdigit((unsigned char)*s)) {
        x = x * 10 + (unsigned long)(*s - '0');
        if (x > 100000) return 0;
        s++;
    }
    *v = (unsigned)x;
    *end = s;
    return 1;
}

static clattn_status open_spec(const char *spec, clattn_device **out)
{
    if (strcmp(spec, "ref") == 0) {
        clattn_device *dev = device_new(CLATTN_BACKEND_REF);
        if (!dev) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the device object");
        snprintf(dev->name, sizeof dev->name, "ref (CPU reference)");
        *out = dev;
        return CLATTN_STATUS_SUCCESS;
    }
    enum { BY_FIRST, BY_INDEX, BY_TYPE, BY_NAME } how;
    unsigned want_p = 0, want_d = 0;
    cl_device_type want_type = 0;
    const char *want_name = NULL;
    if (strcmp(spec, "opencl") == 0) {
        how = BY_FIRST;
    } else if (strncmp(spec, "opencl:", 7) == 0) {
        const char *s = spec + 7, *e;
        if (!parse_uint(s, &e, &want_p) || *e != ':' || !parse_uint(e + 1, &e, &want_d) || *e)
            return clattn_fail(CLATTN_STATUS_INVALID_DEVICE_SPEC,
                               "device spec '%s': expected opencl:P:D with two numbers", spec);
        how = BY_INDEX;
    } else if (strcmp(spec, "gpu") == 0 || strcmp(spec, "cpu") == 0 || strcmp(spec, "accelerator") == 0) {
        how = BY_TYPE;
        want_type = spec[0] == 'g' ? CL_DEVICE_TYPE_GPU
                  : spec[0] == 'c' ? CL_DEVICE_TYPE_CPU : CL_DEVICE_TYPE_ACCELERATOR;
    } else if (strncmp(spec, "name=", 5) == 0 && spec[5]) {
        how = BY_NAME;
        want_name = spec + 5;
    } else {
        return clattn_fail(CLATTN_STATUS_INVALID_DEVICE_SPEC,
                           "device spec '%s' not understood (use ref, opencl, opencl:P:D, gpu, cpu, "
                           "accelerator or name=TEXT)", spec);
    }

    device_entry e[MAX_DEVICES];
    cl_int err;
    size_t n = enumerate(e, MAX_DEVICES, &err);
    if (n == 0)
        return clattn_fail(CLATTN_STATUS_NO_DEVICE, "device spec '%s': no OpenCL device found (%s)", spec,
                           err == CL_SUCCESS ? "the platforms list no device" : clattn_status_string(err));
    long pick = -1;
    for (size_t i = 0; i < n && pick < 0; i++) {
        switch (how) {
        case BY_FIRST: if (e[i].type & CL_DEVICE_TYPE_GPU) pick = (long)i; break;
        case BY_INDEX: if (e[i].p == want_p && e[i].d == want_d) pick = (long)i; break;
        case BY_TYPE: if (e[i].type & want_type) pick = (long)i; break;
        case BY_NAME: {
            char name[256];
            clattn_device_string(e[i].device, CL_DEVICE_NAME, name, sizeof name);
            if (clattn_contains_ci(name, want_name)) pick = (long)i;
            break;
        }
        }
    }
    if (pick < 0 && how == BY_FIRST) pick = 0;
    if (pick < 0)
        return clattn_fail(CLATTN_STATUS_NO_DEVICE, "device spec '%s' matches none of the %zu OpenCL devices "
                           "(see `clattn devices`)", spec, n);
    return open_opencl(e[pick].device, out);
}

clattn_status clattn_device_open(const char *spec, clattn_device **device)
{
    clattn_clear_error();
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    *device = NULL;
    if (spec && *spec) return open_spec(spec, device);
    const char *env = getenv("CLATTN_DEVICE");
    if (env && *env) return open_spec(env, device);
    clattn_status s = open_spec("opencl", device);
    if (s == CLATTN_STATUS_SUCCESS) return s;
    char why[256];
    snprintf(why, sizeof why, "%s", clattn_last_error());
    s = open_spec("ref", device);
    if (s != CLATTN_STATUS_SUCCESS) return s;
    snprintf((*device)->notice, sizeof (*device)->notice, "no usable OpenCL device (%s); using the CPU reference", why);
    clattn_clear_error();
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_device_from_queue(cl_command_queue queue, clattn_device **device)
{
    clattn_clear_error();
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    *device = NULL;
    if (!queue) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "queue is NULL");
    cl_context ctx = NULL;
    cl_device_id id = NULL;
    cl_command_queue_properties props = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, NULL);
    if (err == CL_SUCCESS) err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof id, &id, NULL);
    if (err == CL_SUCCESS) err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    if (err != CL_SUCCESS) return clattn_fail((clattn_status)err, "querying the caller's queue failed (%d)", err);
    /* every execution is a chain of kernels and GEMMs that relies on in-order execution */
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT,
                           "queue is out-of-order (CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE): clattn needs an in-order "
                           "queue");
    clattn_device *dev = device_new(CLATTN_BACKEND_OPENCL);
    if (!dev) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the device object");
    clRetainContext(ctx);
    clRetainCommandQueue(queue);
    dev->device = id;
    dev->context = ctx;
    dev->queue = queue;
    dev->queue_profiling = (props & CL_QUEUE_PROFILING_ENABLE) != 0;
    clattn_caps_read(dev);
    clattn_tune_load(dev);
    *device = dev;
    return CLATTN_STATUS_SUCCESS;
}

void clattn_device_free(clattn_device *device)
{
    if (!device) return;
    free(device->tune);
    clattn_emit_free(device->emit);
    if (device->context) clattn_program_forget(device->context);
    if (device->queue) clReleaseCommandQueue(device->queue);
    if (device->context) clReleaseContext(device->context);
    free(device);
}

clattn_backend clattn_device_backend(const clattn_device *device)
{
    return device ? device->backend : CLATTN_BACKEND_REF;
}

const char *clattn_device_name(const clattn_device *device)
{
    return device ? device->name : "";
}

const char *clattn_device_notice(const clattn_device *device)
{
    return device && device->notice[0] ? device->notice : NULL;
}

const char *clattn_device_facts(const clattn_device *device)
{
    if (!device || device->backend != CLATTN_BACKEND_OPENCL) return "";
    static _Thread_local char text[2048];
    const clattn_caps *c = &device->caps;
    char sg[64] = "";
    for (int i = 0; c->subgroup_sizes[i] && i < CLATTN_MAX_SUBGROUP_SIZES; i++)
        snprintf(sg + strlen(sg), sizeof sg - strlen(sg), "%s%u", i ? "," : "", c->subgroup_sizes[i]);
    char loop[96];
    if (c->loop_limit) snprintf(loop, sizeof loop, "%zu iterations per work-item, all loops together", c->loop_limit);
    else snprintf(loop, sizeof loop, "none below %zu", (size_t)CLATTN_PROBE_LOOP_TRIPS);
    snprintf(text, sizeof text,
             "class: %s\nvendor: %s\ndriver: %s\nopencl c: %s\ncompute units: %u\nlocal memory: %zu bytes\n"
             "max work-group: %zu\nnative float vector: %u\nfp16: %s\nfp64: %s\nsubgroups: %s%s%s%s\n"
             "tensor cores (mma tf32): %s\nloop limit: %s\nnan and inf arithmetic: %s\nprofiling timestamps: %s\n"
             "probe notes: %s\nself-test failures: %s\n",
             clattn_device_class_name(c->dclass), c->vendor, c->driver, c->cl_c_version, c->compute_units, c->local_mem,
             c->max_work_group, c->native_vec_float, c->fp16 ? "yes" : "no", c->fp64 ? "yes" : "no",
             c->subgroups ? "yes" : "no", sg[0] ? " (sizes " : "", sg, sg[0] ? ")" : "", c->nv_mma_tf32 ? "yes" : "no",
             loop, c->ieee_nan ? "IEEE" : "not IEEE", c->profiling_ok ? "real" : "not real (profiling unsupported)",
             c->probe_note[0] ? c->probe_note : "none", c->selftest_failed[0] ? c->selftest_failed + 1 : "none");
    return text;
}

cl_context clattn_device_context(const clattn_device *device) { return device ? device->context : NULL; }
cl_command_queue clattn_device_queue(const clattn_device *device) { return device ? device->queue : NULL; }

clattn_status clattn_device_emit(clattn_device *device, const char *dir, const char *target)
{
    clattn_clear_error();
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    if (device->backend != CLATTN_BACKEND_OPENCL)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "clattn_device_emit: the ref device builds no OpenCL programs");
    const int host = !target || strcmp(target, "host") == 0;
    clattn_caps caps = device->caps;
    if (!host && !clattn_device_simulated(device)) TRY(clattn_caps_simulate(&caps, target));
    else if (!host && strcmp(target, "sm_90") != 0) TRY(clattn_caps_simulate(&caps, target)); /* names the targets */
    if (dir) {
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "clattn_device_emit: '%.300s' is not a directory", dir);
    }
    TRY(clattn_emit_start(device, dir, !host));
    if (!host) device->caps = caps;
    return CLATTN_STATUS_SUCCESS;
}
