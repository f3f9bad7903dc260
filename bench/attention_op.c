/* attention_op.c: sizes, FLOP and byte counts, and random data for the
 * benchmarked attention module (conventions in attention_op.h). */
#include "attention_op.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int clattn_op_check(const clattn_op *op, char *msg, size_t len)
{
    const char *why = NULL;
    if (!op) why = "no op";
    else if (op->batch == 0) why = "batch must be >= 1";
    else if (op->seq == 0) why = "seq must be >= 1";
    else if (op->dim == 0) why = "dim must be >= 1";
    else if (op->heads == 0) why = "heads must be >= 1";
    else if (op->dim % op->heads) why = "heads must divide dim";
    else if (!(op->dropout >= 0.0f && op->dropout < 1.0f)) why = "dropout must be in [0, 1)";
    else if (op->encoder && op->dropout != 0.0f) why = "the encoder layer runs in eval mode: no dropout";
    else if (op->dtype != CLATTN_DTYPE_F32 && op->dtype != CLATTN_DTYPE_F16 && op->dtype != CLATTN_DTYPE_BF16)
        why = "unknown dtype";
    else if (op->encoder && op->no_proj) why = "the encoder layer has its projections (no_proj is attention's)";
    else if (op->encoder && op->activation != CLATTN_ACTIVATION_RELU && op->activation != CLATTN_ACTIVATION_GELU)
        why = "unknown activation";
    else if (op->encoder && op->ff_dim == 0 && op->dim > SIZE_MAX / 4) why = "dim too large for F = 4E";
    if (!why) return 0;
    if (msg && len) snprintf(msg, len, "%s", why);
    return 1;
}

size_t clattn_op_ff_dim(const clattn_op *op)
{
    return op->ff_dim ? op->ff_dim : 4 * op->dim;
}

clattn_op_flop_count clattn_op_flops(const clattn_op *op)
{
    const double B = (double)op->batch, T = (double)op->seq, E = (double)op->dim, H = (double)op->heads;
    const double d = E / H;
    clattn_op_flop_count f;
    f.qkv_projection = op->no_proj ? 0.0 : 2.0 * (B * T) * (3.0 * E) * E;
    f.out_projection = op->no_proj ? 0.0 : 2.0 * (B * T) * E * E;
    f.projections = f.qkv_projection + f.out_projection;
    f.core = 4.0 * B * H * T * T * d * (op->causal ? 0.5 : 1.0);
    f.scores = f.context = f.core / 2.0;
    f.ffn = op->encoder ? 4.0 * (B * T) * (double)clattn_op_ff_dim(op) * E : 0.0;
    f.total = f.projections + f.core + f.ffn;
    return f;
}

double clattn_op_softmax_bytes(const clattn_op *op)
{
    const double scores = (double)op->batch * (double)op->heads * (double)op->seq * (double)op->seq;
    double bytes = 3.0 * 4.0 * scores;              /* read twice, written once, 4-byte floats */
    if (op->key_padding_mask) bytes += 2.0 * scores; /* uint8, read in both passes */
    if (op->attn_mask == CLATTN_MASK_BOOL) bytes += 2.0 * scores;
    else if (op->attn_mask == CLATTN_MASK_FLOAT) bytes += 2.0 * 4.0 * scores;
    return bytes;
}

/* splitmix64: small, deterministic, good enough for benchmark data */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill_uniform(uint64_t *s, float *a, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) a[i] = lo + (hi - lo) * (float)((next_u64(s) >> 40) * (1.0 / 16777216.0));
}

/* *acc += a * b; 1 when that overflows */
static int add_product(size_t *acc, size_t a, size_t b)
{
    if (a && b > SIZE_MAX / a) return 1;
    if (*acc > SIZE_MAX - a * b) return 1;
    *acc += a * b;
    return 0;
}

int clattn_op_make(const clattn_op *op, uint64_t seed, clattn_op_data *data, char *msg, size_t len)
{
    if (!data) {
        if (msg && len) snprintf(msg, len, "no data");
        return 1;
    }
    memset(data, 0, sizeof *data);
    if (clattn_op_check(op, msg, len)) return 1;
    const size_t B = op->batch, T = op->seq, E = op->dim, H = op->heads;
    const size_t F = op->encoder ? clattn_op_ff_dim(op) : 0;
    /* x (B T E); 4 matrices (E, E), 4 biases (E); encoder: w_ff1 (F, E), w_ff2 (E, F), b_ff1 (F), b_ff2 (E),
     * LayerNorm gammas and betas 4 (E) */
    size_t total = 0;
    int over = T > SIZE_MAX / B || add_product(&total, B * T, E); /* x */
    const size_t x_n = total;
    over = over || E > SIZE_MAX / 4 || add_product(&total, 4 * E, E) || add_product(&total, 4, E);
    if (op->encoder)
        over = over || F > SIZE_MAX / 2 || add_product(&total, 2 * F, E) || add_product(&total, 1, F) ||
               add_product(&total, 5, E);
    if (over || total > SIZE_MAX / sizeof(float)) {
        if (msg && len) snprintf(msg, len, "sizes overflow");
        return 1;
    }
    float *m = malloc(total * sizeof *m);
    if (!m) {
        if (msg && len) snprintf(msg, len, "out of memory (%zu floats for x and the weights)", total);
        return 1;
    }
    uint64_t s = seed;
    const float wr = (float)(1.0 / sqrt((double)E));
    float *w_q = m + x_n, *w_k = w_q + E * E, *w_v = w_k + E * E, *w_o = w_v + E * E;
    float *b_q = w_o + E * E, *b_k = b_q + E, *b_v = b_k + E, *b_o = b_v + E;
    fill_uniform(&s, m, x_n, -1.0f, 1.0f);
    fill_uniform(&s, w_q, 4 * E * E, -wr, wr);
    fill_uniform(&s, b_q, 4 * E, -0.1f, 0.1f);
    if (op->encoder) {
        float *w1 = b_o + E, *w2 = w1 + F * E, *b1 = w2 + E * F, *b2 = b1 + F;
        float *g1 = b2 + E, *be1 = g1 + E, *g2 = be1 + E, *be2 = g2 + E;
        fill_uniform(&s, w1, F * E, -wr, wr);
        const float wr2 = (float)(1.0 / sqrt((double)F));
        fill_uniform(&s, w2, E * F, -wr2, wr2);
        fill_uniform(&s, b1, F + E, -0.1f, 0.1f);
        fill_uniform(&s, g1, E, 0.9f, 1.1f);
        fill_uniform(&s, be1, E, -0.1f, 0.1f);
        fill_uniform(&s, g2, E, 0.9f, 1.1f);
        fill_uniform(&s, be2, E, -0.1f, 0.1f);
        clattn_encoder_weights *ew = &data->encoder_weights;
        ew->w_ff1 = w1, ew->b_ff1 = b1, ew->w_ff2 = w2, ew->b_ff2 = b2;
        ew->ln1_weight = g1, ew->ln1_bias = be1, ew->ln2_weight = g2, ew->ln2_bias = be2;
        ew->w_ff1_count = F * E, ew->b_ff1_count = F, ew->w_ff2_count = E * F, ew->b_ff2_count = E;
        ew->ln1_weight_count = ew->ln1_bias_count = ew->ln2_weight_count = ew->ln2_bias_count = E;
        clattn_encoder_desc *ed = &data->encoder_desc;
        ed->ff_dim = F;
        ed->activation = op->activation;
        ed->norm_first = op->norm_first != 0;
        ed->eps = 1e-5f;
    }

    clattn_attention_desc *d = &data->desc;
    d->batch = B;
    d->seq_q = T;
    d->embed = E;
    d->heads = H;
    d->head_dim_qk = E / H;
    d->head_dim_v = E / H;
    d->out_dim = E;
    d->causal = op->causal != 0;
    d->dropout = op->dropout;
    d->seed = seed ^ 0x5DEECE66Dull;
    d->layout = CLATTN_LAYOUT_LINEAR;
    d->algorithm = op->algorithm;
    d->precision = op->precision;
    clattn_attention_weights *w = &data->weights;
    w->w_query = w_q, w->w_key = w_k, w->w_value = w_v, w->w_out = w_o;
    w->b_query = b_q, w->b_key = b_k, w->b_value = b_v, w->b_out = b_o;
    w->w_query_count = w->w_key_count = w->w_value_count = w->w_out_count = E * E;
    w->b_query_count = w->b_key_count = w->b_value_count = w->b_out_count = E;
    if (op->no_proj) { /* the core alone: x is Q, K and V; heads of E/H, the output their merged rows */
        memset(w, 0, sizeof *w);
        d->head_dim_qk = d->head_dim_v = 0;
        d->out_dim = 0;
    }
    if (op->encoder) {
        data->encoder_desc.attn = *d;
        data->encoder_weights.attn = *w;
    }
    data->x = m;
    data->x_in = m;
    data->elem = sizeof(float);
    data->x_count = x_n;
    data->out_count = x_n;
    data->storage_ = m;
    if (op->dtype != CLATTN_DTYPE_F32) { /* x and every weight in the type, the floats rounded to it */
        const size_t n = op->no_proj ? x_n : total;
        uint16_t *h = malloc(n * sizeof *h);
        if (!h || clattn_dtype_convert(m, CLATTN_DTYPE_F32, h, op->dtype, n) ||
            clattn_dtype_convert(h, op->dtype, m, CLATTN_DTYPE_F32, n)) {
            free(h), free(m);
            memset(data, 0, sizeof *data);
            if (msg && len) snprintf(msg, len, "out of memory (%zu halves for x and the weights)", n);
            return 1;
        }
        d->dtype = op->dtype;
        data->typed_ = h, data->x_in = h, data->elem = 2;
        const void **ws[8] = {&w->w_query, &w->w_key, &w->w_value, &w->w_out,
                              &w->b_query, &w->b_key, &w->b_value, &w->b_out};
        for (int i = 0; i < 8; i++)
            if (*ws[i]) *ws[i] = h + ((const float *)*ws[i] - m);
        if (op->encoder) {
            clattn_encoder_weights *ew = &data->encoder_weights;
            const void **es[8] = {&ew->w_ff1, &ew->b_ff1, &ew->w_ff2, &ew->b_ff2,
                                  &ew->ln1_weight, &ew->ln1_bias, &ew->ln2_weight, &ew->ln2_bias};
            for (int i = 0; i < 8; i++) *es[i] = h + ((const float *)*es[i] - m);
            data->encoder_desc.attn = *d;
            ew->attn = *w;
        }
    }
    return 0;
}

const float *clattn_op_data_floats(const clattn_op_data *data, const void *array)
{
    if (!data->typed_ || !array) return array;
    return data->storage_ + ((const uint16_t *)array - (const uint16_t *)data->typed_);
}

void clattn_op_data_free(clattn_op_data *data)
{
    if (!data) return;
    free(data->storage_);
    free(data->typed_);
    memset(data, 0, sizeof *data);
}
