/* blas.c: every CLBlast call the library makes goes through here.
 *
 * CLBlast 1.5.3 initialises its kernel-parameter database and caches on first use
 * without a lock: two threads making a process's first CLBlast calls at the same
 * time can crash or fail with -2039 (see test_robust threads::cold_start_two_threads).
 * So each call holds one process-wide mutex. A call only enqueues work (the first
 * call per device also compiles CLBlast's kernels), so the lock is held briefly
 * except during that one-off compile, which a second thread would wait for anyway. */
#include "internal.h"

#include <pthread.h>

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

static clattn_status blas_status(CLBlastStatusCode s, const char *what)
{
    if (s == CLBlastSuccess) return CLATTN_STATUS_SUCCESS;
    return clattn_fail((clattn_status)s, "CLBlast %s failed (%d: %s)", what, (int)s, clattn_status_string(s));
}

clattn_status clattn_blas_sgemm(cl_command_queue queue, CLBlastTranspose tb, size_t m, size_t n, size_t k,
                                float alpha, cl_mem a, size_t a_off, size_t lda, cl_mem b, size_t b_off, size_t ldb,
                                float beta, cl_mem c, size_t c_off, size_t ldc, const char *what)
{
    pthread_mutex_lock(&blas_lock);
    CLBlastStatusCode s = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, tb, m, n, k, alpha, a, a_off, lda, b,
                                       b_off, ldb, beta, c, c_off, ldc, &queue, NULL);
    pthread_mutex_unlock(&blas_lock);
    return blas_status(s, what);
}

clattn_status clattn_blas_sgemm_strided_batched(cl_command_queue queue, CLBlastTranspose tb, size_t m, size_t n,
                                                size_t k, float alpha, cl_mem a, size_t a_off, size_t lda,
                                                size_t a_stride, cl_mem b, size_t b_off, size_t ldb, size_t b_stride,
                                                float beta, cl_mem c, size_t c_off, size_t ldc, size_t c_stride,
                                                size_t count, const char *what)
{
    pthread_mutex_lock(&blas_lock);
    CLBlastStatusCode s = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo, tb, m, n, k, alpha, a,
                                                     a_off, lda, a_stride, b, b_off, ldb, b_stride, beta, c, c_off,
                                                     ldc, c_stride, count, &queue, NULL);
    pthread_mutex_unlock(&blas_lock);
    return blas_status(s, what);
}
