/* oracle.h: float64 attention and encoder written in the tests, from the formulas of the
 * tutorials and PyTorch's modules. It shares no code with the library (src/attention/ref.c,
 * src/encoder/encoder_ref.c, cl/), so a bug there cannot hide by appearing in both sides of a
 * comparison. Deliberately naive: one loop nest per formula, every sum in double.
 * Dropout follows the documented rule with the oracle's own Philox (oracle_dropout_* below). */
#ifndef CLATTN_TEST_ORACLE_H
#define CLATTN_TEST_ORACLE_H

#include "clattn.h"

#include <stddef.h>
#include <stdint.h>

/* softmax(scale * Q K^T + masks) V with the projections of `w`, as the desc says (defaults
 * resolved here independently of clattn_plan_desc: Tk = Tq unless cross, Ekv = E (without weights in
 * cross-attention HK*dk), dk = E/H without weights, dv = dk, scale = 1/sqrt(dk)). desc.separate_value: V is
 * args.value; desc.attn_mask_per_batch / _per_head: the mask is (B,) (H,) Tq, Tk. A fully masked row has weights 0 (clattn's
 * documented choice; PyTorch gives NaN). desc.sinks: weights.sinks (H floats) is one more logit in each row of head h,
 * with no value (gpt-oss). With desc.dropout = p, weight (b, h, i, j) is kept
 * as w / (1 - p) or dropped to 0 as oracle_dropout_keep(desc.seed, p, b, h, i, j) says; a dropped
 * weight is 0 even in a NaN row (clattn's choice, which this oracle encodes rather than derives:
 * torch's NaN * 0 would stay NaN). A description the library refuses (dk = 0 with weights,
 * heads not dividing E without weights, w_out without out_dim) gives -1.
 *   out  (B, Tq, Eo or H*dv)    attn (B, H, Tq, Tk), may be NULL
 * Returns 0, or -1 when out of memory. */
int oracle_attention(const clattn_attention_desc *desc, const clattn_attention_weights *w,
                     const clattn_attention_args *args, double *out, double *attn);

/* The same, and the training statistics: lse (B, H, Tq), each row's log(sum_j exp(s_ij)) over its visible scaled
 * scores before dropout (-inf with none, NaN for a NaN row), and context (B, Tq, H*dv), the heads' output before
 * the output projection; out, attn, lse and context may each be NULL. */
int oracle_attention_stats(const clattn_attention_desc *desc, const clattn_attention_weights *w,
                           const clattn_attention_args *args, double *out, double *attn, double *lse, double *context);

/* The gradients of a loss through oracle_attention from dL/dout (grad_out, the shape of out), in float64: each
 * pointer given gets the gradient of that input (weights in desc.layout), NULL ones are not computed. Every
 * feature of the forward (masks, GQA, window, dropout with the forward's keep decisions, scale) but kv_half.
 * A fully masked row contributes nothing. Returns 0, or -1 (a refused description, out of memory). */
typedef struct oracle_grads {
    double *x, *kv, *w_query, *w_key, *w_value, *b_query, *b_key, *b_value, *w_out, *b_out;
    double *value; /* desc.separate_value: V's gradient (kv's is then K's alone) */
} oracle_grads;
int oracle_attention_backward(const clattn_attention_desc *desc, const clattn_attention_weights *w,
                              const clattn_attention_args *args, const float *grad_out, oracle_grads *g);

/* Rotary embeddings (desc.rope) rotate Q and K after the projections, from the papers' formulas in float64 (cos and
 * sin of the angle in double), and their gradients back. oracle_rope rotates `rows` rows of `heads` heads of dk
 * values (row stride ld) in place, row t at position t: what oracle_attention does to Q and K. */
void oracle_rope(const clattn_rope *rope, size_t dk, double *a, size_t rows, size_t ld, size_t heads);
/* Grouped-query attention (desc.kv_heads: query head h reads key/value head h / (H/HK)), the sliding
 * window (desc.window: key j hidden from query i when i - j >= W) and desc.kv_half (K and V rounded to
 * the nearest half, ties to even, by oracle_half) are computed from their definitions too.
 * oracle_half: x rounded to IEEE half precision, in double arithmetic (frexp/ldexp/nearbyint). */
double oracle_half(double x);
/* x rounded to bfloat16 (8 significant bits, nearest even), and to a KV cache's type (clattn_kv_type: 0 x itself,
 * 1 oracle_half, 2 oracle_bf16). */
double oracle_bf16(double x);
double oracle_kv(double x, int kv_type);
/* `rows` rows of n values replaced by what an int8 KV cache holds (clattn.h, CLATTN_KV_INT8), from the definition: each
 * value taken as a float; s = the float product max |x_c| * (the float nearest 1/127); q_c = x_c / s rounded to nearest,
 * ties to even, within +-127; the value q_c * s; a row with a NaN or an infinity all NaN. The quotient in double
 * rounds as the exact one would: x_c / s is within 2^-53 of itself, and a quotient of two floats that is not a tie
 * is at least about 2^-25 of it away from one. desc.kv_half = 3 in oracle_attention applies it to each (position,
 * KV head) row of K and V. The oracle's own values: exact in float only where the projections are (dyadic inputs). */
void oracle_int8_rows(double *x, size_t rows, size_t n);

/* torch.nn.TransformerEncoderLayer (batch_first, eval): post-norm or pre-norm, ReLU or erf-GELU,
 * LayerNorm with the biased variance. out (B, T, E). Returns 0 or -1. */
int oracle_encoder(const clattn_encoder_desc *desc, const clattn_encoder_weights *w, const float *x,
                   const uint8_t *key_padding_mask, double *out);

/* Dropout, from the documented rule and nothing in src/ or cl/: Philox4x32-10 written here (checked
 * against Random123's known answers in test_dropout.c); weight (b, h, i, j) is dropped when r0 <
 * floor(p * 2^32), r0 = the first word for counter (j, i, h, b) and key (seed lo, seed hi). */
void oracle_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
uint32_t oracle_dropout_word(uint64_t seed, uint32_t b, uint32_t h, uint32_t i, uint32_t j);
uint64_t oracle_dropout_threshold(float p);  /* floor(p * 2^32), exact for every float p in [0, 1) */
int oracle_dropout_keep(uint64_t seed, float p, uint32_t b, uint32_t h, uint32_t i, uint32_t j);
/* The batch index of a problem's entry 0 in oracle_attention's and oracle_attention_backward's dropout keys: 0,
 * or while a varlen sequence is computed alone, its index (b + oracle_batch0 keys entry b). */
extern size_t oracle_batch0;

/* Random123's published known-answer vectors for Philox4x32-10: counter[4], key[2], out[4]. */
extern const uint32_t oracle_philox_kat[3][10];

/* One element: |got - want| <= atol + rtol |want| for finite want; a NaN want matches only a NaN got
 * and only when nan_ok; an infinite want matches only the same infinity and only when inf_ok. */
int oracle_close(double got, double want, double atol, double rtol, int nan_ok, int inf_ok);

/* |got - want| <= atol + rtol |want| for every element, want finite, got not NaN. Returns the
 * number of failures and describes the first in msg. */
size_t oracle_compare(const float *got, const double *want, size_t n, double atol, double rtol, char *msg,
                      size_t len);
/* oracle_compare with an absolute bound of each element's own added to atol (extra[i] >= 0) */
size_t oracle_compare_extra(const float *got, const double *want, size_t n, double atol, const double *extra,
                            double rtol, char *msg, size_t len);
/* The same where the expectation may be non-finite (NaN and Inf propagation tests): got must be NaN
 * exactly where want is NaN, the same infinity where want is infinite, and close elsewhere. */
size_t oracle_compare_nonfinite(const float *got, const double *want, size_t n, double atol, double rtol, char *msg,
                                size_t len);

#endif
