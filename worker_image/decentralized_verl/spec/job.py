"""The whole RLHFJob: the spec's sections put together, the derived settings workers read, and the manifest
object `kubectl apply` sees. Cross-field rules live in rules.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator

from decentralized_verl.algorithms.presets import LOSS_DEFAULTS, PRESETS, AlgorithmPreset
from decentralized_verl.spec.algorithm import AlgorithmSpec, RolloutCorrectionSpec
from decentralized_verl.spec.base import CrossFieldProblems, SpecModel
from decentralized_verl.spec.data import DataSpec
from decentralized_verl.spec.model import ModelSpec
from decentralized_verl.spec.roles import RolesSpec
from decentralized_verl.spec.scheduling import PriorityClassName, SchedulingSpec
from decentralized_verl.spec.sources import SourceSpec
from decentralized_verl.spec.status import RLHFJobStatus
from decentralized_verl.spec.training import TrainingSpec
from decentralized_verl.spec.volunteers import VolunteersSpec

API_GROUP = "dverl.io"
API_VERSION = "v1alpha1"
KIND = "RLHFJob"
PLURAL = "rlhfjobs"
SHORT_NAME = "rlhf"


class JobSpec(SpecModel):
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
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations put on every pod of the job."""
    sources: list[SourceSpec] = Field(
        default_factory=list,
        description=(
            "Where the model and data come from in a cluster: each mounts a PVC, a ConfigMap, a folder of "
            "the image or a fetched URI at its mountPath in the pods of its roles"
        ),
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> JobSpec:
        from decentralized_verl.spec.rules import cross_field_problems

        problems = cross_field_problems(self)
        if problems:
            raise CrossFieldProblems(problems)
        return self

    # Derived settings the workers read; the preset fills what the spec leaves out.
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
        """The correction in force, None when off: by default on (token TIS) with the vllm backend only."""
        chosen = self.algorithm.rollout_correction
        if chosen is None:
            return RolloutCorrectionSpec() if self.roles.rollout.backend == "vllm" else None
        return chosen if chosen.enabled else None

    @property
    def rollout_batch_size(self) -> int:
        """Prompts each rollout request carries (defaults to the learner batch)."""
        return self.roles.rollout.batch_size or self.training.batch_size


class ObjectMeta(BaseModel):
    """The part of metadata we check; the rest passes through untouched."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(
        min_length=1,
        max_length=40,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="DNS-1123 label; short enough that <name>-<role>-<index> fits in 63 characters",
    )
    namespace: str | None = None


class RLHFJob(BaseModel):
    """A whole manifest as `kubectl apply` sees it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["dverl.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["RLHFJob"]
    metadata: ObjectMeta
    spec: JobSpec
    status: RLHFJobStatus | None = None


def with_defaults(spec: JobSpec) -> dict[str, Any]:
    """The spec as YAML-ready camelCase with every default filled in (what workers receive)."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)
