/* core.h: the attention core interface (the cores layer, src/cores/; docs/ARCHITECTURE.md).
 *
 * A core is one kernel family behind one interface: the attention core of a plan,
 * softmax(Q K^T * scale + masks) V, from Q/K/V rows in device memory to the merged output rows, or the
 * matrix products around it, or its backward. Four kinds (registry.c lists the cores of each; `clattn cores`):
 *   prefill cores   run a whole attention plan's core (the flash family, flash.c, and the unfused core)
 *   decode cores    run a decode step against a KV cache (the decode family, decode_family.c)
 *   GEMM cores      run every GEMM a plan makes: the projections, the feed-forward layers, the unfused
 *                   core's batched score and context products
 *   backward cores  run a training plan's attention backward, dQ, dK, dV from the context's gradient
 * Each is one const clattn_core, listed in registry.c's table of its kind. A plan never names a core:
 * select.c (attention layer) picks one from the table, the tuning file and the environment, builds it with
 * its parameters, and runs it on buffer views. A core knows the device only through its capabilities and
 * the runtime layer's helpers; it never reads the environment or the tuning file. */
#ifndef CLATTN_CORE_H
#define CLATTN_CORE_H

#include "runtime/runtime.h"

#define CLATTN_CORE_MAX_PARAMS 8
#define CLATTN_DECODE_MAX_PARTS 64 /* split-K parts per decode query row */

/* Head-size classes, max(dk, dv) <= 32, 64, 128, 256 and above: the unit of defaults and tuning. */
#define CLATTN_HEAD_CLASSES 5
int clattn_head_class(size_t dk, size_t dv);
const char *clattn_head_class_name(int cls); /* "<=32", ..., ">256" */

/* One tuning parameter: its name (the -D macro its kernel takes, and the word of CLATTN_CORE=NAME:P=V and
 * of the tuning file), the values a plan may take (a file or the environment naming another is refused),
 * the values clattn_tune tries, and words for the values (NULL: they are written as numbers). */
typedef struct clattn_core_param {
    const char *name;
    const size_t *values;
    size_t nvalues;
    const size_t *tried;
    size_t ntried;
    const char *const *labels; /* labels[i] names values[i] */
} clattn_core_param;

/* Values of a core's parameters, in the order of its params[]. */
typedef struct clattn_core_params { size_t v[CLATTN_CORE_MAX_PARAMS]; } clattn_core_params;

/* ---- GEMM cores (kind CLATTN_CORE_GEMM, gemm.c): C = alpha * op(A) op(B) + beta * C, row-major, op(A) (m, k),
 * op(B) (k, n), C (m, n); or a strided batch of `count` such products. */
typedef struct clattn_gemm_call {
    size_t m, n, k;
    int trans_a;                 /* op(A) = A^T: A is stored (k, m) */
    int trans_b;                 /* op(B) = B^T: B is stored (n, k) (an nn.Linear weight) */
    float alpha, beta;           /* beta 0: C is only written, never read (it may hold NaN) */
    clattn_view a, b, c;         /* buffers and element offsets */
    size_t lda, ldb, ldc;        /* row strides of A, B, C as stored, in elements */
    size_t count;                /* products in the batch (>= 1) */
    size_t stride_a, stride_b, stride_c; /* elements from one product's operand to the next's */
    clattn_view bias;            /* (n) added to every row of C, for cores with adds_biases (mem NULL: none) */
    clattn_dtype type_a, type_b; /* the element types of A and B (F32, the default; F16 or BF16 for a core with
                                    reads_dtypes: a half plan's inputs and weights as they are, widened exactly on
                                    the way in); C, the bias, alpha and beta are fp32 */
    const char *what;            /* names the GEMM in errors ("QKV projection") */
} clattn_gemm_call;
/* A built GEMM core, as a plan's projections and its attention core use it. */
typedef struct clattn_gemm {
    const struct clattn_core *core;
    void *state;
} clattn_gemm;
/* Enqueue call on g's core (INVALID_ARGUMENT for a size of 0, a stride shorter than a row, a bias for a core
 * that does not add one: see adds_biases, or an F16 / BF16 operand for a core without reads_dtypes). */
clattn_status clattn_gemm_run(const clattn_gemm *g, const clattn_gemm_call *call);

/* How the plan's shell lays out what a prefill core reads and writes; fixed when the core is built.
 * Q, K and V are token-major rows with a row stride: head h of row t at column h*dk (Q, K) or h*dv (V) of
 * the view; the output goes to merged rows (B, Tq, H*dv). */
typedef struct clattn_core_layout {
    size_t q_ld, k_ld, v_ld, out_ld;
    int bias_q, bias_k, bias_v; /* biases left to the core to add (cores with adds_biases only) */
    const clattn_gemm *gemm;    /* the plan's GEMM core, for cores that compute GEMMs (unfused) */
    clattn_dtype io_dtype;      /* F16 / BF16: Q, K, V and the output are a half plan's own arrays in that type (no
                                   projections) for a core with reads_dtypes to read and write as they are; F32 (and
                                   for every other core): float */
} clattn_core_layout;

/* One execution of a prefill core. */
typedef struct clattn_core_io {
    clattn_view q, k, v, out;
    cl_mem b_q, b_k, b_v;        /* the biases the layout leaves to the core (else NULL) */
    clattn_view kpm, mask;       /* as the caller gave them (mem NULL: none) */
    clattn_view attn;            /* the weights (B, H, Tq, Tk) into a caller's buffer (mem NULL: none) */
    clattn_view lse;             /* training plans: each row's log-sum-exp (B, H, Tq) (mem NULL: not wanted) */
    float *attn_host;            /* or read to this host array, block by block (NULL: none) */
    uint64_t seed;               /* this execution's dropout seed (the plan's now: clattn_plan_set_seed), not the
                                    description's at build */
    size_t seq_q, seq_kv;        /* a varlen batch's sequence (clattn 0.8): a batch of one, of these lengths (at most
                                    the plan's), from q, k, v and out as given; 0: the plan's batch and lengths */
    size_t drop_b0;              /* the batch index dropout keys entry 0 by: a varlen sequence's index (its (h, i, j)
                                    are the padded batch entry's), else 0 */
    /* profiling: a marker at the end of a stage (NULL: profiling off) */
    clattn_status (*mark)(void *ctx, clattn_stage stage);
    void *mark_ctx;
} clattn_core_io;
clattn_status clattn_core_mark(const clattn_core_io *io, clattn_stage stage);
/* What a prefill or backward core computes in this execution: the plan's description d, or for a varlen batch's
 * sequence (the io's seq_q > 0) the same with batch 1 and the sequence's lengths. */
clattn_attention_desc clattn_core_shape(const clattn_attention_desc *d, size_t seq_q, size_t seq_kv);

/* One step of a decode core: query rows (B*n rows of q_ld, the layout's), the cache, and the merged
 * output rows (B*n, H*dv). */
typedef struct clattn_decode_io {
    clattn_view q, out;
    cl_mem cache_k, cache_v;     /* (B, HK, capacity, dk | dv), of the plan's kv_half type */
    cl_mem cache_ks, cache_vs;   /* (B, HK, capacity) an INT8 cache's row scales (NULL for the other types) */
    size_t capacity;             /* a paged cache's pool of pages */
    cl_mem pages;                /* a paged cache (the plan's kv_page_size P): its block tables (B, npage) uint, and
                                    the rows above are (HK, pool pages, P) (decode/decode.h); NULL: contiguous */
    size_t npage;
    cl_mem lens, valid;          /* (B) uint: tokens cached before this step, real new tokens of this step */
    cl_mem row0;                 /* (B) uint: sequence b's first row of q and out, b*n or a packed step's cu_new[b] */
    int packed;                  /* a packed step: only rows row0[b] + t < row0[b] + valid[b] exist (else a padded
                                    step's rows t >= valid[b] get a zero output) */
    cl_mem tree;                 /* (B, n, n) uchar: a verify step's draft tree (clattn_decode_args.tree_mask), or NULL */
    size_t n;                    /* new tokens per sequence at most (valid <= n) */
    size_t rows;                 /* rows of q and out: B*n, or a packed step's */
    size_t max_len;              /* the longest sequence after this step */
    size_t max_parts;            /* split-K parts: 0 = the core chooses, else at most this many */
    int warm;                    /* plan creation: every launch with no work, so that the driver compiles */
    int check_only;              /* choose and check the step's parts only (nothing enqueued): a step the device
                                    cannot run is refused before anything of it is */
    size_t parts;                /* out: the parts this step used */
    /* profiling: a marker at the end of a decode stage (NULL: profiling off) */
    clattn_status (*mark)(void *ctx, clattn_decode_stage stage);
    void *mark_ctx;
} clattn_decode_io;
clattn_status clattn_decode_mark(const clattn_decode_io *io, clattn_decode_stage stage);

/* One backward pass of a backward core (training plans): the forward's Q, K and V rows (the layout's q_ld, k_ld,
 * v_ld), its merged context and the context's gradient (B, Tq, H*dv) rows, each row's log-sum-exp (B, H, Tq), the
 * masks; out: dQ, dK, dV as rows laid out like Q, K and V, of row strides dq_ld and dkv_ld. */
typedef struct clattn_backward_io {
    clattn_view q, k, v;
    clattn_view ctx, dctx;
    size_t ctx_ld, dctx_ld;
    clattn_view lse;
    clattn_view kpm, mask;       /* as the caller gave them (mem NULL: none) */
    clattn_view dq, dk, dv;
    size_t dq_ld, dkv_ld;
    uint64_t seed;               /* the forward's dropout seed (the plan's now), as clattn_core_io's */
    size_t seq_q, seq_kv;        /* a varlen batch's sequence, as clattn_core_io's (0: the plan's shape); lse then
                                    holds the sequence's (H, seq_q) rows */
    size_t drop_b0;              /* as clattn_core_io's */
} clattn_backward_io;

typedef struct clattn_core clattn_core;

/* The description a core's functions get is the plan's, with one difference: its dtype is the type of the arrays the
 * core reads and writes, the layout's io_dtype (select.c's try_core): F16 or BF16 for a core with reads_dtypes on a
 * half plan without projections, F32 for every other (the shell converts for them). */

/* A GEMM core (kind CLATTN_CORE_GEMM) fills in run_gemm, not run; its supports, defaults, fits and build take
 * the plan's description (its head-size class selects the tuning file's entries; NULL: any plan) but compute
 * for whatever calls come, and build gets no layout (NULL). Its algorithm field is unused. */
struct clattn_core {
    const char *name;            /* what CLATTN_CORE, the tuning file and `clattn cores` call it */
    clattn_core_kind kind;       /* CLATTN_CORE_PREFILL, _DECODE, _GEMM or _BACKWARD */
    clattn_algorithm algorithm;  /* what its plans report: FUSED (no score matrix) or UNFUSED */
    int produces_weights;        /* can return the attention weights */
    int saves_row_stats;         /* writes each row's log-sum-exp (io->lse): it serves training plans */
    int adds_biases;             /* adds the Q/K/V biases itself (else the projections do); a GEMM core: adds a
                                    call's bias row to C as it stores it (else the caller fills C with it first) */
    int tf32;                    /* takes plans of precision TF32 (TF32 products); the others are refused */
    int reads_dtypes;            /* reads Q, K, V and writes its output in F16 and BF16 where the layout says
                                    (io_dtype): a half plan without projections then needs no conversions; for
                                    the others the shell widens and narrows at the plan's boundary. A GEMM core:
                                    reads A and B in F16 and BF16 where the call says (type_a, type_b), so a half
                                    plan's projections read its inputs and weights as they are */
    int uses_clblast;            /* a GEMM core that runs CLBlast's kernels: the tuning file's CLBlast parameters
                                    (the device's, set at open) are its tuning, and clattn_tune searches them */
    const clattn_core_param *params; /* its tuning space */
    int nparams;
    const char *const *test_configs; /* NULL-terminated "P=V,..." sets the test suite runs, each as a ctest
                                        entry of its own (NULL: one entry, the defaults) */
    const void *spec;            /* the family's own description (flash.c reads a clattn_flash_spec) */

    /* Can it compute d on a device with these capabilities? d NULL: any plan at all (the device alone).
     * CLATTN_STATUS_SUCCESS, or the status that says why not (UNSUPPORTED; TOO_LARGE_FOR_DEVICE for a size
     * limit) with a sentence in why. */
    clattn_status (*supports)(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                              char *why, size_t len);
    /* Does it run natively on this device? NULL: wherever it supports a plan. 0 with a sentence in why: here
     * it would run as an emulation (flash_mma without tensor cores), for tests: AUTO passes over it and the
     * public list reports it unsupported, while CLATTN_CORE still forces it. */
    int (*native)(const clattn_core *core, const clattn_caps *caps, char *why, size_t len);
    /* Its default parameters for d on this device class (0: none fit). */
    int (*defaults)(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p);
    /* Do parameters from a file or the environment fit d and the device? (NULL: any valid values do) */
    int (*fits)(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p);
    /* Bytes of local memory its kernel declares for d and parameters p, as its fits() counts them against the
     * device's (NULL: none). The family's build checks the compiled kernel's CL_KERNEL_LOCAL_MEM_SIZE against it
     * (clattn_core_check_local), so that the C side's tile geometry and the kernel's __local arrays cannot drift
     * apart unseen. */
    size_t (*local_bytes)(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                          const clattn_core_params *p);
    /* An upper bound on the loop iterations one work-item of its kernels makes for d with parameters p, every loop
     * counted whether or not a compiler unrolls it (NULL: no bound known). A driver may end a work-item's loops
     * early without an error (caps->loop_limit, probed at open: Mesa 22's llvmpipe ends them after 65,535 in all):
     * there, its defaults() keep the bound within clattn_loop_budget, select.c refuses parameters past it with
     * the sizes named (clattn_core_check_trips), and a core without a bound is refused. A GEMM core's bound holds
     * for every call (it cuts k into blocks); a decode core's counts the keys of one split-K part of the longest
     * part its plans run (decode_family.c chooses the parts so). */
    size_t (*trips)(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    const clattn_core_params *p);
    /* Floats of device memory it allocates for d (the plan's memory check; NULL: none). */
    size_t (*workspace)(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay);
    /* Build its kernels and workspace for d (kept in *state). CLATTN_STATUS_UNSUPPORTED: it does not fit
     * the device after all (the compiled kernel allows too few work-items, say). */
    clattn_status (*build)(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                           const clattn_core_layout *lay, const clattn_core_params *p, void **state);
    clattn_status (*run)(void *state, const clattn_core_io *io);          /* prefill: enqueue the core */
    clattn_status (*run_decode)(void *state, clattn_decode_io *io);       /* decode: enqueue one step */
    clattn_status (*run_gemm)(void *state, const clattn_gemm_call *call); /* GEMM: enqueue one call */
    clattn_status (*run_backward)(void *state, const clattn_backward_io *io); /* backward: enqueue one pass */
    size_t (*device_bytes)(const void *state);                            /* its buffers (NULL: none) */
    void (*release)(void *state);
};

/* On a device with a loop limit: lower parameter `param` of p through its smaller values (never to 0) until core's
 * trips fit clattn_loop_budget, or it is at its smallest (then clattn_core_check_trips refuses). The cores' defaults
 * call it; a device without the limit keeps p as it is. */
void clattn_core_fit_trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                           clattn_core_params *p, int param);
/* SUCCESS when core's work-items stay within the device's loop limit for d and p (or it has none), else
 * TOO_LARGE_FOR_DEVICE with a sentence naming the bound, the sizes and the limit in why. p NULL: the core alone (is
 * it bounded at all?). */
clattn_status clattn_core_check_trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                                      const clattn_core_params *p, char *why, size_t len);

/* ---- the registry (registry.c): every core, in one table per kind */
size_t clattn_core_total(void);                  /* cores of every kind */
const clattn_core *clattn_core_at(size_t i);     /* the i-th (prefill first), NULL past the end */
const clattn_core *clattn_core_find(const char *name);
/* The core that a variable of clattn 0.1-0.3 forces with this value (CLATTN_FLASH=rows|tiled,
 * CLATTN_ATTENTION=unfused, CLATTN_SOFTMAX=rows|item: the unfused core with that SOFTMAX), and in *params the
 * parameters it sets ("" for none); NULL when the value forces no core. */
const clattn_core *clattn_core_legacy(const char *var, const char *value, const char **params);
const char *clattn_core_kind_name(clattn_core_kind kind); /* "prefill", "decode", "gemm", "backward" */
/* AUTO's i-th choice of `kind` on this device class for head-size class cls (NULL past the last): the first that
 * supports a plan and builds serves it. */
const clattn_core *clattn_core_preferred(clattn_core_kind kind, clattn_device_class dclass, int cls, size_t i);

/* Parameters as text, "P=V,P=V" (every parameter of the core, in order; a label where it has one). */
void clattn_core_params_format(const clattn_core *core, const clattn_core_params *p, char *buf, size_t len);
/* Parse "P=V,..." (any order, any subset; values as numbers or labels, checked against the core's values)
 * over *p; 0 and a sentence in why on anything else. */
int clattn_core_params_parse(const clattn_core *core, const char *text, clattn_core_params *p, char *why,
                             size_t len);
int clattn_core_param_index(const clattn_core *core, const char *name); /* -1: no such parameter */
int clattn_core_param_valid(const clattn_core_param *param, size_t v);  /* one of its values? */

/* ---- helpers the cores share (core_args.c) */
/* Head sizes up to max_head (SUCCESS, or UNSUPPORTED naming the limit); with fit_defaults, also that the core's
 * defaults exist for d on this device (the smallest head when d is NULL: a work-group core's tiles must fit the
 * local memory and the work-group limit). The supports of the flash and decode families. */
clattn_status clattn_core_supports_heads(const clattn_core *core, const clattn_caps *caps,
                                         const clattn_attention_desc *d, size_t max_head, int fit_defaults, char *why,
                                         size_t len);
/* The split-K merge of the flash and decode families (cl/common/combine.cl, split_combine; src/attention/merge.c is
 * its host twin): rows*heads*dv output elements from `parts` parts, part p of row r having left its unnormalised
 * output at acc + r*a_row + p*a_part + h*a_head and its max and sum at st + r*s_row + p*s_part + h*s_head (+1), the
 * max in base 2 (base2) or natural units. valid: (B) real rows per sequence of n (NULL: all real); lse (mem NULL:
 * none) each row's log-sum-exp at (b*H + h)*n + t. */
typedef struct clattn_split_combine {
    clattn_view acc;
    size_t a_row, a_part, a_head;
    clattn_view st;
    size_t s_row, s_part, s_head;
    size_t parts, rows, heads, dv, n;
    int base2;
    cl_mem valid;
    clattn_view out;
    size_t out_ld;
    clattn_view lse;
} clattn_split_combine;
/* Enqueue split_combine (k, from a program with common/combine) for c; rows 0: launched with no work. */
clattn_status clattn_core_combine(const clattn_device *dev, cl_kernel k, const clattn_split_combine *c);
/* What a kernel may use beyond its declared local arrays (the implementation's own): fits() keeps this much of the
 * device's local memory free, and the check below allows it. */
#define CLATTN_LOCAL_SLACK 256
/* The compiled kernel k of core for d and p uses no more local memory (CL_KERNEL_LOCAL_MEM_SIZE) than the core's
 * local_bytes counts, plus CLATTN_LOCAL_SLACK; else BUILD_FAILURE naming both numbers. */
clattn_status clattn_core_check_local(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                                      const clattn_core_params *p, cl_kernel k);
/* The mask arguments every attention kernel takes (common/mask.cl): key padding mask and offset,
 * attention mask and offset, then Tq, Tk and H. */
void clattn_core_arg_masks(clattn_args *a, clattn_view kpm, clattn_view mask, const clattn_attention_desc *d);
/* The five dropout arguments every attention kernel ends with: seed (low, high word: the execution's, from its io),
 * the drop threshold and the keep scale (runtime/numeric.c), and b0, the batch index that keys the execution's entry 0
 * (its io's drop_b0). */
void clattn_core_arg_dropout(clattn_args *a, const clattn_attention_desc *d, uint64_t seed, size_t b0);
/* A row-major tensor: (buffer, element offset, row stride), the kernels' (p, p_off, p_ld). */
void clattn_core_arg_rows(clattn_args *a, clattn_view t, size_t ld);
/* The arguments of a backward core's pass (cl/cores/backward_common.cl, BWD_ARGS): Q, K, V and dctx rows, lse, D
 * (dd), the masks, the scale, extent, dropout; then the pass's gradients' rows: dQ (pass 0) or dK and dV (pass 1). */
void clattn_core_arg_backward(clattn_args *a, const clattn_backward_io *io, const clattn_core_layout *lay, cl_mem dd,
                              const clattn_attention_desc *d, uint64_t extent, int pass);
/* The backward cores' first pass: D = rowsum(dctx * ctx) into dd (B, H, Tq) with backward_common.cl's bwd_dot, k. */
clattn_status clattn_core_backward_dot(const clattn_device *dev, cl_kernel k, const clattn_backward_io *io, cl_mem dd,
                                       const clattn_attention_desc *d);
/* The -D options of an attention kernel, the one list every core builds from ("-cl-std=CL1.2" first); `what`
 * names the groups its kernels read:
 *   CLATTN_DEFINES_SHAPE   DK, DV, GROUP (query heads per key/value head), WINDOW, KV_HALF (the plan's kv_half)
 *   CLATTN_DEFINES_MASKS   CAUSAL, WINDOW, KPM, MASK_KIND (and MASK_PB, MASK_PH when either is 1)
 *   CLATTN_DEFINES_TRAIN   DROPOUT, LSE
 *   CLATTN_DEFINES_TF32    TF32 (the plan's precision)
 * Writes opts; returns the length written (or more, when it does not fit: snprintf's). */
enum {
    CLATTN_DEFINES_SHAPE = 1,
    CLATTN_DEFINES_MASKS = 2,
    CLATTN_DEFINES_TRAIN = 4,
    CLATTN_DEFINES_TF32 = 8,
    CLATTN_DEFINES_ALL = 15
};
int clattn_core_attention_defines(const clattn_attention_desc *d, unsigned what, char *opts, size_t len);
/* " -DNAME=V" for each of a core's tuning parameters p, in the order of its params[], appended at opts[0..len):
 * the parameter `rows` (-1: none) takes the value `rows_value` instead (a variant's rows). Returns the length
 * written (or more, as snprintf). */
int clattn_core_param_defines(const clattn_core *core, const clattn_core_params *p, int rows, size_t rows_value,
                              char *opts, size_t len);
/* The vector width along the head dimension that divides both head sizes: 8, 4 or 1. */
size_t clattn_core_head_vector(size_t dk, size_t dv);
/* Query rows a work-item keeps in registers (flash_rows, decode_attend): 16, or 8 for value heads above
 * 128, whose accumulators would not stay in registers (PoCL measurements, bench/results/pocl-2core.md). */
size_t clattn_core_register_rows(size_t dv);
/* The loop iterations of one work-item of a row-blocked kernel (flash_rows.cl, decode_attend.cl: `rows` query rows
 * in registers, head vectors nk and nv of a key and a value, blocks of bk keys) over `keys` keys, every loop counted
 * whether or not a compiler unrolls it: per key, the dot products (1 + 3 rows + nk (1 + rows)), the block max and exp
 * (2 rows), the value pass (rows (1 + 2 nv)) and extra_per_key (flash_rows' dropout draws); per block, the
 * corrections; before and after, the rows' loads and stores. */
size_t clattn_core_rows_trips(size_t rows, size_t nk, size_t nv, size_t keys, size_t bk, size_t extra_per_key);

/* ---- the flash family (flash.c): fused kernels with one signature, each one .cl file and one entry.
 * The kernel reads Q, K, V rows and writes merged rows (cores/flash_common.cl); a spec says how it is
 * launched: one work-item per `rows` query rows (PER_ITEM), or one work-group of `group` work-items per
 * `rows` query rows (PER_GROUP, the kernel's reqd_work_group_size). */
typedef enum clattn_flash_launch { CLATTN_FLASH_PER_ITEM = 0, CLATTN_FLASH_PER_GROUP = 1 } clattn_flash_launch;
typedef struct clattn_flash_spec {
    const char *source;          /* its file under cl/, built after the common sources */
    const char *kernel;          /* its kernel's name */
    clattn_flash_launch launch;
    size_t (*rows)(const clattn_core_params *p);  /* query rows per work-item or per work-group */
    size_t (*group)(const clattn_core_params *p); /* PER_GROUP: work-items per work-group */
    int shrink;                  /* PER_GROUP: the parameter halved while the compiled kernel takes fewer
                                    work-items than `group` (-1: none) */
    int split;                   /* PER_GROUP: the parameter (SPLIT) that splits each block's keys into parts,
                                    merged by split_combine (common/combine.cl); halved while the parts' workspace
                                    exceeds one allocation (-1: none; every spec says) */
    /* -D options of its own that depend on the device or the plan, not on its tuning parameters (NULL: none);
     * appends to opts, returns the length written */
    int (*defines)(const clattn_caps *caps, const clattn_attention_desc *d, char *opts, size_t len);
    /* A kernel built with -DALIGNED=1 may read K and V rows as aligned vectors: the element multiple their offsets
     * and row strides need for it (0: never; NULL: the member has no ALIGNED). The plan's kernel is that one when
     * the layout's strides are multiples; a call whose K or V offset is not takes the ALIGNED=0 kernel, built then. */
    size_t (*aligned)(const clattn_attention_desc *d);
} clattn_flash_spec;
clattn_status clattn_flash_build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                                 const clattn_core_layout *lay, const clattn_core_params *p, void **state);
clattn_status clattn_flash_run(void *state, const clattn_core_io *io);
void clattn_flash_release(void *state);
size_t clattn_flash_device_bytes(const void *state);
/* Floats of the split parts' workspace for d with `parts` parts (0 when parts <= 1). */
size_t clattn_flash_split_floats(const clattn_attention_desc *d, size_t parts);
/* A PER_GROUP member's default SPLIT for blocks of `rows` query rows and tiles of `bk` keys: on a GPU, the
 * keys split (2, 4, 8 parts) while the blocks are too few for 4 work-groups per compute unit (long keys,
 * few rows: a small batch), each part keeps at least 8 tiles and the parts' workspace one allocation; a CPU
 * has work enough with one work-group per compute unit (1). */
size_t clattn_flash_split_default(const clattn_caps *caps, const clattn_attention_desc *d, size_t rows, size_t bk);
#define CLATTN_FLASH_MAX_HEAD 256 /* dk and dv the flash kernels take */
clattn_status clattn_flash_supports(const clattn_core *core, const clattn_caps *caps,
                                    const clattn_attention_desc *d, char *why, size_t len);
/* The same, and the member's defaults exist for d on this device (for the smallest head when d is NULL):
 * the work-group members, whose tiles must fit the local memory and the work-group limit. */
clattn_status clattn_flash_supports_tiles(const clattn_core *core, const clattn_caps *caps,
                                          const clattn_attention_desc *d, char *why, size_t len);

/* ---- the decode family (decode_family.c): decode cores with one kernel signature (cores/decode_common.cl), each
 * one .cl file and a spec; the family builds them, sets their arguments, chooses a step's split-K parts,
 * merges the parts (split_combine, common/combine.cl, as the flash family's) and releases them. Kernel arguments:
 *   q, q_off, q_ld, kc, vc, lens, valid, out, out_off, out_ld, part_ml, part_acc, n, H, HK, Tmax, parts, scale,
 *   then PER_ITEM: total (work-items in all); PER_GROUP: first (the launch's first group), groups (in all).
 * Two variants are built at plan creation: the rows of one token's group of query heads, min(GROUP, R), and R
 * rows (steps of several new tokens), R being the member's `rows` parameter (its kernel's -DR). */
typedef struct clattn_decode_spec {
    const char *const *sources;  /* under cl/, in order (cores/decode_common before the member's own) */
    int nsources;
    const char *kernel;
    clattn_flash_launch launch;  /* PER_ITEM: a work-item per block of rows and part; PER_GROUP: a work-group */
    int rows;                    /* the parameter of query rows per work-item or work-group (R) */
    int group;                   /* PER_GROUP: the parameter of work-items per work-group (WG); -1: none */
    const char *defines;         /* -D options of its own beyond its parameters (NULL: none) */
    /* -D options that depend on the device (NULL: none): written to opts (len bytes), their length returned */
    int (*device_defines)(const clattn_caps *caps, char *opts, size_t len);
    /* split-K: units (work-items or groups) wanted per compute unit on a CPU and on a GPU, and the fewest keys of
     * the longest sequence a part takes, for parameters p on this device class */
    size_t per_cu_cpu, per_cu_gpu;
    size_t (*min_keys)(int cpu, const clattn_core_params *p);
    /* The loop iterations of one work-item (of any work-group) whose block of p's R rows runs over a part of `keys`
     * keys, every loop counted (core.h's trips) */
    size_t (*part_trips)(const clattn_attention_desc *d, const clattn_core_params *p, size_t keys);
} clattn_decode_spec;
#define CLATTN_DECODE_MAX_HEAD 256 /* dk and dv the decode kernels take */
/* Head sizes up to CLATTN_DECODE_MAX_HEAD, and the member's defaults exist for d (the smallest head when NULL). */
clattn_status clattn_decode_supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                                     char *why, size_t len);
size_t clattn_decode_workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                               const clattn_core_layout *lay); /* the split-K buffers' floats */
clattn_status clattn_decode_build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                                  const clattn_core_layout *lay, const clattn_core_params *p, void **state);
clattn_status clattn_decode_run(void *state, clattn_decode_io *io);
/* The decode family's trips (core.h): the member's part_trips over a part of CLATTN_DECODE_PLAN_KEYS keys. A step
 * cuts the keys into parts short enough for the device's loop limit (more parts, CLATTN_DECODE_MAX_PARTS at most),
 * and is refused when even those are too long. */
#define CLATTN_DECODE_PLAN_KEYS 256
size_t clattn_decode_trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                           const clattn_core_params *p);
size_t clattn_decode_device_bytes(const void *state);
void clattn_decode_release(void *state);

#endif
