"""`dverl run`'s side of sources: a pod path under a source's mountPath becomes the same path under the
source's `local` folder (relative to the manifest), or under the local cache a URI source is fetched
into, so the manifest written for a cluster runs unchanged on one machine."""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.spec import JobSpec, with_defaults
from decentralized_verl.spec.source_paths import model_and_data_paths, source_of
from decentralized_verl.spec.sources import SourceSpec

Fetcher = Callable[[SourceSpec, Path], Path]
"""Fetches a URI source into a folder of the cache and returns it (fetch.fetch behind a cache key)."""


def cache_root(env: Mapping[str, str]) -> Path:
    """Where fetched sources are kept between runs: $XDG_CACHE_HOME/dverl/sources (~/.cache by default)."""
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dverl" / "sources"


def cache_folder(source: SourceSpec, root: Path) -> Path:
    """One folder per URL and digest: a changed digest or URL never reuses another's download."""
    assert source.uri is not None
    key = hashlib.sha256(f"{source.uri.url}\n{source.uri.sha256 or ''}".encode()).hexdigest()[:24]
    return root / f"{source.name}-{key}"


def local_root(
    source: SourceSpec, index: int, base: Path, fetcher: Fetcher | None, cache: Path | None
) -> Path | Problem:
    """The folder standing in for the source's mountPath here, or the problem that stops it."""
    where = f"spec.sources[{index}]"
    if source.local is not None:
        folder = (base / source.local).resolve()
        if not folder.exists():
            return Problem(f"{where}.local", f"no such folder {str(folder)!r}")
        return folder
    if source.uri is not None and fetcher is not None and cache is not None:
        return fetcher(source, cache_folder(source, cache))
    if source.image is not None and Path(source.image.path).exists():
        return Path(source.image.path)
    kind = {"pvc": "a PVC", "config_map": "a ConfigMap", "image": "an image folder", "uri": "a URI"}[
        source.kind
    ]
    return Problem(
        f"{where}.local",
        f"required to run here: {kind} exists only in a cluster (name the folder that stands in for it)",
    )


def _set(document: dict[str, Any], field: str, value: str) -> None:
    """Set `spec.a.b.c` (camelCase, as the field paths are written) in the spec's dict form."""
    *parents, leaf = field.removeprefix("spec.").split(".")
    node = document
    for key in parents:
        node = node[key]
    node[leaf] = value


def localized(
    spec: JobSpec,
    document: dict[str, Any],
    base: Path,
    *,
    fetcher: Fetcher | None = None,
    cache: Path | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """`document` (the spec as `with_defaults` writes it) with every model and data path that lies under a
    source mapped to the folder standing in for it. `strict`: a source that has none is a ManifestError
    naming its field; otherwise such paths stay as they are (planning reads what it can)."""
    roots: dict[str, Path] = {}
    problems: list[Problem] = []
    for field, path in model_and_data_paths(spec):
        source = source_of(path, spec.sources)
        if source is None:
            continue
        if source.name not in roots:
            index = spec.sources.index(source)
            found = local_root(source, index, base, fetcher, cache)
            if isinstance(found, Problem):
                if strict and found not in problems:
                    problems.append(found)
                continue
            roots[source.name] = found
        rest = posixpath.relpath(posixpath.normpath(path), posixpath.normpath(source.mount_path or "/"))
        _set(document, field, str(roots[source.name] if rest == "." else roots[source.name] / rest))
    if problems:
        raise ManifestError(problems)
    return document


def as_seen_here(spec: JobSpec, base: Path) -> JobSpec:
    """The spec with every path a source's `local` folder (or an image folder here) stands in for mapped
    to it, the rest left as written: what planning reads model shapes from. Fetches nothing."""
    return JobSpec.model_validate(localized(spec, with_defaults(spec), base, strict=False))


def env_cache() -> Path:
    """The cache folder from this process's environment (read at `dverl run`'s entry)."""
    return cache_root(os.environ)
