/* runtime.h: the runtime layer (src/runtime/): OpenCL mechanics that know nothing of attention.
 * Errors, allocation, the device object and its capabilities, programs built from the embedded
 * kernels, kernel arguments and launches, the execution shell, CLBlast, and the numeric conventions
 * that the kernels and the CPU reference share. Every layer above includes it (docs/ARCHITECTURE.md). */
#ifndef CLATTN_RUNTIME_H
#define CLATTN_RUNTIME_H

#include "clattn.h"
#include <clblast_c.h>
#include <stdarg.h>
#include <stdio.h>

/* ---- errors (status.c) */
/* Record a detail message for clattn_last_error() and return `status`. */
clattn_status clattn_fail(clattn_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void clattn_clear_error(void);
void clattn_set_build_log(const char *log);
/* The thread's notice (clattn_last_notice): what the last plan created was asked for and does not do; "" clears it. */
void clattn_set_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

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

typedef struct clattn_view { cl_mem mem; size_t off; } clattn_view; /* a tensor: buffer + element offset */

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
/* *m NULL: a new buffer as clattn_buffer_new; else host's elements written into *m (blocking, after the work enqueued
 * before on the device's in-order queue), or nothing when host is NULL: one helper for the weights a plan uploads at
 * creation and writes again (clattn_plan_set_weights). */
clattn_status clattn_buffer_put(const struct clattn_device *dev, size_t elems, size_t elem_size, const void *host,
                                const char *what, cl_mem *m);
void clattn_mem_release(cl_mem *m); /* release and NULL (NULL is fine) */
size_t clattn_mem_bytes(cl_mem m);  /* CL_MEM_SIZE (0 for NULL) */
/* A caller's buffer (buffers.`what`) must hold `elems` elements of `size` bytes from element `offset`:
 * INVALID_ARGUMENT when m is NULL, its OpenCL code when m is not a buffer, SHAPE_MISMATCH when too small. */
clattn_status clattn_buffer_check(cl_mem m, size_t offset, size_t elems, size_t size, const char *what);
/* ---- the overlap rule (overlap.c): one rule for every call of the API, in its host-pointer and its buffer form.
 * An output may not share memory with an input or with another output: the kernels (and the reference) read
 * inputs while they write outputs, and outputs are written one after the other, so an overlap would give wrong
 * numbers without an error. Inputs may share memory with each other (x given as kv). */
typedef struct clattn_mem_range {
    const void *host;        /* host form: the array (NULL: not given) */
    cl_mem mem;              /* buffer form: the buffer (NULL: not given); sub-buffers are resolved to their parent */
    size_t off, bytes;       /* bytes [off, off + bytes) from host or of mem (bytes 0: nothing to check) */
    const char *owner, *what; /* named "owner.what" ("args.out") in errors; owner "" for a plain parameter */
    long index;              /* >= 0: `what` is an array of arrays and this is its entry ("outs[2]"); else -1 */
} clattn_mem_range;
/* An array of `elems` elements of `size` bytes: from host pointer `host` when buf is NULL, else buf's cl_mem from
 * element buf->offset (the masks' offsets count bytes: size 1). */
clattn_mem_range clattn_range(const char *owner, const char *what, const void *host, const clattn_buffer *buf,
                              size_t elems, size_t size);
/* Field `field` of a host-args struct `a` (when a is not NULL) or of a buffers struct `b`: the one list of an
 * entry point's arrays serves both of its forms, the fields having the same names in both structs. */
#define CLATTN_RANGE(owner, a, b, field, elems, size)                                                 \
    clattn_range(owner, #field, (a) ? (const void *)(a)->field : NULL, (a) ? NULL : &(b)->field, elems, \
                 size)
/* INVALID_ARGUMENT, naming both arrays, when an output shares memory with an input or with another output. */
clattn_status clattn_check_no_overlap(const clattn_mem_range *outs, int nout, const clattn_mem_range *ins, int nin);
/* size arithmetic that cannot wrap: *out = a * b, or 1 on overflow */
int clattn_mul_overflows(size_t a, size_t b, size_t *out);

/* ---- the device and its capabilities (caps.c fills them once, when the device opens) */
typedef enum clattn_device_class {
    CLATTN_CLASS_CPU = 0, CLATTN_CLASS_NVIDIA, CLATTN_CLASS_AMD, CLATTN_CLASS_INTEL, CLATTN_CLASS_OTHER,
    CLATTN_CLASS_COUNT
} clattn_device_class;
const char *clattn_device_class_name(clattn_device_class c); /* "cpu", "nvidia", ... */

#define CLATTN_BLAS_MAX_ELEMS ((size_t)0x7FFFFFFF) /* CLBlast 1.5 indexes its buffers with 32-bit ints */
#define CLATTN_MAX_LAUNCH_ITEMS ((size_t)1 << 30)  /* work-items of one 1-D launch (bigger: several, offset) */
#define CLATTN_MAX_SUBGROUP_SIZES 8

/* What the cores and the plans may ask of a device. The limits are the ones every plan computes within;
 * the tests lower them (the struct is internal) so that a few hundred tokens exercise every chunking path. */
typedef struct clattn_caps {
    cl_device_type type;        /* CL_DEVICE_TYPE */
    clattn_device_class dclass; /* CPU, or the GPU vendor: picks cores and their default parameters */
    char vendor[96];            /* CL_DEVICE_VENDOR */
    char driver[128];           /* CL_DRIVER_VERSION: part of the compiled-program cache's key */
    char cl_c_version[64];      /* CL_DEVICE_OPENCL_C_VERSION */
    unsigned compute_units;     /* CL_DEVICE_MAX_COMPUTE_UNITS */
    size_t local_mem;           /* CL_DEVICE_LOCAL_MEM_SIZE, bytes */
    size_t max_alloc;           /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    size_t global_mem;          /* CL_DEVICE_GLOBAL_MEM_SIZE */
    size_t max_work_group;      /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    size_t base_align;          /* CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes: sub-buffer origins */
    int fp16, fp64;             /* cl_khr_fp16, cl_khr_fp64 */
    int subgroups;              /* cl_khr_subgroups or cl_intel_subgroups: sub-group functions in kernels */
    /* the widths the device runs its SIMD groups at, 0-terminated: Intel's sub-group sizes, NVIDIA's warp,
     * AMD's wavefront (empty when the driver does not say) */
    unsigned subgroup_sizes[CLATTN_MAX_SUBGROUP_SIZES];
    unsigned vec_float, vec_half;       /* CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT / _HALF */
    unsigned native_vec_float;          /* CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT */
    int nv_inline_ptx;          /* the compiler takes NVIDIA inline PTX (asm): a tiny kernel built at open */
    unsigned nv_cc;             /* NVIDIA compute capability as major*10 + minor (cl_nv_device_attribute_query);
                                   0: not NVIDIA, or not reported */
    int nv_mma_tf32;            /* mma.sync m16n8k8 TF32 and m16n8k16 f16/bf16, their cvt and shfl.sync build here (compute
                                   capability 8.0 or newer and inline PTX; a probe kernel built at open) */
    /* What the driver does, measured by the device probes (probes.c) when the device opens, kept per device, driver
     * and clattn version in the kernel cache's directory. The facts no query reports: */
    size_t loop_limit;          /* the loop iterations (all loops together) one work-item completes before the driver
                                   ends its loops without an error (Mesa 22's llvmpipe: 65,535); 0: no limit seen
                                   below CLATTN_PROBE_LOOP_TRIPS. Every core keeps a work-item's trips below it. */
    int ieee_nan;               /* 0 * NaN, 0 * Inf, NaN + 1, Inf - Inf are NaN (0: the driver folds one away) */
    int profiling_ok;           /* event timestamps advance across a real kernel (0: fake, or no profiling queue) */
    size_t local_report;        /* the bytes CL_KERNEL_LOCAL_MEM_SIZE reports for a kernel declaring 4096 bytes of
                                   __local arrays (rusticl: 8192); clattn_core_check_local scales by it */
    char probe_note[300];       /* what the probes found wrong, in words ("" when nothing) */
    /* The last clattn_device_selftest's verdicts on this device and driver (tune/selftest.c), kept with the probes'
     * facts: the cores that computed a wrong number, " name name " ("" when none failed or none was run). AUTO
     * passes over them (select.c); CLATTN_CORE still forces one. */
    char selftest_failed[400];
    size_t blas_max_elems;      /* the largest element index one CLBlast call may touch in one buffer */
    int sibling_subbuffers;     /* CLBlast calls through sub-buffers made beside a caller's sub-buffer (runtime/blas.c,
                                   for operands past blas_max_elems) show their writes through it. 0 on NVIDIA's
                                   OpenCL (driver 580, H200, 2026-11-26): calls in row blocks lost the results of every
                                   block but the last (bench/gpu/subbuf_probe.c); such operands are refused there */
    size_t max_launch_items;    /* work-items of one enqueue of a 1-D kernel */
} clattn_caps;

struct clattn_tune_table;       /* the device's tuning file (device/tune_file.c) */

struct clattn_device {
    clattn_backend backend;
    char name[300];
    char notice[400];           /* why the default fell back to ref ("" = none) */
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    int queue_profiling;        /* the queue has CL_QUEUE_PROFILING_ENABLE */
    clattn_caps caps;           /* read once at open (caps.c); zero on ref */
    struct clattn_tune_table *tune;           /* the device's tuning file, read at open; NULL on ref */
    const struct clattn_tune_table *tune_try; /* clattn_tune's candidate while it searches (else NULL) */
    struct clattn_emit *emit;   /* clattn_device_emit: where its programs are written, and the simulated target */
};

/* Small queries (caps.c): a string property ("" when unknown), whether CL_DEVICE_EXTENSIONS names `name`,
 * and a case-insensitive substring test. */
void clattn_device_string(cl_device_id d, cl_device_info what, char *buf, size_t len);
int clattn_device_has_extension(cl_device_id d, const char *name);
int clattn_contains_ci(const char *hay, const char *needle);
/* Fill dev->caps and dev->name from dev->device (after the context and queue exist: the PTX probe builds
 * a kernel). Never fails: what a driver does not say stays 0. */
void clattn_caps_read(clattn_device *dev);
/* Can plans on dev report stage times? SUCCESS, or UNSUPPORTED with the reason: a queue without
 * CL_QUEUE_PROFILING_ENABLE, or timestamps the probes found not real (caps.profiling_ok). */
clattn_status clattn_profiling_check(const clattn_device *dev);
/* Run the device probes (probes.c, cl/runtime/probe_device.cl) or read their facts from the cache: fills caps'
 * loop_limit, ieee_nan, profiling_ok and probe_note. Never fails: a probe that cannot run leaves the facts of a
 * device without defects, and says so in probe_note. */
#define CLATTN_PROBE_LOOP_TRIPS ((size_t)1 << 20)
void clattn_probes_run(clattn_device *dev);
/* The self-test's verdicts (probes.c, beside the probes' facts): read at open into caps.selftest_failed (from the
 * cache's directory; nothing there: none), and kept there by clattn_device_selftest (failed: the cores that failed,
 * space-separated; "" none): 1 when written to the cache's directory, 0 when they hold for this device only (no
 * directory, or the write failed). clattn_caps_failed: did core `name` fail here? clattn_caps_fail: mark it so. */
void clattn_verdicts_load(clattn_device *dev);
int clattn_verdicts_store(clattn_device *dev, const char *failed);
int clattn_caps_failed(const clattn_caps *caps, const char *name);
void clattn_caps_fail(clattn_caps *caps, const char *name);
/* The loop trips a work-item may make on this device: caps' loop_limit less a margin, or SIZE_MAX without one. */
size_t clattn_loop_budget(const clattn_caps *caps);
/* The check for a kernel outside the cores (the projections' helpers, the encoder's LayerNorm) whose work-items make
 * up to `trips` loop iterations: SUCCESS within clattn_loop_budget, else TOO_LARGE_FOR_DEVICE with a sentence naming
 * `what` (the kernel and the sizes that set its trips), the bound and the device's limit. */
clattn_status clattn_loop_check(const clattn_caps *caps, size_t trips, const char *what);
/* Test-only: build the inline-PTX probe on any device (caps.c asks NVIDIA devices only): 1 if it built. */
int clattn_test_probe_ptx(const clattn_device *dev);
/* Test-only: build the tensor-core probe (cl/runtime/probe_mma.cl) on any device: 1 if it built. */
int clattn_test_probe_mma(const clattn_device *dev);

/* ---- CLBlast (blas.c): every call is serialised by one process-wide lock, because
 * CLBlast's first-use initialisation is not thread-safe. Row-major:
 * C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C; `what` names the GEMM in errors.
 * A GEMM too large for one CLBlast call (32-bit indices, its padded temporaries within one
 * allocation) is split into calls over row blocks (and batch groups), each addressing its
 * buffers through a sub-buffer when the element offset alone would exceed the limit. */
clattn_status clattn_blas_sgemm(const clattn_device *dev, CLBlastTranspose ta, CLBlastTranspose tb, size_t m,
                                size_t n, size_t k, float alpha, cl_mem a, size_t a_off, size_t lda, cl_mem b,
                                size_t b_off, size_t ldb, float beta, cl_mem c, size_t c_off, size_t ldc,
                                const char *what);
clattn_status clattn_blas_sgemm_strided_batched(const clattn_device *dev, CLBlastTranspose ta, CLBlastTranspose tb,
                                                size_t m, size_t n, size_t k, float alpha, cl_mem a, size_t a_off,
                                                size_t lda, size_t a_stride, cl_mem b, size_t b_off, size_t ldb,
                                                size_t b_stride, float beta, cl_mem c, size_t c_off, size_t ldc,
                                                size_t c_stride, size_t count, const char *what);
/* The most elements one operand (its extent past its offset) or padded temporary of one CLBlast call may span: an
 * operand that cannot be cut into row blocks (B) must fit it. */
size_t clattn_blas_call_limit(const clattn_caps *caps);
/* The lock every CLBlast call holds (blas.c). */
void clattn_blas_lock(void);
void clattn_blas_unlock(void);
/* CLBlast's own tuning parameters of its single-precision GEMM kernels (blas_params.c): the spaces its tuners
 * search (the indirect Xgemm with GEMMK = 0, and XgemmDirect), each parameter set in CLBlast's order. */
typedef enum clattn_blas_kernel { CLATTN_BLAS_XGEMM = 0, CLATTN_BLAS_XGEMM_DIRECT = 1 } clattn_blas_kernel;
#define CLATTN_BLAS_MAX_PARAMS 16
const char *clattn_blas_kernel_name(clattn_blas_kernel k); /* "Xgemm", "XgemmDirect" */
int clattn_blas_param_count(clattn_blas_kernel k);          /* 16, 10 */
/* CLBlast's generic defaults (its entries for devices it does not know). */
void clattn_blas_params_generic(clattn_blas_kernel k, size_t *v);
/* Every value in the space and the kernel's tile constraints met (and, caps given, the device's work-group size
 * and local memory): 1, else 0 and a sentence in why. */
int clattn_blas_params_valid(const clattn_caps *caps, clattn_blas_kernel k, const size_t *v, char *why, size_t len);
/* A valid set drawn at random (each value uniform, the invalid rejected), as CLBlast's tuner samples. */
void clattn_blas_params_random(const clattn_caps *caps, clattn_blas_kernel k, uint64_t *rng, size_t *v);
/* "GEMMK=0,KREG=1,..." (every parameter, CLBlast's order); parse takes them in any order, all of them, valid. */
void clattn_blas_params_format(clattn_blas_kernel k, const size_t *v, char *buf, size_t len);
int clattn_blas_params_parse(clattn_blas_kernel k, const char *text, size_t *v, char *why, size_t len);
/* Make v CLBlast's parameters for kernel k on this device, process-wide (every CLBlast call on the device, the
 * caller's own included), and clear CLBlast's compiled kernels. */
clattn_status clattn_blas_use_params(const clattn_device *dev, clattn_blas_kernel k, const size_t *v);
/* Test-only (not exported from the shared library): the largest element index that any CLBlast
 * call has touched in any buffer, counting CLBlast's padded temporaries, since the last reset;
 * reset = 1 returns it and starts again from 0. */
size_t clattn_test_blas_reach(int reset);

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
/* Other files of the same private directory (the device probes' facts, probes.c): the path of the entry for `key`
 * with `suffix` (0: no cache), opened for reading under the same trust rules (NULL: not there or not private), and
 * written atomically (0 on any failure; the cache is best effort). */
int clattn_cache_path(const char *key, const char *suffix, char *path, size_t len);
uint64_t clattn_hash_text(const char *text); /* the cache's hash (FNV-1a, 64 bits) of a string */
FILE *clattn_cache_open(const char *path);
int clattn_cache_write(const char *path, const void *data, size_t n);
/* path written whole or not at all (a private temporary file renamed into place): the parts in order; 0 on any
 * failure, with errno set. clattn_cache_write's, and clattn emit's. */
int clattn_write_parts(const char *path, const void *const *parts, const size_t *lens, int nparts);
/* Test-only: programs loaded from the cache and built from source since the last reset (reset = 1). */
void clattn_test_program_counts(int reset, long *loaded, long *built);
/* Called (when set) before the library compiles kernels from source (clattn_set_build_notice). */
void clattn_notify_build(const clattn_device *dev);

/* ---- programs (program.c): built from the kernels of cl/, embedded at build time. A source is named by
 * its path under cl/ without ".cl" ("common/philox", "cores/flash_rows"). */
/* Build a program from the embedded sources named, in order, with the given options. On failure returns
 * CLATTN_STATUS_BUILD_FAILURE (or an OpenCL code) and keeps the build log for clattn_last_build_log(). */
clattn_status clattn_program_build(const clattn_device *dev, const char *const *names, int count,
                                   const char *options, cl_program *program);
/* The same, quietly: NULL when the build fails, with no error or build log recorded (capability probes). */
cl_program clattn_program_try_build(const clattn_device *dev, const char *const *names, int count,
                                    const char *options);
/* The same, never through the compiled-program cache (the device probes: their facts are cached instead, and the
 * cache's entries stay the plans' programs). */
cl_program clattn_program_try_build_uncached(const clattn_device *dev, const char *const *names, int count,
                                             const char *options);
/* The same for a kernel that takes its work-group size as -DWG: builds `options` plus -DWG=*wg, with *wg
 * (a power of two) first lowered to the device's limit, then rebuilt smaller while the compiled kernel
 * `kernel` allows less (CL_KERNEL_WORK_GROUP_SIZE). On success *wg is the size built for. */
clattn_status clattn_program_build_wg(const clattn_device *dev, const char *const *names, int count,
                                      const char *options, const char *kernel, size_t *wg, cl_program *program,
                                      cl_kernel *k);
/* clCreateKernel with the failure named. */
clattn_status clattn_kernel_create(cl_program prog, const char *name, cl_kernel *k);
void clattn_kernel_release(cl_kernel *k);   /* release and NULL (NULL is fine) */
void clattn_program_release(cl_program *p); /* release and NULL (NULL is fine) */
/* Programs are shared within a context (program.c): the same sources and options built once per context and device,
 * each caller holding its own reference. clattn_program_forget drops the table's references for a context (a device
 * on it is being freed). Test-only: how many builds the table answered since the last reset. */
void clattn_program_forget(cl_context context);
long clattn_test_programs_shared(int reset);
/* ---- emitting (program.c, clattn_device_emit). From clattn_emit_start on, every program dev builds is also written
 * to dir: DIR/STEM.cl, the sources concatenated in the order the builder passes them, and DIR/STEM.opts, the options;
 * STEM is the basename of the last source (its main source), STEM-2, STEM-3... for other
 * programs of the same stem; DIR/index.txt has a line per file (its sources). The same sources and options are
 * written once. simulated: dev's caps are a target's (clattn_caps_simulate): the host compiles what it can of the
 * target's programs (program.c's host_options), the compiled kernels are not checked against the target's limits,
 * and nothing is launched (clattn_device_runs). dir NULL: stop writing (a simulated device stays simulated). */
clattn_status clattn_emit_start(clattn_device *dev, const char *dir, int simulated);
void clattn_emit_free(struct clattn_emit *emit);
int clattn_device_simulated(const clattn_device *dev);
/* SUCCESS, or UNSUPPORTED when dev simulates a target and `what` would launch work on it. */
clattn_status clattn_device_runs(const clattn_device *dev, const char *what);
/* A simulated target's caps on the host device's (caps.c): "sm_90" (an H100 SXM as NVIDIA's OpenCL reports it,
 * ../shared/gpu.md). INVALID_ARGUMENT naming the targets for another name. */
clattn_status clattn_caps_simulate(clattn_caps *caps, const char *target);
/* Test-only: build every program whose DIR/STEM.cl exists (STEM as above, the first of its stem) from that file and
 * DIR/STEM.opts instead of the embedded sources (NULL: stop). */
void clattn_test_program_dir(const char *dir);
size_t clattn_pow2_at_most(size_t n);       /* the largest power of two <= n (1 for n = 0) */

/* ---- launches (launch.c) */
/* Enqueue a 1-D kernel over `total` work-items (rounded up to the work-group size; kernels check the
 * bound), in launches of at most max_launch_items, each at its global offset. */
clattn_status clattn_enqueue_1d(const clattn_device *dev, cl_kernel k, size_t total, const char *what);
/* The same with one work-item per work-group: for kernels whose few long work-items should spread over
 * a CPU's cores (each work-group runs on one core). */
clattn_status clattn_enqueue_items(const clattn_device *dev, cl_kernel k, size_t total, const char *what);
/* Enqueue `groups` work-groups of `wg` work-items, in launches of at most max_launch_items work-items;
 * set_first(k, first group of the launch, ctx) sets the kernel's group-offset argument before each. */
clattn_status clattn_enqueue_groups(const clattn_device *dev, cl_kernel k, size_t groups, size_t wg,
                                    clattn_status (*set_first)(cl_kernel k, size_t first, void *ctx), void *ctx,
                                    const char *what);
/* Test-only: the most work-items any one kernel launch had since the last reset (reset = 1). */
size_t clattn_test_launch_reach(int reset);
void clattn_note_launch(size_t items);
/* Test-only: the most loop iterations a work-item of a kernel outside the cores (clattn_loop_check's) was launched to
 * make since the last reset; the launches note their bound. */
size_t clattn_test_trips_reach(int reset);
void clattn_note_trips(size_t trips);

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
void clattn_arg_view(clattn_args *a, clattn_view v); /* the buffer, then its element offset (ulong) */
void clattn_arg_local(clattn_args *a, size_t bytes); /* a __local array */
clattn_status clattn_args_end(const clattn_args *a);

/* ---- the OpenCL execution shell (exec.c), shared by every plan */
typedef clattn_status (*clattn_pass_fn)(void *ctx); /* enqueues a whole pass on the device queue */
typedef struct clattn_transfer {
    cl_mem buf;        /* NULL: skipped */
    size_t bytes;
    void *host;        /* read from (uploads) or written to (the output) */
    const char *what;  /* for errors: "x", "the output" */
} clattn_transfer;
/* From host arrays: the uploads (non-blocking, in order), the pass, clFinish (always, so the
 * caller's arrays are free on return), then the outputs' reads, last (an output with no buffer or no host
 * array is skipped): on any failure before them the caller's outputs are untouched. */
clattn_status clattn_exec_host(const clattn_device *dev, const clattn_transfer *in, int nin, clattn_pass_fn pass,
                               void *ctx, const clattn_transfer *out, int nout);
/* On the caller's buffers: a barrier on the wait list, the pass, and a completion event. */
clattn_status clattn_exec_buffers(const clattn_device *dev, cl_uint nwait, const cl_event *wait,
                                  clattn_pass_fn pass, void *ctx, cl_event *event);

/* Stage times of a profiled pass (exec.c; the attention shell's and the decode plan's): markers enqueued as the
 * pass goes, ev[0] at its start and ev[k] at the end of stage stage[k]; a stage's time is the sum over its markers
 * of the marker's end minus the end of the marker before it. */
#define CLATTN_MAX_MARKS 16
typedef struct clattn_marks {
    cl_event ev[CLATTN_MAX_MARKS];
    int stage[CLATTN_MAX_MARKS];
    int n;
} clattn_marks;
/* A marker at the end of `stage` (-1: the start of a pass, which drops the last pass's markers). */
clattn_status clattn_marks_put(clattn_marks *m, cl_command_queue q, int stage);
/* ms[0 .. nstages-1]: each stage's milliseconds in the last pass (all 0 when none was marked); waits for it. */
clattn_status clattn_marks_times(const clattn_marks *m, double *ms, int nstages);
void clattn_marks_release(clattn_marks *m);

/* ---- numeric conventions shared by the kernels and the CPU reference (numeric.c) */
/* IEEE half precision, round to nearest even (vstore_half_rte's rounding), in plain C. */
uint16_t clattn_float_to_half(float f);
float clattn_half_to_float(uint16_t h);
float clattn_round_half(float f); /* f rounded to the nearest half */
/* f rounded to a KV cache's element type (clattn_kv_type: 0 float, 1 half, 2 bfloat16), as the cache stores it. */
float clattn_round_kv(float f, int kv_type);
/* An INT8 KV cache's row (clattn.h, clattn_kv_type): x (n) into q (n) and the scale returned, as kv_append.cl
 * quantises it: s = max |x_c| * (1/127 as a float) (NaN when the row holds a NaN or an infinity, so that its values
 * read as NaN), q_c = the exact x_c / s rounded to nearest even (0 where s is 0 or NaN). */
float clattn_kv_quantize_row(const float *x, size_t n, int8_t *q);
/* `rows` rows of n floats each (contiguous) replaced by what a cache of kv_type holds: rounded element by element
 * (clattn_round_kv), or for INT8 quantised by row and read back as q_c * s. */
void clattn_kv_round_rows(float *x, size_t rows, size_t n, int kv_type);
/* bfloat16 (the upper 16 bits of a float), round to nearest even; NaN stays NaN. */
uint16_t clattn_float_to_bf16(float f);
float clattn_bf16_to_float(uint16_t b);
/* The element types of clattn_dtype: bytes of one element, the name ("f32", "f16", "bf16"), and n elements widened to
 * float (exact) or narrowed from float (round to nearest even, as the kernels' dtype_narrow). */
size_t clattn_dtype_size(clattn_dtype t);
const char *clattn_dtype_name(clattn_dtype t);
void clattn_dtype_widen(const void *src, size_t n, clattn_dtype t, float *dst);
void clattn_dtype_narrow(const float *src, size_t n, clattn_dtype t, void *dst);
/* Dropout: drop when the Philox word < threshold; kept weights are scaled by keep_scale. */
uint32_t clattn_dropout_threshold(float p);
float clattn_dropout_keep_scale(float p);

#endif
