/* alloc.c: every host allocation and every OpenCL buffer of the library goes
 * through here, so that tests can make the Nth one fail (fault injection) and
 * check that each failure is reported, leaks nothing and leaves a freeable plan. */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>

/* 0 = never fail; N > 0 = the Nth call from now fails (once). Test-only. */
static atomic_long host_countdown, buffer_countdown;
static atomic_int fired;

void clattn_test_fail_nth_alloc(long host_n, long buffer_n)
{
    atomic_store(&host_countdown, host_n);
    atomic_store(&buffer_countdown, buffer_n);
    atomic_store(&fired, 0);
}

int clattn_test_alloc_fault_fired(void) { return atomic_load(&fired); }

static int should_fail(atomic_long *countdown)
{
    long v = atomic_load(countdown);
    while (v > 0) {
        if (atomic_compare_exchange_weak(countdown, &v, v - 1)) {
            if (v != 1) return 0;
            atomic_store(&fired, 1);
            return 1;
        }
    }
    return 0;
}

void *clattn_malloc(size_t size)
{
    if (should_fail(&host_countdown)) return NULL;
    return malloc(size ? size : 1);
}

void *clattn_calloc(size_t n, size_t size)
{
    if (should_fail(&host_countdown)) return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

cl_mem clattn_create_buffer(cl_context ctx, cl_mem_flags flags, size_t bytes, void *host, cl_int *err)
{
    if (should_fail(&buffer_countdown)) {
        *err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return NULL;
    }
    return clCreateBuffer(ctx, flags, bytes, host, err);
}
