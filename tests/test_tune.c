/* test_tune.c: the device's tuning file (src/device/tune_file.c) and clattn_tune (src/tune/search.c).
 *   files   every kind of file a plan may meet (valid entries for each core, AUTO's core, the GEMM cores' entries,
 *           CLBlast's parameters for its two GEMM kernels (valid, outside its tuner's space, breaking its tile
 *           constraints, incomplete, a preset number of an earlier clattn),
 *           stale, another format, truncated, not a tuning file, huge, mistyped, missing or unknown values,
 *           values a plan cannot use, oversized, binary, empty, CLATTN_TUNE=0, CLATTN_CORE over the file):
 *           never a crash, a notice for what was ignored, and the right answer (against the float64 oracle)
 *           whether the plan ended up tuned or not; each header field wrong alone (another value, a suffix,
 *           missing); every limit at its boundary and one past (line length, file size, class, CLBlast's tile, NUL)
 *   search  clattn_tune on a small shape writes a file the device reads back without a notice, and the
 *           plans then use it; its errors */
#include "runtime/runtime.h"
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char path[64];

static void setup(void)
{
    snprintf(path, sizeof path, "/tmp/clattn_test_tune_XXXXXX");
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    setenv("CLATTN_TUNE_FILE", path, 1);
    unsetenv("CLATTN_TUNE");
    unsetenv("CLATTN_CORE");
    unsetenv("CLATTN_FLASH");
    unsetenv("CLATTN_ATTENTION");
    unsetenv("CLATTN_SOFTMAX");
}

static void teardown(void) { unlink(path); }

/* This file's entries are for the cores AUTO takes on CPU devices for head sizes up to 32 (flash_lanes, and
 * flash_backward for training plans): where another core is AUTO's (NVIDIA's GPUs: flash_mma, flash_backward_gemm),
 * a test whose plans must use them is skipped, naming why. The file's parsing is the device's own either way. */
static void need_auto_core(clattn_core_kind kind, const char *name)
{
    clattn_device *dev = tu_open_opencl();
    clattn_core_info c;
    char have[32];
    snprintf(have, sizeof have, "%s", tu_auto_core(dev, kind, 0, &c) ? c.name : "none");
    clattn_device_free(dev);
    if (strcmp(have, name) != 0)
        cr_skip_test("AUTO's core for head sizes up to 32 is %s here, not %s, whose entries this test writes", have,
                     name);
}

TestSuite(tune, .init = setup, .fini = teardown, .timeout = 300);

/* The header this device and this clattn expect (from a device opened without a file). */
static void header(char *buf, size_t len)
{
    clattn_device *dev = tu_open_opencl();
    char name[400] = "", vendor[200] = "", driver[200] = "";
    cl_device_id id;
    clGetCommandQueueInfo(clattn_device_queue(dev), CL_QUEUE_DEVICE, sizeof id, &id, NULL);
    clGetDeviceInfo(id, CL_DEVICE_VENDOR, sizeof vendor, vendor, NULL);
    clGetDeviceInfo(id, CL_DRIVER_VERSION, sizeof driver, driver, NULL);
    snprintf(name, sizeof name, "%s", clattn_device_name(dev));
    snprintf(buf, len, "clattn-tune 2\nclattn %s\ndevice %s\nvendor %s\ndriver %s\n", clattn_version(), name, vendor,
             driver);
    clattn_device_free(dev);
}

static void write_file(const char *text)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

static char last_core[32], last_params[128]; /* the core of plan_with_file's last plan, and its parameters */
static char last_gemm[32], last_gemm_params[128]; /* and its GEMM core, with its parameters */

/* A plan (head sizes dk and dv: class 0 for 8 and 4) on a fresh device reading the file; checked against the
 * oracle; returns whether it was tuned, the device's notice (copied into notice) and its core (last_core). */
static int plan_with_heads(clattn_algorithm alg, size_t dk, size_t dv, char *notice, size_t len)
{
    clattn_device *dev = tu_open_opencl();
    const char *n = clattn_device_tune_notice(dev);
    snprintf(notice, len, "%s", n ? n : "");
    tu_rng r = {5};
    const size_t B = 2, T = 37, H = 4, E = H * dk;
    float *wq = tu_random(&r, H * dk * E, -0.3f, 0.3f), *wk = tu_random(&r, H * dk * E, -0.3f, 0.3f);
    float *wv = tu_random(&r, H * dv * E, -0.3f, 0.3f), *x = tu_random(&r, B * T * E, -1, 1);
    clattn_attention_desc desc = {.batch = B, .seq_q = T, .embed = E, .heads = H, .head_dim_qk = dk,
                                  .head_dim_v = dv, .causal = 1, .algorithm = alg};
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv};
    clattn_plan *p = NULL;
    cr_assert_eq(tu_plan_create(dev, &desc, &w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const size_t n_out = B * T * H * dv;
    float *out = tu_poisoned(n_out);
    clattn_attention_args a = {.x = x, .out = out};
    cr_assert_eq(tu_plan_execute(p, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    double *want = malloc(n_out * sizeof *want);
    cr_assert_eq(oracle_attention(&desc, &w, &a, want, NULL), 0);
    char msg[256];
    cr_assert_eq(oracle_compare(out, want, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s", msg);
    const int tuned = clattn_plan_tuned(p);
    snprintf(last_core, sizeof last_core, "%s", clattn_plan_core(p));
    snprintf(last_params, sizeof last_params, "%s", clattn_plan_core_params(p));
    snprintf(last_gemm, sizeof last_gemm, "%s", clattn_plan_gemm(p));
    snprintf(last_gemm_params, sizeof last_gemm_params, "%s", clattn_plan_gemm_params(p));
    clattn_plan_free(p);
    clattn_device_free(dev);
    free(wq), free(wk), free(wv), free(x), free(out), free(want);
    return tuned;
}

static int plan_with_file(clattn_algorithm alg, size_t d, char *notice, size_t len)
{
    return plan_with_heads(alg, d, d, notice, len);
}

/* Why the test device does not run core `name` (clattn_core_describe: a driver's limit), or NULL when it does. */
static const char *unsupported_here(const char *name)
{
    static clattn_core_info c;
    clattn_device *dev = tu_open_opencl();
    const char *why = NULL;
    for (size_t i = 0; i < clattn_core_count(); i++)
        if (clattn_core_describe(dev, i, &c) == CLATTN_STATUS_SUCCESS && strcmp(c.name, name) == 0 && !c.supported)
            why = c.reason;
    clattn_device_free(dev);
    return why;
}

typedef struct file_case {
    const char *what, *body;   /* body goes after the header (or replaces it: raw) */
    int raw, tuned;
    clattn_algorithm alg;
    const char *needle;        /* in the notice; NULL = no notice */
    const char *core;          /* the core the plan must run (NULL: any) */
    const char *params;        /* and its parameters (NULL: any) */
} file_case;

Test(tune, files)
{
    need_auto_core(CLATTN_CORE_PREFILL, "flash_lanes");
    char head[1200], text[4096], notice[1100];
    header(head, sizeof head);
    const clattn_algorithm F = CLATTN_ALGORITHM_FUSED, U = CLATTN_ALGORITHM_UNFUSED, A = CLATTN_ALGORITHM_AUTO;
    const file_case cases[] = {
        {"flash_lanes entry", "core flash_lanes 0 VW=8,BK=16,KG=4\n", 0, 1, F, NULL, "flash_lanes", "VW=8,BK=16,KG=4"},
        {"flash_tiled entry and AUTO's core", "core flash_tiled 0 BQ=8,BKT=16,NS=2\nauto 0 flash_tiled\n", 0, 1, F,
         NULL, "flash_tiled", "BQ=8,BKT=16,NS=2"},
        {"AUTO's core alone", "auto 0 unfused\n", 0, 1, A, NULL, "unfused", NULL},
        {"AUTO's core for a plan that cannot use it", "auto 0 unfused\n", 0, 0, F, NULL, NULL, NULL},
        {"parameters in any order", "core flash_lanes 0 KG=4,VW=8,BK=32\n", 0, 1, F, NULL, "flash_lanes",
         "VW=8,BK=32,KG=4"},
        {"comments, CRLF and blank lines", "# a comment\r\n\r\ncore flash_lanes 0 VW=16,BK=8,KG=8\r\n", 0, 1, F, NULL,
         NULL, NULL},
        {"softmax item", "core unfused 0 SOFTMAX=item,HEADS=rows\n", 0, 1, U, NULL, "unfused", "SOFTMAX=item,HEADS=rows"},
        {"softmax rows", "core unfused 0 SOFTMAX=rows,HEADS=elements\n", 0, 1, U, NULL, "unfused", "SOFTMAX=rows,HEADS=elements"},
        {"an entry for another class only", "core flash_lanes 2 VW=8,BK=16,KG=8\n", 0, 0, F, NULL, NULL, NULL},
        {"huge numbers", "core flash_lanes 0 VW=99999999999999999999,BK=16,KG=8\n", 0, 0, F, "the values are", NULL, NULL},
        {"not a value of the space", "core flash_lanes 0 VW=16,BK=24,KG=8\n", 0, 0, F, "the values are", NULL, NULL},
        {"too many work-items", "core flash_tiled 0 BQ=64,BKT=16,NS=16\n", 0, 0, F, "not values", NULL, NULL},
        {"a missing parameter", "core flash_lanes 0 VW=8,BK=16\n", 0, 0, F, "no value for KG", NULL, NULL},
        {"an entry of 0.7.0 (before HEADS)", "core unfused 0 SOFTMAX=item\n", 0, 0, U, "no value for HEADS", NULL, NULL},
        {"an unknown parameter", "core flash_lanes 0 VW=8,BK=16,KG=4,XX=1\n", 0, 0, F, "has no parameter", NULL, NULL},
        {"wrong types", "core flash_lanes 0 VW=eight,BK=16,KG=4\ncore flash_lanes x VW=8,BK=16,KG=4\n"
         "core unfused 0 SOFTMAX=fast\ncore flash_lanes 0 VW=-8,BK=16,KG=4\ncore flash_lanes 0 VW\n", 0, 0, F, "line",
         NULL, NULL},
        {"an unknown core", "core flash_magic 0 X=1\n", 0, 0, F, "not a 'core NAME", NULL, NULL},
        {"bad AUTO entries", "auto 9 unfused\nauto 0 nothing\nauto 0\n", 0, 0, A, "not an 'auto", NULL, NULL},
        {"an unknown entry", "frobnicate 1 2 3\n", 0, 0, F, "not an entry", NULL, NULL},
        {"stale driver", "clattn-tune 2\nclattn 0.3.0\ndevice D\nvendor V\ndriver 0.0-other\ncore flash_rows 0 "
         "ROWS=8,BK=16,VW=4\n", 1, 0, F, "stale", NULL, NULL},
        {"the format of clattn 0.3", "clattn-tune 1\nclattn 0.3.0\ndevice D\nvendor V\ndriver V\nflash 0 rows 8 16 4\n",
         1, 0, F, "another format", NULL, NULL},
        {"no magic", "core flash_rows 0 ROWS=8,BK=16,VW=4\n", 1, 0, F, "not a clattn tuning file", NULL, NULL},
        {"truncated", "clattn-tune 2\n", 1, 0, F, "truncated", NULL, NULL},
        {"empty", "", 1, 0, F, "empty", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const file_case *c = &cases[i];
        if (c->raw) snprintf(text, sizeof text, "%s", c->body);
        else snprintf(text, sizeof text, "%s%s", head, c->body);
        write_file(text);
        const size_t d = 8;
        const int tuned = plan_with_file(c->alg, d, notice, sizeof notice);
        const char *why = c->core ? unsupported_here(c->core) : NULL;
        if (why) { /* the file names a core this device does not run (a driver's limit): the plan runs another */
            cr_assert_eq(tuned, 0, "%s: tuned with %s, which the device does not run", c->what, c->core);
            cr_assert_str_neq(last_core, c->core, "%s", c->what);
            cr_log_info("%s: %s is not run on this device (%s); the plan ran %s", c->what, c->core, why, last_core);
            continue;
        }
        cr_assert_eq(tuned, c->tuned, "%s: tuned = %d; notice: %s", c->what, tuned, notice);
        if (c->needle) cr_assert(strstr(notice, c->needle), "%s: notice '%s' lacks '%s'", c->what, notice, c->needle);
        else cr_assert_str_empty(notice, "%s: unexpected notice '%s'", c->what, notice);
        if (c->core) cr_assert_str_eq(last_core, c->core, "%s: the plan runs %s", c->what, last_core);
        if (c->params) cr_assert_str_eq(last_params, c->params, "%s: the plan runs %s", c->what, last_params);
    }
    /* a forced core (CLATTN_CORE=flash_rows) takes the file's entry for it, where it fits the plan: VW=8 does not
     * divide a head of 4 (no notice: the defaults), VW=4 does */
    setenv("CLATTN_CORE", "flash_rows", 1);
    snprintf(text, sizeof text, "%score flash_rows 0 ROWS=8,BK=16,VW=8\n", head);
    write_file(text);
    cr_assert_eq(plan_with_file(F, 4, notice, sizeof notice), 0, "a vector width the head size does not take");
    cr_assert_str_empty(notice);
    cr_assert(!strstr(last_params, "ROWS=8,BK=16,VW=8"), "%s", last_params);
    snprintf(text, sizeof text, "%score flash_rows 0 ROWS=8,BK=16,VW=4\n", head);
    write_file(text);
    cr_assert_eq(plan_with_file(F, 4, notice, sizeof notice), 1, "a forced core's entry: %s", notice);
    cr_assert_str_eq(last_params, "ROWS=8,BK=16,VW=4");
    unsetenv("CLATTN_CORE");
    /* another clattn version: stale, by the version line */
    snprintf(text, sizeof text, "clattn-tune 2\nclattn 0.0.1\n%score flash_rows 0 ROWS=8,BK=16,VW=4\n",
             strchr(head + 14, '\n') + 1);
    write_file(text);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert(strstr(notice, "stale"), "%s", notice);
    /* larger than 64 KiB, and binary */
    char *big = malloc(70000);
    memset(big, '#', 69999);
    big[69999] = '\0';
    write_file(big);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert(strstr(notice, "larger than"), "%s", notice);
    FILE *f = fopen(path, "wb");
    for (int k = 0; k < 300; k++) fputc(k * 7 % 256, f);
    fclose(f);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert(notice[0], "a binary file gave no notice");
    free(big);
    /* a FIFO in the file's place: no hang, a notice */
    unlink(path);
    cr_assert_eq(mkfifo(path, 0600), 0);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert(strstr(notice, "not a regular file"), "%s", notice);
    unlink(path);
    /* CLATTN_TUNE=0: a valid file is not read */
    snprintf(text, sizeof text, "%score flash_rows 0 ROWS=8,BK=16,VW=4\n", head);
    write_file(text);
    setenv("CLATTN_TUNE", "0", 1);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert_str_empty(notice);
    unsetenv("CLATTN_TUNE");
    /* the environment over the file: CLATTN_CORE's parameters, another core, CLATTN_FLASH's core */
    setenv("CLATTN_CORE", "flash_rows:ROWS=4", 1);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert_str_eq(last_params, "ROWS=4,BK=16,VW=8", "CLATTN_CORE's parameters over the defaults");
    setenv("CLATTN_CORE", "flash_tiled", 1);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert_str_eq(last_core, "flash_tiled");
    unsetenv("CLATTN_CORE");
    setenv("CLATTN_CORE", "flash_rows", 1); /* the core alone: the file's parameters for it */
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 1);
    cr_assert_str_eq(last_params, "ROWS=8,BK=16,VW=4");
    unsetenv("CLATTN_CORE");
    setenv("CLATTN_FLASH", "tiled", 1);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    unsetenv("CLATTN_FLASH");
    /* CLBlast's own parameters (set process-wide at open: last here): valid ones compute right and count as
     * tuned where CLBlast runs the GEMMs; everything else is ignored with a notice */
    static const char *const xgemm_ok[] = {
        "clblast xgemm GEMMK=0,KREG=1,KWG=32,KWI=2,MDIMA=8,MDIMC=8,MWG=32,NDIMB=8,NDIMC=8,NWG=32,SA=1,SB=1,STRM=0,"
        "STRN=0,VWM=4,VWN=4\n",
        "clblast xgemm VWN=2,VWM=1,STRN=1,STRM=1,SB=0,SA=0,NWG=64,NDIMC=16,NDIMB=16,MWG=16,MDIMC=16,MDIMA=16,KWI=2,"
        "KWG=16,KREG=1,GEMMK=0\n",
        "clblast xgemmdirect KWID=2,MDIMAD=8,MDIMCD=8,NDIMBD=8,NDIMCD=8,PADA=1,PADB=1,VWMD=2,VWND=2,WGD=16\n",
    };
    for (int i = 0; i < 3; i++) {
        snprintf(text, sizeof text, "%s%s", head, xgemm_ok[i]);
        write_file(text);
        setenv("CLATTN_CORE", "gemm_clblast", 1);
        cr_assert_eq(plan_with_file(U, 8, notice, sizeof notice), 1, "%s", xgemm_ok[i]);
        cr_assert_str_empty(notice);
        unsetenv("CLATTN_CORE");
        const int tuned = plan_with_file(F, 8, notice, sizeof notice); /* AUTO's GEMM core */
        cr_assert_eq(tuned, strcmp(last_gemm, "gemm_clblast") == 0, "%s: GEMM core %s", xgemm_ok[i], last_gemm);
    }
    static const struct { const char *line, *needle; } xgemm_bad[] = {
        {"clblast xgemm 11\n", "preset set of an earlier clattn"},
        {"clblast xgemm GEMMK=1,KREG=1,KWG=32,KWI=2,MDIMA=8,MDIMC=8,MWG=32,NDIMB=8,NDIMC=8,NWG=32,SA=1,SB=1,STRM=0,"
         "STRN=0,VWM=4,VWN=4\n", "GEMMK=1 is not in the space"},
        {"clblast xgemm GEMMK=0,KREG=1,KWG=32,KWI=2,MDIMA=8,MDIMC=8,MWG=16,NDIMB=8,NDIMC=8,NWG=32,SA=1,SB=1,STRM=0,"
         "STRN=0,VWM=4,VWN=4\n", "tile constraints"},
        /* one constraint alone broken: MWG a multiple of MDIMA * VWM (32) but not of MDIMC * VWM (64) */
        {"clblast xgemm GEMMK=0,KREG=1,KWG=32,KWI=2,MDIMA=8,MDIMC=16,MWG=32,NDIMB=8,NDIMC=8,NWG=32,SA=0,SB=0,STRM=0,"
         "STRN=0,VWM=4,VWN=4\n", "tile constraints"},
        /* XgemmDirect: WGD a multiple of MDIMAD * VWMD (16) but not of MDIMCD * VWMD (32) */
        {"clblast xgemmdirect KWID=2,MDIMAD=8,MDIMCD=16,NDIMBD=8,NDIMCD=8,PADA=1,PADB=1,VWMD=2,VWND=2,WGD=16\n",
         "tile constraints"},
        {"clblast xgemm GEMMK=0,KREG=1,KWG=32,KWI=2,MDIMA=8,MDIMC=8,MWG=32,NDIMB=8,NDIMC=8,NWG=32,SA=1,SB=1,STRM=0,"
         "STRN=0,VWM=4\n", "no value for Xgemm's VWN"},
        {"clblast xgemm GEMMK=0,KREG=1,KWG=32,KWI=2,MDIMA=8,MDIMC=8,MWG=32,NDIMB=8,NDIMC=8,NWG=32,SA=1,SB=1,STRM=0,"
         "STRN=0,VWM=4,VWN=4,WPT=2\n", "no parameter 'WPT'"},
        {"clblast xgemmdirect KWID=2,MDIMAD=8,MDIMCD=8,NDIMBD=8,NDIMCD=8,PADA=1,PADB=1,VWMD=2,VWND=2,WGD=99999\n",
         "not PARAMETER=NUMBER"},
        {"clblast xgemm MWG=x\n", "not PARAMETER=NUMBER"},
        {"clblast sgemm KWG=16\n", "not an entry"},
    };
    for (size_t i = 0; i < sizeof xgemm_bad / sizeof xgemm_bad[0]; i++) {
        snprintf(text, sizeof text, "%s%s", head, xgemm_bad[i].line);
        write_file(text);
        setenv("CLATTN_CORE", "gemm_clblast", 1);
        cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0, "%s", xgemm_bad[i].line);
        cr_assert(strstr(notice, xgemm_bad[i].needle), "%s: notice '%s' lacks '%s'", xgemm_bad[i].line, notice,
                  xgemm_bad[i].needle);
        unsetenv("CLATTN_CORE");
    }
    /* GEMM cores: parameters for gemm_tiles, AUTO's GEMM core (on a CPU device, where gemm_tiles runs) */
    snprintf(text, sizeof text, "%score gemm_tiles 0 MR=4,VW=8,NV=2,QP=2,KC=256,WS=4096\n", head);
    write_file(text);
    const int tiles_tuned = plan_with_file(F, 8, notice, sizeof notice);
    cr_assert_str_empty(notice);
    cr_assert_eq(tiles_tuned, strcmp(last_gemm, "gemm_tiles") == 0, "GEMM core %s", last_gemm);
    if (strcmp(last_gemm, "gemm_tiles") == 0) cr_assert_str_eq(last_gemm_params, "MR=4,VW=8,NV=2,QP=2,KC=256,WS=4096");
    snprintf(text, sizeof text, "%sauto 0 gemm_clblast\n", head);
    write_file(text);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 1);
    cr_assert_str_eq(last_gemm, "gemm_clblast", "the file's AUTO GEMM core");
    snprintf(text, sizeof text, "%score gemm_tiles 0 MR=9,VW=8,NV=2,QP=2,KC=256,WS=4096\n", head);
    write_file(text);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert(strstr(notice, "the values are"), "%s", notice);
    /* no file at all: nothing to say */
    unlink(path);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert_str_empty(notice);
}

static void count_lines(const char *line, void *user)
{
    (void)line;
    (*(int *)user)++;
}

Test(tune, search_writes_a_file_the_plans_use, .timeout = 600)
{
    unlink(path);
    clattn_device *dev = tu_open_opencl();
    int lines = 0;
    const size_t shape[4] = {2, 64, 32, 4}; /* head size 8: class 0 */
    clattn_tune_options o = {.budget_s = 25, .shapes = shape, .n_shapes = 1, .margin = 0.001, .progress = count_lines,
                             .user = &lines};
    cr_assert_eq(clattn_tune(dev, &o), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert(lines > 3, "the search reported %d lines", lines);
    cr_assert_str_eq(clattn_device_tune_file(dev), path);
    cr_assert_null(clattn_device_tune_notice(dev), "its own file has a notice: %s", clattn_device_tune_notice(dev));
    clattn_device_free(dev);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no tuning file written");
    char text[4096];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cr_assert(strncmp(text, "clattn-tune 2\n", 14) == 0, "%s", text);
    /* a plan counts as tuned when an entry of the file applies to it: its core's parameters for class 0, the
     * file's core for class 0 when the plan can use it, or CLBlast's parameters (the projections) */
    char notice[1100];
    int xgemm = strstr(text, "\nclblast xgemm") != NULL;
    const int fused_tuned = plan_with_file(CLATTN_ALGORITHM_FUSED, 8, notice, sizeof notice);
    xgemm &= strcmp(last_gemm, "gemm_clblast") == 0; /* CLBlast's parameters count where CLBlast runs the GEMMs */
    /* and a GEMM core's entry for class 0, or the file's AUTO GEMM core, makes every plan of the class tuned */
    char gemm_entry[64];
    snprintf(gemm_entry, sizeof gemm_entry, "\ncore %s 0 ", last_gemm);
    xgemm |= strstr(text, gemm_entry) != NULL || strstr(text, "\nauto 0 gemm_") != NULL;
    char entry[64];
    snprintf(entry, sizeof entry, "\ncore %s 0 ", last_core);
    cr_assert_eq(fused_tuned, xgemm || strstr(text, "\nauto 0 flash_") || strstr(text, entry), "%s (core %s)", text,
                 last_core);
    cr_assert_str_empty(notice);
    cr_assert_eq(plan_with_file(CLATTN_ALGORITHM_UNFUSED, 8, notice, sizeof notice),
                 xgemm || strstr(text, "\ncore unfused 0 ") || strstr(text, "\nauto 0 unfused"), "%s", text);
    cr_assert_str_empty(notice);
}

/* A training plan (head size 8: class 0) on a fresh device reading the file: its backward's grad_x against the
 * oracle's float64 backward; returns whether the plan was tuned. */
static int training_plan_with_file(void)
{
    clattn_device *dev = tu_open_opencl();
    tu_rng r = {7};
    const size_t B = 2, T = 37, H = 4, d = 8, E = H * d;
    float *wq = tu_random(&r, E * E, -0.3f, 0.3f), *wk = tu_random(&r, E * E, -0.3f, 0.3f);
    float *wv = tu_random(&r, E * E, -0.3f, 0.3f), *x = tu_random(&r, B * T * E, -1, 1);
    float *gout = tu_random(&r, B * T * E, -1, 1), *gx = tu_poisoned(B * T * E);
    clattn_attention_desc desc = {.batch = B, .seq_q = T, .embed = E, .heads = H, .head_dim_qk = d, .causal = 1,
                                  .training = 1};
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv};
    clattn_plan *p = NULL;
    cr_assert_eq(tu_plan_create(dev, &desc, &w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_attention_args a = {.x = x, .x_count = B * T * E};
    clattn_attention_grads g = {.grad_out = gout, .grad_x = gx, .grad_out_count = B * T * E, .grad_x_count = B * T * E};
    cr_assert_eq(clattn_plan_backward(p, &a, &g), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    double *want = malloc(B * T * E * sizeof *want);
    oracle_grads og = {.x = want};
    cr_assert_eq(oracle_attention_backward(&desc, &w, &a, gout, &og), 0);
    char msg[256];
    cr_assert_eq(oracle_compare(gx, want, B * T * E, 1e-4, 1e-3, msg, sizeof msg), 0, "grad_x: %s", msg);
    const int tuned = clattn_plan_tuned(p);
    clattn_plan_free(p);
    clattn_device_free(dev);
    free(wq), free(wk), free(wv), free(x), free(gout), free(gx), free(want);
    return tuned;
}

/* A backward core's entry: training plans of its class take it (tuned, gradients right), inference plans do not
 * count it; parameters out of the core's space are refused with a notice. */
Test(tune, backward_core_entry)
{
    need_auto_core(CLATTN_CORE_BACKWARD, "flash_backward");
    char head[1200], text[2000], notice[1100];
    header(head, sizeof head);
    snprintf(text, sizeof text, "%score flash_backward 0 ROWS=4,PART=2\n", head);
    write_file(text);
    cr_assert_eq(training_plan_with_file(), 1, "a training plan does not use the file's flash_backward entry");
    cr_assert_eq(plan_with_file(CLATTN_ALGORITHM_FUSED, 8, notice, sizeof notice), 0,
                 "an inference plan counts the backward core's entry");
    cr_assert_str_empty(notice);
    snprintf(text, sizeof text, "%score flash_backward 1 ROWS=4,PART=2\n", head);
    write_file(text);
    cr_assert_eq(training_plan_with_file(), 0, "an entry for another class applies");
    snprintf(text, sizeof text, "%score flash_backward 0 ROWS=4,PART=3\n", head);
    write_file(text);
    cr_assert_eq(plan_with_file(CLATTN_ALGORITHM_FUSED, 8, notice, sizeof notice), 0);
    cr_assert(strstr(notice, "the values are"), "PART=3: %s", notice);
    cr_assert_eq(training_plan_with_file(), 0, "a refused entry applies");
    unlink(path);
}

Test(tune, errors)
{
    clattn_device *ref = tu_open_ref();
    cr_assert_eq(clattn_tune(ref, NULL), CLATTN_STATUS_UNSUPPORTED);
    cr_assert_str_eq(clattn_device_tune_file(ref), "");
    clattn_device_free(ref);
    cr_assert_eq(clattn_tune(NULL, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_device *dev = tu_open_opencl();
    const size_t bad[4] = {1, 8, 10, 3};
    clattn_tune_options o = {.shapes = bad, .n_shapes = 1};
    cr_assert_eq(clattn_tune(dev, &o), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "H dividing E"), "%s", clattn_last_error());
    clattn_tune_options m = {.margin = 1.5};
    cr_assert_eq(clattn_tune(dev, &m), CLATTN_STATUS_INVALID_ARGUMENT);
    clattn_tune_options z = {.shapes = bad, .n_shapes = 0};
    cr_assert_eq(clattn_tune(dev, &z), CLATTN_STATUS_INVALID_ARGUMENT);
    for (int c = -2; c <= 2; c += 4) { /* CLBlast's search: -1, 0 or 1 */
        clattn_tune_options b = {.clblast = c};
        cr_assert_eq(clattn_tune(dev, &b), CLATTN_STATUS_INVALID_ARGUMENT, "clblast = %d", c);
        cr_assert(strstr(clattn_last_error(), "clblast"), "%s", clattn_last_error());
    }
    cr_assert_eq(clattn_plan_tuned(NULL), 0);
    setenv("CLATTN_CORE", "flash_rows", 1); /* the search refuses what would override its candidates */
    cr_assert_eq(clattn_tune(dev, NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "CLATTN_CORE"), "%s", clattn_last_error());
    unsetenv("CLATTN_CORE");
    cr_assert_null(clattn_device_tune_notice(NULL));
    clattn_device_free(dev);
}

/* Each header field wrong alone (another value, the right value with a suffix, the line missing), with every
 * other line right and a valid entry after them: the file is not used, and the notice names the field. The
 * right header with the same entry is used (the control). */
Test(tune, each_header_field_wrong_alone)
{
    need_auto_core(CLATTN_CORE_PREFILL, "flash_lanes");
    char head[1200], text[4096], notice[1100];
    header(head, sizeof head);
    char lines[5][400];
    const char *p = head;
    for (int k = 0; k < 5; k++) {
        const char *nl = strchr(p, '\n');
        cr_assert(nl);
        snprintf(lines[k], sizeof lines[k], "%.*s", (int)(nl - p), p);
        p = nl + 1;
    }
    static const char *const names[5] = {"clattn-tune", "clattn", "device", "vendor", "driver"};
    const char *entry = "core flash_lanes 0 VW=8,BK=16,KG=4\n";
    snprintf(text, sizeof text, "%s%s", head, entry);
    write_file(text);
    cr_assert_eq(plan_with_file(CLATTN_ALGORITHM_FUSED, 8, notice, sizeof notice), 1, "the control: %s", notice);
    for (int k = 1; k < 5; k++)
        for (int how = 0; how < 3; how++) { /* 0: another value, 1: a suffix, 2: missing */
            size_t n = 0;
            for (int j = 0; j < 5; j++) {
                if (j == k && how == 2) continue;
                if (j == k && how == 0) n += (size_t)snprintf(text + n, sizeof text - n, "%s other\n", names[k]);
                else if (j == k) n += (size_t)snprintf(text + n, sizeof text - n, "%s+\n", lines[j]);
                else n += (size_t)snprintf(text + n, sizeof text - n, "%s\n", lines[j]);
            }
            snprintf(text + n, sizeof text - n, "%s", entry);
            write_file(text);
            const int tuned = plan_with_file(CLATTN_ALGORITHM_FUSED, 8, notice, sizeof notice);
            cr_assert_eq(tuned, 0, "%s line %s: the file was used", names[k], how == 2 ? "missing" : "wrong");
            char needle[64];
            if (how == 2) snprintf(needle, sizeof needle, "no '%s' line", names[k]);
            else snprintf(needle, sizeof needle, "stale: written for %s", names[k]);
            cr_assert(strstr(notice, needle), "%s (%d): notice '%s' lacks '%s'", names[k], how, notice, needle);
        }
}

/* Every limit exactly at its boundary and one past: a line of 599 characters (read) and 600 (ignored, said), a
 * file of 65536 bytes (read) and 65537 (ignored), head-size class 4 (the last) and 5, CLBlast's largest tile in
 * its tuner's space and the next, a NUL byte after a valid file. */
Test(tune, limits_at_their_boundary)
{
    need_auto_core(CLATTN_CORE_PREFILL, "flash_lanes");
    char head[1200], notice[1100];
    header(head, sizeof head);
    const char *entry = "core flash_lanes 0 VW=8,BK=16,KG=4\n";
    char *text = malloc(70000);
    const clattn_algorithm F = CLATTN_ALGORITHM_FUSED;
    for (int len = 599; len <= 600; len++) { /* a comment line of len characters, then the entry */
        const size_t h = (size_t)snprintf(text, 70000, "%s", head);
        memset(text + h, '#', (size_t)len);
        snprintf(text + h + (size_t)len, 70000 - h - (size_t)len, "\n%s", entry);
        write_file(text);
        cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 1, "a line of %d: %s", len, notice);
        if (len == 599) cr_assert_str_empty(notice, "a line of 599 characters: %s", notice);
        else cr_assert(strstr(notice, "longer than 599"), "a line of 600 characters: '%s'", notice);
    }
    for (size_t size = 65536; size <= 65537; size++) { /* the header, the entry, then comment lines to the size */
        size_t n = (size_t)snprintf(text, 70000, "%s%s", head, entry);
        while (n < size) {
            const size_t line = size - n > 500 ? 500 : size - n;
            memset(text + n, '#', line);
            text[n + line - 1] = '\n';
            n += line;
        }
        text[n] = '\0';
        write_file(text);
        const int tuned = plan_with_file(F, 8, notice, sizeof notice);
        if (size == 65536) cr_assert(tuned == 1 && !notice[0], "a file of 64 KiB: tuned %d, '%s'", tuned, notice);
        else cr_assert(tuned == 0 && strstr(notice, "larger than"), "64 KiB + 1: tuned %d, '%s'", tuned, notice);
    }
    const struct { const char *body; const char *needle; } lines[] = {
        {"auto 4 unfused\n", NULL},
        {"auto 5 unfused\n", "not an 'auto"},
        {"core flash_lanes 4 VW=8,BK=16,KG=4\n", NULL},
        {"core flash_lanes 5 VW=8,BK=16,KG=4\n", "not a 'core NAME"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        snprintf(text, 70000, "%s%s%s", head, entry, lines[i].body);
        write_file(text);
        cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 1, "%s", lines[i].body);
        if (lines[i].needle) cr_assert(strstr(notice, lines[i].needle), "%s: '%s'", lines[i].body, notice);
        else cr_assert_str_empty(notice, "%s: '%s'", lines[i].body, notice);
    }
    /* CLBlast's parameter values at the edge of the space CLBlast's tuner searches: MWG=128 read, 256 refused */
    for (size_t mwg = 128; mwg <= 256; mwg *= 2) {
        snprintf(text, 70000, "%sclblast xgemm GEMMK=0,KREG=1,KWG=16,KWI=2,MDIMA=8,MDIMC=8,MWG=%zu,NDIMB=8,NDIMC=8,"
                 "NWG=16,SA=0,SB=0,STRM=0,STRN=0,VWM=2,VWN=2\n", head, mwg);
        write_file(text);
        setenv("CLATTN_CORE", "gemm_clblast", 1);
        const int tuned = plan_with_file(F, 8, notice, sizeof notice);
        unsetenv("CLATTN_CORE");
        if (mwg == 128) cr_assert(tuned == 1 && !notice[0], "MWG=128: tuned %d, '%s'", tuned, notice);
        else cr_assert(tuned == 0 && strstr(notice, "MWG=256 is not in the space"), "MWG=%zu: tuned %d, '%s'", mwg,
                       tuned, notice);
    }
    /* a valid file, then a NUL byte and more */
    const size_t n = (size_t)snprintf(text, 70000, "%s%s", head, entry);
    memcpy(text + n, "\0# more\n", 8);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(text, 1, n + 8, f), n + 8);
    fclose(f);
    cr_assert_eq(plan_with_file(F, 8, notice, sizeof notice), 0);
    cr_assert(strstr(notice, "NUL"), "'%s'", notice);
    free(text);
}

/* One core with entries in several head-size classes: each plan takes its own class's entry, the class of
 * max(dk, dv), also when dk and dv fall in different classes (dk 8: class 0, dv 40: class 2 is the plan's) and
 * with the classes the other way round; a class without an entry runs the defaults, untuned. */
Test(tune, one_core_in_several_classes)
{
    need_auto_core(CLATTN_CORE_PREFILL, "flash_lanes");
    char head[1200], text[4096], notice[1100];
    header(head, sizeof head);
    snprintf(text, sizeof text, "%score flash_lanes 0 VW=8,BK=8,KG=4\ncore flash_lanes 1 VW=8,BK=32,KG=8\n"
             "core flash_lanes 2 VW=16,BK=16,KG=4\n", head);
    write_file(text);
    static const struct { size_t dk, dv; int tuned; const char *params; } plans[] = {
        {8, 8, 1, "VW=8,BK=8,KG=4"},     /* class 0 */
        {36, 36, 1, "VW=8,BK=32,KG=8"},  /* class 1 */
        {8, 40, 1, "VW=8,BK=32,KG=8"},   /* dk class 0, dv class 1: the plan's class is 1 */
        {72, 8, 1, "VW=16,BK=16,KG=4"},  /* dk class 2, dv class 0: 2 */
        {132, 4, 0, NULL},                /* class 3: no entry, the defaults */
    };
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        const int tuned = plan_with_heads(CLATTN_ALGORITHM_FUSED, plans[i].dk, plans[i].dv, notice, sizeof notice);
        cr_assert_str_empty(notice, "dk %zu dv %zu: notice '%s'", plans[i].dk, plans[i].dv, notice);
        cr_assert_eq(tuned, plans[i].tuned, "dk %zu dv %zu: tuned %d", plans[i].dk, plans[i].dv, tuned);
        cr_assert_str_eq(last_core, "flash_lanes");
        if (plans[i].params)
            cr_assert_str_eq(last_params, plans[i].params, "dk %zu dv %zu: %s", plans[i].dk, plans[i].dv,
                             last_params);
    }
}
