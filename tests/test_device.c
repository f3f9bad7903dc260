/* test_device.c: device listing and specs, caller-owned queues, execution on
 * cl_mem buffers with offsets, wait lists and events, profiling. */
#include "oracle.h"
#include "runtime/runtime.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(device, list)
{
    size_t n = 0;
    cr_assert_eq(clattn_device_list(NULL, 0, &n), CLATTN_STATUS_SUCCESS);
    cr_assert(n >= 1, "no OpenCL device (PoCL expected)");
    clattn_device_info *infos = calloc(n, sizeof *infos);
    size_t n2 = 0;
    cr_assert_eq(clattn_device_list(infos, n, &n2), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(n, n2);
    cr_assert_str_eq(infos[0].selector, "opencl:0:0");
    cr_assert(infos[0].name[0] && infos[0].platform[0] && infos[0].compute_units >= 1);
    cr_assert(infos[0].max_alloc_bytes > 0 && infos[0].global_mem_bytes >= infos[0].max_alloc_bytes);
    cr_assert(strstr(infos[0].opencl_c_version, "OpenCL C"));
    cr_assert_eq(clattn_device_list(NULL, 0, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_device_list(NULL, 3, &n2), CLATTN_STATUS_INVALID_ARGUMENT);
    free(infos);
}

static void expect_open(const char *spec, clattn_status want, clattn_backend backend)
{
    clattn_device *dev = (clattn_device *)(uintptr_t)1;
    clattn_status st = clattn_device_open(spec, &dev);
    cr_assert_eq(st, want, "spec '%s': %s (%s)", spec ? spec : "(null)", clattn_status_string(st),
                 clattn_last_error());
    if (want == CLATTN_STATUS_SUCCESS) {
        cr_assert_eq(clattn_device_backend(dev), backend, "spec '%s'", spec);
        cr_assert(clattn_device_name(dev)[0]);
        cr_assert_eq(clattn_device_context(dev) != NULL, backend == CLATTN_BACKEND_OPENCL);
    } else {
        cr_assert_null(dev, "a failed open must leave *device NULL");
        cr_assert(strlen(clattn_last_error()) > 0);
    }
    clattn_device_free(st == CLATTN_STATUS_SUCCESS ? dev : NULL);
}

Test(device, specs)
{
    clattn_device_info info;
    size_t n = 0;
    cr_assert_eq(clattn_device_list(&info, 1, &n), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_gt(n, 0, "no OpenCL device to open by spec (install pocl-opencl-icd)");
    char by_name[160];
    snprintf(by_name, sizeof by_name, "name=%.*s", 6, info.name); /* a prefix of the first device's name */
    for (char *p = by_name + 5; *p; p++) *p = (char)(p[0] >= 'a' && p[0] <= 'z' ? p[0] - 32 : p[0]); /* any case */
    expect_open("ref", CLATTN_STATUS_SUCCESS, CLATTN_BACKEND_REF);
    expect_open("opencl", CLATTN_STATUS_SUCCESS, CLATTN_BACKEND_OPENCL);
    expect_open("opencl:0:0", CLATTN_STATUS_SUCCESS, CLATTN_BACKEND_OPENCL);
    expect_open(info.type, CLATTN_STATUS_SUCCESS, CLATTN_BACKEND_OPENCL); /* "cpu" on PoCL */
    expect_open(by_name, CLATTN_STATUS_SUCCESS, CLATTN_BACKEND_OPENCL);
    expect_open("opencl:99:0", CLATTN_STATUS_NO_DEVICE, 0);
    expect_open("opencl:0:99", CLATTN_STATUS_NO_DEVICE, 0);
    expect_open("name=NoSuchDeviceAnywhere", CLATTN_STATUS_NO_DEVICE, 0);
    expect_open("bogus", CLATTN_STATUS_INVALID_DEVICE_SPEC, 0);
    expect_open("opencl:", CLATTN_STATUS_INVALID_DEVICE_SPEC, 0);
    expect_open("opencl:1", CLATTN_STATUS_INVALID_DEVICE_SPEC, 0);
    expect_open("opencl:a:b", CLATTN_STATUS_INVALID_DEVICE_SPEC, 0);
    expect_open("opencl:0:0:0", CLATTN_STATUS_INVALID_DEVICE_SPEC, 0);
    expect_open("name=", CLATTN_STATUS_INVALID_DEVICE_SPEC, 0);
    expect_open("REF", CLATTN_STATUS_INVALID_DEVICE_SPEC, 0);
    cr_assert_eq(clattn_device_open("ref", NULL), CLATTN_STATUS_INVALID_ARGUMENT);
}

Test(device, default_from_environment)
{
    setenv("CLATTN_DEVICE", "ref", 1);
    expect_open(NULL, CLATTN_STATUS_SUCCESS, CLATTN_BACKEND_REF);
    expect_open("", CLATTN_STATUS_SUCCESS, CLATTN_BACKEND_REF);
    setenv("CLATTN_DEVICE", "name=NoSuchDeviceAnywhere", 1); /* an error, never a silent fallback */
    expect_open(NULL, CLATTN_STATUS_NO_DEVICE, 0);
    unsetenv("CLATTN_DEVICE");
    expect_open(NULL, CLATTN_STATUS_SUCCESS, CLATTN_BACKEND_OPENCL);
    clattn_device *dev = NULL;
    cr_assert_eq(clattn_device_open(NULL, &dev), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_not_null(dev);
    cr_assert_null(clattn_device_notice(dev), "no fallback happened, so no notice");
    clattn_device_free(dev);
}

/* An out-of-order queue is refused: every execution relies on in-order execution. */
Test(device, out_of_order_queue_refused)
{
    clattn_device *own = tu_open_opencl();
    cl_device_id id;
    cr_assert_eq(clGetCommandQueueInfo(clattn_device_queue(own), CL_QUEUE_DEVICE, sizeof id, &id, NULL), CL_SUCCESS);
    cl_command_queue_properties supported = 0;
    cr_assert_eq(clGetDeviceInfo(id, CL_DEVICE_QUEUE_PROPERTIES, sizeof supported, &supported, NULL), CL_SUCCESS);
    if (!(supported & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
        clattn_device_free(own);
        cr_skip_test("the device has no out-of-order queues");
    }
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(clattn_device_context(own), id, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE,
                                              &err);
    cr_assert_eq(err, CL_SUCCESS);
    clattn_device *dev = (clattn_device *)&err; /* must come back NULL */
    cr_expect_eq(clattn_device_from_queue(q, &dev), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_expect_null(dev);
    cr_expect(strstr(clattn_last_error(), "in-order") != NULL, "%s", clattn_last_error());
    cl_uint refs = 0;
    cr_assert_eq(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL), CL_SUCCESS);
    cr_expect_eq(refs, 1, "a refused queue is not retained");
    clReleaseCommandQueue(q);
    clattn_device_free(own);
}

/* A caller-owned context and queue (no profiling), buffers with offsets, a wait list and an event. */
Test(device, caller_owned_queue_and_buffers)
{
    clattn_device *own = tu_open_opencl();
    cl_int err;
    cl_context ctx = clattn_device_context(own);
    cl_device_id id;
    cr_assert_eq(clGetCommandQueueInfo(clattn_device_queue(own), CL_QUEUE_DEVICE, sizeof id, &id, NULL), CL_SUCCESS);
    cl_command_queue q = clCreateCommandQueue(ctx, id, 0, &err);
    cr_assert_eq(err, CL_SUCCESS);
    clattn_device *dev = NULL;
    cr_assert_eq(clattn_device_from_queue(q, &dev), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clReleaseCommandQueue(q); /* clattn keeps its own reference */
    clattn_device *other = NULL;
    cr_assert_eq(clattn_device_from_queue(NULL, &other), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_null(other);

    const size_t B = 2, T = 7, E = 12, H = 3, NX = B * T * E, NO = B * T * E, NA = B * H * T * T;
    const size_t xo = 5, oo = 3, ao = 11; /* element offsets */
    tu_rng r = {77};
    float *wq = tu_random(&r, E * E, -0.3f, 0.3f), *wk = tu_random(&r, E * E, -0.3f, 0.3f);
    float *wv = tu_random(&r, E * E, -0.3f, 0.3f), *wo = tu_random(&r, E * E, -0.3f, 0.3f);
    float *bo = tu_random(&r, E, -0.3f, 0.3f), *x = tu_random(&r, NX, -1, 1);
    clattn_attention_desc d = {.batch = B, .seq_q = T, .embed = E, .heads = H, .head_dim_qk = E / H, .out_dim = E,
                               .causal = 1, .need_weights = 1};
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .w_out = wo, .b_out = bo};
    clattn_plan *plan = NULL, *ref_plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, &w, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_plan_set_profiling(plan, 1), CLATTN_STATUS_UNSUPPORTED, "queue has no profiling");
    clattn_device *ref = tu_open_ref();
    cr_assert_eq(tu_plan_create(ref, &d, &w, &ref_plan), CLATTN_STATUS_SUCCESS);
    float *want_out = tu_poisoned(NO), *want_attn = tu_poisoned(NA);
    clattn_attention_args a = {.x = x, .out = want_out, .attn = want_attn};
    cr_assert_eq(tu_plan_execute(ref_plan, &a), CLATTN_STATUS_SUCCESS);
    {
        /* the expectation itself against the independent float64 oracle */
        double *o64 = malloc(NO * sizeof *o64), *a64 = malloc(NA * sizeof *a64);
        cr_assert(o64 && a64);
        cr_assert_eq(oracle_attention(&d, &w, &a, o64, a64), 0);
        char m64[256];
        cr_assert_eq(oracle_compare(want_out, o64, NO, TU_ATOL, TU_RTOL, m64, sizeof m64), 0, "ref out: %s", m64);
        cr_assert_eq(oracle_compare(want_attn, a64, NA, TU_ATOL, TU_RTOL, m64, sizeof m64), 0, "ref attn: %s", m64);
        free(o64);
        free(a64);
    }

    float *host_x = tu_poisoned(NX + xo + 4), *host_out = tu_poisoned(NO + oo + 4), *host_attn = tu_poisoned(NA + ao);
    memcpy(host_x + xo, x, NX * sizeof(float));
    cl_mem mx = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (NX + xo + 4) * 4, host_x, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_mem mo = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (NO + oo + 4) * 4, host_out, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_mem ma = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, (NA + ao) * 4, host_attn, &err);
    cr_assert_eq(err, CL_SUCCESS);
    clattn_attention_buffers bufs = {.x = {mx, xo}, .out = {mo, oo}, .attn = {ma, ao}};

    /* too small: one element past the end */
    clattn_attention_buffers small = bufs;
    small.x.offset = xo + 5;
    cr_assert_eq(clattn_plan_execute_buffers(plan, &small, 0, NULL, NULL), CLATTN_STATUS_SHAPE_MISMATCH);
    cr_assert(strstr(clattn_last_error(), "x"));
    small = bufs;
    small.out.mem = NULL;
    cr_assert_eq(clattn_plan_execute_buffers(plan, &small, 0, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cl_event dummy = NULL;
    cr_assert_eq(clattn_plan_execute_buffers(plan, &bufs, 1, NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_plan_execute_buffers(plan, &bufs, 0, &dummy, NULL), CLATTN_STATUS_INVALID_ARGUMENT);

    /* wait for a user event that completes only after the enqueue */
    cl_event gate = clCreateUserEvent(ctx, &err), done = NULL;
    cr_assert_eq(err, CL_SUCCESS);
    cr_assert_eq(clattn_plan_execute_buffers(plan, &bufs, 1, &gate, &done), CLATTN_STATUS_SUCCESS, "%s",
                 clattn_last_error());
    cr_assert_not_null(done);
    cr_assert_eq(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    cr_assert_eq(clWaitForEvents(1, &done), CL_SUCCESS);
    cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(dev), mo, CL_TRUE, 0, (NO + oo + 4) * 4, host_out, 0, NULL,
                                     NULL), CL_SUCCESS);
    cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(dev), ma, CL_TRUE, 0, (NA + ao) * 4, host_attn, 0, NULL,
                                     NULL), CL_SUCCESS);
    char msg[256];
    size_t bad = tu_compare(host_out + oo, want_out, NO, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "out: %s", msg);
    bad = tu_compare(host_attn + ao, want_attn, NA, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "attn: %s", msg);
    for (size_t i = 0; i < oo; i++) cr_assert(isnan(host_out[i]), "out before the offset was written");
    for (size_t i = 0; i < 4; i++) cr_assert(isnan(host_out[oo + NO + i]), "out past the end was written");
    for (size_t i = 0; i < ao; i++) cr_assert(isnan(host_attn[i]), "attn before the offset was written");

    clReleaseEvent(gate);
    clReleaseEvent(done);
    clReleaseMemObject(mx); clReleaseMemObject(mo); clReleaseMemObject(ma);
    clattn_plan_free(plan);
    clattn_plan_free(ref_plan);
    clattn_device_free(dev);
    clattn_device_free(ref);
    clattn_device_free(own);
    free(wq); free(wk); free(wv); free(wo); free(bo); free(x);
    free(want_out); free(want_attn); free(host_x); free(host_out); free(host_attn);
}

Test(device, profiling_stage_times)
{
    clattn_device *dev = tu_open_opencl();
    tu_rng r = {9};
    const size_t E = 16;
    float *w = tu_random(&r, E * E, -0.3f, 0.3f), *x = tu_random(&r, 2 * 33 * E, -1, 1), out[2 * 33 * 16];
    for (size_t i = 0; i < 2 * 33 * 16; i++) out[i] = NAN;
    clattn_attention_desc d = {.batch = 2, .seq_q = 33, .embed = E, .heads = 4, .head_dim_qk = 4, .out_dim = E};
    clattn_attention_weights wt = {.w_query = w, .w_key = w, .w_value = w, .w_out = w};
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &d, &wt, &plan), CLATTN_STATUS_SUCCESS);
    const clattn_status prof = clattn_plan_set_profiling(plan, 1);
    if (tu_profiling_refused(dev, prof, "stage times")) cr_skip_test("timestamps not real here (printed above)");
    cr_assert_eq(prof, CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_attention_args a = {.x = x, .out = out};
    cr_assert_eq(tu_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS);
    double ms[CLATTN_STAGE_COUNT];
    cr_assert_eq(clattn_plan_stage_times(plan, ms), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    {
        /* profiling changes nothing in the result */
        double o64[2 * 33 * 16];
        cr_assert_eq(oracle_attention(&d, &wt, &a, o64, NULL), 0);
        char m64[256];
        cr_assert_eq(oracle_compare(out, o64, 2 * 33 * 16, TU_ATOL, TU_RTOL, m64, sizeof m64), 0, "out: %s", m64);
    }
    double total = 0;
    for (int s = 0; s < CLATTN_STAGE_COUNT; s++) {
        cr_assert(ms[s] >= 0.0, "%s: %g", clattn_stage_name((clattn_stage)s), ms[s]);
        total += ms[s];
    }
    cr_assert(total > 0.0, "profiling recorded nothing");
    /* every stage this library knows: the first 7 as above, then the fused core's (ATTENTION); nothing past n */
    const size_t ns = clattn_stage_count();
    cr_assert_geq(ns, (size_t)CLATTN_STAGE_COUNT + 1);
    double all[16];
    for (int i = 0; i < 16; i++) all[i] = NAN;
    cr_assert_eq(clattn_plan_stage_times_n(plan, all, ns), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    for (size_t s = 0; s < ns; s++) cr_assert(all[s] >= 0.0, "stage %zu: %g", s, all[s]);
    for (int s = 0; s < CLATTN_STAGE_COUNT; s++) cr_assert_eq(all[s], ms[s], "stage %d differs between the calls", s);
    for (size_t s = ns; s < 16; s++) cr_assert(isnan(all[s]), "written past n: all[%zu] = %g", s, all[s]);
    if (clattn_plan_algorithm(plan) == CLATTN_ALGORITHM_FUSED)
        cr_assert_gt(all[CLATTN_STAGE_ATTENTION], 0.0, "a fused plan reports no time for its core");
    for (int i = 0; i < 16; i++) all[i] = NAN;
    cr_assert_eq(clattn_plan_stage_times_n(plan, all, 2), CLATTN_STATUS_SUCCESS);
    cr_assert(!isnan(all[1]) && isnan(all[2]), "n = 2 wrote %g and %g", all[1], all[2]);
    cr_assert_eq(clattn_plan_stage_times_n(plan, NULL, 2), CLATTN_STATUS_INVALID_ARGUMENT);
    /* the plan's own device memory: at least its four E x E weights; none on ref */
    cr_assert_geq(clattn_plan_device_bytes(plan), 4 * E * E * sizeof(float), "%zu bytes",
                  clattn_plan_device_bytes(plan));
    cr_assert_eq(clattn_plan_device_bytes(NULL), 0);
    {
        clattn_device *ref = tu_open_ref();
        clattn_plan *rp = NULL;
        cr_assert_eq(tu_plan_create(ref, &d, &wt, &rp), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(clattn_plan_device_bytes(rp), 0);
        clattn_plan_free(rp);
        clattn_device_free(ref);
    }
    cr_assert_str_eq(clattn_stage_name(CLATTN_STAGE_SOFTMAX), "softmax");
    cr_assert_str_eq(clattn_stage_name((clattn_stage)99), "unknown");
    clattn_plan_free(plan);
    clattn_device_free(dev);
    free(w); free(x);
}

/* The capabilities read once at open (runtime/caps.c): what the cores choose from. On this device the
 * inline-PTX probe builds only where the compiler is NVIDIA's, and a failed probe leaves no error and no
 * build log behind. */
Test(device, capabilities)
{
    clattn_device *dev = tu_open_opencl();
    const clattn_caps *c = &dev->caps;
    cr_assert(c->vendor[0] && c->driver[0] && c->cl_c_version[0], "vendor '%s', driver '%s', OpenCL C '%s'",
              c->vendor, c->driver, c->cl_c_version);
    cr_assert(c->compute_units >= 1 && c->max_work_group >= 1 && c->local_mem > 0 && c->max_alloc > 0 &&
              c->global_mem >= c->max_alloc);
    cr_assert(c->vec_float >= 1 && c->native_vec_float >= 1, "vector widths %u %u", c->vec_float, c->native_vec_float);
    cr_assert(c->dclass < CLATTN_CLASS_COUNT);
    cr_assert_eq(c->dclass == CLATTN_CLASS_CPU, (c->type & CL_DEVICE_TYPE_CPU) != 0);
    for (int i = 0; i < CLATTN_MAX_SUBGROUP_SIZES && c->subgroup_sizes[i]; i++)
        cr_assert(c->subgroup_sizes[i] <= 1024, "sub-group size %u", c->subgroup_sizes[i]);
    const int nvidia = c->dclass == CLATTN_CLASS_NVIDIA;
    if (!nvidia) cr_assert_eq(c->nv_inline_ptx, 0, "inline PTX outside NVIDIA's compiler");
    if (!nvidia) cr_assert(c->nv_cc == 0 && c->nv_mma_tf32 == 0, "compute capability %u, mma %d outside NVIDIA",
                           c->nv_cc, c->nv_mma_tf32);
    if (c->nv_mma_tf32) cr_assert(c->nv_inline_ptx && c->nv_cc >= 80, "mma without inline PTX or cc 8.0");
    /* the tensor-core probe builds exactly where it did at open (asked only on NVIDIA at cc >= 8.0) */
    if (!nvidia || c->nv_cc >= 80) cr_assert_eq(clattn_test_probe_mma(dev), c->nv_mma_tf32, "the mma probe now");
    clattn_set_build_log("an earlier log");
    clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "an earlier error");
    const int probe = clattn_test_probe_ptx(dev);
    cr_assert_eq(probe, c->nv_inline_ptx, "the probe now (%d) and at open (%d)", probe, c->nv_inline_ptx);
    cr_assert_str_eq(clattn_last_error(), "an earlier error", "the probe recorded an error");
    cr_assert_str_eq(clattn_last_build_log(), "an earlier log", "the probe recorded a build log");
    clattn_device_free(dev);
}
