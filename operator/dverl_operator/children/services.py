"""Pure: the job's Services: the headless one that gives each worker a stable DNS name, and the volunteer
gateway in front of its DHT bootstrap peer; and where volunteers dial that gateway."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from decentralized_verl.planning.plan import Plan, PlannedWorker
from dverl_operator.objects.owned import LABEL_JOB, LABEL_ROLE, Owner, job_labels, metadata


def service_name(job: str) -> str:
    return f"{job}-workers"


def gateway_name(job: str) -> str:
    return f"{job}-volunteers"


def worker_address(owner: Owner, worker: PlannedWorker) -> str:
    """`<pod>.<job>-workers.<ns>.svc:<port>`: stable DNS through the headless Service."""
    port = worker.ports.get("grpc")
    return f"{worker.name}.{service_name(owner.name)}.{owner.namespace}.svc:{port}"


def addresses(owner: Owner, plan: Plan) -> dict[str, str]:
    return {worker.name: worker_address(owner, worker) for worker in plan.workers}


def service(owner: Owner, plan: Plan) -> dict[str, Any]:
    """Headless Service: gives each pod the DNS name `<pod>.<job>-workers.<ns>.svc`."""
    ports: dict[str, int] = {}
    for worker in plan.workers:
        for port_name, number in worker.ports.items():
            name = "dht" if worker.role == "dht" else port_name
            ports.setdefault(name, number)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, service_name(owner.name), job_labels(owner.name)),
        "spec": {
            "clusterIP": "None",
            # Rendezvous (torch.distributed, gRPC dial) happens before readiness: publish early.
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: owner.name},
            "ports": [
                {"name": name, "port": number, "targetPort": number, "protocol": "TCP"}
                for name, number in sorted(ports.items())
            ],
        },
    }


def gateway_service(owner: Owner, plan: Plan, service_type: str) -> dict[str, Any] | None:
    """A Service of the chart's type in front of the job's DHT bootstrap peer, so volunteers outside the
    cluster can reach it. Only that pod is selected: a volunteer never gets a route to any other worker."""
    dht = plan.by_role("dht")
    if not dht:
        return None
    port = dht[0].ports["grpc"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, gateway_name(owner.name), {**job_labels(owner.name), LABEL_ROLE: "dht"}),
        "spec": {
            "type": service_type,
            "selector": {LABEL_JOB: owner.name, LABEL_ROLE: "dht"},
            "ports": [{"name": "dht", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def gateway_address(gateway: Mapping[str, Any] | None) -> str | None:
    """Where volunteers dial the job's DHT peer: the load balancer's address, else the node port."""
    if gateway is None:
        return None
    spec = gateway.get("spec") or {}
    ports = spec.get("ports") or [{}]
    ingress = ((gateway.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    if spec.get("type") == "LoadBalancer" and ingress:
        host = ingress[0].get("ip") or ingress[0].get("hostname")
        return f"{host}:{ports[0].get('port')}"
    if spec.get("type") == "NodePort" and ports[0].get("nodePort"):
        return f"<any node>:{ports[0]['nodePort']}"
    if spec.get("type") == "ClusterIP" and spec.get("clusterIP") not in (None, "", "None"):
        return f"{spec['clusterIP']}:{ports[0].get('port')}"
    return None
