/* reference.h: the CPU reference (the `ref` backend and the tests' oracle). */
#ifndef CLATTN_REFERENCE_H
#define CLATTN_REFERENCE_H

#include "internal.h"

/* y (rows, n) = a (rows, k) w^T + bias; w (n, k) in nn.Linear layout, bias (n) or NULL. */
void clattn_ref_linear(const float *a, size_t rows, size_t k, const float *w, const float *bias, size_t n,
                       float *y);

/* Run a validated plan's attention on the CPU. out (B, Tq, out_width), attn (B, H, Tq, Tk) or NULL.
 * Inputs come from args (x, kv, masks); out/attn are separate so callers can stage them. */
clattn_status clattn_ref_execute(struct clattn_plan *plan, const clattn_attention_args *args, float *out,
                                 float *attn);

/* IEEE half precision, round to nearest even (vstore_half_rte's rounding), in plain C. */
uint16_t clattn_float_to_half(float f);
float clattn_half_to_float(uint16_t h);
float clattn_round_half(float f); /* f rounded to the nearest half */

/* Dropout parameters shared by both backends: drop when the Philox word < threshold. */
uint32_t clattn_dropout_threshold(float p);
float clattn_dropout_keep_scale(float p);

#endif
