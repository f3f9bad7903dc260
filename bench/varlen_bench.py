#!/usr/bin/env python3
"""bench/varlen_bench.py: a variable-length batch packed (clattn_attention_desc.varlen) against the same sequences
padded to the longest with a key padding mask, the way a caller without varlen runs them (issue 40).

Both through clattn.functional on one device, the core alone on heads already projected (as
scaled_dot_product_attention): varlen_attention on (total, H, E) rows with the offsets, and attend on (B, Tmax, H, E)
with a (B, 1, 1, Tmax) mask hiding the padding. The two are timed alternating, `--iters` rounds after a warm-up
(plans made), median and spread reported; the packed output is checked against the padded one's real rows (allclose
1e-4). One JSON object per length mix on stdout.

  python3 bench/varlen_bench.py [--device opencl] [--heads 8] [--head-dim 64] [--causal] [--iters 7]
                                [--mixes "64,2048,512,128,1024,256,32,1500" ...]
"""
import argparse
import json
import statistics
import time

import torch

import clattn
import clattn.functional as CF

MIXES = ["64,2048,512,128,1024,256,32,1500", "1000,1000,1000,1000", "17,33,4096,5"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--mixes", nargs="*", default=MIXES)
    a = ap.parse_args()
    H, D = a.heads, a.head_dim
    g = torch.Generator().manual_seed(5)
    for mix in a.mixes:
        lens = [int(t) for t in mix.split(",")]
        B, T = len(lens), max(lens)
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        q, k, v = (torch.randn(cu[-1], H, D, generator=g) for _ in range(3))
        pq, pk, pv = (torch.zeros(B, T, H, D) for _ in range(3))
        mask = torch.zeros(B, 1, 1, T, dtype=torch.bool)
        for b, n in enumerate(lens):
            pq[b, :n], pk[b, :n], pv[b, :n] = q[cu[b]:cu[b + 1]], k[cu[b]:cu[b + 1]], v[cu[b]:cu[b + 1]]
            mask[b, ..., :n] = True

        def packed():
            return CF.varlen_attention(q, k, v, cu, cu, T, T, causal=a.causal, device=a.device)

        def padded():
            return CF.attend(pq, pk, pv, mask, causal=a.causal, device=a.device)

        with torch.no_grad():
            got, ref = packed(), padded()  # warm-up: plans made, kernels built
            for b, n in enumerate(lens):
                torch.testing.assert_close(got[cu[b]:cu[b + 1]], ref[b, :n], rtol=1e-4, atol=1e-4)
            times = {"varlen": [], "padded": []}
            for _ in range(a.iters):
                for name, f in (("varlen", packed), ("padded", padded)):
                    t0 = time.perf_counter()
                    f()
                    times[name].append((time.perf_counter() - t0) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        useful = sum(n * n for n in lens) / (B * T * T)  # the score entries a sequence has, of the padded batch's
        print(json.dumps({"device": clattn.functional.device_name(a.device), "lengths": lens, "heads": H,
                          "head_dim": D, "causal": a.causal, "iters": a.iters,
                          "varlen_ms": round(med["varlen"], 3), "padded_ms": round(med["padded"], 3),
                          "varlen_ms_range": [round(min(times["varlen"]), 3), round(max(times["varlen"]), 3)],
                          "padded_ms_range": [round(min(times["padded"]), 3), round(max(times["padded"]), 3)],
                          "padded_over_varlen": round(med["padded"] / med["varlen"], 2),
                          "useful_fraction_of_padded": round(useful, 3)}), flush=True)


if __name__ == "__main__":
    main()
