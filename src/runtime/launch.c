/* launch.c: kernel arguments and 1-D launches. Every launch is split into enqueues of at most
 * dev->caps.max_launch_items work-items (drivers differ in how large one NDRange may be); the kernels take
 * their bound (or their first group) as an argument and check it. */
#include "runtime.h"

#include <stdatomic.h>

/* The test hooks' high-water marks: the most work-items of one launch, the most loop trips a launch noted. */
static _Atomic size_t launch_max, trips_max;
static void raise_to(_Atomic size_t *mark, size_t v)
{
    size_t cur = atomic_load(mark);
    while (v > cur && !atomic_compare_exchange_weak(mark, &cur, v)) {}
}
static size_t reach(_Atomic size_t *mark, int reset) { return reset ? atomic_exchange(mark, 0) : atomic_load(mark); }

void clattn_note_launch(size_t items) { raise_to(&launch_max, items); }
size_t clattn_test_launch_reach(int reset) { return reach(&launch_max, reset); }
void clattn_note_trips(size_t trips) { raise_to(&trips_max, trips); }
size_t clattn_test_trips_reach(int reset) { return reach(&trips_max, reset); }

/* total work-items in work-groups of `local`, each enqueue at its global offset (get_global_id includes
 * it). total = 0 enqueues one work-group that does nothing: drivers that compile a kernel for its
 * work-group size at the first launch (PoCL) do it then, when a plan warms its kernels up. */
static clattn_status enqueue(const clattn_device *dev, cl_kernel k, size_t total, size_t local, const char *what)
{
    if (total == 0) {
        if (clattn_device_simulated(dev)) return CLATTN_STATUS_SUCCESS; /* nothing runs there, not even a warm-up */
        size_t global = local;
        CL_CHECK(clEnqueueNDRangeKernel(dev->queue, k, 1, NULL, &global, &local, 0, NULL, NULL), what);
        return CLATTN_STATUS_SUCCESS;
    }
    TRY(clattn_device_runs(dev, what));
    size_t step = dev->caps.max_launch_items / local * local;
    if (step == 0) step = local;
    for (size_t start = 0; start < total; start += step) {
        size_t n = total - start < step ? total - start : step;
        size_t global = (n + local - 1) / local * local, offset = start;
        clattn_note_launch(global);
        CL_CHECK(clEnqueueNDRangeKernel(dev->queue, k, 1, &offset, &global, &local, 0, NULL, NULL), what);
    }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_enqueue_1d(const clattn_device *dev, cl_kernel k, size_t total, const char *what)
{
    return enqueue(dev, k, total, dev->caps.max_work_group < 64 ? dev->caps.max_work_group : 64, what);
}

clattn_status clattn_enqueue_items(const clattn_device *dev, cl_kernel k, size_t total, const char *what)
{
    if (dev->caps.dclass != CLATTN_CLASS_CPU) return clattn_enqueue_1d(dev, k, total, what);
    return enqueue(dev, k, total, 1, what);
}

clattn_status clattn_enqueue_groups(const clattn_device *dev, cl_kernel k, size_t groups, size_t wg,
                                    clattn_status (*set_first)(cl_kernel k, size_t first, void *ctx), void *ctx,
                                    const char *what)
{
    if (groups) TRY(clattn_device_runs(dev, what));
    size_t step = dev->caps.max_launch_items / wg;
    if (step == 0) step = 1;
    for (size_t g0 = 0; g0 < groups; g0 += step) {
        const size_t n = groups - g0 < step ? groups - g0 : step;
        TRY(set_first(k, g0, ctx));
        size_t local = wg, global = n * local;
        clattn_note_launch(global);
        CL_CHECK(clEnqueueNDRangeKernel(dev->queue, k, 1, NULL, &global, &local, 0, NULL, NULL), what);
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
void clattn_arg_local(clattn_args *a, size_t bytes) { push(a, bytes, NULL); }

void clattn_arg_view(clattn_args *a, clattn_view v)
{
    clattn_arg_mem(a, v.mem);
    clattn_arg_u64(a, v.off);
}

clattn_status clattn_args_end(const clattn_args *a)
{
    if (a->err == CL_SUCCESS) return CLATTN_STATUS_SUCCESS;
    return clattn_fail((clattn_status)a->err, "setting argument %u of kernel %s failed (%d: %s)", a->bad, a->kernel,
                       a->err, clattn_status_string(a->err));
}
