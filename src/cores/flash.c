/* flash.c: the flash family of prefill cores: fused kernels (cores/flash_common.cl) that stream K and V
 * per block of queries with an online softmax, read Q/K/V where the projections left them and write the
 * merged rows. They share one kernel signature, so one build and one launch serve them all; a member is its
 * .cl file and its descriptor (flash_rows.c, flash_tiled.c), whose clattn_flash_spec says how it launches.
 *
 * Kernel arguments, in order:
 *   q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, out, out_off, out_ld   (rows: clattn_core_arg_rows)
 *   kpm, kpm_off, mask, mask_off, Tq, Tk, H                                (clattn_core_arg_masks)
 *   scale, extent                  (PER_ITEM: the work-items in all; PER_GROUP: the launch's first group)
 *   seed_lo, seed_hi, threshold, keep_scale, drop_b0                       (clattn_core_arg_dropout)
 *   lse, lse_off                   (training plans: each row's log-sum-exp; else NULL)
 * A member whose spec names a `split` parameter may split each block's keys into SPLIT parts (work-groups
 * of their own, for plans with too few blocks to fill the device): the kernel then writes, for each query
 * row and part, the unnormalised output and the row's max (base 2) and sum into a workspace of rows
 *   ws[((b*Tq + i)*SPLIT + part) * ws_ld + ...],  ws_ld = H*(DV+2): H*DV outputs, then (max, sum) per head
 * (passed as the kernel's out, out_ld), and split_combine (common/combine.cl) merges the parts into out. */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARG_EXTENT 20 /* the index of `extent` above */

typedef struct flash_state {
    const clattn_core *core;
    const clattn_flash_spec *spec;
    const clattn_device *dev;
    clattn_attention_desc d;
    clattn_core_layout lay;
    clattn_core_params p;
    cl_program prog, prog_any;
    cl_kernel k, k_combine;
    cl_kernel k_any;  /* spec->aligned: the kernel for calls whose K or V offset is not aligned (built at the first) */
    size_t align;     /* spec->aligned: the element multiple K's and V's offsets need for k (0: k takes any) */
    size_t rows, wg;  /* query rows per work-item (PER_ITEM) or work-group; work-group size (PER_GROUP) */
    size_t parts;     /* key parts per block (1: no split) */
    cl_mem ws;        /* their workspace (parts > 1) */
} flash_state;

size_t clattn_flash_split_floats(const clattn_attention_desc *d, size_t parts)
{
    return parts <= 1 ? 0 : d->batch * d->seq_q * parts * d->heads * (d->head_dim_v + 2);
}

size_t clattn_flash_split_default(const clattn_caps *caps, const clattn_attention_desc *d, size_t rows, size_t bk)
{
    size_t split = 1;
    if (caps->dclass == CLATTN_CLASS_CPU) return split;
    const size_t tk = d->seq_kv ? d->seq_kv : d->seq_q;
    const size_t groups = d->batch * d->heads * ((d->seq_q + rows - 1) / rows);
    const size_t tiles = (tk + bk - 1) / bk, target = 4 * (size_t)caps->compute_units;
    while (split < 8 && groups * split < target && tiles >= 8 * split &&
           clattn_flash_split_floats(d, 2 * split) * sizeof(float) <= caps->max_alloc)
        split *= 2;
    return split;
}

size_t clattn_flash_device_bytes(const void *state)
{
    const flash_state *s = state;
    return clattn_mem_bytes(s->ws);
}

clattn_status clattn_flash_supports(const clattn_core *core, const clattn_caps *caps,
                                    const clattn_attention_desc *d, char *why, size_t len)
{
    return clattn_core_supports_heads(core, caps, d, CLATTN_FLASH_MAX_HEAD, 0, why, len);
}

clattn_status clattn_flash_supports_tiles(const clattn_core *core, const clattn_caps *caps,
                                          const clattn_attention_desc *d, char *why, size_t len)
{
    return clattn_core_supports_heads(core, caps, d, CLATTN_FLASH_MAX_HEAD, 1, why, len);
}

void clattn_flash_release(void *state)
{
    flash_state *s = state;
    if (!s) return;
    clattn_kernel_release(&s->k);
    clattn_kernel_release(&s->k_combine);
    clattn_kernel_release(&s->k_any);
    clattn_mem_release(&s->ws);
    clattn_program_release(&s->prog);
    clattn_program_release(&s->prog_any);
    free(s);
}

/* The member's program for s's plan and parameters; with spec->aligned, its ALIGNED kernel (aligned = 1) or the
 * general one */
static clattn_status flash_program(const flash_state *s, int aligned, cl_program *prog)
{
    const clattn_flash_spec *spec = s->spec;
    char opts[512];
    const size_t len = sizeof opts;
    int n = clattn_core_attention_defines(&s->d, CLATTN_DEFINES_ALL, opts, len);
    if (n > 0 && (size_t)n < len) n += clattn_core_param_defines(s->core, &s->p, -1, 0, opts + n, len - (size_t)n);
    if (spec->defines && n > 0 && (size_t)n < len) n += spec->defines(&s->dev->caps, &s->d, opts + n, len - (size_t)n);
    if (s->lay.io_dtype && n > 0 && (size_t)n < len) /* a half plan's Q, K, V and output as they are */
        n += snprintf(opts + n, len - (size_t)n, " -DIO_DTYPE=%d", (int)s->lay.io_dtype);
    if (spec->aligned && n > 0 && (size_t)n < len) snprintf(opts + n, len - (size_t)n, " -DALIGNED=%d", aligned);
    const char *src[] = {"common/philox", "common/half", "common/dtype", "common/mask", "common/online",
                         "common/combine", "common/exp2", "cores/flash_common", spec->source};
    return clattn_program_build(s->dev, src, sizeof src / sizeof src[0], opts, prog);
}

/* Build the kernel for parameters p; a PER_GROUP kernel is rebuilt with its `shrink` parameter halved while
 * the compiled kernel takes fewer work-items than its group (and the halved parameters still fit the core),
 * and its `split` parameter is halved while the parts' workspace exceeds one allocation. */
clattn_status clattn_flash_build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                                 const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    const clattn_flash_spec *spec = core->spec;
    flash_state *s = clattn_calloc(1, sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the %s state", core->name);
    s->core = core, s->spec = spec, s->dev = dev, s->d = *d, s->lay = *lay, s->p = *p;
    /* the parts' workspace within one allocation: fewer parts where it would not be */
    while (spec->split >= 0 && s->p.v[spec->split] > 1 &&
           clattn_flash_split_floats(d, s->p.v[spec->split]) * sizeof(float) > dev->caps.max_alloc)
        s->p.v[spec->split] /= 2;
    /* a kernel for aligned K and V (spec->aligned), where the layout's row strides are: calls whose offsets are not take
     * the general kernel (flash_run) */
    s->align = spec->aligned ? spec->aligned(d) : 0;
    if (s->align && (lay->k_ld % s->align || lay->v_ld % s->align)) s->align = 0;
    for (;;) {
        clattn_status st = flash_program(s, s->align != 0, &s->prog);
        if (st == CLATTN_STATUS_SUCCESS) st = clattn_kernel_create(s->prog, spec->kernel, &s->k);
        size_t allowed = 0;
        cl_int err = CL_SUCCESS;
        if (st == CLATTN_STATUS_SUCCESS)
            err = clGetKernelWorkGroupInfo(s->k, dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof allowed, &allowed,
                                           NULL);
        if (st == CLATTN_STATUS_SUCCESS && err != CL_SUCCESS)
            st = clattn_fail((clattn_status)err, "querying %s's work-group size failed (%d: %s)", spec->kernel, err,
                             clattn_status_string(err));
        if (clattn_device_simulated(dev)) allowed = dev->caps.max_work_group; /* the target's, not the host's */
        if (st != CLATTN_STATUS_SUCCESS) {
            clattn_flash_release(s);
            return st;
        }
        s->rows = spec->rows(&s->p);
        s->wg = spec->launch == CLATTN_FLASH_PER_GROUP ? spec->group(&s->p) : 0;
        if (s->wg == 0 || s->wg <= allowed) break;
        clattn_kernel_release(&s->k);
        clattn_program_release(&s->prog);
        clattn_core_params smaller = s->p;
        if (spec->shrink >= 0) smaller.v[spec->shrink] /= 2;
        if (spec->shrink < 0 || s->p.v[spec->shrink] <= 1 || (core->fits && !core->fits(core, NULL, NULL, &smaller))) {
            clattn_flash_release(s);
            return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "%s does not fit this device (its kernel takes %zu "
                               "work-items per work-group)", core->name, allowed);
        }
        s->p = smaller;
    }
    clattn_status checked = clattn_core_check_local(core, dev, d, &s->p, s->k);
    if (checked != CLATTN_STATUS_SUCCESS) {
        clattn_flash_release(s);
        return checked;
    }
    s->parts = spec->split >= 0 ? s->p.v[spec->split] : 1;
    if (s->parts > 1) {
        clattn_status st = clattn_kernel_create(s->prog, "split_combine", &s->k_combine);
        if (st == CLATTN_STATUS_SUCCESS)
            st = clattn_buffer_new(dev, clattn_flash_split_floats(d, s->parts), sizeof(float), NULL,
                                   "the flash split parts", &s->ws);
        if (st != CLATTN_STATUS_SUCCESS) {
            clattn_flash_release(s);
            return st;
        }
    }
    *state = s;
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status set_first_group(cl_kernel k, size_t first, void *ctx)
{
    (void)ctx;
    const cl_ulong g0 = first;
    CL_CHECK(clSetKernelArg(k, ARG_EXTENT, sizeof g0, &g0), "setting a flash kernel's first group");
    return CLATTN_STATUS_SUCCESS;
}

/* The parts in the workspace merged into the output rows (and lse): row (b*Tq + i)*parts + p of ws, of H*(DV+2)
 * floats, holds part p's outputs at h*DV and its max (base 2) and sum at H*DV + 2h. */
static clattn_status combine(const flash_state *s, const clattn_attention_desc *d, const clattn_core_io *io)
{
    const size_t ws_ld = d->heads * (d->head_dim_v + 2);
    const clattn_split_combine c = {
        .acc = {s->ws, 0}, .a_row = s->parts * ws_ld, .a_part = ws_ld, .a_head = d->head_dim_v,
        .st = {s->ws, d->heads * d->head_dim_v}, .s_row = s->parts * ws_ld, .s_part = ws_ld, .s_head = 2,
        .parts = s->parts, .rows = d->batch * d->seq_q, .heads = d->heads, .dv = d->head_dim_v, .n = d->seq_q,
        .base2 = 1, .out = io->out, .out_ld = s->lay.out_ld, .lse = io->lse};
    return clattn_core_combine(s->dev, s->k_combine, &c);
}

/* The kernel for a call whose K or V offset is not a multiple of s->align: the general one (ALIGNED=0), built the
 * first time one comes */
static clattn_status kernel_any(flash_state *s, cl_kernel *k)
{
    if (!s->k_any) {
        TRY(flash_program(s, 0, &s->prog_any));
        TRY(clattn_kernel_create(s->prog_any, s->spec->kernel, &s->k_any));
    }
    *k = s->k_any;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_flash_run(void *state, const clattn_core_io *io)
{
    flash_state *s = state;
    const clattn_attention_desc shape = clattn_core_shape(&s->d, io->seq_q, io->seq_kv), *d = &shape; /* a varlen sequence's, or the plan's */
    const size_t blocks = d->batch * d->heads * ((d->seq_q + s->rows - 1) / s->rows) * s->parts;
    cl_kernel k = s->k;
    if (s->align && (io->k.off % s->align || io->v.off % s->align)) TRY(kernel_any(s, &k));
    clattn_args a;
    clattn_args_begin(&a, k, s->spec->kernel);
    clattn_core_arg_rows(&a, io->q, s->lay.q_ld);
    clattn_core_arg_rows(&a, io->k, s->lay.k_ld);
    clattn_core_arg_rows(&a, io->v, s->lay.v_ld);
    if (s->parts > 1)
        clattn_core_arg_rows(&a, (clattn_view){s->ws, 0}, d->heads * (d->head_dim_v + 2));
    else
        clattn_core_arg_rows(&a, io->out, s->lay.out_ld);
    clattn_core_arg_masks(&a, io->kpm, io->mask, d);
    clattn_arg_f32(&a, d->scale);
    clattn_arg_u64(&a, s->spec->launch == CLATTN_FLASH_PER_ITEM ? blocks : 0);
    clattn_core_arg_dropout(&a, d, io->seed, io->drop_b0);
    clattn_arg_view(&a, s->parts > 1 ? (clattn_view){NULL, 0} : io->lse); /* split: split_combine writes it */
    TRY(clattn_args_end(&a));
    char what[64];
    snprintf(what, sizeof what, "enqueue %s", s->spec->kernel);
    if (s->spec->launch == CLATTN_FLASH_PER_ITEM)
        TRY(clattn_enqueue_1d(s->dev, k, blocks, what));
    else
        TRY(clattn_enqueue_groups(s->dev, k, blocks, s->wg, set_first_group, NULL, what));
    if (s->parts > 1) TRY(combine(s, d, io));
    return clattn_core_mark(io, CLATTN_STAGE_ATTENTION);
}
