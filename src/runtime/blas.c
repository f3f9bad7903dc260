/* blas.c: every CLBlast call the library makes goes through here.
 *
 * Thread safety. CLBlast 1.5.3 initialises its kernel-parameter database and caches on
 * first use without a lock: two threads making a process's first CLBlast calls at the same
 * time can crash or fail with -2039 (see test_robust threads::cold_start_two_threads).
 * So each call holds one process-wide mutex. A call only enqueues work (the first
 * call per device also compiles CLBlast's kernels), so the lock is held briefly
 * except during that one-off compile, which a second thread would wait for anyway.
 *
 * Size. CLBlast's kernels index their buffers with 32-bit ints (offset, strides and all),
 * and its indirect GEMM first copies each operand into a temporary padded to its tile
 * sizes. A GEMM whose operands or temporaries would pass 2^31-1 elements computes wrong
 * numbers without an error, and a temporary above the device's max allocation fails. So
 * every call here is planned against the device's limits (dev->caps.blas_max_elems, and
 * dev->caps.max_alloc for the padded temporaries):
 *   - a batched GEMM runs in groups of batch entries that fit, or entry by entry;
 *   - a GEMM runs in blocks of rows of A and C that fit;
 *   - an operand whose element offset plus extent passes the limit is addressed through
 *     a sub-buffer that starts at the aligned origin just below it.
 * What cannot be split (one row, or the B operand alone, too large) is refused with
 * CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, naming the limit. A caller's sub-buffer that would need such a sub-buffer
 * beside it is refused where the driver loses what is written through those (caps.sibling_subbuffers: NVIDIA's
 * OpenCL), before anything is enqueued: the whole buffer with an offset works there. */
#include "runtime.h"

#include <pthread.h>
#include <stdatomic.h>

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

/* CLBlast pads m, n and k up to its work-group tiles (at most 128 in its database) */
#define PAD 128
static size_t pad(size_t n) { return (n + PAD - 1) / PAD * PAD; }
static size_t max2(size_t a, size_t b) { return a > b ? a : b; }
static size_t min2(size_t a, size_t b) { return a < b ? a : b; }

static clattn_status blas_status(CLBlastStatusCode s, const char *what)
{
    if (s == CLBlastSuccess) return CLATTN_STATUS_SUCCESS;
    return clattn_fail((clattn_status)s, "CLBlast %s failed (%d: %s)", what, (int)s, clattn_status_string(s));
}

/* The largest element count one call may give any one operand, or any padded temporary. */
size_t clattn_blas_call_limit(const clattn_caps *caps)
{
    size_t lim = caps->blas_max_elems, align = caps->base_align / sizeof(float);
    size_t alloc = caps->max_alloc / sizeof(float);
    if (alloc < lim) lim = alloc;
    return lim > align ? lim - align : 1; /* room for a sub-buffer's residual offset */
}

/* An operand of one call: `mem` at element `off`, touching `extent` elements. */
typedef struct operand {
    cl_mem mem;
    size_t off;
    cl_mem sub; /* the sub-buffer made for it, released after the call */
} operand;

/* Make op addressable by CLBlast: when off + extent passes the limit, a sub-buffer of the
 * underlying buffer from the aligned origin below the operand, and a small residual offset. */
static clattn_status rebase(const clattn_device *dev, operand *op, size_t extent, const char *what)
{
    op->sub = NULL;
    if (op->off + extent <= dev->caps.blas_max_elems) return CLATTN_STATUS_SUCCESS;
    cl_mem base = op->mem, parent = NULL;
    size_t parent_off = 0;
    /* a sub-buffer cannot be split again: go to its parent, at its origin */
    if (clGetMemObjectInfo(op->mem, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) == CL_SUCCESS &&
        parent) {
        CL_CHECK(clGetMemObjectInfo(op->mem, CL_MEM_OFFSET, sizeof parent_off, &parent_off, NULL),
                 "clGetMemObjectInfo (CL_MEM_OFFSET)");
        base = parent;
    }
    const size_t byte = parent_off + op->off * sizeof(float);
    const size_t origin = byte / dev->caps.base_align * dev->caps.base_align;
    if ((byte - origin) % sizeof(float))
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "%s: a buffer at byte offset %zu (not a multiple of 4) "
                           "cannot be addressed past element %zu", what, byte, dev->caps.blas_max_elems);
    cl_buffer_region region = {origin, byte - origin + extent * sizeof(float)};
    cl_int err;
    op->sub = clCreateSubBuffer(base, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    if (err != CL_SUCCESS) {
        op->sub = NULL;
        return clattn_fail((clattn_status)err, "%s: clCreateSubBuffer at byte %zu (+%zu) failed (%d: %s)", what,
                           origin, region.size, err, clattn_status_string(err));
    }
    op->mem = op->sub;
    op->off = (byte - origin) / sizeof(float);
    return CLATTN_STATUS_SUCCESS;
}

/* Refuse, before any call, an operand in a caller's sub-buffer that reaches past the limit where sub-buffers beside it
 * lose their writes (caps.sibling_subbuffers). `reach`: its element offset plus every element the GEMM touches. */
static clattn_status check_sibling(const clattn_device *dev, cl_mem mem, size_t reach, const char *what,
                                   const char *name)
{
    if (dev->caps.sibling_subbuffers || reach <= dev->caps.blas_max_elems) return CLATTN_STATUS_SUCCESS;
    cl_mem parent = NULL;
    if (clGetMemObjectInfo(mem, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) != CL_SUCCESS || !parent)
        return CLATTN_STATUS_SUCCESS;
    return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "%s: operand %s is a sub-buffer reaching element %zu, past the %zu "
                       "CLBlast can index; this driver loses what CLBlast writes through further sub-buffers of its "
                       "buffer (README, Drivers with defects): pass the whole buffer with an offset instead", what,
                       name, reach, dev->caps.blas_max_elems);
}

/* Test-only: the largest element index any call handed to CLBlast, and the largest padded
 * temporary it may make (see clattn_test_blas_reach in internal.h). */
static _Atomic size_t reach_max;
static void note_reach(size_t v)
{
    size_t cur = atomic_load(&reach_max);
    while (v > cur && !atomic_compare_exchange_weak(&reach_max, &cur, v)) {}
}
size_t clattn_test_blas_reach(int reset)
{
    return reset ? atomic_exchange(&reach_max, 0) : atomic_load(&reach_max);
}

static void release(operand *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (ops[i].sub) clReleaseMemObject(ops[i].sub);
}

/* Elements touched by a row-major (rows, cols) matrix with leading dimension ld. */
static size_t extent(size_t rows, size_t cols, size_t ld) { return (rows - 1) * ld + cols; }

/* Elements touched by op(A) (m, k) and op(B) (k, n) as stored: A (k, m) when transposed, B (n, k). */
static size_t extent_a(CLBlastTranspose ta, size_t m, size_t k, size_t lda)
{
    return ta == CLBlastTransposeYes ? extent(k, m, lda) : extent(m, k, lda);
}
static size_t extent_b(CLBlastTranspose tb, size_t n, size_t k, size_t ldb)
{
    return tb == CLBlastTransposeYes ? extent(n, k, ldb) : extent(k, n, ldb);
}

/* The elements one batch entry of m rows occupies in each operand and, for a GEMM large enough
 * for CLBlast's indirect kernel (m*n*k >= 64^3, below any threshold in its database; smaller
 * ones run its direct kernel, without temporaries), in each padded temporary. */
static size_t entry_need(CLBlastTranspose ta, CLBlastTranspose tb, size_t m, size_t n, size_t k, size_t lda,
                         size_t ldb, size_t ldc)
{
    size_t e = max2(extent_a(ta, m, k, lda), extent(m, n, ldc));
    e = max2(e, extent_b(tb, n, k, ldb));
    const double work = (double)m * (double)n * (double)k;
    if (work >= 64.0 * 64.0 * 64.0) e = max2(e, max2(pad(m) * pad(k), max2(pad(m) * pad(n), pad(n) * pad(k))));
    return e;
}

/* One CLBlast call (batched when count > 1) on rebased operands. */
static clattn_status call(const clattn_device *dev, CLBlastTranspose ta, CLBlastTranspose tb, size_t m, size_t n,
                          size_t k, float alpha, operand a, size_t lda, size_t sa, operand b, size_t ldb, size_t sb,
                          float beta, operand c, size_t ldc, size_t sc, size_t count, const char *what)
{
    const size_t ea = extent_a(ta, m, k, lda), eb = extent_b(tb, n, k, ldb);
    const size_t ec = extent(m, n, ldc);
    TRY(clattn_device_runs(dev, what));
    operand ops[3] = {a, b, c};
    clattn_status st;
    if ((st = rebase(dev, &ops[0], (count - 1) * sa + ea, what)) ||
        (st = rebase(dev, &ops[1], (count - 1) * sb + eb, what)) ||
        (st = rebase(dev, &ops[2], (count - 1) * sc + ec, what))) {
        release(ops, 3);
        return st;
    }
    note_reach(ops[0].off + (count - 1) * sa + ea);
    note_reach(ops[1].off + (count - 1) * sb + eb);
    note_reach(ops[2].off + (count - 1) * sc + ec);
    note_reach(count * entry_need(ta, tb, m, n, k, lda, ldb, ldc));
    cl_command_queue q = dev->queue;
    pthread_mutex_lock(&blas_lock);
    CLBlastStatusCode s =
        count == 1 ? CLBlastSgemm(CLBlastLayoutRowMajor, ta, tb, m, n, k, alpha, ops[0].mem, ops[0].off,
                                  lda, ops[1].mem, ops[1].off, ldb, beta, ops[2].mem, ops[2].off, ldc, &q, NULL)
                   : CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, ta, tb, m, n, k, alpha,
                                                ops[0].mem, ops[0].off, lda, sa, ops[1].mem, ops[1].off, ldb, sb,
                                                beta, ops[2].mem, ops[2].off, ldc, sc, count, &q, NULL);
    pthread_mutex_unlock(&blas_lock);
    release(ops, 3); /* OpenCL keeps a released sub-buffer alive until the enqueued GEMM is done */
    return blas_status(s, what);
}

/* One GEMM (count = 1), in blocks of rows when it is too large for one call (a block of rows of C is a block
 * of rows of A, or of its columns when A is transposed). */
static clattn_status gemm_rows(const clattn_device *dev, CLBlastTranspose ta, CLBlastTranspose tb, size_t m, size_t n,
                               size_t k, float alpha, operand a, size_t lda, operand b, size_t ldb, float beta,
                               operand c, size_t ldc, const char *what)
{
    const size_t lim = clattn_blas_call_limit(&dev->caps);
    if (entry_need(ta, tb, 1, n, k, lda, ldb, ldc) > lim)
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "%s: m=%zu n=%zu k=%zu is too large for one CLBlast call even one row at a time "
                           "(limit %zu elements per operand: 32-bit indices and the device's max allocation)",
                           what, m, n, k, lim);
    size_t rows = m;
    if (entry_need(ta, tb, m, n, k, lda, ldb, ldc) > lim) {
        size_t lo = 1, hi = m - 1; /* the largest row count that fits (the need grows with rows) */
        while (lo < hi) {
            size_t mid = lo + (hi - lo + 1) / 2;
            if (entry_need(ta, tb, mid, n, k, lda, ldb, ldc) <= lim) lo = mid;
            else hi = mid - 1;
        }
        rows = lo >= PAD ? lo / PAD * PAD : lo; /* whole tiles where it can */
    }
    for (size_t r0 = 0; r0 < m; r0 += rows) {
        const size_t mc = min2(rows, m - r0);
        operand ar = {a.mem, a.off + r0 * (ta == CLBlastTransposeYes ? 1 : lda), NULL};
        operand cr = {c.mem, c.off + r0 * ldc, NULL};
        TRY(call(dev, ta, tb, mc, n, k, alpha, ar, lda, 0, b, ldb, 0, beta, cr, ldc, 0, 1, what));
    }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_blas_sgemm(const clattn_device *dev, CLBlastTranspose ta, CLBlastTranspose tb, size_t m,
                                size_t n, size_t k, float alpha, cl_mem a, size_t a_off, size_t lda, cl_mem b,
                                size_t b_off, size_t ldb, float beta, cl_mem c, size_t c_off, size_t ldc,
                                const char *what)
{
    TRY(check_sibling(dev, a, a_off + extent_a(ta, m, k, lda), what, "A"));
    TRY(check_sibling(dev, b, b_off + extent_b(tb, n, k, ldb), what, "B"));
    TRY(check_sibling(dev, c, c_off + extent(m, n, ldc), what, "C"));
    return gemm_rows(dev, ta, tb, m, n, k, alpha, (operand){a, a_off, NULL}, lda, (operand){b, b_off, NULL}, ldb, beta,
                     (operand){c, c_off, NULL}, ldc, what);
}

clattn_status clattn_blas_sgemm_strided_batched(const clattn_device *dev, CLBlastTranspose ta, CLBlastTranspose tb,
                                                size_t m, size_t n, size_t k, float alpha, cl_mem a, size_t a_off,
                                                size_t lda, size_t a_stride, cl_mem b, size_t b_off, size_t ldb,
                                                size_t b_stride, float beta, cl_mem c, size_t c_off, size_t ldc,
                                                size_t c_stride, size_t count, const char *what)
{
    TRY(check_sibling(dev, a, a_off + (count - 1) * a_stride + extent_a(ta, m, k, lda), what, "A"));
    TRY(check_sibling(dev, b, b_off + (count - 1) * b_stride + extent_b(tb, n, k, ldb), what, "B"));
    TRY(check_sibling(dev, c, c_off + (count - 1) * c_stride + extent(m, n, ldc), what, "C"));
    const size_t lim = clattn_blas_call_limit(&dev->caps);
    const size_t one = entry_need(ta, tb, m, n, k, lda, ldb, ldc);
    if (one > lim) { /* entry by entry, each in row blocks */
        for (size_t g = 0; g < count; g++)
            TRY(gemm_rows(dev, ta, tb, m, n, k, alpha, (operand){a, a_off + g * a_stride, NULL}, lda,
                          (operand){b, b_off + g * b_stride, NULL}, ldb, beta,
                          (operand){c, c_off + g * c_stride, NULL}, ldc, what));
        return CLATTN_STATUS_SUCCESS;
    }
    /* groups of entries: each operand's span and each padded temporary (count entries) fit */
    size_t group = count;
    const size_t strides[3] = {a_stride, b_stride, c_stride};
    for (int i = 0; i < 3; i++)
        if (strides[i]) group = min2(group, (lim - one) / strides[i] + 1);
    group = min2(group, lim / one);
    if (group == 0) group = 1;
    for (size_t g = 0; g < count; g += group) {
        const size_t cnt = min2(group, count - g);
        TRY(call(dev, ta, tb, m, n, k, alpha, (operand){a, a_off + g * a_stride, NULL}, lda, a_stride,
                 (operand){b, b_off + g * b_stride, NULL}, ldb, b_stride, beta,
                 (operand){c, c_off + g * c_stride, NULL}, ldc, c_stride, cnt, what));
    }
    return CLATTN_STATUS_SUCCESS;
}

void clattn_blas_lock(void) { pthread_mutex_lock(&blas_lock); }
void clattn_blas_unlock(void) { pthread_mutex_unlock(&blas_lock); }
