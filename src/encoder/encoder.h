/* encoder.h: the encoder layer (src/encoder/): the plan and its validation (encoder.c), which runs on the
 * device's backend: the CPU reference (encoder_ref.c) or OpenCL (encoder_cl.c). Its self-attention is an
 * attention plan on the same device. */
#ifndef CLATTN_ENCODER_H
#define CLATTN_ENCODER_H

#include "attention/attention.h"

struct clattn_encoder_cl;        /* encoder_cl.c */
struct clattn_encoder_ops;

struct clattn_encoder_plan {
    pthread_mutex_t lock;        /* one call at a time per plan */
    clattn_device *device;
    const struct clattn_encoder_ops *ops; /* the device's backend, chosen once at creation */
    clattn_encoder_desc d;       /* eps resolved; d.attn as given (p->attn holds the resolved one) */
    clattn_plan *attn;           /* the self-attention, a plan on the same device */
    size_t rows, E, F;           /* rows = B*T */
    /* host copies, normalised to LINEAR layout [out, in] */
    float *ln1_w, *ln1_b, *w_ff1, *b_ff1, *w_ff2, *b_ff2, *ln2_w, *ln2_b;
    struct clattn_encoder_cl *cl; /* OpenCL state, NULL on ref */
};

typedef struct clattn_encoder_ops {
    /* the device's own check of a validated description, before anything is allocated (NULL: none) */
    clattn_status (*check)(const clattn_device *dev, const clattn_encoder_desc *d);
    clattn_status (*init)(struct clattn_encoder_plan *p);   /* NULL: nothing to build */
    void (*release)(struct clattn_encoder_plan *p);
    clattn_status (*execute_host)(struct clattn_encoder_plan *p, const clattn_encoder_args *args);
    /* NULL: no device buffers (ref) */
    clattn_status (*execute_buffers)(struct clattn_encoder_plan *p, const clattn_encoder_buffers *b, cl_uint nwait,
                                     const cl_event *wait, cl_event *event);
    /* clattn_residual_layernorm_rows on this backend (arguments checked) */
    clattn_status (*layernorm_rows)(clattn_device *dev, size_t rows, size_t E, const float *x, const float *r,
                                    const float *bias, const float *gamma, const float *beta, float eps,
                                    int row_cache, float *sum_out, float *out);
} clattn_encoder_ops;

extern const clattn_encoder_ops clattn_encoder_ref;    /* encoder_ref.c */
extern const clattn_encoder_ops clattn_encoder_opencl; /* encoder_cl.c */

/* Residual + LayerNorm over `rows` rows of E on the CPU: v = fl(fl(x + r) + bias) (r, bias NULL = none),
 * sum_out = v (NULL = not wanted), out = (v - mean) / sqrt(var + eps) * gamma + beta, biased variance. */
void clattn_ref_residual_layernorm(size_t rows, size_t E, const float *x, const float *r, const float *bias,
                                   const float *gamma, const float *beta, float eps, float *sum_out, float *out);

/* The same on a device, from host arrays: ref runs the function above, OpenCL runs cl/encoder/layernorm.cl
 * alone (its residual_layernorm kernel, the variant the arguments call for). row_cache: -1 = as the encoder
 * chooses (the row in local memory when it fits), 0 = re-read the row from global memory, 1 = local memory.
 * For the tests and the demo. */
clattn_status clattn_residual_layernorm_rows(clattn_device *dev, size_t rows, size_t E, const float *x,
                                             const float *r, const float *bias, const float *gamma,
                                             const float *beta, float eps, int row_cache, float *sum_out,
                                             float *out);

#endif
