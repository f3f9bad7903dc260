/* backward_bench.c: `clattn-bench --backward`, timing a training plan's forward and backward pass.
 *
 * The module is the bench's usual one (attention_op.h: self-attention, E -> E projections with biases, H heads of
 * E/H), made with desc.training. On device buffers, median of --iters after --warmup:
 *   forward_ms     clattn_plan_execute_buffers writing out, lse and context
 *   backward_ms    clattn_plan_backward_buffers from dOut and the forward's lse and context to the gradients of x,
 *                  the four weights and the four biases
 *   ratio          backward_ms / forward_ms
 * and the attention core alone, on a plan of the same B, T, H, head size without projections (x is Q, K and V):
 *   core_forward_ms, core_backward_ms, core_backward_gflops = 2.5 x the forward core's FLOPs (4 B H T^2 d, halved
 *   when causal) / core_backward_ms: the backward recomputes the scores and makes dV, dP, dQ and dK (5 products
 *   where the forward makes 2), the convention FlashAttention's papers use.
 * Memory: the training plan's device bytes (clattn_plan_device_bytes) next to an inference plan's, and the
 * Tq x Tk score matrix a materialising backward would need (B H T^2 floats): the fused backward keeps none.
 * --check N: the last N rows' grad_x (every row of a batch entry's tail, each needing the rows after it when
 * causal) against a float64 computation here from the inputs and weights (shares no code with the library);
 * max |got - ref| / (1e-4 + 1e-3 |ref|), <= 1 passes. */
#include "attention_op.h"
#include "bench_util.h"
#include "backward_bench.h"

#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bopts {
    const char *device;
    clattn_op op;
    int iters, warmup, json;
    size_t check;
} bopts;

void clattn_bench_backward_usage(FILE *f)
{
    fprintf(f, "usage: clattn-bench --backward [--device SPEC] [--batch B] [--seq T] [--dim E] [--heads H] [--causal]\n"
               "                    [--iters N] [--warmup N] [--check ROWS] [--json]\n"
               "times a training plan's forward (out, lse, context) and backward (every gradient) on device buffers,\n"
               "and the attention core's backward alone (a plan without projections): GFLOP/s at 2.5x the forward\n"
               "core's FLOPs, memory next to an inference plan's. --check ROWS: the last ROWS rows' grad_x against\n"
               "float64 (defaults: B=4 T=1024 E=512 H=8, 5 iterations after 1 warm-up).\n");
}

static size_t bsize(const char *opt, const char *s)
{
    if (!s) bench_usage_die("%s needs a value", opt);
    char *end;
    const unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || v == 0) bench_usage_die("%s: '%s' is not a positive integer", opt, s);
    return (size_t)v;
}

static void parse(int argc, char **argv, bopts *o)
{
    memset(o, 0, sizeof *o);
    o->device = "opencl";
    o->op = (clattn_op){.batch = 4, .seq = 1024, .dim = 512, .heads = 8};
    o->iters = 5, o->warmup = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--backward")) continue;
        if (!strcmp(a, "--device")) { if (!v) bench_usage_die("--device needs a value"); o->device = v; i++; }
        else if (!strcmp(a, "--batch")) { o->op.batch = bsize(a, v); i++; }
        else if (!strcmp(a, "--seq")) { o->op.seq = bsize(a, v); i++; }
        else if (!strcmp(a, "--dim")) { o->op.dim = bsize(a, v); i++; }
        else if (!strcmp(a, "--heads")) { o->op.heads = bsize(a, v); i++; }
        else if (!strcmp(a, "--causal")) o->op.causal = 1;
        else if (!strcmp(a, "--iters")) { o->iters = (int)bsize(a, v); i++; }
        else if (!strcmp(a, "--warmup")) {
            if (!v || strspn(v, "0123456789") != strlen(v) || !*v) bench_usage_die("--warmup needs a count >= 0");
            o->warmup = atoi(v), i++;
        }
        else if (!strcmp(a, "--check")) { o->check = bsize(a, v); i++; }
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { clattn_bench_backward_usage(stdout); exit(0); }
        else { clattn_bench_backward_usage(stderr); bench_usage_die("--backward: unknown option '%s'", a); }
    }
    char msg[160];
    if (clattn_op_check(&o->op, msg, sizeof msg)) bench_usage_die("%s", msg);
    if (o->check > o->op.seq) bench_usage_die("--check %zu: more rows than --seq %zu", o->check, o->op.seq);
}

static cl_mem buffer(cl_context ctx, size_t floats, const float *init)
{
    cl_int err;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), floats * sizeof(float),
                              (void *)init, &err);
    if (err != CL_SUCCESS) bench_die("clCreateBuffer (%zu floats): OpenCL error %d", floats, err);
    return m;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One plan's forward and backward times on buffers; its device bytes. x (B, T, E) and dOut (B, T, E). */
typedef struct btimes {
    double fwd_ms, bwd_ms;
    size_t bytes;
    char bwd_core[64], bwd_params[128]; /* the backward core that ran, and its parameters */
} btimes;

static btimes time_plan(const bopts *o, clattn_device *dev, const clattn_attention_desc *desc,
                        const clattn_attention_weights *w, const float *x, const float *dout, float *gx_out)
{
    clattn_plan *plan = NULL;
    bench_plan_check(clattn_plan_create(dev, desc, w, &plan), "clattn_plan_create (training)");
    clattn_attention_desc rd;
    clattn_plan_desc(plan, &rd); /* every default resolved */
    const clattn_attention_desc *d = &rd;
    const size_t B = d->batch, T = d->seq_q, E = d->embed, H = d->heads, dv = d->head_dim_v;
    const size_t Hdk = H * d->head_dim_qk;
    cl_context ctx = clattn_device_context(dev);
    cl_command_queue q = clattn_device_queue(dev);
    const size_t ow = clattn_plan_out_width(plan);
    cl_mem xb = buffer(ctx, B * T * E, x), out = buffer(ctx, B * T * ow, NULL), lse = buffer(ctx, B * H * T, NULL);
    cl_mem cx = buffer(ctx, B * T * H * dv, NULL), go = buffer(ctx, B * T * ow, dout), gx = buffer(ctx, B * T * E, NULL);
    cl_mem gw[8] = {NULL};
    const size_t gn[8] = {Hdk * E, Hdk * E, H * dv * E, Hdk, Hdk, H * dv, E * H * dv, E};
    const int has = w->w_query != NULL;
    clattn_attention_grad_buffers g = {.grad_out = {go, 0}, .lse = {lse, 0}, .context = {cx, 0}, .grad_x = {gx, 0}};
    clattn_buffer *slots[8] = {&g.grad_w_query, &g.grad_w_key, &g.grad_w_value, &g.grad_b_query, &g.grad_b_key,
                               &g.grad_b_value, &g.grad_w_out, &g.grad_b_out};
    for (int i = 0; i < 8 && has; i++) gw[i] = buffer(ctx, gn[i], NULL), *slots[i] = (clattn_buffer){gw[i], 0};
    const clattn_attention_buffers in = {.x = {xb, 0}};
    clattn_attention_buffers fw = in;
    fw.out = (clattn_buffer){out, 0}, fw.lse = (clattn_buffer){lse, 0}, fw.context = (clattn_buffer){cx, 0};
    double *tf = malloc((size_t)o->iters * sizeof *tf), *tb = malloc((size_t)o->iters * sizeof *tb);
    if (!tf || !tb) bench_die("out of memory");
    for (int i = -o->warmup; i < o->iters; i++) {
        double t0 = bench_now_ms();
        bench_check(clattn_plan_execute_buffers(plan, &fw, 0, NULL, NULL), "clattn_plan_execute_buffers");
        clFinish(q);
        double t1 = bench_now_ms();
        bench_check(clattn_plan_backward_buffers(plan, &in, &g, 0, NULL, NULL), "clattn_plan_backward_buffers");
        clFinish(q);
        double t2 = bench_now_ms();
        if (i >= 0) tf[i] = t1 - t0, tb[i] = t2 - t1;
    }
    btimes r = {median(tf, o->iters), median(tb, o->iters), clattn_plan_device_bytes(plan), "", ""};
    snprintf(r.bwd_core, sizeof r.bwd_core, "%s", clattn_plan_backward_core(plan));
    snprintf(r.bwd_params, sizeof r.bwd_params, "%s", clattn_plan_backward_core_params(plan));
    if (gx_out) clEnqueueReadBuffer(q, gx, CL_TRUE, 0, B * T * E * sizeof(float), gx_out, 0, NULL, NULL);
    free(tf), free(tb);
    cl_mem all[] = {xb, out, lse, cx, go, gx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) clReleaseMemObject(all[i]);
    for (int i = 0; i < 8; i++)
        if (gw[i]) clReleaseMemObject(gw[i]);
    clattn_plan_free(plan);
    return r;
}

/* y (n) = W (n, k) x (k) + b, in double. */
static void linear64(const float *W, const float *b, const double *x, size_t n, size_t k, double *y)
{
    for (size_t o = 0; o < n; o++) {
        double s = b ? b[o] : 0.0;
        for (size_t c = 0; c < k; c++) s += (double)W[o * k + c] * x[c];
        y[o] = s;
    }
}

/* The last `rows` rows of batch entry B-1's grad_x in float64, from the inputs and the weights alone:
 * grad_x[t] = dq_t Wq + dk_t Wk + dv_t Wv, with dk_t and dv_t summed over the rows i that see key t. Returns the
 * largest |got - ref| / (1e-4 + 1e-3 |ref|). */
static double check_rows(const clattn_op *op, const clattn_op_data *data, const float *dout, const float *gx,
                         size_t rows)
{
    const clattn_attention_weights *w = &data->weights;
    const size_t B = op->batch, T = op->seq, E = op->dim, H = op->heads, dh = E / H, b = B - 1;
    const double scale = 1.0 / sqrt((double)dh);
    double *Q = malloc(T * E * sizeof *Q), *K = malloc(T * E * sizeof *K), *V = malloc(T * E * sizeof *V);
    double *xr = malloc(E * sizeof *xr), *dctx = malloc(E * sizeof *dctx), *s = malloc(T * sizeof *s);
    if (!Q || !K || !V || !xr || !dctx || !s) bench_die("out of memory (--check)");
    for (size_t t = 0; t < T; t++) {
        for (size_t c = 0; c < E; c++) xr[c] = data->x[(b * T + t) * E + c];
        linear64(w->w_query, w->b_query, xr, E, E, Q + t * E);
        linear64(w->w_key, w->b_key, xr, E, E, K + t * E);
        linear64(w->w_value, w->b_value, xr, E, E, V + t * E);
    }
    const size_t t0 = T - rows, i0 = op->causal ? t0 : 0; /* the rows whose weights reach keys t0.. */
    /* per query row i >= i0 and head: P_i (over visible keys), dctx_i = dOut_i Wo, D_i = dctx_i . ctx_i */
    const size_t ni = T - i0;
    double *P = malloc(ni * H * T * sizeof *P), *dC = malloc(ni * E * sizeof *dC), *D = malloc(ni * H * sizeof *D);
    if (!P || !dC || !D) bench_die("out of memory (--check: %zu rows)", ni);
    for (size_t i = i0; i < T; i++) {
        double *dc = dC + (i - i0) * E;
        for (size_t c = 0; c < E; c++) {
            double acc = 0.0;
            for (size_t o = 0; o < E; o++) acc += (double)dout[(b * T + i) * E + o] * ((const float *)w->w_out)[o * E + c];
            dc[c] = acc;
        }
        for (size_t h = 0; h < H; h++) {
            double *p = P + ((i - i0) * H + h) * T, mx = -INFINITY, sum = 0.0;
            const size_t nk = op->causal ? i + 1 : T;
            for (size_t j = 0; j < nk; j++) {
                double v = 0.0;
                for (size_t c = 0; c < dh; c++) v += Q[i * E + h * dh + c] * K[j * E + h * dh + c];
                p[j] = v * scale;
                mx = fmax(mx, p[j]);
            }
            for (size_t j = 0; j < nk; j++) sum += (p[j] = exp(p[j] - mx));
            double Di = 0.0;
            for (size_t c = 0; c < dh; c++) {
                double ctx = 0.0;
                for (size_t j = 0; j < nk; j++) ctx += p[j] / sum * V[j * E + h * dh + c];
                Di += dc[h * dh + c] * ctx;
            }
            for (size_t j = 0; j < nk; j++) p[j] /= sum;
            for (size_t j = nk; j < T; j++) p[j] = 0.0;
            D[(i - i0) * H + h] = Di;
        }
    }
    double worst = 0.0;
    double *dq = malloc(E * sizeof *dq), *dk = malloc(E * sizeof *dk), *dvv = malloc(E * sizeof *dvv);
    for (size_t t = t0; t < T; t++) {
        memset(dq, 0, E * sizeof *dq), memset(dk, 0, E * sizeof *dk), memset(dvv, 0, E * sizeof *dvv);
        for (size_t h = 0; h < H; h++) {
            /* dq_t: over its keys; dk_t, dv_t: over the rows that see key t */
            const double *pt = P + ((t - i0) * H + h) * T, *dct = dC + (t - i0) * E + h * dh;
            for (size_t j = 0; j < T; j++) {
                if (pt[j] == 0.0) continue;
                double dp = 0.0;
                for (size_t c = 0; c < dh; c++) dp += dct[c] * V[j * E + h * dh + c];
                const double ds = pt[j] * (dp - D[(t - i0) * H + h]) * scale;
                for (size_t c = 0; c < dh; c++) dq[h * dh + c] += ds * K[j * E + h * dh + c];
            }
            for (size_t i = i0; i < T; i++) {
                const double p = P[((i - i0) * H + h) * T + t];
                if (p == 0.0) continue;
                const double *dci = dC + (i - i0) * E + h * dh;
                double dp = 0.0;
                for (size_t c = 0; c < dh; c++) dp += dci[c] * V[t * E + h * dh + c];
                const double ds = p * (dp - D[(i - i0) * H + h]) * scale;
                for (size_t c = 0; c < dh; c++) {
                    dk[h * dh + c] += ds * Q[i * E + h * dh + c];
                    dvv[h * dh + c] += p * dci[c];
                }
            }
        }
        for (size_t c = 0; c < E; c++) {
            double ref = 0.0;
            for (size_t o = 0; o < E; o++)
                ref += dq[o] * ((const float *)w->w_query)[o * E + c] + dk[o] * ((const float *)w->w_key)[o * E + c] +
                       dvv[o] * ((const float *)w->w_value)[o * E + c];
            const double err = fabs((double)gx[(b * T + t) * E + c] - ref) / (1e-4 + 1e-3 * fabs(ref));
            worst = isnan(err) ? INFINITY : fmax(worst, err);
        }
    }
    free(Q), free(K), free(V), free(xr), free(dctx), free(s), free(P), free(dC), free(D), free(dq), free(dk), free(dvv);
    return worst;
}

int clattn_bench_backward(int argc, char **argv)
{
    bopts o;
    parse(argc, argv, &o);
    clattn_device *dev = NULL;
    bench_check(clattn_device_open(o.device, &dev), "--device");
    if (clattn_device_backend(dev) != CLATTN_BACKEND_OPENCL)
        bench_usage_die("--backward times device buffers: --device must be an OpenCL device");
    const clattn_op *op = &o.op;
    clattn_op_data data;
    char msg[160];
    if (clattn_op_make(op, 0xBAC4ull + op->seq, &data, msg, sizeof msg)) bench_die("%s", msg);
    const size_t B = op->batch, T = op->seq, E = op->dim, H = op->heads;
    float *dout = malloc(B * T * E * sizeof *dout), *gx = malloc(B * T * E * sizeof *gx);
    if (!dout || !gx) bench_die("out of memory");
    uint64_t st = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < B * T * E; i++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        dout[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    clattn_attention_desc d = data.desc;
    d.training = 1;
    const btimes mod = time_plan(&o, dev, &d, &data.weights, data.x, dout, o.check ? gx : NULL);
    /* the core alone: no projections, x is Q, K and V */
    clattn_attention_desc dc = d;
    dc.head_dim_qk = dc.head_dim_v = 0, dc.out_dim = 0;
    const btimes core = time_plan(&o, dev, &dc, &(clattn_attention_weights){0}, data.x, dout, NULL);
    /* an inference plan's bytes, for the memory comparison */
    clattn_plan *inf = NULL;
    bench_plan_check(clattn_plan_create(dev, &data.desc, &data.weights, &inf), "clattn_plan_create (inference)");
    const size_t inf_bytes = clattn_plan_device_bytes(inf);
    char core_name[64], gemm_name[64];
    snprintf(core_name, sizeof core_name, "%s", clattn_plan_core(inf));
    snprintf(gemm_name, sizeof gemm_name, "%s", clattn_plan_gemm(inf));
    clattn_plan_free(inf);
    const clattn_op_flop_count fl = clattn_op_flops(op);
    const double core_bwd_flops = 2.5 * fl.core, score_bytes = 4.0 * (double)B * H * T * T;
    const double check = o.check ? check_rows(op, &data, dout, gx, o.check) : 0.0;
    char devname[256];
    snprintf(devname, sizeof devname, "%s", clattn_device_name(dev));
    if (o.json) {
        printf("{\"mode\":\"backward\",\"device\":");
        bench_json_string(stdout, devname);
        printf(",\"batch\":%zu,\"seq\":%zu,\"dim\":%zu,\"heads\":%zu,\"causal\":%d,\"core\":\"%s\",\"gemm\":\"%s\","
               "\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"ratio\":%.3f,\"core_forward_ms\":%.3f,"
               "\"core_backward_ms\":%.3f,\"core_ratio\":%.3f,\"core_backward_gflops\":%.2f,"
               "\"train_plan_bytes\":%zu,\"inference_plan_bytes\":%zu,\"score_matrix_bytes\":%.0f",
               B, T, E, H, op->causal, core_name, gemm_name, mod.fwd_ms, mod.bwd_ms, mod.bwd_ms / mod.fwd_ms,
               core.fwd_ms, core.bwd_ms, core.bwd_ms / core.fwd_ms, core_bwd_flops / (core.bwd_ms * 1e6), mod.bytes,
               inf_bytes, score_bytes);
        if (o.check) printf(",\"check_rows\":%zu,\"check_worst\":%.4g,\"check_ok\":%s", o.check, check,
                            check <= 1.0 ? "true" : "false");
        printf(",\"backward_core\":\"%s\",\"backward_core_params\":\"%s\",\"iters\":%d}\n", mod.bwd_core,
               mod.bwd_params, o.iters);
    } else {
        printf("device: %s\nB=%zu T=%zu E=%zu H=%zu%s, forward core %s, backward core %s%s%s, GEMMs %s\n", devname,
               B, T, E, H, op->causal ? " causal" : "", core_name, mod.bwd_core, mod.bwd_params[0] ? ":" : "",
               mod.bwd_params, gemm_name);
        printf("module:  forward %.2f ms, backward %.2f ms (%.2fx the forward)\n", mod.fwd_ms, mod.bwd_ms,
               mod.bwd_ms / mod.fwd_ms);
        printf("core:    forward %.2f ms, backward %.2f ms (%.2fx), backward %.1f GFLOP/s (2.5x the forward core's FLOPs)\n",
               core.fwd_ms, core.bwd_ms, core.bwd_ms / core.fwd_ms, core_bwd_flops / (core.bwd_ms * 1e6));
        printf("memory:  training plan %.1f MiB, inference plan %.1f MiB; a score matrix would be %.1f MiB (none kept)\n",
               mod.bytes / 1048576.0, inf_bytes / 1048576.0, score_bytes / 1048576.0);
        if (o.check) printf("check:   the last %zu rows' grad_x vs float64: worst %.3g of the tolerance (%s)\n", o.check,
                            check, check <= 1.0 ? "ok" : "FAILED");
    }
    free(dout), free(gx);
    clattn_op_data_free(&data);
    clattn_device_free(dev);
    return o.check && !(check <= 1.0) ? 1 : 0;
}
