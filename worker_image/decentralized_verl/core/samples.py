"""What flows through one training step, and how a list of samples becomes padded tensors.

Layout (veRL's): prompts are LEFT-padded to a common length P and responses RIGHT-padded to R, so the
response tokens of every row sit in columns P..P+R-1 and every per-token quantity is a [B, R] tensor
with one response mask. A multi-turn episode's response is everything after its first prompt, the
environment's observations included; its `loss_mask` (0 on those) becomes the batch's `loss_mask`, so the
loss counts only the tokens the policy generated while the forward still attends to all of them.
Pure: no I/O, no model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True)
class Prompt:
    """One prompt of a step, tokenized once by the coordinator."""

    prompt_id: str
    group: int
    """Index of the prompt within the step; samples of one prompt share it (GRPO/RLOO groups)."""
    token_ids: tuple[int, ...]
    text: str
    ground_truth: str = ""
    """The reference answer, or the code tests as JSON."""
    environment: bool = False
    """The prompt starts a multi-turn episode: the rollout worker's environment plays on `ground_truth`
    (and `text`), so they travel with the work item; otherwise only the token ids do."""


@dataclass(frozen=True)
class Sample:
    """One completion of a prompt, filled in as it moves through the step."""

    prompt: Prompt
    sample_index: int
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    text: str
    policy_version: int
    worker_id: str = ""
    score: float | None = None
    score_reason: str = ""
    ref_logprobs: tuple[float, ...] | None = None
    values: tuple[float, ...] | None = None
    extra: dict[str, float] = field(default_factory=dict)
    loss_mask: tuple[int, ...] | None = None
    """Per response token: 1 where the policy generated it, 0 where an environment inserted it (a
    multi-turn episode's observations and chat-template tokens); None: every token is the policy's."""
    turns: tuple[str, ...] = ()
    """A multi-turn episode's model turns as generated, what its environment was shown (the trusted side
    replays the environment on them to score the episode)."""
    end_reason: str = ""
    """Why a multi-turn episode ended (`max_turns`, `token_budget`, the environment's reason, ...)."""
    parts: tuple[tuple[str, int, int], ...] = ()
    """A response continued from another worker's prefix: (worker, policy version, tokens) of each part,
    in order; `policy_version` is then the oldest of them. Empty: one worker and version made it all.
    Each token's log-prob is its own part's, so the learner corrects it like any off-policy token."""

    @property
    def key(self) -> tuple[str, int]:
        """Identity of a sample in a step: a prompt and its sample index, answered exactly once."""
        return (self.prompt.prompt_id, self.sample_index)

    def with_(self, **changes: object) -> Sample:
        return replace(self, **changes)


@dataclass
class TrainBatch:
    """Padded tensors for a list of samples (see the module docstring for the layout)."""

    input_ids: torch.Tensor  # [B, P+R]
    attention_mask: torch.Tensor  # [B, P+R]
    position_ids: torch.Tensor  # [B, P+R]
    response_mask: torch.Tensor  # [B, R] float 0/1
    old_logprobs: torch.Tensor  # [B, R]
    scores: torch.Tensor  # [B]
    group_index: torch.Tensor  # [B] long
    truncated: torch.Tensor  # [B] bool
    response_lengths: torch.Tensor  # [B] long
    prompt_length: int
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None  # [B, R], set by the coordinator before the update
    returns: torch.Tensor | None = None  # [B, R], the critic's targets
    rollout_weights: torch.Tensor | None = None  # [B, R], rollout-correction weights (set by the trainer)
    loss_mask: torch.Tensor | None = None
    """[B, R] the tokens the loss counts, where rollout-correction rejection left out some of
    `response_mask`'s; the forward still reads `response_mask`, the responses' layout."""
    parity_rows: torch.Tensor | None = None
    """[B] bool: rows the learner's current weights generated (their rollout log-probs should match the
    learner's); None: every row."""

    def trained_mask(self) -> torch.Tensor:
        """The tokens the loss counts: response tokens that `loss_mask` (when set) keeps."""
        return self.response_mask if self.loss_mask is None else self.loss_mask * self.response_mask

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: torch.Tensor) -> TrainBatch:
        """Rows `index` (a long tensor) of every tensor, for mini/micro-batches."""
        picked = {
            name: (value[index] if hasattr(value, "shape") and value.dim() > 0 else value)
            for name, value in vars(self).items()
            if name != "prompt_length"
        }
        return TrainBatch(prompt_length=self.prompt_length, **picked)

    def to(self, device: torch.device | str) -> TrainBatch:
        """Every tensor on `device` (this batch itself when they are there already): batches are collated
        on the CPU, where samples arrive, and a learner on a GPU computes them there."""
        device = torch.device(device)
        if self.input_ids.device == device:
            return self
        moved = {
            name: (value.to(device) if hasattr(value, "to") and hasattr(value, "shape") else value)
            for name, value in vars(self).items()
        }
        return TrainBatch(**moved)


def _pad_rows(rows: list[tuple[float, ...] | tuple[int, ...]], width: int, value: float, dtype, left: bool):
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if not row:
            continue
        tensor = torch.tensor(row, dtype=dtype)
        if left:
            out[i, width - len(row) :] = tensor
        else:
            out[i, : len(row)] = tensor
    return out


def collate(samples: list[Sample], pad_token_id: int) -> TrainBatch:
    """Stack samples into the left-prompt / right-response layout."""
    if not samples:
        raise ValueError("collate: no samples")
    prompts = [s.prompt.token_ids for s in samples]
    responses = [s.response_ids for s in samples]
    width_p = max(len(p) for p in prompts)
    width_r = max(1, max(len(r) for r in responses))
    prompt_ids = _pad_rows(prompts, width_p, pad_token_id, torch.long, left=True)
    response_ids = _pad_rows(responses, width_r, pad_token_id, torch.long, left=False)
    prompt_mask = _pad_rows([(1,) * len(p) for p in prompts], width_p, 0, torch.long, left=True)
    response_mask = _pad_rows([(1,) * len(r) for r in responses], width_r, 0, torch.long, left=False)
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    positions = position_ids_from_mask(attention)
    lengths = torch.tensor([len(r) for r in responses], dtype=torch.long)

    def per_token(name: str) -> torch.Tensor | None:
        rows = [getattr(s, name) for s in samples]
        if any(row is None for row in rows):
            return None
        return _pad_rows(rows, width_r, 0.0, torch.float32, left=False)

    loss_mask = None
    if any(s.loss_mask is not None for s in samples):
        rows = [s.loss_mask if s.loss_mask is not None else (1,) * len(s.response_ids) for s in samples]
        for s, row in zip(samples, rows, strict=True):
            if len(row) != len(s.response_ids):
                raise ValueError(
                    f"collate: sample {s.key}: {len(row)} loss-mask entries for {len(s.response_ids)} tokens"
                )
        loss_mask = _pad_rows(rows, width_r, 0, torch.float32, left=False)
    return TrainBatch(
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        attention_mask=attention,
        position_ids=positions,
        response_mask=response_mask.float(),
        old_logprobs=per_token("logprobs"),
        scores=torch.tensor([float(s.score or 0.0) for s in samples], dtype=torch.float32),
        group_index=torch.tensor([s.prompt.group for s in samples], dtype=torch.long),
        truncated=torch.tensor([s.finish_reason == "length" for s in samples], dtype=torch.bool),
        response_lengths=lengths,
        prompt_length=width_p,
        ref_logprobs=per_token("ref_logprobs"),
        values=per_token("values"),
        loss_mask=loss_mask,
    )


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` uses; without them a left-padded row sees shifted
    rotary positions and its log-probs differ from the same row unpadded. Every forward of the package
    (learner, reference, critic, the stages) numbers positions this way."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
