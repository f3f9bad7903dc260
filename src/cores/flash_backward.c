/* flash_backward.c: the fused backward core (cl/cores/flash_backward.cl), FlashAttention-2's backward for
 * training plans: D = rowsum(dctx * ctx), then a dQ pass over query rows and a dK/dV pass over key rows, each
 * recomputing the weights from Q, K and the forward's log-sum-exp; no Tq x Tk buffer, only D (B, H, Tq).
 * Its work-items keep ROWS rows and their gradients, transposed (the rows are a vector's lanes), and stream the
 * other side's rows through the cache, PART of them per step (flash_rows' shape: CPU devices). GQA: a dK/dV
 * work-item sums the GROUP query heads of its key/value head, so no two work-items write one gradient (no atomics).
 *
 * Kernel arguments of bwd_dq and bwd_dkdv (flash_backward.cl's BWD_ARGS), then the gradients' rows:
 *   q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, dctx, dctx_off, dctx_ld     (clattn_core_arg_rows)
 *   lse, lse_off, D                                                              the rows' statistics
 *   kpm, kpm_off, mask, mask_off, Tq, Tk, H                                      (clattn_core_arg_masks)
 *   scale, extent, seed_lo, seed_hi, threshold, keep_scale, drop_b0              (clattn_core_arg_dropout) */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

enum { ROWS, PART };
static const size_t rows_v[] = {1, 2, 4, 8, 16}, rows_tried[] = {4, 8, 16};
static const size_t part_v[] = {1, 2, 4, 8}, part_tried[] = {2, 4, 8};
static const clattn_core_param params[] = {
    [ROWS] = {"ROWS", rows_v, 5, rows_tried, 3, NULL},
    [PART] = {"PART", part_v, 4, part_tried, 3, NULL},
};
/* the test suite's entries: a CPU's defaults (16 rows, 8 partners: partners past the end of every short case), one
 * row per work-item (scalar lanes) with 2 partners, a GPU's defaults (8 and 4), and PART=1 (the partner loop's
 * 1-step form) */
static const char *const test_configs[] = {"-", "ROWS=1,PART=2", "ROWS=8,PART=4", "ROWS=2,PART=1", NULL};


typedef struct bwd_state {
    const clattn_device *dev;
    clattn_attention_desc d;
    clattn_core_layout lay; /* where Q, K and V are */
    clattn_core_params p;
    cl_program prog;
    cl_kernel k_dot, k_dq, k_dkdv;
    cl_mem dd; /* D, (B, H, Tq) */
} bwd_state;

/* Defaults. CPUs: 16 rows, one float16 (an AVX-512 register) per head column, 8 partner rows per step (4 on
 * llvmpipe, below). PoCL,
 * 2 vCPU Zen 4, B=4 T=1024 E=512 H=8, the core's backward (bench/results/pocl-2core-backward.md): one partner
 * per step and one FMA chain per dot, ROWS=16 394 ms, 8 640 ms, 4 1197 ms; ROWS=16 with PART=1 (two chains)
 * 339 ms, 2 210 ms, 4 170 ms, 8 170 ms; ROWS=8 PART=4 223 ms, ROWS=4 PART=4 428 ms. Since flash_lanes (a faster
 * machine of the same kind, bench/results/pocl-2core-reshape.md, three rounds alternating): ROWS=16 with PART=8
 * against 4, core backward at T1024, 88 ms against 97 (d64), 83 against 88 (d128), 97-103 against 105-110
 * (d32), 80 against 91 (d256), 49 against 52 (d64 causal); at T2048 338-344 against 370-380 (d64), 319-325
 * against 342-350 (d128). So 8 partners on CPUs, but for Mesa's llvmpipe (the CPU driver with a loop limit): its
 * compiler had not finished the 8-partner kernels after 13 minutes, holding 7 GB (CI's self-test, 2026-11-27), and
 * takes seconds over 4.
 * GPUs (no GPU has run it yet): 8 rows and 4 partners, the largest that spill no registers in sm_90's PTX
 * (ptx-check, head sizes 64 to 256: 210 and 231 registers; ROWS=16 PART=4 spills, 255). */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    p->v[ROWS] = caps->dclass == CLATTN_CLASS_CPU ? 16 : 8;
    p->v[PART] = caps->dclass == CLATTN_CLASS_CPU && !caps->loop_limit ? 8 : 4;
    clattn_core_fit_trips(core, caps, d, p, ROWS); /* fewer rows where the driver ends loops early */
    return 1;
}

/* A work-item's loop iterations, every loop of flash_backward.cl counted: per step of PART partners, the two dot
 * products (DK/2 + DV/2 + 2), the masks and dropout draws of ROWS lanes per partner (a Philox draw is 10 rounds)
 * and the gradient accumulations (DK + DV); the dQ pass steps over Tk keys, the dK/dV pass over Tq queries of
 * each of the GROUP heads sharing a KV head; before and after, the rows' transposed loads and stores. */
static size_t trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    const clattn_core_params *p)
{
    (void)core, (void)caps;
    const size_t r = p->v[ROWS], part = p->v[PART], dk = d->head_dim_qk, dv = d->head_dim_v;
    const size_t tk = d->seq_kv ? d->seq_kv : d->seq_q, group = d->kv_heads ? d->heads / d->kv_heads : 1;
    const size_t step = 4 + dk / 2 + dv / 2 + part * r * (2 + (d->dropout > 0.0f ? 11 : 0)) + dk + dv;
    const size_t edges = 3 * (dk + dv) * (1 + r) + 4 * r;
    const size_t dq = (tk + part - 1) / part * step, dkdv = group * ((d->seq_q + part - 1) / part * (step + 1) + 1);
    return (dq > dkdv ? dq : dkdv) + edges;
}

static size_t workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay)
{
    (void)core, (void)caps, (void)lay;
    return d->batch * d->heads * d->seq_q;
}

static void release(void *state)
{
    bwd_state *s = state;
    if (!s) return;
    clattn_kernel_release(&s->k_dot);
    clattn_kernel_release(&s->k_dq);
    clattn_kernel_release(&s->k_dkdv);
    clattn_mem_release(&s->dd);
    clattn_program_release(&s->prog);
    free(s);
}

static clattn_status build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                           const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    (void)core;
    bwd_state *s = clattn_calloc(1, sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the backward core's state");
    *state = s;
    s->dev = dev;
    s->d = *d;
    s->lay = *lay;
    s->p = *p;
    char opts[512];
    int n = clattn_core_attention_defines(d, CLATTN_DEFINES_ALL, opts, sizeof opts);
    if (n > 0 && (size_t)n < sizeof opts) clattn_core_param_defines(core, p, -1, 0, opts + n, sizeof opts - (size_t)n);
    const char *src[] = {"common/philox", "common/mask", "cores/backward_common", "cores/flash_backward"};
    clattn_status st = clattn_program_build(dev, src, sizeof src / sizeof src[0], opts, &s->prog);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_kernel_create(s->prog, "bwd_dot", &s->k_dot);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_kernel_create(s->prog, "bwd_dq", &s->k_dq);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_kernel_create(s->prog, "bwd_dkdv", &s->k_dkdv);
    if (st == CLATTN_STATUS_SUCCESS)
        st = clattn_buffer_new(dev, d->batch * d->heads * d->seq_q, sizeof(float), NULL, "the backward's row dots",
                               &s->dd);
    if (st != CLATTN_STATUS_SUCCESS) {
        release(s);
        *state = NULL;
    }
    return st;
}

static clattn_status run_backward(void *state, const clattn_backward_io *io)
{
    bwd_state *s = state;
    /* a varlen batch's sequence (io->seq_q), or the plan's shape */
    const clattn_attention_desc shape = clattn_core_shape(&s->d, io->seq_q, io->seq_kv), *d = &shape;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, H = d->heads, HK = d->kv_heads;
    const size_t rows = s->p.v[ROWS];
    TRY(clattn_core_backward_dot(s->dev, s->k_dot, io, s->dd, d)); /* D = rowsum(dctx * ctx) */
    clattn_args a;
    /* the dQ pass over query rows, then the dK/dV pass over key rows */
    const size_t extent[2] = {B * H * ((Tq + rows - 1) / rows), B * HK * ((Tk + rows - 1) / rows)};
    cl_kernel ks[2] = {s->k_dq, s->k_dkdv};
    static const char *names[2] = {"bwd_dq", "bwd_dkdv"};
    for (int pass = 0; pass < 2; pass++) {
        clattn_args_begin(&a, ks[pass], names[pass]);
        clattn_core_arg_backward(&a, io, &s->lay, s->dd, d, extent[pass], pass);
        TRY(clattn_args_end(&a));
        TRY(clattn_enqueue_1d(s->dev, ks[pass], extent[pass], names[pass]));
    }
    return CLATTN_STATUS_SUCCESS;
}

static size_t device_bytes(const void *state) { return clattn_mem_bytes(((const bwd_state *)state)->dd); }

const clattn_core clattn_core_flash_backward = {
    .name = "flash_backward",
    .kind = CLATTN_CORE_BACKWARD,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .saves_row_stats = 1,
    .params = params,
    .nparams = 2,
    .test_configs = test_configs,
    .supports = clattn_flash_supports, /* head sizes up to CLATTN_FLASH_MAX_HEAD: its rows' private arrays */
    .defaults = defaults,
    .trips = trips,
    .workspace = workspace,
    .build = build,
    .run_backward = run_backward,
    .device_bytes = device_bytes,
    .release = release,
};
