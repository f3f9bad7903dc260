/* oracle.h: float64 attention and encoder written in the tests, from the formulas of the
 * tutorials and PyTorch's modules. It shares no code with the library (src/reference.c,
 * src/encoder_ref.c, cl/), so a bug there cannot hide by appearing in both sides of a
 * comparison. Deliberately naive: one loop nest per formula, every sum in double.
 * Dropout is not modelled (the dropout tests have their own oracle: an independent
 * Philox in test_reference.c checked against the published known answers). */
#ifndef CLATTN_TEST_ORACLE_H
#define CLATTN_TEST_ORACLE_H

#include "clattn.h"

#include <stddef.h>

/* softmax(scale * Q K^T + masks) V with the projections of `w`, as the desc says (defaults
 * resolved here independently of clattn_plan_desc: Tk = Tq unless cross, Ekv = E, dk = E/H
 * without weights, dv = dk, scale = 1/sqrt(dk)). A fully masked row has weights 0 (clattn's
 * documented choice; PyTorch gives NaN). desc.dropout must be 0.
 *   out  (B, Tq, Eo or H*dv)    attn (B, H, Tq, Tk), may be NULL
 * Returns 0, or -1 for an unsupported desc (dropout) or out of memory. */
int oracle_attention(const clattn_attention_desc *desc, const clattn_attention_weights *w,
                     const clattn_attention_args *args, double *out, double *attn);

/* torch.nn.TransformerEncoderLayer (batch_first, eval): post-norm or pre-norm, ReLU or erf-GELU,
 * LayerNorm with the biased variance. out (B, T, E). Returns 0 or -1. */
int oracle_encoder(const clattn_encoder_desc *desc, const clattn_encoder_weights *w, const float *x,
                   const uint8_t *key_padding_mask, double *out);

/* |got - want| <= atol + rtol |want| for every element, want finite, got not NaN. Returns the
 * number of failures and describes the first in msg. */
size_t oracle_compare(const float *got, const double *want, size_t n, double atol, double rtol, char *msg,
                      size_t len);

#endif
