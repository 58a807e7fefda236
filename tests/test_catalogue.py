"""The spec's catalogue and the registries agree, and a registry that disagrees stops at import.

Each disagreement is made for real in a fresh interpreter: the catalogue's list is changed before the
registry module is imported, and that import must fail naming the name on each side."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

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


def _import_fails(setup: str, statement: str) -> str:
    """Run `setup` (changes to the catalogue), then `statement`; return the CatalogueMismatch's message."""
    code = textwrap.dedent(
        f"""
        import sys
        from decentralized_verl.spec.catalogue import CatalogueMismatch
        {setup}
        try:
            {statement}
        except CatalogueMismatch as exc:
            print(exc)
            sys.exit(3)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    return done.stdout.strip()


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


@pytest.mark.parametrize(
    ("setup", "module", "expected"),
    [
        (
            "c.BUILTIN_REWARD_TYPES = c.BUILTIN_REWARD_TYPES + ('vibes',)",
            "decentralized_verl.rewards.registry",
            "reward type names: in the catalogue but not registered: vibes",
        ),
        (
            "c.BUILTIN_REWARD_TYPES = tuple(n for n in c.BUILTIN_REWARD_TYPES if n != 'code')",
            "decentralized_verl.rewards.registry",
            "reward type names: registered but not in the catalogue: code",
        ),
    ],
)
def test_a_reward_registry_that_disagrees_fails_at_import(setup: str, module: str, expected: str) -> None:
    message = _import_fails(
        f"import decentralized_verl.spec.catalogue.rewards as c; {setup}", f"import {module}"
    )
    assert message.startswith(expected), message


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (
            "c.BUILTIN_ENVIRONMENTS = c.BUILTIN_ENVIRONMENTS + ('chess',)",
            "environment names: in the catalogue but not registered: chess",
        ),
        (
            "c.BUILTIN_ENVIRONMENTS = tuple(n for n in c.BUILTIN_ENVIRONMENTS if n != 'calculator')",
            "environment names: registered but not in the catalogue: calculator",
        ),
        (
            "c.ENVIRONMENT_OPTIONS['calculator'] = c.GuessingGameOptions",
            "environment 'calculator': Calculator.Options is not the catalogue's options model",
        ),
    ],
)
def test_an_environment_registry_that_disagrees_fails_at_import(setup: str, expected: str) -> None:
    message = _import_fails(
        f"import decentralized_verl.spec.catalogue.environments as c; {setup}",
        "import decentralized_verl.environments.registry",
    )
    assert message.startswith(expected), message


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (
            "c.BACKEND_KINDS['sglang'] = dataclasses.replace(c.VLLM, name='sglang')",
            "backend names: in the catalogue but not registered: sglang",
        ),
        ("del c.BACKEND_KINDS['vllm']", "backend names: registered but not in the catalogue: vllm"),
    ],
)
def test_a_backend_factory_that_disagrees_fails_at_import(setup: str, expected: str) -> None:
    message = _import_fails(
        f"import dataclasses; import decentralized_verl.spec.catalogue.backends as c; {setup}",
        "import decentralized_verl.backends.factory",
    )
    assert message.startswith(expected), message


def test_an_algorithm_registry_that_disagrees_fails_when_it_loads() -> None:
    """The tables fill as the torch modules import: a listed name without a function fails `load()`, and
    a function registered under a name the catalogue lacks fails as it is registered."""
    missing = _import_fails(
        "import decentralized_verl.spec.catalogue.algorithms as c; "
        "c.KL_ESTIMATOR_NAMES = c.KL_ESTIMATOR_NAMES + ('k9',); "
        "from decentralized_verl.algorithms import registry",
        "registry.load()",
    )
    assert missing.startswith("KL estimator names: in the catalogue but not registered: k9"), missing
    unlisted = _import_fails(
        "import decentralized_verl.spec.catalogue.algorithms as c; "
        "c.POLICY_LOSS_NAMES = tuple(n for n in c.POLICY_LOSS_NAMES if n != 'gspo'); "
        "from decentralized_verl.algorithms import registry",
        "registry.load()",
    )
    assert unlisted.startswith("policy loss 'gspo' is not in the catalogue"), unlisted


def test_the_catalogue_checks_its_own_presets_at_import() -> None:
    """A preset naming an estimator the catalogue does not list stops the catalogue itself."""
    code = textwrap.dedent(
        """
        import pathlib, sys, types
        import decentralized_verl.spec.catalogue as package
        path = pathlib.Path(package.__file__).with_name("algorithms.py")
        source = path.read_text().replace('advantage_estimator="rloo"', 'advantage_estimator="rlooo"')
        module = sys.modules["catalogue_copy"] = types.ModuleType("catalogue_copy")
        try:
            exec(compile(source, str(path), "exec"), module.__dict__)
        except package.CatalogueMismatch as exc:
            print(exc)
            sys.exit(3)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "preset's advantage estimator 'rlooo' is not in the catalogue" in done.stdout


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
