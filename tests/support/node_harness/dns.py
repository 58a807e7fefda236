"""Cluster DNS: what CoreDNS answers for a pod (the zone dns_server.py serves), the pod's resolv.conf
naming that server, and its /etc/hosts with its own names.

A pod with `hostname` and `subdomain` gets `<hostname>.<subdomain>.<ns>.svc.cluster.local` when a
headless Service named `<subdomain>` selects it (and it is ready, unless the Service publishes
not-ready addresses), as Kubernetes' DNS spec says; the Service name resolves to every such pod. Names
resolvable through a pod's search path (`<ns>.svc.cluster.local svc.cluster.local cluster.local`) are
completed by the resolver. Pure; `write_in_place` keeps a file's inode so the bind mounts already made
see the new contents.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOMAIN = "cluster.local"


@dataclass(frozen=True)
class PodRecord:
    namespace: str
    name: str
    ip: str
    labels: Mapping[str, str]
    hostname: str
    subdomain: str
    ready: bool


def record_of(pod: Mapping[str, Any]) -> PodRecord | None:
    """What DNS knows of a pod the node runs (None before it has an IP)."""
    status = pod.get("status") or {}
    if not status.get("podIP") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    meta, spec = pod["metadata"], pod.get("spec") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return PodRecord(
        namespace=meta.get("namespace") or "default",
        name=meta["name"],
        ip=status["podIP"],
        labels=meta.get("labels") or {},
        hostname=spec.get("hostname") or "",
        subdomain=spec.get("subdomain") or "",
        ready=ready,
    )


def _selects(service: Mapping[str, Any], pod: PodRecord) -> bool:
    meta = service.get("metadata") or {}
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    return (
        (meta.get("namespace") or "default") == pod.namespace
        and spec.get("clusterIP") == "None"
        and bool(selector)
        and all(pod.labels.get(k) == v for k, v in selector.items())
        and (pod.ready or bool(spec.get("publishNotReadyAddresses")))
    )


def _forms(name: str, namespace: str, viewer_namespace: str) -> list[str]:
    """`a.b.<ns>.svc.cluster.local` and its shorter forms the viewer's search path would complete."""
    full = [f"{name}.{namespace}.svc.{DOMAIN}", f"{name}.{namespace}.svc", f"{name}.{namespace}"]
    return full + ([name] if namespace == viewer_namespace else [])


def records(
    pods: Iterable[PodRecord], services: Iterable[Mapping[str, Any]], viewer_namespace: str
) -> list[tuple[str, list[str]]]:
    """(ip, names) lines: each selected pod's own name under its Service, then the Service's name."""
    lines: list[tuple[str, list[str]]] = []
    services = list(services)
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        for service in services:
            if not _selects(service, pod):
                continue
            svc = service["metadata"]["name"]
            names: list[str] = []
            if pod.hostname and pod.subdomain == svc:
                names += _forms(f"{pod.hostname}.{svc}", pod.namespace, viewer_namespace)
            names += _forms(svc, pod.namespace, viewer_namespace)
            lines.append((pod.ip, names))
    return lines


def hosts_file(own: PodRecord | None) -> str:
    """A pod's /etc/hosts as the kubelet writes it: localhost and the pod's own names, nothing else
    (other names come from the DNS server; c-ares merges hosts entries that share a name, so listing
    a Service's name beside each pod would make every pod's name resolve to all of them)."""
    out = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    if own is not None:
        fqdn = (
            f"{own.hostname}.{own.subdomain}.{own.namespace}.svc.{DOMAIN}"
            if own.hostname and own.subdomain
            else ""
        )
        out.append("\t".join(x for x in (own.ip, fqdn, own.hostname or own.name) if x))
    return "\n".join(out) + "\n"


def write_in_place(path: Path, text: str) -> None:
    """Rewrite without replacing the file: a bind mount holds the inode, not the name."""
    if path.exists() and path.read_text() == text:
        return
    with open(path, "a+") as handle:
        handle.seek(0)
        handle.truncate()
        handle.write(text)


def zone(pods: Iterable[PodRecord], services: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Fully qualified name -> addresses, what cluster DNS serves (the search path completes short names)."""
    out: dict[str, list[str]] = {}
    for address, names in records(pods, services, viewer_namespace=""):
        for name in names:
            if name.endswith(f".svc.{DOMAIN}"):
                found = out.setdefault(name, [])
                if address not in found:
                    found.append(address)
    return out


def resolv_conf(namespace: str, server: str) -> str:
    """A pod's /etc/resolv.conf as the kubelet writes it for dnsPolicy ClusterFirst."""
    search = f"{namespace}.svc.{DOMAIN} svc.{DOMAIN} {DOMAIN}"
    return f"search {search}\nnameserver {server}\noptions ndots:5\n"
