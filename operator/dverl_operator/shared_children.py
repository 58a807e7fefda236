"""The job's shared children (the rendered-config ConfigMap, the headless Service, the volunteer gateway
Service, the NetworkPolicies): create when missing, patch when their content drifted, remove the optional
ones when not wanted. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dverl_operator import children as kids
from dverl_operator import guard_children as guard
from dverl_operator import owned

Patch = tuple[str, str, dict[str, Any]]


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _sync_spec(
    kind: str,
    name: str,
    observed: Mapping[str, Any] | None,
    want: Mapping[str, Any] | None,
    create: list[dict[str, Any]],
    patch: list[Patch],
    delete: list[tuple[str, str]],
) -> None:
    """An optional child whose whole `spec` is ours: gone when not wanted, made, or its spec restored."""
    if want is None:
        if observed is not None:
            delete.append((kind, name))
    elif observed is None:
        create.append(dict(want))
    elif observed.get("spec") != want["spec"]:
        patch.append((kind, name, {"spec": want["spec"]}))


def sync_shared(
    observed_config_map: Mapping[str, Any] | None,
    observed_service: Mapping[str, Any] | None,
    observed_gateway: Mapping[str, Any] | None,
    desired: kids.Children,
    job: str,
    observed_policies: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None),
) -> tuple[list[dict[str, Any]], list[Patch], list[tuple[str, str]]]:
    """(create, patch, delete) that bring the shared children to what the job wants."""
    create: list[dict[str, Any]] = []
    patch: list[Patch] = []
    delete: list[tuple[str, str]] = []
    gateway_name = kids.gateway_name(job)
    _sync_spec(
        "NetworkPolicy", guard.network_policy_name(job), observed_policies[0], desired.network_policy,
        create, patch, delete,
    )  # fmt: skip
    _sync_spec(
        "NetworkPolicy", guard.gateway_policy_name(job), observed_policies[1], desired.gateway_policy,
        create, patch, delete,
    )  # fmt: skip
    if observed_config_map is None:
        create.append(desired.config_map)
    elif _annotations(observed_config_map).get(owned.ANNOTATION_CONFIG_HASH) != _annotations(
        desired.config_map
    ).get(owned.ANNOTATION_CONFIG_HASH):
        metadata = desired.config_map["metadata"]
        patch.append(
            (
                "ConfigMap",
                metadata["name"],
                {"metadata": {"annotations": metadata["annotations"]}, "data": desired.config_map["data"]},
            )
        )
    if observed_service is None:
        create.append(desired.service)
    elif (observed_service.get("spec") or {}).get("ports") != desired.service["spec"]["ports"]:
        patch.append(
            (
                "Service",
                desired.service["metadata"]["name"],
                {"spec": {"ports": desired.service["spec"]["ports"]}},
            )
        )
    want = desired.gateway
    if want is None:
        if observed_gateway is not None:
            delete.append(("Service", gateway_name))
    elif observed_gateway is None:
        create.append(dict(want))
    else:
        have_spec, want_spec = observed_gateway.get("spec") or {}, want["spec"]
        if have_spec.get("type") != want_spec["type"] or have_spec.get("ports") != want_spec["ports"]:
            patch.append(
                ("Service", gateway_name, {"spec": {"type": want_spec["type"], "ports": want_spec["ports"]}})
            )
    return create, patch, delete


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
