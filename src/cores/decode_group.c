/* decode_group.c: the decode core for GPUs (cl/cores/decode_group.cl): attention of a decode step's new
 * tokens over the KV cache, one work-group per (sequence, KV head, block of query rows, part of the keys).
 * Its work-items are teams of LANES lanes; a team reads one key (and value) at a time, each lane a slice,
 * so that a work-group streams whole consecutive keys with coalesced vector loads, and every query head of
 * the group is served from that one read. Parts are merged by decode_combine (decode_parts.c). Two
 * variants are built at plan creation, as decode_attend's: the rows of one token's group (decode) and R
 * rows (steps of several new tokens).
 * Parameters: WG (work-items per group), LANES (lanes per key), KT (keys per team per step), VW (vector
 * width along the head dimension), R (query rows per work-group). */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

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

#define DECODE_MAX_HEAD 256 /* dk and dv the kernel takes */

typedef struct variant {
    cl_program prog;
    cl_kernel attend;
    size_t rows; /* query rows per work-group */
} variant;

typedef struct group_state {
    const clattn_device *dev;
    clattn_attention_desc d;
    clattn_core_layout lay;
    clattn_core_params p;
    variant few, many;         /* rows per work-group: min(GROUP, R) and R */
    clattn_decode_parts parts; /* split-K partials and decode_combine */
} group_state;

/* Local memory of a work-group, in floats (decode_group.cl's LOCAL_FLOATS): two buffers of the teams'
 * partial dot products, or the merge of the teams' outputs. */
static size_t local_floats(const clattn_attention_desc *d, const clattn_core_params *p)
{
    const size_t nt = p->v[WG] / p->v[LANES];
    const size_t red = 2 * nt * p->v[KT] * p->v[R] * p->v[LANES];
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
    return !caps || local_floats(d, p) * sizeof(float) <= caps->local_mem;
}

/* The widest vector dividing both head sizes, at most 4 floats (16 bytes per lane and load: NVIDIA's
 * widest load) or 8 halves; lanes dividing both heads' vectors so that each lane holds 2 vectors of a key
 * where the head sizes allow (few lanes: fewer partials to sum; more: more keys in flight per work-group);
 * 128 work-items, 2 keys per team and step, 4 rows. A lane's registers (the rows' query and output slices,
 * a step's keys and values) stay within 128 floats, and the work-group, keys per step and rows shrink until
 * the device takes them. By construction, not measured on a GPU yet. */
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
                if ((p->v[R] + p->v[KT]) * (d->head_dim_qk + d->head_dim_v) <= 128 * lanes && fits(core, caps, d, p))
                    return 1;
    }
    return 0;
}

static clattn_status supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                              char *why, size_t len)
{
    if (d && (d->head_dim_qk > DECODE_MAX_HEAD || d->head_dim_v > DECODE_MAX_HEAD)) {
        snprintf(why, len, "%s takes head sizes up to %d (dk = %zu, dv = %zu)", core->name, DECODE_MAX_HEAD,
                 d->head_dim_qk, d->head_dim_v);
        return CLATTN_STATUS_UNSUPPORTED;
    }
    const clattn_attention_desc one = {.head_dim_qk = 1, .head_dim_v = 1};
    clattn_core_params p;
    if (!defaults(core, caps, d ? d : &one, &p)) {
        snprintf(why, len, "%s's work-groups do not fit this device (local memory %zu bytes, max work-group %zu)",
                 core->name, caps->local_mem, caps->max_work_group);
        return CLATTN_STATUS_UNSUPPORTED;
    }
    return CLATTN_STATUS_SUCCESS;
}

static size_t workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay)
{
    (void)core, (void)caps, (void)lay;
    return clattn_decode_parts_floats(d);
}

static void release(void *state)
{
    group_state *s = state;
    if (!s) return;
    variant *vs[] = {&s->few, &s->many};
    for (int i = 0; i < 2; i++) {
        clattn_kernel_release(&vs[i]->attend);
        clattn_program_release(&vs[i]->prog);
    }
    clattn_decode_parts_release(&s->parts);
    free(s);
}

static size_t device_bytes(const void *state) { return clattn_decode_parts_bytes(&((const group_state *)state)->parts); }

/* decode_group.cl for `rows` rows per work-group; with_combine: decode_combine from the same program. */
static clattn_status build_variant(group_state *s, size_t rows, variant *v, int with_combine)
{
    const clattn_attention_desc *d = &s->d;
    const clattn_core_params *p = &s->p;
    char opts[320];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDK=%zu -DDV=%zu -DGROUP=%zu -DWINDOW=%zu -DKV_HALF=%d -DRB=%zu "
             "-DWG=%zu -DLANES=%zu -DKT=%zu -DVW=%zu", d->head_dim_qk, d->head_dim_v, d->heads / d->kv_heads,
             d->window, d->kv_half, rows, p->v[WG], p->v[LANES], p->v[KT], p->v[VW]);
    const char *src[] = {"cores/decode_common", "cores/decode_group"};
    TRY(clattn_program_build(s->dev, src, 2, opts, &v->prog));
    v->rows = rows;
    TRY(clattn_kernel_create(v->prog, "decode_group", &v->attend));
    size_t allowed = 0;
    CL_CHECK(clGetKernelWorkGroupInfo(v->attend, s->dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof allowed, &allowed,
                                      NULL), "querying decode_group's work-group size");
    if (allowed < p->v[WG])
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "decode_group with WG=%zu does not fit this device (its kernel "
                           "takes %zu work-items per work-group)", p->v[WG], allowed);
    if (with_combine) TRY(clattn_kernel_create(v->prog, "decode_combine", &s->parts.k_combine));
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                           const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    group_state *s = clattn_calloc(1, sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the %s state", core->name);
    s->dev = dev, s->d = *d, s->lay = *lay, s->p = *p;
    const size_t G = d->heads / d->kv_heads, r_many = p->v[R], r_few = G < r_many ? G : r_many;
    clattn_status st = build_variant(s, r_few, &s->few, 1);
    if (!st) st = build_variant(s, r_many, &s->many, 0);
    if (!st) st = clattn_decode_parts_alloc(dev, d, &s->parts);
    if (st) {
        release(s);
        return st;
    }
    *state = s;
    return CLATTN_STATUS_SUCCESS;
}

enum { ARG_FIRST = 18 }; /* decode_group's `first` argument (q, q_off, q_ld, kc, vc, lens, valid, out, out_off, out_ld, part_ml, part_acc, n, H, HK, Tmax, parts, scale, first) */

static clattn_status set_first_group(cl_kernel k, size_t first, void *ctx)
{
    (void)ctx;
    const cl_ulong g0 = first;
    CL_CHECK(clSetKernelArg(k, ARG_FIRST, sizeof g0, &g0), "setting decode_group's first group");
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status attend(const group_state *s, const variant *v, const clattn_decode_io *io, size_t parts)
{
    const clattn_attention_desc *d = &s->d;
    const size_t H = d->heads, HK = d->kv_heads, n = io->n;
    const size_t nblk = (n * (H / HK) + v->rows - 1) / v->rows;
    const size_t groups = io->warm ? 0 : d->batch * HK * nblk * parts;
    clattn_args a;
    clattn_args_begin(&a, v->attend, "decode_group");
    clattn_core_arg_rows(&a, io->q, s->lay.q_ld);
    clattn_arg_mem(&a, io->cache_k);
    clattn_arg_mem(&a, io->cache_v);
    clattn_arg_mem(&a, io->lens);
    clattn_arg_mem(&a, io->valid);
    clattn_core_arg_rows(&a, io->out, H * d->head_dim_v);
    clattn_arg_mem(&a, s->parts.ml);
    clattn_arg_mem(&a, s->parts.acc);
    clattn_arg_u32(&a, (cl_uint)n);
    clattn_arg_u32(&a, (cl_uint)H);
    clattn_arg_u32(&a, (cl_uint)HK);
    clattn_arg_u32(&a, (cl_uint)io->capacity);
    clattn_arg_u32(&a, (cl_uint)parts);
    clattn_arg_f32(&a, d->scale);
    clattn_arg_u64(&a, 0); /* first: set per launch */
    clattn_arg_u64(&a, groups);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_groups(s->dev, v->attend, groups, s->p.v[WG], set_first_group, NULL, "enqueue decode_group");
}

/* Split-K parts: about 4 work-groups per compute unit (2 on a CPU) over the whole batch, each part at least
 * two steps of the work-group's keys, so that batch 1 fills the device and a large batch is not split. */
static size_t choose_parts(const group_state *s, const clattn_decode_io *io, size_t rows)
{
    const clattn_caps *caps = &s->dev->caps;
    const clattn_attention_desc *d = &s->d;
    const size_t groups = d->batch * d->kv_heads * ((io->n * (d->heads / d->kv_heads) + rows - 1) / rows);
    const size_t per_cu = caps->dclass == CLATTN_CLASS_CPU ? 2 : 4;
    const size_t step = s->p.v[WG] / s->p.v[LANES] * s->p.v[KT];
    return clattn_decode_parts_choose(&s->parts, d, io, groups, (size_t)caps->compute_units * per_cu, 2 * step);
}

static clattn_status run_decode(void *state, clattn_decode_io *io)
{
    const group_state *s = state;
    const clattn_attention_desc *d = &s->d;
    /* warm: both variants and the combine, with no work */
    const variant *v = io->warm || io->n * (d->heads / d->kv_heads) <= s->few.rows ? &s->few : &s->many;
    const size_t parts = io->warm ? 2 : choose_parts(s, io, v->rows);
    TRY(attend(s, v, io, parts));
    if (io->warm) TRY(attend(s, &s->many, io, parts));
    TRY(clattn_decode_mark(io, CLATTN_DECODE_STAGE_ATTEND));
    if (parts > 1) TRY(clattn_decode_parts_combine(s->dev, &s->parts, d, io, parts));
    io->parts = parts;
    return CLATTN_STATUS_SUCCESS;
}

/* the defaults; one lane per key, one key per team and step, one row per work-group; lanes that do not
 * divide the small test heads, with blocks of 2 rows (fewer than a group's). Larger KT and R take the same
 * loops and cost minutes of PoCL compilation per configuration (cold caches). */
static const char *const test_configs[] = {"-", "WG=64,LANES=1,KT=1,VW=1,R=1", "WG=32,LANES=4,KT=1,R=2", NULL};

const clattn_core clattn_core_decode_group = {
    .name = "decode_group",
    .kind = CLATTN_CORE_DECODE,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .params = params,
    .nparams = 5,
    .test_configs = test_configs,
    .supports = supports,
    .defaults = defaults,
    .fits = fits,
    .workspace = workspace,
    .build = build,
    .run_decode = run_decode,
    .device_bytes = device_bytes,
    .release = release,
};
