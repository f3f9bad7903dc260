/* probe_ptx.cl: does this compiler take NVIDIA inline PTX? caps.c builds it once when an NVIDIA device
 * opens (a build failure means no); never launched. */
__kernel void clattn_probe_ptx(__global uint *out)
{
    uint lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    out[get_global_id(0)] = lane;
}
