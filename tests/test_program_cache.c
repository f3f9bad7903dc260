/* test_program_cache.c: the compiled-kernel cache on disk (src/runtime/program_cache.c). A second plan loads
 * its programs instead of compiling them; every kind of bad file (truncated, corrupted, another key, an
 * absurd length, a binary the driver refuses, an empty file, a directory in its place, an unwritable or
 * absent cache directory, the cache turned off) falls back to compiling, computes the right answer
 * (against the float64 oracle), and, where it can, rewrites the file. Each test has its own directory. */
#include "runtime/runtime.h"
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* One fused plan (GQA, causal) created and run on the OpenCL device, checked against the oracle;
 * returns how many programs were loaded from the cache and how many compiled. */
static void plan_once(clattn_device *dev, long *loaded, long *built)
{
    tu_rng r = {11};
    const size_t B = 2, T = 9, E = 8, H = 2, HK = 1, d = 4;
    float *wq = tu_random(&r, H * d * E, -0.5f, 0.5f), *wk = tu_random(&r, HK * d * E, -0.5f, 0.5f);
    float *wv = tu_random(&r, HK * d * E, -0.5f, 0.5f), *x = tu_random(&r, B * T * E, -1, 1);
    clattn_attention_desc desc = {.batch = B, .seq_q = T, .embed = E, .heads = H, .kv_heads = HK, .head_dim_qk = d,
                                  .causal = 1, .algorithm = CLATTN_ALGORITHM_FUSED};
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv};
    long l0, b0;
    clattn_test_program_counts(1, &l0, &b0);
    clattn_plan *p = NULL;
    cr_assert_eq(clattn_plan_create(dev, &desc, &w, &p), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_test_program_counts(1, loaded, built);
    float *out = tu_poisoned(B * T * H * d);
    clattn_attention_args a = {.x = x, .out = out};
    cr_assert_eq(clattn_plan_execute(p, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    double want[2 * 9 * 8];
    cr_assert_eq(oracle_attention(&desc, &w, &a, want, NULL), 0);
    char msg[256];
    cr_assert_eq(oracle_compare(out, want, B * T * H * d, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "%s", msg);
    clattn_plan_free(p);
    free(wq), free(wk), free(wv), free(x), free(out);
}

Test(cache, second_plan_loads_its_programs)
{
    clattn_device *dev = tu_open_opencl();
    long loaded, built;
    plan_once(dev, &loaded, &built);
    cr_assert(built > 0 && loaded == 0, "cold: %ld built, %ld loaded", built, loaded);
    char paths[16][512];
    cr_assert_eq(bins(paths, 16), (size_t)built, "one file per compiled program");
    plan_once(dev, &loaded, &built);
    cr_assert(built == 0 && loaded > 0, "warm: %ld built, %ld loaded", built, loaded);
    clattn_device_free(dev);
}

typedef enum damage {
    TRUNCATE, FLIP_BINARY, FLIP_KEY, HUGE_LENGTH, GARBAGE_BINARY, EMPTY, DIRECTORY, NDAMAGE
} damage;
static const char *const damage_name[NDAMAGE] = {"truncated", "a flipped binary byte", "another key",
                                                 "a huge length", "a binary the driver refuses", "empty",
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

static uint64_t fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Apply the damage to one cache file, by its documented layout:
 * "CLATTN-PROGRAM 1\n", u64 key length, key, u64 binary length, binary, u64 fnv64(binary). */
static void hurt(const char *path, damage how)
{
    size_t n;
    unsigned char *b = slurp(path, &n);
    const size_t m = 17; /* strlen("CLATTN-PROGRAM 1\n") */
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
        const uint64_t sum = fnv(g + bin_at, 1000);
        memcpy(g + bin_at + 1000, &sum, 8);
        spill(path, g, bin_at + 1000 + 8);
        free(g);
        break;
    }
    case EMPTY: spill(path, b, 0); break;
    case DIRECTORY: cr_assert_eq(remove(path), 0); cr_assert_eq(mkdir(path, 0700), 0); break;
    default: break;
    }
    free(b);
}

Test(cache, bad_files_fall_back_to_compiling)
{
    clattn_device *dev = tu_open_opencl();
    long loaded, built;
    for (int how = 0; how < NDAMAGE; how++) {
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
    clattn_device *dev = tu_open_opencl();
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
