"""Attention for small grouped-query models on a CPU: each key/value head's queries attend as one block.

On a CPU, PyTorch's fused SDPA kernel is tuned for long sequences. For the shapes RL fine-tuning of a
small model produces (a decode step's one query per row; a shared-prompt micro-batch's ~30 response
queries over ~100 keys), it spends more on blocking and, with a padding mask, on the copies of
``repeat_kv`` (3 key/value heads widened to 9 for SmolLM2) than on the arithmetic. Measured on 2 cores
(`benchmarks/cpu_kernels.py`), bf16, forward + backward over 16 rows x 31 queries x 106 keys: 14.9 ms
through transformers' SDPA path, 1.6 ms here; a 64-row decode step 0.47 vs 0.18 ms.

Here the ``groups`` query heads that share a key/value head are stacked into one [groups x queries]
block, so the keys and values are read in place (no copies), with two batched matmuls and a float32
softmax, exactly the arithmetic of transformers' eager attention. The mask is eager's additive float
mask (0 or the dtype's minimum), so a row that attends to nothing (left padding) stays finite.

Used where it is known to be the same computation: causal LMs whose attention is plain scaled
dot-product over an additive mask (``SUPPORTED_MODEL_TYPES``), on a CPU. Calls that carry anything else
(logit soft-capping, attention sinks, position biases) go to transformers' SDPA function unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

NAME = "dverl_grouped"
"""The name registered with transformers' attention and mask interfaces."""

SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Model types whose attention modules compute plain softmax(q k^T * scaling + mask) v."""

_UNSUPPORTED_KWARGS = ("softcap", "position_bias", "s_aux", "sinks")


def grouped_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """[B, Q, H, D] attention output for query [B, H, Q, D] and key/value [B, KV, K, D] (H = KV x groups)."""
    if any(kwargs.get(name) is not None for name in _UNSUPPORTED_KWARGS):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    stacked = (query * scale).reshape(batch, kv_heads, groups * q_len, dim)
    scores = torch.matmul(stacked, key.transpose(-1, -2)).view(batch, kv_heads, groups, q_len, k_len)
    mask = _additive_mask(attention_mask, module, scores, q_len, k_len, is_causal)
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout, training=True)
    out = torch.matmul(probs.view(batch, kv_heads, groups * q_len, k_len), value)
    return out.view(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous(), None


def _additive_mask(
    mask: Tensor | None,
    module: torch.nn.Module,
    scores: Tensor,
    q_len: int,
    k_len: int,
    is_causal: bool | None,
) -> Tensor | None:
    """The mask in the [B, KV or 1, groups or 1, Q, K] layout of the stacked scores, as 0 / dtype-minimum."""
    low = torch.finfo(scores.dtype).min
    if mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if not causal or q_len == 1:
            return None
        # Queries are the last q_len positions of the k_len keys (a cache may hold earlier ones).
        rows = torch.arange(k_len - q_len, k_len, device=scores.device)[:, None]
        allowed = torch.arange(k_len, device=scores.device)[None, :] <= rows
        zeros = torch.zeros((q_len, k_len), dtype=scores.dtype, device=scores.device)
        return zeros.masked_fill(~allowed, low)
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device).masked_fill(~mask, low)
    mask = mask[..., :k_len].to(scores.dtype)
    if mask.dim() == 4 and mask.shape[1] != 1:  # per-head mask [B, H, Q, K]
        return mask.reshape(mask.shape[0], scores.shape[1], scores.shape[2], q_len, k_len)
    return mask.unsqueeze(2) if mask.dim() == 4 else mask


def register() -> None:
    """Make ``NAME`` known to transformers (attention function and its mask: eager's additive one)."""
    AttentionInterface.register(NAME, grouped_attention)
    AttentionMaskInterface.register(NAME, eager_mask)


def use_grouped_attention(model: Any) -> bool:
    """Switch ``model`` to grouped attention when it is on a CPU and of a supported type; True if switched.

    The choice is the model's config, so the learner's forward and the rollout's decode loop both follow it.
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return False
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type != "cpu":
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
