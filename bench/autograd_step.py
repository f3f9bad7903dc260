#!/usr/bin/python3
"""autograd_step.py: a training step through clattn.autograd.MultiheadAttention next to torch.nn.MultiheadAttention.

A step is what a training loop does: zero_grad, the module's forward on x (self-attention, biases, output
projection, batch_first), a loss, backward, and an SGD step, so that the parameters change between steps (clattn
hands them to its plan each step). Both modules start from the same state; rounds alternate clattn and torch, each
round the median of --iters steps after --warmup; the JSON line per shape gives every round's median and the ratio of
the best medians. torch runs with torch.set_num_threads(--threads).

    /usr/bin/python3 bench/autograd_step.py --device opencl --shapes 4x64x64x4,2x256x128x4,4x512x256x8c \\
        --json bench/results/pocl-2core-autograd.jsonl
Shapes are BxTxExH, a trailing c for causal (torch gets the causal mask as attn_mask, clattn is_causal=True).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
os.environ.setdefault("CLATTN_LIBRARY", os.path.join(here, "..", "build", "libclattn.so"))

import torch  # noqa: E402

import clattn  # noqa: E402
import clattn.autograd as ca  # noqa: E402


def parse_shape(s):
    causal = s.endswith("c")
    B, T, E, H = (int(v) for v in s.rstrip("c").split("x"))
    return B, T, E, H, causal


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--shapes", default="4x64x64x4,2x256x128x4,4x512x256x8c")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="append one JSON line per shape to this file")
    ap.add_argument("--label", default="", help="a name for this build in the JSON (before/after comparisons)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for spec in args.shapes.split(","):
        B, T, E, H, causal = parse_shape(spec)
        torch.manual_seed(0)
        ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
        mine = ca.MultiheadAttention(E, H, batch_first=True, device=args.device)
        mine.load_state_dict(ref.state_dict())
        x, target = torch.randn(B, T, E), torch.randn(B, T, E)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1) if causal else None
        opts = {n: torch.optim.SGD(m.parameters(), lr=1e-3) for n, m in (("clattn", mine), ("torch", ref))}

        def step_clattn():
            opts["clattn"].zero_grad()
            out, _ = mine(x, x, x, is_causal=causal)
            ((out - target) ** 2).mean().backward()
            opts["clattn"].step()

        def step_torch():
            opts["torch"].zero_grad()
            out, _ = ref(x, x, x, attn_mask=mask, need_weights=False)
            ((out - target) ** 2).mean().backward()
            opts["torch"].step()

        steps = {"clattn": step_clattn, "torch": step_torch}
        for f in steps.values():
            for _ in range(args.warmup):
                f()
        rounds = {n: [] for n in steps}
        for _ in range(args.rounds):
            for n, f in steps.items():
                ts = []
                for _ in range(args.iters):
                    t0 = time.perf_counter()
                    f()
                    ts.append((time.perf_counter() - t0) * 1e3)
                rounds[n].append(statistics.median(ts))
        best = {n: min(v) for n, v in rounds.items()}
        attn = getattr(mine, "_attn", None)  # None in builds before one Attention per module (a plan per call)
        rec = dict(bench="autograd_step", label=args.label, B=B, T=T, E=E, H=H, causal=causal,
                   device=attn.device if attn is not None else args.device,
                   plans=attn.plans_cached if attn is not None else None,
                   torch=torch.__version__, threads=args.threads,
                   cpu=platform.processor() or platform.machine(), iters=args.iters,
                   clattn_ms=[round(v, 3) for v in rounds["clattn"]], torch_ms=[round(v, 3) for v in rounds["torch"]],
                   ratio=round(best["clattn"] / best["torch"], 3))
        print(f"{args.label + ': ' if args.label else ''}B={B} T={T} E={E} H={H}{' causal' if causal else ''}: clattn {best['clattn']:.2f} ms, torch "
              f"{best['torch']:.2f} ms, clattn/torch {rec['ratio']:.2f} ({rec['device']}; rounds clattn "
              f"{rec['clattn_ms']}, torch {rec['torch_ms']})")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
