/* caps.c: a device's capabilities, read once when it opens (clattn_caps, runtime.h). The cores choose and
 * shape their kernels from these alone; nothing else asks the driver about the device again. */
#include "runtime.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* vendor extensions' queries (cl_ext.h of newer headers; the values are the registry's) */
#define CLATTN_DEVICE_SUB_GROUP_SIZES_INTEL 0x4108 /* cl_intel_required_subgroup_size: size_t[] */
#define CLATTN_DEVICE_WARP_SIZE_NV 0x4003          /* cl_nv_device_attribute_query: cl_uint */
#define CLATTN_CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000 /* the same: cl_uint */
#define CLATTN_CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV 0x4001
#define CLATTN_DEVICE_WAVEFRONT_WIDTH_AMD 0x4043   /* cl_amd_device_attribute_query: cl_uint */

void clattn_device_string(cl_device_id dev, cl_device_info what, char *buf, size_t len)
{
    buf[0] = '\0';
    if (clGetDeviceInfo(dev, what, len, buf, NULL) != CL_SUCCESS) buf[0] = '\0';
    buf[len - 1] = '\0';
}

/* Does the space-separated list name ext? */
static int in_list(const char *list, const char *ext)
{
    const size_t el = strlen(ext);
    for (const char *q = strstr(list, ext); q; q = strstr(q + 1, ext))
        if ((q == list || q[-1] == ' ') && (q[el] == '\0' || q[el] == ' ')) return 1;
    return 0;
}

int clattn_contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    if (n == 0) return 1;
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return 1;
    }
    return 0;
}

/* CL_DEVICE_EXTENSIONS (malloc'ed; NULL when unknown) */
static char *extensions(cl_device_id d)
{
    size_t size = 0;
    char *ext = NULL;
    if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, 0, NULL, &size) != CL_SUCCESS || !(ext = malloc(size + 1)))
        return NULL;
    if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, size, ext, NULL) != CL_SUCCESS) size = 0;
    ext[size] = '\0';
    return ext;
}

int clattn_device_has_extension(cl_device_id d, const char *name)
{
    char *ext = extensions(d);
    const int found = ext && in_list(ext, name);
    free(ext);
    return found;
}

const char *clattn_device_class_name(clattn_device_class c)
{
    static const char *names[CLATTN_CLASS_COUNT] = {"cpu", "nvidia", "amd", "intel", "other"};
    return (unsigned)c < CLATTN_CLASS_COUNT ? names[c] : "unknown";
}

static cl_ulong info_ulong(cl_device_id d, cl_device_info what)
{
    cl_ulong v = 0;
    return clGetDeviceInfo(d, what, sizeof v, &v, NULL) == CL_SUCCESS ? v : 0;
}

static cl_uint info_uint(cl_device_id d, cl_device_info what)
{
    cl_uint v = 0;
    return clGetDeviceInfo(d, what, sizeof v, &v, NULL) == CL_SUCCESS ? v : 0;
}

/* The SIMD widths the driver names (Intel's sub-group sizes, NVIDIA's warp, AMD's wavefront). */
static void subgroup_sizes(cl_device_id d, const char *ext, clattn_caps *c)
{
    size_t n = 0;
    if (in_list(ext, "cl_intel_required_subgroup_size")) {
        size_t sizes[CLATTN_MAX_SUBGROUP_SIZES] = {0}, bytes = 0;
        if (clGetDeviceInfo(d, CLATTN_DEVICE_SUB_GROUP_SIZES_INTEL, sizeof sizes, sizes, &bytes) == CL_SUCCESS)
            for (size_t i = 0; i < bytes / sizeof sizes[0] && n + 1 < CLATTN_MAX_SUBGROUP_SIZES; i++)
                if (sizes[i]) c->subgroup_sizes[n++] = (unsigned)sizes[i];
    }
    if (n == 0 && in_list(ext, "cl_nv_device_attribute_query")) {
        const cl_uint w = info_uint(d, CLATTN_DEVICE_WARP_SIZE_NV);
        if (w) c->subgroup_sizes[n++] = w;
    }
    if (n == 0 && in_list(ext, "cl_amd_device_attribute_query")) {
        const cl_uint w = info_uint(d, CLATTN_DEVICE_WAVEFRONT_WIDTH_AMD);
        if (w) c->subgroup_sizes[n++] = w;
    }
    c->subgroup_sizes[n] = 0;
}

void clattn_caps_read(clattn_device *dev)
{
    clattn_caps *c = &dev->caps;
    cl_device_id d = dev->device;
    memset(c, 0, sizeof *c);
    c->max_alloc = (size_t)info_ulong(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    c->global_mem = (size_t)info_ulong(d, CL_DEVICE_GLOBAL_MEM_SIZE);
    c->local_mem = (size_t)info_ulong(d, CL_DEVICE_LOCAL_MEM_SIZE);
    size_t wg = 1;
    if (clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) != CL_SUCCESS) wg = 1;
    c->max_work_group = wg ? wg : 1;
    const cl_uint cu = info_uint(d, CL_DEVICE_MAX_COMPUTE_UNITS);
    c->compute_units = cu ? cu : 1;
    const cl_uint align = info_uint(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN);
    c->base_align = align >= 32 ? align / 8 : 4096; /* bits; unknown: a page, surely a multiple */
    cl_device_type t = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof t, &t, NULL) != CL_SUCCESS) t = 0;
    c->type = t;
    c->vec_float = info_uint(d, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT);
    c->vec_half = info_uint(d, CL_DEVICE_PREFERRED_VECTOR_WIDTH_HALF);
    c->native_vec_float = info_uint(d, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT);
    clattn_device_string(d, CL_DEVICE_OPENCL_C_VERSION, c->cl_c_version, sizeof c->cl_c_version);

    int nv_query = 0;
    char *ext = extensions(d);
    if (ext) {
        c->fp16 = in_list(ext, "cl_khr_fp16");
        c->fp64 = in_list(ext, "cl_khr_fp64");
        c->subgroups = in_list(ext, "cl_khr_subgroups") || in_list(ext, "cl_intel_subgroups");
        nv_query = in_list(ext, "cl_nv_device_attribute_query");
        subgroup_sizes(d, ext, c);
        free(ext);
    }

    char name[200], plat[96];
    clattn_device_string(d, CL_DEVICE_NAME, name, sizeof name);
    clattn_device_string(d, CL_DEVICE_VENDOR, c->vendor, sizeof c->vendor);
    clattn_device_string(d, CL_DRIVER_VERSION, c->driver, sizeof c->driver);
    cl_platform_id p = NULL;
    plat[0] = '\0';
    if (clGetDeviceInfo(d, CL_DEVICE_PLATFORM, sizeof p, &p, NULL) == CL_SUCCESS)
        clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof plat, plat, NULL);
    plat[sizeof plat - 1] = '\0';
    snprintf(dev->name, sizeof dev->name, "%s [%s]", name, plat);
    if (t & CL_DEVICE_TYPE_CPU) c->dclass = CLATTN_CLASS_CPU;
    else if (clattn_contains_ci(c->vendor, "nvidia")) c->dclass = CLATTN_CLASS_NVIDIA;
    else if (clattn_contains_ci(c->vendor, "advanced micro") || clattn_contains_ci(c->vendor, "amd")) c->dclass = CLATTN_CLASS_AMD;
    else if (clattn_contains_ci(c->vendor, "intel")) c->dclass = CLATTN_CLASS_INTEL;
    else c->dclass = CLATTN_CLASS_OTHER;
    c->blas_max_elems = CLATTN_BLAS_MAX_ELEMS;
    c->sibling_subbuffers = c->dclass != CLATTN_CLASS_NVIDIA;
    c->max_launch_items = CLATTN_MAX_LAUNCH_ITEMS;

    /* inline PTX: only NVIDIA's compiler can take it, so only NVIDIA devices are asked */
    if (c->dclass == CLATTN_CLASS_NVIDIA) c->nv_inline_ptx = clattn_test_probe_ptx(dev);
    /* compute capability (cl_nv_device_attribute_query) and the tensor-core instructions flash_mma issues */
    if (c->dclass == CLATTN_CLASS_NVIDIA && nv_query) {
        const cl_uint major = info_uint(d, CLATTN_CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV);
        const cl_uint minor = info_uint(d, CLATTN_CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV);
        c->nv_cc = major * 10 + (minor < 10 ? minor : 9);
    }
    if (c->nv_inline_ptx && c->nv_cc >= 80) c->nv_mma_tf32 = clattn_test_probe_mma(dev);
    clattn_probes_run(dev);
    clattn_verdicts_load(dev);
}

/* Does a probe kernel (cl/runtime/<name>.cl) build here? Built quietly (kept by the compiled-program cache
 * like any other), never launched. */
static int probe_builds(const clattn_device *dev, const char *name)
{
    const char *src[] = {name};
    cl_program prog = clattn_program_try_build(dev, src, 1, "-cl-std=CL1.2");
    const int ok = prog != NULL;
    clattn_program_release(&prog);
    return ok;
}

/* A tiny kernel with inline PTX. */
int clattn_test_probe_ptx(const clattn_device *dev) { return probe_builds(dev, "runtime/probe_ptx"); }

/* mma.sync m16n8k8 TF32, cvt.rna.tf32.f32 and shfl.sync: flash_mma's instructions. */
int clattn_test_probe_mma(const clattn_device *dev) { return probe_builds(dev, "runtime/probe_mma"); }

/* ---- simulated targets (clattn_device_emit): the capabilities a device of the target reports, so that plans made
 * on the host take the target's cores, defaults and build options. The host's strings stay in vendor and driver
 * with the target named, and the probes' facts are a well-behaved driver's. */
static const struct target {
    const char *name;
    clattn_device_class dclass;
    unsigned compute_units, nv_cc, warp;
    size_t local_mem, max_alloc, global_mem, max_work_group;
} targets[] = {
    /* an H100 SXM through NVIDIA's OpenCL (../shared/gpu.md, measured 2026-11-23): OpenCL C 1.2, 132 compute units,
     * 48 KiB local memory, 19.8 GiB max one allocation, 79 GiB global, warps of 32, inline PTX and mma.sync built,
     * no cl_khr_fp16, no sub-group extension */
    {"sm_90", CLATTN_CLASS_NVIDIA, 132, 90, 32, 48u << 10, (size_t)19800 << 20, (size_t)79 << 30, 1024},
};

clattn_status clattn_caps_simulate(clattn_caps *caps, const char *target)
{
    const struct target *t = NULL;
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        if (target && strcmp(target, targets[i].name) == 0) t = &targets[i];
    if (!t)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "target '%.40s': the simulated targets are sm_90 (an "
                           "H100's capabilities), or host (the device as it is)", target ? target : "(null)");
    clattn_caps c = *caps;
    char was[sizeof c.vendor];
    snprintf(was, sizeof was, "%s", caps->vendor);
    snprintf(c.vendor, sizeof c.vendor, "NVIDIA (simulated %s on %.60s)", t->name, was);
    snprintf(c.driver, sizeof c.driver, "simulated %s on %.100s", t->name, caps->driver);
    snprintf(c.cl_c_version, sizeof c.cl_c_version, "OpenCL C 1.2");
    c.type = CL_DEVICE_TYPE_GPU;
    c.dclass = t->dclass;
    c.compute_units = t->compute_units;
    c.local_mem = t->local_mem;
    c.max_alloc = t->max_alloc;
    c.global_mem = t->global_mem;
    c.max_work_group = t->max_work_group;
    c.base_align = 512;
    c.sibling_subbuffers = 0;
    c.fp16 = 0, c.fp64 = 1, c.subgroups = 0;
    memset(c.subgroup_sizes, 0, sizeof c.subgroup_sizes);
    c.subgroup_sizes[0] = t->warp;
    c.vec_float = 1, c.vec_half = 0, c.native_vec_float = 1;
    c.nv_inline_ptx = 1, c.nv_cc = t->nv_cc, c.nv_mma_tf32 = t->nv_cc >= 80;
    c.loop_limit = 0, c.ieee_nan = 1, c.profiling_ok = 1, c.local_report = 4096;
    c.probe_note[0] = '\0', c.selftest_failed[0] = '\0';
    *caps = c;
    return CLATTN_STATUS_SUCCESS;
}
