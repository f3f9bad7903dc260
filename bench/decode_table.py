#!/usr/bin/env python3
"""Markdown table of `clattn-bench --decode --sweep --json` runs: float and half storage side by side.
usage: python3 bench/decode_table.py FLOAT.jsonl HALF.jsonl"""
import json
import sys


def load(path):
    return {j["context"]: j for j in (json.loads(line) for line in open(path) if line.strip())}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    f, h = load(sys.argv[1]), load(sys.argv[2])
    print("| context C | float: step ms | tokens/s | KV GB/s | copy GB/s | fraction "
          "| half: step ms | tokens/s | KV GB/s | copy GB/s | fraction | half/float tokens/s |")
    print("|" + "---|" * 12)
    for c in sorted(set(f) & set(h)):
        a, b = f[c], h[c]
        print(f"| {c} | {a['step_ms']:.2f} | {a['tokens_per_s']:.0f} | {a['kv_gbps']:.1f} | {a['copy_gbps']:.0f} "
              f"| {a['kv_bandwidth_fraction']:.2f} | {b['step_ms']:.2f} | {b['tokens_per_s']:.0f} | {b['kv_gbps']:.1f} "
              f"| {b['copy_gbps']:.0f} | {b['kv_bandwidth_fraction']:.2f} | {b['tokens_per_s'] / a['tokens_per_s']:.2f} |")


if __name__ == "__main__":
    main()
