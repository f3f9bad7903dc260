/* tune_file.c: the device's tuning file, read when the device opens (clattn.h, "tuning"); clattn_tune
 * (src/tune/search.c) writes it.
 *
 * The file, one entry per line ('#' starts a comment):
 *   clattn-tune 2
 *   clattn <version>          device <name>          vendor <vendor>          driver <driver version>
 *   core <name> <class> <P>=<V>,...    a core's parameters for head-size class 0..4 (max(dk, dv) <= 32, 64,
 *                                      128, 256, above): every parameter of that core (`clattn cores`)
 *   auto <class> <name>                the core plans of head-size class 0..4 get first when they can use
 *                                      it (AUTO plans, or plans of its algorithm), before the order of preference
 *   clblast xgemm <P>=<V>,...          CLBlast's parameters of its Xgemm kernel (runtime/blas_params.c: every
 *   clblast xgemmdirect <P>=<V>,...    parameter, within the space its tuner searches), or of XgemmDirect
 * The header must match this device and this clattn exactly, or the whole file is stale; a file of another
 * format (clattn-tune 1, written by clattn 0.3) is ignored whole. Entries are checked against the cores'
 * own values; one that is not valid is ignored (with a notice), and one that is valid but does not fit a
 * plan (a vector width that does not divide its head size, tiles larger than the local memory) or fails to
 * build falls back to the defaults for that plan. The parameters never change what is computed, only how
 * it is blocked. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define TUNE_MAX_BYTES 65536
#define TUNE_MAGIC "clattn-tune 2"

void clattn_tune_table_init(clattn_tune_table *t)
{
    memset(t, 0, sizeof *t);
}

const clattn_tune_table *clattn_tune_active(const clattn_device *dev)
{
    if (clattn_device_simulated(dev)) return NULL; /* the host's tuning is not the simulated target's */
    return dev->tune_try ? dev->tune_try : dev->tune;
}

const clattn_core_params *clattn_tune_params(const clattn_tune_table *t, const clattn_core *core, int cls)
{
    for (int i = 0; t && i < t->nentries; i++)
        if (t->entries[i].core == core && t->entries[i].cls == cls) return &t->entries[i].params;
    return NULL;
}

int clattn_tune_set_params(clattn_tune_table *t, const clattn_core *core, int cls, const clattn_core_params *p)
{
    for (int i = 0; i < t->nentries; i++)
        if (t->entries[i].core == core && t->entries[i].cls == cls) {
            t->entries[i].params = *p;
            return 1;
        }
    if (t->nentries >= CLATTN_TUNE_MAX_ENTRIES) return 0;
    t->entries[t->nentries++] = (clattn_tune_entry){core, cls, *p};
    return 1;
}

static uint64_t fnv(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The file's path for this device: $CLATTN_TUNE_FILE, else the cache directory (created). 0: none. */
static int tune_path(const clattn_device *dev, char *path, size_t len, int create_dir)
{
    const char *f = getenv("CLATTN_TUNE_FILE");
    if (f && *f) return snprintf(path, len, "%s", f) < (int)len;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[900];
    if (xdg && *xdg) snprintf(dir, sizeof dir, "%s/clattn", xdg);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/clattn", home);
    else return 0;
    if (create_dir) {
        char up[900];
        snprintf(up, sizeof up, "%s", dir);
        char *slash = strrchr(up, '/');
        if (slash && slash != up) {
            *slash = '\0';
            mkdir(up, 0700);
        }
        mkdir(dir, 0700);
    }
    char key[1024];
    snprintf(key, sizeof key, "%s|%s|%s|%s", clattn_version(), dev->name, dev->caps.vendor, dev->caps.driver);
    return snprintf(path, len, "%s/tune-%016llx.txt", dir, (unsigned long long)fnv(key)) < (int)len;
}

static void note(clattn_tune_table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(clattn_tune_table *t, const char *fmt, ...)
{
    size_t used = strlen(t->notice);
    if (used + 4 >= sizeof t->notice) return;
    if (used) t->notice[used++] = ';', t->notice[used++] = ' ', t->notice[used] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->notice + used, sizeof t->notice - used, fmt, ap);
    va_end(ap);
}

/* A head-size class written as one digit, or -1. */
static int class_word(const char *w)
{
    return strlen(w) == 1 && w[0] >= '0' && w[0] < '0' + CLATTN_HEAD_CLASSES ? w[0] - '0' : -1;
}

/* "core NAME CLASS P=V,...": every parameter of the core, each one of its values, together what the core
 * can take on some device. */
static void parse_core(clattn_tune_table *parsed, clattn_tune_table *t, int line_no, char **w, int nw)
{
    const clattn_core *core = nw == 4 ? clattn_core_find(w[1]) : NULL;
    const int cls = nw == 4 ? class_word(w[2]) : -1;
    if (!core || cls < 0) {
        note(t, "line %d: not a 'core NAME CLASS P=V,...' entry with a core `clattn cores` lists and a class 0..%d: "
             "ignored", line_no, CLATTN_HEAD_CLASSES - 1);
        return;
    }
    clattn_core_params p;
    for (int i = 0; i < CLATTN_CORE_MAX_PARAMS; i++) p.v[i] = (size_t)-1;
    char why[300];
    if (!clattn_core_params_parse(core, w[3], &p, why, sizeof why)) {
        note(t, "line %d: %s: ignored", line_no, why);
        return;
    }
    for (int i = 0; i < core->nparams; i++)
        if (p.v[i] == (size_t)-1) {
            note(t, "line %d: %s: no value for %s: ignored", line_no, core->name, core->params[i].name);
            return;
        }
    if (core->fits && !core->fits(core, NULL, NULL, &p)) {
        note(t, "line %d: %s are not values the %s kernel takes together: ignored", line_no, w[3], core->name);
        return;
    }
    if (!clattn_tune_set_params(parsed, core, cls, &p)) note(t, "line %d: too many entries: ignored", line_no);
}

/* Parse `text` (NUL-terminated) into t for this device; never fails, notes what it ignores. */
static void parse(const clattn_device *dev, const char *text, clattn_tune_table *t)
{
    const char *want[4][2] = {{"clattn", clattn_version()}, {"device", dev->name}, {"vendor", dev->caps.vendor},
                              {"driver", dev->caps.driver}};
    int seen[4] = {0}, line_no = 0, header = 0;
    clattn_tune_table parsed;
    clattn_tune_table_init(&parsed);
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char line[600];
        line_no++;
        if (n >= sizeof line) {
            note(t, "line %d: longer than %zu characters, ignored", line_no, sizeof line - 1);
            p += n + (end != NULL);
            continue;
        }
        memcpy(line, p, n);
        line[n] = '\0';
        p += n + (end != NULL);
        if (n && line[n - 1] == '\r') line[--n] = '\0';
        if (!n || line[0] == '#') continue;
        if (!header) {
            if (strncmp(line, "clattn-tune ", 12) == 0 && strcmp(line, TUNE_MAGIC) != 0) {
                note(t, "written in another format ('%.20s', this clattn reads '" TUNE_MAGIC "'): ignored; run "
                     "`clattn tune` again", line);
                return;
            }
            if (strcmp(line, TUNE_MAGIC) != 0) {
                note(t, "not a clattn tuning file (first line is not '" TUNE_MAGIC "'): ignored");
                return;
            }
            header = 1;
            continue;
        }
        int matched = 0;
        for (int k = 0; k < 4; k++) {
            const size_t kl = strlen(want[k][0]);
            if (strncmp(line, want[k][0], kl) == 0 && line[kl] == ' ') {
                matched = 1;
                seen[k] = 1;
                if (strcmp(line + kl + 1, want[k][1]) != 0) {
                    note(t, "stale: written for %s '%s', this is '%s': ignored", want[k][0], line + kl + 1,
                         want[k][1]);
                    return;
                }
            }
        }
        if (matched) continue;
        char *save = NULL, *w[7] = {0};
        int nw = 0;
        for (char *tok = strtok_r(line, " \t", &save); tok && nw < 7; tok = strtok_r(NULL, " \t", &save)) w[nw++] = tok;
        if (strcmp(w[0], "core") == 0) {
            parse_core(&parsed, t, line_no, w, nw);
        } else if (strcmp(w[0], "auto") == 0) {
            const clattn_core *core = nw == 3 ? clattn_core_find(w[2]) : NULL;
            const int cls = nw == 3 ? class_word(w[1]) : -1;
            if (!core || cls < 0)
                note(t, "line %d: not an 'auto CLASS NAME' entry with a class 0..%d and a core `clattn cores` "
                     "lists: ignored", line_no, CLATTN_HEAD_CLASSES - 1);
            else
                parsed.auto_core[core->kind][cls] = core;
        } else if (nw == 3 && strcmp(w[0], "clblast") == 0 &&
                   (strcmp(w[1], "xgemm") == 0 || strcmp(w[1], "xgemmdirect") == 0)) {
            const clattn_blas_kernel k = strcmp(w[1], "xgemm") == 0 ? CLATTN_BLAS_XGEMM : CLATTN_BLAS_XGEMM_DIRECT;
            size_t v[CLATTN_BLAS_MAX_PARAMS];
            char why[300];
            if (strspn(w[2], "0123456789") == strlen(w[2]))
                note(t, "line %d: clblast %s %s: a preset set of an earlier clattn (run `clattn tune` again): ignored",
                     line_no, w[1], w[2]);
            else if (!clattn_blas_params_parse(k, w[2], v, why, sizeof why))
                note(t, "line %d: clblast %s: %s: ignored", line_no, w[1], why);
            else if (!clattn_blas_params_valid(&dev->caps, k, v, why, sizeof why))
                note(t, "line %d: clblast %s: %s: ignored", line_no, w[1], why);
            else
                memcpy(parsed.blas[k], v, sizeof v), parsed.has_blas[k] = 1;
        } else {
            note(t, "line %d: not an entry clattn knows: ignored", line_no);
        }
    }
    if (!header) {
        note(t, "empty or not a clattn tuning file: ignored");
        return;
    }
    for (int k = 0; k < 4; k++)
        if (!seen[k]) {
            note(t, "no '%s' line (truncated?): ignored", want[k][0]);
            return;
        }
    memcpy(t->entries, parsed.entries, sizeof t->entries);
    t->nentries = parsed.nentries;
    memcpy(t->auto_core, parsed.auto_core, sizeof t->auto_core);
    memcpy(t->has_blas, parsed.has_blas, sizeof t->has_blas);
    memcpy(t->blas, parsed.blas, sizeof t->blas);
}

void clattn_tune_load(clattn_device *dev)
{
    clattn_tune_table *t = clattn_calloc(1, sizeof *t);
    if (!t) return; /* no memory for a tuning file: the defaults */
    clattn_tune_table_init(t);
    dev->tune = t;
    const char *off = getenv("CLATTN_TUNE");
    if (off && strcmp(off, "0") == 0) return;
    if (!tune_path(dev, t->path, sizeof t->path, 0)) {
        t->path[0] = '\0';
        return;
    }
    /* without blocking (a FIFO in the file's place cannot hang the device's open), a regular file only */
    const int fd = open(t->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return; /* no file: nothing to say */
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        note(t, "%s is not a regular file: ignored", t->path);
        return;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return;
    }
    char *text = malloc(TUNE_MAX_BYTES + 1);
    size_t n = text ? fread(text, 1, TUNE_MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (!text) return;
    if (n > TUNE_MAX_BYTES) {
        note(t, "%s is larger than %d bytes: ignored", t->path, TUNE_MAX_BYTES);
    } else if (memchr(text, '\0', n)) {
        note(t, "%s holds NUL bytes: ignored", t->path);
    } else {
        text[n] = '\0';
        parse(dev, text, t);
    }
    free(text);
    /* CLBlast's parameters are CLBlast's, per device and process: set them now, for every plan */
    for (int k = 0; k < 2; k++) {
        if (!t->has_blas[k]) continue;
        if (clattn_blas_use_params(dev, (clattn_blas_kernel)k, t->blas[k]) == CLATTN_STATUS_SUCCESS) {
            t->blas_applied[k] = 1;
        } else {
            note(t, "CLBlast refused the %s parameters: ignored", clattn_blas_kernel_name((clattn_blas_kernel)k));
            t->has_blas[k] = 0;
        }
        clattn_clear_error();
    }
}

clattn_status clattn_tune_write(const clattn_device *dev, const clattn_tune_table *t, char *path, size_t len)
{
    if (!tune_path(dev, path, len, 1)) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "no place for the tuning "
                                                          "file (set CLATTN_TUNE_FILE, XDG_CACHE_HOME or HOME)");
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) close(fd), unlink(tmp);
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cannot write the tuning file next to %s", path);
    }
    fprintf(f, TUNE_MAGIC "\n# written by clattn_tune (clattn tune); read by plans on this device\n");
    fprintf(f, "clattn %s\ndevice %s\nvendor %s\ndriver %s\n", clattn_version(), dev->name, dev->caps.vendor,
            dev->caps.driver);
    for (int i = 0; i < t->nentries; i++) {
        char params[200];
        clattn_core_params_format(t->entries[i].core, &t->entries[i].params, params, sizeof params);
        fprintf(f, "core %s %d %s\n", t->entries[i].core->name, t->entries[i].cls, params);
    }
    for (int k = 0; k < CLATTN_CORE_KINDS; k++)
        for (int c = 0; c < CLATTN_HEAD_CLASSES; c++)
            if (t->auto_core[k][c]) fprintf(f, "auto %d %s\n", c, t->auto_core[k][c]->name);
    for (int k = 0; k < 2; k++)
        if (t->has_blas[k]) {
            char text[400];
            clattn_blas_params_format((clattn_blas_kernel)k, t->blas[k], text, sizeof text);
            fprintf(f, "clblast %s %s\n", k == CLATTN_BLAS_XGEMM ? "xgemm" : "xgemmdirect", text);
        }
    const int ok = fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cannot write the tuning file %s", path);
    }
    return CLATTN_STATUS_SUCCESS;
}

const char *clattn_device_tune_file(const clattn_device *dev)
{
    return dev && dev->tune ? dev->tune->path : "";
}

const char *clattn_device_tune_notice(const clattn_device *dev)
{
    return dev && dev->tune && dev->tune->notice[0] ? dev->tune->notice : NULL;
}
