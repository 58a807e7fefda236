"""Pure: the volumes, mounts and fetching init containers that put a job's sources into a role's pods.

A PVC is mounted read-only (at its subPath when given), a ConfigMap as one file per key, an image folder
needs nothing, and a URI is downloaded by an init container (`python -m decentralized_verl.sources.fetch`)
into an emptyDir the worker then mounts read-only. A fetch that fails ends the init container with its
reason as the termination message, so `kubectl describe pod` says what went wrong.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from decentralized_verl.spec import JobSpec
from decentralized_verl.spec.source_paths import pod_roles_of
from decentralized_verl.spec.sources import SourceSpec

FETCH_MODULE = "decentralized_verl.sources.fetch"
FETCH_ENV = (
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "SSL_CERT_FILE",
    "FETCH_PRIVATE_REDIRECTS",
)
"""Env a pod template may give the fetchers too (mirrors, tokens, a private CA)."""


@dataclass
class Mounted:
    """What a pod gets for its sources."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    fetchers: list[dict[str, Any]] = field(default_factory=list)


def volume_name(source: SourceSpec) -> str:
    return f"src-{source.name}"


def sources_for_role(spec: JobSpec, role: str) -> list[SourceSpec]:
    """The sources a role's pods mount, in spec order."""
    return [s for s in spec.sources if role in pod_roles_of(s, spec)]


def fetch_command(source: SourceSpec) -> list[str]:
    assert source.uri is not None and source.mount_path is not None
    command = ["python", "-m", FETCH_MODULE, "--url", source.uri.url, "--dest", source.mount_path]
    if source.uri.sha256:
        command += ["--sha256", source.uri.sha256]
    if source.uri.insecure_skip_digest:
        command += ["--insecure-skip-digest"]
    return command


def mount_sources(
    spec: JobSpec, role: str, image: str, template_env: list[dict[str, Any]], security: dict[str, Any]
) -> Mounted:
    """Volumes, worker mounts and init containers for one role's pods. `template_env` is the role's pod
    template env (the fetchers get the entries that steer downloads); `security` the container security
    context every container of the pod gets."""
    out = Mounted()
    fetch_env = [dict(e) for e in template_env if e.get("name") in FETCH_ENV]
    for source in sources_for_role(spec, role):
        name, path = volume_name(source), source.mount_path
        if source.pvc is not None:
            out.volumes.append(
                {
                    "name": name,
                    "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True},
                }
            )
            mount = {"name": name, "mountPath": path, "readOnly": True}
            if source.pvc.sub_path:
                mount["subPath"] = source.pvc.sub_path
            out.mounts.append(mount)
        elif source.config_map is not None:
            out.volumes.append({"name": name, "configMap": {"name": source.config_map.name}})
            out.mounts.append({"name": name, "mountPath": path, "readOnly": True})
        elif source.uri is not None:
            out.volumes.append({"name": name, "emptyDir": {}})
            out.mounts.append({"name": name, "mountPath": path, "readOnly": True})
            fetcher: dict[str, Any] = {
                "name": f"fetch-{source.name}",
                "image": image,
                "command": fetch_command(source),
                "volumeMounts": [{"name": name, "mountPath": path}],
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": copy.deepcopy(security),
            }
            if fetch_env:
                fetcher["env"] = fetch_env
            out.fetchers.append(fetcher)
        # An image source is already where the pods see it: nothing to mount.
    return out
