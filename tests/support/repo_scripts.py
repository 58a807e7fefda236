"""The checkout's scripts (scripts/*.py) loaded as modules, so a test calls what they define."""

from __future__ import annotations

import importlib.util
import sys

from tests.support.paths import ROOT


def load_script(name: str = "make_example_data"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
