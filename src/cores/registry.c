/* registry.c: every attention core, one table per kind, and AUTO's order of preference among them.
 * Adding a core: its descriptor (a const clattn_core) in a file of its own, one line in its kind's table,
 * and a place in the order below where AUTO should consider it (docs/ARCHITECTURE.md). */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const clattn_core clattn_core_unfused, clattn_core_flash_rows, clattn_core_flash_tiled, clattn_core_flash_gemm,
    clattn_core_flash_mma, clattn_core_flash_lanes;
extern const clattn_core clattn_core_decode_attend, clattn_core_decode_group;
extern const clattn_core clattn_core_gemm_tiles, clattn_core_gemm_clblast;
extern const clattn_core clattn_core_flash_backward, clattn_core_flash_backward_gemm;

static const clattn_core *const prefill[] = {
    &clattn_core_unfused,
    &clattn_core_flash_rows,
    &clattn_core_flash_tiled,
    &clattn_core_flash_gemm,
    &clattn_core_flash_mma,
    &clattn_core_flash_lanes,
};

static const clattn_core *const decode[] = {
    &clattn_core_decode_attend,
    &clattn_core_decode_group,
};

static const clattn_core *const gemm[] = {
    &clattn_core_gemm_tiles,
    &clattn_core_gemm_clblast,
};

static const clattn_core *const backward[] = {
    &clattn_core_flash_backward,
    &clattn_core_flash_backward_gemm,
};

#define COUNT(a) (sizeof (a) / sizeof (a)[0])

/* The variables of clattn 0.1-0.3 that forced a core, by value (select.c reads the variables and refuses other
 * values): the core and the parameters each value names. */
static const struct legacy {
    const char *var, *value;
    const clattn_core *core;
    const char *params;
} legacy[] = {
    {"CLATTN_FLASH", "rows", &clattn_core_flash_rows, ""},
    {"CLATTN_FLASH", "tiled", &clattn_core_flash_tiled, ""},
    {"CLATTN_ATTENTION", "unfused", &clattn_core_unfused, ""},
    {"CLATTN_SOFTMAX", "rows", &clattn_core_unfused, "SOFTMAX=rows"},
    {"CLATTN_SOFTMAX", "item", &clattn_core_unfused, "SOFTMAX=item"},
};

const clattn_core *clattn_core_legacy(const char *var, const char *value, const char **params)
{
    for (size_t i = 0; i < COUNT(legacy); i++)
        if (strcmp(legacy[i].var, var) == 0 && strcmp(legacy[i].value, value) == 0) {
            if (params) *params = legacy[i].params;
            return legacy[i].core;
        }
    if (params) *params = "";
    return NULL;
}
#define MAX_ORDER 8

/* AUTO's order of preference: the first rule whose device class matches (-1: any) and whose head-size
 * classes include the plan's gives the order; the first core in it that supports the plan and builds
 * serves it. Cores that cannot return the attention weights are passed over for plans that need them.
 *   CPU devices (PoCL): flash_lanes, one work-item per 16 query rows along the vector lanes (every product a
 *     broadcast and an FMA, no horizontal sums): on PoCL 3.1, 2 vCPUs of an AMD EPYC (2026-11-26, clattn-bench
 *     --no-proj B=4 H=8, bench/results/pocl-2core-lanes.md) its core ran at 290-305 GFLOP/s at d64 for T=512-4096
 *     (causal 255-290 per useful FLOP), 240 at d32, 330 at d128, 355 at d256: 2.1-2.7x flash_rows (130-140) and
 *     0.56-0.65 of the unfused path's time at T=1024-4096 (which the previous order put first from 1536 keys);
 *     flash_rows after it.
 *   GPUs: flash_gemm, register micro-tiles over K/V tiles in local memory, built to run at GEMM speed (on an H200:
 *     32 TFLOP/s at d64, 2.5-5x flash_tiled, 1.7-2.5x unfused up to d128; at d256 unfused was faster, 6.2 against
 *     9.5 ms at B1 T4096 H8: one shape, so the order stays). After it, for head sizes above 64, the unfused path before
 *     flash_tiled: on an H100 (NVIDIA OpenCL 580, clattn 0.3.0, issue 22's table) unfused took 0.40-0.48 of
 *     flash_tiled's time at head size 128, and 0.85-1.09 of it at 64. flash_rows keeps whole rows per
 *     work-item, which suits a CPU.
 *   NVIDIA GPUs, head sizes up to 128: flash_mma (tensor cores, 3xTF32: fp32 accuracy) first, where it runs natively
 *     (caps.nv_mma_tf32; elsewhere AUTO passes over it, its emulation is for tests). Measured on an H200 (NVIDIA
 *     OpenCL, clattn 0.7.0, bench/results/h200-2026-11-26.md), its core time against flash_gemm's: 0.090 / 0.106 ms
 *     at B4 T512 H8 d64, 2.98 / 4.27 ms at B2 T4096 H16 d64 (causal 1.94 / 3.34), 1.99 / 2.77 ms at B4 T2048 H8 d128;
 *     46 TFLOP/s at d64, beside torch 2.11's fp32 memory-efficient SDPA at 34 on the same card. Above 128 it is
 *     not measured yet: flash_gemm keeps those. Half plans on their own arrays take its m16n8k16 fp16/bf16 products
 *     (HMMA: 308 and 352 TFLOP/s hot-loop ceilings at d64 and d128 by scripts/gpu-static.sh; not run on a GPU yet).
 * Decode: decode_attend (one work-item streams its keys, its accumulators in registers: a CPU's way) on CPUs;
 *   decode_group (work-groups streaming whole keys with coalesced loads) on GPUs, where decode_attend read the
 *   cache at about 1 % of the copy bandwidth on an H100 (issue 23's table); on an H200 decode_group read it at 25-43 %
 *   (955 GB/s at B1, 1694 at B8, context 32768; decode_attend 19 and 81). */
typedef struct order_rule {
    int dclass;            /* clattn_device_class, or -1 for any */
    int cls_lo, cls_hi;    /* head-size classes it covers */
    const char *cores[MAX_ORDER];
} order_rule;

static const order_rule prefill_order[] = {
    {CLATTN_CLASS_CPU, 0, CLATTN_HEAD_CLASSES - 1, {"flash_lanes", "flash_rows", "flash_tiled", "flash_gemm", "unfused"}},
    {CLATTN_CLASS_NVIDIA, 0, 1, {"flash_mma", "flash_gemm", "flash_tiled", "unfused", "flash_rows"}},
    {CLATTN_CLASS_NVIDIA, 2, 2, {"flash_mma", "flash_gemm", "unfused", "flash_tiled", "flash_rows"}},
    {-1, 0, 1, {"flash_gemm", "flash_tiled", "unfused", "flash_rows"}},
    {-1, 2, CLATTN_HEAD_CLASSES - 1, {"flash_gemm", "unfused", "flash_tiled", "flash_rows"}},
};

static const order_rule decode_order[] = {
    {CLATTN_CLASS_CPU, 0, CLATTN_HEAD_CLASSES - 1, {"decode_attend", "decode_group"}},
    {-1, 0, CLATTN_HEAD_CLASSES - 1, {"decode_group", "decode_attend"}},
};

/* Backward: flash_backward (per-work-item rows: a CPU's shape) everywhere, after flash_backward_gemm (tiles in local
 * memory, register micro-tiles: a GPU's shape) on NVIDIA GPUs up to head size 64: on an H200 (clattn 0.7.0,
 * bench/results/h200-2026-11-26.md) its core backward took 20.2 ms against flash_backward's 158 ms at B2 T4096 H16
 * d64, and its training family passed there. Larger heads and other GPUs: not measured yet. */
static const order_rule backward_order[] = {
    {CLATTN_CLASS_NVIDIA, 0, 1, {"flash_backward_gemm", "flash_backward"}},
    {-1, 0, CLATTN_HEAD_CLASSES - 1, {"flash_backward"}},
};

static const order_rule gemm_order[] = {
    {CLATTN_CLASS_CPU, 0, CLATTN_HEAD_CLASSES - 1, {"gemm_tiles", "gemm_clblast"}},
    {-1, 0, CLATTN_HEAD_CLASSES - 1, {"gemm_clblast"}},
};

size_t clattn_core_total(void) { return COUNT(prefill) + COUNT(decode) + COUNT(gemm) + COUNT(backward); }

const clattn_core *clattn_core_at(size_t i)
{
    if (i < COUNT(prefill)) return prefill[i];
    i -= COUNT(prefill);
    if (i < COUNT(decode)) return decode[i];
    i -= COUNT(decode);
    if (i < COUNT(gemm)) return gemm[i];
    i -= COUNT(gemm);
    return i < COUNT(backward) ? backward[i] : NULL;
}

const char *clattn_core_kind_name(clattn_core_kind kind)
{
    return kind == CLATTN_CORE_DECODE ? "decode" : kind == CLATTN_CORE_GEMM ? "gemm"
           : kind == CLATTN_CORE_BACKWARD ? "backward" : "prefill";
}

const clattn_core *clattn_core_find(const char *name)
{
    for (size_t i = 0; i < clattn_core_total(); i++)
        if (strcmp(clattn_core_at(i)->name, name) == 0) return clattn_core_at(i);
    return NULL;
}

const clattn_core *clattn_core_preferred(clattn_core_kind kind, clattn_device_class dclass, int cls, size_t i)
{
    const order_rule *rules = kind == CLATTN_CORE_DECODE ? decode_order
                              : kind == CLATTN_CORE_GEMM ? gemm_order
                              : kind == CLATTN_CORE_BACKWARD ? backward_order
                                                         : prefill_order;
    const size_t n = kind == CLATTN_CORE_DECODE ? COUNT(decode_order)
                     : kind == CLATTN_CORE_GEMM ? COUNT(gemm_order)
                     : kind == CLATTN_CORE_BACKWARD ? COUNT(backward_order)
                                                : COUNT(prefill_order);
    for (size_t r = 0; r < n; r++) {
        if ((rules[r].dclass >= 0 && rules[r].dclass != (int)dclass) || cls < rules[r].cls_lo ||
            cls > rules[r].cls_hi)
            continue;
        if (i >= MAX_ORDER || !rules[r].cores[i]) return NULL;
        return clattn_core_find(rules[r].cores[i]);
    }
    return NULL;
}

/* ---- parameters as text */

int clattn_core_param_index(const clattn_core *core, const char *name)
{
    for (int i = 0; i < core->nparams; i++)
        if (strcmp(core->params[i].name, name) == 0) return i;
    return -1;
}

int clattn_core_param_valid(const clattn_core_param *param, size_t v)
{
    for (size_t i = 0; i < param->nvalues; i++)
        if (param->values[i] == v) return 1;
    return 0;
}

void clattn_core_params_format(const clattn_core *core, const clattn_core_params *p, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < core->nparams && used < len; i++) {
        const clattn_core_param *q = &core->params[i];
        const char *label = NULL;
        for (size_t k = 0; q->labels && k < q->nvalues; k++)
            if (q->values[k] == p->v[i]) label = q->labels[k];
        int n = label ? snprintf(buf + used, len - used, "%s%s=%s", i ? "," : "", q->name, label)
                      : snprintf(buf + used, len - used, "%s%s=%zu", i ? "," : "", q->name, p->v[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
}

/* One value: a label of the parameter, or a decimal number (at most 9 digits) among its values. */
static int parse_value(const clattn_core_param *q, const char *s, size_t *v)
{
    for (size_t k = 0; q->labels && k < q->nvalues; k++)
        if (strcmp(q->labels[k], s) == 0) {
            *v = q->values[k];
            return 1;
        }
    if (!*s || strlen(s) > 9) return 0;
    for (const char *c = s; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    *v = (size_t)strtoul(s, NULL, 10);
    return clattn_core_param_valid(q, *v);
}

/* The values a parameter takes, for an error message. */
static void value_list(const clattn_core_param *q, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < q->nvalues && used < len; k++) {
        int n = q->labels ? snprintf(buf + used, len - used, "%s%s", k ? ", " : "", q->labels[k])
                          : snprintf(buf + used, len - used, "%s%zu", k ? ", " : "", q->values[k]);
        if (n < 0) break;
        used += (size_t)n;
    }
}

int clattn_core_params_parse(const clattn_core *core, const char *text, clattn_core_params *p, char *why,
                             size_t len)
{
    char buf[256];
    if (strlen(text) >= sizeof buf) {
        snprintf(why, len, "parameters '%.40s...' are too long", text);
        return 0;
    }
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    unsigned given = 0; /* the parameters seen: one given twice would silently take its last value */
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq) {
            snprintf(why, len, "'%s' is not PARAMETER=VALUE", item);
            return 0;
        }
        *eq = '\0';
        const int i = clattn_core_param_index(core, item);
        if (i < 0) {
            char names[128] = "";
            for (int k = 0; k < core->nparams; k++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                         core->params[k].name);
            snprintf(why, len, "%s has no parameter '%s' (%s)", core->name, item, core->nparams ? names : "it has none");
            return 0;
        }
        if (given & (1u << i)) {
            snprintf(why, len, "%s: %s is given twice ('%s'): give each parameter once", core->name, item, text);
            return 0;
        }
        given |= 1u << i;
        size_t v;
        if (!parse_value(&core->params[i], eq + 1, &v)) {
            char values[160];
            value_list(&core->params[i], values, sizeof values);
            snprintf(why, len, "%s %s=%s: the values are %s", core->name, item, eq + 1, values);
            return 0;
        }
        p->v[i] = v;
    }
    return 1;
}

/* The loop-limit check (core.h): here, beside the parameters' formatting it names them with. */
clattn_status clattn_core_check_trips(const clattn_core *core, const clattn_caps *caps, const clattn_attention_desc *d,
                                      const clattn_core_params *p, char *why, size_t len)
{
    if (!caps || !caps->loop_limit) return CLATTN_STATUS_SUCCESS;
    if (!core->trips) {
        snprintf(why, len, "%s has no bound on its work-items' loop iterations, and this device's driver ends a "
                 "work-item's loops after %zu iterations without an error (probed when the device opened)",
                 core->name, caps->loop_limit);
        return CLATTN_STATUS_TOO_LARGE_FOR_DEVICE;
    }
    if (!p) return CLATTN_STATUS_SUCCESS; /* the core alone: it has a bound */
    char params[200] = "";
    clattn_core_params_format(core, p, params, sizeof params);
    const size_t budget = clattn_loop_budget(caps);
    const size_t n = core->trips(core, caps, d, p);
    if (n <= budget) return CLATTN_STATUS_SUCCESS;
    if (d && core->kind == CLATTN_CORE_DECODE)
        snprintf(why, len, "%s (%s) would run up to %zu loop iterations in one work-item for a split-K part of %d keys, "
                 "%zu new tokens, head sizes %zu/%zu; this device's driver ends a work-item's loops after %zu without an "
                 "error (probed when the device opened; clattn keeps within %zu)", core->name, params, n,
                 CLATTN_DECODE_PLAN_KEYS, d->seq_q, d->head_dim_qk, d->head_dim_v, caps->loop_limit, budget);
    else if (d)
        snprintf(why, len, "%s (%s) would run up to %zu loop iterations in one work-item for Tq = %zu, Tk = %zu, head "
                 "sizes %zu/%zu; this device's driver ends a work-item's loops after %zu without an error (probed when "
                 "the device opened; clattn keeps within %zu)", core->name, params, n, d->seq_q,
                 d->seq_kv ? d->seq_kv : d->seq_q, d->head_dim_qk, d->head_dim_v, caps->loop_limit, budget);
    else
        snprintf(why, len, "%s (%s) would run up to %zu loop iterations in one work-item; this device's driver ends a "
                 "work-item's loops after %zu without an error (probed when the device opened; clattn keeps within "
                 "%zu)", core->name, params, n, caps->loop_limit, budget);
    return CLATTN_STATUS_TOO_LARGE_FOR_DEVICE;
}
