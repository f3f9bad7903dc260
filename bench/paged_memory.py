#!/usr/bin/env python3
"""bench/paged_memory.py: the device memory a paged KV cache holds for requests that share a prompt (issue 40's
memory target: 64 sequences sharing a 2k-token prompt, 64 tokens each of their own, in at most 1.1 times the bytes of
one prompt plus the 64 tails).

Sequence 0 takes the prompt (one prefill), sequences 1 .. B-1 share it (Decoder.share: its pages, no copy), then
every sequence decodes `tail` tokens of its own, one step at a time. Reported per prompt length: the pages in use,
their bytes (pages x page_size x kv_heads x (dk + dv) x element size), the ideal (the prompt and the tails, each
position once) and their ratio; and every sequence's last output checked against a contiguous Decoder that ran the
prompt and that sequence's tokens alone (allclose 1e-4).

  python3 bench/paged_memory.py [--device opencl] [--batch 64] [--tail 64] [--page-size 16] [--prompts 2048,2047]
"""
import argparse
import json
import sys

import numpy as np

import clattn


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="opencl")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tail", type=int, default=64)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--prompts", default="2048,2047")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    E, H, HK, D, B, P = 64, a.heads, a.kv_heads, a.head_dim, a.batch, a.page_size
    w = dict(w_query=rng.standard_normal((H * D, E), np.float32) / 8,
             w_key=rng.standard_normal((HK * D, E), np.float32) / 8,
             w_value=rng.standard_normal((HK * D, E), np.float32) / 8)
    for L in [int(t) for t in a.prompts.split(",")]:
        cap = L + a.tail
        dec = clattn.Decoder(H, kv_heads=HK, batch=B, capacity=cap, max_new_tokens=L, page_size=P,
                             pages=B * (-(-cap // P)), device=a.device, **w)
        prompt = rng.standard_normal((1, L, E), np.float32)
        x = np.zeros((B, L, E), np.float32)
        x[0] = prompt[0]
        dec(x, valid=[L] + [0] * (B - 1))
        for b in range(1, B):
            dec.share(b, 0)
        tails = rng.standard_normal((a.tail, B, 1, E), np.float32)
        for t in range(a.tail):
            last = dec(tails[t])
        used = dec.pages_in_use
        per_position = HK * 2 * D * 4  # float keys and values of every KV head
        got = used * P * per_position
        ideal = (L + B * a.tail) * per_position
        ok = True
        for b in (0, B // 2, B - 1):  # three sequences against a contiguous Decoder of their own
            ref = clattn.Decoder(H, kv_heads=HK, batch=1, capacity=cap, max_new_tokens=L, device=a.device, **w)
            ref(prompt)
            for t in range(a.tail):
                want = ref(tails[t, b][None])
            ok &= bool(np.allclose(last[b], want[0], rtol=1e-4, atol=1e-5))
        print(json.dumps({"mode": "paged_memory", "device": dec.device, "batch": B, "prompt": L, "tail": a.tail,
                          "page_size": P, "pages_in_use": used, "bytes": got, "ideal_bytes": ideal,
                          "ratio": round(got / ideal, 4), "outputs_match_contiguous": ok}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
