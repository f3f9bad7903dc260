"""clattn inside Hugging Face transformers (>= 4.53): an attention implementation any model can select.

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

Refused, with the keyword named (never silently ignored): `s_aux` / `sinks` (attention sinks, gpt-oss), `softcap`
(Gemma 2), `output_attentions=True` (clattn's core returns no weights here). `position_bias` (T5-style relative
biases) goes in as a float mask.
"""
from typing import Any, Optional

import torch

from ._errors import UnsupportedError
from .functional import attend

__all__ = ["register", "attention_forward", "REFUSED_KEYWORDS"]

REFUSED_KEYWORDS = {
    "s_aux": "attention sinks (gpt-oss's s_aux): clattn has no sink logits yet",
    "sinks": "attention sinks: clattn has no sink logits yet",
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
                 window=window, scale=scaling, dropout_p=float(dropout or 0.0), device=clattn_device)
    return out, None


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
