"""clattn.EncoderLayer: nn.TransformerEncoderLayer's computation on a clattn device."""
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
from ._device import _create, _Device, _Handle, _PlanCache, _PlanCached, _Shaped, _cache_notice
from ._inputs import _batched, _layout_code, _same_input, _unbatched, _Weights


# ---------------------------------------------------------------- encoder layer

def _is_causal_mask(m: Any, T: int) -> Optional[bool]:
    """True when m is the (T, T) causal mask (bool: True above the diagonal; float: -inf above, 0 elsewhere),
    False when it is something else; None when it is not a (T, T) mask at all."""
    arr = m.detach().cpu().numpy() if _a.is_tensor(m) else np.asarray(m)
    if arr.shape != (T, T):
        return None
    upper = np.triu(np.ones((T, T), bool), 1)
    if arr.dtype == np.bool_:
        return bool(np.array_equal(arr, upper))
    if arr.dtype.kind == "f":
        return bool(np.all(np.isneginf(arr[upper])) and np.all(arr[~upper] == 0))
    return False


class EncoderLayer(_Shaped, _PlanCached):
    """torch.nn.TransformerEncoderLayer (eval mode): self-attention, residual + LayerNorm, Linear -> activation ->
    Linear, residual + LayerNorm; norm_first for the pre-norm variant. Weights as torch stores them (layout
    "linear") or transposed ("raw"): w_ff1 (ff_dim, E), w_ff2 (E, ff_dim), LayerNorm weights and biases (E).
    Calls: layer(x, *, key_padding_mask=None) with x (B, T, E) or (T, E); forward(src, src_mask=None,
    src_key_padding_mask=None, is_causal=False) as torch's (src_mask only the causal mask)."""

    def __init__(self, heads: int, *, w_query: Any, w_key: Any, w_value: Any, w_out: Any, ln1_weight: Any,
                 ln1_bias: Any, w_ff1: Any, b_ff1: Any, w_ff2: Any, b_ff2: Any, ln2_weight: Any, ln2_bias: Any,
                 b_query: Any = None, b_key: Any = None, b_value: Any = None, b_out: Any = None,
                 activation: str = "relu", norm_first: bool = False, causal: bool = False, eps: float = 1e-5,
                 layout: str = "linear", algorithm: str = "auto", batch_first: bool = True,
                 device: Optional[str] = None, plan_cache_size: int = 16):
        self.activation = _a.choice("activation", activation, tuple(_lib.ACTIVATIONS))
        for name, v in (("w_query", w_query), ("w_key", w_key), ("w_value", w_value), ("w_out", w_out)):
            if v is None:
                _invalid(f"EncoderLayer: {name} is required")
        self._wt = _Weights(heads, None, layout, None, None, w_query, w_key, w_value, b_query, b_key, b_value,
                            w_out, b_out)
        wt = self._wt
        E = wt.embed
        if wt.kv_embed != E:
            _shape(f"w_key and w_value take inputs of width {wt.kv_embed}, w_query {E}: the encoder's attention is "
                   f"self-attention")
        if wt.out_dim != E:
            _shape(f"w_out: {wt.out_dim} output features, expected embed = {E} (the residual adds it to x)")
        self._ln = {k: _a.floats(k, v, ndim=1) for k, v in dict(ln1_weight=ln1_weight, ln1_bias=ln1_bias,
                                                                 b_ff1=b_ff1, b_ff2=b_ff2, ln2_weight=ln2_weight,
                                                                 ln2_bias=ln2_bias).items()}
        self._ff = {k: _a.floats(k, v, ndim=2) for k, v in dict(w_ff1=w_ff1, w_ff2=w_ff2).items()}
        lin = wt.layout == "linear"
        f1, f2 = self._ff["w_ff1"], self._ff["w_ff2"]
        f1_out, f1_in = f1.shape if lin else f1.shape[::-1]
        f2_out, f2_in = f2.shape if lin else f2.shape[::-1]
        if f1_in != E:
            _shape(f"w_ff1: takes {f1_in} input features, expected embed = {E}")
        if f2_out != E or f2_in != f1_out:
            _shape(f"w_ff2: ({f2_out} out, {f2_in} in) features, expected ({E}, {f1_out}) (embed, w_ff1's outputs)")
        for name, n in (("ln1_weight", E), ("ln1_bias", E), ("ln2_weight", E), ("ln2_bias", E), ("b_ff1", f1_out),
                        ("b_ff2", E)):
            if self._ln[name] is None:
                _invalid(f"EncoderLayer: {name} is required")
            if self._ln[name].shape[0] != n:
                _shape(f"{name}: {self._ln[name].shape[0]} values, expected {n}")
        self.ff_dim = f1_out
        self.norm_first = _a.flag("norm_first", norm_first)
        self.causal = _a.flag("causal", causal)
        self.eps = _a.real("eps", eps, 0.0)
        if self.eps <= 0:
            _invalid(f"eps: {eps!r}, expected a positive number")
        self.algorithm = _a.choice("algorithm", algorithm, tuple(_lib.ALGORITHMS))
        self.batch_first = _a.flag("batch_first", batch_first)
        self._plans = _PlanCache(_a.integer("plan_cache_size", plan_cache_size))
        self._device = _Device(device)
        self.device = self._device.name
        self._last_core = self._last_gemm = None

    @property
    def core_used(self) -> Optional[str]:
        """The core of the last call's self-attention ("ref" on ref; None before any)."""
        return self._last_core

    @property
    def gemm_used(self) -> Optional[str]:
        """The GEMM core of the last call's projections and feed-forward layers ("ref" on ref; None before any)."""
        return self._last_gemm

    def __repr__(self) -> str:
        return (f"clattn.EncoderLayer({self._wt.describe()}, ff_dim={self.ff_dim}, activation={self.activation!r}, "
                f"norm_first={self.norm_first}, causal={self.causal}, eps={self.eps:g}, device={self.device!r})")

    def _plan(self, B, T, E, kpm, causal):
        wt = self._wt

        def make():
            ad = _lib.AttentionDesc(batch=B, seq_q=T, embed=E, heads=wt.heads, head_dim_qk=wt.head_dim_qk,
                                    head_dim_v=wt.head_dim_v, out_dim=wt.out_dim, causal=int(causal),
                                    key_padding_mask=int(kpm), layout=_layout_code(wt.layout),
                                    algorithm=_lib.ALGORITHMS[self.algorithm])
            d = _lib.EncoderDesc(attn=ad, ff_dim=self.ff_dim, activation=_lib.ACTIVATIONS[self.activation],
                                 norm_first=int(self.norm_first), eps=self.eps)
            arrays = {**self._ln, **self._ff}
            w = _lib.EncoderWeights(attn=wt.struct(), **{k: _a.pointer(v) for k, v in arrays.items()},
                                    **{k + "_count": _a.count(v) for k, v in arrays.items()})
            return _create(self._device, _lib.encoder_plan_create, _lib.encoder_plan_free, d, w,
                           "creating the encoder plan")

        return self._plans.get((B, T, E, kpm, causal), make)

    def _run(self, x, key_padding_mask, causal, names):
        xn, kn = names
        kind, x3, batched = _batched(xn, x, self.batch_first)
        B, T, E = x3.shape
        if E != self.embed:
            _shape(f"{xn}: last dimension {E}, but the layer's width (w_query's input) is {self.embed}")
        kpm = None
        if key_padding_mask is not None:
            _, kpm = _a.mask(kn, key_padding_mask, (B, T) if batched else (T,), False, "True = ignore that token")
        plan = self._plan(B, T, E, kpm is not None, causal)
        out = np.full((B, T, E), np.nan, dtype=np.float32)
        args = _lib.EncoderArgs(x=_a.pointer(x3), key_padding_mask=_a.pointer(kpm, ctypes.c_uint8), out=_a.pointer(out),
                                x_count=x3.size, key_padding_mask_count=_a.count(kpm), out_count=out.size)
        _check(_lib.encoder_plan_execute(plan.handle, ctypes.byref(args)), "running the encoder layer")
        self._last_core = _lib.encoder_plan_core(plan.handle).decode()
        self._last_gemm = _lib.encoder_plan_gemm(plan.handle).decode()
        return kind.out(_unbatched(out, batched, self.batch_first))

    def __call__(self, x: Any, *, key_padding_mask: Any = None) -> Any:
        """The layer's output, shaped as x: (B, T, E) or (T, E). key_padding_mask (B, T) bool, True = ignore."""
        return self._run(x, key_padding_mask, self.causal, ("x", "key_padding_mask"))

    def forward(self, src: Any, src_mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False) -> Any:
        """nn.TransformerEncoderLayer.forward. src_mask may only be the causal mask (bool True above the diagonal,
        or float -inf there and 0 elsewhere, as nn.Transformer.generate_square_subsequent_mask makes); any other
        mask is refused: clattn's encoder layer takes no general attention mask."""
        causal = self.causal or _a.flag("is_causal", is_causal)
        if src_mask is not None:
            sa = src.shape if hasattr(src, "shape") else np.asarray(src).shape
            T = sa[1] if len(sa) == 3 and self.batch_first else sa[0]
            is_causal_mask = _is_causal_mask(src_mask, T)
            if is_causal_mask is None:
                _shape(f"src_mask: shape {tuple(getattr(src_mask, 'shape', ()))}, expected ({T}, {T})")
            if not is_causal_mask:
                _invalid("src_mask: clattn's encoder layer takes only the causal mask (causal=True or is_causal); "
                         "this mask is another")
            causal = True
        return self._run(src, src_key_padding_mask, causal, ("src", "src_key_padding_mask"))
