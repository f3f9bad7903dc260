/* flash_mma.c: the tensor-core flash core (cl/cores/flash_mma.cl). Warps of 32 work-items, each owning 16
 * query rows; both products of a tile are mma.sync.m16n8k8 TF32 operations issued through inline PTX, fp32
 * accurate by default (3xTF32: hi*hi + hi*lo + lo*hi), one TF32 product per tile with precision TF32. A half
 * plan's own arrays (HMMA: F16 or BF16 without projections) take mma.sync.m16n8k16 with f16 or bf16 operands on
 * their 16-bit values, P rounded to the type (FlashAttention's rounding; README "Precision").
 *
 * It runs natively on NVIDIA GPUs of compute capability 8.0 or newer whose OpenCL compiler built the probe
 * (caps.nv_mma_tf32). Everywhere else the same kernel builds with the instructions emulated in OpenCL C
 * (MMA_NATIVE = 0), keeping the PTX fragment layout: `native` says no there, so AUTO passes over it and the
 * public list reports it unsupported, and CLATTN_CORE=flash_mma runs the emulation (the test suite does).
 * AUTO's first core on NVIDIA GPUs up to head size 128 (registry.c): on an H200 it passed every attention family
 * and ran at 0.70-0.85 of flash_gemm's core time (bench/results/h200-2026-11-26.md). */
#include "core.h"

#include <stdio.h>

enum { NW, BK, QREG, SPLIT, PS, PF };
static const size_t nw_v[] = {1, 2, 4, 8}, nw_tried[] = {2, 4};
static const size_t bk_v[] = {8, 16, 32, 64}, bk_tried[] = {16, 32};
static const size_t qreg_v[] = {0, 1};
static const size_t split_v[] = {1, 2, 4, 8}, split_tried[] = {1, 2, 4};
static const size_t ps_v[] = {0, 1};
static const size_t pf_v[] = {0, 1};
static const clattn_core_param params[] = {
    [NW] = {"NW", nw_v, 4, nw_tried, 2, NULL},
    [BK] = {"BK", bk_v, 4, bk_tried, 2, NULL},
    [QREG] = {"QREG", qreg_v, 2, qreg_v, 2, NULL},
    [SPLIT] = {"SPLIT", split_v, 4, split_tried, 3, NULL},
    [PS] = {"PS", ps_v, 2, ps_v, 2, NULL},
    [PF] = {"PF", pf_v, 2, pf_v, 2, NULL},
};

/* the defaults (tiles split once, PS = 1); one warp with 16-key tiles (HMMA's smallest), the Q block in local memory, the keys of
 * every block split into 4 parts, merged by split_combine, and every warp splitting the tiles itself (PS = 0) (two
 * entries, not three: the emulation is the suite's slowest core) */
static const char *const test_configs[] = {"-", "NW=1,BK=16,QREG=0,SPLIT=4,PS=0", NULL};

/* floats a lane keeps: its Q fragments (QREG), output and score fragments. 200: head size 128 in 3xTF32 with 8-key
 * tiles, 255 registers and no spill on sm_90 (clang 15 + ptxas 13); 16-key tiles (208) spilled 52 bytes there */
#define MAX_REGS 200
/* with PF (HMMA), whose 16-byte pieces the count above undercounts: f16 d64 PF at 112 took 211 registers, no spill;
 * d128 PF at 192 took 255 and spilled 264 bytes; d128 without PF, 128, took 243 (scripts/gpu-static.sh, sm_90,
 * clang 15 + ptxas 13; bench/results/h200-2026-11-27b.md) */
#define MAX_REGS_PF 128

static size_t pad8(size_t x) { return (x + 7) / 8 * 8; }

static int native_here(const clattn_caps *caps) { return caps && caps->nv_mma_tf32; }

/* HMMA: the fp16/bf16 products (m16n8k16) on a half plan's own arrays (d's dtype is the arrays', core.h), unless the
 * plan's kv_half rounds K and V to the other 16-bit type (then 3xTF32 on the widened values) */
static int hmma_of(const clattn_attention_desc *d)
{
    return d && d->dtype != CLATTN_DTYPE_F32 && (d->kv_half == 0 || (int)d->kv_half == (int)d->dtype);
}
static size_t pad16(size_t x) { return (x + 15) / 16 * 16; }
/* HMMA's local row strides in 32-bit words (flash_mma.cl's KLDW, VLDW): 8 mod 32 and 4 mod 16 */
static size_t kldw(size_t dk) { return pad16(dk) / 2 + (40 - pad16(dk) / 2 % 32) % 32; }
static size_t vldw(size_t dv) { return pad16(dv) / 2 + (20 - pad16(dv) / 2 % 16) % 16; }

/* The kernel's local arrays in bytes: K and V tiles and the Q block (QREG = 0), each twice with PS in 3xTF32 (their
 * low parts), or as 16-bit values with HMMA; the exchange areas (emulation). */
static size_t local_bytes(const clattn_caps *caps, size_t dk, size_t dv, int tf32, int hmma, const clattn_core_params *p)
{
    const size_t bq = 16 * p->v[NW];
    size_t floats;
    if (hmma)
        floats = p->v[BK] * (kldw(dk) + vldw(dv)) + (p->v[QREG] ? 0 : bq * kldw(dk));
    else {
        floats = (p->v[PS] && !tf32 ? 2 : 1) * (p->v[BK] * (pad8(dk) + 4) + p->v[BK] * (pad8(dv) + 4));
        if (!p->v[QREG]) floats += (p->v[PS] && !tf32 ? 2 : 1) * bq * (pad8(dk) + 4);
    }
    const size_t nsb = p->v[BK] / 8, nvb = (hmma ? pad16(dv) : pad8(dv)) / 8;
    if (!native_here(caps)) floats += p->v[NW] * (256 + 128 * (nsb > nvb ? nsb : nvb));
    return floats * sizeof(float);
}

/* Floats a lane keeps in registers: the Q fragments (QREG; their low parts too in 3xTF32; two 16-bit values to a
 * register with HMMA), the output fragments, the tile's scores (and their small terms in 3xTF32); with PF the next
 * tile's K and V pieces (16 bytes each, flash_mma.cl's NKL and NVL). */
static size_t registers(size_t dk, size_t dv, int tf32, int hmma, const clattn_core_params *p)
{
    const size_t wgs = 32 * p->v[NW];
    const size_t pieces = (p->v[BK] * pad16(dk) / 8 + wgs - 1) / wgs + (p->v[BK] * pad16(dv) / 8 + wgs - 1) / wgs;
    if (hmma) return (p->v[QREG] ? pad16(dk) / 4 : 0) + pad16(dv) / 2 + p->v[BK] / 2 + (p->v[PF] ? 4 * pieces : 0);
    const size_t parts = tf32 ? 1 : 2;
    return (p->v[QREG] ? parts * pad8(dk) / 2 : 0) + pad8(dv) / 2 + parts * p->v[BK] / 2;
}

static int tf32_of(const clattn_attention_desc *d) { return d->precision == CLATTN_PRECISION_TF32; }

static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core;
    const size_t wg = 32 * p->v[NW];
    if (caps && wg > caps->max_work_group) return 0;
    if (!d) return 1;
    if (hmma_of(d) && p->v[BK] % 16) return 0; /* HMMA's products take 16 keys */
    if (p->v[PF] && !hmma_of(d)) return 0;      /* PF prefetches HMMA's 16-bit tiles */
    const size_t regs = registers(d->head_dim_qk, d->head_dim_v, tf32_of(d), hmma_of(d), p);
    if (regs > (p->v[PF] ? MAX_REGS_PF : MAX_REGS)) return 0;
    return !caps || local_bytes(caps, d->head_dim_qk, d->head_dim_v, tf32_of(d), hmma_of(d), p) + CLATTN_LOCAL_SLACK <=
                        caps->local_mem;
}

/* HMMA's (a half plan's products in its type), by construction and scripts/gpu-static.sh (sm_90, clang 15 + ptxas 13;
 * on an H200 184 TFLOP/s at d64 and 170 at d128, no other parameters tried there: bench/results/h200-2026-11-27.md):
 * up to d = 128, 4 warps (64 rows), 64-key tiles, Q fragments in registers (d = 128: 128
 * values a lane keeps, against 3xTF32's 200 at 8-key tiles); larger heads 1 warp, 16-key tiles, the Q block in local
 * memory; shrunk (BK to 16, then QREG, then NW) while they do not fit. PS has no part in it (nothing is split). */
static int hmma_defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d, int cls,
                         clattn_core_params *p)
{
    p->v[NW] = cls <= 2 ? 4 : 1;
    p->v[BK] = cls <= 2 ? 64 : 16;
    p->v[QREG] = cls <= 2;
    p->v[SPLIT] = 1;
    p->v[PS] = 1;
    p->v[PF] = 0; /* not measured yet (bench/results/h200-2026-11-27b.md names the next GPU run's A/B) */
    while (!fits(core, caps, d, p)) {
        if (p->v[BK] > 16) p->v[BK] /= 2;
        else if (p->v[QREG]) p->v[QREG] = 0, p->v[BK] = cls <= 2 ? 64 : 16;
        else if (p->v[NW] > 1) p->v[NW] /= 2;
        else return 0;
    }
    p->v[SPLIT] = clattn_flash_split_default(caps, d, 16 * p->v[NW], p->v[BK]);
    return 1;
}

/* Starting points per head-size class, by construction and scripts/gpu-static.sh (sm_90, clang 15 + ptxas 13:
 * indicative; measured on an H200 at d64 and d128: 46 and 35 TFLOP/s, tune kept them, bench/results/h200-2026-11-26.md;
 * d64 43 since O left the accumulator, bench/results/h200-2026-11-27.md;
 * d256 at 10, slower than the unfused path there). No spills, no stack frame.
 * Ceilings of the whole tile, its staging included (bench/results/gpu-static-sm90.md), in useful TFLOP/s:
 *   <=64:  4 warps (64 rows), 32-key tiles, Q fragments in registers, tiles split once (PS): 3xTF32 at the tensor
 *          pipe's 74 (210 registers, 34 KiB; 57 with libclc's exp2, 26 before the split was branch-free), TF32
 *          mode 157 (158 registers)
 *   <=128: 4 warps, Q fragments in registers, tiles split once: 3xTF32 with 8-key tiles, at the tensor pipe's 74
 *          (255 registers: 2 work-groups per SM; 16-key tiles spill; 34 before, the Q block in local memory and
 *          split per use), TF32 mode with 16-key tiles 173 (222 registers; 108 with the Q block in local memory)
 *   >128:  1 warp, 8-key tiles, Q block in local memory (3xTF32 at 256: PS = 0, 165 registers, 33 KiB)
 * then shrunk (BK, then QREG, then PS, then NW) while they do not fit the device; keys split on GPUs as
 * flash_gemm does. */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    const int cls = clattn_head_class(d->head_dim_qk, d->head_dim_v);
    if (hmma_of(d)) return hmma_defaults(core, caps, d, cls, p);
    p->v[NW] = cls <= 2 ? 4 : 1;
    p->v[BK] = cls <= 1 ? 32 : cls == 2 ? (tf32_of(d) ? 16 : 8) : 8;
    p->v[QREG] = cls <= 2;
    p->v[SPLIT] = 1;
    p->v[PS] = 1;
    p->v[PF] = 0; /* fp32 plans: no PF */
    while (!fits(core, caps, d, p)) {
        if (p->v[BK] > 8) p->v[BK] /= 2;
        else if (p->v[QREG]) p->v[QREG] = 0, p->v[BK] = 16;
        else if (p->v[PS]) p->v[PS] = 0, p->v[BK] = cls <= 1 ? 32 : cls == 2 ? 16 : 8; /* split per use */
        else if (p->v[NW] > 1) p->v[NW] /= 2;
        else return 0;
    }
    p->v[SPLIT] = clattn_flash_split_default(caps, d, 16 * p->v[NW], p->v[BK]);
    return 1;
}

static size_t workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay)
{
    (void)lay;
    clattn_core_params p;
    return defaults(core, caps, d, &p) ? clattn_flash_split_floats(d, p.v[SPLIT]) : 0;
}

static int native(const clattn_core *core, const clattn_caps *caps, char *why, size_t len)
{
    if (native_here(caps)) return 1;
    if (caps->dclass != CLATTN_CLASS_NVIDIA)
        snprintf(why, len, "%s needs NVIDIA tensor cores (mma.sync TF32 through inline PTX); here CLATTN_CORE=%s "
                 "runs an emulation of them, for tests", core->name, core->name);
    else
        snprintf(why, len, "%s needs compute capability 8.0 or newer and a compiler that builds mma.sync TF32 "
                 "(compute capability %u.%u, inline PTX %s); CLATTN_CORE=%s runs an emulation", core->name,
                 caps->nv_cc / 10, caps->nv_cc % 10, caps->nv_inline_ptx ? "yes" : "no", core->name);
    return 0;
}

static int defines(const clattn_caps *caps, const clattn_attention_desc *d, char *opts, size_t len)
{
    return snprintf(opts, len, " -DMMA_NATIVE=%d -DEX2_PTX=%d -DHMMA=%d", native_here(caps), native_here(caps),
                    hmma_of(d));
}

/* the flash family's head sizes; precision TF32 is for fp32 arrays (a half plan's products are in its own type) */
static clattn_status supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                              char *why, size_t len)
{
    if (hmma_of(d) && tf32_of(d)) {
        snprintf(why, len, "%s: precision TF32 is for fp32 arrays; a %s plan's products are in its own type (leave "
                 "precision FP32)", core->name, clattn_dtype_name(d->dtype));
        return CLATTN_STATUS_UNSUPPORTED;
    }
    return clattn_flash_supports_tiles(core, caps, d, why, len);
}

/* HMMA stages K and V with 16-byte loads where their rows start at multiples of 8 values (the head sizes too) */
static size_t aligned(const clattn_attention_desc *d)
{
    return hmma_of(d) && d->head_dim_qk % 8 == 0 && d->head_dim_v % 8 == 0 ? 8 : 0;
}

static size_t rows(const clattn_core_params *p) { return 16 * p->v[NW]; }
static size_t group(const clattn_core_params *p) { return 32 * p->v[NW]; }

static const clattn_flash_spec spec = {
    .source = "cores/flash_mma", .kernel = "flash_mma", .launch = CLATTN_FLASH_PER_GROUP, .rows = rows,
    .group = group, .shrink = NW, .split = SPLIT, .defines = defines,
    .aligned = aligned,
};

/* the local arrays, for the family's check against the compiled kernel */
static size_t local_of(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                       const clattn_core_params *p)
{
    (void)core, (void)caps;
    return local_bytes(caps, d->head_dim_qk, d->head_dim_v, tf32_of(d), hmma_of(d), p);
}

const clattn_core clattn_core_flash_mma = {
    .name = "flash_mma",
    .kind = CLATTN_CORE_PREFILL,
    .algorithm = CLATTN_ALGORITHM_FUSED,
    .saves_row_stats = 1,
    .reads_dtypes = 1,
    .tf32 = 1,
    .params = params,
    .nparams = 6,
    .test_configs = test_configs,
    .spec = &spec,
    .supports = supports,
    .native = native,
    .defaults = defaults,
    .fits = fits,
    .build = clattn_flash_build,
    .run = clattn_flash_run,
    .local_bytes = local_of,
    .workspace = workspace,
    .device_bytes = clattn_flash_device_bytes,
    .release = clattn_flash_release,
};
