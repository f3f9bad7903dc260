/* program.c: build OpenCL programs from the kernels embedded at build time (cl/, listed by the generated
 * clattn_kernels.h), through the compiled-program cache. */
#include "runtime.h"

#include "clattn_kernels.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const clattn_embedded_source *find_source(const char *name)
{
    for (size_t i = 0; i < sizeof clattn_cl_sources / sizeof clattn_cl_sources[0]; i++)
        if (strcmp(clattn_cl_sources[i].name, name) == 0) return &clattn_cl_sources[i];
    return NULL;
}

/* ---- programs shared within a context. The same embedded sources with the same options are built once per
 * (context, device) and handed to every plan that asks for them, each with a reference of its own (clRetainProgram;
 * a plan releases its own). The table holds one more reference per entry: dropped when a device on the context is
 * freed (clattn_program_forget, before the context is released: a context at the same address later never meets a
 * stale entry) or when the table is full (the oldest entry goes). Building takes time on every driver, and some keep
 * memory per program created until the process ends (Mesa 22's rusticl: 1-2 KB each). */
#define SHARED_SLOTS 128
static struct shared_program {
    cl_context ctx;
    cl_device_id dev;
    char *key;          /* the sources' names and the options */
    cl_program prog;
} shared[SHARED_SLOTS];
static size_t shared_next; /* the slot the next new entry takes (round robin: the oldest goes) */
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic long n_shared;

static int shared_key(const char *const *names, int count, const char *options, char *key, size_t len)
{
    size_t used = 0;
    for (int i = 0; i < count; i++) {
        const int n = snprintf(key + used, len - used, "%s+", names[i]);
        if (n < 0 || (size_t)n >= len - used) return 0;
        used += (size_t)n;
    }
    const int n = snprintf(key + used, len - used, "\n%s", options ? options : "");
    return n >= 0 && (size_t)n < len - used;
}

/* The shared program for key on dev, retained for the caller (NULL: none yet). */
static cl_program shared_get(const clattn_device *dev, const char *key)
{
    cl_program p = NULL;
    pthread_mutex_lock(&shared_lock);
    for (size_t i = 0; i < SHARED_SLOTS && !p; i++)
        if (shared[i].prog && shared[i].ctx == dev->context && shared[i].dev == dev->device &&
            strcmp(shared[i].key, key) == 0 && clRetainProgram(shared[i].prog) == CL_SUCCESS)
            p = shared[i].prog;
    pthread_mutex_unlock(&shared_lock);
    if (p) atomic_fetch_add(&n_shared, 1);
    return p;
}

/* Keep p for key on dev (the table's own reference; best effort: no memory, no entry). */
static void shared_put(const clattn_device *dev, const char *key, cl_program p)
{
    char *k = strdup(key);
    if (!k || clRetainProgram(p) != CL_SUCCESS) {
        free(k);
        return;
    }
    pthread_mutex_lock(&shared_lock);
    struct shared_program *e = &shared[shared_next];
    shared_next = (shared_next + 1) % SHARED_SLOTS;
    cl_program old = e->prog;
    char *old_key = e->key;
    *e = (struct shared_program){.ctx = dev->context, .dev = dev->device, .key = k, .prog = p};
    pthread_mutex_unlock(&shared_lock);
    if (old) clReleaseProgram(old);
    free(old_key);
}

void clattn_program_forget(cl_context context)
{
    pthread_mutex_lock(&shared_lock);
    for (size_t i = 0; i < SHARED_SLOTS; i++)
        if (shared[i].prog && shared[i].ctx == context) {
            clReleaseProgram(shared[i].prog);
            free(shared[i].key);
            shared[i] = (struct shared_program){0};
        }
    pthread_mutex_unlock(&shared_lock);
}

long clattn_test_programs_shared(int reset) { return reset ? atomic_exchange(&n_shared, 0) : atomic_load(&n_shared); }

/* ---- emitting (runtime.h, clattn_device_emit) */
#define EMIT_MAX 256
struct clattn_emit {
    pthread_mutex_t lock;
    char *dir;               /* NULL: not writing */
    int simulated;
    size_t n;                /* programs written */
    char *keys[EMIT_MAX];    /* their sources and options */
    char stems[EMIT_MAX][64];
};

/* The basename of a program's last source: "cores/flash_mma" -> "flash_mma". */
static void program_stem(const char *const *names, int count, char *stem, size_t len)
{
    const char *last = names[count - 1], *slash = strrchr(last, '/');
    snprintf(stem, len, "%s", slash ? slash + 1 : last);
}

/* dir/name written whole or not at all (clattn_write_parts): the parts in order. */
static clattn_status write_whole(const char *dir, const char *name, const char *const *parts, const size_t *lens,
                                 int nparts)
{
    char path[4400];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "emitting kernels: the path %s/%s is too long", dir, name);
    if (!clattn_write_parts(path, (const void *const *)parts, lens, nparts))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "emitting kernels: writing %s failed: %s", path,
                           strerror(errno));
    return CLATTN_STATUS_SUCCESS;
}

/* Write the program of `names` (texts, lens) built with `options` to the device's emit directory, once. */
static clattn_status emit_program(const clattn_device *dev, const char *const *names, const char *const *texts,
                                  const size_t *lens, int count, const char *options)
{
    struct clattn_emit *e = dev->emit;
    if (!e) return CLATTN_STATUS_SUCCESS;
    char key[1024];
    if (!shared_key(names, count, options, key, sizeof key))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "emitting kernels: the program's sources and options are "
                           "longer than %zu characters", sizeof key);
    clattn_status st = CLATTN_STATUS_SUCCESS;
    pthread_mutex_lock(&e->lock);
    int seen = !e->dir;
    for (size_t i = 0; i < e->n && !seen; i++) seen = strcmp(e->keys[i], key) == 0;
    if (!seen && e->n == EMIT_MAX)
        st = clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "emitting kernels: more than %d programs", EMIT_MAX);
    if (!seen && !st) {
        char base[48], stem[64], file[80], list[600] = "";
        program_stem(names, count, base, sizeof base);
        int same = 0;
        for (size_t i = 0; i < e->n; i++) {
            const size_t bl = strlen(base);
            same += strncmp(e->stems[i], base, bl) == 0 && (e->stems[i][bl] == '\0' || e->stems[i][bl] == '-');
        }
        if (same) snprintf(stem, sizeof stem, "%s-%d", base, same + 1);
        else snprintf(stem, sizeof stem, "%s", base);
        const char *opt_parts[] = {options ? options : "", "\n"};
        const size_t opt_lens[] = {strlen(opt_parts[0]), 1};
        snprintf(file, sizeof file, "%s.cl", stem);
        st = write_whole(e->dir, file, texts, lens, count);
        snprintf(file, sizeof file, "%s.opts", stem);
        if (!st) st = write_whole(e->dir, file, opt_parts, opt_lens, 2);
        for (int i = 0; i < count; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%scl/%s.cl", i ? " " : "", names[i]);
        if (!st) {
            char path[4400];
            snprintf(path, sizeof path, "%s/index.txt", e->dir);
            FILE *f = fopen(path, "a");
            int ok = f && fprintf(f, "%s.cl: %s\n", stem, list) >= 0;
            const int err = errno;
            ok = f && fclose(f) == 0 && ok;
            if (!ok) {
                st = clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "emitting kernels: cannot write %s: %s", path,
                                 strerror(err));
            } else {
                char *k = strdup(key);
                if (!k) st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "emitting kernels");
                else e->keys[e->n] = k, snprintf(e->stems[e->n], sizeof e->stems[0], "%s", stem), e->n++;
            }
        }
        if (st) { /* a program's files are in the index or gone */
            char path[4400];
            snprintf(path, sizeof path, "%s/%s.cl", e->dir, stem);
            remove(path);
            snprintf(path, sizeof path, "%s/%s.opts", e->dir, stem);
            remove(path);
        }
    }
    pthread_mutex_unlock(&e->lock);
    return st;
}

void clattn_emit_free(struct clattn_emit *e)
{
    if (!e) return;
    for (size_t i = 0; i < e->n; i++) free(e->keys[i]);
    free(e->dir);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

clattn_status clattn_emit_start(clattn_device *dev, const char *dir, int simulated)
{
    struct clattn_emit *e = dev->emit;
    if (!e) {
        if (!(e = clattn_calloc(1, sizeof *e))) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "emitting kernels");
        pthread_mutex_init(&e->lock, NULL);
        dev->emit = e;
    }
    char *d = NULL;
    if (dir && !(d = strdup(dir))) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "emitting kernels");
    pthread_mutex_lock(&e->lock);
    free(e->dir);
    e->dir = d;
    for (size_t i = 0; i < e->n; i++) free(e->keys[i]);
    e->n = 0;
    e->simulated = e->simulated || simulated;
    pthread_mutex_unlock(&e->lock);
    return CLATTN_STATUS_SUCCESS;
}

int clattn_device_simulated(const clattn_device *dev) { return dev->emit && dev->emit->simulated; }

clattn_status clattn_device_runs(const clattn_device *dev, const char *what)
{
    if (!clattn_device_simulated(dev)) return CLATTN_STATUS_SUCCESS;
    return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "%s: this device simulates another's capabilities "
                       "(clattn_device_emit): its plans are built to be read, not run", what);
}

/* The options the host compiles a simulated target's program with: the target's native instructions as their
 * emulation or portable form (flash_mma's MMA_NATIVE=1, the flash cores' EX2_PTX=1 and decode_group's SHFL_PTX=1 are
 * inline PTX only NVIDIA's compiler takes), the rest as the target's. */
static const char *host_options(const char *options, char *buf, size_t len)
{
    static const char *const native[] = {"-DMMA_NATIVE=1", "-DEX2_PTX=1", "-DSHFL_PTX=1"};
    if (!options || strlen(options) >= len) return options;
    snprintf(buf, len, "%s", options);
    int changed = 0;
    for (size_t i = 0; i < sizeof native / sizeof native[0]; i++) {
        char *at = strstr(buf, native[i]);
        if (at) at[strlen(native[i]) - 1] = '0', changed = 1;
    }
    return changed ? buf : options;
}

/* ---- a test's own sources (clattn_test_program_dir) */
static char *test_dir;

void clattn_test_program_dir(const char *dir)
{
    free(test_dir);
    test_dir = dir ? strdup(dir) : NULL;
}

/* The text of DIR/STEM.<ext> of the test's directory (NULL: none), NUL-terminated. */
static char *test_file(const char *stem, const char *ext, size_t *len)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s.%s", test_dir, stem, ext);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    char chunk[4096];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n + got + 1 > cap) {
            char *b = realloc(buf, cap = (n + got + 1) * 2);
            if (!b) break;
            buf = b;
        }
        memcpy(buf + n, chunk, got);
        n += got;
    }
    fclose(f);
    if (!buf) buf = calloc(1, 1);
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

static clattn_status build_texts(const clattn_device *dev, const char *const *names, const char **texts,
                                 size_t *lens, int count, const char *options, int quiet, int cached,
                                 cl_program *program);

/* Build (or load from the cache, when cached) the program of the embedded sources `names`. quiet: a failure
 * records no error and no build log (the caller only wants to know whether the device takes the source). */
static clattn_status build(const clattn_device *dev, const char *const *names, int count, const char *options,
                           int quiet, int cached, cl_program *program)
{
    enum { MAX_SOURCES = 12 };
    const char *texts[MAX_SOURCES];
    size_t lens[MAX_SOURCES];
    if (count < 1 || count > MAX_SOURCES)
        return quiet ? CLATTN_STATUS_INVALID_ARGUMENT
                     : clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "bad source count %d (1 to %d)", count,
                                   (int)MAX_SOURCES);
    for (int i = 0; i < count; i++) {
        const clattn_embedded_source *e = find_source(names[i]);
        if (!e)
            return quiet ? CLATTN_STATUS_INVALID_ARGUMENT
                         : clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "no embedded kernel source '%s'", names[i]);
        texts[i] = (const char *)e->text;
        lens[i] = *e->len;
    }
    if (!quiet) TRY(emit_program(dev, names, texts, lens, count, options));
    char host_buf[600];
    if (clattn_device_simulated(dev)) {
        options = host_options(options, host_buf, sizeof host_buf);
        cached = 0; /* what the host compiles for a target is not kept */
    }
    char *own_text = NULL;
    if (test_dir) { /* a test's own sources for this program (clattn_test_program_dir) */
        char stem[48];
        size_t olen = 0;
        program_stem(names, count, stem, sizeof stem);
        own_text = test_file(stem, "cl", &lens[0]);
        char *own_opts = own_text ? test_file(stem, "opts", &olen) : NULL;
        if (own_text) {
            if (own_opts && olen && own_opts[olen - 1] == '\n') own_opts[olen - 1] = '\0';
            snprintf(host_buf, sizeof host_buf, "%s", own_opts ? own_opts : "");
            free(own_opts);
            texts[0] = own_text, count = 1, options = host_buf, cached = 0;
        }
    }
    clattn_status st = build_texts(dev, names, texts, lens, count, options, quiet, cached, program);
    free(own_text);
    return st;
}

static clattn_status build_texts(const clattn_device *dev, const char *const *names, const char **texts,
                                 size_t *lens, int count, const char *options, int quiet, int cached,
                                 cl_program *program)
{
    char skey[1024];
    const int share = cached && shared_key(names, count, options, skey, sizeof skey);
    if (share && (*program = shared_get(dev, skey)) != NULL) return CLATTN_STATUS_SUCCESS;
    char key[2048] = "";
    if (cached) clattn_program_cache_key(dev, names, texts, lens, count, options, key, sizeof key);
    cl_program loaded = key[0] ? clattn_program_cache_load(dev, key, options) : NULL;
    if (loaded) {
        if (share) shared_put(dev, skey, loaded);
        *program = loaded;
        return CLATTN_STATUS_SUCCESS;
    }
    if (!quiet) clattn_notify_build(dev);
    cl_int err;
    cl_program p = clCreateProgramWithSource(dev->context, (cl_uint)count, texts, lens, &err);
    if (err != CL_SUCCESS)
        return quiet ? (clattn_status)err
                     : clattn_fail((clattn_status)err, "clCreateProgramWithSource failed (%d)", err);
    err = clBuildProgram(p, 1, &dev->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        if (quiet) {
            clReleaseProgram(p);
            return (clattn_status)err;
        }
        size_t size = 0;
        char *log = NULL;
        if (clGetProgramBuildInfo(p, dev->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size) == CL_SUCCESS &&
            (log = clattn_malloc(size + 1)) != NULL) {
            if (clGetProgramBuildInfo(p, dev->device, CL_PROGRAM_BUILD_LOG, size, log, NULL) != CL_SUCCESS)
                size = 0;
            log[size] = '\0';
        }
        clattn_set_build_log(log ? log : "(no build log)");
        free(log);
        clReleaseProgram(p);
        return clattn_fail(err == CL_BUILD_PROGRAM_FAILURE ? CLATTN_STATUS_BUILD_FAILURE : (clattn_status)err,
                           "building kernels '%s'%s with options \"%s\" failed (%d); see clattn_last_build_log()",
                           names[0], count > 1 ? " and others" : "", options ? options : "", err);
    }
    if (key[0]) clattn_program_cache_store(dev, key, p);
    if (share) shared_put(dev, skey, p);
    *program = p;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_program_build(const clattn_device *dev, const char *const *names, int count,
                                   const char *options, cl_program *program)
{
    return build(dev, names, count, options, 0, 1, program);
}

cl_program clattn_program_try_build(const clattn_device *dev, const char *const *names, int count,
                                    const char *options)
{
    cl_program p = NULL;
    return build(dev, names, count, options, 1, 1, &p) == CLATTN_STATUS_SUCCESS ? p : NULL;
}

cl_program clattn_program_try_build_uncached(const clattn_device *dev, const char *const *names, int count,
                                             const char *options)
{
    cl_program p = NULL;
    return build(dev, names, count, options, 1, 0, &p) == CLATTN_STATUS_SUCCESS ? p : NULL;
}

clattn_status clattn_kernel_create(cl_program prog, const char *name, cl_kernel *k)
{
    cl_int err;
    *k = clCreateKernel(prog, name, &err);
    if (err != CL_SUCCESS) {
        *k = NULL;
        return clattn_fail((clattn_status)err, "creating kernel %s failed (%d: %s)", name, err,
                           clattn_status_string(err));
    }
    return CLATTN_STATUS_SUCCESS;
}

void clattn_kernel_release(cl_kernel *k)
{
    if (*k) clReleaseKernel(*k);
    *k = NULL;
}

void clattn_program_release(cl_program *p)
{
    if (*p) clReleaseProgram(*p);
    *p = NULL;
}

size_t clattn_pow2_at_most(size_t n)
{
    size_t p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}

clattn_status clattn_program_build_wg(const clattn_device *dev, const char *const *names, int count,
                                      const char *options, const char *kernel, size_t *wg, cl_program *program,
                                      cl_kernel *k)
{
    size_t size = *wg > dev->caps.max_work_group ? clattn_pow2_at_most(dev->caps.max_work_group) : *wg;
    for (;;) {
        char opts[512];
        if (snprintf(opts, sizeof opts, "%s -DWG=%zu", options, size) >= (int)sizeof opts)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "build options too long");
        cl_program prog = NULL;
        TRY(clattn_program_build(dev, names, count, opts, &prog));
        cl_int err;
        cl_kernel kern = clCreateKernel(prog, kernel, &err);
        size_t allowed = 0;
        if (err == CL_SUCCESS)
            err = clGetKernelWorkGroupInfo(kern, dev->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof allowed, &allowed,
                                           NULL);
        if (clattn_device_simulated(dev)) allowed = dev->caps.max_work_group; /* the target's, not the host's */
        if (err == CL_SUCCESS && (size <= allowed || size == 1)) {
            *program = prog;
            *k = kern;
            *wg = size;
            return CLATTN_STATUS_SUCCESS;
        }
        if (kern) clReleaseKernel(kern);
        clReleaseProgram(prog);
        if (err != CL_SUCCESS)
            return clattn_fail((clattn_status)err, "creating kernel %s failed (%d: %s)", kernel, err,
                               clattn_status_string(err));
        size = clattn_pow2_at_most(allowed); /* the compiled kernel allows less than asked: rebuild smaller */
    }
}

