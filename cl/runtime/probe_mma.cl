/* probe_mma.cl: does this compiler take the instructions flash_mma issues (mma.sync m16n8k8 TF32 and m16n8k16 f16 and
 * bf16, cvt.rna.tf32.f32, cvt.rn.f16x2.f32 and cvt.rn.bf16x2.f32, shfl.sync)? caps.c builds it once when an NVIDIA
 * device of compute capability 8.0 or newer opens (a build failure means no); never launched. */
__kernel void clattn_probe_mma(__global float *out)
{
    const uint i = get_global_id(0);
    float d0 = out[i], d1 = 0.0f, d2 = 0.0f, d3 = 0.0f, y;
    uint a, h, bh;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(a) : "f"(d0));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(d0), "f"(d1));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bh) : "f"(d0), "f"(d1));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a), "r"(a), "r"(a), "r"(a), "r"(a), "r"(a));
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(h), "r"(h), "r"(h), "r"(h), "r"(h), "r"(h));
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(bh), "r"(bh), "r"(bh), "r"(bh), "r"(bh), "r"(bh));
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(y) : "f"(d0), "r"(1u));
    out[i] = y + d1 + d2 + d3;
}
