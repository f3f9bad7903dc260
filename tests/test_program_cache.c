/* test_program_cache.c: the compiled-kernel cache on disk (src/runtime/program_cache.c). A second plan loads
 * its programs instead of compiling them; every kind of bad file (truncated, corrupted, another key, an
 * absurd length, a binary the driver refuses, an empty file, a directory in its place, an unwritable or
 * absent cache directory, the cache turned off, each field of the header wrong alone: the magic, the key
 * length, the checksum, bytes after it) falls back to compiling, computes the right answer
 * (against the float64 oracle), and, where it can, rewrites the file. The cache is trusted only when it is
 * private: a directory or entry others can write or that is not the user's, a link, a FIFO, a file moved
 * under another key with its checksum recomputed, is never loaded, and the notice says why. Each test has
 * its own directory. The key changes with each thing a program depends on (sources, options, device name,
 * vendor, driver). */
#include "runtime/runtime.h"
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/clattn_test_cache_XXXXXX");
    cr_assert(mkdtemp(dir));
    setenv("CLATTN_CACHE_DIR", dir, 1);
    unsetenv("CLATTN_PROGRAM_CACHE");
}

static void teardown(void)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                if (remove(p) != 0) rmdir(p);
            }
        closedir(d);
        rmdir(dir);
    }
}

TestSuite(cache, .init = setup, .fini = teardown, .timeout = 300);

/* The .bin files of the directory (at most cap), full paths. */
static size_t bins(char paths[][512], size_t cap)
{
    size_t n = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        const size_t l = strlen(e->d_name);
        if (l > 4 && strcmp(e->d_name + l - 4, ".bin") == 0) snprintf(paths[n++], 512, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    return n;
}

/* The small problem of these tests: a fused plan (GQA, causal) of B=2, T=9, E=8, H=2, HK=1, d=4, its weights and x. */
enum { PB = 2, PT = 9, PE = 8, PH = 2, PHK = 1, PD = 4 };
typedef struct small {
    clattn_attention_desc desc;
    clattn_attention_weights w;
    float *wq, *wk, *wv, *x;
} small;

static small small_make(uint64_t seed)
{
    tu_rng r = {seed};
    small s = {.desc = {.batch = PB, .seq_q = PT, .embed = PE, .heads = PH, .kv_heads = PHK, .head_dim_qk = PD,
                        .causal = 1, .algorithm = CLATTN_ALGORITHM_FUSED}};
    s.wq = tu_random(&r, PH * PD * PE, -0.5f, 0.5f), s.wk = tu_random(&r, PHK * PD * PE, -0.5f, 0.5f);
    s.wv = tu_random(&r, PHK * PD * PE, -0.5f, 0.5f), s.x = tu_random(&r, PB * PT * PE, -1, 1);
    s.w = (clattn_attention_weights){.w_query = s.wq, .w_key = s.wk, .w_value = s.wv};
    return s;
}

static void small_free(small *s) { free(s->wq), free(s->wk), free(s->wv), free(s->x); }

/* Run plan p of s, checked against the oracle. */
static void small_check(clattn_plan *p, small *s)
{
    const size_t n = PB * PT * PH * PD;
    float *out = tu_poisoned(n);
    clattn_attention_args a = {.x = s->x, .out = out};
    cr_assert_eq(tu_plan_execute(p, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    double want[PB * PT * PH * PD];
    cr_assert_eq(oracle_attention(&s->desc, &s->w, &a, want, NULL), 0);
    char msg[256];
    cr_assert_eq(oracle_compare(out, want, n, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s", msg);
    free(out);
}

/* The OpenCL device, opened in the test's directory, and the programs its opening built taken out of it: on NVIDIA's
 * OpenCL the inline-PTX and mma probes (runtime/caps.c) are compiled quietly and kept like any program, so the files
 * the tests count are the plans' alone. */
static clattn_device *open_device(void)
{
    clattn_device *dev = tu_open_opencl();
    char paths[16][512];
    const size_t n = bins(paths, 16);
    for (size_t i = 0; i < n; i++) cr_assert_eq(remove(paths[i]), 0, "%s", paths[i]);
    if (n) cr_log_info("%zu programs the device's opening kept, taken out", n);
    return dev;
}

/* One plan of the small problem created and run on the OpenCL device, checked against the oracle;
 * returns how many programs were loaded from the cache and how many compiled. */
static void plan_once(clattn_device *dev, long *loaded, long *built)
{
    small s = small_make(11);
    long l0, b0;
    clattn_program_forget(dev->context); /* as a new process: no program shared from an earlier plan */
    clattn_test_program_counts(1, &l0, &b0);
    clattn_plan *p = NULL;
    cr_assert_eq(tu_plan_create(dev, &s.desc, &s.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_test_program_counts(1, loaded, built);
    small_check(p, &s);
    clattn_plan_free(p);
    small_free(&s);
}

Test(cache, second_plan_loads_its_programs)
{
    clattn_device *dev = open_device();
    long loaded, built;
    plan_once(dev, &loaded, &built);
    cr_assert(built > 0 && loaded == 0, "cold: %ld built, %ld loaded", built, loaded);
    char paths[16][512];
    cr_assert_eq(bins(paths, 16), (size_t)built, "one file per compiled program");
    plan_once(dev, &loaded, &built);
    cr_assert(built == 0 && loaded > 0, "warm: %ld built, %ld loaded", built, loaded);
    clattn_device_free(dev);
}

/* Within a process, identical plans share their programs (runtime/program.c): the second builds and loads nothing,
 * and keeps computing after the first is freed; a device freed drops the table's references (LeakSanitizer, in the
 * sanitizer pass, sees any left). */
Test(cache, plans_share_programs)
{
    clattn_device *dev = open_device();
    long loaded, built;
    plan_once(dev, &loaded, &built);
    small s = small_make(12);
    clattn_plan *p1 = NULL, *p2 = NULL;
    cr_assert_eq(tu_plan_create(dev, &s.desc, &s.w, &p1), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_test_program_counts(1, &loaded, &built);
    clattn_test_programs_shared(1);
    cr_assert_eq(tu_plan_create(dev, &s.desc, &s.w, &p2), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_test_program_counts(1, &loaded, &built);
    cr_assert(built == 0 && loaded == 0, "the second plan: %ld built, %ld loaded", built, loaded);
    cr_assert_gt(clattn_test_programs_shared(1), 0, "the second plan shared no program");
    clattn_plan_free(p1);
    small_check(p2, &s); /* its programs outlive the first plan */
    clattn_plan_free(p2);
    /* another device on its own context shares nothing with this one */
    clattn_device *dev2 = tu_open_opencl(); /* (the files are not counted after this) */
    cr_assert_eq(tu_plan_create(dev2, &s.desc, &s.w, &p1), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(clattn_test_programs_shared(1), 0, "a program shared across contexts");
    clattn_plan_free(p1);
    clattn_device_free(dev2);
    clattn_device_free(dev);
    small_free(&s);
}

typedef enum damage {
    TRUNCATE, FLIP_BINARY, FLIP_KEY, HUGE_LENGTH, GARBAGE_BINARY, EMPTY, MAGIC, TRAILING, FLIP_SUM, KEY_LENGTH,
    DIRECTORY, NDAMAGE
} damage;
static const char *const damage_name[NDAMAGE] = {"truncated", "a flipped binary byte", "another key",
                                                 "a huge length", "a binary the driver refuses", "empty",
                                                 "the magic of format 1", "8 bytes after the checksum",
                                                 "a flipped checksum byte", "a key length one short",
                                                 "a directory in its place"};

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    cr_assert_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spill(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* fnv64 of a then b, as the file's checksum runs over the key, then the binary */
static uint64_t fnv2(const unsigned char *a, size_t na, const unsigned char *b, size_t nb)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < na; i++) h = (h ^ a[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < nb; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Apply the damage to one cache file, by its documented layout:
 * "CLATTN-PROGRAM 2\n", u64 key length, key, u64 binary length, binary, u64 fnv64(key, binary). */
static void hurt(const char *path, damage how)
{
    size_t n;
    unsigned char *b = slurp(path, &n);
    const size_t m = 17; /* strlen("CLATTN-PROGRAM 2\n") */
    cr_assert(memcmp(b, "CLATTN-PROGRAM 2\n", m) == 0, "not the documented magic");
    uint64_t klen, blen;
    memcpy(&klen, b + m, 8);
    memcpy(&blen, b + m + 8 + klen, 8);
    const size_t bin_at = m + 8 + klen + 8;
    cr_assert_eq(n, bin_at + blen + 8, "the file does not have the documented layout");
    switch (how) {
    case TRUNCATE: spill(path, b, n / 2); break;
    case FLIP_BINARY: b[bin_at + blen / 2] ^= 0x5a; spill(path, b, n); break;
    case FLIP_KEY: b[m + 8 + klen / 2] ^= 0x01; spill(path, b, n); break;
    case HUGE_LENGTH: {
        const uint64_t huge = (uint64_t)1 << 62;
        memcpy(b + m + 8 + klen, &huge, 8);
        spill(path, b, n);
        break;
    }
    case GARBAGE_BINARY: { /* the right key and a valid checksum around 1000 bytes that are no program */
        unsigned char *g = malloc(bin_at + 1000 + 8);
        memcpy(g, b, m + 8 + klen);
        const uint64_t len = 1000;
        memcpy(g + m + 8 + klen, &len, 8);
        for (size_t i = 0; i < 1000; i++) g[bin_at + i] = (unsigned char)(i * 37 + 11);
        const uint64_t sum = fnv2(b + m + 8, klen, g + bin_at, 1000);
        memcpy(g + bin_at + 1000, &sum, 8);
        spill(path, g, bin_at + 1000 + 8);
        free(g);
        break;
    }
    case EMPTY: spill(path, b, 0); break;
    case MAGIC: b[m - 2] = '1'; spill(path, b, n); break; /* each other field intact */
    case TRAILING: {
        unsigned char *t = malloc(n + 8);
        memcpy(t, b, n);
        memset(t + n, 0, 8);
        spill(path, t, n + 8);
        free(t);
        break;
    }
    case FLIP_SUM: b[n - 3] ^= 0x10; spill(path, b, n); break;
    case KEY_LENGTH: {
        const uint64_t shorter = klen - 1;
        memcpy(b + m, &shorter, 8);
        spill(path, b, n);
        break;
    }
    case DIRECTORY: cr_assert_eq(remove(path), 0); cr_assert_eq(mkdir(path, 0700), 0); break;
    default: break;
    }
    free(b);
}

Test(cache, bad_files_fall_back_to_compiling)
{
    clattn_device *dev = open_device();
    long loaded, built;
    for (int how = 0; how < NDAMAGE; how++) {
        if (how == GARBAGE_BINARY && strstr(clattn_device_name(dev), "[rusticl]")) { /* README, "Drivers with defects" */
            cr_log_info("not on rusticl: it aborts the process (a Rust panic) on a binary that is not its own; the "
                        "cache hands a driver only the files it wrote whose checksum holds, and this one is forged");
            continue;
        }
        plan_once(dev, &loaded, &built); /* the files exist (written now, or by the last round) */
        char paths[16][512];
        const size_t n = bins(paths, 16);
        cr_assert(n > 0);
        for (size_t i = 0; i < n; i++) hurt(paths[i], (damage)how);
        plan_once(dev, &loaded, &built);
        cr_assert(built == (long)n && loaded == 0, "%s: %ld built, %ld loaded of %zu files", damage_name[how], built,
                  loaded, n);
        if (how == DIRECTORY) { /* cannot be replaced: no cache for these programs, still right */
            plan_once(dev, &loaded, &built);
            cr_assert(built == (long)n, "a directory in place of the file: %ld built", built);
            /* the rename onto the directory failed: its temporary file is not left behind */
            DIR *dd = opendir(dir);
            struct dirent *e;
            while (dd && (e = readdir(dd)))
                cr_assert(!strstr(e->d_name, ".tmp."), "a temporary file was left: %s", e->d_name);
            if (dd) closedir(dd);
            for (size_t i = 0; i < n; i++) rmdir(paths[i]);
        } else { /* rewritten: the next plan loads again */
            plan_once(dev, &loaded, &built);
            cr_assert(built == 0 && loaded == (long)n, "%s: not rewritten (%ld built, %ld loaded)", damage_name[how],
                      built, loaded);
        }
    }
    clattn_device_free(dev);
}

Test(cache, off_absent_or_unusable_directory)
{
    clattn_device *dev = open_device();
    long loaded, built;
    char paths[16][512];
    setenv("CLATTN_PROGRAM_CACHE", "0", 1);
    plan_once(dev, &loaded, &built);
    cr_assert(built > 0 && loaded == 0);
    cr_assert_eq(bins(paths, 16), 0, "CLATTN_PROGRAM_CACHE=0 wrote files");
    unsetenv("CLATTN_PROGRAM_CACHE");
    /* a plain file where the directory should be */
    char file[128];
    snprintf(file, sizeof file, "%s/not-a-dir", dir);
    spill(file, "x", 1);
    setenv("CLATTN_CACHE_DIR", file, 1);
    plan_once(dev, &loaded, &built);
    cr_assert(built > 0 && loaded == 0);
    cr_assert(strstr(clattn_kernel_cache_notice(), "is not a directory"), "notice: '%s'", clattn_kernel_cache_notice());
    plan_once(dev, &loaded, &built);
    cr_assert(built > 0 && loaded == 0, "a file as the cache directory cannot hold a cache");
    /* a directory that does not exist yet: created */
    char sub[160];
    snprintf(sub, sizeof sub, "%s/a/b", dir);
    setenv("CLATTN_CACHE_DIR", sub, 1);
    plan_once(dev, &loaded, &built);
    plan_once(dev, &loaded, &built);
    cr_assert(built == 0 && loaded > 0, "a new nested directory was not used");
    clattn_device_free(dev);
    /* clean the nested directory for teardown */
    DIR *d = opendir(sub);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", sub, e->d_name), remove(p);
    if (d) closedir(d);
    rmdir(sub);
    snprintf(p, sizeof p, "%s/a", dir);
    rmdir(p);
}

/* The trust rules: a cache others can write, or that is not the user's, is not used; a link or a FIFO in an
 * entry's place is never opened as one (and a FIFO cannot hang the plan); the notice names the reason.
 * After each case the plan is right (the oracle, in plan_once), and a private cache works again. */
static void expect_refused(clattn_device *dev, const char *needle, const char *what, int whole)
{
    long loaded, built;
    plan_once(dev, &loaded, &built);
    if (whole) cr_assert(built > 0 && loaded == 0, "%s: %ld built, %ld loaded", what, built, loaded);
    else cr_assert(built == 1, "%s: %ld built, %ld loaded", what, built, loaded);
    cr_assert(strstr(clattn_kernel_cache_notice(), needle), "%s: notice '%s' lacks '%s'", what,
              clattn_kernel_cache_notice(), needle);
}

Test(cache, trusted_only_when_private)
{
    clattn_device *dev = open_device();
    long loaded, built;
    plan_once(dev, &loaded, &built); /* the files */
    char paths[16][512];
    const size_t n = bins(paths, 16);
    cr_assert(n > 0);
    /* the directory: writable by others (a sticky /tmp-like 1777), by the group */
    cr_assert_eq(chmod(dir, 01777), 0);
    expect_refused(dev, "written by others", "a directory mode 1777", 1);
    cr_assert_eq(chmod(dir, 0707), 0);
    expect_refused(dev, "written by others", "a directory mode 0707", 1);
    cr_assert_eq(chmod(dir, 0770), 0);
    expect_refused(dev, "written by its group", "a directory mode 0770", 1);
    cr_assert_eq(chmod(dir, 0700), 0);
    plan_once(dev, &loaded, &built);
    cr_assert(built == 0 && loaded > 0, "a private directory again: %ld built", built);
    /* an entry others can write: not loaded, then rewritten private */
    cr_assert_eq(chmod(paths[0], 0666), 0);
    plan_once(dev, &loaded, &built);
    cr_assert(built == 1, "an entry mode 0666: %ld built", built);
    cr_assert(strstr(clattn_kernel_cache_notice(), "entry"), "%s", clattn_kernel_cache_notice());
    struct stat st;
    cr_assert(stat(paths[0], &st) == 0 && (st.st_mode & 0077) == 0, "the entry was not rewritten private");
    /* a symbolic link in an entry's place, to a good copy: never followed */
    char copy[600];
    snprintf(copy, sizeof copy, "%s.copy", paths[0]);
    cr_assert_eq(rename(paths[0], copy), 0);
    cr_assert_eq(symlink(copy, paths[0]), 0);
    plan_once(dev, &loaded, &built);
    cr_assert(built == 1, "a link: %ld built", built);
    cr_assert(strstr(clattn_kernel_cache_notice(), "symbolic link"), "%s", clattn_kernel_cache_notice());
    cr_assert(lstat(paths[0], &st) == 0 && S_ISREG(st.st_mode), "the link was not replaced by a file");
    cr_assert_eq(remove(copy), 0);
    /* a FIFO: not opened for reading as an entry, no hang */
    cr_assert_eq(remove(paths[0]), 0);
    cr_assert_eq(mkfifo(paths[0], 0600), 0);
    plan_once(dev, &loaded, &built);
    cr_assert(built == 1, "a FIFO: %ld built", built);
    cr_assert(strstr(clattn_kernel_cache_notice(), "not a regular file"), "%s", clattn_kernel_cache_notice());
    /* another user's entry and directory (only root can make them) */
    if (geteuid() == 0) {
        cr_assert_eq(chown(paths[0], 4242, 4242), 0);
        expect_refused(dev, "belongs to uid 4242", "an entry of another user", 0);
        plan_once(dev, &loaded, &built); /* rewritten as ours */
        cr_assert_eq(chown(dir, 4242, 4242), 0);
        expect_refused(dev, "belongs to uid 4242", "a directory of another user", 1);
        cr_assert_eq(chown(dir, 0, 0), 0);
    } else {
        cr_log_info("not root: the foreign-owner cases need chown");
    }
    clattn_device_free(dev);
}

/* A file moved under another key, its key rewritten to that key and its checksum recomputed over the binary
 * (the old format's checksum): the checksum covers the key, so it is never loaded. */
Test(cache, moved_entry_with_recomputed_checksum)
{
    clattn_device *dev = open_device();
    long loaded, built;
    plan_once(dev, &loaded, &built);
    char paths[16][512];
    const size_t n = bins(paths, 16);
    cr_assert(n >= 2, "the plan builds several programs");
    size_t na, nb;
    unsigned char *a = slurp(paths[0], &na), *b = slurp(paths[1], &nb);
    const size_t m = 17;
    uint64_t ka, kb, blen;
    memcpy(&ka, a + m, 8);
    memcpy(&kb, b + m, 8);
    memcpy(&blen, a + m + 8 + ka, 8);
    /* B's header and key, A's binary, a checksum over the binary alone */
    const size_t total = m + 8 + kb + 8 + blen + 8;
    unsigned char *forged = malloc(total);
    memcpy(forged, b, m + 8 + kb);
    memcpy(forged + m + 8 + kb, &blen, 8);
    memcpy(forged + m + 8 + kb + 8, a + m + 8 + ka + 8, blen);
    uint64_t sum = fnv2(NULL, 0, a + m + 8 + ka + 8, blen);
    memcpy(forged + total - 8, &sum, 8);
    spill(paths[1], forged, total);
    plan_once(dev, &loaded, &built);
    cr_assert(built == 1 && loaded == (long)n - 1, "the forged entry: %ld built, %ld loaded", built, loaded);
    /* a valid entry of another key, copied to this key's path: its key is not this one */
    spill(paths[1], a, na);
    plan_once(dev, &loaded, &built);
    cr_assert(built == 1 && loaded == (long)n - 1, "another key's entry: %ld built, %ld loaded", built, loaded);
    free(a), free(b), free(forged);
    clattn_device_free(dev);
}

/* A valid entry of another key of the same length, copied to this key's place: its key is read and
 * compared, so it is never loaded (the length alone, or the checksum, would not tell). */
Test(cache, entry_of_another_key_of_the_same_length)
{
    clattn_device *dev = open_device();
    const char *src[] = {"common/half", "common/dtype", "attention/linear"};
    cl_program prog = NULL;
    cr_assert_eq(clattn_program_build(dev, src, 3, "-cl-std=CL1.2 -DVW=8", &prog), CLATTN_STATUS_SUCCESS);
    const char *key_a = "a test key: AAAA", *key_b = "a test key: BBBB";
    clattn_program_cache_store(dev, key_a, prog);
    clReleaseProgram(prog);
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%016llx.bin", dir,
             (unsigned long long)fnv2((const unsigned char *)key_a, strlen(key_a), NULL, 0));
    snprintf(pb, sizeof pb, "%s/%016llx.bin", dir,
             (unsigned long long)fnv2((const unsigned char *)key_b, strlen(key_b), NULL, 0));
    cl_program back = clattn_program_cache_load(dev, key_a, "-cl-std=CL1.2 -DVW=8");
    cr_assert_not_null(back, "the entry does not load under its own key");
    clReleaseProgram(back);
    size_t n;
    unsigned char *bytes = slurp(pa, &n);
    spill(pb, bytes, n);
    free(bytes);
    cr_assert_null(clattn_program_cache_load(dev, key_b, "-cl-std=CL1.2 -DVW=8"), "another key's entry was loaded");
    clattn_device_free(dev);
}

/* The key names everything a compiled program depends on: each source's text, the build options, the device's
 * name, vendor and driver (and clattn's version): change any one alone, and the key (so the file) changes. */
Test(cache, key_covers_every_input)
{
    clattn_device *dev = open_device();
    const char *names[2] = {"a.cl", "b.cl"};
    const char *texts[2] = {"kernel void f(global float *x) { x[0] = 1.0f; }", "kernel void g(void) {}"};
    size_t lens[2] = {strlen(texts[0]), strlen(texts[1])};
    char base[4096], k[4096];
    cr_assert(clattn_program_cache_key(dev, names, texts, lens, 2, "-DX=1", base, sizeof base));
    cr_assert(clattn_program_cache_key(dev, names, texts, lens, 2, "-DX=1", k, sizeof k));
    cr_assert_str_eq(k, base, "the same inputs give another key");
    const char *other[2] = {"kernel void f(global float *x) { x[0] = 2.0f; }", texts[1]}; /* same length */
    cr_assert(clattn_program_cache_key(dev, names, other, lens, 2, "-DX=1", k, sizeof k));
    cr_assert_str_neq(k, base, "a source's text is not in the key");
    cr_assert(clattn_program_cache_key(dev, names, texts, lens, 2, "-DX=2", k, sizeof k));
    cr_assert_str_neq(k, base, "the options are not in the key");
    clattn_device *copy = malloc(sizeof *copy);
    char *fields[3] = {copy->name, copy->caps.vendor, copy->caps.driver};
    static const char *const what[3] = {"name", "vendor", "driver"};
    for (int i = 0; i < 3; i++) {
        memcpy(copy, dev, sizeof *copy);
        fields[i][0] ^= 0x20; /* one character of one field */
        cr_assert(clattn_program_cache_key(copy, names, texts, lens, 2, "-DX=1", k, sizeof k));
        cr_assert_str_neq(k, base, "the device's %s is not in the key", what[i]);
    }
    free(copy);
    clattn_device_free(dev);
}

/* ---- clattn_device_emit: the programs a plan builds, written out */
TestSuite(emit, .init = setup, .fini = teardown, .timeout = 300);

/* A new empty directory under the suite's cache directory. */
static void emit_dir(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
    cr_assert_eq(mkdir(out, 0700), 0, "mkdir %s", out);
}

/* The files of an emit directory removed (teardown removes only plain files of the cache directory). */
static void emit_clear(const char *edir)
{
    DIR *d = opendir(edir);
    if (!d) return;
    struct dirent *e;
    char p[1000];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", edir, e->d_name), remove(p);
    closedir(d);
    rmdir(edir);
}

/* Each program index.txt lists: its .cl is its sources under cl/ concatenated, byte for byte, and its .opts one
 * line of options; *n: how many. The stem of the prefill core's program must be among them. */
static void emit_check_index(const char *edir, const char *core, size_t *n)
{
    char path[2000], line[1200];
    snprintf(path, sizeof path, "%s/index.txt", edir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    int has_core = 0;
    *n = 0;
    while (fgets(line, sizeof line, f)) {
        char *colon = strstr(line, ".cl: ");
        cr_assert(colon, "index line '%s'", line);
        *colon = '\0';
        has_core |= strcmp(line, core) == 0;
        size_t got_n = 0, want_n = 0;
        snprintf(path, sizeof path, "%s/%s.cl", edir, line);
        unsigned char *got = slurp(path, &got_n), *want = NULL;
        cr_assert(got, "no %s", path);
        char *save = NULL;
        for (char *src = strtok_r(colon + 5, " \n", &save); src; src = strtok_r(NULL, " \n", &save)) {
            snprintf(path, sizeof path, "%s/%s", CLATTN_CL_DIR, src + 3); /* "cl/..." */
            size_t k = 0;
            unsigned char *t = slurp(path, &k);
            cr_assert(t, "no source %s", path);
            want = realloc(want, want_n + k + 1);
            memcpy(want + want_n, t, k), want_n += k;
            free(t);
        }
        cr_assert(want_n == got_n && memcmp(got, want, got_n) == 0, "%s.cl is not its sources concatenated", line);
        free(got), free(want);
        snprintf(path, sizeof path, "%s/%s.opts", edir, line);
        size_t on = 0;
        unsigned char *opts = slurp(path, &on);
        cr_assert(opts && on > 1 && opts[on - 1] == '\n' && !memchr(opts, '\n', on - 1), "%s.opts: one line", line);
        free(opts);
        ++*n;
    }
    fclose(f);
    cr_assert(has_core, "index.txt does not name the core's program %s", core);
}

Test(emit, host_programs_build_the_same_plan)
{
    clattn_device *dev = open_device();
    char edir[600];
    emit_dir(edir, sizeof edir, "emit");
    cr_assert_eq(clattn_device_emit(dev, edir, NULL), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    small s = small_make(21);
    clattn_plan *p = NULL;
    cr_assert_eq(tu_plan_create(dev, &s.desc, &s.w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    char core[64];
    snprintf(core, sizeof core, "%s", clattn_plan_core(p));
    small_check(p, &s);
    clattn_plan_free(p);
    cr_assert_eq(clattn_device_emit(dev, NULL, NULL), CLATTN_STATUS_SUCCESS);
    size_t n = 0;
    emit_check_index(edir, core, &n);
    cr_assert_geq(n, 2, "a plan with projections builds its core's and the projections' programs (%zu)", n);

    /* the same plan built from the files alone computes the oracle's numbers */
    clattn_program_forget(dev->context);
    clattn_test_program_dir(edir);
    p = NULL;
    clattn_status st = tu_plan_create(dev, &s.desc, &s.w, &p);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "built from %s: %s", edir, clattn_last_error());
    small_check(p, &s);
    clattn_plan_free(p);
    /* and the files are what it was built from: a planted error in the core's program fails the build */
    char path[1000];
    snprintf(path, sizeof path, "%s/%s.cl", edir, core);
    FILE *f = fopen(path, "a");
    cr_assert(f);
    fputs("\n#error planted by the test\n", f);
    fclose(f);
    clattn_program_forget(dev->context);
    p = NULL;
    st = tu_plan_create(dev, &s.desc, &s.w, &p);
    clattn_test_program_dir(NULL);
    clattn_plan_free(p);
    cr_assert_eq(st, CLATTN_STATUS_BUILD_FAILURE, "a planted #error in %s built (%d)", path, st);
    clattn_program_forget(dev->context);
    small_free(&s);
    clattn_device_free(dev);
    emit_clear(edir);
}

Test(emit, simulated_target_emits_and_runs_nothing)
{
    clattn_device *dev = open_device();
    char edir[600];
    emit_dir(edir, sizeof edir, "sm90");
    cr_assert_eq(clattn_device_emit(dev, edir, "sm_99"), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(clattn_last_error(), "sm_90"), "%s", clattn_last_error());
    cr_assert_eq(clattn_device_emit(dev, "/nonexistent/clattn-emit", NULL), CLATTN_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(clattn_device_emit(dev, edir, "sm_90"), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const char *was = getenv("CLATTN_CORE");
    char saved[256] = "";
    if (was) snprintf(saved, sizeof saved, "%s", was);
    setenv("CLATTN_CORE", "flash_mma", 1);
    small s = small_make(22);
    clattn_plan *p = NULL;
    const clattn_status st = tu_plan_create(dev, &s.desc, &s.w, &p);
    if (was) setenv("CLATTN_CORE", saved, 1);
    else unsetenv("CLATTN_CORE");
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_str_eq(clattn_plan_core(p), "flash_mma");
    /* its options are the H100's: the tensor cores' native instructions, not the emulation the host built */
    char path[1000];
    snprintf(path, sizeof path, "%s/flash_mma.opts", edir);
    size_t on = 0;
    unsigned char *opts = slurp(path, &on);
    cr_assert(opts, "no %s", path);
    char *text = calloc(on + 1, 1);
    memcpy(text, opts, on);
    cr_assert(strstr(text, "-DMMA_NATIVE=1"), "%s: %s", path, text);
    free(text), free(opts);
    /* a decode plan: decode_group with the H100's warp shuffles (SHFL_PTX=1), which the host compiled portably */
    const clattn_attention_desc dd = {.batch = 1, .seq_q = 1, .embed = 32, .heads = 4, .kv_heads = 2, .causal = 1,
                                      .separate_value = 1};
    clattn_decode_plan *dp = NULL;
    cr_assert_eq(tu_decode_plan_create(dev, &dd, NULL, &dp), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_str_eq(clattn_decode_plan_core(dp), "decode_group");
    snprintf(path, sizeof path, "%s/decode_group.opts", edir);
    opts = slurp(path, &on);
    cr_assert(opts, "no %s", path);
    text = calloc(on + 1, 1);
    memcpy(text, opts, on);
    cr_assert(strstr(text, "-DSHFL_PTX=1"), "%s: %s", path, text);
    free(text), free(opts);
    clattn_decode_plan_free(dp);
    /* nothing runs on a simulated device, and no output is written */
    float *out = tu_poisoned(PB * PT * PH * PD);
    clattn_attention_args a = {.x = s.x, .out = out};
    const clattn_status run = tu_plan_execute(p, &a);
    cr_assert_eq(run, CLATTN_STATUS_UNSUPPORTED, "%d: %s", run, clattn_last_error());
    cr_assert(strstr(clattn_last_error(), "simulates"), "%s", clattn_last_error());
    for (size_t i = 0; i < PB * PT * PH * PD; i++) cr_assert(isnan(out[i]), "out[%zu] written", i);
    free(out);
    clattn_plan_free(p);
    small_free(&s);
    clattn_device_free(dev);
    emit_clear(edir);

    clattn_device *ref = tu_open_ref();
    cr_assert_eq(clattn_device_emit(ref, "/tmp", NULL), CLATTN_STATUS_UNSUPPORTED);
    clattn_device_free(ref);
}
