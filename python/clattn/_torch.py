"""clattn.from_torch: a clattn module from a PyTorch module's parameters."""
from __future__ import annotations

import collections
import ctypes
import logging
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _arrays as _a
from . import _lib
from ._errors import (BuildFailureError, DeviceAllocationError, Error, InvalidArgumentError, InvalidDeviceSpecError,
                      NoDeviceError, OpenCLError, OutOfHostMemoryError, ShapeMismatchError, SizeOverflowError,
                      TooLargeForDeviceError, UnsupportedError)
from ._errors import check as _check
from ._errors import invalid as _invalid
from ._errors import shape as _shape

logger = logging.getLogger("clattn")
from ._attention import Attention
from ._encoder import EncoderLayer


# ---------------------------------------------------------------- from torch

def _param(name, t):
    return None if t is None else _a.floats(name, t)


def _module_dtype(w) -> str:
    """The plan type of a module whose weights are w's dtype: float16 and bfloat16 modules make plans of their
    type (clattn 0.7), float32 (and the refused float64, refused by _param) float32 ones."""
    name = str(w.dtype).replace("torch.", "")
    return name if name in ("float16", "bfloat16") else "float32"


def _refuse_training_dropout(module, what, p):
    if module.training and p > 0:
        _invalid(f"from_torch: {what} is in training mode with dropout {p}; clattn carries eval semantics "
                 f"(no dropout): call module.eval() first")


def from_torch(module: Any, device: Optional[str] = None, causal: bool = False,
               plan_cache_size: int = 16):
    """An Attention from torch.nn.MultiheadAttention, or an EncoderLayer from torch.nn.TransformerEncoderLayer,
    with the module's weights copied (float32; a float16/bfloat16 MultiheadAttention makes an Attention of that dtype,
    an EncoderLayer widens them exactly; float64 refused) and its
    batch_first carried over. Eval semantics: a module in training mode with dropout is refused. What clattn
    cannot represent is refused with the reason: add_bias_kv, add_zero_attn, key and value inputs of different
    widths (kdim != vdim), activations other than ReLU and GELU, LayerNorms with different eps. torch is needed
    only here."""
    import torch
    if isinstance(module, torch.nn.MultiheadAttention):
        m = module
        if m.bias_k is not None or m.bias_v is not None:
            _invalid("from_torch: MultiheadAttention(add_bias_kv=True) appends learned bias_k/bias_v tokens to the "
                     "keys and values; clattn has no such tokens")
        if m.add_zero_attn:
            _invalid("from_torch: MultiheadAttention(add_zero_attn=True) appends a zero key/value; clattn has none")
        _refuse_training_dropout(m, "the MultiheadAttention", m.dropout)
        if m._qkv_same_embed_dim:
            wq, wk, wv = m.in_proj_weight.chunk(3, dim=0)
        else:
            if m.kdim != m.vdim:
                _invalid(f"from_torch: kdim={m.kdim} and vdim={m.vdim} differ; clattn projects keys and values "
                         f"from one input (kdim == vdim)")
            wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
        bq = bk = bv = None
        if m.in_proj_bias is not None:
            bq, bk, bv = m.in_proj_bias.chunk(3, dim=0)
        return Attention(m.num_heads, w_query=_param("w_query", wq), w_key=_param("w_key", wk),
                         w_value=_param("w_value", wv), b_query=_param("b_query", bq), b_key=_param("b_key", bk),
                         b_value=_param("b_value", bv), w_out=_param("w_out", m.out_proj.weight),
                         b_out=_param("b_out", m.out_proj.bias), causal=causal, batch_first=bool(m.batch_first),
                         device=device, plan_cache_size=plan_cache_size, dtype=_module_dtype(m.out_proj.weight))
    if isinstance(module, torch.nn.TransformerEncoderLayer):
        m = module
        for what, p in (("the TransformerEncoderLayer", max(m.dropout.p, m.dropout1.p, m.dropout2.p)),
                        ("its self-attention", m.self_attn.dropout)):
            _refuse_training_dropout(m, what, p)
        act = {1: "relu", 2: "gelu"}.get(getattr(m, "activation_relu_or_gelu", None))
        if act is None:
            fn = m.activation
            if fn is torch.nn.functional.relu or isinstance(fn, torch.nn.ReLU):
                act = "relu"
            elif (fn is torch.nn.functional.gelu or isinstance(fn, torch.nn.GELU)) and \
                    getattr(fn, "approximate", "none") == "none":
                act = "gelu"
            else:
                _invalid(f"from_torch: activation {fn!r}; clattn has ReLU and GELU (erf form)")
        sa = m.self_attn
        if sa.bias_k is not None or sa.add_zero_attn or not sa._qkv_same_embed_dim:
            _invalid("from_torch: the layer's self-attention has add_bias_kv, add_zero_attn or separate projections")
        if m.norm1.eps != m.norm2.eps:
            _invalid(f"from_torch: norm1.eps={m.norm1.eps} and norm2.eps={m.norm2.eps} differ; clattn has one eps")
        E = sa.embed_dim
        wq, wk, wv = sa.in_proj_weight.chunk(3, dim=0)
        bq, bk, bv = sa.in_proj_bias.chunk(3, dim=0) if sa.in_proj_bias is not None else (None,) * 3

        def norm(name, t, fill):  # LayerNorm(elementwise_affine=False) or (bias=False): ones / zeros
            return _param(name, t) if t is not None else np.full(E, fill, np.float32)

        def vec(name, t, n):  # Linear(bias=False): zeros
            return _param(name, t) if t is not None else np.zeros(n, np.float32)

        F = m.linear1.out_features
        return EncoderLayer(sa.num_heads, w_query=_param("w_query", wq), w_key=_param("w_key", wk),
                            w_value=_param("w_value", wv), b_query=_param("b_query", bq), b_key=_param("b_key", bk),
                            b_value=_param("b_value", bv), w_out=_param("w_out", sa.out_proj.weight),
                            b_out=_param("b_out", sa.out_proj.bias),
                            ln1_weight=norm("ln1_weight", m.norm1.weight, 1.0), ln1_bias=norm("ln1_bias", m.norm1.bias, 0.0),
                            w_ff1=_param("w_ff1", m.linear1.weight), b_ff1=vec("b_ff1", m.linear1.bias, F),
                            w_ff2=_param("w_ff2", m.linear2.weight), b_ff2=vec("b_ff2", m.linear2.bias, E),
                            ln2_weight=norm("ln2_weight", m.norm2.weight, 1.0), ln2_bias=norm("ln2_bias", m.norm2.bias, 0.0),
                            activation=act, norm_first=bool(m.norm_first), causal=causal, eps=m.norm1.eps,
                            batch_first=bool(getattr(m.self_attn, "batch_first", False)), device=device,
                            plan_cache_size=plan_cache_size)
    _invalid(f"from_torch: {type(module).__name__} is not nn.MultiheadAttention or nn.TransformerEncoderLayer")
