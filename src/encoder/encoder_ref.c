/* encoder_ref.c: the encoder layer on the CPU. It is the `ref` device's path
 * and the tests' oracle, so it is written to be read, not to be fast:
 * float storage, double accumulation, one numbered pass per step.
 *
 * Shapes (row-major, N = B*T rows):
 *   x, a, y, n, f, out (N, E)     h (N, F)
 *   w_ff1 (F, E), w_ff2 (E, F)    nn.Linear layout, as the plan stores them
 *
 * post-norm:  1. a = SA(x)      2. y = LN1(x + a)           3. h = act(y W1^T + b1)
 *             4. f = h W2^T     5. out = LN2(y + f + b2)
 * pre-norm:   1. n = LN1(x)     2. a = SA(n)                3. y = x + a;  n = LN2(y)
 *             4. h = act(n W1^T + b1)   5. f = h W2^T       6. out = y + f + b2
 *
 * The residual sums are float additions in the order written, as the OpenCL
 * kernels do them, so that both devices normalise the same float values: it
 * matters when a row has a large common offset, where one rounding of the sum
 * is already a large part of the row's spread.
 */
#include "encoder.h"

#include <math.h>
#include <stdlib.h>

/* v_j = (x_j + r_j) + bias_j, in float */
static float row_value(const float *x, const float *r, const float *bias, size_t j)
{
    float v = x[j];
    if (r) v += r[j];
    if (bias) v += bias[j];
    return v;
}

void clattn_ref_residual_layernorm(size_t rows, size_t E, const float *x, const float *r, const float *bias,
                                   const float *gamma, const float *beta, float eps, float *sum_out, float *out)
{
    for (size_t i = 0; i < rows; i++) {
        const float *xi = x + i * E, *ri = r ? r + i * E : NULL;
        /* a. the mean */
        double mean = 0.0;
        for (size_t j = 0; j < E; j++) mean += row_value(xi, ri, bias, j);
        mean /= (double)E;
        /* b. the biased variance around it (a second pass, not E[v^2] - mean^2) */
        double var = 0.0;
        for (size_t j = 0; j < E; j++) {
            double c = row_value(xi, ri, bias, j) - mean;
            var += c * c;
        }
        var /= (double)E;
        const double rstd = 1.0 / sqrt(var + (double)eps);
        /* c. normalise, scale, shift */
        for (size_t j = 0; j < E; j++) {
            const float v = row_value(xi, ri, bias, j);
            out[i * E + j] = (float)((v - mean) * rstd * gamma[j] + beta[j]);
            if (sum_out) sum_out[i * E + j] = v;
        }
    }
}

/* ReLU (NaN stays NaN, as torch.relu) or GELU in its erf form: 0.5 v (1 + erf(v / sqrt 2)) */
static float activate(float v, clattn_activation act)
{
    if (act == CLATTN_ACTIVATION_GELU) return (float)(0.5 * v * erfc(-(double)v * 0.70710678118654752440));
    return v < 0.0f ? 0.0f : v;
}

static clattn_status ref_encoder_execute(const struct clattn_encoder_plan *p, const clattn_encoder_args *args,
                                         float *out)
{
    const size_t N = p->rows, E = p->E, F = p->F;
    const float eps = p->d.eps;
    float *a = clattn_malloc(N * E * sizeof *a);
    float *y = clattn_malloc(N * E * sizeof *y);
    float *n = clattn_malloc(N * E * sizeof *n);
    float *f = clattn_malloc(N * E * sizeof *f);
    float *h = clattn_malloc(N * F * sizeof *h);
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (!a || !y || !n || !f || !h) {
        st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reference encoder: allocating the activations");
        goto done;
    }
    clattn_attention_args sa = {.key_padding_mask = args->key_padding_mask};

    if (!p->d.norm_first) {
        /* 1. a = SA(x) */
        sa.x = args->x;
        if ((st = clattn_ref_execute(p->attn, &sa, a, NULL, NULL, NULL))) goto done;
        /* 2. y = LN1(x + a) */
        clattn_ref_residual_layernorm(N, E, args->x, a, NULL, p->ln1_w, p->ln1_b, eps, NULL, y);
        /* 3. h = act(y W1^T + b1) */
        clattn_ref_linear(y, N, E, p->w_ff1, p->b_ff1, F, h);
        for (size_t i = 0; i < N * F; i++) h[i] = activate(h[i], p->d.activation);
        /* 4. f = h W2^T (b2 joins the residual) */
        clattn_ref_linear(h, N, F, p->w_ff2, NULL, E, f);
        /* 5. out = LN2(y + f + b2) */
        clattn_ref_residual_layernorm(N, E, y, f, p->b_ff2, p->ln2_w, p->ln2_b, eps, NULL, out);
    } else {
        /* 1. n = LN1(x) */
        clattn_ref_residual_layernorm(N, E, args->x, NULL, NULL, p->ln1_w, p->ln1_b, eps, NULL, n);
        /* 2. a = SA(n) */
        sa.x = n;
        if ((st = clattn_ref_execute(p->attn, &sa, a, NULL, NULL, NULL))) goto done;
        /* 3. y = x + a; n = LN2(y) */
        clattn_ref_residual_layernorm(N, E, args->x, a, NULL, p->ln2_w, p->ln2_b, eps, y, n);
        /* 4. h = act(n W1^T + b1) */
        clattn_ref_linear(n, N, E, p->w_ff1, p->b_ff1, F, h);
        for (size_t i = 0; i < N * F; i++) h[i] = activate(h[i], p->d.activation);
        /* 5. f = h W2^T */
        clattn_ref_linear(h, N, F, p->w_ff2, NULL, E, f);
        /* 6. out = y + f + b2 */
        for (size_t i = 0; i < N; i++)
            for (size_t j = 0; j < E; j++) {
                float v = y[i * E + j] + f[i * E + j];
                v += p->b_ff2[j];
                out[i * E + j] = v;
            }
    }
done:
    free(a); free(y); free(n); free(f); free(h);
    return st;
}

static clattn_status ref_execute_host(struct clattn_encoder_plan *p, const clattn_encoder_args *args)
{
    return ref_encoder_execute(p, args, args->out);
}

static clattn_status ref_layernorm_rows(clattn_device *dev, size_t rows, size_t E, const float *x, const float *r,
                                        const float *bias, const float *gamma, const float *beta, float eps,
                                        int row_cache, float *sum_out, float *out)
{
    (void)dev, (void)row_cache;
    clattn_ref_residual_layernorm(rows, E, x, r, bias, gamma, beta, eps, sum_out, out);
    return CLATTN_STATUS_SUCCESS;
}

const clattn_encoder_ops clattn_encoder_ref = {
    .execute_host = ref_execute_host,
    .layernorm_rows = ref_layernorm_rows,
};
