/* alloc.c: every host allocation and every OpenCL buffer of the library goes
 * through here, so that tests can make the Nth one fail (fault injection) and
 * check that each failure is reported, leaks nothing and leaves a freeable plan. */
#include "runtime.h"

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

/* A device buffer of `elems` elements of `elem_size` bytes (at least one element),
 * initialised from `host` when given; its size is checked against the device's
 * max allocation first, and `what` names it in error messages. */
clattn_status clattn_buffer_new(const clattn_device *dev, size_t elems, size_t elem_size, const void *host,
                                const char *what, cl_mem *out)
{
    size_t bytes;
    if (elems == 0) elems = 1;
    if (clattn_mul_overflows(elems, elem_size, &bytes))
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "%s: size overflows", what);
    if (bytes > dev->caps.max_alloc)
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "%s needs %zu bytes, more than the device's max allocation (%zu bytes)", what, bytes,
                           dev->caps.max_alloc);
    cl_int err;
    cl_mem_flags flags = host ? CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR : CL_MEM_READ_WRITE;
    *out = clattn_create_buffer(dev->context, flags, bytes, (void *)host, &err);
    if (err != CL_SUCCESS) {
        *out = NULL;
        return clattn_fail(err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
                                   err == CL_OUT_OF_HOST_MEMORY || err == CL_INVALID_BUFFER_SIZE
                               ? CLATTN_STATUS_DEVICE_ALLOCATION : (clattn_status)err,
                           "clCreateBuffer for %s (%zu bytes) failed (%d)", what, bytes, err);
    }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_buffer_put(const clattn_device *dev, size_t elems, size_t elem_size, const void *host,
                                const char *what, cl_mem *m)
{
    if (!*m) return clattn_buffer_new(dev, elems, elem_size, host, what, m);
    if (!host) return CLATTN_STATUS_SUCCESS;
    CL_CHECK(clEnqueueWriteBuffer(dev->queue, *m, CL_TRUE, 0, (elems ? elems : 1) * elem_size, host, 0, NULL, NULL),
             what);
    return CLATTN_STATUS_SUCCESS;
}

void clattn_mem_release(cl_mem *m)
{
    if (*m) clReleaseMemObject(*m);
    *m = NULL;
}

size_t clattn_mem_bytes(cl_mem m)
{
    size_t size = 0;
    if (m && clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL) != CL_SUCCESS) size = 0;
    return size;
}

int clattn_mul_overflows(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return 1;
    *out = a * b;
    return 0;
}

clattn_status clattn_buffer_check(cl_mem m, size_t offset, size_t elems, size_t size, const char *what)
{
    if (!m) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "buffers.%s.mem is NULL", what);
    size_t bytes = 0, need;
    cl_int e = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof bytes, &bytes, NULL);
    if (e != CL_SUCCESS) return clattn_fail((clattn_status)e, "buffers.%s is not a valid buffer (%d)", what, e);
    if (offset + elems < offset || clattn_mul_overflows(offset + elems, size, &need) || need > bytes)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH,
                           "buffers.%s: %zu elements from offset %zu do not fit its %zu bytes", what, elems, offset,
                           bytes);
    return CLATTN_STATUS_SUCCESS;
}
