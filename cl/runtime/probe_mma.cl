/* probe_mma.cl: does this compiler take the instructions flash_mma issues (mma.sync m16n8k8 TF32,
 * cvt.rna.tf32.f32, shfl.sync)? caps.c builds it once when an NVIDIA device of compute capability 8.0 or
 * newer opens (a build failure means no); never launched. */
__kernel void clattn_probe_mma(__global float *out)
{
    const uint i = get_global_id(0);
    float d0 = out[i], d1 = 0.0f, d2 = 0.0f, d3 = 0.0f, y;
    uint a;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(a) : "f"(d0));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a), "r"(a), "r"(a), "r"(a), "r"(a), "r"(a));
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(y) : "f"(d0), "r"(1u));
    out[i] = y + d1 + d2 + d3;
}
