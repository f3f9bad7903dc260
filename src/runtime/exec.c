/* exec.c: the OpenCL execution shell shared by the attention and encoder plans: the host
 * path (uploads, the pass, completion, the output read last) and the buffer path (the
 * caller's wait list, the pass, a completion event). The passes only enqueue. And the stage times of a
 * profiled pass, from its markers. */
#include "runtime.h"

clattn_status clattn_exec_host(const clattn_device *dev, const clattn_transfer *in, int nin, clattn_pass_fn pass,
                               void *ctx, const clattn_transfer *out, int nout)
{
    cl_command_queue q = dev->queue;
    clattn_status st = CLATTN_STATUS_SUCCESS;
    for (int i = 0; i < nin && st == CLATTN_STATUS_SUCCESS; i++) {
        if (!in[i].buf || !in[i].bytes) continue; /* nothing to upload (a varlen batch without keys) */
        cl_int err = clEnqueueWriteBuffer(q, in[i].buf, CL_FALSE, 0, in[i].bytes, in[i].host, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            st = clattn_fail((clattn_status)err, "uploading %s failed (%d: %s)", in[i].what, err,
                             clattn_status_string(err));
    }
    if (st == CLATTN_STATUS_SUCCESS) st = pass(ctx);
    /* always: the uploads read the caller's arrays until they are done, whatever failed */
    cl_int err = clFinish(q);
    if (st == CLATTN_STATUS_SUCCESS && err != CL_SUCCESS)
        st = clattn_fail((clattn_status)err, "running the pass failed (%d: %s)", err, clattn_status_string(err));
    /* the outputs last: a failure before them leaves the caller's arrays untouched; the reads are enqueued together
     * and waited for once (a blocking read each costs a round trip to the driver) */
    int reads = 0;
    for (int i = 0; i < nout && st == CLATTN_STATUS_SUCCESS; i++) {
        if (!out[i].buf || !out[i].host || !out[i].bytes) continue;
        err = clEnqueueReadBuffer(q, out[i].buf, CL_FALSE, 0, out[i].bytes, out[i].host, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            st = clattn_fail((clattn_status)err, "reading %s failed (%d: %s)", out[i].what, err,
                             clattn_status_string(err));
        reads++;
    }
    /* always: a read enqueued writes the caller's array until it is done, whatever failed after it */
    err = reads ? clFinish(q) : CL_SUCCESS;
    if (st == CLATTN_STATUS_SUCCESS && err != CL_SUCCESS)
        st = clattn_fail((clattn_status)err, "reading the outputs failed (%d: %s)", err, clattn_status_string(err));
    return st;
}

clattn_status clattn_exec_buffers(const clattn_device *dev, cl_uint nwait, const cl_event *wait, clattn_pass_fn pass,
                                  void *ctx, cl_event *event)
{
    if (nwait) CL_CHECK(clEnqueueBarrierWithWaitList(dev->queue, nwait, wait, NULL), "waiting for the wait list");
    TRY(pass(ctx));
    if (event) CL_CHECK(clEnqueueMarkerWithWaitList(dev->queue, 0, NULL, event), "enqueueing the completion event");
    return CLATTN_STATUS_SUCCESS;
}

void clattn_marks_release(clattn_marks *m)
{
    for (int i = 0; i < m->n; i++)
        if (m->ev[i]) clReleaseEvent(m->ev[i]);
    m->n = 0;
}

clattn_status clattn_marks_put(clattn_marks *m, cl_command_queue q, int stage)
{
    if (stage < 0) clattn_marks_release(m);
    if (m->n >= CLATTN_MAX_MARKS) return clattn_fail(CLATTN_STATUS_INVALID_ARGUMENT, "too many profiling markers");
    CL_CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, &m->ev[m->n]), "enqueueing a profiling marker");
    m->stage[m->n++] = stage;
    return CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_marks_times(const clattn_marks *m, double *ms, int nstages)
{
    for (int s = 0; s < nstages; s++) ms[s] = 0.0;
    if (m->n == 0) return CLATTN_STATUS_SUCCESS;
    CL_CHECK(clWaitForEvents((cl_uint)m->n, m->ev), "waiting for the profiled pass");
    cl_ulong prev = 0;
    for (int k = 0; k < m->n; k++) {
        cl_ulong t = 0;
        CL_CHECK(clGetEventProfilingInfo(m->ev[k], CL_PROFILING_COMMAND_END, sizeof t, &t, NULL),
                 "reading profiling timestamps");
        if (k > 0 && t > prev && m->stage[k] >= 0 && m->stage[k] < nstages) ms[m->stage[k]] += (double)(t - prev) * 1e-6;
        prev = t;
    }
    return CLATTN_STATUS_SUCCESS;
}
