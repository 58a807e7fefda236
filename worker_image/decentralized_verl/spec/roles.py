"""`spec.roles`: each role's workers, backends, resources and heterogeneous node pools."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from decentralized_verl.runtime.device_choice import DeviceOverride
from decentralized_verl.spec.base import SpecModel, registered_name
from decentralized_verl.spec.catalogue.backends import BACKEND_KINDS, HF, BackendKind
from decentralized_verl.spec.model import ModelSpec
from decentralized_verl.spec.sources import PodTemplate

ROLE_NAMES: tuple[str, ...] = ("rollout", "learner", "critic", "reward", "reference")

BackendName = registered_name("backend", tuple(BACKEND_KINDS))


class Toleration(SpecModel):
    key: str | None = None
    """Taint key the toleration matches; empty with Exists matches every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal (default Equal)."""
    value: str | None = None
    """Taint value matched with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect matched; empty matches every effect."""
    toleration_seconds: int | None = None
    """NoExecute only: how long the pod stays bound after the taint appears."""


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")


class Resources(SpecModel):
    cpu: str | None = Field(default=None, description="Kubernetes quantity, e.g. 4 or 500m")
    memory: str | None = Field(default=None, description="Kubernetes quantity, e.g. 16Gi")
    gpus: NonNegativeInt = Field(
        default=0,
        description="GPUs per worker; a vllm rollout worker with N > 1 runs tensor-parallel over them",
    )
    gpu_memory: str | None = Field(
        default=None,
        description=(
            "Memory of one GPU, e.g. 24Gi: what `dverl plan` checks the job against (else from the pool's "
            "gpuType)"
        ),
    )

    @model_validator(mode="after")
    def _quantities(self) -> Resources:
        for name in ("cpu", "memory", "gpu_memory"):
            value = getattr(self, name)
            if value is not None and not QUANTITY.match(value):
                raise ValueError(f"{name}: not a Kubernetes quantity (got {value!r})")
        return self


class NodePool(SpecModel):
    """A slice of a role's replicas that runs on one kind of node (heterogeneous GPUs)."""

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Pool name, a DNS label unique within the role."""
    replicas: PositiveInt
    """Replicas of the role placed in this pool; the pools' replicas add up to the role's."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels this pool's pods require."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints this pool's pods tolerate."""
    gpu_type: str | None = Field(
        default=None,
        description="e.g. a100, rtx4090: dispatch's first weights, and the GPU memory `dverl plan` checks",
    )
    resources: Resources | None = None
    """Per-worker resources in this pool (the role's when omitted)."""


FailurePolicy = Literal["restartPod", "restartRole", "failJob"]

Sharding = Literal["ddp", "fsdp"]
SHARDED_ROLES = ("learner", "critic")
"""The roles that train, so can shard their model. A sharded critic's replicas are the ranks of one value
model (rank 0 serves it); an unsharded critic's are independent copies the learner fails over between."""


class SpansSpec(SpecModel):
    """The rollout policy served as a chain of layer spans (docs/spans.md): each span a process holding
    decoder layers [a, b) of the model, the rollout worker the front (embeddings, LM head, sampling)."""

    count: PositiveInt = Field(description="Spans per rollout worker; the layers are split evenly")
    replicas: PositiveInt = Field(
        default=1, description="Servers per span: a dead or hung one is replaced by another mid-generation"
    )


class RoleSpec(SpecModel):
    """One role's workers. replicas 0 runs the role colocated inside the learner process."""

    replicas: NonNegativeInt = 1
    """Workers of this role; 0 runs it inside the learner process (not the learner itself)."""
    failure_policy: FailurePolicy | None = Field(
        default=None,
        description=(
            "When a worker of this role fails: restartPod (it alone; the default for serving roles), "
            "restartRole (every worker of the role; the learner's default and only restart, as a gang) "
            "or failJob"
        ),
    )
    backend: BackendName = HF.name
    """Generation engine: hf (transformers) or vllm (rollout only)."""
    batch_size: PositiveInt | None = Field(default=None, description="Prompts per request (rollout)")
    microbatch_size: PositiveInt | None = None
    """Sequences per forward pass inside a worker (memory bound); the whole request when omitted."""
    resources: Resources = Field(default_factory=Resources)
    """CPU, memory and GPUs of each worker."""
    node_pools: list[NodePool] = Field(default_factory=list)
    """Split the replicas over kinds of nodes (heterogeneous GPUs); empty: one pool."""
    device: DeviceOverride = Field(
        default="auto",
        description=(
            "Where each worker computes: auto (its GPU when resources.gpus gives it one it can see, else the "
            "CPU), cpu (always), cuda (a GPU, or the worker fails naming this field)"
        ),
    )
    model: ModelSpec | None = Field(default=None, description="Critic / reward model (defaults to policy)")
    sharding: Sharding = Field(
        default="ddp",
        description=(
            "The learner or the critic: ddp (every replica holds the whole model, gradients and optimizer "
            "state; a critic's replicas are then independent fail-over copies) or fsdp (FSDP2: parameters, "
            "gradients and optimizer state split over the replicas, per decoder layer; a critic's replicas "
            "become the ranks of one value model)"
        ),
    )
    cpu_offload: bool = Field(
        default=False, description="fsdp only: keep parameters, gradients and optimizer state in CPU memory"
    )
    activation_checkpointing: bool = Field(
        default=False,
        description=(
            "The learner or the critic: recompute each decoder layer's activations in the backward pass"
        ),
    )
    spans: SpansSpec | None = Field(
        default=None,
        description="rollout only: serve the policy as a chain of layer-span processes (hf backend, no LoRA)",
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Merged into this role's pods: env, volumes, placement, init containers, pull secrets",
    )

    @property
    def backend_kind(self) -> BackendKind:
        """The backend `backend` names, with what it can do (valid once the spec is: the name is checked)."""
        return BACKEND_KINDS[self.backend]


class RolesSpec(SpecModel):
    rollout: RoleSpec = Field(default_factory=RoleSpec)
    """Workers that generate responses (replicas 0: inside the learner)."""
    learner: RoleSpec = Field(default_factory=RoleSpec)
    """Workers that train the policy; replicas >= 1 (ranks of one data-parallel group)."""
    critic: RoleSpec | None = None
    """Value model workers (ppo, gae); none for critic-free estimators."""
    reward: RoleSpec | None = None
    """Reward model workers (rewardType reward_model); replicas 0: inside the learner."""
    reference: RoleSpec | None = None
    """Reference model for the KL penalty (klCoef > 0); replicas 0: inside the learner."""

    def failure_policy(self, name: str) -> str:
        """The role's failure policy with its default filled in (span servers follow the rollout's)."""
        if name == "dht":  # the volunteers' DHT bootstrap: one process, restarted alone
            return "restartPod"
        name = "rollout" if name == "span" else name
        role = getattr(self, name)
        gang = name == "learner" or (name == "critic" and role is not None and role.sharding == "fsdp")
        default = "restartRole" if gang else "restartPod"
        return (role.failure_policy if role is not None else None) or default

    def items(self) -> list[tuple[str, RoleSpec]]:
        """The roles present in this job, in a fixed order."""
        return [(name, role) for name in ROLE_NAMES if (role := getattr(self, name)) is not None]
