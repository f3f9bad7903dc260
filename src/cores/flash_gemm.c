/* flash_gemm.c: the register-tiled flash core for GPUs (cl/cores/flash_gemm.cl). A work-group of
 * (BQ/RM) x TC work-items per BQ query rows; work-item (ty, tx) keeps an RM x (BK/TC) micro-tile of the
 * scores and an RM x (DV/TC) micro-tile of the output in registers, so each value it reads from local memory
 * feeds several FMAs, as in a GEMM kernel (CLBlast's Xgemm, FlashAttention-2's tiling). SPLIT > 1 splits
 * each block's keys into parts of their own work-groups, merged by split_combine (flash.c), for plans whose
 * blocks are too few to fill a GPU. */
#include "core.h"


enum { BQ, BK, RM, TC, VW, SPLIT, PF, KVS };
static const size_t bq_v[] = {8, 16, 32, 64, 128}, bq_tried[] = {16, 32, 64};
static const size_t bk_v[] = {8, 16, 32, 64}, bk_tried[] = {16, 32};
static const size_t rm_v[] = {1, 2, 4, 8}, rm_tried[] = {2, 4, 8};
static const size_t tc_v[] = {2, 4, 8, 16, 32}, tc_tried[] = {8, 16};
static const size_t vw_v[] = {1, 4}, vw_tried[] = {4};
static const size_t split_v[] = {1, 2, 4, 8}, split_tried[] = {1, 2, 4};
static const size_t pf_v[] = {0, 1};
static const size_t kvs_v[] = {0, 1};
static const clattn_core_param params[] = {
    [BQ] = {"BQ", bq_v, 5, bq_tried, 3, NULL},
    [BK] = {"BK", bk_v, 4, bk_tried, 2, NULL},
    [RM] = {"RM", rm_v, 4, rm_tried, 2, NULL},
    [TC] = {"TC", tc_v, 5, tc_tried, 2, NULL},
    [VW] = {"VW", vw_v, 2, vw_tried, 1, NULL},
    [SPLIT] = {"SPLIT", split_v, 4, split_tried, 3, NULL},
    [PF] = {"PF", pf_v, 2, pf_v, 2, NULL},
    [KVS] = {"KVS", kvs_v, 2, kvs_v, 2, NULL},
};

/* the defaults; one row per work-item, narrow rows and scalar loads (other micro-tile edges and
 * remainders), the K and V tiles in one array; the keys of every block split into 4 parts and merged
 * (split_combine), with the next tiles (of 8 keys: within the registers' budget at every head size) loaded
 * through registers into that one array */
static const char *const test_configs[] = {"-", "RM=1,TC=4,VW=1,KVS=1", "BK=8,SPLIT=4,PF=1,KVS=1", NULL};

#define MAX_GROUP 256 /* work-items per work-group the kernel is written for */
#define MAX_ACC 64    /* output accumulators per work-item (floats): more would spill on a GPU */
#define MAX_LIVE 128  /* accumulators and the next tiles in flight (PF), floats per work-item */

/* The kernel's local arrays in bytes: Q block (rows padded by one vector, and one more per work-item row), K and V
 * tiles (rows padded by one vector; one array for both with KVS), P tile, the row maxima's partials. */
static size_t local_bytes(size_t dk, size_t dv, const clattn_core_params *p)
{
    const size_t vw = p->v[VW], krow = dk / vw + 1, vrow = dv / vw + 1;
    const size_t tiles = p->v[KVS] ? p->v[BK] * (krow > vrow ? krow : vrow) : p->v[BK] * (krow + vrow);
    const size_t qblock = p->v[BQ] * krow + p->v[BQ] / p->v[RM]; /* a vector more per work-item row */
    return sizeof(float) * (vw * (qblock + tiles) + p->v[BQ] * (p->v[BK] + 1) + p->v[BQ] * (p->v[TC] + 1));
}

/* Floats of output accumulators per work-item: RM rows x its value vectors. */
static size_t accumulators(size_t dv, const clattn_core_params *p)
{
    const size_t vecs = dv / p->v[VW];
    return p->v[RM] * ((vecs + p->v[TC] - 1) / p->v[TC]) * p->v[VW];
}

/* Floats of the next K and V tiles a work-item holds with PF = 1. */
static size_t prefetch(size_t dk, size_t dv, const clattn_core_params *p)
{
    if (!p->v[PF]) return 0;
    const size_t wg = p->v[BQ] / p->v[RM] * p->v[TC], vw = p->v[VW];
    return vw * ((p->v[BK] * (dk / vw) + wg - 1) / wg + (p->v[BK] * (dv / vw) + wg - 1) / wg);
}

static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core;
    if (p->v[BQ] % p->v[RM] || p->v[BK] % p->v[TC]) return 0;
    const size_t wg = p->v[BQ] / p->v[RM] * p->v[TC];
    if (wg > MAX_GROUP || (caps && wg > caps->max_work_group)) return 0;
    if (!d) return 1;
    if (d->head_dim_qk % p->v[VW] || d->head_dim_v % p->v[VW]) return 0;
    if (accumulators(d->head_dim_v, p) > MAX_ACC) return 0;
    if (accumulators(d->head_dim_v, p) + prefetch(d->head_dim_qk, d->head_dim_v, p) > MAX_LIVE) return 0;
    return !caps || local_bytes(d->head_dim_qk, d->head_dim_v, p) + CLATTN_LOCAL_SLACK <= caps->local_mem;
}

/* Starting points per head-size class, by construction and scripts/gpu-static.sh (sm_90, clang 15 + ptxas 13:
 * indicative; on an H200: 32 TFLOP/s at d64, 25 at d128, 14 at d256, bench/results/h200-2026-11-26.md; tune kept them). Each keeps at most 64
 * accumulators per work-item and fits 48 KiB of local memory (NVIDIA's OpenCL limit per work-group). Ceilings of
 * the whole tile (bench/results/gpu-static-sm90.md), FMA peak 67 TFLOP/s:
 *   <=64:  64 rows x 32 keys, 8x4 score and 8x8 output micro-tiles, 64 work-items, 45 KiB: 46 (254 registers, no
 *          spill; 4x4 and 4x8 micro-tiles: 34 with the S and P V loops fully unrolled, 17 as counted before)
 *   <=128: 32 rows x 32 keys, 4x4 and 4x16, K and V tiles in one array (KVS), 64 work-items, 38 KiB: 36 (193
 *          registers; 16 keys and separate arrays: 28)
 *   >128:  16 rows x 8 keys, 2x1 and 2x32, 64 work-items, 33 KiB (dk = dv = 256)
 * bound by local memory as scripts/gpu-static.sh counts it (no broadcast: every 16-byte load 4 wavefronts; with
 * broadcasts counted it is the FMA pipe, flash_gemm.cl), then shrunk (BK, then BQ) while they do not fit the
 * device; VW = 4 where both head sizes allow it. */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    const int cls = clattn_head_class(d->head_dim_qk, d->head_dim_v);
    static const size_t start[CLATTN_HEAD_CLASSES][5] = {
        {64, 32, 8, 8, 0}, {64, 32, 8, 8, 0}, {32, 32, 4, 8, 1}, {16, 8, 2, 8, 0}, {16, 8, 2, 8, 0},
    };
    p->v[BQ] = start[cls][0], p->v[BK] = start[cls][1], p->v[RM] = start[cls][2], p->v[TC] = start[cls][3];
    p->v[KVS] = start[cls][4];
    p->v[VW] = d->head_dim_qk % 4 == 0 && d->head_dim_v % 4 == 0 ? 4 : 1;
    p->v[SPLIT] = 1;
    p->v[PF] = 0; /* ptx-check: 96-254 registers with it, by shape; for a measurement to choose (tune) */
    while (!fits(core, caps, d, p)) {
        if (p->v[BK] > p->v[TC] && p->v[BK] > 8) p->v[BK] /= 2;
        else if (p->v[BQ] > p->v[RM] && p->v[BQ] > 8) p->v[BQ] /= 2;
        else return 0;
    }
    p->v[SPLIT] = clattn_flash_split_default(caps, d, p->v[BQ], p->v[BK]);
    return 1;
}

/* The split parts' workspace with the defaults (parameters from a file or the environment may differ). */
static size_t workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay)
{
    (void)lay;
    clattn_core_params p;
    return defaults(core, caps, d, &p) ? clattn_flash_split_floats(d, p.v[SPLIT]) : 0;
}

static size_t rows(const clattn_core_params *p) { return p->v[BQ]; }
static size_t group(const clattn_core_params *p) { return p->v[BQ] / p->v[RM] * p->v[TC]; }

/* NVIDIA's OpenCL takes inline PTX (caps.nv_inline_ptx): the softmax's exp2 on the special-function unit
 * (common/exp2.cl); the tile's loops unrolled whole on GPUs, in part on CPUs (flash_gemm.cl, UNROLL_ALL) */
static int defines(const clattn_caps *caps, const clattn_attention_desc *d, char *opts, size_t len)
{
    (void)d;
    return snprintf(opts, len, " -DEX2_PTX=%d -DUNROLL_ALL=%d", caps->nv_inline_ptx ? 1 : 0,
                    caps->dclass != CLATTN_CLASS_CPU);
}

static const clattn_flash_spec spec = {
    .source = "cores/flash_gemm", .kernel = "flash_gemm", .launch = CLATTN_FLASH_PER_GROUP, .rows = rows,
    .group = group, .shrink = BQ, .split = SPLIT, .defines = defines,
};

/* the local arrays, for the family's check against the compiled kernel */
static size_t local_of(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                       const clattn_core_params *p)
{
    (void)core, (void)caps;
    return local_bytes(d->head_dim_qk, d->head_dim_v, p);
}

const clattn_core clattn_core_flash_gemm = {
    .name = "flash_gemm",
    .kind = CLATTN_CORE_PREFILL,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .saves_row_stats = 1,
    .reads_dtypes = 1,
    .params = params,
    .nparams = 8,
    .test_configs = test_configs,
    .spec = &spec,
    .supports = clattn_flash_supports_tiles,
    .defaults = defaults,
    .fits = fits,
    .build = clattn_flash_build,
    .run = clattn_flash_run,
    .local_bytes = local_of,
    .workspace = workspace,
    .device_bytes = clattn_flash_device_bytes,
    .release = clattn_flash_release,
};
