"""clattn.Attention: nn.MultiheadAttention's computation on a clattn device."""
from __future__ import annotations

import collections
import copy
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
from ._device import _create, _Device, _Handle, _PlanCache, _PlanCached, _Shaped, _cache_notice, _plan_state
from ._inputs import _batched, _layout_code, _same_input, _unbatched, _Weights
from ._rope import _positions_np, _rope_spec, _rope_struct


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
    dtype "float32" (default), "float16" or "bfloat16" (or np.float16, torch.float16, torch.bfloat16): the plans'
    arrays (clattn_attention_desc.dtype): weights rounded to it once, inputs of that type taken as they are (others
    rounded to it), outputs in it, each rounded once from the fp32 computation (README, "Data types"); results go
    back as the input came (a bfloat16 result for a NumPy input: widened to float32, NumPy has no bfloat16).
    forward_train and backward run on float32 plans (a float32 twin), on the rounded weights: a float32 module's
    numbers, in float32 (the C API's half training plans round the same numbers to the type once).
    rope: a clattn.Rope (clattn 0.8): rotary position embeddings on the projected queries and keys (after their biases;
    query row i at position i, key row j at j), in every call, forward_train and backward (Llama, Mistral, Qwen,
    GPT-NeoX, GPT-J; README, "Attention variants").
    sinks: attention sinks (clattn 0.8, gpt-oss's `sinks`): one logit per query head (heads values, finite or -inf for
    none) in each row's softmax denominator, with no value: weights exp(s_ij) / (exp(sinks[h]) + sum_j exp(s_ij)). In
    calls, and in forward_train and backward held fixed (lse is then that of the weights with the sink; backward gives
    no gradient for the sinks); need_weights=True refuses them (UnsupportedError).
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
                 device: Optional[str] = None, plan_cache_size: int = 16, precision: str = "fp32",
                 dtype: Any = "float32", rope: Any = None, sinks: Any = None):
        self._wt = _Weights(heads, kv_heads, layout, head_dim_qk, head_dim_v, w_query, w_key, w_value, b_query,
                            b_key, b_value, w_out, b_out, sinks)
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
        self.dtype = _a.dtype_name("dtype", dtype)
        self.rope = rope  # (a property: checked, and its spec kept for the plans' keys)
        self._plans = _PlanCache(_a.integer("plan_cache_size", plan_cache_size))
        self._device = _Device(device)
        self.device = self._device.name
        self._last = (None, None, None)  # (algorithm, core, GEMM core) of the last call
        self._last_backward = None  # (backward core, its parameters) of the last backward
        self._wt_version = 0  # set_weights counts up; each plan holds the weights of the version it has

    @property
    def rope(self) -> Any:
        """The clattn.Rope the plans rotate queries and keys with (None: none). Setting it (checked) makes the next
        calls use plans with the new one, as for every other option."""
        return self._rope

    @rope.setter
    def rope(self, value: Any) -> None:
        self._rope_spec = _rope_spec(value)
        self._rope = value

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
        """The backward core of the last backward() with its parameters ("flash_backward:ROWS=16,PART=8", "ref"
        on ref; None before any)."""
        return self._last_backward

    def __repr__(self) -> str:
        opts = [self._wt.describe()]
        for name, default in (("causal", False), ("window", 0), ("scale", 0.0), ("dropout", 0.0), ("kv_half", False),
                              ("layout", "linear"), ("algorithm", "auto"), ("precision", "fp32"),
                              ("batch_first", True), ("dtype", "float32"), ("rope", None)):
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
                                   training=int(training), dtype=_a.dtype_code(self.dtype),
                                   rope=_rope_struct(self._rope_spec), sinks=int(wt.sinks is not None))
            plan = _create(self._device, _lib.plan_create, _lib.plan_free, d, wt.struct(self.dtype),
                           "creating the attention plan")
            plan.weights_version = self._wt_version
            return plan

        def refresh(plan):  # a plan made before set_weights takes the new weights, keeping its kernels
            if plan.weights_version != self._wt_version:
                _check(_lib.plan_set_weights(plan.handle, ctypes.byref(self._wt.struct(self.dtype))),
                       "setting the new weights")
                plan.weights_version = self._wt_version

        # the options a plan is made with are part of its key: one changed on the module gets a new plan (the
        # dropout seed is set on the plan at each call instead)
        opts = (self.scale, self.dropout, self.window, self.kv_half, self.algorithm, self.precision, self._rope_spec)
        return self._plans.get((B, Tq, E, cross, Tk, Ekv, mask_kind, kpm, need_weights, causal, training, opts), make,
                               refresh)

    def _inputs(self, x, kv, key_padding_mask, attn_mask, names):
        """The call's inputs checked and converted: (kind, batched, x3, kv3, kpm, mask_kind, mask, B, Tq, E, Tk,
        Ekv)."""
        xn, kvn = names
        kind, x3, batched = _batched(xn, x, self.batch_first, self.dtype)
        B, Tq, E = x3.shape
        cross = kv is not None
        if cross:
            _, kv3, kv_batched = _batched(kvn, kv, self.batch_first, self.dtype)
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

    def _positions(self, position_ids, key_position_ids, B, Tq, Tk, cross):
        """The rows' rotary positions as the library reads them, {} without: rope_positions (B*Tq) and, for
        cross-attention, rope_positions_kv (B*Tk), as contiguous uint32 arrays (_positions_np)."""
        if position_ids is None and key_position_ids is None:
            return {}
        if not self._rope_spec:
            _invalid("position_ids without rope: positions only place the rotary embeddings (set rope=clattn.Rope())")
        if position_ids is None:
            _invalid("key_position_ids without position_ids: give the queries' positions too")
        pos = {"rope_positions": _positions_np("position_ids", position_ids, B, Tq)}
        if not cross:
            if key_position_ids is not None:
                _invalid("key_position_ids: self-attention's keys are its queries, at position_ids")
            return pos
        if key_position_ids is None:
            if Tk != Tq:
                _shape(f"key_position_ids is needed: the keys' length {Tk} is not the queries' {Tq}, so "
                       f"position_ids cannot place them")
            key_position_ids = position_ids
        pos["rope_positions_kv"] = _positions_np("key_position_ids", key_position_ids, B, Tk)
        return pos

    def _training_plan(self, B, Tq, E, cross, Tk, Ekv, mask_kind, kpm, causal, seed):
        """The training plan of these inputs (shared by forward_train and backward) and the call's dropout seed (None
        without dropout), set on the plan by _plan_state around the call (another thread's call may pass another)."""
        plan = self._plan(B, Tq, E, cross, Tk, Ekv, mask_kind, kpm, False, causal, training=True)
        seed = self.seed if seed is None else _a.integer("seed", seed, 0, _a.U64_MAX)
        return plan, (seed if self.dropout else None)

    def _run(self, x, kv, key_padding_mask, attn_mask, need_weights, causal, names, stats=False, seed=None,
             positions=(None, None)):
        kind, batched, x3, kv3, kpm, mask_kind, mask, B, Tq, E, Tk, Ekv = self._inputs(x, kv, key_padding_mask,
                                                                                       attn_mask, names)
        cross = kv3 is not None
        pos = self._positions(*positions, B, Tq, Tk, cross)
        need_weights = bool(need_weights)
        if stats:
            plan, seed = self._training_plan(B, Tq, E, cross, Tk, Ekv, mask_kind, kpm is not None, causal, seed)
        else:
            plan = self._plan(B, Tq, E, cross, Tk, Ekv, mask_kind, kpm is not None, need_weights, causal)
            seed = _a.integer("seed", self.seed, 0, _a.U64_MAX) if self.dropout else None
        width = _lib.plan_out_width(plan.handle)
        st = x3.dtype  # the plan's type's storage (float32, float16, uint16 for bfloat16), poisoned with NaN
        nan = np.nan if st == np.float32 else np.array(0x7FFF if st == np.uint16 else np.nan, dtype=st)
        out = np.full((B, Tq, width), nan, dtype=st)
        weights = np.full((B, self.heads, Tq, Tk), nan, dtype=st) if need_weights else None
        lse = np.full((B, self.heads, Tq), np.nan, dtype=np.float32) if stats else None
        context = np.full((B, Tq, self._context_width(E)), np.nan, dtype=np.float32) if stats else None
        arrays = dict(x=x3, kv=kv3, key_padding_mask=kpm, attn_mask=mask, out=out, attn=weights, lse=lse,
                      context=context)
        args = _lib.AttentionArgs(x=_a.pointer(x3), kv=_a.pointer(kv3), key_padding_mask=_a.pointer(kpm, ctypes.c_uint8),
                                  attn_mask=None if mask is None else mask.ctypes.data_as(ctypes.c_void_p),
                                  out=_a.pointer(out), attn=_a.pointer(weights), lse=_a.pointer(lse),
                                  context=_a.pointer(context),
                                  **{k + "_count": _a.count(v) for k, v in arrays.items()},
                                  **{k: _a.pointer(v, ctypes.c_uint32) for k, v in pos.items()},
                                  **{k + "_count": _a.count(v) for k, v in pos.items()})
        with _plan_state(plan, seed):
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
                 attn_mask: Any = None, need_weights: bool = False, position_ids: Any = None,
                 key_position_ids: Any = None) -> Tuple[Any, Any]:
        """out (B, Tq, out_dim or heads*head_dim_v) and, with need_weights, the weights per head (B, heads, Tq, Tk)
        (else None). x (B, Tq, E), or (Tq, E) for one sequence (then out (Tq, ...), weights (heads, Tq, Tk)).
        kv (B, Tk, Ekv): cross-attention (keys and values from kv). value, when given, must be kv itself (as in
        attn(x, x, x)). key_padding_mask (B, Tk) bool, True = ignore that key; attn_mask (Tq, Tk) bool (True = not
        allowed) or float (added to the scaled scores). A row that may see no key gives 0 (PyTorch: NaN).
        position_ids (with rope; clattn 0.8): each query row's rotary position, (B, Tq) whatever batch_first, or
        (1, Tq) or (Tq,) for every batch entry, integers in 0 .. 2^22-1 (transformers' position_ids: packed
        documents from 0, a chunk after its context); default row i at position i. Self-attention's keys are its
        queries; cross-attention's keys are at key_position_ids (B, Tk), which defaults to position_ids when
        Tk = Tq."""
        if value is not None and not _same_input(kv, value):
            _invalid("value: clattn projects keys and values from one input, so value must be the key input "
                     "itself (or leave it out)")
        if kv is x:
            kv = None
        out, weights, kind = self._run(x, kv, key_padding_mask, attn_mask, need_weights, self.causal, ("x", "kv"),
                                       positions=(position_ids, key_position_ids))
        return _a.typed_result(out, self.dtype, kind), _a.typed_result(weights, self.dtype, kind)

    def set_weights(self, **weights: Any) -> None:
        """Replace the module's weights with new values of the same shapes (a training step's parameters): every
        weight and bias the module has (w_query, ..., b_out and sinks, as the constructor takes them), and no other.
        The plans already made keep their compiled kernels and take the new values at their next call
        (clattn_plan_set_weights): far cheaper than a new module. Not while calls on this module run in other
        threads."""
        old = self._wt
        names = _lib.WEIGHT_NAMES + ("sinks",)
        unknown = sorted(set(weights) - set(names))
        if unknown:
            _invalid(f"set_weights: no weight named {', '.join(unknown)} (the names: {', '.join(names)})")
        given = {k: weights.get(k) for k in names}
        have = {**old.w, **old.b, "sinks": old.sinks}
        for k in names:
            if (given[k] is None) != (have[k] is None):
                _invalid(f"set_weights: {k} is {'given' if given[k] is not None else 'missing'}, but the module "
                         f"{'has no' if have[k] is None else 'has a'} {k}: give every weight it has, and no other")
        new = _Weights(old.heads, old.kv_heads, old.layout, None, None, **given)
        for k, v in {**new.w, **new.b, "sinks": new.sinks}.items():
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

    def _trainer(self) -> "Attention":
        """The module training calls run on: itself, or for a half module (whose training calls give float32
        results) a float32 twin on the same (rounded, float32-held) weights, device and options, made once."""
        if self.dtype == "float32":
            return self
        twin = self.__dict__.get("_twin")
        if twin is None or twin._wt is not self._wt:
            twin = copy.copy(self)
            twin.__dict__.pop("_twin", None)
            twin.dtype = "float32"
            twin._plans = _PlanCache(self._plans.size)
            self.__dict__["_twin"] = twin
        for k in ("scale", "dropout", "seed", "window", "kv_half", "algorithm", "precision", "causal", "batch_first",
                  "rope"):
            setattr(twin, k, getattr(self, k))
        return twin

    def forward_train(self, x: Any, kv: Any = None, *, key_padding_mask: Any = None, attn_mask: Any = None,
                      is_causal: bool = False, seed: Optional[int] = None, position_ids: Any = None,
                      key_position_ids: Any = None) -> Tuple[Any, Any, Any]:
        """A training call: (out, lse, context). out as __call__'s; lse (B, heads, Tq), each query row's
        log-sum-exp of its scaled, masked scores (-inf for a row with no visible key); context the heads' output
        before the output projection, in out's layout with heads*head_dim_v columns. backward(..., lse=lse,
        context=context) takes them back and then does not compute them again. Runs the training plan backward
        uses (on the same inputs the same numbers as __call__). seed: the dropout seed of this call (default the
        module's), which backward must be given too. lse and context are float32 NumPy arrays whatever the input's
        kind and dtype. is_causal as in forward(); position_ids and key_position_ids as in __call__ (backward must be
        given the same). A half module trains on float32 plans (its float32 twin, on its weights as rounded to its
        type): results as a float32 module's."""
        if self.dtype != "float32":
            t = self._trainer()
            got = t.forward_train(x, kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=is_causal,
                                  seed=seed, position_ids=position_ids, key_position_ids=key_position_ids)
            self._last = t._last
            return got
        if kv is x:
            kv = None
        causal = self.causal or _a.flag("is_causal", is_causal)
        out, kind, batched, lse, context = self._run(x, kv, key_padding_mask, attn_mask, False, causal, ("x", "kv"),
                                                     stats=True, seed=seed,
                                                     positions=(position_ids, key_position_ids))
        return kind.out(out), lse, context

    def backward(self, x: Any, grad_out: Any, kv: Any = None, *, key_padding_mask: Any = None,
                 attn_mask: Any = None, lse: Any = None, context: Any = None, is_causal: bool = False,
                 seed: Optional[int] = None, position_ids: Any = None,
                 key_position_ids: Any = None) -> Dict[str, Any]:
        """The gradients of a loss through attn(x, kv, ...) from grad_out = dLoss/dout (the shape of out), for the
        same inputs, weights and dropout seed (dropout keeps exactly the forward's weights): a dict with "x", "kv"
        (cross-attention), and each weight and bias the module has ("w_query", ..., "b_out", in its layout), as
        float32 NumPy arrays of their inputs' shapes. Batched (B, T, E) or one sequence (T, E), as __call__ takes
        them. lse and context: forward_train's for these inputs (both or
        neither); given, the forward's statistics are not computed again. Masks get no gradient; a row that sees no
        key contributes nothing. Computed by the device's backward pass (an OpenCL device's backward core, or
        ref's); clattn.autograd wraps it for torch.autograd. position_ids and key_position_ids: the forward's (as in
        __call__). A half module's runs on float32 plans, as forward_train."""
        if self.dtype != "float32":
            t = self._trainer()
            grads = t.backward(x, grad_out, kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask, lse=lse,
                               context=context, is_causal=is_causal, seed=seed, position_ids=position_ids,
                               key_position_ids=key_position_ids)
            self._last_backward = t._last_backward
            return grads
        if kv is x:
            kv = None
        causal = self.causal or _a.flag("is_causal", is_causal)
        kind, batched, x3, kv3, kpm, mask_kind, mask, B, Tq, E, Tk, Ekv = self._inputs(
            x, kv, key_padding_mask, attn_mask, ("x", "kv"))
        cross = kv3 is not None
        pos = self._positions(position_ids, key_position_ids, B, Tq, Tk, cross)
        if (lse is None) != (context is None):
            _invalid("lse and context: give both (forward_train's) or neither")
        plan, seed = self._training_plan(B, Tq, E, cross, Tk, Ekv, mask_kind, kpm is not None, causal, seed)
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
                                  **{k + "_count": _a.count(v) for k, v in arrays.items()},
                                  **{k: _a.pointer(v, ctypes.c_uint32) for k, v in pos.items()},
                                  **{k + "_count": _a.count(v) for k, v in pos.items()})
        g = _lib.AttentionGrads(grad_out=_a.pointer(dout), grad_out_count=_a.count(dout),
                                **{k: _a.pointer(v) for k, v in saved.items()},
                                **{k + "_count": _a.count(v) for k, v in saved.items()},
                                **{"grad_" + k: _a.pointer(v) for k, v in grads.items()},
                                **{"grad_" + k + "_count": _a.count(v) for k, v in grads.items()})
        with _plan_state(plan, seed):  # the forward's dropout mask
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
        if weights is not None and average_attn_weights:  # (a half module's rounded weights averaged in float32,
                                                           # the mean rounded to its type again)
            wf = weights if self.dtype == "float32" else _a.convert(weights, self.dtype, "float32")
            weights = _a.convert(np.ascontiguousarray(wf.mean(axis=-3, dtype=np.float32)), "float32", self.dtype)
        return _a.typed_result(out, self.dtype, kind), _a.typed_result(weights, self.dtype, kind)
