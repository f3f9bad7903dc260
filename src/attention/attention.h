/* attention.h: the attention layer (src/attention/): the plan (plan.c), its two backends (ref.c, the CPU
 * reference; shell.c, the OpenCL shell around a core), the choice of a core (select.c) and the helpers
 * that the decode and encoder plans share with it (linear.c). docs/ARCHITECTURE.md draws the layers. */
#ifndef CLATTN_ATTENTION_H
#define CLATTN_ATTENTION_H

#include "device/device.h"

#include <pthread.h>

#define CLATTN_NSTAGES (CLATTN_STAGE_ATTENTION + 1) /* every stage this version knows */

/* ---- choosing and building a core (select.c) */
typedef struct clattn_core_instance {
    const clattn_core *core;
    void *state;
    clattn_core_params params; /* the parameters it was built with */
    int tuned;                 /* the device's tuning file chose the core or its parameters */
} clattn_core_instance;

/* Pick the core of `kind` for the resolved description d on dev, and build it for the layout: the
 * environment's CLATTN_CORE first (for a plan that can use that core; refused with the core's reason when
 * it cannot serve d), else the tuning file's AUTO entry for d's head-size class, else the registry's order
 * of preference; the parameters from CLATTN_CORE, else the tuning file, else the core's defaults.
 * d->algorithm (FUSED or UNFUSED) and d->need_weights limit the choice. `other_floats`: the plan's own
 * device memory, checked with the core's workspace against the device's global memory before anything is
 * built. */
clattn_status clattn_core_create(const clattn_device *dev, clattn_core_kind kind, const clattn_attention_desc *d,
                                 const clattn_core_layout *lay, size_t other_floats, clattn_core_instance *out);
void clattn_core_destroy(clattn_core_instance *inst);
/* The notice of a plan just created (clattn_last_notice): when CLATTN_CORE is set but names none of the cores the
 * plan runs (ran: their names, n of them, NULL entries skipped), or the device is ref, it says so; else it is cleared. */
void clattn_core_env_note(const clattn_device *dev, const char *const *ran, int n);

/* ---- the plan (plan.c) */
struct clattn_backend_ops;

struct clattn_plan {
    clattn_device *device;
    const struct clattn_backend_ops *ops; /* the device's backend: ref or OpenCL */
    clattn_attention_desc d;     /* every default resolved; on OpenCL d.algorithm is the core's */
    int has_qkv;                 /* Q/K/V projections present */
    int has_out;                 /* output projection present */
    size_t out_width;            /* Eo or H*dv */
    int host_staging;            /* OpenCL: staging buffers for execution from host arrays */
    /* host copies, normalised to LINEAR layout [out, in]; NULL when absent */
    float *w_query, *w_key, *w_value, *b_query, *b_key, *b_value, *w_out, *b_out;
    float *sinks;                /* desc.sinks: each query head's sink logit (H), widened to float; else NULL */
    int profiling;
    int tuned;                   /* it uses entries of the device's tuning file */
    double stage_ms[CLATTN_NSTAGES];
    pthread_mutex_t lock;        /* one call at a time per plan (clattn.h, "threads") */
    const clattn_core *core;     /* the core it runs (NULL on ref) */
    clattn_core_params core_params; /* the parameters it was built with */
    char core_params_text[128];  /* the same as text ("" on ref) */
    const clattn_core *backward_core;           /* a training plan's backward core (NULL: none, or on ref) */
    clattn_core_params backward_core_params;    /* the parameters it was built with */
    char backward_core_params_text[128];        /* the same as text */
    const char *gemm;            /* its GEMM core's name ("ref" on ref) */
    char gemm_params_text[128];  /* that core's parameters as text ("" on ref, or when it has none) */
    void *backend_state;         /* the backend's own (shell.c), NULL on ref */
    float *rope_cs;              /* desc.rope: (cos, sin) of each position below rope_positions and pair (rope.c);
                                    NULL without rotary embeddings */
    size_t rope_positions;       /* max(Tq, Tk), or more once a decode step needed more (clattn_rope_reserve) */
    size_t drop_b0;              /* ref: the batch index dropout keys entry 0 by; a varlen sequence's sub-plan (ref.c,
                                    backward_ref.c) sets its index (its (h, i, j) are the padded entry's), else 0 */
};

/* The seam between a plan and its device: one table per backend, chosen once at plan creation. */
typedef struct clattn_backend_ops {
    const char *name;
    /* device state (buffers, the core) for a validated plan; NULL: none needed */
    clattn_status (*init)(struct clattn_plan *p);
    void (*release)(struct clattn_plan *p);
    int (*produces_weights)(const struct clattn_plan *p); /* can an execution return the weights? */
    clattn_status (*execute_host)(struct clattn_plan *p, const clattn_attention_args *a);
    /* NULL: the backend has no device buffers (ref) */
    clattn_status (*execute_buffers)(struct clattn_plan *p, const clattn_attention_buffers *b, cl_uint nwait,
                                     const cl_event *wait, cl_event *event);
    clattn_status (*stage_times)(struct clattn_plan *p, double ms[CLATTN_NSTAGES]);
    size_t (*device_bytes)(const struct clattn_plan *p); /* NULL: none */
    /* the backward pass of a training plan (backward.c validated the call); NULL: the backend has none */
    clattn_status (*backward_host)(struct clattn_plan *p, const clattn_attention_args *a,
                                   const clattn_attention_grads *g);
    /* the same on device buffers (backward.c validated the call); NULL: the backend has no device buffers */
    clattn_status (*backward_buffers)(struct clattn_plan *p, const clattn_attention_buffers *b,
                                      const clattn_attention_grad_buffers *g, cl_uint nwait, const cl_event *wait,
                                      cl_event *event);
    /* the plan's host weights (clattn_plan_set_weights replaced them) into its device state; NULL: the backend reads
     * the host copies (ref) */
    clattn_status (*set_weights)(struct clattn_plan *p);
} clattn_backend_ops;

extern const clattn_backend_ops clattn_backend_ref;    /* ref.c */
extern const clattn_backend_ops clattn_backend_opencl; /* shell.c */
/* The backend of a device (the table of backends, plan.c): decode and encoder plans choose theirs the same way. */
const clattn_backend_ops *clattn_backend_of(const clattn_device *dev);
/* The checks every execute_buffers entry point makes first: plan and buffers given, a backend with device
 * buffers (on_buffers), a wait list whose count and pointer agree. */
clattn_status clattn_buffers_call_check(const void *plan, const void *buffers, int on_buffers, const clattn_device *dev,
                                        cl_uint nwait, const cl_event *wait);

/* Validate the description and copy the weights (normalised to LINEAR): a plan with every field resolved
 * and no backend state yet. plan_create chooses the backend after it; decode plans keep it as their
 * description and weights. */
clattn_status clattn_plan_prepare(clattn_device *device, const clattn_attention_desc *desc,
                                  const clattn_attention_weights *weights, int host_staging, clattn_plan **plan);
/* A plan as clattn_plan_create makes it, but on OpenCL without the staging buffers that execution from
 * host arrays needs: for owners that only run it on device buffers (the encoder layer). */
clattn_status clattn_plan_create_device_resident(clattn_device *device, const clattn_attention_desc *desc,
                                                 const clattn_attention_weights *weights, clattn_plan **plan);
/* An array given with its element count: CLATTN_STATUS_SUCCESS when the count is `want` (or the array is
 * absent with count 0); else the refusal (SHAPE_MISMATCH, or INVALID_ARGUMENT for a count without an
 * array), naming owner.name, both numbers and `how` the wanted one comes from the description. */
clattn_status clattn_count_check(const char *owner, const char *name, const void *p, size_t count, size_t want,
                                 const char *how);
/* The counts of the eight weight-shaped arrays (w_query, w_key, w_value, b_query, b_key, b_value, w_out, b_out, in
 * that order) against the resolved description d, as clattn_count_check: "owner.<prefix><name>" in messages. */
clattn_status clattn_weight_counts_check(const clattn_attention_desc *d, const char *owner, const char *prefix,
                                         const void *const arrays[8], const size_t counts[8]);
/* args' inputs against the plan (x, kv, the masks: given as the description declares, with their counts); the
 * outputs are the caller's to check (execution, backward). */
clattn_status clattn_plan_check_inputs(const struct clattn_plan *plan, const clattn_attention_args *args);
#define CLATTN_PLAN_INPUTS 5
/* The inputs x, kv, key_padding_mask, attn_mask and value for the overlap rule (runtime.h), from host args (a) or buffers
 * (b): the forward and the backward check their outputs against them. */
void clattn_plan_input_ranges(const struct clattn_plan *p, const clattn_attention_args *a,
                              const clattn_attention_buffers *b, clattn_mem_range ins[CLATTN_PLAN_INPUTS]);
/* Elements of the attention mask ((B,) (H,) Tq, Tk: desc.attn_mask_per_batch, _per_head; 0 without one) and of
 * the value input (B, Tk, HK*dv; 0 without separate_value) of the resolved description d. */
static inline size_t clattn_plan_mask_elems(const clattn_attention_desc *d)
{
    if (d->attn_mask == CLATTN_MASK_NONE) return 0;
    return (d->attn_mask_per_batch ? d->batch : 1) * (d->attn_mask_per_head ? d->heads : 1) * d->seq_q * d->seq_kv;
}
static inline size_t clattn_plan_value_elems(const clattn_attention_desc *d)
{
    return d->separate_value ? d->batch * d->seq_kv * d->kv_heads * d->head_dim_v : 0;
}
/* An execution's rows of x and out (q) and of kv and value (k): the padded batch's B*Tq and B*Tk, or with desc.varlen
 * the packed totals of its offsets (cu_q, cu_k: B+1 each; self-attention cu_k = cu_q; NULL without varlen). */
typedef struct clattn_rows {
    size_t q, k;
    const uint32_t *cu_q, *cu_k;
    const uint32_t *pos_q, *pos_k; /* rope: each row's position given (args.rope_positions; the keys' are
                                      rope_positions_kv, or in self-attention the queries'), or NULL */
} clattn_rows;
/* The rows of an execution with these offsets (args' or buffers', "owner" in messages), checked: given only with
 * desc.varlen and then required, B+1 of them, from 0, non-decreasing, no sequence past seq_q (seq_kv); self-attention
 * takes no cu_k other than cu_q. r NULL: the checks alone. */
clattn_status clattn_plan_rows(const struct clattn_plan *p, const uint32_t *cu_q, size_t nq, const uint32_t *cu_k,
                               size_t nk, const char *owner, clattn_rows *r);
/* One offsets array (owner.name, n entries): B+1 of them from 0, never decreasing, no sequence of more than max rows
 * (max_name and max_why name max in the message). */
clattn_status clattn_offsets_check(const char *owner, const char *name, const uint32_t *cu, size_t n, size_t B,
                                  size_t max, const char *max_name, const char *max_why);
/* The same for rows already checked (the backends': the execution's entry point checked them; here, below the
 * backends, which plan.c's table of them names). */
static inline clattn_rows clattn_plan_rows_of(const struct clattn_plan *p, const uint32_t *cu_q, const uint32_t *cu_k)
{
    const clattn_attention_desc *d = &p->d;
    if (!d->varlen || !cu_q) return (clattn_rows){d->batch * d->seq_q, d->batch * d->seq_kv, NULL, NULL, NULL, NULL};
    if (!d->cross) cu_k = cu_q;
    return (clattn_rows){cu_q[d->batch], cu_k ? cu_k[d->batch] : 0, cu_q, cu_k, NULL, NULL};
}
/* The largest position given + 1 (0: none given): what the table of cos and sin must hold for them. */
static inline size_t clattn_positions_most(const uint32_t *pq, size_t nq, const uint32_t *pk, size_t nk)
{
    size_t most = 0;
    for (size_t i = 0; pq && i < nq; i++) most = pq[i] >= most ? (size_t)pq[i] + 1 : most;
    for (size_t i = 0; pk && i < nk; i++) most = pk[i] >= most ? (size_t)pk[i] + 1 : most;
    return most;
}
/* The same rows with the rope positions given (rope_positions and rope_positions_kv; checked). */
static inline clattn_rows clattn_rows_positioned(clattn_rows r, const clattn_attention_desc *d, const uint32_t *pq,
                                                 const uint32_t *pkv)
{
    r.pos_q = pq, r.pos_k = d->cross ? pkv : pq;
    return r;
}
/* Each of pos[0 .. n-1] (pos NULL: none) at most CLATTN_ROPE_MAX_POSITION, else INVALID_ARGUMENT naming owner.name[i]
 * and `what` may be given it ("a row", "a token"). */
clattn_status clattn_positions_max_check(const uint32_t *pos, size_t n, const char *owner, const char *name,
                                        const char *what);
/* rope_positions and rope_positions_kv (owner's: "args" or "buffers") against the plan and the execution's rows r:
 * given only with rope, _kv only with cross-attention and then with the queries', the counts, each position at most
 * CLATTN_ROPE_MAX_POSITION. */
clattn_status clattn_plan_positions_check(const struct clattn_plan *p, const uint32_t *pq, size_t nq,
                                         const uint32_t *pk, size_t nk, const clattn_rows *r, const char *owner);
/* The plan's table of cos and sin grown to the largest position given (checked), under the plan's lock. */
clattn_status clattn_plan_positions_reserve(struct clattn_plan *p, const uint32_t *pq, const uint32_t *pk,
                                            const clattn_rows *r);
/* The value input's elements for these rows (0 without separate_value). */
static inline size_t clattn_rows_value_elems(const clattn_attention_desc *d, const clattn_rows *r)
{
    return d->separate_value ? r->k * d->kv_heads * d->head_dim_v : 0;
}
/* buffers declares what the plan has: no kv for self-attention, no mask the plan was made without, lse and context
 * only on a training plan. */
clattn_status clattn_plan_check_buffers_declared(const struct clattn_plan *plan, const clattn_attention_buffers *b);
/* New LINEAR [out, in] copy of a (rows_out, cols_in) weight given in `layout`; NULL if out of memory. */
float *clattn_weight_copy(const float *src, size_t rows_out, size_t cols_in, clattn_layout layout);
float *clattn_vector_copy(const float *src, size_t n);

/* ---- rotary position embeddings (rope.c) */
/* desc.rope checked and its defaults resolved (dims, theta, factor), for the resolved head_dim_qk. */
clattn_status clattn_rope_resolve(clattn_attention_desc *d);
/* The table of positions 0 .. positions-1: (positions, r/2, 2) floats, (cos, sin) of each pair's angle times YaRN's
 * factor, computed in double; NULL when out of memory. */
float *clattn_rope_table(const clattn_rope *r, size_t positions);
/* Rotate `heads` heads of head_dim values (the first r) in each of `rows` rows of stride ld, row t at position
 * t % period, or pos[t] when pos is given (args.rope_positions): the forward, in place (ref device); and the
 * gradient's rotation back (the transpose) on doubles. */
void clattn_rope_rotate(const clattn_rope *r, const float *cs, float *x, size_t rows, size_t ld, size_t period,
                        const uint32_t *pos, size_t heads, size_t head_dim);
/* The keys' positions given (args.rope_positions_kv, or in self-attention the queries' rope_positions), or NULL. */
static inline const uint32_t *clattn_rope_key_positions(const clattn_attention_desc *d, const clattn_attention_args *a)
{
    return d->cross ? a->rope_positions_kv : a->rope_positions;
}
/* One row (heads heads of head_dim values) at position pos. */
void clattn_rope_rotate_row(const clattn_rope *r, const float *cs, float *x, size_t pos, size_t heads,
                            size_t head_dim);
/* The plan's table grown to hold positions 0 .. positions-1 at least (to a power of two: a decode session's growing
 * lengths, but no more than max(positions, limit) when limit is not 0: a cache's capacity); nothing when it holds
 * them already or without rope. */
clattn_status clattn_rope_reserve(struct clattn_plan *p, size_t positions, size_t limit);
/* An OpenCL backend's copy of the plan's table (*cs, holding *held positions) made anew when the plan's holds more
 * (the old one released: OpenCL frees it once the work enqueued with it is done). */
clattn_status clattn_rope_device_table(const struct clattn_plan *p, cl_mem *cs, size_t *held);
void clattn_rope_rotate_grad(const clattn_rope *r, const float *cs, double *g, size_t rows, size_t ld, size_t period,
                             const uint32_t *pos, size_t heads, size_t head_dim);

/* ---- projections on the device (linear.c), for the attention, decode and encoder plans */
typedef struct clattn_linear {
    const clattn_device *dev;
    cl_program prog;
    cl_kernel fill, small; /* fill_rows, and for few rows linear_small or linear_gemv (cl/attention/linear.cl) */
    cl_kernel colsum, sum_blocks; /* grad_colsum, grad_sum_blocks: the projections' gradients */
    cl_kernel widen, narrow; /* dtype_widen, dtype_narrow: half-precision plans' inputs and outputs */
    int gemv;              /* small is linear_gemv (a work-group per block of columns: GPUs) */
    size_t colsum_cw;      /* grad_colsum's and grad_sum_blocks' columns per work-item (their -DCW) */
    clattn_core_instance gemm_core; /* the plan's GEMM core (select.c chose it) */
    clattn_gemm gemm;      /* the same, as the cores layer sees it (the unfused core's GEMMs) */
} clattn_linear;
/* The kernels, and the GEMM core for plans of description d (its head-size class picks tuning-file entries). */
clattn_status clattn_linear_build(const clattn_device *dev, const clattn_attention_desc *d, clattn_linear *l);
void clattn_linear_release(clattn_linear *l);
/* Every row of dst (rows, cols) = bias. */
clattn_status clattn_linear_fill(const clattn_linear *l, clattn_view dst, cl_mem bias, size_t rows, size_t cols);
/* y (m, n) = x (m, k) W^T (+ bias), W (n, k) in nn.Linear layout: the bias as rows first and a GEMM with beta = 1
 * on the plan's GEMM core, or with few_rows and m <= CLATTN_LINEAR_SMALL_ROWS, the few-rows kernel of the
 * device's class (a GEMM pads m to its tile and does dozens of times the work): linear_small on CPUs (a
 * work-item per column), linear_gemv on GPUs (a work-group per block of columns, coalesced along k), unless its
 * loops would pass the device's loop limit (k too long): then the GEMM. warm: the few-rows kernel launched with no
 * work. */
#define CLATTN_LINEAR_SMALL_ROWS 16
clattn_status clattn_linear_run(const clattn_linear *l, size_t m, size_t n, size_t k, clattn_view x, cl_mem w,
                                cl_mem bias, clattn_view y, int few_rows, int warm, const char *what);
/* The same on the GEMM core with x and W in the types tx and tw (F16 / BF16 read as they are, widened exactly; the
 * bias and y fp32): for a GEMM core with reads_dtypes (clattn_linear_reads_dtypes), which a half plan's
 * projections use to read its inputs and weights without widened copies. */
clattn_status clattn_linear_run_typed(const clattn_linear *l, size_t m, size_t n, size_t k, clattn_view x,
                                      clattn_dtype tx, cl_mem w, clattn_dtype tw, cl_mem bias, clattn_view y,
                                      const char *what);
int clattn_linear_reads_dtypes(const clattn_linear *l);
/* The projections' gradients (training plans). dW of y = x W^T from dy (rows, m; row stride ldy) and x (rows, n;
 * ldx; of type tx: F16 / BF16 for a GEMM core with reads_dtypes): dW = dy^T x (m, n) in LINEAR layout, x^T dy
 * (n, m) in RAW, into out (fp32; a GEMM with op(A) transposed). */
clattn_status clattn_linear_grad_weight(const clattn_linear *l, clattn_view dy, size_t ldy, clattn_view x, size_t ldx,
                                        clattn_dtype tx, size_t rows, size_t m, size_t n, clattn_layout layout,
                                        clattn_view out, const char *what);
/* out (cols) = the column sums of src (rows, cols; row stride ld): a bias's gradient (in blocks of rows within the
 * device's loop limit). */
clattn_status clattn_linear_colsum(const clattn_linear *l, clattn_view src, size_t ld, size_t rows, size_t cols,
                                   clattn_view out);
/* dst (rows, width; dst_ld) = the sum of `blocks` column blocks of src (rows; src_ld), block b at column b*width. */
clattn_status clattn_linear_sum_blocks(const clattn_linear *l, clattn_view src, size_t src_ld, size_t blocks,
                                       size_t width, clattn_view dst, size_t dst_ld, size_t rows);
/* n elements of a half-precision plan's array (t: F16 or BF16) widened from src into the float dst, or with narrow
 * from the float src into dst rounded to nearest even (dtype_widen, dtype_narrow). */
clattn_status clattn_linear_convert(const clattn_linear *l, clattn_view src, clattn_view dst, size_t n, clattn_dtype t,
                                    int narrow);
/* The GEMM core's name and parameters as text ("gemm_tiles", "MR=8,..."), for the plans' reports. */
void clattn_linear_gemm_describe(const clattn_linear *l, const char **name, char *params, size_t len);
/* The projections' helpers of an OpenCL plan (its GEMM core), for the encoder layer's feed-forward GEMMs;
 * NULL on ref. */
const clattn_linear *clattn_plan_linear(const struct clattn_plan *p);
/* One device buffer holding blocks of rows one after another: block i has rows[i] rows of cols floats from
 * parts[i], or zeros where parts[i] is NULL (a bias that is absent); made when *out is NULL, else written again
 * (clattn_buffer_put). */
clattn_status clattn_upload_blocks(const clattn_device *dev, const float *const *parts, const size_t *rows, int n,
                                   size_t cols, const char *what, cl_mem *out);
/* The same with the elements narrowed to type t on the way (F32: as above). */
clattn_status clattn_upload_blocks_typed(const clattn_device *dev, const float *const *parts, const size_t *rows,
                                         int n, size_t cols, clattn_dtype t, const char *what, cl_mem *out);

/* ---- the CPU reference (ref.c) */
/* y (rows, n) = a (rows, k) w^T + bias; w (n, k) in nn.Linear layout, bias (n) or NULL. */
void clattn_ref_linear(const float *a, size_t rows, size_t k, const float *w, const float *bias, size_t n,
                       float *y);
/* The CPU reference's shared steps (ref_common.c). Q (B, Tq, H*dk), K (B, Tk, HK*dk), V (B, Tk, HK*dv), token-major
 * with head h at columns h*d: the projections of args' x and kv (or the inputs themselves), K and V rounded to half
 * with kv_half. */
void clattn_ref_qkv(const struct clattn_plan *plan, const clattn_attention_args *args, float *Q, float *K, float *V);
/* s (Tk) = query row (b, h, i)'s scaled scores plus the float mask, -inf where the key is hidden (causal, window,
 * key padding, boolean mask); returns the largest score that is not NaN (-inf with none) and sets *any_nan when a
 * score is NaN. */
double clattn_ref_scores(const struct clattn_plan *plan, const clattn_attention_args *args, const float *Q,
                         const float *K, size_t b, size_t h, size_t i, double *s, int *any_nan);
/* Run a validated plan's attention on the CPU. out (B, Tq, out_width), attn (B, H, Tq, Tk), lse (B, H, Tq) and
 * context (B, Tq, H*dv), each optional but out. Inputs come from args (x, kv, masks); the outputs are separate
 * so callers can stage them. */
clattn_status clattn_ref_execute(struct clattn_plan *plan, const clattn_attention_args *args, float *out,
                                 float *attn, float *lse, float *context);

/* The backward pass on the CPU (backward_ref.c), for a validated call: every gradient given in g is written. */
clattn_status clattn_ref_backward(struct clattn_plan *plan, const clattn_attention_args *args,
                                  const clattn_attention_grads *grads);

#endif
