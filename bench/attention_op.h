/* attention_op.h: the one description of the benchmarked operation, shared by
 * clattn-bench and tests/test_bench.c.
 *
 * The operation is nn.MultiheadAttention-style self-attention: x (B, T, E),
 * Q/K/V projections E -> E with biases, H heads of d = E/H, optional causal
 * mask and dropout, output projection E -> E with bias, LINEAR weight layout.
 * With `encoder` set it is a whole nn.TransformerEncoderLayer (batch_first,
 * eval, no dropout): that attention, two LayerNorms and the feed-forward
 * network E -> F -> E (biases, ReLU or GELU), post-norm or pre-norm.
 *
 * FLOP convention (one multiply-add = 2 FLOPs; what the GEMMs must compute):
 *   QKV projection   2 * (B*T) * (3E) * E
 *   out projection   2 * (B*T) * E * E
 *   attention core   4 * B * H * T^2 * d   (Q K^T and W V, 2*B*H*T^2*d each),
 *                    halved when causal, as FlashAttention counts it
 *   feed-forward     2 * (B*T) * F * E  twice (E -> F, F -> E), encoder only
 *   Bias adds, scaling, softmax, head reshuffles, residual adds, LayerNorm
 *   and the activation are not counted.
 *
 * Softmax byte convention (what the softmax kernel reads and writes, logically):
 *   it reads the B*H*T*T float scores twice (max/sum pass, normalise pass) and
 *   writes them once: 3 * 4 * B*H*T^2 bytes, causal or not (masked entries are
 *   still read). Masks are counted as the kernel reads them, once per score in
 *   each of the two passes: a key padding mask or a bool mask adds 2 * B*H*T^2
 *   bytes, a float mask 2 * 4 * B*H*T^2. The causal mask is computed, not read.
 */
#ifndef CLATTN_ATTENTION_OP_H
#define CLATTN_ATTENTION_OP_H

#include "clattn.h"

#include <stddef.h>
#include <stdint.h>

typedef struct clattn_op {
    size_t batch;   /* B */
    size_t seq;     /* T (self-attention: Tq = Tk = T) */
    size_t dim;     /* E */
    size_t heads;   /* H, divides E */
    int causal;
    float dropout;  /* training-mode dropout p on the attention weights, 0 = eval */
    int key_padding_mask;         /* counted by clattn_op_softmax_bytes only; the bench passes none */
    clattn_mask_kind attn_mask;   /* idem */
    /* the encoder layer (dropout must be 0) */
    int encoder;
    size_t ff_dim;                /* F; 0 = 4E (nn.TransformerEncoderLayer's usual choice) */
    clattn_activation activation;
    int norm_first;
    clattn_algorithm algorithm;   /* the attention core: AUTO (fused where it can), FUSED or UNFUSED */
    clattn_precision precision;   /* the core's products: FP32 (default) or TF32 (flash_mma only) */
    clattn_dtype dtype;           /* the plan's arrays: F32 (default), F16 or BF16 (attention only, not the encoder) */
    int no_proj;                  /* the core alone: no weights, x holds Q, K and V (H heads of E/H), the output the
                                     heads' merged rows, as torch's scaled_dot_product_attention; not the encoder */
} clattn_op;

typedef struct clattn_op_flop_count {
    double qkv_projection;  /* 2 (B T)(3E) E */
    double out_projection;  /* 2 (B T) E E */
    double projections;     /* the two above */
    double scores;          /* half of the core: Q K^T */
    double context;         /* the other half: W V */
    double core;            /* 4 B H T^2 d, halved when causal */
    double ffn;             /* encoder: 4 (B T) F E; else 0 */
    double total;           /* projections + core + ffn */
} clattn_op_flop_count;

/* 0 when the op is usable (every size >= 1, H divides E, 0 <= dropout < 1,
 * no dropout in an encoder); else 1 and a reason in msg. */
int clattn_op_check(const clattn_op *op, char *msg, size_t len);

/* F of an encoder op: ff_dim, or 4E when ff_dim is 0. */
size_t clattn_op_ff_dim(const clattn_op *op);

/* FLOPs per the convention above (the op must pass clattn_op_check). */
clattn_op_flop_count clattn_op_flops(const clattn_op *op);

/* Bytes the softmax stage reads and writes, per the convention above. */
double clattn_op_softmax_bytes(const clattn_op *op);

/* A ready-to-plan description with random weights and a random input. */
typedef struct clattn_op_data {
    clattn_attention_desc desc;        /* LINEAR layout, out_dim = E, scale 1/sqrt(d) */
    clattn_attention_weights weights;  /* all four matrices and all four biases */
    clattn_encoder_desc encoder_desc;  /* encoder ops: desc.attn is `desc` above */
    clattn_encoder_weights encoder_weights;
    float *x;                          /* (B, T, E) input, uniform in [-1, 1] (rounded to op.dtype) */
    const void *x_in;                  /* x in op.dtype, as the plan takes it (weights.* are in it too) */
    size_t elem;                       /* bytes of one element of op.dtype */
    size_t x_count, out_count;         /* elements of x and of the output */
    float *storage_;                   /* one allocation behind the arrays above */
    void *typed_;                      /* x and the weights in op.dtype (F16, BF16), else NULL */
} clattn_op_data;

/* Fill `data` for `op`: weights uniform in +-1/sqrt(fan_in) (as nn.Linear's init),
 * biases in +-0.1, LayerNorm gammas in [0.9, 1.1] and betas in +-0.1 (encoder),
 * from a deterministic generator seeded by `seed`.
 * Returns 0, or 1 with a reason in msg (bad op, out of memory). */
int clattn_op_make(const clattn_op *op, uint64_t seed, clattn_op_data *data, char *msg, size_t len);
void clattn_op_data_free(clattn_op_data *data);
/* The floats behind one of data's arrays (x_in, a weight): in an F16 or BF16 op's data the same values, widened
 * (what a float64 oracle reads); in an F32 op's the array itself. */
const float *clattn_op_data_floats(const clattn_op_data *data, const void *array);

#endif
