/* main.c: `clattn` — list devices, run the tutorials' demo, run attention on .npy files. */
#include "args.h"
#include "cli.h"
#include "clattn_build_info.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* clattn --version: the library's version, the git revision it was built from (when known) and CLBlast's */
static int version(void)
{
    printf("clattn %s", clattn_version());
    if (CLATTN_GIT_REVISION[0]) printf(" (git %s)", CLATTN_GIT_REVISION);
    printf("\nCLBlast %s\n", CLATTN_CLBLAST_VERSION[0] ? CLATTN_CLBLAST_VERSION : "(version unknown)");
    return 0;
}

/* A long first run is not silent: before the first kernels are compiled from source (not loaded from
 * clattn's kernel cache), one line on stderr. Shown when stderr is a terminal, or with CLATTN_BUILD_NOTICE=1;
 * CLATTN_BUILD_NOTICE=0 silences it. */
static void build_notice(const char *device, void *user)
{
    int *shown = user;
    if (*shown) return;
    *shown = 1;
    fprintf(stderr, "clattn: compiling OpenCL kernels for %s (a while the first time; later runs load them from "
            "the kernel cache)\n", device);
    fflush(stderr);
}

static void install_build_notice(void)
{
    static int shown;
    const char *env = getenv("CLATTN_BUILD_NOTICE");
    const int on = env && *env ? strcmp(env, "0") != 0 : isatty(2);
    if (on) clattn_set_build_notice(build_notice, &shown);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clattn <command> [options]      clattn help <command>      clattn --version\n"
            "  devices [-v]                 list every OpenCL device (and ref)\n"
            "  selftest [--device SPEC] [--quick]   check every core against ref (first on a new device)\n"
            "  cores [--device SPEC] [--json]   list the attention cores and what the device runs\n"
            "  demo [--device SPEC] [--plot DIR]   run the tutorials' examples and print their tables\n"
            "  run --in DIR --out DIR [--heads H] [--causal] ...   attention on .npy files\n"
            "  encoder --in DIR --out DIR [--heads H] ...   a transformer encoder layer on .npy files\n"
            "  tune [--device SPEC] [--budget S] [--shapes ...]   tune the kernels for the device\n"
            "  emit --out DIR [--target host|sm_90] [--core NAME] ...   write the OpenCL programs a plan builds\n"
            "every option of a command: clattn <command> --help. Options take their value as the next argument\n"
            "or after '=' (--heads 8, --heads=8). Exit status: 0 done, 1 failed, 2 usage error.\n"
            "device SPEC: ref, opencl, opencl:P:D, gpu, cpu, accelerator, name=TEXT\n"
            "             (default: $CLATTN_DEVICE, else opencl, else ref)\n");
}

int main(int argc, char **argv)
{
    argv = clattn_args_split_equals(&argc, argv);  /* --opt=value, as --opt value, for every subcommand */
    if (!argv) {
        fprintf(stderr, "clattn: out of memory reading the arguments\n");
        return 1;
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    install_build_notice();
    if (strcmp(cmd, "devices") == 0) return clattn_cli_devices(argc - 1, argv + 1);
    if (strcmp(cmd, "cores") == 0) return clattn_cli_cores(argc - 1, argv + 1);
    if (strcmp(cmd, "demo") == 0) return clattn_cli_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0) return clattn_cli_run(argc - 1, argv + 1);
    if (strcmp(cmd, "encoder") == 0) return clattn_cli_encoder(argc - 1, argv + 1);
    if (strcmp(cmd, "tune") == 0) return clattn_cli_tune(argc - 1, argv + 1);
    if (strcmp(cmd, "selftest") == 0) return clattn_cli_selftest(argc - 1, argv + 1);
    if (strcmp(cmd, "emit") == 0) return clattn_cli_emit(argc - 1, argv + 1);
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) return version();
    if (strcmp(cmd, "help") == 0 && argc >= 3) { /* clattn help CMD = clattn CMD --help */
        char *sub[] = {argv[2], "--help", NULL};
        if (strcmp(argv[2], "run") == 0) return clattn_cli_run(2, sub);
        if (strcmp(argv[2], "encoder") == 0) return clattn_cli_encoder(2, sub);
        if (strcmp(argv[2], "tune") == 0) return clattn_cli_tune(2, sub);
        if (strcmp(argv[2], "selftest") == 0) return clattn_cli_selftest(2, sub);
        if (strcmp(argv[2], "emit") == 0) return clattn_cli_emit(2, sub);
        if (strcmp(argv[2], "cores") == 0) return clattn_cli_cores(2, sub);
        if (strcmp(argv[2], "demo") == 0) return clattn_cli_demo(2, sub);
        if (strcmp(argv[2], "devices") == 0) return clattn_cli_devices(2, sub);
        fprintf(stderr, "clattn help: unknown command '%s'\n", argv[2]);
        usage(stderr);
        return 2;
    }
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "clattn: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
