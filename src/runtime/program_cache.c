/* program_cache.c: compiled OpenCL programs on disk (clGetProgramInfo(CL_PROGRAM_BINARIES)), so that a
 * second process's first plan loads its kernels instead of compiling them, on drivers without a cache
 * of their own.
 *
 * One file per program: <dir>/<fnv64(key)>.bin, where the key names clattn's version, the device, its
 * vendor and driver, the build options and the sources (names and a hash of their text). The file:
 *   "CLATTN-PROGRAM 2\n", uint64 key length, the key, uint64 binary length, the binary,
 *   uint64 fnv64(key, binary)
 * (little-endian host order: the file is only ever read on the machine that wrote it). A file is used only
 * when all of it checks out; anything else (missing, short, a different key, a bad checksum, a length past
 * the file, a binary the driver refuses) falls back to compiling, which then rewrites the file. Writes go
 * to a temporary file renamed into place, so readers never see half a file. The cache is best effort:
 * its buffers come from plain malloc (not the library's fault-injected allocator), and when one is not
 * there the program is simply compiled.
 *
 * Trust. A cache entry is native code the driver will run, so the cache is used only when it is private:
 * the directory must be the user's and writable by nobody else; an entry is opened without following a
 * link and without blocking (a FIFO in its place cannot hang the caller), and must be a regular file of the
 * user's that nobody else may write. Anything else is not used, and clattn_kernel_cache_notice says why. */
#include "runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "CLATTN-PROGRAM 2\n"
#define MAX_KEY ((uint64_t)1 << 16)
#define MAX_BINARY ((uint64_t)1 << 29) /* 512 MiB: a larger length field is a corrupted file */

static _Atomic long n_loaded, n_built;
static clattn_build_notice_fn notice_fn;
static void *notice_user;

void clattn_set_build_notice(clattn_build_notice_fn fn, void *user)
{
    notice_user = user;
    notice_fn = fn;
}

void clattn_notify_build(const clattn_device *dev)
{
    atomic_fetch_add(&n_built, 1);
    if (notice_fn) notice_fn(dev->name, notice_user);
}

void clattn_test_program_counts(int reset, long *loaded, long *built)
{
    *loaded = reset ? atomic_exchange(&n_loaded, 0) : atomic_load(&n_loaded);
    *built = reset ? atomic_exchange(&n_built, 0) : atomic_load(&n_built);
}

/* ---- what the cache refused, and why */

static pthread_mutex_t notice_lock = PTHREAD_MUTEX_INITIALIZER;
static char refusal[600];

static void refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&notice_lock);
    vsnprintf(refusal, sizeof refusal, fmt, ap);
    pthread_mutex_unlock(&notice_lock);
    va_end(ap);
}

const char *clattn_kernel_cache_notice(void)
{
    static _Thread_local char copy[sizeof refusal];
    pthread_mutex_lock(&notice_lock);
    memcpy(copy, refusal, sizeof copy);
    pthread_mutex_unlock(&notice_lock);
    return copy;
}

/* Is st (of `what` at path) the user's, and writable by nobody else? If not, say why. */
static int private_to_user(const struct stat *st, const char *what, const char *path)
{
    if (st->st_uid != geteuid()) {
        refuse("the kernel cache's %s %s belongs to uid %u, not to this user (uid %u): not used", what, path,
               (unsigned)st->st_uid, (unsigned)geteuid());
        return 0;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        refuse("the kernel cache's %s %s can be written by %s (mode %03o): not used", what, path,
               st->st_mode & S_IWOTH ? "others" : "its group", (unsigned)(st->st_mode & 0777));
        return 0;
    }
    return 1;
}

static uint64_t fnv64(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
#define FNV0 0xcbf29ce484222325ull

uint64_t clattn_hash_text(const char *text) { return fnv64(FNV0, text, strlen(text)); }

/* The cache directory (created), or 0 when the cache is off or there is none. */
static int cache_dir(char *dir, size_t len)
{
    const char *off = getenv("CLATTN_PROGRAM_CACHE");
    if (off && strcmp(off, "0") == 0) return 0;
    const char *d = getenv("CLATTN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (d && *d) n = snprintf(dir, len, "%s", d);
    else if (xdg && *xdg) n = snprintf(dir, len, "%s/clattn/kernels", xdg);
    else if (home && *home) n = snprintf(dir, len, "%s/.cache/clattn/kernels", home);
    else return 0;
    if (n <= 0 || (size_t)n >= len) return 0;
    /* mkdir -p */
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) return 0;
        *p = '/';
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return 0;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        refuse("the kernel cache's directory %s is not a directory: not used", dir);
        return 0;
    }
    return private_to_user(&st, "directory", dir);
}

int clattn_program_cache_key(const clattn_device *dev, const char *const *names, const char *const *texts,
                             const size_t *lens, int count, const char *options, char *key, size_t len)
{
    key[0] = '\0';
    char dir[1024];
    if (!cache_dir(dir, sizeof dir)) return 0;
    uint64_t h = FNV0;
    char srcs[256] = "";
    for (int i = 0; i < count; i++) {
        h = fnv64(h, texts[i], lens[i]);
        snprintf(srcs + strlen(srcs), sizeof srcs - strlen(srcs), "%s%s", i ? "+" : "", names[i]);
    }
    int n = snprintf(key, len, "clattn %s\ndevice %s\nvendor %s\ndriver %s\noptions %s\nsources %s %016llx\n",
                     clattn_version(), dev->name, dev->caps.vendor, dev->caps.driver, options ? options : "", srcs,
                     (unsigned long long)h);
    if (n <= 0 || (size_t)n >= len) {
        key[0] = '\0';
        return 0;
    }
    return 1;
}

int clattn_cache_path(const char *key, const char *suffix, char *path, size_t len)
{
    char dir[1024];
    if (!cache_dir(dir, sizeof dir)) return 0;
    int n = snprintf(path, len, "%s/%016llx%s", dir, (unsigned long long)clattn_hash_text(key), suffix);
    return n > 0 && (size_t)n < len;
}

static int read_u64(FILE *f, uint64_t *v) { return fread(v, sizeof *v, 1, f) == 1; }

/* The entry at path for reading: a regular file of the user's that nobody else may write, opened without
 * following a link or blocking; NULL otherwise (why, in the notice, unless it is simply not there). */
FILE *clattn_cache_open(const char *path)
{
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP || errno == EMLINK) refuse("the kernel cache's entry %s is a symbolic link: not used", path);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        refuse("the kernel cache's entry %s is not a regular file: not used", path);
        close(fd);
        return NULL;
    }
    FILE *f = private_to_user(&st, "entry", path) ? fdopen(fd, "rb") : NULL;
    if (!f) close(fd);
    return f;
}

cl_program clattn_program_cache_load(const clattn_device *dev, const char *key, const char *options)
{
    char path[1200];
    if (!key[0] || !clattn_cache_path(key, ".bin", path, sizeof path)) return NULL;
    FILE *f = clattn_cache_open(path);
    if (!f) return NULL;
    cl_program prog = NULL;
    unsigned char *bin = NULL;
    char *k = NULL;
    char magic[sizeof MAGIC - 1];
    uint64_t klen = 0, blen = 0, sum = 0;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || fread(magic, 1, sizeof magic, f) != sizeof magic ||
        memcmp(magic, MAGIC, sizeof magic) != 0 || !read_u64(f, &klen) || klen != strlen(key) || klen > MAX_KEY)
        goto done;
    if (!(k = malloc(klen)) || fread(k, 1, klen, f) != klen || memcmp(k, key, klen) != 0) goto done;
    if (!read_u64(f, &blen) || blen == 0 || blen > MAX_BINARY || blen > (uint64_t)st.st_size) goto done;
    if (!(bin = malloc(blen)) || fread(bin, 1, blen, f) != blen || !read_u64(f, &sum) ||
        sum != fnv64(fnv64(FNV0, k, klen), bin, blen) || fgetc(f) != EOF)
        goto done;
    {
        const size_t size = (size_t)blen;
        const unsigned char *b = bin;
        cl_int bstatus = CL_SUCCESS, err;
        prog = clCreateProgramWithBinary(dev->context, 1, &dev->device, &size, &b, &bstatus, &err);
        if (err != CL_SUCCESS || bstatus != CL_SUCCESS) {
            if (prog) clReleaseProgram(prog);
            prog = NULL;
            goto done;
        }
        if (clBuildProgram(prog, 1, &dev->device, options, NULL, NULL) != CL_SUCCESS) {
            clReleaseProgram(prog);
            prog = NULL;
            goto done;
        }
        atomic_fetch_add(&n_loaded, 1);
    }
done:
    fclose(f);
    free(k);
    free(bin);
    return prog;
}

void clattn_program_cache_store(const clattn_device *dev, const char *key, cl_program program)
{
    (void)dev;
    char path[1200], tmp[1300];
    if (!key[0] || !clattn_cache_path(key, ".bin", path, sizeof path)) return;
    size_t size = 0;
    if (clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS || size == 0 ||
        size > MAX_BINARY)
        return;
    unsigned char *bin = malloc(size);
    if (!bin) return;
    unsigned char *bins[1] = {bin};
    if (clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) != CL_SUCCESS) {
        free(bin);
        return;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        free(bin);
        return;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        free(bin);
        return;
    }
    const uint64_t klen = strlen(key), blen = size, sum = fnv64(fnv64(FNV0, key, klen), bin, size);
    int ok = fwrite(MAGIC, 1, sizeof MAGIC - 1, f) == sizeof MAGIC - 1 && fwrite(&klen, sizeof klen, 1, f) == 1 &&
             fwrite(key, 1, klen, f) == klen && fwrite(&blen, sizeof blen, 1, f) == 1 &&
             fwrite(bin, 1, size, f) == size && fwrite(&sum, sizeof sum, 1, f) == 1;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
    free(bin);
}

int clattn_write_parts(const char *path, const void *const *parts, const size_t *lens, int nparts)
{
    char tmp[4500];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return 0;
    }
    const int fd = mkstemp(tmp);
    if (fd < 0) return 0;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        const int e = errno;
        close(fd);
        unlink(tmp);
        errno = e;
        return 0;
    }
    int ok = 1;
    for (int i = 0; i < nparts; i++) ok &= fwrite(parts[i], 1, lens[i], f) == lens[i];
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        errno = e;
        return 0;
    }
    return 1;
}

int clattn_cache_write(const char *path, const void *data, size_t n)
{
    return clattn_write_parts(path, &data, &n, 1);
}
