"""An in-memory Kubernetes API for one RLHFJob: each pass of the real `decide` is applied as the
API server would (create, merge-patch, delete), and tests play the kubelet, gang schedulers and Kueue."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from dverl_operator.children import gang
from dverl_operator.reconcile.actions import Actions
from dverl_operator.reconcile.decide import decide
from dverl_operator.reconcile.observed import Observed
from dverl_operator.reconcile.settings import Settings

NOW = 1_800_000_000.0
BOTH = frozenset({"coscheduling", "volcano"})
SETTINGS = Settings(
    default_image="img:1", backoff_base_seconds=10, backoff_max_seconds=60, gang_schedulers=BOTH
)


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies a merge patch."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class World:
    """One RLHFJob and what the API server holds for it."""

    spec: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    settings: Settings = SETTINGS
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    pod_groups: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    now: float = NOW
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def observed(self) -> Observed:
        job = {
            "apiVersion": "dverl.io/v1alpha1",
            "kind": "RLHFJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u-1", "labels": dict(self.labels)},
            "spec": self.spec,
            "status": self.status,
        }
        groups = {name: self.pod_groups.get(name) for name in sorted(self.settings.gang_schedulers)}
        return Observed(
            job=job,
            pods=copy.deepcopy(self.pods),
            config_map=None,
            service=None,
            progress=None,
            now=self.now,
            credentials_ready=True,
            pod_groups=groups,
            namespace_labels=dict(self.namespace_labels),
        )

    def step(self) -> Actions:
        actions = decide(self.observed(), self.settings)
        by_key = {gang.KIND_KEYS[name]: name for name in gang.KIND_KEYS}
        for kind, name, patch in actions.patch:
            if kind == "Pod" and name in self.pods:
                self.pods[name] = merge(self.pods[name], patch)
            elif kind in by_key and self.pod_groups.get(by_key[kind]):
                self.pod_groups[by_key[kind]] = merge(self.pod_groups[by_key[kind]], patch)
        for kind, name in actions.delete:
            if kind == "Pod":
                self.pods.pop(name, None)
            elif kind in by_key:
                self.pod_groups[by_key[kind]] = None
        for obj in actions.create:
            if obj["kind"] == "Pod":
                self.pods[obj["metadata"]["name"]] = copy.deepcopy(obj)
            elif obj["kind"] == "PodGroup":
                scheduler = next(n for n, v in gang.API_VERSIONS.items() if v == obj["apiVersion"])
                self.pod_groups[scheduler] = copy.deepcopy(obj)
        self.status = actions.status
        self.events.extend(actions.events)
        return actions

    def settle(self, passes: int = 4) -> Actions:
        actions = self.step()
        for _ in range(passes - 1):
            actions = self.step()
        return actions

    def run_pods(self, *names: str) -> None:
        for name in names or list(self.pods):
            self.pods[name]["status"] = {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "PodScheduled", "status": "True"},
                ],
            }
            self.pods[name]["spec"]["nodeName"] = "node-1"
            self.pods[name]["spec"].pop("schedulingGates", None)

    def gate_pods(self) -> None:
        """Kueue's webhook: every new pod is held behind its admission gate."""
        for pod in self.pods.values():
            if "nodeName" not in pod["spec"]:
                pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]

    def preempt(self, name: str, reason: str = "PreemptionByScheduler") -> None:
        self.pods[name]["status"] = {
            "phase": "Failed",
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "higher priority"}
            ],
        }


def running(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as its kubelet reports it once its containers run and pass their readiness probe."""
    return {**pod, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
