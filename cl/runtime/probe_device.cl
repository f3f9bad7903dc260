/* probe_device.cl: what a driver does, measured once when a device opens (src/runtime/probes.c). Drivers
 * have defects that no query reports; these kernels show them, so that plans can respect them:
 *   clattn_probe_loop  how many iterations one work-item's loop completes. Mesa's llvmpipe (rusticl, Mesa 22)
 *                      ends every loop of a work-item after 65,535 iterations in total, without an error.
 *                      Each trip loads from memory, so that no compiler can fold the loop to its count.
 *                      Launched on a profiling queue, it is also the real work whose timestamps must advance.
 *   clattn_probe_nan   whether NaN and Inf propagate through multiply and add: IEEE says 0 * NaN, 0 * Inf,
 *                      NaN + 1 and Inf - Inf are NaN. Mesa 22's rusticl folds 0.0f * x to 0.
 * Built without fast-math options, as every clattn kernel. */
__kernel void clattn_probe_loop(__global const int *ones, __global int *out, int n)
{
    int count = 0;
    for (int i = 0; i < n; i++) count += ones[i & 7];
    out[0] = count;
}

/* in: {0, NaN, Inf, 1}. out[k] is 1 where the IEEE answer came back, else 0. */
__kernel void clattn_probe_nan(__global const float *in, __global int *out)
{
    const float zero = in[0], nan = in[1], inf = in[2], one = in[3];
    out[0] = isnan(zero * nan);
    out[1] = isnan(zero * inf);
    out[2] = isnan(0.0f * nan); /* the literal form, as unfused_softmax once wrote it */
    out[3] = isnan(nan + one);
    out[4] = isnan(inf - inf);
    out[5] = isnan(fma(zero, inf, one));
    out[6] = isinf(inf * one) && inf * one > 0.0f;
}

/* Built, never launched: the local memory the driver reports (CL_KERNEL_LOCAL_MEM_SIZE) for a kernel that
 * declares 4096 bytes of it. Drivers differ (rusticl on llvmpipe reports twice what is declared), and the cores'
 * check of their __local arrays (clattn_core_check_local) reads the reports through this one. */
__kernel void clattn_probe_local(__global float *out)
{
    __local float tile[1024];
    const uint l = get_local_id(0);
    for (uint i = l; i < 1024; i += get_local_size(0)) tile[i] = (float)i;
    barrier(CLK_LOCAL_MEM_FENCE);
    out[get_global_id(0)] = tile[1023 - (l & 1023)];
}
