/* rope.c: rotary position embeddings (desc.rope, clattn.h): the description's checks and defaults, the plan's table
 * of cos and sin (computed in double once, at plan creation), and the rotation of rows as the ref device computes it
 * (forward on floats, the gradient's on doubles). The OpenCL shell rotates with cl/attention/rope.cl from the same
 * table (shell_project.c).
 *
 *   f_i = theta^(-2i/r), i < r/2     (LINEAR: f_i / factor; NTK: theta * factor^(r/(r-2)) for theta; YARN below)
 *   pair i of a head at position p:  (a, b) -> m (a cos(p f_i) - b sin(p f_i), b cos(p f_i) + a sin(p f_i))
 *   pairs (i, i + r/2) (HALF) or (2i, 2i+1) (INTERLEAVED); m = 1 except YARN's 0.1 ln(factor) + 1
 */
#include "attention.h"
#include "runtime/runtime.h"

#include <math.h>
#include <stdlib.h>

#define ROPE_THETA_DEFAULT 10000.0 /* RoFormer's base, and transformers' rope_theta default */
#define YARN_BETA_FAST 32.0        /* transformers' _compute_yarn_parameters defaults (YaRN paper, section 3.2) */
#define YARN_BETA_SLOW 1.0

static clattn_status rope_unset(const clattn_rope *r)
{
    const char *set = r->dims ? "dims" : r->theta != 0.0 ? "theta" : r->scaling ? "scaling" : r->factor != 0.0 ? "factor"
                      : r->original_max_position ? "original_max_position" : NULL;
    if (!set) return CLATTN_STATUS_SUCCESS;
    return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rope.%s is set while rope.kind is CLATTN_ROPE_NONE: it would be "
                       "ignored (set rope.kind to HALF or INTERLEAVED)", set);
}

clattn_status clattn_rope_resolve(clattn_attention_desc *d)
{
    clattn_rope *r = &d->rope;
    if (r->kind == CLATTN_ROPE_NONE) return rope_unset(r);
    if (r->kind != CLATTN_ROPE_HALF && r->kind != CLATTN_ROPE_INTERLEAVED)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rope.kind %d is not CLATTN_ROPE_NONE, _HALF or _INTERLEAVED",
                           (int)r->kind);
    if ((unsigned)r->scaling > CLATTN_ROPE_SCALING_YARN)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rope.scaling %d is not CLATTN_ROPE_SCALING_NONE, _LINEAR, "
                           "_NTK or _YARN", (int)r->scaling);
    const size_t dk = d->head_dim_qk;
    const int defaulted = r->dims == 0;
    if (defaulted) r->dims = dk;
    if (r->dims > dk)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "rope.dims (%zu) exceeds head_dim_qk (%zu): only a head's own "
                           "values rotate", r->dims, dk);
    if (r->dims % 2)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "rope.dims %zu is odd: values rotate in pairs%s", r->dims,
                           defaulted ? " (rope.dims 0 takes head_dim_qk; give an even rope.dims below it)" : "");
    if (!(r->theta >= 0.0) || isinf(r->theta) || (r->theta != 0.0 && r->theta <= 1.0))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rope.theta %g: the base must be finite and above 1 (0 = "
                           "10000)", r->theta);
    if (r->theta == 0.0) r->theta = ROPE_THETA_DEFAULT;
    if (!(r->factor >= 0.0) || isinf(r->factor) || (r->factor != 0.0 && r->factor < 1.0))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rope.factor %g: a scaling factor is finite and at least 1 "
                           "(0 = 1)", r->factor);
    if (r->factor == 0.0) r->factor = 1.0;
    if (r->scaling == CLATTN_ROPE_SCALING_NONE && r->factor != 1.0)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rope.factor %g without rope.scaling: it would be ignored "
                           "(choose LINEAR, NTK or YARN)", r->factor);
    if (r->scaling == CLATTN_ROPE_SCALING_NTK && r->dims <= 2)
        return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "rope.scaling NTK with rope.dims %zu: its base theta * "
                           "factor^(r/(r-2)) needs r > 2", r->dims);
    if (r->scaling == CLATTN_ROPE_SCALING_YARN && r->original_max_position == 0)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rope.scaling YARN needs rope.original_max_position (the "
                           "model's context length before scaling: transformers' original_max_position_embeddings)");
    if (r->scaling != CLATTN_ROPE_SCALING_YARN && r->original_max_position)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "rope.original_max_position (%zu) is YARN's: it would be "
                           "ignored with this scaling", r->original_max_position);
    return CLATTN_STATUS_SUCCESS;
}

/* YaRN's dimension d at which a wavelength fits `rotations` times in the original context (its find_correction_dim) */
static double yarn_dim(double rotations, double dims, double base, double max_pos)
{
    return dims * log(max_pos / (rotations * 2.0 * 3.14159265358979323846)) / (2.0 * log(base));
}

float *clattn_rope_table(const clattn_rope *r, size_t positions)
{
    const size_t half = r->dims / 2;
    size_t n;
    if (clattn_mul_overflows(positions, 2 * half, &n) || clattn_mul_overflows(n, sizeof(float), &n)) return NULL;
    float *cs = clattn_malloc(n ? n : 1);
    double *f = clattn_malloc((half ? half : 1) * sizeof *f);
    if (!cs || !f) {
        free(cs), free(f);
        return NULL;
    }
    const double dims = (double)r->dims, factor = r->factor;
    double base = r->theta, m = 1.0;
    if (r->scaling == CLATTN_ROPE_SCALING_NTK) base *= pow(factor, dims / (dims - 2.0));
    /* YaRN: dimensions below `low` keep f_i (extrapolation), above `high` take f_i / factor, a linear ramp between */
    double low = 0.0, high = 0.0;
    if (r->scaling == CLATTN_ROPE_SCALING_YARN) {
        const double mp = (double)r->original_max_position;
        low = floor(yarn_dim(YARN_BETA_FAST, dims, base, mp));
        high = ceil(yarn_dim(YARN_BETA_SLOW, dims, base, mp));
        if (low < 0.0) low = 0.0;
        if (high > dims - 1.0) high = dims - 1.0;
        if (low == high) high += 0.001;
        m = factor > 1.0 ? 0.1 * log(factor) + 1.0 : 1.0;
    }
    for (size_t i = 0; i < half; i++) {
        f[i] = pow(base, -2.0 * (double)i / dims);
        if (r->scaling == CLATTN_ROPE_SCALING_LINEAR) f[i] /= factor;
        if (r->scaling == CLATTN_ROPE_SCALING_YARN) {
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
            f[i] = f[i] / factor * ramp + f[i] * (1.0 - ramp);
        }
    }
    for (size_t p = 0; p < positions; p++)
        for (size_t i = 0; i < half; i++) {
            const double a = (double)p * f[i];
            cs[2 * (p * half + i)] = (float)(m * cos(a));
            cs[2 * (p * half + i) + 1] = (float)(m * sin(a));
        }
    free(f);
    return cs;
}

clattn_status clattn_rope_reserve(struct clattn_plan *p, size_t positions, size_t limit)
{
    if (p->d.rope.kind == CLATTN_ROPE_NONE || positions <= p->rope_positions) return CLATTN_STATUS_SUCCESS;
    size_t n = 64; /* doubled: a decode session's growing lengths remake it a few times, not every step */
    while (n < positions) n *= 2;
    if (limit && n > limit) n = positions > limit ? positions : limit; /* no position past the cache's capacity */
    float *t = clattn_rope_table(&p->d.rope, n);
    if (!t)
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "the rotary embeddings' table of cos and sin for %zu "
                           "positions", n);
    free(p->rope_cs);
    p->rope_cs = t, p->rope_positions = n;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_rope_device_table(const struct clattn_plan *p, cl_mem *cs, size_t *held)
{
    if (p->rope_positions <= *held) return CLATTN_STATUS_SUCCESS;
    cl_mem m = NULL;
    TRY(clattn_buffer_new(p->device, p->rope_positions * p->d.rope.dims, sizeof(float), p->rope_cs,
                          "the rotary embeddings' cos and sin", &m));
    clattn_mem_release(cs);
    *cs = m, *held = p->rope_positions;
    return CLATTN_STATUS_SUCCESS;
}

/* The values of pair i of a head: (i, i + r/2) or (2i, 2i+1). */
static void pair_of(const clattn_rope *r, size_t i, size_t *a, size_t *b)
{
    const size_t half = r->dims / 2;
    if (r->kind == CLATTN_ROPE_INTERLEAVED)
        *a = 2 * i, *b = 2 * i + 1;
    else
        *a = i, *b = i + half;
}

void clattn_rope_rotate_row(const clattn_rope *r, const float *cs, float *x, size_t pos, size_t heads,
                            size_t head_dim)
{
    const size_t half = r->dims / 2;
    const float *c = cs + 2 * pos * half;
    for (size_t h = 0; h < heads; h++) {
        float *v = x + h * head_dim;
        for (size_t i = 0; i < half; i++) {
            size_t ia, ib;
            pair_of(r, i, &ia, &ib);
            const double a = v[ia], b = v[ib], co = c[2 * i], si = c[2 * i + 1];
            v[ia] = (float)(a * co - b * si);
            v[ib] = (float)(b * co + a * si);
        }
    }
}

void clattn_rope_rotate(const clattn_rope *r, const float *cs, float *x, size_t rows, size_t ld, size_t period,
                        const uint32_t *pos, size_t heads, size_t head_dim)
{
    for (size_t t = 0; t < rows; t++)
        clattn_rope_rotate_row(r, cs, x + t * ld, pos ? pos[t] : t % period, heads, head_dim);
}

void clattn_rope_rotate_grad(const clattn_rope *r, const float *cs, double *g, size_t rows, size_t ld, size_t period,
                             const uint32_t *pos, size_t heads, size_t head_dim)
{
    const size_t half = r->dims / 2;
    for (size_t t = 0; t < rows; t++) {
        const float *c = cs + 2 * (pos ? pos[t] : t % period) * half;
        for (size_t h = 0; h < heads; h++) {
            double *v = g + t * ld + h * head_dim;
            for (size_t i = 0; i < half; i++) {
                size_t ia, ib;
                pair_of(r, i, &ia, &ib);
                const double a = v[ia], b = v[ib], co = c[2 * i], si = c[2 * i + 1];
                v[ia] = a * co + b * si; /* the transpose of the rotation */
                v[ib] = b * co - a * si;
            }
        }
    }
}
