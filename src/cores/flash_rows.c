/* flash_rows.c: the flash core for CPU devices (cl/cores/flash_rows.cl): one work-item per ROWS query rows,
 * no local memory and no barriers; K and V rows come through the cache, BK keys per block, VW-wide vectors
 * along the head dimension. On PoCL a work-group runs as a loop and private arrays are cheap. */
#include "core.h"

#include <stddef.h>

enum { ROWS, BK, VW };
static const size_t rows_v[] = {1, 2, 4, 8, 16, 32}, rows_tried[] = {4, 8, 16, 32};
static const size_t bk_v[] = {8, 16, 32};
static const size_t vw_v[] = {1, 4, 8}, vw_tried[] = {4, 8}; /* VW = 1 only where neither divides: a default */
static const clattn_core_param params[] = {
    [ROWS] = {"ROWS", rows_v, 6, rows_tried, 4, NULL},
    [BK] = {"BK", bk_v, 3, bk_v, 3, NULL},
    [VW] = {"VW", vw_v, 3, vw_tried, 2, NULL},
};

/* Defaults on every device class (PoCL measurements, bench/results/pocl-2core-fused-registers.jsonl):
 * the register rows (16, 8 above 128), blocks of 16 keys (one float16 exp), the widest vector that
 * divides both head sizes. */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    p->v[ROWS] = clattn_core_register_rows(d->head_dim_v);
    p->v[BK] = 16;
    p->v[VW] = clattn_core_head_vector(d->head_dim_qk, d->head_dim_v);
    clattn_core_fit_trips(core, caps, d, p, ROWS); /* fewer rows where the driver ends loops early */
    return 1;
}

/* The vector width must divide both head sizes. */
static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core, (void)caps;
    return !d || (d->head_dim_qk % p->v[VW] == 0 && d->head_dim_v % p->v[VW] == 0);
}

/* A work-item's loop iterations (clattn_core_rows_trips), with a Philox draw (10 rounds) per row and key under
 * dropout. */
static size_t trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    const clattn_core_params *p)
{
    (void)core, (void)caps;
    const size_t r = p->v[ROWS], tk = d->seq_kv ? d->seq_kv : d->seq_q;
    return clattn_core_rows_trips(r, d->head_dim_qk / p->v[VW], d->head_dim_v / p->v[VW], tk, p->v[BK],
                                  d->dropout > 0.0f ? r * 11 : 0);
}

static size_t rows(const clattn_core_params *p) { return p->v[ROWS]; }

static const clattn_flash_spec spec = {
    .source = "cores/flash_rows", .kernel = "flash_rows", .launch = CLATTN_FLASH_PER_ITEM, .rows = rows, .shrink = -1,
    .split = -1,
};

const clattn_core clattn_core_flash_rows = {
    .name = "flash_rows",
    .kind = CLATTN_CORE_PREFILL,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .saves_row_stats = 1,
    .reads_dtypes = 1,
    .params = params,
    .nparams = 3,
    .spec = &spec,
    .supports = clattn_flash_supports,
    .defaults = defaults,
    .fits = fits,
    .trips = trips,
    .build = clattn_flash_build,
    .run = clattn_flash_run,
    .release = clattn_flash_release,
};
