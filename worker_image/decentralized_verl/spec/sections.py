"""The spec's sections together (`JobSections`), and the settings derived from them: what the workers read,
with every default the preset, the policy loss and the rollout backend imply filled in. The cross-field
rules (rules.py) read these; `job.JobSpec` is these sections checked by the rules."""

from __future__ import annotations

from pydantic import Field, NonNegativeInt

from decentralized_verl.spec.algorithm import (
    AlgorithmSpec,
    DynamicFilterSpec,
    OverlongSpec,
    RolloutCorrectionSpec,
)
from decentralized_verl.spec.base import SpecModel
from decentralized_verl.spec.catalogue.algorithms import LOSS_DEFAULTS, PRESETS, AlgorithmPreset
from decentralized_verl.spec.data import DataSpec
from decentralized_verl.spec.model import ModelSpec
from decentralized_verl.spec.pod_security import PodSecurityLevel
from decentralized_verl.spec.roles import RolesSpec
from decentralized_verl.spec.scheduling import PriorityClassName, SchedulingSpec
from decentralized_verl.spec.sources import SourceSpec
from decentralized_verl.spec.training import TrainingSpec
from decentralized_verl.spec.volunteers import VolunteersSpec


class JobSections(SpecModel):
    model: ModelSpec
    """The policy to train: a local folder, an installed model package, or a tiny config."""
    algorithm: AlgorithmSpec
    """The RL algorithm: a preset by name with any of its choices overridden."""
    data: DataSpec
    """Training and evaluation data, the reward, prompt rendering and sampling."""
    roles: RolesSpec = Field(default_factory=RolesSpec)
    """The workers of each role: replicas, backend, resources and node pools."""
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    """Steps, batch sizes, optimizer, checkpoints and evaluation."""
    volunteers: VolunteersSpec = Field(default_factory=VolunteersSpec)
    """Machines outside the cluster that join the job through its DHT."""
    suspend: bool = False
    """true: remove the job's pods and keep its checkpoint; false again resumes from it."""
    image: str | None = Field(default=None, description="Worker image; the operator's default when omitted")
    backoff_limit: NonNegativeInt = 6
    """Restarts of the job's roles allowed before the job is marked Failed."""
    scheduler_name: str | None = Field(
        default=None, description="Scheduler of every pod (a gang's scheduler when omitted and one is set)"
    )
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """How the job shares the cluster with others (gang scheduling)."""
    priority_class_name: str | None = PriorityClassName
    pod_security: PodSecurityLevel = Field(
        default="restricted",
        description=(
            "The Pod Security level the job's pods keep to (a podTemplate is checked against it): "
            "restricted, or baseline or privileged for a job that needs more; the operator refuses a job "
            "whose namespace's pod-security.kubernetes.io/enforce label does not admit it"
        ),
    )
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations put on every pod of the job."""
    sources: list[SourceSpec] = Field(
        default_factory=list,
        description=(
            "Where the model and data come from in a cluster: each mounts a PVC, a ConfigMap, a folder of "
            "the image or a fetched URI at its mountPath in the pods of its roles"
        ),
    )

    # Derived settings the workers read: the one place the preset's defaults (and the policy loss's and the
    # backend's) fill what the spec leaves out. Code elsewhere reads these, never the preset.
    @property
    def preset(self) -> AlgorithmPreset:
        return PRESETS[self.algorithm.name]

    @property
    def advantage_estimator(self) -> str:
        return self.algorithm.advantage_estimator or self.preset.advantage_estimator

    @property
    def policy_loss(self) -> str:
        return self.algorithm.policy_loss or self.preset.policy_loss

    @property
    def clip_range(self) -> tuple[float | None, float]:
        """(low, high): the spec's, else the policy loss's own, else the preset's; low None means no lower
        clip (CISPO's default)."""
        algo, preset = self.algorithm, self.preset
        loss = LOSS_DEFAULTS[self.policy_loss]
        low = algo.clip_low
        if low is None and loss.lower_bound:
            low = loss.clip_low if loss.clip_low is not None else preset.clip_low
        high = algo.clip_high
        if high is None:
            high = loss.clip_high if loss.clip_high is not None else preset.clip_high
        return low, high

    @property
    def loss_aggregation(self) -> str:
        """The spec's, else the first the policy loss allows, else the preset's."""
        allowed = LOSS_DEFAULTS[self.policy_loss].aggregations
        return self.algorithm.loss_aggregation or (allowed[0] if allowed else self.preset.loss_aggregation)

    @property
    def whiten_advantages(self) -> bool:
        whiten = self.algorithm.whiten_advantages
        return self.preset.whiten_advantages if whiten is None else whiten

    @property
    def rollout_correction(self) -> RolloutCorrectionSpec | None:
        """The correction in force, None when off: by default on (token TIS) unless the rollout backend
        computes log-probs with the learner's own kernels (hf)."""
        chosen = self.algorithm.rollout_correction
        if chosen is None:
            return None if self.roles.rollout.backend_kind.learner_kernels else RolloutCorrectionSpec()
        return chosen if chosen.enabled else None

    @property
    def norm_adv_by_std(self) -> bool:
        """Divide group advantages by the group's standard deviation: the spec's, else the preset's."""
        norm = self.algorithm.norm_adv_by_std
        return self.preset.norm_adv_by_std if norm is None else norm

    @property
    def mask_truncated(self) -> bool:
        """Leave responses cut at maxNewTokens out of the loss: the spec's, else the preset's."""
        mask = self.algorithm.mask_truncated
        return self.preset.mask_truncated if mask is None else mask

    @property
    def dynamic_filter(self) -> tuple[float, float] | None:
        """DAPO dynamic sampling's (low, high) success-rate band, None when off: the spec's section, else
        the preset's choice with the section's default band."""
        chosen = self.algorithm.dynamic_filter
        if chosen is None:
            default = DynamicFilterSpec()
            return (default.low, default.high) if self.preset.dynamic_filter else None
        return (chosen.low, chosen.high) if chosen.enabled else None

    @property
    def overlong(self) -> tuple[int, float] | None:
        """DAPO soft overlong punishment's (cache length, penalty factor), None when off: the spec's section,
        else the preset's choice; the cache length defaults to a quarter of data.maxNewTokens."""
        chosen = self.algorithm.overlong
        if not (chosen.enabled if chosen is not None else self.preset.overlong_penalty):
            return None
        cache = (chosen.cache_length if chosen is not None else None) or max(1, self.data.max_new_tokens // 4)
        return cache, chosen.penalty_factor if chosen is not None else OverlongSpec().penalty_factor

    @property
    def rollout_batch_size(self) -> int:
        """Prompts each rollout request carries (defaults to the learner batch)."""
        return self.roles.rollout.batch_size or self.training.batch_size
