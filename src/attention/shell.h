/* shell.h: the OpenCL backend's state of an attention plan, shared by its forward (shell.c) and its backward
 * pass (shell_backward.c). */
#ifndef CLATTN_SHELL_H
#define CLATTN_SHELL_H

#include "attention.h"

typedef clattn_view view;

/* A training plan's backward: its core and its buffers (shell_backward.c). */
typedef struct shell_train {
    clattn_core_instance core;    /* the backward core (select.c chose it) */
    cl_mem dproj, dproj_kv;       /* dQ|dK|dV laid out like the projections (cross: dQ, and dK|dV) */
    cl_mem dctx;                  /* the context's gradient (B, Tq, H*dv), with an output projection */
    cl_mem ctx;                   /* the recomputed context without one (with one: the shell's merged) */
    cl_mem gout_in, gx_out, gkv_out, gvalue_out; /* host staging: dOut, dx, dkv, dvalue */
    cl_mem gw[8];                 /* host staging: the parameters' gradients, in clattn_attention_grads' order */
    /* a half-precision plan's fp32 work buffers: dOut widened, the gradients before they are narrowed */
    cl_mem gout32, gx32, gkv32, gvalue32, gw32[8];
} shell_train;

typedef clattn_view view;

typedef struct shell {
    clattn_linear lin;            /* fill_rows for the bias rows, and the plan's GEMM core */
    clattn_core_instance core;
    clattn_core_layout lay;
    size_t n_qkv;                 /* self: H*dk + HK*(dk+dv) columns of the fused projection */
    /* weights (LINEAR layout) */
    cl_mem w_proj;                /* self: [Wq;Wk;Wv] (n_qkv, E); cross: Wq (H*dk, E) */
    cl_mem w_kv;                  /* cross: [Wk;Wv] (HK*(dk+dv), Ekv) */
    cl_mem b_proj, b_proj_kv;     /* the biases as projection rows ([bq|bk|bv]; cross [bq], [bk|bv]) */
    cl_mem b_q, b_k, b_v;         /* the biases for a core that adds them */
    cl_mem w_out, b_out;
    /* workspace */
    cl_mem proj, proj_kv;         /* projection outputs, token-major */
    cl_mem merged;                /* the core's output when an output projection follows: (B, Tq, H*dv) */
    /* staging for execution from host arrays */
    cl_mem x_in, kv_in, kpm_in, mask_in, out_buf, value_in;
    cl_mem lse_buf;               /* training plans: the rows' log-sum-exp when the caller's go elsewhere */
    cl_mem x32, kv32, value32, out32; /* a half-precision plan's inputs widened, its output before narrowing */
    cl_mem attn32;                /* the same for the weights on buffers (made at the first call wanting them) */
    int native_io;                /* a half plan whose core reads and writes its arrays as they are: no conversions */
    int typed_proj;               /* a half plan with projections on a GEMM core with reads_dtypes: its weights
                                     are kept in the type, and its projections read x and kv as they are */
    view out_f32;                 /* a half plan's fp32 output before narrowing: out32, or with typed_proj the
                                     Q|K|V projections' buffer, free again once the core has read it */
    /* desc.rope (shell_project.c): cl/attention/rope.cl, the plan's table of cos and sin, and without projections Q
     * and K rotated (self-attention: one buffer for both, as Q = K = x) */
    cl_program rope_prog;
    cl_kernel rope;
    cl_mem rope_cs, rope_q, rope_k;
    size_t rope_cs_positions;     /* the positions rope_cs holds (grown with the plan's table) */
    cl_mem rope_pos;              /* each row's position, Q's rows then K's (B*(Tq+Tk) uint32, made at the first call
                                     that gives positions or packs a varlen batch) */
    uint32_t *rope_pos_host;      /* its host copy, filled by each such call */
    cl_event rope_pos_written;    /* the upload from it (not blocking; NULL: none pending): waited for before the
                                     next call refills it, and before the plan frees it */
    /* desc.sinks (shell_sinks.c): cl/attention/sinks.cl and the heads' sink logits */
    cl_program sinks_prog;
    cl_kernel sinks_k, sinks_lse_k; /* sink_rows, and sink_lse (training plans) */
    cl_mem sinks_buf;
    shell_train train;            /* training plans: the backward pass (shell_backward.c) */
    clattn_marks marks; /* profiling markers of the last pass */
} shell;

typedef struct run_io {
    view x, kv, kpm, mask, out, attn; /* attn.mem NULL: not wanted (or read to attn_host) */
    view value;                       /* separate_value: V (else mem NULL) */
    float *attn_host;                 /* host path: where to read the weights, block by block (or NULL) */
    view lse, context;                /* training plans: the rows' log-sum-exp (always somewhere), the merged
                                         heads before the output projection (mem NULL: not wanted) */
    clattn_rows rows;                 /* the rows of x and out, kv and value: B*Tq and B*Tk, or a varlen batch's */
} run_io;

/* A half plan's x, kv and value widened into its fp32 work buffers, the views moved onto them; nothing where its
 * projections read them in the type (no such buffers: shell.c's typed_buffers). */
clattn_status clattn_shell_widen_inputs(struct clattn_plan *p, const clattn_rows *rows, view *x, view *kv, view *value);

/* A varlen batch's core (desc.varlen; shell_project.c): the core once per sequence, as a batch of one of its own
 * lengths (clattn_core_io.seq_q, seq_kv) on its rows of Q, K, V, the output and lse (the sequence's (H, L) rows at
 * H * its first row); a sequence with queries and no keys gets context 0 and lse -inf (rows with no visible key).
 * One launch per sequence, with the kernels of the padded batch; profiling marks the core as one stage (attention). */
clattn_status clattn_shell_core_varlen(struct clattn_plan *p, const clattn_rows *rows, const clattn_core_io *cio);

/* The projections (or the inputs themselves), the views the core reads Q, K and V from, Q and K rotated with
 * desc.rope (shell_project.c). */
clattn_status clattn_shell_project(struct clattn_plan *p, const run_io *io, clattn_core_io *cio);
/* desc.rope: the kernel, the table on the device and the rotated Q and K's buffers (plan creation; nothing without
 * rope), and in the backward the gradients of the rotated Q and K (dq, dk: H and HK heads, row strides dq_ld and
 * dk_ld) rotated back in place into those of the projections' Q and K. */
clattn_status clattn_shell_rope_init(struct clattn_plan *p);
clattn_status clattn_shell_rope_grad(struct clattn_plan *p, const clattn_rows *rows, view dq, size_t dq_ld, view dk,
                                     size_t dk_ld);

/* desc.sinks (shell_sinks.c): the kernel and the sinks on the device (plan creation; nothing without sinks), the
 * sinks written again (clattn_plan_set_weights), and the core's output rows `out` (row stride: the layout's out_ld)
 * scaled from their log-sum-exp `lse` (B*Tq rows of H, or a varlen batch's) into those of attention with the sinks;
 * a training plan's lse then becomes that of the weights with the sinks (sink_lse), the statistics its backward
 * takes. */
clattn_status clattn_shell_sinks_init(struct clattn_plan *p);
clattn_status clattn_shell_sinks_upload(struct clattn_plan *p);
clattn_status clattn_shell_sinks(struct clattn_plan *p, const clattn_rows *rows, view out, view lse);

/* shell_backward.c: a training plan's backward core and buffers (plan creation), their release and bytes, and the
 * backend's backward entry points. */
clattn_status clattn_shell_train_init(struct clattn_plan *p);
void clattn_shell_train_release(shell_train *t);
size_t clattn_shell_train_bytes(const shell_train *t);
clattn_status clattn_shell_backward_host(struct clattn_plan *p, const clattn_attention_args *a,
                                         const clattn_attention_grads *g);
clattn_status clattn_shell_backward_buffers(struct clattn_plan *p, const clattn_attention_buffers *b,
                                            const clattn_attention_grad_buffers *g, cl_uint nwait,
                                            const cl_event *wait, cl_event *event);

#endif
