"""Inputs and outputs at the Python edge: NumPy arrays and torch tensors in, the same kind out; every
number range-checked before it reaches ctypes (which would wrap it silently)."""
from __future__ import annotations

import ctypes
import math
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from ._errors import invalid, shape

SIZE_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1
U64_MAX = 2 ** 64 - 1
F32_MAX = float(np.finfo(np.float32).max)


def integer(name: str, v: Any, lo: int = 0, hi: int = SIZE_MAX) -> int:
    """v as a Python int in lo .. hi; bools, floats and anything else are refused."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        invalid(f"{name}: {v!r} is not an integer")
    v = int(v)
    if v < lo or v > hi:
        invalid(f"{name}: {v} is out of range ({lo} .. {hi})")
    return v


def real(name: str, v: Any, lo: float = -F32_MAX, hi: float = F32_MAX, hi_open: bool = False) -> float:
    """v as a finite float that float32 holds, in [lo, hi] (or [lo, hi))."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        invalid(f"{name}: {v!r} is not a number")
    f = float(v)
    if not math.isfinite(f) or f < lo or f > hi or (hi_open and f >= hi):
        invalid(f"{name}: {v!r} is out of range ({lo:g} .. {hi:g}{')' if hi_open else ']'}")
    return f


def flag(name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_, int, np.integer)) or int(v) not in (0, 1):
        invalid(f"{name}: {v!r}, expected True or False")
    return bool(v)


def choice(name: str, v: Any, options: Sequence[str]) -> str:
    if not isinstance(v, str) or v not in options:
        invalid(f"{name}: {v!r}, expected one of {', '.join(repr(o) for o in options)}")
    return v


# ---------------------------------------------------------------- torch, when it is given

def is_tensor(a: Any) -> bool:
    """A torch.Tensor (without importing torch when the caller never used it)."""
    t = type(a)
    return t.__module__.split(".")[0] == "torch" and hasattr(a, "detach") and hasattr(a, "dtype")


class Kind:
    """How an input came (NumPy or torch, and the torch dtype): results go back the same way."""

    def __init__(self, a: Any):
        self.torch_dtype = a.dtype if is_tensor(a) else None

    def out(self, arr: Optional[np.ndarray]):
        if arr is None or self.torch_dtype is None:
            return arr
        import torch
        t = torch.from_numpy(arr)
        return t if self.torch_dtype == torch.float32 else t.to(self.torch_dtype)


def _tensor_to_numpy(name: str, t: Any, floating: bool) -> np.ndarray:
    import torch
    if t.device.type != "cpu":
        invalid(f"{name}: a tensor on {t.device}; clattn takes CPU tensors (it runs on its own device, "
                f"chosen with device=...): pass {name}.cpu()")
    if t.layout != torch.strided:
        invalid(f"{name}: a {t.layout} tensor; pass a dense one ({name}.to_dense())")
    t = t.detach()
    if floating:
        if t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()  # exact: every half and bfloat16 value is a float32 value
        elif t.dtype == torch.float64:
            invalid(f"{name}: a float64 tensor; clattn computes in float32 and would round it silently: "
                    f"pass {name}.float() (or module.float())")
        elif t.dtype != torch.float32:
            invalid(f"{name}: a {t.dtype} tensor; expected float32 (float16 and bfloat16 are widened)")
    elif t.dtype in (torch.float16, torch.bfloat16):  # a float mask: widened exactly
        t = t.float()
    if hasattr(t, "resolve_neg"):
        t = t.resolve_neg()
    if hasattr(t, "resolve_conj"):
        t = t.resolve_conj()
    try:
        return t.contiguous().numpy()
    except (TypeError, RuntimeError) as e:  # a dtype NumPy has no equivalent for
        invalid(f"{name}: a {t.dtype} tensor clattn cannot read ({e})")


def _asarray(name: str, a: Any) -> np.ndarray:
    try:
        return np.asarray(a)
    except (ValueError, TypeError) as e:
        invalid(f"{name}: not an array ({e})")


def floats(name: str, a: Any, ndim: Union[None, int, Tuple[int, ...]] = None) -> Optional[np.ndarray]:
    """A C-contiguous float32 array of a (None stays None). NumPy: any floating dtype converts. torch:
    float32 as is, float16/bfloat16 widened (exactly), float64 and non-floating dtypes refused."""
    if a is None:
        return None
    arr = _tensor_to_numpy(name, a, True) if is_tensor(a) else _asarray(name, a)
    if arr.dtype.kind != "f":
        invalid(f"{name}: dtype {arr.dtype} is not a floating type (use float32)")
    return np.ascontiguousarray(_checked(name, arr, ndim), dtype=np.float32)


def mask(name: str, a: Any, want: Tuple[int, ...], allow_float: bool, meaning: str):
    """(kind, array): ("bool", uint8 array with 1 = not allowed) or ("float", float32 array added to the scores)."""
    arr = _tensor_to_numpy(name, a, False) if is_tensor(a) else _asarray(name, a)
    if arr.dtype == np.bool_ or arr.dtype.kind in "iu":
        kind = "bool"
    elif arr.dtype.kind == "f" and allow_float:
        kind = "float"
    else:
        invalid(f"{name}: dtype {arr.dtype}; expected bool ({meaning})"
                + (" or a float mask added to the scores" if allow_float else ""))
    if tuple(arr.shape) != tuple(want):
        shape(f"{name}: shape {tuple(arr.shape)}, expected {tuple(want)}")
    if kind == "bool":
        return kind, np.ascontiguousarray(arr != 0, dtype=np.uint8)
    return kind, np.ascontiguousarray(arr, dtype=np.float32)


def pointer(a: Optional[np.ndarray], ctype=ctypes.c_float):
    return None if a is None else a.ctypes.data_as(ctypes.POINTER(ctype))


def count(a: Optional[np.ndarray]) -> int:
    return 0 if a is None else int(a.size)


# ---------------------------------------------------------------- half precision (a module's dtype, clattn 0.7)

DTYPES = ("float32", "float16", "bfloat16")  # a module's element types; bfloat16 arrays are uint16 bit patterns


def dtype_name(name: str, v: Any) -> str:
    """A dtype as its name: "float32", "float16" or "bfloat16" (also np.float16/np.float32 and torch's dtypes)."""
    if isinstance(v, str) and v in DTYPES:
        return v
    s = str(v)
    for d in DTYPES:
        if s in (d, "torch." + d) or (d != "bfloat16" and s == str(np.dtype(d))):
            return d
    try:
        if np.dtype(v).name in ("float32", "float16"):
            return np.dtype(v).name
    except TypeError:
        pass
    invalid(f"{name}: {v!r}, expected one of {', '.join(repr(d) for d in DTYPES)}")


def dtype_code(d: str) -> int:
    return DTYPES.index(d)


def _storage(d: str):
    return {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[d]


def convert(a: np.ndarray, frm: str, to: str) -> np.ndarray:
    """a (C-contiguous, of dtype frm's storage) in type `to`, rounded as clattn's plans round (nearest even)."""
    from ._errors import check
    out = np.empty(a.shape, dtype=_storage(to))
    if a.size:
        check(_lib_convert(a.ctypes.data, dtype_code(frm), out.ctypes.data, dtype_code(to), a.size),
              "converting an array's dtype")
    return out


def _lib_convert(*args):
    from . import _lib
    return _lib.dtype_convert(*args)


def typed(name: str, a: Any, d: str, ndim=None) -> np.ndarray:
    """a as a C-contiguous array of dtype d's storage (float32, float16, or bfloat16 as uint16 bits): a torch tensor or
    NumPy array already of that type as it is (no copy when contiguous), any other floating input rounded to it."""
    if d == "float32":
        return floats(name, a, ndim)
    if a is not None and is_tensor(a):
        import torch
        want = torch.float16 if d == "float16" else torch.bfloat16
        if a.dtype == want:
            t = a.detach()
            if t.device.type != "cpu":
                invalid(f"{name}: a tensor on {t.device}; clattn takes CPU tensors: pass {name}.cpu()")
            t = t.contiguous()
            arr = t.numpy() if d == "float16" else t.view(torch.int16).numpy().view(np.uint16)
            return _checked(name, arr, ndim)
    elif d == "float16" and isinstance(a, np.ndarray) and a.dtype == np.float16:
        return _checked(name, np.ascontiguousarray(a), ndim)
    f = floats(name, a, ndim)
    return None if f is None else convert(f, "float32", d)


def _checked(name: str, arr: np.ndarray, ndim) -> np.ndarray:
    """arr, after its rank (one of ndim, when given) and its dimensions (none 0) are checked."""
    if ndim is not None:
        allowed = ndim if isinstance(ndim, tuple) else (ndim,)
        if arr.ndim not in allowed:
            shape(f"{name}: {arr.ndim}-D array of shape {tuple(arr.shape)}, expected "
                  f"{' or '.join(f'{n}-D' for n in allowed)}")
    if 0 in arr.shape:
        shape(f"{name}: shape {tuple(arr.shape)} is empty; every dimension must be at least 1")
    return arr


def typed_result(arr: Optional[np.ndarray], d: str, kind: "Kind"):
    """A result in dtype d's storage back as the input came: a torch tensor of the input's dtype (a half input and
    module: the array's own memory, no copy), else NumPy: float16 as is, bfloat16 widened to float32 (NumPy has no
    bfloat16)."""
    if arr is None or d == "float32":
        return kind.out(arr)
    if kind.torch_dtype is not None:
        import torch
        t = torch.from_numpy(arr) if d == "float16" else torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return t if t.dtype == kind.torch_dtype else t.to(kind.torch_dtype)
    return arr if d == "float16" else convert(arr, "bfloat16", "float32")
