/* tune.c: `clattn tune`, the device's tuning search (clattn_tune) with its progress on stdout.
 *   clattn tune [--device SPEC] [--budget SECONDS] [--shapes preset|B,T,E,H[;B,T,E,H...]] [--margin F]
 *               [--clblast auto|always|never]
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAY(...) clattn_cli_say("clattn tune", __VA_ARGS__)
#define MAX_SHAPES 16

static void usage(FILE *f)
{
    fprintf(f, "usage: clattn tune [--device SPEC] [--budget SECONDS] [--shapes preset|B,T,E,H[;B,T,E,H...]]\n"
               "                   [--margin F] [--clblast auto|always|never]\n"
               "  searches the attention cores' parameters (per head-size class) and AUTO's core for the device on\n"
               "  the given self-attention shapes (preset: 4,512,512,8), then the decode cores' on a decode step of\n"
               "  the first shape (B sequences of T cached tokens, H/4 KV heads) and the GEMM cores' on its attention\n"
               "  call, checks every candidate's output against the defaults', keeps one only if it beats them by\n"
               "  --margin (default 0.03) three times, and writes the device's tuning file, which plans then use\n"
               "  ($CLATTN_TUNE_FILE overrides its path, CLATTN_TUNE=0 ignores it). --budget: wall-clock seconds\n"
               "  (default 120). --clblast: search CLBlast's own Xgemm and XgemmDirect parameters at random, as its\n"
               "  tuners do: auto (default) where CLBlast runs the device's GEMMs, always, or never.\n");
}

static void progress(const char *line, void *user)
{
    (void)user;
    printf("%s\n", line);
    fflush(stdout);
}

/* "B,T,E,H;B,T,E,H": 0 and the shapes, or -1. */
static int parse_shapes(const char *s, size_t *out, size_t *n)
{
    *n = 0;
    while (*s) {
        if (*n == MAX_SHAPES) return -1;
        for (int k = 0; k < 4; k++) {
            if (*s < '0' || *s > '9') return -1;
            errno = 0;
            char *end;
            unsigned long long v = strtoull(s, &end, 10);
            if (errno || v == 0 || v > 0xFFFFFFFFull) return -1;
            out[4 * *n + k] = (size_t)v;
            s = end;
            if (k < 3) {
                if (*s != ',') return -1;
                s++;
            }
        }
        (*n)++;
        if (*s == ';') s++;
        else if (*s) return -1;
    }
    return *n ? 0 : -1;
}

int clattn_cli_tune(int argc, char **argv)
{
    const char *spec = NULL;
    size_t shapes[4 * MAX_SHAPES], n_shapes = 0;
    clattn_tune_options o = {.budget_s = 120.0, .progress = progress};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--device") && strcmp(a, "--budget") && strcmp(a, "--shapes") && strcmp(a, "--margin") &&
            strcmp(a, "--clblast")) {
            SAY("unknown option '%s' (see clattn tune --help)", a);
            return 2;
        }
        if (!v || !strncmp(v, "--", 2)) {
            SAY("%s needs a value", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--device")) {
            spec = v;
        } else if (!strcmp(a, "--clblast")) {
            if (!strcmp(v, "auto")) o.clblast = 0;
            else if (!strcmp(v, "always")) o.clblast = 1;
            else if (!strcmp(v, "never")) o.clblast = -1;
            else {
                SAY("--clblast '%s': must be auto, always or never", v);
                return 2;
            }
        } else if (!strcmp(a, "--budget") || !strcmp(a, "--margin")) {
            char *end;
            errno = 0;
            const double x = strtod(v, &end);
            const int budget = !strcmp(a, "--budget");
            if (errno || end == v || *end || !(budget ? x > 0 && x <= 86400 : x >= 0 && x < 1)) {
                SAY("%s '%s': must be %s", a, v, budget ? "a number of seconds, > 0" : "a fraction in [0, 1)");
                return 2;
            }
            if (budget) o.budget_s = x;
            else o.margin = x;
        } else if (strcmp(v, "preset") != 0) {
            if (parse_shapes(v, shapes, &n_shapes)) {
                SAY("--shapes '%s': expected preset or B,T,E,H[;B,T,E,H...] (at most %d, every value >= 1)", v,
                    MAX_SHAPES);
                return 2;
            }
            o.shapes = shapes, o.n_shapes = n_shapes;
        }
    }
    int code = 1;
    clattn_device *dev = clattn_cli_open_device("clattn tune", spec, &code);
    if (!dev) return code;
    if (clattn_device_backend(dev) != CLATTN_BACKEND_OPENCL) {
        SAY("tuning needs an OpenCL device (--device): %s is the CPU reference", clattn_device_name(dev));
        clattn_device_free(dev);
        return 2;
    }
    printf("tuning %s for up to %.0f s\n", clattn_device_name(dev), o.budget_s);
    const char *old = clattn_device_tune_notice(dev);
    if (old) printf("the previous tuning file: %s\n", old);
    clattn_status st = clattn_tune(dev, &o);
    if (st != CLATTN_STATUS_SUCCESS) {
        SAY("%s: %s", clattn_status_string(st), clattn_last_error());
        clattn_device_free(dev);
        return 1;
    }
    printf("plans on this device now use %s\n", clattn_device_tune_file(dev));
    clattn_device_free(dev);
    return 0;
}
