/* run.c: `clattn run` — attention on NumPy .npy files.
 *
 *   clattn run --in DIR --out DIR [--heads H] [--kv-heads N] [--causal] [--window W] [--scale S]
 *              [--dropout P --seed N] [--need-weights] [--kv-half | --kv-type T]
 *              [--decode-from P [--page-size N] [--draft N [--reject K]]]
 *              [--rope half|interleaved [--rope-dims R] [--rope-theta T] [--rope-scaling KIND:F[:N]]]
 *              [--device SPEC]
 *
 * Order of work: parse the flags (usage errors, exit 2), check the two
 * directories, load and check every input file against the others (exit 1),
 * open the device, create the plan, execute, and only then write out.npy (and
 * attn.npy). Every failure prints exactly one line, "clattn run: ...", and
 * leaves --out as it was. */
#include "cli.h"
#include "npy.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { EXIT_OK = 0, EXIT_INPUT = 1, EXIT_USAGE = 2 };

/* Print one line "clattn run: ..." on stderr (clattn_cli_vsay). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    clattn_cli_vsay("clattn run", fmt, ap);
    va_end(ap);
}

static void usage_line(FILE *f)
{
    fprintf(f, "usage: clattn run --in DIR --out DIR [--heads H] [--kv-heads N] [--causal] [--window W] [--scale S]\n"
               "                  [--dropout P --seed N] [--need-weights] [--kv-half | --kv-type T]\n"
               "                  [--decode-from P [--page-size N] [--draft N [--reject K]]]\n"
               "                  [--algorithm auto|fused|unfused] [--precision fp32|tf32] [--backward] [--lse]\n"
               "                  [--dtype f32|f16|bf16] [--seqlens L,L,... [--kv-seqlens L,L,...]]\n"
               "                  [--rope half|interleaved [--rope-dims R] [--rope-theta T] [--rope-scaling K:F[:N]]]\n"
               "                  [--device SPEC] [-v]\n"
               "  --in DIR: the inputs (below); --out DIR: the outputs (created when missing; written whole or not\n"
               "               at all: each to a temporary file, renamed into place when every output is written)\n"
               "  --heads H: query heads (default 1); --causal: query i sees keys j <= i\n"
               "  --scale S: the score scale (default 1/sqrt(head size)); --dropout P --seed N: training-mode\n"
               "               dropout on the weights (Philox, the same bits on every device)\n"
               "  --need-weights: also write the attention weights (attn.npy, (B, H, Tq, Tk))\n"
               "  --algorithm: auto (default), fused or unfused; --device SPEC: ref, opencl, opencl:P:D, gpu, cpu,\n"
               "               name=TEXT (default: $CLATTN_DEVICE, else opencl, else ref)\n"
               "  --kv-heads N: grouped-query attention, N key/value heads (N divides --heads; default --heads);\n"
               "               w_key.npy and w_value.npy then have N*dk and N*dv rows\n"
               "  --window W: sliding window (with --causal, self-attention): query i sees key j when i - j < W\n"
               "  --kv-half: keys and values stored as IEEE half (rounded to nearest even), computed in fp32\n"
               "  --kv-type float|half|bf16|int8: the keys' and values' storage (--kv-half = --kv-type half); int8\n"
               "               (bytes and a scale per token and KV head) with --decode-from only\n"
               "  --precision: fp32 (default) or tf32: the attention core's products on TF32 operands (10-bit\n"
               "               mantissa), taken only by the tensor-core core flash_mma (CLATTN_CORE=flash_mma)\n"
               "  --decode-from P: (with --causal, self-attention) the first P tokens run as one prefill into a KV\n"
               "               cache, then each later token as its own decode step; out.npy holds all T outputs\n"
               "  --page-size N: (with --decode-from) a paged KV cache of pages of N positions (a power of two)\n"
               "  --draft N: (with --decode-from) the tokens after the prefill in verify steps of N (1 to 16) at a\n"
               "               time, each seeing the cache and the step's earlier tokens (a chain of drafts)\n"
               "  --reject K: (with --draft, 0 <= K < N) each step's last K tokens are rejected: the cache is rolled\n"
               "               back past them (clattn_kv_cache_truncate) and they run again at the head of the next\n"
               "               step; a step that reaches the last token keeps all. out.npy is the same either way\n"
               "  --backward: also the gradients: reads grad_out.npy (the shape of out.npy) and writes grad_NAME.npy\n"
               "               for every differentiable input NAME.npy given (x, kv, w_*, b_*), through a training\n"
               "               plan with the same seed (dropout keeps the forward's weights)\n"
               "  --lse: also write lse.npy ((B, H, Tq): each query row's log-sum-exp of its scaled, masked scores;\n"
               "               -inf for a row with no visible key)\n"
               "  --dtype: the plan's arrays: f32 (default), f16 (IEEE half) or bf16 (bfloat16). x, kv and the weights\n"
               "               are read as float32 .npy (rounded to the type, to nearest even) or in the type itself:\n"
               "               '<f2' for f16, '<u2' holding bfloat16 bit patterns for bf16; out.npy and attn.npy are\n"
               "               written in the type ('<f2', '<u2'); with --backward grad_out.npy is read and the\n"
               "               gradients written the same way (lse.npy stays float32). Not with --decode-from\n"
               "  --seqlens L,L,...: a variable-length batch: x.npy (and out.npy) is (total, E), its sequences of\n"
               "               these lengths packed without padding, each attending to its own rows only (causal and\n"
               "               --window per sequence); with kv.npy, --kv-seqlens gives its sequences' lengths. Not\n"
               "               with masks, --need-weights, --backward or --lse (the C API trains on varlen batches;\n"
               "               the CLI's are inference; --dropout keys sequence b as the padded batch's entry b).\n"
               "               With --decode-from, each sequence's first P tokens\n"
               "               (or all it has) are the prefill and every decode or verify step brings each sequence's\n"
               "               next tokens, packed (none once a sequence is done)\n"
               "  --rope half|interleaved: rotary position embeddings on Q and K (after their projections): pairs\n"
               "               (i, i + R/2) as GPT-NeoX and Llama in transformers, or (2i, 2i + 1) as GPT-J; positions\n"
               "               from 0 in each batch entry (each sequence with --seqlens), or as position_ids.npy\n"
               "               gives them; with --decode-from, keys rotated before they are cached\n"
               "  --rope-dims R: the values rotated per head (even; default the head size); --rope-theta T: the base\n"
               "               (default 10000); --rope-scaling linear:F, ntk:F or yarn:F:N (N: the model's original\n"
               "               context length): positions stretched by F (README, \"Attention variants\")\n"
               "  -v, --verbose: say on stderr what ran (device, shapes, heads, head sizes, algorithm, core, time)\n"
               "inputs in DIR: x.npy, optional kv.npy, w_query.npy/w_key.npy/w_value.npy (all or none),\n"
               "  b_query.npy, b_key.npy, b_value.npy, w_out.npy, b_out.npy, key_padding_mask.npy, attn_mask.npy\n"
               "  grad_out.npy (with --backward), position_ids.npy (with --rope: each row's position, int32 or\n"
               "  int64, (B, Tq) or (Tq,) like x's rows; with kv.npy also key_position_ids.npy, kv's rows'),\n"
               "  sinks.npy (H): attention sinks, one logit per query head in each row's softmax denominator\n"
               "outputs in DIR: out.npy, attn.npy with --need-weights, lse.npy with --lse, grad_*.npy with --backward\n");
}

/* ---------------------------------------------------------------- flags */

typedef struct run_opts {
    const char *in, *out, *device;
    size_t heads, kv_heads, window, decode_from, page_size, draft, reject;
    int causal, need_weights, verbose, kv_half; /* kv_half: a clattn_kv_type (--kv-half, --kv-type) */
    int backward, lse;  /* a training plan: the gradients (grad_out.npy in), the rows' log-sum-exp */
    float scale;        /* 0 = default 1/sqrt(dk) */
    float dropout;
    uint64_t seed;
    clattn_algorithm algorithm;
    clattn_precision precision;
    clattn_dtype dtype;
    int seen_prec, seen_dtype, seen_kv_type, seen_page, seen_draft, seen_reject, seen_seqlens, seen_kv_seqlens;
    uint32_t *cu_q, *cu_k; /* --seqlens, --kv-seqlens: the offsets (nseq + 1 each; malloc'd) */
    size_t nseq, nseq_k;
    int seen_heads, seen_scale, seen_dropout, seen_seed, seen_alg, seen_kv_heads, seen_window, seen_decode;
    clattn_rope rope;   /* --rope, --rope-dims, --rope-theta, --rope-scaling */
    int seen_rope, seen_rope_dims, seen_rope_theta, seen_rope_scaling;
} run_opts;

static const char *kv_type_name(int t)
{
    return t == CLATTN_KV_HALF ? "half" : t == CLATTN_KV_BF16 ? "bf16" : t == CLATTN_KV_INT8 ? "int8" : "float";
}

/* A whole decimal number (digits only, no sign or space) in uint64 range. */
static int parse_u64(const char *s, uint64_t *v)
{
    if (!*s) return 0;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    errno = 0;
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno == ERANGE || *end || x > UINT64_MAX) return 0;
    *v = (uint64_t)x;
    return 1;
}

/* A float that parses fully (no leading space) and is finite in float32. */
static int parse_float(const char *s, float *v)
{
    if (!*s || *s == ' ' || (*s >= '\t' && *s <= '\r')) return 0;
    errno = 0;
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end) return 0;
    if (isnan(x) || isinf(x)) return 0;
    float f = (float)x;
    if (isinf(f)) return 0;
    *v = f;
    return 1;
}

/* --rope-scaling: "linear:F", "ntk:F" or "yarn:F:N" (F a finite number, N a whole number from 1). 0, or -1 (said). */
static int parse_rope_scaling(const char *v, clattn_rope *r)
{
    static const char *const kinds[] = {"linear", "ntk", "yarn"}; /* CLATTN_ROPE_SCALING_LINEAR .. _YARN */
    const size_t len = strcspn(v, ":");
    int k = 0;
    while (k < 3 && (strlen(kinds[k]) != len || strncmp(v, kinds[k], len))) k++;
    char num[64];
    const char *f = v[len] ? v + len + 1 : "";
    const size_t flen = strcspn(f, ":");
    float factor = 0.0f;
    uint64_t orig = 0;
    int ok = k < 3 && flen > 0 && flen < sizeof num;
    if (ok) memcpy(num, f, flen), num[flen] = 0, ok = parse_float(num, &factor);
    if (ok && k == 2) ok = f[flen] == ':' && parse_u64(f + flen + 1, &orig) && orig > 0;
    else if (ok) ok = f[flen] == 0;
    if (!ok) {
        say("--rope-scaling '%s': linear:F, ntk:F or yarn:F:N (F the factor, N the original context length)", v);
        return -1;
    }
    r->scaling = (clattn_rope_scaling)(k + 1), r->factor = factor, r->original_max_position = (size_t)orig;
    return 0;
}

/* Returns -1 to go on, or an exit status. */
/* "7,1,130": each a whole number up to 2^31 - 1, the sum too, at most 65536 of them, as B+1 offsets (malloc'd). */
static int parse_seqlens(const char *flag, const char *v, uint32_t **cu, size_t *n)
{
    size_t count = 1;
    for (const char *p = v; *p; p++) count += *p == ',';
    if (count > 65536) {
        say("%s: %zu lengths; at most 65536 sequences", flag, count);
        return -1;
    }
    if (!(*cu = malloc((count + 1) * sizeof **cu))) {
        say("out of memory");
        return -1;
    }
    (*cu)[0] = 0;
    const char *p = v;
    for (size_t b = 0; b < count; b++) {
        char num[24];
        const size_t len = strcspn(p, ",");
        uint64_t x;
        if (len == 0 || len >= sizeof num) x = UINT64_MAX;
        else memcpy(num, p, len), num[len] = 0;
        if (len == 0 || len >= sizeof num || !parse_u64(num, &x) || x > 0x7FFFFFFFu ||
            (*cu)[b] + x > 0x7FFFFFFFu) {
            say("%s '%s': a comma-separated list of whole numbers (sequence lengths, 0 allowed), their sum below 2^31",
                flag, v);
            return -1;
        }
        (*cu)[b + 1] = (*cu)[b] + (uint32_t)x;
        p += len + (p[len] == ',');
    }
    *n = count;
    return 0;
}

static int parse_flags(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->heads = 1;
    int seen_in = 0, seen_out = 0, seen_dev = 0, seen_causal = 0, seen_nw = 0, seen_v = 0, seen_half = 0;
    int seen_bwd = 0, seen_lse = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage_line(stdout);
            return EXIT_OK;
        }
        int *seen = NULL;
        int takes_value = 1;
        if (strcmp(a, "--in") == 0) seen = &seen_in;
        else if (strcmp(a, "--out") == 0) seen = &seen_out;
        else if (strcmp(a, "--device") == 0) seen = &seen_dev;
        else if (strcmp(a, "--heads") == 0) seen = &o->seen_heads;
        else if (strcmp(a, "--scale") == 0) seen = &o->seen_scale;
        else if (strcmp(a, "--dropout") == 0) seen = &o->seen_dropout;
        else if (strcmp(a, "--seed") == 0) seen = &o->seen_seed;
        else if (strcmp(a, "--algorithm") == 0) seen = &o->seen_alg;
        else if (strcmp(a, "--precision") == 0) seen = &o->seen_prec;
        else if (strcmp(a, "--dtype") == 0) seen = &o->seen_dtype;
        else if (strcmp(a, "--kv-heads") == 0) seen = &o->seen_kv_heads;
        else if (strcmp(a, "--window") == 0) seen = &o->seen_window;
        else if (strcmp(a, "--decode-from") == 0) seen = &o->seen_decode;
        else if (strcmp(a, "--page-size") == 0) seen = &o->seen_page;
        else if (strcmp(a, "--draft") == 0) seen = &o->seen_draft;
        else if (strcmp(a, "--reject") == 0) seen = &o->seen_reject;
        else if (strcmp(a, "--seqlens") == 0) seen = &o->seen_seqlens;
        else if (strcmp(a, "--kv-seqlens") == 0) seen = &o->seen_kv_seqlens;
        else if (strcmp(a, "--rope") == 0) seen = &o->seen_rope;
        else if (strcmp(a, "--rope-dims") == 0) seen = &o->seen_rope_dims;
        else if (strcmp(a, "--rope-theta") == 0) seen = &o->seen_rope_theta;
        else if (strcmp(a, "--rope-scaling") == 0) seen = &o->seen_rope_scaling;
        else if (strcmp(a, "--kv-half") == 0) seen = &seen_half, takes_value = 0;
        else if (strcmp(a, "--kv-type") == 0) seen = &o->seen_kv_type;
        else if (strcmp(a, "--causal") == 0) seen = &seen_causal, takes_value = 0;
        else if (strcmp(a, "--need-weights") == 0) seen = &seen_nw, takes_value = 0;
        else if (strcmp(a, "--backward") == 0) seen = &seen_bwd, takes_value = 0;
        else if (strcmp(a, "--lse") == 0) seen = &seen_lse, takes_value = 0;
        else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) seen = &seen_v, takes_value = 0;
        else {
            if (a[0] == '-') say("unknown option '%s' (see clattn run --help)", a);
            else say("unexpected argument '%s' (see clattn run --help)", a);
            return EXIT_USAGE;
        }
        if (*seen) {
            say("%s given more than once", a);
            return EXIT_USAGE;
        }
        *seen = 1;
        if (!takes_value) {
            if (seen == &seen_causal) o->causal = 1;
            else if (seen == &seen_v) o->verbose = 1;
            else if (seen == &seen_half) o->kv_half = 1;
            else if (seen == &seen_bwd) o->backward = 1;
            else if (seen == &seen_lse) o->lse = 1;
            else o->need_weights = 1;
            continue;
        }
        /* a value that is another flag ("--heads --causal") counts as missing */
        if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
            say("%s needs a value", a);
            return EXIT_USAGE;
        }
        const char *v = argv[++i];
        if (seen == &seen_in) {
            o->in = v;
        } else if (seen == &seen_out) {
            o->out = v;
        } else if (seen == &seen_dev) {
            if (!*v) {
                say("--device: empty device spec (use ref, opencl, opencl:P:D, gpu, cpu, accelerator or name=TEXT)");
                return EXIT_USAGE;
            }
            o->device = v;
        } else if (seen == &o->seen_heads) {
            uint64_t h;
            if (!parse_u64(v, &h) || h == 0 || h > 0xFFFFFFFFu) {
                say("--heads '%s': must be a whole number from 1 to 4294967295", v);
                return EXIT_USAGE;
            }
            o->heads = (size_t)h;
        } else if (seen == &o->seen_kv_heads || seen == &o->seen_window || seen == &o->seen_decode) {
            uint64_t n;
            if (!parse_u64(v, &n) || n == 0 || n > 0xFFFFFFFFu) {
                say("%s '%s': must be a whole number from 1 to 4294967295", a, v);
                return EXIT_USAGE;
            }
            if (seen == &o->seen_kv_heads) o->kv_heads = (size_t)n;
            else if (seen == &o->seen_window) o->window = (size_t)n;
            else o->decode_from = (size_t)n;
        } else if (seen == &o->seen_draft || seen == &o->seen_reject) {
            uint64_t n;
            const uint64_t lo = seen == &o->seen_draft, hi = seen == &o->seen_draft ? 16 : 15;
            if (!parse_u64(v, &n) || n < lo || n > hi) {
                say("%s '%s': must be a whole number from %llu to %llu", a, v, (unsigned long long)lo,
                    (unsigned long long)hi);
                return EXIT_USAGE;
            }
            if (seen == &o->seen_draft) o->draft = (size_t)n;
            else o->reject = (size_t)n;
        } else if (seen == &o->seen_page) {
            uint64_t n;
            if (!parse_u64(v, &n) || n == 0 || n > 65536 || (n & (n - 1))) {
                say("--page-size '%s': must be a power of two from 1 to 65536", v);
                return EXIT_USAGE;
            }
            o->page_size = (size_t)n;
        } else if (seen == &o->seen_scale) {
            if (!parse_float(v, &o->scale) || o->scale == 0.0f) {
                say("--scale '%s': must be a finite nonzero number (in float32 range)", v);
                return EXIT_USAGE;
            }
        } else if (seen == &o->seen_dropout) {
            if (!parse_float(v, &o->dropout) || !(o->dropout >= 0.0f && o->dropout < 1.0f)) {
                say("--dropout '%s': must be a number p with 0 <= p < 1", v);
                return EXIT_USAGE;
            }
        } else if (seen == &o->seen_alg) {
            if (clattn_cli_parse_algorithm(v, &o->algorithm)) {
                say("--algorithm '%s': must be auto, fused or unfused", v);
                return EXIT_USAGE;
            }
        } else if (seen == &o->seen_prec) {
            if (strcmp(v, "fp32") == 0) o->precision = CLATTN_PRECISION_FP32;
            else if (strcmp(v, "tf32") == 0) o->precision = CLATTN_PRECISION_TF32;
            else {
                say("--precision '%s': must be fp32 or tf32", v);
                return EXIT_USAGE;
            }
        } else if (seen == &o->seen_dtype) {
            if (clattn_cli_parse_dtype(v, &o->dtype)) {
                say("--dtype '%s': must be f32, f16 or bf16", v);
                return EXIT_USAGE;
            }
        } else if (seen == &o->seen_kv_type) {
            static const char *const names[] = {"float", "half", "bf16", "int8"}; /* by clattn_kv_type */
            int t = 0;
            while (t < 4 && strcmp(v, names[t])) t++;
            if (t == 4) {
                say("--kv-type '%s': must be float, half, bf16 or int8", v);
                return EXIT_USAGE;
            }
            o->kv_half = t;
        } else if (seen == &o->seen_seqlens || seen == &o->seen_kv_seqlens) {
            if (seen == &o->seen_seqlens ? parse_seqlens(a, v, &o->cu_q, &o->nseq)
                                         : parse_seqlens(a, v, &o->cu_k, &o->nseq_k))
                return EXIT_USAGE;
        } else if (seen == &o->seen_rope) {
            if (strcmp(v, "half") == 0) o->rope.kind = CLATTN_ROPE_HALF;
            else if (strcmp(v, "interleaved") == 0) o->rope.kind = CLATTN_ROPE_INTERLEAVED;
            else {
                say("--rope '%s': must be half (pairs i, i + R/2: GPT-NeoX, Llama) or interleaved (pairs 2i, 2i + 1: "
                    "GPT-J)", v);
                return EXIT_USAGE;
            }
        } else if (seen == &o->seen_rope_dims) {
            uint64_t n;
            if (!parse_u64(v, &n) || n == 0 || n % 2 || n > 0xFFFFFFFFu) {
                say("--rope-dims '%s': must be an even whole number from 2", v);
                return EXIT_USAGE;
            }
            o->rope.dims = (size_t)n;
        } else if (seen == &o->seen_rope_theta) {
            float t;
            if (!parse_float(v, &t) || !(t > 1.0f)) {
                say("--rope-theta '%s': must be a finite number above 1", v);
                return EXIT_USAGE;
            }
            o->rope.theta = t;
        } else if (seen == &o->seen_rope_scaling) {
            if (parse_rope_scaling(v, &o->rope)) return EXIT_USAGE;
        } else if (seen == &o->seen_seed) {
            if (!parse_u64(v, &o->seed)) {
                say("--seed '%s': must be a whole number from 0 to 18446744073709551615", v);
                return EXIT_USAGE;
            }
        }
    }
    if (seen_half && o->seen_kv_type) {
        say("--kv-half and --kv-type: give one of them (--kv-half is --kv-type half)");
        return EXIT_USAGE;
    }
    if (!seen_in) {
        say("--in DIR is required (the directory holding x.npy)");
        return EXIT_USAGE;
    }
    if (!seen_out) {
        say("--out DIR is required (an existing directory for out.npy)");
        return EXIT_USAGE;
    }
    if (!o->seen_kv_heads) o->kv_heads = o->heads;
    if (o->kv_heads > o->heads || o->heads % o->kv_heads) {
        say("--kv-heads %zu: must divide --heads %zu", o->kv_heads, o->heads);
        return EXIT_USAGE;
    }
    if (o->seen_window && !o->causal) {
        say("--window needs --causal (the sliding window limits how far back a query sees)");
        return EXIT_USAGE;
    }
    if ((o->seen_rope_dims || o->seen_rope_theta || o->seen_rope_scaling) && !o->seen_rope) {
        say("%s without --rope: say which pairs rotate (half or interleaved)", o->seen_rope_dims ? "--rope-dims" :
            o->seen_rope_theta ? "--rope-theta" : "--rope-scaling");
        return EXIT_USAGE;
    }
    if (o->seen_page && !o->seen_decode) {
        say("--page-size without --decode-from: only a decode session keeps a KV cache");
        return EXIT_USAGE;
    }
    if (o->seen_draft && !o->seen_decode) {
        say("--draft without --decode-from: verify steps run on a decode session's KV cache");
        return EXIT_USAGE;
    }
    if (o->seen_reject && !o->seen_draft) {
        say("--reject without --draft: only a verify step of several tokens can reject some");
        return EXIT_USAGE;
    }
    if (!o->seen_draft) o->draft = 1;
    if (o->reject >= o->draft) {
        say("--reject %zu with --draft %zu: a step must keep at least one of its tokens (K < N)", o->reject, o->draft);
        return EXIT_USAGE;
    }
    if (o->seen_decode && !o->causal) {
        say("--decode-from needs --causal (decoding is causal self-attention)");
        return EXIT_USAGE;
    }
    if (o->seen_decode && o->need_weights) {
        say("--decode-from with --need-weights: decode steps do not return the attention weights");
        return EXIT_USAGE;
    }
    if (o->seen_decode && o->seen_dropout && o->dropout > 0.0f) {
        say("--decode-from with --dropout: decode steps run without dropout (inference)");
        return EXIT_USAGE;
    }
    if (o->seen_decode && o->algorithm == CLATTN_ALGORITHM_UNFUSED) {
        say("--decode-from with --algorithm unfused: decoding runs its own fused kernel (use auto or fused)");
        return EXIT_USAGE;
    }
    if (o->seen_kv_seqlens && !o->seen_seqlens) {
        say("--kv-seqlens without --seqlens: give the queries' sequence lengths too");
        return EXIT_USAGE;
    }
    if (o->seen_kv_seqlens && o->nseq_k != o->nseq) {
        say("--kv-seqlens has %zu lengths, --seqlens %zu: one key sequence per query sequence", o->nseq_k, o->nseq);
        return EXIT_USAGE;
    }
    if (o->seen_seqlens && (o->need_weights || o->backward || o->lse)) {
        say("--seqlens with %s: a variable-length batch runs inference without weights (README, \"Variable-length "
            "batches\")", o->need_weights ? "--need-weights" : o->backward ? "--backward" : "--lse");
        return EXIT_USAGE;
    }
    if (o->seen_decode && (o->backward || o->lse)) {
        say("--decode-from with %s: decode steps are inference (no training statistics, no backward)",
            o->backward ? "--backward" : "--lse");
        return EXIT_USAGE;
    }
    if (o->need_weights && o->algorithm == CLATTN_ALGORITHM_FUSED) {
        say("--need-weights with --algorithm fused: the fused kernel does not produce the weights (use auto or unfused)");
        return EXIT_USAGE;
    }
    return -1;
}

/* ---------------------------------------------------------------- inputs */

enum {
    F_X, F_KV, F_WQ, F_WK, F_WV, F_BQ, F_BK, F_BV, F_WO, F_BO, F_KPM, F_MASK, F_GOUT, F_POS, F_POS_KV, F_SINKS, F_COUNT
};

static const char *const file_names[F_COUNT] = {
    "x.npy",     "kv.npy",    "w_query.npy", "w_key.npy", "w_value.npy",          "b_query.npy",
    "b_key.npy", "b_value.npy", "w_out.npy", "b_out.npy", "key_padding_mask.npy", "attn_mask.npy", "grad_out.npy",
    "position_ids.npy", "key_position_ids.npy", "sinks.npy"};

typedef struct inputs {
    clattn_npy a[F_COUNT];
    int has[F_COUNT];
} inputs;

static void inputs_free(inputs *in)
{
    for (int f = 0; f < F_COUNT; f++) clattn_npy_free(&in->a[f]);
}

/* The .npy type that holds a plan type's elements as they are: '<f4', '<f2', '<u2' (bfloat16 bit patterns). */
static clattn_npy_dtype npy_type_of(clattn_dtype t)
{
    return t == CLATTN_DTYPE_F16 ? CLATTN_NPY_F16 : t == CLATTN_DTYPE_BF16 ? CLATTN_NPY_U16 : CLATTN_NPY_F32;
}

static const char *shape_str(const clattn_npy *a, char *buf, size_t len)
{
    return clattn_cli_shape(buf, len, a->ndim, a->shape);
}

/* Load every file that exists; check dtypes (the floating inputs: float32, or the plan type's own .npy type) and that
 * no dimension is 0. */
static int load_inputs(const char *dir, clattn_dtype type, inputs *in)
{
    for (int f = 0; f < F_COUNT; f++) {
        size_t need = strlen(dir) + 1 + strlen(file_names[f]) + 1;
        char *path = malloc(need);
        if (!path) {
            say("out of memory");
            return -1;
        }
        snprintf(path, need, "%s/%s", dir, file_names[f]);
        struct stat sb;
        if (lstat(path, &sb) != 0) {
            int e = errno;
            free(path);
            if (e == ENOENT && f == F_X) say("x.npy: missing from --in '%s' (it is required)", dir);
            else if (e == ENOENT) continue; /* absent: optional */
            else say("%s: %s", file_names[f], strerror(e));
            return -1;
        }
        char err[512];
        int rc = clattn_npy_load(path, &in->a[f], err, sizeof err);
        free(path);
        if (rc != 0) {
            say("%s: %s", file_names[f], err);
            return -1;
        }
        in->has[f] = 1;
        const clattn_npy *a = &in->a[f];
        int mask = f == F_KPM || f == F_MASK;
        const int pos = f == F_POS || f == F_POS_KV; /* rotary positions: integers */
        const int half = a->dtype == CLATTN_NPY_F16 || a->dtype == CLATTN_NPY_U16;
        const int bytes = a->dtype == CLATTN_NPY_U8 || a->dtype == CLATTN_NPY_BOOL;
        const int ints = a->dtype == CLATTN_NPY_I32 || a->dtype == CLATTN_NPY_I64;
        int ok = pos ? ints
               : half ? !mask && a->dtype == npy_type_of(type)
               : a->dtype == CLATTN_NPY_F32 ? (!mask || f == F_MASK) : bytes && mask;
        if (!ok && pos) {
            say("%s: dtype %s but expected int32 or int64 (each row's position)", file_names[f],
                clattn_npy_dtype_name(a->dtype));
            return -1;
        }
        if (!ok) {
            char typed[64] = "";
            if (type != CLATTN_DTYPE_F32 && !mask)
                snprintf(typed, sizeof typed, " or %s (--dtype %s)", clattn_npy_dtype_name(npy_type_of(type)),
                         type == CLATTN_DTYPE_F16 ? "f16" : "bf16");
            say("%s: dtype %s but expected %s%s%s", file_names[f], clattn_npy_dtype_name(a->dtype),
                f == F_KPM ? "bool or uint8" : f == F_MASK ? "bool, uint8 or float32" : "float32", typed,
                half && type == CLATTN_DTYPE_F32 && !mask ? " (a 16-bit array needs --dtype f16 or bf16)" : "");
            return -1;
        }
        if (a->count == 0 || a->ndim == 0) {
            char s[256];
            say("%s: shape %s %s", file_names[f], shape_str(a, s, sizeof s),
                a->ndim == 0 ? "is a scalar, expected an array" : "is empty (every dimension must be >= 1)");
            return -1;
        }
    }
    return 0;
}

/* --dtype f16 / bf16: every float32 input of the plan's (x, kv, the weights, grad_out; not the masks) rounded to the
 * type, to nearest even (clattn_dtype_convert), in place of its floats. */
static int inputs_to_type(inputs *in, clattn_dtype type)
{
    if (type == CLATTN_DTYPE_F32) return 0;
    for (int f = 0; f < F_COUNT; f++) {
        clattn_npy *a = &in->a[f];
        if (!in->has[f] || f == F_KPM || f == F_MASK || a->dtype != CLATTN_NPY_F32) continue;
        uint16_t *h = malloc(a->count ? a->count * sizeof *h : 1);
        if (!h) {
            say("out of memory converting %s to the plan's type", file_names[f]);
            return -1;
        }
        if (clattn_dtype_convert(a->data, CLATTN_DTYPE_F32, h, type, a->count) != CLATTN_STATUS_SUCCESS) {
            free(h);
            say("%s: %s", file_names[f], clattn_last_error());
            return -1;
        }
        free(a->data);
        a->data = h, a->dtype = npy_type_of(type);
    }
    return 0;
}

/* The problem's dimensions, once every shape has been checked. */
typedef struct dims {
    int two_d;                  /* x.npy was (Tq, E) */
    size_t B, Tq, Tk, E, Ekv, H, dk, dv, Eo;
    int cross, weights, out_proj;
} dims;

/* shape must be exactly `want` (ndim entries) */
static int expect(const inputs *in, int f, int ndim, const size_t *want, const char *what)
{
    const clattn_npy *a = &in->a[f];
    int ok = a->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = a->shape[d] == want[d];
    if (ok) return 0;
    char got[256], exp[256];
    shape_str(a, got, sizeof got);
    clattn_cli_shape(exp, sizeof exp, ndim, want);
    say("%s: shape %s but expected %s %s", file_names[f], got, exp, what);
    return -1;
}

/* A (rows, cols) matrix with cols fixed; rows returned. */
static int expect_matrix(const inputs *in, int f, size_t cols, const char *what, size_t *rows)
{
    const clattn_npy *a = &in->a[f];
    if (a->ndim != 2) {
        char got[256];
        say("%s: shape %s has %d dimension%s but expected 2 %s", file_names[f], shape_str(a, got, sizeof got),
            a->ndim, a->ndim == 1 ? "" : "s", what);
        return -1;
    }
    size_t want[2] = {a->shape[0], cols};
    if (expect(in, f, 2, want, what)) return -1;
    *rows = a->shape[0];
    return 0;
}

static int check_shapes(const inputs *in, size_t heads, size_t kv_heads, dims *d)
{
    char s[256];
    memset(d, 0, sizeof *d);
    d->H = heads;
    const size_t HK = kv_heads;
    const clattn_npy *x = &in->a[F_X];
    if (x->ndim != 2 && x->ndim != 3) {
        say("x.npy: shape %s has %d dimension%s but expected (B, Tq, E) or (Tq, E)", shape_str(x, s, sizeof s),
            x->ndim, x->ndim == 1 ? "" : "s");
        return -1;
    }
    d->two_d = x->ndim == 2;
    d->B = d->two_d ? 1 : x->shape[0];
    d->Tq = x->shape[x->ndim - 2];
    d->E = x->shape[x->ndim - 1];

    d->cross = in->has[F_KV];
    if (d->cross) {
        const clattn_npy *kv = &in->a[F_KV];
        if (kv->ndim != x->ndim) {
            say("kv.npy: shape %s has %d dimension%s but expected %s, like x.npy %s", shape_str(kv, s, sizeof s),
                kv->ndim, kv->ndim == 1 ? "" : "s", d->two_d ? "(Tk, Ekv)" : "(B, Tk, Ekv)",
                d->two_d ? "(Tq, E)" : "(B, Tq, E)");
            return -1;
        }
        if (!d->two_d && kv->shape[0] != d->B) {
            size_t want[3] = {d->B, kv->shape[1], kv->shape[2]};
            return expect(in, F_KV, 3, want, "(B, Tk, Ekv): its batch must match x.npy's");
        }
        d->Tk = kv->shape[kv->ndim - 2];
        d->Ekv = kv->shape[kv->ndim - 1];
    } else {
        d->Tk = d->Tq;
        d->Ekv = d->E;
    }

    int nqkv = in->has[F_WQ] + in->has[F_WK] + in->has[F_WV];
    if (nqkv != 0 && nqkv != 3) {
        const int fs[3] = {F_WQ, F_WK, F_WV};
        char missing[64] = "";
        for (int i = 0; i < 3; i++)
            if (!in->has[fs[i]])
                snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", *missing ? " and " : "",
                         file_names[fs[i]]);
        say("%s: missing (w_query.npy, w_key.npy and w_value.npy must be given together, or none of them)", missing);
        return -1;
    }
    d->weights = nqkv == 3;
    if (d->weights) {
        size_t rq, rk, rv;
        if (expect_matrix(in, F_WQ, d->E, "(H*dk, E)", &rq)) return -1;
        if (rq % d->H) {
            say("w_query.npy: shape %s: its %zu rows (H*dk) are not divisible by --heads %zu", shape_str(&in->a[F_WQ], s, sizeof s),
                rq, d->H);
            return -1;
        }
        const int gqa = HK != d->H;
        const char *kdesc = gqa ? "(kv_heads*dk, Ekv)" : "(H*dk, Ekv)", *vdesc = gqa ? "(kv_heads*dv, Ekv)" : "(H*dv, Ekv)";
        if (expect_matrix(in, F_WK, d->Ekv, kdesc, &rk)) return -1;
        if (rk != rq / d->H * HK) {
            size_t want[2] = {rq / d->H * HK, d->Ekv};
            return expect(in, F_WK, 2, want, kdesc);
        }
        if (expect_matrix(in, F_WV, d->Ekv, vdesc, &rv)) return -1;
        if (rv % HK) {
            say("w_value.npy: shape %s: its %zu rows (%s) are not divisible by --%s %zu", shape_str(&in->a[F_WV], s, sizeof s),
                rv, gqa ? "kv_heads*dv" : "H*dv", gqa ? "kv-heads" : "heads", HK);
            return -1;
        }
        d->dk = rq / d->H;
        d->dv = rv / HK;
        size_t nq[1] = {rq}, nk[1] = {rk}, nv[1] = {rv};
        if (in->has[F_BQ] && expect(in, F_BQ, 1, nq, "(H*dk)")) return -1;
        if (in->has[F_BK] && expect(in, F_BK, 1, nk, gqa ? "(kv_heads*dk)" : "(H*dk)")) return -1;
        if (in->has[F_BV] && expect(in, F_BV, 1, nv, gqa ? "(kv_heads*dv)" : "(H*dv)")) return -1;
    } else {
        const int bs[3] = {F_BQ, F_BK, F_BV};
        for (int i = 0; i < 3; i++)
            if (in->has[bs[i]]) {
                say("%s: given without w_query.npy, w_key.npy and w_value.npy (a bias needs the weights)",
                    file_names[bs[i]]);
                return -1;
            }
        if (HK != d->H) {
            say("--kv-heads %zu: grouped-query attention needs w_query.npy, w_key.npy and w_value.npy (the key/value "
                "projections make the kv heads)", HK);
            return -1;
        }
        if (d->E % d->H) {
            say("--heads %zu does not divide E = %zu, the last dimension of x.npy %s (without Q/K/V weights the "
                "heads split x)", d->H, d->E, shape_str(x, s, sizeof s));
            return -1;
        }
        if (d->Ekv != d->E) {
            say("kv.npy: shape %s: without Q/K/V weights its last dimension must equal E = %zu of x.npy",
                shape_str(&in->a[F_KV], s, sizeof s), d->E);
            return -1;
        }
        d->dk = d->dv = d->E / d->H;
    }

    d->out_proj = in->has[F_WO];
    if (d->out_proj) {
        if (expect_matrix(in, F_WO, d->H * d->dv, "(Eo, H*dv)", &d->Eo)) return -1;
        size_t no[1] = {d->Eo};
        if (in->has[F_BO] && expect(in, F_BO, 1, no, "(Eo), the rows of w_out.npy")) return -1;
    } else if (in->has[F_BO]) {
        say("b_out.npy: given without w_out.npy");
        return -1;
    }
    size_t nh[1] = {d->H};
    if (in->has[F_SINKS] && expect(in, F_SINKS, 1, nh, "(H), one sink logit per query head")) return -1;

    if (in->has[F_KPM]) {
        const clattn_npy *k = &in->a[F_KPM];
        if (d->two_d && k->ndim == 1) { /* (Tk,) is accepted for a 2-D x */
            size_t want[1] = {d->Tk};
            if (expect(in, F_KPM, 1, want, "(Tk)")) return -1;
        } else {
            size_t want[2] = {d->B, d->Tk};
            if (expect(in, F_KPM, 2, want, "(B, Tk)")) return -1;
        }
    }
    if (in->has[F_MASK]) {
        size_t want[2] = {d->Tq, d->Tk};
        if (expect(in, F_MASK, 2, want, "(Tq, Tk)")) return -1;
    }
    /* the rows' rotary positions: (B, Tq) and kv's (B, Tk), or (Tq,) and (Tk,) for a 2-D x (--seqlens: every packed
     * row's); key_position_ids.npy without kv.npy is refused by check_combination */
    for (int f = F_POS; f <= F_POS_KV; f++) {
        if (!in->has[f] || (f == F_POS_KV && !d->cross)) continue;
        size_t want[2] = {d->B, f == F_POS ? d->Tq : d->Tk};
        if (d->two_d ? expect(in, f, 1, want + 1, f == F_POS ? "(Tq)" : "(Tk)")
                     : expect(in, f, 2, want, f == F_POS ? "(B, Tq)" : "(B, Tk)"))
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- device, outputs */

static char *join(const char *dir, const char *name)
{
    size_t need = strlen(dir) + 1 + strlen(name) + 1;
    char *p = malloc(need);
    if (p) snprintf(p, need, "%s/%s", dir, name);
    return p;
}

/* One output file: its name in --out, its data and shape. */
typedef struct out_file {
    const char *name;
    const void *data;
    int nd;
    size_t shape[4];
    clattn_npy_dtype type; /* its .npy type: CLATTN_NPY_F32, or F16 / U16 for a half plan's out and attn */
} out_file;

#define MAX_OUT_FILES 16

/* Every output to a temporary file first, renamed into place only when all are written: on any error --out is
 * as it was (or is renamed partly only if a rename itself fails); a link or a FIFO at a name is replaced, never
 * followed or opened. */
static int write_files(const char *dir, const out_file *files, int n)
{
    char err[512], tmp[MAX_OUT_FILES][4200];
    char *path[MAX_OUT_FILES] = {NULL};
    int rc = -1, made = 0;
    for (int i = 0; i < n; i++) tmp[i][0] = '\0';
    for (int i = 0; i < n; i++)
        if (!(path[i] = join(dir, files[i].name))) {
            say("out of memory");
            goto out;
        }
    if (clattn_cli_make_dir("clattn run", "--out", dir, &made) != 0) goto out; /* said */
    struct stat st;
    for (int i = 0; i < n; i++)
        if (lstat(path[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            say("%s: '%s' is a directory", files[i].name, path[i]);
            goto out;
        }
    for (int i = 0; i < n; i++)
        if (clattn_npy_save_temp(path[i], files[i].type, files[i].data, files[i].nd,
                                 files[i].shape, tmp[i], sizeof tmp[i], err, sizeof err) != 0) {
            say("%s: %s", files[i].name, err);
            goto out;
        }
    for (int i = 0; i < n; i++) {
        if (rename(tmp[i], path[i]) != 0) {
            say("%s: cannot rename %s into place: %s", files[i].name, tmp[i], strerror(errno));
            goto out;
        }
        tmp[i][0] = '\0';
    }
    rc = 0;
out:
    for (int i = 0; i < n; i++) {
        if (tmp[i][0]) unlink(tmp[i]);
        free(path[i]);
    }
    if (rc) clattn_cli_unmake_dir(dir, made);
    return rc;
}

/* The shape of a (B, Tq, ...) output: without the batch dimension when x.npy has none. */
static out_file shaped(const char *name, const float *data, const dims *d, size_t a, size_t b, size_t c)
{
    out_file f = {name, data, 0, {0}, CLATTN_NPY_F32};
    if (!d->two_d) f.shape[f.nd++] = d->B;
    f.shape[f.nd++] = a, f.shape[f.nd++] = b;
    if (c) f.shape[f.nd++] = c;
    return f;
}

static int write_outputs(const char *dir, const dims *d, size_t out_width, const float *out, const float *attn)
{
    out_file files[2] = {shaped("out.npy", out, d, d->Tq, out_width, 0)};
    if (attn) files[1] = shaped("attn.npy", attn, d, d->H, d->Tq, d->Tk);
    return write_files(dir, files, attn ? 2 : 1);
}

static int mul_ok(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* ---------------------------------------------------------------- --decode-from */

/* A session: the first P tokens of each sequence as one prefill, then steps of `draft` tokens (1: decode steps), and
 * `reject` of them rolled back after each step that does not reach the sequence's end. */
typedef struct decode_session {
    size_t P, page, draft, reject;
    const uint32_t *cu;              /* --seqlens: nseq sequences packed in x (NULL: x's B sequences of T tokens) */
    size_t nseq;
    const uint32_t *pos;             /* position_ids.npy: each row of x's position (NULL: each token at its slot) */
    size_t parts, pages_used, steps; /* out: the most split-K parts a step took, pages in use at the end, steps */
    double ms;
} decode_session;

/* Every step is packed (clattn_decode_args.cu_new): sequence b's tokens are rows start[b] .. start[b] + len[b] - 1 of
 * x, b*T .. of x (B, T, E) or its --seqlens offsets of a packed x; the first min(P, len[b]) of each go as one prefill
 * into a KV cache of the longest sequence's positions, then each sequence's later tokens in steps of s->draft (a
 * sequence that is done brings none; the last s->reject of a step that does not reach its end are rolled back and run
 * again in the next), each at its row's position in s->pos when given; out, laid out as x, gathers every token's rows
 * from the step that kept it. */
static clattn_status decode_run(clattn_device *dev, clattn_attention_desc desc, const clattn_attention_weights *w,
                                const dims *d, decode_session *s, const float *x, size_t out_width, float *out,
                                char *core, size_t core_len)
{
    const size_t B = s->cu ? s->nseq : d->B, E = d->E, P = s->P;
    const size_t nmax = P > s->draft ? P : s->draft;
    desc.batch = B, desc.varlen = 0, desc.seq_q = nmax;
    desc.kv_page_size = s->page; /* (0: a contiguous cache) */
    clattn_decode_plan *plan = NULL;
    clattn_kv_cache *cache = NULL;
    float *xs = malloc((B * nmax * E + 1) * sizeof *xs), *os = malloc((B * nmax * out_width + 1) * sizeof *os);
    size_t *len = malloc(4 * B * sizeof *len), *start = len + B, *at = len + 2 * B, *keep = len + 3 * B;
    uint32_t *cu = malloc((B + 1) * sizeof *cu), *cnt = malloc(B * sizeof *cnt);
    uint32_t *ps = s->pos ? malloc(B * nmax * sizeof *ps) : NULL;
    clattn_status st = CLATTN_STATUS_OUT_OF_HOST_MEMORY;
    if (!xs || !os || !len || !cu || !cnt || (s->pos && !ps)) goto done;
    size_t cap = 1, left = 0;
    for (size_t b = 0; b < B; b++) {
        len[b] = s->cu ? s->cu[b + 1] - s->cu[b] : d->Tq, start[b] = s->cu ? s->cu[b] : b * d->Tq, at[b] = 0;
        if (len[b] > cap) cap = len[b];
        left += len[b];
    }
    if ((st = clattn_decode_plan_create(dev, &desc, w, &plan)) != CLATTN_STATUS_SUCCESS) goto done;
    clattn_cli_notice("clattn run");
    snprintf(core, core_len, "%s", clattn_decode_plan_core(plan));
    clattn_kv_cache_desc cd = {.batch = B, .capacity = cap, .kv_heads = desc.kv_heads ? desc.kv_heads : desc.heads,
                               .type = (clattn_kv_type)desc.kv_half, .page_size = s->page};
    cd.head_dim_qk = d->dk, cd.head_dim_v = d->dv;
    if ((st = clattn_kv_cache_create(dev, &cd, &cache)) != CLATTN_STATUS_SUCCESS) goto done;
    const double t0 = clattn_cli_now_ms();
    for (int first = 1; left; first = 0) {
        cu[0] = 0;
        for (size_t b = 0; b < B; b++) {
            const size_t n = first ? P : s->draft, rest = len[b] - at[b];
            cnt[b] = (uint32_t)(rest < n ? rest : n), cu[b + 1] = cu[b] + cnt[b];
            memcpy(xs + cu[b] * E, x + (start[b] + at[b]) * E, cnt[b] * E * sizeof *xs);
            if (ps) memcpy(ps + cu[b], s->pos + start[b] + at[b], cnt[b] * sizeof *ps);
        }
        clattn_decode_args a = {.x = xs, .out = os, .x_count = cu[B] * E, .out_count = cu[B] * out_width,
                                .cu_new = cu, .cu_new_count = B + 1, .rope_positions = ps,
                                .rope_positions_count = ps ? cu[B] : 0};
        if ((st = clattn_decode_execute(plan, cache, &a)) != CLATTN_STATUS_SUCCESS) goto done;
        if (clattn_decode_plan_last_splits(plan) > s->parts) s->parts = clattn_decode_plan_last_splits(plan);
        s->steps += !first;
        int rolled = 0;
        for (size_t b = 0; b < B; b++) {
            memcpy(out + (start[b] + at[b]) * out_width, os + cu[b] * out_width, cnt[b] * out_width * sizeof *out);
            /* a verify step that does not reach the end keeps cnt - reject of its tokens (cnt is the whole draft) */
            const size_t kept = !first && at[b] + cnt[b] < len[b] ? cnt[b] - s->reject : cnt[b];
            rolled |= kept < cnt[b];
            at[b] += kept, left -= kept, keep[b] = at[b];
        }
        if (rolled && (st = clattn_kv_cache_truncate(cache, keep)) != CLATTN_STATUS_SUCCESS) goto done;
    }
    s->ms = clattn_cli_now_ms() - t0;
    if (s->page) st = clattn_kv_cache_pages(cache, 0, NULL, NULL, &s->pages_used);
done:
    clattn_kv_cache_free(cache);
    clattn_decode_plan_free(plan);
    free(xs), free(os), free(len), free(cu), free(cnt), free(ps);
    return st;
}

/* ---------------------------------------------------------------- the command, step by step */

/* A gradient for every differentiable input given (--backward), the shape of its file. */
static const int grad_of[] = {F_X, F_KV, F_WQ, F_WK, F_WV, F_BQ, F_BK, F_BV, F_WO, F_BO};
static const char *const grad_names[] = {"grad_x.npy", "grad_kv.npy", "grad_w_query.npy", "grad_w_key.npy",
                                         "grad_w_value.npy", "grad_b_query.npy", "grad_b_key.npy",
                                         "grad_b_value.npy", "grad_w_out.npy", "grad_b_out.npy"};
enum { NGRADS = sizeof grad_of / sizeof grad_of[0] };

/* Everything one `clattn run` holds, freed together. */
typedef struct run_state {
    run_opts o;
    inputs in;
    dims d;
    clattn_attention_desc desc;
    clattn_attention_weights w;
    clattn_attention_args args;
    clattn_device *dev;
    clattn_plan *plan;
    float *out, *attn, *lse, *ctx, *grads[NGRADS];
    uint32_t *pos[2];  /* position_ids.npy and key_position_ids.npy as the library reads them (check_positions) */
    size_t n_pos[2];
    size_t out_width, n_out, n_attn, n_lse, n_ctx;
    double t_plan, t_exec, t_backward; /* ms */
    int code;                          /* the exit status when a step fails */
} run_state;

/* position_ids.npy and key_position_ids.npy: with --rope, the keys' with kv.npy only and then together with the
 * queries' (with --decode-from, each step gives its tokens theirs); their values (int32 or int64) in
 * 0 .. CLATTN_ROPE_MAX_POSITION, copied as the uint32 arrays the library reads (r->pos). */
static int check_positions(run_state *r)
{
    const run_opts *o = &r->o;
    const inputs *in = &r->in;
    if (!in->has[F_POS] && !in->has[F_POS_KV]) return 0;
    const char *given = in->has[F_POS] ? "position_ids.npy" : "key_position_ids.npy";
    if (!o->seen_rope) {
        say("%s is in --in, but --rope is not given: positions only place the rotary embeddings", given);
        return r->code = EXIT_USAGE, -1;
    }
    if (!in->has[F_POS]) {
        say("key_position_ids.npy without position_ids.npy: give the queries' positions too");
        return r->code = EXIT_USAGE, -1;
    }
    if (in->has[F_POS_KV] && !r->d.cross) {
        say("key_position_ids.npy without kv.npy: self-attention's keys are its queries, at position_ids.npy");
        return r->code = EXIT_USAGE, -1;
    }
    if (r->d.cross && !in->has[F_POS_KV]) {
        say("position_ids.npy with kv.npy needs key_position_ids.npy (the keys' positions)");
        return r->code = EXIT_USAGE, -1;
    }
    for (int k = 0; k < 2; k++) {
        const int f = k ? F_POS_KV : F_POS;
        if (!in->has[f]) continue;
        const clattn_npy *a = &in->a[f];
        if (!(r->pos[k] = malloc(a->count * sizeof *r->pos[k]))) {
            say("out of memory copying %s", file_names[f]);
            return -1;
        }
        for (size_t i = 0; i < a->count; i++) {
            const long long v = a->dtype == CLATTN_NPY_I32 ? (long long)((const int32_t *)a->data)[i]
                                                           : (long long)((const int64_t *)a->data)[i];
            if (v < 0 || v > CLATTN_ROPE_MAX_POSITION) {
                say("%s: position %lld at flat index %zu; clattn takes 0 .. %u", file_names[f], v, i,
                    (unsigned)CLATTN_ROPE_MAX_POSITION);
                return -1;
            }
            r->pos[k][i] = (uint32_t)v;
        }
        r->n_pos[k] = a->count;
    }
    return 0;
}

/* The flags that need self-attention, or a length, known only once the inputs are read. */
static int check_combination(run_state *r)
{
    const run_opts *o = &r->o;
    const inputs *in = &r->in;
    if ((o->seen_window || o->seen_decode) && r->d.cross) {
        say("%s needs self-attention: kv.npy is given (cross-attention)", o->seen_decode ? "--decode-from" : "--window");
        return r->code = EXIT_USAGE, -1;
    }
    size_t longest = r->d.Tq; /* (--seqlens: the longest sequence's tokens) */
    for (size_t b = 0; o->seen_seqlens && b < o->nseq; b++)
        longest = b == 0 || o->cu_q[b + 1] - o->cu_q[b] > longest ? o->cu_q[b + 1] - o->cu_q[b] : longest;
    if (o->seen_decode && o->decode_from > longest) {
        say("--decode-from %zu: must be from 1 to T = %zu (the tokens of %s)", o->decode_from, longest,
            o->seen_seqlens ? "the longest sequence" : "x.npy");
        return r->code = EXIT_USAGE, -1;
    }
    if (in->has[F_GOUT] && !o->backward) {
        say("grad_out.npy is in --in, but --backward is not given: it would be ignored");
        return r->code = EXIT_USAGE, -1;
    }
    if (o->backward && !in->has[F_GOUT]) {
        say("--backward needs grad_out.npy in --in (the gradient of the loss by out, the shape of out.npy)");
        return -1;
    }
    if (o->dtype != CLATTN_DTYPE_F32 && o->seen_decode) {
        say("--dtype %s with --decode-from: clattn run's decode steps are fp32 (--dtype f32)",
            o->dtype == CLATTN_DTYPE_F16 ? "f16" : "bf16");
        return r->code = EXIT_USAGE, -1;
    }
    if (o->seen_seqlens) {
        const dims *d = &r->d;
        if (in->has[F_KPM] || in->has[F_MASK]) {
            say("--seqlens with %s: a variable-length batch takes no masks (the lengths say which keys a sequence has)",
                in->has[F_KPM] ? "key_padding_mask.npy" : "attn_mask.npy");
            return r->code = EXIT_USAGE, -1;
        }
        if (!d->two_d) {
            say("--seqlens: x.npy is 3-D; a variable-length batch is packed: x.npy (total, E)");
            return -1;
        }
        if (o->cu_q[o->nseq] != d->Tq) {
            say("--seqlens: the lengths add up to %u rows but x.npy has %zu", (unsigned)o->cu_q[o->nseq], d->Tq);
            return -1;
        }
        if (d->cross != o->seen_kv_seqlens) {
            say(d->cross ? "kv.npy with --seqlens needs --kv-seqlens (its sequences' lengths)"
                         : "--kv-seqlens without kv.npy: self-attention's keys are the queries' rows");
            return r->code = EXIT_USAGE, -1;
        }
        if (d->cross && o->cu_k[o->nseq] != d->Tk) {
            say("--kv-seqlens: the lengths add up to %u rows but kv.npy has %zu", (unsigned)o->cu_k[o->nseq], d->Tk);
            return -1;
        }
    }
    if (o->seen_decode && (in->has[F_KPM] || in->has[F_MASK])) {
        say("--decode-from with %s: decode steps take no masks", in->has[F_KPM] ? "key_padding_mask.npy" : "attn_mask.npy");
        return r->code = EXIT_USAGE, -1;
    }
    return check_positions(r);
}

/* The description and the weights from the flags and the files (every array with its count, as read), and the
 * outputs' sizes, before any device work. */
static int describe(run_state *r)
{
    const run_opts *o = &r->o;
    const inputs *in = &r->in;
    const dims *d = &r->d;
    clattn_attention_desc *desc = &r->desc;
    memset(desc, 0, sizeof *desc);
    desc->batch = d->B, desc->seq_q = d->Tq, desc->embed = d->E, desc->cross = d->cross;
    desc->seq_kv = d->cross ? d->Tk : 0, desc->kv_embed = d->cross ? d->Ekv : 0, desc->heads = d->H;
    desc->head_dim_qk = d->weights ? d->dk : 0, desc->head_dim_v = d->weights ? d->dv : 0;
    desc->out_dim = d->out_proj ? d->Eo : 0, desc->causal = o->causal;
    desc->attn_mask = !in->has[F_MASK] ? CLATTN_MASK_NONE
                    : in->a[F_MASK].dtype == CLATTN_NPY_F32 ? CLATTN_MASK_FLOAT : CLATTN_MASK_BOOL;
    desc->key_padding_mask = in->has[F_KPM], desc->scale = o->scale, desc->dropout = o->dropout, desc->seed = o->seed;
    desc->layout = CLATTN_LAYOUT_LINEAR, desc->algorithm = o->algorithm, desc->precision = o->precision;
    desc->need_weights = o->need_weights, desc->kv_heads = o->kv_heads, desc->window = o->window;
    desc->rope = o->rope, desc->sinks = in->has[F_SINKS];
    desc->kv_half = o->kv_half, desc->training = o->backward || o->lse, desc->dtype = o->dtype;
    if (o->seen_seqlens) { /* the packed rows (d: one batch of them, as out.npy is written) in sequences */
        size_t mq = 1, mk = 1;
        for (size_t b = 0; b < o->nseq; b++) {
            if (o->cu_q[b + 1] - o->cu_q[b] > mq) mq = o->cu_q[b + 1] - o->cu_q[b];
            if (d->cross && o->cu_k[b + 1] - o->cu_k[b] > mk) mk = o->cu_k[b + 1] - o->cu_k[b];
        }
        desc->varlen = 1, desc->batch = o->nseq, desc->seq_q = mq, desc->seq_kv = d->cross ? mk : 0;
    }

    static const int files[] = {F_WQ, F_WK, F_WV, F_BQ, F_BK, F_BV, F_WO, F_BO};
    clattn_attention_weights *w = &r->w;
    memset(w, 0, sizeof *w);
    const void **data[] = {&w->w_query, &w->w_key, &w->w_value, &w->b_query, &w->b_key, &w->b_value, &w->w_out,
                            &w->b_out};
    size_t *counts[] = {&w->w_query_count, &w->w_key_count, &w->w_value_count, &w->b_query_count, &w->b_key_count,
                        &w->b_value_count, &w->w_out_count, &w->b_out_count};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (in->has[files[i]]) *data[i] = in->a[files[i]].data, *counts[i] = in->a[files[i]].count;
    if (in->has[F_SINKS]) w->sinks = in->a[F_SINKS].data, w->sinks_count = in->a[F_SINKS].count;

    r->out_width = d->out_proj ? d->Eo : d->H * d->dv;
    size_t t;
    if (!mul_ok(d->B, d->Tq, &t) || !mul_ok(t, r->out_width, &r->n_out) || !mul_ok(r->n_out, sizeof(float), &t) ||
        (o->need_weights && (!mul_ok(d->B, d->H, &t) || !mul_ok(t, d->Tq, &t) || !mul_ok(t, d->Tk, &r->n_attn) ||
                             !mul_ok(r->n_attn, sizeof(float), &t)))) {
        say("the outputs for B=%zu, H=%zu, Tq=%zu, Tk=%zu are too large for this machine", d->B, d->H, d->Tq, d->Tk);
        return -1;
    }
    r->n_lse = d->B * d->H * d->Tq, r->n_ctx = d->B * d->Tq * d->H * d->dv;
    return 0;
}

/* --decode-from: the same description through a decode plan and a KV cache (without Q/K/V weights the heads
 * split x, as the plan path does), out.npy written. */
static int run_decode_steps(run_state *r)
{
    const run_opts *o = &r->o;
    const dims *d = &r->d;
    if (!(r->out = malloc(r->n_out * sizeof *r->out))) {
        say("out of memory allocating the outputs (%zu floats)", r->n_out);
        return -1;
    }
    decode_session s = {.P = o->decode_from, .page = o->page_size, .draft = o->draft, .reject = o->reject, .parts = 1,
                        .cu = o->seen_seqlens ? o->cu_q : NULL, .nseq = o->nseq, .pos = r->pos[0]};
    char core[32] = "";
    clattn_status st = decode_run(r->dev, r->desc, &r->w, d, &s, r->in.a[F_X].data, r->out_width, r->out, core,
                                  sizeof core);
    if (st != CLATTN_STATUS_SUCCESS) {
        say("decoding on %s: %s: %s", clattn_device_name(r->dev), clattn_status_string(st), clattn_last_error());
        return -1;
    }
    if (o->verbose) {
        fprintf(stderr, "clattn run: device %s\n", clattn_device_name(r->dev));
        fprintf(stderr, "clattn run: B=%zu T=%zu E=%zu heads=%zu kv_heads=%zu dk=%zu dv=%zu out=%zu window=%zu "
                "kv=%s\n", d->B, d->Tq, d->E, d->H, o->kv_heads, d->dk, d->dv, r->out_width, o->window,
                kv_type_name(o->kv_half));
        if (o->draft > 1)
            fprintf(stderr, "clattn run: decode: prefill of %zu tokens, then %zu verify steps of up to %zu tokens (the "
                    "last %zu of each rolled back and run again; split-K up to %zu parts); %.1f ms\n", o->decode_from,
                    s.steps, o->draft, o->reject, s.parts, s.ms);
        else
            fprintf(stderr, "clattn run: decode: prefill of %zu tokens, then %zu decode steps (split-K up to %zu "
                    "parts); %.1f ms\n", o->decode_from, s.steps, s.parts, s.ms);
        fprintf(stderr, "clattn run: core %s\n", core);
        if (o->page_size)
            fprintf(stderr, "clattn run: paged KV cache: pages of %zu positions, %zu in use at the end\n", o->page_size,
                    s.pages_used);
        else
            fprintf(stderr, "clattn run: contiguous KV cache\n");
    }
    return write_outputs(o->out, d, r->out_width, r->out, NULL);
}

/* The plan and one execution: out, and attn, lse and the context (for the backward) as asked. */
static int run_forward(run_state *r)
{
    const dims *d = &r->d;
    const inputs *in = &r->in;
    const double t0 = clattn_cli_now_ms();
    clattn_status st = clattn_plan_create(r->dev, &r->desc, &r->w, &r->plan);
    r->t_plan = clattn_cli_now_ms() - t0;
    if (st != CLATTN_STATUS_SUCCESS) {
        say("creating the attention plan on %s: %s: %s", clattn_device_name(r->dev), clattn_status_string(st),
            clattn_last_error());
        return -1;
    }
    clattn_cli_notice("clattn run");
    if (clattn_plan_out_width(r->plan) != r->out_width) { /* cannot happen: the shapes were checked */
        say("internal error: the plan's output width %zu is not the expected %zu", clattn_plan_out_width(r->plan),
            r->out_width);
        return -1;
    }
    r->out = malloc(r->n_out * sizeof *r->out);
    r->attn = r->o.need_weights ? malloc(r->n_attn * sizeof *r->attn) : NULL;
    if (!r->out || (r->o.need_weights && !r->attn)) {
        say("out of memory allocating the outputs (%zu + %zu floats)", r->n_out, r->n_attn);
        return -1;
    }
    clattn_attention_args *args = &r->args;
    memset(args, 0, sizeof *args);
    args->x = in->a[F_X].data, args->x_count = in->a[F_X].count;
    if (d->cross) args->kv = in->a[F_KV].data, args->kv_count = in->a[F_KV].count;
    if (in->has[F_KPM]) args->key_padding_mask = in->a[F_KPM].data, args->key_padding_mask_count = in->a[F_KPM].count;
    if (in->has[F_MASK]) args->attn_mask = in->a[F_MASK].data, args->attn_mask_count = in->a[F_MASK].count;
    args->out = r->out, args->out_count = r->n_out;
    args->attn = r->attn, args->attn_count = r->attn ? r->n_attn : 0;
    if (r->o.seen_seqlens) args->cu_seqlens_q = r->o.cu_q, args->cu_seqlens_q_count = r->o.nseq + 1;
    if (r->o.seen_kv_seqlens) args->cu_seqlens_kv = r->o.cu_k, args->cu_seqlens_kv_count = r->o.nseq + 1;
    args->rope_positions = r->pos[0], args->rope_positions_count = r->n_pos[0];
    args->rope_positions_kv = r->pos[1], args->rope_positions_kv_count = r->n_pos[1];
    /* a training plan: the rows' log-sum-exp (and for the backward the context, so that it recomputes neither) */
    if (r->desc.training) {
        r->lse = malloc(r->n_lse * sizeof *r->lse);
        r->ctx = r->o.backward ? malloc(r->n_ctx * sizeof *r->ctx) : NULL;
        if (!r->lse || (r->o.backward && !r->ctx)) {
            say("out of memory allocating the training statistics");
            return -1;
        }
        args->lse = r->lse, args->lse_count = r->n_lse;
        args->context = r->ctx, args->context_count = r->ctx ? r->n_ctx : 0;
    }
    const double t2 = clattn_cli_now_ms();
    st = clattn_plan_execute(r->plan, args);
    r->t_exec = clattn_cli_now_ms() - t2;
    if (st != CLATTN_STATUS_SUCCESS) {
        say("running attention on %s: %s: %s", clattn_device_name(r->dev), clattn_status_string(st),
            clattn_last_error());
        return -1;
    }
    return 0;
}

/* --backward: grad_out.npy checked against out's shape, then a gradient for every differentiable input given. */
static int run_backward(run_state *r)
{
    const dims *d = &r->d;
    const inputs *in = &r->in;
    const clattn_npy *go = &in->a[F_GOUT];
    const size_t want_nd = d->two_d ? 2 : 3;
    /* grad_out in the plan's type (inputs_to_type rounded a float32 one), the gradients written in it */
    const clattn_npy_dtype nt = npy_type_of(r->o.dtype);
    const size_t es = r->o.dtype == CLATTN_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    if (go->dtype != nt || (size_t)go->ndim != want_nd || go->count != r->n_out ||
        go->shape[go->ndim - 1] != r->out_width || go->shape[go->ndim - 2] != d->Tq) {
        char have[96];
        say("grad_out.npy: %s %s, expected %s with out.npy's shape (%s%zu, %zu)", clattn_npy_dtype_name(go->dtype),
            shape_str(go, have, sizeof have), clattn_npy_dtype_name(nt), d->two_d ? "" : "B, ", d->Tq, r->out_width);
        return -1;
    }
    clattn_attention_grads g = {.grad_out = go->data, .grad_out_count = go->count, .lse = r->lse,
                                .lse_count = r->n_lse, .context = r->ctx, .context_count = r->n_ctx};
    void **slots[NGRADS] = {&g.grad_x, &g.grad_kv, &g.grad_w_query, &g.grad_w_key, &g.grad_w_value,
                             &g.grad_b_query, &g.grad_b_key, &g.grad_b_value, &g.grad_w_out, &g.grad_b_out};
    size_t *counts[NGRADS] = {&g.grad_x_count, &g.grad_kv_count, &g.grad_w_query_count, &g.grad_w_key_count,
                              &g.grad_w_value_count, &g.grad_b_query_count, &g.grad_b_key_count,
                              &g.grad_b_value_count, &g.grad_w_out_count, &g.grad_b_out_count};
    for (int i = 0; i < NGRADS; i++) {
        if (!in->has[grad_of[i]]) continue;
        if (!(r->grads[i] = malloc((in->a[grad_of[i]].count ? in->a[grad_of[i]].count : 1) * es))) {
            say("out of memory allocating the gradients");
            return -1;
        }
        *slots[i] = r->grads[i], *counts[i] = in->a[grad_of[i]].count;
    }
    clattn_attention_args ba = r->args;
    ba.out = NULL, ba.attn = NULL, ba.lse = NULL, ba.context = NULL;
    ba.out_count = ba.attn_count = ba.lse_count = ba.context_count = 0;
    const double t4 = clattn_cli_now_ms();
    clattn_status st = clattn_plan_backward(r->plan, &ba, &g);
    r->t_backward = clattn_cli_now_ms() - t4;
    if (st != CLATTN_STATUS_SUCCESS) {
        say("the backward pass on %s: %s: %s", clattn_device_name(r->dev), clattn_status_string(st),
            clattn_last_error());
        return -1;
    }
    return 0;
}

/* -v: what ran (device, shapes, algorithm, cores, times, tuning). */
static void report(const run_state *r)
{
    clattn_attention_desc d;
    if (clattn_plan_desc(r->plan, &d) != CLATTN_STATUS_SUCCESS) return;
    const clattn_algorithm alg = clattn_plan_algorithm(r->plan);
    fprintf(stderr, "clattn run: device %s\n", clattn_device_name(r->dev));
    fprintf(stderr, "clattn run: B=%zu Tq=%zu Tk=%zu E=%zu%s heads=%zu kv_heads=%zu dk=%zu dv=%zu out=%zu "
            "causal=%s window=%zu kv=%s scale=%g precision=%s dtype=%s\n",
            d.batch, d.seq_q, d.cross ? d.seq_kv : d.seq_q, d.embed, d.cross ? " (cross)" : "", d.heads,
            d.kv_heads, d.head_dim_qk, d.head_dim_v, r->out_width, d.causal ? "yes" : "no", d.window,
            kv_type_name(d.kv_half), (double)d.scale, d.precision == CLATTN_PRECISION_TF32 ? "tf32" : "fp32",
            d.dtype == CLATTN_DTYPE_F16 ? "f16" : d.dtype == CLATTN_DTYPE_BF16 ? "bf16" : "f32");
    const char *cp = clattn_plan_core_params(r->plan);
    fprintf(stderr, "clattn run: algorithm %s, core %s%s%s%s; plan %.1f ms, execute %.1f ms\n",
            alg == CLATTN_ALGORITHM_AUTO ? "reference" : clattn_algorithm_name(alg), clattn_plan_core(r->plan),
            cp[0] ? " (" : "", cp, cp[0] ? ")" : "", r->t_plan, r->t_exec);
    const char *gp = clattn_plan_gemm_params(r->plan);
    fprintf(stderr, "clattn run: gemm %s%s%s%s\n", clattn_plan_gemm(r->plan), gp[0] ? " (" : "", gp, gp[0] ? ")" : "");
    const char *tf = clattn_device_tune_file(r->dev), *tn = clattn_device_tune_notice(r->dev);
    fprintf(stderr, "clattn run: tuned: %s%s\n", clattn_plan_tuned(r->plan) ? "yes, from " : "no",
            clattn_plan_tuned(r->plan) ? tf : "");
    if (tn) fprintf(stderr, "clattn run: tuning file notice: %s\n", tn);
    if (d.varlen)
        fprintf(stderr, "clattn run: variable-length batch: %zu sequences of up to %zu rows (%zu in all)\n", d.batch,
                d.seq_q, r->d.Tq);
    if (r->o.backward) {
        const char *bp = clattn_plan_backward_core_params(r->plan);
        fprintf(stderr, "clattn run: backward core %s%s%s%s, %.1f ms\n", clattn_plan_backward_core(r->plan),
                bp[0] ? " (" : "", bp, bp[0] ? ")" : "", r->t_backward);
    }
}

/* out.npy, and attn.npy, lse.npy and the gradients as asked: all of them or none. */
static int write_results(const run_state *r)
{
    const dims *d = &r->d;
    out_file files[MAX_OUT_FILES];
    int nf = 0;
    files[nf++] = shaped("out.npy", r->out, d, d->Tq, r->out_width, 0);
    if (r->attn) files[nf++] = shaped("attn.npy", r->attn, d, d->H, d->Tq, d->Tk);
    for (int i = 0; i < nf; i++) files[i].type = npy_type_of(r->o.dtype); /* out and attn: in the plan's type */
    if (r->o.lse) files[nf++] = shaped("lse.npy", r->lse, d, d->H, d->Tq, 0);
    for (int i = 0; i < NGRADS && r->o.backward; i++) {
        if (!r->grads[i]) continue;
        const clattn_npy *src = &r->in.a[grad_of[i]];
        out_file f = {grad_names[i], r->grads[i], src->ndim, {0}, npy_type_of(r->o.dtype)}; /* the plan's type */
        for (int k = 0; k < src->ndim && k < 4; k++) f.shape[k] = src->shape[k];
        files[nf++] = f;
    }
    return write_files(r->o.out, files, nf);
}

static void run_state_free(run_state *r)
{
    free(r->out);
    free(r->attn);
    free(r->lse);
    free(r->ctx);
    for (int i = 0; i < NGRADS; i++) free(r->grads[i]);
    free(r->pos[0]);
    free(r->pos[1]);
    clattn_plan_free(r->plan);
    clattn_device_free(r->dev);
    inputs_free(&r->in);
    free(r->o.cu_q);
    free(r->o.cu_k);
}

/* clattn run: the inputs read and checked, the plan (or the decode steps) run, the outputs written whole. */
static int run_steps(run_state *r)
{
    if (load_inputs(r->o.in, r->o.dtype, &r->in) || check_shapes(&r->in, r->o.heads, r->o.kv_heads, &r->d) ||
        check_combination(r) || inputs_to_type(&r->in, r->o.dtype) || describe(r))
        return -1;
    if (!(r->dev = clattn_cli_open_device("clattn run", r->o.device, &r->code))) return -1;
    r->code = EXIT_INPUT;
    if (r->o.seen_decode) return run_decode_steps(r);
    if (run_forward(r) || (r->o.backward && run_backward(r))) return -1;
    if (r->o.verbose) report(r);
    return write_results(r);
}

int clattn_cli_run(int argc, char **argv)
{
    run_state *r = calloc(1, sizeof *r);
    if (!r) {
        say("out of memory");
        return EXIT_INPUT;
    }
    int code = parse_flags(argc, argv, &r->o);
    if (code < 0) {
        code = EXIT_INPUT;
        if (!clattn_cli_check_dir("clattn run", "--in", r->o.in, 0) &&
            !clattn_cli_check_dir("clattn run", "--out", r->o.out, 1)) {
            r->code = EXIT_INPUT;
            code = run_steps(r) == 0 ? EXIT_OK : r->code;
        }
    }
    run_state_free(r);
    free(r);
    return code;
}
