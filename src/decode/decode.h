/* decode.h: the decode layer (src/decode/): the KV cache (cache.c) and decode plans (decode.c), which run
 * on the device's backend: the CPU reference (decode_ref.c) or OpenCL (decode_cl.c, around a decode core). */
#ifndef CLATTN_DECODE_H
#define CLATTN_DECODE_H

#include "attention/attention.h"

/* The cache's rows (a position of one KV head: dk keys, dv values, an INT8 row's scale) are (B, HK, capacity) in a
 * contiguous cache and (HK, pages, P) in a paged one (clattn_kv_row maps a sequence's position to its row). */
struct clattn_kv_cache {
    pthread_mutex_t lock;      /* one call at a time (a decode step holds it for the whole step) */
    clattn_device *device;
    clattn_kv_cache_desc d;    /* defaults resolved (head_dim_v, pages) */
    size_t *len;               /* (B) current lengths */
    float *k_host, *v_host;    /* ref: rows of dk | dv, already rounded (HALF, BF16) or quantised (INT8) */
    cl_mem k, v;               /* OpenCL: the same rows, float, half, bfloat16 or int8 */
    cl_mem ks, vs;             /* OpenCL, INT8: each row's scale (clattn_kv_type) */
    /* paged (d.page_size > 0; else npage 0 and the rest NULL) */
    size_t npage;              /* block-table entries per sequence: ceil(capacity / P) */
    uint32_t *table;           /* (B, npage) the page of each block, CLATTN_NO_PAGE where none */
    uint32_t *refs;            /* (pages) how many sequences' tables hold each page */
    uint32_t *free_pages;      /* a stack of the pages no table holds, nfree of them */
    size_t nfree;
    cl_mem table_mem;          /* OpenCL: the tables as the kernels read them, (B, npage) uint */
    uint32_t *shown;           /* OpenCL: what table_mem holds (NULL before its first write or after a failed one) */
    int table_dirty;           /* table may differ from shown */
};
#define CLATTN_NO_PAGE 0xFFFFFFFFu
size_t clattn_kv_elem_size(const clattn_kv_cache_desc *d); /* bytes of one stored element */
size_t clattn_kv_rows(const clattn_kv_cache_desc *d);      /* rows stored: B*HK*capacity, or pages*HK*P */
/* The row of position pos of sequence b, KV head g (paged: pos's block must have a page). */
size_t clattn_kv_row(const clattn_kv_cache *c, size_t b, size_t g, size_t pos);
/* Before a step writes positions from[b] .. to[b]-1 of each sequence: a paged cache gives every block there a page
 * of the sequence's own (a free page, or a copy of a shared one). Refused with nothing changed when the pool has
 * too few free pages. A contiguous cache: nothing to do. */
clattn_status clattn_kv_cache_reserve(clattn_kv_cache *c, const size_t *from, const size_t *to);
/* After a failed step: the pages past each sequence's length back to the pool (paged; else nothing). */
void clattn_kv_cache_unreserve(clattn_kv_cache *c);
/* OpenCL, paged: table_mem written (enqueued, on the device's queue) when the tables changed. */
clattn_status clattn_kv_cache_sync_table(clattn_kv_cache *c);

struct clattn_decode_cl;       /* decode_cl.c */
struct clattn_decode_ops;

struct clattn_decode_plan {
    pthread_mutex_t lock;      /* one call at a time per plan */
    clattn_plan *base;         /* the description (resolved) and the weights, LINEAR */
    const struct clattn_decode_ops *ops; /* the device's backend, chosen once at creation */
    size_t max_parts;          /* 0 = automatic */
    size_t last_parts;
    struct clattn_decode_cl *cl; /* OpenCL state (NULL on ref) */
    int profiling;             /* stage times on (OpenCL) */
};

/* One decode step, checked against the cache: up to n new tokens per sequence, valid[b] of them real; sequence b's
 * rows of x and out (and kv, value) start at row0[b]: b*n when the step is padded (out's rows t >= valid[b] get a
 * zero attention output), cu_new[b] when it is packed (args.cu_new: only the real rows exist). rows: x's rows (B*n,
 * or cu_new[B]). The longest sequence reaches max_len. tree: a verify step's draft tree (B, n, n), checked, or NULL. */
typedef struct clattn_decode_step {
    size_t n, rows, max_len;
    /* desc.rope: the table of cos and sin must hold rope_most positions, and need not grow past rope_limit: max_len
     * and the cache's capacity (no slot of a step reaches it: check_step), or with positions given the largest + 1
     * and CLATTN_ROPE_MAX_POSITION + 1 */
    size_t rope_most, rope_limit;
    const uint32_t *pos; /* args.rope_positions (rows of them, checked), or NULL: token t of sequence b at len[b] + t */
    const size_t *valid, *row0;
    int packed;
    const uint8_t *tree;
} clattn_decode_step;

/* The backend writes out (rows, out_width) and the new keys and values into the cache; the caller advances the
 * lengths after success. kv and value: the new tokens' K and V of a plan with separate_value (x then their Q), else
 * NULL. */
typedef struct clattn_decode_ops {
    clattn_status (*init)(clattn_decode_plan *plan);        /* NULL: nothing to build */
    void (*release)(clattn_decode_plan *plan);
    clattn_status (*execute)(clattn_decode_plan *plan, clattn_kv_cache *cache, const float *x, const float *kv,
                             const float *value, const clattn_decode_step *step, float *out);
    /* the same on the caller's buffers (NULL: the device has none) */
    clattn_status (*execute_buffers)(clattn_decode_plan *plan, clattn_kv_cache *cache,
                                     const clattn_decode_buffers *buffers, const clattn_decode_step *step,
                                     cl_uint nwait, const cl_event *wait, cl_event *event);
    const char *(*core)(const clattn_decode_plan *plan);
    /* the last step's stage times (NULL: the device has none) */
    clattn_status (*stage_times)(clattn_decode_plan *plan, double *ms);
} clattn_decode_ops;

extern const clattn_decode_ops clattn_decode_ref;    /* decode_ref.c */
extern const clattn_decode_ops clattn_decode_opencl; /* decode_cl.c */

#endif
