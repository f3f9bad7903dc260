#!/usr/bin/python3
"""Generate clattn's backward-pass fixtures with PyTorch autograd.

How to run (from the repository root; Debian's python3-torch 1.13 made the
committed files)::

    /usr/bin/python3 tests/golden/make_golden_backward.py

It deletes and rewrites ``tests/golden/backward/<case>/``. Each case holds the
inputs of make_golden.py's case contract (x.npy, kv.npy, w_*.npy, b_*.npy,
key_padding_mask.npy, attn_mask.npy, meta.txt, expect_out.npy,
expect_attn.npy: see that script's docstring) and:

``grad_out.npy``        (B, Tq, Eo) the gradient of the loss at the output
                        (the loss is sum(out * grad_out)).
``grad_<name>.npy``     the gradient of every differentiable input <name>.npy
                        of the case (x, kv, w_query, w_key, w_value, b_query,
                        b_key, b_value, w_out, b_out), same shape.

The inputs are drawn in float32 and written as drawn; torch.nn.MultiheadAttention
then runs on them in float64 (the module converted with .double()), and its
autograd gradients are written rounded to float32. In cross-attention clattn's
kv is both key and value: torch gets the same tensor as key and value, so the
gradient written for kv is the sum of both paths. No fixture has a query row
without a visible key (torch gives NaN there; clattn's zero gradients are checked
against the test oracle instead) and none uses dropout (torch's generator is not
clattn's).
"""
import math
import os
import shutil

import numpy as np
import torch
from torch import nn

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backward")


def causal_bool(tq, tk):
    return torch.triu(torch.ones(tq, tk, dtype=torch.bool), diagonal=1)


def f32(t):
    return np.ascontiguousarray(t.detach().cpu().numpy().astype("<f4"))


def case(name, seed, *, B, Tq, E, H, Tk=None, kdim=None, bias=True, causal=False, kpm=None, attn_mask=None):
    cross = kdim is not None
    Tk = Tq if Tk is None else Tk
    g = torch.Generator().manual_seed(seed)
    mha = nn.MultiheadAttention(E, H, dropout=0.0, bias=bias, batch_first=True, kdim=kdim, vdim=kdim)
    with torch.no_grad():
        for p in mha.parameters():
            std = 1.3 / math.sqrt(p.shape[1]) if p.dim() == 2 else 0.3
            p.copy_(torch.randn(p.shape, generator=g) * std)
    x32 = torch.randn(B, Tq, E, generator=g)
    kv32 = torch.randn(B, Tk, kdim, generator=g) if cross else None
    Eo = E
    dout32 = torch.randn(B, Tq, Eo, generator=g)
    mha = mha.double()
    mha.train()  # dropout is 0: train mode only keeps autograd's slow, documented path
    x = x32.double().requires_grad_(True)
    kv = kv32.double().requires_grad_(True) if cross else x
    tmask = causal_bool(Tq, Tk) if causal else None
    if attn_mask is not None:
        am = torch.from_numpy(attn_mask)
        if am.dtype == torch.bool:
            tmask = am if tmask is None else (tmask | am)
        else:
            assert tmask is None, "float mask + causal is not used here"
            tmask = am.double()
    tkpm = torch.from_numpy(kpm) if kpm is not None else None
    out, attn = mha(x, kv, kv, key_padding_mask=tkpm, need_weights=True, attn_mask=tmask,
                    average_attn_weights=False)
    assert torch.isfinite(out).all() and torch.isfinite(attn).all(), name
    (out * dout32.double()).sum().backward()

    dh = E // H
    arrs = {"x": x32, "grad_x": x.grad, "expect_out": out, "expect_attn": attn, "grad_out": dout32}
    if cross:
        arrs.update(kv=kv32, grad_kv=kv.grad)
    if mha._qkv_same_embed_dim:
        for part, w, gw in zip(("w_query", "w_key", "w_value"), mha.in_proj_weight.chunk(3, 0),
                               mha.in_proj_weight.grad.chunk(3, 0)):
            arrs[part], arrs["grad_" + part] = w, gw
    else:
        for part, p in (("w_query", mha.q_proj_weight), ("w_key", mha.k_proj_weight), ("w_value", mha.v_proj_weight)):
            arrs[part], arrs["grad_" + part] = p, p.grad
    arrs["w_out"], arrs["grad_w_out"] = mha.out_proj.weight, mha.out_proj.weight.grad
    if bias:
        for part, b, gb in zip(("b_query", "b_key", "b_value"), mha.in_proj_bias.chunk(3, 0),
                               mha.in_proj_bias.grad.chunk(3, 0)):
            arrs[part], arrs["grad_" + part] = b, gb
        arrs["b_out"], arrs["grad_b_out"] = mha.out_proj.bias, mha.out_proj.bias.grad
    d = os.path.join(ROOT, name)
    os.makedirs(d)
    for k, v in arrs.items():
        np.save(os.path.join(d, k + ".npy"), f32(v))
    if kpm is not None:
        np.save(os.path.join(d, "key_padding_mask.npy"), np.ascontiguousarray(kpm.astype(np.bool_)))
    if attn_mask is not None:
        np.save(os.path.join(d, "attn_mask.npy"), np.ascontiguousarray(attn_mask))
    comments = ["torch.nn.MultiheadAttention(embed_dim=%d, num_heads=%d, bias=%s%s), batch_first, float64, autograd"
                % (E, H, bias, ", kdim=vdim=%d" % kdim if cross else ""),
                "inputs and parameters randn (float32) from torch.Generator seed %d; loss sum(out * grad_out)" % seed]
    if causal:
        comments.append("causal: torch got the equivalent boolean mask (key j > query i)")
    with open(os.path.join(d, "meta.txt"), "w") as f:
        f.write("\n".join("# " + c for c in comments) + "\nheads %d\ndk %d\ndv %d\ncausal %d\n"
                % (H, dh, dh, 1 if causal else 0))
    print("%-32s %s" % (name, ", ".join("%s%s" % (k, tuple(v.shape)) for k, v in arrs.items() if k.startswith("grad"))))


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    os.makedirs(ROOT)
    rng = np.random.default_rng(26)
    # causal with padded keys at the end of each entry: every query still sees key 0
    kpm = np.zeros((2, 7), dtype=bool)
    kpm[0, 5:] = True
    kpm[1, 3] = True
    case("mha_causal_kpm", 2601, B=2, Tq=7, E=12, H=3, causal=True, kpm=kpm)
    fm = rng.uniform(-2, 2, size=(5, 9)).astype("<f4")
    case("mha_cross_float_mask", 2602, B=2, Tq=5, Tk=9, E=8, H=2, kdim=6, attn_mask=fm)
    bm = rng.random((61, 61)) < 0.3
    np.fill_diagonal(bm, False)  # every row sees its own key
    case("mha_nobias_bool_mask", 2603, B=1, Tq=61, E=16, H=4, bias=False, attn_mask=bm)
    case("mha_causal_t130", 2604, B=1, Tq=130, E=32, H=2, causal=True)
    case("mha_head1_t1", 2605, B=3, Tq=1, E=3, H=3)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
