"""The import contracts in pyproject.toml hold (import-linter, run for real), and they name every package:
a new package or top-level module must be placed in a layer, or declared as standing beside them."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "worker_image" / "decentralized_verl"
BESIDE_THE_LAYERS: set[str] = set()
"""Modules standing outside every layer: none (docs/architecture.md)."""


def test_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'worker_image'}{os.pathsep}{ROOT / 'operator'}"}
    done = subprocess.run(
        [str(lint_imports), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_every_package_and_module_has_a_place() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    placed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    found |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert not placed & BESIDE_THE_LAYERS
    assert found - placed - BESIDE_THE_LAYERS == set(), "place these in a layer of pyproject.toml"
    assert placed - found == set(), "layers name packages that no longer exist"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


TYPE_ONLY_CIRCLES_LEFT: list[set[str]] = [
    # The spec's source rules and the source parsers name each other's types; the pure source parsing
    # moving into spec/ ends it. Remove the entry then (the test below says so).
    {
        "decentralized_verl.sources.paths",
        "decentralized_verl.spec",
        "decentralized_verl.spec.job",
        "decentralized_verl.spec.rules",
        "decentralized_verl.spec.source_rules",
    },
]
"""Circles closed only by imports under TYPE_CHECKING, still to be broken."""


def _import_graph(*, type_checking: bool) -> dict[str, set[str]]:
    """Module -> the modules it imports, imports inside functions included (grimp)."""
    import grimp

    sys.path[:0] = [str(ROOT / "worker_image")]
    try:
        graph = grimp.build_graph(
            "decentralized_verl", exclude_type_checking_imports=not type_checking, cache_dir=None
        )
    finally:
        del sys.path[0]
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def test_no_module_imports_itself_round_a_circle() -> None:
    """Imports inside functions count too."""
    assert _cycles(_import_graph(type_checking=False)) == []


def test_no_circle_closes_through_imports_for_type_checkers() -> None:
    """Imports under TYPE_CHECKING count too: a type-only circle ties modules together for a reader."""
    found = [set(c) for c in _cycles(_import_graph(type_checking=True))]
    assert [sorted(c) for c in found if c not in TYPE_ONLY_CIRCLES_LEFT] == []
    gone = [sorted(c) for c in TYPE_ONLY_CIRCLES_LEFT if c not in found]
    assert gone == [], "broken at last: remove these from TYPE_ONLY_CIRCLES_LEFT"


def test_the_circle_finder_finds_circles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
