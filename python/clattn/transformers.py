"""clattn inside Hugging Face transformers (>= 4.53): an attention implementation any model can select, and a cache
that keeps K and V on the OpenCL device.

    import clattn.transformers
    name = clattn.transformers.register()            # "clattn"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation=name)   # or model.set_attn_implementation

register() adds clattn's attention function to transformers' AttentionInterface and, under the same name,
transformers' sdpa mask (a boolean (B, 1, Tq, Tk) mask, True = attend, or None where is_causal says it all) to its
AttentionMaskInterface: without the second registration transformers would give no mask at all, and padding would be
ignored. The function runs clattn's core on the heads the model projected (clattn.functional.attend): grouped-query
attention without repeating K and V, the causal flag from the module (or the call), the model's mask (padding,
sliding windows, packed sequences: whatever transformers put in it), `scaling`, and dropout in training. It computes
what transformers' "sdpa" implementation computes, but a query row that sees no key gives 0, not NaN.

`s_aux` / `sinks` (gpt-oss's attention sinks) run as attend's sinks, in inference and in training with the sinks
frozen (a call in which they require grad refuses them: their gradient is not computed yet; so does the DeviceCache's
decode). Refused, with the keyword named (never silently ignored): `softcap` (Gemma 2),
`output_attentions=True` (clattn's core returns no weights here). `position_bias` (T5-style relative
biases) goes in as a float mask.

    cache = clattn.transformers.DeviceCache(model.config, max_cache_len=2048)
    model.generate(ids, attention_mask=mask, **{clattn.transformers.cache_argument(model): cache}, ...)

(The keyword is `cache` in newer transformers, `past_key_values` in 4.x and in 5.x up to at least 5.17:
cache_argument reads it from the model's forward.)

DeviceCache keeps every layer's keys and values in a clattn KV cache on the clattn device (clattn_kv_cache): each
step sends only the new tokens' Q, K and V there and brings back their attention output (cache.bytes_moved counts
them), where the default cache hands the whole K and V to every call. Its layers run clattn's decode plans on the
heads as given (desc.separate_value). It serves generate() on batches without padding or left-padded (what generate
takes), full or sliding-window causal attention: each call's mask is checked against what the cache holds, and a
mask it cannot honour (padding in the middle, packed sequences, a bidirectional model) is refused with the place it
differs. Left padding is not stored: each sequence's cache holds its real tokens only. Inference only (dropout 0);
beam search, cropping and batch reordering are refused.
"""
import ctypes
import inspect
from typing import Any, Dict, Optional, Tuple

import torch

from . import _lib
from ._device import _create, _Handle
from ._errors import UnsupportedError
from ._errors import check as _check
from .functional import _device as _open_device
from .functional import _ptr, attend
from .functional import _DTYPES as _DTYPE_CODES

__all__ = ["register", "attention_forward", "REFUSED_KEYWORDS", "DeviceCache", "cache_argument"]

REFUSED_KEYWORDS = {
    "softcap": "logit soft-capping (Gemma 2's softcap): clattn's scores are not capped",
}


def _refuse(message: str):
    raise UnsupportedError(-3008, "clattn.transformers: " + message)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                      *, clattn_device: Optional[str] = None, **kwargs: Any):
    """transformers' attention interface: query (B, H, Tq, D), key and value (B, Hkv, Tk, D) after the cache;
    returns ((B, Tq, H, Dv), None)."""
    for name, why in REFUSED_KEYWORDS.items():
        if kwargs.get(name) is not None:
            _refuse(f"{name}= is given: {why}. Use attn_implementation=\"eager\" for this model")
    if kwargs.get("output_attentions"):
        _refuse("output_attentions=True: clattn's core returns no attention weights on this path; use "
                "attn_implementation=\"eager\" to get them")
    # attention sinks (gpt-oss passes its module's sinks as s_aux): attend's sinks, in training only frozen
    kw = "s_aux" if kwargs.get("s_aux") is not None else "sinks"
    sinks = kwargs.get(kw)
    if sinks is not None and torch.is_grad_enabled() and getattr(sinks, "requires_grad", False):
        _refuse(f"{kw}= (attention sinks) that require grad: clattn trains with them frozen (their gradient is not "
                f"computed yet). Freeze them (requires_grad_(False)) or use attn_implementation=\"eager\"")
    layer = getattr(key, "_clattn_layer", None)
    if layer is not None:  # the keys and values are in a DeviceCache: attend there
        if sinks is not None:
            _refuse(f"{kw}= (attention sinks) with clattn's DeviceCache: its decode plans have no sinks yet; use the "
                    "default cache")
        if kwargs.get("position_bias") is not None:
            _refuse("position_bias= with clattn's DeviceCache: its decode steps take no float mask; use the default "
                    "cache")
        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        return layer.attend(query, attention_mask, bool(is_causal), scaling, float(dropout or 0.0),
                            int(kwargs.get("sliding_window") or 0)), None
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    Tq = query.shape[2]
    # as transformers' sdpa: causal only without a mask (the mask holds it otherwise) and with more than one query
    causal = bool(Tq > 1 and attention_mask is None and is_causal)
    if causal and key.shape[2] > Tq:  # as sdpa: keys past the queries' length are not attended to
        key, value = key[:, :, :Tq], value[:, :, :Tq]
    mask = attention_mask
    bias = kwargs.get("position_bias")
    if bias is not None:  # relative position biases: a float mask (with -inf where the mask or causality hides)
        hidden = None
        if mask is not None and mask.dtype == torch.bool:
            hidden = ~mask
        elif causal:
            hidden = torch.ones(Tq, key.shape[2], dtype=torch.bool).triu(1)
        fm = bias.float() if mask is None or mask.dtype == torch.bool else bias.float() + mask.float()
        mask = fm.masked_fill(hidden, float("-inf")) if hidden is not None else fm
        causal = False
    window = 0
    sw = kwargs.get("sliding_window")
    if causal and sw:  # without a mask: the window, which the mask would hold otherwise
        window = int(sw)
    out = attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), mask, causal=causal,
                 window=window, scale=scaling, dropout_p=float(dropout or 0.0), sinks=sinks, device=clattn_device)
    return out, None


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword under which model (its forward, and so generate()) takes a Cache: "cache" where its forward has
    that parameter (newer transformers), else "past_key_values" (4.x, and 5.x up to at least 5.17)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def register(name: str = "clattn", device: Optional[str] = None) -> str:
    """Register clattn's attention (and transformers' sdpa mask) as attn_implementation `name` on clattn device
    `device` (a spec as clattn.devices() lists them; None: the default). Returns the name to pass."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError("clattn.transformers needs Hugging Face transformers >= 4.53 (pip install transformers): "
                          f"{e}") from e
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: {name!r}, expected a non-empty string")

    def clattn_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        return attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                 clattn_device=device, **kwargs)

    AttentionInterface.register(name, clattn_attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


# ---------------------------------------------------------------- DeviceCache

try:
    from transformers.cache_utils import Cache as _Cache
    from transformers.cache_utils import CacheLayerMixin as _LayerMixin
except ImportError:  # transformers absent (or too old): DeviceCache says so when made
    _Cache = _LayerMixin = None


def _no_transformers(*args, **kwargs):
    raise ImportError("clattn.transformers.DeviceCache needs Hugging Face transformers >= 4.53 (pip install "
                      "transformers)")


if _LayerMixin is not None:
    class _DeviceLayer(_LayerMixin):
        """One model layer's keys and values in a clattn KV cache (B sequences of up to max_cache_len real tokens).
        update() stores the new tokens' K and V for the attention call that follows and returns placeholders of the
        full cache's shape (no memory) that lead clattn's attention function here; attend() runs the decode step."""

        is_sliding = False
        is_compileable = False
        is_croppable = False

        def __init__(self, owner: "DeviceCache", idx: int):
            super().__init__()
            self.owner, self.idx = owner, idx
            self.length = 0          # tokens seen, padding included (transformers' positions)
            self.pads = None         # (B) left-padding tokens of each sequence, from the first call's mask
            self.pending = None      # (k, v) of update(), for the attention call
            self.handle = None       # the clattn_kv_cache
            self.shape = None        # (B, HK, dk, dv)
            self.kv_type = 0         # the cache's element type (clattn_kv_type): a half model's own

        def lazy_initialization(self, key_states, value_states) -> None:
            B, HK, _, dk = key_states.shape
            dv = value_states.shape[3]
            dev, _ = _open_device(self.owner.device)
            # a float16 or bfloat16 model's keys and values are of its type already: a cache of that type holds them
            # exactly, in half the memory of a float one
            kt = key_states.dtype if key_states.dtype == value_states.dtype else torch.float32
            self.kv_type = {torch.float16: 1, torch.bfloat16: 2}.get(kt, 0)
            cd = _lib.KVCacheDesc(batch=B, capacity=self.owner.max_cache_len, kv_heads=HK, head_dim_qk=dk,
                                  head_dim_v=dv, type=self.kv_type)
            h = ctypes.c_void_p()
            _check(_lib.kv_cache_create(dev.handle, ctypes.byref(cd), ctypes.byref(h)), "creating the KV cache")
            self.handle = _Handle(h, _lib.kv_cache_free, dev)
            self.shape = (B, HK, dk, dv)
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            B, HK, n, dk = key_states.shape
            if (B, HK, dk, value_states.shape[3]) != self.shape:
                _refuse(f"layer {self.idx}: keys {tuple(key_states.shape)} do not fit the cache (batch, kv heads, "
                        f"head sizes {self.shape})")
            if self.pending is not None:
                _refuse(f"layer {self.idx}: update() twice without an attention call between (the model does not "
                        f"use clattn's attention: pass attn_implementation=clattn.transformers.register())")
            self.pending = (key_states, value_states)
            self.length += n
            ph_k = key_states.new_zeros(()).expand(B, HK, self.length, dk)
            ph_v = value_states.new_zeros(()).expand(B, HK, self.length, value_states.shape[3])
            ph_k._clattn_layer = ph_v._clattn_layer = self
            return ph_k, ph_v

        def get_mask_sizes(self, query_length: int) -> Tuple[int, int]:
            return self.length + query_length, 0

        def get_seq_length(self) -> int:
            return self.length

        def get_max_length(self) -> int:
            return -1

        def reset(self) -> None:
            if self.handle is not None:
                _check(_lib.kv_cache_reset(self.handle.handle), "resetting the KV cache")
            self.length, self.pads, self.pending = 0, None, None

        def _unsupported(self, what):
            _refuse(f"{what} with clattn's DeviceCache is not supported (greedy or sampled generate() only): use "
                    f"the default cache")

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove:
                self._unsupported("crop() (assisted decoding)")

        def reorder_cache(self, beam_idx) -> None:
            self._unsupported("reorder_cache() (beam search)")

        def batch_repeat_interleave(self, repeats: int) -> None:
            if repeats != 1:
                self._unsupported("batch_repeat_interleave() (beam search, num_return_sequences)")

        def batch_select_indices(self, indices) -> None:
            self._unsupported("batch_select_indices()")

        def _pads_of(self, mask, base: int, n: int, causal: bool, window: int):
            """Each sequence's left padding, read from the first call's mask; then every call's mask checked against
            what the cache computes: key j (transformers' position) visible to query i when j >= pads[b],
            j <= base + i and (window 0 or base + i - j < window)."""
            B = self.shape[0]
            T = base + n
            if mask is not None and (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[0] != B or
                                     mask.shape[1] != 1 or tuple(mask.shape[2:]) != (n, T)):
                _refuse(f"the attention mask {tuple(mask.shape)} {mask.dtype}: the DeviceCache takes transformers' "
                        f"sdpa mask, bool ({B}, 1, {n}, {T})")
            if self.pads is None:  # the first call: the prompt
                if base:
                    _refuse("the first attention call after tokens were cached elsewhere")
                self.pads = torch.zeros(B, dtype=torch.long) if mask is None else \
                    (mask[:, 0].any(1).long().cumsum(1) == 0).sum(1)  # leading keys no query sees
            pads = self.pads
            if mask is None:  # transformers leaves it out only when nothing is padded and the rows are causal (or one)
                if n > 1 and not causal:
                    _refuse("a bidirectional attention call (no mask, is_causal False): the DeviceCache serves causal "
                            "decoding")
                if bool(pads.any()):
                    _refuse("an attention call without a mask on a cache whose prompts were padded")
                return pads
            i = torch.arange(n).view(1, n, 1) + base
            j = torch.arange(T).view(1, 1, T)
            vis = (j >= pads.view(B, 1, 1)) & (j <= i)
            if window:
                vis &= i - j < window
            if not torch.equal(vis, mask[:, 0]):
                b, qi, kj = (vis != mask[:, 0]).nonzero()[0].tolist()
                _refuse(f"the attention mask at sequence {b}, query {base + qi}, key {kj} is "
                        f"{bool(mask[b, 0, qi, kj])}; the DeviceCache holds left-padded causal"
                        f"{' sliding-window' if window else ''} attention (padding only at the start, none in the "
                        f"middle, no packed sequences): use the default cache")
            return pads

        def attend(self, query, mask, causal: bool, scaling: Optional[float], dropout: float, window: int):
            if dropout:
                _refuse("dropout in a call on clattn's DeviceCache: it serves inference (model.eval())")
            if self.pending is None:
                _refuse(f"layer {self.idx}: an attention call without update() before it")
            k_new, v_new = self.pending
            self.pending = None
            B, H, n, dk = query.shape
            HK, dv = self.shape[1], self.shape[3]
            base = self.length - n
            pads = self._pads_of(mask, base, n, causal, window)
            # this call's padding tokens (positions base .. base + n - 1 below pads[b]) are not stored: each
            # sequence's real tokens first (valid[b] of them), the output rolled back after
            skip = (pads - base).clamp(0, n)
            # a float16 or bfloat16 model's steps run on a plan of its type (the tensors as they are, the output in
            # it); anything else in float32
            dt = query.dtype if query.dtype in (torch.float16, torch.bfloat16) and \
                k_new.dtype == v_new.dtype == query.dtype else torch.float32
            q = query.transpose(1, 2).to(dt)
            k = k_new.transpose(1, 2).to(dt)
            v = v_new.transpose(1, 2).to(dt)
            rolled = bool(skip.any())
            if rolled:
                idx = (torch.arange(n).view(1, n) + skip.view(B, 1)) % n
                q, k, v = (t.gather(1, idx.view(B, n, 1, 1).expand(-1, -1, t.shape[2], t.shape[3])) for t in (q, k, v))
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            out = torch.empty((B, n, H, dv), dtype=dt)
            valid = (n - skip).to(torch.int64)
            plan = self.owner._plan(H, HK, dk, dv, window, scaling, n, _DTYPE_CODES[dt], self.kv_type)
            vs = (ctypes.c_size_t * B)(*valid.tolist())
            a = _lib.DecodeArgs(x=_ptr(q), kv=_ptr(k), value=_ptr(v), out=_ptr(out), new_tokens=n, valid=vs,
                                x_count=q.numel(), kv_count=k.numel(), value_count=v.numel(), valid_count=B,
                                out_count=out.numel())
            _check(_lib.decode_execute(plan.handle, self.handle.handle, ctypes.byref(a)),
                   f"the decode step of layer {self.idx}")
            self.owner.bytes_moved += q.element_size() * (q.numel() + k.numel() + v.numel() + out.numel())
            if rolled:  # real token i of sequence b back at position skip[b] + i (padding rows stay 0)
                back = (torch.arange(n).view(1, n) - skip.view(B, 1)) % n
                out = out.gather(1, back.view(B, n, 1, 1).expand(-1, -1, H, dv))
            return out if query.dtype == torch.float32 else out.to(query.dtype)

    class DeviceCache(_Cache):
        """A transformers Cache whose keys and values stay on a clattn device: pass it to generate() as
        past_key_values, with attn_implementation=clattn.transformers.register() (the calls must reach clattn's
        attention). config: the model's (its num_hidden_layers); max_cache_len: real tokens per sequence (prompt
        and generated); device: a clattn device spec (None: the default). bytes_moved: the bytes sent to and read
        from the device so far (each step: the new tokens' Q, K, V and the output, not the cache)."""

        def __init__(self, config, max_cache_len: int, device: Optional[str] = None):
            n = getattr(config, "num_hidden_layers", None)
            if not isinstance(n, int) or n < 1:
                raise ValueError("DeviceCache: config has no num_hidden_layers")
            if not isinstance(max_cache_len, int) or max_cache_len < 1:
                raise ValueError(f"max_cache_len: {max_cache_len!r}, expected a positive int")
            self.max_cache_len, self.device, self.bytes_moved = max_cache_len, device, 0
            self._plans: Dict[tuple, Any] = {}
            super().__init__(layers=[_DeviceLayer(self, i) for i in range(n)])

        @property
        def max_cache_len(self) -> int:  # type: ignore[override]
            """Real tokens per sequence (prompt and generated), as given. Ours: in transformers 5.x before 5.18 the
            Cache base class has a read-only max_cache_len of its own (deprecated there) that no assignment passes."""
            return self._max_len

        @max_cache_len.setter
        def max_cache_len(self, n: int) -> None:
            self._max_len = n

        def _plan(self, H, HK, dk, dv, window, scaling, n, dtype=0, kv_type=0):
            """The decode plan for these heads (one per shape, window, scale, type and cache type, shared by the
            layers), made for at least n new tokens a call (a longer prompt makes a new one; decode steps reuse the
            prompt's)."""
            scale = float(scaling) if scaling is not None else 0.0
            key = (H, HK, dk, dv, window, scale, dtype, kv_type)
            got = self._plans.get(key)
            if got is None or got[0] < n:
                dev, _ = _open_device(self.device)
                B = self.layers[0].shape[0]
                d = _lib.AttentionDesc(batch=B, seq_q=n, embed=H * dk, heads=H, kv_heads=HK, head_dim_qk=dk,
                                       head_dim_v=dv, causal=1, window=window, scale=scale, separate_value=1,
                                       dtype=dtype, kv_half=kv_type)
                got = self._plans[key] = (n, _create(dev, _lib.decode_plan_create, _lib.decode_plan_free, d,
                                                     _lib.AttentionWeights(), "creating the decode plan"))
            return got[1]
else:
    DeviceCache = _no_transformers  # type: ignore[assignment,misc]
