"""clattn: transformer attention on any OpenCL device, from NumPy or PyTorch.

    import clattn
    clattn.devices()                                   # ref and every OpenCL device
    attn = clattn.Attention(heads=2, w_query=..., w_key=..., w_value=..., w_out=..., causal=True)
    out, weights = attn(x, need_weights=True)          # x (B, T, E) or (T, E)
    out, avg = attn.forward(q, k, v)                   # nn.MultiheadAttention's call
    layer = clattn.EncoderLayer(heads=2, ...)          # torch.nn.TransformerEncoderLayer, eval mode
    clattn.from_torch(torch_module)                    # nn.MultiheadAttention / nn.TransformerEncoderLayer
    dec = clattn.Decoder(heads=32, kv_heads=8, w_query=..., ..., batch=1, capacity=4096, max_new_tokens=512)
    out = dec(prompt)                                  # prefill (B, n, E); then dec(x_next) per token

Inputs are NumPy arrays (any floating dtype, converted to float32; results are float32 NumPy arrays) or
torch tensors on the CPU (float32 as is; float16 and bfloat16 widened to float32 exactly, computed in
float32, and the results rounded back to the input's dtype; float64 refused, as clattn would round it;
results are detached CPU tensors: clattn records no autograd). Every shape is checked against the module
before the library is called, and every failure raises a subclass of clattn.Error (ShapeMismatchError and
InvalidArgumentError are ValueErrors) naming the Python argument. Plans (the library's compiled form of one
input shape) are made on first use and kept in a least-recently-used cache of plan_cache_size entries.
The first plan on an OpenCL device may compile kernels for seconds: the "clattn" logger says so (a
warning, once per device); later runs load them from the kernel cache.
"""
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

__all__ = ["Error", "InvalidArgumentError", "ShapeMismatchError", "SizeOverflowError", "TooLargeForDeviceError",
           "OutOfHostMemoryError", "DeviceAllocationError", "BuildFailureError", "UnsupportedError", "NoDeviceError",
           "InvalidDeviceSpecError", "OpenCLError", "devices", "cores", "version", "Attention", "Decoder",
           "EncoderLayer", "from_torch", "plot_attention"]
__version__ = "0.5.0"

logger = logging.getLogger("clattn")

# ---------------------------------------------------------------- notices from the library

_noticed_devices = set()
_noticed_cache = [""]
_noticed_plans = set()


@_lib.BuildNoticeFn
def _build_notice(device_name, user):  # called by the library, from the thread creating a plan
    try:
        name = (device_name or b"").decode(errors="replace")
        if name not in _noticed_devices:
            _noticed_devices.add(name)
            logger.warning("compiling OpenCL kernels for %s (the first time for this device and clattn "
                           "version; later runs load them from the kernel cache)", name)
    except Exception:  # never let a notice raise into C
        pass


_lib.set_build_notice(_build_notice, None)


def _cache_notice():
    n = (_lib.kernel_cache_notice() or b"").decode(errors="replace")
    if n and n != _noticed_cache[0]:
        _noticed_cache[0] = n
        logger.warning("the kernel cache was not used: %s", n)


def version() -> str:
    """The version of the libclattn this package loaded."""
    return _lib.version().decode()


def devices() -> List[Dict[str, Any]]:
    """Every device clattn can open: ref first, then each OpenCL device, as dicts (selector, platform, name,
    type, compute_units, global_mem_bytes, max_alloc_bytes, opencl_c_version, fp16, fp64)."""
    n = ctypes.c_size_t(0)
    _check(_lib.device_list(None, 0, ctypes.byref(n)), "listing devices")
    infos = (_lib.DeviceInfo * max(n.value, 1))()
    _check(_lib.device_list(infos, n.value, ctypes.byref(n)), "listing devices")
    out = [dict(selector="ref", platform="", name="CPU reference (plain C)", type="cpu", compute_units=1,
                global_mem_bytes=0, max_alloc_bytes=0, opencl_c_version="", fp16=False, fp64=True)]
    for d in infos[:n.value]:
        out.append(dict(selector=d.selector.decode(), platform=d.platform.decode(), name=d.name.decode(),
                        type=d.type.decode(), compute_units=d.compute_units, global_mem_bytes=d.global_mem_bytes,
                        max_alloc_bytes=d.max_alloc_bytes, opencl_c_version=d.opencl_c_version.decode(),
                        fp16=bool(d.fp16), fp64=bool(d.fp64)))
    return out


def cores(device: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every core clattn has, as `clattn cores --json` lists them on `device` (a spec as for devices(); None: the
    default device): dicts with name, kind ("prefill", "decode", "gemm": the matrix products, or
        "backward": a training plan's attention backward), supported,
    emulated (forcing it runs an emulation here, for tests), reason (why not, "" when supported), default_for (the
    head-size classes, "<=32" ... ">256", whose plans AUTO gives it there), algorithm (None for GEMM cores),
    weights, params and test_configs. CLATTN_CORE=NAME[:P=V,...][;NAME...] in the environment forces cores (one
    per kind) on the plans that can use them."""
    dev = _Device(device)
    out = []
    for i in range(_lib.core_count()):
        c = _lib.CoreInfo()
        _check(_lib.core_describe(dev.handle, i, ctypes.byref(c)), "describing the cores")
        out.append(dict(name=c.name.decode(), kind=_lib.CORE_KINDS[c.kind], supported=bool(c.supported),
                        emulated=bool(c.emulated), reason=c.reason.decode(),
                        default_for=[_lib.head_class_label(k).decode() for k in range(_lib.HEAD_CLASS_COUNT)
                                     if c.default_for & (1 << k)],
                        algorithm=None if c.kind == _lib.CORE_GEMM else {1: "fused", 2: "unfused"}.get(c.algorithm, "auto"),
                        weights=bool(c.produces_weights),
                        params=c.params.decode().split(), test_configs=c.test_configs.decode().split()))
    return out


class _Device:
    """An open clattn device (freed with the object)."""

    def __init__(self, spec: Optional[str]):
        if spec is not None and not isinstance(spec, str):
            _invalid(f"device: {spec!r}, expected a device spec string (see clattn.devices()) or None")
        self.handle = ctypes.c_void_p()
        _check(_lib.device_open(spec.encode() if spec else None, ctypes.byref(self.handle)),
               f"opening device {spec!r}")
        self.name = _lib.device_name(self.handle).decode()
        self.backend = "opencl" if _lib.device_backend(self.handle) == _lib.BACKEND_OPENCL else "ref"

    def __del__(self):
        if getattr(self, "handle", None):
            _lib.device_free(self.handle)
            self.handle = None


class _Handle:
    """A library object (plan, decode plan, KV cache), freed when the last reference goes."""

    def __init__(self, handle, free, device):
        self.handle, self._free, self._device = handle, free, device  # the device outlives its plans

    def __del__(self):
        if getattr(self, "handle", None):
            self._free(self.handle)
            self.handle = None


def _create(device: "_Device", create, free, desc, weights, what: str) -> "_Handle":
    """A library object from create(device, &desc, &weights, &handle), freed with free; the kernel cache's notice
    (if any) reported whatever happened, and the plan's own (clattn_last_notice) once per text."""
    handle = ctypes.c_void_p()
    try:
        _check(create(device.handle, ctypes.byref(desc), ctypes.byref(weights), ctypes.byref(handle)), what)
    finally:
        _cache_notice()
    note = (_lib.last_notice() or b"").decode(errors="replace")
    if note and note not in _noticed_plans:  # what the plan was asked for and does not do (CLATTN_CORE), once
        _noticed_plans.add(note)
        logger.warning("%s", note)
    return _Handle(handle, free, device)


class _PlanCache:
    """The plans of one module, per input shape, least recently used first out."""

    def __init__(self, size: int):
        self.size = size
        self._plans: "collections.OrderedDict[tuple, _Handle]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, make, refresh=None):
        """The plan for key: the cached one (after refresh(plan), when given), else make()'s."""
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                if refresh is not None:
                    refresh(plan)
                return plan
            plan = make()
            if self.size:
                self._plans[key] = plan
                while len(self._plans) > self.size:
                    self._plans.popitem(last=False)
            return plan

    def resize(self, size: int):
        with self._lock:
            self.size = size
            while len(self._plans) > size:
                self._plans.popitem(last=False)

    def __len__(self):
        return len(self._plans)


class _Shaped:
    """The shape of a module's attention, read-only (from its weights)."""

    _wt: "_Weights"
    heads = property(lambda self: self._wt.heads, doc="Query heads H.")
    kv_heads = property(lambda self: self._wt.kv_heads, doc="Key/value heads (= heads unless grouped-query).")
    layout = property(lambda self: self._wt.layout, doc='"linear" or "raw".')
    embed = property(lambda self: self._wt.embed, doc="The input width w_query takes (None without weights).")
    head_dim_qk = property(lambda self: self._wt.head_dim_qk, doc="Query/key head size (None without weights).")
    head_dim_v = property(lambda self: self._wt.head_dim_v, doc="Value head size (None without weights).")
    out_dim = property(lambda self: self._wt.out_dim, doc="Rows of w_out (0 without an output projection).")


class _PlanCached:
    """The plan cache's knobs, shared by the modules that make a plan per input shape."""

    _plans: _PlanCache

    @property
    def plan_cache_size(self) -> int:
        """How many input shapes keep their plan (least recently used out); settable (0 keeps none)."""
        return self._plans.size

    @plan_cache_size.setter
    def plan_cache_size(self, n: int) -> None:
        self._plans.resize(_a.integer("plan_cache_size", n))

    @property
    def plans_cached(self) -> int:
        """How many plans the module holds now."""
        return len(self._plans)


def _layout_code(layout: str) -> int:
    return _lib.LAYOUT_LINEAR if layout == "linear" else _lib.LAYOUT_RAW


# ---------------------------------------------------------------- the weights of an attention module

class _Weights:
    """The Q/K/V/out projections of a module, converted and checked against each other once.

    embed / kv_embed: the input widths w_query and w_key take (None without Q/K/V weights: then Q = x, K = V = kv,
    and the head sizes follow from the input's width at the call)."""

    def __init__(self, heads, kv_heads, layout, head_dim_qk, head_dim_v, w_query, w_key, w_value, b_query, b_key,
                 b_value, w_out, b_out):
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

    def struct(self) -> "_lib.AttentionWeights":
        arrays = {**self.w, **self.b}
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


def _batched(name: str, x: Any, batch_first: bool):
    """(kind, x3, batched): x as a C-contiguous float32 (B, T, E) array, from (B, T, E), (T, B, E) when not
    batch_first, or one sequence (T, E); kind says how results go back."""
    kind = _a.Kind(x)
    xa = _a.floats(name, x, ndim=(2, 3))
    batched = xa.ndim == 3
    if batched and not batch_first:
        xa = np.ascontiguousarray(xa.transpose(1, 0, 2))
    return kind, (xa if batched else xa[None]), batched


def _unbatched(out: np.ndarray, batched: bool, batch_first: bool) -> np.ndarray:
    """A (B, T, ...) result in the input's layout."""
    if not batched:
        return out[0]
    return out if batch_first else np.ascontiguousarray(out.transpose(1, 0, 2))


class Attention(_Shaped, _PlanCached):
    """Multi-head attention: torch.nn.MultiheadAttention / scaled_dot_product_attention semantics.

    Weights (NumPy arrays or torch tensors) are optional: without w_query/w_key/w_value, Q = x and K = V = kv (or
    x), split into `heads`. layout "linear" takes torch.nn.Linear's (out_features, in_features) matrices, "raw"
    the tutorials' x @ W (in_features, out_features) ones. kv_heads < heads: grouped-query attention (w_key and
    w_value have kv_heads * head size rows). window (with causal): query i sees key j when i - 16 < j <= i for
    window=16. dropout p (with seed) drops attention weights in every call (training-mode dropout; 0 = eval).
    kv_half rounds keys and values to float16 after their projection. algorithm "auto", "fused" or "unfused".
    precision "fp32" (default) or "tf32": the attention core's products on TF32 operands (like
    torch.backends.cuda.matmul.allow_tf32), taken only by the tensor-core core flash_mma (CLATTN_CORE=flash_mma);
    every other core and the ref device refuse it with the reason. batch_first=False takes and returns (T, B, E), as nn.MultiheadAttention(batch_first=False).
    device: a spec as clattn.devices() lists them (None: $CLATTN_DEVICE, else the first OpenCL device, else ref).
    plan_cache_size: how many input shapes keep their plan (least recently used out; 0 = none kept).

    Calls: attn(x, kv=None, *, key_padding_mask=None, attn_mask=None, need_weights=False) -> (out, weights),
    and forward(query, key, value, ...) as nn.MultiheadAttention.forward.
    """

    def __init__(self, heads: int, *, w_query: Any = None, w_key: Any = None, w_value: Any = None,
                 b_query: Any = None, b_key: Any = None, b_value: Any = None, w_out: Any = None, b_out: Any = None,
                 head_dim_qk: Optional[int] = None, head_dim_v: Optional[int] = None, kv_heads: Optional[int] = None,
                 causal: bool = False, window: int = 0, scale: float = 0.0, dropout: float = 0.0, seed: int = 0,
                 kv_half: bool = False, layout: str = "linear", algorithm: str = "auto", batch_first: bool = True,
                 device: Optional[str] = None, plan_cache_size: int = 16, precision: str = "fp32"):
        self._wt = _Weights(heads, kv_heads, layout, head_dim_qk, head_dim_v, w_query, w_key, w_value, b_query,
                            b_key, b_value, w_out, b_out)
        self.causal = _a.flag("causal", causal)
        self.window = _a.integer("window", window)
        if self.window and not self.causal:
            _invalid(f"window={self.window} needs causal=True (a sliding window looks back from each query)")
        self.scale = _a.real("scale", scale)
        self.dropout = _a.real("dropout", dropout, 0.0, 1.0, hi_open=True)
        self.seed = _a.integer("seed", seed, 0, _a.U64_MAX)
        self.kv_half = _a.flag("kv_half", kv_half)
        self.algorithm = _a.choice("algorithm", algorithm, tuple(_lib.ALGORITHMS))
        self.precision = _a.choice("precision", precision, tuple(_lib.PRECISIONS))
        self.batch_first = _a.flag("batch_first", batch_first)
        self._plans = _PlanCache(_a.integer("plan_cache_size", plan_cache_size))
        self._device = _Device(device)
        self.device = self._device.name
        self._last = (None, None, None)  # (algorithm, core, GEMM core) of the last call
        self._last_backward = None  # (backward core, its parameters) of the last backward
        self._wt_version = 0  # set_weights counts up; each plan holds the weights of the version it has

    @property
    def algorithm_used(self) -> Optional[str]:
        """The algorithm of the last call ("fused", "unfused", or "reference" on ref; None before any)."""
        return self._last[0]

    @property
    def core_used(self) -> Optional[str]:
        """The core of the last call ("flash_rows", "unfused", ..., "ref" on ref; see clattn.cores())."""
        return self._last[1]

    @property
    def gemm_used(self) -> Optional[str]:
        """The GEMM core of the last call's projections ("gemm_tiles", "gemm_clblast", "ref" on ref)."""
        return self._last[2]

    @property
    def backward_core_used(self) -> Optional[str]:
        """The backward core of the last backward() with its parameters ("flash_backward:ROWS=16,PART=4", "ref"
        on ref; None before any)."""
        return self._last_backward

    def __repr__(self) -> str:
        opts = [self._wt.describe()]
        for name, default in (("causal", False), ("window", 0), ("scale", 0.0), ("dropout", 0.0), ("kv_half", False),
                              ("layout", "linear"), ("algorithm", "auto"), ("precision", "fp32"),
                              ("batch_first", True)):
            v = getattr(self, name)
            if v != default:
                opts.append(f"{name}={v!r}")
        return f"clattn.Attention({', '.join(opts)}, device={self.device!r})"

    def _plan(self, B, Tq, E, cross, Tk, Ekv, mask_kind, kpm, need_weights, causal, training=False):
        wt = self._wt

        def make():
            d = _lib.AttentionDesc(batch=B, seq_q=Tq, seq_kv=Tk if cross else 0, embed=E,
                                   kv_embed=Ekv if cross else 0, heads=wt.heads, head_dim_qk=wt.head_dim_qk or 0,
                                   head_dim_v=wt.head_dim_v or 0, out_dim=wt.out_dim, cross=int(cross),
                                   causal=int(causal), attn_mask=mask_kind, key_padding_mask=int(kpm),
                                   scale=self.scale, dropout=self.dropout, seed=self.seed,
                                   layout=_layout_code(wt.layout), algorithm=_lib.ALGORITHMS[self.algorithm],
                                   need_weights=int(need_weights), kv_heads=wt.kv_heads, window=self.window,
                                   kv_half=int(self.kv_half), precision=_lib.PRECISIONS[self.precision],
                                   training=int(training))
            plan = _create(self._device, _lib.plan_create, _lib.plan_free, d, wt.struct(), "creating the attention plan")
            plan.weights_version = self._wt_version
            return plan

        def refresh(plan):  # a plan made before set_weights takes the new weights, keeping its kernels
            if plan.weights_version != self._wt_version:
                _check(_lib.plan_set_weights(plan.handle, ctypes.byref(self._wt.struct())), "setting the new weights")
                plan.weights_version = self._wt_version

        # the options a plan is made with are part of its key: one changed on the module gets a new plan (the
        # dropout seed is set on the plan at each call instead)
        opts = (self.scale, self.dropout, self.window, self.kv_half, self.algorithm, self.precision)
        return self._plans.get((B, Tq, E, cross, Tk, Ekv, mask_kind, kpm, need_weights, causal, training, opts), make,
                               refresh)

    def _inputs(self, x, kv, key_padding_mask, attn_mask, names):
        """The call's inputs checked and converted: (kind, batched, x3, kv3, kpm, mask_kind, mask, B, Tq, E, Tk,
        Ekv)."""
        xn, kvn = names
        kind, x3, batched = _batched(xn, x, self.batch_first)
        B, Tq, E = x3.shape
        cross = kv is not None
        if cross:
            _, kv3, kv_batched = _batched(kvn, kv, self.batch_first)
            if kv_batched != batched:
                _shape(f"{kvn}: {3 if kv_batched else 2}-D, but {xn} is {3 if batched else 2}-D")
            if kv3.shape[0] != B:
                _shape(f"{kvn}: batch {kv3.shape[0]}, but {xn} has batch {B}")
            Tk, Ekv = kv3.shape[1], kv3.shape[2]
        else:
            kv3, Tk, Ekv = None, Tq, E
        self._wt.check_input(xn, E, kvn if cross else None, Ekv if cross else None)
        kpm = None
        if key_padding_mask is not None:
            _, kpm = _a.mask("key_padding_mask", key_padding_mask, (B, Tk) if batched else (Tk,), False,
                             "True = ignore that key")
        mask_kind, mask = _lib.MASK_NONE, None
        if attn_mask is not None:
            am_kind, mask = _a.mask("attn_mask", attn_mask, (Tq, Tk), True, "True = not allowed")
            mask_kind = _lib.MASK_BOOL if am_kind == "bool" else _lib.MASK_FLOAT
        return kind, batched, x3, kv3, kpm, mask_kind, mask, B, Tq, E, Tk, Ekv

    def _training_plan(self, B, Tq, E, cross, Tk, Ekv, mask_kind, kpm, causal, seed):
        """The training plan of these inputs (shared by forward_train and backward), with the dropout seed set."""
        plan = self._plan(B, Tq, E, cross, Tk, Ekv, mask_kind, kpm, False, causal, training=True)
        seed = self.seed if seed is None else _a.integer("seed", seed, 0, _a.U64_MAX)
        _check(_lib.plan_set_seed(plan.handle, seed), "setting the dropout seed")
        return plan

    def _run(self, x, kv, key_padding_mask, attn_mask, need_weights, causal, names, stats=False, seed=None):
        kind, batched, x3, kv3, kpm, mask_kind, mask, B, Tq, E, Tk, Ekv = self._inputs(x, kv, key_padding_mask,
                                                                                       attn_mask, names)
        cross = kv3 is not None
        need_weights = bool(need_weights)
        if stats:
            plan = self._training_plan(B, Tq, E, cross, Tk, Ekv, mask_kind, kpm is not None, causal, seed)
        else:
            plan = self._plan(B, Tq, E, cross, Tk, Ekv, mask_kind, kpm is not None, need_weights, causal)
            if self.dropout:
                _check(_lib.plan_set_seed(plan.handle, _a.integer("seed", self.seed, 0, _a.U64_MAX)),
                       "setting the dropout seed")
        width = _lib.plan_out_width(plan.handle)
        out = np.full((B, Tq, width), np.nan, dtype=np.float32)
        weights = np.full((B, self.heads, Tq, Tk), np.nan, dtype=np.float32) if need_weights else None
        lse = np.full((B, self.heads, Tq), np.nan, dtype=np.float32) if stats else None
        context = np.full((B, Tq, self._context_width(E)), np.nan, dtype=np.float32) if stats else None
        arrays = dict(x=x3, kv=kv3, key_padding_mask=kpm, attn_mask=mask, out=out, attn=weights, lse=lse,
                      context=context)
        args = _lib.AttentionArgs(x=_a.pointer(x3), kv=_a.pointer(kv3), key_padding_mask=_a.pointer(kpm, ctypes.c_uint8),
                                  attn_mask=None if mask is None else mask.ctypes.data_as(ctypes.c_void_p),
                                  out=_a.pointer(out), attn=_a.pointer(weights), lse=_a.pointer(lse),
                                  context=_a.pointer(context),
                                  **{k + "_count": _a.count(v) for k, v in arrays.items()})
        _check(_lib.plan_execute(plan.handle, ctypes.byref(args)), "running attention")
        self._last = ({0: "reference", 1: "fused", 2: "unfused"}[_lib.plan_algorithm(plan.handle)],
                      _lib.plan_core(plan.handle).decode(), _lib.plan_gemm(plan.handle).decode())
        out = _unbatched(out, batched, self.batch_first)
        if weights is not None and not batched:
            weights = weights[0]
        if stats:
            return out, kind, batched, lse if batched else lse[0], _unbatched(context, batched, self.batch_first)
        return out, weights, kind

    def _context_width(self, E: int) -> int:
        """heads * head_dim_v: with Q/K/V weights from them, else from the input's width E."""
        return self.heads * self._wt.head_dim_v if self._wt.has_qkv else E

    def __call__(self, x: Any, kv: Any = None, value: Any = None, *, key_padding_mask: Any = None,
                 attn_mask: Any = None, need_weights: bool = False) -> Tuple[Any, Any]:
        """out (B, Tq, out_dim or heads*head_dim_v) and, with need_weights, the weights per head (B, heads, Tq, Tk)
        (else None). x (B, Tq, E), or (Tq, E) for one sequence (then out (Tq, ...), weights (heads, Tq, Tk)).
        kv (B, Tk, Ekv): cross-attention (keys and values from kv). value, when given, must be kv itself (as in
        attn(x, x, x)). key_padding_mask (B, Tk) bool, True = ignore that key; attn_mask (Tq, Tk) bool (True = not
        allowed) or float (added to the scaled scores). A row that may see no key gives 0 (PyTorch: NaN)."""
        if value is not None and not _same_input(kv, value):
            _invalid("value: clattn projects keys and values from one input, so value must be the key input "
                     "itself (or leave it out)")
        if kv is x:
            kv = None
        out, weights, kind = self._run(x, kv, key_padding_mask, attn_mask, need_weights, self.causal, ("x", "kv"))
        return kind.out(out), kind.out(weights)

    def set_weights(self, **weights: Any) -> None:
        """Replace the module's weights with new values of the same shapes (a training step's parameters): every
        weight and bias the module has (w_query, ..., b_out, as the constructor takes them), and no other. The plans
        already made keep their compiled kernels and take the new values at their next call
        (clattn_plan_set_weights): far cheaper than a new module. Not while calls on this module run in other
        threads."""
        old = self._wt
        unknown = sorted(set(weights) - set(_lib.WEIGHT_NAMES))
        if unknown:
            _invalid(f"set_weights: no weight named {', '.join(unknown)} (the names: {', '.join(_lib.WEIGHT_NAMES)})")
        given = {k: weights.get(k) for k in _lib.WEIGHT_NAMES}
        have = {**old.w, **old.b}
        for k in _lib.WEIGHT_NAMES:
            if (given[k] is None) != (have[k] is None):
                _invalid(f"set_weights: {k} is {'given' if given[k] is not None else 'missing'}, but the module "
                         f"{'has no' if have[k] is None else 'has a'} {k}: give every weight it has, and no other")
        new = _Weights(old.heads, old.kv_heads, old.layout, None, None, **given)
        for k, v in {**new.w, **new.b}.items():
            if v is not None and v.shape != have[k].shape:
                _shape(f"set_weights: {k} has shape {v.shape}, the module's is {have[k].shape}")
        self._wt = new
        self._wt_version += 1

    def _stats_in(self, name: str, a: Any, want: Tuple[int, ...], batched: bool, batch_first: bool):
        """A saved statistic (lse, context) back in the library's (B, ...) layout, checked against want."""
        arr = _a.floats(name, a)
        if arr.ndim == len(want) - 1 and not batched:
            arr = arr[None]
        elif batch_first is False and batched and arr.ndim == 3:
            arr = np.ascontiguousarray(arr.transpose(1, 0, 2))
        if arr.shape != want:
            _shape(f"{name}: shape {arr.shape} (in the library's batch-first layout), expected {want}: pass the "
                   f"{name} that forward_train returned for these inputs")
        return arr

    def forward_train(self, x: Any, kv: Any = None, *, key_padding_mask: Any = None, attn_mask: Any = None,
                      is_causal: bool = False, seed: Optional[int] = None) -> Tuple[Any, Any, Any]:
        """A training call: (out, lse, context). out as __call__'s; lse (B, heads, Tq), each query row's
        log-sum-exp of its scaled, masked scores (-inf for a row with no visible key); context the heads' output
        before the output projection, in out's layout with heads*head_dim_v columns. backward(..., lse=lse,
        context=context) takes them back and then does not compute them again. Runs the training plan backward
        uses (on the same inputs the same numbers as __call__). seed: the dropout seed of this call (default the
        module's), which backward must be given too. lse and context are float32 NumPy arrays whatever the input's
        kind and dtype. is_causal as in forward()."""
        if kv is x:
            kv = None
        causal = self.causal or _a.flag("is_causal", is_causal)
        out, kind, batched, lse, context = self._run(x, kv, key_padding_mask, attn_mask, False, causal, ("x", "kv"),
                                                     stats=True, seed=seed)
        return kind.out(out), lse, context

    def backward(self, x: Any, grad_out: Any, kv: Any = None, *, key_padding_mask: Any = None,
                 attn_mask: Any = None, lse: Any = None, context: Any = None, is_causal: bool = False,
                 seed: Optional[int] = None) -> Dict[str, Any]:
        """The gradients of a loss through attn(x, kv, ...) from grad_out = dLoss/dout (the shape of out), for the
        same inputs, weights and dropout seed (dropout keeps exactly the forward's weights): a dict with "x", "kv"
        (cross-attention), and each weight and bias the module has ("w_query", ..., "b_out", in its layout), as
        float32 NumPy arrays of their inputs' shapes. Batched (B, T, E) or one sequence (T, E), as __call__ takes
        them. lse and context: forward_train's for these inputs (both or
        neither); given, the forward's statistics are not computed again. Masks get no gradient; a row that sees no
        key contributes nothing. Computed by the device's backward pass (an OpenCL device's backward core, or
        ref's); clattn.autograd wraps it for torch.autograd."""
        if kv is x:
            kv = None
        causal = self.causal or _a.flag("is_causal", is_causal)
        kind, batched, x3, kv3, kpm, mask_kind, mask, B, Tq, E, Tk, Ekv = self._inputs(
            x, kv, key_padding_mask, attn_mask, ("x", "kv"))
        cross = kv3 is not None
        if (lse is None) != (context is None):
            _invalid("lse and context: give both (forward_train's) or neither")
        plan = self._training_plan(B, Tq, E, cross, Tk, Ekv, mask_kind, kpm is not None, causal, seed)
        width = _lib.plan_out_width(plan.handle)
        dout = _a.floats("grad_out", grad_out, ndim=(2, 3))
        if dout is None:
            _invalid("grad_out: required")
        if (dout.ndim == 3) != batched:
            _shape(f"grad_out: {dout.ndim}-D, but x is {3 if batched else 2}-D")
        if not batched:
            dout = dout[None]
        elif not self.batch_first:
            dout = np.ascontiguousarray(dout.transpose(1, 0, 2))
        if dout.shape != (B, Tq, width):
            _shape(f"grad_out: shape {dout.shape} (batch first), but out is {(B, Tq, width)}")
        saved = {}
        if lse is not None:
            saved["lse"] = self._stats_in("lse", lse, (B, self.heads, Tq), batched, True)
            saved["context"] = self._stats_in("context", context, (B, Tq, self._context_width(E)), batched,
                                              self.batch_first)
        wt = self._wt
        shapes = dict(x=x3.shape, kv=kv3.shape if cross else None)
        for k, v in {**wt.w, **wt.b}.items():
            shapes[k] = v.shape if v is not None else None
        grads = {k: np.full(shp, np.nan, dtype=np.float32) for k, shp in shapes.items() if shp is not None}
        arrays = dict(x=x3, kv=kv3, key_padding_mask=kpm, attn_mask=mask)
        args = _lib.AttentionArgs(x=_a.pointer(x3), kv=_a.pointer(kv3), key_padding_mask=_a.pointer(kpm, ctypes.c_uint8),
                                  attn_mask=None if mask is None else mask.ctypes.data_as(ctypes.c_void_p),
                                  **{k + "_count": _a.count(v) for k, v in arrays.items()})
        g = _lib.AttentionGrads(grad_out=_a.pointer(dout), grad_out_count=_a.count(dout),
                                **{k: _a.pointer(v) for k, v in saved.items()},
                                **{k + "_count": _a.count(v) for k, v in saved.items()},
                                **{"grad_" + k: _a.pointer(v) for k, v in grads.items()},
                                **{"grad_" + k + "_count": _a.count(v) for k, v in grads.items()})
        _check(_lib.plan_backward(plan.handle, ctypes.byref(args), ctypes.byref(g)), "running the backward pass")
        core, params = _lib.plan_backward_core(plan.handle).decode(), _lib.plan_backward_core_params(plan.handle).decode()
        self._last_backward = core + (":" + params if params else "")
        for k in ("x", "kv"):
            if k in grads:
                grads[k] = _unbatched(grads[k], batched, self.batch_first)
        return grads

    def forward(self, query: Any, key: Any, value: Any, key_padding_mask: Any = None, need_weights: bool = True,
                attn_mask: Any = None, average_attn_weights: bool = True, is_causal: bool = False) -> Tuple[Any, Any]:
        """nn.MultiheadAttention.forward: (attn_output, attn_output_weights). key is query: self-attention,
        else cross-attention (a copy of query gives the same numbers); value must be key (clattn projects keys
        and values from one input). need_weights (default True, as torch) returns the weights averaged over heads (B, Tq, Tk), or per
        head (B, heads, Tq, Tk) with average_attn_weights=False; else None. is_causal=True applies the causal mask
        (as the module's causal=True). Masks as in __call__ (a 3-D attn_mask per head is not supported)."""
        if not _same_input(key, value):
            _invalid("value: clattn projects keys and values from one input, so value must be key itself "
                     "(nn.MultiheadAttention's self-attention mha(x, x, x) and cross-attention mha(q, kv, kv))")
        kv = None if key is query else key  # a copy of query as key: cross-attention, the same numbers
        causal = self.causal or _a.flag("is_causal", is_causal)
        out, weights, kind = self._run(query, kv, key_padding_mask, attn_mask, need_weights, causal,
                                       ("query", "key"))
        if weights is not None and average_attn_weights:
            weights = np.ascontiguousarray(weights.mean(axis=-3, dtype=np.float32))
        return kind.out(out), kind.out(weights)


# ---------------------------------------------------------------- decoding over a KV cache

class Decoder(_Shaped):
    """Causal self-attention over a KV cache on the device (clattn_decode_plan + clattn_kv_cache).

    The projections and options of Attention (w_query, w_key and w_value required; causal implied; no masks,
    dropout or weights out), plus batch (B sequences), capacity (positions each sequence's cache holds) and
    max_new_tokens (the most tokens one call appends). Calling it with x (B, n, E), 1 <= n <= max_new_tokens,
    appends the tokens' keys and values at each sequence's length and returns their outputs (B, n, out_dim or
    heads*head_dim_v): a prefill and the decode steps after it equal one causal run over the whole sequence.
    valid (B ints, 0 <= valid[b] <= n) lets sequence b append only its first valid[b] tokens (ragged prompts);
    its other rows are the output of an empty attention (b_out, or 0). kv_half keeps the cache in float16.
    """

    def __init__(self, heads: int, *, w_query: Any, w_key: Any, w_value: Any, capacity: int, max_new_tokens: int,
                 batch: int = 1, b_query: Any = None, b_key: Any = None, b_value: Any = None, w_out: Any = None,
                 b_out: Any = None, kv_heads: Optional[int] = None, head_dim_qk: Optional[int] = None,
                 head_dim_v: Optional[int] = None, window: int = 0, scale: float = 0.0, kv_half: bool = False,
                 layout: str = "linear", algorithm: str = "auto", device: Optional[str] = None):
        if w_query is None or w_key is None or w_value is None:
            _invalid("Decoder: w_query, w_key and w_value are required")
        self._wt = _Weights(heads, kv_heads, layout, head_dim_qk, head_dim_v, w_query, w_key, w_value, b_query,
                            b_key, b_value, w_out, b_out)
        wt = self._wt
        if wt.kv_embed != wt.embed:
            _shape(f"w_key and w_value take inputs of width {wt.kv_embed}, w_query {wt.embed}: decoding is "
                   f"self-attention, one input for all three")
        self.batch = _a.integer("batch", batch, 1)
        self.capacity = _a.integer("capacity", capacity, 1)
        self.max_new_tokens = _a.integer("max_new_tokens", max_new_tokens, 1)
        self.window = _a.integer("window", window)
        self.scale = _a.real("scale", scale)
        self.kv_half = _a.flag("kv_half", kv_half)
        self.algorithm = _a.choice("algorithm", algorithm, tuple(_lib.ALGORITHMS))
        self._device = _Device(device)
        self.device = self._device.name
        d = _lib.AttentionDesc(batch=self.batch, seq_q=self.max_new_tokens, embed=wt.embed, heads=wt.heads,
                               head_dim_qk=wt.head_dim_qk, head_dim_v=wt.head_dim_v, out_dim=wt.out_dim, causal=1,
                               scale=self.scale, layout=_layout_code(wt.layout),
                               algorithm=_lib.ALGORITHMS[self.algorithm], kv_heads=wt.kv_heads, window=self.window,
                               kv_half=int(self.kv_half))
        self._dplan = _create(self._device, _lib.decode_plan_create, _lib.decode_plan_free, d, wt.struct(),
                              "creating the decode plan")
        cd = _lib.KVCacheDesc(batch=self.batch, capacity=self.capacity, kv_heads=wt.kv_heads,
                              head_dim_qk=wt.head_dim_qk, head_dim_v=wt.head_dim_v, type=int(self.kv_half))
        ch = ctypes.c_void_p()
        _check(_lib.kv_cache_create(self._device.handle, ctypes.byref(cd), ctypes.byref(ch)), "creating the KV cache")
        self._cache = _Handle(ch, _lib.kv_cache_free, self._device)
        self.out_width = wt.out_dim or wt.heads * wt.head_dim_v
        self._lock = threading.Lock()

    @property
    def core_used(self) -> str:
        """The decode core ("decode_attend", or "ref" on ref)."""
        return _lib.decode_plan_core(self._dplan.handle).decode()

    @property
    def gemm_used(self) -> str:
        """The GEMM core of the projections above a few rows ("gemm_tiles", "gemm_clblast", or "ref" on ref)."""
        return _lib.decode_plan_gemm(self._dplan.handle).decode()

    def __repr__(self) -> str:
        return (f"clattn.Decoder({self._wt.describe()}, batch={self.batch}, capacity={self.capacity}, "
                f"max_new_tokens={self.max_new_tokens}" + (f", window={self.window}" if self.window else "")
                + (", kv_half=True" if self.kv_half else "") + f", lengths={self.lengths}, device={self.device!r})")

    def __call__(self, x: Any, valid: Optional[Sequence[int]] = None) -> Any:
        """Append x's tokens to the cache and return their outputs (B, n, out width); see the class."""
        kind = _a.Kind(x)
        xa = _a.floats("x", x, ndim=3)
        B, n, E = xa.shape
        if B != self.batch or E != self.embed:
            _shape(f"x: shape {tuple(xa.shape)}, expected (batch, new tokens, embed) = ({self.batch}, n, {self.embed})")
        if n > self.max_new_tokens:
            _shape(f"x: {n} new tokens, but this Decoder takes at most max_new_tokens={self.max_new_tokens} per call")
        v = None
        if valid is not None:
            try:
                items = list(valid.tolist() if hasattr(valid, "tolist") else valid)
            except TypeError:
                _invalid(f"valid: {valid!r} is not a sequence of integers")
            if len(items) != B:
                _shape(f"valid: {len(items)} values, expected one per sequence ({B})")
            v = np.array([_a.integer(f"valid[{b}]", t, 0, n) for b, t in enumerate(items)], dtype=np.uintp)
        with self._lock:
            lengths = self.lengths
            for b in range(B):
                add = n if v is None else int(v[b])
                if lengths[b] + add > self.capacity:
                    _shape(f"x: sequence {b} holds {lengths[b]} tokens; {add} more exceed capacity={self.capacity}")
            out = np.full((B, n, self.out_width), np.nan, dtype=np.float32)
            args = _lib.DecodeArgs(x=_a.pointer(xa), new_tokens=n, valid=_a.pointer(v, ctypes.c_size_t),
                                   out=_a.pointer(out), x_count=xa.size, valid_count=_a.count(v), out_count=out.size)
            _check(_lib.decode_execute(self._dplan.handle, self._cache.handle, ctypes.byref(args)), "decoding")
        return kind.out(out)

    @property
    def lengths(self) -> List[int]:
        """Each sequence's cached length."""
        n = (ctypes.c_size_t * self.batch)()
        _check(_lib.kv_cache_lengths(self._cache.handle, n), "reading the cache lengths")
        return list(n)

    def reset(self) -> None:
        """Empty every sequence's cache."""
        _check(_lib.kv_cache_reset(self._cache.handle), "resetting the cache")

    def truncate(self, lengths: Sequence[int]) -> None:
        """Cut each sequence back to lengths[b] (at most its length): speculative decoding's rollback."""
        try:
            items = list(lengths.tolist() if hasattr(lengths, "tolist") else lengths)
        except TypeError:
            _invalid(f"lengths: {lengths!r} is not a sequence of integers")
        if len(items) != self.batch:
            _shape(f"lengths: {len(items)} values, expected one per sequence ({self.batch})")
        now = self.lengths
        vals = [_a.integer(f"lengths[{b}]", t, 0, now[b]) for b, t in enumerate(items)]
        _check(_lib.kv_cache_truncate(self._cache.handle, (ctypes.c_size_t * self.batch)(*vals)), "truncating the cache")

    def read_cache(self) -> Tuple[np.ndarray, np.ndarray]:
        """The cache as float32 NumPy arrays: k (B, kv_heads, capacity, head_dim_qk), v (B, kv_heads, capacity,
        head_dim_v); 0 past each sequence's length."""
        k = np.zeros((self.batch, self.kv_heads, self.capacity, self.head_dim_qk), np.float32)
        v = np.zeros((self.batch, self.kv_heads, self.capacity, self.head_dim_v), np.float32)
        _check(_lib.kv_cache_read(self._cache.handle, _a.pointer(k), _a.pointer(v)), "reading the cache")
        return k, v


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


# ---------------------------------------------------------------- from torch

def _param(name, t):
    return None if t is None else _a.floats(name, t)


def _refuse_training_dropout(module, what, p):
    if module.training and p > 0:
        _invalid(f"from_torch: {what} is in training mode with dropout {p}; clattn carries eval semantics "
                 f"(no dropout): call module.eval() first")


def from_torch(module: Any, device: Optional[str] = None, causal: bool = False,
               plan_cache_size: int = 16):
    """An Attention from torch.nn.MultiheadAttention, or an EncoderLayer from torch.nn.TransformerEncoderLayer,
    with the module's weights copied (float32; float16/bfloat16 widened exactly; float64 refused) and its
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
                         device=device, plan_cache_size=plan_cache_size)
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


# ---------------------------------------------------------------- pictures

def plot_attention(weights, tokens=None, heads=None, path=None, title=None):
    """Heat maps of attention weights, one per head in a grid: weights (H, Tq, Tk) or (Tq, Tk) (or
    (1, H, Tq, Tk)); tokens labels the axes (one list, or (query_tokens, key_tokens)); heads picks
    some; path saves the figure (PNG by its extension). Returns the matplotlib Figure. Needs
    matplotlib (pip install 'clattn[plot]')."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    w = np.asarray(weights, dtype=np.float32)
    if w.ndim == 4 and w.shape[0] == 1:
        w = w[0]
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        _shape(f"plot_attention: weights of shape {w.shape}, expected (H, Tq, Tk)")
    idx = list(range(w.shape[0])) if heads is None else list(heads)
    qt = kt = None
    if tokens is not None:
        if len(tokens) == 2 and not isinstance(tokens[0], str):
            qt, kt = list(tokens[0]), list(tokens[1])
        else:
            qt = kt = list(tokens)
        if len(qt) != w.shape[1] or len(kt) != w.shape[2]:
            _shape(f"plot_attention: {len(qt)}x{len(kt)} tokens for {w.shape[1]}x{w.shape[2]} "
                                       "weights")
    cols = min(len(idx), 4)
    rows = (len(idx) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for n, ax in enumerate(axes.flat):
        if n >= len(idx):
            ax.axis("off")
            continue
        h = idx[n]
        im = ax.imshow(w[h], vmin=0.0, vmax=max(float(w[h].max()), 1e-6), cmap="viridis")
        ax.set_title(f"head {h}")
        if qt is not None:
            ax.set_xticks(range(len(kt)), kt, rotation=60, fontsize=7)
            ax.set_yticks(range(len(qt)), qt, fontsize=7)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        fig.colorbar(im, ax=ax, fraction=0.046)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=80)
    return fig
