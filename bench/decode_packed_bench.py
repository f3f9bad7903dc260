#!/usr/bin/env python3
"""bench/decode_packed_bench.py: a decode plan's packed steps (clattn_decode_args.cu_new, Decoder's cu_seqlens)
against the same steps padded to the longest sequence with valid counts, the way a caller without packing runs them
(issue 40).

One Decoder (projections, GQA) per form on one device, the same weights. Two kinds of step, each timed alternating
packed / padded, `--iters` rounds (`--step-iters` for the step) after a warm-up, the median and the spread reported,
and the packed output checked against the padded one's real rows (allclose 1e-4):
  prefill   prompts of the --prompts lengths into empty caches (each round resets the caches first; not timed)
  step      after that prefill, one decode step in which only the sequences of --active bring a token (the others
            are waiting, as in continuous batching): padded, every sequence's row is projected and attended
One JSON object per kind on stdout.

  python3 bench/decode_packed_bench.py [--device opencl] [--embed 512] [--heads 8] [--kv-heads 2]
                                       [--prompts 37,512,5,300,1024,64,200,900] [--active 0,2,4,5,7] [--iters 7]
                                       [--step-iters 41]
"""
import argparse
import json
import statistics
import time

import numpy as np

import clattn


def timed(fn, iters, other):
    """fn and other alternating, iters rounds: each one's times in ms."""
    a, b = [], []
    for _ in range(iters):
        for f, out in ((fn, a), (other, b)):
            t0 = time.perf_counter()
            f()
            out.append((time.perf_counter() - t0) * 1e3)
    return a, b


def summary(ms):
    return {"median_ms": round(statistics.median(ms), 3), "min_ms": round(min(ms), 3), "max_ms": round(max(ms), 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--embed", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--prompts", default="37,512,5,300,1024,64,200,900")
    ap.add_argument("--active", default="0,2,4,5,7")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--step-iters", type=int, default=41, help="rounds of the (sub-millisecond) step")
    a = ap.parse_args()
    lens = [int(t) for t in a.prompts.split(",")]
    active = {int(t) for t in a.active.split(",")}
    B, T, E, H, HK = len(lens), max(lens), a.embed, a.heads, a.kv_heads
    d = E // H
    rng = np.random.default_rng(3)
    w = {k: (rng.standard_normal(shape) / np.sqrt(E)).astype(np.float32) for k, shape in
         (("w_query", (E, E)), ("w_key", (HK * d, E)), ("w_value", (HK * d, E)), ("w_out", (E, E)))}
    dec = {form: clattn.Decoder(H, kv_heads=HK, batch=B, capacity=T + 1, max_new_tokens=T, device=a.device, **w)
           for form in ("packed", "padded")}
    cu = np.concatenate([[0], np.cumsum(lens)])
    x = rng.standard_normal((cu[-1], E)).astype(np.float32)
    xp = np.zeros((B, T, E), dtype=np.float32)
    for b, n in enumerate(lens):
        xp[b, :n] = x[cu[b]:cu[b + 1]]
    counts = [1 if b in active else 0 for b in range(B)]
    cs = np.concatenate([[0], np.cumsum(counts)])
    x1 = rng.standard_normal((int(cs[-1]), E)).astype(np.float32)
    x1p = np.zeros((B, 1, E), dtype=np.float32)
    for b in range(B):
        if counts[b]:
            x1p[b, 0] = x1[cs[b]]

    def prefill(form):
        dec[form].reset()
        return dec[form](x, cu_seqlens=cu) if form == "packed" else dec[form](xp, valid=lens)

    def step(form):  # after a prefill; rolled back to it (truncate: host work, the same for both forms, timed too)
        out = dec[form](x1, cu_seqlens=cs) if form == "packed" else dec[form](x1p, valid=counts)
        dec[form].truncate(lens)
        return out

    got, ref = prefill("packed"), prefill("padded")  # warm-up: kernels built
    for b, n in enumerate(lens):
        np.testing.assert_allclose(got[cu[b]:cu[b + 1]], ref[b, :n], rtol=1e-4, atol=1e-4)
    got, ref = step("packed"), step("padded")
    for b in range(B):
        np.testing.assert_allclose(got[cs[b]:cs[b + 1]], ref[b, :counts[b]], rtol=1e-4, atol=1e-4)
    device = dec["packed"].device
    for kind, fn in (("prefill", prefill), ("step", step)):
        if kind == "step":
            prefill("packed"), prefill("padded")
        pk, pd = timed(lambda: fn("packed"), a.iters if kind == "prefill" else a.step_iters, lambda: fn("padded"))
        rows = int(cu[-1]) if kind == "prefill" else int(cs[-1])
        print(json.dumps({"kind": kind, "device": str(device), "prompts": lens, "active": sorted(active),
                          "embed": E, "heads": H, "kv_heads": HK, "rows_packed": rows,
                          "rows_padded": B * (T if kind == "prefill" else 1), "packed": summary(pk),
                          "padded": summary(pd),
                          "padded_over_packed": round(statistics.median(pd) / statistics.median(pk), 2)}), flush=True)


if __name__ == "__main__":
    main()
