/* tune.c: the device's tuning file (read at device open, used at plan creation) and clattn_tune_table, the
 * search that writes it (clattn.h, "tuning").
 *
 * The file, one entry per line ('#' starts a comment):
 *   clattn-tune 1
 *   clattn <version>          device <name>          vendor <vendor>          driver <driver version>
 *   flash <class> rows <ROWS> <BK> <VW>       the fused kernel for head-size class 0..3: flash_rows
 *   flash <class> tiled <BQ> <BKT> <NS>       ... or flash_tiled
 *   softmax rows|item                         the unfused path's softmax kernel
 * The header must match this device and this clattn exactly, or the whole file is stale. Entries are
 * checked against fixed sets of values; one that is not valid is ignored (with a notice), and one that is
 * valid but does not fit a plan (a vector width that does not divide its head size, tiles larger than the
 * local memory) or fails to build falls back to the defaults for that plan. The parameters never change
 * what is computed, only how it is blocked.
 */
#include "attention_fused.h"
#include "backend.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TUNE_MAX_BYTES 65536
#define TUNE_MAGIC "clattn-tune 1"

int clattn_tune_class(size_t dk, size_t dv)
{
    const size_t d = dk > dv ? dk : dv;
    return d <= 32 ? 0 : d <= 64 ? 1 : d <= 128 ? 2 : d <= 256 ? 3 : -1;
}

const clattn_tune_table *clattn_tune_active(const clattn_device *dev)
{
    return dev->tune_try ? dev->tune_try : dev->tune;
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
    snprintf(key, sizeof key, "%s|%s|%s|%s", clattn_version(), dev->name, dev->vendor, dev->driver);
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

/* A whole number in [1, 1024] that is a power of two, or 0. */
static size_t pow2_value(const char *s)
{
    if (!s || !*s || strlen(s) > 5) return 0;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    unsigned long v = strtoul(s, NULL, 10);
    return v >= 1 && v <= 1024 && (v & (v - 1)) == 0 ? (size_t)v : 0;
}

static int in_set(size_t v, const size_t *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == v) return 1;
    return 0;
}

/* One "flash" line's values checked against what the kernels take; 0 when not. */
static int valid_flash(int kind, size_t a, size_t b, size_t c)
{
    static const size_t rows[] = {1, 2, 4, 8, 16, 32}, bk[] = {8, 16, 32}, vw[] = {1, 4, 8};
    static const size_t bq[] = {1, 2, 4, 8, 16, 32, 64}, bkt[] = {8, 16, 32, 64}, ns[] = {1, 2, 4, 8, 16};
    if (kind == CLATTN_FLASH_ROWS) return in_set(a, rows, 6) && in_set(b, bk, 3) && in_set(c, vw, 3);
    return in_set(a, bq, 7) && in_set(b, bkt, 4) && in_set(c, ns, 5) && a * c <= 256;
}

/* Parse `text` (NUL-terminated) into t for this device; never fails, notes what it ignores. */
static void parse(const clattn_device *dev, const char *text, clattn_tune_table *t)
{
    const char *want[4][2] = {{"clattn", clattn_version()}, {"device", dev->name}, {"vendor", dev->vendor},
                              {"driver", dev->driver}};
    int seen[4] = {0}, line_no = 0, header = 0;
    clattn_tune_table parsed;
    memset(&parsed, 0, sizeof parsed);
    parsed.softmax = -1;
    parsed.xgemm = -1;
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
        if (nw == 2 && strcmp(w[0], "softmax") == 0 && (!strcmp(w[1], "rows") || !strcmp(w[1], "item"))) {
            parsed.softmax = strcmp(w[1], "item") == 0;
        } else if (nw == 3 && strcmp(w[0], "clblast") == 0 && strcmp(w[1], "xgemm") == 0) {
            char *e;
            const unsigned long v = strtoul(w[2], &e, 10);
            if (w[2][0] < '0' || w[2][0] > '9' || *e || v >= clattn_blas_xgemm_sets() || strlen(w[2]) > 4)
                note(t, "line %d: clblast xgemm '%s' is not one of the %zu parameter sets: ignored", line_no, w[2],
                     clattn_blas_xgemm_sets());
            else
                parsed.xgemm = (int)v;
        } else if (nw == 6 && strcmp(w[0], "flash") == 0 && (!strcmp(w[2], "rows") || !strcmp(w[2], "tiled")) &&
                   strlen(w[1]) == 1 && w[1][0] >= '0' && w[1][0] < '0' + CLATTN_TUNE_CLASSES) {
            const int kind = strcmp(w[2], "tiled") == 0 ? CLATTN_FLASH_TILED : CLATTN_FLASH_ROWS;
            const size_t a = pow2_value(w[3]), b = pow2_value(w[4]), c = pow2_value(w[5]);
            if (!valid_flash(kind, a, b, c)) {
                note(t, "line %d: flash parameters %s %s %s are not values the %s kernel takes: ignored", line_no,
                     w[3], w[4], w[5], w[2]);
                continue;
            }
            clattn_tune_flash *f = &parsed.flash[w[1][0] - '0'];
            f->set = 1, f->kind = kind, f->a = a, f->b = b, f->c = c;
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
    memcpy(t->flash, parsed.flash, sizeof t->flash);
    t->softmax = parsed.softmax;
    t->xgemm = parsed.xgemm;
}

void clattn_tune_load(clattn_device *dev)
{
    clattn_tune_table *t = clattn_calloc(1, sizeof *t);
    if (!t) return; /* no memory for a tuning file: the defaults */
    t->softmax = -1;
    t->xgemm = -1;
    dev->tune = t;
    const char *off = getenv("CLATTN_TUNE");
    if (off && strcmp(off, "0") == 0) return;
    if (!tune_path(dev, t->path, sizeof t->path, 0)) {
        t->path[0] = '\0';
        return;
    }
    FILE *f = fopen(t->path, "rb");
    if (!f) return; /* no file: nothing to say */
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
    /* CLBlast's Xgemm parameters are CLBlast's, per device and process: set them now, for every plan */
    if (t->xgemm >= 0) {
        if (clattn_blas_use_xgemm_set(dev, (size_t)t->xgemm) == CLATTN_STATUS_SUCCESS) {
            t->xgemm_applied = 1;
        } else {
            note(t, "CLBlast refused Xgemm parameter set %d: ignored", t->xgemm);
            t->xgemm = -1;
        }
        clattn_clear_error();
    }
}

const char *clattn_device_tune_file(const clattn_device *dev)
{
    return dev && dev->tune ? dev->tune->path : "";
}

const char *clattn_device_tune_notice(const clattn_device *dev)
{
    return dev && dev->tune && dev->tune->notice[0] ? dev->tune->notice : NULL;
}

int clattn_plan_tuned(const clattn_plan *plan) { return plan ? plan->tuned : 0; }

/* ---------------------------------------------------------------- clattn_tune_table */

typedef struct search {
    clattn_device *dev;
    const clattn_tune_options *o;
    double t0, budget_ms, margin;
    double deadline;     /* the current phase's end (ms, now_ms clock) */
    float *x, *wq, *wk, *wv, *wo, *bq, *bo, *ref, *out;
    clattn_attention_desc d;
} search;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void say(const search *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const search *s, const char *fmt, ...)
{
    if (!s->o->progress) return;
    char line[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->o->progress(line, s->o->user);
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Plan the shape with the entries `try` (every default when they are empty), check its output against
 * `s->ref` (when check), and time it: the median of at least 3 runs and 0.3 s. Returns the median in ms,
 * -1 when the plan failed, -2 when its output differed, -3 when the entries did not apply (not tuned). */
static double run_candidate(search *s, const clattn_tune_table *try, clattn_algorithm alg, int check, int need_tuned,
                            float *out)
{
    s->dev->tune_try = try;
    clattn_attention_desc d = s->d;
    d.algorithm = alg;
    clattn_attention_weights w = {.w_query = s->wq, .w_key = s->wk, .w_value = s->wv, .b_query = s->bq,
                                  .w_out = s->wo, .b_out = s->bo};
    clattn_plan *p = NULL;
    clattn_status st = clattn_plan_create(s->dev, &d, &w, &p);
    s->dev->tune_try = NULL;
    if (st != CLATTN_STATUS_SUCCESS) return -1;
    if (need_tuned && !p->tuned) {
        clattn_plan_free(p);
        return -3;
    }
    const size_t n = d.batch * d.seq_q * d.out_dim;
    clattn_attention_args a = {.x = s->x, .out = out};
    if (clattn_plan_execute(p, &a) != CLATTN_STATUS_SUCCESS) {
        clattn_plan_free(p);
        return -1;
    }
    if (check)
        for (size_t i = 0; i < n; i++)
            if (!(fabs((double)out[i] - (double)s->ref[i]) <= 1e-5 + 1e-4 * fabs((double)s->ref[i]))) {
                clattn_plan_free(p);
                return -2;
            }
    double t[64];
    int k = 0;
    const double start = now_ms();
    while (k < 64 && (k < 3 || now_ms() - start < 300.0)) {
        const double t1 = now_ms();
        if (clattn_plan_execute(p, &a) != CLATTN_STATUS_SUCCESS) {
            clattn_plan_free(p);
            return -1;
        }
        t[k++] = now_ms() - t1;
    }
    clattn_plan_free(p);
    qsort(t, (size_t)k, sizeof t[0], cmp_d);
    return t[k / 2];
}

static int over_budget(const search *s) { return now_ms() > s->deadline || now_ms() - s->t0 > s->budget_ms; }

/* Keep `best` over the defaults only if it wins by the margin in three alternating comparisons. */
static int confirm(search *s, const clattn_tune_table *best, clattn_algorithm alg, const char *what)
{
    const clattn_tune_table none = {.softmax = -1, .xgemm = -1};
    for (int round = 0; round < 3; round++) {
        const double d = run_candidate(s, &none, alg, 0, 0, s->out), b = run_candidate(s, best, alg, 1, 1, s->out);
        say(s, "  confirm %s, round %d: default %.2f ms, tuned %.2f ms", what, round + 1, d, b);
        if (d <= 0 || b <= 0 || b > d * (1.0 - s->margin)) return 0;
    }
    return 1;
}

static clattn_status write_file(const clattn_device *dev, const clattn_tune_table *t, char *path, size_t len)
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
    fprintf(f, "clattn %s\ndevice %s\nvendor %s\ndriver %s\n", clattn_version(), dev->name, dev->vendor, dev->driver);
    for (int c = 0; c < CLATTN_TUNE_CLASSES; c++) {
        const clattn_tune_flash *e = &t->flash[c];
        if (e->set)
            fprintf(f, "flash %d %s %zu %zu %zu\n", c, e->kind == CLATTN_FLASH_TILED ? "tiled" : "rows", e->a, e->b,
                    e->c);
    }
    if (t->softmax >= 0) fprintf(f, "softmax %s\n", t->softmax ? "item" : "rows");
    if (t->xgemm >= 0) fprintf(f, "clblast xgemm %d\n", t->xgemm);
    const int ok = fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cannot write the tuning file %s", path);
    }
    return CLATTN_STATUS_SUCCESS;
}

/* Search one shape's head-size class (fused parameters) and the softmax variant within its budget
 * (shape_ms): the fused candidates get 60% of it, their confirmation and the softmax the rest. Results into `keep`. */
static void search_shape(search *s, clattn_tune_table *keep, double shape_ms)
{
    const clattn_attention_desc *d = &s->d;
    const double start = now_ms();
    s->deadline = start + 0.6 * shape_ms;
    const int cls = clattn_tune_class(d->head_dim_qk, d->head_dim_v);
    const clattn_tune_table none = {.softmax = -1, .xgemm = -1};
    /* the fused kernel: every candidate against the defaults */
    const double base = run_candidate(s, &none, CLATTN_ALGORITHM_FUSED, 0, 0, s->ref);
    say(s, "B=%zu T=%zu E=%zu H=%zu: fused, defaults: %.2f ms", d->batch, d->seq_q, d->embed, d->heads, base);
    if (base > 0 && cls >= 0) {
        clattn_tune_table cand = none, best = none;
        double best_ms = base;
        static const size_t rows[] = {4, 8, 16, 32}, bk[] = {8, 16, 32};
        /* vector widths that divide both head sizes: 8 and 4 where they do (1 only when neither does) */
        size_t vws[3] = {0, 0, 0}, nvw = 0;
        if (d->head_dim_qk % 8 == 0 && d->head_dim_v % 8 == 0) vws[nvw++] = 8;
        if (d->head_dim_qk % 4 == 0 && d->head_dim_v % 4 == 0) vws[nvw++] = 4;
        if (!nvw) vws[nvw++] = 1;
        static const size_t bq[] = {8, 16, 32}, bkt[] = {16, 32}, ns[] = {2, 4, 8};
        const int kinds[2] = {s->dev->dclass == CLATTN_CLASS_CPU ? CLATTN_FLASH_ROWS : CLATTN_FLASH_TILED,
                              s->dev->dclass == CLATTN_CLASS_CPU ? CLATTN_FLASH_TILED : CLATTN_FLASH_ROWS};
        int tried = 0, wrong = 0;
        for (int ki = 0; ki < 2 && !over_budget(s); ki++) {
            const int kind = kinds[ki];
            const size_t na = kind == CLATTN_FLASH_ROWS ? 4 : 3, nb = kind == CLATTN_FLASH_ROWS ? 3 : 2;
            const size_t nc = kind == CLATTN_FLASH_ROWS ? nvw : 3;
            for (size_t i = 0; i < na && !over_budget(s); i++)
                for (size_t j = 0; j < nb && !over_budget(s); j++)
                    for (size_t k = 0; k < nc && !over_budget(s); k++) {
                        clattn_tune_flash *e = &cand.flash[cls];
                        e->set = 1, e->kind = kind;
                        e->a = kind == CLATTN_FLASH_ROWS ? rows[i] : bq[i];
                        e->b = kind == CLATTN_FLASH_ROWS ? bk[j] : bkt[j];
                        e->c = kind == CLATTN_FLASH_ROWS ? vws[k] : ns[k];
                        const double ms = run_candidate(s, &cand, CLATTN_ALGORITHM_FUSED, 1, 1, s->out);
                        tried++;
                        if (ms == -2) wrong++;
                        say(s, "  %s %zu %zu %zu: %s%.2f ms", kind == CLATTN_FLASH_ROWS ? "rows" : "tiled", e->a,
                            e->b, e->c, ms == -2 ? "WRONG OUTPUT, rejected " : ms < 0 ? "not applicable " : "",
                            ms < 0 ? 0.0 : ms);
                        if (ms > 0 && ms < best_ms) best_ms = ms, best = cand;
                    }
        }
        say(s, "  %d candidates, %d rejected for their output; best %.2f ms against %.2f ms", tried, wrong, best_ms,
            base);
        s->deadline = start + shape_ms;
        if (best.flash[cls].set && !over_budget(s) && confirm(s, &best, CLATTN_ALGORITHM_FUSED, "fused")) {
            keep->flash[cls] = best.flash[cls];
            say(s, "  kept for head-size class %d", cls);
        } else {
            say(s, "  the defaults stay for head-size class %d", cls);
        }
    }
    /* the unfused path's softmax: the two kernels */
    if (over_budget(s)) return;
    const double b2 = run_candidate(s, &none, CLATTN_ALGORITHM_UNFUSED, 0, 0, s->ref);
    say(s, "B=%zu T=%zu E=%zu H=%zu: unfused, defaults: %.2f ms", d->batch, d->seq_q, d->embed, d->heads, b2);
    if (b2 <= 0) return;
    clattn_tune_table best = none;
    double best_ms = b2;
    for (int v = 0; v < 2 && !over_budget(s); v++) {
        clattn_tune_table cand = none;
        cand.softmax = v;
        const double ms = run_candidate(s, &cand, CLATTN_ALGORITHM_UNFUSED, 1, 1, s->out);
        say(s, "  softmax %s: %s%.2f ms", v ? "item" : "rows", ms == -2 ? "WRONG OUTPUT, rejected " : "",
            ms < 0 ? 0.0 : ms);
        if (ms > 0 && ms < best_ms) best_ms = ms, best = cand;
    }
    if (best.softmax >= 0 && !over_budget(s) && confirm(s, &best, CLATTN_ALGORITHM_UNFUSED, "softmax")) {
        keep->softmax = best.softmax;
        say(s, "  kept softmax %s", best.softmax ? "item" : "rows");
    }
}

static void fill(float *a, size_t n, float scale, uint64_t *st)
{
    for (size_t i = 0; i < n; i++) {
        *st = *st * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = scale * ((float)(*st >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
    }
}

/* The data of shape q = (B, T, E, H): x, the weights, and the output buffers. */
static clattn_status make_shape(search *s, const size_t *q, uint64_t seed)
{
    const size_t B = q[0], T = q[1], E = q[2], H = q[3];
    s->d = (clattn_attention_desc){.batch = B, .seq_q = T, .embed = E, .heads = H, .head_dim_qk = E / H, .out_dim = E};
    const float ws = 1.0f / sqrtf((float)E);
    s->x = malloc(B * T * E * sizeof(float)), s->wq = malloc(E * E * sizeof(float));
    s->wk = malloc(E * E * sizeof(float)), s->wv = malloc(E * E * sizeof(float));
    s->wo = malloc(E * E * sizeof(float)), s->bq = malloc(E * sizeof(float)), s->bo = malloc(E * sizeof(float));
    s->ref = malloc(B * T * E * sizeof(float)), s->out = malloc(B * T * E * sizeof(float));
    if (!s->x || !s->wq || !s->wk || !s->wv || !s->wo || !s->bq || !s->bo || !s->ref || !s->out)
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "tuning: the shape's arrays");
    fill(s->x, B * T * E, 1.0f, &seed), fill(s->wq, E * E, ws, &seed), fill(s->wk, E * E, ws, &seed);
    fill(s->wv, E * E, ws, &seed), fill(s->wo, E * E, ws, &seed), fill(s->bq, E, 0.1f, &seed);
    fill(s->bo, E, 0.1f, &seed);
    return CLATTN_STATUS_SUCCESS;
}

static void free_shape(search *s)
{
    free(s->x), free(s->wq), free(s->wk), free(s->wv), free(s->wo), free(s->bq), free(s->bo), free(s->ref);
    free(s->out);
    s->x = s->wq = s->wk = s->wv = s->wo = s->bq = s->bo = s->ref = s->out = NULL;
}

/* CLBlast's Xgemm parameter sets (blas.c) on the shape in `s`, the whole attention call timed, within
 * `phase_ms`. The defaults are measured first (CLBlast cannot be set back to them afterwards: a set kept
 * must beat both them and set 0, CLBlast's generic default, in every confirmation round). The process is
 * left with the kept set, or set 0. */
static void search_xgemm(search *s, clattn_tune_table *keep, double phase_ms)
{
    const clattn_tune_table none = {.softmax = -1, .xgemm = -1};
    const double start = now_ms();
    s->deadline = start + 0.75 * phase_ms;
    const double base = run_candidate(s, &none, CLATTN_ALGORITHM_FUSED, 0, 0, s->ref);
    say(s, "CLBlast Xgemm parameters, B=%zu T=%zu E=%zu H=%zu: CLBlast's own: %.2f ms", s->d.batch, s->d.seq_q,
        s->d.embed, s->d.heads, base);
    if (base <= 0) return;
    int best = -1;
    double best_ms = base;
    clattn_tune_table cand = none;
    for (size_t i = 0; i < clattn_blas_xgemm_sets() && !over_budget(s); i++) {
        if (clattn_blas_use_xgemm_set(s->dev, i) != CLATTN_STATUS_SUCCESS) {
            say(s, "  set %zu: refused by CLBlast", i);
            continue;
        }
        cand.xgemm = (int)i;
        const double ms = run_candidate(s, &cand, CLATTN_ALGORITHM_FUSED, 1, 1, s->out);
        say(s, "  set %zu: %s%.2f ms", i, ms == -2 ? "WRONG OUTPUT, rejected " : ms < 0 ? "failed " : "",
            ms < 0 ? 0.0 : ms);
        if (ms > 0 && ms < best_ms) best_ms = ms, best = (int)i;
    }
    s->deadline = start + phase_ms;
    int kept = 0;
    if (best >= 0 && !over_budget(s)) {
        kept = 1;
        clattn_tune_table b = none, zero = none;
        b.xgemm = best, zero.xgemm = 0;
        for (int round = 0; round < 3 && kept; round++) {
            clattn_blas_use_xgemm_set(s->dev, 0);
            const double z = run_candidate(s, &zero, CLATTN_ALGORITHM_FUSED, 0, 1, s->out);
            clattn_blas_use_xgemm_set(s->dev, (size_t)best);
            const double t = run_candidate(s, &b, CLATTN_ALGORITHM_FUSED, 1, 1, s->out);
            say(s, "  confirm set %d, round %d: CLBlast's own %.2f ms (once), set 0 %.2f ms, set %d %.2f ms", best,
                round + 1, base, z, best, t);
            kept = t > 0 && z > 0 && t <= base * (1.0 - s->margin) && t <= z * (1.0 - s->margin);
        }
    }
    clattn_clear_error();
    if (kept) {
        keep->xgemm = best;
        say(s, "  kept set %d", best);
    } else {
        clattn_blas_use_xgemm_set(s->dev, 0);
        keep->xgemm = -1;
        say(s, "  CLBlast keeps its own parameters");
    }
}

clattn_status clattn_tune(clattn_device *device, const clattn_tune_options *options)
{
    clattn_clear_error();
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    if (device->backend != CLATTN_BACKEND_OPENCL || !device->tune)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "tuning needs an OpenCL device (this is %s)", device->name);
    const clattn_tune_options defaults = {0};
    const clattn_tune_options *o = options ? options : &defaults;
    if (o->budget_s < 0 || isnan(o->budget_s) || o->margin < 0 || o->margin >= 1 || isnan(o->margin))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "budget_s must be >= 0 and margin in [0, 1)");
    static const size_t preset[4] = {4, 512, 512, 8};
    const size_t *shapes = o->shapes ? o->shapes : preset;
    const size_t n_shapes = o->shapes ? o->n_shapes : 1;
    if (n_shapes == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "n_shapes is 0");
    for (size_t i = 0; i < n_shapes; i++) {
        const size_t *q = shapes + 4 * i;
        if (!q[0] || !q[1] || !q[2] || !q[3] || q[2] % q[3] || q[0] > 4096 || q[1] > 65536 || q[2] > 65536)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "shape %zu (B=%zu, T=%zu, E=%zu, H=%zu): every value "
                               ">= 1 and H dividing E", i, q[0], q[1], q[2], q[3]);
    }
    search s = {.dev = device, .o = o, .t0 = now_ms(), .budget_ms = 1e3 * (o->budget_s > 0 ? o->budget_s : 120.0),
                .margin = o->margin > 0 ? o->margin : 0.03};
    clattn_tune_table keep = *device->tune; /* the file's other entries stay */
    keep.notice[0] = '\0';
    clattn_status st = CLATTN_STATUS_SUCCESS;
    /* the shapes' own kernels share 60% of the budget; CLBlast's parameters, on the first shape, the rest */
    const double kernels_ms = 0.6 * s.budget_ms;
    for (size_t i = 0; i < n_shapes && now_ms() - s.t0 < kernels_ms && st == CLATTN_STATUS_SUCCESS; i++) {
        const double shape_ms = (kernels_ms - (now_ms() - s.t0)) / (double)(n_shapes - i);
        if ((st = make_shape(&s, shapes + 4 * i, 42 + i)) == CLATTN_STATUS_SUCCESS) search_shape(&s, &keep, shape_ms);
        free_shape(&s);
    }
    if (st == CLATTN_STATUS_SUCCESS && (st = make_shape(&s, shapes, 42)) == CLATTN_STATUS_SUCCESS)
        search_xgemm(&s, &keep, s.budget_ms - (now_ms() - s.t0));
    free_shape(&s);
    if (st != CLATTN_STATUS_SUCCESS) return st;
    char path[1024];
    TRY(write_file(device, &keep, path, sizeof path));
    say(&s, "wrote %s (%.0f s)", path, (now_ms() - s.t0) / 1e3);
    /* the device uses it from now on, as a new process would */
    clattn_tune_table *old = device->tune;
    device->tune = NULL;
    clattn_tune_load(device);
    if (!device->tune) device->tune = old;
    else free(old);
    return CLATTN_STATUS_SUCCESS;
}
