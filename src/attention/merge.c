/* merge.c: clattn_attention_merge (clattn.h, "partial attention over key shards"): per row, the shards' outputs
 * weighted by exp(lse_p - L), L = log sum_p exp(lse_p), in double. The same math as decode's split-K combine
 * (cl/cores/decode_common.cl), on the host, for results that come from separate plans or devices. */
#include "attention.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

clattn_status clattn_attention_merge(size_t parts, const float *const *outs, const float *const *lses, size_t batch,
                                     size_t seq_q, size_t heads, size_t head_dim_v, float *out, float *lse)
{
    clattn_clear_error();
    if (parts == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "parts must be >= 1");
    if (!outs || !lses) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "outs or lses is NULL");
    if (!out && !lse) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "out and lse are both NULL: nothing to merge into");
    if (!batch || !seq_q || !heads || !head_dim_v)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "batch, seq_q, heads and head_dim_v must be >= 1");
    size_t rows, n_out;
    if (clattn_mul_overflows(batch, seq_q, &rows) || clattn_mul_overflows(rows, heads, &rows) ||
        clattn_mul_overflows(rows, head_dim_v, &n_out))
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "batch x seq_q x heads x head_dim_v overflows size_t");
    if (parts > INT_MAX / 2) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "parts = %zu: at most %d", parts, INT_MAX / 2);
    clattn_mem_range *ins = clattn_malloc(2 * parts * sizeof *ins);
    if (!ins) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "merging %zu parts", parts);
    clattn_status st = CLATTN_STATUS_SUCCESS;
    for (size_t p = 0; p < parts && !st; p++) {
        if (!outs[p] || !lses[p]) {
            st = clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "part %zu: its out or lse is NULL", p);
            break;
        }
        ins[2 * p] = clattn_range("", "outs", outs[p], NULL, n_out, sizeof(float));
        ins[2 * p + 1] = clattn_range("", "lses", lses[p], NULL, rows, sizeof(float));
        ins[2 * p].index = ins[2 * p + 1].index = (long)p;
        /* +inf (a row's sum that overflowed float) has no weight against the other parts: exp(inf - inf) */
        for (size_t r = 0; r < rows && !st; r++)
            if (lses[p][r] == INFINITY)
                st = clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "lses[%zu][%zu] is +inf (batch %zu, head %zu, query "
                                 "%zu): a log-sum-exp that overflowed float cannot be weighed against the other parts "
                                 "(scale that row's scores down); -inf is a row with no visible key", p, r,
                                 r / (heads * seq_q), r / seq_q % heads, r % seq_q);
    }
    const clattn_mem_range outr[] = {clattn_range("", "out", out, NULL, n_out, sizeof(float)),
                                     clattn_range("", "lse", lse, NULL, rows, sizeof(float))};
    if (!st) st = clattn_check_no_overlap(outr, 2, ins, (int)(2 * parts));
    free(ins);
    TRY(st);
    double *w = malloc(parts * sizeof *w);
    if (!w) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "merging %zu parts", parts);
    const size_t H = heads, Tq = seq_q, dv = head_dim_v;
    for (size_t b = 0; b < batch; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < Tq; i++) {
                const size_t r = (b * H + h) * Tq + i;           /* lse (B, H, Tq) */
                const size_t o = ((b * Tq + i) * H + h) * dv;    /* out (B, Tq, H*dv) */
                double mx = -INFINITY;
                int nan_row = 0;
                for (size_t p = 0; p < parts; p++) {
                    const double l = lses[p][r];
                    nan_row |= isnan(l);
                    if (l > mx) mx = l;
                }
                double sum = 0.0;
                for (size_t p = 0; p < parts; p++) {
                    w[p] = mx == -INFINITY || lses[p][r] == -INFINITY ? 0.0 : exp((double)lses[p][r] - mx);
                    sum += w[p];
                }
                if (lse) lse[r] = nan_row ? NAN : mx == -INFINITY ? -INFINITY : (float)(mx + log(sum));
                if (!out) continue;
                for (size_t c = 0; c < dv; c++) {
                    double acc = 0.0;
                    for (size_t p = 0; p < parts; p++)
                        if (w[p] != 0.0) acc += w[p] * (double)outs[p][o + c];
                    out[o + c] = nan_row ? NAN : mx == -INFINITY ? 0.0f : (float)(acc / sum);
                }
            }
    free(w);
    return CLATTN_STATUS_SUCCESS;
}
