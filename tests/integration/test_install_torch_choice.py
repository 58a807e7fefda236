"""scripts/install.sh installs the torch build the machine can use, and says which: the CUDA build from
PyPI only where an NVIDIA GPU answers `nvidia-smi`; otherwise the CPU build, from the wheel pip finds
locally when there is one (no index needed) or else from PyTorch's CPU index."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT


def _choice(tmp_path: Path, *, gpu: bool, local_wheel: bool, override: str | None = None) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").unlink(missing_ok=True)
    (bin_dir / "python").symlink_to(sys.executable)
    smi = bin_dir / "nvidia-smi"
    smi.unlink(missing_ok=True)
    if gpu:  # the one probe of the hardware the script makes, answering as a GPU machine's does
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
        smi.chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    if local_wheel:
        _cpu_wheel(wheels)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,  # only the find-links given here
        "PIP_FIND_LINKS": str(wheels),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        **({"DVERL_TORCH": override} if override else {}),
    }
    script = f". {ROOT / 'scripts' / 'torch-choice.sh'} && torch_choice"
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _cpu_wheel(folder: Path) -> None:
    """A wheel named and described as torch's CPU build (its contents do not matter to the choice)."""
    info = "torch-2.13.0+cpu.dist-info"
    path = folder / "torch-2.13.0+cpu-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")


def test_a_gpu_machine_gets_the_cuda_build_from_pypi(tmp_path: Path) -> None:
    said, *args = _choice(tmp_path, gpu=True, local_wheel=True)
    assert args == ["torch==2.13.0"] and "the CUDA build from PyPI (an NVIDIA GPU is present" in said


def test_a_machine_without_a_gpu_gets_the_cpu_build_found_locally(tmp_path: Path) -> None:
    said, *args = _choice(tmp_path, gpu=False, local_wheel=True)
    assert args == ["torch==2.13.0"] and "the CPU build found locally (no NVIDIA GPU here" in said


def test_a_machine_without_a_gpu_or_a_local_wheel_gets_the_cpu_index(tmp_path: Path) -> None:
    said, *args = _choice(tmp_path, gpu=False, local_wheel=False)
    assert args == ["torch==2.13.0", "--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert "the CPU build from https://download.pytorch.org/whl/cpu (no NVIDIA GPU here" in said


@pytest.mark.parametrize(
    ("override", "gpu", "expected"), [("cpu", True, "CPU build"), ("cuda", False, "CUDA build")]
)
def test_dverl_torch_overrides_the_guess(tmp_path: Path, override: str, gpu: bool, expected: str) -> None:
    said, *_ = _choice(tmp_path, gpu=gpu, local_wheel=True, override=override)
    assert expected in said


def test_install_sh_installs_what_the_choice_says_and_says_it() -> None:
    text = (ROOT / "scripts" / "install.sh").read_text()
    assert ". scripts/torch-choice.sh" in text and 'echo "install.sh: ${TORCH_CHOICE[0]}"' in text
    assert 'python -m pip install -q "${TORCH_CHOICE[@]:1}"' in text
    assert "torch==" not in text  # the version and its source live in torch-choice.sh alone
