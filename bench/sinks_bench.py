#!/usr/bin/env python3
"""bench/sinks_bench.py: attention sinks inside the call (attend(sinks=...), clattn_attention_desc.sinks) against the
same call without sinks (what the sinks cost: the core's row statistics and one pass of sink_rows over the output) and
against gpt-oss's eager attention in torch (the sink as one more column of the logits, the way a caller without
clattn's sinks computes them; float32, (B, H, L, S) heads).

Inference (torch.no_grad), causal, timed alternating, `--iters` rounds after a warm-up (plans made), median and spread
reported; the outputs with sinks compared with the eager ones (allclose 1e-4). One JSON object per shape on stdout.

  python3 bench/sinks_bench.py [--device opencl] [--heads 8] [--head-dim 64] [--iters 7] [--lengths 512 2048]
"""
import argparse
import json
import math
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
    ap.add_argument("--lengths", type=int, nargs="*", default=[512, 2048])
    a = ap.parse_args()
    H, D, B = a.heads, a.head_dim, a.batch
    g = torch.Generator().manual_seed(8)
    sinks = torch.randn(H, generator=g) + 2.0
    for T in a.lengths:
        q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
        hidden = ~torch.ones(T, T, dtype=torch.bool).tril()

        def with_sinks():
            return CF.attend(q, k, v, causal=True, sinks=sinks, device=a.device)

        def without():
            return CF.attend(q, k, v, causal=True, device=a.device)

        def eager():  # gpt-oss's eager_attention_forward, on the heads
            qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            s = (qh @ kh.transpose(-1, -2) / math.sqrt(D)).masked_fill(hidden, -math.inf)
            s = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, T, 1)], -1)
            return (torch.softmax(s, -1)[..., :-1] @ vh).transpose(1, 2)

        fs = {"sinks": with_sinks, "without": without, "eager": eager}
        with torch.no_grad():
            torch.testing.assert_close(with_sinks(), eager(), rtol=1e-4, atol=1e-4)  # warm-up too
            without()
            times = {n: [] for n in fs}
            for _ in range(a.iters):
                for n, f in fs.items():
                    t0 = time.perf_counter()
                    f()
                    times[n].append((time.perf_counter() - t0) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        print(json.dumps({"device": CF.device_name(a.device), "batch": B, "length": T, "heads": H, "head_dim": D,
                          "causal": True, "iters": a.iters, **{f"{n}_ms": round(m, 3) for n, m in med.items()},
                          **{f"{n}_ms_range": [round(min(t), 3), round(max(t), 3)] for n, t in times.items()},
                          "sinks_over_without": round(med["sinks"] / med["without"], 3),
                          "sinks_over_eager": round(med["sinks"] / med["eager"], 3)}), flush=True)


if __name__ == "__main__":
    main()
