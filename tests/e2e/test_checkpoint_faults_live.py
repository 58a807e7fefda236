"""A run's checkpoint folder tampered with between two `dverl run`s (real learner processes): one
checkpoint corrupted, one stripped of its manifest, one carrying a pickle that would run code (with a
manifest the attacker rewrote to match), and a folder an interrupted write left behind.

The resumed run fails loudly, naming each checkpoint's problem, instead of silently training again from
step 0 (which wrote steps 1..N twice into metrics.jsonl); the pickle never runs (`weights_only=True`);
the leftover folder is removed; the metrics stay as they were. And a checkpoint volume without room
stops the run at its first checkpoint, naming the volume, instead of restarting into the same wall.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from decentralized_verl.launch.run import RunRefused, run_job
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.training.checkpoints.folders import write_manifest
from tests.support.job_manifests import e2e_manifest
from tests.support.small_volume import refused, small_volume

SMALL_VOLUME_REFUSED = refused()


class RunsCode:
    """Unpickling this creates `path` (what a malicious optimizer.pt would do, and worse)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_a_tampered_checkpoint_folder_fails_the_resume_loudly(tmp_path: Path) -> None:
    overrides = {
        "training.evalEvery": 0,
        "training.checkpoint": {"every": 1, "dir": "ckpt", "keep": 3},
        "roles.rollout": {"replicas": 0},
    }
    run = tmp_path / "run"
    run_job(e2e_manifest(tmp_path, "ckpt-attack", **{"training.steps": 2, **overrides}), run, progress=False)
    ckpt = run / "ckpt"
    assert (ckpt / "checkpoint-2" / "manifest.json").exists()
    before = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    assert before == [1, 2]

    (ckpt / "checkpoint-1" / "manifest.json").unlink()  # files nobody vouches for
    shutil.copytree(ckpt / "checkpoint-2", ckpt / "checkpoint-3")  # a pickle that runs code, re-manifested
    marker = tmp_path / "pickle-ran"
    with (ckpt / "checkpoint-3" / "optimizer.pt").open("wb") as file:
        pickle.dump({"optimizer": RunsCode(str(marker)), "scheduler": {}}, file)
    (ckpt / "checkpoint-3" / "manifest.json").unlink()
    write_manifest(ckpt / "checkpoint-3")
    victim = next(p for p in sorted((ckpt / "checkpoint-2").iterdir()) if p.name != "manifest.json")
    victim.write_bytes(victim.read_bytes()[:-8] + b"tampered")  # bytes changed after the manifest
    stale = ckpt / ".tmp-checkpoint-9"
    stale.mkdir()
    (stale / "half-written").write_bytes(b"x")

    with pytest.raises(Exception) as failed:
        run_job(
            e2e_manifest(tmp_path, "ckpt-attack", **{"training.steps": 4, **overrides}),
            run,
            resume=True,
            progress=False,
            timeout=600,
        )
    learner_log = "\n".join(p.read_text(errors="replace") for p in run.rglob("*learner*.log"))
    said = f"{failed.value}\n{learner_log}"
    assert "checkpoint-1" in said and "manifest.json is missing" in said, said[-3000:]
    assert "checkpoint-2" in said and "does not match its sha256" in said, said[-3000:]
    assert "checkpoint-3" in said, said[-3000:]
    assert not marker.exists()  # the pickle was refused, never run
    assert not stale.exists()  # the interrupted write's leftovers are gone
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == before  # no step recorded twice


@pytest.mark.skipif(
    SMALL_VOLUME_REFUSED is not None, reason=f"needs a real small volume: {SMALL_VOLUME_REFUSED}"
)
def test_a_checkpoint_volume_without_room_stops_the_run_once_naming_the_volume(tmp_path: Path) -> None:
    """A full checkpoint volume is input a person must change (a restart meets the same wall): the learner
    exits with the input-error code at its first checkpoint, and the run stops there with the words that
    say which folder, how much it needed and had, and what to change, not torch's `unexpected pos`."""
    overrides = {
        "training.steps": 3,
        "training.evalEvery": 0,
        "training.checkpoint": {"every": 1, "dir": str(tmp_path / "ckpt")},
        "roles.rollout": {"replicas": 0},
    }
    run = tmp_path / "run"
    with small_volume(tmp_path / "ckpt", "64k"), pytest.raises(RunRefused) as stopped:
        run_job(e2e_manifest(tmp_path, "full-volume", **overrides), run, progress=False, timeout=600)
    said = str(stopped.value)
    assert "exited with code 2" in said, said
    assert f"checkpoint '{tmp_path / 'ckpt' / 'checkpoint-1'}' was not written: it needs about" in said, said
    assert "spec.training.checkpoint.keep" in said and "a restart would read the same" in said, said
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]  # trained once, never again
