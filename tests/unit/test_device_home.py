"""One device home: no product module but `runtime/device.py` and `runtime/device_choice.py` names a device
kind, a backend or `torch.cuda`. Code elsewhere is handed a device, so a worker's device follows from the
one decision its entry made, and a CPU and a GPU run take the same code.

At least as strict as the repository's before-stop hook (`git grep` of the same patterns), and it reads
the files on disk, so a module not yet committed is held to it too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = next(p for p in Path(__file__).parents if (p / "pyproject.toml").is_file())
PACKAGES = (ROOT / "worker_image" / "decentralized_verl", ROOT / "operator" / "dverl_operator")
HOME = {
    ROOT / "worker_image/decentralized_verl/runtime/device.py",
    ROOT / "worker_image/decentralized_verl/runtime/device_choice.py",
}
GENERATED = ("_pb2.py", "_pb2_grpc.py")
NAMING = re.compile(
    r"torch\.cuda\b"  # torch.cuda.anything, and torch.cuda itself
    r"|\.cuda\("  # tensor.cuda()
    r"|[\"']nccl[\"']|[\"']cuda[\"']"  # the names as strings
    r"|[\"']cuda:"  # "cuda:0", f"cuda:{i}"
    r"|\bfrom torch import [^\n]*\bcuda\b|\bimport torch\.cuda\b"
    r"|[\"']cpu:gloo"  # the mixed backend spelled out
)


def product_files() -> list[Path]:
    return sorted(
        path for package in PACKAGES for path in package.rglob("*.py") if not path.name.endswith(GENERATED)
    )


def offences(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if NAMING.search(line)]


def test_no_module_outside_the_home_names_a_device() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for path in product_files()
        if path not in HOME and (hits := offences(path.read_text(encoding="utf-8")))
    }
    assert not found, f"devices named outside runtime/device.py: {found}"


def test_the_check_sees_every_spelling_it_forbids() -> None:
    """The pattern catches what it is for (a check that cannot fail would prove nothing)."""
    for line in (
        "x = torch.cuda.is_available()",
        "model.cuda()",
        'dist.init_process_group("nccl")',
        "device = 'cuda'",
        'torch.device(f"cuda:{rank}")',
        "from torch import cuda",
        "import torch.cuda",
        'backend = "cpu:gloo,cuda:nccl"',
        "if torch.cuda:",
    ):
        assert offences(line), line
    for line in ('resources = {"nvidia.com/gpu": 1}', "device = process_device()", "# on a GPU under NCCL"):
        assert not offences(line), line


def test_the_home_exists_and_names_them() -> None:
    """The allowed files are where the names live (the list above is not stale)."""
    for path in HOME:
        assert offences(path.read_text(encoding="utf-8")), path


def test_the_gpu_check_runs_every_file_of_gpu_marked_tests() -> None:
    """Every test file marked `gpu` is one the GPU check's `gpu_tests` part runs (it names them, so as
    not to collect the whole suite on the GPU machine)."""
    import ast

    source = (ROOT / "benchmarks" / "_gpu_job.py").read_text(encoding="utf-8")
    listed = next(
        ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "GPU_TEST_FILES"
    )
    marked = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"^\s*@?pytest\.mark\.gpu\b", path.read_text(encoding="utf-8"), re.MULTILINE)
    }
    assert marked and marked == set(listed)
