"""The import contracts in pyproject.toml hold (import-linter, run for real), and they name every package:
a new package or top-level module must be placed in a layer, or declared as standing beside them.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import sys
import tomllib

from tests.support.paths import ROOT

PACKAGES = {
    "decentralized_verl": ROOT / "worker_image" / "decentralized_verl",
    "dverl_operator": ROOT / "operator" / "dverl_operator",
}
"""Each package with its own layers contract (its `containers`), and where it lives."""
BESIDE_THE_LAYERS: dict[str, set[str]] = {"decentralized_verl": set(), "dverl_operator": {"__main__"}}
"""Modules standing outside every layer: the operator's `python -m` entry only (docs/architecture.md)."""


def test_every_package_and_module_has_a_place() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {c["containers"][0]: c["layers"] for c in config["contracts"] if c["type"] == "layers"}
    assert set(contracts) == set(PACKAGES), "one layers contract per package"
    for container, layers in contracts.items():
        package, beside = PACKAGES[container], BESIDE_THE_LAYERS[container]
        placed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
        found = {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
        found |= {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
        assert not placed & beside
        assert found - placed - beside == set(), f"place these in a layer of {container}'s contract"
        assert placed - found == set(), f"{container}'s layers name packages that no longer exist"


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


def _import_graph(*, type_checking: bool) -> dict[str, set[str]]:
    """Module -> the modules it imports, imports inside functions included (grimp)."""
    import grimp

    sys.path[:0] = [str(ROOT / "worker_image"), str(ROOT / "operator")]
    try:
        graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=not type_checking, cache_dir=None)
    finally:
        del sys.path[:2]
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def test_no_module_imports_itself_round_a_circle() -> None:
    """Imports inside functions count too."""
    assert _cycles(_import_graph(type_checking=False)) == []


def test_no_circle_closes_through_imports_for_type_checkers() -> None:
    """Imports under TYPE_CHECKING count too: a type-only circle ties modules together for a reader."""
    assert [sorted(c) for c in _cycles(_import_graph(type_checking=True))] == []


def test_the_circle_finder_finds_circles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _sibling_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each import as an edge between the two siblings under the importer's and the imported's deepest
    common package: `a.b.x -> a.c.y` is `a.b -> a.c`, so a circle between packages shows even when no
    module circle closes (a module of `b` importing `c`, another of `c` importing `b`)."""
    edges: dict[str, set[str]] = {}
    for importer, imported in ((m, i) for m, targets in modules.items() for i in targets):
        left, right = importer.split("."), imported.split(".")
        common = 0
        while common < min(len(left), len(right)) and left[common] == right[common]:
            common += 1
        if common in (len(left), len(right)):
            continue  # a module importing its own package, or a package one of its modules
        edges.setdefault(".".join(left[: common + 1]), set()).add(".".join(right[: common + 1]))
    return edges


def test_no_package_imports_a_sibling_that_imports_it_back() -> None:
    """Packages at every depth form no circle, type-only imports and imports inside functions included."""
    assert _cycles(_sibling_graph(_import_graph(type_checking=True))) == []


def test_the_sibling_graph_joins_modules_under_their_packages() -> None:
    graph = _sibling_graph({"p.a.x": {"p.b.y"}, "p.b.z": {"p.a.w"}, "p.c": {"p"}})
    assert graph == {"p.a": {"p.b"}, "p.b": {"p.a"}}
    assert _cycles(graph) == [["p.a", "p.b"]]
