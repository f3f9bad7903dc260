/* demo.c: `clattn demo` runs the tutorials' own examples on the chosen device
 * and prints their tables the way the tutorials (PyTorch) print them, next to
 * a check against the numbers the tutorials printed (to 4 decimals). */
#include "cli.h"
#include "encoder/encoder.h"
#include "npy.h"
#include "tutorial_data.h"
#include "tutorial_encoder_data.h"

#define CNT(a) (sizeof(a) / sizeof(float)) /* the element count of a tutorial array */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int mismatches;

/* Print like torch: tensor([[a, b], [c, d]]) with 4 decimals. */
static void print_tensor(const char *title, const float *a, size_t rows, size_t cols)
{
    printf("%s\n", title);
    for (size_t r = 0; r < rows; r++) {
        printf(r == 0 ? "tensor([[" : "        [");
        for (size_t c = 0; c < cols; c++) printf("%s%7.4f", c ? ", " : "", (double)a[r * cols + c]);
        printf(r + 1 < rows ? "],\n" : "]])\n");
    }
}

/* Compare to a table printed with 4 decimals (or to full precision when `tol` is small). */
static void check(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= worst)) worst = d;
    }
    int ok = worst <= tol;
    printf("  %s %s (max |diff| %.1e)\n\n", ok ? "[ok]" : "[MISMATCH]", what, worst);
    mismatches += !ok;
}

static int fail_st(clattn_status st)
{
    fprintf(stderr, "clattn demo: %s: %s\n", clattn_status_string(st), clattn_last_error());
    const char *log = clattn_last_build_log();
    if (log[0]) fprintf(stderr, "%s\n", log);
    return -1;
}

/* One plan, one execution: out (Tq, out_width) and attn (H, Tq, Tk) for a single sequence. The
 * weights need the unfused algorithm on OpenCL; the output is then computed again by the plan's
 * default (the fused kernel there) and must agree. */
static int run_once(clattn_device *dev, const clattn_attention_desc *d, const clattn_attention_weights *w,
                    const float *x, float *out, float *attn)
{
    clattn_attention_desc dw = *d;
    dw.need_weights = attn != NULL;
    clattn_plan *plan = NULL;
    clattn_status st = clattn_plan_create(dev, &dw, w, &plan);
    /* the demo's arrays hold exactly one sequence of the description's shape */
    const size_t n_x = d->batch * d->seq_q * d->embed, n_attn = d->batch * d->heads * d->seq_q * d->seq_q;
    if (st == CLATTN_STATUS_SUCCESS) {
        clattn_attention_args a = {.x = x, .out = out, .attn = attn, .x_count = n_x,
                                   .out_count = d->batch * d->seq_q * clattn_plan_out_width(plan),
                                   .attn_count = attn ? n_attn : 0};
        st = clattn_plan_execute(plan, &a);
    }
    const size_t n = plan ? d->batch * d->seq_q * clattn_plan_out_width(plan) : 0;
    clattn_plan_free(plan);
    if (st != CLATTN_STATUS_SUCCESS) return fail_st(st);
    if (!attn) return 0;
    float *again = malloc(n * sizeof *again);
    if (!again) {
        fprintf(stderr, "clattn demo: out of memory\n");
        return -1;
    }
    plan = NULL;
    st = clattn_plan_create(dev, d, w, &plan);
    if (st == CLATTN_STATUS_SUCCESS) {
        clattn_attention_args a = {.x = x, .out = again, .x_count = n_x, .out_count = n};
        st = clattn_plan_execute(plan, &a);
    }
    const clattn_algorithm alg = clattn_plan_algorithm(plan);
    clattn_plan_free(plan);
    if (st != CLATTN_STATUS_SUCCESS) {
        free(again);
        return fail_st(st);
    }
    if (alg == CLATTN_ALGORITHM_FUSED) {
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= fabsf(again[i] - out[i]) <= 1e-5f + 1e-4f * fabsf(out[i]);
        printf("  %s the fused kernel's output equals the unfused one's\n", same ? "[ok]" : "[MISMATCH]");
        mismatches += !same;
    }
    free(again);
    return 0;
}

/* --plot DIR: the SelfAttention_v1 weights (plain and causal) as .npy files, then PNG heat maps of
 * them drawn by the Python package (python -m clattn.plot DIR). */
static int plot(const char *dir, const float *full, const float *causal)
{
    static const char *const tokens = "Your\njourney\nstarts\nwith\none\nstep\n";
    char path[4096], err[256];
    const size_t shape[3] = {1, 6, 6};
    snprintf(path, sizeof path, "%s/sa_v1.npy", dir);
    int bad = clattn_npy_save_f32(path, full, 3, shape, err, sizeof err);
    snprintf(path, sizeof path, "%s/sa_v1_causal.npy", dir);
    bad = bad || clattn_npy_save_f32(path, causal, 3, shape, err, sizeof err);
    snprintf(path, sizeof path, "%s/tokens.txt", dir);
    FILE *f = bad ? NULL : fopen(path, "w");
    if (!f || fputs(tokens, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "clattn demo: --plot %s: cannot write the weights (%s)\n", dir, bad ? err : path);
        return 1;
    }
    const char *py = getenv("CLATTN_PYTHON");
    if (!py || !*py) py = "python3";
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execlp(py, py, "-m", "clattn.plot", dir, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "clattn demo: --plot: '%s -m clattn.plot %s' failed (exit %d): the pictures need the Python "
                        "package with matplotlib (pip install './python[plot]'; CLATTN_PYTHON picks the "
                        "interpreter); the weights are in %s/*.npy\n", py, dir,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1, dir);
        return 1;
    }
    printf("heat maps of the attention weights in %s (sa_v1.png, sa_v1_causal.png)\n", dir);
    return 0;
}

/* The flags: --device SPEC and --plot DIR, each at most once; 0 to go on, else the exit status (-1: --help, 0). */
static int demo_flags(int argc, char **argv, const char **spec_out, const char **plot_out)
{
    const char *spec = NULL, *plot_dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            printf("usage: clattn demo [--device SPEC] [--plot DIR]\n"
                   "  runs the tutorials' examples (attention without weights, SelfAttention_v1/v2, causal,\n"
                   "  dropout, multi-head, the encoder layer) and checks each table against the tutorials' numbers\n"
                   "  --device SPEC: the device (default: $CLATTN_DEVICE, else opencl, else ref)\n"
                   "  --plot DIR: also write the attention weights to DIR (created when missing) and draw them as\n"
                   "              PNG heat maps through the Python package (CLATTN_PYTHON picks the interpreter)\n");
            return -1;
        }
        if (strcmp(a, "--device") != 0 && strcmp(a, "--plot") != 0) {
            fprintf(stderr, "clattn demo: unknown %s '%s' (usage: clattn demo [--device SPEC] [--plot DIR])\n",
                    a[0] == '-' ? "option" : "argument", a);
            return 2;
        }
        if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0 || !*argv[i + 1]) {
            fprintf(stderr, "clattn demo: %s needs a value\n", a);
            return 2;
        }
        if ((strcmp(a, "--device") == 0 ? spec : plot_dir) != NULL) {
            fprintf(stderr, "clattn demo: %s given more than once\n", a);
            return 2;
        }
        if (strcmp(a, "--device") == 0) spec = argv[++i];
        else plot_dir = argv[++i];
    }
    *spec_out = spec, *plot_out = plot_dir;
    return 0;
}

/* Tutorials 001 to 003 on their six tokens: attention without weights, SelfAttention_v1 (plain and causal: the
 * weights the plot draws), SelfAttention_v2, the multi-head class. 0, or 1 when a plan fails. */
static int demo_tutorial001(clattn_device *dev, const float *x, float *out, float *attn, float *plot_full,
                            float *plot_causal, const char *plot_dir)
{
    /* 1. attention without trainable weights: Q = K = V = x, no scaling */
    printf("== 1. Simple attention without trainable weights (tutorial 001) ==\n");
    float scores[36];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) {
            double s = 0;
            for (int c = 0; c < 3; c++) s += (double)x[i * 3 + c] * x[j * 3 + c];
            scores[i * 6 + j] = (float)s;
        }
    print_tensor("attn_scores = inputs @ inputs.T   (printed for reference, computed on the host)", scores, 6, 6);
    clattn_attention_desc d = {.batch = 1, .seq_q = 6, .embed = 3, .heads = 1, .scale = 1.0f};
    if (run_once(dev, &d, NULL, x, out, attn)) return 1;
    print_tensor("attn_weights = softmax(attn_scores, dim=-1)", attn, 6, 6);
    check("attention weights match tutorial 001", attn, &clattn_tut001_simple_attn_printed[0][0], 36, 5.001e-5);
    print_tensor("all_context_vecs = attn_weights @ inputs", out, 6, 3);
    check("context vectors match tutorial 001", out, &clattn_tut001_simple_context_printed[0][0], 18, 5.001e-5);

    /* 2. SelfAttention_v1: raw [in, out] matrices from torch.manual_seed(123) */
    printf("== 2. SelfAttention_v1, torch.manual_seed(123), raw W (x @ W), d_out = 2 ==\n");
    print_tensor("W_query", &clattn_tut001_sa_v1_w_query[0][0], 3, 2);
    clattn_attention_weights w1 = {.w_query = &clattn_tut001_sa_v1_w_query[0][0],
                                   .w_key = &clattn_tut001_sa_v1_w_key[0][0],
                                   .w_value = &clattn_tut001_sa_v1_w_value[0][0],
                                   .w_query_count = CNT(clattn_tut001_sa_v1_w_query),
                                   .w_key_count = CNT(clattn_tut001_sa_v1_w_key),
                                   .w_value_count = CNT(clattn_tut001_sa_v1_w_value)};
    d = (clattn_attention_desc){.batch = 1, .seq_q = 6, .embed = 3, .heads = 1, .head_dim_qk = 2,
                                .layout = CLATTN_LAYOUT_RAW};
    if (run_once(dev, &d, &w1, x, out, attn)) return 1;
    print_tensor("attn_weights = softmax(queries @ keys.T / sqrt(2))", attn, 6, 6);
    if (plot_dir) memcpy(plot_full, attn, 36 * sizeof *plot_full);
    check("attention weights match tutorial 002", attn, &clattn_tut001_sa_v1_attn_printed[0][0], 36, 5.001e-5);
    print_tensor("context_vec = sa_v1(inputs)", out, 6, 2);
    check("context vectors match tutorials 001/002", out, &clattn_tut001_sa_v1_context_printed[0][0], 12, 5.001e-5);

    /* 3. the same weights with a causal mask */
    printf("== 3. SelfAttention_v1 with a causal mask (query i sees keys j <= i) ==\n");
    d.causal = 1;
    if (run_once(dev, &d, &w1, x, out, attn)) return 1;
    print_tensor("masked attn_weights", attn, 6, 6);
    if (plot_dir) memcpy(plot_causal, attn, 36 * sizeof *plot_causal);
    print_tensor("context_vec (causal)", out, 6, 2);
    printf("  (no tutorial prints this table; tests/golden/cases/tut001_sa_v1_causal checks it against PyTorch)\n\n");

    /* 4. SelfAttention_v2: nn.Linear weights from torch.manual_seed(789) */
    printf("== 4. SelfAttention_v2, torch.manual_seed(789), nn.Linear(3, 2, bias=False) ==\n");
    clattn_attention_weights w2 = {.w_query = &clattn_tut001_sa_v2_w_query[0][0],
                                   .w_key = &clattn_tut001_sa_v2_w_key[0][0],
                                   .w_value = &clattn_tut001_sa_v2_w_value[0][0],
                                   .w_query_count = CNT(clattn_tut001_sa_v2_w_query),
                                   .w_key_count = CNT(clattn_tut001_sa_v2_w_key),
                                   .w_value_count = CNT(clattn_tut001_sa_v2_w_value)};
    d = (clattn_attention_desc){.batch = 1, .seq_q = 6, .embed = 3, .heads = 1, .head_dim_qk = 2};
    if (run_once(dev, &d, &w2, x, out, attn)) return 1;
    print_tensor("context_vec = sa_v2(inputs)", out, 6, 2);
    check("context vectors match tutorial 001", out, &clattn_tut001_sa_v2_context_printed[0][0], 12, 5.001e-5);

    /* 5. multi-head: tutorial 003's MultiHeadAttention (3 heads, causal, output projection) */
    printf("== 5. MultiHeadAttention (tutorial 003's class), torch.manual_seed(123), 3 heads, causal ==\n");
    printf("  d_in 3, d_out 6 (head size 2), output projection with bias; dropout 0.2 in the tutorial is a\n"
           "  training-mode setting: shown here in eval mode (no dropout), as PyTorch computes at inference.\n");
    clattn_attention_weights w3 = {.w_query = &clattn_tut001_mha3_w_query[0][0],
                                   .w_key = &clattn_tut001_mha3_w_key[0][0],
                                   .w_value = &clattn_tut001_mha3_w_value[0][0],
                                   .w_out = &clattn_tut001_mha3_w_out[0][0],
                                   .b_out = clattn_tut001_mha3_b_out, .w_query_count = CNT(clattn_tut001_mha3_w_query),
                                   .w_key_count = CNT(clattn_tut001_mha3_w_key),
                                   .w_value_count = CNT(clattn_tut001_mha3_w_value),
                                   .w_out_count = CNT(clattn_tut001_mha3_w_out),
                                   .b_out_count = CNT(clattn_tut001_mha3_b_out)};
    d = (clattn_attention_desc){.batch = 1, .seq_q = 6, .embed = 3, .heads = 3, .head_dim_qk = 2, .out_dim = 6,
                                .causal = 1};
    if (run_once(dev, &d, &w3, x, out, attn)) return 1;
    print_tensor("context_vecs = mha(inputs)", out, 6, 6);
    check("context vectors match PyTorch (eval mode, 1e-5)", out, &clattn_tut001_mha3_context_torch[0][0], 36,
          1e-5 + 1e-4);

    return 0;
}

/* Tutorial 004: d_k != d_v on its eight tokens. */
static int demo_tutorial004(clattn_device *dev, float *out, float *attn)
{
    clattn_attention_desc d;
    /* 6. d_q = d_k = 3, d_v = 4 (tutorial 004) */
    printf("== 6. d_k != d_v (tutorial 004): \"My shoes are small, my feet are big.\" (8 tokens x 2) ==\n");
    printf("  W_query, W_key (3 x 2) and W_value (4 x 2) from torch.manual_seed(123), used as W.matmul(x)\n");
    clattn_attention_weights w4 = {.w_query = &clattn_tut004_w_query[0][0], .w_key = &clattn_tut004_w_key[0][0],
                                   .w_value = &clattn_tut004_w_value[0][0],
                                   .w_query_count = CNT(clattn_tut004_w_query),
                                   .w_key_count = CNT(clattn_tut004_w_key),
                                   .w_value_count = CNT(clattn_tut004_w_value)};
    d = (clattn_attention_desc){.batch = 1, .seq_q = 8, .embed = 2, .heads = 1, .head_dim_qk = 3, .head_dim_v = 4};
    if (run_once(dev, &d, &w4, &clattn_tut004_embedded[0][0], out, attn)) return 1;
    print_tensor("attention_weights_2 (query 2, \"shoes\")", attn + 8, 1, 8);
    check("weights of query 2 match tutorial 004", attn + 8, clattn_tut004_attn_token2_printed, 8, 5.001e-5);
    print_tensor("context_vector_2", out + 4, 1, 4);
    check("context vector 2 matches tutorial 004", out + 4, clattn_tut004_context_token2_printed, 4, 5.001e-5);
    print_tensor("all context vectors", out, 8, 4);

    return 0;
}

/* Tutorial 004's encoder block: the attention, the Add & Norm kernel alone, then the whole layer in one plan. */
static int demo_encoder(clattn_device *dev)
{
    clattn_attention_desc d;
    /* 7. the encoder block of tutorial 004: MHA + residual + LayerNorm, FeedForward + residual + LayerNorm */
    printf("\n== 7. Encoder block (tutorial 004): MultiHeadSelfAttention(d_model=2, num_heads=2) + Add & Norm,\n"
           "      FeedForward(2, 4) (Linear, ReLU, Linear) + Add & Norm, on the same 8 tokens ==\n");
    printf("  weights: the notebook's RNG stream after torch.manual_seed(123) (MHA, then FeedForward);\n"
           "  LayerNorms gamma 1, beta 0, eps 1e-5\n");
    const float *xe = &clattn_tut004_enc_x[0][0];
    clattn_attention_weights we = {.w_query = &clattn_tut004_enc_w_query[0][0], .b_query = clattn_tut004_enc_b_query,
                                   .w_key = &clattn_tut004_enc_w_key[0][0], .b_key = clattn_tut004_enc_b_key,
                                   .w_value = &clattn_tut004_enc_w_value[0][0], .b_value = clattn_tut004_enc_b_value,
                                   .w_out = &clattn_tut004_enc_w_out[0][0], .b_out = clattn_tut004_enc_b_out,
                                   .w_query_count = CNT(clattn_tut004_enc_w_query),
                                   .b_query_count = CNT(clattn_tut004_enc_b_query),
                                   .w_key_count = CNT(clattn_tut004_enc_w_key),
                                   .b_key_count = CNT(clattn_tut004_enc_b_key),
                                   .w_value_count = CNT(clattn_tut004_enc_w_value),
                                   .b_value_count = CNT(clattn_tut004_enc_b_value),
                                   .w_out_count = CNT(clattn_tut004_enc_w_out),
                                   .b_out_count = CNT(clattn_tut004_enc_b_out)};
    d = (clattn_attention_desc){.batch = 1, .seq_q = 8, .embed = 2, .heads = 2, .head_dim_qk = 1, .out_dim = 2};
    float mha_out[16], normed[16], enc_out[16];
    if (run_once(dev, &d, &we, xe, mha_out, NULL)) return 1;
    print_tensor("MHA output", mha_out, 8, 2);
    check("MHA output matches tutorial 004", mha_out, &clattn_tut004_enc_mha_out_printed[0][0], 16, 5.001e-5);
    /* Add & Norm: the encoder's residual + LayerNorm kernel alone on this device (ref: the reference) */
    clattn_status st = clattn_residual_layernorm_rows(dev, 8, 2, xe, mha_out, NULL, clattn_tut004_enc_ln1_weight,
                                                      clattn_tut004_enc_ln1_bias, 1e-5f, -1, NULL, normed);
    if (st != CLATTN_STATUS_SUCCESS) {
        fprintf(stderr, "clattn demo: %s: %s\n", clattn_status_string(st), clattn_last_error());
        return 1;
    }
    print_tensor("Add & Norm = layer_norm_1(x + mha_out)", normed, 8, 2);
    check("Add & Norm matches tutorial 004", normed, &clattn_tut004_enc_add_norm_printed[0][0], 16, 5.001e-5);
    /* the whole layer in one encoder plan */
    clattn_encoder_desc ed = {.attn = d, .ff_dim = 4, .activation = CLATTN_ACTIVATION_RELU};
    clattn_encoder_weights ew = {.attn = we,
                                 .ln1_weight = clattn_tut004_enc_ln1_weight, .ln1_bias = clattn_tut004_enc_ln1_bias,
                                 .w_ff1 = &clattn_tut004_enc_w_ff1[0][0], .b_ff1 = clattn_tut004_enc_b_ff1,
                                 .w_ff2 = &clattn_tut004_enc_w_ff2[0][0], .b_ff2 = clattn_tut004_enc_b_ff2,
                                 .ln2_weight = clattn_tut004_enc_ln2_weight, .ln2_bias = clattn_tut004_enc_ln2_bias,
                                 .ln1_weight_count = CNT(clattn_tut004_enc_ln1_weight),
                                 .ln1_bias_count = CNT(clattn_tut004_enc_ln1_bias),
                                 .w_ff1_count = CNT(clattn_tut004_enc_w_ff1),
                                 .b_ff1_count = CNT(clattn_tut004_enc_b_ff1),
                                 .w_ff2_count = CNT(clattn_tut004_enc_w_ff2),
                                 .b_ff2_count = CNT(clattn_tut004_enc_b_ff2),
                                 .ln2_weight_count = CNT(clattn_tut004_enc_ln2_weight),
                                 .ln2_bias_count = CNT(clattn_tut004_enc_ln2_bias)};
    clattn_encoder_plan *ep = NULL;
    st = clattn_encoder_plan_create(dev, &ed, &ew, &ep);
    if (st == CLATTN_STATUS_SUCCESS) {
        clattn_encoder_args ea = {.x = xe, .out = enc_out, .x_count = CNT(clattn_tut004_enc_x),
                                  .out_count = sizeof enc_out / sizeof enc_out[0]};
        st = clattn_encoder_plan_execute(ep, &ea);
    }
    clattn_encoder_plan_free(ep);
    if (st != CLATTN_STATUS_SUCCESS) {
        fprintf(stderr, "clattn demo: %s: %s\n", clattn_status_string(st), clattn_last_error());
        const char *log = clattn_last_build_log();
        if (log[0]) fprintf(stderr, "%s\n", log);
        return 1;
    }
    print_tensor("Final encoder output = layer_norm_2(normed + ffn(normed))   (one clattn encoder plan)", enc_out, 8, 2);
    check("final encoder output matches tutorial 004", enc_out, &clattn_tut004_enc_out_printed[0][0], 16, 5.001e-5);

    return 0;
}

int clattn_cli_demo(int argc, char **argv)
{
    const char *spec = NULL, *plot_dir = NULL;
    const int flagged = demo_flags(argc, argv, &spec, &plot_dir);
    if (flagged) return flagged < 0 ? 0 : flagged;
    int made = 0;
    if (plot_dir && (clattn_cli_check_dir("clattn demo", "--plot", plot_dir, 1) ||
                     clattn_cli_make_dir("clattn demo", "--plot", plot_dir, &made)))
        return 1;
    int code = 1;
    clattn_device *dev = clattn_cli_open_device("clattn demo", spec, &code);
    if (!dev) return code;
    printf("clattn demo on: %s\n", clattn_device_name(dev));
    printf("Inputs: \"Your journey starts with one step\" (6 tokens x 3), from tutorials 001/002.\n\n");
    float out[64], attn[3 * 36], plot_full[36], plot_causal[36];
    int rc = 1;
    if (demo_tutorial001(dev, &clattn_tut_inputs[0][0], out, attn, plot_full, plot_causal, plot_dir) ||
        demo_tutorial004(dev, out, attn) || demo_encoder(dev))
        goto done;
    printf("%s on %s\n", mismatches ? "SOME TABLES DIFFER from the tutorials" : "All tables match the tutorials",
           clattn_device_name(dev));
    rc = mismatches ? 1 : 0;
    if (plot_dir && rc == 0) rc = plot(plot_dir, plot_full, plot_causal);
done:
    clattn_device_free(dev);
    return rc;
}
