"""Rules that span fields of a job spec, in named groups; each problem names the field a person should
change, and every problem is reported at once (a wrong name included: `name_problems` checks every
field typed as a registered name, base.py)."""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from decentralized_verl.errors import Problem
from decentralized_verl.spec.base import RegisteredName, one_of
from decentralized_verl.spec.catalogue.algorithms import (
    CLIP_SETTINGS,
    GROUP_ESTIMATORS,
    LOSS_DEFAULTS,
    PRESETS,
)
from decentralized_verl.spec.catalogue.backends import BACKEND_KINDS, names_where
from decentralized_verl.spec.catalogue.environments import (
    BUILTIN_ENVIRONMENTS,
    ENVIRONMENT_OPTIONS,
    EnvironmentOptionsError,
    validate_options,
)
from decentralized_verl.spec.roles import SHARDED_ROLES
from decentralized_verl.spec.source_rules import pod_template_problems, source_problems

if TYPE_CHECKING:
    from decentralized_verl.spec.roles import RoleSpec
    from decentralized_verl.spec.sections import JobSections


def _problem(path: str, message: str) -> Problem:
    return Problem(f"spec.{path}", message)


def name_problems(spec: JobSections) -> Iterator[Problem]:
    """Every name-valued field (a `RegisteredName`) anywhere in the spec holds a name its registry knows."""
    yield from _names_in(spec, "spec")


def _names_in(model: BaseModel, path: str) -> Iterator[Problem]:
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        where = f"{path}.{field.alias or name}"
        choice = _registered(field)
        if choice is not None and isinstance(value, str):
            problem = choice.problem(value)
            if problem:
                yield Problem(where, problem)
        elif isinstance(value, BaseModel):
            yield from _names_in(value, where)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _names_in(item, f"{where}[{i}]")


def _registered(field: FieldInfo) -> RegisteredName | None:
    """The field's `RegisteredName`, also when the field is optional (`Name | None`)."""
    metadata = list(field.metadata)
    for arm in typing.get_args(field.annotation):
        metadata.extend(getattr(arm, "__metadata__", ()))
    return next((m for m in metadata if isinstance(m, RegisteredName)), None)


def algorithm_problems(spec: JobSections) -> Iterator[Problem]:
    algo, roles = spec.algorithm, spec.roles
    preset = PRESETS.get(algo.name)
    if preset is None:
        return  # reported by name_problems
    if preset.needs_critic and roles.critic is None:
        yield _problem("roles.critic", f"algorithm {algo.name!r} needs a critic role (set roles.critic)")
    if algo.samples_per_prompt < preset.min_samples_per_prompt:
        yield _problem(
            "algorithm.samplesPerPrompt",
            f"{algo.name} compares samples within a prompt group: needs >= "
            f"{preset.min_samples_per_prompt} (got {algo.samples_per_prompt})",
        )
    if algo.advantage_estimator == "gae" and roles.critic is None:
        yield _problem("roles.critic", "advantageEstimator 'gae' needs a critic role")
    if algo.advantage_estimator in GROUP_ESTIMATORS and algo.samples_per_prompt < 2:
        yield _problem(
            "algorithm.samplesPerPrompt", f"estimator {algo.advantage_estimator!r} needs >= 2 (got 1)"
        )
    if algo.top_k is not None and algo.top_k > algo.samples_per_prompt:
        yield _problem(
            "algorithm.topK", f"must be <= samplesPerPrompt ({algo.samples_per_prompt}) (got {algo.top_k})"
        )
    if algo.kl_coef > 0 and roles.reference is None:
        yield _problem(
            "roles.reference", "klCoef > 0 needs a reference role (replicas 0 runs it inside the learner)"
        )
    if algo.overlong is not None and algo.overlong.enabled:
        cache = algo.overlong.cache_length
        if cache is not None and cache >= spec.data.max_new_tokens:
            yield _problem(
                "algorithm.overlong.cacheLength",
                f"must be < data.maxNewTokens ({spec.data.max_new_tokens}) (got {cache})",
            )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def loss_problems(spec: JobSections) -> Iterator[Problem]:
    """The policy loss, its ratio settings and aggregation, and the rollout correction fit together."""
    algo = spec.algorithm
    if algo.name not in PRESETS or spec.policy_loss not in LOSS_DEFAULTS:
        return  # reported by name_problems
    loss = spec.policy_loss
    defaults = LOSS_DEFAULTS[loss]
    for setting in CLIP_SETTINGS:
        if getattr(algo, setting) is not None and setting not in defaults.settings:
            uses = ", ".join(_camel(s) for s in CLIP_SETTINGS if s in defaults.settings) or "none of them"
            yield _problem(
                f"algorithm.{_camel(setting)}",
                f"policy loss {loss!r} does not read it (it reads {uses}); remove it or choose another "
                "policyLoss",
            )
    low, _ = spec.clip_range
    if algo.clip_high is not None and low is not None and algo.clip_high < low:
        yield _problem("algorithm.clipHigh", f"must be >= clipLow ({low}) (got {algo.clip_high})")
    allowed = defaults.aggregations
    if algo.loss_aggregation is not None and allowed is not None and algo.loss_aggregation not in allowed:
        yield _problem(
            "algorithm.lossAggregation",
            f"policy loss {loss!r} needs {' or '.join(allowed)} (got {algo.loss_aggregation!r}): "
            "its objective is a mean over sequences, and the others weigh a sequence by its length",
        )
    correction = algo.rollout_correction
    if correction is not None:
        where = "algorithm.rolloutCorrection"
        if correction.reject_low > correction.reject_high:
            yield _problem(
                f"{where}.rejectLow",
                f"must be <= rejectHigh ({correction.reject_high}) (got {correction.reject_low})",
            )
        elif correction.reject_low > 1:
            yield _problem(
                f"{where}.rejectLow",
                f"must be <= 1: the band must hold ratio 1, a token both engines agree on (got "
                f"{correction.reject_low})",
            )
        elif correction.reject_high < 1:
            yield _problem(
                f"{where}.rejectHigh",
                f"must be >= 1: the band must hold ratio 1, a token both engines agree on (got "
                f"{correction.reject_high})",
            )


def reward_problems(spec: JobSections) -> Iterator[Problem]:
    if spec.data.reward_type == "reward_model" and spec.data.reward_model is None:
        reward_role = spec.roles.reward
        if reward_role is None or reward_role.model is None:
            yield _problem("data.rewardModel", "rewardType 'reward_model' needs data.rewardModel")


def environment_problems(spec: JobSections) -> Iterator[Problem]:
    """The environment's options are ones it takes (a user class is imported only by the workers), and no
    critic (its values would be fitted on the environment's tokens)."""
    env = spec.data.environment
    if env is not None and spec.roles.critic is not None:
        yield _problem(
            "data.environment",
            "multi-turn episodes train with critic-free estimators (grpo, rloo, reinforce_plus_plus...): "
            "a critic would fit values on the environment's tokens too; remove roles.critic",
        )
    if env is None or env.name not in BUILTIN_ENVIRONMENTS:
        return
    try:
        validate_options(env.name, ENVIRONMENT_OPTIONS[env.name], env.options)
    except EnvironmentOptionsError as exc:
        yield _problem(f"data.environment.options.{exc.field}", exc.message)


def role_problems(spec: JobSections) -> Iterator[Problem]:
    for name, role in spec.roles.items():
        if role.node_pools:
            total = sum(pool.replicas for pool in role.node_pools)
            if total != role.replicas:
                yield _problem(
                    f"roles.{name}.nodePools",
                    f"pool replicas add up to {total} but roles.{name}.replicas is {role.replicas}",
                )
            seen: set[str] = set()
            for i, pool in enumerate(role.node_pools):
                if pool.name in seen:
                    yield _problem(f"roles.{name}.nodePools[{i}].name", f"duplicate pool {pool.name!r}")
                seen.add(pool.name)
        if name == "learner" and role.failure_policy == "restartPod":
            yield _problem(
                "roles.learner.failurePolicy",
                "learner ranks restart together (restartRole) or fail the job (failJob), not one by one",
            )
        kind = BACKEND_KINDS.get(role.backend)  # None: an unknown name, which name_problems reports
        if kind is not None and kind.rollout_only and name != "rollout":
            scorers = one_of(names_where(lambda kind: not kind.rollout_only))
            yield _problem(f"roles.{name}.backend", f"only the rollout role generates; use {scorers} here")
        if role.spans is not None:
            yield from _span_problems(spec, name, role)
        yield from _sharding_problems(name, role)
    if spec.roles.learner.replicas < 1:
        yield _problem("roles.learner.replicas", "must be >= 1 (got 0): the learner cannot run colocated")


def _span_problems(spec: JobSections, name: str, role: RoleSpec) -> Iterator[Problem]:
    """A policy served as layer spans (docs/spans.md): the rollout role's own hf workers, full weights."""
    if name != "rollout":
        yield _problem(f"roles.{name}.spans", "only the rollout role can be served as spans")
    elif role.replicas < 1:
        yield _problem(
            "roles.rollout.spans", "needs roles.rollout.replicas >= 1 (a colocated rollout has none)"
        )
    elif role.backend not in BACKEND_KINDS or not BACKEND_KINDS[role.backend].layer_spans:
        spans = one_of(names_where(lambda kind: kind.layer_spans))
        yield _problem("roles.rollout.spans", f"needs the {spans} backend (got {role.backend!r})")
    elif spec.model.lora is not None:
        yield _problem("roles.rollout.spans", "cannot serve a model.lora job (spans take whole weights)")
    elif spec.model.tiny is not None and role.spans.count > spec.model.tiny.num_layers:
        yield _problem(
            "roles.rollout.spans.count",
            f"{role.spans.count} spans for a model of {spec.model.tiny.num_layers} layers",
        )


def _sharding_problems(name: str, role: RoleSpec) -> Iterator[Problem]:
    trains = name in SHARDED_ROLES
    roles = ", ".join(SHARDED_ROLES)
    if role.sharding != "ddp" and not trains:
        yield _problem(f"roles.{name}.sharding", f"only training roles ({roles}) shard")
    if role.activation_checkpointing and not trains:
        yield _problem(f"roles.{name}.activationCheckpointing", f"only training roles ({roles}) use it")
    if role.cpu_offload and role.sharding != "fsdp":
        yield _problem(f"roles.{name}.cpuOffload", "needs sharding: fsdp (FSDP2 does the offloading)")
    if name == "critic" and role.sharding == "fsdp":
        if role.replicas == 0:
            yield _problem(
                "roles.critic.replicas",
                "must be >= 1 with roles.critic.sharding: fsdp (a colocated critic runs inside learner "
                "rank 0 alone; a sharded critic's replicas are its ranks)",
            )
        if role.failure_policy == "restartPod":
            yield _problem(
                "roles.critic.failurePolicy",
                "a sharded critic's ranks restart together (restartRole) or fail the job (failJob), not "
                "one by one",
            )


def sharding_problems(spec: JobSections) -> Iterator[Problem]:
    """A sharded learner holds no whole copy of the policy, so nothing may run on its weights in-process."""
    roles = spec.roles
    if roles.learner.sharding != "fsdp":
        return
    if roles.rollout.replicas == 0:
        yield _problem(
            "roles.rollout.replicas",
            "must be >= 1 with roles.learner.sharding: fsdp (a colocated rollout generates with learner rank "
            "0's own weights, which fsdp splits over the learners; rollout workers pull whole weights)",
        )
    if roles.reference is not None and roles.reference.replicas == 0:
        yield _problem(
            "roles.reference.replicas",
            "must be >= 1 with roles.learner.sharding: fsdp (a colocated reference is a copy of learner rank "
            "0's weights, which fsdp splits over the learners)",
        )
    if spec.volunteers.enabled:
        yield _problem(
            "volunteers.enabled",
            "volunteers need roles.learner.sharding: ddp (their results are spot-checked with learner "
            "rank 0's own forward pass, which fsdp splits over the learners)",
        )
    if spec.model.lora is not None:
        yield _problem(
            "roles.learner.sharding",
            "use ddp with model.lora (the adapters are small; fsdp shards whole-model training)",
        )


def batch_problems(spec: JobSections) -> Iterator[Problem]:
    """Batch sizes must fit together (counted in prompts)."""
    roles, training = spec.roles, spec.training
    rollout_workers = max(roles.rollout.replicas, 1)
    produced = rollout_workers * spec.rollout_batch_size
    consumed = roles.learner.replicas * training.batch_size
    if roles.learner.replicas >= 1 and produced % consumed:
        yield _problem(
            "roles.rollout.batchSize",
            f"rollout replicas x rollout batch ({rollout_workers} x {spec.rollout_batch_size} = {produced}) "
            f"must be a multiple of learner replicas x training.batchSize "
            f"({roles.learner.replicas} x {training.batch_size} = {consumed})",
        )
    mini = training.minibatch_size or training.batch_size
    micro = training.microbatch_size or mini
    if mini > training.batch_size:
        yield _problem(
            "training.minibatchSize", f"must be <= training.batchSize ({training.batch_size}) (got {mini})"
        )
    if micro > mini:
        yield _problem("training.microbatchSize", f"must be <= training.minibatchSize ({mini}) (got {micro})")
    if training.batch_size % mini:
        yield _problem(
            "training.minibatchSize", f"must divide training.batchSize ({training.batch_size}) (got {mini})"
        )
    if mini % micro:
        yield _problem(
            "training.microbatchSize", f"must divide training.minibatchSize ({mini}) (got {micro})"
        )
    if training.microbatch_tokens is not None and training.microbatch_size is not None:
        yield _problem(
            "training.microbatchTokens",
            "set either training.microbatchSize (prompts) or training.microbatchTokens (tokens), not both",
        )
    rollout_micro = roles.rollout.microbatch_size
    if rollout_micro is not None and rollout_micro > spec.rollout_batch_size:
        yield _problem(
            "roles.rollout.microbatchSize",
            f"must be <= roles.rollout.batchSize ({spec.rollout_batch_size}) (got {rollout_micro})",
        )


def quantization_problems(spec: JobSections) -> Iterator[Problem]:
    """A 4-bit base is frozen: only LoRA adapters on top of it train, so quantization needs model.lora, and
    a role that trains all its weights (the critic) cannot hold its model in 4 bits."""
    if spec.model.quantization is not None and spec.model.lora is None:
        yield _problem(
            "model.quantization",
            "needs model.lora (a 4-bit base is frozen; only LoRA adapters train on it): add model.lora: {}",
        )
    for name, role in spec.roles.items():
        if role.model is not None and role.model.quantization is not None:
            yield _problem(
                f"roles.{name}.model.quantization",
                f"the {name} trains or serves its own whole model; only the policy (model.quantization) "
                "is held in 4 bits",
            )


def training_problems(spec: JobSections) -> Iterator[Problem]:
    training = spec.training
    if training.steps is not None and training.epochs is not None:
        yield _problem("training.epochs", "set either training.steps or training.epochs, not both")
    if training.checkpoint.every and not training.checkpoint.dir:
        yield _problem("training.checkpoint.dir", "required when checkpoint.every > 0")
    if training.checkpoint.persistent_volume_claim and not (training.checkpoint.dir or "").startswith("/"):
        yield _problem(
            "training.checkpoint.dir", "must be an absolute path (the PVC's mount point) when a PVC is set"
        )
    if training.eval_every > 0 and not spec.data.eval:
        yield _problem("data.eval", "required when training.evalEvery > 0")


def volunteer_problems(spec: JobSections) -> Iterator[Problem]:
    if spec.volunteers.enabled and spec.volunteers.token_secret_ref is None:
        yield _problem(
            "volunteers.tokenSecretRef",
            "required when volunteers are enabled (join tokens are signed with it)",
        )
    if "span" in spec.volunteers.roles and spec.roles.rollout.spans is None:
        yield _problem(
            "volunteers.roles",
            "span volunteers serve layers of a rollout split into spans: set roles.rollout.spans",
        )


def scheduling_problems(spec: JobSections) -> Iterator[Problem]:
    gang = spec.scheduling.gang
    if gang is None:
        return
    if gang.queue is not None and gang.scheduler != "volcano":
        yield _problem(
            "scheduling.gang.queue", "a queue is a Volcano setting; set scheduler: volcano or drop it"
        )
    if gang.schedule_timeout_seconds is not None and gang.scheduler != "coscheduling":
        yield _problem(
            "scheduling.gang.scheduleTimeoutSeconds",
            "a coscheduling setting; set scheduler: coscheduling or drop it",
        )
    rollout = spec.roles.rollout.replicas
    if gang.min_rollout is not None and gang.min_rollout > rollout:
        yield _problem(
            "scheduling.gang.minRollout",
            f"{gang.min_rollout} is more than roles.rollout.replicas ({rollout})",
        )


RULES: tuple[Callable[[JobSections], Iterator[Problem]], ...] = (
    name_problems,
    algorithm_problems,
    loss_problems,
    reward_problems,
    environment_problems,
    role_problems,
    sharding_problems,
    quantization_problems,
    batch_problems,
    training_problems,
    volunteer_problems,
    scheduling_problems,
    source_problems,
    pod_template_problems,
)


def cross_field_problems(spec: JobSections) -> list[Problem]:
    """Every rule group's problems, in a fixed order."""
    return [problem for rule in RULES for problem in rule(spec)]
