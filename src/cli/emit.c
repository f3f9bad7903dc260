/* emit.c: `clattn emit`: the OpenCL programs (sources and build options) a plan builds, written to a directory
 * (clattn_device_emit), for the device as it is or for a simulated one (--target sm_90: an H100's capabilities).
 *
 *   clattn emit --out DIR [--target host|sm_90] [--device SPEC] [--core NAME[:P=V,...][;...]]
 *               [--batch B] [--seq T] [--seq-kv S] [--heads H] [--kv-heads HK] [--head-dim-qk D] [--head-dim-v DV]
 *               [--dim E] [--causal] [--window W] [--dropout P] [--training] [--tf32] [--dtype T] [--need-weights]
 *               [--algorithm auto|fused|unfused] [--decode] [--no-weights]
 */
#include "cli.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>

#define SAY(...) clattn_cli_say("clattn emit", __VA_ARGS__)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clattn emit --out DIR [--target host|sm_90] [--device SPEC] [--core NAME[:P=V,...]]\n"
            "                   [--batch B] [--seq T] [--seq-kv S] [--heads H] [--kv-heads HK] [--head-dim-qk D]\n"
            "                   [--head-dim-v DV] [--dim E] [--causal] [--window W] [--dropout P] [--training]\n"
            "                   [--tf32] [--dtype f32|f16|bf16] [--need-weights] [--algorithm auto|fused|unfused]\n"
            "                   [--decode] [--no-weights]\n"
            "  writes the OpenCL programs the plan described would build: DIR/STEM.cl (the sources as clattn passes\n"
            "  them to the compiler) and DIR/STEM.opts (the build options), STEM the program's main kernel; DIR/index.txt\n"
            "  names each file's sources in cl/. DIR must be empty or missing. Nothing is run. A plan that fails\n"
            "  leaves nothing, except a program the driver does not build: then the files written are kept, with\n"
            "  the build log on stderr.\n"
            "  --target host (default): the device as it is. --target sm_90: the device takes an H100's capabilities\n"
            "    (NVIDIA's OpenCL, compute capability 9.0, 132 compute units, 48 KiB local memory), so the plan picks\n"
            "    the cores, parameters and options it would there (compile them with ../shared/gpu/ptx-check.sh, or\n"
            "    scripts/gpu-static.sh for every GPU core).\n"
            "  --core: CLATTN_CORE for this plan (e.g. flash_mma, flash_gemm:BK=32, decode_group).\n"
            "  The plan: B sequences (default 1) of T tokens (1024), H heads (8) of D (64) and DV (D), Q/K/V and\n"
            "  output projections of width E (H*D) unless --no-weights (the core alone, E = H*D = H*DV). --seq-kv:\n"
            "  cross-attention over S keys. --decode: a decode plan (causal self-attention, one token per step),\n"
            "  --training: a training plan (its backward core too), --tf32: precision TF32, --dtype: the plan's\n"
            "  arrays' type (f16, bf16: with --no-weights the core reads and writes them itself where it can).\n");
}

static int parse_size(const char *flag, const char *v, size_t lo, size_t *out)
{
    char *end = NULL;
    errno = 0;
    const unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || errno || v[0] == '-' || x < lo || x > (unsigned long long)UINT32_MAX) {
        SAY("%s '%s': must be a whole number from %zu to 4294967295", flag, v, lo);
        return -1;
    }
    *out = (size_t)x;
    return 0;
}

/* 1: DIR has an entry besides . and .. */
static int dir_has_entries(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return 0;
    int any = 0;
    for (struct dirent *e; !any && (e = readdir(d)) != NULL;)
        any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return any;
}

/* A failed plan: the files written for it removed (index.txt names them), and the directories made for it. */
static void remove_written(const char *dir, int created)
{
    char path[4200], line[1024];
    snprintf(path, sizeof path, "%s/index.txt", dir);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strstr(line, ".cl: ");
        if (!colon) continue;
        *colon = '\0';
        char file[4300];
        snprintf(file, sizeof file, "%s/%s.cl", dir, line);
        remove(file);
        snprintf(file, sizeof file, "%s/%s.opts", dir, line);
        remove(file);
    }
    if (f) fclose(f);
    remove(path);
    clattn_cli_unmake_dir(dir, created);
}

typedef struct emit_opts {
    const char *out, *target, *device, *core;
    size_t batch, seq, seq_kv, heads, kv_heads, dk, dv, dim, window;
    float dropout;
    int causal, training, tf32, need_weights, decode, no_weights;
    clattn_algorithm algorithm;
    clattn_dtype dtype;
} emit_opts;

static int parse(int argc, char **argv, emit_opts *o)
{
    *o = (emit_opts){.target = "host", .batch = 1, .seq = 1024, .heads = 8, .dk = 64};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 1;
        }
        int *flag = strcmp(a, "--causal") == 0 ? &o->causal : strcmp(a, "--training") == 0 ? &o->training
                    : strcmp(a, "--tf32") == 0 ? &o->tf32 : strcmp(a, "--need-weights") == 0 ? &o->need_weights
                    : strcmp(a, "--decode") == 0 ? &o->decode : strcmp(a, "--no-weights") == 0 ? &o->no_weights : NULL;
        if (flag) {
            *flag = 1;
            continue;
        }
        if (i + 1 >= argc) {
            SAY("%s: unknown argument, or it needs a value", a);
            return -1;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (strcmp(a, "--out") == 0) o->out = v;
        else if (strcmp(a, "--target") == 0) o->target = v;
        else if (strcmp(a, "--device") == 0) o->device = v;
        else if (strcmp(a, "--core") == 0) o->core = v;
        else if (strcmp(a, "--batch") == 0) bad = parse_size(a, v, 1, &o->batch);
        else if (strcmp(a, "--seq") == 0) bad = parse_size(a, v, 1, &o->seq);
        else if (strcmp(a, "--seq-kv") == 0) bad = parse_size(a, v, 1, &o->seq_kv);
        else if (strcmp(a, "--heads") == 0) bad = parse_size(a, v, 1, &o->heads);
        else if (strcmp(a, "--kv-heads") == 0) bad = parse_size(a, v, 1, &o->kv_heads);
        else if (strcmp(a, "--head-dim-qk") == 0) bad = parse_size(a, v, 1, &o->dk);
        else if (strcmp(a, "--head-dim-v") == 0) bad = parse_size(a, v, 1, &o->dv);
        else if (strcmp(a, "--dim") == 0) bad = parse_size(a, v, 1, &o->dim);
        else if (strcmp(a, "--window") == 0) bad = parse_size(a, v, 1, &o->window);
        else if (strcmp(a, "--dtype") == 0) {
            if (clattn_cli_parse_dtype(v, &o->dtype)) {
                SAY("--dtype '%s': must be f32, f16 or bf16", v);
                bad = -1;
            }
        } else if (strcmp(a, "--algorithm") == 0) {
            if (clattn_cli_parse_algorithm(v, &o->algorithm)) {
                SAY("--algorithm '%s': the values are auto, fused and unfused", v);
                bad = -1;
            }
        } else if (strcmp(a, "--dropout") == 0) {
            char *end = NULL;
            o->dropout = strtof(v, &end);
            if (!*v || *end || !(o->dropout >= 0.0f && o->dropout < 1.0f)) {
                SAY("--dropout '%s': must be a number in [0, 1)", v);
                bad = -1;
            }
        } else {
            SAY("unknown argument '%s'", a);
            bad = -1;
        }
        if (bad) return -1;
    }
    if (!o->out) {
        SAY("--out DIR is required");
        return -1;
    }
    if (!o->dv) o->dv = o->dk;
    if (o->decode && (o->seq_kv || o->training || o->dropout > 0.0f || o->need_weights)) {
        SAY("--decode: a decode plan is causal self-attention for inference (no --seq-kv, --training, --dropout or "
            "--need-weights)");
        return -1;
    }
    if (o->no_weights && (o->dim || o->dk != o->dv)) {
        SAY("--no-weights: the core alone reads x split into heads, so E = H*D and DV = D (no --dim)");
        return -1;
    }
    return 0;
}

/* Zero weights of the plan's shapes (NULL arrays with --no-weights); 0, or -1 out of memory. */
static int weights_make(const emit_opts *o, const clattn_attention_desc *d, clattn_attention_weights *w,
                        float **buf)
{
    *w = (clattn_attention_weights){0};
    *buf = NULL;
    if (o->no_weights) return 0;
    const size_t E = d->embed, Ekv = d->kv_embed ? d->kv_embed : E, H = d->heads;
    const size_t HK = d->kv_heads ? d->kv_heads : H, dk = d->head_dim_qk, dv = d->head_dim_v;
    w->w_query_count = H * dk * E, w->w_key_count = HK * dk * Ekv, w->w_value_count = HK * dv * Ekv;
    w->b_query_count = H * dk, w->b_key_count = HK * dk, w->b_value_count = HK * dv;
    w->w_out_count = E * H * dv, w->b_out_count = E;
    size_t most = w->w_query_count;
    const size_t counts[] = {w->w_key_count, w->w_value_count, w->w_out_count};
    for (int i = 0; i < 3; i++) most = counts[i] > most ? counts[i] : most;
    if (!(*buf = calloc(most, sizeof(float)))) return -1;
    w->w_query = w->w_key = w->w_value = w->b_query = w->b_key = w->b_value = w->w_out = w->b_out = *buf;
    return 0;
}

int clattn_cli_emit(int argc, char **argv)
{
    emit_opts o;
    const int p = parse(argc, argv, &o);
    if (p) {
        if (p < 0) usage(stderr);
        return p < 0 ? 2 : 0;
    }
    if (strcmp(o.target, "host") && strcmp(o.target, "sm_90")) {
        SAY("--target '%s': the targets are host (the device as it is) and sm_90 (an H100's capabilities)", o.target);
        return 2;
    }
    if (clattn_cli_check_dir("clattn emit", "--out", o.out, 1)) return 2;
    if (dir_has_entries(o.out)) {
        SAY("--out %s: not empty (emit writes into an empty or missing directory)", o.out);
        return 2;
    }
    if (o.core && setenv("CLATTN_CORE", o.core, 1) != 0) {
        SAY("cannot set CLATTN_CORE");
        return 1;
    }
    if (o.core && clattn_core_env_check() != CLATTN_STATUS_SUCCESS) {
        SAY("--core %s: %s", o.core, clattn_last_error());
        return 2;
    }
    clattn_attention_desc d = {
        .batch = o.batch, .seq_q = o.decode ? 1 : o.seq, .seq_kv = o.seq_kv, .cross = o.seq_kv != 0,
        .heads = o.heads, .kv_heads = o.kv_heads, .head_dim_qk = o.no_weights ? 0 : o.dk,
        .head_dim_v = o.no_weights ? 0 : o.dv, .embed = o.dim ? o.dim : o.heads * o.dk,
        .out_dim = o.no_weights ? 0 : (o.dim ? o.dim : o.heads * o.dk), .causal = o.causal || o.decode,
        .window = o.window, .dropout = o.dropout, .seed = 1, .algorithm = o.algorithm,
        .need_weights = o.need_weights, .training = o.training,
        .precision = o.tf32 ? CLATTN_PRECISION_TF32 : CLATTN_PRECISION_FP32, .dtype = o.dtype};
    clattn_attention_weights w;
    float *wbuf = NULL;
    if (weights_make(&o, &d, &w, &wbuf)) {
        SAY("out of memory for the plan's weights");
        return 1;
    }
    int code = 1, created = 0;
    clattn_device *dev = clattn_cli_open_device("clattn emit", o.device, &code);
    if (!dev) {
        free(wbuf);
        return code;
    }
    code = 1;
    clattn_status st = CLATTN_STATUS_SUCCESS;
    if (clattn_device_backend(dev) != CLATTN_BACKEND_OPENCL) {
        SAY("the ref device builds no OpenCL programs: choose an OpenCL device (--device)");
        goto done;
    }
    if (clattn_cli_make_dir("clattn emit", "--out", o.out, &created)) goto done;
    if ((st = clattn_device_emit(dev, o.out, o.target)) != CLATTN_STATUS_SUCCESS) {
        SAY("%s: %s", clattn_status_string(st), clattn_last_error());
        clattn_cli_unmake_dir(o.out, created);
        goto done;
    }
    char where[400];
    snprintf(where, sizeof where, "%s%s%s", clattn_device_name(dev), strcmp(o.target, "host") ? " as " : "",
             strcmp(o.target, "host") ? o.target : "");
    if (o.decode) {
        clattn_decode_plan *plan = NULL;
        st = clattn_decode_plan_create(dev, &d, o.no_weights ? NULL : &w, &plan);
        if (st == CLATTN_STATUS_SUCCESS)
            printf("decode plan on %s: core %s, GEMM %s\n", where, clattn_decode_plan_core(plan),
                   clattn_decode_plan_gemm(plan));
        clattn_decode_plan_free(plan);
    } else {
        clattn_plan *plan = NULL;
        st = clattn_plan_create(dev, &d, o.no_weights ? NULL : &w, &plan);
        if (st == CLATTN_STATUS_SUCCESS) {
            printf("plan on %s: core %s (%s), GEMM %s (%s)", where, clattn_plan_core(plan),
                   clattn_plan_core_params(plan), clattn_plan_gemm(plan), clattn_plan_gemm_params(plan));
            if (o.training)
                printf(", backward %s (%s)", clattn_plan_backward_core(plan), clattn_plan_backward_core_params(plan));
            printf("\n");
        }
        clattn_plan_free(plan);
    }
    if (st != CLATTN_STATUS_SUCCESS && strstr(clattn_last_error(), "clattn_last_build_log()")) {
        /* the program the driver refused (program.c's build failure, whatever its code) is what a compiler bug
         * report needs: kept, with the others */
        SAY("%s: %s", clattn_status_string(st), clattn_last_error());
        fprintf(stderr, "%s\n", clattn_last_build_log());
        SAY("the programs written are kept in %s; the last in index.txt is the one that did not build", o.out);
        goto done;
    }
    if (st != CLATTN_STATUS_SUCCESS) {
        SAY("%s: %s", clattn_status_string(st), clattn_last_error());
        remove_written(o.out, created);
        goto done;
    }
    clattn_device_emit(dev, NULL, NULL); /* (clears the last error) */
    clattn_cli_notice("clattn emit");
    char path[4200];
    snprintf(path, sizeof path, "%s/index.txt", o.out);
    FILE *f = fopen(path, "r");
    if (!f) {
        SAY("the plan built no program (%s missing)", path);
        clattn_cli_unmake_dir(o.out, created);
        goto done;
    }
    printf("programs for target %s in %s:\n", o.target, o.out);
    char line[1024];
    while (fgets(line, sizeof line, f)) printf("  %s", line);
    fclose(f);
    code = 0;
done:
    clattn_device_free(dev);
    free(wbuf);
    return code;
}
