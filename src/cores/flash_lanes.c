/* flash_lanes.c: the flash core for CPU devices with the query rows along the vector lanes
 * (cl/cores/flash_lanes.cl): one work-item per VW query rows, their scores, softmax statistics and outputs
 * one vector each, so that every product is a broadcast and an FMA, as in a GEMM's micro-kernel, and no
 * horizontal sum is ever taken. */
#include "core.h"

#include <stddef.h>

enum { VW, BK, KG };
static const size_t vw_v[] = {8, 16};
static const size_t bk_v[] = {8, 16, 32, 64}, bk_tried[] = {16, 32, 64};
static const size_t kg_v[] = {4, 8};
static const clattn_core_param params[] = {
    [VW] = {"VW", vw_v, 2, vw_v, 2, NULL},
    [BK] = {"BK", bk_v, 4, bk_tried, 3, NULL},
    [KG] = {"KG", kg_v, 2, kg_v, 2, NULL},
};
static const char *const test_configs[] = {"VW=8,BK=8,KG=4", NULL};

/* Defaults: the device's native float width as the rows (16 with AVX-512, else 8), blocks of 64 keys in score
 * groups of 8. Measured on PoCL 3.1, 2 vCPUs of an AMD EPYC (AVX-512), clattn-bench --no-proj B=4 T=1024 H=8 d64,
 * GFLOP/s of the core over two rounds (bench/results/pocl-2core-lanes.md): VW=16 BK=64 KG=8 302-302, BK=32 269-295,
 * BK=16 276-282, KG=4 260-264; VW=8 (as on an AVX2 device) 156-157. */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    (void)core, (void)d;
    p->v[VW] = caps && caps->native_vec_float >= 16 ? 16 : 8;
    p->v[BK] = 64;
    p->v[KG] = 8;
    return 1;
}

/* BK a multiple of KG */
static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core, (void)caps, (void)d;
    return p->v[BK] % p->v[KG] == 0;
}

/* A work-item's loop iterations, every loop counted whether or not a compiler unrolls it (core.h's trips): Q^T
 * (VW rows of DK) and the accumulators (DV); per block of BK keys the score groups (per group of KG keys: 3 loops of
 * KG and DK columns of KG), the masks (a gather of VW rows per key under a mask), the softmax (2 loops of BK, a Philox
 * draw per row under dropout) and the P V pass (per chunk of DC columns: 2 loops of DC and the keys of DC each,
 * counted as DV chunks of one column, the most there are); the stores (VW rows of DV). */
static size_t trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    const clattn_core_params *p)
{
    (void)core, (void)caps;
    const size_t vw = p->v[VW], bk = p->v[BK], kg = p->v[KG], tk = d->seq_kv ? d->seq_kv : d->seq_q;
    const size_t dk = d->head_dim_qk, dv = d->head_dim_v, blocks = (tk + bk - 1) / bk;
    const size_t scores = bk / kg * (1 + 3 * kg + dk * (1 + kg));
    const size_t softmax = bk * (3 + vw + (d->dropout > 0.0f ? vw * 11 : 0));
    const size_t values = dv * (1 + 2 + bk * 2);
    return vw * (1 + dk) + dv + blocks * (1 + scores + softmax + values) + vw * (2 + dv);
}

static size_t rows(const clattn_core_params *p) { return p->v[VW]; }

static const clattn_flash_spec spec = {
    .source = "cores/flash_lanes", .kernel = "flash_lanes", .launch = CLATTN_FLASH_PER_ITEM, .rows = rows,
    .shrink = -1, .split = -1,
};

const clattn_core clattn_core_flash_lanes = {
    .name = "flash_lanes",
    .kind = CLATTN_CORE_PREFILL,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .saves_row_stats = 1,
    .reads_dtypes = 1,
    .params = params,
    .nparams = 3,
    .test_configs = test_configs,
    .spec = &spec,
    .supports = clattn_flash_supports,
    .defaults = defaults,
    .fits = fits,
    .trips = trips,
    .build = clattn_flash_build,
    .run = clattn_flash_run,
    .release = clattn_flash_release,
};
