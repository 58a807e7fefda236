"""Pure: which spec fields hold model and data paths, which source a pod path lies under, which roles'
pods mount a source, and the pod paths the operator keeps for itself. One home for these answers: the
spec's rules, `dverl validate`, `dverl run` and the operator's pod builder all ask here."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decentralized_verl.spec.sections import JobSections
    from decentralized_verl.spec.sources import SourceSpec

CONFIG_DIR = "/etc/dverl"
CREDENTIALS_DIR = "/var/run/dverl/credentials"
SHM_DIR = "/dev/shm"
TMP_DIR = "/tmp"
HOME_DIR = "/home/dverl"
"""The worker image's home and working directory (Dockerfile): a writable emptyDir in the pods."""
IMAGE_EXAMPLES_DIR = "/opt/dverl/examples"
"""Where the worker image carries the shipped examples (manifests and their data; Dockerfile), and so
where a pod resolves a relative model or data path: a shipped example's `data/...` is found there."""
IMAGE_MODELS_DIR = "/opt/dverl/models"
"""Where the worker image carries its model packages already converted from GGUF (read-only, made at
build time by `python -m decentralized_verl.models.bake`): a pod loads SmolLM2 from there instead of
spending its first minute dequantising into its own emptyDir home, as every pod of a job would."""
RESERVED_MOUNT_PATHS = (CONFIG_DIR, CREDENTIALS_DIR, SHM_DIR, TMP_DIR, HOME_DIR)
"""Where the operator mounts its own volumes: no source or pod template may mount at, above or under them."""


def model_and_data_paths(spec: JobSections) -> Iterator[tuple[str, str]]:
    """(field path, value) of every file or folder the workers read from the spec."""
    if spec.model.path:
        yield "spec.model.path", spec.model.path
    yield "spec.data.train", spec.data.train
    if spec.data.eval:
        yield "spec.data.eval", spec.data.eval
    if spec.data.reward_model is not None and spec.data.reward_model.path:
        yield "spec.data.rewardModel.path", spec.data.reward_model.path
    for name, role in spec.roles.items():
        if role.model is not None and role.model.path:
            yield f"spec.roles.{name}.model.path", role.model.path


def normal(path: str) -> str:
    """The path without `.`, `..` and doubled or trailing slashes (posix, as in the pod)."""
    return posixpath.normpath(path) if path else path


def is_under(path: str, folder: str) -> bool:
    """`path` is `folder` or lies inside it (both absolute pod paths)."""
    return PurePosixPath(normal(path)).is_relative_to(PurePosixPath(normal(folder)))


def overlaps(a: str, b: str) -> bool:
    return is_under(a, b) or is_under(b, a)


def source_of(path: str, sources: list[SourceSpec]) -> SourceSpec | None:
    """The source whose mountPath holds this pod path (mount paths never overlap: at most one)."""
    if not path.startswith("/"):
        return None
    return next((s for s in sources if s.mount_path and is_under(path, s.mount_path)), None)


def source_roles(source: SourceSpec, spec: JobSections) -> tuple[str, ...]:
    """The roles whose pods mount the source: those it names, else every role of the job."""
    if source.roles is not None:
        return tuple(source.roles)
    return tuple(name for name, _ in spec.roles.items())


def pod_roles_of(source: SourceSpec, spec: JobSections) -> set[str]:
    """The roles whose *pods* mount it: a role run inside the learner (replicas 0) reads it there."""
    roles = set(source_roles(source, spec))
    colocated = {name for name, role in spec.roles.items() if role.replicas == 0}
    if roles & colocated:
        roles.add("learner")
    return roles - colocated


def unseen_paths(spec: JobSections) -> list[tuple[str, str]]:
    """(field, why) of each model or data path a cluster's pods cannot see: an absolute path under no
    source's mountPath and outside the image's examples folder. A relative path resolves in that folder
    (IMAGE_EXAMPLES_DIR), which the worker image carries."""
    unseen = []
    for field, path in model_and_data_paths(spec):
        if not path.startswith("/"):
            if not is_under(posixpath.join(IMAGE_EXAMPLES_DIR, path), IMAGE_EXAMPLES_DIR):
                unseen.append(
                    (
                        field,
                        f"{path!r} climbs out of the image's examples folder {IMAGE_EXAMPLES_DIR}, where a "
                        "pod resolves a relative path, so no pod of a cluster can see it (add a source in "
                        "spec.sources that holds it; `dverl run` reads it from this machine)",
                    )
                )
            continue
        if is_under(path, IMAGE_EXAMPLES_DIR):
            continue
        if source_of(path, spec.sources) is None:
            unseen.append(
                (
                    field,
                    f"{path!r} lies under no source's mountPath, so no pod of a cluster can see it (add a "
                    "source in spec.sources that holds it, or give a path relative to the image's examples "
                    f"folder {IMAGE_EXAMPLES_DIR}; `dverl run` reads it from this machine)",
                )
            )
    return unseen


def cluster_warnings(spec: JobSections) -> list[str]:
    """What `dverl validate` says of a manifest run in a cluster, when it is not asked to refuse it."""
    return [f"{field}: {why}" for field, why in unseen_paths(spec)]
