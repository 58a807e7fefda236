"""What an advantage estimator is given: one type for every estimator, so the trainer calls any of them
blindly (`registry.ADVANTAGE_ESTIMATORS`). Its own module, below both the registry that names the
estimators' signature and the estimators themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from decentralized_verl.algorithms.masking import as_bool_mask, check_groups, check_same_shape, zero_masked


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything any estimator may need; each estimator says which fields it requires.

    response_mask: [B, T] 0/1, the tokens that are trained on (holes allowed).
    token_rewards: [B, T] per-token rewards (e.g. score on the last token minus a KL penalty).
    scores:        [B] one outcome score per sample (verifiable reward, reward model).
    values:        [B, T] critic values (gae only).
    group_index:   [B] integer prompt-group id per sample (group estimators; sizes >= 2, uneven ok).
    """

    response_mask: Tensor
    token_rewards: Tensor | None = None
    scores: Tensor | None = None
    values: Tensor | None = None
    group_index: Tensor | None = None

    def mask(self) -> Tensor:
        check_same_shape(self.response_mask, token_rewards=self.token_rewards, values=self.values)
        return as_bool_mask(self.response_mask, name="response_mask")

    def _check_scores(self) -> Tensor:
        if self.scores is None:
            raise ValueError("AdvantageInputs: needs token_rewards or scores")
        batch = self.response_mask.shape[0]
        if self.scores.shape != (batch,):
            raise ValueError(f"scores: expected shape [{batch}], got {tuple(self.scores.shape)}")
        if not self.scores.is_floating_point():
            raise ValueError(f"scores: expected a float tensor, got {self.scores.dtype}")
        return self.scores

    def sample_scores(self, mask: Tensor) -> Tensor:
        """[B] outcome per sample: masked sum of token rewards if given, else `scores`."""
        if self.token_rewards is not None:
            return zero_masked(self.token_rewards, mask).sum(dim=1)
        return self._check_scores()

    def rewards_per_token(self, mask: Tensor) -> Tensor:
        """[B, T] token rewards if given, else each score placed on its sample's last valid token."""
        if self.token_rewards is not None:
            return zero_masked(self.token_rewards, mask)
        scores = self._check_scores()
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(mask, positions, -1).max(dim=1).values
        rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
        rows = torch.nonzero(last >= 0).squeeze(1)
        rewards[rows, last[rows]] = scores[rows]
        return rewards

    def groups(self) -> tuple[Tensor, Tensor]:
        """(dense group id per sample [B], size per group [G]); groups of one are allowed."""
        if self.group_index is None:
            raise ValueError("AdvantageInputs: this estimator needs group_index")
        return check_groups(self.group_index, self.response_mask.shape[0], min_size=1)
