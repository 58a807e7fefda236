"""The paths the few imports inside functions keep light, run for real: the operator, `dverl validate`,
`plan` and `crd` load no torch, nor does a job's worker before it has left its memory estimate
(tests/unit/test_imports_in_functions.py holds the imports themselves)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = next(p for p in Path(__file__).parents if (p / "pyproject.toml").is_file())
HEAVY = ("torch", "transformers", "hivemind", "vllm", "ray", "peft", "wandb", "mlflow")


def _loaded(code: str) -> list[str]:
    """The heavy packages a fresh interpreter holds after `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_operator_the_manifest_commands_and_a_workers_estimate_load_no_torch() -> None:
    manifest = ROOT / "examples" / "tiny-grpo.yaml"
    assert _loaded("import dverl_operator.main") == []
    for command in (["validate", str(manifest)], ["plan", str(manifest)], ["crd"]):
        run = (
            "import contextlib, io\n"
            "from decentralized_verl.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    assert main({command!r}) == 0\n"
        )
        assert _loaded(run) == [], command
    # A job's worker: its config read and its estimate left before torch loads, so a memory limit too
    # small for torch still gets the planner's figure into the OOMKilled failure.
    worker = (
        "import tempfile\n"
        "from pathlib import Path\n"
        "import decentralized_verl.entrypoints.worker\n"
        "from decentralized_verl.entrypoints.worker_config import leave_memory_estimate, load_worker_config\n"
        f"spec, _, base = load_worker_config(Path({str(manifest)!r}), None)\n"
        "with tempfile.TemporaryDirectory() as folder:\n"
        "    log = Path(folder) / 'termination-log'\n"
        "    log.touch()\n"
        "    assert leave_memory_estimate(spec, 'learner', 0, base, log), 'no estimate left'\n"
    )
    assert _loaded(worker) == []
