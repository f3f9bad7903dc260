#!/usr/bin/env python3
"""Markdown tables of `clattn-bench --decode --sweep --json` runs: float and half storage side by side.
usage: python3 bench/decode_table.py FLOAT.jsonl HALF.jsonl

Each file may hold several sweeps, one after another (a sweep ends where the context stops growing);
the k-th float sweep is paired with the k-th half sweep. One table per pair, then the range over the
pairs of the issue's two figures: the float fraction at C = 8192 and half/float tokens/s at C = 32768."""
import json
import sys


def sweeps(path):
    runs, last = [], None
    for line in open(path):
        if not line.strip():
            continue
        j = json.loads(line)
        if last is None or j["context"] <= last:
            runs.append({})
        runs[-1][j["context"]] = j
        last = j["context"]
    return runs


def table(f, h):
    print("| context C | float: step ms | tokens/s | KV GB/s | copy GB/s | fraction "
          "| half: step ms | tokens/s | KV GB/s | copy GB/s | fraction | half/float tokens/s |")
    print("|" + "---|" * 12)
    for c in sorted(set(f) & set(h)):
        a, b = f[c], h[c]
        print(f"| {c} | {a['step_ms']:.2f} | {a['tokens_per_s']:.0f} | {a['kv_gbps']:.1f} | {a['copy_gbps']:.0f} "
              f"| {a['kv_bandwidth_fraction']:.2f} | {b['step_ms']:.2f} | {b['tokens_per_s']:.0f} | {b['kv_gbps']:.1f} "
              f"| {b['copy_gbps']:.0f} | {b['kv_bandwidth_fraction']:.2f} | {b['tokens_per_s'] / a['tokens_per_s']:.2f} |")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    fs, hs = sweeps(sys.argv[1]), sweeps(sys.argv[2])
    if len(fs) != len(hs):
        sys.exit(f"decode_table.py: {len(fs)} float sweeps but {len(hs)} half sweeps")
    frac, ratio = [], []
    for k, (f, h) in enumerate(zip(fs, hs), 1):
        if len(fs) > 1:
            print(f"\nRun {k} ({f[min(f)]['timestamp']}):\n")
        table(f, h)
        if 8192 in f:
            frac.append(f[8192]["kv_bandwidth_fraction"])
        if 32768 in f and 32768 in h:
            ratio.append(h[32768]["tokens_per_s"] / f[32768]["tokens_per_s"])
    if len(fs) > 1 and frac and ratio:
        print(f"\nOver the {len(fs)} runs: float fraction at C = 8192 {min(frac):.2f}-{max(frac):.2f}; "
              f"half/float tokens/s at C = 32768 {min(ratio):.2f}-{max(ratio):.2f}")


if __name__ == "__main__":
    main()
