/* gemm_tiles.c: the GEMM core for CPU devices (cl/cores/gemm_tiles.cl): both operands packed into panels, then
 * register micro-tiles of MR x NV*VW, as a CPU BLAS computes. On this project's 2-core AMD EPYC (Zen 4, AVX-512)
 * through PoCL it runs the attention projections' GEMMs at 185-205 GFLOP/s, where CLBlast's kernels ran at
 * 15-17 and OpenBLAS (through a native kernel on the same buffers) at 187-205 (bench/experiments/gemm_cpu.c,
 * bench/results/pocl-2core-gemm.md).
 *
 * A call is split into blocks whose packed panels fit the plan's workspace (parameter WS, KiB, within the
 * device's max allocation): whole batch entries when they fit, else blocks of rows and columns of C, and the
 * depth k in chunks of at most KC (beta = 1 after the first chunk). Per block: pack the B block (once for all
 * its row blocks), pack the A block, run the tiles. Every index in the kernels is 64-bit, so no block has an
 * index limit of its own; launches stay within the device's launch limit (runtime/launch.c).
 *   MR   rows of a micro-tile                       VW   vector width (the device's native float width)
 *   NV   vectors across a micro-tile (NR = NV * VW)  QP   column panels per work-item
 *   KC   the depth of one block (0: all of k that fits)   WS   the packing workspace, KiB */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MR, VW, NV, QP, KC, WS, NPARAMS };
static const size_t mr_v[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16}, mr_t[] = {4, 6, 8, 12};
static const size_t vw_v[] = {4, 8, 16}, vw_t[] = {8, 16};
static const size_t nv_v[] = {1, 2, 3, 4}, nv_t[] = {1, 2, 4};
static const size_t qp_v[] = {1, 2, 4, 8, 16}, qp_t[] = {4};
static const size_t kc_v[] = {0, 64, 128, 256, 512, 1024, 2048}, kc_t[] = {0, 256};
static const size_t ws_v[] = {16, 64, 256, 1024, 4096, 8192, 16384, 65536}, ws_t[] = {8192};
static const clattn_core_param params[] = {
    [MR] = {"MR", mr_v, 12, mr_t, 4, NULL}, [VW] = {"VW", vw_v, 3, vw_t, 2, NULL},
    [NV] = {"NV", nv_v, 4, nv_t, 3, NULL},  [QP] = {"QP", qp_v, 5, qp_t, 1, NULL},
    [KC] = {"KC", kc_v, 7, kc_t, 2, NULL},  [WS] = {"WS", ws_v, 8, ws_t, 1, NULL},
};
/* the suite's configuration for this core: narrow vectors, odd tile rows, one panel per work-item, shallow blocks
 * and a small workspace, so that every blocking path runs on small shapes. Its defaults need no entry of their
 * own: where gemm_tiles runs (CPU devices) it is AUTO's GEMM core, which the plain entries run. */
static const char *const test_configs[] = {"MR=3,VW=4,NV=3,QP=1,KC=64,WS=16", NULL};

typedef struct tiles_state {
    const clattn_device *dev;
    cl_program prog;
    cl_kernel pack_a[3], pack_b[3], tiles; /* the pack kernels by the operand's dtype: F32, F16, BF16 */
    cl_mem ws;
    size_t ws_floats;
    size_t mr, nr, qp, kc;
} tiles_state;

static clattn_status supports(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                              char *why, size_t len)
{
    (void)core, (void)d;
    if (caps->dclass != CLATTN_CLASS_CPU) {
        snprintf(why, len, "gemm_tiles is written for CPU devices (one work-item per register tile, no local memory); "
                 "GPUs run gemm_clblast");
        return CLATTN_STATUS_UNSUPPORTED;
    }
    return CLATTN_STATUS_SUCCESS;
}

/* The workspace in floats for WS KiB, within one allocation. */
static size_t ws_floats(const clattn_caps *caps, const clattn_core_params *p)
{
    size_t n = p->v[WS] << 8; /* KiB / 4 bytes */
    const size_t alloc = caps->max_alloc / sizeof(float);
    return n < alloc ? n : alloc;
}

/* Measured on PoCL 3.1, 2 vCPUs of an AMD EPYC (Zen 4, AVX-512: native width 16), GEMMs of the attention
 * projections (bench/results/pocl-2core-gemm.md): MR=8 NV=2 (8 x 32 tiles, 16 accumulators of 16 floats) with
 * 4 column panels per work-item; the same tile shape at VW=8 for AVX2 devices. */
static int defaults(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    clattn_core_params *p)
{
    (void)core, (void)d;
    p->v[MR] = 8;
    p->v[VW] = caps->native_vec_float >= 16 ? 16 : caps->native_vec_float >= 8 ? 8 : 4;
    p->v[NV] = p->v[VW] == 16 ? 2 : 4;
    p->v[QP] = 4;
    p->v[KC] = 0;
    p->v[WS] = 8192;
    if (caps && caps->loop_limit) { /* the driver ends loops early: blocks of k shallow enough for its limit */
        p->v[KC] = 2048;
        clattn_core_fit_trips(core, caps, d, p, KC);
    }
    return 1;
}

/* A work-item's loop iterations, every loop of gemm_tiles.cl counted: a tiles work-item runs QP panels of KC k-steps
 * (1 + NV + MR (1 + NV) each) and its stores; a pack work-item copies KC columns of a panel (1 + its rows each).
 * KC = 0 takes all of a call's k: no bound for every call. */
static size_t trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                    const clattn_core_params *p)
{
    (void)core, (void)caps, (void)d;
    if (p->v[KC] == 0) return SIZE_MAX;
    const size_t mr = p->v[MR], nv = p->v[NV], nr = nv * p->v[VW], kc = p->v[KC];
    const size_t tiles = p->v[QP] * (1 + kc * (1 + nv + mr * (1 + nv)) + mr * (3 + 2 * nv + nv * p->v[VW]) + nv);
    const size_t pack = kc * (1 + (mr > nr ? mr : nr));
    return tiles > pack ? tiles : pack;
}

/* The workspace holds one row panel and one column panel at least, one k deep. */
static int fits(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                const clattn_core_params *p)
{
    (void)core, (void)d;
    return !caps || ws_floats(caps, p) >= 2 * (p->v[MR] > p->v[NV] * p->v[VW] ? p->v[MR] : p->v[NV] * p->v[VW]);
}

static size_t workspace(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                        const clattn_core_layout *lay)
{
    (void)lay;
    clattn_core_params p;
    memset(&p, 0, sizeof p);
    defaults(core, caps, d, &p);
    return ws_floats(caps, &p);
}

static void release(void *state)
{
    tiles_state *s = state;
    if (!s) return;
    clattn_mem_release(&s->ws);
    for (int t = 0; t < 3; t++) {
        clattn_kernel_release(&s->pack_a[t]);
        clattn_kernel_release(&s->pack_b[t]);
    }
    clattn_kernel_release(&s->tiles);
    clattn_program_release(&s->prog);
    free(s);
}

static size_t device_bytes(const void *state) { return clattn_mem_bytes(((const tiles_state *)state)->ws); }

static clattn_status build(const clattn_core *core, const clattn_device *dev, const clattn_attention_desc *d,
                           const clattn_core_layout *lay, const clattn_core_params *p, void **state)
{
    (void)d, (void)lay;
    tiles_state *s = clattn_calloc(1, sizeof *s);
    if (!s) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the %s state", core->name);
    s->dev = dev;
    s->mr = p->v[MR], s->nr = p->v[NV] * p->v[VW], s->qp = p->v[QP], s->kc = p->v[KC];
    s->ws_floats = ws_floats(&dev->caps, p);
    char opts[128];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DMR=%zu -DVW=%zu -DNV=%zu -DQP=%zu", p->v[MR], p->v[VW], p->v[NV],
             p->v[QP]);
    const char *src[] = {"common/half", "cores/gemm_tiles"};
    clattn_status st = clattn_program_build(dev, src, 2, opts, &s->prog);
    static const char *const pack_names[3][2] = {{"gemm_pack_a", "gemm_pack_b"},
                                                 {"gemm_pack_a_f16", "gemm_pack_b_f16"},
                                                 {"gemm_pack_a_bf16", "gemm_pack_b_bf16"}};
    for (int t = 0; t < 3 && !st; t++) {
        st = clattn_kernel_create(s->prog, pack_names[t][0], &s->pack_a[t]);
        if (!st) st = clattn_kernel_create(s->prog, pack_names[t][1], &s->pack_b[t]);
    }
    if (!st) st = clattn_kernel_create(s->prog, "gemm_tiles", &s->tiles);
    if (!st) st = clattn_buffer_new(dev, s->ws_floats, sizeof(float), NULL, "the GEMM packing workspace", &s->ws);
    if (st) {
        release(s);
        return st;
    }
    *state = s;
    return CLATTN_STATUS_SUCCESS;
}

static size_t min2(size_t a, size_t b) { return a < b ? a : b; }
static size_t up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* Pack `rows` x `depth` of a matrix (element (r, c) at x.off + r * rs + c * cs, entry e at + e * xe) into
 * panels of P rows at ws[dst_off + e * de ...] for `ent` entries. */
static clattn_status pack(const tiles_state *s, cl_kernel k, const char *name, size_t P, clattn_view x, size_t rs,
                          size_t cs, size_t xe, size_t rows, size_t depth, size_t dst_off, size_t de, size_t ent)
{
    const size_t panels = (rows + P - 1) / P;
    clattn_args a;
    clattn_args_begin(&a, k, name);
    clattn_arg_view(&a, x);
    clattn_arg_u64(&a, rs);
    clattn_arg_u64(&a, cs);
    clattn_arg_u64(&a, xe);
    clattn_arg_u32(&a, (cl_uint)rows);
    clattn_arg_u32(&a, (cl_uint)depth);
    clattn_arg_view(&a, (clattn_view){s->ws, dst_off});
    clattn_arg_u64(&a, de);
    clattn_arg_u32(&a, (cl_uint)panels);
    clattn_arg_u64(&a, ent * panels);
    TRY(clattn_args_end(&a));
    return clattn_enqueue_items(s->dev, k, ent * panels, name);
}

/* How a call is blocked so that its packed panels fit the workspace: half for A's panels, half for B's. */
typedef struct blocking {
    size_t kc, mc, nc, ent; /* depth, rows and columns of C per block, batch entries per block */
    size_t a_floats, b_floats; /* one entry's packed block of A, of B (the stride between entries) */
} blocking;

static blocking plan_blocks(const tiles_state *s, const clattn_gemm_call *c)
{
    blocking b;
    const size_t half = s->ws_floats / 2, wide = s->mr > s->nr ? s->mr : s->nr;
    b.kc = min2(c->k, half / wide);
    if (s->kc) b.kc = min2(b.kc, s->kc);
    if (b.kc == 0) b.kc = 1; /* fits() keeps at least one panel of each, one deep */
    b.mc = min2(c->m, half / b.kc / s->mr * s->mr);
    b.nc = min2(c->n, half / b.kc / s->nr * s->nr);
    b.a_floats = up(b.mc, s->mr) * b.kc;
    b.b_floats = up(b.nc, s->nr) * b.kc;
    b.ent = b.mc == c->m && b.nc == c->n ? min2(c->count, min2(half / b.a_floats, half / b.b_floats)) : 1;
    if (b.ent == 0) b.ent = 1;
    return b;
}

static clattn_status run_gemm(void *state, const clattn_gemm_call *c)
{
    const tiles_state *s = state;
    const blocking bl = plan_blocks(s, c);
    const size_t half = s->ws_floats / 2;
    /* op(A) (m, k): row i, depth kk; op(B)^T (n, k): row j, depth kk */
    const size_t a_rs = c->trans_a ? 1 : c->lda, a_cs = c->trans_a ? c->lda : 1;
    const size_t b_rs = c->trans_b ? c->ldb : 1, b_cs = c->trans_b ? 1 : c->ldb;
    for (size_t e0 = 0; e0 < c->count; e0 += bl.ent) {
        const size_t ent = min2(bl.ent, c->count - e0);
        for (size_t k0 = 0; k0 < c->k; k0 += bl.kc) {
            const size_t kc = min2(bl.kc, c->k - k0);
            const float beta = k0 == 0 ? c->beta : 1.0f;
            for (size_t j0 = 0; j0 < c->n; j0 += bl.nc) {
                const size_t nc = min2(bl.nc, c->n - j0);
                const clattn_view bv = {c->b.mem, c->b.off + e0 * c->stride_b + j0 * b_rs + k0 * b_cs};
                TRY(pack(s, s->pack_b[c->type_b], "gemm_pack_b", s->nr, bv, b_rs, b_cs, c->stride_b, nc, kc, half,
                         bl.b_floats, ent));
                for (size_t i0 = 0; i0 < c->m; i0 += bl.mc) {
                    const size_t mc = min2(bl.mc, c->m - i0);
                    const clattn_view av = {c->a.mem, c->a.off + e0 * c->stride_a + i0 * a_rs + k0 * a_cs};
                    TRY(pack(s, s->pack_a[c->type_a], "gemm_pack_a", s->mr, av, a_rs, a_cs, c->stride_a, mc, kc, 0,
                             bl.a_floats, ent));
                    const size_t mp = (mc + s->mr - 1) / s->mr, np = (nc + s->nr - 1) / s->nr;
                    const size_t items = ent * mp * ((np + s->qp - 1) / s->qp);
                    clattn_args a;
                    clattn_args_begin(&a, s->tiles, "gemm_tiles");
                    clattn_arg_view(&a, (clattn_view){s->ws, 0});
                    clattn_arg_u64(&a, bl.a_floats);
                    clattn_arg_view(&a, (clattn_view){s->ws, half});
                    clattn_arg_u64(&a, bl.b_floats);
                    clattn_arg_view(&a, (clattn_view){c->c.mem, c->c.off + e0 * c->stride_c + i0 * c->ldc + j0});
                    clattn_arg_u64(&a, c->ldc);
                    clattn_arg_u64(&a, c->stride_c);
                    clattn_arg_u32(&a, (cl_uint)mc);
                    clattn_arg_u32(&a, (cl_uint)nc);
                    clattn_arg_u32(&a, (cl_uint)kc);
                    clattn_arg_f32(&a, c->alpha);
                    clattn_arg_f32(&a, beta);
                    /* the bias once, with the first chunk of the depth */
                    clattn_arg_view(&a, (clattn_view){c->bias.mem, c->bias.off + j0});
                    clattn_arg_u32(&a, c->bias.mem && k0 == 0);
                    clattn_arg_u32(&a, (cl_uint)mp);
                    clattn_arg_u32(&a, (cl_uint)np);
                    clattn_arg_u64(&a, items);
                    TRY(clattn_args_end(&a));
                    TRY(clattn_enqueue_items(s->dev, s->tiles, items, "gemm_tiles"));
                }
            }
        }
    }
    return CLATTN_STATUS_SUCCESS;
}

const clattn_core clattn_core_gemm_tiles = {
    .name = "gemm_tiles",
    .kind = CLATTN_CORE_GEMM,
    .adds_biases = 1,
    .reads_dtypes = 1,
    .params = params,
    .nparams = NPARAMS,
    .test_configs = test_configs,
    .supports = supports,
    .defaults = defaults,
    .fits = fits,
    .trips = trips,
    .workspace = workspace,
    .build = build,
    .run_gemm = run_gemm,
    .device_bytes = device_bytes,
    .release = release,
};
