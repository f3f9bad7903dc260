"""clattn from PyTorch 2.x and Hugging Face transformers against torch's own attention, on this machine's threads.

    python bench/transformers_bench.py [--threads 2] [--rounds 10] [--device opencl] [--quick] [--json OUT]

1. clattn.functional.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention at
   B=4, H=8, d=64, T=512 and 1024, causal and not (rounds alternating, medians), the core's time (the library call
   alone, timed inside the calls), and the host overhead of the functional: the rest of those calls (every
   check, layout, plan lookup and ctypes argument of the Python side), against the core's time.
2. The same at a decode shape (B=1, H=8, one query, 2,048 keys): the host overhead per call, plans cached.
3. generate() on a Llama-shaped model (hidden 512, 8 heads, 2 key/value heads, 4 layers, random weights) for 128
   new tokens after a 1,024-token prompt: attn_implementation="sdpa", clattn with transformers' cache, and clattn
   with its DeviceCache; tokens per second of the whole call and of the decode steps alone (the call minus a
   1-token call), and the bytes the DeviceCache moves to and from the device per generated token.
Needs torch 2.x and transformers (bash scripts/torch2-venv.sh); the library from CLATTN_LIBRARY or the package."""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import clattn
import clattn.functional as CF
import clattn.transformers as CT


def timed(fn, reps=1):
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def alternate(fns, rounds):
    """Median seconds of each function, the functions taking turns round by round."""
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(timed(f))
    return {k: statistics.median(v) for k, v in times.items()}


class _CoreTimed:
    """Times the library's execution inside the real call (clattn_plan_execute, wrapped): .seconds after the call."""

    def __init__(self):
        self.real, self.seconds = clattn._lib.plan_execute, 0.0

    def __enter__(self):
        def timed_exec(plan, args):
            start = time.perf_counter()
            st = self.real(plan, args)
            self.seconds += time.perf_counter() - start
            return st
        self.seconds = 0.0
        clattn._lib.plan_execute = timed_exec
        return self

    def __exit__(self, *exc):
        clattn._lib.plan_execute = self.real


def measure(torch_fn, clattn_fn, rounds, reps):
    """Medians over rounds, torch and clattn taking turns: torch's seconds a call, clattn's, the library's execution
    inside clattn's calls (the core) and the rest of them (the host overhead: every check, layout, plan lookup and
    ctypes argument of the Python side), each of the last two measured within the same calls."""
    torch_fn(), clattn_fn()  # plans made, kernels loaded
    t_torch, t_clattn, t_core, t_host = [], [], [], []
    for _ in range(rounds):
        t_torch.append(timed(torch_fn, reps))
        with _CoreTimed() as c:
            total = timed(clattn_fn, reps)
        t_clattn.append(total)
        t_core.append(c.seconds / reps)
        t_host.append(total - c.seconds / reps)
    return {k: statistics.median(v) for k, v in
            (("torch", t_torch), ("clattn", t_clattn), ("clattn_core", t_core), ("host", t_host))}


def sdpa_cases(args, out):
    for T in (512, 1024) if not args.quick else (256,):
        for causal in (False, True):
            g = torch.Generator().manual_seed(T)
            q, k, v = (torch.randn(4, 8, T, 64, generator=g) for _ in range(3))

            def functional():
                with torch.no_grad():
                    return CF.scaled_dot_product_attention(q, k, v, is_causal=causal, device=args.device)

            m = measure(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
                        functional, args.rounds, 1)
            row = {"case": f"sdpa B4 H8 d64 T{T}{' causal' if causal else ''}", **{k: v * 1e3 for k, v in m.items()},
                   "ratio": m["clattn"] / m["torch"], "overhead": m["host"] / m["clattn_core"]}
            out.append(row)
            print(f"{row['case']:<32} torch {row['torch']:8.2f} ms  clattn {row['clattn']:8.2f} ms  "
                  f"(core {row['clattn_core']:.2f} ms)  clattn/torch {row['ratio']:.2f}  host overhead "
                  f"{1e3 * row['host']:.0f} us = {100 * row['overhead']:.1f} % of the core")


def decode_case(args, out):
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 8, 1, 64, generator=g), torch.randn(1, 8, 2048, 64, generator=g), \
        torch.randn(1, 8, 2048, 64, generator=g)

    def functional():
        with torch.no_grad():
            CF.scaled_dot_product_attention(q, k, v, device=args.device)

    m = measure(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), functional, args.rounds, 20)
    row = {"case": "decode B1 H8 d64 Tq1 Tk2048", **{k2: t * 1e6 for k2, t in m.items()}}
    out.append(row)
    print(f"{row['case']:<32} torch {row['torch']:8.1f} us  clattn {row['clattn']:8.1f} us  (core "
          f"{row['clattn_core']:.1f} us)  host overhead {row['host']:.1f} us a call")


def generate_case(args, out):
    prompt, new = (1024, 128) if not args.quick else (128, 16)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=prompt + new + 8)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, cfg.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    name = CT.register(device=args.device)
    key = "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"

    def run(impl, n, device_cache):
        model.set_attn_implementation(impl)
        opts = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        cache = CT.DeviceCache(cfg, max_cache_len=prompt + n, device=args.device) if device_cache else None
        if cache is not None:
            opts[key] = cache
        with torch.no_grad():
            start = time.perf_counter()
            toks = model.generate(ids, attention_mask=mask, **opts)
            return time.perf_counter() - start, toks, cache

    variants = {"sdpa": ("sdpa", False), "clattn": (name, False), "clattn_device_cache": (name, True)}
    for impl, dc in variants.values():
        run(impl, 2, dc)  # plans, kernels
    whole, first, toks, moved = {}, {}, {}, {}
    for _ in range(max(1, args.rounds // 5)):
        for k2, (impl, dc) in variants.items():
            t, tk, cache = run(impl, new, dc)
            whole.setdefault(k2, []).append(t)
            toks[k2] = tk
            t1, _, c1 = run(impl, 1, dc)
            first.setdefault(k2, []).append(t1)
            if cache is not None:
                moved[k2] = (cache.bytes_moved - c1.bytes_moved) / (new - 1)
    same = all(torch.equal(toks["sdpa"], t) for t in toks.values())
    for k2 in variants:
        w, f = statistics.median(whole[k2]), statistics.median(first[k2])
        row = {"case": f"generate llama h512 8/2 heads 4 layers prompt {prompt} new {new}", "impl": k2,
               "tokens_per_s": new / w, "decode_tokens_per_s": (new - 1) / (w - f), "same_tokens": same}
        if k2 in moved:
            row["bytes_per_token"] = moved[k2]
        out.append(row)
    base = next(r for r in out if r.get("impl") == "sdpa")
    for r in out:
        if "impl" in r:
            extra = f"  {r['bytes_per_token']:.0f} bytes to/from the device per decode step" if "bytes_per_token" in r \
                else ""
            print(f"{r['case']} {r['impl']:<20} {r['tokens_per_s']:7.1f} tok/s ({r['tokens_per_s'] / base['tokens_per_s']:.2f}x sdpa), "
                  f"decode steps {r['decode_tokens_per_s']:7.1f} tok/s "
                  f"({r['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f}x){extra}")
    print("the same tokens" if same else "THE TOKENS DIFFER")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} threads; clattn "
          f"{clattn.version()} on {CF.device_name(args.device)}")
    out = []
    sdpa_cases(args, out)
    decode_case(args, out)
    generate_case(args, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "threads": args.threads,
                       "device": CF.device_name(args.device), "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
