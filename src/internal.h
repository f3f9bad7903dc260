/* internal.h: what the library's own source files share (not installed). */
#ifndef CLATTN_INTERNAL_H
#define CLATTN_INTERNAL_H

#include "clattn.h"
#include <clblast_c.h>
#include <stdarg.h>

/* ---- errors (status.c) */
/* Record a detail message for clattn_last_error() and return `status`. */
clattn_status clattn_fail(clattn_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void clattn_clear_error(void);
void clattn_set_build_log(const char *log);

/* ---- helpers of the OpenCL passes (attention_cl.c, encoder.c) */
typedef struct clattn_view { cl_mem mem; size_t off; } clattn_view; /* a tensor: buffer + element offset */

/* return the status of `expr` when it is not success */
#define TRY(expr)                                   \
    do {                                            \
        clattn_status s_ = (expr);                  \
        if (s_ != CLATTN_STATUS_SUCCESS) return s_; \
    } while (0)

/* return an OpenCL failure of `call` as its status, with `what` in the detail */
#define CL_CHECK(call, what)                                                                              \
    do {                                                                                                  \
        cl_int e_ = (call);                                                                               \
        if (e_ != CL_SUCCESS)                                                                             \
            return clattn_fail((clattn_status)e_, "%s failed (%d: %s)", what, e_, clattn_status_string(e_)); \
    } while (0)

/* ---- allocation (alloc.c): all host allocations and OpenCL buffers go through these */
void *clattn_malloc(size_t size);
void *clattn_calloc(size_t n, size_t size);
cl_mem clattn_create_buffer(cl_context ctx, cl_mem_flags flags, size_t bytes, void *host, cl_int *err);
/* Test-only fault injection: make the host_n-th host allocation and the buffer_n-th
 * buffer creation from now fail (0 = never). Not exported from the shared library. */
void clattn_test_fail_nth_alloc(long host_n, long buffer_n);
int clattn_test_alloc_fault_fired(void); /* did the armed failure happen? */
/* A device buffer checked against the device's max allocation, named `what` in errors. */
struct clattn_device;
clattn_status clattn_buffer_new(const struct clattn_device *dev, size_t elems, size_t elem_size, const void *host,
                                const char *what, cl_mem *out);
void clattn_mem_release(cl_mem *m); /* release and NULL (NULL is fine) */
/* A caller's buffer (buffers.`what`) must hold `elems` elements of `size` bytes from element `offset`:
 * INVALID_ARGUMENT when m is NULL, its OpenCL code when m is not a buffer, SHAPE_MISMATCH when too small. */
clattn_status clattn_buffer_check(cl_mem m, size_t offset, size_t elems, size_t size, const char *what);
/* New LINEAR [out, in] copy of a (rows_out, cols_in) weight given in `layout` (plan.c); NULL if out of memory. */
float *clattn_weight_copy(const float *src, size_t rows_out, size_t cols_in, clattn_layout layout);
float *clattn_vector_copy(const float *src, size_t n);

/* ---- size arithmetic that cannot wrap (plan.c) */
int clattn_mul_overflows(size_t a, size_t b, size_t *out);

/* ---- CLBlast (blas.c): every call is serialised by one process-wide lock, because
 * CLBlast's first-use initialisation is not thread-safe. Row-major, A not transposed:
 * C (m, n) = alpha * A (m, k) * op(B) + beta * C; `what` names the GEMM in errors.
 * A GEMM too large for one CLBlast call (32-bit indices, its padded temporaries within one
 * allocation) is split into calls over row blocks (and batch groups), each addressing its
 * buffers through a sub-buffer when the element offset alone would exceed the limit. */
struct clattn_device;
clattn_status clattn_blas_sgemm(const struct clattn_device *dev, CLBlastTranspose tb, size_t m, size_t n, size_t k,
                                float alpha, cl_mem a, size_t a_off, size_t lda, cl_mem b, size_t b_off, size_t ldb,
                                float beta, cl_mem c, size_t c_off, size_t ldc, const char *what);
clattn_status clattn_blas_sgemm_strided_batched(const struct clattn_device *dev, CLBlastTranspose tb, size_t m, size_t n,
                                                size_t k, float alpha, cl_mem a, size_t a_off, size_t lda,
                                                size_t a_stride, cl_mem b, size_t b_off, size_t ldb, size_t b_stride,
                                                float beta, cl_mem c, size_t c_off, size_t ldc, size_t c_stride,
                                                size_t count, const char *what);

/* CLBlast's single-precision Xgemm parameters, from a fixed table of complete sets taken from CLBlast's own
 * database (tuning): how many sets there are, and make set `i` CLBlast's for this device, process-wide (it
 * applies to every CLBlast call on the device, the caller's own included), clearing CLBlast's kernel cache.
 * Set 0 is CLBlast's default for devices it does not know. */
size_t clattn_blas_xgemm_sets(void);
clattn_status clattn_blas_use_xgemm_set(const struct clattn_device *dev, size_t set);

/* Test-only (not exported from the shared library): the largest element index that any CLBlast
 * call has touched in any buffer, counting CLBlast's padded temporaries, since the last reset;
 * reset = 1 returns it and starts again from 0. */
size_t clattn_test_blas_reach(int reset);
/* Test-only: the most work-items any one kernel launch had since the last reset (reset = 1). */
size_t clattn_test_launch_reach(int reset);
void clattn_note_launch(size_t items);

/* ---- devices (device.c) */
typedef enum clattn_device_class {
    CLATTN_CLASS_CPU = 0, CLATTN_CLASS_NVIDIA, CLATTN_CLASS_AMD, CLATTN_CLASS_INTEL, CLATTN_CLASS_OTHER
} clattn_device_class;

/* The limits every plan computes within. Read once when the device opens; the tests lower them
 * (the struct is internal) so that a few hundred tokens exercise every chunking path. */
#define CLATTN_BLAS_MAX_ELEMS ((size_t)0x7FFFFFFF) /* CLBlast 1.5 indexes its buffers with 32-bit ints */
#define CLATTN_MAX_LAUNCH_ITEMS ((size_t)1 << 30)  /* work-items of one 1-D launch (bigger: several, offset) */

struct clattn_device {
    clattn_backend backend;
    char name[300];
    char notice[400];           /* why the default fell back to ref ("" = none) */
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    /* capabilities, read once at open (fill_limits) */
    cl_device_type type;        /* CL_DEVICE_TYPE */
    clattn_device_class dclass; /* CPU, or the GPU vendor: picks kernel variants and tile defaults */
    unsigned compute_units;     /* CL_DEVICE_MAX_COMPUTE_UNITS */
    size_t local_mem;           /* CL_DEVICE_LOCAL_MEM_SIZE, bytes */
    int fp16;                   /* cl_khr_fp16 */
    size_t max_alloc;           /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    size_t global_mem;          /* CL_DEVICE_GLOBAL_MEM_SIZE */
    size_t max_work_group;      /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    size_t base_align;          /* CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes: sub-buffer origins */
    size_t blas_max_elems;      /* the largest element index one CLBlast call may touch in one buffer */
    size_t max_launch_items;    /* work-items of one enqueue of a 1-D kernel */
    int queue_profiling;        /* the queue has CL_QUEUE_PROFILING_ENABLE */
    char driver[128];           /* CL_DRIVER_VERSION: part of the compiled-program cache's key */
    char vendor[96];            /* CL_DEVICE_VENDOR */
    struct clattn_tune_table *tune;   /* the device's tuning file, read at open (tune.c); NULL on ref */
    const struct clattn_tune_table *tune_try; /* clattn_tune's candidate while it searches (else NULL) */
};

/* ---- tuning (tune.c) */
#define CLATTN_TUNE_CLASSES 4 /* head-size classes: max(dk, dv) <= 32, 64, 128, 256 */
typedef struct clattn_tune_flash {
    int set;            /* the file has an entry for this class */
    int kind;           /* 0 flash_rows, 1 flash_tiled (clattn_flash_kind) */
    size_t a, b, c;     /* rows: ROWS, BK, VW; tiled: BQ, BKT, NS */
} clattn_tune_flash;
typedef struct clattn_tune_table {
    clattn_tune_flash flash[CLATTN_TUNE_CLASSES];
    int softmax;        /* -1 not set, 0 softmax_rows (a work-group per row), 1 softmax_rows_item */
    int xgemm;          /* -1 not set, else the index of CLBlast's Xgemm parameter set (blas.c) */
    int xgemm_applied;  /* the device made it CLBlast's at open */
    char path[1024];    /* where it was read from ("" = none) */
    char notice[1024];  /* what was ignored and why ("" = nothing) */
} clattn_tune_table;
int clattn_tune_class(size_t dk, size_t dv); /* -1: no class (head sizes above 256) */
/* Read the device's tuning file (at device open); never fails: a bad file is ignored, with a notice. */
void clattn_tune_load(struct clattn_device *dev);
/* The entries that apply now: clattn_tune's candidate while it searches, else the file's (NULL: none). */
const clattn_tune_table *clattn_tune_active(const struct clattn_device *dev);

/* ---- compiled programs on disk (program_cache.c) */
/* The cache key of a program: clattn's version, the device, its vendor and driver, the options and the
 * sources (names and a hash of their text). "" (and 0) when the cache is off or has no directory. */
int clattn_program_cache_key(const clattn_device *dev, const char *const *names, const char *const *texts,
                             const size_t *lens, int count, const char *options, char *key, size_t len);
/* A program built from the cached binary for `key`, or NULL (no file, or one that is not a valid entry
 * for this key: truncated, corrupted, another key, a binary the driver refuses). Never fails otherwise. */
cl_program clattn_program_cache_load(const clattn_device *dev, const char *key, const char *options);
/* Save a built program's binary for `key` (atomically: a temporary file renamed); errors are ignored. */
void clattn_program_cache_store(const clattn_device *dev, const char *key, cl_program program);
/* Test-only: programs loaded from the cache and built from source since the last reset (reset = 1). */
void clattn_test_program_counts(int reset, long *loaded, long *built);
/* Called (when set) before the library compiles kernels from source (clattn_set_build_notice). */
void clattn_notify_build(const clattn_device *dev);

/* ---- programs (program.c) */
/* Build a program from the embedded sources named (e.g. {"philox", "softmax"})
 * with the given options. On failure returns CLATTN_STATUS_BUILD_FAILURE (or
 * an OpenCL code) and keeps the build log for clattn_last_build_log(). */
clattn_status clattn_program_build(const clattn_device *dev, const char *const *names, int count,
                                   const char *options, cl_program *program);
/* The same for a kernel that takes its work-group size as -DWG: builds `options` plus -DWG=*wg, with *wg
 * (a power of two) first lowered to the device's limit, then rebuilt smaller while the compiled kernel
 * `kernel` allows less (CL_KERNEL_WORK_GROUP_SIZE). On success *wg is the size built for. */
clattn_status clattn_program_build_wg(const clattn_device *dev, const char *const *names, int count,
                                      const char *options, const char *kernel, size_t *wg, cl_program *program,
                                      cl_kernel *k);
size_t clattn_pow2_at_most(size_t n); /* the largest power of two <= n (1 for n = 0) */
/* Enqueue a 1-D kernel over `total` work-items (rounded up to the work-group size; kernels check the bound). */
clattn_status clattn_enqueue_1d(const clattn_device *dev, cl_kernel k, size_t total, const char *what);

/* Kernel arguments pushed in order, typed; the first failure is kept and named (kernel, index):
 *   clattn_args a; clattn_args_begin(&a, k, "flash_rows"); clattn_arg_mem(&a, buf); ...
 *   TRY(clattn_args_end(&a)); */
typedef struct clattn_args {
    cl_kernel k;
    const char *kernel;
    cl_uint n, bad;
    cl_int err;
} clattn_args;
void clattn_args_begin(clattn_args *a, cl_kernel k, const char *kernel);
void clattn_arg_mem(clattn_args *a, cl_mem m); /* NULL: an unused buffer argument */
void clattn_arg_u32(clattn_args *a, cl_uint v);
void clattn_arg_u64(clattn_args *a, cl_ulong v);
void clattn_arg_f32(clattn_args *a, cl_float v);
clattn_status clattn_args_end(const clattn_args *a);

/* ---- the OpenCL execution shell (exec.c), shared by the attention and encoder plans */
typedef clattn_status (*clattn_pass_fn)(void *ctx); /* enqueues a whole pass on the device queue */
typedef struct clattn_transfer {
    cl_mem buf;        /* NULL: skipped */
    size_t bytes;
    void *host;        /* read from (uploads) or written to (the output) */
    const char *what;  /* for errors: "x", "the output" */
} clattn_transfer;
/* From host arrays: the uploads (non-blocking, in order), the pass, clFinish (always, so the
 * caller's arrays are free on return), then the output read, last: on any failure the caller's
 * output is untouched. */
clattn_status clattn_exec_host(const struct clattn_device *dev, const clattn_transfer *in, int nin,
                               clattn_pass_fn pass, void *ctx, const clattn_transfer *out);
/* On the caller's buffers: a barrier on the wait list, the pass, and a completion event. */
clattn_status clattn_exec_buffers(const struct clattn_device *dev, cl_uint nwait, const cl_event *wait,
                                  clattn_pass_fn pass, void *ctx, cl_event *event);

/* ---- the plan (plan.c), shared by the two backends */
struct clattn_cl_state;          /* attention_cl.c */

#define CLATTN_NSTAGES (CLATTN_STAGE_ATTENTION + 1) /* every stage this version knows */

struct clattn_backend_ops;

struct clattn_plan {
    clattn_device *device;
    const struct clattn_backend_ops *ops; /* ref, unfused or fused (backend.h) */
    clattn_attention_desc d;     /* every default resolved; d.algorithm FUSED or UNFUSED on OpenCL */
    int has_qkv;                 /* Q/K/V projections present */
    int has_out;                 /* output projection present */
    size_t out_width;            /* Eo or H*dv */
    int host_staging;            /* OpenCL: staging buffers for execution from host arrays */
    /* host copies, normalised to LINEAR layout [out, in]; NULL when absent */
    float *w_query, *w_key, *w_value, *b_query, *b_key, *b_value, *w_out, *b_out;
    int profiling;
    int tuned;                   /* it uses parameters from the device's tuning file */
    double stage_ms[CLATTN_NSTAGES];
    struct clattn_cl_state *cl;  /* OpenCL backend state, NULL on ref */
};

/* Validate the description and copy the weights (normalised to LINEAR): a plan with every field
 * resolved and ops = the reference backend, nothing on the device yet. plan_create chooses the backend
 * after it; decode plans (decode.c) keep it as their description and weights. */
clattn_status clattn_plan_prepare(clattn_device *device, const clattn_attention_desc *desc,
                                  const clattn_attention_weights *weights, int host_staging, clattn_plan **plan);

/* A plan as clattn_plan_create makes it, but on OpenCL without the staging buffers that execution from
 * host arrays needs: for owners that only run it on device buffers (the encoder layer). */
clattn_status clattn_plan_create_device_resident(clattn_device *device, const clattn_attention_desc *desc,
                                                 const clattn_attention_weights *weights, clattn_plan **plan);

/* The OpenCL backends' device memory (attention_cl.c); the backends themselves are in backend.h. */
size_t clattn_cl_device_bytes(const struct clattn_plan *plan);

/* ---- the encoder layer (encoder.c: plan, validation, OpenCL path; encoder_ref.c: CPU reference) */
struct clattn_encoder_cl;        /* encoder.c */

struct clattn_encoder_plan {
    clattn_device *device;
    clattn_encoder_desc d;       /* eps resolved; d.attn as given (p->attn holds the resolved one) */
    clattn_plan *attn;           /* the self-attention, a plan on the same device */
    size_t rows, E, F;           /* rows = B*T */
    /* host copies, normalised to LINEAR layout [out, in] */
    float *ln1_w, *ln1_b, *w_ff1, *b_ff1, *w_ff2, *b_ff2, *ln2_w, *ln2_b;
    struct clattn_encoder_cl *cl; /* OpenCL state, NULL on ref */
};

/* The whole layer on the CPU; out (B, T, E) is written only in the last pass. */
clattn_status clattn_ref_encoder_execute(const struct clattn_encoder_plan *p, const clattn_encoder_args *args,
                                         float *out);

/* Residual + LayerNorm over `rows` rows of E on the CPU: v = fl(fl(x + r) + bias) (r, bias NULL = none),
 * sum_out = v (NULL = not wanted), out = (v - mean) / sqrt(var + eps) * gamma + beta, biased variance. */
void clattn_ref_residual_layernorm(size_t rows, size_t E, const float *x, const float *r, const float *bias,
                                   const float *gamma, const float *beta, float eps, float *sum_out, float *out);

/* The same on a device, from host arrays: ref runs the function above, OpenCL runs cl/layernorm.cl alone
 * (its residual_layernorm kernel, the variant the arguments call for). row_cache: -1 = as the encoder
 * chooses (the row in local memory when it fits), 0 = re-read the row from global memory, 1 = local memory.
 * For the tests and the demo. */
clattn_status clattn_residual_layernorm_rows(clattn_device *dev, size_t rows, size_t E, const float *x,
                                             const float *r, const float *bias, const float *gamma,
                                             const float *beta, float eps, int row_cache, float *sum_out,
                                             float *out);

#endif
