"""The algorithms a spec can name: the names the algorithm registries serve, the presets (what each name
in `spec.algorithm.name` means) and what each policy loss implies for the settings around it.

The spec validates names against these tables and resolves its defaults from them (`spec.sections`);
`algorithms/registry.py` checks its tables against the names here. So an algorithm is one entry here
plus (if new) one registered estimator in `algorithms/advantages.py` or policy loss in
`algorithms/policy_loss.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from decentralized_verl.spec.catalogue import check_listed, check_registry

ADVANTAGE_ESTIMATOR_NAMES: tuple[str, ...] = (
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
)
POLICY_LOSS_NAMES: tuple[str, ...] = ("ppo_clip", "gspo", "cispo", "vanilla_pg")
LOSS_AGGREGATION_NAMES: tuple[str, ...] = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")
KL_ESTIMATOR_NAMES: tuple[str, ...] = ("k1", "k2", "k3")

GROUP_ESTIMATORS: tuple[str, ...] = ("grpo", "rloo", "reinforce_plus_plus_baseline")
"""Estimators that compare samples within a prompt group."""


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
    whiten_advantages: bool = False
    """Whiten the estimator's advantages over the batch's valid tokens (veRL does for GAE)."""
    dynamic_filter: bool = False
    overlong_penalty: bool = False
    mask_truncated: bool = False


PRESETS: dict[str, AlgorithmPreset] = {
    "ppo": AlgorithmPreset(advantage_estimator="gae", needs_critic=True, whiten_advantages=True),
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


CLIP_SETTINGS = ("clip_low", "clip_high", "dual_clip", "skip_threshold")
"""The spec's ratio settings (snake_case) a policy loss may read; `LossDefaults.settings` picks from them."""


@dataclass(frozen=True)
class LossDefaults:
    """What a policy loss implies for the settings around it.

    The spec refuses a ratio setting the loss does not read (it would silently do nothing); a loss's
    own clip defaults beat the preset's, because the clip range's scale belongs to the ratio the loss
    clips (a sequence-level ratio moves far less than a token-level one); an explicit spec value beats both.
    """

    settings: frozenset[str]
    """The `CLIP_SETTINGS` the loss reads."""
    clip_low: float | None = None
    """None: the preset's (unless `lower_bound` is False)."""
    clip_high: float | None = None
    """None: the preset's."""
    lower_bound: bool = True
    """False: no lower clip unless `clipLow` is set (CISPO keeps every token's gradient)."""
    aggregations: tuple[str, ...] | None = None
    """The loss aggregations that make sense with this loss, the first the default; None: any."""


LOSS_DEFAULTS: dict[str, LossDefaults] = {
    "ppo_clip": LossDefaults(settings=frozenset(CLIP_SETTINGS)),
    # GSPO clips a length-normalised sequence ratio: its paper's range is 3e-4 / 4e-4, and its objective is
    # a mean over sequences (each sequence one weight), so only seq_mean_token_mean makes sense.
    "gspo": LossDefaults(
        settings=frozenset({"clip_low", "clip_high"}),
        clip_low=3e-4,
        clip_high=4e-4,
        aggregations=("seq_mean_token_mean",),
    ),
    # CISPO (MiniMax-M1) bounds the importance weight from above only.
    "cispo": LossDefaults(settings=frozenset({"clip_low", "clip_high"}), lower_bound=False),
    "vanilla_pg": LossDefaults(settings=frozenset()),
}
"""Per policy loss (every name of `POLICY_LOSS_NAMES`)."""

check_registry("policy loss defaults", LOSS_DEFAULTS, POLICY_LOSS_NAMES)
for _name in GROUP_ESTIMATORS:
    check_listed("group estimator", _name, ADVANTAGE_ESTIMATOR_NAMES)
for _preset in PRESETS.values():
    check_listed("preset's advantage estimator", _preset.advantage_estimator, ADVANTAGE_ESTIMATOR_NAMES)
    check_listed("preset's policy loss", _preset.policy_loss, POLICY_LOSS_NAMES)
    check_listed("preset's loss aggregation", _preset.loss_aggregation, LOSS_AGGREGATION_NAMES)
for _loss in LOSS_DEFAULTS.values():
    for _aggregation in _loss.aggregations or ():
        check_listed("policy loss's aggregation", _aggregation, LOSS_AGGREGATION_NAMES)
