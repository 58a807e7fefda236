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
    placed = {name.strip() for layer in layers for name in layer.split(":")}
    found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    found |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert not placed & BESIDE_THE_LAYERS
    assert found - placed - BESIDE_THE_LAYERS == set(), "place these in a layer of pyproject.toml"
    assert placed - found == set(), "layers name packages that no longer exist"
