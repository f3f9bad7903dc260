"""A Llama-style attention block on clattn, from weights in a NumPy file, checked against PyTorch (issue 41).

    /usr/bin/python3 examples/models/llama_attention.py [--device opencl] [--weights DIR]

The model: the attention of Llama 2/3 as transformers writes it, in plain PyTorch below (LlamaStyleAttention):
q/k/v/o projections without biases, grouped-query attention (8 query heads on 2 key/value heads), rotary embeddings
with transformers' rotate_half (base 500000, Llama 3's), causal scaled_dot_product_attention. The example writes the
module's weights to DIR/llama_attention.npz (a temporary directory by default), loads them back with NumPy alone,
and runs them three ways on clattn:
  1. clattn.Attention(..., causal=True, rope=clattn.Rope(theta=500000.0)): one plan, the rotation inside it;
  2. clattn.Decoder with the same weights: a 10-token prompt, then one token per call over a KV cache (the keys
     rotated at their positions before they are cached);
  3. clattn.functional.attend on the heads torch projected, rope=... (what an engine calling the core does).
Each output is compared with the PyTorch module's in float64 (|got - want| <= 1e-4 + 1e-3 |want|); the example exits
1 when one differs. Needs torch, NumPy and the clattn package (pip install ./python).
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np
import torch

import clattn
import clattn.functional as CF

E, H, HK, D, THETA = 64, 8, 2, 8, 500000.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]], -1)


class LlamaStyleAttention(torch.nn.Module):
    """Llama's attention block (transformers' LlamaAttention without the cache), in plain PyTorch."""

    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(E, H * D, bias=False)
        self.k_proj = torch.nn.Linear(E, HK * D, bias=False)
        self.v_proj = torch.nn.Linear(E, HK * D, bias=False)
        self.o_proj = torch.nn.Linear(H * D, E, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(B, T, HK, D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, HK, D).transpose(1, 2)
        inv = 1.0 / THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // HK, dim=1), v.repeat_interleave(H // HK, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return self.o_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * D))


def close(name: str, got, want: torch.Tensor) -> bool:
    got = torch.as_tensor(np.asarray(got, dtype=np.float64))
    err = (got - want).abs() - (1e-4 + 1e-3 * want.abs())
    ok = bool((err <= 0).all())
    print(f"{name}: {'matches' if ok else 'DIFFERS from'} PyTorch (max |diff| {float((got - want).abs().max()):.2e})")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="a clattn device spec (default: the first OpenCL device)")
    ap.add_argument("--weights", default=None, help="where to write llama_attention.npz (default: a temporary dir)")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = LlamaStyleAttention().double()
    x = torch.randn(2, 37, E, dtype=torch.float64)
    with torch.no_grad():
        want = model(x)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(a.weights or tmp, "llama_attention.npz")
        np.savez(path, **{n: p.detach().float().numpy() for n, p in model.state_dict().items()})
        w = dict(np.load(path))  # from here on NumPy arrays only, as a checkpoint gives them
    rope = clattn.Rope(kind="half", theta=THETA)
    ok = True
    # 1. one plan: the projections, the rotation, the core and the output projection on the device
    attn = clattn.Attention(H, kv_heads=HK, head_dim_qk=D, w_query=w["q_proj.weight"], w_key=w["k_proj.weight"],
                            w_value=w["v_proj.weight"], w_out=w["o_proj.weight"], causal=True, rope=rope,
                            device=a.device)
    out, _ = attn(x.float().numpy())
    ok &= close(f"clattn.Attention ({attn.core_used} on {attn.device})", out, want)
    # 2. decoding: a prompt of 10 tokens, then one token per call
    dec = clattn.Decoder(H, kv_heads=HK, head_dim_qk=D, w_query=w["q_proj.weight"], w_key=w["k_proj.weight"],
                         w_value=w["v_proj.weight"], w_out=w["o_proj.weight"], batch=2, capacity=64,
                         max_new_tokens=10, rope=rope, device=a.device)
    xs = x.float().numpy()
    steps = [dec(xs[:, :10])] + [dec(xs[:, t:t + 1]) for t in range(10, xs.shape[1])]
    ok &= close("clattn.Decoder (prompt of 10, then 27 steps)", np.concatenate(steps, axis=1), want)
    # 3. the core on the heads torch projected (an engine that keeps its own projections)
    m32 = model.float()
    with torch.no_grad():
        q = m32.q_proj(x.float()).view(2, 37, H, D)
        k = m32.k_proj(x.float()).view(2, 37, HK, D)
        v = m32.v_proj(x.float()).view(2, 37, HK, D)
        o = CF.attend(q, k, v, causal=True, rope=CF.Rope(theta=THETA), device=a.device)
        ok &= close("clattn.functional.attend(rope=...)", m32.o_proj(o.reshape(2, 37, H * D)), want)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
