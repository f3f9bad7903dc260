/* fuzz_npy.c: libFuzzer harness for clattn_npy_parse (src/util/npy.c, no OpenCL needed).
 *
 * Each input is a whole .npy file. The parser must never crash, leak or read out of
 * bounds (AddressSanitizer), never hit undefined behaviour (UBSan), and:
 *   - on failure: return nonzero, leave the result zeroed and say why in a
 *     NUL-terminated message (also when the message buffer is tiny or absent);
 *   - on success: give a consistent array (dtype, rank, shape, count = product of
 *     the shape, data readable for count elements, bool data 0/1), err = "";
 *   - give the same verdict whatever the message buffer;
 *   - for float32 arrays: write them back with clattn_npy_save_f32 and read the
 *     same bytes again (round trip).
 * Any violated property aborts (a crash for libFuzzer). */
#include "npy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_npy: property violated: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static int all_zero(const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i]) return 0;
    return 1;
}

static size_t item_size(clattn_npy_dtype t)
{
    return t == CLATTN_NPY_I64 ? 8 : t == CLATTN_NPY_F32 || t == CLATTN_NPY_I32 ? 4
         : t == CLATTN_NPY_F16 || t == CLATTN_NPY_U16 ? 2 : 1;
}

/* Every property of a successful result; touches every data byte. */
static void check_array(const clattn_npy *a)
{
    CHECK(a->dtype == CLATTN_NPY_F32 || a->dtype == CLATTN_NPY_U8 || a->dtype == CLATTN_NPY_BOOL ||
          a->dtype == CLATTN_NPY_F16 || a->dtype == CLATTN_NPY_U16 || a->dtype == CLATTN_NPY_I32 ||
          a->dtype == CLATTN_NPY_I64);
    CHECK(a->ndim >= 0 && a->ndim <= CLATTN_NPY_MAX_DIMS);
    size_t count = 1;
    for (int i = 0; i < a->ndim; i++) count *= a->shape[i]; /* fits: the data is in memory */
    for (int i = a->ndim; i < CLATTN_NPY_MAX_DIMS; i++) CHECK(a->shape[i] == 0);
    CHECK(a->count == count);
    CHECK(a->data != NULL);
    const unsigned char *d = a->data;
    unsigned sum = 0;
    for (size_t i = 0; i < a->count * item_size(a->dtype); i++) sum += d[i];
    if (a->dtype == CLATTN_NPY_BOOL)
        for (size_t i = 0; i < a->count; i++) CHECK(d[i] == 0 || d[i] == 1);
    (void)sum;
}

static char tmp_path[64];

static void round_trip(const clattn_npy *a)
{
    if (a->dtype != CLATTN_NPY_F32 || a->count > 4096) return;
    if (!tmp_path[0]) snprintf(tmp_path, sizeof tmp_path, "/tmp/fuzz_npy.%ld.npy", (long)getpid());
    char err[256];
    CHECK(clattn_npy_save_f32(tmp_path, a->data, a->ndim, a->shape, err, sizeof err) == 0);
    clattn_npy b;
    CHECK(clattn_npy_load(tmp_path, &b, err, sizeof err) == 0);
    CHECK(b.dtype == CLATTN_NPY_F32 && b.ndim == a->ndim && b.count == a->count);
    CHECK(memcmp(b.shape, a->shape, sizeof a->shape) == 0);
    CHECK(memcmp(b.data, a->data, a->count * 4) == 0); /* bit patterns, NaN payloads included */
    clattn_npy_free(&b);
    unlink(tmp_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size heap copy, so that ASan sees any read past the end */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);

    clattn_npy a;
    char err[512];
    memset(&a, 0x5A, sizeof a);
    memset(err, 'x', sizeof err);
    int rc = clattn_npy_parse(size ? copy : NULL, size, &a, err, sizeof err);
    CHECK(memchr(err, '\0', sizeof err) != NULL);
    if (rc != 0) {
        CHECK(err[0] != '\0');
        CHECK(all_zero(&a, sizeof a));
    } else {
        CHECK(err[0] == '\0');
        check_array(&a);
    }

    /* the verdict does not depend on the message buffer */
    clattn_npy b;
    char tiny[1] = {'x'}, small[7];
    CHECK((clattn_npy_parse(size ? copy : NULL, size, &b, NULL, 0) != 0) == (rc != 0));
    clattn_npy_free(&b);
    CHECK((clattn_npy_parse(size ? copy : NULL, size, &b, tiny, sizeof tiny) != 0) == (rc != 0));
    CHECK(tiny[0] == '\0');
    clattn_npy_free(&b);
    CHECK((clattn_npy_parse(size ? copy : NULL, size, &b, small, sizeof small) != 0) == (rc != 0));
    CHECK(memchr(small, '\0', sizeof small) != NULL);
    clattn_npy_free(&b);

    if (rc == 0) round_trip(&a);
    clattn_npy_free(&a);
    CHECK(all_zero(&a, sizeof a));
    clattn_npy_free(&a); /* twice: safe on a zeroed struct */
    clattn_npy_free(NULL);
    free(copy);
    return 0;
}
