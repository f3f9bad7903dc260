"""clattn.plot_attention: heat maps of attention weights."""
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
