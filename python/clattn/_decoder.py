"""clattn.Decoder: attention over a KV cache, one step at a time."""
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
from ._rope import _positions_np, _rope_spec, _rope_struct


# ---------------------------------------------------------------- decoding over a KV cache

def _tree(tree_mask: Any, B: int, n: int) -> Optional[np.ndarray]:
    """A verify step's draft tree as the library takes it: (B, n, n) bytes, 0 or 1; (n, n) serves every sequence."""
    if tree_mask is None:
        return None
    t = np.asarray(tree_mask.cpu().numpy() if hasattr(tree_mask, "cpu") else tree_mask)
    if t.ndim == 2:
        t = np.broadcast_to(t, (B,) + t.shape)
    if t.shape != (B, n, n):
        _shape(f"tree_mask: shape {t.shape}, expected (batch, new tokens, new tokens) = ({B}, {n}, {n}) or ({n}, {n})")
    return np.ascontiguousarray(t != 0, dtype=np.uint8)


def _step_positions(lengths: List[int], counts: List[int], row0: List[int], pos: Optional[np.ndarray]):
    """What accept() needs of a step: the lengths before it, and each sequence's tokens' rotary positions (from pos,
    x's rows; else their slots, length + t)."""
    return (list(lengths), [[int(p) for p in pos[row0[b]:row0[b] + c]] if pos is not None else
                            list(range(lengths[b], lengths[b] + c)) for b, c in enumerate(counts)])


class Decoder(_Shaped):
    """Causal self-attention over a KV cache on the device (clattn_decode_plan + clattn_kv_cache).

    The projections and options of Attention (w_query, w_key and w_value required; causal implied; no masks,
    dropout or weights out), plus batch (B sequences), capacity (positions each sequence's cache holds) and
    max_new_tokens (the most tokens one call appends). Calling it with x (B, n, E), 1 <= n <= max_new_tokens,
    appends the tokens' keys and values at each sequence's length and returns their outputs (B, n, out_dim or
    heads*head_dim_v): a prefill and the decode steps after it equal one causal run over the whole sequence.
    valid (B ints, 0 <= valid[b] <= n) lets sequence b append only its first valid[b] tokens (ragged prompts);
    its other rows are the output of an empty attention (b_out, or 0). kv_dtype: the cache's element type,
    "float32" (default), "float16" or "bfloat16" (clattn 0.7; keys and values rounded to it, to nearest even, as
    they are appended), or "int8" (clattn 0.8: each appended token's keys of a KV head, and its values, quantised
    to bytes with one float scale, max |x| / 127; every element within max |x| / 254 of its value; the README's
    "KV cache"); kv_half=True is kv_dtype="float16". page_size (clattn 0.8): a paged cache, pages of page_size
    positions (a power of two) from a pool of `pages` (0: enough for every sequence's capacity), taken as sequences
    grow and given back when they shrink; share() lets sequences share a prompt's pages (a shared page is copied
    before one of them writes into it). A step the pool cannot hold raises TooLargeForDeviceError, nothing changed.
    rope: a clattn.Rope (clattn 0.8): each token's query and key rotated at its position in its sequence (the cache
    length + its index in the call, or the position_ids a call gives), keys before they are cached; share() keeps
    them (same positions), and accept() refuses a branch that would move a token rotated at its slot to another (a
    draft tree needs position_ids: the length + each token's depth).
    """

    def __init__(self, heads: int, *, w_query: Any, w_key: Any, w_value: Any, capacity: int, max_new_tokens: int,
                 batch: int = 1, b_query: Any = None, b_key: Any = None, b_value: Any = None, w_out: Any = None,
                 b_out: Any = None, kv_heads: Optional[int] = None, head_dim_qk: Optional[int] = None,
                 head_dim_v: Optional[int] = None, window: int = 0, scale: float = 0.0, kv_half: bool = False,
                 layout: str = "linear", algorithm: str = "auto", device: Optional[str] = None,
                 kv_dtype: Optional[str] = None, page_size: int = 0, pages: int = 0, rope: Any = None):
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
        half = _a.flag("kv_half", kv_half)
        int8 = kv_dtype is not None and str(kv_dtype) in ("int8", "torch.int8")
        kvd = "float32" if kv_dtype is None else "int8" if int8 else _a.dtype_name("kv_dtype", kv_dtype)
        if half and kv_dtype is not None and kvd != "float16":
            _invalid(f"kv_half=True with kv_dtype={kvd!r}: give one of them (kv_half=True is kv_dtype='float16')")
        self.kv_dtype = "float16" if half else kvd
        self.kv_half = self.kv_dtype == "float16"
        # clattn_kv_type: 0 float, 1 half, 2 bfloat16, 3 int8
        kv_type = 3 if self.kv_dtype == "int8" else _a.dtype_code(self.kv_dtype)
        self.page_size = _a.integer("page_size", page_size, 0)
        self.pages = _a.integer("pages", pages, 0)
        if self.pages and not self.page_size:
            _invalid(f"pages={self.pages} without page_size: a contiguous cache has no pages")
        self.algorithm = _a.choice("algorithm", algorithm, tuple(_lib.ALGORITHMS))
        self.rope = rope
        rope_struct = _rope_struct(_rope_spec(rope))
        self._device = _Device(device)
        self.device = self._device.name
        d = _lib.AttentionDesc(batch=self.batch, seq_q=self.max_new_tokens, embed=wt.embed, heads=wt.heads,
                               head_dim_qk=wt.head_dim_qk, head_dim_v=wt.head_dim_v, out_dim=wt.out_dim, causal=1,
                               scale=self.scale, layout=_layout_code(wt.layout),
                               algorithm=_lib.ALGORITHMS[self.algorithm], kv_heads=wt.kv_heads, window=self.window,
                               kv_half=kv_type, kv_page_size=self.page_size, rope=rope_struct)
        self._dplan = _create(self._device, _lib.decode_plan_create, _lib.decode_plan_free, d, wt.struct(),
                              "creating the decode plan")
        cd = _lib.KVCacheDesc(batch=self.batch, capacity=self.capacity, kv_heads=wt.kv_heads,
                              head_dim_qk=wt.head_dim_qk, head_dim_v=wt.head_dim_v, type=kv_type,
                              page_size=self.page_size, pages=self.pages)
        ch = ctypes.c_void_p()
        _check(_lib.kv_cache_create(self._device.handle, ctypes.byref(cd), ctypes.byref(ch)), "creating the KV cache")
        self._cache = _Handle(ch, _lib.kv_cache_free, self._device)
        self.out_width = wt.out_dim or wt.heads * wt.head_dim_v
        self._lock = threading.Lock()
        self._fixed = True  # from here on the options are the plan's and the cache's (__setattr__)

    def __setattr__(self, name: str, value: Any) -> None:
        """The options (batch, capacity, window, scale, rope, ...) are fixed once the decoder is made: its plan and
        cache were built for them, so a new value would be ignored. Setting one raises AttributeError."""
        if not name.startswith("_") and self.__dict__.get("_fixed"):
            raise AttributeError(f"Decoder.{name} is fixed when the decoder is made (its plan and KV cache were built "
                                 f"for it, so a new value would be ignored): make a new Decoder")
        object.__setattr__(self, name, value)

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
                + (f", kv_dtype={self.kv_dtype!r}" if self.kv_dtype != "float32" else "")
                + (f", page_size={self.page_size}" if self.page_size else "")
                + f", lengths={self.lengths}, device={self.device!r})")

    def __call__(self, x: Any, valid: Optional[Sequence[int]] = None, tree_mask: Any = None,
                 cu_seqlens: Any = None, position_ids: Any = None) -> Any:
        """Append x's tokens to the cache and return their outputs (B, n, out width); see the class.

        tree_mask (clattn 0.8, a speculative decoding's verify step): bool or 0/1 (B, n, n), or (n, n) for every
        sequence; draft token i sees draft token j only where tree_mask[b, i, j] (its ancestors and itself: the
        diagonal set, nothing above it), and every cached token. Then accept() keeps the accepted branch.

        cu_seqlens (clattn 0.8, packed new tokens): B+1 offsets from 0, never decreasing (FlashAttention's
        cu_seqlens); x is then (cu_seqlens[B], E), sequence b's new tokens at rows cu_seqlens[b] ..
        cu_seqlens[b+1]-1 (none, or up to max_new_tokens of them), and the outputs come back the same way, (rows,
        out width): no padding is computed. Not with valid (the offsets give the counts); a tree_mask is then
        (B, n, n) with n the longest sequence's count, its rows past a sequence's count unused.

        position_ids (clattn 0.8, with rope): each new token's rotary position, (B, n), or (n,) for every sequence
        (packed: (cu_seqlens[B],), a position per row), integers in 0 .. 2^22-1; by default token t of sequence b at
        lengths[b] + t, its cache slot. Its key is rotated there once, before it is cached, so give a sequence's
        tokens their positions at every step (transformers' position_ids in generate; a sequence whose cache starts
        at position p0: p0 + lengths[b] + t)."""
        if position_ids is not None and not _rope_spec(self.rope):
            _invalid("position_ids without rope: positions only place the rotary embeddings (Decoder(rope=...))")
        if cu_seqlens is not None:
            return self._packed(x, cu_seqlens, valid, tree_mask, position_ids)
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
        tree = _tree(tree_mask, B, n)
        pos = None if position_ids is None else _positions_np("position_ids", position_ids, B, n)
        with self._lock:
            lengths = self.lengths
            for b in range(B):
                add = n if v is None else int(v[b])
                if lengths[b] + add > self.capacity:
                    _shape(f"x: sequence {b} holds {lengths[b]} tokens; {add} more exceed capacity={self.capacity}")
            out = np.full((B, n, self.out_width), np.nan, dtype=np.float32)
            args = _lib.DecodeArgs(x=_a.pointer(xa), new_tokens=n, valid=_a.pointer(v, ctypes.c_size_t),
                                   out=_a.pointer(out), x_count=xa.size, valid_count=_a.count(v), out_count=out.size,
                                   tree_mask=_a.pointer(tree, ctypes.c_uint8), tree_mask_count=_a.count(tree),
                                   rope_positions=_a.pointer(pos, ctypes.c_uint32), rope_positions_count=_a.count(pos))
            _check(_lib.decode_execute(self._dplan.handle, self._cache.handle, ctypes.byref(args)), "decoding")
            counts = [n if v is None else int(v[b]) for b in range(B)]
            self._last_step = _step_positions(lengths, counts, [b * n for b in range(B)], pos)
        return kind.out(out)

    def _packed(self, x: Any, cu_seqlens: Any, valid: Any, tree_mask: Any, position_ids: Any) -> Any:
        """A step of packed new tokens (__call__'s cu_seqlens)."""
        if valid is not None:
            _invalid("valid with cu_seqlens: the offsets give each sequence's count of new tokens")
        kind = _a.Kind(x)
        B = self.batch
        try:
            cu_list = list(cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens)
        except TypeError:
            _invalid(f"cu_seqlens: {cu_seqlens!r} is not a sequence of integers")
        if len(cu_list) != B + 1:
            _shape(f"cu_seqlens: {len(cu_list)} offsets, expected batch + 1 = {B + 1}")
        cu = np.array([_a.integer(f"cu_seqlens[{b}]", t, 0, 2**32 - 1) for b, t in enumerate(cu_list)],
                      dtype=np.uint32)
        if cu[0] != 0 or np.any(cu[1:] < cu[:-1]):
            _invalid(f"cu_seqlens: {cu_list}: offsets from 0 that never decrease")
        counts = [int(c) for c in np.diff(cu)]
        if not cu[-1]:  # no sequence brings a token: nothing to append or compute (the arguments still checked)
            if tuple(np.shape(x)) != (0, self.embed):
                _shape(f"x: shape {tuple(np.shape(x))}, expected (cu_seqlens[-1], embed) = (0, {self.embed})")
            _tree(tree_mask, B, 1)
            if position_ids is not None:
                _positions_np("position_ids", position_ids, 1, 0)
            return kind.out(np.zeros((0, self.out_width), dtype=np.float32))
        xa = _a.floats("x", x, ndim=2)
        rows, E = xa.shape
        if E != self.embed or rows != int(cu[-1]):
            _shape(f"x: shape {tuple(xa.shape)}, expected (cu_seqlens[-1], embed) = ({int(cu[-1])}, {self.embed})")
        if max(counts) > self.max_new_tokens:
            _shape(f"cu_seqlens: sequence {counts.index(max(counts))} brings {max(counts)} new tokens, but this "
                   f"Decoder takes at most max_new_tokens={self.max_new_tokens} per call")
        n = max(counts + [1])
        tree = _tree(tree_mask, B, n)
        pos = None if position_ids is None else _positions_np("position_ids", position_ids, 1, rows)
        with self._lock:
            lengths = self.lengths
            for b in range(B):
                if lengths[b] + counts[b] > self.capacity:
                    _shape(f"x: sequence {b} holds {lengths[b]} tokens; {counts[b]} more exceed "
                           f"capacity={self.capacity}")
            out = np.full((rows, self.out_width), np.nan, dtype=np.float32)
            args = _lib.DecodeArgs(x=_a.pointer(xa), new_tokens=n, out=_a.pointer(out), x_count=xa.size,
                                   out_count=out.size, tree_mask=_a.pointer(tree, ctypes.c_uint8),
                                   tree_mask_count=_a.count(tree), cu_new=_a.pointer(cu, ctypes.c_uint32),
                                   cu_new_count=cu.size, rope_positions=_a.pointer(pos, ctypes.c_uint32),
                                   rope_positions_count=_a.count(pos))
            _check(_lib.decode_execute(self._dplan.handle, self._cache.handle, ctypes.byref(args)), "decoding")
            self._last_step = _step_positions(lengths, counts, [int(c) for c in cu[:-1]], pos)
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

    def accept(self, start: Sequence[int], branches: Sequence[Sequence[int]]) -> None:
        """Keep the accepted branch of a verify step (clattn_kv_cache_accept): sequence b had start[b] tokens before
        the step; of the step's draft tokens it keeps branches[b] (their indices in the step, strictly ascending:
        the tree's root first), moved to positions start[b], start[b] + 1, ...; its length becomes start[b] +
        len(branches[b]). An empty branch drops the whole step. With rope, a branch that moves tokens (not a prefix)
        must be of the last step, right after it, and keep kept token k at the least of the positions that step gave
        its tokens + k (_check_moves): a draft tree given the length + its depths keeps any branch; a step at its
        slots (no position_ids) keeps prefixes only."""
        st = [_a.integer(f"start[{b}]", t, 0) for b, t in enumerate(list(start))]
        br = [list(x) for x in branches]
        if len(st) != self.batch or len(br) != self.batch:
            _shape(f"start and branches: {len(st)} and {len(br)} entries, expected one per sequence ({self.batch})")
        if self.rope is not None:
            self._check_moves(st, br)
        stride = max([len(x) for x in br] + [1])
        idx = (ctypes.c_size_t * (self.batch * stride))()
        for b, x in enumerate(br):
            for i, t in enumerate(x):
                idx[b * stride + i] = _a.integer(f"branches[{b}][{i}]", t, 0)
        n = ctypes.c_size_t * self.batch
        _check(_lib.kv_cache_accept(self._cache.handle, n(*st), n(*[len(x) for x in br]), idx, stride),
               "accepting a branch")

    def _check_moves(self, start: List[int], branches: List[List[int]]) -> None:
        """With rope, a branch whose tokens move (not a prefix of the step) must leave every kept key at the position
        it was rotated for: the last step's tokens of sequence b were given positions pos (their slots by default);
        kept token k (branches[b][k]) must have been at m + k, m the least of them (a draft tree at the length + its
        depths: any branch from a root; a chain at its slots: a prefix only)."""
        last = getattr(self, "_last_step", None)
        for b, x in enumerate(branches):
            if list(x) == list(range(len(x))):  # a prefix: nothing moves
                continue
            if last is None or start[b] != last[0][b]:
                _invalid(f"branches[{b}] = {list(x)} with rope moves tokens, but start[{b}] = {start[b]} is not the "
                         f"length before the last step ({None if last is None else last[0][b]}): only that step's "
                         f"positions are known here; keep a prefix, or accept right after the step")
            pos = last[1][b]
            m = min(pos) if len(pos) else 0
            for k, t in enumerate(x):
                if 0 <= t < len(pos) and pos[t] != m + k:
                    _invalid(f"branches[{b}] = {list(x)} with rope: draft {t} was rotated at position {pos[t]} and "
                             f"would sit where position {m + k} belongs; keep a prefix of a step at its slots, or "
                             f"give a draft tree's tokens the length + their depths (position_ids)")

    def share(self, dst: int, src: int, length: Optional[int] = None) -> None:
        """Sequence dst's cache becomes sequence src's first `length` tokens (default: all of them), its own dropped
        (clattn_kv_cache_share): a paged cache shares src's pages, a contiguous one copies the tokens."""
        d = _a.integer("dst", dst, 0, self.batch - 1)
        s = _a.integer("src", src, 0, self.batch - 1)
        n = self.lengths[s] if length is None else _a.integer("length", length, 0)
        _check(_lib.kv_cache_share(self._cache.handle, d, s, n), "sharing a prefix")

    def pages_of(self, b: int) -> List[int]:
        """A paged cache's pages of sequence b, in order (its block table up to its length)."""
        if not self.page_size:
            _invalid("pages_of: this Decoder's cache is contiguous (page_size=0)")
        b = _a.integer("b", b, 0, self.batch - 1)
        most = (self.capacity + self.page_size - 1) // self.page_size
        table, count = (ctypes.c_size_t * most)(), ctypes.c_size_t()
        _check(_lib.kv_cache_pages(self._cache.handle, b, table, ctypes.byref(count), None), "reading the pages")
        return list(table[:count.value])

    @property
    def pages_in_use(self) -> int:
        """A paged cache's pages held by any sequence (0 for a contiguous cache)."""
        if not self.page_size:
            return 0
        used = ctypes.c_size_t()
        _check(_lib.kv_cache_pages(self._cache.handle, 0, None, None, ctypes.byref(used)), "reading the pages")
        return used.value

    def read_cache(self) -> Tuple[np.ndarray, np.ndarray]:
        """The cache as float32 NumPy arrays: k (B, kv_heads, capacity, head_dim_qk), v (B, kv_heads, capacity,
        head_dim_v); 0 past each sequence's length."""
        k = np.zeros((self.batch, self.kv_heads, self.capacity, self.head_dim_qk), np.float32)
        v = np.zeros((self.batch, self.kv_heads, self.capacity, self.head_dim_v), np.float32)
        _check(_lib.kv_cache_read(self._cache.handle, _a.pointer(k), _a.pointer(v)), "reading the cache")
        return k, v
