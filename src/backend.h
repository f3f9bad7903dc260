/* backend.h: the seam where an attention plan's computation varies. A plan gets one backend at
 * creation and goes through it for everything device-specific; plan.c (validation, weights,
 * the public entry points) and the encoder layer see only this table.
 *   ref      the plain-C reference on the CPU (reference.c)
 *   unfused  OpenCL: CLBlast GEMMs around the softmax kernel, through a score matrix (attention_cl.c)
 *   fused    OpenCL: the projections by CLBlast, the core by cl/flash.cl (attention_cl.c,
 *            attention_fused.c) */
#ifndef CLATTN_BACKEND_H
#define CLATTN_BACKEND_H

#include "internal.h"

typedef struct clattn_backend_ops {
    const char *name;
    int produces_weights;   /* can an execution return the attention weights? */
    /* device state (buffers, kernels) for a validated plan; NULL: none needed */
    clattn_status (*init)(struct clattn_plan *p);
    void (*release)(struct clattn_plan *p);
    clattn_status (*execute_host)(struct clattn_plan *p, const clattn_attention_args *a);
    /* NULL: the backend has no device buffers (ref) */
    clattn_status (*execute_buffers)(struct clattn_plan *p, const clattn_attention_buffers *b, cl_uint nwait,
                                     const cl_event *wait, cl_event *event);
    clattn_status (*stage_times)(struct clattn_plan *p, double ms[CLATTN_NSTAGES]);
} clattn_backend_ops;

extern const clattn_backend_ops clattn_backend_ref;
extern const clattn_backend_ops clattn_backend_unfused;
extern const clattn_backend_ops clattn_backend_fused;

#endif
