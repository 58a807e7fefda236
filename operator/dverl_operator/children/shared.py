"""The job's shared children (the rendered-config ConfigMap, the headless Service, the volunteer gateway
Service, the NetworkPolicies): create when missing, patch when their content drifted, remove the optional
ones when not wanted. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dverl_operator.children import guard, services
from dverl_operator.children.job_children import Children
from dverl_operator.objects import owned

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
    desired: Children,
    job: str,
    observed_policies: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None),
) -> tuple[list[dict[str, Any]], list[Patch], list[tuple[str, str]]]:
    """(create, patch, delete) that bring the shared children to what the job wants."""
    create: list[dict[str, Any]] = []
    patch: list[Patch] = []
    delete: list[tuple[str, str]] = []
    gateway_name = services.gateway_name(job)
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
