/* cores.c: `clattn cores [--device SPEC] [--json]`: every registered core (attention and GEMM), as the device
 * sees it (clattn_core_describe): name, kind, supported (or why not), the head-size classes AUTO gives it.
 * --json: one object per line with the keys name, kind, supported, reason, emulated, default_for (an array of
 * head-size classes), algorithm (null for GEMM cores), weights, params and test_configs (arrays of strings). */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAY(...) clattn_cli_say("clattn cores", __VA_ARGS__)

static void usage(FILE *f)
{
    fprintf(f, "usage: clattn cores [--device SPEC] [--json]\n"
               "  lists every core clattn has: name, kind (prefill, decode, gemm or backward), whether the device runs it\n"
               "  (or why not), and the head-size classes (max(dk, dv)) AUTO gives it on this device.\n"
               "  CLATTN_CORE=NAME[:P=V,...][;NAME[:P=V,...]...] forces cores (one per kind) on the plans that can\n"
               "  use them.\n");
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* A space-separated list as a JSON array of strings. */
static void json_words(const char *list)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    putchar('[');
    int first = 1;
    char *save = NULL;
    for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        if (!first) putchar(',');
        json_string(w);
        first = 0;
    }
    putchar(']');
}

int clattn_cli_cores(int argc, char **argv)
{
    const char *spec = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--device") == 0) {
            if (i + 1 >= argc) {
                SAY("--device needs a value");
                return 2;
            }
            spec = argv[++i];
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            SAY("unknown argument '%s'", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    int code = 1;
    clattn_device *dev = clattn_cli_open_device("clattn cores", spec, &code);
    if (!dev) return code;
    int width = 14; /* the name column: the longest name */
    for (size_t i = 0; i < clattn_core_count(); i++) {
        clattn_core_info c;
        if (clattn_core_describe(NULL, i, &c) == CLATTN_STATUS_SUCCESS && (int)strlen(c.name) > width)
            width = (int)strlen(c.name);
    }
    if (!json) printf("cores on %s\n%-*s %-8s %-9s %-26s %s\n", clattn_device_name(dev), width, "CORE", "KIND",
                      "SUPPORTED", "DEFAULT FOR (HEAD SIZE)", "PARAMETERS");
    int rc = 0;
    for (size_t i = 0; i < clattn_core_count(); i++) {
        clattn_core_info c;
        const clattn_status st = clattn_core_describe(dev, i, &c);
        if (st != CLATTN_STATUS_SUCCESS) {
            SAY("%s: %s", clattn_status_string(st), clattn_last_error());
            rc = 1;
            break;
        }
        const char *kind = c.kind == CLATTN_CORE_DECODE ? "decode" : c.kind == CLATTN_CORE_GEMM ? "gemm"
                           : c.kind == CLATTN_CORE_BACKWARD ? "backward" : "prefill";
        char classes[128] = "";
        for (int k = 0; k < CLATTN_HEAD_CLASS_COUNT; k++)
            if (c.default_for & (1u << k))
                snprintf(classes + strlen(classes), sizeof classes - strlen(classes), "%s%s", classes[0] ? " " : "",
                         clattn_head_class_label(k));
        if (json) {
            printf("{\"name\":");
            json_string(c.name);
            printf(",\"kind\":\"%s\",\"supported\":%s,\"reason\":", kind, c.supported ? "true" : "false");
            json_string(c.reason);
            printf(",\"emulated\":%s", c.emulated ? "true" : "false");
            printf(",\"default_for\":");
            json_words(classes);
            if (c.kind == CLATTN_CORE_GEMM) printf(",\"algorithm\":null");
            else printf(",\"algorithm\":\"%s\"", clattn_algorithm_name(c.algorithm));
            printf(",\"weights\":%s,\"reads_dtypes\":%s,\"params\":", c.produces_weights ? "true" : "false",
                   c.reads_dtypes ? "true" : "false");
            json_words(c.params);
            printf(",\"test_configs\":");
            json_words(c.test_configs);
            printf("}\n");
        } else {
            printf("%-*s %-8s %-9s %-26s %s\n", width, c.name, kind, c.supported ? "yes" : c.emulated ? "emulated" : "no",
                   classes[0] ? classes : "-", c.params[0] ? c.params : "-");
            if (!c.supported) printf("  %s\n", c.reason);
        }
    }
    const char *forced = getenv("CLATTN_CORE");
    if (forced && *forced) { /* what every plan would refuse is said here, not only at plan creation */
        if (clattn_core_env_check() != CLATTN_STATUS_SUCCESS) {
            SAY("%s: every plan will refuse it", clattn_last_error());
            rc = rc ? rc : 2;
        } else if (!json) {
            printf("CLATTN_CORE=%s forces its cores on the plans that can use them (each plan kind takes its own "
                   "kinds: prefill, gemm and backward for attention plans, decode and gemm for decode plans)\n", forced);
        }
    }
    clattn_device_free(dev);
    return rc;
}
