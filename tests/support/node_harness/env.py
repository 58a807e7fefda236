"""A container's environment as the kubelet builds it: literal values, Secret and ConfigMap keys, the
pod's own fields (fieldRef) and its resources (resourceFieldRef), `envFrom`, then the variables every pod
gets (HOSTNAME, the API server's KUBERNETES_SERVICE_*). Pure: the objects it reads are passed in.

A reference that cannot be met stops the container from starting, as the kubelet's
CreateContainerConfigError does; the error names the variable and what it refers to, so a test sees
which field of the operator's pod was wrong.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from dverl_operator.objects.quantity import parse as quantity

Lookup = Callable[[str, str], Mapping[str, Any] | None]
"""(kind "Secret"|"ConfigMap", name) -> the object in the pod's namespace, or None."""


class EnvError(ValueError):
    """A container's env cannot be built (CreateContainerConfigError)."""


def _key_of(kind: str, ref: Mapping[str, Any], lookup: Lookup, var: str) -> str | None:
    obj = lookup(kind, ref.get("name", ""))
    optional = bool(ref.get("optional"))
    field = "secretKeyRef" if kind == "Secret" else "configMapKeyRef"
    if obj is None:
        if optional:
            return None
        raise EnvError(f"env {var}: {field} {kind} {ref.get('name')!r} not found")
    key = ref.get("key", "")
    if kind == "Secret":
        data = obj.get("data") or {}
        if key in data:
            return base64.b64decode(data[key]).decode()
        if key in (obj.get("stringData") or {}):
            return str(obj["stringData"][key])
    elif key in (obj.get("data") or {}):
        return str(obj["data"][key])
    if optional:
        return None
    raise EnvError(f"env {var}: {field} key {key!r} not in {kind} {ref.get('name')!r}")


def field_value(path: str, pod: Mapping[str, Any], pod_ip: str, var: str) -> str:
    """The downward API's fieldRef paths the kubelet resolves."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace") or "default",
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": pod_ip.rsplit(".", 1)[0] + ".1" if pod_ip else "",
    }
    if path in simple:
        return str(simple[path])
    for prefix, table in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((meta.get(table) or {}).get(path[len(prefix) + 2 : -2], ""))
    raise EnvError(f"env {var}: fieldRef.fieldPath {path!r} is not supported by the downward API")


def resource_value(ref: Mapping[str, Any], container: Mapping[str, Any], var: str) -> str:
    """`limits.cpu` etc. in units of the divisor, rounded up as the kubelet does; an unset limit reads
    as the node's capacity, here the machine's cores (the memory limit falls back to 0, "unlimited")."""
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or name not in ("cpu", "memory", "ephemeral-storage"):
        raise EnvError(f"env {var}: resourceFieldRef.resource {resource!r} is not supported")
    amounts = (container.get("resources") or {}).get(kind) or {}
    if name == "cpu":
        have = float(quantity(amounts["cpu"])) if "cpu" in amounts else float(os.cpu_count() or 1)
        divisor = float(quantity(str(ref.get("divisor", "1"))))
    else:
        have = float(quantity(amounts[name])) if name in amounts else 0.0
        divisor = float(quantity(str(ref.get("divisor", "1"))))
    if divisor <= 0:
        raise EnvError(f"env {var}: resourceFieldRef.divisor must be positive")
    return str(max(1, math.ceil(have / divisor)) if have else 0)


def _expand(value: str, env: Mapping[str, str]) -> str:
    """`$(VAR)` references to variables defined earlier; `$$` escapes; unknown references stay as written."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i) and (end := value.find(")", i)) != -1:
            name = value[i + 2 : end]
            out.append(env[name] if name in env else value[i : end + 1])
            i = end + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_ip: str,
    lookup: Lookup,
    api_server: tuple[str, int] | None = None,
) -> dict[str, str]:
    """Everything the container's process sees in its environment (beside what the image sets)."""
    env: dict[str, str] = {}
    hostname = (pod.get("spec") or {}).get("hostname") or (pod.get("metadata") or {}).get("name", "")
    env["HOSTNAME"] = hostname
    if api_server is not None:
        env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = api_server[0], str(api_server[1])
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if field not in source:
                continue
            ref = source[field]
            obj = lookup(kind, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f"envFrom: {field} {kind} {ref.get('name')!r} not found")
            for key, value in (obj.get("data") or {}).items():
                env[prefix + key] = base64.b64decode(value).decode() if kind == "Secret" else str(value)
    for item in container.get("env") or []:
        var = item.get("name", "")
        if "value" in item or "valueFrom" not in item:
            env[var] = _expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"]
        value: str | None
        if "secretKeyRef" in source:
            value = _key_of("Secret", source["secretKeyRef"], lookup, var)
        elif "configMapKeyRef" in source:
            value = _key_of("ConfigMap", source["configMapKeyRef"], lookup, var)
        elif "fieldRef" in source:
            value = field_value(source["fieldRef"].get("fieldPath", ""), pod, pod_ip, var)
        elif "resourceFieldRef" in source:
            value = resource_value(source["resourceFieldRef"], container, var)
        else:
            raise EnvError(f"env {var}: valueFrom names no source")
        if value is not None:
            env[var] = value
    return env
