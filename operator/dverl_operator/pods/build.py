"""Pure: one worker pod of a job: its command and environment from the plan, the volumes the operator
provides (the job's ConfigMap, its credentials, the learner's checkpoint claim), the role's sources and
scratch space, placement from its node pool, the restricted security settings, and the role's podTemplate
merged in.

Each pod carries a hash of the fields that cannot change in place (image, command, resources, placement,
learner rendezvous); a pod whose hash differs from the desired one is replaced, anything else is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from decentralized_verl.planning.plan import CONFIG_PATH, Plan, PlannedWorker, worker_env
from decentralized_verl.settings import env_name
from decentralized_verl.spec import API_GROUP, JobSpec
from decentralized_verl.spec.source_paths import CREDENTIALS_DIR
from decentralized_verl.spec.sources import PodTemplate
from dverl_operator.children.config_map import config_map_name
from dverl_operator.children.guard import credentials_volume
from dverl_operator.children.services import service_name
from dverl_operator.objects.owned import (
    ANNOTATION_TEMPLATE_HASH,
    DEFAULT_POOL,
    LABEL_INDEX,
    LABEL_POOL,
    LABEL_ROLE,
    Owner,
    content_hash,
    job_labels,
    metadata,
)
from dverl_operator.pods.gpu import gpu_pod_additions
from dverl_operator.pods.marks import PodMarks
from dverl_operator.pods.security import (
    container_security_context,
    grace_seconds,
    pod_security_context,
    scratch,
)
from dverl_operator.pods.sources import Mounted, mount_sources
from dverl_operator.pods.template import apply_template

GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER_NAME = "worker"
CREDENTIALS_PATH = CREDENTIALS_DIR


def _resources(worker: PlannedWorker) -> dict[str, dict[str, str]]:
    amounts: dict[str, str] = {}
    if worker.cpu:
        amounts["cpu"] = worker.cpu
    if worker.memory:
        amounts["memory"] = worker.memory
    if worker.gpus:
        amounts[GPU_RESOURCE] = str(worker.gpus)
    if not amounts:
        return {}
    # Requests equal limits: GPUs must, and it keeps training pods in the Guaranteed QoS class.
    return {"requests": dict(amounts), "limits": dict(amounts)}


# Env a learner's rendezvous depends on: changing any of it means the learner gang must restart.
_RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def _secret_env(spec: JobSpec, worker: PlannedWorker) -> list[dict[str, Any]]:
    """The coordinator signs and checks volunteer join tokens with the job's secret, read from the Secret
    the spec names; only the learner gets it, never a worker that volunteers could reach."""
    ref = spec.volunteers.token_secret_ref
    if worker.role != "learner" or not spec.volunteers.enabled or ref is None:
        return []
    return [
        {"name": env_name("join_secret"), "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
    ]


def pod(
    owner: Owner,
    spec: JobSpec,
    plan: Plan,
    worker: PlannedWorker,
    image: str,
    addrs: Mapping[str, str],
    marks: PodMarks = PodMarks(),
) -> dict[str, Any]:
    """One worker pod: placement from its node pool, GPUs, the plan's command and environment, and the
    marks shared schedulers read (gang, queue, priority)."""
    env = worker_env(plan, worker, addrs)
    env[env_name("config")] = CONFIG_PATH
    command = worker.command(CONFIG_PATH)
    if worker.role == "learner":
        # A restarted learner gang continues from the newest checkpoint (a no-op when there is none).
        command = [*command, "--resume"]
    mounts, volumes, own_env = _job_volumes(owner, spec, worker)
    env.update(own_env)
    role_spec = getattr(spec.roles, worker.role, None)
    overrides = role_spec.pod_template if role_spec is not None else None
    security = container_security_context()
    sources = mount_sources(spec, worker.role, image, overrides.spec.env if overrides else [], security)
    mounts.extend(sources.mounts)
    volumes.extend(sources.volumes)
    gpu = gpu_pod_additions(spec, worker)
    env.update(gpu.env)  # under the role's podTemplate env, which wins (NCCL's interface, say)
    scratch_volumes, scratch_mounts = scratch(worker, shm_floor_mib=gpu.shm_floor_mib)
    mounts.extend(scratch_mounts)
    volumes.extend(scratch_volumes)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": command,
        "env": [{"name": key, "value": value} for key, value in sorted(env.items())]
        + _secret_env(spec, worker),
        "ports": [
            {"name": name, "containerPort": number, "protocol": "TCP"}
            for name, number in sorted(worker.ports.items())
        ],
        "volumeMounts": mounts,
        "readinessProbe": {"tcpSocket": {"port": worker.ports["grpc"]}, "periodSeconds": 5},
        # A worker that exits on bad input prints the field at fault last: the kubelet keeps those lines
        # as the termination message, and the job's WorkerFailed event and failure condition quote it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security,
    }
    resources = _resources(worker)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "hostname": worker.name,
        "subdomain": service_name(owner.name),
        # The operator restarts workers itself, so it can count restarts and apply backoff per role.
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        "securityContext": pod_security_context(),
        # Workers never call the API server (the operator does): no token in the pod.
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": grace_seconds(spec, worker),
    }
    if sources.fetchers:
        pod_spec["initContainers"] = sources.fetchers
    pod_spec.update(_placement(worker, marks))
    template = _replacement_fields(container, pod_spec, env, sources, overrides, marks)
    meta = metadata(owner, worker.name, _labels(owner, worker, marks))
    meta["annotations"] = {
        **_scrape_annotations(worker),
        **spec.pod_annotations,
        **marks.annotations,
        ANNOTATION_TEMPLATE_HASH: content_hash(template),
    }
    return apply_template({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}, overrides)


def _job_volumes(
    owner: Owner, spec: JobSpec, worker: PlannedWorker
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, str]]:
    """The volumes the operator itself provides (the job's ConfigMap, the worker's credentials and, for a
    learner, the checkpoint claim), as (mounts, volumes, env that points the worker at them): the user's
    sources and scratch space come after, from pods.sources and pods.security."""
    mounts = [{"name": "config", "mountPath": CONFIG_PATH.rsplit("/", 1)[0], "readOnly": True}]
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": config_map_name(owner.name)}}]
    # Every pod holds credentials, the DHT bootstrap too, for its identity (it holds no token).
    mounts.append({"name": "credentials", "mountPath": CREDENTIALS_PATH, "readOnly": True})
    volumes.append(credentials_volume(owner, worker))
    env = {env_name("tls_dir"): CREDENTIALS_PATH}
    checkpoint = spec.training.checkpoint
    if worker.role == "learner" and checkpoint.persistent_volume_claim and checkpoint.dir:
        # User data: mounted, never created or deleted by the operator.
        mounts.append({"name": "checkpoints", "mountPath": checkpoint.dir})
        volumes.append(
            {
                "name": "checkpoints",
                "persistentVolumeClaim": {"claimName": checkpoint.persistent_volume_claim},
            }
        )
        env[env_name("output")] = checkpoint.dir
    return mounts, volumes, env


def _placement(worker: PlannedWorker, marks: PodMarks) -> dict[str, Any]:
    """Where the pod may run and who schedules it: the node pool's selector and tolerations, the
    scheduler and priority the shared-scheduler marks ask for (each only when set)."""
    placement: dict[str, Any] = {}
    if worker.node_selector:
        placement["nodeSelector"] = dict(worker.node_selector)
    if worker.tolerations:
        placement["tolerations"] = [dict(t) for t in worker.tolerations]
    if marks.scheduler_name:
        placement["schedulerName"] = marks.scheduler_name
    if marks.priority_class_name:
        placement["priorityClassName"] = marks.priority_class_name
    return placement


def _labels(owner: Owner, worker: PlannedWorker, marks: PodMarks) -> dict[str, str]:
    """The labels the operator selects its pods by (job, role, pool, index) over the schedulers' marks."""
    labels = {
        **marks.labels,
        **job_labels(owner.name),
        LABEL_ROLE: worker.role,
        LABEL_POOL: worker.pool or DEFAULT_POOL,
        LABEL_INDEX: str(worker.index),
    }
    if worker.gpu_type:
        labels[f"{API_GROUP}/gpu-type"] = worker.gpu_type
    return labels


def _replacement_fields(
    container: Mapping[str, Any],
    pod_spec: Mapping[str, Any],
    env: Mapping[str, str],
    sources: Mounted,
    overrides: PodTemplate | None,
    marks: PodMarks,
) -> dict[str, Any]:
    """The fields a running pod cannot take in place: their hash is annotated on the pod, and a pod whose
    hash differs from the desired one is replaced. Fields added later are only present when set, so pods
    of jobs that do not use them keep the hash they had before those fields existed."""
    template = {
        "image": container["image"],
        "command": container["command"],
        "resources": container.get("resources", {}),
        "placement": [pod_spec.get("nodeSelector"), pod_spec.get("tolerations"), marks.scheduler_name],
        "rendezvous": {key: env.get(key) for key in _RENDEZVOUS_ENV},
        # Pods from before the job had credentials talk plaintext: replaced, not mixed with secured ones.
        "credentials": True,
    }
    if sources.volumes or sources.fetchers:
        # A pod's volumes cannot change in place.
        template["sources"] = [sources.volumes, sources.mounts, sources.fetchers]
    if overrides is not None:
        template["podTemplate"] = overrides.model_dump(mode="json", by_alias=True)
    if marks.labels or marks.annotations or marks.priority_class_name:
        # A pod cannot move to another gang, queue group or priority: a change replaces it.
        template["scheduling"] = [dict(marks.labels), dict(marks.annotations), marks.priority_class_name]
    return template


def _scrape_annotations(worker: PlannedWorker) -> dict[str, str]:
    """The learner's training metrics, for a Prometheus that discovers pods by annotation."""
    if "metrics" not in worker.ports:
        return {}
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(worker.ports["metrics"]),
        "prometheus.io/path": "/metrics",
    }
