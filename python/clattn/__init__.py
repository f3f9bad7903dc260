"""clattn: transformer attention on any OpenCL device, from NumPy.

    import numpy as np, clattn
    clattn.devices()                                   # ref and every OpenCL device
    attn = clattn.Attention(heads=2, w_query=..., w_key=..., w_value=..., w_out=..., causal=True)
    out, weights = attn(x, need_weights=True)          # x (B, T, E) or (T, E), float32
    layer = clattn.EncoderLayer(heads=2, ...)          # torch.nn.TransformerEncoderLayer, eval mode
    clattn.from_torch(torch_module)                    # nn.MultiheadAttention / nn.TransformerEncoderLayer
    dec = clattn.Decoder(heads=32, kv_heads=8, w_query=..., ..., batch=1, capacity=4096, max_new_tokens=512)
    out = dec(prompt)                                  # prefill (B, n, E); then dec(x_next) per token

Bindings are ctypes over the public C ABI of the libclattn this package carries; the C
library's plans are made per input shape on first use and kept. Every failure raises
clattn.Error with the status name, the library's message and, for a kernel build, its log.
"""
import ctypes
import threading

import numpy as np

from . import _lib

__all__ = ["Error", "devices", "cores", "version", "Attention", "Decoder", "EncoderLayer", "from_torch", "plot_attention"]
__version__ = "0.3.0"


class Error(Exception):
    """A clattn failure: .status (int), .status_name, .message, .build_log ("" unless a kernel build failed)."""

    def __init__(self, status, message, build_log=""):
        self.status = status
        self.status_name = _lib.STATUS_NAMES.get(status, (_lib.status_string(status) or b"").decode())
        self.message = message
        self.build_log = build_log
        super().__init__(f"{self.status_name}: {message}" + (f"\n{build_log}" if build_log else ""))


def _check(status, what):
    if status != 0:
        msg = (_lib.last_error() or b"").decode(errors="replace")
        log = (_lib.last_build_log() or b"").decode(errors="replace") if status == _lib.BUILD_FAILURE else ""
        raise Error(status, f"{what}: {msg}" if msg else what, log)


def _fail(status, message):
    raise Error(status, message)


def version():
    """The version of the libclattn this package loaded."""
    return _lib.version().decode()


def devices():
    """Every device clattn can open: ref first, then each OpenCL device, as dicts."""
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


def cores(device=None):
    """Every attention core clattn has, as `clattn cores --json` lists them on `device` (a spec as for
    devices(); None: the default device): dicts with name, kind ("prefill" or "decode"), supported, reason
    (why not, "" when supported), default_for (the head-size classes, "<=32" ... ">256", whose plans AUTO gives
    it there), algorithm, weights, params and test_configs. CLATTN_CORE=NAME[:P=V,...] in the environment
    forces a core on the plans that can use it."""
    dev = _Device(device)
    out = []
    for i in range(_lib.core_count()):
        c = _lib.CoreInfo()
        _check(_lib.core_describe(dev.handle, i, ctypes.byref(c)), "describing the cores")
        out.append(dict(name=c.name.decode(), kind=_lib.CORE_KINDS[c.kind], supported=bool(c.supported),
                        reason=c.reason.decode(),
                        default_for=[_lib.head_class_label(k).decode() for k in range(_lib.HEAD_CLASS_COUNT)
                                     if c.default_for & (1 << k)],
                        algorithm={1: "fused", 2: "unfused"}.get(c.algorithm, "auto"), weights=bool(c.produces_weights),
                        params=c.params.decode().split(), test_configs=c.test_configs.decode().split()))
    return out


class _Device:
    """An open clattn device (freed with the object)."""

    def __init__(self, spec):
        self.handle = ctypes.c_void_p()
        _check(_lib.device_open(spec.encode() if spec else None, ctypes.byref(self.handle)),
               f"opening device {spec!r}")
        self.name = _lib.device_name(self.handle).decode()
        self.backend = "opencl" if _lib.device_backend(self.handle) == _lib.BACKEND_OPENCL else "ref"

    def __del__(self):
        if getattr(self, "handle", None):
            _lib.device_free(self.handle)
            self.handle = None


# ---------------------------------------------------------------- arrays

def _floats(name, a, shape=None, ndim=None):
    """A C-contiguous float32 copy or view of a; floating types convert, anything else is refused."""
    if a is None:
        return None
    arr = np.asarray(a)
    if arr.dtype.kind != "f":
        _fail(_lib.INVALID_ARGUMENT, f"{name}: dtype {arr.dtype} is not a floating type (use float32)")
    if ndim is not None and arr.ndim not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        _fail(_lib.SHAPE_MISMATCH, f"{name}: {arr.ndim}-D array of shape {arr.shape}, expected {ndim}-D")
    if shape is not None and tuple(arr.shape) != tuple(shape):
        _fail(_lib.SHAPE_MISMATCH, f"{name}: shape {tuple(arr.shape)}, expected {tuple(shape)}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _mask_bytes(name, a, shape):
    arr = np.asarray(a)
    if arr.dtype != np.bool_ and arr.dtype.kind not in "iu":
        _fail(_lib.INVALID_ARGUMENT, f"{name}: dtype {arr.dtype}; expected bool (True = ignore)")
    if tuple(arr.shape) != tuple(shape):
        _fail(_lib.SHAPE_MISMATCH, f"{name}: shape {tuple(arr.shape)}, expected {tuple(shape)}")
    return np.ascontiguousarray(arr != 0, dtype=np.uint8)


def _fp(a):
    return None if a is None else a.ctypes.data_as(_lib.c_float_p)


# ---------------------------------------------------------------- attention

class Attention:
    """Multi-head attention (the fields of clattn_attention_desc, as keyword arguments).

    Weights are optional: without w_query/w_key/w_value, Q = x and K = V = kv (or x), split into
    `heads`. layout "linear" takes torch.nn.Linear's [out, in] matrices, "raw" the tutorials'
    x @ W [in, out] ones. algorithm "auto", "fused" or "unfused"; device a spec as `clattn devices`
    lists them (None: $CLATTN_DEVICE, else the first OpenCL device, else ref).
    """

    def __init__(self, heads, *, w_query=None, w_key=None, w_value=None, b_query=None, b_key=None, b_value=None,
                 w_out=None, b_out=None, head_dim_qk=None, head_dim_v=None, causal=False, scale=0.0, dropout=0.0,
                 seed=0, layout="linear", algorithm="auto", device=None, kv_heads=None, window=0, kv_half=False):
        if not isinstance(heads, (int, np.integer)) or heads < 1:
            _fail(_lib.INVALID_ARGUMENT, f"heads: {heads!r}, expected a positive integer")
        kv_heads = heads if kv_heads is None else kv_heads
        if not isinstance(kv_heads, (int, np.integer)) or kv_heads < 1 or heads % kv_heads:
            _fail(_lib.SHAPE_MISMATCH, f"kv_heads: {kv_heads!r}, expected a positive integer dividing heads ({heads})")
        if not isinstance(window, (int, np.integer)) or window < 0:
            _fail(_lib.INVALID_ARGUMENT, f"window: {window!r}, expected an integer >= 0 (0 = none)")
        self.kv_heads, self.window, self.kv_half = int(kv_heads), int(window), bool(kv_half)
        if layout not in ("linear", "raw"):
            _fail(_lib.INVALID_ARGUMENT, f"layout: {layout!r}, expected 'linear' or 'raw'")
        if algorithm not in _lib.ALGORITHMS:
            _fail(_lib.INVALID_ARGUMENT, f"algorithm: {algorithm!r}, expected one of {sorted(_lib.ALGORITHMS)}")
        self.heads, self.causal, self.scale, self.dropout, self.seed = int(heads), bool(causal), scale, dropout, seed
        self.layout, self.algorithm = layout, algorithm
        w = dict(w_query=w_query, w_key=w_key, w_value=w_value, w_out=w_out)
        self._w = {k: _floats(k, v, ndim=2) for k, v in w.items()}
        self._b = {k: _floats(k, v, ndim=1) for k, v in dict(b_query=b_query, b_key=b_key, b_value=b_value,
                                                             b_out=b_out).items()}
        wq = self._w["w_query"]
        if (wq is None) != (self._w["w_key"] is None) or (wq is None) != (self._w["w_value"] is None):
            _fail(_lib.INVALID_ARGUMENT, "w_query, w_key and w_value: give all three or none")
        lin = layout == "linear"
        if wq is not None:
            rows_q = wq.shape[0] if lin else wq.shape[1]
            rows_v = self._w["w_value"].shape[0] if lin else self._w["w_value"].shape[1]
            if rows_q % self.heads or rows_v % self.kv_heads:
                _fail(_lib.SHAPE_MISMATCH, f"w_query/w_value: {rows_q}/{rows_v} output rows do not split into "
                                           f"{self.heads}/{self.kv_heads} heads")
            self.head_dim_qk = head_dim_qk or rows_q // self.heads
            self.head_dim_v = head_dim_v or rows_v // self.kv_heads
        else:
            self.head_dim_qk = self.head_dim_v = 0
        wo = self._w["w_out"]
        self.out_dim = 0 if wo is None else (wo.shape[0] if lin else wo.shape[1])
        self._device = _Device(device)
        self.device = self._device.name
        self._plans = {}
        self._lock = threading.Lock()

    def _plan(self, key):
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        B, Tq, E, cross, Tk, Ekv, mask_kind, kpm, need_weights = key
        d = _lib.AttentionDesc(batch=B, seq_q=Tq, seq_kv=Tk if cross else 0, embed=E, kv_embed=Ekv if cross else 0,
                               heads=self.heads, head_dim_qk=self.head_dim_qk, head_dim_v=self.head_dim_v,
                               out_dim=self.out_dim, cross=int(cross), causal=int(self.causal), attn_mask=mask_kind,
                               key_padding_mask=int(kpm), scale=float(self.scale), dropout=float(self.dropout),
                               seed=int(self.seed),
                               layout=_lib.LAYOUT_LINEAR if self.layout == "linear" else _lib.LAYOUT_RAW,
                               algorithm=_lib.ALGORITHMS[self.algorithm], need_weights=int(need_weights),
                               kv_heads=self.kv_heads, window=self.window, kv_half=int(self.kv_half))
        w = _lib.AttentionWeights(**{k: _fp(v) for k, v in {**self._w, **self._b}.items()})
        handle = ctypes.c_void_p()
        _check(_lib.plan_create(self._device.handle, ctypes.byref(d), ctypes.byref(w), ctypes.byref(handle)),
               "creating the attention plan")
        plan = _Plan(handle, _lib.plan_free)
        self._plans[key] = plan
        return plan

    def __call__(self, x, kv=None, key_padding_mask=None, attn_mask=None, need_weights=False):
        """out (B, Tq, Eo or H*dv), and the weights (B, H, Tq, Tk) when need_weights (else None).
        A 2-D x (T, E) is one sequence: out (T, ...) and weights (H, Tq, Tk), as PyTorch's unbatched call."""
        x = _floats("x", x, ndim=(2, 3))
        batched = x.ndim == 3
        x3 = x if batched else x[None]
        B, Tq, E = x3.shape
        cross = kv is not None
        if cross:
            kv = _floats("kv", kv, ndim=x.ndim)
            kv3 = kv if batched else kv[None]
            if kv3.shape[0] != B:
                _fail(_lib.SHAPE_MISMATCH, f"kv: batch {kv3.shape[0]}, x has {B}")
            Tk, Ekv = kv3.shape[1], kv3.shape[2]
        else:
            kv3, Tk, Ekv = None, Tq, E
        kpm = None
        if key_padding_mask is not None:
            kpm = _mask_bytes("key_padding_mask", key_padding_mask, (B, Tk) if batched else (Tk,))
        mask_kind, mask = _lib.MASK_NONE, None
        if attn_mask is not None:
            am = np.asarray(attn_mask)
            if am.dtype == np.bool_:
                mask_kind, mask = _lib.MASK_BOOL, _mask_bytes("attn_mask", am, (Tq, Tk))
            else:
                mask_kind, mask = _lib.MASK_FLOAT, _floats("attn_mask", am, shape=(Tq, Tk))
        key = (B, Tq, E, cross, Tk, Ekv, mask_kind, kpm is not None, bool(need_weights))
        with self._lock:
            plan = self._plan(key)
            width = _lib.plan_out_width(plan.handle)
            out = np.full((B, Tq, width), np.nan, dtype=np.float32)
            weights = np.full((B, self.heads, Tq, Tk), np.nan, dtype=np.float32) if need_weights else None
            args = _lib.AttentionArgs(
                x=_fp(x3), kv=_fp(kv3),
                key_padding_mask=None if kpm is None else kpm.ctypes.data_as(_lib.c_uint8_p),
                attn_mask=None if mask is None else mask.ctypes.data_as(ctypes.c_void_p),
                out=_fp(out), attn=_fp(weights))
            _check(_lib.plan_execute(plan.handle, ctypes.byref(args)), "running attention")
        if not batched:
            return out[0], (None if weights is None else weights[0])
        return out, weights

    @property
    def algorithm_used(self):
        """The algorithm of the last plan made ("fused", "unfused", or "reference" on ref)."""
        if not self._plans:
            return None
        a = _lib.plan_algorithm(list(self._plans.values())[-1].handle)
        return {0: "reference", 1: "fused", 2: "unfused"}[a]

    @property
    def core_used(self):
        """The core of the last plan made ("flash_rows", "unfused", ..., "ref" on ref; `clattn.cores()`)."""
        if not self._plans:
            return None
        return _lib.plan_core(list(self._plans.values())[-1].handle).decode()


class Decoder(Attention):
    """Causal self-attention over a KV cache on the device (clattn_decode_plan + clattn_kv_cache).

    The keyword arguments of Attention (causal is implied; no masks, dropout or weights out), plus
    batch (B sequences), capacity (positions each sequence's cache holds) and max_new_tokens (the
    most tokens one call appends). Calling it with x (B, n, E), 1 <= n <= max_new_tokens, appends
    the tokens' keys and values at each sequence's length and returns their outputs (B, n, Eo or
    H*dv): a prefill and the decode steps after it equal one causal run over the whole sequence.
    valid (B ints) lets sequence b append only its first valid[b] tokens (ragged prompts).
    """

    def __init__(self, heads, *, batch=1, capacity, max_new_tokens, **kw):
        if kw.pop("causal", True) is not True:
            _fail(_lib.INVALID_ARGUMENT, "Decoder: decoding is causal (leave causal out)")
        super().__init__(heads, causal=True, **kw)
        for name, v in (("batch", batch), ("capacity", capacity), ("max_new_tokens", max_new_tokens)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                _fail(_lib.INVALID_ARGUMENT, f"{name}: {v!r}, expected a positive integer")
        self.batch, self.capacity, self.max_new_tokens = int(batch), int(capacity), int(max_new_tokens)
        wq = self._w["w_query"]
        if wq is None:
            _fail(_lib.INVALID_ARGUMENT, "Decoder: w_query, w_key and w_value are required")
        self.embed = wq.shape[1] if self.layout == "linear" else wq.shape[0]
        d = _lib.AttentionDesc(batch=self.batch, seq_q=self.max_new_tokens, embed=self.embed, heads=self.heads,
                               head_dim_qk=self.head_dim_qk, head_dim_v=self.head_dim_v, out_dim=self.out_dim,
                               causal=1, scale=float(self.scale), dropout=float(self.dropout),
                               layout=_lib.LAYOUT_LINEAR if self.layout == "linear" else _lib.LAYOUT_RAW,
                               algorithm=_lib.ALGORITHMS[self.algorithm], kv_heads=self.kv_heads,
                               window=self.window, kv_half=int(self.kv_half))
        w = _lib.AttentionWeights(**{k: _fp(v) for k, v in {**self._w, **self._b}.items()})
        handle = ctypes.c_void_p()
        _check(_lib.decode_plan_create(self._device.handle, ctypes.byref(d), ctypes.byref(w), ctypes.byref(handle)),
               "creating the decode plan")
        self._dplan = _Plan(handle, _lib.decode_plan_free)
        cd = _lib.KVCacheDesc(batch=self.batch, capacity=self.capacity, kv_heads=self.kv_heads,
                              head_dim_qk=self.head_dim_qk, head_dim_v=self.head_dim_v, type=int(self.kv_half))
        ch = ctypes.c_void_p()
        _check(_lib.kv_cache_create(self._device.handle, ctypes.byref(cd), ctypes.byref(ch)), "creating the KV cache")
        self._cache = _Plan(ch, _lib.kv_cache_free)
        self.out_width = self.out_dim or self.heads * self.head_dim_v

    def __call__(self, x, valid=None):
        x = _floats("x", x, ndim=3)
        B, n, E = x.shape
        if B != self.batch or E != self.embed:
            _fail(_lib.SHAPE_MISMATCH, f"x: shape {x.shape}, expected ({self.batch}, n, {self.embed})")
        v = None
        if valid is not None:
            v = np.ascontiguousarray(np.asarray(valid), dtype=np.uintp)
            if v.shape != (B,):
                _fail(_lib.SHAPE_MISMATCH, f"valid: shape {v.shape}, expected ({B},)")
        out = np.full((B, n, self.out_width), np.nan, dtype=np.float32)
        args = _lib.DecodeArgs(x=_fp(x), new_tokens=n, valid=None if v is None else v.ctypes.data_as(
            ctypes.POINTER(ctypes.c_size_t)), out=_fp(out))
        with self._lock:
            _check(_lib.decode_execute(self._dplan.handle, self._cache.handle, ctypes.byref(args)), "decoding")
        return out

    @property
    def lengths(self):
        """Each sequence's cached length."""
        n = (ctypes.c_size_t * self.batch)()
        _check(_lib.kv_cache_lengths(self._cache.handle, n), "reading the cache lengths")
        return list(n)

    def reset(self):
        _check(_lib.kv_cache_reset(self._cache.handle), "resetting the cache")

    def truncate(self, lengths):
        """Drop each sequence's tail down to lengths[b] (at most its length): speculative decoding's rollback."""
        n = (ctypes.c_size_t * self.batch)(*[int(v) for v in lengths])
        if len(lengths) != self.batch:
            _fail(_lib.SHAPE_MISMATCH, f"lengths: {len(lengths)} values, expected {self.batch}")
        _check(_lib.kv_cache_truncate(self._cache.handle, n), "truncating the cache")

    def read_cache(self):
        """The cache as float: k (B, kv_heads, capacity, dk), v (B, kv_heads, capacity, dv); 0 past each length."""
        k = np.zeros((self.batch, self.kv_heads, self.capacity, self.head_dim_qk), np.float32)
        v = np.zeros((self.batch, self.kv_heads, self.capacity, self.head_dim_v), np.float32)
        _check(_lib.kv_cache_read(self._cache.handle, _fp(k), _fp(v)), "reading the cache")
        return k, v


class _Plan:
    def __init__(self, handle, free):
        self.handle, self._free = handle, free

    def __del__(self):
        if getattr(self, "handle", None):
            self._free(self.handle)
            self.handle = None


# ---------------------------------------------------------------- encoder layer

class EncoderLayer:
    """torch.nn.TransformerEncoderLayer (batch_first, eval): self-attention, residual + LayerNorm,
    Linear -> activation -> Linear, residual + LayerNorm; norm_first for the pre-norm variant.
    Weights as torch stores them (layout "linear") or transposed ("raw")."""

    def __init__(self, heads, *, w_query, w_key, w_value, w_out, ln1_weight, ln1_bias, w_ff1, b_ff1, w_ff2, b_ff2,
                 ln2_weight, ln2_bias, b_query=None, b_key=None, b_value=None, b_out=None, activation="relu",
                 norm_first=False, causal=False, eps=1e-5, layout="linear", algorithm="auto", device=None):
        if activation not in _lib.ACTIVATIONS:
            _fail(_lib.INVALID_ARGUMENT, f"activation: {activation!r}, expected 'relu' or 'gelu'")
        self._attn = Attention(heads, w_query=w_query, w_key=w_key, w_value=w_value, w_out=w_out, b_query=b_query,
                               b_key=b_key, b_value=b_value, b_out=b_out, causal=causal, layout=layout,
                               algorithm=algorithm, device=device)
        self._ln = {k: _floats(k, v, ndim=1) for k, v in dict(ln1_weight=ln1_weight, ln1_bias=ln1_bias,
                                                              b_ff1=b_ff1, b_ff2=b_ff2, ln2_weight=ln2_weight,
                                                              ln2_bias=ln2_bias).items()}
        self._ff = {k: _floats(k, v, ndim=2) for k, v in dict(w_ff1=w_ff1, w_ff2=w_ff2).items()}
        self.ff_dim = self._ff["w_ff1"].shape[0 if layout == "linear" else 1]
        self.activation, self.norm_first, self.eps = activation, bool(norm_first), float(eps)
        self.device = self._attn.device
        self._plans = {}
        self._lock = threading.Lock()

    def __call__(self, x, key_padding_mask=None):
        x = _floats("x", x, ndim=(2, 3))
        batched = x.ndim == 3
        x3 = x if batched else x[None]
        B, T, E = x3.shape
        kpm = None
        if key_padding_mask is not None:
            kpm = _mask_bytes("key_padding_mask", key_padding_mask, (B, T) if batched else (T,))
        key = (B, T, E, kpm is not None)
        a = self._attn
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                ad = _lib.AttentionDesc(batch=B, seq_q=T, embed=E, heads=a.heads, head_dim_qk=a.head_dim_qk,
                                        head_dim_v=a.head_dim_v, out_dim=a.out_dim, causal=int(a.causal),
                                        key_padding_mask=int(kpm is not None),
                                        layout=_lib.LAYOUT_LINEAR if a.layout == "linear" else _lib.LAYOUT_RAW,
                                        algorithm=_lib.ALGORITHMS[a.algorithm])
                d = _lib.EncoderDesc(attn=ad, ff_dim=self.ff_dim, activation=_lib.ACTIVATIONS[self.activation],
                                     norm_first=int(self.norm_first), eps=self.eps)
                w = _lib.EncoderWeights(attn=_lib.AttentionWeights(**{k: _fp(v) for k, v in {**a._w, **a._b}.items()}),
                                        **{k: _fp(v) for k, v in {**self._ln, **self._ff}.items()})
                handle = ctypes.c_void_p()
                _check(_lib.encoder_plan_create(a._device.handle, ctypes.byref(d), ctypes.byref(w),
                                                ctypes.byref(handle)), "creating the encoder plan")
                plan = self._plans[key] = _Plan(handle, _lib.encoder_plan_free)
            out = np.full((B, T, E), np.nan, dtype=np.float32)
            args = _lib.EncoderArgs(x=_fp(x3),
                                    key_padding_mask=None if kpm is None else kpm.ctypes.data_as(_lib.c_uint8_p),
                                    out=_fp(out))
            _check(_lib.encoder_plan_execute(plan.handle, ctypes.byref(args)), "running the encoder layer")
        return out if batched else out[0]


# ---------------------------------------------------------------- from torch

def _np(t):
    return None if t is None else t.detach().cpu().numpy().astype(np.float32)


def from_torch(module, device=None, causal=False):
    """An Attention from torch.nn.MultiheadAttention (batch_first, eval semantics: no dropout), or an
    EncoderLayer from torch.nn.TransformerEncoderLayer. torch is needed only here."""
    import torch  # noqa: F401  (absent torch: ImportError only when this is called)
    name = type(module).__name__
    if name == "MultiheadAttention":
        m = module
        if not m.batch_first:
            _fail(_lib.INVALID_ARGUMENT, "from_torch: MultiheadAttention must be batch_first=True")
        if m._qkv_same_embed_dim:
            wq, wk, wv = (_np(t) for t in m.in_proj_weight.chunk(3, dim=0))
        else:
            wq, wk, wv = _np(m.q_proj_weight), _np(m.k_proj_weight), _np(m.v_proj_weight)
        bq = bk = bv = None
        if m.in_proj_bias is not None:
            bq, bk, bv = (_np(t) for t in m.in_proj_bias.chunk(3, dim=0))
        return Attention(m.num_heads, w_query=wq, w_key=wk, w_value=wv, b_query=bq, b_key=bk, b_value=bv,
                         w_out=_np(m.out_proj.weight), b_out=_np(m.out_proj.bias), causal=causal, device=device)
    if name == "TransformerEncoderLayer":
        m = module
        if not getattr(m, "batch_first", getattr(m.self_attn, "batch_first", False)):
            _fail(_lib.INVALID_ARGUMENT, "from_torch: TransformerEncoderLayer must be batch_first=True")
        act = getattr(m, "activation_relu_or_gelu", None)
        act = {1: "relu", 2: "gelu"}.get(act)
        if act is None:
            fn = getattr(m.activation, "__name__", type(m.activation).__name__).lower()
            act = "gelu" if "gelu" in fn else "relu" if "relu" in fn else None
        if act is None:
            _fail(_lib.INVALID_ARGUMENT, "from_torch: only ReLU and GELU activations")
        sa = m.self_attn
        wq, wk, wv = (_np(t) for t in sa.in_proj_weight.chunk(3, dim=0))
        bq, bk, bv = (_np(t) for t in sa.in_proj_bias.chunk(3, dim=0)) if sa.in_proj_bias is not None else (None,) * 3
        if abs(m.norm1.eps - m.norm2.eps) > 0:
            _fail(_lib.INVALID_ARGUMENT, "from_torch: norm1 and norm2 with different eps")
        return EncoderLayer(sa.num_heads, w_query=wq, w_key=wk, w_value=wv, b_query=bq, b_key=bk, b_value=bv,
                            w_out=_np(sa.out_proj.weight), b_out=_np(sa.out_proj.bias),
                            ln1_weight=_np(m.norm1.weight), ln1_bias=_np(m.norm1.bias),
                            w_ff1=_np(m.linear1.weight), b_ff1=_np(m.linear1.bias),
                            w_ff2=_np(m.linear2.weight), b_ff2=_np(m.linear2.bias),
                            ln2_weight=_np(m.norm2.weight), ln2_bias=_np(m.norm2.bias), activation=act,
                            norm_first=m.norm_first, causal=causal, eps=m.norm1.eps, device=device)
    _fail(_lib.INVALID_ARGUMENT, f"from_torch: {name} is not nn.MultiheadAttention or nn.TransformerEncoderLayer")


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
        _fail(_lib.SHAPE_MISMATCH, f"plot_attention: weights of shape {w.shape}, expected (H, Tq, Tk)")
    idx = list(range(w.shape[0])) if heads is None else list(heads)
    qt = kt = None
    if tokens is not None:
        if len(tokens) == 2 and not isinstance(tokens[0], str):
            qt, kt = list(tokens[0]), list(tokens[1])
        else:
            qt = kt = list(tokens)
        if len(qt) != w.shape[1] or len(kt) != w.shape[2]:
            _fail(_lib.SHAPE_MISMATCH, f"plot_attention: {len(qt)}x{len(kt)} tokens for {w.shape[1]}x{w.shape[2]} "
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
