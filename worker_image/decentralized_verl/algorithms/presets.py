"""Algorithm presets: what each name in `spec.algorithm.name` means, without importing torch.

The spec validates names against this table and the trainer reads its defaults from it, so an
algorithm is one entry here plus (if new) one registered estimator in `advantages.py` or policy loss in
`policy_loss.py` (their names are declared in `registry.py`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmPreset:
    """Defaults an algorithm name implies; every field can be overridden in the spec."""

    advantage_estimator: str
    needs_critic: bool = False
    min_samples_per_prompt: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.2
    policy_loss: str = "ppo_clip"
    loss_aggregation: str = "token_mean"
    norm_adv_by_std: bool = True
    dynamic_filter: bool = False
    overlong_penalty: bool = False
    mask_truncated: bool = False


PRESETS: dict[str, AlgorithmPreset] = {
    "ppo": AlgorithmPreset(advantage_estimator="gae", needs_critic=True),
    "grpo": AlgorithmPreset(advantage_estimator="grpo", min_samples_per_prompt=2),
    # DAPO: clip-higher, token-level loss, dynamic sampling, soft overlong punishment.
    "dapo": AlgorithmPreset(
        advantage_estimator="grpo",
        min_samples_per_prompt=2,
        clip_high=0.28,
        dynamic_filter=True,
        overlong_penalty=True,
        mask_truncated=True,
    ),
    "rloo": AlgorithmPreset(advantage_estimator="rloo", min_samples_per_prompt=2),
    "reinforce_plus_plus": AlgorithmPreset(advantage_estimator="reinforce_plus_plus"),
    "reinforce_plus_plus_baseline": AlgorithmPreset(
        advantage_estimator="reinforce_plus_plus_baseline", min_samples_per_prompt=2
    ),
}
