"""clattn.Rope: rotary position embeddings as clattn_attention_desc.rope takes them (no torch needed: clattn.Attention
and clattn.Decoder take one too, and clattn.functional re-exports it)."""
import ast
import dataclasses
import math
from typing import Any, Optional

from . import _lib
from ._errors import invalid as _invalid
from ._errors import shape as _shape


@dataclasses.dataclass(frozen=True)
class Rope:
    """Rotary position embeddings (RoFormer), applied by clattn to query and key inside the call
    (clattn_attention_desc.rope): the first `dims` values of each head (0: all; even) as pairs, pair i of the token at
    position p turned by the angle p * theta^(-2i/dims). kind "half": pairs (i, i + dims/2), transformers'
    rotate_half (GPT-NeoX, Llama, Mistral, Qwen); "interleaved": pairs (2i, 2i + 1) (GPT-J, RoFormer). scaling None,
    "linear" (positions / factor), "ntk" (theta * factor^(dims/(dims-2))) or "yarn" (transformers' "yarn" with
    original_max_position, its beta_fast 32 and beta_slow 1, cos and sin times 0.1 ln(factor) + 1). Positions count
    from 0 in each batch entry (each sequence of varlen_attention): query row i at i, key row j at j. cos and sin are
    computed in float64 once per plan (transformers computes them in float32: at positions of thousands its angles
    differ from these by more than float32 rounding)."""
    kind: str = "half"
    dims: int = 0
    theta: float = 10000.0
    scaling: Optional[str] = None
    factor: float = 1.0
    original_max_position: int = 0

    def __post_init__(self):
        if self.kind not in _lib.ROPE_KINDS:
            _invalid(f"Rope(kind={self.kind!r}): the kinds are 'half' (pairs i, i + dims/2) and 'interleaved' "
                     f"(pairs 2i, 2i + 1)")
        if self.scaling not in _lib.ROPE_SCALINGS:
            _invalid(f"Rope(scaling={self.scaling!r}): None, 'linear', 'ntk' or 'yarn'")
        for name in ("theta", "factor"):
            v = float(getattr(self, name))
            if not math.isfinite(v):
                _invalid(f"Rope({name}={v}): must be finite")
        if int(self.dims) < 0 or int(self.original_max_position) < 0:
            _invalid(f"Rope(dims={self.dims}, original_max_position={self.original_max_position}): must be >= 0")


def _rope_spec(rope: Any) -> str:
    """A Rope as the plans' key and the custom operator's argument: '' for none."""
    if rope is None:
        return ""
    if not isinstance(rope, Rope):
        _invalid(f"rope: a {type(rope).__name__}; pass clattn.Rope(...) or None")
    return repr((rope.kind, int(rope.dims), float(rope.theta), rope.scaling, float(rope.factor),
                 int(rope.original_max_position)))


def _rope_struct(spec: str) -> "_lib.Rope":
    """The library's clattn_rope for a spec of _rope_spec (the library checks the numbers)."""
    if not spec:
        return _lib.Rope()
    kind, dims, theta, scaling, factor, orig = ast.literal_eval(spec)
    return _lib.Rope(kind=_lib.ROPE_KINDS[kind], dims=dims, theta=theta, scaling=_lib.ROPE_SCALINGS[scaling],
                     factor=factor, original_max_position=orig)


MAX_POSITION = 2 ** 22 - 1  # CLATTN_ROPE_MAX_POSITION: the largest position a row may be given


def _positions_np(name: str, ids: Any, B: int, n: int) -> "np.ndarray":
    """One position_ids argument of clattn.Attention as the library reads it: a contiguous uint32 array of B*n
    positions, from (B, n), or (1, n) or (n,) for every batch entry; integers in 0 .. MAX_POSITION."""
    import numpy as np

    a = np.asarray(ids)
    if not np.issubdtype(a.dtype, np.integer):  # (bool is not an integer type to NumPy)
        _invalid(f"{name}: dtype {a.dtype}; positions are integers")
    if a.ndim == 1:
        a = a[None]
    if a.ndim == 2 and a.shape[0] == 1:
        a = np.broadcast_to(a, (B, a.shape[1]))
    if a.shape != (B, n):
        _shape(f"{name}: {a.shape}; (batch, length) = ({B}, {n}), or ({n},) for every batch entry")
    if a.size and (int(a.min()) < 0 or int(a.max()) > MAX_POSITION):
        _invalid(f"{name}: positions from {int(a.min())} to {int(a.max())}; clattn takes 0 .. {MAX_POSITION}")
    return np.ascontiguousarray(a, dtype=np.uint32).reshape(-1)
