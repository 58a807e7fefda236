"""Sharded (DCP) checkpoints of FSDP2 learners: saved by 2 ranks and resumed on 1 or 2, saved by 1 and
resumed on 2, exported to a Hugging Face folder that gives the sharded model's logits, refused when torn or
corrupt, and `dverl export`'s errors.

The runs: 1 rank (a process group of one in this process) trains 2 steps, saves, and takes a third; 2
torchrun ranks do the same, then resume both checkpoints; 1 rank resumes theirs. Every resume loads a model
built from another seed, so only the load can make it match, then takes the third step. The dumps hold
whole (gathered) tensors keyed by parameter name.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from decentralized_verl.cli.main import main as dverl
from decentralized_verl.errors import CheckpointError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.training.checkpoints.folders import latest_checkpoint
from decentralized_verl.training.checkpoints.learner import restore_latest
from decentralized_verl.training.checkpoints.sharded import export_hf, load_sharded
from tests.support import sharded_checkpoint_worker as worker
from tests.support.paths import SUPPORT
from tests.support.processes import console_env

WORKER = SUPPORT / "sharded_checkpoint_worker.py"
STEP_TOLERANCE = 1e-5
"""One learner sums a step's 4 rows in one backward, two learners in two halves averaged by the reduce-
scatter: the same gradient up to float32 rounding, which Adam's normalisation lifts for near-zero gradient
entries (measured <= 1.1e-6 on the weights after the step; the step itself moves weights by ~1e-2)."""


@dataclass(frozen=True)
class Runs:
    root: Path
    dumps: dict[str, dict]

    def checkpoint(self, name: str) -> Path:
        return self.root / name / "checkpoint-2"


def torchrun(cwd: Path, *tasks: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = subprocess.run(
        [*command, str(WORKER), *tasks],
        cwd=cwd,
        env=console_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("sharded")
    two, one = root / "two" / "checkpoint-2", root / "one" / "checkpoint-2"
    worker.in_this_process([f"train:{one}:{root}/one.pt"])
    torchrun(
        root,
        f"train:{two}:{root}/two.pt",
        f"resume:{two}:{root}/two_on_two.pt",
        f"resume:{one}:{root}/one_on_two.pt",
    )
    worker.in_this_process([f"resume:{two}:{root}/two_on_one.pt"])
    names = ["two", "two_on_two", "two_on_one", "one", "one_on_two"]
    return Runs(root, {name: torch.load(root / f"{name}.pt", weights_only=False) for name in names})


def assert_same_tensors(got: dict, want: dict, *, atol: float = 0.0) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, dict):
            assert_same_tensors(got[key], value, atol=atol)
        elif isinstance(value, torch.Tensor):
            assert torch.allclose(got[key], value, rtol=0.0, atol=atol), key
        else:
            assert got[key] == value, key


def fresh_plain(seed: int = 99):
    """The tiny model unsharded, with its optimizer and scheduler, in no process group."""
    model, _ = load_model_and_tokenizer(worker.ModelSpec(tiny=worker.TINY.model_copy(update={"seed": seed})))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


# ------------------------------------------------------------------------------------------- resume
@pytest.mark.parametrize("resumed", ["two_on_two", "two_on_one"])
def test_two_learners_checkpoint_resumes_on_two_or_one(runs: Runs, resumed: str) -> None:
    saved, loaded = runs.dumps["two"], runs.dumps[resumed]
    assert loaded["world"] == (2 if resumed == "two_on_two" else 1)
    assert loaded["state"] == {"step": 2, "policy_version": 2, "sampler": {"epoch": 0, "offset": 8}}
    assert_same_tensors(loaded["at_checkpoint"], saved["at_checkpoint"])  # a reshard copies, exactly
    assert loaded["scheduler"] == saved["scheduler"]
    assert loaded["scheduler"]["last_epoch"] == 2  # the warm-up's position came back too
    assert_same_tensors(loaded["after"], saved["after"], atol=STEP_TOLERANCE)
    moved = max((saved["after"][k] - saved["at_checkpoint"]["model"][k]).abs().max() for k in saved["after"])
    assert moved > 100 * STEP_TOLERANCE  # the third step changed the weights far beyond the tolerance


def test_one_learner_checkpoint_resumes_on_two(runs: Runs) -> None:
    saved, loaded = runs.dumps["one"], runs.dumps["one_on_two"]
    assert saved["world"] == 1 and loaded["world"] == 2
    assert_same_tensors(loaded["at_checkpoint"], saved["at_checkpoint"])
    assert loaded["scheduler"] == saved["scheduler"]
    assert_same_tensors(loaded["after"], saved["after"], atol=STEP_TOLERANCE)
    # and one learner trains as two do: the runs agree with each other, not only with themselves
    assert_same_tensors(saved["after"], runs.dumps["two"]["after"], atol=STEP_TOLERANCE)


def test_a_plain_model_with_no_process_group_loads_a_sharded_checkpoint(runs: Runs) -> None:
    model, optimizer, scheduler = fresh_plain()
    state = load_sharded(model, optimizer, scheduler, runs.checkpoint("two"))
    assert state["step"] == 2
    saved = runs.dumps["two"]["at_checkpoint"]
    assert_same_tensors(model.state_dict(), saved["model"])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0075)  # the saved lr, not this optimizer's 5.0
    names = dict(zip(model.parameters(), (name for name, _ in model.named_parameters()), strict=True))
    for param, moments in optimizer.state.items():
        assert torch.equal(moments["exp_avg"], saved["optimizer"]["state"][names[param]]["exp_avg"])


# ------------------------------------------------------------------------------------------- export
def test_export_gives_a_hugging_face_folder_with_the_sharded_models_logits(
    runs: Runs, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = export_hf(runs.checkpoint("two"), tmp_path / "hf", model_spec=worker.SPEC)
    exported = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        logits = exported(input_ids=worker.probe()).logits
    assert torch.allclose(logits, runs.dumps["two"]["logits"], rtol=0.0, atol=1e-5)
    assert len(AutoTokenizer.from_pretrained(out)) == exported.config.vocab_size
    assert not (out / "optimizer.pt").exists() and not (out / "dcp").exists()


# ---------------------------------------------------------------------------------------- integrity
@pytest.fixture
def two_checkpoints(runs: Runs, tmp_path: Path) -> Path:
    """checkpoint-2 and checkpoint-3, copies of the 2-learner checkpoint."""
    for step in (2, 3):
        shutil.copytree(runs.checkpoint("two"), tmp_path / f"checkpoint-{step}")
    return tmp_path


def test_a_corrupt_shard_is_refused_by_name_and_resume_falls_back(two_checkpoints: Path) -> None:
    shard = two_checkpoints / "checkpoint-3" / "dcp" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-9])
    model, optimizer, scheduler = fresh_plain()
    with pytest.raises(CheckpointError, match=r"dcp/__1_0\.distcp does not match its sha256"):
        load_sharded(model, optimizer, scheduler, two_checkpoints / "checkpoint-3")
    with pytest.raises(CheckpointError, match=r"dcp/__1_0\.distcp does not match"):
        export_hf(two_checkpoints / "checkpoint-3", two_checkpoints / "out")
    point = restore_latest(
        SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler), two_checkpoints
    )
    assert point is not None and point.folder.name == "checkpoint-2" and point.step == 2


def test_a_checkpoint_without_its_manifest_or_a_shard_is_refused(two_checkpoints: Path) -> None:
    (two_checkpoints / "checkpoint-3" / "manifest.json").unlink()
    (two_checkpoints / "checkpoint-2" / "dcp" / "__0_0.distcp").unlink()
    model, optimizer, scheduler = fresh_plain()
    with pytest.raises(CheckpointError, match=r"manifest\.json is missing"):
        load_sharded(model, optimizer, scheduler, two_checkpoints / "checkpoint-3")
    with pytest.raises(CheckpointError, match=r"dcp/__0_0\.distcp is missing"):
        load_sharded(model, optimizer, scheduler, two_checkpoints / "checkpoint-2")
    assert latest_checkpoint(two_checkpoints, verify=True) is None


# -------------------------------------------------------------------------------------------- CLI
def test_dverl_export_picks_the_newest_complete_checkpoint_of_a_run(runs: Runs, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    job = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "tiny"},
        "spec": {
            "model": {"tiny": worker.TINY.model_dump(by_alias=True)},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "t.jsonl"},
            "training": {"checkpoint": {"dir": "kept"}},  # relative to the run folder
        },
    }
    run.mkdir()
    (run / "job.yaml").write_text(yaml.safe_dump(job))
    for step in (2, 4):
        shutil.copytree(runs.checkpoint("two"), run / "kept" / f"checkpoint-{step}")
    (run / "kept" / "checkpoint-4" / "dcp" / ".metadata").write_bytes(b"torn")
    assert dverl(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file() and (
        tmp_path / "hf" / "tokenizer.json"
    ).is_file()

    assert dverl(["export", str(run), "--step", "3", "--out", str(tmp_path / "other")]) == 2
    assert (
        "--step 3: no checkpoint-3 under" in (err := capsys.readouterr().err) and "steps there: 4, 2" in err
    )
    assert dverl(["export", str(run), "--step", "2", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err  # the error names the flag as --help shows it today, not its old name
    assert f"--output {str(tmp_path / 'hf')!r} is not empty" in err and "--out " not in err
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    assert dverl(["export", str(empty), "--out", str(tmp_path / "other")]) == 2
    assert "no checkpoints under" in capsys.readouterr().err
