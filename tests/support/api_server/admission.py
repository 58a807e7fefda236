"""The admission stage of a pod create: Pod Security for a namespace labelled to enforce it, and
ResourceQuota. Pure: the pod, its namespace's labels, the quotas and the pods already counted in, to the
refusal the API server answers with (None: admitted).

Pod Security is judged by the product's one checker (decentralized_verl.spec.pod_security),
so the test world and the product agree on what "restricted" means.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from decentralized_verl.spec.pod_security import enforced_level, violations
from dverl_operator.objects.quantity import parse
from tests.support.api_server.schema import FieldError
from tests.support.api_server.status import Refusal, forbidden

TERMINAL = ("Succeeded", "Failed")


def pod_security(pod: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> Refusal | None:
    """403 when the namespace enforces baseline or restricted (a label value that is no level counts as
    restricted) and the pod breaks it, listing every violation as the Pod Security admission does."""
    level = enforced_level(namespace_labels)
    if level is None:
        return None
    found = violations(pod, level)
    if not found:
        return None
    listed = ", ".join(f"{v.rule} ({v.field}: {v.message})" for v in found)
    name = (pod.get("metadata") or {}).get("name") or ""
    return forbidden("pods", "", name, f'violates PodSecurity "{level}:latest": {listed}')


def pod_errors(pod: Mapping[str, Any]) -> list[FieldError]:
    """The pod validation a client meets first: at least one container, each named and with an image,
    names unique."""
    spec = pod.get("spec") or {}
    errors = []
    if not spec.get("containers"):
        errors.append(FieldError("spec.containers", "FieldValueRequired", "Required value"))
    seen: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            at = f"spec.{kind}[{i}]"
            if not container.get("name"):
                errors.append(FieldError(f"{at}.name", "FieldValueRequired", "Required value"))
            elif container["name"] in seen:
                errors.append(
                    FieldError(f"{at}.name", "FieldValueDuplicate", f'Duplicate value: "{container["name"]}"')
                )
            seen.add(container.get("name") or "")
            if not container.get("image"):
                errors.append(FieldError(f"{at}.image", "FieldValueRequired", "Required value"))
    return errors


MUTABLE_POD_SPEC = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)


def _frozen_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A pod spec without what an update may change (images, activeDeadlineSeconds, added tolerations,
    removed scheduling gates)."""
    out = copy.deepcopy(dict(spec))
    for kind in ("containers", "initContainers"):
        for container in out.get(kind) or []:
            container.pop("image", None)
    for key in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
        out.pop(key, None)
    return out


def pod_update_errors(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldError]:
    """An update of a pod's spec beyond what the API server lets change (bindings and the kubelet's own
    writes go elsewhere); scheduling gates may only be removed and tolerations only added."""
    before, after = old.get("spec") or {}, new.get("spec") or {}
    frozen = _frozen_spec(before) != _frozen_spec(after)
    gates = [g for g in after.get("schedulingGates") or [] if g not in (before.get("schedulingGates") or [])]
    dropped = [t for t in before.get("tolerations") or [] if t not in (after.get("tolerations") or [])]
    if frozen or gates or dropped:
        return [FieldError("spec", "FieldValueForbidden", f"Forbidden: {MUTABLE_POD_SPEC}")]
    return []


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(((pod.get("spec") or {}).get("containers")) or [])


def _init_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(((pod.get("spec") or {}).get("initContainers")) or [])


def container_amount(container: Mapping[str, Any], kind: str, resource: str) -> Decimal | None:
    """A container's request or limit; a request left out defaults to the limit, as the API server
    defaults it."""
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    if kind == "limits":
        text = limits.get(resource)
    else:
        text = requests.get(resource, limits.get(resource))
    return None if text is None else parse(str(text))


def pod_amount(pod: Mapping[str, Any], kind: str, resource: str) -> Decimal | None:
    """The pod's effective request or limit of one resource: the sum over its containers, or its largest
    init container's when that is more (the scheduler's and quota's rule). None when no container says."""
    main = [container_amount(c, kind, resource) for c in _containers(pod)]
    init = [container_amount(c, kind, resource) for c in _init_containers(pod)]
    if all(a is None for a in main + init):
        return None
    summed = sum((a for a in main if a is not None), Decimal(0))
    return max([summed, *(a for a in init if a is not None)])


def _quota_key(key: str) -> tuple[str, str] | None:
    """`requests.nvidia.com/gpu` -> ("requests", "nvidia.com/gpu"); bare `cpu`/`memory` are requests."""
    if key.startswith(("requests.", "limits.")):
        kind, _, resource = key.partition(".")
        return kind, resource
    if key in ("cpu", "memory"):
        return "requests", key
    return None


def _render(key: str, amount: Decimal) -> str:
    if key.endswith(("memory", "storage")):
        whole = int(amount)
        for suffix, unit in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if whole and whole % unit == 0:
                return f"{whole // unit}{suffix}"
        return str(whole)
    if amount != amount.to_integral_value():
        return f"{int(amount * 1000)}m"
    return str(int(amount))


def quota(
    pod: Mapping[str, Any], quotas: Iterable[Mapping[str, Any]], others: Iterable[Mapping[str, Any]]
) -> Refusal | None:
    """403 when admitting `pod` would take any quota of its namespace over its `hard` amounts, counting the
    namespace's non-terminal pods (`others`) as used; or when a quota on a compute resource exists and the
    pod does not state that resource ("must specify")."""
    name = (pod.get("metadata") or {}).get("name") or ""
    counted = [p for p in others if ((p.get("status") or {}).get("phase")) not in TERMINAL]
    for q in quotas:
        hard = (q.get("spec") or {}).get("hard") or {}
        qname = (q.get("metadata") or {}).get("name") or ""
        missing = []
        over: list[tuple[str, Decimal, Decimal, Decimal]] = []
        for key, text in sorted(hard.items()):
            limit = parse(str(text))
            if key in ("pods", "count/pods"):
                used, asked = Decimal(len(counted)), Decimal(1)
            else:
                parsed = _quota_key(key)
                if parsed is None:
                    continue
                kind, resource = parsed
                asked_or_none = pod_amount(pod, kind, resource)
                if asked_or_none is None:
                    if resource in ("cpu", "memory"):
                        missing.append(key)
                    continue
                asked = asked_or_none
                used = sum((pod_amount(p, kind, resource) or Decimal(0) for p in counted), Decimal(0))
            if used + asked > limit:
                over.append((key, asked, used, limit))
        if missing:
            return forbidden("pods", "", name, f"failed quota: {qname}: must specify {','.join(missing)}")
        if over:
            requested = ",".join(f"{k}={_render(k, a)}" for k, a, _, _ in over)
            used_s = ",".join(f"{k}={_render(k, u)}" for k, _, u, _ in over)
            limited = ",".join(f"{k}={_render(k, lim)}" for k, _, _, lim in over)
            return forbidden(
                "pods", "", name,
                f"exceeded quota: {qname}, requested: {requested}, used: {used_s}, limited: {limited}",
            )  # fmt: skip
    return None


def refusal_of(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    quotas: Iterable[Mapping[str, Any]],
    others: Iterable[Mapping[str, Any]],
) -> Refusal | None:
    """Pod Security first, then quota, as the admission chain orders them."""
    return pod_security(pod, namespace_labels) or quota(pod, quotas, others)


__all__ = ["Refusal", "pod_amount", "pod_security", "quota", "refusal_of"]
