/* encoder.c: `clattn encoder`, a transformer encoder layer on .npy files.
 *
 *   clattn encoder --in DIR --out DIR [--heads H] [--causal] [--norm-first]
 *                  [--activation relu|gelu] [--eps E] [--device SPEC]
 *
 * DIR holds x.npy (B, T, E) or (T, E), the attention weights of `clattn run`
 * (w_query, w_key, w_value, optional b_query/b_key/b_value, w_out, optional
 * b_out; nn.Linear layout), ln1_weight, ln1_bias, w_ff1 (F, E), b_ff1 (F),
 * w_ff2 (E, F), b_ff2 (E), ln2_weight, ln2_bias and an optional
 * key_padding_mask (B, T) bool/uint8. Writes DIR_OUT/out.npy with x's shape.
 *
 * Errors as `clattn run` (run.c) reports them: exit 2 for usage (flags and
 * their values, a device spec that cannot be parsed), 1 for input (directories,
 * files, dtypes, shapes, a device that matches nothing) and failures; exactly
 * one stderr line starting with "clattn encoder: "; every shape is checked
 * against the others before the device is opened, and nothing is written to
 * --out on failure.
 */
#include "cli.h"
#include "npy.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define USAGE                                                                                         \
    "usage: clattn encoder --in DIR --out DIR [--heads H] [--causal] [--norm-first] [--activation relu|gelu] " \
    "[--eps E] [--algorithm auto|fused|unfused] [--device SPEC]"

static int fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One line on stderr, "clattn encoder: ..." (clattn_cli_vsay), and the exit status. */
static int fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    clattn_cli_vsay("clattn encoder", fmt, ap);
    va_end(ap);
    return status;
}

/* ---------------------------------------------------------------- flags */

typedef struct options {
    const char *in, *out, *device;
    size_t heads;
    int causal, norm_first;
    clattn_activation activation;
    float eps;
    clattn_algorithm algorithm;
} options;

/* A whole decimal number from 1 to 2^32-1 (digits only, no sign or space). */
static int parse_heads(const char *s, size_t *out)
{
    if (!*s) return -1;
    for (const char *c = s; *c; c++)
        if (!isdigit((unsigned char)*c)) return -1;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE || v == 0 || v > 0xFFFFFFFFull) return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_eps(const char *s, float *out)
{
    if (!*s || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v)) return -1;
    float f = (float)v;
    if (!(isfinite(f) && f > 0.0f)) return -1;
    *out = f;
    return 0;
}

/* 0 to run, 2 after a usage error (reported), -1 for --help. */
static int parse(int argc, char **argv, options *o)
{
    *o = (options){.heads = 1, .activation = CLATTN_ACTIVATION_RELU, .eps = 1e-5f};
    int seen_heads = 0, seen_act = 0, seen_eps = 0, seen_alg = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return -1;
        if (strcmp(a, "--causal") == 0 || strcmp(a, "--norm-first") == 0) {
            int *flag = a[2] == 'c' ? &o->causal : &o->norm_first;
            if (*flag) return fail(2, "%s given more than once", a);
            *flag = 1;
            continue;
        }
        const int takes_value = strcmp(a, "--in") == 0 || strcmp(a, "--out") == 0 || strcmp(a, "--device") == 0 ||
                                strcmp(a, "--heads") == 0 || strcmp(a, "--activation") == 0 ||
                                strcmp(a, "--eps") == 0 || strcmp(a, "--algorithm") == 0;
        if (!takes_value) {
            if (a[0] == '-') return fail(2, "unknown option '%s' (see clattn encoder --help)", a);
            return fail(2, "unexpected argument '%s' (see clattn encoder --help)", a);
        }
        if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) return fail(2, "%s needs a value (%s)", a, USAGE);
        const char *v = argv[++i];
        if (strcmp(a, "--in") == 0 || strcmp(a, "--out") == 0 || strcmp(a, "--device") == 0) {
            const char **slot = a[2] == 'i' ? &o->in : a[2] == 'o' ? &o->out : &o->device;
            if (*slot) return fail(2, "%s given more than once", a);
            if (slot == &o->device && !*v)
                return fail(2, "--device: empty device spec (use ref, opencl, opencl:P:D, gpu, cpu, accelerator or "
                               "name=TEXT)");
            *slot = v;
        } else if (strcmp(a, "--heads") == 0) {
            if (seen_heads++) return fail(2, "--heads given more than once");
            if (parse_heads(v, &o->heads)) return fail(2, "--heads '%s': must be a whole number from 1 to 4294967295", v);
        } else if (strcmp(a, "--activation") == 0) {
            if (seen_act++) return fail(2, "--activation given more than once");
            if (strcmp(v, "relu") == 0) o->activation = CLATTN_ACTIVATION_RELU;
            else if (strcmp(v, "gelu") == 0) o->activation = CLATTN_ACTIVATION_GELU;
            else return fail(2, "--activation '%s': must be relu or gelu", v);
        } else if (strcmp(a, "--algorithm") == 0) {
            if (seen_alg++) return fail(2, "--algorithm given more than once");
            if (clattn_cli_parse_algorithm(v, &o->algorithm))
                return fail(2, "--algorithm '%s': must be auto, fused or unfused", v);
        } else {
            if (seen_eps++) return fail(2, "--eps given more than once");
            if (parse_eps(v, &o->eps)) return fail(2, "--eps '%s': must be a finite number > 0 (in float32 range)", v);
        }
    }
    if (!o->in) return fail(2, "--in DIR is required (the directory holding x.npy and the weights)");
    if (!o->out) return fail(2, "--out DIR is required (the directory for out.npy; created when missing)");
    return 0;
}

/* ---------------------------------------------------------------- inputs */

enum { X, WQ, WK, WV, BQ, BK, BV, WO, BO, LN1W, LN1B, WF1, BF1, WF2, BF2, LN2W, LN2B, KPM, N_FILES };
static const char *const file_names[N_FILES] = {
    "x.npy",          "w_query.npy",   "w_key.npy",  "w_value.npy", "b_query.npy",    "b_key.npy",
    "b_value.npy",    "w_out.npy",     "b_out.npy",  "ln1_weight.npy", "ln1_bias.npy", "w_ff1.npy",
    "b_ff1.npy",      "w_ff2.npy",     "b_ff2.npy",  "ln2_weight.npy", "ln2_bias.npy", "key_padding_mask.npy"};

typedef struct inputs {
    clattn_npy a[N_FILES];
    int has[N_FILES];
} inputs;

static void inputs_free(inputs *in)
{
    for (int i = 0; i < N_FILES; i++) clattn_npy_free(&in->a[i]);
}

static void shape_str(const clattn_npy *a, char *s, size_t len)
{
    clattn_cli_shape(s, len, a->ndim, a->shape);
}

/* Load every file of the contract that exists; 0 or the exit status after an error (reported). */
static int load_all(const char *dir, inputs *in)
{
    static const int required[] = {X, WO, LN1W, LN1B, WF1, BF1, WF2, BF2, LN2W, LN2B};
    for (int i = 0; i < N_FILES; i++) {
        char path[4096], err[512];
        snprintf(path, sizeof path, "%s/%s", dir, file_names[i]);
        struct stat sb;
        if (lstat(path, &sb) != 0) {
            if (errno == ENOENT) continue; /* absent: required ones are named below */
            return fail(1, "%s: %s", file_names[i], strerror(errno));
        }
        if (clattn_npy_load(path, &in->a[i], err, sizeof err) != 0) return fail(1, "%s: %s", file_names[i], err);
        in->has[i] = 1;
        const clattn_npy *a = &in->a[i];
        if (i == KPM ? a->dtype != CLATTN_NPY_U8 && a->dtype != CLATTN_NPY_BOOL : a->dtype != CLATTN_NPY_F32)
            return fail(1, "%s: dtype %s but expected %s", file_names[i], clattn_npy_dtype_name(a->dtype),
                        i == KPM ? "bool or uint8" : "float32");
        if (a->count == 0 || a->ndim == 0) {
            char s[128];
            shape_str(a, s, sizeof s);
            return fail(1, "%s: shape %s %s", file_names[i], s,
                        a->ndim == 0 ? "is a scalar, expected an array" : "is empty (every dimension must be >= 1)");
        }
    }
    for (size_t k = 0; k < sizeof required / sizeof required[0]; k++)
        if (!in->has[required[k]])
            return fail(1, "%s: missing from --in '%s' (the encoder layer needs it)", file_names[required[k]], dir);
    const char *unsupported[][2] = {{"kv.npy", "cross-attention is not part of the encoder layer"},
                                    {"attn_mask.npy", "not supported by the encoder layer (use --causal and "
                                                      "key_padding_mask.npy)"}};
    for (int k = 0; k < 2; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, unsupported[k][0]);
        struct stat sb;
        if (stat(path, &sb) == 0) return fail(1, "%s: %s", unsupported[k][0], unsupported[k][1]);
    }
    return 0;
}

/* The array must have this shape (ndim 1 or 2); 0 or the exit status after an error (reported). */
static int expect(const inputs *in, int i, int ndim, size_t d0, size_t d1, const char *names)
{
    const clattn_npy *a = &in->a[i];
    if (a->ndim == ndim && a->shape[0] == d0 && (ndim == 1 || a->shape[1] == d1)) return 0;
    char got[128];
    shape_str(a, got, sizeof got);
    if (ndim == 1) return fail(1, "%s: shape %s but expected (%zu,) (%s)", file_names[i], got, d0, names);
    return fail(1, "%s: shape %s but expected (%zu, %zu) (%s)", file_names[i], got, d0, d1, names);
}

/* Check every shape against the others and fill the plan's description; 0 or the exit status. */
static int check_shapes(const inputs *in, const options *o, clattn_encoder_desc *d)
{
    const clattn_npy *x = &in->a[X];
    char s[128];
    if (x->ndim != 2 && x->ndim != 3) {
        shape_str(x, s, sizeof s);
        return fail(1, "x.npy: shape %s but expected (B, T, E) or (T, E)", s);
    }
    const size_t B = x->ndim == 3 ? x->shape[0] : 1, T = x->shape[x->ndim - 2], E = x->shape[x->ndim - 1];
    const size_t H = o->heads;
    int rc, nqkv = in->has[WQ] + in->has[WK] + in->has[WV];
    size_t dk, dv;
    if (nqkv != 0 && nqkv != 3)
        return fail(1, "%s: missing (w_query, w_key and w_value come together)",
                    file_names[!in->has[WQ] ? WQ : !in->has[WK] ? WK : WV]);
    if (nqkv == 3) {
        const clattn_npy *wq = &in->a[WQ], *wv = &in->a[WV];
        if (wq->ndim != 2 || wq->shape[1] != E || wq->shape[0] == 0 || wq->shape[0] % H) {
            shape_str(wq, s, sizeof s);
            return fail(1, "w_query.npy: shape %s but expected (H*dk, E) with H = %zu (--heads), E = %zu", s, H, E);
        }
        dk = wq->shape[0] / H;
        if ((rc = expect(in, WK, 2, H * dk, E, "H*dk, E"))) return rc;
        if (wv->ndim != 2 || wv->shape[1] != E || wv->shape[0] == 0 || wv->shape[0] % H) {
            shape_str(wv, s, sizeof s);
            return fail(1, "w_value.npy: shape %s but expected (H*dv, E) with H = %zu (--heads), E = %zu", s, H, E);
        }
        dv = wv->shape[0] / H;
        if (in->has[BQ] && (rc = expect(in, BQ, 1, H * dk, 0, "H*dk"))) return rc;
        if (in->has[BK] && (rc = expect(in, BK, 1, H * dk, 0, "H*dk"))) return rc;
        if (in->has[BV] && (rc = expect(in, BV, 1, H * dv, 0, "H*dv"))) return rc;
    } else {
        for (int i = BQ; i <= BV; i++)
            if (in->has[i]) return fail(1, "%s: a Q/K/V bias without w_query, w_key and w_value", file_names[i]);
        if (E % H) return fail(1, "--heads %zu does not divide E = %zu (x.npy) and there are no Q/K/V weights", H, E);
        dk = dv = E / H;
    }
    if ((rc = expect(in, WO, 2, E, H * dv, "E, H*dv"))) return rc;
    if (in->has[BO] && (rc = expect(in, BO, 1, E, 0, "E"))) return rc;
    if ((rc = expect(in, LN1W, 1, E, 0, "E")) || (rc = expect(in, LN1B, 1, E, 0, "E"))) return rc;
    const clattn_npy *w1 = &in->a[WF1];
    if (w1->ndim != 2 || w1->shape[1] != E || w1->shape[0] == 0) {
        shape_str(w1, s, sizeof s);
        return fail(1, "w_ff1.npy: shape %s but expected (F, E) with E = %zu", s, E);
    }
    const size_t F = w1->shape[0];
    if ((rc = expect(in, BF1, 1, F, 0, "F")) || (rc = expect(in, WF2, 2, E, F, "E, F")) ||
        (rc = expect(in, BF2, 1, E, 0, "E")) || (rc = expect(in, LN2W, 1, E, 0, "E")) ||
        (rc = expect(in, LN2B, 1, E, 0, "E")))
        return rc;
    if (in->has[KPM]) {
        const clattn_npy *m = &in->a[KPM];
        int ok = (m->ndim == 2 && m->shape[0] == B && m->shape[1] == T) || (x->ndim == 2 && m->ndim == 1 && m->shape[0] == T);
        if (!ok) {
            shape_str(m, s, sizeof s);
            return fail(1, "key_padding_mask.npy: shape %s but expected (%zu, %zu) (B, T)%s", s, B, T,
                        x->ndim == 2 ? " or (T,)" : "");
        }
    }
    *d = (clattn_encoder_desc){0};
    d->attn.batch = B;
    d->attn.seq_q = T;
    d->attn.embed = E;
    d->attn.heads = H;
    d->attn.head_dim_qk = nqkv == 3 ? dk : 0;
    d->attn.head_dim_v = nqkv == 3 ? dv : 0;
    d->attn.out_dim = E;
    d->attn.causal = o->causal;
    d->attn.key_padding_mask = in->has[KPM];
    d->attn.layout = CLATTN_LAYOUT_LINEAR;
    d->attn.algorithm = o->algorithm;
    d->ff_dim = F;
    d->activation = o->activation;
    d->norm_first = o->norm_first;
    d->eps = o->eps;
    return 0;
}

/* ---------------------------------------------------------------- the command */

int clattn_cli_encoder(int argc, char **argv)
{
    options o;
    int rc = parse(argc, argv, &o);
    if (rc < 0) {
        printf("%s\n"
               "inputs in DIR (torch.nn.TransformerEncoderLayer's parameters, nn.Linear [out, in] layout):\n"
               "  x.npy (B, T, E) or (T, E); w_query.npy, w_key.npy, w_value.npy (E, E); optional b_query.npy,\n"
               "  b_key.npy, b_value.npy (E); w_out.npy (E, E); optional b_out.npy (E); ln1_weight.npy,\n"
               "  ln1_bias.npy (E); w_ff1.npy (F, E), b_ff1.npy (F); w_ff2.npy (E, F), b_ff2.npy (E);\n"
               "  ln2_weight.npy, ln2_bias.npy (E); optional key_padding_mask.npy (B, T) bool\n"
               "output in DIR: out.npy, the shape of x (--out is created when missing; out.npy is written to a\n"
               "  temporary file and renamed into place, so a failed run leaves --out as it was)\n"
               "  --heads H: attention heads (default 1); --causal: causal self-attention; --norm-first: pre-norm\n"
               "  --activation relu|gelu (default relu; gelu is the erf form); --eps E: LayerNorm epsilon (1e-5)\n"
               "  --algorithm auto|fused|unfused; --device SPEC (default: $CLATTN_DEVICE, else opencl, else ref)\n",
               USAGE);
        return 0;
    }
    if (rc) return rc;
    if (clattn_cli_check_dir("clattn encoder", "--in", o.in, 0) ||
        clattn_cli_check_dir("clattn encoder", "--out", o.out, 1))
        return 1;

    inputs in = {0};
    clattn_encoder_desc d;
    clattn_device *dev = NULL;
    clattn_encoder_plan *plan = NULL;
    float *out = NULL;
    if ((rc = load_all(o.in, &in)) || (rc = check_shapes(&in, &o, &d))) goto done;

    /* the device: a spec that cannot be parsed is a usage error, one that matches nothing an input error */
    if (!(dev = clattn_cli_open_device("clattn encoder", o.device, &rc))) goto done;
#define ARR(i) (in.has[i] ? in.a[i].data : NULL)
#define CNT(i) (in.has[i] ? in.a[i].count : 0)
    /* every array with its element count, as read from its file */
    const clattn_attention_weights aw = {
        .w_query = ARR(WQ), .w_key = ARR(WK), .w_value = ARR(WV), .b_query = ARR(BQ), .b_key = ARR(BK),
        .b_value = ARR(BV), .w_out = in.a[WO].data, .b_out = ARR(BO), .w_query_count = CNT(WQ),
        .w_key_count = CNT(WK), .w_value_count = CNT(WV), .b_query_count = CNT(BQ), .b_key_count = CNT(BK),
        .b_value_count = CNT(BV), .w_out_count = in.a[WO].count, .b_out_count = CNT(BO)};
    const clattn_encoder_weights w = {.attn = aw,
                                      .ln1_weight = in.a[LN1W].data, .ln1_bias = in.a[LN1B].data,
                                      .w_ff1 = in.a[WF1].data,       .b_ff1 = in.a[BF1].data,
                                      .w_ff2 = in.a[WF2].data,       .b_ff2 = in.a[BF2].data,
                                      .ln2_weight = in.a[LN2W].data, .ln2_bias = in.a[LN2B].data,
                                      .ln1_weight_count = in.a[LN1W].count, .ln1_bias_count = in.a[LN1B].count,
                                      .w_ff1_count = in.a[WF1].count, .b_ff1_count = in.a[BF1].count,
                                      .w_ff2_count = in.a[WF2].count, .b_ff2_count = in.a[BF2].count,
                                      .ln2_weight_count = in.a[LN2W].count, .ln2_bias_count = in.a[LN2B].count};
#undef ARR
#undef CNT
    clattn_status st = clattn_encoder_plan_create(dev, &d, &w, &plan);
    if (st) {
        rc = fail(1, "creating the encoder plan on %s: %s: %s", clattn_device_name(dev), clattn_status_string(st),
                  clattn_last_error());
        goto done;
    }
    clattn_cli_notice("clattn encoder");
    const size_t n = in.a[X].count;
    if (!(out = malloc(n * sizeof *out))) {
        rc = fail(1, "out of memory allocating the output (%zu floats)", n);
        goto done;
    }
    clattn_encoder_args args = {.x = in.a[X].data, .key_padding_mask = in.has[KPM] ? in.a[KPM].data : NULL,
                                .out = out, .x_count = in.a[X].count,
                                .key_padding_mask_count = in.has[KPM] ? in.a[KPM].count : 0, .out_count = n};
    st = clattn_encoder_plan_execute(plan, &args);
    if (st) {
        rc = fail(1, "running the encoder layer on %s: %s: %s", clattn_device_name(dev), clattn_status_string(st),
                  clattn_last_error());
        goto done;
    }
    /* a temporary file renamed into place: a failure leaves --out as it was, a link is never followed */
    char path[4096], tmp[4200], err[512];
    snprintf(path, sizeof path, "%s/out.npy", o.out);
    struct stat sb;
    int made = 0;  /* --out directories created here, removed again on an error */
    if (clattn_cli_make_dir("clattn encoder", "--out", o.out, &made) != 0) {
        rc = 1;
        goto done;
    }
    if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        rc = fail(1, "out.npy: '%s' is a directory", path);
    } else if (clattn_npy_save_f32_temp(path, out, in.a[X].ndim, in.a[X].shape, tmp, sizeof tmp, err,
                                        sizeof err) != 0) {
        rc = fail(1, "out.npy: %s", err);
    } else if (rename(tmp, path) != 0) {
        rc = fail(1, "out.npy: cannot rename %s into place: %s", tmp, strerror(errno));
        unlink(tmp);
    } else {
        rc = 0;
    }
    if (rc) clattn_cli_unmake_dir(o.out, made);
done:
    free(out);
    clattn_encoder_plan_free(plan);
    clattn_device_free(dev);
    inputs_free(&in);
    return rc;
}
