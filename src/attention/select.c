/* select.c: which core computes a plan, with which parameters: the one place where the registry's order of
 * preference, the device's tuning file and the environment meet (clattn_core_create), and the list of
 * cores the public API and `clattn cores` show (clattn_core_describe).
 *
 * The environment, read at every plan creation:
 *   CLATTN_CORE=NAME[:P=V,...]   forces core NAME, with these parameters, on the plans that can use it
 *                                (its kind; AUTO or its algorithm; the weights only if it makes them); one it
 *                                cannot serve is refused with its reason, never given another core.
 *   older names, read only when CLATTN_CORE is not set, which keep their old meaning: a preference tried
 *   first, with the usual choice after it when the core cannot serve the plan
 *   CLATTN_FLASH=rows|tiled      flash_rows or flash_tiled first
 *   CLATTN_ATTENTION=unfused     unfused first for AUTO plans (fused, auto: no override)
 *   CLATTN_SOFTMAX=rows|item     the unfused core's SOFTMAX parameter */
#include "attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the environment asks for one plan. */
typedef struct env_request {
    const clattn_core *force;      /* the core forced (NULL: none) */
    int strict;                    /* CLATTN_CORE: that core or a refusal; else only tried first */
    int auto_only;                 /* force AUTO plans only (CLATTN_ATTENTION) */
    const char *var;               /* the variable that forces it */
    const clattn_core *param_core; /* the core `params` are for (the forced one, or unfused: CLATTN_SOFTMAX) */
    char params[200];              /* "P=V,..." ("" = none) */
    const char *param_var;
} env_request;

/* One spec of CLATTN_CORE, "NAME[:P=V,...]", into r when its core is of `kind`; *core_out: its core. */
static clattn_status read_spec(env_request *r, const char *v, const char *spec, clattn_core_kind kind,
                               const clattn_core **core_out)
{
    char name[64];
    const char *colon = strchr(spec, ':');
    const size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    if (n >= sizeof name || (colon && strlen(colon + 1) >= sizeof r->params))
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_CORE='%.60s': too long", v);
    memcpy(name, spec, n);
    name[n] = '\0';
    const clattn_core *c = clattn_core_find(name);
    if (!c) {
        char names[400] = "";
        for (size_t i = 0; i < clattn_core_total(); i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     clattn_core_at(i)->name);
        return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_CORE='%s': no core '%s' (the cores: %s)", v, name,
                           names);
    }
    *core_out = c;
    if (c->kind != kind) return CLATTN_STATUS_SUCCESS;
    r->force = c;
    r->var = r->param_var = "CLATTN_CORE";
    r->strict = 1;
    r->param_core = c;
    if (colon) snprintf(r->params, sizeof r->params, "%s", colon + 1);
    return CLATTN_STATUS_SUCCESS;
}

/* What the environment asks for plans of `kind`. CLATTN_CORE holds specs separated by ';', at most one core
 * of each kind; the older variables are read only when it is not set, and only for prefill plans. */
static clattn_status read_env(const clattn_device *dev, env_request *r, clattn_core_kind kind)
{
    memset(r, 0, sizeof *r);
    const clattn_tune_table *tn = dev ? clattn_tune_active(dev) : NULL;
    if (tn && tn->selftest) { /* clattn_device_selftest's core, and the environment not read */
        if (tn->force[kind]) {
            r->force = r->param_core = tn->force[kind];
            r->var = r->param_var = "clattn_device_selftest";
            r->strict = 1;
        }
        return CLATTN_STATUS_SUCCESS;
    }
    const char *v = getenv("CLATTN_CORE");
    if (v && *v) {
        char buf[600];
        if (strlen(v) >= sizeof buf) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_CORE='%.60s...': too "
                                                        "long", v);
        snprintf(buf, sizeof buf, "%s", v);
        const clattn_core *seen[CLATTN_CORE_BACKWARD + 1] = {NULL};
        char *save = NULL;
        for (char *spec = strtok_r(buf, ";", &save); spec; spec = strtok_r(NULL, ";", &save)) {
            const clattn_core *c = NULL;
            TRY(read_spec(r, v, spec, kind, &c));
            if (seen[c->kind])
                return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_CORE='%s': two %s cores (%s and %s): at "
                                   "most one of each kind", v, clattn_core_kind_name(c->kind), seen[c->kind]->name,
                                   c->name);
            seen[c->kind] = c;
        }
        return CLATTN_STATUS_SUCCESS;
    }
    if (kind != CLATTN_CORE_PREFILL) return CLATTN_STATUS_SUCCESS;
    const char *flash = getenv("CLATTN_FLASH"), *alg = getenv("CLATTN_ATTENTION"), *sm = getenv("CLATTN_SOFTMAX");
    if (flash && *flash) {
        if (strcmp(flash, "rows") != 0 && strcmp(flash, "tiled") != 0)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_FLASH='%s': expected rows or tiled", flash);
        r->force = clattn_core_legacy("CLATTN_FLASH", flash, NULL);
        r->var = "CLATTN_FLASH";
    } else if (alg && *alg) {
        if (strcmp(alg, "fused") != 0 && strcmp(alg, "unfused") != 0 && strcmp(alg, "auto") != 0)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_ATTENTION='%s': expected fused, unfused or "
                               "auto", alg);
        r->force = clattn_core_legacy("CLATTN_ATTENTION", alg, NULL); /* fused and auto force none */
        if (r->force) r->auto_only = 1, r->var = "CLATTN_ATTENTION";
    }
    if (sm && *sm) {
        if (strcmp(sm, "rows") != 0 && strcmp(sm, "item") != 0)
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "CLATTN_SOFTMAX='%s': expected rows or item", sm);
        const char *params = "";
        r->param_core = clattn_core_legacy("CLATTN_SOFTMAX", sm, &params);
        r->param_var = "CLATTN_SOFTMAX";
        snprintf(r->params, sizeof r->params, "%s", params);
    }
    return CLATTN_STATUS_SUCCESS;
}

/* Can a plan of this kind and description use the core at all (before the core's own limits)? A GEMM core
 * serves any plan: the algorithm and the weights are its attention core's concern; a backward core any training
 * plan. */
static int eligible(const clattn_core *c, clattn_core_kind kind, const clattn_attention_desc *d)
{
    if (c->kind != kind) return 0;
    if (kind == CLATTN_CORE_GEMM) return 1;
    if (kind == CLATTN_CORE_BACKWARD) return d->training;
    return (d->algorithm == CLATTN_ALGORITHM_AUTO || c->algorithm == d->algorithm) &&
           (!d->need_weights || c->produces_weights) && (!(d->training || d->sinks) || c->saves_row_stats);
}

/* The layout as this core sees it: the biases stay the shell's unless the core adds them (a GEMM core gets
 * none), and a half plan's arrays are float (the shell converts them) unless the core reads the types. */
static clattn_core_layout layout_for(const clattn_core *c, const clattn_core_layout *lay)
{
    clattn_core_layout l = lay ? *lay : (clattn_core_layout){0};
    if (!c->adds_biases) l.bias_q = l.bias_k = l.bias_v = 0;
    if (!c->reads_dtypes) l.io_dtype = CLATTN_DTYPE_F32;
    return l;
}

static clattn_status check_memory(const clattn_device *dev, const clattn_core *c, const clattn_attention_desc *d,
                                  const clattn_core_layout *lay, size_t other_floats)
{
    const size_t total = other_floats + (c->workspace ? c->workspace(c, &dev->caps, d, lay) : 0);
    if (total > dev->caps.global_mem / sizeof(float))
        return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                           "these dimensions need about %zu bytes of device memory, more than its global memory "
                           "(%zu bytes)", total * sizeof(float), dev->caps.global_mem);
    return CLATTN_STATUS_SUCCESS;
}

/* Parameters for core c on plan d: the environment's over the defaults (refused when they do not parse or
 * do not fit), else the tuning file's when they fit (*tuned = 1), else the defaults. UNSUPPORTED (why in
 * the error) when no parameters of c fit. */
static clattn_status params_for(const clattn_device *dev, const env_request *r, const clattn_core *c,
                                const clattn_attention_desc *d, clattn_core_params *p, int *tuned)
{
    *tuned = 0;
    memset(p, 0, sizeof *p);
    if (!c->defaults(c, &dev->caps, d, p))
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "no parameters of %s fit this plan on this device", c->name);
    if (r->param_core == c && r->params[0]) {
        char why[300];
        if (!clattn_core_params_parse(c, r->params, p, why, sizeof why))
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: %s", r->param_var, why);
        if (c->fits && !c->fits(c, &dev->caps, d, p)) { /* the limit named where it is local memory */
            const size_t need = c->local_bytes ? c->local_bytes(c, &dev->caps, d, p) : 0;
            char limit[160] = "";
            if (need + CLATTN_LOCAL_SLACK > dev->caps.local_mem)
                snprintf(limit, sizeof limit, ": its kernel needs %zu bytes of local memory, the device has %zu", need,
                         dev->caps.local_mem);
            return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "%s: core %s with %s does not fit this plan on this device%s",
                               r->param_var, c->name, r->params, limit);
        }
        return CLATTN_STATUS_SUCCESS;
    }
    const int cls = clattn_head_class(d->head_dim_qk, d->head_dim_v);
    const clattn_core_params *t = clattn_tune_params(clattn_tune_active(dev), c, cls);
    if (t && (!c->fits || c->fits(c, &dev->caps, d, t))) {
        *p = *t;
        *tuned = 1;
    }
    return CLATTN_STATUS_SUCCESS;
}

/* Build core c for plan d. *refused = 1 when the failure is c's own (it does not take d, no parameters of
 * it fit, or it does not build for this device: the next core may), 0 when it is the plan's. forced
 * (CLATTN_CORE): no other core will be tried, so the error names the variable. A build with the tuning
 * file's parameters that fails is tried again with the defaults. */
static clattn_status try_core(const clattn_device *dev, const env_request *r, const clattn_core *c, int forced,
                              const clattn_attention_desc *plan_desc, const clattn_core_layout *lay0,
                              size_t other_floats, clattn_core_instance *out, int *refused)
{
    const clattn_core_layout lay = layout_for(c, lay0);
    /* the core's view of the plan: its dtype is the type of the arrays it reads (core.h) */
    clattn_attention_desc cd = *plan_desc;
    cd.dtype = lay.io_dtype;
    const clattn_attention_desc *d = &cd;
    char why[300] = "";
    *refused = 1;
    clattn_status sup = c->supports(c, &dev->caps, d, why, sizeof why);
    /* TF32 is the attention core's: the projections stay fp32 */
    if (sup == CLATTN_STATUS_SUCCESS && c->kind != CLATTN_CORE_GEMM && d->precision == CLATTN_PRECISION_TF32 &&
        !c->tf32) {
        sup = CLATTN_STATUS_UNSUPPORTED;
        snprintf(why, sizeof why, "%s computes in fp32 only (precision TF32 needs TF32 products: flash_mma, which "
                 "AUTO does not choose yet; CLATTN_CORE=flash_mma forces it)", c->name);
    }
    if (sup == CLATTN_STATUS_SUCCESS && !forced && c->native && !c->native(c, &dev->caps, why, sizeof why))
        sup = CLATTN_STATUS_UNSUPPORTED; /* an emulation: for CLATTN_CORE only */
    if (sup != CLATTN_STATUS_SUCCESS)
        return forced ? clattn_fail(sup, "%s forces core %s: %s", r->var, c->name, why) : clattn_fail(sup, "%s", why);
    clattn_core_params p;
    int tuned;
    const clattn_status pst = params_for(dev, r, c, d, &p, &tuned);
    if (pst != CLATTN_STATUS_SUCCESS) {
        *refused = pst == CLATTN_STATUS_UNSUPPORTED;
        return pst;
    }
    /* the device's loop limit (a driver defect the probes measure): the tuning file's parameters past it give
     * way to the defaults, which keep within it where any parameters can; past it still, the core is refused */
    clattn_status trips = clattn_core_check_trips(c, &dev->caps, d, &p, why, sizeof why);
    if (trips != CLATTN_STATUS_SUCCESS && tuned && c->trips) {
        c->defaults(c, &dev->caps, d, &p);
        tuned = 0;
        trips = clattn_core_check_trips(c, &dev->caps, d, &p, why, sizeof why);
    }
    if (trips != CLATTN_STATUS_SUCCESS)
        return forced ? clattn_fail(trips, "%s forces core %s: %s", r->var, c->name, why) : clattn_fail(trips, "%s", why);
    *refused = 0;
    TRY(check_memory(dev, c, d, &lay, other_floats));
    out->core = c;
    out->params = p;
    out->tuned = tuned;
    const clattn_core_layout *lp = lay0 ? &lay : NULL;
    clattn_status st = c->build(c, dev, d, lp, &p, &out->state);
    if (st != CLATTN_STATUS_SUCCESS && tuned && !forced) {
        clattn_clear_error(); /* the file's parameters did not build here: the defaults */
        c->defaults(c, &dev->caps, d, &p);
        out->params = p;
        out->tuned = 0;
        st = c->build(c, dev, d, lp, &p, &out->state);
    }
    if (st != CLATTN_STATUS_SUCCESS) out->core = NULL, out->state = NULL;
    *refused = st == CLATTN_STATUS_UNSUPPORTED;
    return st;
}

clattn_status clattn_core_create(const clattn_device *dev, clattn_core_kind kind, const clattn_attention_desc *d,
                                 const clattn_core_layout *lay, size_t other_floats, clattn_core_instance *out)
{
    memset(out, 0, sizeof *out);
    env_request r;
    TRY(read_env(dev, &r, kind));
    int refused;
    const int forced = r.force && eligible(r.force, kind, d) && !(r.auto_only && d->algorithm != CLATTN_ALGORITHM_AUTO);
    if (forced && r.strict) return try_core(dev, &r, r.force, 1, d, lay, other_floats, out, &refused);
    /* AUTO's order: an older variable's core, the tuning file's core for the head-size class, then the
     * registry's preference */
    const int cls = clattn_head_class(d->head_dim_qk, d->head_dim_v);
    const clattn_tune_table *tn = clattn_tune_active(dev);
    const clattn_core *tried[16];
    size_t ntried = 0;
    char reasons[900] = "";
    int fp32_only = 0; /* cores skipped for a TF32 plan: they compute in fp32 only */
    clattn_status refusal = CLATTN_STATUS_SUCCESS; /* the refusals' status, when they all agree */
    for (size_t i = 0;; i++) {
        const clattn_core *c = NULL;
        if (i == 0) {
            if (!forced) continue;
            c = r.force;
        } else if (i == 1) {
            if (forced || !tn || !(c = tn->auto_core[kind][cls])) continue;
        } else if (!(c = clattn_core_preferred(kind, dev->caps.dclass, cls, i - 2))) {
            break;
        }
        int seen = 0;
        for (size_t k = 0; k < ntried; k++) seen |= tried[k] == c;
        if (seen || !eligible(c, kind, d) || ntried >= sizeof tried / sizeof tried[0]) continue;
        tried[ntried++] = c;
        if (i > 0 && clattn_caps_failed(&dev->caps, c->name)) { /* AUTO never takes it here */
            snprintf(reasons + strlen(reasons), sizeof reasons - strlen(reasons), "%s%s failed clattn selftest on this "
                     "device and driver", reasons[0] ? "; " : "", c->name);
            continue;
        }
        if (kind != CLATTN_CORE_GEMM && d->precision == CLATTN_PRECISION_TF32 && !c->tf32) {
            fp32_only++; /* one reason for them all, said once below */
            continue;
        }
        const clattn_status st = try_core(dev, &r, c, 0, d, lay, other_floats, out, &refused);
        if (st == CLATTN_STATUS_SUCCESS) {
            out->tuned |= i == 1;
            return st;
        }
        if (!refused) return st;
        refusal = refusal == CLATTN_STATUS_SUCCESS || refusal == st ? st : CLATTN_STATUS_UNSUPPORTED;
        snprintf(reasons + strlen(reasons), sizeof reasons - strlen(reasons), "%s%s", reasons[0] ? "; " : "",
                 clattn_last_error());
    }
    char tf32[240] = "";
    if (fp32_only)
        snprintf(tf32, sizeof tf32, "precision TF32 needs TF32 products, which %d of its cores do not have (they "
                 "compute in fp32 only; flash_mma has them, and AUTO does not choose it yet: CLATTN_CORE=flash_mma "
                 "forces it)%s", fp32_only, reasons[0] ? "; " : "");
    return clattn_fail(refusal == CLATTN_STATUS_SUCCESS ? CLATTN_STATUS_UNSUPPORTED : refusal,
                       "%sno %s core can compute this plan on this device%s%s%s",
                       kind != CLATTN_CORE_GEMM && d->algorithm == CLATTN_ALGORITHM_FUSED ? "algorithm FUSED: " : "",
                       clattn_core_kind_name(kind), reasons[0] || tf32[0] ? ": " : "", tf32, reasons);
}

void clattn_core_env_note(const clattn_device *dev, const char *const *ran, int n)
{
    clattn_set_notice("%s", "");
    const char *v = getenv("CLATTN_CORE");
    if (!v || !*v) return;
    if (dev->backend != CLATTN_BACKEND_OPENCL) {
        clattn_set_notice("CLATTN_CORE='%.400s' is not used on the ref device: it computes every plan with the CPU "
                          "reference (cores run on OpenCL devices)", v);
        return;
    }
    char buf[600], named[400] = "", runs[200] = "";
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *spec = strtok_r(buf, ";", &save); spec; spec = strtok_r(NULL, ";", &save)) {
        char *colon = strchr(spec, ':');
        if (colon) *colon = '\0';
        for (int i = 0; i < n; i++)
            if (ran[i] && strcmp(ran[i], spec) == 0) return; /* it names a core the plan runs: it applies */
        const clattn_core *c = clattn_core_find(spec);
        snprintf(named + strlen(named), sizeof named - strlen(named), "%s%s (a %s core)", named[0] ? ", " : "", spec,
                 c ? clattn_core_kind_name(c->kind) : "unknown");
    }
    for (int i = 0; i < n; i++)
        if (ran[i] && ran[i][0])
            snprintf(runs + strlen(runs), sizeof runs - strlen(runs), "%s%s", runs[0] ? ", " : "", ran[i]);
    clattn_set_notice("CLATTN_CORE='%.200s' names no core this plan runs, so it does nothing here: it names %s; this "
                      "plan runs %s (each plan kind takes its own kinds: prefill, gemm and, when training, backward "
                      "for attention and encoder plans; decode and gemm for decode plans)", v, named, runs);
}

clattn_status clattn_core_env_check(void)
{
    clattn_clear_error();
    for (int kind = CLATTN_CORE_PREFILL; kind <= CLATTN_CORE_BACKWARD; kind++) {
        env_request r;
        TRY(read_env(NULL, &r, (clattn_core_kind)kind));
        clattn_core_params p = {{0}};
        char why[300];
        if (r.param_core && r.params[0] && !clattn_core_params_parse(r.param_core, r.params, &p, why, sizeof why))
            return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "%s: %s", r.param_var, why);
    }
    return CLATTN_STATUS_SUCCESS;
}

void clattn_core_destroy(clattn_core_instance *inst)
{
    if (inst->core && inst->state) inst->core->release(inst->state);
    memset(inst, 0, sizeof *inst);
}

/* ---- the public list (clattn.h, "cores") */

size_t clattn_core_count(void) { return clattn_core_total(); }

/* AUTO's core for a plan of head-size class cls and kind on dev, without building it: the tuning file's,
 * else the first in the order of preference that supports a representative plan (head sizes at the
 * class's top, one head, 1024 tokens). */
static const clattn_core *auto_choice(const clattn_device *dev, clattn_core_kind kind, int cls)
{
    static const size_t top[CLATTN_HEAD_CLASSES] = {32, 64, 128, 256, 512};
    const size_t hd = top[cls];
    const clattn_attention_desc d = {.batch = 1, .seq_q = 1024, .seq_kv = 1024, .embed = hd, .kv_embed = hd,
                                     .heads = 1, .kv_heads = 1, .head_dim_qk = hd, .head_dim_v = hd,
                                     .causal = kind == CLATTN_CORE_DECODE};
    const clattn_tune_table *tn = clattn_tune_active(dev);
    char why[300];
    const clattn_core *c = tn ? tn->auto_core[kind][cls] : NULL;
    if (c && c->supports(c, &dev->caps, &d, why, sizeof why) == CLATTN_STATUS_SUCCESS &&
        (!c->native || c->native(c, &dev->caps, why, sizeof why)))
        return c;
    clattn_core_params p;
    for (size_t i = 0; (c = clattn_core_preferred(kind, dev->caps.dclass, cls, i)); i++)
        if (c->supports(c, &dev->caps, &d, why, sizeof why) == CLATTN_STATUS_SUCCESS &&
            (!c->native || c->native(c, &dev->caps, why, sizeof why)) && !clattn_caps_failed(&dev->caps, c->name) &&
            c->defaults(c, &dev->caps, &d, &p) &&
            clattn_core_check_trips(c, &dev->caps, &d, &p, why, sizeof why) == CLATTN_STATUS_SUCCESS)
            return c;
    return NULL;
}

clattn_status clattn_core_describe(const clattn_device *device, size_t index, clattn_core_info *info)
{
    clattn_clear_error();
    if (!info) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "info is NULL");
    const clattn_core *c = clattn_core_at(index);
    if (!c) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "core index %zu: there are %zu cores", index,
                               clattn_core_total());
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", c->name);
    info->kind = c->kind;
    info->algorithm = c->algorithm;
    info->produces_weights = c->produces_weights;
    info->reads_dtypes = c->reads_dtypes;
    for (int i = 0; i < c->nparams; i++)
        snprintf(info->params + strlen(info->params), sizeof info->params - strlen(info->params), "%s%s", i ? " " : "",
                 c->params[i].name);
    for (int i = 0; c->test_configs && c->test_configs[i]; i++)
        snprintf(info->test_configs + strlen(info->test_configs), sizeof info->test_configs - strlen(info->test_configs),
                 "%s%s", i ? " " : "", c->test_configs[i]);
    if (!device) {
        snprintf(info->reason, sizeof info->reason, "no device given");
        return CLATTN_STATUS_SUCCESS;
    }
    if (device->backend != CLATTN_BACKEND_OPENCL) {
        snprintf(info->reason, sizeof info->reason, "the ref device computes every plan with the CPU reference "
                 "(cores run on OpenCL devices)");
        return CLATTN_STATUS_SUCCESS;
    }
    /* supported: it takes some plan here, and its loops are bounded where the driver ends them early */
    const int sup = c->supports(c, &device->caps, NULL, info->reason, sizeof info->reason) == CLATTN_STATUS_SUCCESS &&
                    clattn_core_check_trips(c, &device->caps, NULL, NULL, info->reason, sizeof info->reason) ==
                        CLATTN_STATUS_SUCCESS;
    const int nat = !sup || !c->native || c->native(c, &device->caps, info->reason, sizeof info->reason);
    const int failed = sup && nat && clattn_caps_failed(&device->caps, c->name);
    if (failed)
        snprintf(info->reason, sizeof info->reason, "%s failed clattn selftest on this device and driver (CLATTN_CORE "
                 "still forces it; `clattn selftest` again records new verdicts)", c->name);
    info->supported = sup && nat && !failed;
    info->emulated = sup && !nat;
    if (info->supported) info->reason[0] = '\0';
    for (int cls = 0; cls < CLATTN_HEAD_CLASSES; cls++)
        if (auto_choice(device, c->kind, cls) == c) info->default_for |= 1u << cls;
    return CLATTN_STATUS_SUCCESS;
}

const char *clattn_head_class_label(int cls) { return clattn_head_class_name(cls); }
