"""The cross-field rules of rules.py (and the spec models' own validators) that CEL can say, as the CRD's
`x-kubernetes-validations`: the API server then refuses a bad RLHFJob at `kubectl apply`, before the
operator sees it. The Python rules stay the authority (`dverl validate`, the operator, `dverl run`); these
are a subset, each mirroring one of them, and a test evaluates every one against manifests that pass and
fail the Python rules.

Rules are keyed by the pydantic model they sit on, so a model inlined at several places (ModelSpec under
spec.model, spec.data.rewardModel and each role) carries them everywhere. The API server reports a broken
rule with the path of the object it sits on (`spec.training: Invalid value: "object": ...`); the message
names the field inside it to change. Every rule is written for the object after the schema's defaults are
applied (the API server defaults before it validates), and guards each optional field with `has()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from decentralized_verl.spec.catalogue.algorithms import GROUP_ESTIMATORS, PRESETS
from decentralized_verl.spec.catalogue.backends import names_where
from decentralized_verl.spec.roles import ROLE_NAMES, SHARDED_ROLES


@dataclass(frozen=True)
class CelRule:
    rule: str
    message: str

    def to_schema(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message}


def _names(names: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


def _preset_rules() -> list[CelRule]:
    """The presets that need a critic, and those with a group-size floor, from the preset registry."""
    rules = []
    needs_critic = [name for name, preset in PRESETS.items() if preset.needs_critic]
    if needs_critic:
        rules.append(
            CelRule(
                f"!(self.algorithm.name in {_names(needs_critic)}) || has(self.roles.critic)",
                f"roles.critic: algorithms {', '.join(needs_critic)} need a critic role (set roles.critic)",
            )
        )
    floors = sorted({p.min_samples_per_prompt for p in PRESETS.values() if p.min_samples_per_prompt > 1})
    for floor in floors:
        named = [n for n, p in PRESETS.items() if p.min_samples_per_prompt == floor]
        rules.append(
            CelRule(
                f"!(self.algorithm.name in {_names(named)}) || self.algorithm.samplesPerPrompt >= {floor}",
                f"algorithm.samplesPerPrompt: {', '.join(named)} compare samples within a prompt group: "
                f"needs >= {floor}",
            )
        )
    return rules


_FSDP = "has(self.roles.learner) && self.roles.learner.sharding == 'fsdp'"
_ROLLOUT_REPLICAS = "(has(self.roles.rollout) ? self.roles.rollout.replicas : 1)"

JOB_RULES = [
    *_preset_rules(),
    CelRule(
        "!has(self.algorithm.advantageEstimator) || self.algorithm.advantageEstimator != 'gae' "
        "|| has(self.roles.critic)",
        "roles.critic: advantageEstimator 'gae' needs a critic role",
    ),
    CelRule(
        f"!has(self.algorithm.advantageEstimator) || !(self.algorithm.advantageEstimator in "
        f"{_names(GROUP_ESTIMATORS)}) || self.algorithm.samplesPerPrompt >= 2",
        f"algorithm.samplesPerPrompt: estimators {', '.join(GROUP_ESTIMATORS)} need >= 2",
    ),
    CelRule(
        "self.algorithm.klCoef == 0.0 || has(self.roles.reference)",
        "roles.reference: klCoef > 0 needs a reference role (replicas 0 runs it inside the learner)",
    ),
    CelRule(
        "!has(self.algorithm.overlong) || !self.algorithm.overlong.enabled "
        "|| !has(self.algorithm.overlong.cacheLength) "
        "|| self.algorithm.overlong.cacheLength < self.data.maxNewTokens",
        "algorithm.overlong.cacheLength: must be < data.maxNewTokens",
    ),
    CelRule(
        "self.data.rewardType != 'reward_model' || has(self.data.rewardModel) "
        "|| (has(self.roles.reward) && has(self.roles.reward.model))",
        "data.rewardModel: rewardType 'reward_model' needs data.rewardModel (or roles.reward.model)",
    ),
    CelRule(
        "!has(self.data.environment) || !has(self.roles.critic)",
        "data.environment: multi-turn episodes train with critic-free estimators; remove roles.critic",
    ),
    CelRule(
        "!has(self.training.evalEvery) || self.training.evalEvery == 0 || has(self.data.eval)",
        "data.eval: required when training.evalEvery > 0",
    ),
    CelRule(
        f"!({_FSDP}) || {_ROLLOUT_REPLICAS} >= 1",
        "roles.rollout.replicas: must be >= 1 with roles.learner.sharding: fsdp (a colocated rollout would "
        "generate with weights fsdp splits over the learners)",
    ),
    CelRule(
        f"!({_FSDP}) || !has(self.roles.reference) || self.roles.reference.replicas >= 1",
        "roles.reference.replicas: must be >= 1 with roles.learner.sharding: fsdp (a colocated reference "
        "copies weights fsdp splits over the learners)",
    ),
    CelRule(
        f"!({_FSDP}) || !self.volunteers.enabled",
        "volunteers.enabled: volunteers need roles.learner.sharding: ddp",
    ),
    CelRule(
        "!has(self.model.quantization) || has(self.model.lora)",
        "model.quantization: needs model.lora (a 4-bit base is frozen; only LoRA adapters train on it)",
    ),
    CelRule(
        f"!({_FSDP}) || !has(self.model.lora)",
        "roles.learner.sharding: use ddp with model.lora (the adapters are small)",
    ),
    CelRule(
        "!has(self.scheduling.gang) || !has(self.scheduling.gang.minRollout) "
        f"|| self.scheduling.gang.minRollout <= {_ROLLOUT_REPLICAS}",
        "scheduling.gang.minRollout: must be <= roles.rollout.replicas",
    ),
]
"""Rules across sections, on spec itself. Sections with defaults in the schema (roles, training,
volunteers, scheduling) are filled in by the API server, so only their optional members need has()."""


def _role_rules(name: str) -> list[CelRule]:
    rules = []
    guard = f"!has(self.{name}) || "
    role = f"self.{name}"
    if name == "learner":
        rules += [
            CelRule(
                f"{guard}!has({role}.failurePolicy) || {role}.failurePolicy != 'restartPod'",
                "learner.failurePolicy: learner ranks restart together (restartRole) or fail the job "
                "(failJob), not one by one",
            ),
            CelRule(f"{guard}{role}.replicas >= 1", "learner.replicas: must be >= 1"),
        ]
    if name != "rollout":
        generators = " && ".join(f"{role}.backend != '{n}'" for n in names_where(lambda k: k.rollout_only))
        rules.append(CelRule(f"{guard}{generators}", f"{name}.backend: only the rollout role generates"))
    if name not in SHARDED_ROLES:
        trains = ", ".join(SHARDED_ROLES)
        rules += [
            CelRule(
                f"{guard}{role}.sharding == 'ddp'", f"{name}.sharding: only training roles ({trains}) shard"
            ),
            CelRule(
                f"{guard}!{role}.activationCheckpointing",
                f"{name}.activationCheckpointing: only training roles ({trains}) use it",
            ),
        ]
    if name == "critic":
        rules += [
            CelRule(
                f"{guard}{role}.sharding != 'fsdp' || {role}.replicas >= 1",
                "critic.replicas: must be >= 1 with critic.sharding: fsdp",
            ),
            CelRule(
                f"{guard}{role}.sharding != 'fsdp' || !has({role}.failurePolicy) "
                f"|| {role}.failurePolicy != 'restartPod'",
                "critic.failurePolicy: a sharded critic's ranks restart together (restartRole) or fail "
                "the job (failJob)",
            ),
        ]
    return rules


CEL_RULES: dict[str, list[CelRule]] = {
    "JobSpec": JOB_RULES,
    "RolesSpec": [rule for name in ROLE_NAMES for rule in _role_rules(name)],
    "RoleSpec": [
        CelRule("!self.cpuOffload || self.sharding == 'fsdp'", "cpuOffload: needs sharding: fsdp"),
    ],
    "ModelSpec": [
        CelRule(
            "[has(self.path), has(self.__package__), has(self.tiny)].filter(x, x).size() == 1",
            "set exactly one of path, package, tiny",
        ),
    ],
    "TinyModelSpec": [
        CelRule("self.hiddenSize % self.numHeads == 0", "hiddenSize: must be a multiple of numHeads"),
    ],
    "AlgorithmSpec": [
        CelRule("!has(self.topK) || self.topK <= self.samplesPerPrompt", "topK: must be <= samplesPerPrompt"),
        CelRule(
            "!has(self.clipHigh) || !has(self.clipLow) || self.clipHigh >= self.clipLow",
            "clipHigh: must be >= clipLow",
        ),
    ],
    "DynamicFilterSpec": [CelRule("self.low <= self.high", "low: must be <= high")],
    "RolloutCorrectionSpec": [
        CelRule("self.rejectLow <= self.rejectHigh", "rejectLow: must be <= rejectHigh"),
        CelRule("self.rejectLow <= 1.0", "rejectLow: must be <= 1 (the band must hold ratio 1)"),
        CelRule("self.rejectHigh >= 1.0", "rejectHigh: must be >= 1 (the band must hold ratio 1)"),
    ],
    "TrainingSpec": [
        CelRule("!(has(self.steps) && has(self.epochs))", "epochs: set either steps or epochs, not both"),
        CelRule(
            "!has(self.minibatchSize) || self.minibatchSize <= self.batchSize",
            "minibatchSize: must be <= batchSize",
        ),
        CelRule(
            "!has(self.minibatchSize) || self.batchSize % self.minibatchSize == 0",
            "minibatchSize: must divide batchSize",
        ),
        CelRule(
            "!has(self.microbatchSize) "
            "|| self.microbatchSize <= (has(self.minibatchSize) ? self.minibatchSize : self.batchSize)",
            "microbatchSize: must be <= minibatchSize (batchSize when unset)",
        ),
        CelRule(
            "!has(self.microbatchSize) "
            "|| (has(self.minibatchSize) ? self.minibatchSize : self.batchSize) % self.microbatchSize == 0",
            "microbatchSize: must divide minibatchSize (batchSize when unset)",
        ),
        CelRule(
            "!(has(self.microbatchTokens) && has(self.microbatchSize))",
            "microbatchTokens: set either microbatchSize (prompts) or microbatchTokens (tokens), not both",
        ),
    ],
    "CheckpointSpec": [
        CelRule("!has(self.every) || self.every == 0 || has(self.dir)", "dir: required when every > 0"),
        CelRule(
            "!has(self.persistentVolumeClaim) || (has(self.dir) && self.dir.startsWith('/'))",
            "dir: must be an absolute path (the PVC's mount point) when persistentVolumeClaim is set",
        ),
    ],
    "VolunteersSpec": [
        CelRule(
            "!self.enabled || has(self.tokenSecretRef)",
            "tokenSecretRef: required when volunteers are enabled (join tokens are signed with it)",
        ),
    ],
    "GangSpec": [
        CelRule(
            "!has(self.queue) || self.scheduler == 'volcano'", "queue: a Volcano setting (scheduler: volcano)"
        ),
        CelRule(
            "!has(self.scheduleTimeoutSeconds) || self.scheduler == 'coscheduling'",
            "scheduleTimeoutSeconds: a coscheduling setting (scheduler: coscheduling)",
        ),
    ],
}
"""pydantic model name -> the rules on every schema node generated from that model."""
