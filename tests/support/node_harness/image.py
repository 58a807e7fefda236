"""The worker image, played by a venv: its entrypoint, user, working folder and environment, and the
mapping of a container's command line onto the venv's interpreter and console scripts (`dverl`
-> <venv>/bin/dverl). The images a node holds, by name, each with the venv that plays it: the test venv
for the plain worker image, the vLLM venv (scripts/install-vllm.sh) for its `-vllm-cpu` flavour. Pure
apart from reading the process's own interpreter and import path and whether a venv's interpreter exists.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decentralized_verl import __version__
from decentralized_verl.spec.source_paths import IMAGE_EXAMPLES_DIR
from tests.support.paths import ROOT

WORKER_REPOSITORY = "ghcr.io/dverl/dverl-worker"
"""Where the chart's worker image lives (charts/dverl/values.yaml `workerImage`)."""
TEST_WORKER_IMAGE = "registry.example/dverl-worker:test"
"""The worker image the tests' operator puts into pods (its DVERL_WORKER_IMAGE)."""
VLLM_CPU_IMAGE = f"{WORKER_REPOSITORY}:{__version__}-vllm-cpu"
"""The worker image with vLLM's CPU build (Dockerfile --build-arg VLLM=cpu), as the vLLM examples name it."""
VLLM_CUDA_IMAGE = f"{WORKER_REPOSITORY}:{__version__}-vllm"
"""The worker image with vLLM's CUDA build (Dockerfile --build-arg VLLM=cuda), as the GPU-sized examples
name it: held only by a node that plays a GPU pool's node (gpus.py), played there by the vLLM venv."""
VLLM_VENV = ROOT / ".venv-vllm"
"""Where scripts/install-vllm.sh makes the vLLM venv in this checkout."""


def _default_pythonpath() -> str:
    return os.environ.get("PYTHONPATH", "")


@dataclass(frozen=True)
class ImageStandIn:
    """What the Dockerfile's worker stage sets: ENTRYPOINT ["dverl"], USER 10001:10001, WORKDIR
    /home/dverl, and the venv's scripts first on PATH. The test's import path (the worktree under test)
    stands in for the code baked into the image."""

    venv: Path = field(default_factory=lambda: Path(sys.executable).parent.parent)
    pythonpath: str = field(default_factory=_default_pythonpath)
    entrypoint: tuple[str, ...] = ("dverl",)
    cmd: tuple[str, ...] = ("--help",)
    user: int = 10001
    group: int = 10001
    workdir: str = "/home/dverl"
    files: Mapping[str, Path] = field(default_factory=lambda: {IMAGE_EXAMPLES_DIR: ROOT / "examples"})
    """What the Dockerfile COPYs into the image, by its path there: the shipped examples, from this
    checkout (bound read-only into every container, as the image's layers are)."""

    def code_paths(self) -> list[Path]:
        """What the image's user must be able to read: the interpreter (through its symlinks), the venv,
        the code under test (the import path, and the checkout the venv's editable install points at)."""
        paths = [Path(os.path.realpath(self.venv / "bin" / "python")), self.venv, ROOT]
        paths += [Path(p) for p in self.pythonpath.split(os.pathsep) if p]
        return paths

    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.venv / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH": self.pythonpath,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "HOME": self.workdir,
            "HF_HOME": f"{self.workdir}/.cache/huggingface",
        }


def resolve_argv(container: Mapping[str, Any], image: ImageStandIn, env: Mapping[str, str]) -> list[str]:
    """The process a container runs: `command` replaces the entrypoint and `args` the image's CMD (CMD is
    dropped when only `command` is given), `$(VAR)` expanded from the container's env, and a bare program
    name found in the venv first (python -> the venv's interpreter)."""
    from tests.support.node_harness.env import _expand

    command: Sequence[str] | None = container.get("command")
    args: Sequence[str] | None = container.get("args")
    if command:
        argv = [*command, *(args or [])]
    else:
        argv = [*image.entrypoint, *(args if args is not None else image.cmd)]
    argv = [_expand(str(a), env) for a in argv]
    if not argv:
        raise ValueError(f"container {container.get('name')!r}: nothing to run")
    program = argv[0]
    if "/" not in program:
        if program in ("python", "python3"):
            program = "python"
        candidate = image.venv / "bin" / program
        if candidate.exists():
            argv[0] = str(candidate)
        else:
            for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
                if Path(folder, program).exists():
                    argv[0] = str(Path(folder, program))
                    break
            else:
                raise FileNotFoundError(
                    f"container {container.get('name')!r}: {program!r} is not in the image"
                )
    return argv


def vllm_venv(path: Path | None = None) -> Path | None:
    """The vLLM venv that plays the `-vllm-cpu` image: `path`, or else this checkout's `.venv-vllm`; None
    when it has no interpreter (never installed: CI has none)."""
    venv = path if path is not None else VLLM_VENV
    return venv if (venv / "bin" / "python").exists() else None


def node_images(plain: ImageStandIn, vllm: Path | None = None, gpus: bool = False) -> dict[str, ImageStandIn]:
    """The images a test node holds, by name, and the stand-in that plays each: `plain` (the test venv)
    under the names the tests' operator, the chart and the plain examples use, and as the `-verifiers`
    flavour when its venv has verifiers (scripts/install.sh installs that extra); the `-vllm-cpu` flavour
    only when the node is given a vLLM venv (`vllm`), played by that venv's interpreter and scripts with
    the same files (vLLM needs its own torch build, so it lives in a venv of its own), and on a node that
    plays a GPU pool's node (`gpus`) the CUDA `-vllm` flavour too, played by the same venv (its
    containers compute on the CPU: gpus.py hands them the worker's CPU override). Any other name
    cannot be pulled: its container waits in ErrImagePull / ImagePullBackOff, as a kubelet's does when
    the registry lacks the image."""
    names = {"test", TEST_WORKER_IMAGE, f"{WORKER_REPOSITORY}:{__version__}", f"{WORKER_REPOSITORY}:latest"}
    if importlib.util.find_spec("verifiers") is not None:
        names.add(f"{WORKER_REPOSITORY}:{__version__}-verifiers")
    images = dict.fromkeys(names, plain)
    if vllm is not None:
        # The vLLM venv's own editable install may point at another checkout: the code under test goes
        # first on its import path, as the image would carry it.
        tested = [str(ROOT / "worker_image"), str(ROOT / "operator"), *filter(None, [plain.pythonpath])]
        images[VLLM_CPU_IMAGE] = dataclasses.replace(plain, venv=vllm, pythonpath=os.pathsep.join(tested))
        if gpus:
            images[VLLM_CUDA_IMAGE] = images[VLLM_CPU_IMAGE]
    return images
