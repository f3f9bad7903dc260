/* test_bench.c: the benchmark's op description (bench/attention_op.h) and the
 * clattn-bench program. The FLOP and byte formulas are checked against numbers
 * worked out by hand; clattn-bench (CLATTN_BENCH_PATH) is started with
 * fork/exec on ref and on the OpenCL device and its --json line is checked for
 * every documented key and for positive figures. No timing is asserted. */
#include "attention_op.h"
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static clattn_op op_of(size_t B, size_t T, size_t E, size_t H, int causal)
{
    clattn_op op = {0};
    op.batch = B;
    op.seq = T;
    op.dim = E;
    op.heads = H;
    op.causal = causal;
    return op;
}

/* ---------------------------------------------------------------- FLOPs and bytes */

Test(op, flops_default_config)
{
    /* B=4 T=512 E=512 H=8 (d=64):
     *   QKV  2 * 2048 * 1536 * 512   = 3 221 225 472
     *   out  2 * 2048 * 512 * 512    = 1 073 741 824
     *   core 4 * 4 * 8 * 512^2 * 64  = 2 147 483 648 */
    clattn_op op = op_of(4, 512, 512, 8, 0);
    clattn_op_flop_count f = clattn_op_flops(&op);
    cr_expect_eq(f.qkv_projection, 3221225472.0);
    cr_expect_eq(f.out_projection, 1073741824.0);
    cr_expect_eq(f.projections, 4294967296.0);
    cr_expect_eq(f.core, 2147483648.0);
    cr_expect_eq(f.scores, 1073741824.0);
    cr_expect_eq(f.context, 1073741824.0);
    cr_expect_eq(f.total, 6442450944.0);

    op.causal = 1; /* the core halves, the projections do not */
    f = clattn_op_flops(&op);
    cr_expect_eq(f.projections, 4294967296.0);
    cr_expect_eq(f.core, 1073741824.0);
    cr_expect_eq(f.scores, 536870912.0);
    cr_expect_eq(f.total, 5368709120.0);
}

Test(op, flops_small_configs)
{
    /* B=1 T=16 E=32 H=2 (d=16): QKV 2*16*96*32 = 98304, out 2*16*32*32 = 32768, core 4*1*2*256*16 = 32768 */
    clattn_op op = op_of(1, 16, 32, 2, 0);
    clattn_op_flop_count f = clattn_op_flops(&op);
    cr_expect_eq(f.qkv_projection, 98304.0);
    cr_expect_eq(f.out_projection, 32768.0);
    cr_expect_eq(f.core, 32768.0);
    cr_expect_eq(f.total, 163840.0);

    /* B=2 T=3 E=6 H=3 (d=2): QKV 2*6*18*6 = 1296, out 2*6*6*6 = 432, core 4*2*3*9*2 = 432; causal core 216 */
    op = op_of(2, 3, 6, 3, 0);
    f = clattn_op_flops(&op);
    cr_expect_eq(f.qkv_projection, 1296.0);
    cr_expect_eq(f.out_projection, 432.0);
    cr_expect_eq(f.core, 432.0);
    cr_expect_eq(f.total, 2160.0);
    op.causal = 1;
    cr_expect_eq(clattn_op_flops(&op).core, 216.0);
    cr_expect_eq(clattn_op_flops(&op).total, 1944.0);

    /* the core does not depend on how E is split into heads: H*d = E */
    clattn_op a = op_of(3, 10, 64, 1, 0), b = op_of(3, 10, 64, 16, 0);
    cr_expect_eq(clattn_op_flops(&a).core, clattn_op_flops(&b).core);
    cr_expect_eq(clattn_op_flops(&a).core, 4.0 * 3 * 100 * 64);
}

Test(op, softmax_bytes)
{
    /* B=4 H=8 T=512: 8 388 608 scores; read twice + written once, 4 bytes: 100 663 296 */
    clattn_op op = op_of(4, 512, 512, 8, 0);
    cr_expect_eq(clattn_op_softmax_bytes(&op), 100663296.0);
    op.causal = 1; /* masked scores are still read and written */
    cr_expect_eq(clattn_op_softmax_bytes(&op), 100663296.0);
    op.key_padding_mask = 1; /* + 1 byte per score in each of 2 passes */
    cr_expect_eq(clattn_op_softmax_bytes(&op), 100663296.0 + 16777216.0);
    op.key_padding_mask = 0;
    op.attn_mask = CLATTN_MASK_BOOL;
    cr_expect_eq(clattn_op_softmax_bytes(&op), 100663296.0 + 16777216.0);
    op.attn_mask = CLATTN_MASK_FLOAT; /* + 4 bytes per score in each of 2 passes */
    cr_expect_eq(clattn_op_softmax_bytes(&op), 100663296.0 + 67108864.0);

    /* B=1 H=2 T=16: 512 scores * 12 bytes = 6144 */
    op = op_of(1, 16, 32, 2, 0);
    cr_expect_eq(clattn_op_softmax_bytes(&op), 6144.0);
}

Test(op, check)
{
    char msg[128];
    clattn_op op = op_of(1, 16, 32, 2, 0);
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 0);
    op.heads = 3;
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 1);
    cr_expect(strstr(msg, "divide") != NULL, "%s", msg);
    op = op_of(0, 16, 32, 2, 0);
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 1);
    op = op_of(1, 0, 32, 2, 0);
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 1);
    op = op_of(1, 16, 32, 2, 0);
    op.dropout = 1.0f;
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 1);
    op.dropout = 0.1f;
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 0);
}

Test(op, make_fills_desc_and_weights)
{
    char msg[128];
    clattn_op op = op_of(2, 5, 12, 3, 1);
    op.dropout = 0.25f;
    clattn_op_data a, b;
    cr_assert_eq(clattn_op_make(&op, 42, &a, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(clattn_op_make(&op, 42, &b, msg, sizeof msg), 0, "%s", msg);
    const clattn_attention_desc *d = &a.desc;
    cr_expect_eq(d->batch, 2);
    cr_expect_eq(d->seq_q, 5);
    cr_expect_eq(d->embed, 12);
    cr_expect_eq(d->heads, 3);
    cr_expect_eq(d->head_dim_qk, 4);
    cr_expect_eq(d->head_dim_v, 4);
    cr_expect_eq(d->out_dim, 12);
    cr_expect_eq(d->causal, 1);
    cr_expect_eq(d->cross, 0);
    cr_expect_eq(d->layout, CLATTN_LAYOUT_LINEAR);
    cr_expect_eq(d->dropout, 0.25f);
    cr_expect_eq(a.x_count, 2 * 5 * 12);
    cr_expect_eq(a.out_count, 2 * 5 * 12);
    const clattn_attention_weights *ww = &a.weights;
    const struct { const float *w_query, *w_key, *w_value, *b_query, *b_key, *b_value, *w_out, *b_out; } wf = {
        ww->w_query, ww->w_key, ww->w_value, ww->b_query, ww->b_key, ww->b_value, ww->w_out, ww->b_out}, *w = &wf;
    cr_assert(w->w_query && w->w_key && w->w_value && w->w_out);
    cr_assert(w->b_query && w->b_key && w->b_value && w->b_out);
    const float bound = 1.0f / sqrtf(12.0f);
    for (size_t i = 0; i < 12 * 12; i++) {
        cr_expect(fabsf(w->w_query[i]) <= bound && fabsf(w->w_out[i]) <= bound);
        cr_expect(fabsf(w->w_key[i]) <= bound && fabsf(w->w_value[i]) <= bound);
    }
    for (size_t i = 0; i < 12; i++) cr_expect(fabsf(w->b_query[i]) <= 0.1f && fabsf(w->b_out[i]) <= 0.1f);
    for (size_t i = 0; i < a.x_count; i++) cr_expect(a.x[i] >= -1.0f && a.x[i] <= 1.0f);
    /* deterministic: the same seed gives the same numbers, another seed others */
    cr_expect(memcmp(a.x, b.x, a.x_count * sizeof *a.x) == 0);
    cr_expect(memcmp(a.weights.w_value, b.weights.w_value, 144 * sizeof(float)) == 0);
    clattn_op_data c;
    cr_assert_eq(clattn_op_make(&op, 43, &c, msg, sizeof msg), 0);
    cr_expect(memcmp(a.x, c.x, a.x_count * sizeof *a.x) != 0);

    /* the description plans and runs (ref) */
    clattn_device *dev = tu_open_ref();
    cr_assert(dev);
    clattn_plan *plan = NULL;
    cr_assert_eq(tu_plan_create(dev, &a.desc, &a.weights, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float out[2 * 5 * 12];
    for (size_t i = 0; i < 2 * 5 * 12; i++) out[i] = NAN;
    cr_assert_eq(a.out_count, 2 * 5 * 12);
    clattn_attention_args args = {.x = a.x, .out = out};
    cr_expect_eq(tu_plan_execute(plan, &args), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    double o64[2 * 5 * 12];
    cr_assert_eq(oracle_attention(&a.desc, &a.weights, &args, o64, NULL), 0);
    cr_expect_eq(oracle_compare(out, o64, a.out_count, TU_ATOL, TU_RTOL, msg, sizeof msg), 0, "vs float64: %s", msg);
    clattn_plan_free(plan);
    clattn_device_free(dev);
    clattn_op_data_free(&a);
    clattn_op_data_free(&b);
    clattn_op_data_free(&c);
    cr_expect_null(a.x);

    op.heads = 5; /* does not divide 12 */
    cr_expect_eq(clattn_op_make(&op, 1, &a, msg, sizeof msg), 1);
    cr_expect(strstr(msg, "divide") != NULL, "%s", msg);
}

/* --no-proj: the core alone (no weights, x holds Q, K and V); its FLOPs the core's only; in half precision x in the
 * type; it plans and runs on ref against the float64 oracle; the encoder refuses it */
Test(op, no_proj_is_the_core_alone)
{
    char msg[128];
    clattn_op op = op_of(2, 9, 16, 2, 1);
    op.no_proj = 1;
    const clattn_op_flop_count f = clattn_op_flops(&op);
    cr_expect_eq(f.projections, 0.0);
    cr_expect_eq(f.total, f.core);
    cr_expect_eq(f.core, 4.0 * 2 * 2 * 9 * 9 * 8 * 0.5);
    for (int t = 0; t < 2; t++) {
        op.dtype = t ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F32;
        clattn_op_data a;
        cr_assert_eq(clattn_op_make(&op, 7, &a, msg, sizeof msg), 0, "%s", msg);
        const clattn_attention_weights *w = &a.weights;
        cr_expect(!w->w_query && !w->w_key && !w->w_value && !w->w_out && !w->b_query && !w->b_out);
        cr_expect_eq(a.desc.out_dim, 0);
        cr_expect_eq(a.desc.dtype, op.dtype);
        cr_expect_eq(a.elem, t ? 2 : 4);
        clattn_device *dev = tu_open_ref();
        clattn_plan *plan = NULL;
        cr_assert_eq(tu_plan_create(dev, &a.desc, &a.weights, &plan), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        cr_expect_eq(clattn_plan_out_width(plan), 16);
        void *out = tu_poisoned_typed(2 * 9 * 16, op.dtype);
        clattn_attention_args args = {.x = a.x_in, .out = out};
        cr_assert_eq(tu_plan_execute(plan, &args), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        double o64[2 * 9 * 16];
        clattn_attention_args oa = {.x = a.x}; /* the floats (rounded to the type) the oracle reads */
        cr_assert_eq(oracle_attention(&a.desc, &a.weights, &oa, o64, NULL), 0);
        float *got = tu_widened(out, 2 * 9 * 16, op.dtype);
        double atol, rtol;
        tu_dtype_tolerance(op.dtype, &atol, &rtol);
        cr_expect_eq(oracle_compare(got, o64, 2 * 9 * 16, atol, rtol, msg, sizeof msg), 0, "vs float64: %s", msg);
        free(got), free(out);
        clattn_plan_free(plan);
        clattn_device_free(dev);
        clattn_op_data_free(&a);
    }
    op.dtype = CLATTN_DTYPE_F32;
    op.encoder = 1;
    clattn_op_data e;
    cr_expect_eq(clattn_op_make(&op, 1, &e, msg, sizeof msg), 1);
    cr_expect(strstr(msg, "no_proj") != NULL, "%s", msg);
}

Test(op, encoder_flops_and_check)
{
    /* B=2 T=3 E=6 H=3, F=13: attention as above (QKV 1296, out 432, core 432) + FFN 4*6*13*6 = 1872 */
    clattn_op op = op_of(2, 3, 6, 3, 0);
    op.encoder = 1;
    op.ff_dim = 13;
    clattn_op_flop_count f = clattn_op_flops(&op);
    cr_expect_eq(f.ffn, 1872.0);
    cr_expect_eq(f.projections, 1728.0);
    cr_expect_eq(f.total, 1728.0 + 432.0 + 1872.0);
    op.ff_dim = 0; /* default F = 4E = 24: 4*6*24*6 = 3456 */
    cr_expect_eq(clattn_op_ff_dim(&op), 24);
    cr_expect_eq(clattn_op_flops(&op).ffn, 3456.0);
    op.encoder = 0; /* attention alone: no FFN */
    cr_expect_eq(clattn_op_flops(&op).ffn, 0.0);
    cr_expect_eq(clattn_op_flops(&op).total, 2160.0);

    char msg[128];
    op.encoder = 1;
    op.dropout = 0.1f;
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 1);
    cr_expect(strstr(msg, "dropout") != NULL, "%s", msg);
    op.dropout = 0.0f;
    op.activation = (clattn_activation)7;
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 1);
    op.activation = CLATTN_ACTIVATION_GELU;
    cr_expect_eq(clattn_op_check(&op, msg, sizeof msg), 0, "%s", msg);
}

/* The bench's encoder data plans and runs on ref and OpenCL, and the two agree with each other and with the float64
 * oracle (what the bench times is right); in F16 and BF16 (--dtype) x and every weight are in the type, and the
 * oracle reads the same values widened. */
static void encoder_op_matches_ref(int norm_first, clattn_activation act, int causal, size_t T, size_t F,
                                   clattn_dtype t)
{
    char msg[256];
    clattn_op op = op_of(2, T, 12, 3, causal);
    op.encoder = 1;
    op.ff_dim = F;
    op.activation = act;
    op.norm_first = norm_first;
    op.dtype = t;
    clattn_op_data data;
    cr_assert_eq(clattn_op_make(&op, 99 + T, &data, msg, sizeof msg), 0, "%s", msg);
    const clattn_encoder_desc *d = &data.encoder_desc;
    cr_expect_eq(d->ff_dim, F ? F : 48);
    cr_expect_eq(d->norm_first, norm_first);
    cr_expect_eq(d->activation, act);
    cr_expect_eq(d->attn.causal, causal);
    cr_expect_eq(d->attn.seq_q, T);
    const clattn_encoder_weights *w = &data.encoder_weights;
    cr_assert(w->w_ff1 && w->b_ff1 && w->w_ff2 && w->b_ff2 && w->ln1_weight && w->ln1_bias && w->ln2_weight &&
              w->ln2_bias && w->attn.w_query && w->attn.w_out);
    cr_expect_eq(d->attn.dtype, t);
    cr_expect_eq(data.x_in, t == CLATTN_DTYPE_F32 ? (const void *)data.x : data.typed_);
    /* the floats behind the typed arrays (the values the plans read, widened): every weight, and x */
    clattn_encoder_desc d32 = *d;
    d32.attn.dtype = CLATTN_DTYPE_F32;
    clattn_encoder_weights w32 = *w;
    const void **slots[16] = {&w32.attn.w_query, &w32.attn.w_key, &w32.attn.w_value, &w32.attn.w_out,
                              &w32.attn.b_query, &w32.attn.b_key, &w32.attn.b_value, &w32.attn.b_out,
                              &w32.w_ff1, &w32.b_ff1, &w32.w_ff2, &w32.b_ff2,
                              &w32.ln1_weight, &w32.ln1_bias, &w32.ln2_weight, &w32.ln2_bias};
    for (int i = 0; i < 16; i++) {
        const void *typed = *slots[i];
        *slots[i] = clattn_op_data_floats(&data, typed);
        if (t != CLATTN_DTYPE_F32) { /* the weight in the type: its elements' bits are the floats' rounding */
            const float *f = *slots[i];
            cr_expect_eq(((const uint16_t *)typed)[0], tu_dtype_bits(f[0], t), "weight %d", i);
            cr_expect_eq((double)f[0], tu_dtype_round(f[0], t), "weight %d", i);
        }
    }
    cr_expect_eq(clattn_op_data_floats(&data, data.x_in), data.x);
    const float *g1 = w32.ln1_weight;
    for (size_t i = 0; i < 12; i++) cr_expect(g1[i] >= 0.9f && g1[i] <= 1.1f);

    clattn_device *ref = tu_open_ref(), *cl = tu_open_opencl();
    void *want = tu_poisoned_typed(data.out_count, t), *got = tu_poisoned_typed(data.out_count, t);
    clattn_encoder_plan *pr = NULL, *pc = NULL;
    cr_assert_eq(tu_encoder_plan_create(ref, d, w, &pr), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    cr_assert_eq(tu_encoder_plan_create(cl, d, w, &pc), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    clattn_encoder_args a = {.x = data.x_in, .out = want};
    cr_assert_eq(tu_encoder_plan_execute(pr, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    a.out = got;
    cr_assert_eq(tu_encoder_plan_execute(pc, &a), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    float *got32 = tu_widened(got, data.out_count, t), *want32 = tu_widened(want, data.out_count, t);
    double atol, rtol;
    tu_dtype_tolerance_of(t, TU_ATOL, TU_RTOL, &atol, &rtol);
    size_t bad = tu_compare(got32, want32, data.out_count, atol, rtol, msg, sizeof msg);
    cr_expect_eq(bad, 0, "T=%zu F=%zu dtype %d: %zu of %zu elements differ; %s", T, F, (int)t, bad, data.out_count,
                 msg);
    double *o64 = malloc(data.out_count * sizeof *o64);
    cr_assert_not_null(o64);
    cr_assert_eq(oracle_encoder(&d32, &w32, data.x, NULL, o64), 0);
    bad = oracle_compare(got32, o64, data.out_count, atol, rtol, msg, sizeof msg);
    cr_expect_eq(bad, 0, "T=%zu F=%zu dtype %d vs float64: %zu of %zu differ; %s", T, F, (int)t, bad,
                 data.out_count, msg);
    free(o64);
    clattn_encoder_plan_free(pr);
    clattn_encoder_plan_free(pc);
    clattn_device_free(ref);
    clattn_device_free(cl);
    free(want), free(got), free(want32), free(got32);
    clattn_op_data_free(&data);
}

Test(op, encoder_data_opencl_matches_ref, .timeout = 300)
{
    encoder_op_matches_ref(0, CLATTN_ACTIVATION_RELU, 0, 7, 0, CLATTN_DTYPE_F32);
    encoder_op_matches_ref(1, CLATTN_ACTIVATION_GELU, 1, 1, 37, CLATTN_DTYPE_F32);
    encoder_op_matches_ref(0, CLATTN_ACTIVATION_GELU, 1, 61, 25, CLATTN_DTYPE_F32);
    encoder_op_matches_ref(1, CLATTN_ACTIVATION_RELU, 0, 13, 0, CLATTN_DTYPE_F16); /* --encoder --dtype */
    encoder_op_matches_ref(0, CLATTN_ACTIVATION_GELU, 1, 7, 25, CLATTN_DTYPE_BF16);
}

/* ---------------------------------------------------------------- clattn-bench, end to end */

typedef struct run_result {
    int status;        /* exit status, or -1 when killed */
    char out[16384];   /* stdout */
    char err[4096];    /* stderr */
} run_result;

static void read_fd(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        if (n == cap - 1) {   /* full: drain the rest */
            char sink[4096];
            while (read(fd, sink, sizeof sink) > 0) {}
            break;
        }
    }
    buf[n] = '\0';
}

/* Run clattn-bench with argv (argv[0] ignored, NULL-terminated); stdout through a pipe, stderr via a file. */
static void run_bench(const char *const *args, run_result *r)
{
    char err_path[] = "/tmp/clattn_test_bench_err_XXXXXX";
    int err_fd = mkstemp(err_path);
    cr_assert(err_fd >= 0, "mkstemp failed");
    int p[2];
    cr_assert(pipe(p) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork failed");
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(err_fd, 2);
        close(p[0]);
        close(p[1]);
        close(err_fd);
        const char *argv[32];
        int n = 0;
        argv[n++] = CLATTN_BENCH_PATH;
        for (int i = 1; args[i] && n < 31; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(CLATTN_BENCH_PATH, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    read_fd(p[0], r->out, sizeof r->out);
    close(p[0]);
    int ws = 0;
    cr_assert(waitpid(pid, &ws, 0) == pid);
    r->status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    lseek(err_fd, 0, SEEK_SET);
    read_fd(err_fd, r->err, sizeof r->err);
    close(err_fd);
    unlink(err_path);
}

/* The text just after "key": in a one-line JSON object, or NULL (a small key search, no JSON library). */
static const char *json_value(const char *json, const char *key)
{
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p ? p + strlen(pat) : NULL;
}

static int json_is_null(const char *v) { return v && strncmp(v, "null", 4) == 0; }

/* A number value: 1 and *out on success, 0 when absent, null or not a number. */
static int json_number(const char *json, const char *key, double *out)
{
    const char *v = json_value(json, key);
    if (!v || json_is_null(v)) return 0;
    char *end;
    *out = strtod(v, &end);
    return end != v && (*end == ',' || *end == '}');
}

static const char *const all_keys[] = {
    "device", "driver", "batch", "seq", "dim", "heads", "causal", "first_call_ms", "median_ms", "min_ms", "max_ms",
    "host_median_ms", "gflops", "gemm_share", "sgemm_gflops", "sgemm_fraction", "softmax_gbps", "stages"};

static void expect_positive(const char *json, const char *key)
{
    double v = 0;
    cr_expect(json_number(json, key, &v), "%s is not a number in %s", key, json);
    cr_expect(v > 0 && isfinite(v), "%s = %g is not positive", key, v);
}

/* Checks shared by both devices; returns the JSON line (r->out). */
static const char *check_common(const run_result *r, const char *device_spec)
{
    cr_assert_eq(r->status, 0, "clattn-bench --device %s exited %d; stderr:\n%s", device_spec, r->status, r->err);
    const char *json = r->out;
    cr_assert(json[0] == '{', "stdout does not start a JSON object:\n%s", json);
    const char *nl = strchr(json, '\n');
    cr_assert(nl && nl[1] == '\0', "expected exactly one line of JSON:\n%s", json);
    cr_assert(nl[-1] == '}', "the JSON line does not end its object:\n%s", json);
    for (size_t i = 0; i < sizeof all_keys / sizeof all_keys[0]; i++)
        cr_expect(json_value(json, all_keys[i]) != NULL, "key \"%s\" missing from\n%s", all_keys[i], json);
    char want_version[64];
    snprintf(want_version, sizeof want_version, "\"%s\"", clattn_version());
    const char *ver = json_value(json, "clattn_version"), *ts = json_value(json, "timestamp");
    cr_expect(ver && strncmp(ver, want_version, strlen(want_version)) == 0, "clattn_version is not %s", want_version);
    /* "YYYY-MM-DDTHH:MM:SSZ" */
    cr_expect(ts && strlen(ts) > 21 && ts[0] == '"' && ts[5] == '-' && ts[11] == 'T' && ts[20] == 'Z' && ts[21] == '"',
              "timestamp is not an ISO 8601 UTC time: %.24s", ts ? ts : "(missing)");
    const char *dv = json_value(json, "device"), *dr = json_value(json, "driver");
    cr_expect(dv && dv[0] == '"' && dv[1] != '"', "device is not a non-empty string");
    cr_expect(dr && dr[0] == '"' && dr[1] != '"', "driver is not a non-empty string");
    double v;
    cr_expect(json_number(json, "batch", &v) && v == 1);
    cr_expect(json_number(json, "seq", &v) && v == 16);
    cr_expect(json_number(json, "dim", &v) && v == 32);
    cr_expect(json_number(json, "heads", &v) && v == 2);
    cr_expect(strncmp(json_value(json, "causal"), "false", 5) == 0);
    expect_positive(json, "first_call_ms");
    expect_positive(json, "host_median_ms");
    expect_positive(json, "gflops");
    const char *stages = json_value(json, "stages");
    cr_assert(stages && stages[0] == '{', "stages is not an object");
    const char *stages_end = strchr(stages, '}');
    cr_assert(stages_end);
    for (int s = 0; s < (int)clattn_stage_count(); s++) {
        char pat[64];
        snprintf(pat, sizeof pat, "\"%s\":", clattn_stage_name((clattn_stage)s));
        const char *at = strstr(stages, pat);
        cr_expect(at && at < stages_end, "stage %s missing from stages", pat);
    }
    return json;
}

static double stage_ms(const char *json, const char *name)
{
    const char *stages = json_value(json, "stages");
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", name);
    const char *at = strstr(stages, pat);
    if (!at || json_is_null(at + strlen(pat))) return -1.0;
    return strtod(at + strlen(pat), NULL);
}

Test(bench, smoke_ref, .timeout = 120)
{
    const char *args[] = {"clattn-bench", "--json", "--batch", "1", "--seq", "16", "--dim", "32", "--heads", "2",
                          "--iters", "2", "--warmup", "1", "--device", "ref", NULL};
    run_result *r = calloc(1, sizeof *r);
    run_bench(args, r);
    const char *json = check_common(r, "ref");
    cr_expect(strstr(json, "\"driver\":\"n/a\"") != NULL, "ref's driver is not n/a");
    /* ref: no device-resident figures and no SGEMM: null */
    const char *nulls[] = {"median_ms", "min_ms", "max_ms", "sgemm_gflops", "sgemm_fraction"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++)
        cr_expect(json_is_null(json_value(json, nulls[i])), "%s should be null on ref", nulls[i]);
    cr_expect(stage_ms(json, "qkv_projection") > 0 && stage_ms(json, "out_projection") > 0);
    free(r);
}

static void smoke_opencl(const char *algorithm)
{
    const char *spec = tu_opencl_spec();
    const char *args[] = {"clattn-bench", "--json", "--batch", "1", "--seq", "16", "--dim", "32", "--heads", "2",
                          "--iters", "2", "--warmup", "1", "--device", spec, "--algorithm", algorithm, NULL};
    run_result *r = calloc(1, sizeof *r);
    run_bench(args, r);
    const char *json = check_common(r, spec);
    cr_expect(strstr(json, "\"driver\":\"n/a\"") == NULL, "an OpenCL device reports its driver version");
    const int fused = strcmp(algorithm, "unfused") != 0; /* auto is fused here */
    char want[64];
    snprintf(want, sizeof want, "\"algorithm\":\"%s\"", fused ? "fused" : "unfused");
    cr_expect(strstr(json, want) != NULL, "--algorithm %s: expected %s in\n%s", algorithm, want, json);
    const char *positive[] = {"median_ms", "min_ms", "max_ms", "sgemm_gflops", "sgemm_fraction", "device_bytes"};
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++) expect_positive(json, positive[i]);
    /* the figures from the stage times: where the device's timestamps are not real (the probes: Mesa's rusticl) the
     * stages are not timed, the reason is given, and every such figure is null */
    const char *unsupported = json_value(json, "stages_unsupported");
    cr_assert(unsupported, "stages_unsupported missing:\n%s", json);
    const int timed = json_is_null(unsupported);
    if (!timed) cr_log_info("stages not timed on this device, as the bench says: %.300s", unsupported);
    clattn_device *dev = tu_open_opencl(); /* a device whose timestamps are real must be timed */
    const int real = strstr(clattn_device_facts(dev), "profiling timestamps: real") != NULL;
    clattn_device_free(dev);
    cr_assert_eq(timed, real, "the stages are %stimed on a device whose timestamps are %sreal", timed ? "" : "not ",
                 real ? "" : "not ");
    const char *staged[] = {"gemm_share", "core_ms", "core_gflops", "softmax_gbps"};
    for (size_t i = 0; i < sizeof staged / sizeof staged[0]; i++) {
        if (timed && (i < 3 || !fused)) expect_positive(json, staged[i]);
        else cr_expect(json_is_null(json_value(json, staged[i])), "%s: %s should be null (%s)", algorithm, staged[i],
                       timed ? "no softmax pass" : "stages not timed");
    }
    double lo = 0, med = 0, hi = 0, share = 0;
    cr_expect(json_number(json, "min_ms", &lo) && json_number(json, "median_ms", &med) &&
                  json_number(json, "max_ms", &hi), "min/median/max_ms missing:\n%s", json);
    cr_expect(lo <= med && med <= hi, "min %g <= median %g <= max %g", lo, med, hi);
    if (timed) {
        cr_expect(json_number(json, "gemm_share", &share), "gemm_share missing");
        cr_expect(share <= 1.0, "gemm_share %g > 1", share);
    }
    for (int s = 0; s < (int)clattn_stage_count(); s++) {
        const char *name = clattn_stage_name((clattn_stage)s);
        /* the unfused core reads Q, K, V where the projections left them: no head split or merge (a kv_half plan's) */
        const int core = s == CLATTN_STAGE_SCORES || s == CLATTN_STAGE_SOFTMAX || s == CLATTN_STAGE_CONTEXT;
        const int copies = s == CLATTN_STAGE_HEAD_SPLIT || s == CLATTN_STAGE_HEAD_MERGE;
        const int runs = timed && !copies && (s == CLATTN_STAGE_ATTENTION ? fused : core ? !fused : 1);
        if (runs) cr_expect(stage_ms(json, name) > 0, "%s: stage %s has no positive time", algorithm, name);
        else cr_expect(stage_ms(json, name) < 0, "%s: stage %s should be null", algorithm, name);
    }
    free(r);
}

Test(bench, smoke_opencl, .timeout = 300) { smoke_opencl("auto"); }
Test(bench, smoke_opencl_unfused, .timeout = 300) { smoke_opencl("unfused"); }
Test(bench, smoke_opencl_fused, .timeout = 300) { smoke_opencl("fused"); }

/* --encoder: the whole layer, timed as a whole; the stages are null, the FFN is counted */
static void encoder_smoke(const char *spec)
{
    const char *args[] = {"clattn-bench", "--json", "--encoder", "--ff", "40", "--activation", "gelu", "--norm-first",
                          "--batch", "1", "--seq", "16", "--dim", "32", "--heads", "2", "--iters", "2", "--warmup",
                          "1", "--device", spec, NULL};
    run_result *r = calloc(1, sizeof *r);
    run_bench(args, r);
    const char *json = check_common(r, spec);
    cr_expect(strncmp(json_value(json, "encoder"), "true", 4) == 0, "encoder is not true:\n%s", json);
    cr_expect(strncmp(json_value(json, "norm_first"), "true", 4) == 0);
    cr_expect(strncmp(json_value(json, "activation"), "\"gelu\"", 6) == 0);
    double v = 0;
    cr_expect(json_number(json, "ff_dim", &v) && v == 40);
    /* FFN 4*16*40*32 = 81920; attention 2*16*96*32 + 2*16*32*32 + 4*2*256*16 = 98304 + 32768 + 32768 */
    cr_expect(json_number(json, "ffn_flops", &v) && v == 81920.0, "ffn_flops %g", v);
    cr_expect(json_number(json, "flops", &v) && v == 81920.0 + 163840.0, "flops %g", v);
    for (int s = 0; s < CLATTN_STAGE_COUNT; s++)
        cr_expect(stage_ms(json, clattn_stage_name((clattn_stage)s)) < 0, "stage %s should be null",
                  clattn_stage_name((clattn_stage)s));
    cr_expect(json_is_null(json_value(json, "gemm_share")) && json_is_null(json_value(json, "softmax_gbps")));
    if (strcmp(spec, "ref") != 0) {
        expect_positive(json, "median_ms");
        expect_positive(json, "sgemm_gflops");
    }
    free(r);
}

Test(bench, encoder_ref, .timeout = 120) { encoder_smoke("ref"); }

Test(bench, encoder_opencl, .timeout = 300)
{
    encoder_smoke(tu_opencl_spec());
}

Test(bench, encoder_options_need_encoder, .timeout = 60)
{
    run_result *r = calloc(1, sizeof *r);
    const char *ff_alone[] = {"clattn-bench", "--device", "ref", "--ff", "64", NULL};
    run_bench(ff_alone, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "--encoder") != NULL, "stderr: %s", r->err);
    const char *enc_dropout[] = {"clattn-bench", "--device", "ref", "--encoder", "--dropout", "0.1", NULL};
    run_bench(enc_dropout, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "dropout") != NULL, "stderr: %s", r->err);
    const char *bad_act[] = {"clattn-bench", "--device", "ref", "--encoder", "--activation", "tanh", NULL};
    run_bench(bad_act, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "tanh") != NULL, "stderr: %s", r->err);
    free(r);
}

Test(bench, csv_appends_with_one_header, .timeout = 120)
{
    char path[] = "/tmp/clattn_test_bench_csv_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    unlink(path); /* the bench creates it: a new file gets the header */
    const char *args[] = {"clattn-bench", "--device", "ref", "--batch", "1", "--seq", "8", "--dim", "8", "--heads",
                          "2", "--iters", "1", "--warmup", "0", "--csv", path, NULL};
    run_result *r = calloc(1, sizeof *r);
    for (int k = 0; k < 2; k++) {
        run_bench(args, r);
        cr_assert_eq(r->status, 0, "stderr:\n%s", r->err);
    }
    FILE *f = fopen(path, "r");
    cr_assert(f, "no CSV file written");
    char line[4096];
    int lines = 0, headers = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        if (strncmp(line, "device,driver,batch,seq", 23) == 0) headers++;
    }
    fclose(f);
    unlink(path);
    cr_expect_eq(lines, 3, "expected a header and two rows, got %d lines", lines);
    cr_expect_eq(headers, 1);
    free(r);
}

Test(bench, errors_exit_nonzero_with_a_message, .timeout = 60)
{
    run_result *r = calloc(1, sizeof *r);
    const char *bad_opt[] = {"clattn-bench", "--frobnicate", NULL};
    run_bench(bad_opt, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "--frobnicate") != NULL, "stderr: %s", r->err);

    const char *bad_heads[] = {"clattn-bench", "--device", "ref", "--dim", "10", "--heads", "3", NULL};
    run_bench(bad_heads, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "divide") != NULL, "stderr: %s", r->err);

    const char *bad_device[] = {"clattn-bench", "--device", "name=no-such-device-anywhere", "--seq", "8", NULL};
    run_bench(bad_device, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "--device") != NULL, "stderr: %s", r->err);
    cr_expect_eq(r->out[0], '\0', "nothing on stdout on an error");

    const char *sweep_and_seq[] = {"clattn-bench", "--sweep", "--seq", "64", NULL};
    run_bench(sweep_and_seq, r);
    cr_expect_neq(r->status, 0);
    free(r);
}

/* ---------------------------------------------------------------- clattn-bench --decode */

/* kv: the cache's type as --decode names it (NULL: float; "half" through --kv-half, the others through --kv-type) */
static void decode_smoke(const char *spec, const char *kv, const char *window)
{
    run_result *r = calloc(1, sizeof *r);
    const char *args[32] = {"clattn-bench", "--decode", "--device", spec, "--context", "100", "--heads", "4",
                            "--kv-heads", "2", "--head-dim", "8", "--dim", "16", "--iters", "3", "--warmup", "1",
                            "--json"};
    int n = 19;
    if (kv && !strcmp(kv, "half")) args[n++] = "--kv-half";
    else if (kv) args[n++] = "--kv-type", args[n++] = kv;
    if (window) args[n++] = "--window", args[n++] = window;
    args[n] = NULL;
    run_bench(args, r);
    cr_assert_eq(r->status, 0, "exit %d; stderr: %s", r->status, r->err);
    const char *j = r->out;
    cr_assert(strchr(j, '\n') == j + strlen(j) - 1, "not one JSON line: %s", j);
    const char *keys[] = {"step_ms", "step_min_ms", "step_max_ms", "first_step_ms", "tokens_per_s", "kv_bytes",
                          "weight_bytes", "kv_gbps", "copy_gbps", "kv_bandwidth_fraction"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) expect_positive(j, keys[i]);
    double ctx = 0, kvb = 0, step = 0, gbps = 0, tps = 0, copy = 0, frac = 0;
    cr_assert(json_number(j, "context", &ctx) && ctx == 100);
    json_number(j, "kv_bytes", &kvb), json_number(j, "step_ms", &step), json_number(j, "kv_gbps", &gbps);
    json_number(j, "tokens_per_s", &tps), json_number(j, "copy_gbps", &copy);
    json_number(j, "kv_bandwidth_fraction", &frac);
    /* B * HK * visible positions * (dk + dv) * element size: 101 positions (the cache and the new token),
     * or the window; an int8 cache's rows also have a float scale each, key and value */
    const double visible = window ? atof(window) : 101.0;
    const int int8 = kv && !strcmp(kv, "int8");
    const double elem = !kv ? 4.0 : int8 ? 1.0 : 2.0;
    cr_expect(fabs(kvb - 1 * 2 * visible * (16 * elem + (int8 ? 8.0 : 0.0))) < 0.5, "kv_bytes = %g", kvb);
    cr_expect(fabs(gbps - kvb / (step * 1e6)) <= 1e-3 * gbps, "kv_gbps %g is not kv_bytes / step", gbps);
    cr_expect(fabs(tps - 1e3 / step) <= 1e-3 * tps, "tokens_per_s %g is not 1 / step", tps);
    cr_expect(fabs(frac - gbps / copy) <= 1e-3 * frac, "kv_bandwidth_fraction %g is not kv_gbps / copy_gbps", frac);
    const char *v = json_value(j, "kv_type");
    char want[16];
    snprintf(want, sizeof want, "\"%s\"", kv ? kv : "float");
    cr_expect(v && strncmp(v, want, strlen(want)) == 0, "kv_type: %s", j);
    cr_expect(json_value(j, "clattn_version") && json_value(j, "timestamp") && json_value(j, "device"), "%s", j);
    free(r);
}

Test(bench, decode_ref, .timeout = 120) { decode_smoke("ref", NULL, NULL); }
Test(bench, decode_opencl, .timeout = 300)
{
    decode_smoke(tu_opencl_spec(), NULL, NULL);
    decode_smoke(tu_opencl_spec(), "half", "37");
    decode_smoke(tu_opencl_spec(), "int8", NULL);
    decode_smoke(tu_opencl_spec(), "bf16", "37");
}

/* --new-tokens N --tree (a speculative verify step): the step takes N tokens per sequence as a draft tree, tokens/s
 * counts them, and the KV bytes cover the cache up to the last of them (C + N positions) */
Test(bench, decode_new_tokens, .timeout = 120)
{
    run_result *r = calloc(1, sizeof *r);
    const char *args[] = {"clattn-bench", "--decode", "--device", "ref", "--context", "100", "--heads", "4", "--kv-heads",
                          "2", "--head-dim", "8", "--dim", "16", "--iters", "2", "--warmup", "1", "--new-tokens", "5",
                          "--tree", "--json", NULL};
    run_bench(args, r);
    cr_assert_eq(r->status, 0, "exit %d; stderr: %s", r->status, r->err);
    double n = 0, kvb = 0, step = 0, tps = 0;
    cr_assert(json_number(r->out, "new_tokens", &n) && n == 5, "%s", r->out);
    const char *tr = json_value(r->out, "tree");
    cr_expect(tr && strncmp(tr, "true", 4) == 0, "tree: %s", r->out);
    json_number(r->out, "kv_bytes", &kvb), json_number(r->out, "step_ms", &step);
    json_number(r->out, "tokens_per_s", &tps);
    cr_expect(fabs(kvb - 2.0 * 105 * 16 * 4) < 0.5, "kv_bytes = %g", kvb);
    cr_expect(fabs(tps - 5e3 / step) <= 1e-3 * tps, "tokens_per_s %g is not 5 / step", tps);
    const char *many[] = {"clattn-bench", "--decode", "--device", "ref", "--new-tokens", "17", NULL};
    run_bench(many, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "--new-tokens: at most 16") != NULL, "stderr: %s", r->err);
    free(r);
}

/* --page-size N: the step on a paged cache (the JSON says so); refused when not a power of two */
Test(bench, decode_paged, .timeout = 120)
{
    run_result *r = calloc(1, sizeof *r);
    const char *args[] = {"clattn-bench", "--decode", "--device", "ref", "--context", "100", "--heads", "4", "--kv-heads",
                          "2", "--head-dim", "8", "--dim", "16", "--iters", "2", "--warmup", "1", "--page-size", "16",
                          "--json", NULL};
    run_bench(args, r);
    cr_assert_eq(r->status, 0, "exit %d; stderr: %s", r->status, r->err);
    double page = 0;
    cr_assert(json_number(r->out, "page_size", &page) && page == 16, "%s", r->out);
    const char *bad[] = {"clattn-bench", "--decode", "--device", "ref", "--page-size", "12", NULL};
    run_bench(bad, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "--page-size: a power of two") != NULL, "stderr: %s", r->err);
    free(r);
}

Test(bench, decode_errors, .timeout = 60)
{
    run_result *r = calloc(1, sizeof *r);
    const char *bad_kv[] = {"clattn-bench", "--decode", "--device", "ref", "--heads", "4", "--kv-heads", "3", NULL};
    run_bench(bad_kv, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "--kv-heads") != NULL, "stderr: %s", r->err);
    const char *sweep_ctx[] = {"clattn-bench", "--decode", "--sweep", "--context", "64", NULL};
    run_bench(sweep_ctx, r);
    cr_expect_neq(r->status, 0);
    const char *bad_type[] = {"clattn-bench", "--decode", "--device", "ref", "--kv-type", "int4", NULL};
    run_bench(bad_type, r);
    cr_expect_neq(r->status, 0);
    cr_expect(strstr(r->err, "--kv-type: 'int4' is not") != NULL, "stderr: %s", r->err);
    const char *unknown[] = {"clattn-bench", "--decode", "--causal", NULL};
    run_bench(unknown, r);
    cr_expect_eq(r->status, 2);
    cr_expect(strstr(r->err, "--causal") != NULL, "stderr: %s", r->err);
    free(r);
}

/* The device and configuration lines come first on stderr; --progress names each phase. */
Test(bench, start_lines_and_progress, .timeout = 120)
{
    run_result *r = calloc(1, sizeof *r);
    const char *args[] = {"clattn-bench", "--device", "ref", "--batch", "1", "--seq", "8", "--dim", "8", "--heads", "2",
                          "--iters", "2", "--warmup", "1", "--progress", NULL};
    run_bench(args, r);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    cr_assert(strncmp(r->err, "clattn-bench: device ref", 24) == 0, "the first line is not the device: %s", r->err);
    const char *cfg = strstr(r->err, "clattn-bench: self-attention B=1 T=8 E=8 H=2 non-causal");
    const char *first = strstr(r->err, "T=8: first call (plan creation");
    const char *took = strstr(r->err, "T=8: first call took");
    const char *host = strstr(r->err, "T=8: host runs 0/2");
    cr_assert(cfg && first && took && host, "stderr: %s", r->err);
    cr_assert(cfg < first && first < took && took < host, "phases out of order: %s", r->err);
    const char *quiet[] = {"clattn-bench", "--device", "ref", "--batch", "1", "--seq", "8", "--dim", "8", "--heads",
                           "2", "--iters", "2", "--warmup", "1", NULL};
    run_bench(quiet, r);
    cr_assert_eq(r->status, 0);
    cr_assert(strstr(r->err, "clattn-bench: device ref") && !strstr(r->err, "first call"),
              "without --progress: the start lines only: %s", r->err);
    free(r);
}

/* Usage errors exit 2, as clattn's; runtime failures 1. --opt=value is the same as --opt value. */
Test(bench, usage_errors_exit_2_and_equals_values, .timeout = 120)
{
    run_result *r = calloc(1, sizeof *r);
    const char *const cases[][8] = {
        {"clattn-bench", "--bogus", NULL},
        {"clattn-bench", "--seq", "0", NULL},
        {"clattn-bench", "--seq=abc", NULL},
        {"clattn-bench", "--batch", NULL},
        {"clattn-bench", "--algorithm=fast", NULL},
        {"clattn-bench", "--budget", "-1", NULL},
        {"clattn-bench", "--ff", "8", NULL},                       /* encoder options without --encoder */
        {"clattn-bench", "--decode", "--context", "x", NULL},
        {"clattn-bench", "--decode", "--heads=4", "--kv-heads=3", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_bench(cases[i], r);
        cr_expect_eq(r->status, 2, "%s %s: exit %d; stderr: %s", cases[i][1], cases[i][2] ? cases[i][2] : "",
                     r->status, r->err);
        cr_expect(strncmp(r->err, "clattn-bench: ", 14) == 0, "stderr: %s", r->err);
    }
    const char *eq[] = {"clattn-bench", "--device=ref", "--batch=1", "--seq=8", "--dim=8", "--heads=2", "--iters=2",
                        "--warmup=1", "--json", NULL};
    run_bench(eq, r);
    cr_assert_eq(r->status, 0, "stderr: %s", r->err);
    double v;
    cr_expect(json_number(r->out, "seq", &v) && v == 8, "%s", r->out);
    const char *missing_device[] = {"clattn-bench", "--device", "name=NoSuchDeviceAnywhere", "--seq", "8", NULL};
    run_bench(missing_device, r);
    cr_expect_eq(r->status, 1, "a device that is not there is a runtime failure: %s", r->err);
    free(r);
}
