"""The attention core alone in PyTorch on the same GPU, for clattn-bench's core_gflops to be read against.
Argument: "B T E H,B T E H,...". One JSON line per (config, causal, dtype, backend). fp32 with TF32 off (true fp32)."""
import json, statistics, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

def time_fn(fn, iters=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)

print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}), flush=True)
n = 8192
A = torch.randn(n, n, device="cuda"); Bm = torch.randn(n, n, device="cuda")
ms = time_fn(lambda: A @ Bm, iters=5)
print(json.dumps({"variant": "cublas_sgemm", "n": n, "median_ms": ms, "tflops": 2 * n**3 / ms / 1e9}), flush=True)
del A, Bm
backends = (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH))
for c in sys.argv[1].split(","):
    B, T, E, H = (int(v) for v in c.split())
    d = E // H
    for causal in (0, 1):
        flops = 4.0 * B * H * T * T * d * (0.5 if causal else 1.0)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            q = torch.randn(B, H, T, d, device="cuda", dtype=dt); k = torch.randn_like(q); v = torch.randn_like(q)
            for name, be in backends:
                rec = {"B": B, "T": T, "E": E, "H": H, "causal": causal, "dtype": str(dt).split(".")[-1], "backend": name}
                try:
                    with torch.no_grad(), sdpa_kernel([be]):
                        ms = time_fn(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
                    rec.update(median_ms=ms, tflops=flops / ms / 1e9)
                except Exception as e:
                    rec["error"] = str(e).splitlines()[0][:120]
                print(json.dumps(rec), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
