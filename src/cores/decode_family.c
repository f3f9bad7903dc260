/* decode_family.c: the decode family (core.h): decode cores of one kernel signature (cores/decode_common.cl),
 * each a .cl file and a clattn_decode_spec (decode_attend.c, decode_group.c). Here: their build (two variants),
 * arguments and launch, the choice of a step's split-K parts, the parts' buffers and their merge (split_combine,
 * cl/common/combine.cl, shared with the flash family), and their release. */
#include "core.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PART_ROWS 4    /* the partial buffers hold split-K parts for steps of up to 4 new tokens */
#define ARG_FIRST 26   /* PER_GROUP: the index of the kernel's `first` argument (the list in attend below) */

typedef struct variant {
    cl_program prog;
    cl_kernel attend;
    size_t rows; /* query rows per work-item or work-group */
} variant;

typedef struct decode_state {
    const clattn_core *core;
    const clattn_decode_spec *spec;
    const clattn_device *dev;
    clattn_attention_desc d;
    clattn_core_layout lay;
    clattn_core_params p;
    variant few, many;  /* rows: min(GROUP, R) and R */
    cl_kernel combine;  /* split_combine (common/combine.cl), from the few variant's program */
    cl_mem ml, acc;     /* (slot, 2) each part's max and sum, (slot, dv) its unnormalised output */
    size_t slots;       /* (row, part) slots (part_slots) */
} decode_state;

/* The most (row, part) slots the partial buffers may have: half of one allocation. */
static size_t slots_most(const clattn_caps *caps, const clattn_attention_desc *d)
{
    return caps->max_alloc / 2 / ((d->head_dim_v + 2) * sizeof(float));
}

/* (row, part) slots of the partial buffers at plan creation: steps of up to PART_ROWS new tokens,
 * CLATTN_DECODE_MAX_PARTS parts (within slots_most). On a device with a loop limit a long step (a prefill) must be
 * split too, or its last rows' loops run past the limit: there a step that needs more slots makes the buffers larger
 * (up to slots_most) before anything of it is enqueued (grow_slots). */
static size_t part_slots(const clattn_caps *caps, const clattn_attention_desc *d)
{
    const size_t n = d->batch * (d->seq_q < PART_ROWS ? d->seq_q : PART_ROWS) * d->heads * CLATTN_DECODE_MAX_PARTS;
    const size_t most = slots_most(caps, d);
    return caps->loop_limit && n > most ? most : n;
}

clattn_status clattn_decode_supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                                     char *why, size_t len)
{
    return clattn_core_supports_heads(core, caps, d, CLATTN_DECODE_MAX_HEAD, 1, why, len);
}

size_t clattn_decode_workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                               const clattn_core_layout *lay)
{
    (void)core, (void)lay;
    return part_slots(caps, d) * (2 + d->head_dim_v);
}

void clattn_decode_release(void *state)
{
    decode_state *s = state;
    if (!s) return;
    variant *vs[] = {&s->few, &s->many};
    for (int i = 0; i < 2; i++) {
        clattn_kernel_release(&vs[i]->attend);
        clattn_program_release(&vs[i]->prog);
    }
    clattn_kernel_release(&s->combine);
    clattn_mem_release(&s->ml);
    clattn_mem_release(&s->acc);
    free(s);
}

size_t clattn_decode_device_bytes(const void *state)
{
    const decode_state *s = state;
    return clattn_mem_bytes(s->ml) + clattn_mem_bytes(s->acc);
}

/* The member's kernel for `rows` rows; with_combine: split_combine from the same program. */
static clattn_status build_variant(decode_state *s, size_t rows, variant *v, int with_combine)
{
    const clattn_decode_spec *spec = s->spec;
    char opts[512];
    int n = clattn_core_attention_defines(&s->d, CLATTN_DEFINES_SHAPE, opts, sizeof opts);
    if (n > 0 && (size_t)n < sizeof opts)
        n += clattn_core_param_defines(s->core, &s->p, spec->rows, rows, opts + n, sizeof opts - (size_t)n);
    if (spec->defines && n > 0 && (size_t)n < sizeof opts)
        n += snprintf(opts + n, sizeof opts - (size_t)n, " %s", spec->defines);
    if (spec->device_defines && n > 0 && (size_t)n < sizeof opts)
        n += spec->device_defines(&s->dev->caps, opts + n, sizeof opts - (size_t)n);
    if (n <= 0 || (size_t)n >= sizeof opts)
        return clattn_fail(CLATTN_STATUS_BUILD_FAILURE, "%s: its build options do not fit %zu bytes", s->core->name,
                           sizeof opts);
    TRY(clattn_program_build(s->dev, spec->sources, spec->nsources, opts, &v->prog));
    v->rows = rows;
    TRY(clattn_kernel_create(v->prog, spec->kernel, &v->attend));
    if (spec->launch == CLATTN_FLASH_PER_GROUP) {
        const size_t wg = s->p.v[spec->group];
        size_t allowed = 0;
        CL_CHECK(clGetKernelWorkGroupInfo(v->attend, s->dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof allowed,
                                          &allowed, NULL), "querying a decode kernel's work-group size");
        if (clattn_device_simulated(s->dev)) allowed = s->dev->caps.max_work_group; /* the target's, not the host's */
        if (allowed < wg)
            return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "%s with %s=%zu does not fit this device (its kernel "
                               "takes %zu work-items per work-group)", s->core->name,
                               s->core->params[spec->group].name, wg, allowed);
    }
    TRY(clattn_core_check_local(s->core, s->dev, &s->d, &s->p, v->attend));
    if (with_combine) TRY(clattn_kernel_create(v->prog, "split_combine", &s->combine));
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_decode_build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                                  const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    decode_state *s = clattn_calloc(1, sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the %s state", core->name);
    s->core = core, s->spec = core->spec, s->dev = dev, s->d = *d, s->lay = *lay, s->p = *p;
    const size_t G = d->heads / d->kv_heads, r_many = p->v[s->spec->rows], r_few = G < r_many ? G : r_many;
    s->slots = part_slots(&dev->caps, d);
    clattn_status st = build_variant(s, r_few, &s->few, 1);
    if (!st) st = build_variant(s, r_many, &s->many, 0);
    if (!st) st = clattn_buffer_new(dev, s->slots * 2, 4, NULL, "the split-K partial sums", &s->ml);
    if (!st) st = clattn_buffer_new(dev, s->slots * d->head_dim_v, 4, NULL, "the split-K partial outputs", &s->acc);
    if (st) {
        clattn_decode_release(s);
        return st;
    }
    *state = s;
    return CLATTN_STATUS_SUCCESS;
}

size_t clattn_decode_trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                           const clattn_core_params *p)
{
    (void)caps;
    const clattn_decode_spec *spec = core->spec;
    return spec->part_trips(d, p, CLATTN_DECODE_PLAN_KEYS);
}

/* The most keys a part may hold for the variant of `rows` rows within the device's loop limit (SIZE_MAX: no limit;
 * 0: not even one key). */
static size_t part_keys_max(const decode_state *s, size_t rows, size_t max_len)
{
    const clattn_caps *caps = &s->dev->caps;
    if (!caps->loop_limit) return SIZE_MAX;
    clattn_core_params p = s->p;
    p.v[s->spec->rows] = rows;
    const size_t budget = clattn_loop_budget(caps);
    size_t lo = 0, hi = max_len;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo + 1) / 2;
        if (s->spec->part_trips(&s->d, &p, mid) <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* A step's parts: io->max_parts when forced (within the buffers), else enough for the spec's units per compute unit
 * when the step has `units` of them unsplit, each part at least min_keys keys of the longest sequence;
 * 1 .. CLATTN_DECODE_MAX_PARTS, and within the buffers. On a device with a loop limit, at least as many as keep each
 * part's keys within it: a step that needs more than it may take is refused (TOO_LARGE_FOR_DEVICE). */
static clattn_status choose_parts(const decode_state *s, const clattn_decode_io *io, size_t rows, size_t *out)
{
    const clattn_caps *caps = &s->dev->caps;
    const clattn_attention_desc *d = &s->d;
    const int cpu = caps->dclass == CLATTN_CLASS_CPU;
    const size_t units = d->batch * d->kv_heads * ((io->n * (d->heads / d->kv_heads) + rows - 1) / rows);
    const size_t target = (size_t)caps->compute_units * (cpu ? s->spec->per_cu_cpu : s->spec->per_cu_gpu);
    const size_t min_keys = s->spec->min_keys(cpu, &s->p);
    const size_t nrows = d->batch * io->n * d->heads;
    /* the buffers' slots, or on a device with a loop limit as many as grow_slots may make */
    const size_t room = caps->loop_limit && slots_most(caps, d) > s->slots ? slots_most(caps, d) : s->slots;
    size_t cap = room / (nrows ? nrows : 1);
    if (cap > CLATTN_DECODE_MAX_PARTS) cap = CLATTN_DECODE_MAX_PARTS;
    const size_t keys_max = part_keys_max(s, rows, io->max_len);
    const size_t need = keys_max == SIZE_MAX ? 1 : keys_max ? (io->max_len + keys_max - 1) / keys_max : SIZE_MAX;
    size_t parts;
    if (io->max_parts) {
        parts = io->max_parts < cap ? io->max_parts : cap;
    } else {
        parts = (target + units - 1) / (units ? units : 1);
        const size_t by_len = (io->max_len + min_keys - 1) / min_keys;
        if (parts > by_len) parts = by_len;
        if (parts > cap) parts = cap;
        if (parts < need && need <= cap) parts = need;
    }
    if (!parts) parts = 1;
    if (parts < need) {
        const size_t most = io->max_parts && io->max_parts < cap ? io->max_parts : cap;
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "decode step: %s (%zu query rows per work-item or group) keeps at most %zu keys in one split-K part "
                           "within this device's loop limit (its driver ends a work-item's loops after %zu iterations "
                           "without an error; probed when the device opened), so the longest sequence, %zu keys, needs "
                           "%zu parts; this step may take %zu%s", s->core->name, rows, keys_max,
                           caps->loop_limit, io->max_len, need, most,
                           io->max_parts && io->max_parts < cap ? " (clattn_decode_plan_set_splits)" : "");
    }
    *out = parts;
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status set_first_group(cl_kernel k, size_t first, void *ctx)
{
    (void)ctx;
    const cl_ulong g0 = first;
    CL_CHECK(clSetKernelArg(k, ARG_FIRST, sizeof g0, &g0), "setting a decode kernel's first group");
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status attend(const decode_state *s, const variant *v, const clattn_decode_io *io, size_t parts)
{
    const clattn_attention_desc *d = &s->d;
    const size_t H = d->heads, HK = d->kv_heads;
    const size_t nblk = (io->n * (H / HK) + v->rows - 1) / v->rows;
    const size_t units = io->warm ? 0 : d->batch * HK * nblk * parts;
    const int per_group = s->spec->launch == CLATTN_FLASH_PER_GROUP;
    clattn_args a;
    clattn_args_begin(&a, v->attend, s->spec->kernel);
    clattn_core_arg_rows(&a, io->q, s->lay.q_ld);
    clattn_arg_mem(&a, io->cache_k);
    clattn_arg_mem(&a, io->cache_v);
    clattn_arg_mem(&a, io->cache_ks);
    clattn_arg_mem(&a, io->cache_vs);
    clattn_arg_mem(&a, io->pages ? io->pages : io->lens); /* (contiguous: never read) */
    clattn_arg_u32(&a, (cl_uint)io->npage);
    clattn_arg_mem(&a, io->lens);
    clattn_arg_mem(&a, io->valid);
    clattn_arg_mem(&a, io->row0);
    clattn_arg_u32(&a, (cl_uint)io->packed);
    clattn_arg_mem(&a, io->tree);
    clattn_arg_u32(&a, io->tree != NULL);
    clattn_core_arg_rows(&a, io->out, H * d->head_dim_v);
    clattn_arg_mem(&a, s->ml);
    clattn_arg_mem(&a, s->acc);
    clattn_arg_u32(&a, (cl_uint)io->n);
    clattn_arg_u32(&a, (cl_uint)H);
    clattn_arg_u32(&a, (cl_uint)HK);
    clattn_arg_u32(&a, (cl_uint)io->capacity);
    clattn_arg_u32(&a, (cl_uint)parts);
    clattn_arg_f32(&a, d->scale);
    if (per_group) clattn_arg_u64(&a, 0); /* first: set per launch */
    clattn_arg_u64(&a, units);
    TRY(clattn_args_end(&a));
    char what[64];
    snprintf(what, sizeof what, "enqueue %s", s->spec->kernel);
    if (per_group)
        return clattn_enqueue_groups(s->dev, v->attend, units, s->p.v[s->spec->group], set_first_group, NULL, what);
    return clattn_enqueue_items(s->dev, v->attend, units, what);
}

/* The parts merged into io->out (launched with no work when io->warm): slot (row*parts + p) of (row0[b] + t)*H + h
 * holds part p's max and sum (natural units) at ml + 2*slot and its output at acc + slot*dv. A packed step's rows are
 * all real: merged without the padded step's counts (valid), which would zero rows by a padded row's place. */
static clattn_status combine(const decode_state *s, const clattn_decode_io *io, size_t parts)
{
    const size_t H = s->d.heads, dv = s->d.head_dim_v;
    const clattn_split_combine c = {
        .acc = {s->acc, 0}, .a_row = H * parts * dv, .a_part = dv, .a_head = parts * dv,
        .st = {s->ml, 0}, .s_row = H * parts * 2, .s_part = 2, .s_head = parts * 2,
        .parts = parts, .rows = io->warm ? 0 : io->rows, .heads = H, .dv = dv, .n = io->n, .base2 = 0,
        .valid = io->packed ? NULL : io->valid, .out = io->out, .out_ld = H * dv, .lse = {NULL, 0}};
    TRY(clattn_core_combine(s->dev, s->combine, &c));
    return clattn_decode_mark(io, CLATTN_DECODE_STAGE_COMBINE);
}

clattn_status clattn_decode_mark(const clattn_decode_io *io, clattn_decode_stage stage)
{
    return io->mark ? io->mark(io->mark_ctx, stage) : CLATTN_STATUS_SUCCESS;
}

/* The partial buffers made large enough for `slots` (row, part) slots: new buffers, the old ones released (kernels
 * enqueued on them keep them until they finish); a failure keeps the old ones. */
static clattn_status grow_slots(decode_state *s, size_t slots)
{
    cl_mem ml = NULL, acc = NULL;
    clattn_status st = clattn_buffer_new(s->dev, slots * 2, 4, NULL, "the split-K partial sums", &ml);
    if (!st) st = clattn_buffer_new(s->dev, slots * s->d.head_dim_v, 4, NULL, "the split-K partial outputs", &acc);
    if (st) {
        clattn_mem_release(&ml);
        clattn_mem_release(&acc);
        return st;
    }
    clattn_mem_release(&s->ml);
    clattn_mem_release(&s->acc);
    s->ml = ml, s->acc = acc, s->slots = slots;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_decode_run(void *state, clattn_decode_io *io)
{
    decode_state *s = state;
    /* warm: both variants and the combine, with no work */
    const variant *v = io->warm || io->n * (s->d.heads / s->d.kv_heads) <= s->few.rows ? &s->few : &s->many;
    size_t parts = 2;
    if (!io->warm) TRY(choose_parts(s, io, v->rows, &parts));
    io->parts = parts;
    /* more slots than the buffers have (a long step under a loop limit): larger buffers, in the check that comes
     * before anything of the step is enqueued. Without a loop limit choose_parts keeps within the buffers: a step
     * that would not is a defect refused here, never written past their end. */
    const size_t slots = s->d.batch * io->n * s->d.heads * parts;
    if (!io->warm && parts > 1 && slots > s->slots) {
        if (!s->dev->caps.loop_limit)
            return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "decode step: %zu split-K slots chosen for buffers of %zu "
                               "(a defect in clattn's choice of parts; please report it)", slots, s->slots);
        TRY(grow_slots(s, slots));
    }
    if (io->check_only) return CLATTN_STATUS_SUCCESS;
    TRY(attend(s, v, io, parts));
    if (io->warm) TRY(attend(s, &s->many, io, parts));
    TRY(clattn_decode_mark(io, CLATTN_DECODE_STAGE_ATTEND));
    if (parts > 1) TRY(combine(s, io, parts));
    return CLATTN_STATUS_SUCCESS;
}
