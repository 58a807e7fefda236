"""The test node's cgroup v2 delegation, on a folder standing in for the cgroup tree: the kernel's
no-internal-process rule (a cgroup holding processes cannot hand a controller to its children: EBUSY) is
played by the stand-in's writer, so the path a v2 host takes runs on the v1 machines these tests run on."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.support.node_harness import cgroups


def tree(tmp_path: Path, procs: str, subtree: str = "") -> Path:
    """Our own cgroup with its pids (written past the kernel stand-in: this is the state it starts in)."""
    parent = tmp_path / "own"
    parent.mkdir()
    for name, text in (("cgroup.subtree_control", subtree), ("cgroup.procs", procs)):
        with (parent / name).open("w") as out:
            out.write(text)
    return parent


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Writes into the stand-in tree as the kernel takes them: a pid written into a cgroup.procs moves
    out of the one it was in; `+memory` into a subtree_control is refused while that cgroup holds pids."""
    writes: list[tuple[str, str]] = []
    plain = Path.write_text

    def write_text(path: Path, text: str, *args, **kwargs) -> int:
        inside = path.parent.name == cgroups.LEAF
        writes.append((f"{cgroups.LEAF}/{path.name}" if inside else path.name, text))
        if path.name == "cgroup.subtree_control" and (path.parent / "cgroup.procs").read_text().split():
            raise OSError(errno.EBUSY, "Device or resource busy")
        if path.name == "cgroup.procs" and path.parent.name == cgroups.LEAF:
            source = path.parent.parent / "cgroup.procs"
            plain(source, " ".join(p for p in source.read_text().split() if p != text))
            return plain(path, (path.read_text() if path.exists() else "") + f"{text} ")
        return plain(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    return writes


def test_an_empty_cgroup_delegates_memory_in_one_write(tmp_path: Path, kernel: list) -> None:
    parent = tree(tmp_path, "")
    cgroups.delegate_memory(parent)
    assert kernel == [("cgroup.subtree_control", "+memory")]
    assert not (parent / cgroups.LEAF).exists()


def test_a_cgroup_holding_processes_moves_them_to_its_leaf_first(tmp_path: Path, kernel: list) -> None:
    parent = tree(tmp_path, "1 42 77")
    cgroups.delegate_memory(parent)
    assert (parent / "cgroup.procs").read_text().split() == []
    assert (parent / cgroups.LEAF / "cgroup.procs").read_text().split() == ["1", "42", "77"]
    assert kernel[-1] == ("cgroup.subtree_control", "+memory")
    assert [w for w in kernel if w[0].startswith(cgroups.LEAF)] == [
        (f"{cgroups.LEAF}/cgroup.procs", pid) for pid in ("1", "42", "77")
    ]


def test_memory_already_delegated_is_left_as_it_is(tmp_path: Path, kernel: list) -> None:
    parent = tree(tmp_path, "1", subtree="cpu memory")
    cgroups.delegate_memory(parent)
    assert kernel == []


def test_a_refusal_other_than_busy_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = tree(tmp_path, "")

    def refuse(path: Path, text: str, *args, **kwargs) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(Path, "write_text", refuse)
    with pytest.raises(PermissionError):
        cgroups.delegate_memory(parent)
