"""What the modules share about their inputs: the weights' layout and device copies, batching."""
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
from ._device import _Device


def _layout_code(layout: str) -> int:
    return _lib.LAYOUT_LINEAR if layout == "linear" else _lib.LAYOUT_RAW


# ---------------------------------------------------------------- the weights of an attention module

class _Weights:
    """The Q/K/V/out projections of a module, converted and checked against each other once.

    embed / kv_embed: the input widths w_query and w_key take (None without Q/K/V weights: then Q = x, K = V = kv,
    and the head sizes follow from the input's width at the call)."""

    def __init__(self, heads, kv_heads, layout, head_dim_qk, head_dim_v, w_query, w_key, w_value, b_query, b_key,
                 b_value, w_out, b_out, sinks=None):
        self.heads = _a.integer("heads", heads, 1)
        self.kv_heads = self.heads if kv_heads is None else _a.integer("kv_heads", kv_heads, 1)
        if self.heads % self.kv_heads:
            _shape(f"kv_heads: {self.kv_heads} does not divide heads ({self.heads})")
        self.layout = _a.choice("layout", layout, ("linear", "raw"))
        self.w = {k: _a.floats(k, v, ndim=2) for k, v in
                  dict(w_query=w_query, w_key=w_key, w_value=w_value, w_out=w_out).items()}
        self.b = {k: _a.floats(k, v, ndim=1) for k, v in
                  dict(b_query=b_query, b_key=b_key, b_value=b_value, b_out=b_out).items()}
        lin = self.layout == "linear"
        # attention sinks (gpt-oss): one logit per query head, finite or -inf (the library checks the values)
        self.sinks = _a.floats("sinks", sinks, ndim=1)
        if self.sinks is not None and self.sinks.shape != (self.heads,):
            _shape(f"sinks: {self.sinks.shape[0]} values, expected one per query head (heads={self.heads})")

        def out_in(name):  # (output features, input width) whatever the layout
            a = self.w[name]
            return (a.shape[0], a.shape[1]) if lin else (a.shape[1], a.shape[0])

        given = [self.w[k] is not None for k in ("w_query", "w_key", "w_value")]
        if any(given) and not all(given):
            _invalid("w_query, w_key and w_value: give all three or none")
        self.has_qkv = all(given)
        H, HK = self.heads, self.kv_heads
        lay = "(out_features, in_features)" if lin else "(in_features, out_features)"
        if self.has_qkv:
            q_out, self.embed = out_in("w_query")
            k_out, self.kv_embed = out_in("w_key")
            v_out, v_in = out_in("w_value")
            if v_in != self.kv_embed:
                _shape(f"w_key and w_value take inputs of width {self.kv_embed} and {v_in} ({self.layout} layout: "
                       f"{lay}); keys and values are projected from one input")
            if q_out % H:
                _shape(f"w_query: {q_out} output features do not split into heads={H}")
            dk = q_out // H
            if k_out != HK * dk:
                _shape(f"w_key: {k_out} output features, expected kv_heads*head_dim_qk = {HK}*{dk} = {HK * dk} "
                       f"(w_query has {q_out} for {H} heads)")
            if v_out % HK:
                _shape(f"w_value: {v_out} output features do not split into kv_heads={HK}")
            dv = v_out // HK
            for name, given_dim, dim in (("head_dim_qk", head_dim_qk, dk), ("head_dim_v", head_dim_v, dv)):
                if given_dim is not None and _a.integer(name, given_dim, 1) != dim:
                    _shape(f"{name}: {given_dim}, but the weights make it {dim}")
            self.head_dim_qk, self.head_dim_v = dk, dv
            for name, n in (("b_query", H * dk), ("b_key", HK * dk), ("b_value", HK * dv)):
                if self.b[name] is not None and self.b[name].shape[0] != n:
                    _shape(f"{name}: {self.b[name].shape[0]} values, expected {n}")
        else:
            for name in ("b_query", "b_key", "b_value"):
                if self.b[name] is not None:
                    _invalid(f"{name} without w_query, w_key and w_value: a bias needs its weight")
            if HK != H:
                _invalid(f"kv_heads={HK} (grouped-query attention) needs w_query, w_key and w_value")
            for name, v in (("head_dim_qk", head_dim_qk), ("head_dim_v", head_dim_v)):
                if v is not None:
                    _invalid(f"{name}: without w_query, w_key and w_value the head size is the input's width / "
                             f"heads (leave {name} out)")
            self.embed = self.kv_embed = None
            self.head_dim_qk = self.head_dim_v = None
        self.out_dim = 0
        if self.w["w_out"] is not None:
            self.out_dim, o_in = out_in("w_out")
            if self.has_qkv and o_in != H * self.head_dim_v:
                _shape(f"w_out: takes {o_in} input features, expected heads*head_dim_v = {H}*{self.head_dim_v} = "
                       f"{H * self.head_dim_v} ({self.layout} layout: {lay})")
            self._out_in = o_in
            if self.b["b_out"] is not None and self.b["b_out"].shape[0] != self.out_dim:
                _shape(f"b_out: {self.b['b_out'].shape[0]} values, expected {self.out_dim} (w_out's output features)")
        elif self.b["b_out"] is not None:
            _invalid("b_out without w_out: a bias needs its weight")

    def check_input(self, name: str, width: int, kv_name: Optional[str], kv_width: Optional[int]):
        """The widths of x (and of kv for cross-attention, None for self) against the weights."""
        cross = kv_name is not None
        src = kv_width if cross else width
        if self.has_qkv:
            if width != self.embed:
                _shape(f"{name}: last dimension {width}, but w_query takes inputs of width {self.embed}")
            if src != self.kv_embed:
                if cross:
                    _shape(f"{kv_name}: last dimension {src}, but w_key and w_value take inputs of width "
                           f"{self.kv_embed}")
                _shape(f"{name}: last dimension {width}, but w_key and w_value take inputs of width {self.kv_embed} "
                       f"(self-attention projects queries, keys and values from {name}; pass a separate key input "
                       f"for cross-attention)")
            return
        if width % self.heads:
            _shape(f"{name}: last dimension {width} does not split into heads={self.heads} (no Q/K/V weights: "
                   f"queries are {name} itself)")
        if cross and src != width:
            _shape(f"{kv_name}: last dimension {src}, but without Q/K/V weights keys are {kv_name} itself and must "
                   f"have the width of {name} ({width})")
        if self.w["w_out"] is not None and self._out_in != width:
            _shape(f"{name}: last dimension {width}, but w_out takes {self._out_in} input features (without Q/K/V "
                   f"weights the attention output has the width of the values)")

    def struct(self, dtype: str = "float32") -> "_lib.AttentionWeights":
        """The weights as the library takes them, in dtype (half copies made once per dtype and kept: the struct
        points at them)."""
        arrays = {**self.w, **self.b, "sinks": self.sinks}
        if dtype != "float32":
            cache = self.__dict__.setdefault("_typed", {})
            if dtype not in cache:
                cache[dtype] = {k: None if v is None else _a.convert(v, "float32", dtype) for k, v in arrays.items()}
            arrays = cache[dtype]
        return _lib.AttentionWeights(**{k: _a.pointer(v) for k, v in arrays.items()},
                                     **{k + "_count": _a.count(v) for k, v in arrays.items()})

    def describe(self) -> str:
        s = f"heads={self.heads}"
        if self.kv_heads != self.heads:
            s += f", kv_heads={self.kv_heads}"
        if self.has_qkv:
            s += f", embed={self.embed}"
            if self.kv_embed != self.embed:
                s += f", kv_embed={self.kv_embed}"
            s += f", head_dim_qk={self.head_dim_qk}, head_dim_v={self.head_dim_v}"
        if self.out_dim:
            s += f", out_dim={self.out_dim}"
        if self.sinks is not None:
            s += ", sinks"
        return s


# ---------------------------------------------------------------- attention

def _same_input(a: Any, b: Any) -> bool:
    """b is a, or an array equal to it (torch's mha(x, x, x) with x passed as copies)."""
    if a is b:
        return True
    if _a.is_tensor(a) != _a.is_tensor(b):
        return False
    try:
        if _a.is_tensor(a):
            return a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())
        a_, b_ = np.asarray(a), np.asarray(b)
        return a_.shape == b_.shape and a_.dtype == b_.dtype and bool(np.array_equal(a_, b_))
    except Exception:
        return False


def _batched(name: str, x: Any, batch_first: bool, dtype: str = "float32"):
    """(kind, x3, batched): x as a C-contiguous (B, T, E) array of dtype's storage (float32; float16; bfloat16 as
    uint16 bits), from (B, T, E), (T, B, E) when not batch_first, or one sequence (T, E); kind says how results go
    back."""
    kind = _a.Kind(x)
    xa = _a.typed(name, x, dtype, ndim=(2, 3))
    batched = xa.ndim == 3
    if batched and not batch_first:
        xa = np.ascontiguousarray(xa.transpose(1, 0, 2))
    return kind, (xa if batched else xa[None]), batched


def _unbatched(out: np.ndarray, batched: bool, batch_first: bool) -> np.ndarray:
    """A (B, T, ...) result in the input's layout."""
    if not batched:
        return out[0]
    return out if batch_first else np.ascontiguousarray(out.transpose(1, 0, 2))
