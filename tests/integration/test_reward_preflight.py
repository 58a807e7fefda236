"""`dverl run` checks a user's reward imports before any worker starts, in a child: the module's code
never runs in the launcher, which goes on to issue every role's secrets."""

from __future__ import annotations

import os
from pathlib import Path

from decentralized_verl.cli.main import main
from decentralized_verl.launch.preflight import preflight_problems
from decentralized_verl.spec.manifest import load_job
from tests.unit.test_manifest_strict import _spec, _write


def test_run_reads_data_and_imports_the_reward_before_any_worker(tmp_path: Path, capsys) -> None:
    spec = _spec(data={"train": "missing.jsonl", "eval": str(tmp_path), "rewardType": "no_such_module:score"})
    path = _write(tmp_path, spec)
    job = load_job(path)
    problems = [str(p) for p in preflight_problems(job.spec, tmp_path)]
    assert any(p.startswith("spec.data.train:") and "missing.jsonl" in p for p in problems), problems
    assert any(p.startswith("spec.data.eval:") for p in problems), problems
    assert any(p.startswith("spec.data.rewardType:") and "no_such_module" in p for p in problems), problems
    assert main(["run", str(path), "--output", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run" / "logs").exists()  # no worker was started
    assert "spec.data.rewardType" in capsys.readouterr().err


def test_a_user_reward_next_to_the_manifest_imports_in_a_child(tmp_path: Path) -> None:
    marker = tmp_path / "imported-by"
    (tmp_path / "my_reward_mod.py").write_text(
        f"import os\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "def score(prompt, completion, **kw):\n    return 1.0\n"
    )
    job = load_job(_write(tmp_path, _spec(data={"rewardType": "my_reward_mod:score"})))
    assert preflight_problems(job.spec, tmp_path) == []
    assert marker.read_text() != str(os.getpid())  # imported, but not here
