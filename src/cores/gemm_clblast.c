/* gemm_clblast.c: the GEMM core that runs CLBlast's SGEMM (runtime/blas.c, which splits what passes
 * CLBlast's 32-bit indices or one allocation into calls that fit). The GPUs' GEMM core: CLBlast's kernels
 * are tuned for GPUs (its database, and `clattn tune`'s search of its Xgemm parameters on the device). It has
 * no parameters of its own: CLBlast's are per device and process, set from the tuning file's `clblast`
 * entries when the device opens. */
#include "core.h"

static clattn_status supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                              char *why, size_t len)
{
    (void)core, (void)caps, (void)d, (void)why, (void)len;
    return CLATTN_STATUS_SUCCESS;
}

static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    (void)core, (void)caps, (void)d, (void)p;
    return 1;
}

/* The state is the device: CLBlast keeps its compiled kernels itself. */
static clattn_status build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                           const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    (void)core, (void)d, (void)lay, (void)p;
    *state = (void *)dev;
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status run_gemm(void *state, const clattn_gemm_call *c)
{
    const clattn_device *dev = state;
    const CLBlastTranspose ta = c->trans_a ? CLBlastTransposeYes : CLBlastTransposeNo;
    const CLBlastTranspose tb = c->trans_b ? CLBlastTransposeYes : CLBlastTransposeNo;
    if (c->count == 1)
        return clattn_blas_sgemm(dev, ta, tb, c->m, c->n, c->k, c->alpha, c->a.mem, c->a.off, c->lda, c->b.mem,
                                 c->b.off, c->ldb, c->beta, c->c.mem, c->c.off, c->ldc, c->what);
    return clattn_blas_sgemm_strided_batched(dev, ta, tb, c->m, c->n, c->k, c->alpha, c->a.mem, c->a.off, c->lda,
                                             c->stride_a, c->b.mem, c->b.off, c->ldb, c->stride_b, c->beta, c->c.mem,
                                             c->c.off, c->ldc, c->stride_c, c->count, c->what);
}

static void release(void *state) { (void)state; }

const clattn_core clattn_core_gemm_clblast = {
    .name = "gemm_clblast",
    .kind = CLATTN_CORE_GEMM,
    .uses_clblast = 1,
    .supports = supports,
    .defaults = defaults,
    .build = build,
    .run_gemm = run_gemm,
    .release = release,
};
