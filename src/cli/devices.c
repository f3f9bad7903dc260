/* devices.c: `clattn devices`. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int clattn_cli_devices(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: clattn devices [-v]\n"
               "  lists ref (the CPU reference) and every OpenCL device with its selector (opencl:P:D), type,\n"
               "  compute units, memory and OpenCL C version\n"
               "  -v  also opens each device and prints what clattn knows of it: its capabilities and the facts\n"
               "      its probes measured (the loop limit, NaN and Inf arithmetic, profiling timestamps)\n");
        return 0;
    }
    const int verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    if (argc > 1 + verbose) {
        fprintf(stderr, "clattn devices: unexpected argument '%s' (clattn devices takes only -v)\n", argv[1 + verbose]);
        return 2;
    }
    size_t n = 0;
    clattn_status st = clattn_device_list(NULL, 0, &n);
    if (st != CLATTN_STATUS_SUCCESS) {
        fprintf(stderr, "clattn devices: %s: %s\n", clattn_status_string(st), clattn_last_error());
        return 1;
    }
    clattn_device_info *infos = calloc(n ? n : 1, sizeof *infos);
    if (!infos) {
        fprintf(stderr, "clattn devices: out of memory\n");
        return 1;
    }
    clattn_device_list(infos, n, &n);
    /* columns as wide as their longest entry: a name is never cut */
    int wp = (int)strlen("PLATFORM"), wd = (int)strlen("CPU reference (plain C)"), wc = (int)strlen("OPENCL_C");
    int ws = (int)strlen("SELECTOR");
    for (size_t i = 0; i < n; i++) {
        const clattn_device_info *d = &infos[i];
        if ((int)strlen(d->platform) > wp) wp = (int)strlen(d->platform);
        if ((int)strlen(d->name) > wd) wd = (int)strlen(d->name);
        if ((int)strlen(d->opencl_c_version) > wc) wc = (int)strlen(d->opencl_c_version);
        if ((int)strlen(d->selector) > ws) ws = (int)strlen(d->selector);
    }
    printf("%-*s %-*s %-*s %-6s %4s %10s %10s %-*s %4s %4s\n", ws, "SELECTOR", wp, "PLATFORM", wd, "DEVICE", "TYPE",
           "CU", "GLOBAL", "MAX_ALLOC", wc, "OPENCL_C", "FP16", "FP64");
    printf("%-*s %-*s %-*s %-6s %4s %10s %10s %-*s %4s %4s\n", ws, "ref", wp, "-", wd, "CPU reference (plain C)", "cpu",
           "1", "-", "-", wc, "-", "no", "yes");
    for (size_t i = 0; i < n; i++) {
        const clattn_device_info *d = &infos[i];
        printf("%-*s %-*s %-*s %-6s %4u %7.1fGiB %7.1fGiB %-*s %4s %4s\n", ws, d->selector, wp, d->platform, wd,
               d->name, d->type, d->compute_units, d->global_mem_bytes / 1073741824.0,
               d->max_alloc_bytes / 1073741824.0, wc, d->opencl_c_version, d->fp16 ? "yes" : "no",
               d->fp64 ? "yes" : "no");
    }
    if (n == 0) printf("(no OpenCL device found: only ref is available)\n");
    for (size_t i = 0; verbose && i < n; i++) {
        clattn_device *dev = NULL;
        printf("\n%s  %s\n", infos[i].selector, infos[i].name);
        if (clattn_device_open(infos[i].selector, &dev) != CLATTN_STATUS_SUCCESS) {
            printf("  (does not open: %s)\n", clattn_last_error());
            continue;
        }
        for (const char *line = clattn_device_facts(dev); *line;) {
            const char *end = strchr(line, '\n');
            const int len = end ? (int)(end - line) : (int)strlen(line);
            printf("  %.*s\n", len, line);
            line += len + (end != NULL);
        }
        clattn_device_free(dev);
    }
    free(infos);
    return 0;
}
