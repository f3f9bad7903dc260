/* attention_fused.c: the fused attention core (cl/flash.cl) on an OpenCL device.
 *
 * Which kernel and which tiles: a table of variants, each with a predicate on the device and
 * the head sizes, tried in the order of the device class's preference (ggml style):
 *   CPU devices:  flash_rows (one work-item per ROWS query rows, no local memory)
 *   GPUs, other:  flash_tiled (K/V tiles in local memory), else flash_rows
 * CLATTN_FLASH=rows|tiled in the environment overrides the choice (tests run both). */
#include "attention_fused.h"
#include "reference.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tile parameters */

/* flash_tiled: NS work-items per query row so that each holds at most 16 value columns,
 * BQ rows per work-group (at most 256 work-items), BKT keys per tile; shrunk until the
 * three local arrays fit the device's local memory. 0 if nothing fits. */
static int tiled_params(const clattn_device *dev, size_t dk, size_t dv, clattn_flash_params *t)
{
    size_t ns = 1;
    while ((dv + ns - 1) / ns > 16 && ns < 16) ns *= 2;
    size_t wg_cap = dev->max_work_group < 256 ? dev->max_work_group : 256;
    if (ns > wg_cap) return 0;
    size_t bq = 32;
    while (bq * ns > wg_cap) bq /= 2;
    size_t bk = 32;
    const size_t kvw = dk > dv ? dk : dv;
    for (;;) {
        size_t bytes = sizeof(float) * (bq * dk + bk * (kvw + 1) + bq * (bk + 1));
        if (bytes + 256 <= dev->local_mem) break;
        if (bk > 8) bk /= 2;
        else if (bq > 1) bq /= 2;
        else return 0;
    }
    t->ns = ns;
    t->bq = bq;
    t->bk = bk;
    return 1;
}

static int rows_params(const clattn_device *dev, size_t dk, size_t dv, clattn_flash_params *t)
{
    (void)dev;
    t->rows = dv > 128 ? 8 : 16;
    t->bk = 16;
    t->vw = dk % 8 == 0 && dv % 8 == 0 ? 8 : dk % 4 == 0 && dv % 4 == 0 ? 4 : 1;
    return 1;
}

typedef struct flash_variant {
    clattn_flash_kind kind;
    const char *kernel;
    int (*params)(const clattn_device *dev, size_t dk, size_t dv, clattn_flash_params *t);
} flash_variant;

static const flash_variant variants[] = {
    {CLATTN_FLASH_ROWS, "flash_rows", rows_params},
    {CLATTN_FLASH_TILED, "flash_tiled", tiled_params},
};

/* The device class's order of preference over `variants`. */
static const clattn_flash_kind preference[][2] = {
    [CLATTN_CLASS_CPU] = {CLATTN_FLASH_ROWS, CLATTN_FLASH_TILED},
    [CLATTN_CLASS_NVIDIA] = {CLATTN_FLASH_TILED, CLATTN_FLASH_ROWS},
    [CLATTN_CLASS_AMD] = {CLATTN_FLASH_TILED, CLATTN_FLASH_ROWS},
    [CLATTN_CLASS_INTEL] = {CLATTN_FLASH_TILED, CLATTN_FLASH_ROWS},
    [CLATTN_CLASS_OTHER] = {CLATTN_FLASH_TILED, CLATTN_FLASH_ROWS},
};

int clattn_fused_supports(const clattn_device *dev, const clattn_attention_desc *d, char *why, size_t len)
{
    if (d->head_dim_qk > CLATTN_FLASH_MAX_HEAD || d->head_dim_v > CLATTN_FLASH_MAX_HEAD) {
        snprintf(why, len, "the fused kernel takes head sizes up to %d (dk = %zu, dv = %zu)", CLATTN_FLASH_MAX_HEAD,
                 d->head_dim_qk, d->head_dim_v);
        return 0;
    }
    (void)dev;
    return 1;
}

/* Build variant `kind` with tiles t (flash_tiled: rebuilt with fewer rows while the compiled kernel allows
 * less) into f. */
static clattn_status build_variant(const clattn_device *dev, const clattn_attention_desc *d, clattn_flash_kind kind,
                                   clattn_flash_params t, clattn_fused *f)
{
    const flash_variant *v = &variants[kind];
    for (;;) {
        char opts[400];
        snprintf(opts, sizeof opts,
                 "-cl-std=CL1.2 -DDK=%zu -DDV=%zu -DGROUP=%zu -DKV_ROUND=%d -DCAUSAL=%d -DWINDOW=%zu -DKPM=%d "
                 "-DMASK_KIND=%d -DDROPOUT=%d -DROWS=%zu -DBK=%zu -DBQ=%zu -DBKT=%zu -DNS=%zu -DVW=%zu",
                 d->head_dim_qk, d->head_dim_v, d->heads / d->kv_heads, d->kv_half, d->causal, d->window,
                 d->key_padding_mask, (int)d->attn_mask, d->dropout > 0.0f, t.rows ? t.rows : 4, t.bk,
                 t.bq ? t.bq : 16, t.bk, t.ns ? t.ns : 4, t.vw ? t.vw : 1);
        const char *src[] = {"philox", "half", "mask", "online", "flash"};
        cl_program prog = NULL;
        TRY(clattn_program_build(dev, src, 5, opts, &prog));
        cl_int err;
        cl_kernel k = clCreateKernel(prog, v->kernel, &err);
        size_t allowed = 0;
        if (err == CL_SUCCESS)
            err = clGetKernelWorkGroupInfo(k, dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof allowed, &allowed, NULL);
        if (err != CL_SUCCESS) {
            if (k) clReleaseKernel(k);
            clReleaseProgram(prog);
            return clattn_fail((clattn_status)err, "creating kernel %s failed (%d: %s)", v->kernel, err,
                               clattn_status_string(err));
        }
        const size_t wg = kind == CLATTN_FLASH_TILED ? t.bq * t.ns : 0;
        if (wg == 0 || wg <= allowed) {
            f->prog = prog;
            f->k = k;
            f->kind = kind;
            f->t = t;
            f->wg = wg;
            return CLATTN_STATUS_SUCCESS;
        }
        clReleaseKernel(k);
        clReleaseProgram(prog);
        if (t.bq <= 1) return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "%s does not fit this device", v->kernel);
        t.bq /= 2;
    }
}

/* The tuning file's entry for this plan's head-size class, when it fits the plan and the device. */
static int tuned_params(const clattn_device *dev, const clattn_attention_desc *d, clattn_flash_kind *kind,
                        clattn_flash_params *t)
{
    const clattn_tune_table *tn = clattn_tune_active(dev);
    const int cls = clattn_tune_class(d->head_dim_qk, d->head_dim_v);
    if (!tn || cls < 0 || !tn->flash[cls].set) return 0;
    const clattn_tune_flash *e = &tn->flash[cls];
    memset(t, 0, sizeof *t);
    *kind = (clattn_flash_kind)e->kind;
    if (e->kind == CLATTN_FLASH_ROWS) {
        t->rows = e->a, t->bk = e->b, t->vw = e->c;
        return d->head_dim_qk % t->vw == 0 && d->head_dim_v % t->vw == 0;
    }
    t->bq = e->a, t->bk = e->b, t->ns = e->c;
    const size_t kvw = d->head_dim_qk > d->head_dim_v ? d->head_dim_qk : d->head_dim_v;
    const size_t bytes = sizeof(float) * (t->bq * d->head_dim_qk + t->bk * (kvw + 1) + t->bq * (t->bk + 1));
    return t->bq * t->ns <= dev->max_work_group && bytes + 256 <= dev->local_mem;
}

clattn_status clattn_fused_init(const clattn_device *dev, const clattn_attention_desc *d, clattn_fused *f)
{
    memset(f, 0, sizeof *f);
    const char *pick = getenv("CLATTN_FLASH");
    int forced = -1;
    if (pick && *pick) {
        if (strcmp(pick, "rows") == 0) forced = CLATTN_FLASH_ROWS;
        else if (strcmp(pick, "tiled") == 0) forced = CLATTN_FLASH_TILED;
        else return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_FLASH='%s': expected rows or tiled", pick);
    }
    /* the device's tuning file first (not when CLATTN_FLASH forces a variant); a tuned build that fails
     * falls back to the defaults below */
    clattn_flash_kind kind;
    clattn_flash_params t = {0};
    if (forced < 0 && tuned_params(dev, d, &kind, &t)) {
        if (build_variant(dev, d, kind, t, f) == CLATTN_STATUS_SUCCESS) {
            f->tuned = 1;
            return CLATTN_STATUS_SUCCESS;
        }
        clattn_clear_error();
    }
    for (int n = 0; n < 2; n++) {
        kind = forced >= 0 ? (clattn_flash_kind)forced : preference[dev->dclass][n];
        memset(&t, 0, sizeof t);
        if (variants[kind].params(dev, d->head_dim_qk, d->head_dim_v, &t)) {
            const clattn_status st = build_variant(dev, d, kind, t, f);
            if (st != CLATTN_STATUS_UNSUPPORTED) return st; /* built, or a real error */
        }
        if (forced >= 0) break;
    }
    return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "no fused kernel variant fits this device (local memory %zu bytes, "
                       "max work-group %zu)%s", dev->local_mem, dev->max_work_group,
                       forced >= 0 ? " (CLATTN_FLASH forces one)" : "");
}

void clattn_fused_release(clattn_fused *f)
{
    if (f->k) clReleaseKernel(f->k);
    if (f->prog) clReleaseProgram(f->prog);
    memset(f, 0, sizeof *f);
}

void clattn_arg_masks(clattn_args *a, clattn_view kpm, clattn_view mask, const clattn_attention_desc *d)
{
    clattn_arg_mem(a, kpm.mem);
    clattn_arg_u64(a, kpm.off);
    clattn_arg_mem(a, mask.mem);
    clattn_arg_u64(a, mask.off);
    clattn_arg_u32(a, (cl_uint)d->seq_q);
    clattn_arg_u32(a, (cl_uint)d->seq_kv);
    clattn_arg_u32(a, (cl_uint)d->heads);
}

void clattn_arg_dropout(clattn_args *a, const clattn_attention_desc *d)
{
    clattn_arg_u32(a, (cl_uint)d->seed);
    clattn_arg_u32(a, (cl_uint)(d->seed >> 32));
    clattn_arg_u32(a, clattn_dropout_threshold(d->dropout));
    clattn_arg_f32(a, clattn_dropout_keep_scale(d->dropout));
}

/* A row-major tensor: (buffer, element offset, row stride), the kernels' (p, p_off, p_ld). */
static void arg_rows(clattn_args *a, clattn_view t, size_t ld)
{
    clattn_arg_mem(a, t.mem);
    clattn_arg_u64(a, t.off);
    clattn_arg_u32(a, (cl_uint)ld);
}

/* The common arguments, then the variant's own (total work-items / first group), then dropout. */
static clattn_status set_args(const clattn_attention_desc *d, clattn_fused *f, const clattn_fused_io *io,
                              cl_ulong extent)
{
    clattn_args a;
    const char *name = f->kind == CLATTN_FLASH_TILED ? "flash_tiled" : "flash_rows";
    clattn_args_begin(&a, f->k, name);
    arg_rows(&a, io->q, io->q_ld);
    arg_rows(&a, io->k, io->k_ld);
    arg_rows(&a, io->v, io->v_ld);
    arg_rows(&a, io->out, io->out_ld);
    clattn_arg_masks(&a, io->kpm, io->mask, d);
    clattn_arg_f32(&a, d->scale);
    clattn_arg_u64(&a, extent);
    clattn_arg_dropout(&a, d);
    return clattn_args_end(&a);
}

clattn_status clattn_fused_run(const clattn_device *dev, const clattn_attention_desc *d, clattn_fused *f,
                               const clattn_fused_io *io)
{
    const size_t BH = d->batch * d->heads, Tq = d->seq_q;
    if (f->kind == CLATTN_FLASH_ROWS) {
        const size_t total = BH * ((Tq + f->t.rows - 1) / f->t.rows);
        TRY(set_args(d, f, io, total));
        return clattn_enqueue_1d(dev, f->k, total, "enqueue flash_rows");
    }
    /* flash_tiled: groups in launches of at most max_launch_items work-items, each told its first group */
    const size_t groups = BH * ((Tq + f->t.bq - 1) / f->t.bq);
    size_t step = dev->max_launch_items / f->wg;
    if (step == 0) step = 1;
    for (size_t g0 = 0; g0 < groups; g0 += step) {
        const size_t n = groups - g0 < step ? groups - g0 : step;
        TRY(set_args(d, f, io, g0));
        size_t local = f->wg, global = n * local;
        clattn_note_launch(global);
        CL_CHECK(clEnqueueNDRangeKernel(dev->queue, f->k, 1, NULL, &global, &local, 0, NULL, NULL),
                 "enqueue flash_tiled");
    }
    return CLATTN_STATUS_SUCCESS;
}
