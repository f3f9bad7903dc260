/* cache.c: the KV cache (clattn.h, "KV cache and decoding"): per sequence b and key/value head g,
 * positions 0 .. capacity-1 of keys and values, (B, HK, capacity, dk | dv), in host memory on ref and in
 * device buffers (float, half or bfloat16) on OpenCL; each sequence's length lives on the host. */
#include "decode.h"

#include <stdlib.h>
#include <string.h>

size_t clattn_kv_elem_size(const clattn_kv_cache_desc *d)
{
    return d->type == CLATTN_KV_FLOAT ? 4 : d->type == CLATTN_KV_INT8 ? 1 : 2;
}

/* Bytes of an INT8 cache's scales (0 for the other types): a float per row of keys and per row of values. */
static size_t scale_bytes(const clattn_kv_cache_desc *d)
{
    return d->type == CLATTN_KV_INT8 ? d->batch * d->kv_heads * d->capacity * 2 * sizeof(float) : 0;
}

clattn_status clattn_kv_cache_create(clattn_device *device, const clattn_kv_cache_desc *desc, clattn_kv_cache **cache)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    *cache = NULL;
    if (!device) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "device is NULL");
    if (!desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "desc is NULL");
    clattn_kv_cache_desc d = *desc;
    if (d.type != CLATTN_KV_FLOAT && d.type != CLATTN_KV_HALF && d.type != CLATTN_KV_BF16 && d.type != CLATTN_KV_INT8)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "type %d is not CLATTN_KV_FLOAT, CLATTN_KV_HALF, "
                           "CLATTN_KV_BF16 or CLATTN_KV_INT8", (int)d.type);
    if (d.batch == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "batch must be >= 1");
    if (d.capacity == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "capacity must be >= 1");
    if (d.kv_heads == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "kv_heads must be >= 1");
    if (d.head_dim_qk == 0) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "head_dim_qk must be >= 1");
    if (d.head_dim_v == 0) d.head_dim_v = d.head_dim_qk;
    if (d.capacity > 0xFFFFFFFFu || d.batch > 0xFFFFFFFFu || d.kv_heads > 0xFFFFFFFFu)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "capacity, batch and kv_heads must fit 32 bits");
    size_t nk, nv, t;
    if (clattn_mul_overflows(d.batch, d.kv_heads, &t) || clattn_mul_overflows(t, d.capacity, &t) ||
        clattn_mul_overflows(t, d.head_dim_qk, &nk) || clattn_mul_overflows(t, d.head_dim_v, &nv) ||
        clattn_mul_overflows(nk + nv, 4, &t) || nk + nv < nk)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "the cache's size overflows size_t");

    clattn_kv_cache *c = clattn_calloc(1, sizeof *c);
    if (!c) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache");
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "creating the cache's lock");
    }
    c->device = device;
    c->d = d;
    c->len = clattn_calloc(d.batch, sizeof *c->len);
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (!c->len) {
        st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache lengths");
    } else if (device->backend == CLATTN_BACKEND_REF) {
        c->k_host = clattn_calloc(nk, sizeof(float));
        c->v_host = clattn_calloc(nv, sizeof(float));
        if (!c->k_host || !c->v_host)
            st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache (%zu floats)", nk + nv);
    } else {
        const size_t es = clattn_kv_elem_size(&d), rows = d.batch * d.kv_heads * d.capacity;
        if ((nk + nv) * es + scale_bytes(&d) > device->caps.global_mem)
            st = clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "the cache needs %zu bytes, more than the device's "
                             "global memory (%zu bytes)", (nk + nv) * es + scale_bytes(&d), device->caps.global_mem);
        else if ((st = clattn_buffer_new(device, nk, es, NULL, "the key cache", &c->k)) == CLATTN_STATUS_SUCCESS)
            st = clattn_buffer_new(device, nv, es, NULL, "the value cache", &c->v);
        if (st == CLATTN_STATUS_SUCCESS && d.type == CLATTN_KV_INT8 &&
            (st = clattn_buffer_new(device, rows, 4, NULL, "the key cache's scales", &c->ks)) == CLATTN_STATUS_SUCCESS)
            st = clattn_buffer_new(device, rows, 4, NULL, "the value cache's scales", &c->vs);
    }
    if (st != CLATTN_STATUS_SUCCESS) {
        clattn_kv_cache_free(c);
        return st;
    }
    *cache = c;
    return CLATTN_STATUS_SUCCESS;
}

void clattn_kv_cache_free(clattn_kv_cache *cache)
{
    if (!cache) return;
    clattn_mem_release(&cache->k);
    clattn_mem_release(&cache->v);
    clattn_mem_release(&cache->ks);
    clattn_mem_release(&cache->vs);
    free(cache->k_host);
    free(cache->v_host);
    free(cache->len);
    pthread_mutex_destroy(&cache->lock);
    free(cache);
}

clattn_status clattn_kv_cache_desc_get(const clattn_kv_cache *cache, clattn_kv_cache_desc *desc)
{
    clattn_clear_error();
    if (!cache || !desc) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache or desc is NULL");
    *desc = cache->d;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_reset(clattn_kv_cache *cache)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    pthread_mutex_lock(&cache->lock);
    for (size_t b = 0; b < cache->d.batch; b++) cache->len[b] = 0;
    pthread_mutex_unlock(&cache->lock);
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status truncate_locked(clattn_kv_cache *cache, const size_t *lengths)
{
    for (size_t b = 0; b < cache->d.batch; b++)
        if (lengths[b] > cache->len[b])
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "truncate: lengths[%zu] = %zu is more than the "
                               "sequence's length %zu (truncation only drops the tail)", b, lengths[b], cache->len[b]);
    for (size_t b = 0; b < cache->d.batch; b++) cache->len[b] = lengths[b];
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_truncate(clattn_kv_cache *cache, const size_t *lengths)
{
    clattn_clear_error();
    if (!cache || !lengths) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache or lengths is NULL");
    pthread_mutex_lock(&cache->lock);
    const clattn_status st = truncate_locked(cache, lengths);
    pthread_mutex_unlock(&cache->lock);
    return st;
}

/* Row (b, g, pos) of one tensor (keys or values, D elements of es bytes) to (b, g, to), on the device or the host. */
static clattn_status move_row(clattn_kv_cache *c, cl_mem m, float *host, size_t D, size_t es, size_t row_from,
                              size_t row_to)
{
    if (host) {
        memmove(host + row_to * D, host + row_from * D, D * sizeof *host);
        return CLATTN_STATUS_SUCCESS;
    }
    const cl_int err = clEnqueueCopyBuffer(c->device->queue, m, m, row_from * D * es, row_to * D * es, D * es, 0, NULL,
                                           NULL);
    if (err != CL_SUCCESS)
        return clattn_fail((clattn_status)err, "moving a cache row failed (%d: %s)", err, clattn_status_string(err));
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status accept_locked(clattn_kv_cache *c, const size_t *from, const size_t *counts, const size_t *index,
                                   size_t stride)
{
    const clattn_kv_cache_desc *d = &c->d;
    for (size_t b = 0; b < d->batch; b++) {
        if (from[b] > c->len[b])
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "accept: from[%zu] = %zu is past the sequence's length "
                               "%zu", b, from[b], c->len[b]);
        if (counts[b] > stride)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "accept: counts[%zu] = %zu is more than stride (%zu)",
                               b, counts[b], stride);
        for (size_t i = 0; i < counts[b]; i++) {
            const size_t x = index[b * stride + i];
            if (from[b] + x >= c->len[b])
                return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "accept: index[%zu] = %zu (sequence %zu): token "
                                   "%zu of the step is past the sequence's length %zu", b * stride + i, x, b,
                                   from[b] + x, c->len[b]);
            if (i && x <= index[b * stride + i - 1])
                return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "accept: index[%zu] = %zu (sequence %zu) does not "
                                   "come after the one before it (%zu): a branch is strictly ascending", b * stride + i,
                                   x, b, index[b * stride + i - 1]);
        }
    }
    /* in order: token i goes to from + i <= from + index[i], the source of no later move (the indices ascend) */
    const size_t es = clattn_kv_elem_size(d), HK = d->kv_heads, cap = d->capacity;
    for (size_t b = 0; b < d->batch; b++)
        for (size_t g = 0; g < HK; g++)
            for (size_t i = 0; i < counts[b]; i++) {
                const size_t base = (b * HK + g) * cap + from[b], src = base + index[b * stride + i], dst = base + i;
                if (src == dst) continue;
                TRY(move_row(c, c->k, c->k_host, d->head_dim_qk, es, src, dst));
                TRY(move_row(c, c->v, c->v_host, d->head_dim_v, es, src, dst));
                if (c->ks) TRY(move_row(c, c->ks, NULL, 1, sizeof(float), src, dst));
                if (c->vs) TRY(move_row(c, c->vs, NULL, 1, sizeof(float), src, dst));
            }
    if (!c->k_host) CL_CHECK(clFinish(c->device->queue), "moving the accepted cache rows");
    for (size_t b = 0; b < d->batch; b++) c->len[b] = from[b] + counts[b];
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_accept(clattn_kv_cache *cache, const size_t *from, const size_t *counts,
                                     const size_t *index, size_t stride)
{
    clattn_clear_error();
    if (!cache || !from || !counts) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache, from or counts is NULL");
    size_t any = 0;
    for (size_t b = 0; b < cache->d.batch; b++) any |= counts[b];
    if (any && !index) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "accept: index is NULL");
    pthread_mutex_lock(&cache->lock);
    const clattn_status st = accept_locked(cache, from, counts, index, stride);
    pthread_mutex_unlock(&cache->lock);
    return st;
}

clattn_status clattn_kv_cache_lengths(const clattn_kv_cache *cache, size_t *lengths)
{
    clattn_clear_error();
    if (!cache || !lengths) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache or lengths is NULL");
    clattn_kv_cache *c = (clattn_kv_cache *)cache; /* the lock is the cache's own state */
    pthread_mutex_lock(&c->lock);
    memcpy(lengths, cache->len, cache->d.batch * sizeof *lengths);
    pthread_mutex_unlock(&c->lock);
    return CLATTN_STATUS_SUCCESS;
}

size_t clattn_kv_cache_device_bytes(const clattn_kv_cache *cache)
{
    if (!cache || !cache->k) return 0;
    const size_t rows = cache->d.batch * cache->d.kv_heads * cache->d.capacity;
    return rows * (cache->d.head_dim_qk + cache->d.head_dim_v) * clattn_kv_elem_size(&cache->d) +
           scale_bytes(&cache->d);
}

/* n bytes of a device buffer into host memory. */
static clattn_status read_raw(const clattn_kv_cache *c, cl_mem m, size_t n, void *dst, const char *what)
{
    const cl_int err = clEnqueueReadBuffer(c->device->queue, m, CL_TRUE, 0, n, dst, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return clattn_fail((clattn_status)err, "reading the %s failed (%d: %s)", what, err, clattn_status_string(err));
    return CLATTN_STATUS_SUCCESS;
}

/* One of the two tensors (B, HK, Tmax, D) as float into dst, zero past each sequence's length. */
static clattn_status cache_read_one(const clattn_kv_cache *c, cl_mem m, cl_mem scales, const float *host, size_t D,
                                    float *dst, const char *what)
{
    const clattn_kv_cache_desc *d = &c->d;
    const size_t rows = d->batch * d->kv_heads * d->capacity, n = rows * D;
    if (host) {
        memcpy(dst, host, n * sizeof *dst);
    } else {
        const size_t es = clattn_kv_elem_size(d), sb = d->type == CLATTN_KV_INT8 ? rows * sizeof(float) : 0;
        void *raw = clattn_malloc(n * es);
        float *sa = sb ? clattn_malloc(sb) : NULL; /* INT8: the rows' scales */
        if (!raw || (sb && !sa)) {
            free(raw), free(sa);
            return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reading the %s (%zu bytes)", what, n * es + sb);
        }
        clattn_status st = read_raw(c, m, n * es, raw, what);
        if (!st && sb) st = read_raw(c, scales, sb, sa, what);
        if (!st) {
            if (d->type == CLATTN_KV_INT8) {
                const int8_t *q = raw;
                for (size_t r = 0; r < rows; r++)
                    for (size_t e = 0; e < D; e++) dst[r * D + e] = (float)q[r * D + e] * sa[r];
            } else if (es == 2) {
                clattn_dtype_widen(raw, n, d->type == CLATTN_KV_BF16 ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F16, dst);
            } else {
                memcpy(dst, raw, n * sizeof *dst);
            }
        }
        free(sa);
        free(raw);
        if (st) return st;
    }
    for (size_t b = 0; b < d->batch; b++)
        for (size_t g = 0; g < d->kv_heads; g++) {
            float *p = dst + ((b * d->kv_heads + g) * d->capacity + c->len[b]) * D;
            memset(p, 0, (d->capacity - c->len[b]) * D * sizeof *p);
        }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_read(const clattn_kv_cache *cache, float *k, float *v)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    const size_t rows = cache->d.batch * cache->d.kv_heads * cache->d.capacity;
    const clattn_mem_range outs[] = {clattn_range("", "k", k, NULL, rows * cache->d.head_dim_qk, sizeof(float)),
                                     clattn_range("", "v", v, NULL, rows * cache->d.head_dim_v, sizeof(float))};
    TRY(clattn_check_no_overlap(outs, 2, NULL, 0));
    clattn_kv_cache *c = (clattn_kv_cache *)cache; /* the lock is the cache's own state */
    pthread_mutex_lock(&c->lock);
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (k) st = cache_read_one(cache, cache->k, cache->ks, cache->k_host, cache->d.head_dim_qk, k, "key cache");
    if (v && !st) st = cache_read_one(cache, cache->v, cache->vs, cache->v_host, cache->d.head_dim_v, v, "value cache");
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* An INT8 cache's keys or values (rows of D) quantised on the host as kv_append.cl does, codes and scales uploaded. */
static clattn_status write_int8(clattn_kv_cache *cache, const float *x, size_t D, cl_mem codes, cl_mem scales,
                                const char *what)
{
    const size_t rows = cache->d.batch * cache->d.kv_heads * cache->d.capacity;
    int8_t *q = clattn_malloc(rows * D);
    float *s = clattn_malloc(rows * sizeof *s);
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (!q || !s) st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "quantising the %s cache", what);
    for (size_t r = 0; !st && r < rows; r++) s[r] = clattn_kv_quantize_row(x + r * D, D, q + r * D);
    const void *src[2] = {q, s};
    const size_t n[2] = {rows * D, rows * sizeof *s};
    cl_mem dst[2] = {codes, scales};
    for (int t = 0; t < 2 && !st; t++) {
        const cl_int err = clEnqueueWriteBuffer(cache->device->queue, dst[t], CL_TRUE, 0, n[t], src[t], 0, NULL, NULL);
        if (err != CL_SUCCESS)
            st = clattn_fail((clattn_status)err, "writing the %s cache%s failed (%d: %s)", what, t ? "'s scales" : "",
                             err, clattn_status_string(err));
    }
    free(q), free(s);
    return st;
}

static clattn_status write_locked(clattn_kv_cache *cache, const float *k, const float *v, const size_t *lengths)
{
    const clattn_kv_cache_desc *d = &cache->d;
    for (size_t b = 0; b < d->batch; b++)
        if (lengths[b] > d->capacity)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "lengths[%zu] = %zu exceeds the capacity (%zu)", b,
                               lengths[b], d->capacity);
    const size_t rows = d->batch * d->kv_heads * d->capacity;
    const size_t nk = rows * d->head_dim_qk, nv = rows * d->head_dim_v;
    if (cache->k_host) {
        memcpy(cache->k_host, k, nk * sizeof *k);
        memcpy(cache->v_host, v, nv * sizeof *v);
        clattn_kv_round_rows(cache->k_host, rows, d->head_dim_qk, (int)d->type);
        clattn_kv_round_rows(cache->v_host, rows, d->head_dim_v, (int)d->type);
    } else if (d->type == CLATTN_KV_INT8) {
        TRY(write_int8(cache, k, d->head_dim_qk, cache->k, cache->ks, "key"));
        TRY(write_int8(cache, v, d->head_dim_v, cache->v, cache->vs, "value"));
    } else {
        const size_t es = clattn_kv_elem_size(d);
        const float *src[2] = {k, v};
        const size_t n[2] = {nk, nv};
        cl_mem dst[2] = {cache->k, cache->v};
        for (int t = 0; t < 2; t++) {
            void *raw = (void *)src[t];
            if (es == 2) {
                uint16_t *h = clattn_malloc(n[t] * sizeof *h);
                if (!h) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "converting the cache to 16 bits");
                clattn_dtype_narrow(src[t], n[t], d->type == CLATTN_KV_BF16 ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F16, h);
                raw = h;
            }
            cl_int err = clEnqueueWriteBuffer(cache->device->queue, dst[t], CL_TRUE, 0, n[t] * es, raw, 0, NULL, NULL);
            if (es == 2) free(raw);
            if (err != CL_SUCCESS)
                return clattn_fail((clattn_status)err, "writing the %s cache failed (%d: %s)", t ? "value" : "key", err,
                                   clattn_status_string(err));
        }
    }
    memcpy(cache->len, lengths, d->batch * sizeof *cache->len);
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_write(clattn_kv_cache *cache, const float *k, const float *v, const size_t *lengths)
{
    clattn_clear_error();
    if (!cache || !k || !v || !lengths)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache, k, v or lengths is NULL");
    pthread_mutex_lock(&cache->lock);
    const clattn_status st = write_locked(cache, k, v, lengths);
    pthread_mutex_unlock(&cache->lock);
    return st;
}
