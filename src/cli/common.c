/* common.c: what the `clattn` subcommands share: one-line error messages,
 * directory checks, shape strings and opening the device a command asks for. */
#include "cli.h"

#include <time.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void clattn_cli_vsay(const char *cmd, const char *fmt, va_list ap)
{
    char msg[1024];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0) snprintf(msg, sizeof msg, "(error message could not be formatted)");
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    fprintf(stderr, "%s: %s\n", cmd, msg);
}

void clattn_cli_say(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    clattn_cli_vsay(cmd, fmt, ap);
    va_end(ap);
}

void clattn_cli_notice(const char *cmd)
{
    const char *note = clattn_last_notice();
    if (note[0]) clattn_cli_say(cmd, "note: %s", note);
}

/* The nearest existing ancestor of a missing path, when it is a directory we may write in: 0, else -1 after
 * saying why. */
static int creatable(const char *cmd, const char *flag, const char *path)
{
    char *p = strdup(path);
    if (!p) {
        clattn_cli_say(cmd, "%s '%s': out of memory", flag, path);
        return -1;
    }
    struct stat sb;
    int rc = -1;
    for (;;) {
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[-1] == '/') slash--;  /* "a//b" */
        if (!slash) strcpy(p, ".");
        else if (slash == p) p[1] = '\0';                        /* "/x": the root */
        else *slash = '\0';
        if (stat(p, &sb) == 0) {
            if (!S_ISDIR(sb.st_mode)) clattn_cli_say(cmd, "%s '%s': '%s' is not a directory", flag, path, p);
            else if (access(p, W_OK | X_OK) != 0)
                clattn_cli_say(cmd, "%s '%s': cannot create it in '%s' (not writable)", flag, path, p);
            else rc = 0;
            break;
        }
        if (errno != ENOENT || strcmp(p, ".") == 0 || strcmp(p, "/") == 0) {
            clattn_cli_say(cmd, "%s '%s': %s: %s", flag, path, p, strerror(errno));
            break;
        }
    }
    free(p);
    return rc;
}

int clattn_cli_make_dir(const char *cmd, const char *flag, const char *path, int *created)
{
    *created = 0;
    char *p = strdup(path);
    if (!p) {
        clattn_cli_say(cmd, "%s '%s': out of memory", flag, path);
        return -1;
    }
    int rc = 0;
    for (char *c = p + 1;; c++) {  /* each prefix that ends a component, then the whole path */
        if (*c != '/' && *c != '\0') continue;
        const char keep = *c;
        *c = '\0';
        if (mkdir(p, 0777) == 0) {
            (*created)++;
        } else if (errno != EEXIST) {
            clattn_cli_say(cmd, "%s '%s': cannot create '%s': %s", flag, path, p, strerror(errno));
            rc = -1;
        }
        *c = keep;
        if (rc || !keep) break;
    }
    free(p);
    if (rc) clattn_cli_unmake_dir(path, *created), *created = 0;
    return rc;
}

void clattn_cli_unmake_dir(const char *path, int created)
{
    char *p = strdup(path);
    if (!p) return;
    for (int k = 0; k < created; k++) {
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/') p[--n] = '\0';
        if (rmdir(p) != 0) break;
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) break;
        *slash = '\0';
    }
    free(p);
}

int clattn_cli_check_dir(const char *cmd, const char *flag, const char *path, int writable)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT && writable) return creatable(cmd, flag, path);  /* made when the outputs are written */
        if (errno == ENOENT)
            clattn_cli_say(cmd, "%s '%s': no such directory", flag, path);
        else
            clattn_cli_say(cmd, "%s '%s': %s", flag, path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        clattn_cli_say(cmd, "%s '%s': not a directory", flag, path);
        return -1;
    }
    if (access(path, writable ? (W_OK | X_OK) : (R_OK | X_OK)) != 0) {
        clattn_cli_say(cmd, "%s '%s': %s", flag, path, writable ? "not writable" : "not readable");
        return -1;
    }
    return 0;
}

const char *clattn_cli_shape(char *buf, size_t len, int ndim, const size_t *dims)
{
    size_t n = (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < ndim && n < len; d++) n += (size_t)snprintf(buf + n, len - n, "%s%zu", d ? ", " : "", dims[d]);
    if (n < len) snprintf(buf + n, len - n, "%s)", ndim == 1 ? "," : "");
    return buf;
}

clattn_device *clattn_cli_open_device(const char *cmd, const char *spec, int *code)
{
    clattn_device *dev = NULL;
    clattn_status st = clattn_device_open(spec, &dev);
    if (st != CLATTN_STATUS_SUCCESS) {
        const char *env = getenv("CLATTN_DEVICE");
        const char *why = *clattn_last_error() ? clattn_last_error() : clattn_status_string(st);
        if (spec) clattn_cli_say(cmd, "--device '%s': %s", spec, why);
        else if (env && *env) clattn_cli_say(cmd, "--device (default from CLATTN_DEVICE='%s'): %s", env, why);
        else clattn_cli_say(cmd, "--device (default): %s", why);
        if (code) *code = st == CLATTN_STATUS_INVALID_DEVICE_SPEC ? 2 : 1;
        return NULL;
    }
    const char *notice = clattn_device_notice(dev);
    if (notice) clattn_cli_say(cmd, "notice: %s", notice);
    return dev;
}

int clattn_cli_parse_algorithm(const char *v, clattn_algorithm *a)
{
    static const clattn_algorithm all[] = {CLATTN_ALGORITHM_AUTO, CLATTN_ALGORITHM_FUSED, CLATTN_ALGORITHM_UNFUSED};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(v, clattn_algorithm_name(all[i])) == 0) {
            *a = all[i];
            return 0;
        }
    return -1;
}

int clattn_cli_parse_dtype(const char *v, clattn_dtype *t)
{
    static const struct { const char *name; clattn_dtype t; } all[] = {
        {"f32", CLATTN_DTYPE_F32}, {"f16", CLATTN_DTYPE_F16}, {"bf16", CLATTN_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(v, all[i].name) == 0) {
            *t = all[i].t;
            return 0;
        }
    return -1;
}

double clattn_cli_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
