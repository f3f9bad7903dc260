"""clattn: transformer attention on any OpenCL device, from NumPy or PyTorch.

    import clattn
    clattn.devices()                                   # ref and every OpenCL device
    attn = clattn.Attention(heads=2, w_query=..., w_key=..., w_value=..., w_out=..., causal=True)
    out, weights = attn(x, need_weights=True)          # x (B, T, E) or (T, E)
    out, avg = attn.forward(q, k, v)                   # nn.MultiheadAttention's call
    layer = clattn.EncoderLayer(heads=2, ...)          # torch.nn.TransformerEncoderLayer, eval mode
    clattn.from_torch(torch_module)                    # nn.MultiheadAttention / nn.TransformerEncoderLayer
    attn = clattn.Attention(heads=32, kv_heads=8, ..., causal=True, rope=clattn.Rope(theta=500000.0))  # Llama
    dec = clattn.Decoder(heads=32, kv_heads=8, w_query=..., ..., batch=1, capacity=4096, max_new_tokens=512)
    out = dec(prompt)                                  # prefill (B, n, E); then dec(x_next) per token

Inputs are NumPy arrays (any floating dtype, converted to float32; results are float32 NumPy arrays) or
torch tensors on the CPU (float32 as is; float16 and bfloat16 widened to float32 exactly, computed in
float32, and the results rounded back to the input's dtype; float64 refused, as clattn would round it;
results are detached CPU tensors: clattn records no autograd). Every shape is checked against the module
before the library is called, and every failure raises a subclass of clattn.Error (ShapeMismatchError and
InvalidArgumentError are ValueErrors) naming the Python argument. Plans (the library's compiled form of one
input shape) are made on first use and kept in a least-recently-used cache of plan_cache_size entries.
The first plan on an OpenCL device may compile kernels for seconds: the "clattn" logger says so (a
warning, once per device); later runs load them from the kernel cache.
"""
from __future__ import annotations

import logging

from ._errors import (BuildFailureError, DeviceAllocationError, Error, InvalidArgumentError, InvalidDeviceSpecError,
                      NoDeviceError, OpenCLError, OutOfHostMemoryError, ShapeMismatchError, SizeOverflowError,
                      TooLargeForDeviceError, UnsupportedError)

__all__ = ["Error", "InvalidArgumentError", "ShapeMismatchError", "SizeOverflowError", "TooLargeForDeviceError",
           "OutOfHostMemoryError", "DeviceAllocationError", "BuildFailureError", "UnsupportedError", "NoDeviceError",
           "InvalidDeviceSpecError", "OpenCLError", "devices", "cores", "selftest", "version", "Attention", "Decoder",
           "EncoderLayer", "Rope", "from_torch", "plot_attention"]
__version__ = "0.7.0"

logger = logging.getLogger("clattn")  # the library's notices (kernels compiled, the kernel cache unused, CLATTN_CORE)

# the package's modules, by concern; the public names are these
from ._device import cores, devices, selftest, version  # noqa: E402
from ._rope import Rope  # noqa: E402
from ._attention import Attention  # noqa: E402
from ._decoder import Decoder  # noqa: E402
from ._encoder import EncoderLayer  # noqa: E402
from ._torch import from_torch  # noqa: E402
from ._plot import plot_attention  # noqa: E402

for _public in (Attention, Decoder, EncoderLayer, Rope, from_torch, plot_attention, devices, cores, version):
    _public.__module__ = __name__  # where users import them from (repr, pickling, help)
del _public
