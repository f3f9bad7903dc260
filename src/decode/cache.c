/* cache.c: the KV cache (clattn.h, "KV cache and decoding"): per sequence b and key/value head g, positions
 * 0 .. capacity-1 of keys and values, in host memory on ref and in device buffers (float, half, bfloat16 or int8
 * with scales) on OpenCL; each sequence's length lives on the host. Its rows are (B, HK, capacity) when contiguous;
 * a paged cache's are head-major, (HK, pages, P), so that a sequence's consecutive pages are one stream per head where
 * the pool has them in order (clattn_kv_cache_write lays them out so; a step takes the next free page). Its block
 * tables, the pages' reference counts and the free pages (a stack) live on the host, the tables copied to the device
 * before a step that needs them. */
#include "decode.h"

#include <stdlib.h>
#include <string.h>

size_t clattn_kv_elem_size(const clattn_kv_cache_desc *d)
{
    return d->type == CLATTN_KV_FLOAT ? 4 : d->type == CLATTN_KV_INT8 ? 1 : 2;
}

size_t clattn_kv_rows(const clattn_kv_cache_desc *d)
{
    return d->page_size ? d->pages * d->kv_heads * d->page_size : d->batch * d->kv_heads * d->capacity;
}

size_t clattn_kv_row(const clattn_kv_cache *c, size_t b, size_t g, size_t pos)
{
    const size_t P = c->d.page_size;
    if (!P) return (b * c->d.kv_heads + g) * c->d.capacity + pos;
    return (g * c->d.pages + c->table[b * c->npage + pos / P]) * P + pos % P;
}

/* Bytes of an INT8 cache's scales (0 for the other types): a float per row of keys and per row of values. */
static size_t scale_bytes(const clattn_kv_cache_desc *d)
{
    return d->type == CLATTN_KV_INT8 ? clattn_kv_rows(d) * 2 * sizeof(float) : 0;
}

/* ---- pages (paged caches): the tables, the reference counts and the free stack */

static void page_unref(clattn_kv_cache *c, uint32_t page)
{
    if (--c->refs[page] == 0) c->free_pages[c->nfree++] = page;
}

/* Sequence b's blocks from the one holding position len on (those no position below len uses) back to the pool, the
 * last first: the free stack then gives them back in order (see clattn_kv_cache_unreserve). */
static void release_tail(clattn_kv_cache *c, size_t b, size_t len)
{
    const size_t P = c->d.page_size;
    for (size_t i = c->npage; i-- > (len + P - 1) / P;) {
        uint32_t *t = &c->table[b * c->npage + i];
        if (*t == CLATTN_NO_PAGE) continue;
        page_unref(c, *t);
        *t = CLATTN_NO_PAGE;
        c->table_dirty = 1;
    }
}

void clattn_kv_cache_unreserve(clattn_kv_cache *c)
{
    if (!c->d.page_size) return;
    /* the last sequence first: a step that takes the positions again (a rejected draft's, a benchmark's) gets back the
     * same pages in the same blocks (reserve pops them in sequence and block order), so the tables are not written */
    for (size_t b = c->d.batch; b-- > 0;) release_tail(c, b, c->len[b]);
}

/* Rows from .. from+n-1 of every tensor (keys, values, an INT8 cache's scales) to rows to .. to+n-1, on the host or
 * the device: the one copy behind copy-on-write, accept's moves and a contiguous cache's share. */
static clattn_status copy_rows(clattn_kv_cache *c, size_t from, size_t to, size_t n, const char *what)
{
    const clattn_kv_cache_desc *d = &c->d;
    const size_t w[4] = {d->head_dim_qk, d->head_dim_v, 1, 1}; /* elements a row */
    float *const host[4] = {c->k_host, c->v_host, NULL, NULL};
    const cl_mem m[4] = {c->k, c->v, c->ks, c->vs};
    const size_t es[4] = {clattn_kv_elem_size(d), clattn_kv_elem_size(d), 4, 4}; /* bytes an element on the device */
    for (int t = 0; t < 4; t++) {
        if (host[t]) {
            memmove(host[t] + to * w[t], host[t] + from * w[t], n * w[t] * sizeof(float));
            continue;
        }
        if (!m[t]) continue;
        const size_t row = w[t] * es[t];
        const cl_int err = clEnqueueCopyBuffer(c->device->queue, m[t], m[t], from * row, to * row, n * row, 0, NULL,
                                               NULL);
        if (err != CL_SUCCESS)
            return clattn_fail((clattn_status)err, "%s failed (%d: %s)", what, err, clattn_status_string(err));
    }
    return CLATTN_STATUS_SUCCESS;
}

/* Page `from`'s rows (every head, every tensor) into page `to`: per head, the P rows at row (g*pages + page)*P. */
static clattn_status page_copy(clattn_kv_cache *c, uint32_t from, uint32_t to)
{
    const size_t P = c->d.page_size, pages = c->d.pages;
    for (size_t g = 0; g < c->d.kv_heads; g++)
        TRY(copy_rows(c, (g * pages + from) * P, (g * pages + to) * P, P, "copying a shared page of the KV cache"));
    return CLATTN_STATUS_SUCCESS;
}

/* Pages the writes need: a new one per block without a page, and a copy per shared page written, except that the
 * last of a page's holders to write keeps it (so k writers of a page of r holders copy k, or k - 1 when k = r). */
static clattn_status pages_needed(const clattn_kv_cache *c, const size_t *from, const size_t *to, size_t *need)
{
    const size_t P = c->d.page_size;
    size_t fresh = 0, shared = 0;
    for (size_t b = 0; b < c->d.batch; b++)
        for (size_t i = from[b] / P; from[b] < to[b] && i <= (to[b] - 1) / P; i++) {
            const uint32_t t = c->table[b * c->npage + i];
            if (t == CLATTN_NO_PAGE) fresh++;
            else if (c->refs[t] > 1) shared++;
        }
    *need = fresh;
    if (!shared) return CLATTN_STATUS_SUCCESS;
    uint32_t *writers = clattn_calloc(c->d.pages, sizeof *writers);
    if (!writers) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "counting the KV cache's shared pages");
    for (size_t b = 0; b < c->d.batch; b++)
        for (size_t i = from[b] / P; from[b] < to[b] && i <= (to[b] - 1) / P; i++) {
            const uint32_t t = c->table[b * c->npage + i];
            if (t != CLATTN_NO_PAGE && c->refs[t] > 1) writers[t]++;
        }
    for (size_t p = 0; p < c->d.pages; p++)
        if (writers[p]) *need += writers[p] == c->refs[p] ? writers[p] - 1 : writers[p];
    free(writers);
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_reserve(clattn_kv_cache *c, const size_t *from, const size_t *to)
{
    const size_t P = c->d.page_size;
    if (!P) return CLATTN_STATUS_SUCCESS;
    size_t need = 0;
    TRY(pages_needed(c, from, to, &need));
    if (need > c->nfree)
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "the KV cache's pool has %zu free pages of %zu "
                           "positions and this call needs %zu (new blocks, and copies of shared pages written to): "
                           "free sequences (clattn_kv_cache_truncate, reset) or make the pool larger (desc.pages = "
                           "%zu now)", c->nfree, P, need, c->d.pages);
    for (size_t b = 0; b < c->d.batch; b++)
        for (size_t i = from[b] / P; from[b] < to[b] && i <= (to[b] - 1) / P; i++) {
            uint32_t *t = &c->table[b * c->npage + i];
            if (*t != CLATTN_NO_PAGE && c->refs[*t] == 1) continue; /* its own already */
            const uint32_t page = c->free_pages[--c->nfree];
            if (*t != CLATTN_NO_PAGE) { /* shared: its copy (the positions before from[b], and the others') */
                const clattn_status st = page_copy(c, *t, page);
                if (st != CLATTN_STATUS_SUCCESS) {
                    c->nfree++;
                    return st;
                }
                page_unref(c, *t);
            }
            c->refs[page] = 1;
            *t = page;
            c->table_dirty = 1;
        }
    return CLATTN_STATUS_SUCCESS;
}

static void CL_CALLBACK free_snapshot(cl_event ev, cl_int status, void *snapshot)
{
    (void)ev, (void)status;
    free(snapshot);
}

/* After a failed write: what table_mem holds is not known, so the next write takes every entry. */
static void forget_shown(clattn_kv_cache *c)
{
    free(c->shown);
    c->shown = NULL;
}

clattn_status clattn_kv_cache_sync_table(clattn_kv_cache *c)
{
    if (!c->table_mem || !c->table_dirty) return CLATTN_STATUS_SUCCESS;
    /* only the entries that differ from what table_mem holds, from first to last: a step that takes back the page a
     * truncation gave up writes nothing, one that starts a page writes a word per sequence at most */
    const size_t n = c->d.batch * c->npage;
    const int first = !c->shown; /* table_mem not yet written: every entry goes */
    if (first && !(c->shown = clattn_malloc(n * sizeof *c->shown)))
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "copying the KV cache's block tables");
    size_t lo = 0, hi = n;
    if (!first) {
        while (lo < n && c->table[lo] == c->shown[lo]) lo++;
        while (hi > lo && c->table[hi - 1] == c->shown[hi - 1]) hi--;
    }
    if (lo == hi) {
        c->table_dirty = 0;
        return CLATTN_STATUS_SUCCESS;
    }
    /* from a copy of its own, freed when the write completes: no wait here for an earlier step (a step on the
     * caller's buffers may sit behind the caller's events) */
    cl_uint *snap = clattn_malloc((hi - lo) * sizeof *snap);
    if (!snap) {
        forget_shown(c);
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "copying the KV cache's block tables");
    }
    for (size_t i = lo; i < hi; i++) snap[i - lo] = c->table[i];
    cl_event ev = NULL;
    const cl_int err = clEnqueueWriteBuffer(c->device->queue, c->table_mem, CL_FALSE, lo * sizeof *snap,
                                            (hi - lo) * sizeof *snap, snap, 0, NULL, &ev);
    if (err != CL_SUCCESS) {
        free(snap);
        forget_shown(c);
        return clattn_fail((clattn_status)err, "writing the KV cache's block tables failed (%d: %s)", err,
                           clattn_status_string(err));
    }
    if (clSetEventCallback(ev, CL_COMPLETE, free_snapshot, snap) != CL_SUCCESS) {
        clWaitForEvents(1, &ev);
        free(snap);
    }
    clReleaseEvent(ev);
    memcpy(c->shown + lo, c->table + lo, (hi - lo) * sizeof *c->shown);
    c->table_dirty = 0;
    return CLATTN_STATUS_SUCCESS;
}

/* A paged cache's tables: every block without a page, every page free (the stack pops page 0 first). */
static clattn_status make_tables(clattn_kv_cache *c, size_t npage)
{
    const size_t B = c->d.batch, pages = c->d.pages;
    c->npage = npage;
    c->table = clattn_malloc(B * npage * sizeof *c->table);
    c->refs = clattn_calloc(pages, sizeof *c->refs);
    c->free_pages = clattn_malloc(pages * sizeof *c->free_pages);
    if (!c->table || !c->refs || !c->free_pages)
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache's block tables");
    for (size_t i = 0; i < B * npage; i++) c->table[i] = CLATTN_NO_PAGE;
    for (size_t i = 0; i < pages; i++) c->free_pages[i] = (uint32_t)(pages - 1 - i);
    c->nfree = pages;
    c->table_dirty = 1;
    return CLATTN_STATUS_SUCCESS;
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
    const size_t P = d.page_size, npage = P ? d.capacity / P + (d.capacity % P != 0) : 0;
    if (P && (P > 65536 || (P & (P - 1))))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "page_size %zu: a power of two from 1 to 65536 (0: a "
                           "contiguous cache)", P);
    if (!P && d.pages)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "pages = %zu without page_size: a contiguous cache has no "
                           "pages (set page_size for a paged one)", d.pages);
    size_t nk, nv, t;
    if (P && !d.pages && clattn_mul_overflows(d.batch, npage, &d.pages))
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "the cache's default pool (batch x ceil(capacity / page_size)) "
                           "overflows size_t");
    if (d.pages >= CLATTN_NO_PAGE)
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "pages = %zu: at most %u", d.pages, CLATTN_NO_PAGE - 1);
    if (P && (clattn_mul_overflows(d.pages, d.kv_heads, &t) || clattn_mul_overflows(t, P, &t)))
        return clattn_fail(CLATTN_STATUS_SIZE_OVERFLOW, "the cache's size overflows size_t");
    if ((!P && (clattn_mul_overflows(d.batch, d.kv_heads, &t) || clattn_mul_overflows(t, d.capacity, &t))) ||
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
    if (!c->len) st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache lengths");
    if (st == CLATTN_STATUS_SUCCESS && P) st = make_tables(c, npage);
    if (st == CLATTN_STATUS_SUCCESS && device->backend == CLATTN_BACKEND_REF) {
        c->k_host = clattn_calloc(nk, sizeof(float));
        c->v_host = clattn_calloc(nv, sizeof(float));
        if (!c->k_host || !c->v_host)
            st = clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the cache (%zu floats)", nk + nv);
    } else if (st == CLATTN_STATUS_SUCCESS) {
        const size_t es = clattn_kv_elem_size(&d), rows = clattn_kv_rows(&d);
        if ((nk + nv) * es + scale_bytes(&d) > device->caps.global_mem)
            st = clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "the cache needs %zu bytes, more than the device's "
                             "global memory (%zu bytes)", (nk + nv) * es + scale_bytes(&d), device->caps.global_mem);
        else if ((st = clattn_buffer_new(device, nk, es, NULL, "the key cache", &c->k)) == CLATTN_STATUS_SUCCESS)
            st = clattn_buffer_new(device, nv, es, NULL, "the value cache", &c->v);
        if (st == CLATTN_STATUS_SUCCESS && d.type == CLATTN_KV_INT8 &&
            (st = clattn_buffer_new(device, rows, 4, NULL, "the key cache's scales", &c->ks)) == CLATTN_STATUS_SUCCESS)
            st = clattn_buffer_new(device, rows, 4, NULL, "the value cache's scales", &c->vs);
        if (st == CLATTN_STATUS_SUCCESS && P)
            st = clattn_buffer_new(device, d.batch * npage, 4, NULL, "the cache's block tables", &c->table_mem);
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
    if (cache->table_mem) clFinish(cache->device->queue); /* the tables' writes done: their copies freed */
    clattn_mem_release(&cache->table_mem);
    free(cache->table), free(cache->refs), free(cache->free_pages), free(cache->shown);
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
    clattn_kv_cache_unreserve(cache); /* every page back to the pool */
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
    clattn_kv_cache_unreserve(cache);
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
    /* paged: the pages written to made the sequence's own first (a page shared since the step is copied) */
    size_t *to = clattn_malloc(d->batch * sizeof *to);
    if (!to) return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "accept: allocating the ranges");
    for (size_t b = 0; b < d->batch; b++) to[b] = from[b] + counts[b];
    const clattn_status st = clattn_kv_cache_reserve(c, from, to);
    free(to);
    TRY(st);
    /* in order: token i goes to from + i <= from + index[i], the source of no later move (the indices ascend) */
    const size_t HK = d->kv_heads;
    for (size_t b = 0; b < d->batch; b++)
        for (size_t g = 0; g < HK; g++)
            for (size_t i = 0; i < counts[b]; i++) {
                const size_t src = clattn_kv_row(c, b, g, from[b] + index[b * stride + i]);
                const size_t dst = clattn_kv_row(c, b, g, from[b] + i);
                if (src == dst) continue;
                TRY(copy_rows(c, src, dst, 1, "moving a cache row"));
            }
    if (!c->k_host) CL_CHECK(clFinish(c->device->queue), "moving the accepted cache rows");
    for (size_t b = 0; b < d->batch; b++) c->len[b] = from[b] + counts[b];
    clattn_kv_cache_unreserve(c);
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
    return clattn_kv_rows(&cache->d) * (cache->d.head_dim_qk + cache->d.head_dim_v) * clattn_kv_elem_size(&cache->d) +
           scale_bytes(&cache->d) + clattn_mem_bytes(cache->table_mem);
}

/* n bytes of a device buffer into host memory. */
static clattn_status read_raw(const clattn_kv_cache *c, cl_mem m, size_t n, void *dst, const char *what)
{
    const cl_int err = clEnqueueReadBuffer(c->device->queue, m, CL_TRUE, 0, n, dst, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return clattn_fail((clattn_status)err, "reading the %s failed (%d: %s)", what, err, clattn_status_string(err));
    return CLATTN_STATUS_SUCCESS;
}

/* Every stored row of one of the two tensors (D elements each) as float into img. */
static clattn_status storage_read(const clattn_kv_cache *c, cl_mem m, cl_mem scales, const float *host, size_t D,
                                  float *img, const char *what)
{
    const clattn_kv_cache_desc *d = &c->d;
    const size_t rows = clattn_kv_rows(d), n = rows * D;
    if (host) {
        memcpy(img, host, n * sizeof *img);
        return CLATTN_STATUS_SUCCESS;
    }
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
                for (size_t e = 0; e < D; e++) img[r * D + e] = (float)q[r * D + e] * sa[r];
        } else if (es == 2) {
            clattn_dtype_widen(raw, n, d->type == CLATTN_KV_BF16 ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F16, img);
        } else {
            memcpy(img, raw, n * sizeof *img);
        }
    }
    free(sa);
    free(raw);
    return st;
}

/* One of the two tensors as (B, HK, Tmax, D) floats into dst, zero past each sequence's length (a paged cache's
 * rows gathered through the tables). */
static clattn_status cache_read_one(const clattn_kv_cache *c, cl_mem m, cl_mem scales, const float *host, size_t D,
                                    float *dst, const char *what)
{
    const clattn_kv_cache_desc *d = &c->d;
    const size_t HK = d->kv_heads, cap = d->capacity;
    float *img = dst;
    if (d->page_size && !(img = clattn_malloc(clattn_kv_rows(d) * D * sizeof *img)))
        return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "reading the %s's pages", what);
    const clattn_status st = storage_read(c, m, scales, host, D, img, what);
    if (st == CLATTN_STATUS_SUCCESS && d->page_size)
        for (size_t b = 0; b < d->batch; b++)
            for (size_t g = 0; g < HK; g++)
                for (size_t j = 0; j < c->len[b]; j++)
                    memcpy(dst + ((b * HK + g) * cap + j) * D, img + clattn_kv_row(c, b, g, j) * D, D * sizeof *dst);
    if (img != dst) free(img);
    if (st != CLATTN_STATUS_SUCCESS) return st;
    for (size_t b = 0; b < d->batch; b++)
        for (size_t g = 0; g < HK; g++) {
            float *p = dst + ((b * HK + g) * cap + c->len[b]) * D;
            memset(p, 0, (cap - c->len[b]) * D * sizeof *p);
        }
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_read(const clattn_kv_cache *cache, float *k, float *v)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    const size_t rows = cache->d.batch * cache->d.kv_heads * cache->d.capacity; /* the caller's arrays' rows */
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
    const size_t rows = clattn_kv_rows(&cache->d);
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

/* The stored rows from (B, HK, Tmax, D) floats x: x itself when contiguous; a paged cache's pages from x's rows
 * through `table` (positions past a sequence's last page are not stored), zeros in the pages no table holds. */
static float *storage_image(const clattn_kv_cache *c, const uint32_t *table, const float *x, size_t D)
{
    const clattn_kv_cache_desc *d = &c->d;
    if (!d->page_size) return (float *)x;
    const size_t P = d->page_size, HK = d->kv_heads, cap = d->capacity;
    float *img = clattn_calloc(clattn_kv_rows(d) * D, sizeof *img);
    if (!img) return NULL;
    for (size_t b = 0; b < d->batch; b++)
        for (size_t i = 0; i < c->npage && table[b * c->npage + i] != CLATTN_NO_PAGE; i++)
            for (size_t g = 0; g < HK; g++)
                for (size_t j = i * P; j < (i + 1) * P && j < cap; j++)
                    memcpy(img + ((g * d->pages + table[b * c->npage + i]) * P + j % P) * D,
                           x + ((b * HK + g) * cap + j) * D, D * sizeof *img);
    return img;
}

/* k and v (B, HK, Tmax, dk | dv) into the stored rows. */
static clattn_status write_rows(clattn_kv_cache *cache, const float *k, const float *v)
{
    const clattn_kv_cache_desc *d = &cache->d;
    const size_t rows = clattn_kv_rows(d);
    const size_t nk = rows * d->head_dim_qk, nv = rows * d->head_dim_v;
    if (cache->k_host) {
        memcpy(cache->k_host, k, nk * sizeof *k);
        memcpy(cache->v_host, v, nv * sizeof *v);
        clattn_kv_round_rows(cache->k_host, rows, d->head_dim_qk, (int)d->type);
        clattn_kv_round_rows(cache->v_host, rows, d->head_dim_v, (int)d->type);
        return CLATTN_STATUS_SUCCESS;
    }
    if (d->type == CLATTN_KV_INT8) {
        TRY(write_int8(cache, k, d->head_dim_qk, cache->k, cache->ks, "key"));
        return write_int8(cache, v, d->head_dim_v, cache->v, cache->vs, "value");
    }
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
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status write_locked(clattn_kv_cache *cache, const float *k, const float *v, const size_t *lengths)
{
    const clattn_kv_cache_desc *d = &cache->d;
    const size_t P = d->page_size, B = d->batch;
    size_t need = 0;
    for (size_t b = 0; b < B; b++) {
        if (lengths[b] > d->capacity)
            return clattn_fail(CLATTN_STATUS_SHAPE_MISMATCH, "lengths[%zu] = %zu exceeds the capacity (%zu)", b,
                               lengths[b], d->capacity);
        if (P) need += (lengths[b] + P - 1) / P;
    }
    if (need > d->pages)
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE, "the lengths need %zu pages of %zu positions and the "
                           "KV cache's pool has %zu", need, P, d->pages);
    /* paged: every sequence's pages anew, pages 0, 1, ... in order (none shared) */
    uint32_t *table = NULL;
    if (P) {
        if (!(table = clattn_malloc(B * cache->npage * sizeof *table)))
            return clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "allocating the new block tables");
        uint32_t next = 0;
        for (size_t b = 0; b < B; b++)
            for (size_t i = 0; i < cache->npage; i++)
                table[b * cache->npage + i] = i * P < lengths[b] ? next++ : CLATTN_NO_PAGE;
    }
    float *ki = storage_image(cache, table, k, d->head_dim_qk), *vi = storage_image(cache, table, v, d->head_dim_v);
    clattn_status st = ki && vi ? write_rows(cache, ki, vi)
                                : clattn_fail(CLATTN_STATUS_OUT_OF_HOST_MEMORY, "arranging the cache's pages");
    if (ki != k) free(ki);
    if (vi != v) free(vi);
    if (st == CLATTN_STATUS_SUCCESS && P) {
        memcpy(cache->table, table, B * cache->npage * sizeof *table);
        for (size_t p = 0; p < d->pages; p++) cache->refs[p] = p < need;
        cache->nfree = 0;
        for (size_t p = d->pages; p-- > need;) cache->free_pages[cache->nfree++] = (uint32_t)p;
        cache->table_dirty = 1;
    }
    free(table);
    if (st == CLATTN_STATUS_SUCCESS) memcpy(cache->len, lengths, B * sizeof *cache->len);
    return st;
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

/* A contiguous cache: sequence src's first `length` rows of every head into sequence dst's (device or host). */
static clattn_status copy_prefix(clattn_kv_cache *c, size_t dst, size_t src, size_t length)
{
    for (size_t g = 0; g < c->d.kv_heads && length; g++)
        TRY(copy_rows(c, clattn_kv_row(c, src, g, 0), clattn_kv_row(c, dst, g, 0), length, "share: copying the prefix"));
    if (!c->k_host) CL_CHECK(clFinish(c->device->queue), "share: copying the prefix");
    return CLATTN_STATUS_SUCCESS;
}

static clattn_status share_locked(clattn_kv_cache *c, size_t dst, size_t src, size_t length)
{
    const size_t B = c->d.batch, P = c->d.page_size;
    if (dst >= B || src >= B)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "share: sequence %zu is past the batch (%zu sequences)",
                           dst >= B ? dst : src, B);
    if (dst == src)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "share: dst and src are both sequence %zu", dst);
    if (length > c->len[src])
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "share: length %zu is past sequence %zu's length %zu",
                           length, src, c->len[src]);
    if (!P) {
        TRY(copy_prefix(c, dst, src, length));
    } else {
        release_tail(c, dst, 0);
        for (size_t i = 0; i < (length + P - 1) / P; i++) {
            const uint32_t page = c->table[src * c->npage + i];
            c->table[dst * c->npage + i] = page;
            c->refs[page]++;
        }
        c->table_dirty = 1;
    }
    c->len[dst] = length;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_kv_cache_share(clattn_kv_cache *cache, size_t dst, size_t src, size_t length)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    pthread_mutex_lock(&cache->lock);
    const clattn_status st = share_locked(cache, dst, src, length);
    pthread_mutex_unlock(&cache->lock);
    return st;
}

clattn_status clattn_kv_cache_pages(const clattn_kv_cache *cache, size_t b, size_t *table, size_t *count,
                                    size_t *in_use)
{
    clattn_clear_error();
    if (!cache) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "cache is NULL");
    const size_t P = cache->d.page_size;
    if (!P) return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "the cache is contiguous (page_size 0): it has no pages");
    if (b >= cache->d.batch)
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "sequence %zu is past the batch (%zu sequences)", b,
                           cache->d.batch);
    clattn_kv_cache *c = (clattn_kv_cache *)cache; /* the lock is the cache's own state */
    pthread_mutex_lock(&c->lock);
    const size_t n = (c->len[b] + P - 1) / P;
    for (size_t i = 0; table && i < n; i++) table[i] = c->table[b * c->npage + i];
    if (count) *count = n;
    if (in_use) *in_use = c->d.pages - c->nfree;
    pthread_mutex_unlock(&c->lock);
    return CLATTN_STATUS_SUCCESS;
}
