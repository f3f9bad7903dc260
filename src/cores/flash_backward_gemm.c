/* flash_backward_gemm.c: the backward core for GPUs (cl/cores/flash_backward_gemm.cl), FlashAttention-2's backward in
 * flash_gemm's shape: D = rowsum(dctx * ctx), then a dQ pass of work-groups over BQ query rows streaming K and V tiles
 * through local memory, and a dK/dV pass of work-groups over BK key rows streaming Q and dctx tiles (each of the
 * GROUP query heads of its key/value head: no atomics); every product an RQ or RK x (tile / TC) register micro-tile per
 * work-item. flash_backward keeps whole rows per work-item in private arrays (16-33 KiB of stack per work-item in
 * sm_90's PTX): a CPU's shape; this is a GPU's. AUTO's backward core on NVIDIA GPUs up to head size 64 (registry.c):
 * on an H200, 20.2 ms against flash_backward's 158 at B2 T4096 H16 d64; elsewhere CLATTN_CORE=flash_backward_gemm
 * runs it (the test suite does, on PoCL).
 *
 * Kernel arguments of bwd_dq_tiles and bwd_dkdv_tiles (backward_common.cl's BWD_ARGS, extent the launch's first
 * work-group), then the gradients' rows, as flash_backward.c's. */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

enum { BQ, BK, RQ, RK, TC };
static const size_t tile_v[] = {8, 16, 32, 64}, tile_tried[] = {16, 32};
static const size_t rows_v[] = {1, 2, 4, 8}, rows_tried[] = {2, 4};
static const size_t tc_v[] = {2, 4, 8, 16}, tc_tried[] = {4, 8};
static const clattn_core_param params[] = {
    [BQ] = {"BQ", tile_v, 4, tile_tried, 2, NULL},
    [BK] = {"BK", tile_v, 4, tile_tried, 2, NULL},
    [RQ] = {"RQ", rows_v, 4, rows_tried, 2, NULL},
    [RK] = {"RK", rows_v, 4, rows_tried, 2, NULL},
    [TC] = {"TC", tc_v, 4, tc_tried, 2, NULL},
};
/* the test suite's entries: the defaults, and small unequal tiles with one row per work-item (every edge: tiles past
 * the end, columns past the head size at 4 work-items a row) */
static const char *const test_configs[] = {"-", "BQ=16,BK=8,RQ=1,RK=1,TC=4", NULL};

#define MAX_GROUP 256 /* work-items per work-group the kernels are written for */
#define MAX_ACC 64    /* gradient accumulators per work-item (floats) in the dK/dV pass: more would spill */

static size_t group_q(const clattn_core_params *p) { return p->v[BQ] / p->v[RQ] * p->v[TC]; }
static size_t group_k(const clattn_core_params *p) { return p->v[BK] / p->v[RK] * p->v[TC]; }

/* Bytes of the larger of the two passes' local arrays, as flash_backward_gemm.cl declares them: rows padded by one
 * vector (4 floats where both head sizes are multiples of 4, else 1), the blocks read by ty grouped by RQ or RK rows
 * with a vector more per group; bwd_dq_tiles: Q and dctx blocks, K and V tiles, dS; bwd_dkdv_tiles: K and V blocks,
 * Q and dctx tiles, W and dS, the tile's lse and D. */
static size_t local_bytes(size_t dk, size_t dv, const clattn_core_params *p)
{
    const size_t bq = p->v[BQ], bk = p->v[BK], rq = p->v[RQ], rk = p->v[RK];
    const size_t vw = dk % 4 == 0 && dv % 4 == 0 ? 4 : 1, ldk = dk + vw, ldv = dv + vw;
    const size_t dq = bq / rq * (rq * (ldk + ldv) + 2 * vw) + bk * (ldk + ldv) + bq * (bk + 1);
    const size_t dkdv = bk / rk * (rk * (ldk + ldv) + 2 * vw) + bq * (ldk + ldv) + 2 * bk * (bq + 1) + 2 * bq;
    return sizeof(float) * (dq > dkdv ? dq : dkdv);
}

static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core;
    const size_t tc = p->v[TC];
    if (p->v[BQ] % p->v[RQ] || p->v[BK] % p->v[RK] || p->v[BQ] % tc || p->v[BK] % tc) return 0;
    const size_t wg = group_q(p) > group_k(p) ? group_q(p) : group_k(p);
    if (wg > MAX_GROUP || (caps && wg > caps->max_work_group)) return 0;
    if (!d) return 1;
    const size_t nk = (d->head_dim_qk + tc - 1) / tc, nv = (d->head_dim_v + tc - 1) / tc;
    if (p->v[RQ] * nk > MAX_ACC || p->v[RK] * (nk + nv) > MAX_ACC) return 0;
    return !caps || local_bytes(d->head_dim_qk, d->head_dim_v, p) + CLATTN_LOCAL_SLACK <= caps->local_mem;
}

/* Starting points per head-size class, by construction and scripts/gpu-static.sh (sm_90, clang 15 + ptxas 13:
 * indicative; on an H200 at d64: 17 TFLOP/s, bench/results/h200-2026-11-26.md), within 48 KiB (NVIDIA's OpenCL limit per work-group), no spill:
 *   <=64:  32 query rows x 32 keys, 4 rows a work-item in both passes, 8 work-items a row (64 a group): 42 KiB;
 *          ceilings 33 (dQ) and 34 (dK/dV) TFLOP/s, 220 and 254 registers
 *   <=128: 16 x 16, 4 rows a work-item in the dQ pass (32 a group) and 2 in the dK/dV pass (64; 4 spilled 140 bytes
 *          there, its accumulators 4 (DK + DV) / TC = 128): 35 KiB; ceilings 25 and 19, 255 and 168 registers (2
 *          rows in the dQ pass too: 18)
 *   >128:  8 x 8, 1 row a work-item: 33 KiB
 * then shrunk (BK, then BQ) while they do not fit the device. */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    const int cls = clattn_head_class(d->head_dim_qk, d->head_dim_v);
    static const size_t start[CLATTN_HEAD_CLASSES][4] = {
        {32, 32, 4, 4}, {32, 32, 4, 4}, {16, 16, 4, 2}, {8, 8, 1, 1}, {8, 8, 1, 1},
    };
    p->v[BQ] = start[cls][0], p->v[BK] = start[cls][1], p->v[RQ] = start[cls][2], p->v[RK] = start[cls][3];
    p->v[TC] = 8;
    while (!fits(core, caps, d, p)) {
        if (p->v[BK] > p->v[TC] && p->v[BK] > p->v[RK] && p->v[BK] > 8) p->v[BK] /= 2;
        else if (p->v[BQ] > p->v[TC] && p->v[BQ] > p->v[RQ] && p->v[BQ] > 8) p->v[BQ] /= 2;
        else return 0;
    }
    return 1;
}

static clattn_status supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                              char *why, size_t len)
{
    return clattn_core_supports_heads(core, caps, d, CLATTN_FLASH_MAX_HEAD, 1, why, len);
}

static size_t local_of(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                       const clattn_core_params *p)
{
    (void)core, (void)caps;
    return local_bytes(d->head_dim_qk, d->head_dim_v, p);
}

static size_t workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay)
{
    (void)core, (void)caps, (void)lay;
    return d->batch * d->heads * d->seq_q;
}

typedef struct bwd_state {
    const clattn_device *dev;
    clattn_attention_desc d;
    clattn_core_layout lay;
    clattn_core_params p;
    cl_program prog;
    cl_kernel k_dot, k_dq, k_dkdv;
    cl_mem dd; /* D, (B, H, Tq) */
} bwd_state;

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

/* The compiled kernel takes a work-group of wg work-items (a driver may allow fewer: UNSUPPORTED, named). */
static clattn_status check_group(const clattn_device *dev, cl_kernel k, size_t wg, const char *name)
{
    size_t allowed = 0;
    CL_CHECK(clGetKernelWorkGroupInfo(k, dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof allowed, &allowed, NULL),
             "work-group size of the backward's kernels");
    if (allowed < wg)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "flash_backward_gemm: the compiled %s allows %zu work-items a "
                           "group, the parameters need %zu", name, allowed, wg);
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                           const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    bwd_state *s = clattn_calloc(1, sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the backward core's state");
    *state = s;
    s->dev = dev;
    s->d = *d;
    s->lay = *lay;
    s->p = *p;
    char opts[600];
    int n = clattn_core_attention_defines(d, CLATTN_DEFINES_ALL, opts, sizeof opts);
    if (n > 0 && (size_t)n < sizeof opts)
        n += clattn_core_param_defines(core, p, -1, 0, opts + n, sizeof opts - (size_t)n);
    /* NVIDIA's OpenCL takes inline PTX: the weights' exp2 on the special-function unit (common/exp2.cl) */
    if (n > 0 && (size_t)n < sizeof opts)
        snprintf(opts + n, sizeof opts - (size_t)n, " -DEX2_PTX=%d", dev->caps.nv_inline_ptx ? 1 : 0);
    const char *src[] = {"common/philox", "common/mask", "common/exp2", "cores/backward_common",
                         "cores/flash_backward_gemm"};
    clattn_status st = clattn_program_build(dev, src, sizeof src / sizeof src[0], opts, &s->prog);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_kernel_create(s->prog, "bwd_dot", &s->k_dot);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_kernel_create(s->prog, "bwd_dq_tiles", &s->k_dq);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_kernel_create(s->prog, "bwd_dkdv_tiles", &s->k_dkdv);
    if (st == CLATTN_STATUS_SUCCESS && !clattn_device_simulated(dev))
        st = check_group(dev, s->k_dq, group_q(p), "bwd_dq_tiles");
    if (st == CLATTN_STATUS_SUCCESS && !clattn_device_simulated(dev))
        st = check_group(dev, s->k_dkdv, group_k(p), "bwd_dkdv_tiles");
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_core_check_local(core, dev, d, p, s->k_dq);
    if (st == CLATTN_STATUS_SUCCESS) st = clattn_core_check_local(core, dev, d, p, s->k_dkdv);
    if (st == CLATTN_STATUS_SUCCESS)
        st = clattn_buffer_new(dev, d->batch * d->heads * d->seq_q, sizeof(float), NULL, "the backward's row dots",
                               &s->dd);
    if (st != CLATTN_STATUS_SUCCESS) {
        release(s);
        *state = NULL;
    }
    return st;
}

/* the launch's first work-group: BWD_ARGS's extent (argument 23) */
static clattn_status set_first(cl_kernel k, size_t first, void *ctx)
{
    (void)ctx;
    const cl_ulong f = first;
    CL_CHECK(clSetKernelArg(k, 23, sizeof f, &f), "the backward's first work-group");
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status run_backward(void *state, const clattn_backward_io *io)
{
    bwd_state *s = state;
    /* a varlen batch's sequence (io->seq_q), or the plan's shape */
    const clattn_attention_desc shape = clattn_core_shape(&s->d, io->seq_q, io->seq_kv), *d = &shape;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->seq_kv, H = d->heads, HK = d->kv_heads;
    TRY(clattn_core_backward_dot(s->dev, s->k_dot, io, s->dd, d)); /* D = rowsum(dctx * ctx) */
    clattn_args a;
    /* the dQ pass over query blocks, then the dK/dV pass over key blocks */
    const size_t bq = s->p.v[BQ], bk = s->p.v[BK];
    const size_t groups[2] = {B * H * ((Tq + bq - 1) / bq), B * HK * ((Tk + bk - 1) / bk)};
    const size_t wg[2] = {group_q(&s->p), group_k(&s->p)};
    cl_kernel ks[2] = {s->k_dq, s->k_dkdv};
    static const char *names[2] = {"bwd_dq_tiles", "bwd_dkdv_tiles"};
    for (int pass = 0; pass < 2; pass++) {
        clattn_args_begin(&a, ks[pass], names[pass]);
        clattn_core_arg_backward(&a, io, &s->lay, s->dd, d, 0, pass); /* extent: the first group, set per launch */
        TRY(clattn_args_end(&a));
        TRY(clattn_enqueue_groups(s->dev, ks[pass], groups[pass], wg[pass], set_first, NULL, names[pass]));
    }
    return CLATTN_STATUS_SUCCESS;
}

static size_t device_bytes(const void *state) { return clattn_mem_bytes(((const bwd_state *)state)->dd); }

const clattn_core clattn_core_flash_backward_gemm = {
    .name = "flash_backward_gemm",
    .kind = CLATTN_CORE_BACKWARD,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .saves_row_stats = 1,
    .params = params,
    .nparams = 5,
    .test_configs = test_configs,
    .supports = supports,
    .defaults = defaults,
    .fits = fits,
    .local_bytes = local_of,
    .workspace = workspace,
    .build = build,
    .run_backward = run_backward,
    .device_bytes = device_bytes,
    .release = release,
};
