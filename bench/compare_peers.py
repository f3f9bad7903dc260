#!/usr/bin/python3
"""compare_peers.py: clattn against the CPU engines users deploy, on one module.

The module is torch.nn.MultiheadAttention (batch_first, eval, Q/K/V and output projections with biases,
need_weights=False; causal: a (T, T) bool mask), B x T x E input, H heads, random weights (seed 0). Timed on
the same input, each as its users call it (host arrays in, host arrays out):
  - clattn: clattn.from_torch(module) on --device (default opencl: PoCL on a CPU), the Python package of this
    checkout (python/) with the library of --build-dir;
  - torch: the module itself (torch.set_num_threads(--threads));
  - ONNX Runtime: the module exported to ONNX (torch.onnx.export, opset 14), CPU execution provider,
    intra-op threads --threads, graph optimisations on;
  - OpenVINO: the same ONNX file, CPU plugin, INFERENCE_NUM_THREADS --threads, f32 inference precision,
    latency hint.
Every engine's output is checked against torch's (|diff| <= 1e-4 + 1e-3 |torch|, every element) before it is
timed; one that differs is reported and not timed. Rounds alternate the engines (--rounds, default 2) and each
round's median of --iters calls after --warmup is printed, then the ratios of clattn's time to each peer's
(the first round's and the second's).

ONNX Runtime and OpenVINO come from PyPI: unless they import already, the script makes a virtual environment
(--venv, default /tmp/clattn-peers-venv; over the system Python with its packages, NumPy held at the system's
version), installs them there and runs itself again in it. Without network (or with --no-install) the peers
that are missing are skipped with a notice, and clattn and torch are still compared.

Run from the repository root after building:
    /usr/bin/python3 bench/compare_peers.py --seqs 512,1024 [--causal] [--json-out bench/results/FILE.json]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def have(module):
    try:
        __import__(module)
        return True
    except Exception:
        return False


def bootstrap(args):
    """Re-run in a venv with onnxruntime and openvino when they do not import here (once: CLATTN_PEERS_VENV)."""
    if have("onnxruntime") and have("openvino") or args.no_install or os.environ.get("CLATTN_PEERS_VENV"):
        return
    venv = args.venv
    py = os.path.join(venv, "bin", "python")
    try:
        if not os.path.exists(py):
            log(f"compare_peers: making {venv} (onnxruntime, openvino from PyPI)")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
        import numpy
        subprocess.run([py, "-m", "pip", "install", "-q", "onnxruntime", "openvino", f"numpy=={numpy.__version__}"],
                       check=True)
    except (subprocess.CalledProcessError, OSError) as e:
        log(f"compare_peers: could not install the peers ({e}); the missing ones are skipped")
        return
    env = dict(os.environ, CLATTN_PEERS_VENV="1")
    os.execve(py, [py] + sys.argv, env)


def median_ms(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)


def engines(args, torch, np, T, causal, onnx_dir):
    """{name: (call, output or None, why-not)}: each engine's call on the module of sequence length T."""
    B, E, H = args.batch, args.dim, args.heads
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    x = torch.randn(B, T, E, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True: not attended (torch's bool mask)

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, inp):
            return self.mha(inp, inp, inp, need_weights=False, attn_mask=mask)[0]

    mod = Module().eval()
    xn = x.numpy()
    out = {}

    def torch_call():
        with torch.no_grad():
            return mod(x).numpy()
    out["torch"] = (torch_call, None)

    import clattn
    att = clattn.from_torch(mha, device=args.device, causal=causal)
    out["clattn"] = (lambda: att(xn)[0], None)

    path = os.path.join(onnx_dir, f"mha_T{T}{'_causal' if causal else ''}.onnx")
    try:  # with gradients on: torch's fused fast path (aten::_native_multi_head_attention) has no ONNX form
        with torch.enable_grad():
            torch.onnx.export(mod, (x,), path, opset_version=14, input_names=["x"], output_names=["out"])
    except Exception as e:  # noqa: BLE001 (any export failure: the ONNX peers are skipped)
        path, why = None, f"torch.onnx.export failed: {e}"
    if path and have("onnxruntime"):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        out[f"onnxruntime {ort.__version__}"] = (lambda: sess.run(None, {"x": xn})[0], None)
    else:
        out["onnxruntime"] = (None, why if not path else "not installed")
    if path and have("openvino"):
        import openvino as ov
        core = ov.Core()
        compiled = core.compile_model(core.read_model(path), "CPU", {
            "INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
        req = compiled.create_infer_request()
        out[f"openvino {ov.__version__.split('-')[0]}"] = (lambda: req.infer({0: xn})[0].copy(), None)
    else:
        out["openvino"] = (None, why if not path else "not installed")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="512,1024", help="comma-separated sequence lengths (default 512,1024)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--causal", action="store_true", help="a causal mask (torch: a (T, T) bool mask)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="rounds alternating the engines (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="threads of torch and the peers (default 2)")
    ap.add_argument("--device", default="opencl", help="clattn's device (default opencl)")
    ap.add_argument("--build-dir", default="build", help="where libclattn was built (default build)")
    ap.add_argument("--venv", default="/tmp/clattn-peers-venv", help="the peers' virtual environment")
    ap.add_argument("--no-install", action="store_true", help="skip the peers that do not import here")
    ap.add_argument("--json-out", default="", help="also write every measurement to this JSON file")
    args = ap.parse_args()
    bootstrap(args)

    lib = os.path.join(ROOT, args.build_dir, "libclattn.so")
    if not os.path.exists(lib):
        sys.exit(f"compare_peers: {lib} not found (build first, or --build-dir)")
    os.environ.setdefault("CLATTN_LIBRARY", lib)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import numpy as np
    import torch
    import clattn
    torch.set_num_threads(args.threads)
    seqs = [int(s) for s in args.seqs.split(",") if s]
    rows = []
    with tempfile.TemporaryDirectory() as onnx_dir:
        for T in seqs:
            eng = engines(args, torch, np, T, args.causal, onnx_dir)
            want = eng["torch"][0]()
            times = {name: [] for name in eng}
            notes = {}
            for name, (fn, why) in eng.items():
                if fn is None:
                    notes[name] = why
                    continue
                got = np.asarray(fn(), np.float32)
                diff = float(np.max(np.abs(got - want)))
                if got.shape != want.shape or not np.all(np.abs(got - want) <= 1e-4 + 1e-3 * np.abs(want)):
                    notes[name] = f"output differs from torch's (max |diff| {diff:.3g}): not timed"
                    eng[name] = (None, notes[name])
                else:
                    notes[name] = f"max |diff| from torch {diff:.2g}"
            for r in range(args.rounds):
                for name, (fn, _) in eng.items():
                    if fn is not None:
                        times[name].append(median_ms(fn, args.iters, args.warmup))
                log(f"T={T} round {r + 1}: " + ", ".join(f"{n} {t[-1]:.1f} ms" for n, t in times.items() if t))
            rows.append({"T": T, "causal": args.causal, "times_ms": times, "notes": notes})

    print(f"device: clattn on {args.device} ({clattn.version()}), torch {torch.__version__}, {args.threads} threads; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(f"module: nn.MultiheadAttention B={args.batch} E={args.dim} H={args.heads}{' causal' if args.causal else ''}, "
          f"medians of {args.iters} calls after {args.warmup}, {args.rounds} rounds alternating")
    for row in rows:
        names = [n for n, t in row["times_ms"].items() if t]
        print(f"\nT={row['T']}:")
        for n, t in row["times_ms"].items():
            print(f"  {n:22s} " + (", ".join(f"{v:8.2f}" for v in t) + " ms" if t else "skipped") +
                  f"   ({row['notes'].get(n, '')})")
        c = row["times_ms"].get("clattn")
        for n in names:
            if n != "clattn" and c:
                ratios = [a / b for a, b in zip(c, row["times_ms"][n])]
                print(f"  clattn / {n:13s} " + ", ".join(f"{v:.2f}" for v in ratios))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": args.device, "clattn": clattn.version(), "torch": torch.__version__,
                       "threads": args.threads, "batch": args.batch, "dim": args.dim, "heads": args.heads,
                       "iters": args.iters, "warmup": args.warmup, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
