/* flash_tiled.c: the flash core for GPUs (cl/cores/flash_tiled.cl): a work-group of BQ*NS work-items per BQ
 * query rows, NS work-items sharing a row's value columns; K and V tiles of BKT keys staged in local
 * memory. */
#include "core.h"


enum { BQ, BKT, NS };
static const size_t bq_v[] = {1, 2, 4, 8, 16, 32, 64}, bq_tried[] = {8, 16, 32};
static const size_t bkt_v[] = {8, 16, 32, 64}, bkt_tried[] = {16, 32};
static const size_t ns_v[] = {1, 2, 4, 8, 16}, ns_tried[] = {2, 4, 8};
static const clattn_core_param params[] = {
    [BQ] = {"BQ", bq_v, 7, bq_tried, 3, NULL},
    [BKT] = {"BKT", bkt_v, 4, bkt_tried, 2, NULL},
    [NS] = {"NS", ns_v, 5, ns_tried, 3, NULL},
};

#define MAX_GROUP 256 /* work-items per work-group the kernel is written for */

/* The three local arrays (Q rows, a K or V tile, the scores) in bytes, with the kernel's padding. */
static size_t local_bytes(size_t dk, size_t dv, const clattn_core_params *p)
{
    const size_t kvw = dk > dv ? dk : dv;
    return sizeof(float) * (p->v[BQ] * dk + p->v[BKT] * (kvw + 1) + p->v[BQ] * (p->v[BKT] + 1));
}

static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core;
    const size_t wg = p->v[BQ] * p->v[NS];
    if (wg > MAX_GROUP) return 0;
    if (caps && wg > caps->max_work_group) return 0;
    return !caps || !d || local_bytes(d->head_dim_qk, d->head_dim_v, p) + CLATTN_LOCAL_SLACK <= caps->local_mem;
}

/* NS work-items per query row so that each holds at most 16 value columns, BQ rows per work-group (at most
 * 256 work-items), BKT = 32 keys per tile; shrunk (BKT to 8, then BQ) until the tiles fit the local memory.
 * 0 if nothing fits. On every GPU class alike until measurements there say otherwise. */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    (void)core;
    const size_t dv = d->head_dim_v;
    size_t ns = 1;
    while ((dv + ns - 1) / ns > 16 && ns < 16) ns *= 2;
    const size_t cap = caps->max_work_group < MAX_GROUP ? caps->max_work_group : MAX_GROUP;
    if (ns > cap) return 0;
    size_t bq = 32;
    while (bq * ns > cap) bq /= 2;
    p->v[BQ] = bq, p->v[BKT] = 32, p->v[NS] = ns;
    while (local_bytes(d->head_dim_qk, dv, p) + CLATTN_LOCAL_SLACK > caps->local_mem) {
        if (p->v[BKT] > 8) p->v[BKT] /= 2;
        else if (p->v[BQ] > 1) p->v[BQ] /= 2;
        else return 0;
    }
    return 1;
}

static size_t rows(const clattn_core_params *p) { return p->v[BQ]; }
static size_t group(const clattn_core_params *p) { return p->v[BQ] * p->v[NS]; }

static const clattn_flash_spec spec = {
    .source = "cores/flash_tiled", .kernel = "flash_tiled", .launch = CLATTN_FLASH_PER_GROUP, .rows = rows,
    .group = group, .shrink = BQ, .split = -1,
};

/* the local arrays, for the family's check against the compiled kernel */
static size_t local_of(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                       const clattn_core_params *p)
{
    (void)core, (void)caps;
    return local_bytes(d->head_dim_qk, d->head_dim_v, p);
}

const clattn_core clattn_core_flash_tiled = {
    .name = "flash_tiled",
    .kind = CLATTN_CORE_PREFILL,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .saves_row_stats = 1,
    .reads_dtypes = 1,
    .params = params,
    .nparams = 3,
    .spec = &spec,
    .supports = clattn_flash_supports_tiles,
    .defaults = defaults,
    .fits = fits,
    .local_bytes = local_of,
    .build = clattn_flash_build,
    .run = clattn_flash_run,
    .release = clattn_flash_release,
};
