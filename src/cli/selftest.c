/* selftest.c: `clattn selftest`, the device's self-test (clattn_device_selftest): every core the device runs
 * against ref on a compact conformance set, one line per core, exit 1 when any computed a wrong number or a case
 * ended in an error.
 *   clattn selftest [--device SPEC] [--quick]
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#define SAY(...) clattn_cli_say("clattn selftest", __VA_ARGS__)
#define MAX_CORES 64

static void usage(FILE *f)
{
    fprintf(f, "usage: clattn selftest [--device SPEC] [--quick]\n"
               "  runs every core the device runs (forced in turn) on a compact conformance set against the CPU\n"
               "  reference: attention plans of odd sizes, masks, GQA, a window, long rows, NaN and Inf inputs and\n"
               "  the weights; the GEMM cores on their projections; decode steps over prefilled, long and half\n"
               "  caches; training plans' gradients. Prints one line per core (cases, refused, worst error,\n"
               "  verdict) and exits 1 if any core computed a wrong number (FAIL) or a case ended in an error\n"
               "  that is not a refusal (error). The failures are kept with the device's probes: AUTO then passes\n"
               "  over a core that failed on this device and driver (a full run replaces them, a quick one adds).\n"
               "  --quick: fewer and shorter cases. The first thing to run on a new device.\n");
}

static const char *verdict_name(clattn_verdict v)
{
    return v == CLATTN_VERDICT_PASS ? "pass" : v == CLATTN_VERDICT_FAIL ? "FAIL" : v == CLATTN_VERDICT_ERROR ? "error"
                                                                                                       : "not run";
}

static const char *kind_name(clattn_core_kind k)
{
    static const char *const names[] = {"prefill", "decode", "gemm", "backward"};
    return (unsigned)k < 4 ? names[k] : "?";
}

int clattn_cli_selftest(int argc, char **argv)
{
    const char *spec = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--quick")) {
            quick = 1;
        } else if (!strcmp(a, "--device")) {
            if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)) {
                SAY("--device needs a value");
                return 2;
            }
            spec = argv[++i];
        } else {
            SAY("unknown option '%s' (see clattn selftest --help)", a);
            return 2;
        }
    }
    int code = 1;
    clattn_device *dev = clattn_cli_open_device("clattn selftest", spec, &code);
    if (!dev) return code;
    if (clattn_device_backend(dev) != CLATTN_BACKEND_OPENCL) {
        SAY("the self-test checks an OpenCL device (--device) against the CPU reference; %s is the reference itself",
            clattn_device_name(dev));
        clattn_device_free(dev);
        return 2;
    }
    printf("self-test of %s%s\n", clattn_device_name(dev), quick ? " (quick)" : "");
    fflush(stdout);
    clattn_selftest_result r[MAX_CORES];
    size_t n = 0;
    const clattn_status st = clattn_device_selftest(dev, quick, r, MAX_CORES, &n);
    if (st != CLATTN_STATUS_SUCCESS) {
        SAY("%s: %s", clattn_status_string(st), clattn_last_error());
        clattn_device_free(dev);
        return 1;
    }
    printf("%-16s %-9s %5s %7s %12s %10s  %s\n", "core", "kind", "cases", "refused", "worst error", "of the tol", "verdict");
    int failed = 0, errors = 0;
    for (size_t i = 0; i < n && i < MAX_CORES; i++) {
        failed += r[i].verdict == CLATTN_VERDICT_FAIL;
        errors += r[i].verdict == CLATTN_VERDICT_ERROR;
        if (r[i].verdict == CLATTN_VERDICT_NOT_RUN) {
            printf("%-16s %-9s %5s %7s %12s %10s  not run: %s\n", r[i].core, kind_name(r[i].kind), "-", "-", "-", "-",
                   r[i].detail);
            continue;
        }
        /* a pass whose every case was refused says so */
        const int all_refused = r[i].verdict == CLATTN_VERDICT_PASS && r[i].cases == 0;
        printf("%-16s %-9s %5zu %7zu %12.3g %10.3f  %s%s%s\n", r[i].core, kind_name(r[i].kind), r[i].cases,
               r[i].refused, r[i].worst_error, r[i].worst_ratio, all_refused ? "refused" : verdict_name(r[i].verdict),
               r[i].detail[0] ? ": " : "", r[i].detail);
    }
    if (failed) printf("%d core%s computed wrong numbers on this device: AUTO no longer picks %s here\n", failed,
                       failed > 1 ? "s" : "", failed > 1 ? "them" : "it");
    if (errors) printf("%d core%s ended a case in an error (not kept: run the self-test again)\n", errors,
                       errors > 1 ? "s" : "");
    if (!failed && !errors) printf("every core the device runs computed the reference's numbers\n");
    if (clattn_last_notice()[0]) SAY("%s", clattn_last_notice());
    clattn_device_free(dev);
    return failed || errors ? 1 : 0;
}
