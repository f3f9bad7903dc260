/*
 * npy.c: strict NumPy .npy reader and float32 writer. See npy.h for the rules.
 *
 * Structure of a .npy file:
 *   "\x93NUMPY" major minor  len(2 bytes LE for 1.0, 4 bytes LE for 2.0/3.0)
 *   header (len bytes: a Python dict literal, space padded, ending in '\n')
 *   data   (count * itemsize bytes)
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* fileno, fstat */
#endif

#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#ifdef _WIN32
#include <io.h>
#else
#include <fcntl.h>
#include <unistd.h>
#endif

/* ---------------------------------------------------------------- helpers */

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    if (n < 0)
        err[0] = '\0';
    err[errlen - 1] = '\0';
}

static void clear_err(char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
}

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static void swap2_inplace(unsigned char *p, size_t count)
{
    for (size_t i = 0; i < count; i++, p += 2) {
        const unsigned char t = p[0];
        p[0] = p[1];
        p[1] = t;
    }
}

const char *clattn_npy_dtype_name(clattn_npy_dtype t)
{
    switch (t) {
    case CLATTN_NPY_F32: return "float32";
    case CLATTN_NPY_U8: return "uint8";
    case CLATTN_NPY_BOOL: return "bool";
    case CLATTN_NPY_F16: return "float16";
    case CLATTN_NPY_U16: return "uint16";
    case CLATTN_NPY_I32: return "int32";
    case CLATTN_NPY_I64: return "int64";
    }
    return "?";
}

static void swap8_inplace(unsigned char *p, size_t count)
{
    for (size_t i = 0; i < count; i++, p += 8)
        for (int k = 0; k < 4; k++) {
            const unsigned char t = p[k];
            p[k] = p[7 - k];
            p[7 - k] = t;
        }
}

static void swap4_inplace(unsigned char *p, size_t count)
{
    for (size_t i = 0; i < count; i++, p += 4) {
        unsigned char t = p[0];
        p[0] = p[3];
        p[3] = t;
        t = p[1];
        p[1] = p[2];
        p[2] = t;
    }
}

/* Copy at most `max` bytes of s[0..n) into dst (capacity cap >= 8) for use in
 * a message: non-printable and non-ASCII bytes become '?', and "..." marks a
 * cut. */
static void sanitize(char *dst, size_t cap, const char *s, size_t n, size_t max)
{
    size_t limit = n;
    int cut = 0;
    if (max > cap - 4)
        max = cap - 4;
    if (limit > max) {
        limit = max;
        cut = 1;
    }
    size_t j = 0;
    for (size_t i = 0; i < limit; i++) {
        unsigned char c = (unsigned char)s[i];
        dst[j++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (cut) {
        dst[j++] = '.';
        dst[j++] = '.';
        dst[j++] = '.';
    }
    dst[j] = '\0';
}

/* ---------------------------------------------------------------- preamble */

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* p holds the first min(total, 12) bytes of a file of `total` bytes. On
 * success *hstart is the offset of the header and *hlen its length, both
 * checked to fit inside the file. */
static int parse_preamble(const unsigned char *p, size_t total, size_t *hstart, size_t *hlen,
                          char *err, size_t errlen)
{
    size_t cmp = total < sizeof npy_magic ? total : sizeof npy_magic;
    if (memcmp(p, npy_magic, cmp) != 0) {
        set_err(err, errlen, "bad magic (not a .npy file)");
        return -1;
    }
    if (total < 8) {
        set_err(err, errlen, "truncated: file is %zu bytes, too short for the .npy preamble",
                total);
        return -1;
    }
    unsigned major = p[6], minor = p[7];
    size_t lenbytes;
    if (major == 1 && minor == 0) {
        lenbytes = 2;
    } else if ((major == 2 || major == 3) && minor == 0) {
        lenbytes = 4;
    } else {
        set_err(err, errlen,
                "unsupported .npy format version %u.%u (expected 1.0, 2.0 or 3.0)", major, minor);
        return -1;
    }
    size_t prefix = 8 + lenbytes;
    if (total < prefix) {
        set_err(err, errlen,
                "truncated: file is %zu bytes, too short for the version %u.0 preamble "
                "(%zu bytes)",
                total, major, prefix);
        return -1;
    }
    uint32_t len = (uint32_t)p[8] | ((uint32_t)p[9] << 8);
    if (lenbytes == 4)
        len |= ((uint32_t)p[10] << 16) | ((uint32_t)p[11] << 24);
    if (len == 0) {
        set_err(err, errlen, "header length is 0 (a .npy header cannot be empty)");
        return -1;
    }
    if ((uint64_t)len > (uint64_t)(total - prefix)) {
        set_err(err, errlen,
                "truncated: header length is %lu bytes, but only %zu bytes follow the preamble",
                (unsigned long)len, total - prefix);
        return -1;
    }
    if ((size_t)len > CLATTN_NPY_MAX_HEADER) {
        set_err(err, errlen, "header length %lu is larger than the %zu-byte limit",
                (unsigned long)len, (size_t)CLATTN_NPY_MAX_HEADER);
        return -1;
    }
    *hstart = prefix;
    *hlen = len;
    return 0;
}

/* ---------------------------------------------------------------- header dict */

typedef struct npy_header {
    clattn_npy_dtype dtype;
    size_t itemsize;
    int swap; /* float32 or 16-bit data in the other byte order */
    int fortran;
    int ndim;
    size_t shape[CLATTN_NPY_MAX_DIMS];
    size_t count;
    size_t nbytes;
    char shape_text[64]; /* the shape as written, for messages */
} npy_header;

typedef struct lexer {
    const char *s;
    size_t n;
    size_t i;
    char *err;
    size_t errlen;
} lexer;

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

static int is_ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static void skip_ws(lexer *L)
{
    while (L->i < L->n && is_ws(L->s[L->i]))
        L->i++;
}

/* "unexpected end of header" or "unexpected character 'x' at header offset N". */
static int unexpected(lexer *L, const char *expected)
{
    if (L->i >= L->n) {
        set_err(L->err, L->errlen,
                "malformed header: unexpected end of header, expected %s (unterminated dict)",
                expected);
    } else {
        unsigned char c = (unsigned char)L->s[L->i];
        if (c >= 0x20 && c < 0x7f)
            set_err(L->err, L->errlen,
                    "malformed header: unexpected character '%c' at header offset %zu, "
                    "expected %s",
                    (char)c, L->i, expected);
        else
            set_err(L->err, L->errlen,
                    "malformed header: unexpected byte 0x%02x at header offset %zu, expected %s",
                    (unsigned)c, L->i, expected);
    }
    return -1;
}

/* A single- or double-quoted string without escapes. Copies at most cap-1
 * bytes into buf (NUL-terminated); *len is the full length. */
static int read_string(lexer *L, char *buf, size_t cap, size_t *len, const char *what)
{
    if (L->i >= L->n || (L->s[L->i] != '\'' && L->s[L->i] != '"'))
        return unexpected(L, what);
    char q = L->s[L->i];
    size_t start = ++L->i;
    while (L->i < L->n && L->s[L->i] != q) {
        unsigned char c = (unsigned char)L->s[L->i];
        if (c == '\\') {
            set_err(L->err, L->errlen,
                    "malformed header: escape sequence in a string at header offset %zu "
                    "(not supported)",
                    L->i);
            return -1;
        }
        if (c == '\n')
            break; /* a string cannot span lines: reported as unterminated */
        if (c < 0x20 || c == 0x7f) {
            set_err(L->err, L->errlen,
                    "malformed header: control byte 0x%02x in a string at header offset %zu",
                    (unsigned)c, L->i);
            return -1;
        }
        L->i++;
    }
    if (L->i >= L->n || L->s[L->i] != q) {
        set_err(L->err, L->errlen,
                "malformed header: unterminated string starting at header offset %zu",
                start - 1);
        return -1;
    }
    size_t n = L->i - start;
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, L->s + start, k);
    buf[k] = '\0';
    *len = n;
    L->i++; /* closing quote */
    return 0;
}

/* the types the reader takes, as the messages list them */
#define NPY_EXPECTED "float32 '<f4', float16 '<f2', uint16 '<u2', uint8 '|u1', bool '|b1', int32 '<i4' or int64 '<i8'"

static int parse_descr(lexer *L, npy_header *h)
{
    if (L->i >= L->n || (L->s[L->i] != '\'' && L->s[L->i] != '"')) {
        if (L->i < L->n && L->s[L->i] == '[')
            set_err(L->err, L->errlen,
                    "descr is not a string (structured dtypes are not supported; expected " NPY_EXPECTED ")");
        else
            set_err(L->err, L->errlen, "descr is not a string (expected " NPY_EXPECTED ")");
        return -1;
    }
    size_t start = L->i + 1;
    char d[8];
    size_t len;
    if (read_string(L, d, sizeof d, &len, "a quoted descr") != 0)
        return -1;
    int le = host_is_little_endian();
    int ok = 0;
    if (len == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '=') && d[1] == 'f' && d[2] == '4') {
        h->dtype = CLATTN_NPY_F32;
        h->itemsize = 4;
        h->swap = d[0] == '<' ? !le : d[0] == '>' ? le : 0;
        ok = 1;
    } else if (len == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '=') && (d[1] == 'f' || d[1] == 'u') &&
               d[2] == '2') {
        h->dtype = d[1] == 'f' ? CLATTN_NPY_F16 : CLATTN_NPY_U16;
        h->itemsize = 2;
        h->swap = d[0] == '<' ? !le : d[0] == '>' ? le : 0;
        ok = 1;
    } else if (len == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '=') && d[1] == 'i' &&
               (d[2] == '4' || d[2] == '8')) {
        h->dtype = d[2] == '4' ? CLATTN_NPY_I32 : CLATTN_NPY_I64;
        h->itemsize = d[2] == '4' ? 4 : 8;
        h->swap = d[0] == '<' ? !le : d[0] == '>' ? le : 0;
        ok = 1;
    } else if (len == 3 && (d[0] == '|' || d[0] == '<' || d[0] == '>' || d[0] == '=') &&
               (d[1] == 'u' || d[1] == 'b') && d[2] == '1') {
        h->dtype = d[1] == 'u' ? CLATTN_NPY_U8 : CLATTN_NPY_BOOL;
        h->itemsize = 1;
        h->swap = 0;
        ok = 1;
    }
    if (!ok) {
        char shown[48];
        sanitize(shown, sizeof shown, L->s + start, len, 32);
        /* a float64 array (numpy's default) is the usual mistake: say how to fix it */
        const int f64 = len == 3 && (memcmp(d, "<f8", 3) == 0 || memcmp(d, ">f8", 3) == 0);
        set_err(L->err, L->errlen,
                "dtype '%s' not supported (expected " NPY_EXPECTED ")%s", shown,
                f64 ? "; save it with a.astype(np.float32)" : "");
        return -1;
    }
    return 0;
}

static int parse_fortran(lexer *L, npy_header *h)
{
    size_t start = L->i;
    while (L->i < L->n && is_ident(L->s[L->i]))
        L->i++;
    size_t n = L->i - start;
    if (n == 4 && memcmp(L->s + start, "True", 4) == 0) {
        h->fortran = 1;
    } else if (n == 5 && memcmp(L->s + start, "False", 5) == 0) {
        h->fortran = 0;
    } else {
        set_err(L->err, L->errlen, "fortran_order must be True or False");
        return -1;
    }
    return 0;
}

/* The shape text for messages: from `start` to the first ')' (inclusive), or
 * to the first '}' or line end (or ',' when the value does not start with
 * '('), without trailing whitespace. */
static void shape_snippet(const lexer *L, size_t start, char *dst, size_t cap)
{
    size_t end = start;
    int paren = start < L->n && L->s[start] == '(';
    while (end < L->n) {
        char c = L->s[end];
        if (paren && c == ')') {
            end++;
            break;
        }
        if (c == '}' || c == '\n' || (!paren && c == ','))
            break;
        end++;
    }
    while (end > start && is_ws(L->s[end - 1]))
        end--;
    if (end == start) {
        snprintf(dst, cap, "<missing>");
        return;
    }
    sanitize(dst, cap, L->s + start, end - start, 48);
}

static int parse_shape(lexer *L, npy_header *h)
{
    size_t start = L->i;
    size_t ndim = 0;
    int overflow = 0;
    int ok = 0;

    shape_snippet(L, start, h->shape_text, sizeof h->shape_text);
    if (L->i < L->n && L->s[L->i] == '(') {
        L->i++;
        skip_ws(L);
        if (L->i < L->n && L->s[L->i] == ')') {
            L->i++;
            ok = 1;
        }
        while (!ok) {
            /* one non-negative decimal integer */
            if (L->i >= L->n || !is_digit(L->s[L->i]))
                break; /* includes '-': negative dimensions are invalid */
            if (L->s[L->i] == '0' && L->i + 1 < L->n && is_digit(L->s[L->i + 1]))
                break; /* leading zero */
            size_t v = 0;
            while (L->i < L->n && is_digit(L->s[L->i])) {
                size_t d = (size_t)(L->s[L->i] - '0');
                if (v > (SIZE_MAX - d) / 10)
                    overflow = 1;
                else
                    v = v * 10 + d;
                L->i++;
            }
            if (L->i < L->n && (is_ident(L->s[L->i]) || L->s[L->i] == '.'))
                break; /* 5L, 5.0, 5e3, 0x5, 5j */
            if (ndim < CLATTN_NPY_MAX_DIMS)
                h->shape[ndim] = v;
            ndim++;
            skip_ws(L);
            if (L->i < L->n && L->s[L->i] == ',') {
                L->i++;
                skip_ws(L);
                if (L->i < L->n && L->s[L->i] == ')') {
                    L->i++;
                    ok = 1;
                }
            } else if (L->i < L->n && L->s[L->i] == ')') {
                if (ndim == 1)
                    break; /* (5) is an int, not a tuple */
                L->i++;
                ok = 1;
            } else {
                break;
            }
        }
    }
    if (!ok) {
        set_err(L->err, L->errlen,
                "shape %s invalid (expected a tuple of non-negative integers such as (3, 5), "
                "(5,) or ())",
                h->shape_text);
        return -1;
    }
    if (ndim > CLATTN_NPY_MAX_DIMS) {
        set_err(L->err, L->errlen, "shape %s has %zu dimensions (at most %d supported)",
                h->shape_text, ndim, CLATTN_NPY_MAX_DIMS);
        return -1;
    }
    if (overflow) {
        set_err(L->err, L->errlen, "shape %s too large (a dimension does not fit size_t)",
                h->shape_text);
        return -1;
    }
    h->ndim = (int)ndim;
    return 0;
}

enum { KEY_DESCR = 0, KEY_FORTRAN = 1, KEY_SHAPE = 2, NKEYS = 3 };
static const char *const key_names[NKEYS] = {"descr", "fortran_order", "shape"};

static int parse_dict(const char *s, size_t n, npy_header *h, char *err, size_t errlen)
{
    lexer L = {s, n, 0, err, errlen};
    int seen[NKEYS] = {0, 0, 0};

    memset(h, 0, sizeof *h);
    if (s[n - 1] != '\n') {
        set_err(err, errlen, "malformed header: the header does not end with a newline");
        return -1;
    }
    skip_ws(&L);
    if (L.i >= L.n || L.s[L.i] != '{')
        return unexpected(&L, "'{'");
    L.i++;
    for (;;) {
        skip_ws(&L);
        if (L.i < L.n && L.s[L.i] == '}') {
            L.i++;
            break;
        }
        char key[24];
        size_t keylen;
        size_t keystart = L.i + 1;
        if (read_string(&L, key, sizeof key, &keylen, "a quoted key or '}'") != 0)
            return -1;
        int k = -1;
        for (int j = 0; j < NKEYS; j++)
            if (keylen == strlen(key_names[j]) && strcmp(key, key_names[j]) == 0)
                k = j;
        if (k < 0) {
            char shown[48];
            sanitize(shown, sizeof shown, s + keystart, keylen, 32);
            set_err(err, errlen,
                    "unknown key '%s' in header (expected 'descr', 'fortran_order' and 'shape')",
                    shown);
            return -1;
        }
        if (seen[k]) {
            set_err(err, errlen, "duplicate key '%s' in header", key_names[k]);
            return -1;
        }
        seen[k] = 1;
        skip_ws(&L);
        if (L.i >= L.n || L.s[L.i] != ':')
            return unexpected(&L, "':' after a key");
        L.i++;
        skip_ws(&L);
        int rc = k == KEY_DESCR ? parse_descr(&L, h)
                 : k == KEY_FORTRAN ? parse_fortran(&L, h)
                                    : parse_shape(&L, h);
        if (rc != 0)
            return -1;
        skip_ws(&L);
        if (L.i < L.n && L.s[L.i] == ',') {
            L.i++;
            continue;
        }
        if (L.i < L.n && L.s[L.i] == '}') {
            L.i++;
            break;
        }
        return unexpected(&L, "',' or '}' after a value");
    }
    skip_ws(&L);
    if (L.i < L.n)
        return unexpected(&L, "only whitespace after the dict");
    for (int j = 0; j < NKEYS; j++) {
        if (!seen[j]) {
            set_err(err, errlen, "missing key '%s' in header", key_names[j]);
            return -1;
        }
    }

    /* Sizes: numpy's rule, the product of the non-zero dimensions times the
     * item size must fit, even when another dimension is 0. */
    size_t prod = h->itemsize;
    int zero = 0;
    for (int d = 0; d < h->ndim; d++) {
        size_t v = h->shape[d];
        if (v == 0) {
            zero = 1;
            continue;
        }
        if (prod > SIZE_MAX / v) {
            set_err(err, errlen, "shape %s too large (the data size overflows size_t)",
                    h->shape_text);
            return -1;
        }
        prod *= v;
    }
    h->nbytes = zero ? 0 : prod;
    h->count = h->nbytes / h->itemsize;

    if (h->fortran) {
        int big = 0;
        for (int d = 0; d < h->ndim; d++)
            if (h->shape[d] > 1)
                big++;
        if (big > 1 && h->count != 0) {
            set_err(err, errlen, "fortran_order True not supported (shape %s; save the array "
                                 "in C order, e.g. np.ascontiguousarray)",
                    h->shape_text);
            return -1;
        }
    }
    return 0;
}

static int check_data_size(size_t avail, const npy_header *h, char *err, size_t errlen)
{
    if (avail < h->nbytes) {
        set_err(err, errlen, "truncated: header says %zu data bytes, file has %zu", h->nbytes,
                avail);
        return -1;
    }
    if (avail > h->nbytes) {
        set_err(err, errlen, "%zu trailing bytes after the data (header says %zu data bytes)",
                avail - h->nbytes, h->nbytes);
        return -1;
    }
    return 0;
}

static void convert_data(unsigned char *data, const npy_header *h)
{
    if ((h->dtype == CLATTN_NPY_F32 || h->dtype == CLATTN_NPY_I32) && h->swap)
        swap4_inplace(data, h->count);
    if (h->dtype == CLATTN_NPY_I64 && h->swap)
        swap8_inplace(data, h->count);
    if ((h->dtype == CLATTN_NPY_F16 || h->dtype == CLATTN_NPY_U16) && h->swap)
        swap2_inplace(data, h->count);
    if (h->dtype == CLATTN_NPY_BOOL)
        for (size_t i = 0; i < h->count; i++)
            data[i] = data[i] != 0;
}

static void fill_result(clattn_npy *out, const npy_header *h, void *data)
{
    out->dtype = h->dtype;
    out->ndim = h->ndim;
    for (int d = 0; d < CLATTN_NPY_MAX_DIMS; d++)
        out->shape[d] = d < h->ndim ? h->shape[d] : 0;
    out->count = h->count;
    out->data = data;
}

/* ---------------------------------------------------------------- public reader */

int clattn_npy_parse(const void *bytes, size_t size, clattn_npy *out, char *err, size_t errlen)
{
    if (out == NULL) {
        set_err(err, errlen, "clattn_npy_parse: out is NULL");
        return -1;
    }
    memset(out, 0, sizeof *out);
    if (bytes == NULL && size != 0) {
        set_err(err, errlen, "clattn_npy_parse: bytes is NULL but size is %zu", size);
        return -1;
    }
    const unsigned char *p = bytes != NULL ? (const unsigned char *)bytes
                                           : (const unsigned char *)"";
    size_t hstart, hlen;
    if (parse_preamble(p, size, &hstart, &hlen, err, errlen) != 0)
        return -1;
    npy_header h;
    if (parse_dict((const char *)p + hstart, hlen, &h, err, errlen) != 0)
        return -1;
    if (check_data_size(size - hstart - hlen, &h, err, errlen) != 0)
        return -1;
    unsigned char *data = malloc(h.nbytes > 0 ? h.nbytes : 1);
    if (data == NULL) {
        set_err(err, errlen, "out of memory allocating %zu data bytes", h.nbytes);
        return -1;
    }
    if (h.nbytes > 0)
        memcpy(data, p + hstart + hlen, h.nbytes);
    convert_data(data, &h);
    fill_result(out, &h, data);
    clear_err(err, errlen);
    return 0;
}

/* Read exactly n bytes; on failure describe it. */
static int read_exact(FILE *f, void *buf, size_t n, const char *path, char *err, size_t errlen)
{
    size_t got = n > 0 ? fread(buf, 1, n, f) : 0;
    if (got == n)
        return 0;
    if (ferror(f))
        set_err(err, errlen, "read error on '%s': %s", path, strerror(errno));
    else
        set_err(err, errlen, "truncated: '%s' ended early (read %zu of %zu bytes; did the file "
                             "change while being read?)",
                path, got, n);
    return -1;
}

int clattn_npy_load(const char *path, clattn_npy *out, char *err, size_t errlen)
{
    if (out == NULL) {
        set_err(err, errlen, "clattn_npy_load: out is NULL");
        return -1;
    }
    memset(out, 0, sizeof *out);
    if (path == NULL) {
        set_err(err, errlen, "clattn_npy_load: path is NULL");
        return -1;
    }
#ifdef _WIN32
    FILE *f = fopen(path, "rb");
#else
    /* without blocking: a FIFO in a file's place is refused below instead of waiting for a writer */
    FILE *f = NULL;
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        struct stat pre_st;
        if (fstat(fd, &pre_st) == 0 && !S_ISREG(pre_st.st_mode)) {
            close(fd);
            set_err(err, errlen, "'%s' is not a regular file", path);
            return -1;
        }
        const int flags = fcntl(fd, F_GETFL);
        if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        if (!(f = fdopen(fd, "rb"))) close(fd);
    }
#endif
    if (f == NULL) {
        set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }

    int rc = -1;
    char *hbuf = NULL;
    unsigned char *data = NULL;
    unsigned long long fsize;
#ifdef _WIN32
    struct _stat64 st;
    if (_fstat64(_fileno(f), &st) != 0) {
        set_err(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        goto done;
    }
    if ((st.st_mode & _S_IFMT) != _S_IFREG) {
        set_err(err, errlen, "'%s' is not a regular file", path);
        goto done;
    }
#else
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        set_err(err, errlen, "cannot stat '%s': %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, "'%s' is not a regular file", path);
        goto done;
    }
#endif
    if (st.st_size < 0) {
        set_err(err, errlen, "'%s' has a negative size", path);
        goto done;
    }
    fsize = (unsigned long long)st.st_size;
    if (fsize > CLATTN_NPY_MAX_FILE_BYTES) {
        set_err(err, errlen, "'%s' is %llu bytes, larger than the 16 GiB limit", path, fsize);
        goto done;
    }
    if (fsize > (unsigned long long)SIZE_MAX) {
        set_err(err, errlen, "'%s' is %llu bytes, too large for this platform", path, fsize);
        goto done;
    }

    size_t total = (size_t)fsize;
    unsigned char pre[12];
    size_t npre = total < sizeof pre ? total : sizeof pre;
    if (read_exact(f, pre, npre, path, err, errlen) != 0)
        goto done;
    size_t hstart, hlen;
    if (parse_preamble(pre, total, &hstart, &hlen, err, errlen) != 0)
        goto done;
    /* hlen <= CLATTN_NPY_MAX_HEADER and fits the file: safe to allocate. */
    hbuf = malloc(hlen);
    if (hbuf == NULL) {
        set_err(err, errlen, "out of memory allocating a %zu-byte header", hlen);
        goto done;
    }
    if (fseek(f, (long)hstart, SEEK_SET) != 0) {
        set_err(err, errlen, "cannot seek in '%s': %s", path, strerror(errno));
        goto done;
    }
    if (read_exact(f, hbuf, hlen, path, err, errlen) != 0)
        goto done;
    npy_header h;
    if (parse_dict(hbuf, hlen, &h, err, errlen) != 0)
        goto done;
    /* The data size is checked against the real file size before allocating. */
    if (check_data_size(total - hstart - hlen, &h, err, errlen) != 0)
        goto done;
    data = malloc(h.nbytes > 0 ? h.nbytes : 1);
    if (data == NULL) {
        set_err(err, errlen, "out of memory allocating %zu data bytes", h.nbytes);
        goto done;
    }
    if (read_exact(f, data, h.nbytes, path, err, errlen) != 0)
        goto done;
    convert_data(data, &h);
    fill_result(out, &h, data);
    data = NULL;
    clear_err(err, errlen);
    rc = 0;

done:
    free(hbuf);
    free(data);
    fclose(f);
    return rc;
}

void clattn_npy_free(clattn_npy *a)
{
    if (a == NULL)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------- writer */

/* The header of a float32 array of this shape (into header, its length in *total) and the element count;
 * -1 and err naming `path` when the shape cannot be written. */
static int npy_header_of(const char *path, clattn_npy_dtype dtype, const void *data, int ndim, const size_t *shape,
                         unsigned char *header, size_t *total_out, size_t *count_out, char *err, size_t errlen)
{
    if (path == NULL) {
        set_err(err, errlen, "clattn_npy_save: path is NULL");
        return -1;
    }
    const char *descr = dtype == CLATTN_NPY_F32 ? "<f4" : dtype == CLATTN_NPY_F16 ? "<f2" : dtype == CLATTN_NPY_U16 ? "<u2" : NULL;
    const size_t itemsize = dtype == CLATTN_NPY_F32 ? 4 : 2;
    if (descr == NULL) {
        set_err(err, errlen, "cannot write '%s': dtype %d is not float32, float16 or uint16", path, (int)dtype);
        return -1;
    }
    if (ndim < 0 || ndim > CLATTN_NPY_MAX_DIMS) {
        set_err(err, errlen, "cannot write '%s': ndim %d out of range (0 to %d)", path, ndim,
                CLATTN_NPY_MAX_DIMS);
        return -1;
    }
    if (ndim > 0 && shape == NULL) {
        set_err(err, errlen, "cannot write '%s': shape is NULL but ndim is %d", path, ndim);
        return -1;
    }

    /* The same size rule as the reader, so that what we write we can read. */
    size_t prod = itemsize;
    int zero = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 0) {
            zero = 1;
            continue;
        }
        if (prod > SIZE_MAX / shape[d]) {
            set_err(err, errlen, "cannot write '%s': shape too large (the data size overflows "
                                 "size_t)",
                    path);
            return -1;
        }
        prod *= shape[d];
    }
    size_t count = zero ? 0 : prod / itemsize;
    if (count > 0 && data == NULL) {
        set_err(err, errlen, "cannot write '%s': data is NULL for %zu elements", path, count);
        return -1;
    }

    /* Dict text, as numpy writes it. At most 8 * 22 + ~60 characters. */
    char dict[512];
    size_t len = (size_t)snprintf(dict, sizeof dict,
                                  "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < ndim; d++)
        len += (size_t)snprintf(dict + len, sizeof dict - len, "%s%zu", d > 0 ? ", " : "",
                                shape[d]);
    len += (size_t)snprintf(dict + len, sizeof dict - len, "%s), }", ndim == 1 ? "," : "");

    /* Pad: preamble + dict + spaces + '\n' is a multiple of 64 bytes. */
    unsigned major = 1;
    size_t prefix = 10;
    size_t total = (prefix + len + 1 + 63) / 64 * 64;
    if (total - prefix > 65535) {
        major = 2;
        prefix = 12;
        total = (prefix + len + 1 + 63) / 64 * 64;
    }
    size_t hlen = total - prefix;
    memcpy(header, npy_magic, 6);
    header[6] = (unsigned char)major;
    header[7] = 0;
    header[8] = (unsigned char)(hlen & 0xff);
    header[9] = (unsigned char)((hlen >> 8) & 0xff);
    if (major == 2) {
        header[10] = (unsigned char)((hlen >> 16) & 0xff);
        header[11] = (unsigned char)((hlen >> 24) & 0xff);
    }
    memcpy(header + prefix, dict, len);
    memset(header + prefix + len, ' ', total - prefix - len - 1);
    header[total - 1] = '\n';

    *total_out = total;
    *count_out = count;
    return 0;
}

/* The header and the data to f; 0 on success, else the errno of the failure (or EIO). */
static int npy_write(FILE *f, const unsigned char *header, size_t total, const void *data, size_t count,
                     size_t itemsize)
{
    int ok = fwrite(header, 1, total, f) == total;
    if (ok && count > 0) {
        if (host_is_little_endian()) {
            ok = fwrite(data, itemsize, count, f) == count;
        } else {
            unsigned char buf[4096];
            const unsigned char *src = (const unsigned char *)data;
            size_t left = count;
            while (ok && left > 0) {
                size_t k = left < sizeof buf / itemsize ? left : sizeof buf / itemsize;
                memcpy(buf, src, k * itemsize);
                if (itemsize == 4) swap4_inplace(buf, k);
                else swap2_inplace(buf, k);
                ok = fwrite(buf, itemsize, k, f) == k;
                src += k * itemsize;
                left -= k;
            }
        }
    }
    int saved = ok ? 0 : (errno ? errno : EIO);
    if (ok && fflush(f) != 0) {
        ok = 0;
        saved = errno ? errno : EIO;
    }
    if (fclose(f) != 0 && ok) saved = errno ? errno : EIO;
    return saved;
}

int clattn_npy_save_f32(const char *path, const float *data, int ndim, const size_t *shape,
                        char *err, size_t errlen)
{
    unsigned char header[640];
    size_t total, count;
    if (npy_header_of(path, CLATTN_NPY_F32, data, ndim, shape, header, &total, &count, err, errlen) != 0) return -1;
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        set_err(err, errlen, "cannot create '%s': %s", path, strerror(errno));
        return -1;
    }
    /* Only a regular file is removed on failure (never /dev/stdout, a FIFO...). */
    int regular = 0;
#ifdef _WIN32
    struct _stat64 st;
    if (_fstat64(_fileno(f), &st) == 0 && (st.st_mode & _S_IFMT) == _S_IFREG)
        regular = 1;
#else
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode))
        regular = 1;
#endif
    const int saved = npy_write(f, header, total, data, count, 4);
    if (saved != 0) {
        if (regular)
            remove(path);
        set_err(err, errlen, "cannot write '%s': %s", path, strerror(saved));
        return -1;
    }
    clear_err(err, errlen);
    return 0;
}

#ifndef _WIN32
int clattn_npy_save_f32_temp(const char *path, const float *data, int ndim, const size_t *shape, char *tmp,
                             size_t tmplen, char *err, size_t errlen)
{
    return clattn_npy_save_temp(path, CLATTN_NPY_F32, data, ndim, shape, tmp, tmplen, err, errlen);
}

int clattn_npy_save_temp(const char *path, clattn_npy_dtype dtype, const void *data, int ndim, const size_t *shape,
                         char *tmp, size_t tmplen, char *err, size_t errlen)
{
    if (path == NULL || tmp == NULL) {
        set_err(err, errlen, "clattn_npy_save_temp: path or tmp is NULL");
        return -1;
    }
    unsigned char header[640];
    size_t total, count;
    if (npy_header_of(path, dtype, data, ndim, shape, header, &total, &count, err, errlen) != 0) return -1;
    if ((size_t)snprintf(tmp, tmplen, "%s.tmp.XXXXXX", path) >= tmplen) {
        set_err(err, errlen, "cannot write '%s': the path is too long", path);
        return -1;
    }
    const int fd = mkstemp(tmp); /* a new file, O_EXCL: never an existing file or a link */
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (f == NULL) {
        const int e = errno;
        if (fd >= 0) close(fd), unlink(tmp);
        set_err(err, errlen, "cannot create a temporary file beside '%s': %s", path, strerror(e));
        tmp[0] = '\0';
        return -1;
    }
    const int saved = npy_write(f, header, total, data, count, dtype == CLATTN_NPY_F32 ? 4 : 2);
    if (saved != 0) {
        unlink(tmp);
        tmp[0] = '\0';
        set_err(err, errlen, "cannot write '%s': %s", path, strerror(saved));
        return -1;
    }
    clear_err(err, errlen);
    return 0;
}
#endif
