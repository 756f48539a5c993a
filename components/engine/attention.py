"""The embedded engine's attention: transformers' SDPA, without repeating the key/value heads in a masked prefill.

transformers' ``sdpa`` implementation copies each layer's keys and values ``num_attention_heads /
num_key_value_heads`` times (``repeat_kv``) whenever an attention mask is passed and more than one query is
forwarded, i.e. on every prefill chunk the engine runs (it always passes a mask: rows are left-padded and a
chunk after a cached prefix is not upper-left causal). With a long cached history that copy is the whole KV
cache, three times over for SmolLM2, per layer per chunk. On CPU, torch's SDPA takes grouped heads with a mask
directly (``enable_gqa``), so this implementation does that; everything else (one query token, no mask, other
devices, where masked GQA falls back to the slow math kernel) goes to transformers' own function unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "rein_sdpa"  # the ``attn_implementation`` the engine loads its model with


def _attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    if not (
        grouped and plain and attention_mask is not None and query.shape[2] > 1 and query.device.type == "cpu"
    ):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make ``NAME`` a transformers attention implementation (idempotent); returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
