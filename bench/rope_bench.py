#!/usr/bin/env python3
"""bench/rope_bench.py: rotary embeddings inside the call (attend(rope=...), clattn_attention_desc.rope) against the
same call with the rotation applied outside, the way a caller without clattn's rope runs it (issue 41's target:
within 5 %).

Both through clattn.functional on one device, the core on heads already projected: attend(q, k, v, rope=R) and
attend(rot(q), rot(k), v) with rot transformers' apply_rotary_pos_emb written in torch (rotate_half, float32, cos and
sin cached once outside the timing, as a model caches them). Timed alternating, `--iters` rounds after a warm-up
(plans made), median and spread reported, outputs compared (allclose 1e-4). One JSON object per shape on stdout.

  python3 bench/rope_bench.py [--device opencl] [--heads 8] [--head-dim 64] [--iters 7] [--lengths 512 2048 4096]
"""
import argparse
import json
import statistics
import time

import torch

import clattn.functional as CF


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--lengths", type=int, nargs="*", default=[512, 2048, 4096])
    a = ap.parse_args()
    H, D, B = a.heads, a.head_dim, a.batch
    g = torch.Generator().manual_seed(6)
    rope = CF.Rope()
    for T in a.lengths:
        q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]

        def rot(x):
            return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin

        def inside():
            return CF.attend(q, k, v, causal=True, rope=rope, device=a.device)

        def outside():
            return CF.attend(rot(q), rot(k), v, causal=True, device=a.device)

        with torch.no_grad():
            got, ref = inside(), outside()  # warm-up: plans made, kernels built
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)  # (transformers' float32 angles: close)
            times = {"inside": [], "outside": []}
            for _ in range(a.iters):
                for name, f in (("inside", inside), ("outside", outside)):
                    t0 = time.perf_counter()
                    f()
                    times[name].append((time.perf_counter() - t0) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        print(json.dumps({"device": CF.device_name(a.device), "batch": B, "length": T, "heads": H, "head_dim": D,
                          "causal": True, "iters": a.iters, "inside_ms": round(med["inside"], 3),
                          "outside_ms": round(med["outside"], 3),
                          "inside_ms_range": [round(min(times["inside"]), 3), round(max(times["inside"]), 3)],
                          "outside_ms_range": [round(min(times["outside"]), 3), round(max(times["outside"]), 3)],
                          "inside_over_outside": round(med["inside"] / med["outside"], 3)}), flush=True)


if __name__ == "__main__":
    main()
