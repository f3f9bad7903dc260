/* test_cli.c: `clattn run` end to end. The built binary (CLATTN_CLI_PATH) is
 * started with fork/exec on fresh temporary directories; its exit status and
 * stderr are checked, and its .npy outputs are compared element by element
 * with the golden expectations, on ref and on the OpenCL device.
 * Every malformed input is written here, byte by byte. */
#include "oracle.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- temp dirs and files */

static char root[64];        /* this test's temporary directory, removed by fini */
static char in_dir[128], out_dir[128], err_path[128], stdout_path[128];

static void rm_rf(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d))) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
                char sub[1024];
                snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
                rm_rf(sub);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/clattn_test_cli_XXXXXX");
    cr_assert(mkdtemp(root), "mkdtemp failed");
    snprintf(in_dir, sizeof in_dir, "%s/in", root);
    snprintf(out_dir, sizeof out_dir, "%s/out", root);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", root);
    snprintf(stdout_path, sizeof stdout_path, "%s/stdout.txt", root);
    cr_assert(mkdir(in_dir, 0700) == 0 && mkdir(out_dir, 0700) == 0);
}

static void teardown(void)
{
    if (root[0] && strncmp(root, "/tmp/clattn_test_cli_", 21) == 0) rm_rf(root);
    root[0] = '\0';
}

TestSuite(cli, .init = setup, .fini = teardown, .timeout = 120);

static char *path_in(const char *dir, const char *name)
{
    static char buf[16][1024]; /* a ring: each result lives for the next 15 calls */
    static int k;
    char *p = buf[k++ & 15];
    size_t a = strlen(dir), b = strlen(name);
    cr_assert(a + 1 + b < sizeof buf[0], "path too long: %s/%s", dir, name);
    memmove(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static char *case_dir(const char *name) { return path_in(CLATTN_GOLDEN_DIR, name); }

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    cr_assert(b);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static void copy_file(const char *src, const char *dst)
{
    size_t n;
    unsigned char *b = read_all(src, &n);
    write_bytes(dst, b, n);
    free(b);
}

/* Copy a golden case's inputs (every .npy but expect_*) into in_dir. */
static void copy_case(const char *name)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", case_dir(name));
    DIR *d = opendir(dir);
    cr_assert(d, "cannot open %s", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 4, ".npy") != 0 || strncmp(e->d_name, "expect_", 7) == 0) continue;
        copy_file(path_in(dir, e->d_name), path_in(in_dir, e->d_name));
    }
    closedir(d);
}

static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* A raw .npy file: version 1.0, header padded to 64 bytes (like numpy). */
static void write_npy_raw(const char *path, const char *descr, const char *fortran, const char *shape,
                          const void *data, size_t nbytes)
{
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr, fortran, shape);
    size_t hl = (size_t)n + 1;
    while ((10 + hl) % 64) hl++;
    unsigned char *b = malloc(10 + hl + nbytes);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(hl & 0xff), b[9] = (unsigned char)(hl >> 8);
    memset(b + 10, ' ', hl);
    memcpy(b + 10, dict, (size_t)n);
    b[10 + hl - 1] = '\n';
    if (nbytes) memcpy(b + 10 + hl, data, nbytes);
    write_bytes(path, b, 10 + hl + nbytes);
    free(b);
}

static void save_f32(const char *path, const float *data, int ndim, const size_t *shape)
{
    char err[256];
    cr_assert_eq(clattn_npy_save_f32(path, data, ndim, shape, err, sizeof err), 0, "%s", err);
}

static void load(const char *path, clattn_npy *a)
{
    char err[512];
    cr_assert_eq(clattn_npy_load(path, a, err, sizeof err), 0, "%s: %s", path, err);
}

/* ---------------------------------------------------------------- running the binary */

static const char *cl_spec(void) { return tu_opencl_spec(); }

#define ENV_UNSET ((const char *)0)

static rlim_t fsize_limit; /* run_cli's child may write files of at most this many bytes (0: no limit) */
static unsigned cli_deadline; /* run_cli's child is killed (SIGALRM) after this many seconds (0: never): a run that
                                 must not hang fails at once when it does, not at the test's timeout */

/* The ctest entries of each core run this suite with CLATTN_CORE set, which the CLI notes on plans it does nothing
 * for ("clattn run: note: CLATTN_CORE=..."): those lines are dropped from stderr, the rest checked as it is
 * (cli.core_variable_noted checks the note itself). */
static int keep_core_notes; /* set by the test of the note itself */

static void drop_core_notes(char *err, const char *prefix)
{
    char *line = err, *w = err;
    while (*line) {
        char *end = strchr(line, '\n');
        const size_t n = end ? (size_t)(end - line + 1) : strlen(line);
        const size_t p = strlen(prefix);
        if (!(strncmp(line, prefix, p) == 0 && strncmp(line + p, "note: CLATTN_CORE=", 18) == 0)) {
            memmove(w, line, n);
            w += n;
        }
        line += n;
    }
    *w = '\0';
}

/* Run CLATTN_CLI_PATH with args (NULL-terminated, without argv[0]) and
 * CLATTN_DEVICE = env_device (ENV_UNSET: removed). stdout and stderr go to
 * files in root; *err gets stderr (malloc'd). Returns the exit status. */
static int run_cli(const char *const *args, const char *env_device, char **err)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = CLATTN_CLI_PATH;
    for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    tu_child_env env = tu_env_with("CLATTN_DEVICE", env_device);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork failed");
    if (pid == 0) { /* async-signal-safe calls only, up to the exec (tu_env_with) */
        int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fo = open(stdout_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fe < 0 || fo < 0 || dup2(fe, 2) < 0 || dup2(fo, 1) < 0) _exit(126);
        close(fe), close(fo);
        if (fsize_limit) { /* a full disk, as far as the process can tell: writes past it fail with EFBIG */
            struct rlimit rl = {fsize_limit, fsize_limit};
            signal(SIGXFSZ, SIG_IGN);
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(125);
        }
        if (cli_deadline) alarm(cli_deadline); /* kept across execve */
        execve(CLATTN_CLI_PATH, (char *const *)argv, env.vars);
        _exit(127);
    }
    tu_env_free(&env);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    size_t len;
    *err = (char *)read_all(err_path, &len);
    cr_assert(WIFEXITED(status), "clattn was killed by signal %d; stderr: %s", WTERMSIG(status), *err);
    cr_assert_neq(WEXITSTATUS(status), 127, "cannot exec %s", CLATTN_CLI_PATH);
    if (getenv("CLATTN_CORE") && !keep_core_notes) drop_core_notes(*err, "clattn run: ");
    return WEXITSTATUS(status);
}

/* ---------------------------------------------------------------- golden round trips */

typedef struct meta { int heads, causal, has_scale; char scale[64]; } meta;

static meta read_meta(const char *name)
{
    meta m = {1, 0, 0, ""};
    FILE *f = fopen(path_in(case_dir(name), "meta.txt"), "r");
    cr_assert(f, "%s: no meta.txt", name);
    char line[256], key[64], val[64];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || sscanf(line, "%63s %63s", key, val) != 2) continue;
        if (strcmp(key, "heads") == 0) m.heads = atoi(val);
        else if (strcmp(key, "causal") == 0) m.causal = atoi(val);
        else if (strcmp(key, "scale") == 0) m.has_scale = 1, snprintf(m.scale, sizeof m.scale, "%s", val);
    }
    fclose(f);
    return m;
}

/* The case's flags: --heads H [--causal] [--scale S], appended to args at *n. */
static void meta_args(const meta *m, const char **args, int *n, char *heads_buf)
{
    sprintf(heads_buf, "%d", m->heads);
    args[(*n)++] = "--heads";
    args[(*n)++] = heads_buf;
    if (m->causal) args[(*n)++] = "--causal";
    if (m->has_scale) {
        args[(*n)++] = "--scale";
        args[(*n)++] = m->scale;
    }
}

static void expect_shape(const clattn_npy *a, const char *what, int ndim, const size_t *shape)
{
    cr_assert_eq(a->dtype, CLATTN_NPY_F32, "%s: not float32", what);
    cr_assert_eq(a->ndim, ndim, "%s: %d dimensions, expected %d", what, a->ndim, ndim);
    for (int d = 0; d < ndim; d++)
        cr_assert_eq(a->shape[d], shape[d], "%s: dimension %d is %zu, expected %zu", what, d, a->shape[d], shape[d]);
}

static void compare(const char *what, const float *got, const float *want, size_t n)
{
    char msg[256];
    size_t bad = tu_compare(got, want, n, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s: %zu of %zu elements differ; %s", what, bad, n, msg);
}

/* out_dir holds exactly out.npy and attn.npy equal to the given expectations. */
static void check_outputs(const char *what, const clattn_npy *eo, const clattn_npy *ea)
{
    cr_assert_eq(dir_entries(out_dir), 2, "%s: --out should hold out.npy and attn.npy only", what);
    clattn_npy out = {0}, attn = {0};
    load(path_in(out_dir, "out.npy"), &out);
    load(path_in(out_dir, "attn.npy"), &attn);
    char w[300];
    snprintf(w, sizeof w, "%s out.npy", what);
    expect_shape(&out, w, eo->ndim, eo->shape);
    compare(w, out.data, eo->data, eo->count);
    snprintf(w, sizeof w, "%s attn.npy", what);
    expect_shape(&attn, w, ea->ndim, ea->shape);
    compare(w, attn.data, ea->data, ea->count);
    clattn_npy_free(&out);
    clattn_npy_free(&attn);
    unlink(path_in(out_dir, "out.npy"));
    unlink(path_in(out_dir, "attn.npy"));
}

static void roundtrip(const char *name)
{
    meta m = read_meta(name);
    clattn_npy eo = {0}, ea = {0};
    load(path_in(case_dir(name), "expect_out.npy"), &eo);
    load(path_in(case_dir(name), "expect_attn.npy"), &ea);
    const char *devs[2] = {"ref", cl_spec()};
    for (int k = 0; k < 2; k++) {
        const char *args[24];
        char hb[32];
        int n = 0;
        args[n++] = "run", args[n++] = "--in", args[n++] = case_dir(name), args[n++] = "--out", args[n++] = out_dir;
        meta_args(&m, args, &n, hb);
        args[n++] = "--need-weights", args[n++] = "--device", args[n++] = devs[k], args[n] = NULL;
        char *err;
        int rc = run_cli(args, "bogus-env-must-be-ignored", &err);
        cr_assert_eq(rc, 0, "%s on %s: exit %d: %s", name, devs[k], rc, err);
        cr_assert_str_empty(err, "%s on %s: unexpected stderr: %s", name, devs[k], err);
        free(err);
        char what[200];
        snprintf(what, sizeof what, "%s on %s", name, devs[k]);
        check_outputs(what, &eo, &ea);
    }
    clattn_npy_free(&eo);
    clattn_npy_free(&ea);
}

#define ROUNDTRIP(name) Test(cli, roundtrip_##name) { roundtrip(#name); }
ROUNDTRIP(tut001_simple)        /* no weights, scale 1 */
ROUNDTRIP(tut003_mha)           /* a tutorial's multi-head module with out projection, causal */
ROUNDTRIP(tut004_dk_dv)         /* dk != dv, one head */
ROUNDTRIP(mha_basic)
ROUNDTRIP(mha_cross)            /* kv.npy */
ROUNDTRIP(mha_cross_causal)
ROUNDTRIP(mha_kpm)              /* key_padding_mask.npy */
ROUNDTRIP(mha_bool_mask)        /* bool attn_mask.npy */
ROUNDTRIP(mha_float_mask)       /* float attn_mask.npy with -inf */
ROUNDTRIP(mha_kpm_causal_bool)
ROUNDTRIP(manual_dk_dv)         /* dk != dv, out projection 10 -> 6 */
ROUNDTRIP(manual_cross_dk_dv)
ROUNDTRIP(manual_noweights_heads)
ROUNDTRIP(manual_scale)         /* --scale 0.3 */
ROUNDTRIP(mha_causal)
ROUNDTRIP(mha_fully_masked)       /* torch NaN rows as clattn zeros */
ROUNDTRIP(mha_causal_kpm)

/* Batch entry b of a golden case as a 2-D problem: x (Tq, E), kv (Tk, Ekv),
 * key_padding_mask (Tk) or (1, Tk); out.npy must be (Tq, Eo), attn.npy (H, Tq, Tk). */
static void roundtrip_2d(const char *name, size_t b, int kpm_1d, const char *env_device)
{
    meta m = read_meta(name);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", case_dir(name));
    copy_case(name);
    clattn_npy x = {0}, eo = {0}, ea = {0};
    load(path_in(dir, "x.npy"), &x);
    load(path_in(dir, "expect_out.npy"), &eo);
    load(path_in(dir, "expect_attn.npy"), &ea);
    cr_assert(x.ndim == 3 && eo.ndim == 3 && ea.ndim == 4, "%s: x (B, Tq, E), expect_out (B, Tq, Eo), expect_attn "
              "(B, H, Tq, Tk)", name);
    cr_assert(eo.shape[0] == x.shape[0] && ea.shape[0] == x.shape[0] && eo.shape[1] == x.shape[1] &&
              ea.shape[2] == x.shape[1], "%s: the expectations' shapes disagree with x", name);
    cr_assert(b < x.shape[0]);
    size_t xs[2] = {x.shape[1], x.shape[2]};
    save_f32(path_in(in_dir, "x.npy"), (float *)x.data + b * xs[0] * xs[1], 2, xs);
    if (access(path_in(dir, "kv.npy"), F_OK) == 0) {
        clattn_npy kv = {0};
        load(path_in(dir, "kv.npy"), &kv);
        size_t ks[2] = {kv.shape[1], kv.shape[2]};
        save_f32(path_in(in_dir, "kv.npy"), (float *)kv.data + b * ks[0] * ks[1], 2, ks);
        clattn_npy_free(&kv);
    }
    if (access(path_in(dir, "key_padding_mask.npy"), F_OK) == 0) {
        clattn_npy k = {0};
        load(path_in(dir, "key_padding_mask.npy"), &k);
        char shape[64];
        if (kpm_1d) snprintf(shape, sizeof shape, "(%zu,)", k.shape[1]);
        else snprintf(shape, sizeof shape, "(1, %zu)", k.shape[1]);
        write_npy_raw(path_in(in_dir, "key_padding_mask.npy"), "|b1", "False", shape,
                      (uint8_t *)k.data + b * k.shape[1], k.shape[1]);
        clattn_npy_free(&k);
    }
    /* expectations of batch entry b, as 2-D / 3-D arrays */
    clattn_npy e2 = eo, a3 = ea;
    e2.ndim = 2, e2.shape[0] = eo.shape[1], e2.shape[1] = eo.shape[2], e2.shape[2] = 0;
    e2.count = e2.shape[0] * e2.shape[1];
    e2.data = (float *)eo.data + b * e2.count;
    a3.ndim = 3, a3.shape[0] = ea.shape[1], a3.shape[1] = ea.shape[2], a3.shape[2] = ea.shape[3], a3.shape[3] = 0;
    a3.count = a3.shape[0] * a3.shape[1] * a3.shape[2];
    a3.data = (float *)ea.data + b * a3.count;

    const char *args[24];
    char hb[32];
    int n = 0;
    args[n++] = "run", args[n++] = "--in", args[n++] = in_dir, args[n++] = "--out", args[n++] = out_dir;
    meta_args(&m, args, &n, hb);
    args[n++] = "--need-weights", args[n] = NULL;
    char *err;
    int rc = run_cli(args, env_device, &err);
    cr_assert_eq(rc, 0, "2-D %s on CLATTN_DEVICE=%s: exit %d: %s", name, env_device, rc, err);
    cr_assert_str_empty(err, "unexpected stderr: %s", err);
    free(err);
    char what[200];
    snprintf(what, sizeof what, "2-D %s[%zu] on CLATTN_DEVICE=%s", name, b, env_device);
    check_outputs(what, &e2, &a3);
    clattn_npy_free(&x);
    clattn_npy_free(&eo);
    clattn_npy_free(&ea);
}

/* the device comes from CLATTN_DEVICE here (no --device) */
Test(cli, two_d_self_attention)
{
    roundtrip_2d("mha_t130", 0, 0, "ref");
    roundtrip_2d("mha_t130", 0, 0, cl_spec());
}

Test(cli, two_d_cross_attention)
{
    roundtrip_2d("mha_cross", 1, 0, "ref");
    roundtrip_2d("mha_cross", 1, 0, cl_spec());
}

Test(cli, two_d_key_padding_mask)
{
    roundtrip_2d("mha_kpm", 2, 1, "ref"); /* (Tk,) */
    roundtrip_2d("mha_kpm", 2, 0, cl_spec()); /* (1, Tk) */
}

/* CLATTN_CORE naming no core of the plan (a decode core on `clattn run`'s prefill plan): the run succeeds on its usual
 * cores and says so in one note; naming the core it runs, nothing is said. */
Test(cli, core_variable_noted)
{
    const char *args[] = {"run", "--in", case_dir("mha_basic"), "--out", out_dir, "--heads", "3", "--device",
                          cl_spec(), NULL};
    char *saved = getenv("CLATTN_CORE") ? strdup(getenv("CLATTN_CORE")) : NULL;
    setenv("CLATTN_CORE", "decode_group", 1);
    char *err;
    keep_core_notes = 1;
    int rc = run_cli(args, ENV_UNSET, &err);
    keep_core_notes = 0;
    unsetenv("CLATTN_CORE");
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cr_assert(strncmp(err, "clattn run: note: CLATTN_CORE='decode_group' names no core this plan runs", 72) == 0 &&
                  strchr(err, '\n') == err + strlen(err) - 1,
              "expected one note: %s", err);
    free(err);
    rc = run_cli(args, ENV_UNSET, &err);
    cr_assert(rc == 0 && err[0] == '\0', "exit %d: %s", rc, err);
    free(err);
    if (saved) setenv("CLATTN_CORE", saved, 1);
    free(saved);
}

/* Without --device and without CLATTN_DEVICE the default is opencl: no notice, same results. */
Test(cli, default_device)
{
    const char *args[] = {"run", "--in", case_dir("mha_basic"), "--out", out_dir, "--heads", "3", "--need-weights",
                          NULL};
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cr_assert_str_empty(err, "unexpected stderr (a fallback notice?): %s", err);
    free(err);
    clattn_npy eo = {0}, ea = {0};
    load(path_in(case_dir("mha_basic"), "expect_out.npy"), &eo);
    load(path_in(case_dir("mha_basic"), "expect_attn.npy"), &ea);
    check_outputs("mha_basic on the default device", &eo, &ea);
    clattn_npy_free(&eo);
    clattn_npy_free(&ea);
}

/* Without --need-weights only out.npy is written; --seed without --dropout is fine (eval). */
Test(cli, out_only_and_seed_without_dropout)
{
    const char *args[] = {"run", "--in", case_dir("mha_basic"), "--out", out_dir, "--heads", "3", "--seed", "99",
                          "--device", "ref", NULL};
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cr_assert_str_empty(err);
    free(err);
    cr_assert_eq(dir_entries(out_dir), 1);
    clattn_npy out = {0}, eo = {0};
    load(path_in(out_dir, "out.npy"), &out);
    load(path_in(case_dir("mha_basic"), "expect_out.npy"), &eo);
    expect_shape(&out, "out.npy", 3, eo.shape);
    compare("out.npy", out.data, eo.data, eo.count);
    clattn_npy_free(&out);
    clattn_npy_free(&eo);
}

Test(cli, help)
{
    const char *args[] = {"run", "--help", NULL};
    char *err;
    cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0);
    free(err);
    size_t n;
    char *out = (char *)read_all(stdout_path, &n);
    cr_assert(strstr(out, "--in DIR"), "help: %s", out);
    free(out);
}

/* stdout of a clattn command that must succeed silently on stderr (the caller frees it) */
static char *stdout_of(const char *const *args)
{
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "%s: exit %d: %s", args[0], rc, err);
    cr_assert_str_empty(err, "%s: unexpected stderr: %s", args[0], err);
    free(err);
    size_t n;
    return (char *)read_all(stdout_path, &n);
}

/* clattn help run = clattn run --help; clattn help encoder lists the files encoder reads */
Test(cli, help_command)
{
    char *out = stdout_of((const char *const[]){"help", "run", NULL});
    cr_assert(strstr(out, "usage: clattn run --in DIR") && strstr(out, "key_padding_mask.npy"), "help run: %s", out);
    free(out);
    out = stdout_of((const char *const[]){"help", "encoder", NULL});
    cr_assert(strstr(out, "usage: clattn encoder") && strstr(out, "ln1_weight.npy") && strstr(out, "w_ff2.npy"),
              "help encoder: %s", out);
    free(out);
    const char *bogus[] = {"help", "frobnicate", NULL};
    char *err;
    cr_assert_eq(run_cli(bogus, ENV_UNSET, &err), 2);
    cr_assert(strstr(err, "frobnicate"), "%s", err);
    free(err);
}

/* clattn run -v says what ran, so that a forgotten --heads shows */
Test(cli, verbose_run)
{
    const char *args[] = {"run", "--in", case_dir("mha_basic"), "--out", out_dir, "--device", "ref", "-v", NULL};
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    const char *want[] = {"clattn run: device ref", "B=2 Tq=7 Tk=7 E=12", "heads=1 dk=12 dv=12", "algorithm reference",
                          "execute ", "clattn run: gemm ref"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(err, want[i]), "-v should say '%s':\n%s", want[i], err);
    free(err);
    unlink(path_in(out_dir, "out.npy"));
}

Test(cli, version)
{
    char *out = stdout_of((const char *const[]){"--version", NULL});
    char want[64];
    snprintf(want, sizeof want, "clattn %s", clattn_version());
    cr_assert(strncmp(out, want, strlen(want)) == 0, "--version: %s", out);
    cr_assert(strstr(out, "\nCLBlast "), "--version names CLBlast: %s", out);
    free(out);
}

/* ---------------------------------------------------------------- dropout */

static void run_dropout(const char *dev, const char *seed, clattn_npy *attn, clattn_npy *out)
{
    const char *args[] = {"run", "--in", case_dir("mha_basic"), "--out", out_dir, "--heads", "3", "--dropout",
                          "0.5", "--seed", seed, "--need-weights", "--device", dev, NULL};
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "dropout on %s: exit %d: %s", dev, rc, err);
    cr_assert_str_empty(err, "%s", err);
    free(err);
    load(path_in(out_dir, "attn.npy"), attn);
    load(path_in(out_dir, "out.npy"), out);
    unlink(path_in(out_dir, "attn.npy"));
    unlink(path_in(out_dir, "out.npy"));
}

Test(cli, dropout)
{
    clattn_npy c1 = {0}, c2 = {0}, r = {0}, c3 = {0}, o1 = {0}, o2 = {0}, orf = {0}, o3 = {0}, ea = {0};
    run_dropout(cl_spec(), "7", &c1, &o1);
    run_dropout(cl_spec(), "7", &c2, &o2);
    run_dropout("ref", "7", &r, &orf);
    run_dropout(cl_spec(), "8", &c3, &o3);
    load(path_in(case_dir("mha_basic"), "expect_attn.npy"), &ea);
    const size_t n = ea.count;
    expect_shape(&c1, "attn.npy", 4, ea.shape);
    expect_shape(&c2, "attn.npy", 4, ea.shape);
    expect_shape(&c3, "attn.npy", 4, ea.shape);
    expect_shape(&r, "attn.npy", 4, ea.shape);
    expect_shape(&o2, "out.npy", o1.ndim, o1.shape);
    expect_shape(&orf, "out.npy", o1.ndim, o1.shape);
    /* same seed, same device: identical bit for bit */
    cr_assert_eq(memcmp(c1.data, c2.data, n * sizeof(float)), 0, "two opencl runs with seed 7 differ (attn)");
    cr_assert_eq(memcmp(o1.data, o2.data, o1.count * sizeof(float)), 0, "two opencl runs with seed 7 differ (out)");
    /* every weight against the independent dropout oracle (tests/oracle.c): dropped exactly where
     * Philox(counter (j, i, h, b), key seed) < floor(0.5 * 2^32), else 2 x the PyTorch eval weight */
    cr_assert(ea.ndim == 4, "expect_attn.npy is (B, H, Tq, Tk)");
    const size_t B = ea.shape[0], H = ea.shape[1], Tq = ea.shape[2], Tk = ea.shape[3];
    const float *a1 = c1.data, *ar = r.data, *a3 = c3.data, *e = ea.data;
    size_t zeros = 0, differ = 0, k = 0;
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t i = 0; i < Tq; i++)
                for (uint32_t j = 0; j < Tk; j++, k++) {
                    const int keep7 = oracle_dropout_keep(7, 0.5f, b, h, i, j);
                    const int keep8 = oracle_dropout_keep(8, 0.5f, b, h, i, j);
                    const float want7 = keep7 ? 2.0f * e[k] : 0.0f, want8 = keep8 ? 2.0f * e[k] : 0.0f;
                    cr_assert(fabsf(a1[k] - want7) <= TU_ATOL + TU_RTOL * fabsf(want7) && (a1[k] == 0.0f) == !keep7,
                              "seed 7, weight (%u,%u,%u,%u) = %g, expected %g", b, h, i, j, (double)a1[k],
                              (double)want7);
                    cr_assert(fabsf(a3[k] - want8) <= TU_ATOL + TU_RTOL * fabsf(want8) && (a3[k] == 0.0f) == !keep8,
                              "seed 8, weight (%u,%u,%u,%u) = %g, expected %g", b, h, i, j, (double)a3[k],
                              (double)want8);
                    zeros += !keep7;
                    differ += keep7 != keep8;
                }
    cr_assert_eq(k, n);
    compare("attn ref vs opencl", ar, a1, n);
    compare("out ref vs opencl", orf.data, o1.data, o1.count);
    /* the oracle's mask itself: Binomial(n, 1/2) drops, within 5 sd (sd = sqrt(n)/2); two seeds
     * disagree on each weight with probability 1/2, so also within 5 sd of n/2 */
    cr_assert(fabs((double)zeros - n / 2.0) <= 5 * sqrt((double)n) / 2, "%zu of %zu weights dropped", zeros, n);
    cr_assert(fabs((double)differ - n / 2.0) <= 5 * sqrt((double)n) / 2, "seeds 7 and 8 differ on %zu of %zu",
              differ, n);
    /* seed 8's output: written everywhere, and not seed 7's */
    expect_shape(&o3, "out.npy", o1.ndim, o1.shape);
    int out_differs = 0;
    for (size_t i = 0; i < o3.count; i++) {
        cr_assert(isfinite(((const float *)o3.data)[i]), "seed 8: out[%zu] not finite", i);
        out_differs |= ((const float *)o3.data)[i] != ((const float *)o1.data)[i];
    }
    cr_assert(out_differs, "seeds 7 and 8 gave the same output");
    clattn_npy *all[] = {&c1, &c2, &r, &c3, &o1, &o2, &orf, &o3, &ea};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) clattn_npy_free(all[i]);
}

/* ---------------------------------------------------------------- bad inputs */

/* stderr is exactly one line "clattn run: ..." mentioning needle; the status is
 * want; --out is still empty (or still absent). */
static void check_failure(int rc, char *err, int want, const char *needle, const char *what)
{
    cr_assert_eq(rc, want, "%s: exit %d, expected %d; stderr: %s", what, rc, want, err);
    cr_assert(strncmp(err, "clattn run: ", 12) == 0, "%s: stderr does not start with 'clattn run: ': %s", what, err);
    size_t len = strlen(err);
    cr_assert(len > 12 && err[len - 1] == '\n' && strchr(err, '\n') == err + len - 1,
              "%s: stderr is not exactly one line: [%s]", what, err);
    cr_assert(strstr(err, needle), "%s: stderr does not mention '%s': %s", what, needle, err);
    struct stat sb;
    if (stat(out_dir, &sb) == 0) cr_assert_eq(dir_entries(out_dir), 0, "%s: --out is not empty", what);
    free(err);
}

/* Run on in_dir/out_dir with --device ref, the given extra flags, and expect failure. */
static void bad(const char *what, int want, const char *needle, const char *const *extra)
{
    const char *args[40];
    int n = 0;
    args[n++] = "run", args[n++] = "--in", args[n++] = in_dir, args[n++] = "--out", args[n++] = out_dir;
    args[n++] = "--device", args[n++] = "ref";
    for (; extra && *extra; extra++) args[n++] = *extra;
    args[n] = NULL;
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    check_failure(rc, err, want, needle, what);
}

#define FLAGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* run with exactly these args (after "run") */
static void bad_argv(const char *what, int want, const char *needle, const char *const *args)
{
    const char *full[40];
    int n = 0;
    full[n++] = "run";
    for (; *args; args++) full[n++] = *args;
    full[n] = NULL;
    char *err;
    int rc = run_cli(full, ENV_UNSET, &err);
    check_failure(rc, err, want, needle, what);
}

Test(cli, bad_flags)
{
    copy_case("mha_basic");
    bad("unknown flag", 2, "--frobnicate", FLAGS("--heads", "3", "--frobnicate"));
    bad("unknown flag, worded as encoder words it", 2, "unknown option '--frobnicate' (see clattn run --help)",
        FLAGS("--heads", "3", "--frobnicate"));
    bad("positional argument", 2, "stray", FLAGS("--heads", "3", "stray"));
    bad("--heads without value", 2, "--heads", FLAGS("--heads"));
    bad("--scale followed by a flag", 2, "--scale", FLAGS("--heads", "3", "--scale", "--causal"));
    bad_argv("--device without value", 2, "--device", FLAGS("--in", in_dir, "--out", out_dir, "--device"));
    bad_argv("--in without value", 2, "--in", FLAGS("--out", out_dir, "--in"));
    bad("--heads twice", 2, "--heads", FLAGS("--heads", "3", "--heads", "3"));
    const char *heads[] = {"0", "-1", "abc", "2x", "1.5", "", " 3", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++)
        bad("bad --heads", 2, "--heads", FLAGS("--heads", heads[i]));
    const char *drop[] = {"-0.1", "1", "1.5", "nan", "inf", "0.5x", ""};
    for (size_t i = 0; i < sizeof drop / sizeof *drop; i++)
        bad("bad --dropout", 2, "--dropout", FLAGS("--heads", "3", "--dropout", drop[i]));
    const char *scale[] = {"nan", "inf", "-inf", "0", "abc", "1e39", "0.5 ", "-0"};
    for (size_t i = 0; i < sizeof scale / sizeof *scale; i++)
        bad("bad --scale", 2, "--scale", FLAGS("--heads", "3", "--scale", scale[i]));
    const char *seed[] = {"-1", "abc", "18446744073709551616"};
    for (size_t i = 0; i < sizeof seed / sizeof *seed; i++)
        bad("bad --seed", 2, "--seed", FLAGS("--heads", "3", "--dropout", "0.1", "--seed", seed[i]));
}

Test(cli, bad_device)
{
    copy_case("mha_basic");
    const char *specs[][2] = {{"bogus", "2"}, {"opencl:x", "2"}, {"name=", "2"}, {"name=NoSuchDevice", "1"},
                              {"opencl:99:0", "1"}};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        char what[64];
        snprintf(what, sizeof what, "--device %s", specs[i][0]);
        bad_argv(what, atoi(specs[i][1]), "--device",
                 FLAGS("--in", in_dir, "--out", out_dir, "--heads", "3", "--device", specs[i][0]));
    }
    /* a bad CLATTN_DEVICE default is named too */
    const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--heads", "3", NULL};
    char *err;
    int rc = run_cli(args, "bogus", &err);
    check_failure(rc, err, 2, "CLATTN_DEVICE", "CLATTN_DEVICE=bogus");
}

Test(cli, bad_directories)
{
    copy_case("mha_basic");
    bad_argv("missing --in", 2, "--in", FLAGS("--out", out_dir, "--heads", "3"));
    bad_argv("missing --out", 2, "--out", FLAGS("--in", in_dir, "--heads", "3"));
    bad_argv("--in is a file", 1, "--in", FLAGS("--in", path_in(in_dir, "x.npy"), "--out", out_dir));
    bad_argv("--in does not exist", 1, "--in", FLAGS("--in", path_in(root, "nope"), "--out", out_dir));
    bad_argv("--out is a file", 1, "--out", FLAGS("--in", in_dir, "--out", path_in(in_dir, "x.npy")));
    /* a missing --out is made, parents too, but only when the outputs are written: a run that fails first
     * leaves it missing, and one that fails writing removes what it made */
    const char *nope = path_in(root, "no_such_out"), *deep = path_in(nope, "a/b");
    bad_argv("--out does not exist, the run fails", 1, "heads", FLAGS("--in", in_dir, "--out", deep, "--heads", "5"));
    cr_assert_neq(access(nope, F_OK), 0, "--out was created by a run that failed");
    bad_argv("--out under a file", 1, "--out", FLAGS("--in", in_dir, "--out", path_in(path_in(in_dir, "x.npy"), "sub")));
    char *err;
    int rc = run_cli(FLAGS("run", "--in", in_dir, "--out", deep, "--device", "ref", "--heads", "3"), ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "--out a/b missing: exit %d: %s", rc, err);
    free(err);
    cr_assert_eq(access(path_in(deep, "out.npy"), R_OK), 0, "no out.npy in the created --out");
    cr_assert_eq(unlink(path_in(deep, "out.npy")), 0);
    cr_assert_eq(rmdir(deep), 0);
    cr_assert_eq(rmdir(path_in(nope, "a")), 0);
    cr_assert_eq(rmdir(nope), 0);
    unlink(path_in(in_dir, "x.npy"));
    bad("missing x.npy", 1, "x.npy", FLAGS("--heads", "3"));
    cr_assert_eq(mkdir(path_in(in_dir, "x.npy"), 0700), 0); /* else this would test "missing x.npy" again */
    bad("x.npy is a directory", 1, "x.npy", FLAGS("--heads", "3"));
}

/* x.npy of mha_basic (2, 7, 12) as bytes */
static unsigned char *x_bytes(size_t *len) { return read_all(path_in(case_dir("mha_basic"), "x.npy"), len); }

Test(cli, bad_x_file)
{
    copy_case("mha_basic");
    const char *x = path_in(in_dir, "x.npy");
    size_t len;
    unsigned char *b = x_bytes(&len);
    const size_t hdr_end = 10 + (size_t)(b[8] | b[9] << 8);
    const size_t cuts[] = {0, 1, 6, 8, 9, 10, 30, hdr_end - 1, hdr_end, hdr_end + 1, hdr_end + 4, len - 4, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        write_bytes(x, b, cuts[i]);
        char what[64];
        snprintf(what, sizeof what, "x.npy cut at %zu of %zu bytes", cuts[i], len);
        bad(what, 1, "x.npy", FLAGS("--heads", "3"));
    }
    /* one byte too many */
    unsigned char *longer = malloc(len + 1);
    memcpy(longer, b, len);
    longer[len] = 0;
    write_bytes(x, longer, len + 1);
    bad("x.npy with a trailing byte", 1, "x.npy", FLAGS("--heads", "3"));
    free(longer);
    /* garbage: bad magic, a header that is not a dict, an unknown key */
    unsigned char *g = malloc(len);
    memcpy(g, b, len);
    g[1] = 'X';
    write_bytes(x, g, len);
    bad("x.npy with bad magic", 1, "x.npy", FLAGS("--heads", "3"));
    memcpy(g, b, len);
    memset(g + 10, '#', hdr_end - 11);
    write_bytes(x, g, len);
    bad("x.npy with a garbage header", 1, "x.npy", FLAGS("--heads", "3"));
    free(g);
    const float zeros[168] = {0};
    write_npy_raw(x, "<f4", "False", "(2, 7, 12), 'extra': 1", zeros, sizeof zeros);
    bad("x.npy with an extra header key", 1, "x.npy", FLAGS("--heads", "3"));
    write_npy_raw(x, "<f4", "False", "(2, 7, 12", zeros, sizeof zeros);
    bad("x.npy with an unclosed shape", 1, "x.npy", FLAGS("--heads", "3"));
    /* headers that claim impossible shapes */
    write_npy_raw(x, "<f4", "False", "(99999999999999, 99999999999999, 99999999999999)", zeros, sizeof zeros);
    bad("x.npy with an overflowing shape", 1, "x.npy", FLAGS("--heads", "3"));
    write_npy_raw(x, "<f4", "False", "(100000, 100000, 12)", zeros, sizeof zeros);
    bad("x.npy claiming 480 GB", 1, "x.npy", FLAGS("--heads", "3"));
    write_npy_raw(x, "<f4", "False", "(2, -7, 12)", zeros, sizeof zeros);
    bad("x.npy with a negative dimension", 1, "x.npy", FLAGS("--heads", "3"));
    free(b);
}

Test(cli, bad_x_dtype_order_rank)
{
    copy_case("mha_basic");
    const char *x = path_in(in_dir, "x.npy");
    clattn_npy xa = {0};
    load(path_in(case_dir("mha_basic"), "x.npy"), &xa);
    double d[168];
    for (int i = 0; i < 168; i++) d[i] = ((float *)xa.data)[i];
    write_npy_raw(x, "<f8", "False", "(2, 7, 12)", d, sizeof d);
    bad("float64 x.npy", 1, "x.npy", FLAGS("--heads", "3"));
    bad("float64 x.npy: the fix", 1, "astype(np.float32)", FLAGS("--heads", "3"));
    write_npy_raw(x, "<f4", "True", "(2, 7, 12)", xa.data, 168 * 4);
    bad("fortran-order x.npy", 1, "x.npy", FLAGS("--heads", "3"));
    write_npy_raw(x, "|u1", "False", "(2, 7, 12)", d, 168);
    bad("uint8 x.npy", 1, "x.npy", FLAGS("--heads", "3"));
    write_npy_raw(x, "<f4", "False", "(1, 2, 7, 12)", xa.data, 168 * 4);
    bad("4-D x.npy", 1, "x.npy", FLAGS("--heads", "3"));
    write_npy_raw(x, "<f4", "False", "(168,)", xa.data, 168 * 4);
    bad("1-D x.npy", 1, "x.npy", FLAGS("--heads", "3"));
    write_npy_raw(x, "<f4", "False", "(2, 0, 12)", NULL, 0);
    bad("empty x.npy", 1, "x.npy", FLAGS("--heads", "3"));
    write_npy_raw(x, "<f4", "False", "(2, 7, 11)", xa.data, 154 * 4);
    bad("x.npy narrower than w_query", 1, "w_query.npy", FLAGS("--heads", "3"));
    clattn_npy_free(&xa);
}

Test(cli, bad_weights)
{
    static const float z[512];
    copy_case("mha_cross"); /* x (2, 5, 12), kv (2, 11, 7), H = 3, weights (12, 12), (12, 7), (12, 7) */
    const char *wk = path_in(in_dir, "w_key.npy");
    size_t s[2] = {12, 5};
    save_f32(wk, z, 2, s);
    /* the exact message of the README's example */
    {
        const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--heads", "3", "--device", "ref", NULL};
        char *err;
        int rc = run_cli(args, ENV_UNSET, &err);
        cr_assert_eq(rc, 1);
        cr_assert_str_eq(err, "clattn run: w_key.npy: shape (12, 5) but expected (12, 7) (H*dk, Ekv)\n");
        free(err);
    }
    s[0] = 9, s[1] = 7;
    save_f32(wk, z, 2, s);
    bad("w_key rows", 1, "w_key.npy", FLAGS("--heads", "3"));
    copy_file(path_in(case_dir("mha_cross"), "w_key.npy"), wk);
    bad("--heads 5 does not divide H*dk = 12", 1, "--heads", FLAGS("--heads", "5"));
    size_t b11[1] = {11};
    save_f32(path_in(in_dir, "b_query.npy"), z, 1, b11);
    bad("b_query one short", 1, "b_query.npy", FLAGS("--heads", "3"));
    size_t b2d[2] = {1, 12};
    save_f32(path_in(in_dir, "b_query.npy"), z, 2, b2d);
    bad("b_query 2-D", 1, "b_query.npy", FLAGS("--heads", "3"));
    copy_file(path_in(case_dir("mha_cross"), "b_query.npy"), path_in(in_dir, "b_query.npy"));
    write_npy_raw(path_in(in_dir, "w_value.npy"), "<f8", "False", "(12, 7)", z, 12 * 7 * 8);
    bad("float64 w_value", 1, "w_value.npy", FLAGS("--heads", "3"));
    write_npy_raw(path_in(in_dir, "w_value.npy"), "|b1", "False", "(12, 7)", z, 12 * 7);
    bad("bool w_value", 1, "w_value.npy", FLAGS("--heads", "3"));
    unlink(path_in(in_dir, "w_value.npy"));
    bad("only w_query and w_key", 1, "w_value.npy", FLAGS("--heads", "3"));
    copy_file(path_in(case_dir("mha_cross"), "w_value.npy"), path_in(in_dir, "w_value.npy"));
    size_t kvs[3] = {3, 11, 7};
    save_f32(path_in(in_dir, "kv.npy"), z, 3, kvs);
    bad("kv batch 3 vs x batch 2", 1, "kv.npy", FLAGS("--heads", "3"));
    size_t kv2[2] = {11, 7};
    save_f32(path_in(in_dir, "kv.npy"), z, 2, kv2);
    bad("2-D kv with 3-D x", 1, "kv.npy", FLAGS("--heads", "3"));
}

Test(cli, bad_out_projection_and_biases)
{
    static const float z[512];
    copy_case("manual_dk_dv"); /* H = 2, dk = 3, dv = 5, w_out (6, 10), b_out (6) */
    size_t t[2] = {10, 6};
    save_f32(path_in(in_dir, "w_out.npy"), z, 2, t);
    bad("w_out transposed", 1, "w_out.npy", FLAGS("--heads", "2"));
    copy_file(path_in(case_dir("manual_dk_dv"), "w_out.npy"), path_in(in_dir, "w_out.npy"));
    size_t b7[1] = {7};
    save_f32(path_in(in_dir, "b_out.npy"), z, 1, b7);
    bad("b_out length", 1, "b_out.npy", FLAGS("--heads", "2"));
    unlink(path_in(in_dir, "w_out.npy"));
    bad("b_out without w_out", 1, "b_out.npy", FLAGS("--heads", "2"));
    unlink(path_in(in_dir, "b_out.npy"));
    size_t b6[1] = {6};
    save_f32(path_in(in_dir, "b_value.npy"), z, 1, b6);
    bad("b_value sized H*dk, not H*dv", 1, "b_value.npy", FLAGS("--heads", "2"));
    /* weights absent, a bias present */
    rm_rf(in_dir);
    cr_assert_eq(mkdir(in_dir, 0700), 0);
    copy_case("tut001_simple");
    save_f32(path_in(in_dir, "b_key.npy"), z, 1, (size_t[]){3});
    bad("bias without weights", 1, "b_key.npy", FLAGS("--heads", "1"));
    unlink(path_in(in_dir, "b_key.npy"));
    bad("--heads 2 does not divide E = 3 (no weights)", 1, "--heads", FLAGS("--heads", "2"));
    save_f32(path_in(in_dir, "kv.npy"), z, 3, (size_t[]){1, 4, 5});
    bad("no weights, kv width 5 vs E = 3", 1, "kv.npy", FLAGS("--heads", "1"));
}

Test(cli, bad_masks)
{
    static const uint8_t m[512];
    copy_case("mha_basic"); /* B = 2, Tq = Tk = 7 */
    const char *kpm = path_in(in_dir, "key_padding_mask.npy"), *am = path_in(in_dir, "attn_mask.npy");
    write_npy_raw(kpm, "|b1", "False", "(2, 8)", m, 16);
    bad("key_padding_mask (2, 8)", 1, "key_padding_mask.npy", FLAGS("--heads", "3"));
    write_npy_raw(kpm, "|b1", "False", "(7,)", m, 7);
    bad("key_padding_mask 1-D with a 3-D x", 1, "key_padding_mask.npy", FLAGS("--heads", "3"));
    write_npy_raw(kpm, "<f4", "False", "(2, 7)", m, 56);
    bad("float32 key_padding_mask", 1, "key_padding_mask.npy", FLAGS("--heads", "3"));
    write_npy_raw(kpm, "|u1", "False", "(2, 7)", m, 14); /* uint8 is fine */
    write_npy_raw(am, "|b1", "False", "(8, 7)", m, 56);
    bad("attn_mask (8, 7)", 1, "attn_mask.npy", FLAGS("--heads", "3"));
    write_npy_raw(am, "|b1", "False", "(2, 7, 7)", m, 98);
    bad("attn_mask 3-D", 1, "attn_mask.npy", FLAGS("--heads", "3"));
    write_npy_raw(am, "<f8", "False", "(7, 7)", m, 392);
    bad("float64 attn_mask", 1, "attn_mask.npy", FLAGS("--heads", "3"));
    write_npy_raw(am, "|u1", "False", "(7, 7)", m, 7); /* truncated */
    bad("truncated attn_mask", 1, "attn_mask.npy", FLAGS("--heads", "3"));
    /* all valid now: uint8 masks of zeros change nothing */
    write_npy_raw(am, "|u1", "False", "(7, 7)", m, 49);
    const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--heads", "3", "--device", "ref", "--need-weights",
                          NULL};
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "valid uint8 masks: exit %d: %s", rc, err);
    free(err);
    clattn_npy eo = {0}, ea = {0};
    load(path_in(case_dir("mha_basic"), "expect_out.npy"), &eo);
    load(path_in(case_dir("mha_basic"), "expect_attn.npy"), &ea);
    check_outputs("mha_basic with all-zero uint8 masks", &eo, &ea);
    clattn_npy_free(&eo);
    clattn_npy_free(&ea);
}

/* Writing attn.npy fails (a directory of that name): out.npy is removed again. */
Test(cli, all_or_nothing_outputs)
{
    cr_assert_eq(mkdir(path_in(out_dir, "attn.npy"), 0700), 0);
    const char *args[] = {"run", "--in", case_dir("mha_basic"), "--out", out_dir, "--heads", "3", "--device", "ref",
                          "--need-weights", NULL};
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert(strncmp(err, "clattn run: attn.npy", 20) == 0, "stderr: %s", err);
    cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "not one line: %s", err);
    free(err);
    cr_assert_neq(access(path_in(out_dir, "out.npy"), F_OK), 0, "out.npy was left behind");
    cr_assert_eq(dir_entries(out_dir), 1);
    /* and when out.npy itself cannot be written, nothing is */
    rmdir(path_in(out_dir, "attn.npy"));
    cr_assert_eq(mkdir(path_in(out_dir, "out.npy"), 0700), 0);
    rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert(strncmp(err, "clattn run: out.npy", 19) == 0, "stderr: %s", err);
    free(err);
    cr_assert_neq(access(path_in(out_dir, "attn.npy"), F_OK), 0, "attn.npy was written");
}

/* Outputs are never half-written: each goes to a temporary file in --out, renamed into place when all are
 * written. A full disk on the second file leaves the first run's files as they were and no temporary file;
 * a link at out.npy is replaced, its target untouched; a FIFO at out.npy is replaced, without a hang; a FIFO
 * as an input is refused, without a hang. */
static void spill_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(cli, outputs_never_half_written, .timeout = 30)
{
    const char *args[] = {"run", "--in", case_dir("mha_basic"), "--out", out_dir, "--heads", "3", "--device", "ref",
                          "--need-weights", NULL};
    char *err;
    cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "%s", err);
    free(err);
    struct stat so, sa;
    cr_assert(stat(path_in(out_dir, "out.npy"), &so) == 0 && stat(path_in(out_dir, "attn.npy"), &sa) == 0);
    cr_assert_gt(sa.st_size, so.st_size + 64, "the case's weights are not larger than its output");
    /* the files of an earlier run, then a disk that fills up during attn.npy */
    spill_text(path_in(out_dir, "out.npy"), "an earlier out.npy");
    spill_text(path_in(out_dir, "attn.npy"), "an earlier attn.npy");
    fsize_limit = (rlim_t)so.st_size + 64;
    const int rc = run_cli(args, ENV_UNSET, &err);
    fsize_limit = 0;
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "attn.npy"), "stderr: %s", err);
    free(err);
    size_t n;
    char *text = (char *)read_all(path_in(out_dir, "out.npy"), &n);
    cr_assert(n == 18 && memcmp(text, "an earlier out.npy", 18) == 0, "out.npy changed by a failed run");
    free(text);
    text = (char *)read_all(path_in(out_dir, "attn.npy"), &n);
    cr_assert(n == 19 && memcmp(text, "an earlier attn.npy", 19) == 0, "attn.npy changed by a failed run");
    free(text);
    cr_assert_eq(dir_entries(out_dir), 2, "a temporary file was left in --out");
    /* a missing --out that the failing run made (two levels) is removed again */
    const char *made = path_in(root, "made_out"), *made2 = path_in(made, "inner");
    const char *args_made[] = {"run", "--in", case_dir("mha_basic"), "--out", made2, "--heads", "3", "--device", "ref",
                           "--need-weights", NULL};
    fsize_limit = (rlim_t)so.st_size + 64;
    const int rc2 = run_cli(args_made, ENV_UNSET, &err);
    fsize_limit = 0;
    cr_assert_eq(rc2, 1, "exit %d: %s", rc2, err);
    free(err);
    cr_assert_neq(access(made, F_OK), 0, "the directories a failed run made were left");
    /* a link at out.npy: replaced by the output, its target untouched */
    char victim[300];
    snprintf(victim, sizeof victim, "%s/victim.txt", root);
    spill_text(victim, "not an output");
    cr_assert_eq(remove(path_in(out_dir, "out.npy")), 0);
    cr_assert_eq(symlink(victim, path_in(out_dir, "out.npy")), 0);
    cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "%s", err);
    free(err);
    text = (char *)read_all(victim, &n);
    cr_assert(n == 13 && memcmp(text, "not an output", 13) == 0, "the link's target was written");
    free(text);
    struct stat sl;
    cr_assert(lstat(path_in(out_dir, "out.npy"), &sl) == 0 && S_ISREG(sl.st_mode), "out.npy is not a file now");
    clattn_npy a;
    load(path_in(out_dir, "out.npy"), &a);
    clattn_npy_free(&a);
    /* a FIFO at out.npy: replaced, no hang (a run of this case takes well under a second: a hang is killed at 5 s) */
    cli_deadline = 5;
    cr_assert_eq(remove(path_in(out_dir, "out.npy")), 0);
    cr_assert_eq(mkfifo(path_in(out_dir, "out.npy"), 0600), 0);
    cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "%s", err);
    free(err);
    cr_assert(lstat(path_in(out_dir, "out.npy"), &sl) == 0 && S_ISREG(sl.st_mode), "out.npy is not a file now");
    /* a FIFO as an input: refused by name, no hang */
    const size_t xs[3] = {1, 3, 4};
    const float x[12] = {0};
    save_f32(path_in(in_dir, "x.npy"), x, 3, xs);
    const char *args2[] = {"run", "--in", in_dir, "--out", out_dir, "--heads", "2", "--device", "ref", NULL};
    cr_assert_eq(run_cli(args2, ENV_UNSET, &err), 0, "%s", err);
    free(err);
    cr_assert_eq(remove(path_in(in_dir, "x.npy")), 0);
    cr_assert_eq(mkfifo(path_in(in_dir, "x.npy"), 0600), 0);
    cr_assert_eq(run_cli(args2, ENV_UNSET, &err), 1, "%s", err);
    cr_assert(strstr(err, "not a regular file"), "stderr: %s", err);
    free(err);
    cli_deadline = 0;
    remove(victim);
}

/* ---------------------------------------------------------------- grouped-query, window, half K/V, decoding */

/* x (2, 19, 16) and GQA weights (H = 4, kv_heads = 2, dk = dv = 4, w_out 16 x 16) in in_dir, dyadic
 * (x in units of 2^-6, weights of 2^-10) so that every projection is exact in float and --kv-half's
 * rounding is compared exactly with the oracle's; the oracle's run of the flags into *want. */
enum { DB = 2, DT = 19, DE = 16, DH = 4, DHK = 2, DD = 4 };

static float dyadic(tu_rng *r, int bits) { return ldexpf(nearbyintf(ldexpf(tu_uniform(r, -1, 1), bits)), -bits); }

static void decode_inputs(float *x, float *wq, float *wk, float *wv, float *bk, float *wo)
{
    tu_rng r = {2024};
    for (size_t i = 0; i < DB * DT * DE; i++) x[i] = dyadic(&r, 6);
    for (size_t i = 0; i < DH * DD * DE; i++) wq[i] = dyadic(&r, 10);
    for (size_t i = 0; i < DHK * DD * DE; i++) wk[i] = dyadic(&r, 10), wv[i] = dyadic(&r, 10);
    for (size_t i = 0; i < DHK * DD; i++) bk[i] = dyadic(&r, 10);
    for (size_t i = 0; i < DE * DH * DD; i++) wo[i] = tu_uniform(&r, -0.5f, 0.5f);
    const size_t xs[3] = {DB, DT, DE}, wqs[2] = {DH * DD, DE}, wks[2] = {DHK * DD, DE}, bks[1] = {DHK * DD};
    const size_t wos[2] = {DE, DH * DD};
    save_f32(path_in(in_dir, "x.npy"), x, 3, xs);
    save_f32(path_in(in_dir, "w_query.npy"), wq, 2, wqs);
    save_f32(path_in(in_dir, "w_key.npy"), wk, 2, wks);
    save_f32(path_in(in_dir, "w_value.npy"), wv, 2, wks);
    save_f32(path_in(in_dir, "b_key.npy"), bk, 1, bks);
    save_f32(path_in(in_dir, "w_out.npy"), wo, 2, wos);
}

static void decode_check(const char *dev, size_t window, int half, const char *decode_from, const char *page,
                         const char *draft, const char *reject)
{
    float x[DB * DT * DE], wq[DH * DD * DE], wk[DHK * DD * DE], wv[DHK * DD * DE], bk[DHK * DD], wo[DE * DH * DD];
    decode_inputs(x, wq, wk, wv, bk, wo);
    const char *args[32];
    int n = 0;
    char wbuf[32];
    snprintf(wbuf, sizeof wbuf, "%zu", window);
    args[n++] = "run", args[n++] = "--in", args[n++] = in_dir, args[n++] = "--out", args[n++] = out_dir;
    args[n++] = "--device", args[n++] = dev, args[n++] = "--heads", args[n++] = "4", args[n++] = "--kv-heads";
    args[n++] = "2", args[n++] = "--causal";
    if (window) args[n++] = "--window", args[n++] = wbuf;
    static const char *const kv_types[] = {"float", "half", "bf16", "int8"}; /* half: a clattn_kv_type */
    if (half == 1) args[n++] = "--kv-half";
    else if (half) args[n++] = "--kv-type", args[n++] = kv_types[half];
    if (decode_from) args[n++] = "--decode-from", args[n++] = decode_from;
    if (page) args[n++] = "--page-size", args[n++] = page;
    if (draft) args[n++] = "--draft", args[n++] = draft;
    if (reject) args[n++] = "--reject", args[n++] = reject;
    args[n] = NULL;
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cr_assert_str_empty(err, "a successful run printed: %s", err);
    free(err);
    clattn_attention_desc d = {.batch = DB, .seq_q = DT, .embed = DE, .heads = DH, .kv_heads = DHK, .head_dim_qk = DD,
                               .head_dim_v = DD, .out_dim = DE, .causal = 1, .window = window, .kv_half = half};
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .b_key = bk, .w_out = wo};
    clattn_attention_args a = {.x = x};
    double want[DB * DT * DE];
    cr_assert_eq(oracle_attention(&d, &w, &a, want, NULL), 0);
    clattn_npy out;
    load(path_in(out_dir, "out.npy"), &out);
    const size_t shape[3] = {DB, DT, DE};
    expect_shape(&out, "out.npy", 3, shape);
    char msg[256];
    size_t bad_n = oracle_compare(out.data, want, DB * DT * DE, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad_n, 0, "%s W=%zu half=%d decode-from %s page-size %s draft %s reject %s: %zu elements differ; "
                 "first: %s", dev, window, half, decode_from ? decode_from : "-", page ? page : "-", draft ? draft : "-",
                 reject ? reject : "-", bad_n, msg);
    clattn_npy_free(&out);
}

Test(cli, gqa_window_half_decode)
{
    const char *cl = cl_spec();
    decode_check(cl, 5, 1, NULL, NULL, NULL, NULL);
    decode_check(cl, 5, 1, "6", NULL, NULL, NULL);
    decode_check(cl, 0, 0, "1", NULL, NULL, NULL);
    decode_check(cl, 0, 0, NULL, NULL, NULL, NULL);
    decode_check(cl, 3, 0, "19", NULL, NULL, NULL);
    decode_check("ref", 5, 1, "6", NULL, NULL, NULL);
    /* --kv-type: bfloat16 on both paths, int8 (clattn 0.8; decode plans only) through the decode plan, against the
     * oracle's own rounding and quantisation */
    decode_check(cl, 5, 2, NULL, NULL, NULL, NULL);
    decode_check(cl, 5, 3, "6", NULL, NULL, NULL);
    decode_check(cl, 0, 3, "1", NULL, NULL, NULL);
    decode_check("ref", 3, 3, "6", NULL, NULL, NULL);
    /* --page-size (clattn 0.8): a paged cache, pages of 4 (the prefill and the steps cross them) and of 1 */
    decode_check(cl, 5, 1, "6", "4", NULL, NULL);
    decode_check(cl, 0, 3, "1", "1", NULL, NULL);
    decode_check("ref", 3, 0, "6", "4", NULL, NULL);
    /* --draft, --reject (clattn 0.8): verify steps of 4 and of 3 tokens, the last 1 or 2 of each rolled back and run
     * again (19 tokens: the last step shorter than a draft), on a contiguous and a paged cache, a window, int8 */
    decode_check(cl, 0, 0, "6", NULL, "4", NULL);
    decode_check(cl, 5, 1, "6", "4", "4", "1");
    decode_check(cl, 0, 3, "1", "4", "3", "2");
    decode_check("ref", 3, 0, "2", NULL, "4", "3");
}

/* -v after a decode session says what the cache was: pages of --page-size and how many the session ended with
 * (2 sequences of 19 tokens: 5 pages of 4 each), or contiguous */
Test(cli, decode_report)
{
    float x[DB * DT * DE], wq[DH * DD * DE], wk[DHK * DD * DE], wv[DHK * DD * DE], bk[DHK * DD], wo[DE * DH * DD];
    decode_inputs(x, wq, wk, wv, bk, wo);
    for (int paged = 0; paged < 2; paged++) {
        const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--device", "ref", "--heads", "4",
                              "--kv-heads", "2", "--causal", "--decode-from", "6", "-v",
                              paged ? "--page-size" : NULL, "4", NULL};
        char *err;
        cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "%s", err);
        cr_assert(strstr(err, "decode: prefill of 6 tokens, then 13 decode steps"), "stderr: %s", err);
        cr_assert(strstr(err, paged ? "paged KV cache: pages of 4 positions, 10 in use at the end"
                                    : "contiguous KV cache"), "stderr: %s", err);
        free(err);
    }
    /* a verify session: 13 tokens after the prefill in steps of 4, five keeping 2 and the last (3 tokens, which reach
     * the end) all (without the rollback: 4 steps); the rolled-back pages go back to the pool (5 pages a sequence at
     * the end) */
    const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--device", "ref", "--heads", "4", "--kv-heads", "2",
                          "--causal", "--decode-from", "6", "--draft", "4", "--reject", "2", "--page-size", "4", "-v",
                          NULL};
    char *err;
    cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "%s", err);
    cr_assert(strstr(err, "decode: prefill of 6 tokens, then 6 verify steps of up to 4 tokens (the last 2 of each "
                          "rolled back and run again"), "stderr: %s", err);
    cr_assert(strstr(err, "paged KV cache: pages of 4 positions, 10 in use at the end"), "stderr: %s", err);
    free(err);
}

Test(cli, bad_decode_flags)
{
    float x[DB * DT * DE], wq[DH * DD * DE], wk[DHK * DD * DE], wv[DHK * DD * DE], bk[DHK * DD], wo[DE * DH * DD];
    decode_inputs(x, wq, wk, wv, bk, wo);
    bad("kv-heads not dividing heads", 2, "--kv-heads 3", FLAGS("--heads", "4", "--kv-heads", "3"));
    bad("kv-heads above heads", 2, "--kv-heads 8", FLAGS("--heads", "4", "--kv-heads", "8"));
    bad("kv-heads 0", 2, "--kv-heads", FLAGS("--heads", "4", "--kv-heads", "0"));
    bad("kv-type unknown", 2, "--kv-type 'int4': must be float, half, bf16 or int8",
        FLAGS("--heads", "4", "--kv-type", "int4"));
    bad("kv-half and kv-type", 2, "--kv-half and --kv-type: give one of them",
        FLAGS("--heads", "4", "--kv-half", "--kv-type", "half"));
    bad("page size not a power of two", 2, "--page-size '6': must be a power of two",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3", "--page-size", "6"));
    bad("page size past 65536", 2, "--page-size '131072'",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3", "--page-size", "131072"));
    bad("page size without decode-from", 2, "--page-size without --decode-from",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--page-size", "4"));
    bad("int8 without decode-from", 1, "(CLATTN_KV_INT8) is for decode plans",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--kv-type", "int8"));
    bad("window without causal", 2, "--window", FLAGS("--heads", "4", "--kv-heads", "2", "--window", "3"));
    bad("window 0", 2, "--window", FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--window", "0"));
    bad("decode without causal", 2, "--decode-from", FLAGS("--heads", "4", "--kv-heads", "2", "--decode-from", "3"));
    bad("decode-from 0", 2, "--decode-from", FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "0"));
    bad("decode-from past T", 2, "--decode-from 20",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "20"));
    bad("draft without decode-from", 2, "--draft without --decode-from",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--draft", "4"));
    bad("draft 0", 2, "--draft '0': must be a whole number from 1 to 16",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3", "--draft", "0"));
    bad("draft 17", 2, "--draft '17'",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3", "--draft", "17"));
    bad("reject without draft", 2, "--reject without --draft",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3", "--reject", "1"));
    bad("reject the whole draft", 2, "--reject 4 with --draft 4",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3", "--draft", "4", "--reject", "4"));
    bad("decode with weights", 2, "--need-weights",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3", "--need-weights"));
    bad("decode with dropout", 2, "--dropout",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3", "--dropout", "0.1"));
    bad("wrong w_key rows for kv-heads", 1, "w_key.npy", FLAGS("--heads", "4", "--causal"));
    const size_t ks[2] = {DT, DT};
    float m[DT * DT] = {0};
    save_f32(path_in(in_dir, "attn_mask.npy"), m, 2, ks);
    bad("decode with a mask", 2, "attn_mask.npy",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3"));
    remove(path_in(in_dir, "attn_mask.npy"));
    const size_t kvs[3] = {DB, 7, DE};
    save_f32(path_in(in_dir, "kv.npy"), x, 3, kvs);
    bad("decode with kv.npy", 2, "--decode-from", FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "3"));
    bad("window with kv.npy", 2, "--window", FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--window", "3"));
}

/* A long first run is not silent: the notice before kernels are compiled, once; none when they load from
 * the kernel cache, none with CLATTN_BUILD_NOTICE=0 (and none when stderr is not a terminal, which the
 * other tests here rely on). */
Test(cli, build_notice)
{
    copy_case("mha_basic");
    char cache[160];
    snprintf(cache, sizeof cache, "%s/kernels", root);
    setenv("CLATTN_CACHE_DIR", cache, 1);
    setenv("CLATTN_BUILD_NOTICE", "1", 1);
    unsetenv("CLATTN_PROGRAM_CACHE"); /* the cache on, whatever the environment (the sanitizer stage turns it off) */
    const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--heads", "2", "--device", cl_spec(), NULL};
    char *err;
    int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strncmp(err, "clattn: compiling OpenCL kernels for ", 37) == 0, "no notice first: [%s]", err);
    cr_assert(strstr(err, "later runs load them from the kernel cache"), "%s", err);
    cr_assert(strchr(err, '\n') == err + strlen(err) - 1, "the notice is not one line: [%s]", err);
    free(err);
    rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_empty(err, "the second run compiled again or printed: [%s]", err);
    free(err);
    snprintf(cache, sizeof cache, "%s/kernels2", root);
    setenv("CLATTN_CACHE_DIR", cache, 1);
    setenv("CLATTN_BUILD_NOTICE", "0", 1);
    rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_empty(err, "CLATTN_BUILD_NOTICE=0 printed: [%s]", err);
    free(err);
}

/* ---------------------------------------------------------------- options */

/* --opt=value works as --opt value, everywhere (the values may hold '=': --device=name=...). */
Test(cli, options_take_equals_values)
{
    copy_case("mha_basic");
    char in_eq[200], out_eq[200];
    snprintf(in_eq, sizeof in_eq, "--in=%s", in_dir);
    snprintf(out_eq, sizeof out_eq, "--out=%s", out_dir);
    char *err;
    int rc = run_cli(FLAGS("run", in_eq, out_eq, "--heads=3", "--device=ref"), ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    free(err);
    cr_assert_eq(access(path_in(out_dir, "out.npy"), R_OK), 0);
    rc = run_cli(FLAGS("cores", "--device=ref", "--json"), ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "%s", err);
    free(err);
    rc = run_cli(FLAGS("cores", "--device=name=NoSuchDeviceAnywhere"), ENV_UNSET, &err);
    cr_assert_eq(rc, 1, "%s", err);
    cr_assert(strstr(err, "NoSuchDeviceAnywhere"), "the value after the first '=' is the spec: %s", err);
    free(err);
    rc = run_cli(FLAGS("run", in_eq, out_eq, "--heads="), ENV_UNSET, &err);  /* an empty value */
    cr_assert_eq(rc, 2, "%s", err);
    free(err);
}

/* A missing value is named as missing (exit 2), in every subcommand. */
Test(cli, missing_values_are_named)
{
    const char *const cases[][6] = {
        {"run", "--in", "x", "--out", "y", "--heads"}, {"encoder", "--in", NULL}, {"tune", "--budget", NULL},
        {"cores", "--device", NULL},                    {"demo", "--plot", NULL},  {"demo", "--device", "--plot"},
        {"tune", "--clblast", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[8] = {0};
        for (int k = 0; k < 6 && cases[i][k]; k++) args[k] = cases[i][k];
        char *err;
        const int rc = run_cli(args, ENV_UNSET, &err);
        cr_assert_eq(rc, 2, "%s: exit %d: %s", cases[i][0], rc, err);
        cr_assert(strstr(err, "needs a value"), "%s: %s", cases[i][0], err);
        free(err);
    }
}

/* tune's --clblast takes auto, always or never (exit 2 and the flag named otherwise). */
Test(cli, tune_clblast_values)
{
    const char *const bad_values[] = {"sometimes", "1", ""};
    for (size_t i = 0; i < sizeof bad_values / sizeof bad_values[0]; i++) {
        char *err;
        const int rc = run_cli(FLAGS("tune", "--clblast", bad_values[i]), ENV_UNSET, &err);
        cr_assert_eq(rc, 2, "--clblast '%s': exit %d: %s", bad_values[i], rc, err);
        cr_assert(strstr(err, "--clblast"), "%s", err);
        free(err);
    }
}

/* Every subcommand's --help lists every option its parser takes (exit 0, on stdout). */
Test(cli, help_lists_every_option)
{
    static const struct { const char *cmd; const char *flags[24]; } subs[] = {
        {"run", {"--in", "--out", "--device", "--heads", "--scale", "--dropout", "--seed", "--algorithm", "--kv-heads",
                 "--window", "--decode-from", "--kv-half", "--kv-type", "--causal", "--need-weights", "--verbose",
                 "--precision", "--page-size", "--rope", "--rope-dims", "--rope-theta", "--rope-scaling",
                 NULL}},
        {"encoder", {"--in", "--out", "--device", "--heads", "--causal", "--norm-first", "--activation", "--eps",
                     "--algorithm", NULL}},
        {"tune", {"--device", "--budget", "--shapes", "--margin", "--clblast", NULL}},
        {"cores", {"--device", "--json", NULL}},
        {"demo", {"--device", "--plot", NULL}},
        {"devices", {NULL}},
        {"emit", {"--out", "--target", "--device", "--core", "--batch", "--seq", "--seq-kv", "--heads", "--kv-heads",
                  "--head-dim-qk", "--head-dim-v", "--dim", "--causal", "--window", "--dropout", "--training", "--tf32",
                  "--dtype", "--need-weights", "--algorithm", "--decode", "--no-weights", NULL}},
    };
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        for (int form = 0; form < 2; form++) {  /* clattn CMD --help, clattn help CMD */
            char *err;
            const int rc = form ? run_cli(FLAGS("help", subs[i].cmd), ENV_UNSET, &err)
                                : run_cli(FLAGS(subs[i].cmd, "--help"), ENV_UNSET, &err);
            cr_assert_eq(rc, 0, "%s --help: exit %d: %s", subs[i].cmd, rc, err);
            free(err);
            size_t n;
            char *out = (char *)read_all(stdout_path, &n);
            cr_assert(strstr(out, subs[i].cmd), "%s --help does not name the command: %s", subs[i].cmd, out);
            for (int k = 0; subs[i].flags[k]; k++)
                cr_assert(strstr(out, subs[i].flags[k]), "%s --help does not list %s:\n%s", subs[i].cmd,
                          subs[i].flags[k], out);
            free(out);
        }
    }
}

/* demo --plot makes a missing directory (the weights land there before the pictures are drawn) */
Test(cli, demo_plot_makes_its_directory, .timeout = 120)
{
    const char *dir = path_in(root, "plots/new");
    /* no Python: the drawing fails, after the directory and the weights are there */
    tu_child_env env = tu_env_with("CLATTN_PYTHON", "/nonexistent/python");
    const char *argv[] = {CLATTN_CLI_PATH, "demo", "--device", "ref", "--plot", dir, NULL};
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1), dup2(fd, 2);
        execve(CLATTN_CLI_PATH, (char *const *)argv, env.vars);
        _exit(127);
    }
    tu_env_free(&env);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "exit %d", WEXITSTATUS(status));
    struct stat sb;
    cr_assert(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode), "demo --plot did not make %s", dir);
    cr_assert(stat(path_in(dir, "sa_v1.npy"), &sb) == 0, "no weights in %s", dir);
}

/* --backward and --lse: PyTorch autograd's fixture (tests/golden/backward/mha_causal_kpm, made by
 * make_golden_backward.py) through the command, on ref and on OpenCL: every grad_NAME.npy for the inputs given,
 * in their shapes, and lse.npy (B, H, Tq); grad_out.npy without --backward, and --backward without it, refused. */
Test(cli, backward_and_lse, .timeout = 120)
{
    const char *fixture = CLATTN_GOLDEN_DIR "/../backward/mha_causal_kpm";
    static const char *inputs[] = {"x", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out",
                                   "b_out", "key_padding_mask", "grad_out"};
    char name[64];
    for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++) {
        snprintf(name, sizeof name, "%s.npy", inputs[i]);
        copy_file(path_in(fixture, name), path_in(in_dir, name));
    }
    const char *devs[2] = {"ref", cl_spec()};
    for (int k = 0; k < 2; k++) {
        const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--heads", "3", "--causal", "--backward",
                              "--lse", "--device", devs[k], NULL};
        char *err;
        const int rc = run_cli(args, ENV_UNSET, &err);
        cr_assert_eq(rc, 0, "%s: exit %d: %s", devs[k], rc, err);
        free(err);
        for (size_t i = 0; i < 9; i++) { /* the differentiable inputs */
            snprintf(name, sizeof name, "grad_%s.npy", inputs[i]);
            clattn_npy got, want;
            load(path_in(out_dir, name), &got);
            load(path_in(fixture, name), &want);
            cr_assert_eq(got.ndim, want.ndim, "%s %s", devs[k], name);
            for (int d = 0; d < got.ndim; d++) cr_assert_eq(got.shape[d], want.shape[d], "%s %s", devs[k], name);
            char msg[256];
            const size_t bad_n = tu_compare(got.data, want.data, want.count, 1e-4, 1e-3, msg, sizeof msg);
            cr_assert_eq(bad_n, 0, "%s %s vs PyTorch: %s", devs[k], name, msg);
            clattn_npy_free(&got), clattn_npy_free(&want);
        }
        clattn_npy lse;
        load(path_in(out_dir, "lse.npy"), &lse);
        cr_assert(lse.ndim == 3 && lse.shape[0] == 2 && lse.shape[1] == 3 && lse.shape[2] == 7, "lse.npy's shape");
        clattn_npy_free(&lse);
    }
    rm_rf(out_dir);
    cr_assert_eq(mkdir(out_dir, 0700), 0);
    bad("--backward with --decode-from", 2, "--decode-from", FLAGS("--heads", "3", "--causal", "--backward",
                                                                     "--decode-from", "2"));
    bad("grad_out.npy without --backward", 2, "grad_out.npy", FLAGS("--heads", "3", "--causal"));
    remove(path_in(in_dir, "grad_out.npy"));
    bad("--backward without grad_out.npy", 1, "grad_out.npy", FLAGS("--heads", "3", "--causal", "--backward"));
}

/* clattn emit: the programs of a plan into an empty or missing directory, or nothing at all */
Test(cli, emit_writes_programs_or_nothing, .timeout = 300)
{
    const char *spec = tu_opencl_spec();
    char *err;
    int rc = run_cli(FLAGS("emit", "--device", spec), ENV_UNSET, &err);
    cr_assert_eq(rc, 2, "no --out: exit %d: %s", rc, err);
    cr_assert(strstr(err, "--out"), "%s", err);
    free(err);
    const char *fresh = path_in(root, "emit/new");
    rc = run_cli(FLAGS("emit", "--out", fresh, "--device", spec, "--target", "sm_99"), ENV_UNSET, &err);
    cr_assert_eq(rc, 2, "--target sm_99: exit %d: %s", rc, err);
    cr_assert(strstr(err, "sm_90"), "%s", err);
    free(err);
    rc = run_cli(FLAGS("emit", "--out", fresh, "--device", "ref"), ENV_UNSET, &err);
    cr_assert_eq(rc, 1, "ref: exit %d: %s", rc, err);
    free(err);
    rc = run_cli(FLAGS("emit", "--out", fresh, "--device", spec, "--heads", "2", "--head-dim-qk", "4", "--seq", "9",
                       "--need-weights", "--algorithm", "fused"), ENV_UNSET, &err);
    cr_assert_eq(rc, 1, "a refused plan: exit %d: %s", rc, err);
    cr_assert(strstr(err, "weights"), "the refusal is said: %s", err);
    free(err);
    struct stat st;
    cr_assert_neq(stat(path_in(root, "emit"), &st), 0, "a failed emit left its directory");

    rc = run_cli(FLAGS("emit", "--out", fresh, "--device", spec, "--heads", "2", "--head-dim-qk", "4", "--seq", "9",
                       "--causal"), ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "emit: exit %d: %s", rc, err);
    free(err);
    size_t n;
    char *out = (char *)read_all(stdout_path, &n);
    cr_assert(strstr(out, "programs for target host"), "%s", out);
    free(out);
    char *index = (char *)read_all(path_in(fresh, "index.txt"), &n);
    int lines = 0;
    for (char *c = index; *c; c++) lines += *c == '\n';
    cr_assert_geq(lines, 2, "index.txt: %s", index);
    char stem[128];
    cr_assert_eq(sscanf(index, "%127[^.].cl:", stem), 1, "%s", index);
    char file[160];
    snprintf(file, sizeof file, "%s.opts", stem);
    cr_assert_eq(stat(path_in(fresh, file), &st), 0, "no %s", file);
    free(index);
    /* an existing directory that is not empty is refused */
    rc = run_cli(FLAGS("emit", "--out", fresh, "--device", spec), ENV_UNSET, &err);
    cr_assert_eq(rc, 2, "non-empty --out: exit %d: %s", rc, err);
    cr_assert(strstr(err, "not empty"), "%s", err);
    free(err);
    /* --dtype: a half plan of the core alone builds its fused core for the type (IO_DTYPE); another word refused */
    const char *typed = path_in(root, "emit/typed");
    rc = run_cli(FLAGS("emit", "--out", typed, "--device", spec, "--dtype", "f8"), ENV_UNSET, &err);
    cr_assert_eq(rc, 2, "--dtype f8: exit %d: %s", rc, err);
    cr_assert(strstr(err, "f32, f16 or bf16"), "%s", err);
    free(err);
    rc = run_cli(FLAGS("emit", "--out", typed, "--device", spec, "--heads", "2", "--head-dim-qk", "8", "--seq", "9",
                       "--no-weights", "--dtype", "bf16", "--algorithm", "fused"), ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "emit --dtype bf16: exit %d: %s", rc, err);
    free(err);
    index = (char *)read_all(path_in(typed, "index.txt"), &n);
    int io = 0;
    for (char *line = strtok(index, "\n"); line; line = strtok(NULL, "\n")) {
        if (sscanf(line, "%127[^.].cl:", stem) != 1) continue;
        snprintf(file, sizeof file, "%s.opts", stem);
        char *opts = (char *)read_all(path_in(typed, file), &n);
        io += strstr(opts, "-DIO_DTYPE=2") != NULL;
        free(opts);
    }
    free(index);
    cr_assert_eq(io, 1, "one program (the fused core's) reads bfloat16 itself, -DIO_DTYPE=2: %d", io);
}

/* --dtype f16 / bf16: the plan in that type; float32 inputs rounded to it, or the type's own .npy ('<f2', '<u2' bit
 * patterns) taken as they are; out.npy and attn.npy (and with --backward the gradients) written in it, and exactly the
 * --dtype f32 run's numbers on the rounded inputs, rounded once (the same fp32 computation); what a half plan cannot
 * do refused */
static void run_ok(const char *const *extra, const char *dev, const char *out)
{
    const char *args[40];
    int n = 0;
    args[n++] = "run", args[n++] = "--in", args[n++] = in_dir, args[n++] = "--out", args[n++] = out;
    args[n++] = "--device", args[n++] = dev;
    for (; extra && *extra; extra++) args[n++] = *extra;
    args[n] = NULL;
    char *err;
    const int rc = run_cli(args, ENV_UNSET, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    free(err);
}

Test(cli, dtype_half_runs)
{
    enum { B = 2, T = 9, E = 8 };
    tu_rng r = {4242};
    float x[B * T * E], w[4][E * E], xr[B * T * E], wr[4][E * E];
    tu_fill(&r, x, B * T * E, -2, 2);
    for (int k = 0; k < 4; k++) tu_fill(&r, w[k], E * E, -0.5f, 0.5f);
    const char *wn[4] = {"w_query.npy", "w_key.npy", "w_value.npy", "w_out.npy"};
    const size_t xs[3] = {B, T, E}, ws[2] = {E, E};
    const char *devs[2] = {"ref", cl_spec()};
    for (int t = 1; t <= 2; t++) {
        const clattn_dtype ty = (clattn_dtype)t;
        const char *name = t == 1 ? "f16" : "bf16";
        for (size_t i = 0; i < B * T * E; i++) xr[i] = (float)tu_dtype_round(x[i], ty);
        for (int k = 0; k < 4; k++)
            for (size_t i = 0; i < E * E; i++) wr[k][i] = (float)tu_dtype_round(w[k][i], ty);
        for (int dv = 0; dv < 2; dv++) {
            char out32[160], outh[160];
            snprintf(out32, sizeof out32, "%s/o32", root), snprintf(outh, sizeof outh, "%s/oh", root);
            /* the reference: --dtype f32 on the rounded values */
            save_f32(path_in(in_dir, "x.npy"), xr, 3, xs);
            for (int k = 0; k < 4; k++) save_f32(path_in(in_dir, wn[k]), wr[k], 2, ws);
            run_ok(FLAGS("--heads", "2", "--causal", "--need-weights"), devs[dv], out32);
            /* the half run: x in the type's own .npy, the weights as float32 (rounded by the CLI) */
            uint16_t xh[B * T * E];
            for (size_t i = 0; i < B * T * E; i++) xh[i] = tu_dtype_bits(xr[i], ty);
            write_npy_raw(path_in(in_dir, "x.npy"), t == 1 ? "<f2" : "<u2", "False", "(2, 9, 8)", xh, sizeof xh);
            for (int k = 0; k < 4; k++) save_f32(path_in(in_dir, wn[k]), w[k], 2, ws);
            run_ok(FLAGS("--heads", "2", "--causal", "--need-weights", "--dtype", name), devs[dv], outh);
            const char *files[2] = {"out.npy", "attn.npy"};
            for (int f = 0; f < 2; f++) {
                clattn_npy a32, ah;
                load(path_in(out32, files[f]), &a32);
                load(path_in(outh, files[f]), &ah);
                cr_assert_eq(ah.dtype, t == 1 ? CLATTN_NPY_F16 : CLATTN_NPY_U16, "%s %s: written as %d", name, files[f],
                             (int)ah.dtype);
                cr_assert_eq(ah.count, a32.count);
                for (size_t i = 0; i < ah.count; i++) {
                    const float want = (float)tu_dtype_round(((const float *)a32.data)[i], ty);
                    const float got = tu_dtype_value(((const uint16_t *)ah.data)[i], ty);
                    cr_assert_eq(got, want, "%s on %s, %s[%zu]: %g, want %g", name, devs[dv], files[f], i,
                                 (double)got, (double)want);
                }
                clattn_npy_free(&a32), clattn_npy_free(&ah);
            }
            rm_rf(out32), rm_rf(outh);
            /* --backward --lse: a half training plan; grad_out.npy float32 (rounded by the CLI) against the f32 run
             * on the rounded values, the gradients written in the type and the f32 run's rounded once, lse float32
             * and the same */
            float go[B * T * E], gor[B * T * E];
            tu_fill(&r, go, B * T * E, -1, 1);
            for (size_t i = 0; i < B * T * E; i++) gor[i] = (float)tu_dtype_round(go[i], ty);
            save_f32(path_in(in_dir, "x.npy"), xr, 3, xs);
            for (int k = 0; k < 4; k++) save_f32(path_in(in_dir, wn[k]), wr[k], 2, ws);
            save_f32(path_in(in_dir, "grad_out.npy"), gor, 3, xs);
            run_ok(FLAGS("--heads", "2", "--causal", "--backward", "--lse"), devs[dv], out32);
            for (int k = 0; k < 4; k++) save_f32(path_in(in_dir, wn[k]), w[k], 2, ws);
            save_f32(path_in(in_dir, "grad_out.npy"), go, 3, xs);
            run_ok(FLAGS("--heads", "2", "--causal", "--backward", "--lse", "--dtype", name), devs[dv], outh);
            const char *gfiles[7] = {"out.npy", "grad_x.npy", "grad_w_query.npy", "grad_w_key.npy",
                                     "grad_w_value.npy", "grad_w_out.npy", "lse.npy"};
            for (int f = 0; f < 7; f++) {
                clattn_npy a32, ah;
                load(path_in(out32, gfiles[f]), &a32);
                load(path_in(outh, gfiles[f]), &ah);
                const int typed = f < 6;
                cr_assert_eq(ah.dtype, !typed ? CLATTN_NPY_F32 : t == 1 ? CLATTN_NPY_F16 : CLATTN_NPY_U16,
                             "%s %s: written as %d", name, gfiles[f], (int)ah.dtype);
                cr_assert_eq(ah.count, a32.count);
                for (size_t i = 0; i < ah.count; i++) {
                    const float v32 = ((const float *)a32.data)[i];
                    const float want = typed ? (float)tu_dtype_round(v32, ty) : v32;
                    const float got = typed ? tu_dtype_value(((const uint16_t *)ah.data)[i], ty)
                                            : ((const float *)ah.data)[i];
                    cr_assert(got == want || (isnan(got) && isnan(want)), "%s --backward on %s, %s[%zu]: %g, want %g",
                              name, devs[dv], gfiles[f], i, (double)got, (double)want);
                }
                clattn_npy_free(&a32), clattn_npy_free(&ah);
            }
            remove(path_in(in_dir, "grad_out.npy"));
            rm_rf(out32), rm_rf(outh);
        }
    }
    /* refusals: a 16-bit x without --dtype, or of the other type; what a half plan does not do */
    uint16_t xh[B * T * E] = {0};
    write_npy_raw(path_in(in_dir, "x.npy"), "<f2", "False", "(2, 9, 8)", xh, sizeof xh);
    bad("float16 x without --dtype", 1, "needs --dtype f16 or bf16", FLAGS("--heads", "2"));
    bad("float16 x with bf16", 1, "or uint16 (--dtype bf16)", FLAGS("--heads", "2", "--dtype", "bf16"));
    save_f32(path_in(in_dir, "x.npy"), x, 3, xs);
    bad("bad dtype", 2, "--dtype 'f64'", FLAGS("--heads", "2", "--dtype", "f64"));
    bad("half decode", 2, "decode steps are fp32",
        FLAGS("--heads", "2", "--causal", "--dtype", "bf16", "--decode-from", "3"));
}

/* --seqlens (clattn 0.8): the decode inputs' 38 rows as a packed batch of sequences of 7, 0, 12 and 19 rows (x.npy
 * (38, 16)), causal with a window and GQA, on the OpenCL device and ref: out.npy (38, 16), each sequence's rows the
 * oracle's for it alone. Then what the flags refuse. */
Test(cli, varlen_batch)
{
    float x[DB * DT * DE], wq[DH * DD * DE], wk[DHK * DD * DE], wv[DHK * DD * DE], bk[DHK * DD], wo[DE * DH * DD];
    decode_inputs(x, wq, wk, wv, bk, wo);
    const size_t lens[4] = {7, 0, 12, 19}, total = DB * DT, xs[2] = {total, DE};
    save_f32(path_in(in_dir, "x.npy"), x, 2, xs);
    double want[DB * DT * DE];
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .b_key = bk, .w_out = wo};
    for (size_t b = 0, r0 = 0; b < 4; r0 += lens[b++]) {
        if (!lens[b]) continue;
        clattn_attention_desc d = {.batch = 1, .seq_q = lens[b], .embed = DE, .heads = DH, .kv_heads = DHK,
                                   .head_dim_qk = DD, .head_dim_v = DD, .out_dim = DE, .causal = 1, .window = 5};
        clattn_attention_args a = {.x = x + r0 * DE};
        cr_assert_eq(oracle_attention(&d, &w, &a, want + r0 * DE, NULL), 0);
    }
    const char *devs[2] = {cl_spec(), "ref"};
    /* the plan, then decode sessions of packed steps: a prefill of each sequence's first 5 tokens (at most its length)
     * and decode steps; a prefill of 9 and verify steps of 3 with the last of each rejected, on a paged cache */
    static const char *const session[3][7] = {{NULL}, {"--decode-from", "5", NULL},
                                               {"--decode-from", "9", "--draft", "3", "--reject", "1", NULL}};
    for (int k = 0; k < 6; k++) {
        const char *args[32] = {"run", "--in", in_dir, "--out", out_dir, "--device", devs[k % 2], "--heads", "4",
                                "--kv-heads", "2", "--causal", "--window", "5", "--seqlens", "7,0,12,19", "-v"};
        size_t na = 17;
        for (size_t i = 0; session[k / 2][i]; i++) args[na++] = session[k / 2][i];
        if (k / 2 == 2) args[na++] = "--page-size", args[na++] = "4";
        char *err;
        cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "%s: %s", devs[k % 2], err);
        if (k / 2 == 0)
            cr_assert(strstr(err, "variable-length batch: 4 sequences of up to 19 rows (38 in all)"), "stderr: %s",
                      err);
        else
            cr_assert(strstr(err, k / 2 == 1 ? "then 14 decode steps" : "then 5 verify steps"), "stderr: %s", err);
        free(err);
        clattn_npy out;
        load(path_in(out_dir, "out.npy"), &out);
        expect_shape(&out, "out.npy", 2, xs);
        char msg[256];
        const size_t bad_n = oracle_compare(out.data, want, total * DE, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad_n, 0, "%s --seqlens (session %d): %zu elements differ; first: %s", devs[k % 2], k / 2, bad_n,
                     msg);
        clattn_npy_free(&out);
        remove(path_in(out_dir, "out.npy"));
    }
    /* dropout: each sequence's weights kept as the padded batch's entry b's (the oracle keys sequence b by b) */
    for (size_t b = 0, r0 = 0; b < 4; r0 += lens[b++]) {
        if (!lens[b]) continue;
        clattn_attention_desc d = {.batch = 1, .seq_q = lens[b], .embed = DE, .heads = DH, .kv_heads = DHK,
                                   .head_dim_qk = DD, .head_dim_v = DD, .out_dim = DE, .causal = 1, .window = 5,
                                   .dropout = 0.3f, .seed = 11};
        clattn_attention_args a = {.x = x + r0 * DE};
        oracle_batch0 = b;
        cr_assert_eq(oracle_attention(&d, &w, &a, want + r0 * DE, NULL), 0);
        oracle_batch0 = 0;
    }
    for (int k = 0; k < 2; k++) {
        const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--device", devs[k], "--heads", "4",
                              "--kv-heads", "2", "--causal", "--window", "5", "--seqlens", "7,0,12,19", "--dropout",
                              "0.3", "--seed", "11", NULL};
        char *err;
        cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "%s: %s", devs[k], err);
        free(err);
        clattn_npy out;
        load(path_in(out_dir, "out.npy"), &out);
        char msg[256];
        const size_t bad_n = oracle_compare(out.data, want, total * DE, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad_n, 0, "%s --seqlens --dropout: %zu elements differ; first: %s", devs[k], bad_n, msg);
        clattn_npy_free(&out);
        remove(path_in(out_dir, "out.npy"));
    }
    bad("seqlens not adding up", 1, "add up to 37 rows but x.npy has 38", FLAGS("--heads", "4", "--kv-heads", "2", "--seqlens", "7,11,19"));
    bad("seqlens malformed", 2, "--seqlens '7,,19'", FLAGS("--heads", "4", "--kv-heads", "2", "--seqlens", "7,,19"));
    bad("decode-from past the longest sequence", 2, "--decode-from 20: must be from 1 to T = 19 (the tokens of the "
        "longest sequence)", FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--seqlens", "7,0,12,19",
                                   "--decode-from", "20"));
    bad("seqlens with lse", 2, "--seqlens with --lse", FLAGS("--heads", "4", "--kv-heads", "2", "--seqlens", "38", "--lse"));
    bad("kv-seqlens without kv.npy", 2, "--kv-seqlens without kv.npy",
        FLAGS("--heads", "4", "--kv-heads", "2", "--seqlens", "38", "--kv-seqlens", "5"));
    bad("kv-seqlens alone", 2, "--kv-seqlens without --seqlens", FLAGS("--heads", "4", "--kv-heads", "2", "--kv-seqlens", "38"));
    const size_t x3[3] = {2, 19, 16};
    save_f32(path_in(in_dir, "x.npy"), x, 3, x3);
    bad("seqlens with 3-D x", 1, "x.npy is 3-D", FLAGS("--heads", "4", "--kv-heads", "2", "--seqlens", "19,19"));
}

/* --rope, --rope-dims, --rope-theta, --rope-scaling: a padded batch and a varlen one (each sequence's positions from
 * 0) on both devices, as one plan and as a decode session, against the oracle; the flags' usage errors */
/* clattn run with `args` succeeds, and its out.npy (n values) matches the float64 `want`; out.npy removed after */
static void run_matches(const char *const *args, const double *want, size_t n, const char *what)
{
    char *err;
    cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "%s: %s", what, err);
    free(err);
    clattn_npy out;
    load(path_in(out_dir, "out.npy"), &out);
    char msg[256];
    const size_t bad_n = oracle_compare(out.data, want, n, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad_n, 0, "%s: %zu elements differ; first: %s", what, bad_n, msg);
    clattn_npy_free(&out);
    remove(path_in(out_dir, "out.npy"));
}

Test(cli, rope)
{
    float x[DB * DT * DE], wq[DH * DD * DE], wk[DHK * DD * DE], wv[DHK * DD * DE], bk[DHK * DD], wo[DE * DH * DD];
    decode_inputs(x, wq, wk, wv, bk, wo);
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .b_key = bk, .w_out = wo};
    const clattn_rope rope = {.kind = CLATTN_ROPE_INTERLEAVED, .dims = 2, .theta = 500.0,
                              .scaling = CLATTN_ROPE_SCALING_YARN, .factor = 4.0, .original_max_position = 8};
    const char *devs[2] = {cl_spec(), "ref"};
    double want[DB * DT * DE];
    for (int varlen = 0; varlen < 2; varlen++) {
        const size_t lens[4] = {7, 0, 12, 19}, total = DB * DT, xs[2] = {total, DE};
        if (varlen) {
            save_f32(path_in(in_dir, "x.npy"), x, 2, xs);
            for (size_t b = 0, r0 = 0; b < 4; r0 += lens[b++]) {
                if (!lens[b]) continue;
                clattn_attention_desc d = {.batch = 1, .seq_q = lens[b], .embed = DE, .heads = DH, .kv_heads = DHK,
                                           .head_dim_qk = DD, .head_dim_v = DD, .out_dim = DE, .causal = 1,
                                           .rope = rope};
                clattn_attention_args a = {.x = x + r0 * DE};
                cr_assert_eq(oracle_attention(&d, &w, &a, want + r0 * DE, NULL), 0);
            }
        } else {
            clattn_attention_desc d = {.batch = DB, .seq_q = DT, .embed = DE, .heads = DH, .kv_heads = DHK,
                                       .head_dim_qk = DD, .head_dim_v = DD, .out_dim = DE, .causal = 1, .rope = rope};
            clattn_attention_args a = {.x = x};
            cr_assert_eq(oracle_attention(&d, &w, &a, want, NULL), 0);
        }
        for (int k = 0; k < 4; k++) { /* each device, as one prefill plan and as a decode session (--decode-from 5) */
            const char *args[32] = {"run", "--in", in_dir, "--out", out_dir, "--device", devs[k % 2], "--heads", "4",
                                    "--kv-heads", "2", "--causal", "--rope", "interleaved", "--rope-dims", "2",
                                    "--rope-theta", "500", "--rope-scaling", "yarn:4:8"};
            size_t na = 20;
            if (varlen) args[na++] = "--seqlens", args[na++] = "7,0,12,19";
            if (k >= 2) args[na++] = "--decode-from", args[na++] = "5";
            char what[96];
            snprintf(what, sizeof what, "%s --rope (varlen %d, decode %d)", devs[k % 2], varlen, k >= 2);
            run_matches(args, want, DB * DT * DE, what);
        }
    }
    bad("rope kind", 2, "--rope 'neox'", FLAGS("--heads", "4", "--kv-heads", "2", "--rope", "neox"));
    bad("rope dims odd", 2, "--rope-dims '3'", FLAGS("--heads", "4", "--kv-heads", "2", "--rope", "half",
                                                     "--rope-dims", "3"));
    bad("rope theta", 2, "--rope-theta '1'", FLAGS("--heads", "4", "--kv-heads", "2", "--rope", "half",
                                                   "--rope-theta", "1"));
    bad("rope scaling", 2, "--rope-scaling 'yarn:4'", FLAGS("--heads", "4", "--kv-heads", "2", "--rope", "half",
                                                            "--rope-scaling", "yarn:4"));
    bad("rope scaling kind", 2, "--rope-scaling 'dynamic:2'", FLAGS("--heads", "4", "--kv-heads", "2", "--rope",
                                                                    "half", "--rope-scaling", "dynamic:2"));
    bad("rope dims without rope", 2, "--rope-dims without --rope", FLAGS("--heads", "4", "--kv-heads", "2",
                                                                         "--rope-dims", "2"));
    /* the library's refusal, one line: rotary dims past the head size */
    bad("rope dims past the head", 1, "rope.dims (8) exceeds head_dim_qk (4)",
        FLAGS("--heads", "4", "--kv-heads", "2", "--rope", "half", "--rope-dims", "8"));
}

/* sinks.npy (clattn 0.8): attention sinks, one logit per query head (one head without: -inf), against the float64
 * oracle on both devices, as a batch and packed (--seqlens); a sinks.npy of the wrong shape refused; a decode session
 * refused by the library, one line. */
Test(cli, sinks)
{
    float x[DB * DT * DE], wq[DH * DD * DE], wk[DHK * DD * DE], wv[DHK * DD * DE], bk[DHK * DD], wo[DE * DH * DD];
    decode_inputs(x, wq, wk, wv, bk, wo);
    const float sinks[DH] = {-INFINITY, 0.5f, 2.5f, -1.0f};
    const size_t hs[1] = {DH}, three[1] = {3};
    save_f32(path_in(in_dir, "sinks.npy"), sinks, 1, hs);
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .b_key = bk, .w_out = wo, .sinks = sinks};
    const char *devs[2] = {cl_spec(), "ref"};
    double want[DB * DT * DE];
    for (int varlen = 0; varlen < 2; varlen++) {
        const size_t lens[4] = {7, 0, 12, 19}, xs[3] = {DB, DT, DE}, packed[2] = {DB * DT, DE};
        save_f32(path_in(in_dir, "x.npy"), x, varlen ? 2 : 3, varlen ? packed : xs);
        for (size_t b = 0, r0 = 0; b < (varlen ? 4u : 1u); r0 += varlen ? lens[b] : 0, b++) {
            if (varlen && !lens[b]) continue;
            clattn_attention_desc d = {.batch = varlen ? 1 : DB, .seq_q = varlen ? lens[b] : DT, .embed = DE,
                                       .heads = DH, .kv_heads = DHK, .head_dim_qk = DD, .head_dim_v = DD,
                                       .out_dim = DE, .causal = 1, .sinks = 1};
            clattn_attention_args a = {.x = x + r0 * DE};
            cr_assert_eq(oracle_attention(&d, &w, &a, want + r0 * DE, NULL), 0);
        }
        for (int k = 0; k < 2; k++) {
            const char *args[32] = {"run", "--in", in_dir, "--out", out_dir, "--device", devs[k], "--heads", "4",
                                    "--kv-heads", "2", "--causal"};
            size_t na = 12;
            if (varlen) args[na++] = "--seqlens", args[na++] = "7,0,12,19";
            char what[64];
            snprintf(what, sizeof what, "%s sinks.npy (varlen %d)", devs[k], varlen);
            run_matches(args, want, DB * DT * DE, what);
        }
    }
    const size_t xs[3] = {DB, DT, DE};
    save_f32(path_in(in_dir, "x.npy"), x, 3, xs);
    bad("sinks decode", 1, "a decode plan has no attention sinks",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--decode-from", "5"));
    save_f32(path_in(in_dir, "sinks.npy"), sinks, 1, three);
    bad("sinks shape", 1, "sinks.npy: shape (3,) but expected (4,) (H), one sink logit per query head",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal"));
}

/* position_ids.npy (clattn 0.8): each row at the position it gives, int64 (np.arange's) and int32, as a batch
 * (B, T) and as a packed --seqlens batch (total,), forward (one plan, and a --decode-from session: single steps, and
 * verify steps with rollbacks) and --backward, against the float64 oracle at the same
 * positions (two documents packed in entry 0, entry 1 in the thousands up to the largest position); cross-attention's
 * keys at key_position_ids.npy; each refusal, nothing written. */
Test(cli, rope_positions)
{
    float x[DB * DT * DE], wq[DH * DD * DE], wk[DHK * DD * DE], wv[DHK * DD * DE], bk[DHK * DD], wo[DE * DH * DD];
    decode_inputs(x, wq, wk, wv, bk, wo);
    clattn_attention_weights w = {.w_query = wq, .w_key = wk, .w_value = wv, .b_key = bk, .w_out = wo};
    const clattn_rope rope = {.kind = CLATTN_ROPE_HALF, .dims = 4, .theta = 500.0};
    uint32_t pos[DB * DT];
    int64_t p64[DB * DT];
    int32_t p32[DB * DT];
    for (size_t t = 0; t < DT; t++) {
        pos[t] = t < 8 ? (uint32_t)t : (uint32_t)(t - 8);          /* two documents, each from 0 */
        pos[DT + t] = CLATTN_ROPE_MAX_POSITION - (uint32_t)(DT - 1 - t) * 517u; /* thousands, up to the largest */
    }
    for (size_t i = 0; i < DB * DT; i++) p64[i] = pos[i], p32[i] = (int32_t)pos[i];
    const size_t xs[3] = {DB, DT, DE};
    save_f32(path_in(in_dir, "x.npy"), x, 3, xs);
    const struct { const char *name; const size_t *shape; size_t n; } wf[] = {
        {"w_query.npy", (const size_t[]){DH * DD, DE}, 2}, {"w_key.npy", (const size_t[]){DHK * DD, DE}, 2},
        {"w_value.npy", (const size_t[]){DHK * DD, DE}, 2}, {"b_key.npy", (const size_t[]){DHK * DD}, 1},
        {"w_out.npy", (const size_t[]){DE, DH * DD}, 2}};
    const float *wd[] = {wq, wk, wv, bk, wo};
    for (int i = 0; i < 5; i++) save_f32(path_in(in_dir, wf[i].name), wd[i], (int)wf[i].n, wf[i].shape);
    double want[DB * DT * DE];
    clattn_attention_desc d = {.batch = DB, .seq_q = DT, .embed = DE, .heads = DH, .kv_heads = DHK,
                               .head_dim_qk = DD, .head_dim_v = DD, .out_dim = DE, .causal = 1, .rope = rope};
    clattn_attention_args a = {.x = x, .rope_positions = pos, .rope_positions_count = DB * DT};
    cr_assert_eq(oracle_attention(&d, &w, &a, want, NULL), 0);
    const char *devs[2] = {cl_spec(), "ref"};
    char shape2[32], shape1[32];
    snprintf(shape2, sizeof shape2, "(%d, %d)", DB, DT);
    snprintf(shape1, sizeof shape1, "(%d,)", DB * DT);
    for (int k = 0; k < 8; k++) { /* each device; int64 (B, T), then int32 as a packed batch of the two rows; each as
                                   * one plan, then as a decode session (verify steps with rollbacks when packed) */
        const int packed = k / 2 % 2, decode = k >= 4;
        if (packed) {
            const size_t xp[2] = {DB * DT, DE};
            save_f32(path_in(in_dir, "x.npy"), x, 2, xp);
            write_npy_raw(path_in(in_dir, "position_ids.npy"), "<i4", "False", shape1, p32, sizeof p32);
        } else {
            save_f32(path_in(in_dir, "x.npy"), x, 3, xs);
            write_npy_raw(path_in(in_dir, "position_ids.npy"), "<i8", "False", shape2, p64, sizeof p64);
        }
        char seqlens[32];
        snprintf(seqlens, sizeof seqlens, "%d,%d", DT, DT);
        const char *args[32] = {"run", "--in", in_dir, "--out", out_dir, "--device", devs[k % 2], "--heads", "4",
                                "--kv-heads", "2", "--causal", "--rope", "half", "--rope-dims", "4", "--rope-theta",
                                "500"};
        size_t na = 18;
        if (packed) args[na++] = "--seqlens", args[na++] = seqlens;
        if (decode) args[na++] = "--decode-from", args[na++] = "5";
        if (decode && packed) args[na++] = "--draft", args[na++] = "3", args[na++] = "--reject", args[na++] = "1";
        char what[96];
        snprintf(what, sizeof what, "%s position_ids.npy (packed %d, decode %d)", devs[k % 2], packed, decode);
        run_matches(args, want, DB * DT * DE, what);
    }
    /* --backward at the positions: grad_x against the oracle's (the positions reach the backward too) */
    save_f32(path_in(in_dir, "x.npy"), x, 3, xs);
    write_npy_raw(path_in(in_dir, "position_ids.npy"), "<i8", "False", shape2, p64, sizeof p64);
    float gout[DB * DT * DE];
    tu_rng r = {77};
    for (size_t i = 0; i < DB * DT * DE; i++) gout[i] = tu_uniform(&r, -1, 1);
    save_f32(path_in(in_dir, "grad_out.npy"), gout, 3, xs);
    double *gx = calloc(DB * DT * DE, sizeof *gx);
    oracle_grads og = {.x = gx};
    cr_assert_eq(oracle_attention_backward(&d, &w, &a, gout, &og), 0);
    {
        const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--device", cl_spec(), "--heads", "4",
                              "--kv-heads", "2", "--causal", "--rope", "half", "--rope-dims", "4", "--rope-theta",
                              "500", "--backward", NULL};
        char *err;
        cr_assert_eq(run_cli(args, ENV_UNSET, &err), 0, "--backward: %s", err);
        free(err);
        clattn_npy g;
        load(path_in(out_dir, "grad_x.npy"), &g);
        char msg[256];
        const size_t bad_n = oracle_compare(g.data, gx, DB * DT * DE, TU_ATOL, 1e-3, msg, sizeof msg);
        cr_assert_eq(bad_n, 0, "--backward at position_ids.npy: %zu elements of grad_x differ; first: %s", bad_n, msg);
        clattn_npy_free(&g);
    }
    free(gx);
    remove(path_in(in_dir, "grad_out.npy"));
    for (const char *const *o = (const char *const[]){"out.npy", "grad_x.npy", "grad_w_query.npy", "grad_w_key.npy",
                                                      "grad_w_value.npy", "grad_b_key.npy", "grad_w_out.npy", NULL};
         *o; o++)
        remove(path_in(out_dir, *o));
    rmdir(out_dir);
    /* the refusals, nothing written */
    const char *const *rp = FLAGS("--heads", "4", "--kv-heads", "2", "--causal", "--rope", "half");
    bad("positions without rope", 2, "position_ids.npy is in --in, but --rope is not given",
        FLAGS("--heads", "4", "--kv-heads", "2", "--causal"));
    write_npy_raw(path_in(in_dir, "key_position_ids.npy"), "<i8", "False", shape2, p64, sizeof p64);
    bad("key positions on self-attention", 2, "key_position_ids.npy without kv.npy", rp);
    remove(path_in(in_dir, "position_ids.npy"));
    bad("key positions alone", 2, "key_position_ids.npy without position_ids.npy", rp);
    remove(path_in(in_dir, "key_position_ids.npy"));
    write_npy_raw(path_in(in_dir, "position_ids.npy"), "<i8", "False", shape1, p64, sizeof p64);
    bad("positions shape", 1, "position_ids.npy: shape (38,) but expected (2, 19) (B, Tq)", rp);
    p64[5] = -1;
    write_npy_raw(path_in(in_dir, "position_ids.npy"), "<i8", "False", shape2, p64, sizeof p64);
    bad("negative position", 1, "position_ids.npy: position -1 at flat index 5; clattn takes 0 .. 4194303", rp);
    p64[5] = (int64_t)CLATTN_ROPE_MAX_POSITION + 1;
    write_npy_raw(path_in(in_dir, "position_ids.npy"), "<i8", "False", shape2, p64, sizeof p64);
    bad("position past the largest", 1, "position 4194304 at flat index 5", rp);
    write_npy_raw(path_in(in_dir, "position_ids.npy"), "<f4", "False", shape2, x, DB * DT * sizeof(float));
    bad("float positions", 1, "position_ids.npy: dtype float32 but expected int32 or int64", rp);
    write_npy_raw(path_in(in_dir, "key_padding_mask.npy"), "<i4", "False", shape2, p32, sizeof p32);
    remove(path_in(in_dir, "position_ids.npy"));
    bad("integer mask", 1, "key_padding_mask.npy: dtype int32 but expected bool or uint8", rp);
    remove(path_in(in_dir, "key_padding_mask.npy"));
    /* cross-attention: kv.npy's rows at key_position_ids.npy */
    float kv[DB * 11 * DE];
    for (size_t i = 0; i < DB * 11 * DE; i++) kv[i] = tu_uniform(&r, -1, 1);
    const size_t kvs[3] = {DB, 11, DE};
    save_f32(path_in(in_dir, "kv.npy"), kv, 3, kvs);
    uint32_t kpos[DB * 11];
    int64_t k64[DB * 11];
    for (size_t i = 0; i < DB * 11; i++) kpos[i] = (uint32_t)(i * 389 % 5003), k64[i] = kpos[i];
    for (size_t i = 0; i < DB * DT; i++) p64[i] = pos[i];
    write_npy_raw(path_in(in_dir, "position_ids.npy"), "<i8", "False", shape2, p64, sizeof p64);
    bad("cross without key positions", 2, "position_ids.npy with kv.npy needs key_position_ids.npy", rp);
    char kshape[32];
    snprintf(kshape, sizeof kshape, "(%d, 11)", DB);
    write_npy_raw(path_in(in_dir, "key_position_ids.npy"), "<i8", "False", kshape, k64, sizeof k64);
    clattn_attention_desc dc = d;
    dc.cross = 1, dc.seq_kv = 11, dc.kv_embed = DE, dc.causal = 0;
    clattn_attention_args ac = {.x = x, .kv = kv, .rope_positions = pos, .rope_positions_count = DB * DT,
                                .rope_positions_kv = kpos, .rope_positions_kv_count = DB * 11};
    cr_assert_eq(oracle_attention(&dc, &w, &ac, want, NULL), 0);
    const char *args[] = {"run", "--in", in_dir, "--out", out_dir, "--device", cl_spec(), "--heads", "4",
                          "--kv-heads", "2", "--rope", "half", "--rope-dims", "4", "--rope-theta", "500", NULL};
    run_matches(args, want, DB * DT * DE, "cross at key_position_ids.npy");
}
