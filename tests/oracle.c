/* oracle.c: see oracle.h. Written from the formulas; shares no code with src/ or cl/. */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* y (rows, n) = a (rows, k) W + b, W given as torch.nn.Linear's [n, k] (LINEAR) or as the
 * tutorials' raw [k, n] (RAW). a is float or double (one of af/ad is NULL). */
static void linear(const float *af, const double *ad, size_t rows, size_t k, const float *w, const float *b,
                   size_t n, clattn_layout layout, double *y)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t o = 0; o < n; o++) {
            double acc = b ? (double)b[o] : 0.0;
            for (size_t c = 0; c < k; c++) {
                double a = af ? (double)af[r * k + c] : ad[r * k + c];
                double wv = layout == CLATTN_LAYOUT_LINEAR ? w[o * k + c] : w[c * n + o];
                acc += a * wv;
            }
            y[r * n + o] = acc;
        }
}

static void copy_to_double(const float *a, size_t n, double *y)
{
    for (size_t i = 0; i < n; i++) y[i] = a[i];
}

/* Q (B*Tq, H*dk), K (B*Tk, HK*dk), V (B*Tk, HK*dv): the projections of x and kv (or x), or the inputs themselves
 * without weights. */
/* A description's sizes with every default resolved, as the forward and the backward read them. */
typedef struct odims {
    size_t B, Tq, Tk, E, Ekv, H, HK, G, dk, dv;
    int proj;     /* Q/K/V weights given */
    double scale;
} odims;

/* d's sizes; -1 for a description the library refuses, which is not computed here either (no silent garbage). */
static int dims_of(const clattn_attention_desc *d, const clattn_attention_weights *w, odims *o)
{
    o->B = d->batch, o->Tq = d->seq_q, o->E = d->embed, o->H = d->heads;
    o->HK = d->kv_heads ? d->kv_heads : o->H;
    o->Tk = d->cross ? d->seq_kv : o->Tq;
    o->proj = w && w->w_query;
    o->dk = d->head_dim_qk ? d->head_dim_qk : o->E / o->H;
    o->dv = d->head_dim_v ? d->head_dim_v : o->dk;
    /* without weights kv holds K (and V) of HK heads as they are */
    o->Ekv = d->cross && d->kv_embed ? d->kv_embed : d->cross && !o->proj ? o->HK * o->dk : o->E;
    o->scale = d->scale != 0.0f ? (double)d->scale : 1.0 / sqrt((double)o->dk);
    if (!o->proj && (o->E % o->H != 0 || o->dk != o->E / o->H || o->Ekv != o->HK * o->dk)) return -1;
    if (!o->proj && o->dv != o->dk && !d->separate_value) return -1;
    if (d->separate_value && (o->proj || !d->cross)) return -1;
    if (o->proj && d->head_dim_qk == 0) return -1;
    if (o->HK > o->H || o->H % o->HK || (o->HK != o->H && !o->proj && !d->cross) || (d->window && !d->causal))
        return -1;
    o->G = o->H / o->HK; /* query head h reads key/value head h / G */
    return 0;
}

/* Rotary position embeddings, from the formulas (RoFormer section 3.4.2; the HALF layout as transformers'
 * rotate_half; the scalings as transformers' _compute_linear_scaling_rope_parameters and _compute_yarn_parameters,
 * NTK-aware as bloc97's base * factor^(r/(r-2))): head values (x_a, x_b) of pair i at position p become
 * m (x_a cos t - x_b sin t, x_b cos t + x_a sin t), t = p * inv_freq_i. `transpose`: the gradient's map, the
 * rotation's transpose. Rows `rows` of stride ld, row t at position t % period, or pos[t] when given (the args'
 * rope_positions). Defaults resolved here. */
static void rope_apply(const clattn_rope *r, size_t dk, double *a, size_t rows, size_t ld, size_t period,
                       const uint32_t *pos, size_t heads, int transpose)
{
    if (r->kind == CLATTN_ROPE_NONE) return;
    const size_t dim = r->dims ? r->dims : dk, half = dim / 2;
    const double theta = r->theta != 0.0 ? r->theta : 10000.0, factor = r->factor != 0.0 ? r->factor : 1.0;
    double *inv = malloc((half ? half : 1) * sizeof *inv), m = 1.0;
    if (!inv) abort();
    for (size_t i = 0; i < half; i++) {
        const double expo = (double)(2 * i) / (double)dim; /* arange(0, dim, 2) / dim */
        switch (r->scaling) {
        case CLATTN_ROPE_SCALING_LINEAR: inv[i] = 1.0 / pow(theta, expo) / factor; break;
        case CLATTN_ROPE_SCALING_NTK: inv[i] = 1.0 / pow(theta * pow(factor, (double)dim / ((double)dim - 2.0)), expo); break;
        case CLATTN_ROPE_SCALING_YARN: {
            const double pi = 3.14159265358979323846, omp = (double)r->original_max_position;
            double low = floor((double)dim * log(omp / (32.0 * 2.0 * pi)) / (2.0 * log(theta)));
            double high = ceil((double)dim * log(omp / (1.0 * 2.0 * pi)) / (2.0 * log(theta)));
            low = fmax(low, 0.0), high = fmin(high, (double)dim - 1.0);
            if (low == high) high += 0.001;
            const double ramp = fmin(fmax(((double)i - low) / (high - low), 0.0), 1.0);
            const double extrapolation_factor = 1.0 - ramp;
            const double pos_freq = pow(theta, expo);
            inv[i] = 1.0 / (factor * pos_freq) * (1.0 - extrapolation_factor) + 1.0 / pos_freq * extrapolation_factor;
            m = factor <= 1.0 ? 1.0 : 0.1 * log(factor) + 1.0;
            break;
        }
        default: inv[i] = 1.0 / pow(theta, expo);
        }
    }
    for (size_t t = 0; t < rows; t++)
        for (size_t h = 0; h < heads; h++)
            for (size_t i = 0; i < half; i++) {
                double *x = a + t * ld + h * dk;
                const size_t ia = r->kind == CLATTN_ROPE_INTERLEAVED ? 2 * i : i;
                const size_t ib = r->kind == CLATTN_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
                const double ang = (double)(pos ? pos[t] : t % period) * inv[i], c = m * cos(ang);
                const double s = transpose ? -m * sin(ang) : m * sin(ang);
                const double xa = x[ia], xb = x[ib];
                x[ia] = xa * c - xb * s;
                x[ib] = xb * c + xa * s;
            }
    free(inv);
}

void oracle_rope(const clattn_rope *rope, size_t dk, double *a, size_t rows, size_t ld, size_t heads)
{
    rope_apply(rope, dk, a, rows, ld, rows ? rows : 1, NULL, heads, 0);
}

static void project_qkv(const clattn_attention_desc *d, const clattn_attention_weights *w,
                        const clattn_attention_args *args, const odims *o, double *q, double *k, double *v)
{
    const size_t B = o->B, Tq = o->Tq, Tk = o->Tk, E = o->E, Ekv = o->Ekv, H = o->H, HK = o->HK, dk = o->dk;
    const size_t dv = o->dv;
    const float *src_kv = d->cross ? args->kv : args->x;
    if (w && w->w_query) {
        linear(args->x, NULL, B * Tq, E, w->w_query, w->b_query, H * dk, d->layout, q);
        linear(src_kv, NULL, B * Tk, Ekv, w->w_key, w->b_key, HK * dk, d->layout, k);
        linear(src_kv, NULL, B * Tk, Ekv, w->w_value, w->b_value, HK * dv, d->layout, v);
    } else {
        copy_to_double(args->x, B * Tq * E, q);
        copy_to_double(src_kv, B * Tk * Ekv, k);
        copy_to_double(d->separate_value ? args->value : src_kv, B * Tk * HK * dv, v);
    }
    const uint32_t *kpos = d->cross ? args->rope_positions_kv : args->rope_positions; /* self: the queries' rows */
    rope_apply(&d->rope, dk, q, B * Tq, H * dk, Tq, args->rope_positions, H, 0);
    rope_apply(&d->rope, dk, k, B * Tk, HK * dk, Tk, kpos, HK, 0);
}

double oracle_half(double x)
{
    if (isnan(x) || isinf(x)) return x;
    if (fabs(x) >= 65520.0) return copysign(INFINITY, x); /* past the largest half's rounding range */
    int e;
    frexp(x, &e);                     /* |x| = m 2^e, m in [0.5, 1): 11 significant bits have unit 2^(e-11) */
    int q = e - 11;
    if (q < -24) q = -24;             /* the subnormal halves' spacing */
    return ldexp(nearbyint(ldexp(x, -q)), q); /* nearbyint: to nearest, ties to even */
}

double oracle_bf16(double x)
{
    if (isnan(x) || isinf(x) || x == 0.0) return x;
    int e;
    frexp(x, &e);                     /* 8 significant bits: unit 2^(e-8) */
    int q = e - 8;
    if (q < -133) q = -133;           /* bfloat16's subnormal spacing (a float's range) */
    const double r = ldexp(nearbyint(ldexp(x, -q)), q);
    return fabs(r) > 3.3895313892515355e38 ? copysign(INFINITY, x) : r; /* past the largest bfloat16 */
}

double oracle_kv(double x, int kv_type) { return kv_type == 2 ? oracle_bf16(x) : kv_type ? oracle_half(x) : x; }

void oracle_int8_rows(double *x, size_t rows, size_t n)
{
    const double inv127 = (double)(1.0f / 127.0f); /* the float nearest 1/127, as clattn.h defines the scale */
    for (size_t r = 0; r < rows; r++) {
        double *row = x + r * n, amax = 0.0;
        int nonfinite = 0;
        for (size_t c = 0; c < n; c++) {
            const float f = (float)row[c];
            if (isnan(f) || isinf(f)) nonfinite = 1;
            else if (fabs((double)f) > amax) amax = fabs((double)f);
        }
        const double s = (double)(float)(amax * inv127); /* the float product: the double one is exact */
        for (size_t c = 0; c < n; c++) {
            if (nonfinite) {
                row[c] = NAN;
                continue;
            }
            double q = s > 0.0 ? nearbyint((double)(float)row[c] / s) : 0.0; /* a tie of the exact quotient is one
                                                                               in double too (see oracle.h) */
            q = q > 127.0 ? 127.0 : q < -127.0 ? -127.0 : q;
            row[c] = q * s;
        }
    }
}

int oracle_attention(const clattn_attention_desc *d, const clattn_attention_weights *w,
                     const clattn_attention_args *args, double *out, double *attn)
{
    return oracle_attention_stats(d, w, args, out, attn, NULL, NULL);
}

int oracle_attention_stats(const clattn_attention_desc *d, const clattn_attention_weights *w,
                           const clattn_attention_args *args, double *out, double *attn, double *lse, double *context)
{
    odims o;
    if (dims_of(d, w, &o) || (w && w->w_out && d->out_dim == 0)) return -1;
    const size_t B = o.B, Tq = o.Tq, Tk = o.Tk, H = o.H, HK = o.HK, G = o.G, dk = o.dk, dv = o.dv;
    const double scale = o.scale;

    double *q = malloc(B * Tq * H * dk * sizeof *q);
    double *k = malloc(B * Tk * HK * dk * sizeof *k);
    double *v = malloc(B * Tk * HK * dv * sizeof *v);
    double *ctx = malloc(B * Tq * H * dv * sizeof *ctx);
    double *p = malloc((Tk ? Tk : 1) * sizeof *p);
    if (!q || !k || !v || !ctx || !p) {
        free(q), free(k), free(v), free(ctx), free(p);
        return -1;
    }
    /* Q (B*Tq, H*dk), K (B*Tk, H*dk), V (B*Tk, H*dv): row t holds every head, head h at h*dk */
    project_qkv(d, w, args, &o, q, k, v);
    if (d->kv_half == CLATTN_KV_INT8) { /* the values an int8 KV cache holds: rows of a position and KV head */
        oracle_int8_rows(k, B * Tk * HK, dk);
        oracle_int8_rows(v, B * Tk * HK, dv);
    } else if (d->kv_half) { /* the values a half or bfloat16 KV cache holds */
        for (size_t n = 0; n < B * Tk * HK * dk; n++) k[n] = oracle_kv(k[n], d->kv_half);
        for (size_t n = 0; n < B * Tk * HK * dv; n++) v[n] = oracle_kv(v[n], d->kv_half);
    }
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < Tq; i++) {
                /* the (Tq, Tk) mask of (b, h): (B,) (H,) Tq, Tk as the flags say */
                const size_t at = ((d->attn_mask_per_batch ? b : 0) * (d->attn_mask_per_head ? H : 1) +
                                   (d->attn_mask_per_head ? h : 0)) * Tq * Tk;
                const uint8_t *bmask = d->attn_mask == CLATTN_MASK_BOOL ? (const uint8_t *)args->attn_mask + at : NULL;
                const float *fmask = d->attn_mask == CLATTN_MASK_FLOAT ? (const float *)args->attn_mask + at : NULL;
                /* s_j = scale q_i . k_j + float mask, or hidden */
                double mx = -INFINITY;
                int nan_row = 0; /* a NaN score makes the whole row NaN, as torch's softmax */
                for (size_t j = 0; j < Tk; j++) {
                    int hidden = (d->causal && j > i) || (d->window && j <= i && i - j >= d->window) ||
                                 (d->key_padding_mask && args->key_padding_mask[b * Tk + j]) ||
                                 (bmask && bmask[i * Tk + j]);
                    if (hidden) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    double s = 0.0;
                    for (size_t c = 0; c < dk; c++)
                        s += q[(b * Tq + i) * H * dk + h * dk + c] * k[(b * Tk + j) * HK * dk + (h / G) * dk + c];
                    s *= scale;
                    if (fmask) s += fmask[i * Tk + j];
                    p[j] = s;
                    if (isnan(s)) nan_row = 1;
                    if (s > mx) mx = s;
                }
                /* attention sinks (desc.sinks, gpt-oss): the head's sink is one more column of the row's logits,
                 * whose weight is dropped after the softmax (it has no value); -inf without sinks */
                const double sink = d->sinks && w && w->sinks ? (double)((const float *)w->sinks)[h] : -INFINITY;
                const double top = sink > mx ? sink : mx;
                double sum = top == -INFINITY ? 0.0 : exp(sink - top);
                for (size_t j = 0; j < Tk; j++) {
                    p[j] = (top == -INFINITY || p[j] == -INFINITY) ? 0.0 : exp(p[j] - top);
                    sum += p[j];
                }
                mx = top;
                if (lse) /* log of the sum of exp over the visible scores (and the sink), before dropout */
                    lse[(b * H + h) * Tq + i] = nan_row ? NAN : sum == 0.0 ? -INFINITY : mx + log(sum);
                for (size_t j = 0; j < Tk; j++) {
                    p[j] = nan_row ? NAN : sum == 0.0 ? 0.0 : p[j] / sum; /* no visible key: 0 */
                    if (d->dropout > 0.0f) /* the documented mask, from the oracle's own Philox */
                        p[j] = oracle_dropout_keep(d->seed, d->dropout, (uint32_t)(oracle_batch0 + b), (uint32_t)h,
                                                   (uint32_t)i, (uint32_t)j)
                                   ? p[j] / (1.0 - (double)d->dropout)
                                   : 0.0;
                    if (attn) attn[((b * H + h) * Tq + i) * Tk + j] = p[j];
                }
                for (size_t c = 0; c < dv; c++) {
                    double acc = 0.0;
                    for (size_t j = 0; j < Tk; j++) acc += p[j] * v[(b * Tk + j) * HK * dv + (h / G) * dv + c];
                    ctx[(b * Tq + i) * H * dv + h * dv + c] = acc;
                }
            }
    if (out && w && w->w_out)
        linear(NULL, ctx, B * Tq, H * dv, w->w_out, w->b_out, d->out_dim, d->layout, out);
    else if (out)
        memcpy(out, ctx, B * Tq * H * dv * sizeof *out);
    if (context) memcpy(context, ctx, B * Tq * H * dv * sizeof *context);
    free(q), free(k), free(v), free(ctx), free(p);
    return 0;
}

/* LayerNorm over the last dimension, biased variance (divide by E, as torch). */
static void layer_norm(const double *a, size_t rows, size_t E, const float *g, const float *beta, double eps,
                       double *y)
{
    for (size_t r = 0; r < rows; r++) {
        const double *v = a + r * E;
        double mean = 0.0, var = 0.0;
        for (size_t c = 0; c < E; c++) mean += v[c];
        mean /= (double)E;
        for (size_t c = 0; c < E; c++) var += (v[c] - mean) * (v[c] - mean);
        var /= (double)E;
        for (size_t c = 0; c < E; c++) y[r * E + c] = (v[c] - mean) / sqrt(var + eps) * g[c] + beta[c];
    }
}

/* attention of a double input: rounded to float first, as the layer's input is float */
static int attention_of(const clattn_encoder_desc *d, const clattn_encoder_weights *w, const double *in,
                        const uint8_t *kpm, size_t n, double *out)
{
    float *xf = malloc(n * sizeof *xf);
    if (!xf) return -1;
    for (size_t i = 0; i < n; i++) xf[i] = (float)in[i];
    clattn_attention_desc ad = d->attn;
    ad.out_dim = ad.embed;
    clattn_attention_args a = {.x = xf, .key_padding_mask = kpm};
    int rc = oracle_attention(&ad, &w->attn, &a, out, NULL);
    free(xf);
    return rc;
}

/* FF(y) = W2 act(W1 y + b1) + b2 */
static void feed_forward(const clattn_encoder_desc *d, const clattn_encoder_weights *w, const double *y,
                         size_t rows, double *hid, double *out)
{
    const size_t E = d->attn.embed, F = d->ff_dim;
    linear(NULL, y, rows, E, w->w_ff1, w->b_ff1, F, d->attn.layout, hid);
    for (size_t i = 0; i < rows * F; i++) {
        double h = hid[i];
        hid[i] = d->activation == CLATTN_ACTIVATION_GELU ? 0.5 * h * (1.0 + erf(h / sqrt(2.0))) : (h > 0.0 ? h : 0.0);
    }
    linear(NULL, hid, rows, F, w->w_ff2, w->b_ff2, E, d->attn.layout, out);
}

int oracle_encoder(const clattn_encoder_desc *d, const clattn_encoder_weights *w, const float *x,
                   const uint8_t *kpm, double *out)
{
    const size_t rows = d->attn.batch * d->attn.seq_q, E = d->attn.embed, n = rows * E;
    const double eps = d->eps != 0.0f ? (double)d->eps : 1e-5;
    double *xd = malloc(n * sizeof *xd), *t = malloc(n * sizeof *t), *y = malloc(n * sizeof *y);
    double *f = malloc(n * sizeof *f), *hid = malloc(rows * d->ff_dim * sizeof *hid);
    int rc = -1;
    if (!xd || !t || !y || !f || !hid) goto done;
    copy_to_double(x, n, xd);
    if (!d->norm_first) {
        /* y = LN1(x + Attn(x)); out = LN2(y + FF(y)) */
        if (attention_of(d, w, xd, kpm, n, t)) goto done;
        for (size_t i = 0; i < n; i++) t[i] += xd[i];
        layer_norm(t, rows, E, w->ln1_weight, w->ln1_bias, eps, y);
        feed_forward(d, w, y, rows, hid, f);
        for (size_t i = 0; i < n; i++) t[i] = y[i] + f[i];
        layer_norm(t, rows, E, w->ln2_weight, w->ln2_bias, eps, out);
    } else {
        /* y = x + Attn(LN1(x)); out = y + FF(LN2(y)) */
        layer_norm(xd, rows, E, w->ln1_weight, w->ln1_bias, eps, t);
        if (attention_of(d, w, t, kpm, n, y)) goto done;
        for (size_t i = 0; i < n; i++) y[i] += xd[i];
        layer_norm(y, rows, E, w->ln2_weight, w->ln2_bias, eps, t);
        feed_forward(d, w, t, rows, hid, f);
        for (size_t i = 0; i < n; i++) out[i] = y[i] + f[i];
    }
    rc = 0;
done:
    free(xd), free(t), free(y), free(f), free(hid);
    return rc;
}

void oracle_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]}, k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        uint64_t a = (uint64_t)0xD2511F53u * x[0], b = (uint64_t)0xCD9E8D57u * x[2];
        uint32_t y0 = (uint32_t)(b >> 32) ^ x[1] ^ k[0], y2 = (uint32_t)(a >> 32) ^ x[3] ^ k[1];
        x[0] = y0, x[1] = (uint32_t)b, x[2] = y2, x[3] = (uint32_t)a;
        k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
    }
    memcpy(out, x, sizeof x);
}

uint32_t oracle_dropout_word(uint64_t seed, uint32_t b, uint32_t h, uint32_t i, uint32_t j)
{
    const uint32_t c[4] = {j, i, h, b}, k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    oracle_philox4x32_10(c, k, r);
    return r[0];
}

size_t oracle_batch0 = 0;

uint64_t oracle_dropout_threshold(float p)
{
    return (uint64_t)floor((double)p * 4294967296.0);
}

int oracle_dropout_keep(uint64_t seed, float p, uint32_t b, uint32_t h, uint32_t i, uint32_t j)
{
    return oracle_dropout_word(seed, b, h, i, j) >= oracle_dropout_threshold(p);
}

const uint32_t oracle_philox_kat[3][10] = {
    {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
    {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
     0x6d5451fd},
    {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
     0x24126ea1},
};

int oracle_close(double g, double r, double atol, double rtol, int nan_ok, int inf_ok)
{
    if (isnan(r)) return nan_ok && isnan(g);
    if (isinf(r)) return inf_ok && g == r;
    return !isnan(g) && fabs(g - r) <= atol + rtol * fabs(r);
}

static size_t compare(const float *got, const double *want, size_t n, double atol, const double *extra, double rtol,
                      int nan_ok, char *msg, size_t len)
{
    size_t bad = 0;
    if (len) msg[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = want[i], a = atol + (extra ? extra[i] : 0.0);
        if (!oracle_close(g, r, a, rtol, nan_ok, nan_ok)) {
            if (bad == 0 && len)
                snprintf(msg, len, "element %zu: got %.9g, float64 oracle %.9g (|diff| %.3g > %.3g)", i, g, r,
                         fabs(g - r), a + rtol * fabs(r));
            bad++;
        }
    }
    return bad;
}

size_t oracle_compare(const float *got, const double *want, size_t n, double atol, double rtol, char *msg,
                      size_t len)
{
    return compare(got, want, n, atol, NULL, rtol, 0, msg, len);
}

size_t oracle_compare_extra(const float *got, const double *want, size_t n, double atol, const double *extra,
                            double rtol, char *msg, size_t len)
{
    return compare(got, want, n, atol, extra, rtol, 0, msg, len);
}

size_t oracle_compare_nonfinite(const float *got, const double *want, size_t n, double atol, double rtol, char *msg,
                                size_t len)
{
    return compare(got, want, n, atol, NULL, rtol, 1, msg, len);
}

/* ---- the backward pass, as whole matrices per (b, h): the softmax's Jacobian applied row by row
 * (dS = P o (dP - rowsum(P o dP))), not the FlashAttention identity rowsum(P o dP) = dctx . ctx that the library
 * uses. */
int oracle_attention_backward(const clattn_attention_desc *d, const clattn_attention_weights *w,
                              const clattn_attention_args *args, const float *grad_out, oracle_grads *g)
{
    odims od;
    if (dims_of(d, w, &od) || d->kv_half) return -1;
    const size_t B = od.B, Tq = od.Tq, Tk = od.Tk, E = od.E, Ekv = od.Ekv, H = od.H, HK = od.HK, G = od.G;
    const size_t dk = od.dk, dv = od.dv, Hdv = H * dv, Eo = w && w->w_out ? d->out_dim : Hdv;
    const int proj = od.proj;
    const double scale = od.scale;
    const float *src_kv = d->cross ? args->kv : args->x;
    /* the forward's weights A = P o M (M the dropout factors) and the context, per (b, h) matrices */
    double *q = malloc(B * Tq * H * dk * sizeof *q), *k = malloc(B * Tk * HK * dk * sizeof *k);
    double *v = malloc(B * Tk * HK * dv * sizeof *v), *ctx = calloc(B * Tq * Hdv, sizeof *ctx);
    double *P = malloc(B * H * Tq * Tk * sizeof *P), *M = malloc(B * H * Tq * Tk * sizeof *M);
    double *dctx = calloc(B * Tq * Hdv, sizeof *dctx), *dq = calloc(B * Tq * H * dk, sizeof *dq);
    double *dk_ = calloc(B * Tk * HK * dk, sizeof *dk_), *dv_ = calloc(B * Tk * HK * dv, sizeof *dv_);
    double *dP = malloc((Tk ? Tk : 1) * sizeof *dP);
    int rc = -1;
    if (!q || !k || !v || !ctx || !P || !M || !dctx || !dq || !dk_ || !dv_ || !dP) goto done;
    project_qkv(d, w, args, &od, q, k, v);
    {
        clattn_attention_desc d2 = *d;
        d2.dropout = 0.0f; /* P before dropout, M apart */
        if (oracle_attention_stats(&d2, w, args, NULL, P, NULL, NULL)) goto done;
        for (size_t b = 0; b < B; b++)
            for (size_t h = 0; h < H; h++)
                for (size_t i = 0; i < Tq; i++)
                    for (size_t j = 0; j < Tk; j++)
                        M[((b * H + h) * Tq + i) * Tk + j] =
                            d->dropout > 0.0f ? (oracle_dropout_keep(d->seed, d->dropout, (uint32_t)(oracle_batch0 + b),
                                                                     (uint32_t)h, (uint32_t)i, (uint32_t)j)
                                                     ? 1.0 / (1.0 - (double)d->dropout)
                                                     : 0.0)
                                              : 1.0;
        /* ctx = (P o M) V */
        for (size_t b = 0; b < B; b++)
            for (size_t h = 0; h < H; h++)
                for (size_t i = 0; i < Tq; i++)
                    for (size_t c = 0; c < dv; c++) {
                        double acc = 0.0;
                        for (size_t j = 0; j < Tk; j++) {
                            const size_t ij = ((b * H + h) * Tq + i) * Tk + j;
                            if (M[ij] != 0.0) acc += P[ij] * M[ij] * v[(b * Tk + j) * HK * dv + (h / G) * dv + c];
                        }
                        ctx[(b * Tq + i) * Hdv + h * dv + c] = acc;
                    }
    }
    /* dctx = dOut Wo: Wo (Eo, H*dv) LINEAR, or RAW (H*dv, Eo) */
    for (size_t r = 0; r < B * Tq; r++)
        for (size_t c = 0; c < Hdv; c++) {
            double acc = 0.0;
            if (w && w->w_out)
                for (size_t e = 0; e < Eo; e++)
                    acc += (double)grad_out[r * Eo + e] *
                           (d->layout == CLATTN_LAYOUT_LINEAR ? ((const float *)w->w_out)[e * Hdv + c]
                                                          : ((const float *)w->w_out)[c * Eo + e]);
            else
                acc = grad_out[r * Eo + c];
            dctx[r * Hdv + c] = acc;
        }
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < Tq; i++) {
                const double *Pi = &P[((b * H + h) * Tq + i) * Tk], *Mi = &M[((b * H + h) * Tq + i) * Tk];
                const double *dci = &dctx[(b * Tq + i) * Hdv + h * dv];
                /* dA_ij = dctx_i . v_j; dP = dA o M; dV_j += A_ij dctx_i */
                double rowsum = 0.0;
                for (size_t j = 0; j < Tk; j++) {
                    const double *vj = &v[(b * Tk + j) * HK * dv + (h / G) * dv];
                    double da = 0.0;
                    for (size_t c = 0; c < dv; c++) da += dci[c] * vj[c];
                    dP[j] = Mi[j] == 0.0 ? 0.0 : da * Mi[j];
                    rowsum += Pi[j] * dP[j];
                    if (Mi[j] != 0.0)
                        for (size_t c = 0; c < dv; c++)
                            dv_[(b * Tk + j) * HK * dv + (h / G) * dv + c] += Pi[j] * Mi[j] * dci[c];
                }
                /* dS = P o (dP - rowsum); dQ_i += scale dS K; dK_j += scale dS_ij Q_i */
                for (size_t j = 0; j < Tk; j++) {
                    const double ds = Pi[j] * (dP[j] - rowsum) * scale;
                    if (ds == 0.0) continue;
                    for (size_t c = 0; c < dk; c++) {
                        dq[(b * Tq + i) * H * dk + h * dk + c] += ds * k[(b * Tk + j) * HK * dk + (h / G) * dk + c];
                        dk_[(b * Tk + j) * HK * dk + (h / G) * dk + c] += ds * q[(b * Tq + i) * H * dk + h * dk + c];
                    }
                }
            }
    /* rotary embeddings: dQ and dK are the rotated Q's and K's gradients; the rotation's transpose takes them back */
    rope_apply(&d->rope, dk, dq, B * Tq, H * dk, Tq, args->rope_positions, H, 1);
    rope_apply(&d->rope, dk, dk_, B * Tk, HK * dk, Tk, d->cross ? args->rope_positions_kv : args->rope_positions, HK,
               1);
    /* the parameters: dW (out, in) = dY^T X, in the description's layout; db = sum of dY's rows */
#define GRAD_W(dst, dy, xf, xd, rows, nout, nin)                                                                       \
    if (dst)                                                                                                           \
        for (size_t o = 0; o < (nout); o++)                                                                            \
            for (size_t c = 0; c < (nin); c++) {                                                                       \
                double acc = 0.0;                                                                                      \
                for (size_t r = 0; r < (rows); r++)                                                                    \
                    acc += (dy)[r * (nout) + o] * ((xf) ? (double)(xf)[r * (nin) + c] : (xd)[r * (nin) + c]);          \
                (dst)[d->layout == CLATTN_LAYOUT_LINEAR ? o * (nin) + c : c * (nout) + o] = acc;                       \
            }
#define GRAD_B(dst, dy, rows, nout)                                                                                    \
    if (dst)                                                                                                           \
        for (size_t o = 0; o < (nout); o++) {                                                                          \
            double acc = 0.0;                                                                                          \
            for (size_t r = 0; r < (rows); r++) acc += (dy)[r * (nout) + o];                                           \
            (dst)[o] = acc;                                                                                            \
        }
    {
        double *dout = malloc(B * Tq * Eo * sizeof *dout);
        if (!dout) goto done;
        copy_to_double(grad_out, B * Tq * Eo, dout);
        GRAD_W(g->w_out, dout, (const float *)NULL, ctx, B * Tq, Eo, Hdv);
        GRAD_B(g->b_out, dout, B * Tq, Eo);
        free(dout);
    }
    GRAD_W(g->w_query, dq, (const float *)args->x, (const double *)NULL, B * Tq, H * dk, E);
    GRAD_W(g->w_key, dk_, src_kv, (const double *)NULL, B * Tk, HK * dk, Ekv);
    GRAD_W(g->w_value, dv_, src_kv, (const double *)NULL, B * Tk, HK * dv, Ekv);
    GRAD_B(g->b_query, dq, B * Tq, H * dk);
    GRAD_B(g->b_key, dk_, B * Tk, HK * dk);
    GRAD_B(g->b_value, dv_, B * Tk, HK * dv);
#undef GRAD_W
#undef GRAD_B
    /* the inputs: dX = dY W (W (out, in) LINEAR, or RAW (in, out)), or dY itself without projections */
    {
        double *gx = g->x, *gkv = d->cross ? g->kv : g->x;
        if (gx) memset(gx, 0, B * Tq * E * sizeof *gx);
        if (d->cross && gkv) memset(gkv, 0, B * Tk * Ekv * sizeof *gkv);
        double *gval = d->separate_value ? g->value : gkv; /* V is its own input, or kv (or x) */
        if (d->separate_value && gval) memset(gval, 0, B * Tk * HK * dv * sizeof *gval);
        struct { double *dst; const double *dy; size_t rows, nout, nin; const float *w; } parts[3] = {
            {gx, dq, B * Tq, H * dk, E, proj ? w->w_query : NULL},
            {gkv, dk_, B * Tk, HK * dk, Ekv, proj ? w->w_key : NULL},
            {gval, dv_, B * Tk, HK * dv, d->separate_value ? HK * dv : Ekv, proj ? w->w_value : NULL}};
        for (int s = 0; s < 3; s++) {
            if (!parts[s].dst) continue;
            for (size_t r = 0; r < parts[s].rows; r++)
                for (size_t c = 0; c < parts[s].nin; c++) {
                    double acc = 0.0;
                    if (parts[s].w)
                        for (size_t o = 0; o < parts[s].nout; o++)
                            acc += parts[s].dy[r * parts[s].nout + o] *
                                   (d->layout == CLATTN_LAYOUT_LINEAR ? parts[s].w[o * parts[s].nin + c]
                                                                      : parts[s].w[c * parts[s].nout + o]);
                    else
                        acc = parts[s].dy[r * parts[s].nout + c];
                    parts[s].dst[r * parts[s].nin + c] += acc;
                }
        }
    }
    rc = 0;
done:
    free(q), free(k), free(v), free(ctx), free(P), free(M), free(dctx), free(dq), free(dk_), free(dv_), free(dP);
    return rc;
}
