/* test_golden.c: every PyTorch-made golden case (tests/golden/cases, made by
 * tests/golden/make_golden.py) on ref and on the OpenCL device, out and the
 * per-head attention weights, every element, poisoned outputs. On OpenCL every case runs
 * with both algorithms: unfused (out and attn) and fused (out; it makes no weights).
 * A half case (meta.txt's dtype: f16 or bf16) runs twice: in float32 (its values are floats too) and as a plan of
 * its type on the same values, held to that type's bound (README, "Precision"). */
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

static const char *type_name(clattn_dtype t)
{
    return t == CLATTN_DTYPE_F16 ? "float16" : t == CLATTN_DTYPE_BF16 ? "bfloat16" : "float32";
}

/* The case as a plan of type t (F32, or the case's half type) with the weights w: every element of out (and attn)
 * against the fixture within the type's bound. */
static void run_one(clattn_device *dev, tu_case *cp, const clattn_attention_weights *w32, int weights, clattn_dtype t)
{
    tu_case c = *cp;
    char msg[512];
    clattn_attention_weights w = *w32;
    void *typed[10] = {0}; /* the 8 weights, x and kv in the type: the same values (a half case holds the type's) */
    if (t != CLATTN_DTYPE_F32) {
        cr_assert(w.w_query && w.w_out, "%s: a half case is a projected module (no core rounds P there)", c.name);
        const void **slots[10] = {&w.w_query, &w.w_key, &w.w_value, &w.w_out, &w.b_query, &w.b_key, &w.b_value,
                                  &w.b_out, &c.args.x, &c.args.kv};
        const size_t counts[10] = {c.wq.count, c.wk.count, c.wv.count, c.wo.count, c.bq.count, c.bk.count,
                                   c.bv.count, c.bo.count, c.x.count, c.kv.count};
        for (int k = 0; k < 10; k++) {
            if (!*slots[k]) continue;
            typed[k] = tu_typed(*slots[k], counts[k], t);
            float *back = tu_widened(typed[k], counts[k], t);
            for (size_t e = 0; e < counts[k]; e++)
                cr_assert_eq(back[e], ((const float *)*slots[k])[e], "%s: array %d element %zu is not a value of %s",
                             c.name, k, e, type_name(t));
            free(back);
            *slots[k] = typed[k];
        }
        c.desc.dtype = t;
    }
    clattn_plan *plan = NULL;
    clattn_status st = tu_plan_create(dev, &c.desc, &w, &plan);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: plan: %s: %s", c.name, clattn_status_string(st),
                 clattn_last_error());
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL)
        cr_assert_eq(clattn_plan_algorithm(plan), c.desc.algorithm, "%s: asked for %s, the plan runs %s", c.name,
                     clattn_algorithm_name(c.desc.algorithm), clattn_algorithm_name(clattn_plan_algorithm(plan)));
    /* the fixtures' own shapes: out (B, Tq, Eo or H*dv), attn (B, H, Tq, Tk), every value finite */
    clattn_attention_desc rd;
    cr_assert_eq(clattn_plan_desc(plan, &rd), CLATTN_STATUS_SUCCESS);
    const size_t Tk = rd.cross ? rd.seq_kv : rd.seq_q;
    cr_assert(c.expect_out.ndim == 3 && c.expect_out.shape[0] == rd.batch && c.expect_out.shape[1] == rd.seq_q &&
                  c.expect_out.shape[2] == clattn_plan_out_width(plan),
              "%s: expect_out.npy has the wrong shape", c.name);
    cr_assert(c.expect_attn.ndim == 4 && c.expect_attn.shape[0] == rd.batch && c.expect_attn.shape[1] == rd.heads &&
                  c.expect_attn.shape[2] == rd.seq_q && c.expect_attn.shape[3] == Tk,
              "%s: expect_attn.npy is not (B, H, Tq, Tk)", c.name);
    cr_assert(c.expect_out.dtype == CLATTN_NPY_F32 && c.expect_attn.dtype == CLATTN_NPY_F32, "%s: dtype", c.name);
    for (size_t e = 0; e < c.out_count; e++)
        cr_assert(isfinite(((const float *)c.expect_out.data)[e]), "%s: expect_out[%zu] not finite", c.name, e);
    for (size_t e = 0; e < c.attn_count; e++)
        cr_assert(isfinite(((const float *)c.expect_attn.data)[e]), "%s: expect_attn[%zu] not finite", c.name, e);
    cr_assert_eq(c.out_count, c.desc.batch * c.desc.seq_q * clattn_plan_out_width(plan), "%s: out size", c.name);
    void *out = tu_poisoned_typed(c.out_count, t), *attn = tu_poisoned_typed(c.attn_count, t);
    c.args.out = out;
    c.args.attn = weights ? attn : NULL;
    st = tu_plan_execute(plan, &c.args);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: execute: %s: %s", c.name, clattn_status_string(st),
                 clattn_last_error());
    double atol, rtol;
    tu_dtype_tolerance(t, &atol, &rtol);
    float *out32 = tu_widened(out, c.out_count, t), *attn32 = tu_widened(attn, c.attn_count, t);
    size_t bad = tu_compare(out32, c.expect_out.data, c.out_count, atol, rtol, msg, sizeof msg);
    cr_expect_eq(bad, 0, "%s (%s) on %s (%s): out: %zu of %zu differ; %s", c.name, type_name(t),
                 clattn_device_name(dev), clattn_algorithm_name(clattn_plan_algorithm(plan)), bad, c.out_count,
                 msg);
    if (weights) {
        bad = tu_compare(attn32, c.expect_attn.data, c.attn_count, atol, rtol, msg, sizeof msg);
        cr_expect_eq(bad, 0, "%s (%s) on %s: attn: %zu of %zu differ; %s", c.name, type_name(t),
                     clattn_device_name(dev), bad, c.attn_count, msg);
    }
    clattn_plan_free(plan);
    free(out), free(attn), free(out32), free(attn32);
    for (int k = 0; k < 10; k++) free(typed[k]);
}

static void run_all(clattn_device *dev, clattn_layout layout, clattn_algorithm alg)
{
    const int weights = alg != CLATTN_ALGORITHM_FUSED;
    if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL && !tu_core_applies(alg, weights)) return;
    static char names[256][128];
    size_t n = tu_case_names(names, 256);
    cr_assert(n >= 25, "expected the golden cases in %s, found %zu", CLATTN_GOLDEN_DIR, n);
    for (size_t i = 0; i < n; i++) {
        tu_case c;
        char msg[512];
        cr_assert_eq(tu_case_load(names[i], &c, msg, sizeof msg), 0, "%s", msg);
        clattn_attention_weights w = c.weights;
        float *t[8] = {0};
        if (layout == CLATTN_LAYOUT_RAW) { /* hand the same weights over transposed, as x @ W matrices */
            c.desc.layout = CLATTN_LAYOUT_RAW;
            const void **ws[] = {&w.w_query, &w.w_key, &w.w_value, &w.w_out};
            const clattn_npy *arrs[] = {&c.wq, &c.wk, &c.wv, &c.wo};
            for (int k = 0; k < 4; k++) {
                if (!*ws[k]) continue;
                size_t rows = arrs[k]->shape[0], cols = arrs[k]->shape[1];
                t[k] = malloc(rows * cols * sizeof(float));
                for (size_t r = 0; r < rows; r++)
                    for (size_t q = 0; q < cols; q++) t[k][q * rows + r] = ((const float *)*ws[k])[r * cols + q];
                *ws[k] = t[k];
            }
        }
        c.desc.algorithm = alg;
        c.desc.need_weights = weights;
        run_one(dev, &c, &w, weights, CLATTN_DTYPE_F32);
        if (c.dtype != CLATTN_DTYPE_F32) run_one(dev, &c, &w, weights, c.dtype);
        for (int k = 0; k < 8; k++) free(t[k]);
        tu_case_free(&c);
    }
}

Test(golden, ref)
{
    clattn_device *dev = tu_open_ref();
    run_all(dev, CLATTN_LAYOUT_LINEAR, CLATTN_ALGORITHM_AUTO);
    clattn_device_free(dev);
}

Test(golden, ref_raw_layout)
{
    clattn_device *dev = tu_open_ref();
    run_all(dev, CLATTN_LAYOUT_RAW, CLATTN_ALGORITHM_AUTO);
    clattn_device_free(dev);
}

Test(golden, opencl)
{
    clattn_device *dev = tu_open_opencl();
    run_all(dev, CLATTN_LAYOUT_LINEAR, CLATTN_ALGORITHM_UNFUSED);
    run_all(dev, CLATTN_LAYOUT_LINEAR, CLATTN_ALGORITHM_FUSED);
    clattn_device_free(dev);
}

Test(golden, opencl_raw_layout)
{
    clattn_device *dev = tu_open_opencl();
    run_all(dev, CLATTN_LAYOUT_RAW, CLATTN_ALGORITHM_UNFUSED);
    run_all(dev, CLATTN_LAYOUT_RAW, CLATTN_ALGORITHM_FUSED);
    clattn_device_free(dev);
}
