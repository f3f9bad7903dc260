/* cli.h: the `clattn` command-line tool's subcommands. */
#ifndef CLATTN_CLI_H
#define CLATTN_CLI_H

#include "clattn.h"

#include <stdarg.h>
#include <stddef.h>

/* Each returns the process exit status: 0 success, 1 runtime failure, 2 usage error. */
int clattn_cli_devices(int argc, char **argv);
int clattn_cli_cores(int argc, char **argv);
int clattn_cli_demo(int argc, char **argv);
int clattn_cli_run(int argc, char **argv);
int clattn_cli_encoder(int argc, char **argv);
int clattn_cli_tune(int argc, char **argv);
int clattn_cli_selftest(int argc, char **argv);
int clattn_cli_emit(int argc, char **argv);

/* ---- common.c. `cmd` is the message prefix ("clattn run"). */
/* One line "cmd: ..." on stderr; control characters (a newline in a file name) become '?'. */
void clattn_cli_vsay(const char *cmd, const char *fmt, va_list ap);
void clattn_cli_say(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The notice of the plan just created (clattn_last_notice: CLATTN_CORE naming no core it runs), said when it has one. */
void clattn_cli_notice(const char *cmd);
/* 0 when --in/--out `path` is a directory we can read (or write); else -1 after saying why. A writable one
 * (--out, --plot) may also be missing when its nearest existing ancestor is a directory we can write in: the
 * command creates it (clattn_cli_make_dir) only when it writes its outputs. */
int clattn_cli_check_dir(const char *cmd, const char *flag, const char *path, int writable);
/* mkdir -p path (mode 0777 less the umask); *created = how many directories it made, the last components of
 * path. 0, or -1 after saying why (then nothing it made is left). */
int clattn_cli_make_dir(const char *cmd, const char *flag, const char *path, int *created);
/* Remove the `created` directories clattn_cli_make_dir made (empty ones only): on an error, --out as it was. */
void clattn_cli_unmake_dir(const char *path, int created);
/* "(2, 3)", "(5,)": a shape as NumPy prints it, in buf. */
const char *clattn_cli_shape(char *buf, size_t len, int ndim, const size_t *dims);
/* Open the device named by --device (NULL = default: $CLATTN_DEVICE, else opencl, else ref), saying the
 * fallback notice. On failure says why and returns NULL with *code = 2 for a spec that cannot be parsed,
 * 1 for one that matches nothing. */
clattn_device *clattn_cli_open_device(const char *cmd, const char *spec, int *code);
/* --algorithm auto|fused|unfused: 0 and *a set, or -1 for anything else. */
int clattn_cli_parse_algorithm(const char *v, clattn_algorithm *a);
/* f32, f16 or bf16 into *t: 0, or -1 for another word (the caller names the choices). */
int clattn_cli_parse_dtype(const char *v, clattn_dtype *t);
/* Monotonic wall time in milliseconds (for clattn run -v). */
double clattn_cli_now_ms(void);

#endif
