"""A pod's volumes where its containers expect them: ConfigMaps and Secrets written out as files with
their modes (and the fsGroup's group), PVCs as host folders the test names by claimName, emptyDirs as
fresh folders (tmpfs for `medium: Memory`, sized by `sizeLimit`), all bind-mounted at their mountPaths
(with subPath and readOnly) inside a private mount namespace, so the host and the other pods never see
them. The pod's /etc/hosts and /etc/resolv.conf are bound the same way (dns.py writes them).

`volume_files` and `mount_script` are pure; `prepare` does the writing.
"""

from __future__ import annotations

import base64
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Lookup = Callable[[str, str], Mapping[str, Any] | None]


class VolumeError(ValueError):
    """A volume cannot be set up (the kubelet's FailedMount: the pod stays in ContainerCreating)."""


@dataclass(frozen=True)
class Mount:
    target: str
    source: Path | None = None
    """A host folder or file bound at target; None for a tmpfs."""
    read_only: bool = False
    tmpfs_size: str | None = None


def volume_files(volume: Mapping[str, Any], lookup: Lookup) -> dict[str, tuple[bytes, int]]:
    """A configMap or secret volume's files: relative path -> (content, mode), with `items` choosing and
    renaming keys, `defaultMode` (0644) and per-item `mode`, as the kubelet projects them."""
    if "configMap" in volume:
        source, kind, name_key = volume["configMap"], "ConfigMap", "name"
    elif "secret" in volume:
        source, kind, name_key = volume["secret"], "Secret", "secretName"
    else:
        raise VolumeError(f"volume {volume.get('name')!r}: not a configMap or secret volume")
    obj = lookup(kind, source.get(name_key, ""))
    if obj is None:
        if source.get("optional"):
            return {}
        raise VolumeError(f"volume {volume.get('name')!r}: {kind} {source.get(name_key)!r} not found")
    raw = obj.get("data") or {}
    data = {k: base64.b64decode(v) if kind == "Secret" else str(v).encode() for k, v in raw.items()}
    if kind == "ConfigMap":
        data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    mode = int(source.get("defaultMode", 0o644))
    items = source.get("items")
    if not items:
        return {key: (value, mode) for key, value in data.items()}
    files: dict[str, tuple[bytes, int]] = {}
    for item in items:
        key = item.get("key", "")
        if key not in data:
            if source.get("optional"):
                continue
            raise VolumeError(
                f"volume {volume.get('name')!r}: key {key!r} not in {kind} {obj['metadata']['name']!r}"
            )
        files[item.get("path", key)] = (data[key], int(item.get("mode", mode)))
    return files


def _write_files(folder: Path, files: Mapping[str, tuple[bytes, int]], group: int | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rel, (content, mode) in files.items():
        path = folder / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise VolumeError(f"item path {rel!r} must be relative without '..'")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if group is not None:
            # The kubelet's volume ownership for fsGroup: group-owned and at least group-readable.
            os.chown(path, 0, group)
            mode |= 0o440
        os.chmod(path, mode)
    if group is not None:
        os.chown(folder, 0, group)
    os.chmod(folder, 0o755 if group is None else 0o2755)


def _own_for_group(folder: Path, group: int | None) -> None:
    """fsGroup on a writable volume: group-owned and group-writable with setgid, as the kubelet makes it."""
    if group is None:
        return
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(root) / name
            os.chown(path, -1, group, follow_symlinks=False)
            if not path.is_symlink():
                os.chmod(path, path.stat().st_mode | 0o060 | (0o2010 if path.is_dir() else 0))
    os.chown(folder, -1, group)
    os.chmod(folder, folder.stat().st_mode | 0o2070)


def prepare(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_dir: Path,
    lookup: Lookup,
    claims: Mapping[str, Path],
) -> list[Mount]:
    """Every mount one container needs, its volume contents written under `pod_dir` (written once per
    pod: a volume is shared by the pod's containers)."""
    spec = pod.get("spec") or {}
    group = (spec.get("securityContext") or {}).get("fsGroup")
    sources: dict[str, tuple[Path | None, str | None]] = {}
    for volume in spec.get("volumes") or []:
        name = volume["name"]
        folder = pod_dir / "volumes" / name
        if "configMap" in volume or "secret" in volume:
            if not folder.exists():
                _write_files(folder, volume_files(volume, lookup), group)
            sources[name] = (folder, None)
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"].get("claimName", "")
            if claim not in claims:
                raise VolumeError(
                    f"volume {name!r}: persistentVolumeClaim {claim!r} is not bound on this node"
                )
            host = claims[claim]
            if not volume["persistentVolumeClaim"].get("readOnly"):
                _own_for_group(host, group)
            sources[name] = (host, None)
        elif "emptyDir" in volume:
            empty = volume["emptyDir"] or {}
            if empty.get("medium") == "Memory":
                sources[name] = (None, str(empty.get("sizeLimit") or "64Mi"))
            else:
                folder.mkdir(parents=True, exist_ok=True)
                os.chmod(folder, 0o777)
                sources[name] = (folder, None)
        else:
            raise VolumeError(
                f"volume {name!r}: this node supports configMap, secret, persistentVolumeClaim and emptyDir"
            )
    mounts: list[Mount] = []
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in sources:
            raise VolumeError(f"volumeMount {vm['name']!r}: no such volume in the pod")
        host, size = sources[vm["name"]]
        read_only = bool(vm.get("readOnly"))
        if host is None:
            mounts.append(Mount(target=vm["mountPath"], tmpfs_size=_tmpfs_size(size or "64Mi")))
            continue
        sub = vm.get("subPath") or ""
        if ".." in Path(sub).parts or Path(sub).is_absolute():
            raise VolumeError(f"volumeMount {vm['name']!r}: subPath {sub!r} must be relative without '..'")
        source = host / sub if sub else host
        if sub and not source.exists():
            source.mkdir(parents=True)  # the kubelet creates a missing subPath folder
        mounts.append(Mount(target=vm["mountPath"], source=source, read_only=read_only))
    return mounts


def _tmpfs_size(quantity: str) -> str:
    from dverl_operator.objects.quantity import parse

    return str(int(parse(quantity)))


def blocked_ancestors(paths: Sequence[Path]) -> dict[Path, set[str]]:
    """For each path the container's user must reach (the image stand-in's interpreter, venv and code):
    the outermost ancestor other users may not traverse (Debian's /root is 0700, and pyenv's Python
    lives under it), with the child on the way there. A real image has no such folder; the pod's mount
    namespace then gets a traversable stand-in for it holding just those children."""
    out: dict[Path, set[str]] = {}
    for path in paths:
        parts = Path(os.path.realpath(path)).parts
        for i in range(1, len(parts) - 1):
            ancestor = Path(*parts[: i + 1])
            try:
                mode = ancestor.stat().st_mode
            except OSError:
                break
            if not mode & 0o001:
                out.setdefault(ancestor, set()).add(parts[i + 1])
                break
    return out


def mount_script(
    mounts: list[Mount],
    etc_files: Mapping[str, Path],
    hostname: str,
    workdir: Path,
    workdir_target: str,
    read_only_root: bool = False,
    reachable: Mapping[Path, set[str]] | None = None,
    image_paths: Sequence[Path] = (),
) -> str:
    """The bash run inside the pod's new mount and UTS namespaces before exec'ing the container's process
    (`exec "$@"`): binds in order, read-only where asked, the pod's hostname and working folder.

    Every source is opened first and bound through its /proc/self/fd link (`mount -c`: no path
    lookup), so a mount that covers the node's folder (a pod's `/tmp` emptyDir over the test's tmp
    folder) cannot hide the sources bound after it."""
    lines = ["set -e"]
    binds: list[tuple[Path, str, bool]] = [(workdir, workdir_target, read_only_root)]
    binds += [(source, target, True) for target, source in etc_files.items()]  # /etc/hosts, resolv.conf
    fds: dict[Path, int] = {}
    for mount in mounts:
        if mount.source is not None:
            binds.append((mount.source, mount.target, mount.read_only))
    for source, _, _ in binds:
        if source not in fds:
            fds[source] = 10 + len(fds)
            lines.append(f"exec {fds[source]}<{shlex.quote(str(source))}")
    # The image stand-in's own files (venv, code) where a volume covers a folder holding them (a pod's
    # /tmp emptyDir over a checkout under /tmp): bound back after the volumes, as an image's files would
    # sit beside its volumes rather than under them.
    targets = [Path(workdir_target)] + [Path(m.target) for m in mounts]
    covered = [p for p in image_paths if any(t == p or t in p.parents for t in targets)]
    for source in covered:
        if source not in fds:
            fds[source] = 10 + len(fds)
            lines.append(f"exec {fds[source]}<{shlex.quote(str(source))}")
    for blocked, children in (reachable or {}).items():
        for child in sorted(children):
            source = blocked / child
            if source not in fds:
                fds[source] = 10 + len(fds)
                lines.append(f"exec {fds[source]}<{shlex.quote(str(source))}")
        lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(blocked))}")
        for child in sorted(children):
            quoted = shlex.quote(str(blocked / child))
            lines.append(f"mkdir -p {quoted}")
            lines.append(f"mount -c --bind /proc/self/fd/{fds[blocked / child]} {quoted}")

    def bind(source: Path, target: str, read_only: bool) -> None:
        quoted = shlex.quote(target)
        # Nested mountPaths land inside an earlier volume, where the kubelet creates them too.
        lines.append(f"[ -e {quoted} ] || {'touch' if source.is_file() else 'mkdir -p'} {quoted}")
        lines.append(f"mount -c --bind /proc/self/fd/{fds[source]} {quoted}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {quoted}")

    for source, target, read_only in binds[: 1 + len(etc_files)]:
        bind(source, target, read_only)
    for mount in mounts:
        if mount.source is None:
            quoted = shlex.quote(mount.target)
            lines.append(f"[ -e {quoted} ] || mkdir -p {quoted}")
            lines.append(f"mount -t tmpfs -o size={mount.tmpfs_size},mode=1777 tmpfs {quoted}")
        else:
            bind(mount.source, mount.target, mount.read_only)
    for source in covered:
        quoted = shlex.quote(str(source))
        lines.append(f"mkdir -p {quoted}")
        lines.append(f"mount -c --bind /proc/self/fd/{fds[source]} {quoted}")
        lines.append(f"mount -o remount,bind,ro {quoted}")
    lines += [f"exec {fd}<&-" for fd in fds.values()]
    if read_only_root:
        lines.append("mount -o remount,bind,ro /")
    lines.append(f"hostname {shlex.quote(hostname)}")
    lines.append(f"cd {shlex.quote(workdir_target)}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def mountpoints(mounts: list[Mount], workdir_target: str) -> list[tuple[str, bool]]:
    """(target, is_file) for each mountpoint, so the node can create the missing ones on the host."""
    out = [(workdir_target, False)]
    for mount in mounts:
        is_file = mount.source is not None and mount.source.is_file()
        out.append((mount.target, is_file))
    return out
