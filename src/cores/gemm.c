/* gemm.c: the GEMM family's entry point (core.h, "GEMM cores"): every matrix product a plan makes goes
 * through clattn_gemm_run to the plan's GEMM core (gemm_tiles.c, gemm_clblast.c), chosen once when the plan
 * is created (attention/select.c, like the attention cores). */
#include "core.h"

/* Operand `name` of a batch: count products `stride` elements apart, each `rows` stored rows of `len` elements
 * `ld` apart, from element v.off of v.mem, must end inside the buffer (NULL: INVALID_ARGUMENT). */
static clattn_status operand_fits(const char *what, char name, clattn_view v, size_t rows, size_t len, size_t ld,
                                  size_t count, size_t stride, clattn_dtype type)
{
    if (!v.mem) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: operand %c has no buffer", what, name);
    size_t last, span, bytes, end = v.off;
    const int overflows = clattn_mul_overflows(count - 1, stride, &last) || clattn_mul_overflows(rows - 1, ld, &span) ||
                          (end += last) < last || (end += span) < span || (end += len) < len;
    if (overflows || clattn_mul_overflows(end, clattn_dtype_size(type), &bytes) || bytes > clattn_mem_bytes(v.mem))
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "%s: operand %c (%zu x %zu elements, %zu products from "
                           "element %zu) does not fit its buffer of %zu bytes", what, name, rows, len, count, v.off,
                           clattn_mem_bytes(v.mem));
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_gemm_run(const clattn_gemm *g, const clattn_gemm_call *c)
{
    const char *what = c->what ? c->what : "GEMM";
    if (!g || !g->core || !g->core->run_gemm)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: no GEMM core", what);
    if (!c->m || !c->n || !c->k || !c->count)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: m=%zu n=%zu k=%zu count=%zu (each must be >= 1)", what,
                           c->m, c->n, c->k, c->count);
    const size_t row_a = c->trans_a ? c->m : c->k, row_b = c->trans_b ? c->k : c->n;
    if (c->lda < row_a || c->ldb < row_b || c->ldc < c->n)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: row strides lda=%zu ldb=%zu ldc=%zu, shorter than "
                           "the rows (%zu, %zu, %zu)", what, c->lda, c->ldb, c->ldc, row_a, row_b, c->n);
    const clattn_dtype types[2] = {c->type_a, c->type_b};
    for (int i = 0; i < 2; i++) {
        if (types[i] != CLATTN_DTYPE_F32 && types[i] != CLATTN_DTYPE_F16 && types[i] != CLATTN_DTYPE_BF16)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: operand %c has dtype %d (not F32, F16 or BF16)",
                               what, "AB"[i], (int)types[i]);
        if (types[i] != CLATTN_DTYPE_F32 && !g->core->reads_dtypes)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: operand %c is %s, which %s does not read (its "
                               "operands are fp32)", what, "AB"[i], clattn_dtype_name(types[i]), g->core->name);
    }
    if (c->bias.mem && !g->core->adds_biases)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: %s does not add a bias row", what, g->core->name);
    /* every operand inside its buffer: a layout error of the caller's (a shell, a core's chunking) is refused here by
     * name instead of reading or writing past a buffer, which a driver neither reports nor survives reliably */
    TRY(operand_fits(what, 'A', c->a, c->trans_a ? c->k : c->m, row_a, c->lda, c->count, c->stride_a, types[0]));
    TRY(operand_fits(what, 'B', c->b, c->trans_b ? c->n : c->k, row_b, c->ldb, c->count, c->stride_b, types[1]));
    TRY(operand_fits(what, 'C', c->c, c->m, c->n, c->ldc, c->count, c->stride_c, CLATTN_DTYPE_F32));
    if (c->bias.mem) TRY(operand_fits(what, 'b', c->bias, 1, c->n, c->n, 1, 0, CLATTN_DTYPE_F32));
    return g->core->run_gemm(g->state, c);
}
