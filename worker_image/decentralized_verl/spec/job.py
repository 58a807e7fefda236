"""The whole RLHFJob: the spec (its sections, `sections.py`, checked by the cross-field rules of rules.py)
and the manifest object `kubectl apply` sees."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from decentralized_verl.spec.base import CrossFieldProblems
from decentralized_verl.spec.rules import cross_field_problems
from decentralized_verl.spec.sections import JobSections
from decentralized_verl.spec.status import RLHFJobStatus

API_GROUP = "dverl.io"
API_VERSION = "v1alpha1"
KIND = "RLHFJob"
PLURAL = "rlhfjobs"
SHORT_NAME = "rlhf"


class JobSpec(JobSections):
    @model_validator(mode="after")
    def _cross_field_rules(self) -> JobSpec:
        problems = cross_field_problems(self)
        if problems:
            raise CrossFieldProblems(problems)
        return self


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
