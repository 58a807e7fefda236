"""Each role's worker, estimated: the job's sizes read from the spec once (`Job`), then one function per
role putting memory.py's and rollout_memory.py's components together, colocated roles (replicas 0) inside
the learner. Pure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from decentralized_verl.planning import memory as mem
from decentralized_verl.planning import rollout_memory as rollout_mem
from decentralized_verl.planning.devices import Placement
from decentralized_verl.planning.memory import (
    Component,
    Estimate,
    MicroBatch,
    Trainable,
    TrainingSetup,
)
from decentralized_verl.planning.quantized import FourBit, four_bit
from decentralized_verl.planning.rollout_memory import Generation
from decentralized_verl.planning.shapes import ModelShape
from decentralized_verl.planning.spans import chain_estimate
from decentralized_verl.spec import JobSpec, ModelSpec, RoleSpec


@dataclass(frozen=True)
class Job:
    """The sizes every estimate reads, and the shapes found for the roles' models."""

    spec: JobSpec
    shapes: dict[str, ModelShape]
    """Role -> the shape of the model it holds (absent: not found)."""

    @property
    def group(self) -> int:
        return self.spec.algorithm.samples_per_prompt

    @property
    def prompt_tokens(self) -> int:
        return self.spec.data.max_prompt_tokens

    @property
    def response_tokens(self) -> int:
        return self.spec.data.max_new_tokens

    def dtype_bytes(self, role: str) -> int:
        return mem.DTYPE_BYTES[self.model(role).dtype]

    def model(self, role: str) -> ModelSpec:
        spec = self.spec
        if role == "critic" and spec.roles.critic is not None and spec.roles.critic.model is not None:
            return spec.roles.critic.model
        if role == "reward":
            reward = spec.roles.reward
            return (reward.model if reward is not None else None) or spec.data.reward_model or spec.model
        return spec.model

    def micro(self, rows_or_prompts: int, *, by_prompts: bool, shared: bool) -> MicroBatch:
        g = self.group
        prompts = rows_or_prompts if by_prompts else max(1, -(-rows_or_prompts // g))
        rows = rows_or_prompts * g if by_prompts else rows_or_prompts
        return MicroBatch(prompts, rows, self.prompt_tokens, self.response_tokens, shared)

    def learner_micro(self, shared: bool, size: int | None = None, tokens: int | None = None) -> MicroBatch:
        """The largest learner micro-batch at the job's longest prompt and response: `size` prompts, or
        what a `tokens` budget packs (training/microbatches.py: whole groups while they fit, else a
        group's rows split)."""
        training = self.spec.training
        mini = training.minibatch_size or training.batch_size
        if size is None and tokens is None:
            size, tokens = training.microbatch_size, training.microbatch_tokens
        if tokens is not None:
            p, r, g = self.prompt_tokens, self.response_tokens, self.group
            per_group = p + g * max(r - 1, 0) if g > 1 else p + r
            groups = min(tokens // per_group, mini)
            if groups >= 1:
                return self.micro(groups, by_prompts=True, shared=shared)
            rows = max(1, min(g, (tokens - p) // max(r - 1, 1)))
            return MicroBatch(1, rows, p, r, shared)
        return self.micro(size or mini, by_prompts=True, shared=shared)

    def critic_micro(self, rows: int | None = None) -> MicroBatch:
        """A critic's micro-batch, counted in rows (serving/scoring.py CriticWorker)."""
        role = self.spec.roles.critic
        rows = rows or (role.microbatch_size if role else None) or self.spec.training.microbatch_size or 8
        return self.micro(rows, by_prompts=False, shared=True)

    def training_setup(self, role: str, shards: int | None = None) -> TrainingSetup:
        spec_role: RoleSpec = getattr(self.spec.roles, role)
        lora = self.model(role).lora
        trainable = Trainable(lora.rank, tuple(lora.target_modules)) if lora is not None else mem.FULL
        return TrainingSetup(
            dtype_bytes=self.dtype_bytes(role),
            trainable=trainable,
            shards=shards if shards is not None else sharded_over(spec_role),
            cpu_offload=spec_role.cpu_offload,
            checkpointing=spec_role.activation_checkpointing,
            entropy=self.spec.algorithm.entropy_coef > 0 and role == "learner",
            value_head=role == "critic",
            quantization=self.four_bit(role),
        )

    def four_bit(self, role: str) -> FourBit | None:
        """The role's 4-bit base: the policy's roles (learner, reference, rollout) hold the policy's as
        model.quantization says; a critic or reward model is never 4-bit."""
        return four_bit(self.spec.model) if role in POLICY_ROLES else None


POLICY_ROLES = ("learner", "reference", "rollout")
"""Roles holding the policy's model, so its 4-bit base when it has one."""


def sharded_over(role: RoleSpec) -> int:
    """Workers a training role's model state is split over: its replicas with fsdp, else 1."""
    return role.replicas if role.sharding == "fsdp" else 1


def _phase(components: list[Component], role: str) -> list[Component]:
    """A colocated role's components, its phases named apart from the learner's own."""
    return [
        c if c.phase == "always" else dataclasses.replace(c, phase=f"{role} {c.phase}") for c in components
    ]


def learner(
    job: Job, placement: Placement, setup: TrainingSetup, micro: MicroBatch, *, colocated_rollout: bool = True
) -> Estimate:
    """A learner, with whatever runs inside it (roles with replicas 0)."""
    shape = job.shapes["learner"]
    on_gpu = placement.on_gpu
    parts = mem.training_components(shape, setup, micro, on_gpu)
    roles = job.spec.roles
    if roles.rollout.replicas == 0 and colocated_rollout:
        parts += _phase(_colocated_rollout(job, placement), "rollout")
    if roles.reference is not None and roles.reference.replicas == 0:
        # orchestration/wiring.py: a deep copy of the policy, microbatchSize x samplesPerPrompt rows; for a
        # LoRA policy its own base with the adapters off (no second copy of the weights).
        rows = (job.spec.training.microbatch_size or 8) * job.group
        copy = job.micro(rows, by_prompts=False, shared=not on_gpu)
        parts += _phase(
            mem.forward_components(
                shape,
                setup.dtype_bytes,
                copy,
                on_gpu,
                quantization=setup.quantization,
                own_weights=setup.trainable.full,
            ),
            "reference",
        )
    critic = roles.critic
    if critic is not None and critic.replicas == 0 and "critic" in job.shapes:
        critic_setup = job.training_setup("critic", shards=1)
        parts += _phase(
            mem.training_components(job.shapes["critic"], critic_setup, job.critic_micro(), on_gpu), "critic"
        )
    reward = roles.reward
    if reward is not None and reward.replicas == 0 and "reward" in job.shapes:
        parts += _phase(_reward_model(job, placement), "reward")
    return Estimate(tuple(parts + mem.runtime_components(on_gpu)))


def _colocated_rollout(job: Job, placement: Placement) -> list[Component]:
    """Generation inside the learner: the HF backend with the learner's own weights, or a vLLM engine
    beside it, which takes its share of the GPU whatever it needs."""
    shape, b = job.shapes["learner"], job.dtype_bytes("learner")
    gen = generation(job, placement)
    if job.spec.roles.rollout.backend_kind.shares_learner_weights:
        return rollout_mem.hf_generation_components(
            shape, b, gen, placement.on_gpu, own_weights=False, quantization=job.four_bit("learner")
        )
    if placement.gpu is not None and placement.gpu.bytes is not None:
        share = int(rollout_mem.VLLM_UTILIZATION * placement.gpu.bytes)
        detail = f"gpu_memory_utilization {rollout_mem.VLLM_UTILIZATION} of this GPU, reserved at start"
        return [Component("vllm engine", share, "gpu", detail=detail)]
    return rollout_mem.vllm_components(shape, b, gen, placement.on_gpu, job.four_bit("learner"))


def generation(
    job: Job, placement: Placement, tensor_parallel: int | None = None, batch: int | None = None
) -> Generation:
    shape = job.shapes.get("rollout") or job.shapes["learner"]
    return Generation(
        sequences=(batch or job.spec.rollout_batch_size) * job.group,
        prompt_tokens=job.prompt_tokens,
        response_tokens=job.response_tokens,
        backend=job.spec.roles.rollout.backend_kind,
        tensor_parallel=tensor_parallel or max(placement.gpus, 1),
        max_model_len=shape.max_positions,
    )


def critic(job: Job, placement: Placement, setup: TrainingSetup, micro: MicroBatch) -> Estimate:
    parts = mem.training_components(job.shapes["critic"], setup, micro, placement.on_gpu)
    return Estimate(tuple(parts + mem.runtime_components(placement.on_gpu)))


def rollout(
    job: Job, placement: Placement, tensor_parallel: int | None = None, batch: int | None = None
) -> Estimate:
    shape, b = job.shapes["rollout"], job.dtype_bytes("rollout")
    gen = generation(job, placement, tensor_parallel, batch)
    on_gpu = placement.on_gpu
    quantization = job.four_bit("rollout")
    if gen.backend.reserves_gpu_share:
        parts = rollout_mem.vllm_components(shape, b, gen, on_gpu, quantization)
        if (
            on_gpu
        ):  # the worker loads the HF model on the host first and keeps it (refreshes are checked on it)
            params = shape.parameters()
            parts.append(
                Component("host copy", params * b, "host", detail="the HF model the engine was built from")
            )
        return Estimate(tuple([*parts, mem.runtime_components(False)[0]]))
    spans = job.spec.roles.rollout.spans
    if spans is not None:  # a chain of span processes, each with the role's resources
        return chain_estimate(shape, b, gen, on_gpu, spans.count)
    parts = rollout_mem.hf_generation_components(
        shape, b, gen, on_gpu, own_weights=True, quantization=quantization
    )
    return Estimate(tuple(parts + mem.runtime_components(on_gpu)))


def _reward_model(job: Job, placement: Placement, rows: int | None = None) -> list[Component]:
    role = job.spec.roles.reward
    rows = rows or (role.microbatch_size if role else None) or 8
    micro = job.micro(rows, by_prompts=False, shared=False)
    b = job.dtype_bytes("reward")
    return mem.forward_components(job.shapes["reward"], b, micro, placement.on_gpu, logits=False)


def reward(job: Job, placement: Placement, rows: int | None = None) -> Estimate:
    """A reward worker: a reward model's forward when it has one, else only the process."""
    parts = _reward_model(job, placement, rows) if "reward" in job.shapes else []
    return Estimate(tuple(parts + mem.runtime_components(placement.on_gpu)))


def reference(job: Job, placement: Placement, rows: int | None = None) -> Estimate:
    """The frozen policy: role microbatchSize (rows), else training.microbatchSize, else 8 (scoring.py)."""
    role = job.spec.roles.reference
    rows = rows or (role.microbatch_size if role else None) or job.spec.training.microbatch_size or 8
    micro = job.micro(rows, by_prompts=False, shared=not placement.on_gpu)
    b = job.dtype_bytes("reference")
    parts = mem.forward_components(
        job.shapes["reference"], b, micro, placement.on_gpu, quantization=job.four_bit("reference")
    )
    return Estimate(tuple(parts + mem.runtime_components(placement.on_gpu)))


# ------------------------------------------------------------------------------------------ budgets


def budgets(role: str, job: Job, placement: Placement) -> tuple[int | None, int | None]:
    """(usable GPU memory, host memory) of one worker: a vLLM rollout engine gets its share of the GPU."""
    gpu = placement.gpu.bytes if placement.gpu is not None else None
    if gpu is not None and role == "rollout" and job.spec.roles.rollout.backend_kind.reserves_gpu_share:
        gpu = int(rollout_mem.VLLM_UTILIZATION * gpu)
    return gpu, placement.host.bytes


def fits(estimate: Estimate, gpu: int | None, host: int | None, on_gpu: bool) -> bool | None:
    """True, False, or None when the memory that decides (a GPU's, or a CPU worker's RAM) is not known;
    a GPU worker's host memory is checked too when given."""
    if on_gpu:
        if gpu is None:
            return None
        return estimate.gpu <= gpu and (host is None or estimate.host <= host)
    if host is None:
        return None
    return estimate.host <= host


def fits_in(role: str, job: Job, placement: Placement, estimate: Estimate) -> bool:
    gpu, host = budgets(role, job, placement)
    return bool(fits(estimate, gpu, host, placement.on_gpu))
