/*
 * test_npy.c: Criterion tests for the .npy reader/writer (src/util/npy.c).
 *
 * Build and run, e.g.:
 *   gcc -std=c11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined \
 *       -DCLATTN_TEST_DATA_DIR=\"$PWD/tests/data\" -Isrc/util tests/test_npy.c src/util/npy.c \
 *       -lcriterion -o /tmp/test_npy && /tmp/test_npy
 * Fixtures in tests/data/npy/ come from tests/data/npy/make_npy.py.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* mkstemp, close, unlink */
#endif

#include "npy.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CLATTN_TEST_DATA_DIR
#define CLATTN_TEST_DATA_DIR "tests/data"
#endif

#define ERRLEN 256

/* ---------------------------------------------------------------- helpers */

static const char *fixture(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/npy/%s", CLATTN_TEST_DATA_DIR, name);
    return path;
}

/* A fresh temporary file name (the file exists, empty). */
static void temp_path(char *buf, size_t cap)
{
    const char *dir = getenv("TMPDIR");
    if (dir == NULL || dir[0] == '\0')
        dir = "/tmp";
    snprintf(buf, cap, "%s/clattn_npy_XXXXXX", dir);
    int fd = mkstemp(buf);
    cr_assert(fd >= 0, "mkstemp failed for %s", buf);
    close(fd);
}

static void write_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    unsigned char *buf = malloc(1 << 16);
    cr_assert_not_null(buf);
    *n = fread(buf, 1, 1 << 16, f);
    fclose(f);
    return buf;
}

/* Build a .npy image: preamble for `major`.0, the dict text, space padding to
 * a multiple of 64 and '\n', then `ndata` data bytes. Returns a malloc'd
 * buffer. */
static unsigned char *make_npy(unsigned major, const char *dict, const void *data, size_t ndata,
                               size_t *size)
{
    size_t prefix = major == 1 ? 10 : 12;
    size_t len = strlen(dict);
    size_t total = (prefix + len + 1 + 63) / 64 * 64;
    unsigned char *buf = malloc(total + ndata + 1);
    cr_assert_not_null(buf);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    size_t hlen = total - prefix;
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    if (prefix == 12) {
        buf[10] = (unsigned char)(hlen >> 16);
        buf[11] = (unsigned char)(hlen >> 24);
    }
    memcpy(buf + prefix, dict, len);
    memset(buf + prefix + len, ' ', total - prefix - len - 1);
    buf[total - 1] = '\n';
    if (ndata > 0)
        memcpy(buf + total, data, ndata);
    *size = total + ndata;
    return buf;
}

static int is_zeroed(const clattn_npy *a)
{
    clattn_npy z;
    memset(&z, 0, sizeof z);
    return memcmp(a, &z, sizeof z) == 0;
}

/* Parse must fail, leave *out zeroed and give a NUL-terminated message
 * containing `want`. */
static void expect_parse_fail(const void *bytes, size_t size, const char *want)
{
    clattn_npy a;
    char err[ERRLEN];
    memset(err, 'x', sizeof err);
    memset(&a, 0xab, sizeof a);
    int rc = clattn_npy_parse(bytes, size, &a, err, sizeof err);
    cr_assert_neq(rc, 0, "parse succeeded, expected failure with \"%s\"", want);
    cr_assert(is_zeroed(&a), "out not zeroed on failure");
    cr_assert(memchr(err, '\0', sizeof err) != NULL, "err not NUL-terminated");
    cr_assert_gt(strlen(err), 0, "empty error message");
    cr_assert(strstr(err, want) != NULL, "error \"%s\" does not contain \"%s\"", err, want);
}

static void expect_dict_fail(const char *dict, const void *data, size_t ndata, const char *want)
{
    size_t size;
    unsigned char *buf = make_npy(1, dict, data, ndata, &size);
    expect_parse_fail(buf, size, want);
    free(buf);
}

static void expect_load_fail(const char *path, const char *want)
{
    clattn_npy a;
    char err[ERRLEN];
    memset(&a, 0xab, sizeof a);
    int rc = clattn_npy_load(path, &a, err, sizeof err);
    cr_assert_neq(rc, 0, "load of %s succeeded, expected failure", path);
    cr_assert(is_zeroed(&a));
    cr_assert_gt(strlen(err), 0);
    cr_assert(strstr(err, want) != NULL, "error \"%s\" does not contain \"%s\"", err, want);
}

static void load_ok(const char *path, clattn_npy *a)
{
    char err[ERRLEN];
    int rc = clattn_npy_load(path, a, err, sizeof err);
    cr_assert_eq(rc, 0, "load %s failed: %s", path, err);
    cr_assert_str_empty(err);
    cr_assert_not_null(a->data);
}

static void parse_dict_ok(const char *dict, const void *data, size_t ndata, clattn_npy *a)
{
    size_t size;
    char err[ERRLEN];
    unsigned char *buf = make_npy(1, dict, data, ndata, &size);
    int rc = clattn_npy_parse(buf, size, a, err, sizeof err);
    free(buf);
    cr_assert_eq(rc, 0, "parse of %s failed: %s", dict, err);
    cr_assert_not_null(a->data);
}

static const float f3[3] = {1.5f, -2.0f, 0.25f};

/* ---------------------------------------------------------------- round trip */

static void round_trip(int ndim, const size_t *shape)
{
    size_t count = 1;
    for (int d = 0; d < ndim; d++)
        count *= shape[d];
    float *v = malloc((count > 0 ? count : 1) * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < count; i++)
        v[i] = (float)i * 0.37f - 5.0f + (float)ndim;

    char path[512], err[ERRLEN];
    temp_path(path, sizeof path);
    int rc = clattn_npy_save_f32(path, v, ndim, shape, err, sizeof err);
    cr_assert_eq(rc, 0, "save failed: %s", err);
    cr_assert_str_empty(err);

    /* The header is numpy-shaped: version 1.0, multiple of 64, ends in '\n'. */
    size_t n;
    unsigned char *raw = read_file(path, &n);
    cr_assert_eq(memcmp(raw, "\x93NUMPY\x01\x00", 8), 0);
    size_t hlen = (size_t)raw[8] | ((size_t)raw[9] << 8);
    cr_assert_eq((10 + hlen) % 64, 0, "header not 64-byte aligned");
    cr_assert_eq(raw[10 + hlen - 1], '\n');
    cr_assert_eq(n, 10 + hlen + count * 4);
    free(raw);

    clattn_npy a;
    load_ok(path, &a);
    cr_assert_eq(a.dtype, CLATTN_NPY_F32);
    cr_assert_eq(a.ndim, ndim);
    for (int d = 0; d < ndim; d++)
        cr_assert_eq(a.shape[d], shape[d], "dim %d", d);
    for (int d = ndim; d < CLATTN_NPY_MAX_DIMS; d++)
        cr_assert_eq(a.shape[d], 0);
    cr_assert_eq(a.count, count);
    const float *got = a.data;
    for (size_t i = 0; i < count; i++)
        cr_assert_eq(memcmp(&got[i], &v[i], sizeof(float)), 0, "element %zu: %g != %g", i,
                     (double)got[i], (double)v[i]);
    clattn_npy_free(&a);
    cr_assert(is_zeroed(&a));
    unlink(path);
    free(v);
}

Test(npy_roundtrip, shape_0d) { round_trip(0, NULL); }
Test(npy_roundtrip, shape_0) { const size_t s[] = {0}; round_trip(1, s); }
Test(npy_roundtrip, shape_1) { const size_t s[] = {1}; round_trip(1, s); }
Test(npy_roundtrip, shape_7) { const size_t s[] = {7}; round_trip(1, s); }
Test(npy_roundtrip, shape_3x5) { const size_t s[] = {3, 5}; round_trip(2, s); }
Test(npy_roundtrip, shape_2x3x4) { const size_t s[] = {2, 3, 4}; round_trip(3, s); }
Test(npy_roundtrip, shape_8x1)
{
    const size_t s[] = {1, 1, 1, 1, 1, 1, 1, 1};
    round_trip(8, s);
}
Test(npy_roundtrip, shape_empty_middle) { const size_t s[] = {4, 0, 3}; round_trip(3, s); }

Test(npy_roundtrip, special_values)
{
    const float v[6] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f};
    const size_t shape[1] = {6};
    char path[512], err[ERRLEN];
    temp_path(path, sizeof path);
    cr_assert_eq(clattn_npy_save_f32(path, v, 1, shape, err, sizeof err), 0, "%s", err);
    clattn_npy a;
    load_ok(path, &a);
    cr_assert_eq(memcmp(a.data, v, sizeof v), 0);
    clattn_npy_free(&a);
    unlink(path);
}

/* ---------------------------------------------------------------- writer errors */

Test(npy_save, bad_arguments)
{
    char path[512], err[ERRLEN];
    temp_path(path, sizeof path);
    const size_t shape9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    cr_assert_neq(clattn_npy_save_f32(path, f3, 9, shape9, err, sizeof err), 0);
    cr_assert(strstr(err, "ndim 9") != NULL, "%s", err);
    cr_assert_neq(clattn_npy_save_f32(path, f3, -1, shape9, err, sizeof err), 0);
    cr_assert_neq(clattn_npy_save_f32(path, f3, 1, NULL, err, sizeof err), 0);
    cr_assert(strstr(err, "shape is NULL") != NULL, "%s", err);
    const size_t s3[1] = {3};
    cr_assert_neq(clattn_npy_save_f32(path, NULL, 1, s3, err, sizeof err), 0);
    cr_assert(strstr(err, "data is NULL") != NULL, "%s", err);
    const size_t huge[2] = {(size_t)1 << 62, (size_t)1 << 62};
    cr_assert_neq(clattn_npy_save_f32(path, f3, 2, huge, err, sizeof err), 0);
    cr_assert(strstr(err, "too large") != NULL, "%s", err);
    cr_assert_neq(clattn_npy_save_f32(NULL, f3, 1, s3, err, sizeof err), 0);
    /* NULL data is fine for an empty array. */
    const size_t s0[2] = {0, 5};
    cr_assert_eq(clattn_npy_save_f32(path, NULL, 2, s0, err, sizeof err), 0, "%s", err);
    unlink(path);
}

Test(npy_save, unwritable_path)
{
    char err[ERRLEN];
    const size_t s3[1] = {3};
    const char *path = "/nonexistent-clattn-dir/sub/x.npy";
    cr_assert_neq(clattn_npy_save_f32(path, f3, 1, s3, err, sizeof err), 0);
    cr_assert(strstr(err, "cannot create") != NULL, "%s", err);
    cr_assert(strstr(err, path) != NULL, "%s", err);
    FILE *f = fopen(path, "rb");
    cr_assert_null(f);
}

#ifdef __linux__
Test(npy_save, write_error_reported_device_not_removed)
{
    /* /dev/full opens fine and fails every write with ENOSPC. It is not a
     * regular file, so the writer must not remove it. */
    FILE *probe = fopen("/dev/full", "wb");
    if (probe == NULL)
        cr_skip_test("no writable /dev/full");
    fclose(probe);
    char err[ERRLEN];
    const size_t s3[1] = {3};
    cr_assert_neq(clattn_npy_save_f32("/dev/full", f3, 1, s3, err, sizeof err), 0);
    cr_assert(strstr(err, "cannot write '/dev/full'") != NULL, "%s", err);
    cr_assert_eq(access("/dev/full", F_OK), 0, "/dev/full was removed");
}
#endif

/* ---------------------------------------------------------------- numpy fixtures */

Test(npy_numpy, f32_2d)
{
    clattn_npy a;
    load_ok(fixture("f32_2d.npy"), &a);
    cr_assert_eq(a.dtype, CLATTN_NPY_F32);
    cr_assert_eq(a.ndim, 2);
    cr_assert_eq(a.shape[0], 3);
    cr_assert_eq(a.shape[1], 4);
    cr_assert_eq(a.count, 12);
    const float *f = a.data;
    for (size_t i = 0; i < 12; i++)
        cr_assert_float_eq(f[i], (float)i * 0.5f - 1.5f, 0.0f, "element %zu", i);
    clattn_npy_free(&a);
}

Test(npy_numpy, bool_2d)
{
    clattn_npy a;
    load_ok(fixture("bool_2d.npy"), &a);
    cr_assert_eq(a.dtype, CLATTN_NPY_BOOL);
    cr_assert_eq(a.ndim, 2);
    cr_assert_eq(a.shape[0], 2);
    cr_assert_eq(a.shape[1], 3);
    const unsigned char want[6] = {1, 0, 1, 0, 0, 1};
    cr_assert_eq(memcmp(a.data, want, 6), 0);
    clattn_npy_free(&a);
}

Test(npy_numpy, u8_1d)
{
    clattn_npy a;
    load_ok(fixture("u8_1d.npy"), &a);
    cr_assert_eq(a.dtype, CLATTN_NPY_U8);
    cr_assert_eq(a.ndim, 1);
    cr_assert_eq(a.shape[0], 5);
    const unsigned char want[5] = {0, 1, 127, 128, 255};
    cr_assert_eq(memcmp(a.data, want, 5), 0);
    clattn_npy_free(&a);
}

Test(npy_numpy, version_2_0)
{
    size_t n;
    unsigned char *raw = read_file(fixture("f32_v2.npy"), &n);
    cr_assert_eq(raw[6], 2, "fixture is not version 2.0");
    free(raw);
    clattn_npy a;
    load_ok(fixture("f32_v2.npy"), &a);
    cr_assert_eq(a.ndim, 2);
    cr_assert_eq(a.shape[0], 2);
    cr_assert_eq(a.shape[1], 3);
    const float *f = a.data;
    for (size_t i = 0; i < 6; i++)
        cr_assert_float_eq(f[i], (float)i + 0.25f, 0.0f);
    clattn_npy_free(&a);
}

Test(npy_numpy, zero_d)
{
    clattn_npy a;
    load_ok(fixture("f32_0d.npy"), &a);
    cr_assert_eq(a.ndim, 0);
    cr_assert_eq(a.count, 1);
    cr_assert_float_eq(*(const float *)a.data, 3.25f, 0.0f);
    clattn_npy_free(&a);
}

Test(npy_numpy, zero_dimension)
{
    clattn_npy a;
    load_ok(fixture("f32_empty.npy"), &a);
    cr_assert_eq(a.ndim, 3);
    cr_assert_eq(a.shape[0], 2);
    cr_assert_eq(a.shape[1], 0);
    cr_assert_eq(a.shape[2], 3);
    cr_assert_eq(a.count, 0);
    clattn_npy_free(&a);
}

Test(npy_numpy, big_endian_f32_is_swapped)
{
    clattn_npy a;
    load_ok(fixture("f32_be.npy"), &a);
    cr_assert_eq(a.dtype, CLATTN_NPY_F32);
    cr_assert_eq(a.ndim, 1);
    cr_assert_eq(a.shape[0], 5);
    const float *f = a.data;
    for (size_t i = 0; i < 5; i++)
        cr_assert_float_eq(f[i], (float)i * 1.25f - 2.0f, 0.0f, "element %zu", i);
    clattn_npy_free(&a);
}

Test(npy_numpy, float64_rejected)
{
    clattn_npy a;
    char err[ERRLEN];
    memset(&a, 0xab, sizeof a); /* is_zeroed below must see the loader's zeroing */
    cr_assert_neq(clattn_npy_load(fixture("f64_1d.npy"), &a, err, sizeof err), 0);
    cr_assert(is_zeroed(&a));
    cr_assert_str_eq(err, "dtype '<f8' not supported (expected float32 '<f4', float16 '<f2', uint16 '<u2', uint8 "
                          "'|u1', bool '|b1', int32 '<i4' or int64 '<i8'); save it with a.astype(np.float32)");
}

Test(npy_numpy, fortran_order_rejected)
{
    expect_load_fail(fixture("f32_fortran.npy"), "fortran_order True not supported");
}

/* Every prefix of a numpy-written file, through the file loader too. */
Test(npy_numpy, every_prefix_of_fixture_fails)
{
    size_t n;
    unsigned char *raw = read_file(fixture("f32_2d.npy"), &n);
    cr_assert_gt(n, 128);
    char path[512];
    temp_path(path, sizeof path);
    for (size_t k = 0; k < n; k++) {
        expect_parse_fail(raw, k, "truncated"); /* every prefix, whichever part it cuts */
        write_file(path, raw, k);
        expect_load_fail(path, "truncated");
    }
    write_file(path, raw, n);
    clattn_npy a;
    load_ok(path, &a);
    clattn_npy_free(&a);
    unlink(path);
    free(raw);
}

/* ---------------------------------------------------------------- truncation */

Test(npy_truncation, every_prefix_fails)
{
    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    clattn_npy a;
    char err[ERRLEN];
    cr_assert_eq(clattn_npy_parse(buf, size, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(a.data, f3, 12), 0);
    clattn_npy_free(&a);

    for (size_t k = 0; k < size; k++) {
        /* A fresh exact-size heap copy so that ASan sees any over-read. */
        unsigned char *p = malloc(k > 0 ? k : 1);
        cr_assert_not_null(p);
        memcpy(p, buf, k);
        expect_parse_fail(p, k, "truncated");
        if (k == 0)
            expect_parse_fail(NULL, 0, "truncated");
        free(p);
    }
    free(buf);
}

Test(npy_truncation, messages)
{
    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    clattn_npy a;
    char err[ERRLEN];
    cr_assert_neq(clattn_npy_parse(buf, size - 4, &a, err, sizeof err), 0);
    cr_assert_str_eq(err, "truncated: header says 12 data bytes, file has 8");
    cr_assert_neq(clattn_npy_parse(buf, 3, &a, err, sizeof err), 0);
    cr_assert(strstr(err, "truncated") != NULL, "%s", err);
    cr_assert_neq(clattn_npy_parse(buf, 40, &a, err, sizeof err), 0);
    cr_assert(strstr(err, "truncated: header length is 118 bytes, but only 30 bytes follow") !=
                  NULL,
              "%s", err);
    free(buf);

    /* The file loader reports the same. */
    buf = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    char path[512];
    temp_path(path, sizeof path);
    write_file(path, buf, size - 4);
    expect_load_fail(path, "truncated: header says 12 data bytes, file has 8");
    unlink(path);
    free(buf);
}

Test(npy_truncation, trailing_bytes_rejected)
{
    const float f4[4] = {1, 2, 3, 4};
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f4, 16,
                     "4 trailing bytes after the data");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f4, 13,
                     "1 trailing bytes after the data");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", f4, 4,
                     "4 trailing bytes");

    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f4, 16, &size);
    char path[512];
    temp_path(path, sizeof path);
    write_file(path, buf, size);
    expect_load_fail(path, "4 trailing bytes after the data");
    unlink(path);
    free(buf);
}

/* ---------------------------------------------------------------- garbage */

Test(npy_garbage, wrong_magic)
{
    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    buf[5] = 'Z';
    expect_parse_fail(buf, size, "bad magic (not a .npy file)");
    buf[5] = 'Y';
    buf[0] = 'P';
    expect_parse_fail(buf, size, "bad magic");
    expect_parse_fail(buf, 1, "bad magic");
    expect_parse_fail("PK\x03\x04 this is a zip", 20, "bad magic");
    free(buf);
}

Test(npy_garbage, bad_version)
{
    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    buf[6] = 9;
    buf[7] = 9;
    expect_parse_fail(buf, size, "unsupported .npy format version 9.9");
    buf[6] = 1;
    buf[7] = 1;
    expect_parse_fail(buf, size, "version 1.1");
    buf[6] = 0;
    buf[7] = 0;
    expect_parse_fail(buf, size, "version 0.0");
    free(buf);
}

Test(npy_garbage, header_length_beyond_file)
{
    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    buf[8] = 0xff;
    buf[9] = 0xff;
    expect_parse_fail(buf, size, "truncated: header length is 65535 bytes");
    free(buf);

    buf = make_npy(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    buf[8] = buf[9] = buf[10] = buf[11] = 0xff;
    expect_parse_fail(buf, size, "truncated: header length is 4294967295 bytes");
    buf[8] = buf[9] = buf[10] = buf[11] = 0;
    expect_parse_fail(buf, size, "header length is 0");
    free(buf);
}

Test(npy_garbage, missing_keys)
{
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, }", f3, 12,
                     "missing key 'shape'");
    expect_dict_fail("{'fortran_order': False, 'shape': (3,)}", f3, 12, "missing key 'descr'");
    expect_dict_fail("{'descr': '<f4', 'shape': (3,)}", f3, 12, "missing key 'fortran_order'");
    expect_dict_fail("{}", f3, 12, "missing key 'descr'");
}

Test(npy_garbage, duplicate_key)
{
    expect_dict_fail("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                     f3, 12, "duplicate key 'descr'");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), \"shape\": (3,)}",
                     f3, 12, "duplicate key 'shape'");
}

Test(npy_garbage, unknown_key)
{
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'foo': 1, }", f3,
                     12, "unknown key 'foo'");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'Shape': (3,), }", f3, 12,
                     "unknown key 'Shape'");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'descrx': 1}", f3,
                     12, "unknown key 'descrx'");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), "
                     "'a_very_long_key_name_that_goes_on_and_on_and_on': 1}",
                     f3, 12, "unknown key 'a_very_long_key");
}

Test(npy_garbage, shape_negative)
{
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3, -2), }", f3, 12,
                     "shape (3, -2) invalid");
}

Test(npy_garbage, shape_not_integer)
{
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 'a'), }", f3, 12,
                     "shape (3, 'a') invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3.0,), }", f3, 12,
                     "shape (3.0,) invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (0x3,), }", f3, 12,
                     "invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (03,), }", f3, 12,
                     "invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (1_0,), }", f3, 12,
                     "invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (+3,), }", f3, 12,
                     "invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (True,), }", f3, 12,
                     "invalid");
}

Test(npy_garbage, shape_not_a_tuple)
{
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", f3, 12,
                     "shape (3) invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': 3, }", f3, 12,
                     "shape 3 invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': [3], }", f3, 12,
                     "shape [3] invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (,), }", f3, 12,
                     "shape (,) invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,,), }", f3, 12,
                     "invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3 4), }", f3, 12,
                     "invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,", f3, 12,
                     "shape (3, invalid");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3, }", f3, 12,
                     "shape (3, invalid");
}

Test(npy_garbage, shape_nine_dims)
{
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (1, 1, 1, 1, 1, 1, 1, 1, 3), }",
                     f3, 12, "has 9 dimensions (at most 8 supported)");
}

Test(npy_garbage, shape_product_overflow)
{
    /* (2**62, 2**62) */
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (4611686018427387904, 4611686018427387904), }",
                     f3, 12, "too large");
    /* (2**62,) fits as a count but not times 4 bytes. */
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (4611686018427387904,), }",
                     f3, 12, "too large");
    /* numpy's rule: an empty array must still have a representable size. */
    expect_dict_fail("{'descr': '|u1', 'fortran_order': False, "
                     "'shape': (0, 4611686018427387904, 4611686018427387904), }",
                     f3, 0, "too large");
    /* A big but representable shape fails on the data size, without allocating. */
    expect_dict_fail("{'descr': '|u1', 'fortran_order': False, "
                     "'shape': (1000000000, 1000000000), }",
                     f3, 12, "truncated: header says 1000000000000000000 data bytes, file has 12");
}

Test(npy_garbage, shape_dimension_overflow)
{
    /* (10**30,) */
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (1000000000000000000000000000000,), }",
                     f3, 12, "too large");
    /* SIZE_MAX + 1 on 64-bit hosts. */
    expect_dict_fail("{'descr': '|u1', 'fortran_order': False, "
                     "'shape': (18446744073709551616,), }",
                     f3, 12, "too large");
}

Test(npy_garbage, unterminated_dict)
{
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), ", f3, 12,
                     "unterminated dict");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)", f3, 12,
                     "unterminated dict");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'desc", f3, 12,
                     "unterminated string");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape'", f3, 12,
                     "unterminated dict");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape':", f3, 12,
                     "shape <missing> invalid");
}

Test(npy_garbage, descr_not_a_string)
{
    expect_dict_fail("{'descr': 5, 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "descr is not a string");
    expect_dict_fail("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "descr is not a string (structured dtypes are not supported");
    expect_dict_fail("{'descr': f4, 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "descr is not a string");
}

Test(npy_garbage, unsupported_dtypes)
{
    expect_dict_fail("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "dtype '<f8' not supported");
    expect_dict_fail("{'descr': '<u4', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "dtype '<u4' not supported");
    expect_dict_fail("{'descr': '|i4', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "dtype '|i4' not supported");
    expect_dict_fail("{'descr': '<i1', 'fortran_order': False, 'shape': (3,), }", f3, 3,
                     "dtype '<i1' not supported");
    expect_dict_fail("{'descr': '|f2', 'fortran_order': False, 'shape': (3,), }", f3, 6,
                     "dtype '|f2' not supported");
    expect_dict_fail("{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }", f3, 6,
                     "dtype '<i2' not supported");
    expect_dict_fail("{'descr': '|f4', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "dtype '|f4' not supported");
    expect_dict_fail("{'descr': '<f4 ', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "dtype '<f4 ' not supported");
    expect_dict_fail("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "dtype '|O' not supported");
    expect_dict_fail("{'descr': '', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "dtype '' not supported");
    expect_dict_fail("{'descr': '<U1000000000000000000000000000000000000000000', "
                     "'fortran_order': False, 'shape': (3,), }",
                     f3, 12, "dtype '<U100000000000000000000000000000...' not supported");
}

Test(npy_garbage, fortran_order_values)
{
    expect_dict_fail("{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }", f3, 12,
                     "fortran_order must be True or False");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': false, 'shape': (3,), }", f3, 12,
                     "fortran_order must be True or False");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (3,), }", f3, 12,
                     "fortran_order must be True or False");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': 'False', 'shape': (3,), }", f3, 12,
                     "fortran_order must be True or False");
    const float f6[6] = {0};
    expect_dict_fail("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f6, 24,
                     "fortran_order True not supported");
}

Test(npy_garbage, other_syntax_errors)
{
    expect_dict_fail("{'descr' '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "expected ':' after a key");
    expect_dict_fail("{'descr': '<f4' 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "expected ',' or '}' after a value");
    expect_dict_fail("{'descr': '<f4',, 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "expected a quoted key or '}'");
    expect_dict_fail("{descr: '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "expected a quoted key");
    expect_dict_fail("['descr', '<f4']", f3, 12, "expected '{'");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }}", f3, 12,
                     "expected only whitespace after the dict");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } x", f3, 12,
                     "expected only whitespace after the dict");
    expect_dict_fail("{'descr': '<\\x66\\x34', 'fortran_order': False, 'shape': (3,), }", f3, 12,
                     "escape sequence");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), \x01}", f3, 12,
                     "unexpected byte 0x01");
    expect_dict_fail("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), \xc3\xa9}", f3, 12,
                     "unexpected byte 0xc3");
    expect_dict_fail("", f3, 12, "expected '{'");
}

Test(npy_garbage, header_without_newline)
{
    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    size_t last = 10 + ((size_t)buf[8] | ((size_t)buf[9] << 8)) - 1;
    cr_assert_eq(buf[last], '\n');
    buf[last] = ' ';
    expect_parse_fail(buf, size, "does not end with a newline");
    /* A NUL inside the header. */
    buf[last] = '\n';
    buf[last - 1] = '\0';
    expect_parse_fail(buf, size, "unexpected byte 0x00");
    free(buf);
}

/* Mutate every byte of a valid file to a few values: no crash, and either a
 * success or a failure with a message. (Run under ASan/UBSan.) */
Test(npy_garbage, single_byte_mutations)
{
    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    const unsigned char vals[] = {0x00, 0x01, '\n', ' ', '(', ')', ',', '\'', '9', '-', 0x7f,
                                  0x80, 0xff};
    unsigned char *p = malloc(size);
    cr_assert_not_null(p);
    for (size_t i = 0; i < size; i++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            memcpy(p, buf, size);
            p[i] = vals[v];
            clattn_npy a;
            char err[ERRLEN];
            memset(&a, 0xab, sizeof a);
            memset(err, 'x', sizeof err);
            int rc = clattn_npy_parse(p, size, &a, err, sizeof err);
            if (rc == 0) {
                cr_assert_not_null(a.data);
                cr_assert_str_empty(err);
                clattn_npy_free(&a);
            } else {
                cr_assert(is_zeroed(&a));
                cr_assert_gt(strlen(err), 0, "byte %zu = 0x%02x: empty message", i, vals[v]);
            }
        }
    }
    free(p);
    free(buf);
}

/* ---------------------------------------------------------------- accepted variants */

Test(npy_accept, header_variants)
{
    const char *dicts[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
        "{'shape': (3,), 'fortran_order': False, 'descr': '<f4'}",
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3,)}",
        "  {  'descr' : '<f4' ,\n 'fortran_order':False,'shape':( 3 , ) , }",
        "{'descr': '=f4', 'fortran_order': False, 'shape': (3,), }",
        "{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }",
    };
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
        clattn_npy a;
        parse_dict_ok(dicts[i], f3, 12, &a);
        cr_assert_eq(a.dtype, CLATTN_NPY_F32);
        cr_assert_eq(a.ndim, 1);
        cr_assert_eq(a.shape[0], 3);
        cr_assert_eq(memcmp(a.data, f3, 12), 0, "dict %zu", i);
        clattn_npy_free(&a);
    }
}

Test(npy_accept, fortran_true_when_layout_identical)
{
    const float f6[6] = {1, 2, 3, 4, 5, 6};
    clattn_npy a;
    parse_dict_ok("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 6, 1), }", f6, 24, &a);
    cr_assert_eq(a.count, 6);
    clattn_npy_free(&a);
    parse_dict_ok("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 0, 3), }", f6, 0, &a);
    cr_assert_eq(a.count, 0);
    clattn_npy_free(&a);
    parse_dict_ok("{'descr': '<f4', 'fortran_order': True, 'shape': (), }", f6, 4, &a);
    cr_assert_eq(a.count, 1);
    clattn_npy_free(&a);
}

Test(npy_accept, byte_dtypes_and_bool_normalised)
{
    const unsigned char bytes[5] = {0, 1, 2, 0x80, 0xff};
    const char *u8[] = {"|u1", "<u1", ">u1", "=u1"};
    for (size_t i = 0; i < 4; i++) {
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (5,), }",
                 u8[i]);
        clattn_npy a;
        parse_dict_ok(dict, bytes, 5, &a);
        cr_assert_eq(a.dtype, CLATTN_NPY_U8);
        cr_assert_eq(memcmp(a.data, bytes, 5), 0);
        clattn_npy_free(&a);
    }
    clattn_npy a;
    parse_dict_ok("{'descr': '|b1', 'fortran_order': False, 'shape': (5,), }", bytes, 5, &a);
    cr_assert_eq(a.dtype, CLATTN_NPY_BOOL);
    const unsigned char want[5] = {0, 1, 1, 1, 1};
    cr_assert_eq(memcmp(a.data, want, 5), 0);
    clattn_npy_free(&a);
}

Test(npy_accept, version_3_0_and_zero_d)
{
    size_t size;
    unsigned char *buf =
        make_npy(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f3, 4, &size);
    clattn_npy a;
    char err[ERRLEN];
    cr_assert_eq(clattn_npy_parse(buf, size, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(a.ndim, 0);
    cr_assert_eq(a.count, 1);
    cr_assert_float_eq(*(const float *)a.data, 1.5f, 0.0f);
    clattn_npy_free(&a);
    free(buf);
}

Test(npy_accept, explicit_big_endian_swap)
{
    const unsigned char be[8] = {0x3f, 0xc0, 0, 0, 0xc0, 0, 0, 0}; /* 1.5, -2.0 */
    clattn_npy a;
    parse_dict_ok("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", be, 8, &a);
    const float *f = a.data;
    cr_assert_float_eq(f[0], 1.5f, 0.0f);
    cr_assert_float_eq(f[1], -2.0f, 0.0f);
    clattn_npy_free(&a);
}

Test(npy_accept, unaligned_input_buffer)
{
    size_t size;
    unsigned char *buf =
        make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f3, 12, &size);
    unsigned char *p = malloc(size + 1);
    cr_assert_not_null(p);
    memcpy(p + 1, buf, size);
    clattn_npy a;
    char err[ERRLEN];
    cr_assert_eq(clattn_npy_parse(p + 1, size, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(a.data, f3, 12), 0);
    clattn_npy_free(&a);
    free(p);
    free(buf);
}

/* ---------------------------------------------------------------- error reporting */

Test(npy_errors, small_errlen)
{
    char err[8];
    memset(err, 'x', sizeof err);
    clattn_npy a;
    cr_assert_neq(clattn_npy_parse("nonsense", 8, &a, err, sizeof err), 0);
    cr_assert_eq(err[7], '\0');
    cr_assert_eq(strlen(err), 7);
    cr_assert_str_eq(err, "bad mag");

    char one[1] = {'x'};
    cr_assert_neq(clattn_npy_parse("nonsense", 8, &a, one, 1), 0);
    cr_assert_eq(one[0], '\0');

    memset(err, 'x', sizeof err);
    cr_assert_neq(clattn_npy_load("/nonexistent-clattn/x.npy", &a, err, sizeof err), 0);
    cr_assert_eq(err[7], '\0');
    cr_assert_eq(strlen(err), 7);

    /* NULL err or errlen 0: no crash, no write. */
    cr_assert_neq(clattn_npy_parse("nonsense", 8, &a, NULL, 0), 0);
    cr_assert_neq(clattn_npy_parse("nonsense", 8, &a, one, 0), 0);
}

Test(npy_errors, null_arguments)
{
    char err[ERRLEN];
    memset(err, 0, sizeof err);
    cr_assert_neq(clattn_npy_parse("x", 1, NULL, err, sizeof err), 0);
    cr_assert_gt(strlen(err), 0);
    clattn_npy a;
    memset(&a, 0xab, sizeof a);
    memset(err, 0, sizeof err);
    cr_assert_neq(clattn_npy_parse(NULL, 5, &a, err, sizeof err), 0);
    cr_assert(is_zeroed(&a));
    cr_assert_gt(strlen(err), 0);
    memset(&a, 0xab, sizeof a);
    memset(err, 0, sizeof err);
    cr_assert_neq(clattn_npy_load(NULL, &a, err, sizeof err), 0);
    cr_assert(is_zeroed(&a));
    cr_assert_gt(strlen(err), 0);
    clattn_npy_free(NULL);
    memset(&a, 0, sizeof a);
    clattn_npy_free(&a);
}

Test(npy_errors, load_failures)
{
    expect_load_fail("/nonexistent-clattn/x.npy", "cannot open '/nonexistent-clattn/x.npy'");
    expect_load_fail(CLATTN_TEST_DATA_DIR, "is not a regular file");
    char path[512];
    temp_path(path, sizeof path);
    expect_load_fail(path, "truncated");
    write_file(path, "hello world, not numpy", 22);
    expect_load_fail(path, "bad magic");
    unlink(path);
}

/* ---------------------------------------------------------------- 16-bit data (clattn run --dtype f16 / bf16) */

static int contains(const unsigned char *bytes, size_t n, const char *text)
{
    const size_t k = strlen(text);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(bytes + i, text, k) == 0) return 1;
    return 0;
}

/* '<i4' and '<i8' (clattn 0.8: the CLI's positions) read as int32 and int64, '>' byte-swapped, '=' as the host's
 * order; a truncated array refused */
Test(npy_int, read_and_swap)
{
    const int32_t i4[3] = {7, -2, 4194303};
    const int64_t i8[3] = {7, -2, (int64_t)1 << 40};
    const unsigned char be4[12] = {0, 0, 0, 7, 0xFF, 0xFF, 0xFF, 0xFE, 0, 0x3F, 0xFF, 0xFF};
    const unsigned char be8[24] = {0, 0, 0, 0, 0, 0, 0, 7, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE,
                                   0, 0, 0x01, 0, 0, 0, 0, 0};
    const struct {
        const char *descr;
        const void *data;
        size_t bytes;
        clattn_npy_dtype type;
        const void *want;
    } cases[] = {{"<i4", i4, 12, CLATTN_NPY_I32, i4}, {"=i4", i4, 12, CLATTN_NPY_I32, i4},
                 {">i4", be4, 12, CLATTN_NPY_I32, i4}, {"<i8", i8, 24, CLATTN_NPY_I64, i8},
                 {"=i8", i8, 24, CLATTN_NPY_I64, i8}, {">i8", be8, 24, CLATTN_NPY_I64, i8}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) { /* (the host is little-endian) */
        char dict[96];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (3,), }", cases[i].descr);
        clattn_npy a;
        parse_dict_ok(dict, cases[i].data, cases[i].bytes, &a);
        cr_assert_eq(a.dtype, cases[i].type, "%s", cases[i].descr);
        cr_assert_eq(a.count, 3, "%s", cases[i].descr);
        cr_assert(memcmp(a.data, cases[i].want, cases[i].bytes) == 0, "%s: values not as written", cases[i].descr);
        clattn_npy_free(&a);
        expect_dict_fail(dict, cases[i].data, cases[i].bytes - 1, "truncated");
    }
}

/* '<f2' and '<u2' read as their 16 bits, '>f2' and '>u2' byte-swapped, '=' as the host's order; a truncated 16-bit
 * array refused; written back as '<f2' / '<u2' and read again unchanged */
Test(npy_16bit, read_swap_and_write)
{
    const uint16_t h[3] = {0x3C00, 0xC000, 0x3400}; /* 1, -2, 0.25 as IEEE half */
    const unsigned char be[6] = {0x3C, 0x00, 0xC0, 0x00, 0x34, 0x00};
    const char *dicts[] = {"{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }",
                           "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }",
                           "{'descr': '=f2', 'fortran_order': False, 'shape': (3,), }"};
    const clattn_npy_dtype types[] = {CLATTN_NPY_F16, CLATTN_NPY_U16, CLATTN_NPY_F16};
    for (int i = 0; i < 3; i++) { /* (the host is little-endian: '=' reads as '<') */
        clattn_npy a;
        parse_dict_ok(dicts[i], h, 6, &a);
        cr_assert_eq(a.dtype, types[i]);
        cr_assert_eq(a.count, 3);
        cr_assert(memcmp(a.data, h, 6) == 0);
        clattn_npy_free(&a);
    }
    clattn_npy b;
    parse_dict_ok("{'descr': '>f2', 'fortran_order': False, 'shape': (3,), }", be, 6, &b);
    cr_assert(b.dtype == CLATTN_NPY_F16 && memcmp(b.data, h, 6) == 0, "big-endian halves not swapped");
    clattn_npy_free(&b);
    parse_dict_ok("{'descr': '>u2', 'fortran_order': False, 'shape': (3,), }", be, 6, &b);
    cr_assert(b.dtype == CLATTN_NPY_U16 && memcmp(b.data, h, 6) == 0, "big-endian uint16 not swapped");
    clattn_npy_free(&b);
    expect_dict_fail("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", h, 5, "truncated");
    for (int t = 0; t < 2; t++) {
        char path[512], tmp[600], err[ERRLEN];
        temp_path(path, sizeof path);
        const size_t shape[2] = {1, 3};
        const clattn_npy_dtype ty = t ? CLATTN_NPY_U16 : CLATTN_NPY_F16;
        cr_assert_eq(clattn_npy_save_temp(path, ty, h, 2, shape, tmp, sizeof tmp, err, sizeof err), 0, "%s", err);
        cr_assert_eq(rename(tmp, path), 0);
        size_t n;
        unsigned char *bytes = read_file(path, &n);
        cr_assert(contains(bytes, n, t ? "'<u2'" : "'<f2'"), "descr not written");
        free(bytes);
        clattn_npy a;
        load_ok(path, &a);
        cr_assert(a.dtype == ty && a.ndim == 2 && a.shape[1] == 3 && memcmp(a.data, h, 6) == 0);
        clattn_npy_free(&a);
        unlink(path);
    }
    char tmp[600], err[ERRLEN];
    const size_t shape[1] = {3};
    cr_assert_neq(clattn_npy_save_temp("/tmp/x.npy", CLATTN_NPY_U8, h, 1, shape, tmp, sizeof tmp, err, sizeof err), 0);
    cr_assert(strstr(err, "is not float32, float16 or uint16"), "%s", err);
}
