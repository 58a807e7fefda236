"""The learner-side forward over `samples.collate`'s layout: per-token log-probs (and entropy) of the
responses, or the hidden states a critic reads, computed with as few token positions as the batch allows.

Three savings over running the padded batch through a causal LM:
- Shared prompt: rows that repeat a prompt (a GRPO group) run it once; its keys/values are copied to
  every row of the group and the responses continue from that cache. Gradients flow back through the
  copies into the one prompt pass, so log-probs and gradients equal the full forward's (to rounding).
- Logits only where needed: the LM head runs on the hidden states of valid response positions alone
  (a 49k-vocabulary head at prompt or padding positions is most of a small model's FLOPs), and their
  log-probs are taken in cache-sized chunks without float32 copies of the logits (`token_logprobs`).
- Trimmed padding: columns that are padding in every row of the micro-batch are dropped first.

Models whose logits are more than `lm_head(hidden)` (soft-capped or scaled logits), or whose decoder or
cache cannot be found, take the plain forward with `logits_to_keep`; results are the same, only slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from decentralized_verl.core.kv_cache import cache_keyword, returned_cache
from decentralized_verl.core.samples import TrainBatch, position_ids_from_mask
from decentralized_verl.core.token_logprobs import token_logprobs

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose logits are not the LM head's output alone."""


@dataclass(frozen=True)
class Trimmed:
    """A micro-batch's tensors with all-padding columns removed; responses keep their columns at the left."""

    prompt_ids: torch.Tensor  # [B, P']
    prompt_mask: torch.Tensor  # [B, P']
    response_ids: torch.Tensor  # [B, R']
    response_mask: torch.Tensor  # [B, R'] bool
    full_width: int
    """R of the untrimmed batch, so results can be padded back to [B, R]."""


def trim(batch: TrainBatch) -> Trimmed:
    """Drop prompt columns that are padding in every row and response columns past the longest response."""
    p = batch.prompt_length
    prompt_mask = batch.attention_mask[:, :p]
    used = prompt_mask.any(dim=0).nonzero()
    first = int(used[0]) if len(used) else max(p - 1, 0)
    response_mask = batch.response_mask.bool()
    width = int(response_mask.sum(dim=1).max()) if response_mask.numel() else 0
    width = max(width, 1)
    return Trimmed(
        prompt_ids=batch.input_ids[:, first:p],
        prompt_mask=prompt_mask[:, first:],
        response_ids=batch.input_ids[:, p : p + width],
        response_mask=response_mask[:, :width],
        full_width=int(batch.response_mask.shape[1]),
    )


def shared_prompts(prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(index of one row per distinct prompt, row -> that prompt's position), or None when no prompt repeats.

    Rows with equal left-padded prompt ids hold the same prompt, whatever group they came from.
    """
    unique, inverse = torch.unique(prompt_ids, dim=0, return_inverse=True)
    if unique.shape[0] == prompt_ids.shape[0]:
        return None
    first_row = torch.full((unique.shape[0],), -1, dtype=torch.long, device=prompt_ids.device)
    rows = torch.arange(prompt_ids.shape[0], device=prompt_ids.device)
    first_row = first_row.scatter_reduce(0, inverse, rows, reduce="amin", include_self=False)
    return first_row, inverse


def parts_of(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(decoder, lm_head) of a causal LM when its logits are exactly lm_head(decoder output), else None."""
    config = getattr(model, "config", None)
    if config is None or any(getattr(config, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or head is None or decoder is model:
        return None
    return decoder, head


def _expanded_cache(cache: Any, index: torch.Tensor) -> Any | None:
    """A fresh DynamicCache whose row i holds the keys/values of the prompt row `index[i]` (in the graph)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return DynamicCache(
        [(layer.keys.index_select(0, index), layer.values.index_select(0, index)) for layer in layers]
    )


def response_hidden(decoder: nn.Module, t: Trimmed) -> torch.Tensor:
    """[B, R', H] hidden states at the columns that predict each response token (the last prompt column
    for the first response token, response column j for token j + 1)."""
    plan = shared_prompts(t.prompt_ids)
    if plan is not None:
        hidden = _shared_hidden(decoder, t, plan)
        if hidden is not None:
            return hidden
    mask = torch.cat([t.prompt_mask, t.response_mask.long()], dim=1)
    positions = position_ids_from_mask(mask)
    ids = torch.cat([t.prompt_ids, t.response_ids], dim=1)
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    p, r = t.prompt_ids.shape[1], t.response_ids.shape[1]
    return out.last_hidden_state[:, p - 1 : p - 1 + r, :]


def _shared_hidden(
    decoder: nn.Module, t: Trimmed, plan: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor | None:
    first_row, inverse = plan
    prompt_mask = t.prompt_mask[first_row]
    prompt_positions = position_ids_from_mask(prompt_mask)
    out = decoder(
        input_ids=t.prompt_ids[first_row],
        attention_mask=prompt_mask,
        position_ids=prompt_positions,
        use_cache=True,
    )
    last = out.last_hidden_state[:, -1:, :].index_select(0, inverse)  # predicts response token 0
    r = t.response_ids.shape[1]
    if r == 1:
        return last
    cache = _expanded_cache(returned_cache(out), inverse)
    if cache is None:
        return None
    # The last response token predicts nothing, so the continuation stops one column short.
    continuation = t.response_ids[:, : r - 1]
    mask = torch.cat([t.prompt_mask, t.response_mask[:, : r - 1].long()], dim=1)
    positions = t.prompt_mask.sum(dim=1, keepdim=True) + torch.arange(r - 1, device=mask.device)
    rest = decoder(
        input_ids=continuation,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        **{cache_keyword(decoder): cache},
    )
    return torch.cat([last, rest.last_hidden_state], dim=1)


def _pad_back(values: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - values.shape[1]
    return F.pad(values, (0, missing)) if missing > 0 else values[:, :width]


def response_logprobs(
    model: nn.Module,
    batch: TrainBatch,
    temperature: float = 1.0,
    *,
    entropy: bool = False,
    plain: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([B, R] log p(response token | prefix) at `temperature`, [B, R] entropy or None); zero at padding.

    `plain` forces the model's own call over the padded batch (the baseline benchmarks compare with)."""
    parts = None if plain else parts_of(model)
    if parts is None:
        return _plain_logprobs(model, batch, temperature, entropy=entropy)
    decoder, head = parts
    t = trim(batch)
    hidden = response_hidden(decoder, t)
    valid = t.response_mask
    logits = head(hidden[valid])  # [N, V]: only positions with a response token to predict
    targets = t.response_ids[valid]
    if not entropy:
        picked = token_logprobs(logits, targets, temperature or 1.0)
        return _scattered(picked, valid, t.full_width), None
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    per_token = -(log_probs.exp() * log_probs).sum(dim=-1)
    return _scattered(picked, valid, t.full_width), _scattered(per_token, valid, t.full_width)


def _scattered(values: torch.Tensor, valid: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] with `values` (one per True in `valid`, row-major) at their positions, zero elsewhere."""
    out = torch.zeros(valid.shape, dtype=values.dtype, device=values.device).masked_scatter(valid, values)
    return _pad_back(out, width)


def _plain_logprobs(
    model: nn.Module, batch: TrainBatch, temperature: float, *, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = _response_logits(model, batch, temperature)
    logp = _token_logprobs(logits, batch)
    ent = None
    if entropy:
        log_probs = torch.log_softmax(logits, dim=-1)
        ent = -(log_probs.exp() * log_probs).sum(dim=-1) * batch.response_mask
    return logp, ent


def _response_logits(model, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits predicting each response token ([B, R, V]) from the model's own call, over the temperature.

    Responses are the last R columns, so only the last R + 1 positions' logits are computed
    (`logits_to_keep`): with a 49k vocabulary the prompt positions' logits would dominate memory.
    """
    r = batch.response_mask.shape[1]
    inputs = {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": batch.position_ids,
        "use_cache": False,
    }
    try:
        out = model(**inputs, logits_to_keep=r + 1)
        logits = out.logits[:, :r, :]
    except TypeError:  # a model without logits_to_keep
        out = model(**inputs)
        p = batch.prompt_length
        logits = out.logits[:, p - 1 : p - 1 + r, :]
    logits = logits.float()
    return logits / temperature if temperature and temperature != 1.0 else logits


def _token_logprobs(logits: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    """log p(response token) from response logits (already over the temperature), zero at padding; through
    the same kernel as the trimmed forward, so the two forwards agree."""
    p = batch.prompt_length
    rows, width, vocab = logits.shape
    targets = batch.input_ids[:, p : p + width]
    logp = token_logprobs(logits.reshape(-1, vocab), targets.reshape(-1)).view(rows, width)
    return logp * batch.response_mask


def response_values(backbone: nn.Module, value_head: nn.Module, batch: TrainBatch) -> torch.Tensor:
    """[B, R] critic values V(s_t) read at the same columns as the log-probs; zero at padding."""
    t = trim(batch)
    values = value_head(response_hidden(backbone, t)).squeeze(-1).float() * t.response_mask
    return _pad_back(values, t.full_width)


def positions_computed(batch: TrainBatch) -> int:
    """Token positions the decoder runs for `batch` (shared prompts once): what micro-batch packing counts."""
    t = trim(batch)
    plan = shared_prompts(t.prompt_ids)
    rows, p, r = t.prompt_ids.shape[0], t.prompt_ids.shape[1], t.response_ids.shape[1]
    if plan is None:
        return rows * (p + r)
    return int(plan[0].shape[0]) * p + rows * (r - 1)


class ForwardChooser:
    """Which forward a learner keeps using: the shared-prompt one, or the model's own call.

    Both give the same numbers, so the choice is speed alone. On a CPU the shared forward wins whenever a
    prompt repeats (compute-bound: fewer positions, less time). On a GPU a small micro-batch is bound by
    kernel launches, and the shared forward's second pass can cost more than the positions it saves
    (measured on an H100: 0.43x at 64 rows of 75 + 32 tokens, 2.1x at 1,000-token prompts). So on a GPU
    the first micro-batches are timed both ways (forward + backward, per padded position, since the
    micro-batches differ in size) and the faster is kept for the rest of the run.
    """

    def __init__(self, device_type: str, *, trials: int = 2) -> None:
        self.tune = device_type != "cpu"
        self.trials = trials
        self.seconds: dict[bool, list[float]] = {True: [], False: []}
        self.choice: bool | None = None if self.tune else False
        """`plain` for every call once decided (False: the shared forward)."""

    def plain_next(self) -> bool:
        if self.choice is not None:
            return self.choice
        return len(self.seconds[False]) > len(self.seconds[True])  # alternate, shared first

    def record(self, plain: bool, seconds: float, positions: int) -> None:
        if self.choice is not None:
            return
        self.seconds[plain].append(seconds / max(positions, 1))
        if min(len(v) for v in self.seconds.values()) >= self.trials:
            per_position = {k: sorted(v)[len(v) // 2] for k, v in self.seconds.items()}
            self.choice = per_position[True] < per_position[False]
