"""clattn.functional: torch.nn.functional.scaled_dot_product_attention on a clattn device.

    import clattn.functional as CF
    out = CF.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                          enable_gqa=False)

The attention core alone on heads already projected (clattn_attention_desc.separate_value): query (..., H, L, E),
key (..., Hk, S, E), value (..., Hk, S, Ev) as torch takes them, any number of leading dimensions (broadcast as
torch broadcasts them), the result (..., H, L, Ev). Differentiable through clattn's backward pass. With torch >= 2.4
the call is a torch custom operator (torch.ops.clattn.attend, with a fake implementation), so torch.compile traces it
without a graph break; with older torch (Debian's 1.13) it is a torch.autograd.Function over the same code.

Where clattn differs from torch on purpose: a query row that sees no key (fully masked) gives 0, not NaN, and passes
no gradient. float64 tensors are refused (clattn computes in float32, which would round them silently). float16 and
bfloat16 inference calls (query, key and value of one type, no gradient wanted) go in and come out in their type, no
float32 copy on the host (clattn_attention_desc.dtype: the plan widens them where its kernels read them and rounds the
output once); a call that trains, or mixes types, is computed from float32 copies and rounded back. Masks get no gradient (a float attn_mask that
requires grad is refused). Dropout draws its seed from torch's generator (torch.manual_seed makes it repeatable);
the kept weights differ from torch's, which draws them otherwise.

Plans (one per shape and option set) are cached per device, device=None meaning $CLATTN_DEVICE, else the first
OpenCL device, else ref (clattn.devices()).
"""

import ctypes
import math
import threading
from typing import Any, Dict, Optional, Tuple

import torch

from . import _lib
from ._device import _create, _Device, _PlanCache, _plan_state
from ._errors import check as _check
from ._errors import invalid as _invalid
from ._errors import shape as _shape
from ._errors import UnsupportedError
from ._rope import MAX_POSITION as _MAX_POSITION
from ._rope import Rope, _rope_spec, _rope_struct

__all__ = ["scaled_dot_product_attention", "attend", "varlen_attention", "Rope", "PLAN_CACHE_SIZE"]

PLAN_CACHE_SIZE = 64  # plans kept per device (least recently used out)
# Inference calls of a few query rows (decode steps, whose key length grows by one each token) run on a plan for
# the key length rounded up to a multiple of KEY_BUCKET, the keys past the real ones hidden by the mask: one plan per
# KEY_BUCKET tokens generated, not one per token. At 2,048 keys the padding is 3 % of the work at most.
KEY_BUCKET = 64
BUCKET_ROWS = 16  # query rows up to which a call is bucketed

_devices: Dict[Optional[str], Tuple[_Device, _PlanCache]] = {}
_devices_lock = threading.Lock()
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.float16: _lib.DTYPE_F16, torch.bfloat16: _lib.DTYPE_BF16}
_TORCH_OF = {code: t for t, code in _DTYPES.items()}
_HAS_CUSTOM_OP = hasattr(torch, "library") and hasattr(torch.library, "custom_op")  # torch >= 2.4


def _unsupported(message: str):
    raise UnsupportedError(-3008, message)


def _first_derivatives_only():
    """Refuse a double backward (a backward run with grad enabled)."""
    if torch.is_grad_enabled():
        _unsupported("clattn.functional: a second derivative (double backward) is not supported; clattn computes "
                     "first derivatives only")


def _grads(grad_out, lse, out, dq, dk, dv) -> "_lib.AttentionGrads":
    """A backward call's arrays: dOut, the forward's lse and output (the context: no output projection), dQ in grad_x,
    dK in grad_kv, dV in grad_value."""
    return _lib.AttentionGrads(grad_out=_ptr(grad_out), lse=_ptr(lse), context=_ptr(out), grad_x=_ptr(dq),
                               grad_kv=_ptr(dk), grad_value=_ptr(dv), grad_out_count=grad_out.numel(),
                               lse_count=lse.numel(), context_count=out.numel(), grad_x_count=dq.numel(),
                               grad_kv_count=dk.numel(), grad_value_count=dv.numel())


def _device(spec: Optional[str]) -> Tuple[_Device, _PlanCache]:
    """The open device of a spec and its plan cache, opened once per process."""
    with _devices_lock:
        got = _devices.get(spec)
        if got is None:
            got = _devices[spec] = (_Device(spec), _PlanCache(PLAN_CACHE_SIZE))
        return got


def device_name(device: Optional[str] = None) -> str:
    """The name of the device calls with this spec run on (opening it)."""
    return _device(device or None)[0].name


def _ptr(t: Optional[torch.Tensor], ctype=_lib.c_float_p):
    return None if t is None else ctypes.cast(t.data_ptr(), ctype)


def _plan(dev: _Device, cache: _PlanCache, key: tuple):
    (B, Tq, Tk, H, HK, dk, dv, mask_kind, pb, ph, causal, window, scale, dropout, training, rope, kpm, sinks,
     dtype) = key

    def make():
        d = _lib.AttentionDesc(batch=B, seq_q=Tq, seq_kv=Tk, embed=H * dk, heads=H, kv_heads=HK, head_dim_qk=dk,
                               head_dim_v=dv, cross=1, separate_value=1, causal=int(causal), window=window,
                               attn_mask=mask_kind, attn_mask_per_batch=int(pb), attn_mask_per_head=int(ph),
                               key_padding_mask=int(kpm), scale=scale, dropout=dropout, training=int(training),
                               dtype=dtype, rope=_rope_struct(rope), sinks=int(sinks))
        # a plan with sinks is made with zeros, and given the call's before each execution (_attend_impl)
        zeros = torch.zeros(H if sinks else 0, dtype=_TORCH_OF[dtype])
        w = _lib.AttentionWeights(sinks=_ptr(zeros) if sinks else None, sinks_count=H if sinks else 0)
        return _create(dev, _lib.plan_create, _lib.plan_free, d, w, "creating the attention plan")

    return cache.get(key, make)


def _key(q, k, v, mask, causal, window, scale, dropout_p, training, rope, kpm=None, sinks=None) -> tuple:
    B, Tq, H, dk = q.shape
    Tk, HK, dv = k.shape[1], k.shape[2], v.shape[3]
    kind, pb, ph = _lib.MASK_NONE, False, False
    if mask is not None:
        kind = _lib.MASK_BOOL if mask.dtype == torch.uint8 else _lib.MASK_FLOAT
        pb, ph = mask.shape[0] > 1, mask.shape[1] > 1
    return (B, Tq, Tk, H, HK, dk, dv, kind, pb, ph, bool(causal), int(window), float(scale), float(dropout_p),
            bool(training), rope, kpm is not None, sinks is not None,
            _DTYPES[q.dtype])  # (the type last: test_functional reads it)


def _inputs(q, k, v, mask, kpm=None) -> "_lib.AttentionArgs":
    """The call's inputs as the library takes them: Q in x, K in kv, V in value, the mask and the key padding mask
    (None: none)."""
    a = _lib.AttentionArgs(x=_ptr(q), kv=_ptr(k), value=_ptr(v), x_count=q.numel(), kv_count=k.numel(),
                           value_count=v.numel())
    if kpm is not None:
        a.key_padding_mask, a.key_padding_mask_count = _ptr(kpm, _lib.c_uint8_p), kpm.numel()
    if mask is not None:
        a.attn_mask, a.attn_mask_count = ctypes.c_void_p(mask.data_ptr()), mask.numel()
    return a


def _positioned(a: "_lib.AttentionArgs", pos, B: int, Tq: int, Tk: int) -> None:
    """The rows' rotary positions into the args: pos None, or a contiguous int32 tensor of B*Tq queries' positions
    then B*Tk keys' (rope_positions, rope_positions_kv: the library reads them as uint32, all in 0 .. 2^22-1)."""
    if pos is None:
        return
    if pos.dtype != torch.int32 or pos.dim() != 1 or pos.numel() != B * (Tq + Tk) or not pos.is_contiguous():
        _invalid(f"pos: a contiguous 1-D int32 tensor of {B} * ({Tq} + {Tk}) positions (attend's position_ids and "
                 f"key_position_ids), not {pos.dtype} {tuple(pos.shape)}")
    u32 = ctypes.POINTER(ctypes.c_uint32)
    a.rope_positions, a.rope_positions_count = ctypes.cast(pos.data_ptr(), u32), B * Tq
    a.rope_positions_kv, a.rope_positions_kv_count = ctypes.cast(pos.data_ptr() + 4 * B * Tq, u32), B * Tk


def _attend_impl(q, k, v, mask, causal: bool, window: int, scale: float, dropout_p: float, seed: int,
                 training: bool, device: str, rope: str = "", kpm=None,
                 pos=None, sinks=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """out (B, Tq, H, dv) and, for a training call, lse (B, H, Tq) (else an empty tensor): q (B, Tq, H, dk),
    k (B, Tk, HK, dk), v (B, Tk, HK, dv) contiguous CPU tensors of one type (float32, or float16 or bfloat16 when not
    training; out in it), mask None or (1|B, 1|H, Tq, Tk) uint8 (nonzero = hidden) or float32 (added); kpm None or
    a contiguous (B, Tk) uint8 key padding mask (nonzero = hidden: the library's own, no (Tq, Tk) mask made); pos
    None or the rows' rotary positions (_positioned); sinks None or each head's sink logit, a contiguous (H,) tensor
    of q's type (constants: a training call's lse is that of the weights with them, which its backward takes)."""
    dev, cache = _device(device or None)
    B, Tq, H, _ = q.shape
    dv = v.shape[3]
    plan = _plan(dev, cache, _key(q, k, v, mask, causal, window, scale, dropout_p, training, rope, kpm, sinks))
    out = torch.empty((B, Tq, H, dv), dtype=q.dtype)
    lse = torch.empty((B, H, Tq) if training else (0,), dtype=torch.float32)
    a = _inputs(q, k, v, mask, kpm)
    _positioned(a, pos, B, Tq, k.shape[1])
    a.out, a.out_count = _ptr(out), out.numel()
    if training:
        a.lse, a.lse_count = _ptr(lse), lse.numel()
    # the plan is made with zero sinks (_plan): the call's are its weights (H values of its type) while it runs
    w = None if sinks is None else _lib.AttentionWeights(sinks=_ptr(sinks), sinks_count=sinks.numel())
    with _plan_state(plan, seed if dropout_p > 0.0 else None, w):
        _check(_lib.plan_execute(plan.handle, ctypes.byref(a)), "scaled_dot_product_attention")
    return out, lse


def _attend_backward_impl(q, k, v, mask, out, lse, grad_out, causal: bool, window: int, scale: float,
                          dropout_p: float, seed: int, device: str, rope: str = "", kpm=None, pos=None):
    """dq, dk, dv for the training call that gave out and lse (the same inputs, key padding mask, positions and
    seed)."""
    dev, cache = _device(device or None)
    plan = _plan(dev, cache, _key(q, k, v, mask, causal, window, scale, dropout_p, True, rope, kpm))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    a = _inputs(q, k, v, mask, kpm)
    _positioned(a, pos, q.shape[0], q.shape[1], k.shape[1])
    g = _grads(grad_out, lse, out, dq, dk, dv)
    with _plan_state(plan, seed if dropout_p > 0.0 else None):  # the forward's dropout mask
        _check(_lib.plan_backward(plan.handle, ctypes.byref(a), ctypes.byref(g)),
               "scaled_dot_product_attention backward")
    return dq, dk, dv


if _HAS_CUSTOM_OP:
    @torch.library.custom_op("clattn::attend", mutates_args=())
    def _attend_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], causal: bool,
                   window: int, scale: float, dropout_p: float, seed: int, training: bool,
                   device: str, rope: str, pos: Optional[torch.Tensor],
                   sinks: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return _attend_impl(q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope, pos=pos,
                            sinks=sinks)

    @_attend_op.register_fake
    def _(q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope, pos, sinks):
        B, Tq, H, _ = q.shape
        return (q.new_empty((B, Tq, H, v.shape[3])), q.new_empty((B, H, Tq) if training else (0,),
                                                                  dtype=torch.float32))

    @torch.library.custom_op("clattn::attend_backward", mutates_args=())
    def _attend_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                            out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor, causal: bool, window: int,
                            scale: float, dropout_p: float, seed: int, device: str, rope: str,
                            pos: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _attend_backward_impl(q, k, v, mask, out, lse, grad_out.contiguous(), causal, window, scale,
                                     dropout_p, seed, device, rope, pos=pos)

    @_attend_backward_op.register_fake
    def _(q, k, v, mask, out, lse, grad_out, causal, window, scale, dropout_p, seed, device, rope, pos):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def _setup_context(ctx, inputs, output):
        q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope, pos, sinks = inputs
        out, lse = output
        if not training:
            return
        ctx.save_for_backward(q, k, v, mask, out, lse, pos)
        ctx.opts = (causal, window, scale, dropout_p, seed, device, rope)

    def _backward(ctx, grad_out, grad_lse):
        q, k, v, mask, out, lse, pos = ctx.saved_tensors
        _first_derivatives_only()
        dq, dk, dv = _attend_backward_op(q, k, v, mask, out, lse, grad_out, *ctx.opts, pos)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None

    _attend_op.register_autograd(_backward, setup_context=_setup_context)

    def _run(q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope, pos=None, sinks=None):
        if training and not any(t.requires_grad for t in (q, k, v)):
            training = False
        return _attend_op(q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope, pos,
                          sinks)[0]
else:
    class _AttendFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope, pos, sinks):
            out, lse = _attend_impl(q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope,
                                    pos=pos, sinks=sinks)
            if training:
                ctx.save_for_backward(q, k, v, out, lse)
                ctx.mask, ctx.pos = mask, pos
                ctx.opts = (causal, window, scale, dropout_p, seed, device, rope)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            _first_derivatives_only()
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = _attend_backward_impl(q, k, v, ctx.mask, out, lse, grad_out.contiguous(), *ctx.opts,
                                               pos=ctx.pos)
            return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None

    def _run(q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope, pos=None, sinks=None):
        return _AttendFunction.apply(q, k, v, mask, causal, window, scale, dropout_p, seed, training, device, rope,
                                     pos, sinks)


def _as_float(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        _invalid(f"{name}: a {type(t).__name__}; clattn.functional takes torch tensors")
    if t.device.type != "cpu":
        _invalid(f"{name}: a tensor on {t.device}; clattn takes CPU tensors (it runs on its own device, chosen with "
                 f"device=...): pass {name}.cpu()")
    if t.layout != torch.strided:
        _invalid(f"{name}: a {t.layout} tensor; pass a dense one ({name}.to_dense())")
    if t.dtype not in _FLOATS:
        if t.dtype == torch.float64:
            _invalid(f"{name}: float64; clattn computes in float32 and would round it: pass {name}.float()")
        _invalid(f"{name}: dtype {t.dtype}; clattn takes float32, float16 and bfloat16")
    return t


def _mask_for(name: str, m: torch.Tensor, B: int, H: int, Tq: int, Tk: int) -> torch.Tensor:
    """A mask broadcastable to (B, H, Tq, Tk) as clattn takes it: (1|B, 1|H, Tq, Tk), contiguous, uint8 nonzero =
    hidden (from torch's bool True = attend) or float32 added."""
    if not isinstance(m, torch.Tensor):
        _invalid(f"{name}: a {type(m).__name__}; pass a torch tensor")
    if m.device.type != "cpu":
        _invalid(f"{name}: a tensor on {m.device}; pass {name}.cpu()")
    if m.requires_grad and torch.is_grad_enabled():
        _unsupported(f"{name} requires grad: clattn computes no gradient for masks; pass {name}.detach() if it is "
                     f"not learned")
    m = m.detach()
    if m.dim() > 4:
        _shape(f"{name}: {tuple(m.shape)} has more dimensions than the (batch, heads, L, S) it is broadcast to")
    shape = (1,) * (4 - m.dim()) + tuple(m.shape)
    full = (B, H, Tq, Tk)
    for have, want in zip(shape, full):
        if have not in (1, want):
            _shape(f"{name}: {tuple(m.shape)} does not broadcast to (batch, heads, L, S) = {full}")
    m = m.reshape(shape).expand(shape[0], shape[1], Tq, Tk)
    if m.dtype == torch.bool:
        return (~m).to(torch.uint8).contiguous()
    if m.dtype in _FLOATS or m.dtype == torch.float64:
        return m.to(torch.float32).contiguous()
    _invalid(f"{name}: dtype {m.dtype}; a mask is bool (True = attend) or floating (added to the scores)")
    return m  # not reached


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor] = None,
           *, causal: bool = False, window: int = 0, scale: Optional[float] = None, dropout_p: float = 0.0,
           rope: Optional[Rope] = None, position_ids: Any = None, key_position_ids: Any = None,
           sinks: Any = None, device: Optional[str] = None) -> torch.Tensor:
    """The core on token-major heads, the layout projections produce and clattn reads without a copy:
    query (B, L, H, E), key (B, S, Hk, E), value (B, S, Hk, Ev) with Hk dividing H (query head h reads key/value
    head h // (H // Hk)) -> (B, L, H, Ev). mask None, or broadcastable to (B, H, L, S): bool True = attend, or float
    added. causal: key j hidden from query i when j > i (top-left aligned); window W > 0 (with causal): also when
    i - j >= W. rope: a Rope, rotary position embeddings applied to query and key inside the call (query row i at
    position i, key row j at j; their gradients rotated back), or with position_ids (B, L) or (L,), integers in
    0 .. 2^22-1 (transformers' position_ids: packed documents, a chunk after its context; a left-padded batch needs
    none, as a shift of every position changes nothing), query row i of entry b at position_ids[b, i]; (1, L)
    serves every entry; the keys at key_position_ids (B, S), (1, S) or (S,), which defaults to position_ids when
    S = L (self-attention). sinks (clattn 0.8): attention sinks, gpt-oss's (its s_aux): a tensor of H logits, one per
    query head in each of its rows' softmax denominators with no value (-inf: none for that head), in the call's type
    (rounded to it, with half inputs); in training held fixed (query, key and value get their gradients; a sink that
    requires grad is refused: its own gradient is not computed yet).
    The rest as scaled_dot_product_attention."""
    q, k, v = _as_float("query", query), _as_float("key", key), _as_float("value", value)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.dim() != 4:
            _shape(f"{name}: {tuple(t.shape)}; attend takes (batch, length, heads, head size)")
    B, L, H, E = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        _shape(f"key {tuple(k.shape)} and value {tuple(v.shape)}: batch must be query's ({B})")
    S, Hk = k.shape[1], k.shape[2]
    if k.shape[3] != E:
        _shape(f"key {tuple(k.shape)}: head size {k.shape[3]} must be query's ({E})")
    if tuple(v.shape[:3]) != (B, S, Hk):
        _shape(f"value {tuple(v.shape)}: (batch, length, heads) must be key's ({B}, {S}, {Hk})")
    if Hk == 0 or H % Hk:
        _shape(f"key/value heads ({Hk}) must divide query heads ({H})")
    if min(B, L, S, H, E, v.shape[3]) == 0:
        _shape(f"query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}: a dimension is 0")
    causal, window = bool(causal), int(window)
    if window < 0 or (window and not causal):
        _invalid(f"window={window}: a sliding window needs causal=True and window >= 0")
    if scale is None:
        scale = 1.0 / math.sqrt(E)
    scale = float(scale)
    if not math.isfinite(scale) or scale == 0.0:
        _invalid(f"scale={scale}: must be finite and nonzero")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        _invalid(f"dropout_p={dropout_p}: must be in [0, 1)")
    m = None if mask is None else _mask_for("attn_mask", mask, B, H, L, S)
    rope_spec = _rope_spec(rope)
    pq, pk = _position_ids(position_ids, key_position_ids, rope_spec, B, L, S)
    seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if dropout_p > 0.0 else 0
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    dtype = query.dtype
    # half inputs of one type run natively for inference; training plans, and mixed types, compute from float32
    if training or not q.dtype == k.dtype == v.dtype:
        q, k, v = q.float(), k.float(), v.float()
    sk = _sinks_of(sinks, H, q.dtype)
    Sb = -(-S // KEY_BUCKET) * KEY_BUCKET
    if not training and L <= BUCKET_ROWS:  # (with a mask even when Sb = S: the bucket's one plan)
        q, k, v, m = _bucketed(q, k, v, m, Sb)
        if pk is not None and Sb != S:  # the padded keys (hidden) at position 0
            pk = torch.cat((pk, pk.new_zeros((B, Sb - S))), dim=1)
    pos = None if pq is None else torch.cat((pq.reshape(-1), pk.reshape(-1))).contiguous()
    out = _run(q.contiguous(), k.contiguous(), v.contiguous(), m, causal, window, scale, dropout_p, seed, training,
               device or "", rope_spec, pos, sk)
    return out if out.dtype == dtype else out.to(dtype)


def _sinks_of(sinks: Any, H: int, dtype) -> Optional[torch.Tensor]:
    """attend's sinks checked: None, or H logits as a contiguous tensor of the plan's type."""
    if sinks is None:
        return None
    s = _as_float("sinks", sinks)
    if torch.is_grad_enabled() and s.requires_grad:  # (a learned sink would get no gradient)
        _unsupported("sinks that require grad: clattn 0.8 trains with attention sinks held fixed (query, key and "
                     "value get their gradients; the sinks' own is not computed yet): pass sinks.detach(), or call "
                     "under torch.no_grad()")
    s = s.detach()
    if tuple(s.shape) != (H,):
        _shape(f"sinks: {tuple(s.shape)}, expected one logit per query head ({H},)")
    return s.to(dtype).contiguous()


def _positions_of(name: str, ids: Any, B: int, n: int) -> torch.Tensor:
    """One position_ids argument as a (B, n) int32 tensor: (B, n) or (n,) (every batch entry), integers in
    0 .. 2^22-1."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
        _invalid(f"{name}: dtype {ids.dtype}; positions are integers")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() == 2 and ids.shape[0] == 1:  # (1, n): every batch entry (transformers' cache_position[None])
        ids = ids.expand(B, -1)
    if tuple(ids.shape) != (B, n):
        _shape(f"{name}: {tuple(ids.shape)}; (batch, length) = ({B}, {n}), or ({n},) for every batch entry")
    ids = ids.cpu().to(torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > _MAX_POSITION):
        _invalid(f"{name}: positions from {int(ids.min())} to {int(ids.max())}; clattn takes 0 .. {_MAX_POSITION}")
    return ids.to(torch.int32).contiguous()


def _position_ids(position_ids: Any, key_position_ids: Any, rope_spec: str, B: int, L: int, S: int):
    """attend's position_ids and key_position_ids as (B, L) and (B, S) int32 tensors, or (None, None)."""
    if position_ids is None and key_position_ids is None:
        return None, None
    if not rope_spec:
        _invalid("position_ids without rope: positions only place the rotary embeddings (pass rope=Rope(...))")
    if position_ids is None:
        _invalid("key_position_ids without position_ids: give the queries' positions too")
    pq = _positions_of("position_ids", position_ids, B, L)
    if key_position_ids is None:
        if S != L:
            _shape(f"key_position_ids is needed: the keys' length {S} is not the queries' {L}, so position_ids "
                   f"cannot place them")
        return pq, pq
    return pq, _positions_of("key_position_ids", key_position_ids, B, S)


def _offsets(name: str, cu: Any, rows: int) -> torch.Tensor:
    """cu_seqlens as clattn takes them: a 1-D integer tensor of B+1 offsets, contiguous uint32 (checked by the
    library: from 0, non-decreasing, the last the packed rows)."""
    if not isinstance(cu, torch.Tensor):
        cu = torch.as_tensor(cu)
    if cu.dim() != 1 or cu.numel() < 2:
        _shape(f"{name}: {tuple(cu.shape)}; the offsets are a 1-D tensor of batch + 1 entries")
    if cu.dtype.is_floating_point or cu.dtype == torch.bool or cu.dtype.is_complex:
        _invalid(f"{name}: dtype {cu.dtype}; the offsets are integers")
    cu = cu.cpu().to(torch.int64)
    if int(cu.min()) < 0 or int(cu.max()) > 2 ** 31 - 1:
        _invalid(f"{name}: offsets outside 0 .. 2^31-1")
    if int(cu[-1]) != rows:
        _shape(f"{name}[-1] = {int(cu[-1])}: the packed tensor has {rows} rows")
    return cu.to(torch.int32).contiguous()


def _varlen_plan(dev: _Device, cache: _PlanCache, key: tuple):
    (_, B, Tq, Tk, H, HK, dk, dv, causal, window, rope, scale, dropout, dtype, training) = key

    def make():
        d = _lib.AttentionDesc(batch=B, seq_q=Tq, seq_kv=Tk, embed=H * dk, heads=H, kv_heads=HK, head_dim_qk=dk,
                               head_dim_v=dv, cross=1, separate_value=1, causal=int(causal), window=window,
                               scale=scale, dropout=dropout, dtype=dtype, varlen=1, training=int(training),
                               rope=_rope_struct(rope))
        return _create(dev, _lib.plan_create, _lib.plan_free, d, _lib.AttentionWeights(),
                       "creating the varlen attention plan")

    return cache.get(key, make)


def _varlen_inputs(q, k, v, cq, ck) -> "_lib.AttentionArgs":
    a = _inputs(q, k, v, None)
    u32 = ctypes.POINTER(ctypes.c_uint32)
    a.cu_seqlens_q, a.cu_seqlens_q_count = ctypes.cast(cq.data_ptr(), u32), cq.numel()
    a.cu_seqlens_kv, a.cu_seqlens_kv_count = ctypes.cast(ck.data_ptr(), u32), ck.numel()
    return a


def _varlen_impl(q, k, v, cq, ck, key: tuple, seed: int, device: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """out (total_q, H, dv) and, for a training plan (key[-1]), lse: each sequence's (H, L) rows one after another."""
    dev, cache = _device(device or None)
    plan = _varlen_plan(dev, cache, key)
    H, dv, training = q.shape[1], v.shape[2], key[-1]
    out = torch.empty((q.shape[0], H, dv), dtype=q.dtype)
    lse = torch.empty((H * q.shape[0],) if training else (0,), dtype=torch.float32)
    a = _varlen_inputs(q, k, v, cq, ck)
    a.out, a.out_count = _ptr(out), out.numel()
    if training:
        a.lse, a.lse_count = _ptr(lse), lse.numel()
    with _plan_state(plan, seed if key[-3] > 0.0 else None):  # (key[-3]: dropout)
        _check(_lib.plan_execute(plan.handle, ctypes.byref(a)), "varlen_attention")
    return out, lse


class _VarlenFunction(torch.autograd.Function):
    """varlen_attention's gradients through the plan's backward (the forward's lse and output passed back)."""

    @staticmethod
    def forward(ctx, q, k, v, cq, ck, key, seed, device):
        out, lse = _varlen_impl(q, k, v, cq, ck, key, seed, device)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = (cq, ck, key, seed, device)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        _first_derivatives_only()
        q, k, v, out, lse = ctx.saved_tensors
        cq, ck, key, seed, device = ctx.opts
        dev, cache = _device(device or None)
        plan = _varlen_plan(dev, cache, key)
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        a = _varlen_inputs(q, k, v, cq, ck)
        g = _grads(grad_out, lse, out, dq, dk, dv)
        with _plan_state(plan, seed if key[-3] > 0.0 else None):  # the forward's dropout mask
            _check(_lib.plan_backward(plan.handle, ctypes.byref(a), ctypes.byref(g)), "varlen_attention backward")
        return dq, dk, dv, None, None, None, None, None


def varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens_q: Any,
                     cu_seqlens_k: Any, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     window: int = 0, scale: Optional[float] = None, dropout_p: float = 0.0,
                     rope: Optional[Rope] = None, device: Optional[str] = None) -> torch.Tensor:
    """Attention over a variable-length batch packed without padding, as flash_attn_varlen_func takes it (inference):
    query (total_q, H, E), key (total_k, Hk, E), value (total_k, Hk, Ev); sequence b is rows cu_seqlens_q[b] ..
    cu_seqlens_q[b+1]-1 of query and cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1 of key and value (B+1 offsets each,
    integer tensors or lists), each at most max_seqlen_q (max_seqlen_k) long -> (total_q, H, Ev). causal and window
    per sequence, top-left aligned; a sequence without keys gives 0. Each sequence gets what attend() gives it
    alone, with no padding computed (clattn_attention_desc.varlen). The plan is made for the longest lengths rounded
    up to a multiple of KEY_BUCKET (one plan for many batches). dropout_p: training-mode dropout on the weights, as
    attend's (a seed drawn from torch's generator each call); sequence b's weights are kept or dropped as attend()
    on the padded batch keeps its entry b's. rope: a Rope, each sequence's positions from 0. Differentiable (query, key and value) through clattn's backward,
    computed in float32 (a torch.autograd.Function: torch.compile breaks the graph there)."""
    q, k, v = _as_float("query", query), _as_float("key", key), _as_float("value", value)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.dim() != 3:
            _shape(f"{name}: {tuple(t.shape)}; varlen_attention takes (total rows, heads, head size)")
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    _, H, E = q.shape
    S, Hk = k.shape[0], k.shape[1]
    if k.shape[2] != E:
        _shape(f"key {tuple(k.shape)}: head size {k.shape[2]} must be query's ({E})")
    if tuple(v.shape[:2]) != (S, Hk):
        _shape(f"value {tuple(v.shape)}: (rows, heads) must be key's ({S}, {Hk})")
    if Hk == 0 or H % Hk:
        _shape(f"key/value heads ({Hk}) must divide query heads ({H})")
    if min(H, E, v.shape[2]) == 0:
        _shape(f"query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}: a head dimension is 0")
    cq, ck = _offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0]), _offsets("cu_seqlens_k", cu_seqlens_k, S)
    if cq.numel() != ck.numel():
        _shape(f"cu_seqlens_q has {cq.numel()} offsets, cu_seqlens_k {ck.numel()}: one batch, batch + 1 each")
    max_q, max_k = int(max_seqlen_q), int(max_seqlen_k)
    if max_q < 1 or max_k < 1:
        _invalid(f"max_seqlen_q={max_q}, max_seqlen_k={max_k}: must be >= 1")
    for name, c, m in (("cu_seqlens_q", cq, max_q), ("cu_seqlens_k", ck, max_k)):
        lens = c[1:] - c[:-1]
        if int(lens.max()) > m:  # (a decrease is the library's to name)
            b = int(lens.argmax())
            _shape(f"{name}: sequence {b} has {int(lens[b])} rows, past max_seqlen_{name[-1]} = {m}")
    causal, window = bool(causal), int(window)
    if window < 0 or (window and not causal):
        _invalid(f"window={window}: a sliding window needs causal=True and window >= 0")
    scale = float(1.0 / math.sqrt(E) if scale is None else scale)
    if not math.isfinite(scale) or scale == 0.0:
        _invalid(f"scale={scale}: must be finite and nonzero")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        _invalid(f"dropout_p={dropout_p}: must be in [0, 1)")
    rope_spec = _rope_spec(rope)
    seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if dropout_p > 0.0 else 0
    dtype = query.dtype
    if training or q.dtype != k.dtype or k.dtype != v.dtype:  # training plans compute from float32 copies
        q, k, v = q.float(), k.float(), v.float()
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if q.shape[0] == 0:  # every sequence empty: nothing to compute
        return torch.zeros((0, H, v.shape[2]), dtype=dtype)
    B = cq.numel() - 1
    bucket = lambda n: -(-n // KEY_BUCKET) * KEY_BUCKET  # noqa: E731
    key = ("varlen", B, bucket(max_q), bucket(max_k), H, Hk, E, v.shape[2], causal, window, rope_spec, scale,
           dropout_p, _DTYPES[q.dtype], training)
    if training:
        out = _VarlenFunction.apply(q, k, v, cq, ck, key, seed, device or "")
    else:
        out = _varlen_impl(q.detach(), k.detach(), v.detach(), cq, ck, key, seed, device or "")[0]
    return out if out.dtype == dtype else out.to(dtype)


def _bucketed(q, k, v, m, Sb: int):
    """Keys and values padded with zeros to Sb, and the mask extended to hide the padding (a (1, 1, L, Sb) one
    made when there is none): the same attention on a plan shared by every key length of the bucket."""
    B, S, Hk, E = k.shape
    if Sb != S:
        kb, vb = k.new_zeros((B, Sb, Hk, E)), v.new_zeros((B, Sb, Hk, v.shape[3]))
        kb[:, :S], vb[:, :S] = k, v
        k, v = kb, vb
    if m is None:
        m = torch.zeros((1, 1, q.shape[1], Sb), dtype=torch.uint8)
        m[..., S:] = 1
    elif Sb != S:
        pad = m.new_full((*m.shape[:3], Sb - S), 1 if m.dtype == torch.uint8 else float("-inf"))
        m = torch.cat((m, pad), dim=3)
    return q, k, v, m


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False,
                                 *, device: Optional[str] = None) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention, computed by clattn: softmax(Q K^T * scale + mask) V.

    query (N, ..., H, L, E), key (N, ..., Hk, S, E), value (N, ..., Hk, S, Ev) -> (N, ..., H, L, Ev); leading
    dimensions broadcast. Hk = H, or Hk = 1 (broadcast), or with enable_gqa Hk dividing H (query head h reads
    key/value head h // (H // Hk), without repeating K and V). attn_mask broadcastable to (N, ..., H, L, S): bool
    (True = take part in attention) or floating (added to the scores). is_causal: the top-left aligned lower
    triangle (query i sees keys j <= i), not with attn_mask. scale None: 1/sqrt(E). dropout_p: training-mode dropout
    on the weights (each call a new seed from torch's generator).

    Differs from torch on purpose: a query row that sees no key gives 0 (torch: NaN) and no gradient; float64 is
    refused (clattn computes in float32); masks get no gradient. device: a clattn device spec (None: the default)."""
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor) or not isinstance(value, torch.Tensor):
        _invalid("query, key and value must be torch tensors")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        _shape(f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}: each needs at least "
               f"(L, E)")
    if is_causal and attn_mask is not None:
        _invalid("is_causal=True with an attn_mask: pass one or the other (as torch)")
    # (..., H, L, E) with H = 1 when absent; the leading dimensions broadcast
    q4 = query if query.dim() >= 3 else query.unsqueeze(0)
    k4 = key if key.dim() >= 3 else key.unsqueeze(0)
    v4 = value if value.dim() >= 3 else value.unsqueeze(0)
    H, Hk = q4.shape[-3], k4.shape[-3]
    if v4.shape[-3] != Hk:
        _shape(f"value {tuple(value.shape)}: heads must be key's ({Hk})")
    if Hk != H and Hk != 1 and not (enable_gqa and Hk and H % Hk == 0):
        _shape(f"key/value heads ({Hk}) != query heads ({H})" +
               ("" if enable_gqa else ": pass enable_gqa=True for grouped-query attention") +
               (f"; with enable_gqa they must divide them" if enable_gqa else ""))
    try:
        lead = torch.broadcast_shapes(q4.shape[:-3], k4.shape[:-3], v4.shape[:-3])
    except RuntimeError:
        _shape(f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}: the batch "
               f"dimensions do not broadcast")
    L, E, S, Ev = q4.shape[-2], q4.shape[-1], k4.shape[-2], v4.shape[-1]
    if k4.shape[-1] != E:
        _shape(f"key {tuple(key.shape)}: head size {k4.shape[-1]} must be query's ({E})")
    if v4.shape[-2] != S:
        _shape(f"value {tuple(value.shape)}: length must be key's ({S})")
    B = math.prod(lead) if lead else 1
    q4 = q4.expand(*lead, H, L, E).reshape(B, H, L, E)
    k4 = k4.expand(*lead, Hk, S, E).reshape(B, Hk, S, E)
    v4 = v4.expand(*lead, Hk, S, Ev).reshape(B, Hk, S, Ev)
    mask = None
    if attn_mask is not None:  # broadcast to (lead, H, L, S), then as clattn takes it
        if not isinstance(attn_mask, torch.Tensor):
            _invalid(f"attn_mask: a {type(attn_mask).__name__}; pass a torch tensor")
        mshape = (1,) * max(0, len(lead) + 3 - attn_mask.dim()) + tuple(attn_mask.shape)
        try:
            torch.broadcast_shapes(mshape, (*lead, H, L, S))
        except RuntimeError:
            _shape(f"attn_mask: {tuple(attn_mask.shape)} does not broadcast to {(*lead, H, L, S)}")
        if len(mshape) > len(lead) + 3:
            _shape(f"attn_mask: {tuple(attn_mask.shape)} has more dimensions than {(*lead, H, L, S)}")
        per_batch = any(d > 1 for d in mshape[:len(lead)])
        m = attn_mask.reshape(mshape)
        m = m.expand(*(lead if per_batch else (1,) * len(lead)), mshape[-3], L, S)
        mask = m.reshape(B if per_batch else 1, mshape[-3], L, S)
    if Hk == H and (mask is None or mask.shape[:2] in ((1, 1), (B, H))):
        # each (batch, head) pair a batch entry of one head: torch's (B, H, L, E) tensors are then clattn's
        # token-major rows as they lie in memory (no copy), and so is the output
        Bf = B * H
        mf = mask if mask is None or mask.shape[:2] == (1, 1) else mask.reshape(Bf, 1, L, S)
        out = attend(q4.reshape(Bf, 1, L, E).transpose(1, 2), k4.reshape(Bf, 1, S, E).transpose(1, 2),
                     v4.reshape(Bf, 1, S, Ev).transpose(1, 2), mf, causal=is_causal, scale=scale, dropout_p=dropout_p,
                     device=device)
        out = out.reshape(*lead, H, L, Ev)
    else:
        out = attend(q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2), mask, causal=is_causal,
                     scale=scale, dropout_p=dropout_p, device=device)
        out = out.transpose(1, 2).reshape(*lead, H, L, Ev)
    return out if query.dim() >= 3 else out.reshape(L, Ev)
