/* decode_attend.c: the decode core for CPUs (cl/cores/decode_attend.cl): attention of a decode step's new
 * tokens over the KV cache. One work-item per (sequence, KV head, block of R query rows, part): the rows of a
 * block run over the query heads that share the KV head, so one pass over a key serves them all; the
 * keys are cut into parts (split-K) when too few work-items would otherwise stream a long cache, and
 * split_combine merges the parts (the decode family, decode_family.c, builds, launches and merges).
 * Parameters: VW (vector width along the head dimension, dividing dk and dv), R. */
#include "core.h"

#include <stddef.h>

enum { VW, R };
static const size_t vw_v[] = {1, 4, 8};
static const size_t r_v[] = {1, 2, 4, 8, 16, 32};
static const clattn_core_param params[] = {
    [VW] = {"VW", vw_v, 3, NULL, 0, NULL},
    [R] = {"R", r_v, 6, NULL, 0, NULL},
};

/* As flash_rows (the same register blocking): the widest vector dividing both head sizes, 16 rows per
 * work-item (8 for value heads above 128). */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    p->v[VW] = clattn_core_head_vector(d->head_dim_qk, d->head_dim_v);
    p->v[R] = clattn_core_register_rows(d->head_dim_v);
    clattn_core_fit_trips(core, caps, d, p, R); /* fewer rows where the driver ends loops early */
    return 1;
}

static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core, (void)caps;
    return !d || (d->head_dim_qk % p->v[VW] == 0 && d->head_dim_v % p->v[VW] == 0);
}

/* Split-K parts of at least 1024 keys on a CPU (256 elsewhere), for 2 work-items per compute unit on a CPU (16
 * elsewhere): a CPU's work-item streams a long part well, and a part's merge costs a pass over its rows. */
static size_t min_keys(int cpu, const clattn_core_params *p)
{
    (void)p;
    return cpu ? 1024 : 256;
}

#define KEYS_PER_BLOCK 16 /* the kernel's BK */
#define STR_(x) #x
#define STR(x) STR_(x)

/* A work-item's loop iterations over a part of `keys` keys: the row-blocked count (clattn_core_rows_trips), and per
 * key the loops of KP keys at a time (the second chains' sums, the odd vector's tail). */
static size_t part_trips(const clattn_attention_desc *d, const clattn_core_params *p, size_t keys)
{
    const size_t r = p->v[R];
    return clattn_core_rows_trips(r, d->head_dim_qk / p->v[VW], d->head_dim_v / p->v[VW], keys, KEYS_PER_BLOCK,
                                  1 + 3 * r);
}

static const char *const sources[] = {"common/half", "common/dtype", "common/online", "common/combine", "cores/decode_common",
                                      "cores/decode_attend"};
static const clattn_decode_spec spec = {
    .sources = sources, .nsources = sizeof sources / sizeof sources[0], .kernel = "decode_attend", .launch = CLATTN_FLASH_PER_ITEM, .rows = R,
    .group = -1, .defines = "-DBK=" STR(KEYS_PER_BLOCK), .per_cu_cpu = 2, .per_cu_gpu = 16, .min_keys = min_keys,
    .part_trips = part_trips,
};

const clattn_core clattn_core_decode_attend = {
    .name = "decode_attend",
    .kind = CLATTN_CORE_DECODE,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .params = params,
    .nparams = 2,
    .spec = &spec,
    .supports = clattn_decode_supports,
    .defaults = defaults,
    .fits = fits,
    .trips = clattn_decode_trips,
    .workspace = clattn_decode_workspace,
    .build = clattn_decode_build,
    .run_decode = clattn_decode_run,
    .device_bytes = clattn_decode_device_bytes,
    .release = clattn_decode_release,
};
