"""clattn.distributed: attention with the sequence split across the processes of a torch.distributed group (context
parallelism), each process running clattn on its own OpenCL device (CLATTN_DEVICE, or `device=`).

    ring_attention(q, k, v, group=None, causal=False, layout="contiguous")   K/V blocks passed around the ring
    ulysses_attention(q, k, v, group=None, causal=False)                     two all-to-alls: sequence <-> heads
    shard(x, group=None, layout="contiguous", dim=1) / unshard(...)          a rank's part of a sequence, and back
    MultiheadAttention(E, H, method="ring", layout=...)                      torch's module, its core distributed

Tensors are token-major heads as clattn.functional.attend takes them: q (B, L, H, E), k (B, S, Hk, E),
v (B, S, Hk, Ev), Hk dividing H, float32; every rank holds its part of the sequence (L / N query and S / N key rows of
the whole, N the group's size) and gets its rows of the output, (B, L, H, Ev), equal to attend() on the whole
sequence. Both are differentiable in q, k and v (first derivatives).

- ring_attention: rank r starts with its own K/V block; at each of N steps it attends its queries to the block it
  holds (clattn's core with lse, a training plan) while it sends that block to rank r + 1 and receives the next one
  from rank r - 1 (isend / irecv, overlapped with the step's compute); the partial outputs are merged by their
  log-sum-exp, in a fixed order (the same result on every rank and in every run), accumulated in `merge_dtype`
  (float32, or float64). The backward passes the K/V blocks around again with their dK and dV accumulators, each
  step's gradients from clattn's backward given the merged output and lse (as FlashAttention's ring versions do).
  causal: with layout="zigzag" each rank holds chunks r and 2N-1-r of 2N (shard() cuts them), so that every rank
  has the same causal work; "contiguous": chunk r of N (rank N-1 then does N times rank 0's work).
- ulysses_attention (DeepSpeed-Ulysses): an all-to-all turns the sequence split into a head split (each rank then
  holds the whole sequence for H / N query heads and Hk / N key/value heads: both must divide by N), clattn attends
  there, and a second all-to-all turns it back. causal and window as attend's; layout "contiguous" only.
- Checked on every rank before any block moves, in one all_gather: the shapes, the options, the dtypes and whether
  gradients are wanted must agree across the group (else ShapeMismatchError on every rank, naming the first rank and
  field that differ), and a rank whose own arguments are refused raises its error while every other rank raises
  InvalidArgumentError naming it: no rank is left waiting. Every collective and point-to-point wait runs under the
  group's timeout (init_process_group(timeout=...): gloo's default is 30 minutes; set it lower to fail sooner).
- key_padding_mask: this rank's part (B, S/N) of a bool mask over the whole sequence's keys, True = padding (as
  nn.MultiheadAttention's), cut as the keys were (shard(mask, layout=...)). The ring passes each block's part around
  with the block (clattn's own key padding, no (L, S) mask is made); Ulysses gathers the whole mask on every rank.
  A query row whose every key is hidden (padding, causal) gives zeros and zero gradients, as attend() does.
- Not taken: other masks, dropout (its Philox counters would be a block's own positions, not the sequence's: the
  functions have no such arguments), and half types (refused: the ring merges float32 partials). Each rank brings
  equal parts (shard refuses a length that does not split evenly: pad, and mask the padding with key_padding_mask).
"""
from __future__ import annotations

import math
import struct
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from . import functional as _F
from ._errors import invalid as _invalid
from ._errors import shape as _shape
from .functional import _unsupported

__all__ = ["ring_attention", "ulysses_attention", "shard", "unshard", "MultiheadAttention"]

_LAYOUTS = ("contiguous", "zigzag")
_TAG_K, _TAG_V, _TAG_DK, _TAG_DV, _TAG_P = 11, 12, 13, 14, 15


def _world(group) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        _invalid("clattn.distributed: torch.distributed is not initialised "
                                   "(call torch.distributed.init_process_group first)")
    return dist.get_rank(group), dist.get_world_size(group)


def _chunks_of(rank: int, world: int, layout: str) -> List[int]:
    """The global chunk numbers a rank holds, in its rows' order: [rank] of N, or [rank, 2N-1-rank] of 2N."""
    return [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]


def shard(x: torch.Tensor, group=None, layout: str = "contiguous", dim: int = 1) -> torch.Tensor:
    """This rank's part of a whole sequence x along dim (a copy): chunk r of N, or with layout="zigzag" chunks r and
    2N-1-r of 2N, one after the other. The length must divide evenly."""
    rank, world = _world(group)
    if layout not in _LAYOUTS:
        _invalid(f"layout={layout!r}: 'contiguous' or 'zigzag'")
    parts = world if layout == "contiguous" else 2 * world
    if x.shape[dim] % parts:
        _shape(f"shard: length {x.shape[dim]} does not split into {parts} equal chunks "
                                 f"({world} ranks, layout {layout!r}); pad it (and mask the padding) first")
    pieces = x.chunk(parts, dim=dim)
    return torch.cat([pieces[c] for c in _chunks_of(rank, world, layout)], dim=dim).contiguous()


def unshard(x: torch.Tensor, group=None, layout: str = "contiguous", dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's part (an all_gather; every rank gets it): shard's inverse."""
    rank, world = _world(group)
    if layout not in _LAYOUTS:
        _invalid(f"layout={layout!r}: 'contiguous' or 'zigzag'")
    x = x.contiguous()
    got = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(got, x, group=group)
    if layout == "contiguous":
        return torch.cat(got, dim=dim)
    pieces = [None] * (2 * world)
    for r, t in enumerate(got):
        a, b = t.chunk(2, dim=dim)
        pieces[r], pieces[2 * world - 1 - r] = a, b
    return torch.cat(pieces, dim=dim)


_NAMES = ["batch", "query length", "heads", "head size", "key batch", "key length", "key heads", "key head size",
          "value batch", "value length", "value heads", "value head size", "query dtype", "key dtype",
          "value dtype", "causal", "window", "scale (low bits)", "scale (high bits)", "layout", "merge dtype",
          "gradients wanted", "key padding mask"]
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}


def _local_meta(what: str, q, k, v, causal: bool, window: int, scale: Optional[float], layout: str,
                merge_dtype, kpm) -> Tuple[List[float], float]:
    """What this rank was given, as numbers every rank compares (_NAMES), and the scale; raises for arguments no
    rank could take (not tensors, not 4-D, an empty head, an unknown layout or merge dtype, a key padding mask that
    is not bool (batch, this rank's key rows))."""
    for name, t in (("query", q), ("key", k), ("value", v), ("key_padding_mask", kpm)):
        if name == "key_padding_mask" and t is None:
            continue
        if not isinstance(t, torch.Tensor):
            _invalid(f"{what}: {name} is a {type(t).__name__}; torch tensors only")
        if t.device.type != "cpu":
            _invalid(f"{what}: {name} is on {t.device}; CPU tensors only (clattn reads host memory, and runs on the "
                     "OpenCL device of its own)")
        if name == "key_padding_mask":
            continue
        if t.dim() != 4:
            _shape(f"{what}: {name} {tuple(t.shape)}; (batch, length, heads, head size)")
        if min(t.shape[2], t.shape[3]) == 0:
            _shape(f"{what}: {name} {tuple(t.shape)}: no heads or an empty head")
    if layout not in _LAYOUTS:
        _invalid(f"{what}: layout={layout!r}: 'contiguous' or 'zigzag'")
    if merge_dtype not in (torch.float32, torch.float64):
        _invalid(f"{what}: merge_dtype={merge_dtype}: torch.float32 or torch.float64")
    if kpm is not None:
        if kpm.dtype != torch.bool:
            _invalid(f"{what}: key_padding_mask is {kpm.dtype}; a bool tensor (True = padding)")
        if tuple(kpm.shape) != tuple(k.shape[:2]):
            _shape(f"{what}: key_padding_mask {tuple(kpm.shape)}; (batch, this rank's key rows) = "
                   f"{tuple(k.shape[:2])}")
    B, L, H, E = q.shape
    sc = 1.0 / math.sqrt(E) if scale is None else float(scale)
    lo, hi = struct.unpack("<II", struct.pack("<d", sc))  # the scale's bits, exact in float64 (NaN too)
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    meta = [B, L, H, E, *k.shape, *v.shape, _DTYPE_CODES.get(q.dtype, 9), _DTYPE_CODES.get(k.dtype, 9),
            _DTYPE_CODES.get(v.dtype, 9), int(bool(causal)), int(window), lo, hi, _LAYOUTS.index(layout),
            int(merge_dtype == torch.float64), int(grads), int(kpm is not None)]
    return meta, sc


def _agree(what: str, meta: Optional[List[float]], mine: Optional[Exception], group, world: int):
    """Every rank's meta equal (or ShapeMismatchError naming the first rank and field that differ), and no rank's
    own refusal: raised on every rank alike, before any rank waits on another (the one all_gather)."""
    row = torch.tensor([0.0 if mine is None else 1.0] + (meta or [0.0] * len(_NAMES)), dtype=torch.float64)
    every = [torch.empty_like(row) for _ in range(world)]
    dist.all_gather(every, row, group=group)
    if mine is not None:
        raise mine
    for r, t in enumerate(every):
        if t[0]:
            _invalid(f"{what}: rank {r} refused its arguments (its own error says why); every rank stops")
    for r, t in enumerate(every):
        diff = (t != every[0]).nonzero()
        if diff.numel():
            i = int(diff[0, 0]) - 1
            _shape(f"{what}: rank {r} has {_NAMES[i]} = {t[i + 1].item():g}, rank 0 {every[0][i + 1].item():g}; "
                   "every rank of the group must call it alike")


def _check(what: str, q, k, v, group, causal: bool, window: int, scale: Optional[float], layout: str,
           heads_split: bool, merge_dtype=torch.float32, kpm=None) -> Tuple[int, int, float]:
    """The group's ranks agree on the call (_agree), then its refusals, from agreed values: the same on every rank."""
    rank, world = _world(group)
    meta, sc, mine = None, 0.0, None
    try:
        meta, sc = _local_meta(what, q, k, v, causal, window, scale, layout, merge_dtype, kpm)
    except Exception as e:  # noqa: BLE001 (raised again below, on this rank, after the others heard of it)
        mine = e
    _agree(what, meta, mine, group, world)
    B, L, H, E = q.shape
    S, Hk = k.shape[1], k.shape[2]
    if q.dtype != torch.float32 or k.dtype != torch.float32 or v.dtype != torch.float32:
        _unsupported(f"{what}: {q.dtype}, {k.dtype}, {v.dtype}: float32 only (the partials are merged in float32 "
                     "or float64)")
    if k.shape[0] != B or v.shape[0] != B or v.shape[1] != S or v.shape[2] != Hk:
        _shape(f"{what}: key {tuple(k.shape)} and value {tuple(v.shape)} do not match query {tuple(q.shape)} "
               "(batch, and value's length and heads as key's)")
    if k.shape[3] != E or H % Hk:
        _shape(f"{what}: key {tuple(k.shape)}: head size {E} and heads dividing {H}")
    if window and not causal:
        _invalid(f"{what}: window={window} needs causal=True")
    if not math.isfinite(sc) or sc == 0.0:
        _invalid(f"{what}: scale={sc}: must be finite and nonzero")
    if heads_split:
        if H % world or Hk % world:
            _shape(f"{what}: {H} query heads and {Hk} key/value heads must divide by the group's {world} ranks "
                   "(each rank attends H/N and Hk/N of them)")
        if layout != "contiguous":
            _invalid(f"{what}: layout {layout!r}: contiguous only (the all-to-all concatenates the ranks' parts in "
                     "rank order)")
    elif causal and L != S:
        _shape(f"{what}: causal with {L} query rows and {S} key rows per rank: equal lengths")
    if layout == "zigzag" and (L % 2 or S % 2):
        _shape(f"{what}: {L} query and {S} key rows per rank: zigzag holds two equal chunks")
    return rank, world, sc


# ---- the ring

def _pairs(rank: int, world: int, layout: str, src: int, causal: bool, nq: int, nk: int):
    """The (query chunk, key chunk, masked) blocks of step `src` (whose K/V this rank holds): local row ranges
    and whether the block is causal (the diagonal); blocks wholly after the queries are skipped under causal."""
    qc, kc = _chunks_of(rank, world, layout), _chunks_of(src, world, layout)
    lq, lk = nq // len(qc), nk // len(kc)
    out = []
    for a, ca in enumerate(qc):
        for c, cc in enumerate(kc):
            if causal and cc > ca:
                continue
            out.append((slice(a * lq, (a + 1) * lq), slice(c * lk, (c + 1) * lk), causal and cc == ca))
    return out


def _merge(acc_o, acc_l, o, l, dtype):
    """The running output and lse with one more block's: by their log-sum-exp, -inf rows (no key yet) kept exact."""
    o = o.to(dtype)
    l = l.to(dtype)
    if acc_o is None:
        return o, l
    new = torch.logaddexp(acc_l, l)
    w_old = torch.where(acc_l == -math.inf, torch.zeros_like(acc_l), torch.exp(acc_l - new))
    w_new = torch.where(l == -math.inf, torch.zeros_like(l), torch.exp(l - new))
    # lse (B, H, L) weights rows of out (B, L, H, Ev)
    return acc_o * w_old.transpose(1, 2)[..., None] + o * w_new.transpose(1, 2)[..., None], new


def _global_rank(group, r: int) -> int:
    """Group rank r as the default group's (what isend and irecv take)."""
    if group is None or group is dist.group.WORLD:
        return r
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank  # (torch 1.13: private)
    return get(group, r)


def _exchange(sends: List[torch.Tensor], recvs: List[torch.Tensor], tags: List[int], rank: int, world: int, group):
    """Post the sends to rank + 1 and the receives from rank - 1 (in the group's ranks); returns their requests."""
    to, frm = _global_rank(group, (rank + 1) % world), _global_rank(group, (rank - 1) % world)
    reqs = []
    for s, r, t in zip(sends, recvs, tags):
        reqs.append(dist.isend(s, to, group=group, tag=t))
        reqs.append(dist.irecv(r, frm, group=group, tag=t))
    return reqs


def _pass_on(block: List[torch.Tensor], rank: int, world: int, group):
    """Send the K/V block (and its key padding mask) on to rank + 1 while the next comes from rank - 1: the next
    block's tensors (to be waited for) and the requests."""
    nxt = [torch.empty_like(t) for t in block]
    return nxt, _exchange(block, nxt, [_TAG_K, _TAG_V, _TAG_P][:len(block)], rank, world, group)


def _part(t: Optional[torch.Tensor], rows: slice) -> Optional[torch.Tensor]:
    return None if t is None else t[:, rows].contiguous()


def _ring_forward(q, k, v, kpm, group, rank, world, causal, scale, layout, device, merge_dtype):
    """kpm: this rank's (B, S/N) uint8 key padding mask (nonzero = hidden), or None."""
    nq, nk = q.shape[1], k.shape[1]
    acc = {}
    block = [k.contiguous(), v.contiguous()] + ([] if kpm is None else [kpm.contiguous()])
    for step in range(world):
        src = (rank - step) % world
        reqs, nxt = [], None
        if step < world - 1:  # the next block travels while this one is attended
            nxt, reqs = _pass_on(block, rank, world, group)
        cur_k, cur_v, cur_p = block[0], block[1], block[2] if len(block) > 2 else None
        for rq, rk, diag in _pairs(rank, world, layout, src, causal, nq, nk):
            o, l = _F._attend_impl(q[:, rq].contiguous(), cur_k[:, rk].contiguous(), cur_v[:, rk].contiguous(), None,
                                   diag, 0, scale, 0.0, 0, True, device, kpm=_part(cur_p, rk))
            key = (rq.start, rq.stop)
            acc[key] = _merge(*acc.get(key, (None, None)), o, l, merge_dtype)
        for r in reqs:
            r.wait()
        if nxt is not None:
            block = nxt
    B, H, Ev = q.shape[0], q.shape[2], v.shape[3]
    out = torch.empty((B, nq, H, Ev), dtype=torch.float32)
    lse = torch.empty((B, H, nq), dtype=torch.float32)
    for (a, b), (o, l) in acc.items():
        out[:, a:b], lse[:, :, a:b] = o.float(), l.float()
    return out, lse


def _ring_backward(q, k, v, kpm, out, lse, grad_out, group, rank, world, causal, scale, layout, device):
    nq, nk = q.shape[1], k.shape[1]
    dq = torch.zeros_like(q)
    block = [k.contiguous(), v.contiguous()] + ([] if kpm is None else [kpm.contiguous()])
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # the accumulators of the block this rank holds
    for step in range(world):
        src = (rank - step) % world
        reqs, nxt = [], None
        if step < world - 1:
            nxt, reqs = _pass_on(block, rank, world, group)
        cur_k, cur_v, cur_p = block[0], block[1], block[2] if len(block) > 2 else None
        for rq, rk, diag in _pairs(rank, world, layout, src, causal, nq, nk):
            gq, gk, gv = _F._attend_backward_impl(
                q[:, rq].contiguous(), cur_k[:, rk].contiguous(), cur_v[:, rk].contiguous(), None,
                out[:, rq].contiguous(), lse[:, :, rq].contiguous(), grad_out[:, rq].contiguous(), diag, 0, scale,
                0.0, 0, device, kpm=_part(cur_p, rk))
            dq[:, rq] += gq
            dk[:, rk] += gk
            dv[:, rk] += gv
        for r in reqs:
            r.wait()
        # the accumulators follow their block to rank + 1; after the last step they reach the block's owner
        if world > 1:
            got = (torch.empty_like(dk), torch.empty_like(dv))
            for r in _exchange([dk, dv], list(got), [_TAG_DK, _TAG_DV], rank, world, group):
                r.wait()
            dk, dv = got
        if nxt is not None:
            block = nxt
    return dq, dk, dv


class _RingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kpm, group, rank, world, causal, scale, layout, device, merge_dtype):
        q, k, v = q.detach().contiguous(), k.detach().contiguous(), v.detach().contiguous()
        out, lse = _ring_forward(q, k, v, kpm, group, rank, world, causal, scale, layout, device, merge_dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kpm = kpm  # (not differentiable: uint8)
        ctx.opts = (group, rank, world, causal, scale, layout, device)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        _F._first_derivatives_only()
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(q, k, v, ctx.kpm, out, lse, grad_out.contiguous().float(), *ctx.opts)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, group=None, *,
                   causal: bool = False, key_padding_mask: Optional[torch.Tensor] = None,
                   scale: Optional[float] = None, layout: str = "contiguous",
                   merge_dtype: torch.dtype = torch.float32, device: Optional[str] = None) -> torch.Tensor:
    """Ring attention over the group: this rank's query rows (B, L/N, H, E) against the whole sequence's keys, whose
    blocks (B, S/N, Hk, E) and values pass around the ring -> (B, L/N, H, Ev), as attend() on the whole sequence
    gives these rows. causal: top-left over the whole sequence (each rank's rows as shard() cut them with `layout`:
    "zigzag" balances the causal work). key_padding_mask: (B, S/N) bool, True = padding, cut as the keys. merge_dtype:
    float32 or float64, the partials' merge (fixed order: the same bits on every rank and in every run). See the
    module's notes for what is refused."""
    what = "ring_attention"
    rank, world, sc = _check(what, query, key, value, group, causal, 0, scale, layout, False, merge_dtype,
                             key_padding_mask)
    kpm = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if training:
        return _RingFunction.apply(query, key, value, kpm, group, rank, world, bool(causal), sc, layout,
                                   device or "", merge_dtype)
    with torch.no_grad():
        return _ring_forward(query.contiguous(), key.contiguous(), value.contiguous(), kpm, group, rank, world,
                             bool(causal), sc, layout, device or "", merge_dtype)[0]


# ---- Ulysses

def _seq_to_heads(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """(B, L/N, H, E) sequence parts -> (B, L, H/N, E): rank n gets head group n of every rank's rows."""
    B, Lc, H, E = x.shape
    send = x.reshape(B, Lc, world, H // world, E).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)  # (N: the source rank's rows, B, Lc, H/N, E)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 0, 2, 3, 4).reshape(B, world * Lc, H // world, E)


def _heads_to_seq(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """(B, L, H/N, E) head groups -> (B, L/N, H, E): the inverse of _seq_to_heads."""
    B, L, Hn, E = x.shape
    send = x.reshape(B, world, L // world, Hn, E).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)  # (N: the source rank's head group, B, L/N, H/N, E)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, L // world, world * Hn, E)


class _PaddedAttend(torch.autograd.Function):
    """attend() on (B, L, H/N, E) head groups with clattn's own key padding mask kpm (B, S) uint8, nonzero = hidden:
    no (L, S) mask is made (attend's mask argument would expand one)."""

    @staticmethod
    def forward(ctx, q, k, v, kpm, causal, window, scale, device):
        q, k, v = q.detach().contiguous(), k.detach().contiguous(), v.detach().contiguous()
        training = any(ctx.needs_input_grad[:3])
        out, lse = _F._attend_impl(q, k, v, None, causal, window, scale, 0.0, 0, training, device, kpm=kpm)
        if training:
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.kpm, ctx.opts = kpm, (causal, window, scale, 0.0, 0, device)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        _F._first_derivatives_only()
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _F._attend_backward_impl(q, k, v, None, out, lse, grad_out.contiguous().float(), *ctx.opts,
                                              kpm=ctx.kpm)
        return dq, dk, dv, None, None, None, None, None


class _AllToAll(torch.autograd.Function):
    """One of the two all-to-alls (to_heads: _seq_to_heads, else _heads_to_seq); its gradient goes back through the
    other."""

    @staticmethod
    def forward(ctx, x, group, world, to_heads: bool):
        ctx.opts = (group, world, to_heads)
        return (_seq_to_heads if to_heads else _heads_to_seq)(x.contiguous(), group, world)

    @staticmethod
    def backward(ctx, g):
        group, world, to_heads = ctx.opts
        return (_heads_to_seq if to_heads else _seq_to_heads)(g.contiguous(), group, world), None, None, None


def ulysses_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, group=None, *,
                      causal: bool = False, window: int = 0, key_padding_mask: Optional[torch.Tensor] = None,
                      scale: Optional[float] = None, device: Optional[str] = None) -> torch.Tensor:
    """DeepSpeed-Ulysses attention over the group: this rank's rows (B, L/N, H, E), (B, S/N, Hk, E), (B, S/N, Hk, Ev)
    of a contiguously sharded sequence -> (B, L/N, H, Ev), as attend() on the whole sequence gives these rows. H and
    Hk must divide by N. causal and window as attend's, over the whole sequence; key_padding_mask: (B, S/N) bool,
    True = padding (gathered from every rank: each attends the whole sequence)."""
    what = "ulysses_attention"
    rank, world, sc = _check(what, query, key, value, group, causal, int(window), scale, "contiguous",
                             heads_split=True, kpm=key_padding_mask)
    q, k, v = (_AllToAll.apply(t, group, world, True) for t in (query, key, value))
    if key_padding_mask is None:
        o = _F.attend(q, k, v, causal=bool(causal), window=int(window), scale=sc, device=device)
    else:
        mine = key_padding_mask.to(torch.uint8).contiguous()  # (uint8: what every backend's all_gather moves)
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine, group=group)
        kpm = torch.cat(parts, dim=1).contiguous()  # (B, S): the whole sequence's, in rank order
        o = _PaddedAttend.apply(q, k, v, kpm, bool(causal), int(window), sc, device or "")
    return _AllToAll.apply(o, group, world, False)


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention (batch_first, self-attention) over a sequence split across the group: forward(x)
    takes this rank's rows (B, L/N, E), as shard() cut them with `layout`, and returns their output (B, L/N, E) and
    None. The projections run locally on the rank's rows (torch), the core through ring_attention (method="ring") or
    ulysses_attention ("ulysses": H must divide by N; contiguous layout). Its parameters are torch's own
    (load_state_dict from an nn.MultiheadAttention works); each rank's gradients are its rows' share, so sum them
    over the group (torch.distributed.all_reduce, or DistributedDataParallel) before the optimizer steps.
    key_padding_mask: this rank's part (B, L/N) of a bool mask, True = padding, cut as x. Not with dropout, attn_mask
    (causal: is_causal=True), need_weights, kdim/vdim or add_bias_kv (refused)."""

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, *, group=None, method: str = "ring",
                 layout: str = "contiguous", merge_dtype: torch.dtype = torch.float32, device: Optional[str] = None):
        super().__init__(embed_dim, num_heads, bias=bias, batch_first=True)
        if method not in ("ring", "ulysses"):
            _invalid(f"method={method!r}: 'ring' or 'ulysses'")
        if method == "ulysses" and layout != "contiguous":
            _invalid(f"layout={layout!r} with method='ulysses': contiguous only")
        self.group, self.method, self.layout = group, method, layout
        self.merge_dtype, self.clattn_device = merge_dtype, device

    def forward(self, x: torch.Tensor, key=None, value=None, key_padding_mask=None, need_weights: bool = False,
                attn_mask=None, is_causal: bool = False, average_attn_weights: bool = True):
        for name, arg in (("key", key), ("value", value)):
            if arg is not None and arg is not x:
                _unsupported(f"clattn.distributed.MultiheadAttention: {name} other than the query: self-attention "
                             "only")
        if attn_mask is not None or need_weights:
            _unsupported("clattn.distributed.MultiheadAttention: attn_mask and the weights are not taken (causal: "
                         "is_causal=True; padding: key_padding_mask)")
        if self.dropout:
            _unsupported("clattn.distributed.MultiheadAttention: dropout is not taken")
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[2] != self.embed_dim:
            _shape(f"clattn.distributed.MultiheadAttention: x {tuple(getattr(x, 'shape', ()))}; (batch, rows, "
                   f"{self.embed_dim})")
        B, L, E = x.shape
        H = self.num_heads
        qkv = torch.nn.functional.linear(x, self.in_proj_weight, self.in_proj_bias)  # (B, L, 3E)
        q, k, v = (t.reshape(B, L, H, E // H) for t in qkv.chunk(3, dim=2))
        if self.method == "ring":
            o = ring_attention(q, k, v, self.group, causal=bool(is_causal), key_padding_mask=key_padding_mask,
                               layout=self.layout, merge_dtype=self.merge_dtype, device=self.clattn_device)
        else:
            o = ulysses_attention(q, k, v, self.group, causal=bool(is_causal), key_padding_mask=key_padding_mask,
                                  device=self.clattn_device)
        return self.out_proj(o.reshape(B, L, E)), None
