"""Every kind the operator reads or writes, as lightkube generic resources: dict-shaped objects for core
kinds and custom resources alike, so the operator's pure code sees plain Kubernetes JSON whatever the kind.

Two API groups serve a kind named PodGroup, so such kinds are keyed by `kind.group` (`kind_key`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericNamespacedResource,
    create_global_resource,
    create_namespaced_resource,
)

from decentralized_verl.spec import API_GROUP, API_VERSION, KIND, PLURAL

# key -> (group, version, kind, plural)
KINDS: dict[str, tuple[str, str, str, str]] = {
    "Pod": ("", "v1", "Pod", "pods"),
    "Service": ("", "v1", "Service", "services"),
    "ConfigMap": ("", "v1", "ConfigMap", "configmaps"),
    "Secret": ("", "v1", "Secret", "secrets"),
    "Event": ("", "v1", "Event", "events"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies"),
    "Lease": ("coordination.k8s.io", "v1", "Lease", "leases"),
    KIND: (API_GROUP, API_VERSION, KIND, PLURAL),
    "PodGroup.scheduling.x-k8s.io": ("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups"),
    "PodGroup.scheduling.volcano.sh": ("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups"),
}

_RESOURCES: dict[str, type[GenericNamespacedResource]] = {}


def resource(key: str) -> type[GenericNamespacedResource]:
    """The generic resource class for a KINDS key (made once; lightkube keeps one per group and kind)."""
    found = _RESOURCES.get(key)
    if found is None:
        group, version, kind, plural = KINDS[key]
        found = _RESOURCES[key] = create_namespaced_resource(group, version, kind, plural)
    return found


@functools.cache
def namespace_resource() -> type[GenericGlobalResource]:
    """Namespaces, the one cluster-scoped kind the operator reads (its own, for their labels); made once,
    as lightkube registers one class per kind."""
    return create_global_resource("", "v1", "Namespace", "namespaces")


def kind_key(obj: Mapping[str, Any]) -> str:
    """The KINDS key of an object: its kind, or `kind.group` where the kind alone is ambiguous."""
    kind = obj["kind"]
    if kind in KINDS:
        return kind
    group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    return f"{kind}.{group}"
