"""Pure: what an observed pod says about itself (its phase, readiness, whether it is going away, its role)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dverl_operator.objects.owned import LABEL_ROLE


def pod_phase(pod: Mapping[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Ready as the kubelet reports it: phase Running and condition Ready=True."""
    if pod_phase(pod) != "Running":
        return False
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def pod_deleting(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def role_of(pod: Mapping[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE, "")
