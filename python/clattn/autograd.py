"""Training with clattn from PyTorch: a torch.autograd.Function over clattn's forward and backward pass, and
MultiheadAttention, an nn.Module shaped like torch.nn.MultiheadAttention whose attention runs on a clattn device.

    import clattn.autograd
    mha = clattn.autograd.MultiheadAttention(64, 4, batch_first=True, device="opencl")
    out, _ = mha(x, x, x, key_padding_mask=kpm)      # x: a float32 CPU tensor (B, T, E)
    out.sum().backward()                              # mha's parameters and x get their .grad

Each call hands the current parameters to clattn (a plan per call: the weights live in the plan), runs the forward
on the device, and its backward runs clattn's backward pass with the same inputs and dropout seed, so that dropout
keeps exactly the forward's weights. Tensors are float32 on the CPU (clattn moves them to its device). Needs torch.
"""
from typing import Any, Optional

import numpy as np
import torch

from . import Attention
from ._errors import invalid as _invalid

_PARAMS = ("w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out", "b_out")


def _np(t: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    return None if t is None else t.detach().to(torch.float32).contiguous().numpy()


class AttentionFunction(torch.autograd.Function):
    """out = attention(x, kv; w_query, w_key, w_value, b_query, b_key, b_value, w_out, b_out) on a clattn device.

    apply(x, kv, key_padding_mask, attn_mask, opts, *params): kv None for self-attention; the masks NumPy arrays or
    None (no gradient); opts a dict of clattn.Attention's keyword arguments (heads, causal, dropout, seed, device,
    ...); params the eight tensors in _PARAMS' order (None where absent). Gradients for x, kv and every parameter
    that requires one."""

    @staticmethod
    def forward(ctx, x, kv, key_padding_mask, attn_mask, opts, *params):
        weights = {k: _np(p) for k, p in zip(_PARAMS, params)}
        attn = Attention(**opts, **{k: v for k, v in weights.items() if v is not None})
        xn, kvn = _np(x), _np(kv)
        out, _ = attn(xn, kvn, key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        ctx.attn, ctx.inputs = attn, (xn, kvn, key_padding_mask, attn_mask)
        ctx.has = [p is not None for p in params]
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_out):
        xn, kvn, kpm, mask = ctx.inputs
        g = ctx.attn.backward(xn, _np(grad_out), kvn, key_padding_mask=kpm, attn_mask=mask)
        t = {k: torch.from_numpy(v) for k, v in g.items()}
        return (t.get("x"), t.get("kv"), None, None, None) + tuple(t.get(k) if h else None
                                                                  for k, h in zip(_PARAMS, ctx.has))


def _mask(m: Any) -> Optional[np.ndarray]:
    if m is None:
        return None
    return m.detach().cpu().numpy() if isinstance(m, torch.Tensor) else np.asarray(m)


class MultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention's parameters (in_proj_weight, in_proj_bias, out_proj) and call, its attention
    computed by clattn with gradients through clattn's backward pass. dropout p applies to the attention weights in
    training mode (a new seed each call, the same in that call's backward); eval mode has none. forward(query, key,
    value, key_padding_mask=None, need_weights=False, attn_mask=None, is_causal=False) -> (out, None): key is
    query for self-attention, value must be key; need_weights=True is refused (no weights from a training call).
    load_state_dict takes torch.nn.MultiheadAttention's state dict."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, device: Optional[str] = None, seed: int = 0):
        super().__init__()
        ref = torch.nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, bias=bias, batch_first=batch_first)
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.in_proj_weight = torch.nn.Parameter(ref.in_proj_weight.detach().clone())
        self.in_proj_bias = torch.nn.Parameter(ref.in_proj_bias.detach().clone()) if bias else None
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj.load_state_dict(ref.out_proj.state_dict())
        self.clattn_device = device
        self._seed = seed

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = False, attn_mask=None,
                is_causal: bool = False):
        if need_weights:
            _invalid("need_weights=True: a training call returns no attention weights (pass need_weights=False)")
        if value is not key:
            _invalid("value: clattn projects keys and values from one input, so value must be key itself")
        wq, wk, wv = self.in_proj_weight.chunk(3, dim=0)
        bq, bk, bv = self.in_proj_bias.chunk(3, dim=0) if self.in_proj_bias is not None else (None,) * 3
        p = self.dropout if self.training else 0.0
        self._seed += 1
        opts = dict(heads=self.num_heads, causal=bool(is_causal), dropout=p, seed=self._seed,
                    batch_first=self.batch_first, device=self.clattn_device, plan_cache_size=0)
        kv = None if key is query else key
        out = AttentionFunction.apply(query, kv, _mask(key_padding_mask), _mask(attn_mask), opts, wq, wk, wv, bq,
                                      bk, bv, self.out_proj.weight, self.out_proj.bias)
        return out, None
