"""The whole RLHFJob: the spec's sections put together, the derived settings workers read, and the manifest
object `kubectl apply` sees. Cross-field rules live in rules.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator

from decentralized_verl.algorithms.presets import PRESETS, AlgorithmPreset
from decentralized_verl.spec.algorithm import AlgorithmSpec
from decentralized_verl.spec.base import CrossFieldProblems, SpecModel
from decentralized_verl.spec.data import DataSpec
from decentralized_verl.spec.model import ModelSpec
from decentralized_verl.spec.roles import RolesSpec
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
    algorithm: AlgorithmSpec
    data: DataSpec
    roles: RolesSpec = Field(default_factory=RolesSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    volunteers: VolunteersSpec = Field(default_factory=VolunteersSpec)
    suspend: bool = False
    image: str | None = Field(default=None, description="Worker image; the operator's default when omitted")
    backoff_limit: NonNegativeInt = 6
    scheduler_name: str | None = None
    pod_annotations: dict[str, str] = Field(default_factory=dict)

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
