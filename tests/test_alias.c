/* test_alias.c: the overlap rule (clattn.h, "Memory"). In every entry point that writes arrays (the forward, the
 * backward, a decode step, the encoder layer, the key-shard merge, the KV cache's read), host-pointer and buffer
 * forms, on ref and on OpenCL: each output placed over each other array is refused with INVALID_ARGUMENT naming
 * both, and nothing is written. Three placements: at the other array's start, over its last element only, and (on
 * buffers) through a sub-buffer. The same arrays apart are accepted (the control), and inputs that share memory give
 * the numbers separate copies give. */
#include "testutil.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clattn_device *cl_dev, *ref_dev;

static void setup(void)
{
    cl_dev = tu_open_opencl();
    ref_dev = tu_open_ref();
    cr_assert(cl_dev && ref_dev);
}

static void teardown(void)
{
    clattn_device_free(cl_dev);
    clattn_device_free(ref_dev);
}

TestSuite(alias, .init = setup, .fini = teardown);

/* ---- the driver: one arena holds every array of a call, each in a slot of its own */

typedef enum fill { F_FLOAT, F_MASK, F_COUNT } fill; /* random floats, a few 1 bytes, size_t values `count` */

typedef struct arr {
    const char *name;  /* as the error names it: "args.out" */
    size_t elems, size;
    int out;
    fill f;
    size_t count;      /* F_COUNT: the value of every element */
} arr;

#define MAXA 20
typedef clattn_status (*host_fn)(void *ctx, void *const p[]);
typedef clattn_status (*buf_fn)(void *ctx, const clattn_buffer b[]);
/* After each refusal, the call's own state it must have left as it was (NULL: none). */
typedef void (*unchanged_fn)(void *ctx);

typedef struct arena {
    size_t n, slot, total;
    unsigned char *pristine; /* every array in its own slot, with its contents */
} arena;

static size_t bytes_of(const arr *a) { return a->elems * a->size; }

/* Slots of twice the largest array (page aligned): an array moved into another's slot overlaps that one only. */
static void arena_make(arena *ar, const arr *a, size_t n, uint64_t seed)
{
    size_t mx = 0;
    for (size_t i = 0; i < n; i++) mx = bytes_of(&a[i]) > mx ? bytes_of(&a[i]) : mx;
    ar->n = n;
    ar->slot = (2 * mx + 64 + 4095) / 4096 * 4096;
    ar->total = (n + 1) * ar->slot;
    ar->pristine = malloc(ar->total);
    cr_assert(ar->pristine);
    tu_rng rng = {seed};
    for (size_t k = 0; k < ar->total; k++) ar->pristine[k] = (unsigned char)tu_next(&rng);
    for (size_t i = 0; i < n; i++) {
        unsigned char *p = ar->pristine + i * ar->slot;
        for (size_t e = 0; e < a[i].elems; e++) {
            if (a[i].f == F_FLOAT) ((float *)p)[e] = tu_uniform(&rng, -1.0f, 1.0f);
            else if (a[i].f == F_MASK) p[e] = tu_next(&rng) % 5 == 0;
            else ((size_t *)p)[e] = a[i].count;
        }
    }
}

/* The byte position of array j when it is placed over array i: at i's start, or over i's last bytes only
 * (aligned to j's element). */
static size_t place(const arena *ar, const arr *a, size_t i, size_t j, int tail)
{
    const size_t at = i * ar->slot;
    return tail ? at + (bytes_of(&a[i]) - 1) / a[j].size * a[j].size : at;
}

/* Does err name `name` as a whole ("args.out", not the start of "args.outs")? */
static int names(const char *err, const char *name)
{
    const size_t n = strlen(name);
    for (const char *s = strstr(err, name); s; s = strstr(s + 1, name))
        if (!isalnum((unsigned char)s[n]) && s[n] != '_' && s[n] != '[' && s[n] != '.') return 1;
    return 0;
}

static void expect_refused(clattn_status st, const char *what, const arr *a, size_t i, size_t j, const char *how)
{
    cr_assert_eq(st, CLATTN_STATUS_INVALID_ARGUMENT, "%s: %s over %s (%s): status %d (%s), expected a refusal", what,
                 a[j].name, a[i].name, how, st, clattn_last_error());
    const char *err = clattn_last_error();
    cr_assert(names(err, a[i].name) && names(err, a[j].name), "%s: %s over %s (%s): the error names %s", what,
              a[j].name, a[i].name, how, err);
}

/* Every output over every other array, host pointers. */
static void alias_host(const char *what, const arr *a, size_t n, host_fn f, void *ctx, unchanged_fn unchanged)
{
    arena ar;
    arena_make(&ar, a, n, 17);
    unsigned char *mem = aligned_alloc(4096, ar.total), *snap = malloc(ar.total);
    cr_assert(mem && snap);
    void *p[MAXA];
    memcpy(mem, ar.pristine, ar.total);
    for (size_t k = 0; k < n; k++) p[k] = mem + k * ar.slot;
    cr_assert_eq(f(ctx, p), CLATTN_STATUS_SUCCESS, "%s: the arrays apart: %s", what, clattn_last_error());
    size_t refused = 0;
    for (size_t i = 0; i < n; i++) {
        if (!a[i].out) continue;
        for (size_t j = 0; j < n; j++)
            for (int tail = 0; tail < 2 && j != i; tail++) {
                memcpy(mem, ar.pristine, ar.total);
                const size_t at = place(&ar, a, i, j, tail);
                memcpy(mem + at, ar.pristine + j * ar.slot, bytes_of(&a[j]));
                for (size_t k = 0; k < n; k++) p[k] = mem + k * ar.slot;
                p[j] = mem + at;
                memcpy(snap, mem, ar.total);
                expect_refused(f(ctx, p), what, a, i, j, tail ? "over its last element" : "at its start");
                cr_assert(memcmp(mem, snap, ar.total) == 0, "%s: %s over %s: refused, but memory was written", what,
                          a[j].name, a[i].name);
                if (unchanged) unchanged(ctx);
                refused++;
            }
    }
    cr_assert_gt(refused, 0);
    free(mem);
    free(snap);
    free(ar.pristine);
}

/* The same on device buffers: one cl_mem, arrays at element offsets, or array j as a sub-buffer over array i. */
static void alias_buffers(const char *what, const arr *a, size_t n, buf_fn f, void *ctx, unchanged_fn unchanged)
{
    arena ar;
    arena_make(&ar, a, n, 29);
    cl_context cx = clattn_device_context(cl_dev);
    cl_command_queue q = clattn_device_queue(cl_dev);
    cl_int e;
    cl_mem mem = clCreateBuffer(cx, CL_MEM_READ_WRITE, ar.total, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    unsigned char *snap = malloc(ar.total), *back = malloc(ar.total);
    cr_assert(snap && back);
    clattn_buffer b[MAXA];
    cr_assert_eq(clEnqueueWriteBuffer(q, mem, CL_TRUE, 0, ar.total, ar.pristine, 0, NULL, NULL), CL_SUCCESS);
    for (size_t k = 0; k < n; k++) b[k] = (clattn_buffer){mem, k * ar.slot / a[k].size};
    cr_assert_eq(f(ctx, b), CLATTN_STATUS_SUCCESS, "%s: the buffers apart: %s", what, clattn_last_error());
    cr_assert_eq(clFinish(q), CL_SUCCESS);
    for (size_t i = 0; i < n; i++) {
        if (!a[i].out) continue;
        for (size_t j = 0; j < n; j++)
            for (int how = 0; how < 3 && j != i; how++) {
                cr_assert_eq(clEnqueueWriteBuffer(q, mem, CL_TRUE, 0, ar.total, ar.pristine, 0, NULL, NULL),
                             CL_SUCCESS);
                const size_t at = place(&ar, a, i, j, how == 1);
                for (size_t k = 0; k < n; k++) b[k] = (clattn_buffer){mem, k * ar.slot / a[k].size};
                cl_mem sub = NULL;
                if (how == 2) { /* a sub-buffer that starts at i's slot (page aligned) */
                    const cl_buffer_region r = {at, bytes_of(&a[j])};
                    sub = clCreateSubBuffer(mem, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &e);
                    cr_assert_eq(e, CL_SUCCESS, "clCreateSubBuffer: %d", e);
                    b[j] = (clattn_buffer){sub, 0};
                } else {
                    b[j] = (clattn_buffer){mem, at / a[j].size};
                }
                memcpy(snap, ar.pristine, ar.total);
                static const char *hows[3] = {"at its start", "over its last element", "a sub-buffer at its start"};
                expect_refused(f(ctx, b), what, a, i, j, hows[how]);
                cr_assert_eq(clEnqueueReadBuffer(q, mem, CL_TRUE, 0, ar.total, back, 0, NULL, NULL), CL_SUCCESS);
                cr_assert(memcmp(back, snap, ar.total) == 0, "%s: %s over %s (%s): refused, but the buffer was written",
                          what, a[j].name, a[i].name, hows[how]);
                if (unchanged) unchanged(ctx);
                if (sub) clReleaseMemObject(sub);
            }
    }
    clReleaseMemObject(mem);
    free(snap);
    free(back);
    free(ar.pristine);
}

/* ---- the attention plan: a training plan with every array an execution and a backward can take */

enum { B = 2, TQ = 5, TK = 7, E = 8, EKV = 6, H = 2, HK = 1, DK = 4, DV = 3, EO = 5 };

typedef struct att {
    clattn_plan *plan;
    float *w[8];
} att;

static void att_make(att *t, clattn_device *dev)
{
    tu_rng rng = {5};
    const size_t n[8] = {H * DK * E, HK * DK * EKV, HK * DV * EKV, H * DK, HK * DK, HK * DV, EO * H * DV, EO};
    for (int i = 0; i < 8; i++) t->w[i] = tu_random(&rng, n[i], -0.5f, 0.5f);
    const clattn_attention_desc d = {.batch = B, .seq_q = TQ, .seq_kv = TK, .embed = E, .kv_embed = EKV, .heads = H,
                                     .kv_heads = HK, .head_dim_qk = DK, .head_dim_v = DV, .out_dim = EO, .cross = 1,
                                     .attn_mask = CLATTN_MASK_FLOAT, .key_padding_mask = 1, .need_weights = 1,
                                     .training = 1};
    const clattn_attention_weights w = {.w_query = t->w[0], .w_key = t->w[1], .w_value = t->w[2], .b_query = t->w[3],
                                        .b_key = t->w[4], .b_value = t->w[5], .w_out = t->w[6], .b_out = t->w[7]};
    cr_assert_eq(tu_plan_create(dev, &d, &w, &t->plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
}

static void att_free(att *t)
{
    clattn_plan_free(t->plan);
    for (int i = 0; i < 8; i++) free(t->w[i]);
}

/* The forward's arrays, in the order the calls below read them. */
#define INPUTS(o)                                                                                               \
    {o ".x", B * TQ * E, 4, 0, F_FLOAT, 0}, {o ".kv", B * TK * EKV, 4, 0, F_FLOAT, 0},                            \
        {o ".key_padding_mask", B * TK, 1, 0, F_MASK, 0}, {o ".attn_mask", TQ * TK, 4, 0, F_FLOAT, 0}
#define FORWARD(o)                                                                                               \
    {INPUTS(o), {o ".out", B * TQ * EO, 4, 1, F_FLOAT, 0}, {o ".attn", B * H * TQ * TK, 4, 1, F_FLOAT, 0},      \
     {o ".lse", B * H * TQ, 4, 1, F_FLOAT, 0}, {o ".context", B * TQ * H * DV, 4, 1, F_FLOAT, 0}}
#define BACKWARD(o)                                                                                              \
    {INPUTS(o),                                                                                                  \
     {"grads.grad_out", B * TQ * EO, 4, 0, F_FLOAT, 0},                                                          \
     {"grads.lse", B * H * TQ, 4, 0, F_FLOAT, 0},                                                                \
     {"grads.context", B * TQ * H * DV, 4, 0, F_FLOAT, 0},                                                       \
     {"grads.grad_x", B * TQ * E, 4, 1, F_FLOAT, 0},                                                             \
     {"grads.grad_kv", B * TK * EKV, 4, 1, F_FLOAT, 0},                                                          \
     {"grads.grad_w_query", H * DK * E, 4, 1, F_FLOAT, 0},                                                       \
     {"grads.grad_w_key", HK * DK * EKV, 4, 1, F_FLOAT, 0},                                                      \
     {"grads.grad_w_value", HK * DV * EKV, 4, 1, F_FLOAT, 0},                                                    \
     {"grads.grad_b_query", H * DK, 4, 1, F_FLOAT, 0},                                                           \
     {"grads.grad_b_key", HK * DK, 4, 1, F_FLOAT, 0},                                                            \
     {"grads.grad_b_value", HK * DV, 4, 1, F_FLOAT, 0},                                                          \
     {"grads.grad_w_out", EO * H * DV, 4, 1, F_FLOAT, 0},                                                        \
     {"grads.grad_b_out", EO, 4, 1, F_FLOAT, 0}}

static const arr forward_host[] = FORWARD("args"), forward_bufs[] = FORWARD("buffers");
static const arr backward_host[] = BACKWARD("args"), backward_bufs[] = BACKWARD("buffers");
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static clattn_attention_args args_of(void *const p[])
{
    clattn_attention_args a = {.x = p[0], .kv = p[1], .key_padding_mask = p[2], .attn_mask = p[3]};
    a.x_count = B * TQ * E, a.kv_count = B * TK * EKV, a.key_padding_mask_count = B * TK, a.attn_mask_count = TQ * TK;
    return a;
}

static clattn_attention_buffers buffers_of(const clattn_buffer b[])
{
    return (clattn_attention_buffers){.x = b[0], .kv = b[1], .key_padding_mask = b[2], .attn_mask = b[3]};
}

static clattn_status forward_host_call(void *ctx, void *const p[])
{
    clattn_attention_args a = args_of(p);
    a.out = p[4], a.attn = p[5], a.lse = p[6], a.context = p[7];
    a.out_count = B * TQ * EO, a.attn_count = B * H * TQ * TK, a.lse_count = B * H * TQ, a.context_count = B * TQ * H * DV;
    return clattn_plan_execute(((att *)ctx)->plan, &a);
}

static clattn_status forward_buf_call(void *ctx, const clattn_buffer b[])
{
    clattn_attention_buffers bu = buffers_of(b);
    bu.out = b[4], bu.attn = b[5], bu.lse = b[6], bu.context = b[7];
    return clattn_plan_execute_buffers(((att *)ctx)->plan, &bu, 0, NULL, NULL);
}

static clattn_status backward_host_call(void *ctx, void *const p[])
{
    const clattn_attention_args a = args_of(p);
    clattn_attention_grads g = {.grad_out = p[4], .lse = p[5], .context = p[6], .grad_x = p[7], .grad_kv = p[8],
                                .grad_w_query = p[9], .grad_w_key = p[10], .grad_w_value = p[11],
                                .grad_b_query = p[12], .grad_b_key = p[13], .grad_b_value = p[14],
                                .grad_w_out = p[15], .grad_b_out = p[16]};
    size_t *counts[] = {&g.grad_out_count, &g.lse_count, &g.context_count, &g.grad_x_count, &g.grad_kv_count,
                        &g.grad_w_query_count, &g.grad_w_key_count, &g.grad_w_value_count, &g.grad_b_query_count,
                        &g.grad_b_key_count, &g.grad_b_value_count, &g.grad_w_out_count, &g.grad_b_out_count};
    for (size_t i = 0; i < COUNT(counts); i++) *counts[i] = backward_host[4 + i].elems;
    return clattn_plan_backward(((att *)ctx)->plan, &a, &g);
}

static clattn_status backward_buf_call(void *ctx, const clattn_buffer b[])
{
    const clattn_attention_buffers bu = buffers_of(b);
    const clattn_attention_grad_buffers g = {.grad_out = b[4], .lse = b[5], .context = b[6], .grad_x = b[7],
                                             .grad_kv = b[8], .grad_w_query = b[9], .grad_w_key = b[10],
                                             .grad_w_value = b[11], .grad_b_query = b[12], .grad_b_key = b[13],
                                             .grad_b_value = b[14], .grad_w_out = b[15], .grad_b_out = b[16]};
    return clattn_plan_backward_buffers(((att *)ctx)->plan, &bu, &g, 0, NULL, NULL);
}

static void attention_on(clattn_device *dev, int buffers)
{
    att t;
    att_make(&t, dev);
    alias_host("forward", forward_host, COUNT(forward_host), forward_host_call, &t, NULL);
    alias_host("backward", backward_host, COUNT(backward_host), backward_host_call, &t, NULL);
    if (buffers) {
        alias_buffers("forward", forward_bufs, COUNT(forward_bufs), forward_buf_call, &t, NULL);
        alias_buffers("backward", backward_bufs, COUNT(backward_bufs), backward_buf_call, &t, NULL);
    }
    att_free(&t);
}

Test(alias, attention_ref) { attention_on(ref_dev, 0); }
Test(alias, attention_opencl) { attention_on(cl_dev, 1); }

/* ---- a decode step over a KV cache */

enum { DN = 3, DCAP = 32 };

typedef struct dec {
    clattn_decode_plan *plan;
    clattn_kv_cache *cache;
    float *w[3];
    size_t len[B]; /* the cache's lengths before the call */
} dec;

static void dec_make(dec *t, clattn_device *dev)
{
    tu_rng rng = {9};
    t->w[0] = tu_random(&rng, H * DK * E, -0.5f, 0.5f);
    t->w[1] = tu_random(&rng, HK * DK * E, -0.5f, 0.5f);
    t->w[2] = tu_random(&rng, HK * DV * E, -0.5f, 0.5f);
    const clattn_attention_desc d = {.batch = B, .seq_q = DN, .embed = E, .heads = H, .kv_heads = HK,
                                     .head_dim_qk = DK, .head_dim_v = DV, .causal = 1};
    const clattn_attention_weights w = {.w_query = t->w[0], .w_key = t->w[1], .w_value = t->w[2]};
    cr_assert_eq(tu_decode_plan_create(dev, &d, &w, &t->plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const clattn_kv_cache_desc cd = {.batch = B, .capacity = DCAP, .kv_heads = HK, .head_dim_qk = DK, .head_dim_v = DV};
    cr_assert_eq(clattn_kv_cache_create(dev, &cd, &t->cache), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
}

static void dec_free(dec *t)
{
    clattn_decode_plan_free(t->plan);
    clattn_kv_cache_free(t->cache);
    for (int i = 0; i < 3; i++) free(t->w[i]);
}

static const arr decode_host[] = {{"args.x", B * DN * E, 4, 0, F_FLOAT, 0},
                                  {"args.valid", B, sizeof(size_t), 0, F_COUNT, DN},
                                  {"args.out", B * DN * H * DV, 4, 1, F_FLOAT, 0}};
static const arr decode_bufs[] = {{"buffers.x", B * DN * E, 4, 0, F_FLOAT, 0},
                                  {"buffers.out", B * DN * H * DV, 4, 1, F_FLOAT, 0}};

/* A refused step leaves the cache's lengths as they were before it. */
static void lengths_kept(void *ctx)
{
    dec *t = ctx;
    size_t len[B];
    cr_assert_eq(clattn_kv_cache_lengths(t->cache, len), CLATTN_STATUS_SUCCESS);
    for (size_t b = 0; b < B; b++)
        cr_assert_eq(len[b], t->len[b], "sequence %zu: length %zu after a refused step, %zu before", b, len[b],
                     t->len[b]);
}

static clattn_status decode_host_call(void *ctx, void *const p[])
{
    dec *t = ctx;
    clattn_kv_cache_lengths(t->cache, t->len);
    const clattn_decode_args a = {.x = p[0], .new_tokens = DN, .valid = p[1], .out = p[2], .x_count = B * DN * E,
                                  .valid_count = B, .out_count = B * DN * H * DV};
    return clattn_decode_execute(t->plan, t->cache, &a);
}

static clattn_status decode_buf_call(void *ctx, const clattn_buffer b[])
{
    dec *t = ctx;
    clattn_kv_cache_lengths(t->cache, t->len);
    const clattn_decode_buffers bu = {.x = b[0], .out = b[1]};
    return clattn_decode_execute_buffers(t->plan, t->cache, &bu, DN, NULL, 0, NULL, NULL);
}

/* k and v of clattn_kv_cache_read */
static const arr cache_read[] = {{"k", B * HK * DCAP * DK, 4, 1, F_FLOAT, 0}, {"v", B * HK * DCAP * DV, 4, 1, F_FLOAT, 0}};

static clattn_status cache_read_call(void *ctx, void *const p[])
{
    return clattn_kv_cache_read(((dec *)ctx)->cache, p[0], p[1]);
}

static void decode_on(clattn_device *dev, int buffers)
{
    dec t;
    dec_make(&t, dev);
    alias_host("decode", decode_host, COUNT(decode_host), decode_host_call, &t, lengths_kept);
    if (buffers) alias_buffers("decode", decode_bufs, COUNT(decode_bufs), decode_buf_call, &t, lengths_kept);
    alias_host("kv_cache_read", cache_read, COUNT(cache_read), cache_read_call, &t, NULL);
    dec_free(&t);
}

Test(alias, decode_ref) { decode_on(ref_dev, 0); }
Test(alias, decode_opencl) { decode_on(cl_dev, 1); }

/* ---- the encoder layer */

enum { FF = 12 };

typedef struct enc {
    clattn_encoder_plan *plan;
    float *w[16];
} enc;

static void enc_make(enc *t, clattn_device *dev)
{
    tu_rng rng = {11};
    const size_t n[16] = {E * E, E * E, E * E, E, E, E, E * E, E, E, E, FF * E, FF, E * FF, E, E, E};
    for (int i = 0; i < 16; i++) t->w[i] = tu_random(&rng, n[i], -0.5f, 0.5f);
    const clattn_encoder_desc d = {.attn = {.batch = B, .seq_q = TQ, .embed = E, .heads = H, .head_dim_qk = E / H,
                                            .out_dim = E, .key_padding_mask = 1},
                                   .ff_dim = FF};
    const clattn_encoder_weights w = {
        .attn = {.w_query = t->w[0], .w_key = t->w[1], .w_value = t->w[2], .b_query = t->w[3], .b_key = t->w[4],
                 .b_value = t->w[5], .w_out = t->w[6], .b_out = t->w[7]},
        .ln1_weight = t->w[8], .ln1_bias = t->w[9], .w_ff1 = t->w[10], .b_ff1 = t->w[11], .w_ff2 = t->w[12],
        .b_ff2 = t->w[13], .ln2_weight = t->w[14], .ln2_bias = t->w[15]};
    cr_assert_eq(tu_encoder_plan_create(dev, &d, &w, &t->plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
}

#define ENCODER(o)                                                                                             \
    {{o ".x", B * TQ * E, 4, 0, F_FLOAT, 0}, {o ".key_padding_mask", B * TQ, 1, 0, F_MASK, 0},                \
     {o ".out", B * TQ * E, 4, 1, F_FLOAT, 0}}
static const arr encoder_host[] = ENCODER("args"), encoder_bufs[] = ENCODER("buffers");

static clattn_status encoder_host_call(void *ctx, void *const p[])
{
    const clattn_encoder_args a = {.x = p[0], .key_padding_mask = p[1], .out = p[2], .x_count = B * TQ * E,
                                   .key_padding_mask_count = B * TQ, .out_count = B * TQ * E};
    return clattn_encoder_plan_execute(((enc *)ctx)->plan, &a);
}

static clattn_status encoder_buf_call(void *ctx, const clattn_buffer b[])
{
    const clattn_encoder_buffers bu = {.x = b[0], .key_padding_mask = b[1], .out = b[2]};
    return clattn_encoder_plan_execute_buffers(((enc *)ctx)->plan, &bu, 0, NULL, NULL);
}

static void encoder_on(clattn_device *dev, int buffers)
{
    enc t;
    enc_make(&t, dev);
    alias_host("encoder", encoder_host, COUNT(encoder_host), encoder_host_call, &t, NULL);
    if (buffers) alias_buffers("encoder", encoder_bufs, COUNT(encoder_bufs), encoder_buf_call, &t, NULL);
    clattn_encoder_plan_free(t.plan);
    for (int i = 0; i < 16; i++) free(t.w[i]);
}

Test(alias, encoder_ref) { encoder_on(ref_dev, 0); }
Test(alias, encoder_opencl) { encoder_on(cl_dev, 1); }

/* ---- the key-shard merge (host arrays, no device) */

static const arr merge_arrays[] = {{"outs[0]", B * TQ * H * DV, 4, 0, F_FLOAT, 0},
                                   {"outs[1]", B * TQ * H * DV, 4, 0, F_FLOAT, 0},
                                   {"lses[0]", B * H * TQ, 4, 0, F_FLOAT, 0},
                                   {"lses[1]", B * H * TQ, 4, 0, F_FLOAT, 0},
                                   {"out", B * TQ * H * DV, 4, 1, F_FLOAT, 0},
                                   {"lse", B * H * TQ, 4, 1, F_FLOAT, 0}};

static clattn_status merge_call(void *ctx, void *const p[])
{
    (void)ctx;
    const float *outs[2] = {p[0], p[1]}, *lses[2] = {p[2], p[3]};
    return clattn_attention_merge(2, outs, lses, B, TQ, H, DV, p[4], p[5]);
}

Test(alias, merge) { alias_host("merge", merge_arrays, COUNT(merge_arrays), merge_call, NULL, NULL); }

/* ---- inputs may share memory: x given again as kv is the numbers of two copies */

static void shared_inputs_on(clattn_device *dev, int buffers)
{
    tu_rng rng = {23};
    enum { T = 6, EE = 8 };
    float *w[8];
    const size_t n[8] = {H * DK * EE, HK * DK * EE, HK * DV * EE, H * DK, HK * DK, HK * DV, EO * H * DV, EO};
    for (int i = 0; i < 8; i++) w[i] = tu_random(&rng, n[i], -0.5f, 0.5f);
    const clattn_attention_desc d = {.batch = B, .seq_q = T, .seq_kv = T, .embed = EE, .heads = H, .kv_heads = HK,
                                     .head_dim_qk = DK, .head_dim_v = DV, .out_dim = EO, .cross = 1, .training = 1};
    const clattn_attention_weights ws = {.w_query = w[0], .w_key = w[1], .w_value = w[2], .b_query = w[3],
                                         .b_key = w[4], .b_value = w[5], .w_out = w[6], .b_out = w[7]};
    clattn_plan *plan;
    cr_assert_eq(tu_plan_create(dev, &d, &ws, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    const size_t nx = B * T * EE, no = B * T * EO;
    float *x = tu_random(&rng, nx, -1.0f, 1.0f), *copy = malloc(nx * sizeof *copy), *go = tu_random(&rng, no, -1, 1);
    memcpy(copy, x, nx * sizeof *x);
    float *out[2], *gx[2], *gkv[2];
    for (int k = 0; k < 2; k++) { /* k = 0: kv is a copy of x; k = 1: kv is x itself */
        out[k] = tu_poisoned(no), gx[k] = tu_poisoned(nx), gkv[k] = tu_poisoned(nx);
        const clattn_attention_args a = {.x = x, .kv = k ? x : copy, .out = out[k], .x_count = nx, .kv_count = nx,
                                         .out_count = no};
        cr_assert_eq(clattn_plan_execute(plan, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        const clattn_attention_args ab = {.x = x, .kv = k ? x : copy, .x_count = nx, .kv_count = nx};
        const clattn_attention_grads g = {.grad_out = go, .grad_out_count = no, .grad_x = gx[k], .grad_x_count = nx,
                                          .grad_kv = gkv[k], .grad_kv_count = nx};
        cr_assert_eq(clattn_plan_backward(plan, &ab, &g), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    }
    cr_assert(memcmp(out[0], out[1], no * sizeof(float)) == 0, "out: kv = x differs from kv = a copy of x");
    cr_assert(memcmp(gx[0], gx[1], nx * sizeof(float)) == 0, "grad_x: kv = x differs from kv = a copy of x");
    cr_assert(memcmp(gkv[0], gkv[1], nx * sizeof(float)) == 0, "grad_kv: kv = x differs from kv = a copy of x");
    if (buffers) { /* one cl_mem as x and kv, against the host result */
        cl_context cx = clattn_device_context(dev);
        cl_int e;
        cl_mem bx = clCreateBuffer(cx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, nx * 4, x, &e);
        cl_mem bo = clCreateBuffer(cx, CL_MEM_READ_WRITE, no * 4, NULL, &e);
        cr_assert_eq(e, CL_SUCCESS);
        const clattn_attention_buffers bu = {.x = {bx, 0}, .kv = {bx, 0}, .out = {bo, 0}};
        cr_assert_eq(clattn_plan_execute_buffers(plan, &bu, 0, NULL, NULL), CLATTN_STATUS_SUCCESS, "%s",
                     clattn_last_error());
        float *got = tu_poisoned(no);
        cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(dev), bo, CL_TRUE, 0, no * 4, got, 0, NULL, NULL),
                     CL_SUCCESS);
        cr_assert(memcmp(got, out[0], no * sizeof(float)) == 0, "buffers: kv = x differs from the host result");
        free(got);
        clReleaseMemObject(bx);
        clReleaseMemObject(bo);
    }
    for (int k = 0; k < 2; k++) free(out[k]), free(gx[k]), free(gkv[k]);
    free(x), free(copy), free(go);
    for (int i = 0; i < 8; i++) free(w[i]);
    clattn_plan_free(plan);
}

Test(alias, shared_inputs_ref) { shared_inputs_on(ref_dev, 0); }
Test(alias, shared_inputs_opencl) { shared_inputs_on(cl_dev, 1); }
