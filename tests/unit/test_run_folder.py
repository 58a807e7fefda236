"""`dverl run` never writes over an earlier run: a used folder is refused with the choices, `--overwrite`
deletes it on purpose, and `--resume` with nothing to continue (no folder, no checkpoint, every step
done) says so instead of starting over or counting past the end. All before any worker starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decentralized_verl.cli.main import main
from decentralized_verl.launch.run_folder import RunFolderRefused, check_run_folder, clear_run_folder
from tests.support.paths import ROOT

TINY = str(ROOT / "examples" / "tiny-grpo.yaml")


def _earlier_run(folder: Path, *, steps: int | None = None, checkpoint: bool = True) -> None:
    folder.mkdir(parents=True)
    (folder / "job.yaml").write_text("kind: RLHFJob\n")
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    if checkpoint:
        (folder / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    if steps is not None:
        (folder / "summary.json").write_text(json.dumps({"steps": steps}))


def _check(folder: Path, *, resume: bool = False, overwrite: bool = False, total: int | None = 200) -> None:
    check_run_folder(
        folder, resume=resume, overwrite=overwrite, total_steps=total, checkpoints=folder / "checkpoints"
    )


def test_a_used_folder_is_refused_with_the_three_choices(tmp_path: Path) -> None:
    _earlier_run(tmp_path / "run")
    with pytest.raises(RunFolderRefused) as refused:
        _check(tmp_path / "run")
    said = str(refused.value)
    assert str(tmp_path / "run") in said and "metrics.jsonl" in said
    assert "--resume" in said and "--output DIR" in said and "--overwrite" in said


def test_a_folder_with_someone_elses_files_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderRefused, match=r"notes\.txt"):
        _check(tmp_path / "run")


@pytest.mark.parametrize("setup", [None, (), ("job.yaml",), ("job.yaml", "secrets")])
def test_an_absent_empty_or_refused_before_start_folder_is_used(tmp_path: Path, setup) -> None:
    folder = tmp_path / "run"
    if setup is not None:
        folder.mkdir()
        for name in setup:
            (folder / name).mkdir() if name == "secrets" else (folder / name).write_text("x")
    _check(folder)  # what a manifest refused at preflight leaves behind does not block the next try


def test_overwrite_deletes_the_earlier_run_and_checkpoints_kept_elsewhere(tmp_path: Path) -> None:
    _earlier_run(tmp_path / "run")
    elsewhere = tmp_path / "ckpt"
    (elsewhere / "checkpoint-3").mkdir(parents=True)
    _check(tmp_path / "run", overwrite=True)
    clear_run_folder(tmp_path / "run", elsewhere)
    assert list((tmp_path / "run").iterdir()) == [] and not elsewhere.exists()


def test_resume_and_overwrite_together_are_refused(tmp_path: Path) -> None:
    _earlier_run(tmp_path / "run")
    with pytest.raises(RunFolderRefused, match="exclude each other"):
        _check(tmp_path / "run", resume=True, overwrite=True)


def test_resume_of_a_missing_folder_says_there_is_nothing_to_continue(tmp_path: Path) -> None:
    with pytest.raises(RunFolderRefused, match="does not exist, so there is no run to continue"):
        _check(tmp_path / "nowhere", resume=True)


def test_resume_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    _earlier_run(tmp_path / "run", checkpoint=False)
    with pytest.raises(RunFolderRefused, match="no checkpoint to continue from"):
        _check(tmp_path / "run", resume=True)


def test_resume_of_a_finished_run_says_it_finished(tmp_path: Path) -> None:
    _earlier_run(tmp_path / "run", steps=200)
    with pytest.raises(RunFolderRefused, match="already finished all 200 steps") as refused:
        _check(tmp_path / "run", resume=True, total=200)
    assert "training.steps is 200" in str(refused.value)
    with pytest.raises(RunFolderRefused, match="already finished"):
        _check(tmp_path / "run", resume=True, total=None)  # counted in epochs: the summary says it ended


def test_resume_of_a_finished_run_with_more_steps_asked_continues(tmp_path: Path) -> None:
    _earlier_run(tmp_path / "run", steps=200)
    _check(tmp_path / "run", resume=True, total=300)


def test_resume_of_an_interrupted_run_continues(tmp_path: Path) -> None:
    _earlier_run(tmp_path / "run")
    _check(tmp_path / "run", resume=True)


def test_dverl_run_refuses_before_any_worker_and_keeps_the_metrics(tmp_path: Path, capsys) -> None:
    _earlier_run(tmp_path / "run")
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert main(["run", TINY, "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and "Traceback" not in err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    assert not (tmp_path / "run" / "logs").exists()  # no worker was started


def test_dverl_run_resume_of_a_finished_run_exits_2_without_starting(tmp_path: Path, capsys) -> None:
    _earlier_run(tmp_path / "run", steps=200)
    assert main(["run", TINY, "--output", str(tmp_path / "run"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "already finished all 200 steps" in err and "step 200/1" not in err
    assert not (tmp_path / "run" / "logs").exists()
