/* overlap.c: the overlap rule (runtime.h) that every entry point of the API checks before it reads or writes
 * anything, in both of its forms: host arrays compared by address, device buffers by the buffer they live in
 * (a sub-buffer's parent) and their byte ranges there. */
#include "runtime.h"

#include <stdint.h>
#include <stdio.h>

clattn_mem_range clattn_range(const char *owner, const char *what, const void *host, const clattn_buffer *buf,
                              size_t elems, size_t size)
{
    clattn_mem_range r = {.owner = owner, .what = what, .index = -1};
    size_t bytes, off = 0;
    /* a size or an offset that overflows is the size checks' to refuse: nothing to compare here */
    if (clattn_mul_overflows(elems, size, &bytes) || (buf && clattn_mul_overflows(buf->offset, size, &off)) ||
        off + bytes < off)
        return r;
    if (buf) r.mem = buf->mem;
    else r.host = host;
    r.off = off;
    r.bytes = bytes;
    return r;
}

/* The buffer a range lives in (the parent of a sub-buffer) and its offset there. */
static void resolve(cl_mem m, size_t *off, cl_mem *root)
{
    cl_mem parent = NULL;
    size_t origin = 0;
    if (clGetMemObjectInfo(m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) == CL_SUCCESS && parent &&
        clGetMemObjectInfo(m, CL_MEM_OFFSET, sizeof origin, &origin, NULL) == CL_SUCCESS) {
        *off += origin;
        *root = parent;
        return;
    }
    *root = m;
}

static const char *name_of(const clattn_mem_range *r, char *buf, size_t len)
{
    const char *dot = r->owner[0] ? "." : "";
    if (r->index >= 0) snprintf(buf, len, "%s%s%s[%ld]", r->owner, dot, r->what, r->index);
    else snprintf(buf, len, "%s%s%s", r->owner, dot, r->what);
    return buf;
}

static clattn_status check_pair(const clattn_mem_range *a, const clattn_mem_range *b)
{
    if (a->bytes == 0 || b->bytes == 0) return CLATTN_STATUS_SUCCESS;
    char an[80], bn[80];
    if (a->host && b->host) {
        const uintptr_t a0 = (uintptr_t)a->host + a->off, b0 = (uintptr_t)b->host + b->off;
        if (a0 >= b0 + b->bytes || b0 >= a0 + a->bytes) return CLATTN_STATUS_SUCCESS;
        const uintptr_t lo = a0 > b0 ? a0 : b0, hi = a0 + a->bytes < b0 + b->bytes ? a0 + a->bytes : b0 + b->bytes;
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s overlaps %s (they share %zu bytes of host memory): an "
                           "output may not share memory with an input or another output", name_of(a, an, sizeof an),
                           name_of(b, bn, sizeof bn), (size_t)(hi - lo));
    }
    if (!a->mem || !b->mem) return CLATTN_STATUS_SUCCESS; /* host memory and a buffer, or one not given */
    size_t ao = a->off, bo = b->off;
    cl_mem ar, br;
    resolve(a->mem, &ao, &ar);
    resolve(b->mem, &bo, &br);
    if (ar != br || ao >= bo + b->bytes || bo >= ao + a->bytes) return CLATTN_STATUS_SUCCESS;
    return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s overlaps %s (bytes %zu..%zu and %zu..%zu of one buffer): an "
                       "output may not share memory with an input or another output", name_of(a, an, sizeof an),
                       name_of(b, bn, sizeof bn), ao, ao + a->bytes - 1, bo, bo + b->bytes - 1);
}

clattn_status clattn_check_no_overlap(const clattn_mem_range *outs, int nout, const clattn_mem_range *ins, int nin)
{
    for (int i = 0; i < nout; i++) {
        for (int j = 0; j < nin; j++) TRY(check_pair(&outs[i], &ins[j]));
        for (int j = i + 1; j < nout; j++) TRY(check_pair(&outs[i], &outs[j]));
    }
    return CLATTN_STATUS_SUCCESS;
}
