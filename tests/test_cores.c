/* test_cores.c: the attention cores as registered units (src/cores/registry.c, src/attention/select.c).
 *   list     clattn_core_count / clattn_core_describe on no device, ref and the OpenCL device: every core
 *            once, its kind, supported or why not, and exactly one AUTO default per head-size class and
 *            kind (flash_rows, then unfused above 256, on a CPU device)
 *   choice   what AUTO, FUSED, UNFUSED and need_weights plans run, and clattn_plan_core /
 *            clattn_decode_plan_core / clattn_encoder_plan_core naming it
 *   forced   CLATTN_CORE=NAME[:P=V,...]: the core on the plans that can use it, computing the oracle's
 *            numbers with its parameters; a plan it cannot serve refused with its reason, never given
 *            another core; unknown cores, parameters and values refused naming what exists; the older
 *            names' meaning kept (a preference)
 *   cli      `clattn cores` and `clattn cores --json` (the keys the ctest generator reads) on ref and OpenCL
 *   GEMM cores: each plan names its GEMM core (gemm_tiles on CPUs, CLBlast on GPUs); CLATTN_CORE forces one,
 *            alone or beside an attention core ("flash_tiled;gemm_clblast"), at most one per kind */
#include "oracle.h"
#include "testutil.h"
#include "cores/core.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static void clean_env(void)
{
    unsetenv("CLATTN_CORE");
    unsetenv("CLATTN_FLASH");
    unsetenv("CLATTN_ATTENTION");
    unsetenv("CLATTN_SOFTMAX");
    setenv("CLATTN_TUNE", "0", 1); /* the defaults, whatever tuning file this machine has */
}

TestSuite(cores, .init = clean_env, .timeout = 600);

static int is_cpu(clattn_device *dev)
{
    cl_device_id id;
    cl_device_type t = 0;
    clGetCommandQueueInfo(clattn_device_queue(dev), CL_QUEUE_DEVICE, sizeof id, &id, NULL);
    clGetDeviceInfo(id, CL_DEVICE_TYPE, sizeof t, &t, NULL);
    return (t & CL_DEVICE_TYPE_CPU) != 0;
}

static clattn_core_info info_of(const clattn_device *dev, const char *name)
{
    clattn_core_info c;
    for (size_t i = 0; i < clattn_core_count(); i++) {
        cr_assert_eq(clattn_core_describe(dev, i, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        if (strcmp(c.name, name) == 0) return c;
    }
    cr_assert_fail("no core %s", name);
    return c;
}

Test(cores, list)
{
    const size_t n = clattn_core_count();
    cr_assert_geq(n, 4);
    clattn_device *ref = tu_open_ref(), *cl = tu_open_opencl();
    unsigned defaults[4] = {0, 0, 0, 0}; /* per kind: the classes some core is AUTO's default for */
    for (size_t i = 0; i < n; i++) {
        clattn_core_info none, onref, c;
        cr_assert_eq(clattn_core_describe(NULL, i, &none), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(clattn_core_describe(ref, i, &onref), CLATTN_STATUS_SUCCESS);
        cr_assert_eq(clattn_core_describe(cl, i, &c), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_assert_str_eq(none.name, c.name);
        cr_assert(!none.supported && !onref.supported && none.default_for == 0 && onref.default_for == 0);
        cr_assert(strstr(onref.reason, "ref"), "%s: %s", onref.name, onref.reason);
        cr_assert(c.kind == CLATTN_CORE_PREFILL || c.kind == CLATTN_CORE_DECODE || c.kind == CLATTN_CORE_GEMM ||
                  c.kind == CLATTN_CORE_BACKWARD);
        if (c.kind == CLATTN_CORE_GEMM) cr_assert(c.algorithm == CLATTN_ALGORITHM_AUTO && !c.produces_weights);
        else cr_assert(c.algorithm == CLATTN_ALGORITHM_FUSED || c.algorithm == CLATTN_ALGORITHM_UNFUSED);
        cr_assert(c.supported == (c.reason[0] == '\0'), "%s: supported %d, reason '%s'", c.name, c.supported, c.reason);
        cr_assert_eq(c.default_for & defaults[c.kind], 0u, "%s: a second default for a class", c.name);
        defaults[c.kind] |= c.default_for;
        for (size_t k = 0; k < i; k++) {
            clattn_core_info o;
            clattn_core_describe(NULL, k, &o);
            cr_assert_str_neq(o.name, c.name, "core %s registered twice", c.name);
        }
    }
    cr_assert_eq(defaults[CLATTN_CORE_PREFILL], 0x1Fu, "every head-size class has a prefill default");
    cr_assert_eq(defaults[CLATTN_CORE_DECODE], 0x0Fu, "head sizes up to 256 have a decode default");
    cr_assert_eq(defaults[CLATTN_CORE_GEMM], 0x1Fu, "every head-size class has a GEMM default");
    /* a device with a loop limit (llvmpipe): the listing is for plans of 1024 tokens, which the backward core cannot
     * take at the largest heads there, and the cores that state no loop bound are refused */
    const size_t limit = tu_loop_limit(cl);
    if (!limit) cr_assert_eq(defaults[CLATTN_CORE_BACKWARD], 0x0Fu, "head sizes up to 256 have a backward default");
    else cr_assert_eq(defaults[CLATTN_CORE_BACKWARD] & ~0x0Fu, 0u, "a backward default above 256");
    const clattn_core_info tiles = info_of(cl, "gemm_tiles"), clblast = info_of(cl, "gemm_clblast");
    if (!limit) cr_assert(clblast.supported, "CLBlast runs on every OpenCL device");
    else cr_assert(!clblast.supported && strstr(clblast.reason, "no bound"), "gemm_clblast: %s", clblast.reason);
    cr_assert_str_eq(tiles.params, "MR VW NV QP KC WS");
    if (is_cpu(cl)) cr_assert(tiles.supported && tiles.default_for == 0x1Fu, "a CPU device's GEMMs run gemm_tiles");
    else cr_assert(!tiles.supported && strstr(tiles.reason, "CPU") && clblast.default_for == 0x1Fu,
                   "a GPU's GEMMs run CLBlast (%s)", tiles.reason);
    const clattn_core_info rows = info_of(cl, "flash_rows"), tiled = info_of(cl, "flash_tiled");
    const clattn_core_info unfused = info_of(cl, "unfused"), dec = info_of(cl, "decode_attend");
    cr_assert(rows.supported && unfused.supported && dec.supported);
    cr_assert(limit ? !tiled.supported && strstr(tiled.reason, "no bound") : tiled.supported, "flash_tiled: %s",
              tiled.reason);
    cr_assert(unfused.produces_weights && !rows.produces_weights && !tiled.produces_weights);
    cr_assert_eq(unfused.algorithm, CLATTN_ALGORITHM_UNFUSED);
    cr_assert_eq(dec.kind, CLATTN_CORE_DECODE);
    cr_assert_str_eq(rows.params, "ROWS BK VW");
    cr_assert_str_eq(unfused.params, "SOFTMAX HEADS");
    cr_assert_str_eq(unfused.test_configs, "SOFTMAX=rows,HEADS=elements SOFTMAX=item,HEADS=rows");
    cr_assert(unfused.default_for & 0x10u, "above 256 only the unfused core takes a plan");
    const clattn_core_info lanes = info_of(cl, "flash_lanes");
    cr_assert_str_eq(lanes.params, "VW BK KG");
    cr_assert(lanes.supported && !lanes.produces_weights && lanes.algorithm == CLATTN_ALGORITHM_FUSED);
    /* a loop limit: 1024 tokens are too many for flash_lanes' work-items (no parameter shortens them) and within it
     * for flash_rows' smaller heads (fewer rows per work-item) */
    if (is_cpu(cl) && limit)
        cr_assert(!lanes.default_for && rows.default_for && (rows.default_for & ~0x0Fu) == 0,
                  "flash_lanes: default for 0x%x, flash_rows for 0x%x", lanes.default_for, rows.default_for);
    else if (is_cpu(cl)) cr_assert_eq(lanes.default_for, 0x0Fu, "a CPU device's fused core is flash_lanes");
    else { /* a GPU's fused cores: flash_mma up to head size 128 where it runs natively (NVIDIA), flash_gemm the rest */
        const clattn_core_info mma = info_of(cl, "flash_mma"), gemm = info_of(cl, "flash_gemm");
        const unsigned want_mma = mma.supported && !mma.emulated ? 0x07u : 0u;
        cr_assert(mma.default_for == want_mma && gemm.default_for == (0x0Fu & ~want_mma),
                  "a GPU's fused cores: flash_mma for 0x%x, flash_gemm for 0x%x", mma.default_for, gemm.default_for);
    }
    clattn_core_info c;
    cr_assert_eq(clattn_core_describe(cl, n, &c), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_core_describe(cl, 0, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(clattn_head_class_label(0), "<=32");
    cr_assert_str_eq(clattn_head_class_label(4), ">256");
    cr_assert_str_eq(clattn_head_class_label(5), "?");
    clattn_device_free(ref);
    clattn_device_free(cl);
}

static char last_gemm[32];
static char last_params[128]; /* plan_run's last plan's core parameters */

/* The core AUTO gives kind's plans of head-size class cls on dev. */
static const char *info_default(const clattn_device *dev, clattn_core_kind kind, int cls)
{
    static clattn_core_info c;
    for (size_t i = 0; i < clattn_core_count(); i++) {
        clattn_core_describe(dev, i, &c);
        if (c.kind == kind && (c.default_for & (1u << cls))) return c.name;
    }
    return "";
} /* the GEMM core of plan_run's last plan ("" when it made none) */

/* A self-attention plan of head size d (E = 2d, 2 heads) on dev: created (or its status), run against the
 * float64 oracle; the core it ran into core, its GEMM core into last_gemm. */
static clattn_status plan_run(clattn_device *dev, size_t d, clattn_algorithm alg, int need_weights, char *core,
                              size_t len)
{
    tu_rng r = {d * 7 + (size_t)alg};
    const size_t B = 2, T = 19, H = 2, E = H * d;
    const float ws = 1.0f / sqrtf((float)E); /* nn.Linear's initialisation: activations of order 1 */
    float *w[4], *x = tu_random(&r, B * T * E, -1, 1), *b = tu_random(&r, E, -0.5f, 0.5f);
    for (int i = 0; i < 4; i++) w[i] = tu_random(&r, E * E, -ws, ws);
    clattn_attention_desc desc = {.batch = B, .seq_q = T, .embed = E, .heads = H, .head_dim_qk = d, .out_dim = E,
                                  .causal = 1, .algorithm = alg, .need_weights = need_weights};
    clattn_attention_weights wt = {.w_query = w[0], .w_key = w[1], .w_value = w[2], .w_out = w[3], .b_query = b,
                                   .b_value = b};
    clattn_plan *p = NULL;
    const clattn_status st = tu_plan_create(dev, &desc, &wt, &p);
    if (st == CLATTN_STATUS_SUCCESS) {
        snprintf(core, len, "%s", clattn_plan_core(p));
        snprintf(last_gemm, sizeof last_gemm, "%s", clattn_plan_gemm(p));
        snprintf(last_params, sizeof last_params, "%s", clattn_plan_core_params(p));
        float *out = tu_poisoned(B * T * E);
        clattn_attention_args a = {.x = x, .out = out};
        cr_assert_eq(tu_plan_execute(p, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        double *want = malloc(B * T * E * sizeof *want);
        cr_assert_eq(oracle_attention(&desc, &wt, &a, want, NULL), 0);
        char msg[256];
        cr_assert_eq(oracle_compare(out, want, B * T * E, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s: %s", core, msg);
        clattn_plan_free(p);
        free(out), free(want);
    } else {
        cr_assert_null(p);
        core[0] = last_gemm[0] = '\0';
    }
    for (int i = 0; i < 4; i++) free(w[i]);
    free(x), free(b);
    return st;
}

Test(cores, choice)
{
    clattn_device *cl = tu_open_opencl(), *ref = tu_open_ref();
    char core[32];
    static const size_t heads[] = {8, 64, 96, 256, 300};
    for (int k = 0; k < 5; k++) {
        const int cls = k == 2 ? 2 : k == 4 ? 4 : k;
        clattn_core_info def;
        for (size_t i = 0; i < clattn_core_count(); i++) {
            clattn_core_describe(cl, i, &def);
            if (def.kind == CLATTN_CORE_PREFILL && (def.default_for & (1u << cls))) break;
        }
        cr_assert_eq(plan_run(cl, heads[k], CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS,
                     "%s", clattn_last_error());
        if (strcmp(core, def.name) != 0 && tu_loop_limit(cl)) { /* the listing is for plans of 1024 tokens */
            cr_log_info("AUTO at head size %zu runs %s for 19 tokens; the listed default, %s, is for 1024, and on a "
                        "device with a loop limit (%zu) AUTO's core depends on the length", heads[k], core, def.name,
                        tu_loop_limit(cl));
            continue;
        }
        cr_assert_str_eq(core, def.name, "AUTO at head size %zu runs %s, the listed default is %s", heads[k], core,
                         def.name);
    }
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 1, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(core, "unfused", "need_weights: the core that makes them");
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_UNFUSED, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(core, "unfused");
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_FUSED, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert(strncmp(core, "flash_", 6) == 0, "FUSED runs %s", core);
    cr_assert_str_eq(last_gemm, is_cpu(cl) ? "gemm_tiles" : "gemm_clblast", "the device class's GEMM core");
    cr_assert_eq(plan_run(cl, 300, CLATTN_ALGORITHM_FUSED, 0, core, sizeof core), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "FUSED") && strstr(clattn_last_error(), "256"), "%s", clattn_last_error());
    cr_assert_eq(plan_run(ref, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(core, "ref");
    cr_assert_str_eq(last_gemm, "ref");
    cr_assert_str_eq(clattn_plan_core(NULL), "");
    cr_assert_str_eq(clattn_plan_gemm(NULL), "");
    cr_assert_str_eq(clattn_plan_gemm_params(NULL), "");
    /* decode and encoder plans name theirs */
    clattn_attention_desc dd = {.batch = 1, .seq_q = 2, .embed = 16, .heads = 2, .causal = 1};
    clattn_decode_plan *dp = NULL;
    cr_assert_eq(tu_decode_plan_create(cl, &dd, NULL, &dp), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_str_eq(clattn_decode_plan_core(dp), is_cpu(cl) ? "decode_attend" : "decode_group");
    cr_assert_str_eq(clattn_decode_plan_gemm(dp), is_cpu(cl) ? "gemm_tiles" : "gemm_clblast");
    clattn_decode_plan_free(dp);
    cr_assert_eq(tu_decode_plan_create(ref, &dd, NULL, &dp), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(clattn_decode_plan_core(dp), "ref");
    cr_assert_str_eq(clattn_decode_plan_gemm(dp), "ref");
    clattn_decode_plan_free(dp);
    cr_assert_str_eq(clattn_decode_plan_gemm(NULL), "");
    cr_assert_str_eq(clattn_encoder_plan_gemm(NULL), "");
    clattn_device_free(cl);
    clattn_device_free(ref);
}

Test(cores, forced)
{
    clattn_device *cl = tu_open_opencl();
    char core[32];
    /* every prefill core, forced, runs the plans that can use it and computes the oracle's numbers */
    for (size_t i = 0; i < clattn_core_count(); i++) {
        clattn_core_info c;
        clattn_core_describe(cl, i, &c);
        if (c.kind != CLATTN_CORE_PREFILL || !c.supported) continue;
        setenv("CLATTN_CORE", c.name, 1);
        cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS, "%s: %s",
                     c.name, clattn_last_error());
        cr_assert_str_eq(core, c.name);
        cr_assert_eq(plan_run(cl, 8, c.algorithm, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
        cr_assert_str_eq(core, c.name);
        /* a plan whose description excludes it keeps its own core */
        const clattn_algorithm other = c.algorithm == CLATTN_ALGORITHM_FUSED ? CLATTN_ALGORITHM_UNFUSED
                                                                             : CLATTN_ALGORITHM_FUSED;
        cr_assert_eq(plan_run(cl, 8, other, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
        cr_assert_str_neq(core, c.name);
        if (!c.produces_weights) {
            cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 1, core, sizeof core), CLATTN_STATUS_SUCCESS);
            cr_assert_str_eq(core, "unfused");
            /* a plan it cannot serve: refused with its reason and the variable, never another core */
            cr_assert_eq(plan_run(cl, 300, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_UNSUPPORTED);
            cr_assert(strstr(clattn_last_error(), "CLATTN_CORE") && strstr(clattn_last_error(), c.name) &&
                      strstr(clattn_last_error(), "256"), "%s", clattn_last_error());
        }
    }
    /* parameters: valid ones run; unknown names, values not in the space and values that do not fit are refused */
    setenv("CLATTN_CORE", "flash_rows:ROWS=4,BK=8", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS, "%s",
                 clattn_last_error());
    cr_assert_str_eq(core, "flash_rows");
    setenv("CLATTN_CORE", "flash_tiled:BQ=4,BKT=8,NS=2", 1);
    if (tu_loop_limit(cl)) /* it states no loop bound: refused there, with the reason */
        cr_assert(plan_run(cl, 16, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core) == CLATTN_STATUS_TOO_LARGE_FOR_DEVICE &&
                  strstr(clattn_last_error(), "no bound"), "%s", clattn_last_error());
    else
        cr_assert_eq(plan_run(cl, 16, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
    setenv("CLATTN_CORE", "unfused:SOFTMAX=rows", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 1, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(core, "unfused");
    const struct { const char *env; clattn_status st; const char *needle; } bad[] = {
        {"flash_magic", CLATTN_STATUS_INVALID_ARGUMENT, "flash_rows"},
        {"flash_rows:ROWS=3", CLATTN_STATUS_INVALID_ARGUMENT, "the values are"},
        {"flash_rows:ROWS", CLATTN_STATUS_INVALID_ARGUMENT, "PARAMETER=VALUE"},
        {"flash_rows:TILE=4", CLATTN_STATUS_INVALID_ARGUMENT, "has no parameter"},
        {"flash_rows:ROWS=4,BK=8,ROWS=8", CLATTN_STATUS_INVALID_ARGUMENT, "ROWS is given twice"}, /* not: last wins */
        {"unfused:SOFTMAX=fast", CLATTN_STATUS_INVALID_ARGUMENT, "rows, item"},
        {"flash_tiled:BQ=64,NS=16", CLATTN_STATUS_UNSUPPORTED, "does not fit"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("CLATTN_CORE", bad[i].env, 1);
        cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), bad[i].st, "%s: %s", bad[i].env,
                     clattn_last_error());
        cr_assert(strstr(clattn_last_error(), bad[i].needle), "%s: '%s' lacks '%s'", bad[i].env, clattn_last_error(),
                  bad[i].needle);
    }
    /* the limit named where it is local memory (here lowered to 4 KiB: flash_tiled's 64-row tiles need more) */
    const size_t local = cl->caps.local_mem;
    cl->caps.local_mem = 4096;
    setenv("CLATTN_CORE", "flash_tiled:BQ=64", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "bytes of local memory, the device has 4096"), "%s", clattn_last_error());
    cl->caps.local_mem = local;
    setenv("CLATTN_CORE", "flash_rows:VW=8", 1); /* head size 4: the vector width does not divide it */
    cr_assert_eq(plan_run(cl, 4, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(clattn_last_error(), "does not fit"), "%s", clattn_last_error());
    /* a GEMM core forced: the plan keeps its attention core and runs its GEMMs on it (projections, and the
     * unfused core's products), with the oracle's numbers; with an attention core in the same variable, both */
    for (size_t i = 0; i < clattn_core_count(); i++) {
        clattn_core_info c;
        clattn_core_describe(cl, i, &c);
        if (c.kind != CLATTN_CORE_GEMM || !c.supported) continue;
        for (int weights = 0; weights < 2; weights++) {
            setenv("CLATTN_CORE", c.name, 1);
            cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, weights, core, sizeof core), CLATTN_STATUS_SUCCESS,
                         "%s: %s", c.name, clattn_last_error());
            cr_assert_str_eq(last_gemm, c.name);
            cr_assert_str_eq(core, weights ? "unfused" : info_default(cl, CLATTN_CORE_PREFILL, 0));
            char spec[96];
            snprintf(spec, sizeof spec, "unfused;%s", c.name); /* not AUTO's core here (no weights asked) */
            setenv("CLATTN_CORE", spec, 1);
            cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
            cr_assert(strcmp(core, "unfused") == 0 && strcmp(last_gemm, c.name) == 0, "%s: %s, %s", spec, core,
                      last_gemm);
        }
    }
    if (is_cpu(cl)) {
        setenv("CLATTN_CORE", "gemm_tiles:MR=3,VW=4,NV=3,QP=1,KC=64,WS=16;unfused", 1);
        cr_assert_eq(plan_run(cl, 16, CLATTN_ALGORITHM_AUTO, 1, core, sizeof core), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        cr_assert(strcmp(core, "unfused") == 0 && strcmp(last_gemm, "gemm_tiles") == 0, "%s, %s", core, last_gemm);
    }
    const struct { const char *env; const char *needle; } bad_gemm[] = {
        {"gemm_tiles:MR=9", "the values are"},
        {"gemm_tiles:TILE=4", "has no parameter"},
        {"flash_rows;flash_tiled", "two prefill cores"},
        {"gemm_tiles;gemm_clblast", "two gemm cores"},
        {"flash_rows;gemm_magic", "no core 'gemm_magic'"},
    };
    for (size_t i = 0; i < sizeof bad_gemm / sizeof bad_gemm[0]; i++) {
        setenv("CLATTN_CORE", bad_gemm[i].env, 1);
        if (!is_cpu(cl) && strncmp(bad_gemm[i].env, "gemm_tiles:", 11) == 0) { /* refused first as a CPU-only core */
            cr_assert_neq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
            cr_assert(strstr(clattn_last_error(), "gemm_tiles") && strstr(clattn_last_error(), "CPU"), "%s: %s",
                      bad_gemm[i].env, clattn_last_error());
            continue;
        }
        cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_INVALID_ARGUMENT,
                     "%s: %s", bad_gemm[i].env, clattn_last_error());
        cr_assert(strstr(clattn_last_error(), bad_gemm[i].needle), "%s: '%s' lacks '%s'", bad_gemm[i].env,
                  clattn_last_error(), bad_gemm[i].needle);
    }
    if (!is_cpu(cl)) { /* gemm_tiles forced on a GPU: refused with its reason, never CLBlast instead */
        setenv("CLATTN_CORE", "gemm_tiles", 1);
        cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_UNSUPPORTED);
        cr_assert(strstr(clattn_last_error(), "CPU"), "%s", clattn_last_error());
    }
    /* a decode core forced: prefill plans keep theirs, decode plans run it; a plan it does nothing for says so in
     * its notice (clattn_last_notice), as does one whose description excludes the forced prefill core */
    setenv("CLATTN_CORE", "decode_attend", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_neq(core, "decode_attend");
    cr_assert(strstr(clattn_last_notice(), "names no core this plan runs") &&
                  strstr(clattn_last_notice(), "decode_attend (a decode core)") && strstr(clattn_last_notice(), core),
              "%s", clattn_last_notice());
    setenv("CLATTN_CORE", "flash_rows", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 1, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert(strstr(clattn_last_notice(), "flash_rows (a prefill core)"), "need_weights: %s", clattn_last_notice());
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(clattn_last_notice(), "", "the forced core runs: no notice");
    char spec2[96]; /* one spec applies (the device's GEMM core): the variable does something */
    snprintf(spec2, sizeof spec2, "decode_attend;%s", info_default(cl, CLATTN_CORE_GEMM, 0));
    setenv("CLATTN_CORE", spec2, 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(clattn_last_notice(), "");
    clattn_device *ref = tu_open_ref();
    cr_assert_eq(plan_run(ref, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert(strstr(clattn_last_notice(), "not used on the ref device"), "%s", clattn_last_notice());
    clattn_device_free(ref);
    /* the variable checked without a plan */
    cr_assert_eq(clattn_core_env_check(), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    static const char *const bad_env[] = {"garbage", "flash_rows:ROWS=4,ROWS=8", "decode_group:NOPE=1",
                                          "flash_rows;flash_tiled"};
    for (size_t i = 0; i < sizeof bad_env / sizeof bad_env[0]; i++) {
        setenv("CLATTN_CORE", bad_env[i], 1);
        cr_assert_eq(clattn_core_env_check(), CLATTN_STATUS_INVALID_ARGUMENT, "%s", bad_env[i]);
    }
    unsetenv("CLATTN_CORE");
    cr_assert_eq(clattn_core_env_check(), CLATTN_STATUS_SUCCESS);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(clattn_last_notice(), "", "no variable: no notice");
    /* the older names keep their meaning: a core tried first, the usual choice when it cannot serve */
    setenv("CLATTN_FLASH", "tiled", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    /* (under a loop limit flash_tiled, which states no bound, cannot serve: the usual choice) */
    cr_assert_str_eq(core, tu_loop_limit(cl) ? info_default(cl, CLATTN_CORE_PREFILL, 0) : "flash_tiled");
    cr_assert_eq(plan_run(cl, 300, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(core, "unfused");
    setenv("CLATTN_FLASH", "wide", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_INVALID_ARGUMENT);
    unsetenv("CLATTN_FLASH");
    setenv("CLATTN_ATTENTION", "unfused", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_AUTO, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_eq(core, "unfused");
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_FUSED, 0, core, sizeof core), CLATTN_STATUS_SUCCESS);
    cr_assert_str_neq(core, "unfused");
    unsetenv("CLATTN_ATTENTION");
    /* CLATTN_SOFTMAX=rows|item: the unfused core's softmax, each value its own */
    static const char *const softmax[] = {"item", "rows", "item"};
    for (int i = 0; i < 3; i++) {
        setenv("CLATTN_SOFTMAX", softmax[i], 1);
        cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_UNFUSED, 0, core, sizeof core), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        char want[48]; /* HEADS by the device's class: a work-item per row on CPUs, per element elsewhere */
        snprintf(want, sizeof want, "SOFTMAX=%s,HEADS=%s", softmax[i], is_cpu(cl) ? "rows" : "elements");
        cr_assert_str_eq(core, "unfused");
        cr_assert_str_eq(last_params, want, "CLATTN_SOFTMAX=%s: %s", softmax[i], last_params);
    }
    setenv("CLATTN_SOFTMAX", "wide", 1);
    cr_assert_eq(plan_run(cl, 8, CLATTN_ALGORITHM_UNFUSED, 0, core, sizeof core), CLATTN_STATUS_INVALID_ARGUMENT);
    unsetenv("CLATTN_SOFTMAX");
    clattn_device_free(cl);
}

/* stdout of `clattn ARGS` (stderr appended), its exit status in *rc. */
static char *cli(const char *args, int *rc)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", CLATTN_CLI_PATH, args);
    FILE *f = popen(cmd, "r");
    cr_assert(f, "popen %s", cmd);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (n + 1 < cap && fgets(buf + n, (int)(cap - n), f)) n += strlen(buf + n);
    buf[n] = '\0';
    const int st = pclose(f);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

Test(cores, cli)
{
    char args[300];
    int rc;
    snprintf(args, sizeof args, "cores --json --device %s", tu_opencl_spec());
    char *out = cli(args, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    clattn_device *cl_for_limit = tu_open_opencl();
    size_t lines = 0;
    for (char *l = out; *l; l = strchr(l, '\n') + 1, lines++) {
        cr_assert(l[0] == '{' && strchr(l, '\n') && strchr(l, '\n')[-1] == '}', "not one JSON object a line: %s", l);
        static const char *keys[] = {"\"name\":\"", "\"kind\":\"", "\"supported\":", "\"reason\":\"", "\"emulated\":",
                                     "\"default_for\":[", "\"test_configs\":["};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            cr_assert(strstr(l, keys[k]) && strstr(l, keys[k]) < strchr(l, '\n'), "no %s in %s", keys[k], l);
    }
    cr_assert_eq(lines, clattn_core_count());
    cr_assert(strstr(out, "{\"name\":\"unfused\",\"kind\":\"prefill\",\"supported\":true,\"reason\":\"\""), "%s", out);
    cr_assert(strstr(out, "\"name\":\"decode_attend\",\"kind\":\"decode\""), "%s", out);
    if (!tu_loop_limit(cl_for_limit)) /* else refused there: it states no loop bound */
        cr_assert(strstr(out, "\"name\":\"gemm_clblast\",\"kind\":\"gemm\",\"supported\":true"), "%s", out);
    else
        cr_assert(strstr(out, "\"name\":\"gemm_clblast\",\"kind\":\"gemm\",\"supported\":false,\"reason\":\""
                          "gemm_clblast has no bound on its work-items' loop iterations"), "%s", out);
    cr_assert(strstr(out, "\"algorithm\":null"), "%s", out);
    free(out);
    out = cli("cores --device ref --json", &rc);
    cr_assert_eq(rc, 0);
    cr_assert(strstr(out, "\"name\":\"flash_rows\",\"kind\":\"prefill\",\"supported\":false,\"reason\":\"the ref"),
              "%s", out);
    cr_assert(strstr(out, "\"default_for\":[]"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "cores --device %s", tu_opencl_spec());
    out = cli(args, &rc);
    cr_assert_eq(rc, 0);
    /* flash_tiled's row; every row's KIND where the header's is, the longest name's too */
    const char *head = strstr(out, "CORE"), *row = strstr(out, "\nflash_tiled ");
    cr_assert(head && row, "%s", out);
    char name[64], kind[16], sup[16];
    cr_assert_eq(sscanf(row, " %63s %15s %15s", name, kind, sup), 3, "%s", out);
    cr_assert(strcmp(kind, "prefill") == 0 && strcmp(sup, tu_loop_limit(cl_for_limit) ? "no" : "yes") == 0, "%s", out);
    const long kind_at = strstr(head, "KIND") - head;
    for (const char *line = strchr(head, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
        if (line[1] == ' ') continue; /* a reason under its core */
        const char *k = line + 1;
        while (*k && *k != ' ') k++;
        while (*k == ' ') k++;
        cr_assert_eq(k - (line + 1), kind_at, "a row's KIND column is not the header's: %s", out);
    }
    free(out);
    out = cli("cores --bogus", &rc);
    cr_assert_eq(rc, 2, "%s", out);
    free(out);
    /* a variable every plan would refuse: `clattn cores` says so, and fails */
    setenv("CLATTN_CORE", "garbage", 1);
    out = cli("cores --device ref", &rc);
    cr_assert(rc == 2 && strstr(out, "no core 'garbage'") && strstr(out, "every plan will refuse it"), "%d: %s", rc,
              out);
    free(out);
    unsetenv("CLATTN_CORE");
    out = cli("cores --device nosuchthing", &rc);
    cr_assert_neq(rc, 0, "%s", out);
    free(out);
    clattn_device_free(cl_for_limit);
}

/* AUTO's order on GPUs (registry.c): flash_gemm first for every head size it takes; then flash_tiled up to
 * 64 and the unfused path above (issue 22's H100 table); on NVIDIA GPUs flash_mma before all of them up to head
 * size 128 (measured on an H200), the same order after it; on a CPU flash_lanes. */
Test(cores, gpu_order)
{
    static const char *const gpu[][4] = {
        {"flash_gemm", "flash_tiled", "unfused", "flash_rows"},
        {"flash_gemm", "flash_tiled", "unfused", "flash_rows"},
        {"flash_gemm", "unfused", "flash_tiled", "flash_rows"},
        {"flash_gemm", "unfused", "flash_tiled", "flash_rows"},
    };
    for (int dc = CLATTN_CLASS_NVIDIA; dc <= CLATTN_CLASS_OTHER; dc++)
        for (int cls = 0; cls < 4; cls++) {
            const int mma = dc == CLATTN_CLASS_NVIDIA && cls <= 2;
            for (size_t i = 0; i < 4 + (size_t)mma; i++) {
                const clattn_core *c = clattn_core_preferred(CLATTN_CORE_PREFILL, (clattn_device_class)dc, cls, i);
                const char *want = mma ? (i ? gpu[cls][i - 1] : "flash_mma") : gpu[cls][i];
                cr_assert(c, "class %d, head class %d: no choice %zu", dc, cls, i);
                cr_assert_str_eq(c->name, want, "device class %d, head class %d, choice %zu", dc, cls, i);
            }
            cr_assert_null(clattn_core_preferred(CLATTN_CORE_PREFILL, (clattn_device_class)dc, cls, 4 + (size_t)mma),
                           "device class %d, head class %d: a choice past the order", dc, cls);
        }
    cr_assert_str_eq(clattn_core_preferred(CLATTN_CORE_PREFILL, CLATTN_CLASS_CPU, 1, 0)->name, "flash_lanes");
    /* backward: flash_backward_gemm, then flash_backward, on NVIDIA GPUs up to head size 64 (measured on an H200);
     * flash_backward alone everywhere else */
    for (int dc = 0; dc < CLATTN_CLASS_COUNT; dc++)
        for (int cls = 0; cls < CLATTN_HEAD_CLASSES; cls++) {
            const int gemm = dc == CLATTN_CLASS_NVIDIA && cls <= 1;
            const clattn_core *a = clattn_core_preferred(CLATTN_CORE_BACKWARD, (clattn_device_class)dc, cls, 0);
            const clattn_core *b = clattn_core_preferred(CLATTN_CORE_BACKWARD, (clattn_device_class)dc, cls, 1);
            cr_assert(a, "device class %d, head class %d: no backward core", dc, cls);
            cr_assert_str_eq(a->name, gemm ? "flash_backward_gemm" : "flash_backward", "class %d, head class %d", dc,
                             cls);
            if (gemm) cr_assert(b && strcmp(b->name, "flash_backward") == 0, "class %d, head class %d", dc, cls);
            else cr_assert_null(b, "class %d, head class %d", dc, cls);
        }
}

/* CPU devices: flash_lanes first for every head size the flash kernels take (measured faster than flash_rows and
 * than the unfused path at every length and head size, registry.c), then flash_rows, flash_tiled, flash_gemm and the
 * unfused path; on a CPU test device the plans AUTO builds say the same, long or short, causal or not. */
Test(cores, cpu_order)
{
    static const char *const cpu[] = {"flash_lanes", "flash_rows", "flash_tiled", "flash_gemm", "unfused"};
    for (int cls = 0; cls < CLATTN_HEAD_CLASSES; cls++) {
        for (size_t i = 0; i < 5; i++) {
            const clattn_core *c = clattn_core_preferred(CLATTN_CORE_PREFILL, CLATTN_CLASS_CPU, cls, i);
            cr_assert(c, "head class %d: no choice %zu", cls, i);
            cr_assert_str_eq(c->name, cpu[i], "head class %d, choice %zu", cls, i);
        }
        cr_assert_null(clattn_core_preferred(CLATTN_CORE_PREFILL, CLATTN_CLASS_CPU, cls, 5));
    }
    clattn_device *cl = tu_open_opencl();
    if (is_cpu(cl) && !getenv("CLATTN_CORE"))
        for (int k = 0; k < 4; k++) {
            const clattn_attention_desc d = {.batch = 1, .seq_q = k < 2 ? 61 : 1536, .embed = k % 2 ? 64 : 512,
                                             .heads = k % 2 ? 1 : 2, .causal = k == 1};
            clattn_plan *plan = NULL;
            cr_assert_eq(clattn_plan_create(cl, &d, NULL, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
            cr_assert_str_eq(clattn_plan_core(plan), "flash_lanes", "shape %d", k);
            clattn_plan_free(plan);
        }
    clattn_device_free(cl);
}

/* The GEMM cores' order: gemm_tiles then CLBlast on CPU devices, CLBlast alone on GPUs (registry.c). */
Test(cores, gemm_order)
{
    for (int dc = 0; dc < CLATTN_CLASS_COUNT; dc++)
        for (int cls = 0; cls < CLATTN_HEAD_CLASSES; cls++) {
            const clattn_core *a = clattn_core_preferred(CLATTN_CORE_GEMM, (clattn_device_class)dc, cls, 0);
            const clattn_core *b = clattn_core_preferred(CLATTN_CORE_GEMM, (clattn_device_class)dc, cls, 1);
            cr_assert(a, "device class %d, head class %d: no GEMM core", dc, cls);
            cr_assert_eq(a->kind, CLATTN_CORE_GEMM);
            cr_assert_str_eq(a->name, dc == CLATTN_CLASS_CPU ? "gemm_tiles" : "gemm_clblast", "class %d", dc);
            if (dc == CLATTN_CLASS_CPU) cr_assert(b && strcmp(b->name, "gemm_clblast") == 0);
            else cr_assert_null(b);
        }
}

/* flash_gemm's defaults on a GPU-like device (48 KiB of local memory, 1024 work-items, 132 compute units):
 * they fit it, keep at most 64 accumulators, take 8-row micro-tiles up to head size 64 and one array for the K
 * and V tiles at 128 (the register prefetch fitting beside the former), and split the keys only where the
 * blocks are too few. */
Test(cores, flash_gemm_defaults)
{
    const clattn_core *c = clattn_core_find("flash_gemm");
    cr_assert(c);
    clattn_caps caps = {.dclass = CLATTN_CLASS_NVIDIA, .local_mem = 49152, .max_work_group = 1024,
                        .compute_units = 132, .max_alloc = (size_t)1 << 34};
    static const size_t heads[] = {8, 64, 80, 96, 128, 256, 7, 13};
    for (size_t k = 0; k < sizeof heads / sizeof heads[0]; k++) {
        const size_t dh = heads[k];
        clattn_attention_desc d = {.batch = 4, .seq_q = 4096, .embed = 8 * dh, .heads = 8, .head_dim_qk = dh,
                                   .head_dim_v = dh};
        clattn_core_params p;
        cr_assert(c->defaults(c, &caps, &d, &p), "head %zu: no defaults", dh);
        cr_assert(c->fits(c, &caps, &d, &p), "head %zu: the defaults do not fit", dh);
        cr_assert_eq(p.v[5], 1, "head %zu: B=4 T=4096 H=8 fills the GPU unsplit (SPLIT=%zu)", dh, p.v[5]);
        cr_assert_eq(p.v[4], dh % 4 ? 1u : 4u, "head %zu: vector width %zu", dh, p.v[4]);
        cr_assert_eq(p.v[6], 0, "head %zu: no register prefetch by default", dh);
        cr_assert_eq(p.v[2], dh <= 64 ? 8u : dh <= 128 ? 4u : 2u, "head %zu: RM=%zu", dh, p.v[2]);
        cr_assert_eq(p.v[7], dh > 64 && dh <= 128, "head %zu: KVS=%zu", dh, p.v[7]);
        if (dh <= 64) {
            p.v[6] = 1; /* with it: within the registers' budget */
            cr_assert(c->fits(c, &caps, &d, &p), "head %zu: PF=1 does not fit the defaults", dh);
            p.v[6] = 0;
        }
        d.batch = 1, d.seq_q = 512, d.seq_kv = 8192; /* 8 heads x a few blocks: split */
        cr_assert(c->defaults(c, &caps, &d, &p));
        cr_assert_gt(p.v[5], 1, "head %zu: B=1 Tq=512 Tk=8192 H=8 leaves the GPU idle unsplit", dh);
        caps.dclass = CLATTN_CLASS_CPU;
        cr_assert(c->defaults(c, &caps, &d, &p));
        cr_assert_eq(p.v[5], 1, "head %zu: a CPU is not split", dh);
        caps.dclass = CLATTN_CLASS_NVIDIA;
    }
    /* too little local memory for any tile: no defaults, and the core says why */
    caps.local_mem = 1024;
    clattn_attention_desc d = {.batch = 1, .seq_q = 64, .embed = 512, .heads = 2, .head_dim_qk = 256, .head_dim_v = 256};
    clattn_core_params p;
    cr_assert_eq(c->defaults(c, &caps, &d, &p), 0);
    char why[200];
    cr_assert_eq(c->supports(c, &caps, &d, why, sizeof why), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(why, "do not fit"), "%s", why);
}

/* flash_backward_gemm's defaults on a GPU-like device (48 KiB of local memory): they exist and fit for every head
 * size up to 256 (and odd ones, whose rows take no vectors), with 4 rows a work-item in the dQ pass up to 128 and the
 * dK/dV pass's accumulators within 64 floats; with too little local memory the core says why it does not fit. */
Test(cores, flash_backward_gemm_defaults)
{
    const clattn_core *c = clattn_core_find("flash_backward_gemm");
    cr_assert(c && c->kind == CLATTN_CORE_BACKWARD);
    enum { BQ, BK, RQ, RK, TC };
    clattn_caps caps = {.dclass = CLATTN_CLASS_NVIDIA, .local_mem = 49152, .max_work_group = 1024,
                        .compute_units = 132, .max_alloc = (size_t)1 << 34};
    static const size_t heads[] = {8, 64, 80, 96, 128, 256, 7, 13};
    for (size_t k = 0; k < sizeof heads / sizeof heads[0]; k++) {
        const size_t dh = heads[k];
        clattn_attention_desc d = {.batch = 4, .seq_q = 1024, .embed = 8 * dh, .heads = 8, .head_dim_qk = dh,
                                   .head_dim_v = dh, .training = 1};
        clattn_core_params p;
        cr_assert(c->defaults(c, &caps, &d, &p), "head %zu: no defaults", dh);
        cr_assert(c->fits(c, &caps, &d, &p), "head %zu: the defaults do not fit", dh);
        cr_assert_leq(c->local_bytes(c, &caps, &d, &p) + CLATTN_LOCAL_SLACK, caps.local_mem, "head %zu", dh);
        cr_assert_eq(p.v[RQ], dh <= 128 ? 4u : 1u, "head %zu: RQ=%zu", dh, p.v[RQ]);
        const size_t cols = 2 * ((dh + p.v[TC] - 1) / p.v[TC]);
        cr_assert_leq(p.v[RK] * cols, 64, "head %zu: RK=%zu, %zu accumulators", dh, p.v[RK], p.v[RK] * cols);
        char why[200];
        cr_assert_eq(c->supports(c, &caps, &d, why, sizeof why), CLATTN_STATUS_SUCCESS, "head %zu: %s", dh, why);
    }
    caps.local_mem = 2048;
    clattn_attention_desc d = {.batch = 1, .seq_q = 64, .embed = 512, .heads = 2, .head_dim_qk = 256, .head_dim_v = 256,
                               .training = 1};
    char why[200];
    cr_assert_eq(c->supports(c, &caps, &d, why, sizeof why), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(why, "do not fit"), "%s", why);
}

/* Decode: decode_group first on every GPU class and head class, decode_attend on CPUs (registry.c). */
Test(cores, decode_order)
{
    for (int dc = 0; dc < CLATTN_CLASS_COUNT; dc++)
        for (int cls = 0; cls < CLATTN_HEAD_CLASSES; cls++) {
            const clattn_core *a = clattn_core_preferred(CLATTN_CORE_DECODE, (clattn_device_class)dc, cls, 0);
            const clattn_core *b = clattn_core_preferred(CLATTN_CORE_DECODE, (clattn_device_class)dc, cls, 1);
            cr_assert(a && b, "device class %d, head class %d: two decode cores in the order", dc, cls);
            cr_assert_str_eq(a->name, dc == CLATTN_CLASS_CPU ? "decode_attend" : "decode_group", "class %d", dc);
            cr_assert_str_eq(b->name, dc == CLATTN_CLASS_CPU ? "decode_group" : "decode_attend", "class %d", dc);
        }
}

/* decode_group's defaults on a GPU-like device (48 KiB of local memory, 1024 work-items): they fit, read 16
 * bytes per lane and load (float4, or half8 from a half cache), give each key to as many lanes as divide
 * it with at least 2 vectors each (at most 32), and keep a lane's registers within 128 floats; with too little local memory the core says
 * why it does not fit. */
Test(cores, decode_group_defaults)
{
    const clattn_core *c = clattn_core_find("decode_group");
    cr_assert(c);
    enum { WG, LANES, KT, VW, R };
    clattn_caps caps = {.dclass = CLATTN_CLASS_NVIDIA, .local_mem = 49152, .max_work_group = 1024,
                        .compute_units = 132, .max_alloc = (size_t)1 << 34};
    static const size_t heads[] = {128, 64, 256, 8, 5, 96};
    for (size_t k = 0; k < sizeof heads / sizeof heads[0]; k++)
        for (int half = 0; half < 2; half++) {
            const size_t dh = heads[k];
            clattn_attention_desc d = {.batch = 1, .seq_q = 1, .embed = 32 * dh, .heads = 32, .kv_heads = 8,
                                       .head_dim_qk = dh, .head_dim_v = dh, .kv_half = half};
            clattn_core_params p;
            cr_assert(c->defaults(c, &caps, &d, &p), "head %zu half %d: no defaults", dh, half);
            cr_assert(c->fits(c, &caps, &d, &p), "head %zu half %d: the defaults do not fit", dh, half);
            const size_t want_vw = dh % 8 == 0 && half ? 8 : dh % 4 == 0 ? 4 : 1;
            cr_assert_eq(p.v[VW], want_vw, "head %zu half %d: VW=%zu", dh, half, p.v[VW]);
            const size_t nvec = dh / p.v[VW];
            const size_t ln = p.v[LANES], more = 2 * ln; /* the most lanes that divide and leave 2 vectors each */
            cr_assert(nvec % ln == 0 && (nvec / ln >= 2 || ln == 1), "head %zu half %d: LANES=%zu", dh, half, ln);
            cr_assert(ln == 32 || nvec % more || nvec / more < 2, "head %zu half %d: LANES=%zu, not %zu", dh, half,
                      ln, more);
            cr_assert_leq((p.v[R] + p.v[KT]) * 2 * dh, 128 * p.v[LANES], "head %zu: registers", dh);
            cr_assert_eq(p.v[WG], 128, "head %zu half %d: WG=%zu", dh, half, p.v[WG]);
        }
    caps.local_mem = 256;
    clattn_attention_desc d = {.batch = 1, .seq_q = 1, .embed = 512, .heads = 2, .kv_heads = 1, .head_dim_qk = 256,
                               .head_dim_v = 256};
    char why[200];
    cr_assert_eq(c->supports(c, &caps, &d, why, sizeof why), CLATTN_STATUS_UNSUPPORTED);
    cr_assert(strstr(why, "do not fit"), "%s", why);
}

/* flash_mma's defaults on an H100-like device (48 KiB of local memory, the tensor-core probe built): they
 * exist and fit for every head size up to 256, keep a lane within the register budget, and split the keys
 * of a small batch; there `native` says yes. Without the probe, or off NVIDIA, `native` says no and why. */
Test(cores, flash_mma_defaults_and_native)
{
    const clattn_core *c = clattn_core_find("flash_mma");
    cr_assert(c && c->native && c->tf32);
    enum { NW, BK, QREG, SPLIT, PS, PF };
    clattn_caps caps = {.dclass = CLATTN_CLASS_NVIDIA, .local_mem = 49152, .max_work_group = 1024,
                        .compute_units = 132, .max_alloc = (size_t)1 << 34, .nv_inline_ptx = 1, .nv_cc = 90,
                        .nv_mma_tf32 = 1};
    char why[300];
    cr_assert(c->native(c, &caps, why, sizeof why));
    static const size_t heads[][2] = {{64, 64}, {128, 128}, {256, 256}, {8, 8}, {5, 3}, {80, 128}, {32, 32}};
    for (size_t k = 0; k < sizeof heads / sizeof heads[0]; k++) {
        clattn_attention_desc d = {.batch = 1, .seq_q = 4096, .seq_kv = 4096, .embed = 1024, .heads = 8,
                                   .kv_heads = 8, .head_dim_qk = heads[k][0], .head_dim_v = heads[k][1]};
        clattn_core_params p;
        cr_assert(c->defaults(c, &caps, &d, &p), "head %zu/%zu: no defaults", heads[k][0], heads[k][1]);
        cr_assert(c->fits(c, &caps, &d, &p), "head %zu/%zu: the defaults do not fit", heads[k][0], heads[k][1]);
        cr_assert_eq(c->supports(c, &caps, &d, why, sizeof why), CLATTN_STATUS_SUCCESS, "%s", why);
        const size_t mx = heads[k][0] > heads[k][1] ? heads[k][0] : heads[k][1];
        /* Q fragments in registers, 4 warps and the tiles split once (PS) up to head size 128, 8-key tiles there in
         * 3xTF32 (the registers' budget); at 256 one warp, the Q block in local memory, split per use */
        cr_assert_eq(p.v[QREG], mx <= 128, "head %zu: QREG=%zu", mx, p.v[QREG]);
        cr_assert_eq(p.v[NW], mx <= 128 ? 4u : 1u, "head %zu: NW=%zu", mx, p.v[NW]);
        cr_assert_eq(p.v[PS], mx <= 128, "head %zu/%zu: PS=%zu", heads[k][0], heads[k][1], p.v[PS]);
        cr_assert_eq(p.v[PF], 0, "head %zu: PF=%zu (not measured: off by default)", mx, p.v[PF]);
        cr_assert_eq(p.v[BK], mx <= 64 ? 32u : 8u, "head %zu: BK=%zu", mx, p.v[BK]);
        /* in TF32 mode the tiles and Q fragments have no low parts: 16-key tiles at 128 */
        clattn_attention_desc t = d;
        t.precision = CLATTN_PRECISION_TF32;
        clattn_core_params pt;
        cr_assert(c->defaults(c, &caps, &t, &pt) && c->fits(c, &caps, &t, &pt), "head %zu TF32: no defaults", mx);
        cr_assert_eq(pt.v[NW], mx <= 128 ? 4u : 1u, "head %zu TF32: NW=%zu", mx, pt.v[NW]);
        cr_assert_eq(pt.v[PS], 1, "head %zu TF32: PS=%zu", mx, pt.v[PS]);
        cr_assert_eq(pt.v[BK], mx <= 64 ? 32u : mx <= 128 ? 16u : 8u, "head %zu TF32: BK=%zu", mx, pt.v[BK]);
        /* the keys split until 4 work-groups per compute unit, and no further */
        const size_t groups = 8 * (4096 / (16 * p.v[NW]));
        cr_assert(groups * p.v[SPLIT] >= 4 * 132 || p.v[SPLIT] == 8, "head %zu: SPLIT=%zu", mx, p.v[SPLIT]);
        cr_assert(p.v[SPLIT] == 1 || groups * p.v[SPLIT] / 2 < 4 * 132, "head %zu: SPLIT=%zu", mx, p.v[SPLIT]);
    }
    caps.nv_mma_tf32 = 0;
    cr_assert_not(c->native(c, &caps, why, sizeof why));
    cr_assert(strstr(why, "compute capability 9.0") && strstr(why, "emulation"), "%s", why);
    caps.dclass = CLATTN_CLASS_AMD;
    cr_assert_not(c->native(c, &caps, why, sizeof why));
    cr_assert(strstr(why, "NVIDIA tensor cores"), "%s", why);
}
