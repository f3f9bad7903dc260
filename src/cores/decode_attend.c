/* decode_attend.c: the decode core (cl/cores/decode_attend.cl): attention of a decode step's new tokens
 * over the KV cache. One work-item per (sequence, KV head, block of R query rows, part): the rows of a
 * block run over the query heads that share the KV head, so one pass over a key serves them all; the
 * keys are cut into `parts` (split-K) when too few work-items would otherwise stream a long cache, and
 * decode_combine merges the parts. Two variants are built at plan creation: few rows per work-item (one
 * token's group of query heads) and R rows (several new tokens per step).
 * Parameters: VW (vector width along the head dimension, dividing dk and dv), R. */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

enum { VW, R };
static const size_t vw_v[] = {1, 4, 8};
static const size_t r_v[] = {1, 2, 4, 8, 16, 32};
static const clattn_core_param params[] = {
    [VW] = {"VW", vw_v, 3, NULL, 0, NULL},
    [R] = {"R", r_v, 6, NULL, 0, NULL},
};

#define DECODE_MAX_HEAD 256 /* dk and dv the kernel takes */

typedef struct variant {
    cl_program prog;
    cl_kernel attend;
    size_t rows; /* query rows per work-item */
} variant;

typedef struct decode_state {
    const clattn_device *dev;
    clattn_attention_desc d;
    clattn_core_layout lay;
    variant few, many;         /* rows per work-item: min(GROUP, R) and R */
    clattn_decode_parts parts; /* split-K partials and decode_combine */
} decode_state;

static clattn_status supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                              char *why, size_t len)
{
    (void)caps;
    if (d && (d->head_dim_qk > DECODE_MAX_HEAD || d->head_dim_v > DECODE_MAX_HEAD)) {
        snprintf(why, len, "%s takes head sizes up to %d (dk = %zu, dv = %zu)", core->name, DECODE_MAX_HEAD,
                 d->head_dim_qk, d->head_dim_v);
        return CLATTN_STATUS_UNSUPPORTED;
    }
    return CLATTN_STATUS_SUCCESS;
}

/* As flash_rows (the same register blocking): the widest vector dividing both head sizes, 16 rows per
 * work-item (8 for value heads above 128). */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    (void)core, (void)caps;
    p->v[VW] = clattn_core_head_vector(d->head_dim_qk, d->head_dim_v);
    p->v[R] = clattn_core_register_rows(d->head_dim_v);
    return 1;
}

static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core, (void)caps;
    return !d || (d->head_dim_qk % p->v[VW] == 0 && d->head_dim_v % p->v[VW] == 0);
}

static size_t workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay)
{
    (void)core, (void)caps, (void)lay;
    return clattn_decode_parts_floats(d);
}

static void release(void *state)
{
    decode_state *s = state;
    if (!s) return;
    variant *vs[] = {&s->few, &s->many};
    for (int i = 0; i < 2; i++) {
        clattn_kernel_release(&vs[i]->attend);
        clattn_program_release(&vs[i]->prog);
    }
    clattn_decode_parts_release(&s->parts);
    free(s);
}

static size_t device_bytes(const void *state)
{
    const decode_state *s = state;
    return clattn_decode_parts_bytes(&s->parts);
}

/* decode_attend.cl for `rows` rows per work-item; with_combine: decode_combine from the same program. */
static clattn_status build_variant(decode_state *s, size_t rows, size_t vw, variant *v, int with_combine)
{
    const clattn_attention_desc *d = &s->d;
    char opts[300];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDK=%zu -DDV=%zu -DGROUP=%zu -DWINDOW=%zu -DKV_HALF=%d -DR=%zu -DBK=16 "
             "-DVW=%zu", d->head_dim_qk, d->head_dim_v, d->heads / d->kv_heads, d->window, d->kv_half, rows, vw);
    const char *src[] = {"common/online", "cores/decode_common", "cores/decode_attend"};
    TRY(clattn_program_build(s->dev, src, 3, opts, &v->prog));
    v->rows = rows;
    TRY(clattn_kernel_create(v->prog, "decode_attend", &v->attend));
    if (with_combine) TRY(clattn_kernel_create(v->prog, "decode_combine", &s->parts.k_combine));
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                           const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    decode_state *s = clattn_calloc(1, sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the %s state", core->name);
    s->dev = dev, s->d = *d, s->lay = *lay;
    const size_t G = d->heads / d->kv_heads, r_many = p->v[R], r_few = G < r_many ? G : r_many;
    clattn_status st = build_variant(s, r_few, p->v[VW], &s->few, 1);
    if (!st) st = build_variant(s, r_many, p->v[VW], &s->many, 0);
    if (!st) st = clattn_decode_parts_alloc(dev, d, &s->parts);
    if (st) {
        release(s);
        return st;
    }
    *state = s;
    return CLATTN_STATUS_SUCCESS;
}

/* Split-K parts for a step: enough work-items for the device (a few per compute unit on a CPU, many on a
 * GPU), each part at least a few hundred keys. */
static size_t choose_parts(const decode_state *s, const clattn_decode_io *io, size_t rows)
{
    const clattn_caps *caps = &s->dev->caps;
    const clattn_attention_desc *d = &s->d;
    const size_t items = d->batch * d->kv_heads * ((io->n * (d->heads / d->kv_heads) + rows - 1) / rows);
    const int cpu = caps->dclass == CLATTN_CLASS_CPU;
    return clattn_decode_parts_choose(&s->parts, d, io, items, (size_t)caps->compute_units * (cpu ? 2 : 16),
                                      cpu ? 1024 : 256);
}

static clattn_status attend(const decode_state *s, const variant *v, const clattn_decode_io *io, size_t parts)
{
    const clattn_attention_desc *d = &s->d;
    const size_t H = d->heads, HK = d->kv_heads, n = io->n;
    const size_t nblk = (n * (H / HK) + v->rows - 1) / v->rows;
    const size_t total = io->warm ? 0 : d->batch * HK * nblk * parts;
    clattn_args a;
    clattn_args_begin(&a, v->attend, "decode_attend");
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
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_items(s->dev, v->attend, total, "enqueue decode_attend");
}

static clattn_status run_decode(void *state, clattn_decode_io *io)
{
    const decode_state *s = state;
    const clattn_attention_desc *d = &s->d;
    const size_t H = d->heads;
    /* warm: both variants and the combine, with no work */
    const variant *v = io->warm || io->n * (H / d->kv_heads) <= s->few.rows ? &s->few : &s->many;
    const size_t parts = io->warm ? 2 : choose_parts(s, io, v->rows);
    TRY(attend(s, v, io, parts));
    if (io->warm) TRY(attend(s, &s->many, io, parts));
    TRY(clattn_decode_mark(io, CLATTN_DECODE_STAGE_ATTEND));
    if (parts > 1) TRY(clattn_decode_parts_combine(s->dev, &s->parts, d, io, parts));
    io->parts = parts;
    return CLATTN_STATUS_SUCCESS;
}

const clattn_core clattn_core_decode_attend = {
    .name = "decode_attend",
    .kind = CLATTN_CORE_DECODE,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .params = params,
    .nparams = 2,
    .supports = supports,
    .defaults = defaults,
    .fits = fits,
    .workspace = workspace,
    .build = build,
    .run_decode = run_decode,
    .device_bytes = device_bytes,
    .release = release,
};
