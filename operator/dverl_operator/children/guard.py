"""Pure: the objects that keep a job's pods to themselves: its credentials Secret (TLS, job token,
weight-signing key), the NetworkPolicies that admit only the job's own pods and the operator, and the
Secret volume each pod mounts (learners alone get the signing key)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from decentralized_verl.planning.plan import Plan, PlannedWorker
from decentralized_verl.security.credentials import (
    DHT_KEY_FILE,
    DHT_ROLE,
    PUBLIC_FILES,
    SIGNING_KEY_FILE,
    TOKEN_FILE,
    IssuedCredentials,
    token_key,
)
from decentralized_verl.security.rights import TOKEN_ROLES
from dverl_operator.objects.owned import LABEL_JOB, LABEL_ROLE, Owner, job_labels, metadata


@dataclass(frozen=True)
class PolicyScope:
    """Who, besides the job's own pods, may reach them: the operator's pods (for Status), and the
    metrics scraper (Prometheus) on the learner's metrics port only."""

    operator_namespace: str
    operator_labels: Mapping[str, str]
    scraper_namespace_labels: Mapping[str, str] | None = None
    """Labels of the namespaces the scraper runs in ({}: any namespace; None, with no pod labels: no
    scraper is let in)."""
    scraper_pod_labels: Mapping[str, str] | None = None
    """Labels of the scraper's pods ({}: any pod of those namespaces)."""

    @property
    def scraper(self) -> dict[str, Any] | None:
        """The NetworkPolicy peer the scraper is, or None when none is configured."""
        if self.scraper_namespace_labels is None and self.scraper_pod_labels is None:
            return None
        return {
            "namespaceSelector": {"matchLabels": dict(self.scraper_namespace_labels or {})},
            "podSelector": {"matchLabels": dict(self.scraper_pod_labels or {})},
        }


def credentials_secret_name(job: str) -> str:
    return f"{job}-credentials"


def network_policy_name(job: str) -> str:
    return f"{job}-workers"


def gateway_policy_name(job: str) -> str:
    return f"{job}-volunteers"


def credentials_secret(owner: Owner, credentials: IssuedCredentials) -> dict[str, Any]:
    """The job's credentials (security.credentials), owned by the job: deleted with it. Each role's
    token is its own key; a pod mounts only its own role's."""
    data = credentials.secret_data()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata(owner, credentials_secret_name(owner.name), job_labels(owner.name)),
        "data": {key: base64.b64encode(value).decode() for key, value in sorted(data.items())},
    }


def network_policy(owner: Owner, plan: Plan, scope: PolicyScope) -> dict[str, Any]:
    """Ingress to every pod of the job from the job's own pods (any port: gRPC, the learners'
    rendezvous, the DHT), from the operator's pods to the coordinator's gRPC port, and from the metrics
    scraper, when one is configured, to the metrics port (the learner's: the pod its prometheus.io
    annotations name); nothing else."""
    coordinator_ports = sorted({w.ports["grpc"] for w in plan.by_role("learner")})
    operator_peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": scope.operator_namespace}},
        "podSelector": {"matchLabels": dict(scope.operator_labels)},
    }
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": {LABEL_JOB: owner.name}}}]},
        {
            "from": [operator_peer],
            "ports": [{"protocol": "TCP", "port": port} for port in coordinator_ports],
        },
    ]
    metrics_ports = sorted({w.ports["metrics"] for w in plan.workers if "metrics" in w.ports})
    if scope.scraper is not None and metrics_ports:
        ingress.append(
            {"from": [scope.scraper], "ports": [{"protocol": "TCP", "port": port} for port in metrics_ports]}
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(owner, network_policy_name(owner.name), job_labels(owner.name)),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_JOB: owner.name}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def gateway_policy(owner: Owner, plan: Plan) -> dict[str, Any] | None:
    """Volunteers dial the DHT bootstrap peer from outside the cluster: its port, on that pod only."""
    dht = plan.by_role("dht")
    if not dht:
        return None
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(
            owner, gateway_policy_name(owner.name), {**job_labels(owner.name), LABEL_ROLE: "dht"}
        ),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_JOB: owner.name, LABEL_ROLE: "dht"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": dht[0].ports["grpc"]}]}],
        },
    }


def credentials_volume(owner: Owner, worker: PlannedWorker) -> dict[str, Any]:
    """Every pod gets the job's public files and its own role's token (as `token`); learners alone the
    weight-signing key, the DHT bootstrap alone its identity. No pod gets another role's token, so its
    rights are its role's (security.rights)."""
    items = [{"key": key, "path": key} for key in PUBLIC_FILES]
    if worker.role in TOKEN_ROLES:
        items.append({"key": token_key(worker.role), "path": TOKEN_FILE})
    if worker.role == "learner":
        items.append({"key": SIGNING_KEY_FILE, "path": SIGNING_KEY_FILE})
    if worker.role == DHT_ROLE:
        items.append({"key": DHT_KEY_FILE, "path": DHT_KEY_FILE})
    return {
        "name": "credentials",
        "secret": {"secretName": credentials_secret_name(owner.name), "defaultMode": 0o440, "items": items},
    }
