/* testutil.c: random data, tolerant comparison, devices and golden cases for the tests. */
#include "testutil.h"
#include "decode/decode.h"
#include "encoder/encoder.h"
#include "oracle.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t tu_next(tu_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float tu_uniform(tu_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((tu_next(r) >> 40) * (1.0 / 16777216.0));
}

void tu_fill(tu_rng *r, float *a, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) a[i] = tu_uniform(r, lo, hi);
}

float *tu_random(tu_rng *r, size_t n, float lo, float hi)
{
    float *a = malloc((n ? n : 1) * sizeof *a);
    if (a) tu_fill(r, a, n, lo, hi);
    return a;
}

float *tu_poisoned(size_t n)
{
    float *a = malloc((n ? n : 1) * sizeof *a);
    if (a)
        for (size_t i = 0; i < n; i++) a[i] = NAN;
    return a;
}

size_t tu_compare(const float *got, const float *ref, size_t n, double atol, double rtol, char *msg, size_t len)
{
    size_t bad = 0;
    if (len) msg[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (!oracle_close(g, r, atol, rtol, 0, 1)) { /* a NaN expectation never matches */
            if (bad == 0 && len)
                snprintf(msg, len, "element %zu: got %.9g, expected %.9g (|diff| %.3g > %.3g)%s", i, g, r,
                         fabs(g - r), atol + rtol * fabs(r), isnan(r) ? " [the expectation itself is NaN]" : "");
            bad++;
        }
    }
    return bad;
}


clattn_device *tu_open_opencl(void)
{
    const char *spec = getenv("CLATTN_TEST_DEVICE");
    if (!spec || !*spec) spec = "opencl";
    clattn_device *dev = NULL;
    clattn_status st = clattn_device_open(spec, &dev);
    if (st != CLATTN_STATUS_SUCCESS)
        cr_assert_fail("cannot open the OpenCL test device \"%s\": %s (%s)", spec, clattn_status_string(st),
                       clattn_last_error());
    if (clattn_device_backend(dev) != CLATTN_BACKEND_OPENCL) {
        clattn_device_free(dev);
        /* a test that claims OpenCL would compare ref with ref: say so instead of passing */
        cr_skip_test("CLATTN_TEST_DEVICE=%s is not an OpenCL device; this test needs one", spec);
    }
    for (int kind = CLATTN_CORE_PREFILL; kind <= CLATTN_CORE_BACKWARD; kind++) {
        const clattn_core_info *forced = tu_forced_core_of((clattn_core_kind)kind);
        for (size_t i = 0; forced && i < clattn_core_count(); i++) {
            clattn_core_info c;
            if (clattn_core_describe(dev, i, &c) == CLATTN_STATUS_SUCCESS && strcmp(c.name, forced->name) == 0 &&
                !c.supported && !c.emulated) {
                clattn_device_free(dev);
                cr_skip_test("core %s is not supported by the test device: %s", c.name, c.reason);
            }
        }
    }
    return dev;
}

int tu_auto_core(clattn_device *dev, clattn_core_kind kind, unsigned cls, clattn_core_info *info)
{
    for (size_t i = 0; i < clattn_core_count(); i++) {
        cr_assert_eq(clattn_core_describe(dev, i, info), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
        if (info->kind == kind && (info->default_for & 1u << cls)) return 1;
    }
    return 0;
}

int tu_refused_by_device(const clattn_device *dev, clattn_status st, const char *what)
{
    if (st != CLATTN_STATUS_TOO_LARGE_FOR_DEVICE && st != CLATTN_STATUS_UNSUPPORTED) return 0;
    char why[1024]; /* a copy: tu_forced_core_of's calls below replace the library's last error */
    snprintf(why, sizeof why, "%s", clattn_last_error());
    char lim[48];
    snprintf(lim, sizeof lim, "loops after %zu ", dev->caps.loop_limit);
    const int loops = dev->caps.loop_limit && strstr(why, lim) && strstr(why, "without an error");
    const int group = st == CLATTN_STATUS_UNSUPPORTED && strstr(why, "work-items per work-group)") &&
                      tu_forced_core_of(CLATTN_CORE_DECODE);
    if (!loops && !group) return 0;
    cr_log_info("%s: refused by the device, as it must be: %s", what, why);
    return 1;
}

size_t tu_loop_limit(const clattn_device *dev) { return dev->caps.loop_limit; }

int tu_profiling_refused(const clattn_device *dev, clattn_status st, const char *what)
{
    if (st != CLATTN_STATUS_UNSUPPORTED || dev->caps.profiling_ok || !strstr(clattn_last_error(), "not real")) return 0;
    cr_log_info("%s: profiling refused by the device, as it must be: %s", what, clattn_last_error());
    return 1;
}

const clattn_core_info *tu_forced_core_of(clattn_core_kind kind)
{
    static clattn_core_info info[CLATTN_CORE_BACKWARD + 1];
    const char *v = getenv("CLATTN_CORE");
    if (!v || !*v) return NULL;
    for (const char *spec = v; *spec; spec += strcspn(spec, ";"), spec += *spec == ';') {
        const size_t n = strcspn(spec, ":;");
        size_t i = 0;
        clattn_core_info c;
        for (; i < clattn_core_count(); i++)
            if (clattn_core_describe(NULL, i, &c) == CLATTN_STATUS_SUCCESS && strlen(c.name) == n &&
                strncmp(c.name, spec, n) == 0)
                break;
        if (i == clattn_core_count()) cr_assert_fail("CLATTN_CORE=%s names no registered core", v);
        if (c.kind == kind) {
            info[kind] = c;
            return &info[kind];
        }
    }
    return NULL;
}

const clattn_core_info *tu_forced_core(void) { return tu_forced_core_of(CLATTN_CORE_PREFILL); }

int tu_core_applies(clattn_algorithm alg, int need_weights)
{
    const clattn_core_info *c = tu_forced_core();
    if (!c) return 1;
    if (c->kind != CLATTN_CORE_PREFILL || (need_weights && !c->produces_weights)) return 0;
    return alg == CLATTN_ALGORITHM_AUTO || alg == c->algorithm;
}

const char *tu_opencl_spec(void)
{
    static char spec[256];
    const char *s = getenv("CLATTN_TEST_DEVICE");
    snprintf(spec, sizeof spec, "%s", s && *s ? s : "opencl");
    clattn_device_free(tu_open_opencl()); /* fails or skips the test as tu_open_opencl does */
    return spec;
}

clattn_device *tu_open_ref(void)
{
    clattn_device *dev = NULL;
    clattn_status st = clattn_device_open("ref", &dev);
    if (st != CLATTN_STATUS_SUCCESS)
        cr_assert_fail("cannot open the ref device: %s (%s)", clattn_status_string(st), clattn_last_error());
    return dev;
}

/* ---- golden cases */

static int load_opt(const char *dir, const char *file, clattn_npy *a, int *present, char *msg, size_t len)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (!f) {
        *present = 0;
        return 0;
    }
    fclose(f);
    *present = 1;
    if (clattn_npy_load(path, a, err, sizeof err) != 0) {
        snprintf(msg, len, "%s: %s", path, err);
        return -1;
    }
    return 0;
}

int tu_case_load(const char *name, tu_case *c, char *msg, size_t len)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    char dir[768];
    if (name[0] == '/')
        snprintf(dir, sizeof dir, "%s", name); /* a case directory elsewhere (tests/golden/backward) */
    else
        snprintf(dir, sizeof dir, "%s/%s", CLATTN_GOLDEN_DIR, name);
    int has_x, has_kv, has_wq, has_wk, has_wv, has_bq, has_bk, has_bv, has_wo, has_bo, has_kpm, has_mask, has_eo,
        has_ea;
    if (load_opt(dir, "x.npy", &c->x, &has_x, msg, len) || load_opt(dir, "kv.npy", &c->kv, &has_kv, msg, len) ||
        load_opt(dir, "w_query.npy", &c->wq, &has_wq, msg, len) ||
        load_opt(dir, "w_key.npy", &c->wk, &has_wk, msg, len) ||
        load_opt(dir, "w_value.npy", &c->wv, &has_wv, msg, len) ||
        load_opt(dir, "b_query.npy", &c->bq, &has_bq, msg, len) ||
        load_opt(dir, "b_key.npy", &c->bk, &has_bk, msg, len) ||
        load_opt(dir, "b_value.npy", &c->bv, &has_bv, msg, len) ||
        load_opt(dir, "w_out.npy", &c->wo, &has_wo, msg, len) ||
        load_opt(dir, "b_out.npy", &c->bo, &has_bo, msg, len) ||
        load_opt(dir, "key_padding_mask.npy", &c->kpm, &has_kpm, msg, len) ||
        load_opt(dir, "attn_mask.npy", &c->mask, &has_mask, msg, len) ||
        load_opt(dir, "expect_out.npy", &c->expect_out, &has_eo, msg, len) ||
        load_opt(dir, "expect_attn.npy", &c->expect_attn, &has_ea, msg, len))
        return -1;
    if (!has_x || !has_eo || !has_ea || c->x.ndim != 3) {
        snprintf(msg, len, "%s: needs x.npy (3-D), expect_out.npy and expect_attn.npy", dir);
        return -1;
    }
    /* meta.txt: heads, causal, scale, dk, dv */
    char path[1024], line[256];
    snprintf(path, sizeof path, "%s/meta.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(msg, len, "%s: missing", path);
        return -1;
    }
    clattn_attention_desc *d = &c->desc;
    while (fgets(line, sizeof line, f)) {
        char key[64], word[16];
        double v;
        if (line[0] != '#' && sscanf(line, "%63s %15s", key, word) == 2 && strcmp(key, "dtype") == 0) {
            if (strcmp(word, "f16") == 0) c->dtype = CLATTN_DTYPE_F16;
            else if (strcmp(word, "bf16") == 0) c->dtype = CLATTN_DTYPE_BF16;
            else {
                snprintf(msg, len, "%s: dtype %s is not f16 or bf16", path, word);
                fclose(f);
                return -1;
            }
            continue;
        }
        if (line[0] == '#' || sscanf(line, "%63s %lf", key, &v) != 2) continue;
        if (strcmp(key, "heads") == 0) d->heads = (size_t)v;
        else if (strcmp(key, "causal") == 0) d->causal = v != 0;
        else if (strcmp(key, "scale") == 0) d->scale = (float)v;
        else if (strcmp(key, "dk") == 0) d->head_dim_qk = (size_t)v;
        else if (strcmp(key, "dv") == 0) d->head_dim_v = (size_t)v;
    }
    fclose(f);
    d->batch = c->x.shape[0];
    d->seq_q = c->x.shape[1];
    d->embed = c->x.shape[2];
    if (has_kv) {
        d->cross = 1;
        d->seq_kv = c->kv.shape[1];
        d->kv_embed = c->kv.shape[2];
    }
    d->layout = CLATTN_LAYOUT_LINEAR;
    if (!has_wq) d->head_dim_qk = d->head_dim_v = 0; /* derived from embed/heads */
    if (has_wo) d->out_dim = c->wo.shape[0];
    d->key_padding_mask = has_kpm;
    if (has_mask) d->attn_mask = c->mask.dtype == CLATTN_NPY_F32 ? CLATTN_MASK_FLOAT : CLATTN_MASK_BOOL;
    /* every array's shape against the case's dimensions: a fixture that does not match its meta.txt
     * must fail loudly, not be read past its end */
    const size_t B = d->batch, Tq = d->seq_q, E = d->embed, H = d->heads;
    const size_t Tk = has_kv ? d->seq_kv : Tq, Ekv = has_kv ? d->kv_embed : E;
    const size_t dk = has_wq ? d->head_dim_qk : (H ? E / H : 0), dv = has_wq && d->head_dim_v ? d->head_dim_v : dk;
    struct {
        int present;
        const clattn_npy *a;
        const char *file;
        int ndim;
        size_t s0, s1;
        clattn_npy_dtype dtype;
    } want[] = {
        {has_kv, &c->kv, "kv.npy", 3, B, Tk, CLATTN_NPY_F32},
        {has_wq, &c->wq, "w_query.npy", 2, H * dk, E, CLATTN_NPY_F32},
        {has_wk, &c->wk, "w_key.npy", 2, H * dk, Ekv, CLATTN_NPY_F32},
        {has_wv, &c->wv, "w_value.npy", 2, H * dv, Ekv, CLATTN_NPY_F32},
        {has_bq, &c->bq, "b_query.npy", 1, H * dk, 0, CLATTN_NPY_F32},
        {has_bk, &c->bk, "b_key.npy", 1, H * dk, 0, CLATTN_NPY_F32},
        {has_bv, &c->bv, "b_value.npy", 1, H * dv, 0, CLATTN_NPY_F32},
        {has_wo, &c->wo, "w_out.npy", 2, c->expect_out.shape[2], H * dv, CLATTN_NPY_F32},
        {has_bo, &c->bo, "b_out.npy", 1, d->out_dim, 0, CLATTN_NPY_F32},
        {has_kpm, &c->kpm, "key_padding_mask.npy", 2, B, Tk, CLATTN_NPY_BOOL},
        {has_mask, &c->mask, "attn_mask.npy", 2, Tq, Tk, c->mask.dtype == CLATTN_NPY_F32 ? CLATTN_NPY_F32 : CLATTN_NPY_BOOL},
        {1, &c->expect_out, "expect_out.npy", 3, B, Tq, CLATTN_NPY_F32},
        {1, &c->expect_attn, "expect_attn.npy", 4, B, H, CLATTN_NPY_F32},
    };
    if (H == 0 || (has_wq && dk == 0)) {
        snprintf(msg, len, "%s: meta.txt needs heads (and dk with weights)", dir);
        return -1;
    }
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const clattn_npy *a = want[k].a;
        if (!want[k].present) continue;
        if (a->ndim != want[k].ndim || a->shape[0] != want[k].s0 || (want[k].ndim > 1 && a->shape[1] != want[k].s1) ||
            a->dtype != want[k].dtype) {
            snprintf(msg, len, "%s/%s: shape or dtype does not match the case (B=%zu Tq=%zu Tk=%zu E=%zu H=%zu dk=%zu "
                     "dv=%zu)", dir, want[k].file, B, Tq, Tk, E, H, dk, dv);
            return -1;
        }
    }
    if (c->expect_attn.shape[2] != Tq || c->expect_attn.shape[3] != Tk) {
        snprintf(msg, len, "%s/expect_attn.npy: not (B, H, Tq, Tk)", dir);
        return -1;
    }
    clattn_attention_weights *w = &c->weights;
    w->w_query = has_wq ? c->wq.data : NULL;
    w->w_key = has_wk ? c->wk.data : NULL;
    w->w_value = has_wv ? c->wv.data : NULL;
    w->b_query = has_bq ? c->bq.data : NULL;
    w->b_key = has_bk ? c->bk.data : NULL;
    w->b_value = has_bv ? c->bv.data : NULL;
    w->w_out = has_wo ? c->wo.data : NULL;
    w->b_out = has_bo ? c->bo.data : NULL;
    c->args.x = c->x.data;
    c->args.kv = has_kv ? c->kv.data : NULL;
    c->args.key_padding_mask = has_kpm ? c->kpm.data : NULL;
    c->args.attn_mask = has_mask ? c->mask.data : NULL;
    c->out_count = c->expect_out.count;
    c->attn_count = c->expect_attn.count;
    return 0;
}

void tu_case_free(tu_case *c)
{
    clattn_npy *all[] = {&c->x, &c->kv, &c->wq, &c->wk, &c->wv, &c->bq, &c->bk, &c->bv,
                         &c->wo, &c->bo, &c->kpm, &c->mask, &c->expect_out, &c->expect_attn};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) clattn_npy_free(all[i]);
}

static int cmp_names(const void *a, const void *b) { return strcmp(a, b); }

size_t tu_case_names(char names[][128], size_t cap)
{
    DIR *dir = opendir(CLATTN_GOLDEN_DIR);
    if (!dir) return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < cap) {
        if (e->d_name[0] == '.') continue;
        snprintf(names[n++], 128, "%.127s", e->d_name);
    }
    closedir(dir);
    qsort(names, n, 128, cmp_names);
    return n;
}

/* ---- the element counts a careful caller gives (clattn 0.4) */

static void fill(size_t *count, const void *p, size_t want)
{
    if (p && *count == 0) *count = want;
}

void tu_count_weights(clattn_attention_weights *w, const clattn_attention_desc *d)
{
    const size_t H = d->heads, HK = d->kv_heads ? d->kv_heads : H, E = d->embed;
    const size_t Ekv = d->cross && d->kv_embed ? d->kv_embed : E;
    const size_t dk = d->head_dim_qk ? d->head_dim_qk : H ? E / H : 0, dv = d->head_dim_v ? d->head_dim_v : dk;
    fill(&w->w_query_count, w->w_query, H * dk * E);
    fill(&w->w_key_count, w->w_key, HK * dk * Ekv);
    fill(&w->w_value_count, w->w_value, HK * dv * Ekv);
    fill(&w->b_query_count, w->b_query, H * dk);
    fill(&w->b_key_count, w->b_key, HK * dk);
    fill(&w->b_value_count, w->b_value, HK * dv);
    fill(&w->w_out_count, w->w_out, d->out_dim * H * dv);
    fill(&w->b_out_count, w->b_out, d->out_dim);
    fill(&w->sinks_count, w->sinks, H);
}

clattn_status tu_plan_create(clattn_device *dev, const clattn_attention_desc *d, const clattn_attention_weights *w,
                             clattn_plan **plan)
{
    if (!d || !w) return clattn_plan_create(dev, d, w, plan);
    clattn_attention_weights c = *w;
    tu_count_weights(&c, d);
    return clattn_plan_create(dev, d, &c, plan);
}

clattn_status tu_plan_execute(clattn_plan *plan, const clattn_attention_args *a)
{
    if (!plan || !a) return clattn_plan_execute(plan, a);
    clattn_attention_args c = *a;
    tu_count_args(plan, &c);
    return clattn_plan_execute(plan, &c);
}

void tu_count_args(const clattn_plan *plan, clattn_attention_args *a)
{
    clattn_attention_desc d;
    if (clattn_plan_desc(plan, &d) != CLATTN_STATUS_SUCCESS) return;
    clattn_attention_args c = *a;
    const size_t B = d.batch, Tq = d.seq_q, Tk = d.seq_kv;
    fill(&c.x_count, c.x, B * Tq * d.embed);
    fill(&c.kv_count, c.kv, B * Tk * d.kv_embed);
    fill(&c.key_padding_mask_count, c.key_padding_mask, B * Tk);
    fill(&c.attn_mask_count, c.attn_mask,
         (d.attn_mask_per_batch ? B : 1) * (d.attn_mask_per_head ? d.heads : 1) * Tq * Tk);
    fill(&c.value_count, c.value, B * Tk * d.kv_heads * d.head_dim_v);
    fill(&c.out_count, c.out, B * Tq * clattn_plan_out_width(plan));
    fill(&c.attn_count, c.attn, B * d.heads * Tq * Tk);
    fill(&c.lse_count, c.lse, B * d.heads * Tq);
    fill(&c.context_count, c.context, B * Tq * d.heads * d.head_dim_v);
    if (!d.varlen) {
        fill(&c.rope_positions_count, c.rope_positions, B * Tq);
        fill(&c.rope_positions_kv_count, c.rope_positions_kv, B * Tk);
    }
    *a = c;
}

clattn_status tu_encoder_plan_create(clattn_device *dev, const clattn_encoder_desc *d, const clattn_encoder_weights *w,
                                     clattn_encoder_plan **plan)
{
    if (!d || !w) return clattn_encoder_plan_create(dev, d, w, plan);
    clattn_encoder_weights c = *w;
    tu_count_weights(&c.attn, &d->attn);
    const size_t E = d->attn.embed, F = d->ff_dim;
    fill(&c.ln1_weight_count, c.ln1_weight, E);
    fill(&c.ln1_bias_count, c.ln1_bias, E);
    fill(&c.w_ff1_count, c.w_ff1, F * E);
    fill(&c.b_ff1_count, c.b_ff1, F);
    fill(&c.w_ff2_count, c.w_ff2, E * F);
    fill(&c.b_ff2_count, c.b_ff2, E);
    fill(&c.ln2_weight_count, c.ln2_weight, E);
    fill(&c.ln2_bias_count, c.ln2_bias, E);
    return clattn_encoder_plan_create(dev, d, &c, plan);
}

clattn_status tu_encoder_plan_execute(clattn_encoder_plan *plan, const clattn_encoder_args *a)
{
    if (!plan || !a) return clattn_encoder_plan_execute(plan, a);
    clattn_encoder_args c = *a;
    fill(&c.x_count, c.x, plan->rows * plan->E);
    fill(&c.key_padding_mask_count, c.key_padding_mask, plan->rows);
    fill(&c.out_count, c.out, plan->rows * plan->E);
    return clattn_encoder_plan_execute(plan, &c);
}

clattn_status tu_decode_plan_create(clattn_device *dev, const clattn_attention_desc *d,
                                    const clattn_attention_weights *w, clattn_decode_plan **plan)
{
    if (!d) return clattn_decode_plan_create(dev, d, w, plan);
    clattn_attention_weights c = w ? *w : (clattn_attention_weights){0};
    if (w) tu_count_weights(&c, d);
    const clattn_status st = clattn_decode_plan_create(dev, d, w ? &c : NULL, plan); /* (no weights: NULL, as given) */
    if (tu_refused_by_device(dev, st, "decode plan"))
        cr_skip_test("the device refuses this decode plan for its own limit (printed above)");
    return st;
}

clattn_status tu_kv_cache_create(clattn_device *dev, const clattn_kv_cache_desc *d, clattn_kv_cache **cache)
{
    const clattn_status st = clattn_kv_cache_create(dev, d, cache);
    if (st != CLATTN_STATUS_SUCCESS || d->type == CLATTN_KV_INT8) return st;
    const size_t B = d->batch, T = d->capacity, HK = d->kv_heads, dk = d->head_dim_qk;
    const size_t dv = d->head_dim_v ? d->head_dim_v : dk;
    const size_t P = d->page_size;
    size_t left = P ? (d->pages ? d->pages : B * ((T + P - 1) / P)) : 0; /* the pool's pages, laid out in order */
    float *k = tu_poisoned(B * HK * T * dk), *v = tu_poisoned(B * HK * T * dv);
    size_t *full = calloc(B, sizeof *full), *none = calloc(B, sizeof *none);
    cr_assert(k && v && full && none);
    for (size_t b = 0; b < B; b++) {
        full[b] = P ? (left * P < T ? left * P : T) : T;
        if (P) left -= (full[b] + P - 1) / P;
    }
    cr_assert_eq(clattn_kv_cache_write(*cache, k, v, full), CLATTN_STATUS_SUCCESS, "poisoning the cache: %s",
                 clattn_last_error());
    cr_assert_eq(clattn_kv_cache_truncate(*cache, none), CLATTN_STATUS_SUCCESS, "%s", clattn_last_error());
    free(k), free(v), free(full), free(none);
    return st;
}

clattn_status tu_decode_execute(clattn_decode_plan *plan, clattn_kv_cache *cache, const clattn_decode_args *a)
{
    if (!plan || !a) return clattn_decode_execute(plan, cache, a);
    clattn_decode_args c = *a;
    const clattn_attention_desc *d = &plan->base->d;
    size_t n = c.new_tokens, rows = d->batch * n; /* packed (cu_new): its rows, and n 0 = the longest count */
    if (c.cu_new) {
        fill(&c.cu_new_count, c.cu_new, d->batch + 1);
        rows = c.cu_new[d->batch];
        if (!c.new_tokens)
            for (size_t b = 0; b < d->batch; b++)
                if (c.cu_new[b + 1] - c.cu_new[b] > n) n = c.cu_new[b + 1] - c.cu_new[b];
    }
    fill(&c.x_count, c.x, rows * d->embed);
    fill(&c.valid_count, c.valid, d->batch);
    fill(&c.out_count, c.out, rows * plan->base->out_width);
    fill(&c.kv_count, c.kv, rows * d->kv_heads * d->head_dim_qk);
    fill(&c.value_count, c.value, rows * d->kv_heads * d->head_dim_v);
    fill(&c.tree_mask_count, c.tree_mask, d->batch * n * n);
    fill(&c.rope_positions_count, c.rope_positions, rows);
    return clattn_decode_execute(plan, cache, &c);
}

/* ---- half precision, the tests' own (no code shared with the library's numeric.c): values rounded with double
 * arithmetic (nearbyint: the default rounding, to nearest even), encoded and decoded with frexp and ldexp */
static const double F16_UNIT = 1.0 / 1024.0, BF16_UNIT = 1.0 / 128.0; /* a significand's last place in [1, 2) */

double tu_dtype_round(double v, clattn_dtype t)
{
    if (t == CLATTN_DTYPE_F32 || v == 0.0 || !isfinite(v)) return t == CLATTN_DTYPE_F32 ? (double)(float)v : v;
    int e;
    frexp(v, &e); /* |v| in [2^(e-1), 2^e) */
    int emin = t == CLATTN_DTYPE_F16 ? -14 : -126;
    if (e - 1 < emin) e = emin + 1; /* subnormal: the smallest normal's spacing */
    const double ulp = ldexp(t == CLATTN_DTYPE_F16 ? F16_UNIT : BF16_UNIT, e - 1);
    const double r = nearbyint(v / ulp) * ulp;
    return t == CLATTN_DTYPE_F16 && fabs(r) > 65504.0 ? copysign(INFINITY, v) : r;
}

uint16_t tu_dtype_bits(float f, clattn_dtype t)
{
    if (t == CLATTN_DTYPE_BF16) {
        uint32_t u;
        memcpy(&u, &f, 4);
        return (uint16_t)(u >> 16); /* f is a bfloat16 already (rounded): its upper half */
    }
    const uint16_t sign = signbit(f) ? 0x8000u : 0;
    const double a = fabs((double)f);
    if (isnan(f)) return 0x7E00u;
    if (isinf(f)) return (uint16_t)(sign | 0x7C00u);
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)nearbyint(a * ldexp(1.0, 24)));
    int e;
    const double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)nearbyint((2.0 * m - 1.0) * 1024.0));
}

float tu_dtype_value(uint16_t h, clattn_dtype t)
{
    if (t == CLATTN_DTYPE_BF16) {
        const uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const double s = (h & 0x8000u) ? -1.0 : 1.0;
    if (e == 0x1F) return m ? NAN : (float)(s * INFINITY);
    return (float)(s * (e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25)));
}

void *tu_typed(const float *a, size_t n, clattn_dtype t)
{
    if (!a) return NULL;
    if (t == CLATTN_DTYPE_F32) {
        float *c = malloc(n * sizeof *c);
        memcpy(c, a, n * sizeof *c);
        return c;
    }
    uint16_t *h = malloc(n * sizeof *h + 1);
    for (size_t i = 0; i < n; i++) h[i] = tu_dtype_bits(a[i], t);
    return h;
}

float *tu_widened(const void *a, size_t n, clattn_dtype t)
{
    float *f = malloc(n * sizeof *f + 1);
    for (size_t i = 0; i < n; i++)
        f[i] = t == CLATTN_DTYPE_F32 ? ((const float *)a)[i] : tu_dtype_value(((const uint16_t *)a)[i], t);
    return f;
}

void *tu_poisoned_typed(size_t n, clattn_dtype t)
{
    if (t == CLATTN_DTYPE_F32) return tu_poisoned(n);
    void *h = malloc(n * 2 + 1);
    memset(h, 0xFF, n * 2); /* 0xFFFF: a NaN in half and in bfloat16 */
    return h;
}

void tu_dtype_tolerance_of(clattn_dtype t, double atol32, double rtol32, double *atol, double *rtol)
{
    /* the fp32 bound, then the output's one rounding to the type: |round(y) - y| <= u |y| (u = 2^-11 for half,
     * 2^-8 for bfloat16), plus half a subnormal step (2^-25) for half's values below 2^-14 */
    const double u = t == CLATTN_DTYPE_F16 ? ldexp(1.0, -11) : t == CLATTN_DTYPE_BF16 ? ldexp(1.0, -8) : 0.0;
    *atol = atol32 * (1.0 + u) + (t == CLATTN_DTYPE_F16 ? ldexp(1.0, -25) : 0.0);
    *rtol = rtol32 + u * (1.0 + rtol32);
}

void tu_dtype_tolerance(clattn_dtype t, double *atol, double *rtol)
{
    tu_dtype_tolerance_of(t, TU_ATOL, TU_RTOL, atol, rtol);
}

int tu_weights_typed(clattn_attention_weights *w, const clattn_attention_desc *d, clattn_dtype t, void *typed[9])
{
    int nt = 0;
    if (t == CLATTN_DTYPE_F32) return 0;
    tu_count_weights(w, d);
    const void **ws[9] = {&w->w_query, &w->w_key, &w->w_value, &w->b_query, &w->b_key, &w->b_value, &w->w_out,
                          &w->b_out, &w->sinks};
    const size_t *ns[9] = {&w->w_query_count, &w->w_key_count, &w->w_value_count, &w->b_query_count,
                           &w->b_key_count, &w->b_value_count, &w->w_out_count, &w->b_out_count, &w->sinks_count};
    for (int k = 0; k < 9; k++)
        if (*ws[k]) *ws[k] = typed[nt++] = tu_typed(*ws[k], *ns[k], t);
    return nt;
}

static float *typed_random(tu_rng *r, clattn_dtype t, size_t n, float lo, float hi)
{
    float *a = tu_random(r, n, lo, hi);
    if (t != CLATTN_DTYPE_F32)
        for (size_t i = 0; i < n; i++) a[i] = (float)tu_dtype_round(a[i], t);
    return a;
}

void tu_problem_make(tu_problem *p, const tu_attn_case *c, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    tu_rng rng = {seed};
    clattn_attention_desc *d = &p->d;
    d->batch = c->B, d->seq_q = c->Tq, d->seq_kv = c->cross ? c->Tk : 0, d->embed = c->E;
    d->kv_embed = c->cross ? c->Ekv : 0, d->heads = c->H, d->kv_heads = c->HK, d->head_dim_qk = c->dk;
    d->head_dim_v = c->dv, d->out_dim = c->Eo, d->window = c->window, d->cross = c->cross, d->causal = c->causal;
    d->key_padding_mask = c->kpm, d->attn_mask = c->mask, d->dropout = c->dropout, d->seed = seed * 31 + 7;
    d->training = c->training, d->layout = c->layout, d->kv_half = c->kv_half, d->need_weights = c->need_weights;
    d->scale = c->scale, d->dtype = c->dtype;
    d->rope = c->rope, d->sinks = c->sinks;
    d->separate_value = c->separate_value, d->attn_mask_per_batch = c->mask_pb, d->attn_mask_per_head = c->mask_ph;
    const size_t H = c->H, HK = c->HK ? c->HK : c->H, dk = c->noproj ? c->E / H : c->dk;
    const size_t dv = c->noproj ? (c->separate_value && c->dv ? c->dv : c->E / H) : c->dv;
    if (c->separate_value) d->head_dim_v = dv;
    /* without weights kv holds HK heads of dk (kv_embed 0: the plan resolves it so) */
    const size_t B = c->B, Tq = c->Tq, Tk = c->cross ? c->Tk : c->Tq, E = c->E;
    const size_t Ekv = !c->cross ? c->E : c->Ekv ? c->Ekv : c->noproj ? HK * dk : c->E;
    const float sq = 1.0f / sqrtf((float)E), skv = 1.0f / sqrtf((float)Ekv), so = 1.0f / sqrtf((float)(H * dv));
    if (!c->noproj) {
        p->w.w_query = p->bufs[p->nb++] = typed_random(&rng, c->dtype, H * dk * E, -sq, sq);
        p->w.w_key = p->bufs[p->nb++] = typed_random(&rng, c->dtype, HK * dk * Ekv, -skv, skv);
        p->w.w_value = p->bufs[p->nb++] = typed_random(&rng, c->dtype, HK * dv * Ekv, -skv, skv);
    }
    if (c->biases && !c->noproj) {
        p->w.b_query = p->bufs[p->nb++] = typed_random(&rng, c->dtype, H * dk, -0.5f, 0.5f);
        p->w.b_key = p->bufs[p->nb++] = typed_random(&rng, c->dtype, HK * dk, -0.5f, 0.5f);
        p->w.b_value = p->bufs[p->nb++] = typed_random(&rng, c->dtype, HK * dv, -0.5f, 0.5f);
    }
    if (c->Eo) {
        p->w.w_out = p->bufs[p->nb++] = typed_random(&rng, c->dtype, c->Eo * H * dv, -so, so);
        if (c->biases) p->w.b_out = p->bufs[p->nb++] = typed_random(&rng, c->dtype, c->Eo, -0.5f, 0.5f);
    }
    p->a.x = p->bufs[p->nb++] = typed_random(&rng, c->dtype, B * Tq * E, -2.0f, 2.0f);
    if (c->cross) p->a.kv = p->bufs[p->nb++] = typed_random(&rng, c->dtype, B * Tk * Ekv, -2.0f, 2.0f);
    if (c->separate_value) p->a.value = p->bufs[p->nb++] = typed_random(&rng, c->dtype, B * Tk * HK * dv, -2.0f, 2.0f);
    const size_t nm = (c->mask_pb ? B : 1) * (c->mask_ph ? H : 1) * Tq * Tk; /* the attention mask's elements */
    if (c->kpm) {
        p->kpm = calloc(B * Tk, 1);
        for (size_t i = 0; i < B * Tk; i++) p->kpm[i] = tu_next(&rng) % 4 == 0;
        if (B > 1) memset(p->kpm + (B - 1) * Tk, 1, Tk); /* a fully masked batch entry: lse -inf, context 0 */
        p->a.key_padding_mask = p->kpm;
    }
    if (c->sinks) { /* from an rng of their own (the other arrays as without them): head 0 without a sink (-inf) when
                     * there are others, the rest about the rows' log-sum-exp (a few units), so that each row keeps
                     * from a tenth to nearly all of its weight */
        tu_rng srng = {seed ^ 0x5157u};
        float *s = p->bufs[p->nb++] = typed_random(&srng, c->dtype, H, -2.0f, 4.0f);
        if (H > 1) s[0] = -INFINITY;
        p->w.sinks = s;
    }
    if (c->rope_pos) {
        p->pos_q = malloc(B * Tq * sizeof *p->pos_q);
        cr_assert(p->pos_q);
        for (size_t b = 0; b < B; b++) {
            /* left padding (its rows at 1, as transformers gives them), then documents of 11 rows packed, each from
             * position 0 (RoPE depends on the difference of positions: a shift alone would change nothing) */
            const size_t pad = 3 * b < Tq ? 3 * b : Tq - 1;
            for (size_t t = 0; t < Tq; t++)
                p->pos_q[b * Tq + t] = t < pad ? 1u : (uint32_t)((t - pad) % 11 + (b % 2 ? 517 : 0));
        }
        p->a.rope_positions = p->pos_q;
        if (c->cross) {
            p->pos_k = malloc(B * Tk * sizeof *p->pos_k);
            cr_assert(p->pos_k);
            for (size_t b = 0; b < B; b++)
                for (size_t j = 0; j < Tk; j++) p->pos_k[b * Tk + j] = (uint32_t)((7 * j + 3 * b) % 900);
            p->a.rope_positions_kv = p->pos_k;
        }
    }
    if (c->mask == CLATTN_MASK_BOOL) {
        p->bmask = calloc(nm, 1);
        for (size_t i = 0; i < nm; i++) p->bmask[i] = tu_next(&rng) % 3 == 0;
        p->a.attn_mask = p->bmask;
    } else if (c->mask == CLATTN_MASK_FLOAT) {
        float *fm = p->bufs[p->nb++] = tu_random(&rng, nm, -2.0f, 2.0f);
        for (size_t i = 0; i < nm; i++)
            if (tu_next(&rng) % 5 == 0) fm[i] = -INFINITY;
        p->a.attn_mask = fm;
    }
}

int tu_rounds_p(const clattn_plan *plan, const tu_attn_case *c)
{
    return c->dtype != CLATTN_DTYPE_F32 && c->noproj && !c->training &&
           (c->kv_half == 0 || c->kv_half == (int)c->dtype) &&
           strcmp(clattn_plan_core(plan), "flash_mma") == 0;
}

/* The rounding of P's bound per output element (README, "Precision"): the weights a (B, H, Tq, Tk, after dropout) of
 * a case without projections, its V the values as the plan got them (self: x, cross: kv, or value; HK heads of dv) */
static double *p_rounding_bound(const tu_problem *p, const tu_attn_case *c, const double *a, size_t dv)
{
    const clattn_attention_desc *d = &p->d;
    const size_t B = d->batch, Tq = d->seq_q, Tk = d->cross ? d->seq_kv : Tq, H = d->heads;
    const size_t HK = d->kv_heads ? d->kv_heads : H, G = H / HK, vld = HK * dv;
    const float *V = c->separate_value ? p->a.value : d->cross ? p->a.kv : p->a.x;
    const double u = c->dtype == CLATTN_DTYPE_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    const double sub = c->dtype == CLATTN_DTYPE_F16 ? ldexp(1.0, -25) : 0.0; /* half's subnormal weights */
    const double keep = d->dropout > 0.0f ? 1.0 / (1.0 - (double)d->dropout) : 1.0;
    double *extra = malloc(B * Tq * H * dv * sizeof *extra);
    cr_assert(extra);
    for (size_t b = 0; b < B; b++)
        for (size_t i = 0; i < Tq; i++)
            for (size_t h = 0; h < H; h++)
                for (size_t col = 0; col < dv; col++) {
                    const double *ar = a + ((b * H + h) * Tq + i) * Tk;
                    double wv = 0.0, sv = 0.0;
                    for (size_t j = 0; j < Tk; j++) {
                        const double vj = fabs((double)V[(b * Tk + j) * vld + (h / G) * dv + col]);
                        wv += fabs(ar[j]) * vj;
                        sv += vj;
                    }
                    extra[((b * Tq + i) * H + h) * dv + col] = u * wv + sub * keep * sv;
                }
    return extra;
}

/* The plan of d with w's arrays copied into type t (typed[], *nt of them, for the caller to free) on dev, running the
 * forced core where one is; NULL (the copies freed) when the device refuses it for a limit of its own
 * (tu_refused_by_device), else asserted made. `what` names the case. */
static clattn_plan *typed_plan(clattn_device *dev, const clattn_attention_desc *d, const clattn_attention_weights *pw,
                               clattn_dtype t, const clattn_core_info *forced, void *typed[12], int *nt,
                               const char *what)
{
    clattn_attention_weights w = *pw;
    *nt = tu_weights_typed(&w, d, t, typed);
    clattn_plan *plan = NULL;
    const clattn_status st = tu_plan_create(dev, d, &w, &plan);
    if (tu_refused_by_device(dev, st, what)) {
        for (int k = 0; k < *nt; k++) free(typed[k]);
        *nt = 0;
        return NULL;
    }
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: plan: %s: %s\n%s", what, clattn_status_string(st), clattn_last_error(),
                 clattn_last_build_log());
    if (forced) cr_assert_str_eq(clattn_plan_core(plan), forced->name);
    return plan;
}

void tu_attention_check(clattn_device *dev, const tu_attn_case *c, uint64_t seed)
{
    const clattn_core_info *forced = clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL ? tu_forced_core() : NULL;
    tu_attn_case cc = *c;
    if (forced && cc.need_weights && !forced->produces_weights) cc.need_weights = 0;
    tu_problem p;
    tu_problem_make(&p, &cc, seed);
    clattn_attention_desc d = p.d;
    d.algorithm = forced ? forced->algorithm : CLATTN_ALGORITHM_AUTO;
    const clattn_dtype t = cc.dtype;
    /* the plan's arrays in its type (the oracle reads p's floats, the same values) */
    const size_t B = d.batch, Tq = d.seq_q, Tk = d.cross ? d.seq_kv : Tq, H = d.heads;
    const size_t HK = d.kv_heads ? d.kv_heads : H;
    void *typed[12] = {0};
    int nt;
    char what[48];
    snprintf(what, sizeof what, "case %llu", (unsigned long long)seed);
    clattn_plan *plan = typed_plan(dev, &d, &p.w, t, forced, typed, &nt, what);
    if (!plan) {
        tu_problem_free(&p);
        return;
    }
    clattn_status st;
    const size_t dv = cc.noproj && !cc.separate_value ? d.embed / H : d.head_dim_v, ow = clattn_plan_out_width(plan);
    const size_t n_out = B * Tq * ow, n_attn = B * H * Tq * Tk, n_lse = B * H * Tq, n_ctx = B * Tq * H * dv;
    void *out = tu_poisoned_typed(n_out, t), *attn = tu_poisoned_typed(n_attn, t);
    float *lse = tu_poisoned(n_lse), *ctx = tu_poisoned(n_ctx);
    double *o64 = malloc(n_out * sizeof *o64), *a64 = malloc(n_attn * sizeof *a64), *l64 = malloc(n_lse * sizeof *l64),
           *c64 = malloc(n_ctx * sizeof *c64);
    cr_assert(o64 && a64 && l64 && c64);
    cr_assert_eq(oracle_attention_stats(&p.d, &p.w, &p.a, o64, a64, l64, c64), 0);
    clattn_attention_args a = p.a;
    if (t != CLATTN_DTYPE_F32) {
        /* kv's width as tu_problem_make made it (without weights, kv holds HK heads of E/H) */
        const size_t Ekv = !cc.cross ? 0 : cc.Ekv ? cc.Ekv : cc.noproj ? HK * (cc.E / H) : cc.E;
        a.x = typed[nt++] = tu_typed(p.a.x, B * Tq * d.embed, t);
        if (p.a.kv) a.kv = typed[nt++] = tu_typed(p.a.kv, B * Tk * Ekv, t);
        if (p.a.value) a.value = typed[nt++] = tu_typed(p.a.value, B * Tk * HK * dv, t);
    }
    a.out = out;
    if (cc.need_weights) a.attn = attn;
    if (cc.training) a.lse = lse, a.context = ctx;
    st = tu_plan_execute(plan, &a);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "case %llu (%s): execute: %s: %s", (unsigned long long)seed,
                 clattn_plan_core(plan), clattn_status_string(st), clattn_last_error());
    double atol, rtol;
    tu_dtype_tolerance(t, &atol, &rtol);
    float *outf = tu_widened(out, n_out, t), *attnf = tu_widened(attn, n_attn, t);
    char msg[256];
    int nonzero = 0;
    for (size_t i = 0; i < n_out; i++) nonzero |= o64[i] != 0.0;
    cr_assert(nonzero, "case %llu: the oracle's output is all zero", (unsigned long long)seed);
    double *extra = tu_rounds_p(plan, &cc) ? p_rounding_bound(&p, &cc, a64, dv) : NULL;
    size_t bad = oracle_compare_extra(outf, o64, n_out, atol, extra, rtol, msg, sizeof msg);
    free(extra);
    cr_assert_eq(bad, 0, "case %llu (%s, %s) out: %zu of %zu differ; %s", (unsigned long long)seed,
                 clattn_plan_core(plan), t == CLATTN_DTYPE_F16 ? "f16" : t == CLATTN_DTYPE_BF16 ? "bf16" : "f32", bad,
                 n_out, msg);
    if (cc.need_weights) {
        bad = oracle_compare(attnf, a64, n_attn, atol, rtol, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %llu (%s) attn: %zu of %zu differ; %s", (unsigned long long)seed,
                     clattn_plan_core(plan), bad, n_attn, msg);
    }
    if (cc.training) {
        bad = oracle_compare(ctx, c64, n_ctx, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %llu (%s) context: %zu of %zu differ; %s", (unsigned long long)seed,
                     clattn_plan_core(plan), bad, n_ctx, msg);
        bad = oracle_compare_nonfinite(lse, l64, n_lse, TU_ATOL, TU_RTOL, msg, sizeof msg);
        cr_assert_eq(bad, 0, "case %llu (%s) lse: %zu of %zu differ; %s", (unsigned long long)seed,
                     clattn_plan_core(plan), bad, n_lse, msg);
    }
    clattn_plan_free(plan);
    for (int k = 0; k < nt; k++) free(typed[k]);
    free(out); free(attn); free(outf); free(attnf); free(lse); free(ctx); free(o64); free(a64); free(l64); free(c64);
    tu_problem_free(&p);
}

/* n elements of es bytes at `off` elements into a new buffer of off + n + 3, the rest 0x5A bytes; host NULL: all 0x5A */
static cl_mem varlen_buffer(clattn_device *dev, const void *host, size_t n, size_t es, size_t off)
{
    cl_int e;
    const size_t bytes = (off + n + 3) * es;
    cl_mem m = clCreateBuffer(clattn_device_context(dev), CL_MEM_READ_WRITE, bytes, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    unsigned char *fill = malloc(bytes);
    cr_assert(fill);
    memset(fill, 0x5A, bytes);
    if (host) memcpy(fill + off * es, host, n * es);
    cr_assert_eq(clEnqueueWriteBuffer(clattn_device_queue(dev), m, CL_TRUE, 0, bytes, fill, 0, NULL, NULL), CL_SUCCESS);
    free(fill);
    return m;
}

/* A varlen case's batch: the offsets, and the padded problem's rows packed (x; kv and value of cross-attention) */
typedef struct varlen_batch {
    uint32_t cu_q[17], cu_k[17];
    size_t rq, rk, Ekv, Vw, dv; /* packed rows of x and of kv; kv's and value's widths; the value head size */
    float *x, *kv, *v;
    uint32_t *pq, *pk; /* rope_pos: the rows' positions packed (pk: cross-attention's keys), else NULL */
} varlen_batch;

static void varlen_pack(const tu_problem *p, const tu_attn_case *c, const size_t *lens_q, const size_t *lens_k,
                        uint64_t seed, varlen_batch *vb)
{
    const size_t B = c->B, Tq = c->Tq, Tk = c->cross ? c->Tk : c->Tq, H = c->H, E = c->E;
    const size_t HK = c->HK ? c->HK : H;
    memset(vb, 0, sizeof *vb);
    vb->Ekv = !c->cross ? 0 : c->Ekv ? c->Ekv : c->noproj ? HK * (E / H) : E;
    vb->dv = c->noproj && !c->separate_value ? E / H : p->d.head_dim_v;
    vb->Vw = c->separate_value ? HK * vb->dv : 0;
    cr_assert(B <= 16);
    for (size_t b = 0; b < B; b++) {
        cr_assert(lens_q[b] <= Tq && (!c->cross || lens_k[b] <= Tk), "case %llu: a sequence past the case's lengths",
                  (unsigned long long)seed);
        vb->cu_q[b + 1] = vb->cu_q[b] + (uint32_t)lens_q[b];
        vb->cu_k[b + 1] = vb->cu_k[b] + (uint32_t)(c->cross ? lens_k[b] : lens_q[b]);
    }
    vb->rq = vb->cu_q[B], vb->rk = vb->cu_k[B];
    const size_t Ekv = vb->Ekv, Vw = vb->Vw;
    vb->x = malloc((vb->rq * E + 1) * sizeof *vb->x), vb->kv = malloc((vb->rk * Ekv + 1) * sizeof *vb->kv);
    vb->v = malloc((vb->rk * Vw + 1) * sizeof *vb->v);
    cr_assert(vb->x && vb->kv && vb->v);
    for (size_t b = 0; b < B; b++) {
        const size_t nk = vb->cu_k[b + 1] - vb->cu_k[b];
        memcpy(vb->x + vb->cu_q[b] * E, (const float *)p->a.x + b * Tq * E, lens_q[b] * E * sizeof *vb->x);
        if (Ekv) memcpy(vb->kv + vb->cu_k[b] * Ekv, (const float *)p->a.kv + b * Tk * Ekv, nk * Ekv * sizeof *vb->kv);
        if (Vw) memcpy(vb->v + vb->cu_k[b] * Vw, (const float *)p->a.value + b * Tk * Vw, nk * Vw * sizeof *vb->v);
    }
    if (p->pos_q) {
        cr_assert(vb->pq = malloc((vb->rq + 1) * sizeof *vb->pq));
        for (size_t b = 0; b < B; b++) memcpy(vb->pq + vb->cu_q[b], p->pos_q + b * Tq, lens_q[b] * sizeof *vb->pq);
    }
    if (p->pos_k) {
        cr_assert(vb->pk = malloc((vb->rk + 1) * sizeof *vb->pk));
        for (size_t b = 0; b < B; b++)
            memcpy(vb->pk + vb->cu_k[b], p->pos_k + b * Tk, (vb->cu_k[b + 1] - vb->cu_k[b]) * sizeof *vb->pk);
    }
}

static void varlen_free(varlen_batch *vb) { free(vb->x), free(vb->kv), free(vb->v), free(vb->pq), free(vb->pk); }

/* Sequence b's positions for the oracle's call on it alone (rope_pos), and the packed ones for the plan's. */
static void varlen_positions(const tu_problem *p, const tu_attn_case *c, size_t b, clattn_attention_args *a1)
{
    const size_t Tk = c->cross ? c->Tk : c->Tq;
    if (p->pos_q) a1->rope_positions = p->pos_q + b * c->Tq;
    if (p->pos_k) a1->rope_positions_kv = p->pos_k + b * Tk;
}
static void varlen_positions_packed(const varlen_batch *vb, const uint32_t **pq, size_t *nq, const uint32_t **pk,
                                    size_t *nk)
{
    if (vb->pq) *pq = vb->pq, *nq = vb->rq;
    if (vb->pk) *pk = vb->pk, *nk = vb->rk;
}

void tu_varlen_check(clattn_device *dev, const tu_attn_case *c, const size_t *lens_q, const size_t *lens_k,
                     uint64_t seed, int on_buffers)
{
    const clattn_core_info *forced = clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL ? tu_forced_core() : NULL;
    tu_problem p;
    tu_problem_make(&p, c, seed);
    const clattn_dtype t = c->dtype;
    const size_t B = c->B, Tq = c->Tq, Tk = c->cross ? c->Tk : c->Tq, E = c->E;
    varlen_batch vb;
    varlen_pack(&p, c, lens_q, lens_k, seed, &vb);
    const uint32_t *cu_q = vb.cu_q, *cu_k = vb.cu_k;
    const size_t rq = vb.rq, rk = vb.rk, Ekv = vb.Ekv, Vw = vb.Vw;
    float *x = vb.x, *kv = vb.kv, *v = vb.v;
    /* the plan */
    clattn_attention_desc d = p.d;
    d.algorithm = forced ? forced->algorithm : CLATTN_ALGORITHM_AUTO;
    d.varlen = 1;
    void *typed[12] = {0};
    int nt;
    char what[48];
    snprintf(what, sizeof what, "varlen case %llu", (unsigned long long)seed);
    clattn_plan *plan = typed_plan(dev, &d, &p.w, t, forced, typed, &nt, what);
    if (!plan) {
        varlen_free(&vb);
        tu_problem_free(&p);
        return;
    }
    clattn_status st;
    const size_t ow = clattn_plan_out_width(plan), n_out = rq * ow, es = t == CLATTN_DTYPE_F32 ? 4 : 2;
    /* the oracle: each sequence alone (and where the plan rounds P to its type, each element's added bound) */
    double *o64 = malloc((n_out + 1) * sizeof *o64), *extra = NULL;
    cr_assert(o64);
    const int rounds = tu_rounds_p(plan, c);
    if (rounds) cr_assert(extra = calloc(n_out + 1, sizeof *extra));
    int nonzero = 0;
    for (size_t b = 0; b < B; b++) {
        const size_t nq = lens_q[b], nk = cu_k[b + 1] - cu_k[b];
        if (nq == 0) continue;
        double *o = o64 + cu_q[b] * ow;
        if (nk == 0) { /* no keys: context 0 */
            for (size_t i = 0; i < nq * ow; i++) o[i] = p.w.b_out ? ((const float *)p.w.b_out)[i % ow] : 0.0;
            continue;
        }
        clattn_attention_desc d1 = p.d;
        d1.batch = 1, d1.seq_q = nq;
        if (c->cross) d1.seq_kv = nk;
        clattn_attention_args a1 = {.x = (const float *)p.a.x + b * Tq * E};
        if (Ekv) a1.kv = (const float *)p.a.kv + b * Tk * Ekv;
        if (Vw) a1.value = (const float *)p.a.value + b * Tk * Vw;
        varlen_positions(&p, c, b, &a1);
        double *w1 = rounds ? malloc(c->H * nq * nk * sizeof *w1) : NULL;
        cr_assert(!rounds || w1);
        oracle_batch0 = b; /* dropout keys the sequence as the padded batch's entry b */
        cr_assert_eq(oracle_attention(&d1, &p.w, &a1, o, w1), 0);
        oracle_batch0 = 0;
        for (size_t i = 0; i < nq * ow; i++) nonzero |= o[i] != 0.0;
        if (rounds) { /* the sequence as a problem of its own (no projections: out is the heads' rows) */
            tu_problem sp = p;
            sp.d = d1, sp.a = a1;
            double *e = p_rounding_bound(&sp, c, w1, vb.dv);
            memcpy(extra + cu_q[b] * ow, e, nq * ow * sizeof *e);
            free(e);
        }
        free(w1);
    }
    cr_assert(nonzero || rq == 0, "varlen case %llu: the oracle's output is all zero", (unsigned long long)seed);
    /* the host call */
    void *xt = tu_typed(x, rq * E, t), *kvt = tu_typed(kv, rk * Ekv, t), *vt = tu_typed(v, rk * Vw, t);
    void *out = tu_poisoned_typed(n_out + 1, t);
    clattn_attention_args a = {.x = xt, .x_count = rq * E, .out = out, .out_count = n_out, .cu_seqlens_q = cu_q,
                               .cu_seqlens_q_count = B + 1};
    if (c->cross) a.kv = kvt, a.kv_count = rk * Ekv, a.cu_seqlens_kv = cu_k, a.cu_seqlens_kv_count = B + 1;
    if (Vw) a.value = vt, a.value_count = rk * Vw;
    varlen_positions_packed(&vb, &a.rope_positions, &a.rope_positions_count, &a.rope_positions_kv,
                            &a.rope_positions_kv_count);
    st = clattn_plan_execute(plan, &a);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "varlen case %llu (%s): execute: %s: %s", (unsigned long long)seed,
                 clattn_plan_core(plan), clattn_status_string(st), clattn_last_error());
    double atol, rtol;
    tu_dtype_tolerance(t, &atol, &rtol);
    float *outf = tu_widened(out, n_out, t);
    char msg[256];
    const size_t bad = oracle_compare_extra(outf, o64, n_out, atol, extra, rtol, msg, sizeof msg);
    cr_assert_eq(bad, 0, "varlen case %llu (%s) out: %zu of %zu differ; %s", (unsigned long long)seed,
                 clattn_plan_core(plan), bad, n_out, msg);
    if (on_buffers && clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL) {
        const size_t off = 5;
        cl_mem bx = varlen_buffer(dev, xt, rq * E, es, off), bo = varlen_buffer(dev, NULL, n_out, es, off);
        cl_mem bkv = c->cross ? varlen_buffer(dev, kvt, rk * Ekv, es, off) : NULL;
        cl_mem bv = Vw ? varlen_buffer(dev, vt, rk * Vw, es, off) : NULL;
        clattn_attention_buffers bb = {.x = {bx, off}, .kv = {bkv, off}, .value = {bv, off}, .out = {bo, off},
                                       .cu_seqlens_q = cu_q, .cu_seqlens_q_count = B + 1};
        if (c->cross) bb.cu_seqlens_kv = cu_k, bb.cu_seqlens_kv_count = B + 1;
        varlen_positions_packed(&vb, &bb.rope_positions, &bb.rope_positions_count, &bb.rope_positions_kv,
                                &bb.rope_positions_kv_count);
        st = clattn_plan_execute_buffers(plan, &bb, 0, NULL, NULL);
        cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "varlen case %llu (%s): on buffers: %s", (unsigned long long)seed,
                     clattn_plan_core(plan), clattn_last_error());
        unsigned char *got = malloc((off + n_out + 3) * es);
        cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(dev), bo, CL_TRUE, 0, (off + n_out + 3) * es, got, 0, NULL,
                                         NULL), CL_SUCCESS);
        cr_assert(memcmp(got + off * es, out, n_out * es) == 0, "varlen case %llu: buffers and host arrays differ",
                  (unsigned long long)seed);
        for (size_t j = 0; j < off * es; j++) cr_assert_eq(got[j], 0x5A, "varlen: written before the offset");
        for (size_t j = 0; j < 3 * es; j++) cr_assert_eq(got[(off + n_out) * es + j], 0x5A, "varlen: written past out");
        free(got);
        clReleaseMemObject(bx), clReleaseMemObject(bo);
        if (bkv) clReleaseMemObject(bkv);
        if (bv) clReleaseMemObject(bv);
    }
    clattn_plan_free(plan);
    for (int k = 0; k < nt; k++) free(typed[k]);
    varlen_free(&vb);
    free(xt), free(kvt), free(vt), free(out), free(outf), free(o64), free(extra);
    tu_problem_free(&p);
}

void tu_varlen_train_check(clattn_device *dev, const tu_attn_case *c, const size_t *lens_q, const size_t *lens_k,
                           uint64_t seed)
{
    const clattn_core_info *forced = clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL ? tu_forced_core() : NULL;
    const clattn_core_info *forced_bwd =
        clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL ? tu_forced_core_of(CLATTN_CORE_BACKWARD) : NULL;
    tu_attn_case cc = *c;
    cc.training = 1;
    tu_problem p;
    tu_problem_make(&p, &cc, seed);
    const size_t B = c->B, Tq = c->Tq, Tk = c->cross ? c->Tk : c->Tq, H = c->H, E = c->E;
    const size_t HK = c->HK ? c->HK : H;
    varlen_batch vb;
    varlen_pack(&p, c, lens_q, lens_k, seed, &vb);
    const uint32_t *cu_q = vb.cu_q, *cu_k = vb.cu_k;
    const size_t rq = vb.rq, rk = vb.rk, Ekv = vb.Ekv, Vw = vb.Vw, dv = vb.dv;
    float *x = vb.x, *kv = vb.kv, *v = vb.v;
    clattn_attention_desc d = p.d;
    d.algorithm = forced ? forced->algorithm : CLATTN_ALGORITHM_AUTO;
    d.varlen = 1, d.training = 1;
    clattn_plan *plan = NULL;
    clattn_status st = tu_plan_create(dev, &d, &p.w, &plan);
    char what[48];
    snprintf(what, sizeof what, "varlen training case %llu", (unsigned long long)seed);
    if (tu_refused_by_device(dev, st, what)) {
        varlen_free(&vb);
        tu_problem_free(&p);
        return;
    }
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: plan: %s", what, clattn_last_error());
    if (forced) cr_assert_str_eq(clattn_plan_core(plan), forced->name);
    if (forced_bwd) cr_assert_str_eq(clattn_plan_backward_core(plan), forced_bwd->name);
    const size_t ow = clattn_plan_out_width(plan), C = H * dv, n_out = rq * ow;
    /* the oracle, each sequence alone: out, lse, context and the gradients */
    enum { NG = 11 };
    const size_t Ew = c->cross ? Ekv : E; /* the K and V weights' input width */
    const size_t n[NG] = {rq * E, rk * Ekv, H * p.d.head_dim_qk * E, HK * p.d.head_dim_qk * Ew,
                          HK * p.d.head_dim_v * Ew, H * p.d.head_dim_qk, HK * p.d.head_dim_qk, HK * p.d.head_dim_v,
                          p.d.out_dim * C, p.d.out_dim, rk * Vw};
    const int has[NG] = {1, c->cross, p.w.w_query != NULL, p.w.w_key != NULL, p.w.w_value != NULL,
                         p.w.b_query != NULL, p.w.b_key != NULL, p.w.b_value != NULL, p.w.w_out != NULL,
                         p.w.b_out != NULL, Vw != 0};
    static const char *names[NG] = {"x", "kv", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out",
                                    "b_out", "value"};
    double *o64 = calloc(n_out + 1, sizeof *o64), *l64 = calloc(H * rq + 1, sizeof *l64);
    double *c64 = calloc(rq * C + 1, sizeof *c64), *want[NG] = {0}, *one[NG] = {0};
    for (int i = 0; i < NG; i++)
        if (has[i]) want[i] = calloc(n[i] + 1, sizeof(double)), one[i] = calloc(n[i] + 1, sizeof(double));
    tu_rng rng = {seed ^ 0x9E37u};
    float *dout = tu_random(&rng, n_out + 1, -1.0f, 1.0f);
    for (size_t b = 0; b < B; b++) {
        const size_t q0 = cu_q[b], nq = lens_q[b], k0 = cu_k[b], nk = cu_k[b + 1] - k0;
        if (nq == 0) continue; /* its keys' gradients stay 0 */
        if (nk == 0) { /* out = b_out, lse -inf (the sink's, s_h, with sinks), context 0; b_out's gradient takes
                        * grad_out's rows */
            for (size_t i = 0; i < nq * ow; i++) {
                o64[q0 * ow + i] = p.w.b_out ? ((const float *)p.w.b_out)[i % ow] : 0.0;
                if (want[9]) want[9][i % ow] += dout[q0 * ow + i];
            }
            for (size_t i = 0; i < H * nq; i++) /* (the sequence's lse: H rows of nq) */
                l64[H * q0 + i] = p.w.sinks ? ((const float *)p.w.sinks)[i / nq] : -INFINITY;
            continue;
        }
        clattn_attention_desc d1 = p.d;
        d1.batch = 1, d1.seq_q = nq, d1.training = 1;
        if (c->cross) d1.seq_kv = nk;
        clattn_attention_args a1 = {.x = (const float *)p.a.x + b * Tq * E};
        if (Ekv) a1.kv = (const float *)p.a.kv + b * Tk * Ekv;
        if (Vw) a1.value = (const float *)p.a.value + b * Tk * Vw;
        varlen_positions(&p, c, b, &a1);
        oracle_batch0 = b; /* dropout keys the sequence as the padded batch's entry b */
        cr_assert_eq(oracle_attention_stats(&d1, &p.w, &a1, o64 + q0 * ow, NULL, l64 + H * q0, c64 + q0 * C), 0);
        oracle_grads og = {one[0], one[1], one[2], one[3], one[4], one[5], one[6], one[7], one[8], one[9], one[10]};
        cr_assert_eq(oracle_attention_backward(&d1, &p.w, &a1, dout + q0 * ow, &og), 0);
        oracle_batch0 = 0;
        memcpy(want[0] + q0 * E, one[0], nq * E * sizeof(double));
        if (want[1]) memcpy(want[1] + k0 * Ekv, one[1], nk * Ekv * sizeof(double));
        if (want[10]) memcpy(want[10] + k0 * Vw, one[10], nk * Vw * sizeof(double));
        for (int i = 2; i < 10; i++)
            for (size_t j = 0; want[i] && j < n[i]; j++) want[i][j] += one[i][j];
    }
    /* the forward: out, lse, context */
    float *out = tu_poisoned(n_out + 1), *lse = tu_poisoned(H * rq + 1), *ctx = tu_poisoned(rq * C + 1);
    clattn_attention_args a = {.x = x, .x_count = rq * E, .out = out, .out_count = n_out, .lse = lse,
                               .lse_count = H * rq, .context = ctx, .context_count = rq * C, .cu_seqlens_q = cu_q,
                               .cu_seqlens_q_count = B + 1};
    if (c->cross) a.kv = kv, a.kv_count = rk * Ekv, a.cu_seqlens_kv = cu_k, a.cu_seqlens_kv_count = B + 1;
    if (Vw) a.value = v, a.value_count = rk * Vw;
    varlen_positions_packed(&vb, &a.rope_positions, &a.rope_positions_count, &a.rope_positions_kv,
                            &a.rope_positions_kv_count);
    st = clattn_plan_execute(plan, &a);
    cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s (%s): forward: %s", what, clattn_plan_core(plan), clattn_last_error());
    char msg[256];
    size_t bad = oracle_compare(out, o64, n_out, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s (%s) out: %zu of %zu differ; %s", what, clattn_plan_core(plan), bad, n_out, msg);
    bad = oracle_compare_nonfinite(lse, l64, H * rq, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s (%s) lse: %zu of %zu differ; %s", what, clattn_plan_core(plan), bad, H * rq, msg);
    bad = oracle_compare(ctx, c64, rq * C, TU_ATOL, TU_RTOL, msg, sizeof msg);
    cr_assert_eq(bad, 0, "%s (%s) context: %zu of %zu differ; %s", what, clattn_plan_core(plan), bad, rq * C, msg);
    /* the backward, with the forward's statistics and without */
    for (int saved = 0; saved < 2; saved++) {
        float *got[NG] = {0};
        for (int i = 0; i < NG; i++)
            if (has[i]) got[i] = tu_poisoned(n[i] + 1);
        clattn_attention_grads g = {.grad_out = dout, .grad_out_count = n_out, .grad_x = got[0], .grad_kv = got[1],
                                    .grad_w_query = got[2], .grad_w_key = got[3], .grad_w_value = got[4],
                                    .grad_b_query = got[5], .grad_b_key = got[6], .grad_b_value = got[7],
                                    .grad_w_out = got[8], .grad_b_out = got[9], .grad_value = got[10]};
        size_t *counts[NG] = {&g.grad_x_count, &g.grad_kv_count, &g.grad_w_query_count, &g.grad_w_key_count,
                              &g.grad_w_value_count, &g.grad_b_query_count, &g.grad_b_key_count, &g.grad_b_value_count,
                              &g.grad_w_out_count, &g.grad_b_out_count, &g.grad_value_count};
        for (int i = 0; i < NG; i++) *counts[i] = has[i] ? n[i] : 0;
        if (saved) g.lse = lse, g.lse_count = H * rq, g.context = ctx, g.context_count = rq * C;
        clattn_attention_args ba = a;
        ba.out = NULL, ba.out_count = 0, ba.lse = NULL, ba.lse_count = 0, ba.context = NULL, ba.context_count = 0;
        st = clattn_plan_backward(plan, &ba, &g);
        cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s (%s): backward: %s", what, clattn_plan_backward_core(plan),
                     clattn_last_error());
        for (int i = 0; i < NG; i++) {
            if (!has[i]) continue;
            bad = oracle_compare(got[i], want[i], n[i], 1e-4, 1e-3, msg, sizeof msg);
            cr_assert_eq(bad, 0, "%s (%s%s) grad_%s: %zu of %zu differ; %s", what, clattn_plan_backward_core(plan),
                         saved ? ", saved statistics" : "", names[i], bad, n[i], msg);
        }
        /* the buffer form (OpenCL), the same offsets as host arrays: the host call's bits, nothing past the ends */
        if (clattn_device_backend(dev) == CLATTN_BACKEND_OPENCL && !saved) {
            const size_t off = 3;
            cl_mem bx = varlen_buffer(dev, x, rq * E, 4, off), bg = varlen_buffer(dev, dout, n_out, 4, off);
            cl_mem bkv = c->cross && rk ? varlen_buffer(dev, kv, rk * Ekv, 4, off) : NULL;
            cl_mem bv = Vw && rk ? varlen_buffer(dev, v, rk * Vw, 4, off) : NULL, bo[NG] = {0};
            for (int i = 0; i < NG; i++)
                if (has[i] && n[i]) bo[i] = varlen_buffer(dev, NULL, n[i], 4, off);
            clattn_attention_buffers bb = {.x = {bx, off}, .kv = {bkv, off}, .value = {bv, off},
                                           .cu_seqlens_q = cu_q, .cu_seqlens_q_count = B + 1};
            if (c->cross) bb.cu_seqlens_kv = cu_k, bb.cu_seqlens_kv_count = B + 1;
            varlen_positions_packed(&vb, &bb.rope_positions, &bb.rope_positions_count, &bb.rope_positions_kv,
                                    &bb.rope_positions_kv_count);
            clattn_attention_grad_buffers gb = {.grad_out = {bg, off}};
            clattn_buffer *slot[NG] = {&gb.grad_x, &gb.grad_kv, &gb.grad_w_query, &gb.grad_w_key, &gb.grad_w_value,
                                       &gb.grad_b_query, &gb.grad_b_key, &gb.grad_b_value, &gb.grad_w_out,
                                       &gb.grad_b_out, &gb.grad_value};
            for (int i = 0; i < NG; i++) *slot[i] = (clattn_buffer){bo[i], off};
            st = clattn_plan_backward_buffers(plan, &bb, &gb, 0, NULL, NULL);
            cr_assert_eq(st, CLATTN_STATUS_SUCCESS, "%s: backward on buffers: %s", what, clattn_last_error());
            for (int i = 0; i < NG; i++) {
                if (!bo[i]) continue;
                unsigned char *back = malloc((off + n[i] + 3) * 4);
                cr_assert_eq(clEnqueueReadBuffer(clattn_device_queue(dev), bo[i], CL_TRUE, 0, (off + n[i] + 3) * 4, back,
                                                 0, NULL, NULL), CL_SUCCESS);
                cr_assert(memcmp(back + off * 4, got[i], n[i] * 4) == 0, "%s grad_%s: buffers and host arrays differ",
                          what, names[i]);
                for (size_t j = 0; j < off * 4; j++) cr_assert_eq(back[j], 0x5A, "grad_%s: written before", names[i]);
                for (size_t j = 0; j < 12; j++) cr_assert_eq(back[(off + n[i]) * 4 + j], 0x5A, "grad_%s: past", names[i]);
                free(back);
                clReleaseMemObject(bo[i]);
            }
            clReleaseMemObject(bx), clReleaseMemObject(bg);
            if (bkv) clReleaseMemObject(bkv);
            if (bv) clReleaseMemObject(bv);
        }
        for (int i = 0; i < NG; i++) free(got[i]);
    }
    clattn_plan_free(plan);
    for (int i = 0; i < NG; i++) free(want[i]), free(one[i]);
    varlen_free(&vb);
    free(o64), free(l64), free(c64), free(dout), free(out), free(lse), free(ctx);
    tu_problem_free(&p);
}

void tu_problem_free(tu_problem *p)
{
    for (int i = 0; i < p->nb; i++) free(p->bufs[i]);
    free(p->kpm);
    free(p->bmask);
    free(p->pos_q);
    free(p->pos_k);
}

extern char **environ;

tu_child_env tu_env_with(const char *name, const char *value)
{
    size_t n = 0;
    while (environ[n]) n++;
    tu_child_env e = {calloc(n + 2, sizeof(char *)), NULL};
    cr_assert(e.vars, "out of memory");
    const size_t len = strlen(name);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!(strncmp(environ[i], name, len) == 0 && environ[i][len] == '=') && strncmp(environ[i], "BXFI_", 5) != 0)
            e.vars[k++] = environ[i];
    if (value) {
        e.set = malloc(len + strlen(value) + 2);
        cr_assert(e.set, "out of memory");
        sprintf(e.set, "%s=%s", name, value);
        e.vars[k++] = e.set;
    }
    e.vars[k] = NULL;
    return e;
}

void tu_env_free(tu_child_env *e)
{
    free(e->set);
    free(e->vars);
    e->set = NULL, e->vars = NULL;
}

static size_t tu_pick(tu_rng *r, const size_t *v, size_t n) { return v[tu_next(r) % n]; }

void tu_case_random(tu_attn_case *c, uint64_t seed, int training)
{
    tu_rng r = {0x5EEDCA5E00000000ull ^ seed};
    static const size_t Bs[] = {1, 2, 3}, Ts[] = {1, 2, 5, 7, 13, 17, 33, 61, 130}, Tks[] = {1, 3, 9, 17, 40, 70};
    static const size_t Hs[] = {1, 2, 3, 4}, ds[] = {1, 2, 3, 4, 5, 8, 16, 32, 64}, Es[] = {3, 4, 7, 8, 12, 16, 20};
    memset(c, 0, sizeof *c);
    c->B = tu_pick(&r, Bs, 3), c->Tq = tu_pick(&r, Ts, 9);
    c->cross = tu_next(&r) % 3 == 0;
    if (c->cross) c->Tk = tu_pick(&r, Tks, 6);
    c->H = tu_pick(&r, Hs, 4);
    size_t divs[4], nd = 0;
    for (size_t k = 1; k <= c->H; k++)
        if (c->H % k == 0) divs[nd++] = k;
    c->HK = tu_next(&r) % 2 ? tu_pick(&r, divs, nd) : 0;
    c->noproj = tu_next(&r) % 4 == 0;
    if (c->noproj) { /* x is Q, K and V: their heads E/H; GQA only across kv (cross) */
        if (!c->cross) c->HK = 0;
        c->dk = c->dv = tu_pick(&r, ds, 9);
        c->E = c->H * c->dk;
        if (c->cross && tu_next(&r) % 2) c->separate_value = 1, c->dv = tu_pick(&r, ds, 9);
    } else {
        c->E = tu_pick(&r, Es, 7), c->dk = tu_pick(&r, ds, 9), c->dv = tu_pick(&r, ds, 9);
        c->Ekv = c->cross ? tu_pick(&r, Es, 7) : 0;
        c->Eo = tu_next(&r) % 3 ? tu_pick(&r, Es, 7) : 0;
        c->biases = (int)(tu_next(&r) % 2);
        c->layout = tu_next(&r) % 4 == 0 ? CLATTN_LAYOUT_RAW : CLATTN_LAYOUT_LINEAR;
    }
    c->causal = (int)(tu_next(&r) % 2);
    if (c->causal && tu_next(&r) % 3 == 0) c->window = 1 + tu_next(&r) % (c->Tq + 2);
    c->kpm = tu_next(&r) % 3 == 0;
    const int mk = (int)(tu_next(&r) % 4);
    c->mask = mk == 1 ? CLATTN_MASK_BOOL : mk == 2 ? CLATTN_MASK_FLOAT : CLATTN_MASK_NONE;
    if (c->mask) c->mask_pb = tu_next(&r) % 3 == 0, c->mask_ph = tu_next(&r) % 3 == 0;
    if ((c->cross ? c->Tk : c->Tq) < 5) /* so few keys that the masks could hide them all: an all-zero output */
        c->mask = CLATTN_MASK_NONE, c->mask_pb = c->mask_ph = 0, c->kpm = 0;
    c->dropout = tu_next(&r) % 4 == 0 ? 0.25f : 0.0f;
    const int dt = (int)(tu_next(&r) % 6);
    c->dtype = dt == 4 ? CLATTN_DTYPE_F16 : dt == 5 ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F32;
    if (tu_next(&r) % 5 == 0) c->scale = 0.3f;
    if (training) {
        c->training = 1;
        return;
    }
    c->need_weights = tu_next(&r) % 3 == 0;
    c->training = !c->need_weights && tu_next(&r) % 4 == 0;
    if (!c->training && tu_next(&r) % 5 == 0) c->kv_half = c->dtype ? (int)c->dtype : 1 + (int)(tu_next(&r) % 2);
}

void tu_case_describe(const tu_attn_case *c, char *buf, size_t len)
{
    snprintf(buf, len,
             "B=%zu Tq=%zu Tk=%zu cross=%d E=%zu Ekv=%zu H=%zu HK=%zu dk=%zu dv=%zu Eo=%zu noproj=%d separate_value=%d "
             "biases=%d causal=%d window=%zu kpm=%d mask=%d per_batch=%d per_head=%d dropout=%g layout=%d dtype=%d "
             "scale=%g need_weights=%d training=%d kv_half=%d",
             c->B, c->Tq, c->Tk, c->cross, c->E, c->Ekv, c->H, c->HK, c->dk, c->dv, c->Eo, c->noproj,
             c->separate_value, c->biases, c->causal, c->window, c->kpm, (int)c->mask, c->mask_pb, c->mask_ph,
             (double)c->dropout, (int)c->layout, (int)c->dtype, (double)c->scale, c->need_weights, c->training,
             c->kv_half);
}

int tu_sweep_count(int dflt, int *base)
{
    const char *n = getenv("CLATTN_TEST_SWEEP"), *b = getenv("CLATTN_TEST_SWEEP_BASE"), *core = getenv("CLATTN_CORE");
    *base = b && *b ? atoi(b) : 0;
    if (n && *n) return atoi(n);
    /* a core's own entries (CLATTN_CORE) run none unless asked: with cold kernel caches each case compiles new
     * kernels, about 10 s a core on PoCL and minutes on llvmpipe, across some 30 entries */
    return core && *core ? 0 : dflt;
}
