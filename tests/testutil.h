/* testutil.h: helpers shared by the Criterion tests. */
#ifndef CLATTN_TESTUTIL_H
#define CLATTN_TESTUTIL_H

#include "clattn.h"
#include "npy.h"

#include <stddef.h>
#include <stdint.h>

/* Deterministic random numbers (splitmix64), fresh per test via the seed. */
typedef struct tu_rng { uint64_t s; } tu_rng;
uint64_t tu_next(tu_rng *r);
float tu_uniform(tu_rng *r, float lo, float hi);
void tu_fill(tu_rng *r, float *a, size_t n, float lo, float hi);
float *tu_random(tu_rng *r, size_t n, float lo, float hi);   /* malloc'd */
float *tu_poisoned(size_t n);                                 /* malloc'd, every element NaN */

/* |got - ref| <= atol + rtol*|ref| for all n; an infinite ref needs the same infinity. Any NaN, in got
 * or in ref, fails: an expectation that is NaN is a broken expectation, not a match.
 * Returns the number of failures; describes the first in msg. */
size_t tu_compare(const float *got, const float *ref, size_t n, double atol, double rtol, char *msg, size_t len);
/* (Where NaN is the expectation, tests compare with the float64 oracle: oracle_compare_nonfinite.) */
#define TU_ATOL 1e-5
#define TU_RTOL 1e-4

/* The OpenCL device tests run on: $CLATTN_TEST_DEVICE, else "opencl". Never returns NULL: a device
 * that does not open fails the calling test; a spec that names the ref device (CLATTN_TEST_DEVICE=ref)
 * skips it visibly ([SKIP]), since a test that claims OpenCL would then compare ref with ref.
 * Call only from a test's body (Criterion's assert/skip). */
clattn_device *tu_open_opencl(void);
/* The spec of that device, for the CLI and the bench (--device SPEC): fails or skips as above. */
const char *tu_opencl_spec(void);
clattn_device *tu_open_ref(void);   /* fails the calling test if ref does not open */
/* Did the test device refuse a plan (or a step) for one of its own limits? 1 when st is TOO_LARGE_FOR_DEVICE or
 * UNSUPPORTED and the reason names a limit the driver has that clattn respects: its loop limit (probed: Mesa 22's
 * llvmpipe), or fewer work-items per work-group than a forced core's parameters; the reason is printed ([----]) and
 * the caller skips the case. Else 0, and the caller asserts as before: on a device without such limits (PoCL) every
 * refusal still fails. `what` names the case in the printed line. */
int tu_refused_by_device(const clattn_device *dev, clattn_status st, const char *what);
/* The device's loop limit as the probes found it (0: none; Mesa 22's llvmpipe: 65535). */
size_t tu_loop_limit(const clattn_device *dev);
/* Was profiling (clattn_plan_set_profiling's or the decode plan's status st) refused because the device probes found
 * its timestamps not real (Mesa 22's rusticl: 0, 1, 2 ns)? 1, with the reason printed: the caller skips its stage-time
 * checks. Else 0, and the caller asserts as before (on PoCL every refusal fails). */
int tu_profiling_refused(const clattn_device *dev, clattn_status st, const char *what);

/* The library's calls with every array's element count filled in as a careful caller gives it (clattn 0.4),
 * from the (resolved) description: each array given whose count is 0 gets the count the description needs.
 * Counts already set are kept, and NULL arguments pass through, so the refusals stay testable; the count
 * checks themselves are tested with the library's own calls (test_counts.c). */
clattn_status tu_plan_create(clattn_device *dev, const clattn_attention_desc *d, const clattn_attention_weights *w,
                             clattn_plan **plan);
clattn_status tu_plan_execute(clattn_plan *plan, const clattn_attention_args *a);
void tu_count_args(const clattn_plan *plan, clattn_attention_args *a); /* the same counts, in place */
clattn_status tu_encoder_plan_create(clattn_device *dev, const clattn_encoder_desc *d, const clattn_encoder_weights *w,
                                     clattn_encoder_plan **plan);
clattn_status tu_encoder_plan_execute(clattn_encoder_plan *plan, const clattn_encoder_args *a);
/* (A decode plan the device refuses for its own limit, as tu_refused_by_device says, skips the calling test visibly:
 * a forced decode core whose work-groups the driver does not take refuses every plan of that test.) */
clattn_status tu_decode_plan_create(clattn_device *dev, const clattn_attention_desc *d,
                                    const clattn_attention_weights *w, clattn_decode_plan **plan);
clattn_status tu_decode_execute(clattn_decode_plan *plan, clattn_kv_cache *cache, const clattn_decode_args *a);
/* clattn_kv_cache_create, then the cache's slots NaN (a float, half or bfloat16 cache: written at full length, then
 * truncated to empty; an int8 cache as created): every position of a contiguous cache and of the pages its sequences
 * can hold at once (a paged cache's pages past them, and a last page's slots past the capacity, as the library
 * leaves them), so that a kernel reading a slot past a sequence's length gives NaN whatever memory the cache happened
 * to get (a fresh buffer is often zeros, and zeros pass unseen where a slot's weight is small). A paged cache's pages
 * go back to its pool in another order than a fresh one's. */
clattn_status tu_kv_cache_create(clattn_device *dev, const clattn_kv_cache_desc *d, clattn_kv_cache **cache);
/* The counts alone, into *w (for the description d, unresolved as a caller writes it). */
void tu_count_weights(clattn_attention_weights *w, const clattn_attention_desc *d);

/* The core of `kind` that CLATTN_CORE=NAME[:P=V,...][;NAME[:P=V,...]...] forces (the ctest entries
 * <family>_core_<name>..., generated from the registry), or NULL. tu_open_opencl skips the test visibly when the
 * test device does not run a forced core. tu_forced_core: the forced attention (prefill) core. */
const clattn_core_info *tu_forced_core_of(clattn_core_kind kind);
const clattn_core_info *tu_forced_core(void);
/* AUTO's core of `kind` for head-size class `cls` on dev (the first core in the registry's order whose
 * clattn_core_describe default_for claims the class), into *info; 0 when none does. */
int tu_auto_core(clattn_device *dev, clattn_core_kind kind, unsigned cls, clattn_core_info *info);
/* Would an OpenCL plan of this algorithm (with need_weights) run the forced prefill core? 1 when none is forced
 * (a GEMM or decode core forced alone serves every plan).
 * Helpers that go over both algorithms return early for the cases another entry runs. */
int tu_core_applies(clattn_algorithm alg, int need_weights);

/* One attention problem of the test families (test_core, test_train), best written with designated initializers,
 * {.B = 2, .Tq = 7, .E = 12, .H = 3, .dk = 4, .dv = 4, .Eo = 12, .causal = 1}: fields left out are 0 (no cross,
 * no masks, HK = H, no window, LINEAR layout, dropout 0, inference). */
typedef struct tu_attn_case {
    size_t B, Tq, Tk, E, Ekv, H, HK, dk, dv, Eo, window;
    int cross, causal, biases, kpm;
    clattn_mask_kind mask;
    float dropout;
    clattn_layout layout; /* the weights' layout (the random arrays read as RAW's (in, out) when RAW) */
    int noproj;           /* no weights at all: x (and kv) are Q, K and V, heads of E/H (dk = dv = E/H, Eo = 0) */
    int training;         /* a training plan: lse and context are outputs too */
    int kv_half;          /* K and V rounded to half (kv_half; inference only) */
    int need_weights;     /* the attention weights are wanted (cores that produce them) */
    float scale;          /* the scores' scale (0: the default, 1/sqrt(dk)) */
    int separate_value;   /* with noproj and cross: kv is K of HK heads (dk = E/H), value V (dv, 0 = dk): the heads as
                             torch's scaled_dot_product_attention takes them */
    int mask_pb, mask_ph; /* the attention mask per batch entry and/or per head: (B,) (H,) Tq, Tk */
    clattn_dtype dtype;   /* the plan's type: inputs and weights rounded to it (the oracle reads them in float) */
    clattn_rope rope;     /* rotary embeddings on Q and K (kind NONE: none) */
    int sinks;            /* attention sinks (desc.sinks): tu_problem_make's weights.sinks, head 0's -inf (none) */
    int rope_pos;         /* with rope, args.rope_positions given (tu_problem_make's: each entry left-padded by 3b
                             rows at position 1, as transformers' position_ids, then documents of 11 rows each from 0,
                             the odd entries' from 517, past the plan's first table; cross-attention's keys at
                             (7j + 3b) % 900) */
} tu_attn_case;

/* A random combination of the case's options (the sweeps of test_conformance and test_train): batch, lengths,
 * self or cross, heads and GQA, head sizes, projections or none (a separate value), biases, causal and the window,
 * every mask kind (per batch entry, per head), dropout, the layout, the scale and the dtype; with `training` a
 * training plan's case (no attention weights, no half cache), else the weights asked for, a training plan's
 * statistics or a half cache at random. Deterministic in seed; tu_case_describe writes it as one line. */
void tu_case_random(tu_attn_case *c, uint64_t seed, int training);
void tu_case_describe(const tu_attn_case *c, char *buf, size_t len);
/* How many random cases a sweep runs: CLATTN_TEST_SWEEP, else `dflt` (0 in a core's entries, with CLATTN_CORE set),
 * from CLATTN_TEST_SWEEP_BASE (default 0). */
int tu_sweep_count(int dflt, int *base);

/* Its random weights and inputs (x and kv in +-2, so that scores reach a few units), its masks (a key padding mask
 * masks a quarter of the keys and, with B > 1, the last batch entry whole; a bool mask a third; a float mask has
 * -inf at a fifth), and the description; everything the oracle and the plans read. */
typedef struct tu_problem {
    clattn_attention_desc d;
    clattn_attention_weights w;
    clattn_attention_args a;
    float *bufs[16];
    int nb;
    uint8_t *kpm, *bmask;
    uint32_t *pos_q, *pos_k; /* rope_pos: the rows' positions */
    const clattn_attention_weights *first; /* plans are created with these, then given w (clattn_plan_set_weights);
                                              NULL: created with w */
} tu_problem;
void tu_problem_make(tu_problem *p, const tu_attn_case *c, uint64_t seed);
/* Half precision, the tests' own arithmetic: v rounded to the type (to nearest even); a float that is a value of the
 * type as its 16 bits, and back; malloc'd arrays: a float array in the type (a copy for F32), widened to float,
 * poisoned (NaN in the type). The bound against the float64 oracle for a plan of type t: the fp32 one and the
 * output's rounding (README, "Precision"). */
double tu_dtype_round(double v, clattn_dtype t);
uint16_t tu_dtype_bits(float f, clattn_dtype t);
float tu_dtype_value(uint16_t h, clattn_dtype t);
void *tu_typed(const float *a, size_t n, clattn_dtype t);
float *tu_widened(const void *a, size_t n, clattn_dtype t);
void *tu_poisoned_typed(size_t n, clattn_dtype t);
void tu_dtype_tolerance(clattn_dtype t, double *atol, double *rtol);
/* The same from other fp32 tolerances (the backward's): widened by one rounding to t */
void tu_dtype_tolerance_of(clattn_dtype t, double atol32, double rtol32, double *atol, double *rtol);
/* w's arrays replaced by copies in type t (F32: none), counts filled in; the copies go to typed[] (the caller frees
 * them): returns how many */
int tu_weights_typed(clattn_attention_weights *w, const clattn_attention_desc *d, clattn_dtype t, void *typed[9]);
/* The attention case on dev against the float64 oracle, every output element checked after poisoning: out, the
 * weights when asked for (and, with a prefill core forced, when it returns them), a training case's lse and context.
 * A half-precision case (c->dtype) gives the plan its arrays in the type and compares with that type's bound. */
void tu_attention_check(clattn_device *dev, const tu_attn_case *c, uint64_t seed);
/* A variable-length batch (desc.varlen) of case c's kind: c->B sequences of lens_q[b] queries (and lens_k[b] keys in
 * cross-attention; NULL for self-attention), each at most c->Tq (c->Tk), packed without padding. The plan's output
 * for every packed row against the float64 oracle run on each sequence alone (a batch of one of its lengths), after
 * poisoning; a sequence without keys gives b_out (or 0). With on_buffers the same call on cl_mem buffers at an offset
 * must give the host call's bits and write nothing outside out. c: no masks, dropout, weights or training (refused
 * with varlen). */
void tu_varlen_check(clattn_device *dev, const tu_attn_case *c, const size_t *lens_q, const size_t *lens_k,
                     uint64_t seed, int on_buffers);
/* The same for a training plan (c->training, fp32): the forward's out, lse (each sequence's (H, L) rows at H times its
 * first row) and context against the oracle per sequence, then the backward from a random grad_out, with the
 * forward's statistics and without: the inputs' gradients row by row and the parameters' summed over the sequences
 * against oracle_attention_backward's per sequence (a sequence without keys: grad_x 0 and grad_out's rows in b_out's
 * gradient; without queries: its grad_kv rows 0); on OpenCL the backward on buffers at an offset gives the host
 * call's bits and writes nothing outside the gradients. */
void tu_varlen_train_check(clattn_device *dev, const tu_attn_case *c, const size_t *lens_q, const size_t *lens_k,
                           uint64_t seed);
/* Whether the plan rounds P to its type before P V (flash_mma's fp16/bf16 products on a half plan without projections
 * whose kv_half is 0 or the plan's type; README, "Precision"): then each output element's bound adds u·Σ_j a_ij·|v_jc|
 * (a: the weights after dropout) and, for F16, 2^-25·(1/(1-p))·Σ_j |v_jc| (weights below half's normal range) */
int tu_rounds_p(const clattn_plan *plan, const tu_attn_case *c);
void tu_problem_free(tu_problem *p);

/* A golden case directory (tests/golden/cases/NAME), loaded. */
typedef struct tu_case {
    char name[256];
    clattn_attention_desc desc;
    clattn_npy x, kv, wq, wk, wv, bq, bk, bv, wo, bo, kpm, mask, expect_out, expect_attn;
    clattn_attention_weights weights;
    clattn_attention_args args;   /* x, kv, masks set; out/attn not */
    size_t out_count, attn_count;
    clattn_dtype dtype;           /* a half case's type (meta.txt's dtype; F32: none). desc.dtype stays F32: the */
} tu_case;                        /* arrays are floats, holding values of the type */
/* Returns 0 on success; on failure writes why into msg. A name starting with '/' is the case's directory. */
int tu_case_load(const char *name, tu_case *c, char *msg, size_t len);
void tu_case_free(tu_case *c);
/* Names of all golden cases (sorted); returns the count. names[i] are static storage. */
size_t tu_case_names(char names[][128], size_t cap);

/* A child process's environment for execve: this process's with NAME=value (value NULL: NAME removed) and
 * without Criterion's BXFI_ variables (a Criterion binary started with them takes itself for a worker), made
 * before a fork. Between fork and exec the child of a Criterion test must not allocate (setenv does): the test
 * process has other threads (Criterion's messaging, 3 of them), and one that held an allocator's lock when fork
 * copied the process leaves it locked in the child for ever. CI's sanitizer stage hung that way in setenv, about
 * once in 400 forks (ASan's stack depot lock), until test_cli made the environment first. */
typedef struct tu_child_env { char **vars; char *set; } tu_child_env; /* set: the one string made */
tu_child_env tu_env_with(const char *name, const char *value);
void tu_env_free(tu_child_env *e);

#endif
