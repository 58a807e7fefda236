"""The spec's catalogue and the registries agree, and a registry that disagrees stops at import.

Each disagreement is made for real in a fresh interpreter: the catalogue's list is changed before the
registry module is imported, and that import must fail naming the name on each side.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import ast

import pytest

from decentralized_verl.spec.catalogue import CatalogueMismatch, check_listed, check_registry
from decentralized_verl.spec.catalogue import algorithms as algorithm_names
from decentralized_verl.spec.catalogue.backends import BACKEND_KINDS, HF, VLLM, backend_kind, names_where
from decentralized_verl.spec.catalogue.environments import BUILTIN_ENVIRONMENTS, ENVIRONMENT_OPTIONS
from decentralized_verl.spec.catalogue.rewards import BUILTIN_REWARD_TYPES
from tests.support.paths import ROOT


def test_check_registry_names_both_sides() -> None:
    check_registry("widget", ["a", "b"], ("b", "a"))
    with pytest.raises(CatalogueMismatch) as info:
        check_registry("widget", ["a", "c"], ("a", "b"))
    assert str(info.value) == (
        "widget names: registered but not in the catalogue: c; in the catalogue but not registered: b "
        "(spec/catalogue/)"
    )
    with pytest.raises(
        CatalogueMismatch, match=r"widget 'z' is not in the catalogue \(spec/catalogue/: a, b\)"
    ):
        check_listed("widget", "z", ("a", "b"))


def test_the_registries_serve_exactly_the_catalogue() -> None:
    from decentralized_verl.algorithms import registry
    from decentralized_verl.backends.factory import ENGINES
    from decentralized_verl.environments.registry import ENVIRONMENTS
    from decentralized_verl.rewards.registry import REWARD_TYPES

    registry.load()
    assert list(registry.ADVANTAGE_ESTIMATORS) != [] and set(registry.ADVANTAGE_ESTIMATORS) == set(
        algorithm_names.ADVANTAGE_ESTIMATOR_NAMES
    )
    assert set(REWARD_TYPES) == set(BUILTIN_REWARD_TYPES)
    assert set(ENVIRONMENTS) == set(BUILTIN_ENVIRONMENTS)
    assert all(ENVIRONMENTS[name].Options is ENVIRONMENT_OPTIONS[name] for name in ENVIRONMENTS)
    assert set(ENGINES) == set(BACKEND_KINDS.values())


def test_backend_kinds_by_name_and_capability() -> None:
    assert list(BACKEND_KINDS) == ["hf", "vllm"]
    assert backend_kind("hf") is HF and backend_kind("vllm") is VLLM and str(VLLM) == "vllm"
    with pytest.raises(ValueError, match=r"generation backend 'sglang' is unknown \(known: hf, vllm\)"):
        backend_kind("sglang")
    assert names_where(lambda kind: kind.layer_spans) == ("hf",)
    assert names_where(lambda kind: kind.rollout_only) == ("vllm",)
    assert names_where(lambda kind: kind.tensor_parallel) == ("vllm",)


def _compares_a_backend_name(node: ast.Compare) -> bool:
    """`x == "vllm"`, `"hf" != x`, `x in ("hf", "both")`: a comparison with a backend's name in it (a URI's
    `scheme == "hf"` is another "hf")."""
    names = set(BACKEND_KINDS)
    for part in (node.left, *node.comparators):
        values = part.elts if isinstance(part, ast.Tuple | ast.List | ast.Set) else [part]
        if any(isinstance(v, ast.Constant) and v.value in names for v in values):
            return "scheme" not in ast.unparse(node)
    return False


def test_no_code_compares_backend_names() -> None:
    """Code that behaves differently per backend asks its `BackendKind` for the capability it needs; a name
    compared as a string would silently go wrong for the next backend."""
    catalogue = ROOT / "worker_image" / "decentralized_verl" / "spec" / "catalogue" / "backends.py"
    offenders = []
    for folder in ("worker_image", "operator", "benchmarks", "testing"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == catalogue or "_pb2" in path.name:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare) and _compares_a_backend_name(node):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []
    seen = ast.parse('backend == "vllm"\nrole.backend != "hf"\nname in ("hf", "both")\nuri.scheme == "hf"')
    found = [n for n in ast.walk(seen) if isinstance(n, ast.Compare) and _compares_a_backend_name(n)]
    assert len(found) == 3
