"""The spec's catalogue and the registries agree, and a registry that disagrees stops at import.

Each disagreement is made for real in a fresh interpreter: the catalogue's list is changed before the
registry module is imported, and that import must fail naming the name on each side.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


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
