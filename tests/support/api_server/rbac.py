"""The operator's rights as the chart grants them: `helm template charts/dverl` with given values, its
Roles, ClusterRoles and bindings read back, and each request authorized as RBAC does (a rule grants a verb
on a resource, or `resource/subresource`, in an API group, optionally only for named objects; a
ClusterRole bound cluster-wide grants in every namespace, a RoleBinding only in its own).

A request the rendered RBAC does not grant gets the API server's 403, so a chart that drops a right the
operator needs breaks the tests that run the operator.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.api_server.status import Refusal, forbidden
from tests.support.paths import ROOT

CHART = ROOT / "charts" / "dverl"
RELEASE = "dverl"


def helm_binary() -> Path:
    """helm v4 from scripts/install-tools.sh (./.tools/bin/helm), installed when missing (never a skip)."""
    local = ROOT / ".tools" / "bin" / "helm"
    if not (local.is_file() and os.access(local, os.X_OK)):
        on_path = shutil.which("helm")
        if on_path and subprocess.run(
            [on_path, "version", "--short"], capture_output=True, text=True
        ).stdout.startswith("v4"):
            return Path(on_path)
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "install-tools.sh")], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"scripts/install-tools.sh failed:\n{done.stdout}\n{done.stderr}"
    return local


@functools.cache
def rendered(namespace: str, values: tuple[str, ...] = ()) -> tuple[dict[str, Any], ...]:
    """The chart's objects as `helm template` renders them into `namespace` with `--set` values."""
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"dverl-helm-home-{os.getpid()}"
    env = {**os.environ, "KUBECONFIG": str(home / "no-kubeconfig")}
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    args = [a for v in values for a in ("--set", v)]
    done = subprocess.run(
        [str(helm_binary()), "template", RELEASE, str(CHART), "--namespace", namespace, *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, f"helm template failed: {done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


@dataclass(frozen=True)
class Request:
    """What RBAC judges: who asks, the verb, the resource (with its group and subresource), where, and
    the object's name when the request names one."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def _rule_grants(rule: Mapping[str, Any], req: Request) -> bool:
    groups = rule.get("apiGroups") or []
    resources = rule.get("resources") or []
    verbs = rule.get("verbs") or []
    names = rule.get("resourceNames") or []
    full = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
    return (
        ("*" in groups or req.group in groups)
        and ("*" in resources or full in resources or (req.subresource and f"{req.resource}/*" in resources))
        and ("*" in verbs or req.verb in verbs)
        and (not names or (req.name != "" and req.name in names))
    )


@dataclass(frozen=True)
class Authorizer:
    """The rendered roles and bindings; `check` raises the API server's 403 for what they do not grant."""

    objects: tuple[dict[str, Any], ...]

    def _roles(self, kind: str, name: str, namespace: str) -> list[Mapping[str, Any]]:
        found = []
        for obj in self.objects:
            meta = obj.get("metadata") or {}
            same = obj.get("kind") == kind and meta.get("name") == name
            if same and (kind == "ClusterRole" or meta.get("namespace") == namespace):
                found.append(obj)
        return found

    def _subject_matches(self, subject: Mapping[str, Any], user: str) -> bool:
        if subject.get("kind") == "ServiceAccount":
            return user == f"system:serviceaccount:{subject.get('namespace')}:{subject.get('name')}"
        return subject.get("kind") == "User" and subject.get("name") == user

    def rules_for(self, req: Request) -> list[Mapping[str, Any]]:
        """Every rule bound to the user that applies where the request acts."""
        rules: list[Mapping[str, Any]] = []
        for binding in self.objects:
            kind = binding.get("kind")
            if kind not in ("ClusterRoleBinding", "RoleBinding"):
                continue
            if not any(self._subject_matches(s, req.user) for s in binding.get("subjects") or []):
                continue
            where = (binding.get("metadata") or {}).get("namespace") or ""
            if kind == "RoleBinding" and where != req.namespace:
                continue
            ref = binding.get("roleRef") or {}
            for role in self._roles(ref.get("kind", ""), ref.get("name", ""), where):
                rules.extend(role.get("rules") or [])
        return rules

    def allows(self, req: Request) -> bool:
        return any(_rule_grants(rule, req) for rule in self.rules_for(req))

    def check(self, req: Request) -> None:
        if self.allows(req):
            return
        full = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
        scope = f'in the namespace "{req.namespace}"' if req.namespace else "at the cluster scope"
        raise forbidden(
            req.resource, req.group, req.name,
            f'User "{req.user}" cannot {req.verb} resource "{full}" in API group "{req.group}" {scope}',
        )  # fmt: skip


def service_account(objects: Sequence[Mapping[str, Any]]) -> str:
    """The user name of the chart's operator ServiceAccount."""
    for obj in objects:
        if obj.get("kind") == "ServiceAccount":
            meta = obj["metadata"]
            return f"system:serviceaccount:{meta['namespace']}:{meta['name']}"
    raise AssertionError("the rendered chart has no ServiceAccount")


def chart_authorizer(namespace: str = "default", values: Sequence[str] = ()) -> tuple[Authorizer, str]:
    """The chart rendered into `namespace` with `values`, and its operator's user name."""
    objects = rendered(namespace, tuple(values))
    return Authorizer(objects), service_account(objects)


__all__ = ["Authorizer", "Refusal", "Request", "chart_authorizer", "rendered"]
