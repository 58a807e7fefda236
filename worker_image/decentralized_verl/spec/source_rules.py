"""Rules for `spec.sources` and the roles' `podTemplate`s: each problem names the field to change."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from decentralized_verl.errors import Problem
from decentralized_verl.spec.pod_security import PodSecurityLevel, outside, template_pod, violations
from decentralized_verl.spec.source_paths import RESERVED_MOUNT_PATHS, normal, overlaps
from decentralized_verl.spec.uri import SHA256, UriProblem, parse_uri

if TYPE_CHECKING:
    from decentralized_verl.spec.sections import JobSections
    from decentralized_verl.spec.sources import PodOverrides, PodTemplate

RESERVED_ENV = re.compile(r"^(DVERL_.*|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK)$")
"""Env the operator sets and the workers depend on: a pod template cannot replace it."""
RESERVED_VOLUMES = re.compile(r"^(config|credentials|checkpoints|dshm|tmp|home|src-.*)$")
"""The operator's volume names (a source's volume is `src-<name>`)."""


def _absolute_problem(path: str) -> str | None:
    if not path.startswith("/"):
        return f"must be an absolute path (got {path!r})"
    if normal(path) == "/":
        return "cannot be / (it would hide the whole image)"
    if normal(path) != path.rstrip("/") or ".." in PurePosixPath(path).parts:
        return f"must be a plain absolute path without '.', '..' or '//' (got {path!r})"
    return None


def _reserved_problem(path: str) -> str | None:
    taken = next((r for r in RESERVED_MOUNT_PATHS if overlaps(path, r)), None)
    if taken:
        return f"{path!r} overlaps {taken}, where the operator mounts its own volume"
    return None


def source_problems(spec: JobSections) -> Iterator[Problem]:
    role_names = {name for name, _ in spec.roles.items()}
    seen: dict[str, int] = {}
    mounted: list[tuple[int, str]] = []
    checkpoint_dir = spec.training.checkpoint.dir
    for i, source in enumerate(spec.sources):
        where = f"spec.sources[{i}]"
        if source.name in seen:
            yield Problem(
                f"{where}.name", f"duplicate source {source.name!r} (also sources[{seen[source.name]}])"
            )
        seen.setdefault(source.name, i)
        mount = source.mount_path or ""
        problem = _absolute_problem(mount) or _reserved_problem(mount)
        if problem:
            yield Problem(f"{where}.mountPath", problem)
        else:
            for j, other in mounted:
                if overlaps(mount, other):
                    yield Problem(
                        f"{where}.mountPath", f"{mount!r} overlaps sources[{j}].mountPath {other!r}"
                    )
            if checkpoint_dir and checkpoint_dir.startswith("/") and overlaps(mount, checkpoint_dir):
                yield Problem(
                    f"{where}.mountPath", f"{mount!r} overlaps training.checkpoint.dir {checkpoint_dir!r}"
                )
            mounted.append((i, mount))
        for k, role in enumerate(source.roles or []):
            if role not in role_names:
                known = ", ".join(sorted(role_names))
                yield Problem(f"{where}.roles[{k}]", f"{role!r} is not a role of this job ({known})")
        yield from _kind_problems(where, source)


def _kind_problems(where: str, source: Any) -> Iterator[Problem]:
    if source.pvc is not None and source.pvc.sub_path is not None:
        sub = source.pvc.sub_path
        parts = PurePosixPath(sub).parts
        if sub.startswith("/") or not sub or ".." in parts or normal(sub) != sub.rstrip("/"):
            yield Problem(
                f"{where}.pvc.subPath",
                f"must be a plain relative path inside the volume, no '..' (got {sub!r})",
            )
    if source.image is not None:
        problem = _absolute_problem(source.image.path)
        if problem:
            yield Problem(f"{where}.image.path", problem)
        elif normal(source.mount_path or "") != normal(source.image.path):
            yield Problem(
                f"{where}.mountPath",
                f"an image source is seen where it lies: must equal image.path {source.image.path!r} "
                f"(got {source.mount_path!r}) or be left out",
            )
    if source.uri is not None:
        try:
            uri = parse_uri(source.uri.url)
        except UriProblem as exc:
            yield Problem(f"{where}.uri.url", f"{exc} (got {source.uri.url!r})")
            return
        digest = source.uri.sha256
        if digest is not None and not SHA256.match(digest):
            yield Problem(f"{where}.uri.sha256", f"must be 64 lowercase hex digits (got {digest!r})")
        if digest is not None and uri.whole_repository:
            yield Problem(
                f"{where}.uri.sha256",
                "checks one file; name a file of the repository, or pin a whole one by ?revision=<commit>",
            )
        if digest is not None and source.uri.insecure_skip_digest:
            yield Problem(f"{where}.uri.insecureSkipDigest", "contradicts the sha256 given: keep one")
        if digest is None and not source.uri.insecure_skip_digest and not uri.pinned_by_commit:
            needs = (
                "pin the repository by ?revision=<40-hex commit>"
                if uri.whole_repository
                else "give the file's SHA-256"
            )
            yield Problem(
                f"{where}.uri.sha256",
                f"required: {needs}, or set insecureSkipDigest: true to accept an unchecked download",
            )


def pod_template_problems(spec: JobSections) -> Iterator[Problem]:
    level = spec.pod_security
    for name, role in spec.roles.items():
        if role.pod_template is not None:
            where = f"spec.roles.{name}.podTemplate"
            yield from _override_problems(f"{where}.spec", role.pod_template.spec, level)
            yield from _profile_problems(where, role.pod_template, level)


def _profile_problems(where: str, template: PodTemplate, level: PodSecurityLevel) -> Iterator[Problem]:
    """What the template adds to its role's pods, judged at the job's Pod Security level (spec.podSecurity)
    as admission would judge the merged pod; under "restricted": a privileged, root, capability-adding or
    seccomp-Unconfined init container, a volume type outside the profile (hostPath, nfs, ...), an AppArmor
    annotation that turns it off."""
    over = template.spec
    pod = template_pod(template.metadata.annotations, over.volumes, over.init_containers)
    for violation in violations(pod, level):
        if violation.field.startswith("spec.volumes[") and ".hostPath" in violation.field:
            continue  # said once, by the volume rule above, with what to use instead
        if violation.rule == "Volume Types" and any(
            "hostPath" in v for i, v in enumerate(over.volumes) if violation.field == f"spec.volumes[{i}]"
        ):
            continue
        field = violation.field.replace("spec.", f"{where}.spec.", 1)
        if violation.field.startswith("metadata."):
            field = f"{where}.{violation.field}"
        yield Problem(field, f"{violation.message} ({outside(level, violation.rule)})")


def _named(where: str, items: list[dict[str, Any]]) -> Iterator[tuple[str, str | None]]:
    for i, item in enumerate(items):
        value = item.get("name")
        yield f"{where}[{i}]", value if isinstance(value, str) and value else None


def _override_problems(where: str, spec: PodOverrides, level: PodSecurityLevel) -> Iterator[Problem]:
    for field, items in (
        ("env", spec.env),
        ("volumes", spec.volumes),
        ("initContainers", spec.init_containers),
    ):
        for at, value in _named(f"{where}.{field}", items):
            if value is None:
                yield Problem(f"{at}.name", "required")
            elif field == "env" and RESERVED_ENV.match(value):
                yield Problem(f"{at}.name", f"{value} is set by the operator; the workers depend on it")
            elif field == "volumes" and RESERVED_VOLUMES.match(value):
                yield Problem(f"{at}.name", f"{value!r} is the name of one of the operator's volumes")
    for i, volume in enumerate(spec.volumes):
        if "hostPath" in volume and level != "privileged":
            yield Problem(
                f"{where}.volumes[{i}].hostPath",
                f"not allowed: the pods stay within the Pod Security {level} profile (use a PVC, or declare "
                "spec.podSecurity: privileged where the namespace allows it)",
            )
    declared = {v.get("name") for v in spec.volumes}
    for i, mount in enumerate(spec.volume_mounts):
        path = mount.get("mountPath")
        at = f"{where}.volumeMounts[{i}]"
        if not isinstance(path, str) or not path.startswith("/"):
            yield Problem(f"{at}.mountPath", f"must be an absolute path (got {path!r})")
        elif problem := _reserved_problem(path):
            yield Problem(f"{at}.mountPath", problem)
        if mount.get("name") not in declared:
            yield Problem(f"{at}.name", f"no volume {mount.get('name')!r} in {where}.volumes")
