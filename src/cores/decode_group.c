/* decode_group.c: the decode core for GPUs (cl/cores/decode_group.cl): attention of a decode step's new
 * tokens over the KV cache, one work-group per (sequence, KV head, block of query rows, part of the keys).
 * Its work-items are teams of LANES lanes; a team reads one key (and value) at a time, each lane a slice,
 * so that a work-group streams whole consecutive keys with coalesced vector loads, and every query head of
 * the group is served from that one read. The decode family (decode_family.c) builds it, launches it and
 * merges its parts (split_combine).
 * Parameters: WG (work-items per group), LANES (lanes per key), KT (keys per team per step), VW (vector
 * width along the head dimension), R (query rows per work-group). */
#include "core.h"

#include <stddef.h>
#include <stdio.h>

enum { WG, LANES, KT, VW, R };
static const size_t wg_v[] = {32, 64, 128, 256};
static const size_t lanes_v[] = {1, 2, 4, 8, 16, 32};
static const size_t kt_v[] = {1, 2, 4};
static const size_t vw_v[] = {1, 4, 8};
static const size_t r_v[] = {1, 2, 4, 8};
/* what clattn tune tries (a decode step: R, the rows of steps with several new tokens, stays at 4) */
static const size_t wg_t[] = {64, 128, 256};
static const size_t lanes_t[] = {4, 8, 16, 32};
static const size_t kt_t[] = {1, 2, 4};
static const size_t vw_t[] = {4, 8};
static const size_t r_t[] = {4};
static const clattn_core_param params[] = {
    [WG] = {"WG", wg_v, 4, wg_t, 3, NULL},
    [LANES] = {"LANES", lanes_v, 6, lanes_t, 4, NULL},
    [KT] = {"KT", kt_v, 3, kt_t, 3, NULL},
    [VW] = {"VW", vw_v, 3, vw_t, 2, NULL},
    [R] = {"R", r_v, 4, r_t, 1, NULL},
};

/* NVIDIA's compiler takes inline PTX (caps.nv_inline_ptx): a team's partial dot products are summed by warp
 * shuffles (decode_group.cl's SHFL_PTX), not through local memory. */
static int shfl_here(const clattn_caps *caps) { return caps && caps->nv_inline_ptx; }

static int device_defines(const clattn_caps *caps, char *opts, size_t len)
{
    return snprintf(opts, len, " -DSHFL_PTX=%d", shfl_here(caps));
}

/* Local memory of a work-group, in floats (decode_group.cl's LOCAL_FLOATS): two buffers of the teams'
 * partial dot products (none with shuffles), or the merge of the teams' outputs. */
static size_t local_floats(const clattn_caps *caps, const clattn_attention_desc *d, const clattn_core_params *p)
{
    const size_t nt = p->v[WG] / p->v[LANES];
    const size_t red = shfl_here(caps) ? 0 : 2 * nt * p->v[KT] * p->v[R] * p->v[LANES];
    const size_t mrg = nt * (d->head_dim_v + 1) + 2 * nt * p->v[R];
    return red > mrg ? red : mrg;
}

static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core;
    if (p->v[LANES] > p->v[WG]) return 0;
    if (caps && p->v[WG] > caps->max_work_group) return 0;
    if (!d) return 1;
    if (d->head_dim_qk % p->v[VW] || d->head_dim_v % p->v[VW]) return 0;
    return !caps || local_floats(caps, d, p) * sizeof(float) <= caps->local_mem;
}

/* The widest vector dividing both head sizes, at most 4 floats (16 bytes per lane and load: NVIDIA's
 * widest load) or 8 halves (8 bytes for INT8); lanes dividing both heads' vectors so that each lane holds 2 vectors of a key
 * where the head sizes allow (few lanes: fewer partials to sum; more: more keys in flight per work-group);
 * 128 work-items, 2 keys per team and step, 4 rows. A lane's registers (the rows' query and output slices,
 * a step's keys and values) stay within 128 floats, and the work-group, keys per step and rows shrink until
 * the device takes them. By construction; on an H200 at context 32768 (d128, 32 heads over 8): 955 GB/s of the fp32
 * cache at B1, 1694 at B8 (copy 3.9 TB/s), tune's best WG=128 within 3 % (bench/results/h200-2026-11-26.md); with the
 * lanes' sums by warp shuffles (SHFL_PTX) the attention reads it at 3.3 and 3.2 TB/s (bench/results/h200-2026-11-27b.md).
 * A half cache keeps 8 halves a lane (LANES 8, R 2 at d128): LANES=16 with VW=4 (R 4) was 10 % faster at B8 and 7 %
 * slower at B1 there, before the shuffles (the same file), so the rule stays. */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    size_t vw = clattn_core_head_vector(d->head_dim_qk, d->head_dim_v);
    if (vw > 4 && !d->kv_half) vw = 4;
    const size_t nk = d->head_dim_qk / vw, nv = d->head_dim_v / vw, nmin = nk < nv ? nk : nv;
    size_t lanes = 32;
    while (lanes > 1 && (nk % lanes || nv % lanes || lanes * 2 > nmin)) lanes /= 2;
    p->v[VW] = vw, p->v[LANES] = lanes, p->v[KT] = 2, p->v[R] = 4;
    for (size_t wg = 128; wg >= 32; wg /= 2) {
        p->v[WG] = wg;
        for (p->v[KT] = 2; p->v[KT] >= 1; p->v[KT]--)
            for (p->v[R] = 4; p->v[R] >= 1; p->v[R] /= 2)
                if ((p->v[R] + p->v[KT]) * (d->head_dim_qk + d->head_dim_v) <= 128 * lanes && fits(core, caps, d, p)) {
                    clattn_core_fit_trips(core, caps, d, p, R); /* fewer rows where the driver ends loops early */
                    return 1;
                }
    }
    return 0;
}

/* Split-K parts of at least two steps of the work-group's keys, for 4 work-groups per compute unit (2 on a CPU):
 * batch 1 fills the device and a large batch is not split. */
static size_t min_keys(int cpu, const clattn_core_params *p)
{
    (void)cpu;
    return 2 * (p->v[WG] / p->v[LANES] * p->v[KT]);
}

/* A work-item's loop iterations over a part of `keys` keys, every loop of decode_group.cl counted: per step of
 * NT*KT keys, the loads (KT (1 + NSK + NSV)), the dot products (KT R (1 + NSK)), the sums of the lanes' partials
 * (KT R (1 + LANES)) and the softmax and value update (R (1 + 2 KT + NSV (1 + KT))); before, the rows' loads; after,
 * the teams' merge. */
static size_t part_trips(const clattn_attention_desc *d, const clattn_core_params *p, size_t keys)
{
    const size_t wg = p->v[WG], lanes = p->v[LANES], kt = p->v[KT], r = p->v[R], nt = wg / lanes;
    const size_t nsk = (d->head_dim_qk / p->v[VW] + lanes - 1) / lanes, nsv = (d->head_dim_v / p->v[VW] + lanes - 1) / lanes;
    const size_t steps = (keys + nt * kt - 1) / (nt * kt);
    const size_t step = 1 + kt * (1 + nsk + nsv) + kt * r * (1 + nsk) + kt * r * (1 + lanes) + r * (1 + 2 * kt + nsv * (1 + kt));
    return steps * step + r * (1 + nsk + nsv) + r * (1 + 2 * nt + nsv + (d->head_dim_v + wg - 1) / wg * (1 + nt));
}

static const char *const sources[] = {"common/half", "common/dtype", "common/combine", "cores/decode_common", "cores/decode_group"};
static const clattn_decode_spec spec = {
    .sources = sources, .nsources = sizeof sources / sizeof sources[0], .kernel = "decode_group", .launch = CLATTN_FLASH_PER_GROUP, .rows = R,
    .group = WG, .device_defines = device_defines, .per_cu_cpu = 2, .per_cu_gpu = 4, .min_keys = min_keys,
    .part_trips = part_trips,
};

/* the defaults; one lane per key, one key per team and step, one row per work-group; lanes that do not
 * divide the small test heads, with blocks of 2 rows (fewer than a group's). Larger KT and R take the same
 * loops and cost minutes of PoCL compilation per configuration (cold caches). */
static const char *const test_configs[] = {"-", "WG=64,LANES=1,KT=1,VW=1,R=1", "WG=32,LANES=4,KT=1,R=2", NULL};

/* the local arrays, for the family's check against the compiled kernel */
static size_t local_of(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                       const clattn_core_params *p)
{
    (void)core;
    return local_floats(caps, d, p) * sizeof(float);
}

const clattn_core clattn_core_decode_group = {
    .name = "decode_group",
    .kind = CLATTN_CORE_DECODE,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .params = params,
    .nparams = 5,
    .test_configs = test_configs,
    .spec = &spec,
    .supports = clattn_decode_supports,
    .defaults = defaults,
    .fits = fits,
    .local_bytes = local_of,
    .trips = clattn_decode_trips,
    .workspace = clattn_decode_workspace,
    .build = clattn_decode_build,
    .run_decode = clattn_decode_run,
    .device_bytes = clattn_decode_device_bytes,
    .release = clattn_decode_release,
};
