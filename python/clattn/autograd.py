"""Training with clattn from PyTorch: a torch.autograd.Function over clattn's forward and backward pass, and
MultiheadAttention, an nn.Module shaped like torch.nn.MultiheadAttention whose attention runs on a clattn device.

    import clattn.autograd
    mha = clattn.autograd.MultiheadAttention(64, 4, batch_first=True, device="opencl")
    out, _ = mha(x, x, x, key_padding_mask=kpm)      # x: a CPU tensor (B, T, E), or one sequence (T, E)
    out.sum().backward()                              # mha's parameters and x get their .grad

The module keeps one clattn.Attention, whose training plan per input shape is made once and reused: each call hands
it the parameters when they changed since its last call (clattn_plan_set_weights: the kernels and buffers stay), the
forward returns each row's log-sum-exp and the heads' context besides the output, and the backward takes them back,
so the forward's statistics are computed once. The backward runs with the forward's dropout seed, so dropout keeps
exactly the forward's weights.

Dtypes as clattn.Attention's: float32 as is, float16 and bfloat16 widened exactly and the results (and gradients)
rounded back to each input's dtype, float64 refused (clattn computes in float32 and would round it). Masks get no
gradient: a float attn_mask that requires grad is refused, as is a second derivative (create_graph=True through
this module gives gradients whose own backward raises clattn.UnsupportedError). Needs torch.
"""
from typing import Any, Optional, Tuple

import numpy as np
import torch

from . import Attention
from ._errors import UnsupportedError, invalid as _invalid
from ._lib import INVALID_ARGUMENT
from ._rope import _rope_spec

_PARAMS = ("w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out", "b_out")

_DOUBLE_BACKWARD = ("clattn.autograd: a second derivative (double backward: create_graph=True and then a gradient "
                    "of a gradient, e.g. a gradient penalty) is not supported; clattn computes first derivatives "
                    "only. Use torch.nn.MultiheadAttention for that term")


def _unsupported(message: str):
    raise UnsupportedError(-3008, message)


class _NoSecondDerivative(torch.autograd.Function):
    """The identity on a gradient, connected to the inputs it depends on, whose own backward refuses: what a
    gradient of clattn's backward gives when create_graph=True (else that gradient would silently be a constant)."""

    @staticmethod
    def forward(ctx, grad, *inputs):
        return grad.clone()

    @staticmethod
    def backward(ctx, *grads):
        _unsupported(_DOUBLE_BACKWARD)


def _param_key(params) -> Tuple:
    """What identifies the values of the parameters: each tensor's storage address, in-place version, shape and
    dtype. The tensors themselves are held with the key, so an address cannot be reused while it is remembered."""
    return tuple(None if p is None else (p.data_ptr(), p._version, tuple(p.shape), p.stride(), p.dtype)
                 for p in params)


def _sync_weights(attn: Attention, params) -> None:
    """Hand attn the parameters when they changed since its last call (an optimizer step, a load_state_dict)."""
    key = _param_key(params)
    held = getattr(attn, "_autograd_params", None)
    if held is not None and held[0] == key:
        return
    attn.set_weights(**{k: p.detach() for k, p in zip(_PARAMS, params) if p is not None})
    attn._autograd_params = (key, tuple(params))


class AttentionFunction(torch.autograd.Function):
    """out = attention(x, kv; w_query, w_key, w_value, b_query, b_key, b_value, w_out, b_out) on a clattn device.

    apply(attn, x, kv, key_padding_mask, attn_mask, is_causal, seed, positions, *params): attn a clattn.Attention
    made with weights of the parameters' shapes (its options: heads, dropout, batch_first, device, rope, ...; its
    training plans are reused from call to call, and it is given the parameters when they changed); kv None for
    self-attention; the masks as Attention takes them (no gradient); is_causal as Attention.forward's; seed this
    call's dropout seed; positions None or (position_ids, key_position_ids), the rows' rotary positions as
    Attention.forward_train takes them (attn made with rope; the backward gets the same); params the eight tensors
    in _PARAMS' order (None where the module has none). Gradients for x, kv and every parameter that requires one,
    in their dtypes."""

    @staticmethod
    def forward(ctx, attn, x, kv, key_padding_mask, attn_mask, is_causal, seed, positions, *params):
        _sync_weights(attn, params)
        # (copies: the backward uses these positions even if the caller's tensors change in place before it runs)
        pos = {k: None if p is None else np.array(p.detach() if isinstance(p, torch.Tensor) else p)
               for k, p in zip(("position_ids", "key_position_ids"), positions or (None, None))}
        out, lse, context = attn.forward_train(x, kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                               is_causal=is_causal, seed=seed, **pos)
        ctx.attn, ctx.masks, ctx.is_causal, ctx.seed = attn, (key_padding_mask, attn_mask), is_causal, seed
        ctx.stats, ctx.pos = (lse, context), pos
        ctx.has_kv = kv is not None
        ctx.save_for_backward(x, kv, *params)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, kv, *params = ctx.saved_tensors
        attn = ctx.attn
        _sync_weights(attn, params)  # another call may have given attn other weights since this one's forward
        lse, context = ctx.stats
        g = attn.backward(x, grad_out, kv, key_padding_mask=ctx.masks[0], attn_mask=ctx.masks[1], lse=lse,
                          context=context, is_causal=ctx.is_causal, seed=ctx.seed, **ctx.pos)
        inputs = {"x": x, "kv": kv, **dict(zip(_PARAMS, params))}
        want = {k: ctx.needs_input_grad[i] for i, k in enumerate(("x", "kv"), start=1)}
        want.update({k: ctx.needs_input_grad[8 + i] for i, k in enumerate(_PARAMS)})
        out = {}
        for k, t in inputs.items():
            if t is None or not want[k] or k not in g:
                out[k] = None
                continue
            gk = torch.from_numpy(g[k]).to(t.dtype)
            if torch.is_grad_enabled():  # create_graph=True: a gradient that refuses its own gradient
                gk = _NoSecondDerivative.apply(gk, *[v for v in (x, kv, *params) if v is not None and v.requires_grad])
            out[k] = gk
        return (None, out["x"], out["kv"], None, None, None, None, None) + tuple(out[k] for k in _PARAMS)


def _mask(name: str, m: Any) -> Optional[Any]:
    """A mask for clattn, which computes no gradient for it: one that asks for one is refused."""
    if m is None:
        return None
    if isinstance(m, torch.Tensor):
        if m.requires_grad and torch.is_grad_enabled():
            _unsupported(f"{name} requires grad: clattn computes no gradient for masks (a learned additive bias "
                         f"needs torch.nn.MultiheadAttention); pass {name}.detach() if it is not learned")
        return m.detach()
    return m


class MultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention's parameters (in_proj_weight, in_proj_bias, out_proj) and call, its attention
    computed by clattn with gradients through clattn's backward pass. dropout p applies to the attention weights in
    training mode (a new seed each call, the same in that call's backward); eval mode has none. forward(query, key,
    value, key_padding_mask=None, need_weights=False, attn_mask=None, is_causal=False, position_ids=None,
    key_position_ids=None) -> (out, None): query (B, T, E) (or (T, B, E) unless batch_first), or one sequence (T, E)
    as torch takes it; key is query for self-attention, value must be key; need_weights=True is refused (no weights
    from a training call). load_state_dict takes torch.nn.MultiheadAttention's state dict. The module's clattn state
    (its plans) is not part of a copy or a pickle: a copy makes its own at its first call.

    rope (clattn 0.8): a clattn.Rope, rotary position embeddings on the projected queries and keys (after their
    biases; the parameters are torch's, so the state dict is the same with and without): query row i at position i,
    or at position_ids (B, T) whatever batch_first, (1, T) or (T,), integers in 0 .. 2^22-1 (transformers'
    position_ids); cross-attention's keys at key_position_ids (B, S) (by default position_ids when S = T). The
    backward runs at the same positions (copied at the forward). position_ids without rope is refused."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, device: Optional[str] = None, seed: int = 0, rope: Any = None):
        super().__init__()
        _rope_spec(rope)  # a Rope or None, refused here rather than at the first call
        self.rope = rope
        ref = torch.nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, bias=bias, batch_first=batch_first)
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.in_proj_weight = torch.nn.Parameter(ref.in_proj_weight.detach().clone())
        self.in_proj_bias = torch.nn.Parameter(ref.in_proj_bias.detach().clone()) if bias else None
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj.load_state_dict(ref.out_proj.state_dict())
        self.clattn_device = device
        self._seed = seed
        self._attn: Optional[Attention] = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_attn"] = None  # device handles and plans: made again where the copy runs
        return state

    def _params(self):
        wq, wk, wv = self.in_proj_weight.chunk(3, dim=0)
        bq, bk, bv = self.in_proj_bias.chunk(3, dim=0) if self.in_proj_bias is not None else (None,) * 3
        return wq, wk, wv, bq, bk, bv, self.out_proj.weight, self.out_proj.bias

    def _attention(self, params) -> Attention:
        """The clattn module every call runs on (made at the first call, with the parameters then)."""
        if self._attn is None:
            weights = {k: p.detach() for k, p in zip(_PARAMS, params) if p is not None}
            self._attn = Attention(self.num_heads, **weights, dropout=self.dropout, batch_first=self.batch_first,
                                   device=self.clattn_device)  # (its rope: set at each call, as its dropout)
            self._attn._autograd_params = (_param_key(params), tuple(params))
        return self._attn

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = False, attn_mask=None,
                is_causal: bool = False, position_ids=None, key_position_ids=None):
        if need_weights:
            _invalid("need_weights=True: a training call returns no attention weights (pass need_weights=False)")
        if value is not key:
            _invalid("value: clattn projects keys and values from one input, so value must be key itself")
        if not isinstance(query, torch.Tensor):
            _invalid(f"query: a {type(query).__name__}; clattn.autograd takes torch tensors")
        params = self._params()
        attn = self._attention(params)
        p = self.dropout if self.training else 0.0
        attn.dropout = p  # train() / eval(): Attention keys its plans by their dropout
        attn.rope = self.rope  # (a rope set on the module after its first call is used too)
        self._seed += 1
        kv = None if key is query else key
        out = AttentionFunction.apply(attn, query, kv, _mask("key_padding_mask", key_padding_mask),
                                      _mask("attn_mask", attn_mask), bool(is_causal), self._seed,
                                      (position_ids, key_position_ids), *params)
        return out, None
