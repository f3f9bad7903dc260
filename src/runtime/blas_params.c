/* blas_params.c: CLBlast's own tuning parameters for its single-precision GEMM kernels, as `clattn tune`
 * searches them (src/tune/search.c) and the tuning file holds them ("clblast xgemm P=V,...", "clblast
 * xgemmdirect P=V,..."). The spaces and constraints are the ones CLBlast 1.5's own tuners search at random
 * (xgemm V=2: the indirect kernel, GEMMK = 0; xgemm_direct V=2), with the device's local memory and
 * work-group size. A value a file holds passes the same checks, so no file can hand CLBlast a combination its
 * kernels do not compile, or one outside the space the search tries. GEMMK = 1 (the 2-D register-tiled kernel)
 * is left out: on PoCL 3.1 one of CLBlast's own database sets for it crashed the process inside the GEMM.
 * The parameters are CLBlast's, per device and per process (CLBlastOverrideParameters): they apply to every
 * CLBlast call on the device, the caller's own included. */
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VALUES 8

typedef struct space_param {
    const char *name;
    size_t values[MAX_VALUES];
    int nvalues;
} space_param;

/* In CLBlast's order (its database's, alphabetical). */
static const space_param xgemm_space[] = {
    {"GEMMK", {0}, 1},          {"KREG", {1}, 1},           {"KWG", {16, 32}, 2},        {"KWI", {2}, 1},
    {"MDIMA", {8, 16, 32}, 3},  {"MDIMC", {8, 16, 32}, 3},  {"MWG", {16, 32, 64, 128}, 4}, {"NDIMB", {8, 16, 32}, 3},
    {"NDIMC", {8, 16, 32}, 3},  {"NWG", {16, 32, 64, 128}, 4}, {"SA", {0, 1}, 2},        {"SB", {0, 1}, 2},
    {"STRM", {0, 1}, 2},        {"STRN", {0, 1}, 2},        {"VWM", {1, 2, 4, 8}, 4},    {"VWN", {1, 2, 4, 8}, 4},
};
enum { GEMMK, KREG, KWG, KWI, MDIMA, MDIMC, MWG, NDIMB, NDIMC, NWG, SA, SB, STRM, STRN, VWM, VWN };

static const space_param direct_space[] = {
    {"KWID", {2, 8, 16}, 3},    {"MDIMAD", {8, 16, 32}, 3}, {"MDIMCD", {8, 16, 32}, 3}, {"NDIMBD", {8, 16, 32}, 3},
    {"NDIMCD", {8, 16, 32}, 3}, {"PADA", {0, 1}, 2},        {"PADB", {0, 1}, 2},        {"VWMD", {1, 2, 4, 8}, 4},
    {"VWND", {1, 2, 4, 8}, 4},  {"WGD", {8, 16, 32, 64}, 4},
};
enum { KWID, MDIMAD, MDIMCD, NDIMBD, NDIMCD, PADA, PADB, VWMD, VWND, WGD };

/* CLBlast's generic defaults (its database's entries for devices it does not know), the process's parameters
 * when a search keeps nothing: CLBlast cannot be set back to its own device-specific entry once overridden. */
static const size_t xgemm_generic[16] = {0, 1, 32, 2, 8, 8, 32, 8, 8, 32, 1, 1, 0, 0, 4, 4};
static const size_t direct_generic[10] = {2, 8, 8, 8, 8, 1, 1, 1, 1, 32};

static const space_param *space(clattn_blas_kernel k, int *n)
{
    if (k == CLATTN_BLAS_XGEMM_DIRECT) {
        *n = (int)(sizeof direct_space / sizeof direct_space[0]);
        return direct_space;
    }
    *n = (int)(sizeof xgemm_space / sizeof xgemm_space[0]);
    return xgemm_space;
}

const char *clattn_blas_kernel_name(clattn_blas_kernel k)
{
    return k == CLATTN_BLAS_XGEMM_DIRECT ? "XgemmDirect" : "Xgemm";
}

int clattn_blas_param_count(clattn_blas_kernel k)
{
    int n;
    space(k, &n);
    return n;
}

void clattn_blas_params_generic(clattn_blas_kernel k, size_t *v)
{
    memcpy(v, k == CLATTN_BLAS_XGEMM_DIRECT ? direct_generic : xgemm_generic,
           (size_t)clattn_blas_param_count(k) * sizeof *v);
}

static int multiple(size_t x, size_t of) { return of && x % of == 0; }

int clattn_blas_params_valid(const clattn_caps *caps, clattn_blas_kernel k, const size_t *v, char *why, size_t len)
{
    int n;
    const space_param *sp = space(k, &n);
    for (int i = 0; i < n; i++) {
        int in = 0;
        for (int j = 0; j < sp[i].nvalues; j++) in |= sp[i].values[j] == v[i];
        if (!in) {
            snprintf(why, len, "%s=%zu is not in the space CLBlast's tuner searches", sp[i].name, v[i]);
            return 0;
        }
    }
    size_t wg, local;
    int ok;
    if (k == CLATTN_BLAS_XGEMM) {
        const size_t kdima = v[MDIMC] * v[NDIMC] / v[MDIMA], kdimb = v[MDIMC] * v[NDIMC] / v[NDIMB];
        ok = multiple(v[KWG], v[KWI]) && multiple(v[MWG], v[MDIMC] * v[VWM]) && multiple(v[NWG], v[NDIMC] * v[VWN]) &&
             multiple(v[MWG], v[MDIMA] * v[VWM]) && multiple(v[NWG], v[NDIMB] * v[VWN]) && multiple(v[KWG], kdima) &&
             multiple(v[KWG], kdimb);
        wg = v[MDIMC] * v[NDIMC];
        local = (v[SA] * v[KWG] * v[MWG] + v[SB] * v[KWG] * v[NWG]) * sizeof(float);
    } else {
        const size_t kdima = v[MDIMCD] * v[NDIMCD] / v[MDIMAD], kdimb = v[MDIMCD] * v[NDIMCD] / v[NDIMBD];
        ok = multiple(v[WGD], v[KWID]) && multiple(v[WGD], v[MDIMCD] * v[VWMD]) &&
             multiple(v[WGD], v[NDIMCD] * v[VWND]) && multiple(v[WGD], v[MDIMAD] * v[VWMD]) &&
             multiple(v[WGD], v[NDIMBD] * v[VWND]) && multiple(v[WGD], kdima) && multiple(v[WGD], kdimb);
        wg = v[MDIMCD] * v[NDIMCD];
        local = (v[WGD] * (v[WGD] + v[PADA]) + v[WGD] * (v[WGD] + v[PADB])) * sizeof(float);
    }
    if (!ok) {
        snprintf(why, len, "these %s parameters break its tile constraints (the tile sizes must be multiples of "
                 "the work-group sizes times the vector widths)", clattn_blas_kernel_name(k));
        return 0;
    }
    if (caps && (wg > caps->max_work_group || local > caps->local_mem)) {
        snprintf(why, len, "%s with %zu work-items and %zu bytes of local memory does not fit the device (%zu, %zu)",
                 clattn_blas_kernel_name(k), wg, local, caps->max_work_group, caps->local_mem);
        return 0;
    }
    return 1;
}

void clattn_blas_params_random(const clattn_caps *caps, clattn_blas_kernel k, uint64_t *rng, size_t *v)
{
    int n;
    const space_param *sp = space(k, &n);
    char why[200];
    for (int attempt = 0; attempt < 100000; attempt++) {
        for (int i = 0; i < n; i++) {
            *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = sp[i].values[(*rng >> 33) % (uint64_t)sp[i].nvalues];
        }
        if (clattn_blas_params_valid(caps, k, v, why, sizeof why)) return;
    }
    clattn_blas_params_generic(k, v); /* valid everywhere CLBlast runs */
}

void clattn_blas_params_format(clattn_blas_kernel k, const size_t *v, char *buf, size_t len)
{
    int n;
    const space_param *sp = space(k, &n);
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < len; i++) {
        const int w = snprintf(buf + used, len - used, "%s%s=%zu", i ? "," : "", sp[i].name, v[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

int clattn_blas_params_parse(clattn_blas_kernel k, const char *text, size_t *v, char *why, size_t len)
{
    int n;
    const space_param *sp = space(k, &n);
    int seen[16] = {0};
    char buf[300];
    if (strlen(text) >= sizeof buf) {
        snprintf(why, len, "'%.40s...' is too long", text);
        return 0;
    }
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || !eq[1] || strlen(eq + 1) > 4 || strspn(eq + 1, "0123456789") != strlen(eq + 1)) {
            snprintf(why, len, "'%s' is not PARAMETER=NUMBER", item);
            return 0;
        }
        *eq = '\0';
        int i = 0;
        while (i < n && strcmp(sp[i].name, item) != 0) i++;
        if (i == n) {
            snprintf(why, len, "%s has no parameter '%s'", clattn_blas_kernel_name(k), item);
            return 0;
        }
        v[i] = (size_t)strtoul(eq + 1, NULL, 10);
        seen[i] = 1;
    }
    for (int i = 0; i < n; i++)
        if (!seen[i]) {
            snprintf(why, len, "no value for %s's %s", clattn_blas_kernel_name(k), sp[i].name);
            return 0;
        }
    return clattn_blas_params_valid(NULL, k, v, why, len);
}

clattn_status clattn_blas_use_params(const clattn_device *dev, clattn_blas_kernel k, const size_t *v)
{
    int n;
    const space_param *sp = space(k, &n);
    const char *names[16];
    for (int i = 0; i < n; i++) names[i] = sp[i].name;
    char why[200];
    if (!clattn_blas_params_valid(&dev->caps, k, v, why, sizeof why))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLBlast %s: %s", clattn_blas_kernel_name(k), why);
    clattn_blas_lock();
    CLBlastStatusCode st = CLBlastOverrideParameters(dev->device, clattn_blas_kernel_name(k), CLBlastPrecisionSingle,
                                                     (size_t)n, names, v);
    if (st == CLBlastSuccess) st = CLBlastClearCache(); /* its compiled kernels were made with the old ones */
    clattn_blas_unlock();
    if (st != CLBlastSuccess)
        return clattn_fail((clattn_status)st, "CLBlastOverrideParameters(%s) failed (%d)", clattn_blas_kernel_name(k),
                           (int)st);
    return CLATTN_STATUS_SUCCESS;
}
