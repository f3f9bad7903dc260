/* probes.c: the device probes (cl/runtime/probe_device.cl), run once when a device opens. They measure what no
 * query reports and drivers get wrong without an error (issue 45, Mesa 22's rusticl on llvmpipe):
 *   loop_limit    how many loop iterations one work-item completes (llvmpipe: 65,535, all loops together);
 *   ieee_nan      whether NaN and Inf propagate through multiply and add (rusticl folds 0.0f * x to 0);
 *   profiling_ok  whether event timestamps advance across a real kernel (rusticl reports 0, 1, 2, 3 ns);
 *   local_report  the local memory the driver reports for a kernel declaring 4096 bytes (rusticl: 8192).
 * The facts are kept in the kernel cache's directory (the same trust rules), keyed by clattn's version, the
 * device and its driver version, so a second process reads them instead of probing (a few ms otherwise). Beside
 * them, under the same key, the last self-test's verdicts (tune/selftest.c): the cores that failed on this driver. */
#include "runtime.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROBES_MAGIC "CLATTN-PROBES 2\n"

static void cache_key(const clattn_device *dev, char *key, size_t len)
{
    snprintf(key, len, "%sclattn %s\ndevice %s\nvendor %s\ndriver %s\n", PROBES_MAGIC, clattn_version(), dev->name,
             dev->caps.vendor, dev->caps.driver);
}

/* The facts of the devices probed in this process (a device opened again is not probed again, even when the
 * cache directory is off: each probe builds a program, and some drivers keep memory per program built). */
#define MEMO_SLOTS 16
static struct {
    uint64_t key;
    clattn_caps facts;
} memo[MEMO_SLOTS];
static int memo_used;
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;

static int memo_get(clattn_caps *c, const char *key)
{
    const uint64_t h = clattn_hash_text(key);
    int found = 0;
    pthread_mutex_lock(&memo_lock);
    for (int i = 0; i < memo_used && !found; i++)
        if (memo[i].key == h) {
            c->loop_limit = memo[i].facts.loop_limit;
            c->ieee_nan = memo[i].facts.ieee_nan;
            c->profiling_ok = memo[i].facts.profiling_ok;
            c->local_report = memo[i].facts.local_report;
            memcpy(c->probe_note, memo[i].facts.probe_note, sizeof c->probe_note);
            found = 1;
        }
    pthread_mutex_unlock(&memo_lock);
    return found;
}

static void memo_put(const clattn_caps *c, const char *key)
{
    pthread_mutex_lock(&memo_lock);
    if (memo_used < MEMO_SLOTS) {
        memo[memo_used].key = clattn_hash_text(key);
        memo[memo_used].facts = *c;
        memo_used++;
    }
    pthread_mutex_unlock(&memo_lock);
}

/* The facts from the cache: 1 when a whole entry for this key was there. */
static int cache_load(clattn_caps *c, const char *key)
{
    char path[1200], text[2048];
    if (!clattn_cache_path(key, ".probes", path, sizeof path)) return 0;
    FILE *f = clattn_cache_open(path);
    if (!f) return 0;
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const size_t kl = strlen(key);
    if (n <= kl || memcmp(text, key, kl) != 0) return 0;
    unsigned long long limit = 0, local = 0;
    int nan = 0, prof = 0, used = 0;
    if (sscanf(text + kl, "loop_limit %llu\nieee_nan %d\nprofiling_ok %d\nlocal_report %llu\nnote %n", &limit, &nan,
               &prof, &local, &used) != 4 ||
        used == 0 || local < 4096)
        return 0;
    const char *note = text + kl + used, *end = strchr(note, '\n');
    if (!end || strcmp(end, "\nend\n") != 0 || (size_t)(end - note) >= sizeof c->probe_note) return 0;
    c->loop_limit = (size_t)limit;
    c->ieee_nan = nan != 0;
    c->profiling_ok = prof != 0;
    c->local_report = (size_t)local;
    memcpy(c->probe_note, note, (size_t)(end - note));
    c->probe_note[end - note] = '\0';
    return 1;
}

static void cache_store(const clattn_caps *c, const char *key)
{
    char path[1200], text[2048];
    if (!clattn_cache_path(key, ".probes", path, sizeof path)) return;
    const int n = snprintf(text, sizeof text,
                           "%sloop_limit %llu\nieee_nan %d\nprofiling_ok %d\nlocal_report %llu\nnote %s\nend\n", key,
                           (unsigned long long)c->loop_limit, c->ieee_nan, c->profiling_ok,
                           (unsigned long long)c->local_report, c->probe_note);
    if (n > 0 && (size_t)n < sizeof text) clattn_cache_write(path, text, (size_t)n);
}

static void note(clattn_caps *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(clattn_caps *c, const char *fmt, ...)
{
    const size_t used = strlen(c->probe_note);
    if (used + 3 >= sizeof c->probe_note) return;
    if (used) strcat(c->probe_note, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->probe_note + strlen(c->probe_note), sizeof c->probe_note - strlen(c->probe_note), fmt, ap);
    va_end(ap);
}

static cl_ulong event_time(cl_event e, cl_profiling_info what, int *ok)
{
    cl_ulong t = 0;
    if (clGetEventProfilingInfo(e, what, sizeof t, &t, NULL) != CL_SUCCESS) *ok = 0;
    return t;
}

/* The loop probe, on a queue of its own with profiling: the trips one work-item completed, and whether the
 * launch's timestamps advanced (a kernel of 2^20 dependent-free loads takes far more than a microsecond). */
static int probe_loop(clattn_device *dev, cl_kernel k, cl_mem ones, cl_mem out)
{
    clattn_caps *c = &dev->caps;
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(dev->context, dev->device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) {
        q = NULL;
        c->profiling_ok = 0;
        note(c, "no profiling queue (%d)", err);
    }
    cl_command_queue use = q ? q : dev->queue;
    const cl_int n = (cl_int)CLATTN_PROBE_LOOP_TRIPS;
    cl_int got = -1;
    cl_event ev = NULL;
    size_t one = 1;
    err = clSetKernelArg(k, 0, sizeof ones, &ones);
    if (err == CL_SUCCESS) err = clSetKernelArg(k, 1, sizeof out, &out);
    if (err == CL_SUCCESS) err = clSetKernelArg(k, 2, sizeof n, &n);
    if (err == CL_SUCCESS) err = clEnqueueNDRangeKernel(use, k, 1, NULL, &one, &one, 0, NULL, &ev);
    if (err == CL_SUCCESS) err = clEnqueueReadBuffer(use, out, CL_TRUE, 0, sizeof got, &got, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        note(c, "the loop probe did not run (%d)", err);
    } else if (got < 0 || got > n) {
        note(c, "the loop probe returned %d of %d trips", (int)got, (int)n);
    } else if (got < n) {
        c->loop_limit = (size_t)got;
        note(c, "a work-item's loops end after %d iterations in all, without an error", (int)got);
    }
    if (q && ev && err == CL_SUCCESS) {
        int ok = 1;
        const cl_ulong queued = event_time(ev, CL_PROFILING_COMMAND_QUEUED, &ok),
                       submit = event_time(ev, CL_PROFILING_COMMAND_SUBMIT, &ok),
                       start = event_time(ev, CL_PROFILING_COMMAND_START, &ok),
                       end = event_time(ev, CL_PROFILING_COMMAND_END, &ok);
        size_t res = 0;
        if (clGetDeviceInfo(dev->device, CL_DEVICE_PROFILING_TIMER_RESOLUTION, sizeof res, &res, NULL) != CL_SUCCESS)
            res = 0;
        c->profiling_ok = ok && res > 0 && queued <= submit && submit <= start && start < end && end - start >= 1000;
        if (!c->profiling_ok)
            note(c, "profiling timestamps are not real (a %d-trip kernel: %llu ns, timer resolution %zu ns)", (int)got,
                 (unsigned long long)(end - start), res);
    }
    if (ev) clReleaseEvent(ev);
    if (q) clReleaseCommandQueue(q);
    return err == CL_SUCCESS;
}

static void probe_nan(clattn_device *dev, cl_kernel k, cl_mem in, cl_mem out)
{
    static const char *const what[] = {"0 * NaN", "0 * Inf", "0.0f * NaN (a literal 0)", "NaN + 1", "Inf - Inf",
                                       "fma(0, Inf, 1)", "Inf * 1"};
    cl_int got[7] = {0};
    cl_int err = clSetKernelArg(k, 0, sizeof in, &in);
    if (err == CL_SUCCESS) err = clSetKernelArg(k, 1, sizeof out, &out);
    size_t one = 1;
    if (err == CL_SUCCESS) err = clEnqueueNDRangeKernel(dev->queue, k, 1, NULL, &one, &one, 0, NULL, NULL);
    if (err == CL_SUCCESS) err = clEnqueueReadBuffer(dev->queue, out, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        note(&dev->caps, "the NaN probe did not run (%d)", err);
        return;
    }
    for (int i = 0; i < 7; i++)
        if (got[i] != 1) {
            dev->caps.ieee_nan = 0;
            note(&dev->caps, "%s is not %s", what[i], i == 6 ? "Inf" : "NaN");
        }
}

/* The local memory the driver reports for 4096 bytes declared (the kernel is built, never launched). */
static void probe_local(clattn_device *dev, cl_program prog)
{
    cl_int err;
    cl_kernel k = clCreateKernel(prog, "clattn_probe_local", &err);
    cl_ulong used = 0;
    if (err == CL_SUCCESS)
        err = clGetKernelWorkGroupInfo(k, dev->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof used, &used, NULL);
    if (k) clReleaseKernel(k);
    if (err == CL_SUCCESS && used > 4096) {
        dev->caps.local_report = (size_t)used;
        note(&dev->caps, "CL_KERNEL_LOCAL_MEM_SIZE reports %llu bytes for 4096 declared", (unsigned long long)used);
    }
}

void clattn_probes_run(clattn_device *dev)
{
    clattn_caps *c = &dev->caps;
    c->loop_limit = 0;
    c->ieee_nan = 1;
    c->profiling_ok = 1;
    c->local_report = 4096;
    c->probe_note[0] = '\0';
    char key[1024];
    cache_key(dev, key, sizeof key);
    if (memo_get(c, key)) return;
    if (cache_load(c, key)) {
        memo_put(c, key);
        return;
    }

    const char *src[] = {"runtime/probe_device"};
    cl_program prog = clattn_program_try_build_uncached(dev, src, 1, "-cl-std=CL1.2");
    cl_kernel kl = NULL, kn = NULL;
    cl_mem ones = NULL, out = NULL, in = NULL;
    cl_int err = prog ? CL_SUCCESS : CL_BUILD_PROGRAM_FAILURE;
    static const cl_int ones_host[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    const float in_host[4] = {0.0f, NAN, INFINITY, 1.0f};
    if (err == CL_SUCCESS) kl = clCreateKernel(prog, "clattn_probe_loop", &err);
    if (err == CL_SUCCESS) kn = clCreateKernel(prog, "clattn_probe_nan", &err);
    if (err == CL_SUCCESS)
        ones = clCreateBuffer(dev->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof ones_host,
                              (void *)ones_host, &err);
    if (err == CL_SUCCESS)
        in = clCreateBuffer(dev->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof in_host, (void *)in_host,
                            &err);
    if (err == CL_SUCCESS) out = clCreateBuffer(dev->context, CL_MEM_READ_WRITE, 8 * sizeof(cl_int), NULL, &err);
    int ran = 0;
    if (err != CL_SUCCESS) {
        note(c, "the probe kernels did not build or start (%d): the driver's defects are unknown", err);
        c->profiling_ok = dev->queue_profiling;
    } else {
        ran = probe_loop(dev, kl, ones, out);
        probe_nan(dev, kn, in, out);
        probe_local(dev, prog);
    }
    if (in) clReleaseMemObject(in);
    if (out) clReleaseMemObject(out);
    if (ones) clReleaseMemObject(ones);
    if (kn) clReleaseKernel(kn);
    if (kl) clReleaseKernel(kl);
    if (prog) clReleaseProgram(prog);
    if (ran) {
        cache_store(c, key);
        memo_put(c, key);
    }
}

clattn_status clattn_profiling_check(const clattn_device *dev)
{
    if (!dev->queue_profiling)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED, "the command queue was created without CL_QUEUE_PROFILING_ENABLE");
    if (!dev->caps.profiling_ok)
        return clattn_fail(CLATTN_STATUS_UNSUPPORTED,
                           "profiling is unsupported on %s: its event timestamps are not real (the device probe: %s)",
                           dev->name, dev->caps.probe_note);
    return CLATTN_STATUS_SUCCESS;
}

size_t clattn_loop_budget(const clattn_caps *caps)
{
    /* an eighth kept back for the loops the cores' trip counts leave out (prologues, epilogues, stores) */
    return caps->loop_limit ? caps->loop_limit - caps->loop_limit / 8 : SIZE_MAX;
}

clattn_status clattn_loop_check(const clattn_caps *caps, size_t trips, const char *what)
{
    const size_t budget = clattn_loop_budget(caps);
    if (trips <= budget) return CLATTN_STATUS_SUCCESS;
    return clattn_fail(CLATTN_STATUS_TOO_LARGE_FOR_DEVICE,
                       "%s would run up to %zu loop iterations in one work-item; this device's driver ends a work-item's "
                       "loops after %zu without an error (probed when the device opened; clattn keeps within %zu)",
                       what, trips, caps->loop_limit, budget);
}

/* ---- the self-test's verdicts: "<key>failed NAME NAME \nend\n" in <hash>.selftest */

#define VERDICTS_MAGIC "CLATTN-SELFTEST 1\n"

static void verdicts_key(const clattn_device *dev, char *key, size_t len)
{
    snprintf(key, len, "%sclattn %s\ndevice %s\nvendor %s\ndriver %s\n", VERDICTS_MAGIC, clattn_version(), dev->name,
             dev->caps.vendor, dev->caps.driver);
}

void clattn_verdicts_load(clattn_device *dev)
{
    clattn_caps *c = &dev->caps;
    c->selftest_failed[0] = '\0';
    char key[1024], path[1200], text[1600];
    verdicts_key(dev, key, sizeof key);
    if (!clattn_cache_path(key, ".selftest", path, sizeof path)) return;
    FILE *f = clattn_cache_open(path);
    if (!f) return;
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const size_t kl = strlen(key);
    if (n <= kl || memcmp(text, key, kl) != 0 || strncmp(text + kl, "failed ", 7) != 0) return;
    const char *names = text + kl + 7, *end = strchr(names, '\n');
    if (!end || strcmp(end, "\nend\n") != 0 || (size_t)(end - names) + 3 >= sizeof c->selftest_failed) return;
    if (end > names) snprintf(c->selftest_failed, sizeof c->selftest_failed, " %.*s ", (int)(end - names), names);
}

int clattn_verdicts_store(clattn_device *dev, const char *failed)
{
    clattn_caps *c = &dev->caps;
    c->selftest_failed[0] = '\0';
    if (failed[0] && strlen(failed) + 3 < sizeof c->selftest_failed)
        snprintf(c->selftest_failed, sizeof c->selftest_failed, " %s ", failed);
    char key[1024], path[1200], text[1600];
    verdicts_key(dev, key, sizeof key);
    if (!clattn_cache_path(key, ".selftest", path, sizeof path)) return 0;
    const int n = snprintf(text, sizeof text, "%sfailed %s\nend\n", key, failed);
    return n > 0 && (size_t)n < sizeof text && clattn_cache_write(path, text, (size_t)n);
}

void clattn_caps_fail(clattn_caps *caps, const char *name)
{
    const size_t used = strlen(caps->selftest_failed);
    if (clattn_caps_failed(caps, name) || used + strlen(name) + 3 > sizeof caps->selftest_failed) return;
    snprintf(caps->selftest_failed + used, sizeof caps->selftest_failed - used, "%s%s ", used ? "" : " ", name);
}

int clattn_caps_failed(const clattn_caps *caps, const char *name)
{
    char word[80];
    snprintf(word, sizeof word, " %s ", name);
    return caps->selftest_failed[0] && strstr(caps->selftest_failed, word) != NULL;
}
