/*
 * npy.h: strict reader and writer for NumPy .npy files (internal to clattn).
 *
 * Reader
 *   - Format versions 1.0 (2-byte header length), 2.0 and 3.0 (4-byte
 *     length; 3.0 has a utf-8 header). Any other version is rejected.
 *   - The header must be a Python dict literal with exactly the keys 'descr',
 *     'fortran_order' and 'shape' (any order, optional whitespace, optional
 *     trailing comma, single- or double-quoted strings), followed only by
 *     whitespace, and its last byte must be '\n'. Unknown, duplicate or
 *     missing keys and anything else that is not such a literal are rejected.
 *     Headers longer than CLATTN_NPY_MAX_HEADER bytes are rejected.
 *   - descr: '<f4' (float32 little-endian), '>f4' (float32 big-endian: the
 *     data is byte-swapped), '=f4' (float32 in the host's byte order);
 *     '<f2', '>f2', '=f2' (float16, kept as its 16 bits) and '<u2', '>u2',
 *     '=u2' (uint16), byte-swapped likewise;
 *     '|u1', '<u1', '>u1', '=u1' (uint8); '|b1', '<b1', '>b1', '=b1' (bool);
 *     '<i4', '>i4', '=i4' (int32) and '<i8', '>i8', '=i8' (int64), byte-swapped
 *     likewise.
 *     Everything else (float64, structured dtypes, ...) is rejected with the
 *     dtype named in the message.
 *   - fortran_order must be False, except that True is accepted when the
 *     Fortran and C layouts are the same bytes: when at most one dimension is
 *     larger than 1, or the array is empty.
 *   - shape: a tuple of non-negative decimal integers: (), (5,), (3, 5), ...
 *     (no leading zeros, signs, underscores or other notation). At most
 *     CLATTN_NPY_MAX_DIMS dimensions; each dimension must fit size_t, and the
 *     product of the non-zero dimensions times the item size must fit size_t
 *     even when another dimension is 0 (numpy's own rule).
 *   - The data must be exactly count * itemsize bytes: fewer is "truncated",
 *     more is "N trailing bytes after the data".
 *   - Nothing is allocated from a header claim before it has been checked
 *     against the real size of the buffer or file. clattn_npy_load streams:
 *     it reads the preamble and header, checks the data size against the
 *     file size (fstat), then reads the data straight into its final buffer.
 *     Files larger than CLATTN_NPY_MAX_FILE_BYTES are refused.
 *   - bool data: any nonzero byte is normalised to 1.
 *
 * Writer
 *   - clattn_npy_save_f32 writes '<f4', fortran_order False, C order,
 *     version 1.0 (2.0 only if the header would not fit 65535 bytes), the
 *     header padded with spaces so that preamble + header is a multiple of 64
 *     bytes and ends in '\n' (as numpy does). It writes to `path` directly
 *     (no temporary file, so an existing file of that name is replaced); on
 *     failure it removes the partial file if it is a regular file (never a
 *     device such as /dev/stdout).
 *
 * All functions return 0 on success and -1 on failure. On failure they write
 * one sentence describing the problem into err (if err != NULL and
 * errlen > 0; always NUL-terminated, truncated to errlen - 1 characters).
 * On success err is set to "". They never print, exit or abort.
 * Messages that name a system error use strerror(), so they are not
 * guaranteed thread-safe on every C library.
 */
#ifndef CLATTN_NPY_H
#define CLATTN_NPY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum clattn_npy_dtype {
    CLATTN_NPY_F32 = 1,
    CLATTN_NPY_U8 = 2,
    CLATTN_NPY_BOOL = 3,
    CLATTN_NPY_F16 = 4,  /* '<f2': IEEE half, its bits as uint16 (host order) */
    CLATTN_NPY_U16 = 5,  /* '<u2': uint16 (the CLI's bfloat16 bit patterns) */
    CLATTN_NPY_I32 = 6,  /* '<i4': int32 (host order; the CLI's positions) */
    CLATTN_NPY_I64 = 7   /* '<i8': int64 (host order; NumPy's default integers) */
} clattn_npy_dtype;

#define CLATTN_NPY_MAX_DIMS 8

/* Largest header (the dict text after the preamble) the reader accepts. */
#define CLATTN_NPY_MAX_HEADER ((size_t)1 << 20)

/* Largest file clattn_npy_load accepts (16 GiB). */
#define CLATTN_NPY_MAX_FILE_BYTES ((unsigned long long)16 << 30)

typedef struct clattn_npy {
    clattn_npy_dtype dtype;
    int ndim;                          /* 0..8 */
    size_t shape[CLATTN_NPY_MAX_DIMS]; /* shape[ndim..7] are 0 */
    size_t count;                      /* product of shape (1 for 0-d, 0 if a dim is 0) */
    void *data;                        /* count elements, malloc'd; float for F32 (host order),
                                          uint16_t for F16 and U16, int32_t for I32,
                                          int64_t for I64 (host order),
                                          uint8 (0/1 for BOOL) for U8/BOOL. Never NULL on
                                          success: a 1-byte allocation when count == 0. */
} clattn_npy;

/* Parse a whole .npy file held in memory (the fuzzing entry point). `bytes`
 * may be NULL only when size is 0. The result owns a copy of the data.
 * On failure returns nonzero, leaves *out zeroed and describes the problem
 * in err. */
int clattn_npy_parse(const void *bytes, size_t size, clattn_npy *out, char *err, size_t errlen);

/* The NumPy name of a type: "float32", "float16", "uint16", "uint8", "bool", "int32", "int64" ("?" for another
 * value). */
const char *clattn_npy_dtype_name(clattn_npy_dtype t);

/* Read a .npy file. Same rules and results as clattn_npy_parse. */
int clattn_npy_load(const char *path, clattn_npy *out, char *err, size_t errlen);

/* Free the data and zero *a. Safe on a zeroed struct and on NULL. */
void clattn_npy_free(clattn_npy *a);

/* Write `data` (product of shape floats, C order; may be NULL when that
 * product is 0) as a float32 little-endian .npy file. ndim is 0..8; shape may
 * be NULL when ndim is 0. */
int clattn_npy_save_f32(const char *path, const float *data, int ndim, const size_t *shape,
                        char *err, size_t errlen);

/* The same for float32 (F32), float16 (F16: data holds the halves' bits) or uint16 (U16) data: '<f4', '<f2' or '<u2'
 * into a new temporary file, as clattn_npy_save_f32_temp below. */
int clattn_npy_save_temp(const char *path, clattn_npy_dtype dtype, const void *data, int ndim, const size_t *shape,
                         char *tmp, size_t tmplen, char *err, size_t errlen);

/* The same into a new temporary file beside `path` ("<path>.tmp.XXXXXX", made by mkstemp: never an
 * existing file or a link), its name in tmp; nothing is left behind on failure. The caller renames it to
 * `path` when every output is written (a link or a FIFO at `path` is then replaced, never followed), or
 * removes it. POSIX only. */
int clattn_npy_save_f32_temp(const char *path, const float *data, int ndim, const size_t *shape, char *tmp,
                             size_t tmplen, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* CLATTN_NPY_H */
