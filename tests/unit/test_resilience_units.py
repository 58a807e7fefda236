"""The pure pieces behind surviving failures: the progress clock, the checkpoint clock, checkpoints that
are verified before use, snapshots written in the background, metrics rows a resumed run redoes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from decentralized_verl.errors import CheckpointError
from decentralized_verl.launch.watchdog import STALL_FLOOR_S, STARTUP_S, ProgressClock, allowance
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.reporting.metrics import MetricsLog, read_metrics, truncate_after
from decentralized_verl.spec import ModelSpec, TinyModelSpec
from decentralized_verl.training.checkpoints.folders import (
    checkpoint_problem,
    latest_checkpoint,
    write_manifest,
)
from decentralized_verl.training.checkpoints.learner import CheckpointClock, CheckpointWriter, restore_latest
from tests.support.paths import ROOT

TINY = TinyModelSpec(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=64)


# --------------------------------------------------------------------------------------- progress
def test_a_learner_counts_as_stalled_only_past_its_allowance() -> None:
    clock = ProgressClock(stall_factor=10)
    clock.restarted(0.0)
    assert not clock.stalled(STARTUP_S - 1) and clock.stalled(STARTUP_S + 1)  # loading its model
    for i, now in enumerate([100.0, 102.0, 104.0, 106.0]):
        clock.observe(i + 1, now)
    assert clock.step_seconds == [2.0, 2.0, 2.0]
    assert allowance(clock.step_seconds, 10) == STALL_FLOOR_S  # 20 s is below the floor
    clock.observe(None, 150.0)  # an unanswered poll is not progress
    assert not clock.stalled(106.0 + STALL_FLOOR_S - 1) and clock.stalled(106.0 + STALL_FLOOR_S + 1)
    clock.observe(7, 200.0)  # a jump of three steps counts as three step times
    assert clock.step_seconds[-1] == pytest.approx(94.0 / 3)
    assert allowance([30.0, 40.0, 500.0], 10) == 400.0  # the median: one slow eval step does not count


# ------------------------------------------------------------------------------------- checkpoints
def test_the_checkpoint_clock_takes_every_step_while_cheap_then_spreads_out() -> None:
    fixed = CheckpointClock(every=5)
    assert [s for s in range(1, 13) if fixed.due(s, 12, 1.0, 0.1, 0.0)] == [5, 10, 12]
    auto = CheckpointClock(every=None)
    assert auto.due(1, 100, 1.0, None, 0.0)  # the first one measures the snapshot
    auto.taken(1, 0.0)
    assert auto.due(2, 100, 10.0, 0.2, 1.0)  # 0.2 s of a 10 s step is 2%: every step
    auto.taken(2, 1.0)
    assert not auto.due(3, 100, 1.0, 0.2, 2.0)  # 20% of a 1 s step: every 4th step
    assert auto.due(6, 100, 1.0, 0.2, 5.0)
    assert auto.due(3, 100, 1.0, 50.0, 1.0 + 601.0)  # never longer than the time bound
    assert auto.due(100, 100, 1.0, 50.0, 2.0)  # the last step always


@pytest.fixture
def trainer():
    from decentralized_verl.spec.manifest import parse_spec
    from decentralized_verl.training.trainer import PolicyTrainer

    model, tokenizer = load_model_and_tokenizer(ModelSpec(tiny=TINY))
    spec = parse_spec(
        {
            "model": {"tiny": TINY.model_dump(by_alias=True)},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "t.jsonl"},
            "training": {"steps": 3, "batchSize": 2, "learningRate": 0.01},
        }
    )
    return PolicyTrainer(model, spec), tokenizer


def test_a_snapshot_is_what_the_model_was_when_taken_not_when_written(tmp_path: Path, trainer) -> None:
    policy, tokenizer = trainer
    writer = CheckpointWriter(tmp_path, policy, tokenizer, keep=2)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    folder = writer.take(1, {"step": 1, "policy_version": 1, "sampler": {"epoch": 0, "offset": 2}})
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(1.0)  # training goes on while the write is in flight
    writer.close()
    assert writer.snapshot_seconds is not None and writer.write_seconds is not None
    fresh, _ = load_model_and_tokenizer(ModelSpec(tiny=TINY))
    from decentralized_verl.training.trainer import PolicyTrainer

    resumed = PolicyTrainer(fresh, policy.spec)
    point = restore_latest(resumed, tmp_path)
    assert point is not None and point.folder == folder and point.sampler_state == {"epoch": 0, "offset": 2}
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before(tmp_path: Path, trainer, caplog) -> None:
    policy, tokenizer = trainer
    writer = CheckpointWriter(tmp_path, policy, tokenizer, keep=3)
    for step in (1, 2, 3):
        writer.take(step, {"step": step, "policy_version": step, "sampler": {"epoch": 0, "offset": 0}})
    writer.close()
    assert latest_checkpoint(tmp_path, verify=True).name == "checkpoint-3"
    weights = next((tmp_path / "checkpoint-3").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-7])  # torn on disk
    assert "does not match its sha256" in checkpoint_problem(tmp_path / "checkpoint-3")
    (tmp_path / "checkpoint-2" / "trainer_state.json").unlink()
    assert checkpoint_problem(tmp_path / "checkpoint-2") == "trainer_state.json is missing"
    assert latest_checkpoint(tmp_path, verify=True).name == "checkpoint-1"
    assert "checkpoint-3 cannot be used" in caplog.text and "checkpoint-2 cannot be used" in caplog.text
    assert latest_checkpoint(tmp_path).name == "checkpoint-3"  # unverified: by name only


def test_no_usable_checkpoint_fails_loudly_and_stale_writes_are_removed(tmp_path: Path, trainer) -> None:
    """A learner told to resume never starts over from step 0 when checkpoints exist but none checks
    out (its metrics would hold every step twice); a folder without its manifest is one of those; what
    interrupted writes left is removed at start."""
    policy, tokenizer = trainer
    writer = CheckpointWriter(tmp_path, policy, tokenizer, keep=3)
    for step in (1, 2):
        writer.take(step, {"step": step, "policy_version": step, "sampler": {"epoch": 0, "offset": 0}})
    writer.close()
    torn = tmp_path / ".tmp-checkpoint-3-4242-deadbeef"
    (torn / "sub").mkdir(parents=True)
    (tmp_path / ".old-checkpoint-1-cafef00d").mkdir()
    (tmp_path / "checkpoint-2" / "manifest.json").unlink()  # e.g. files dropped there by hand
    assert "manifest.json is missing" in checkpoint_problem(tmp_path / "checkpoint-2")
    resumed = type(policy)(policy.model, policy.spec)
    assert restore_latest(resumed, tmp_path).folder.name == "checkpoint-1"
    assert not torn.exists() and not (tmp_path / ".old-checkpoint-1-cafef00d").exists()
    weights = next((tmp_path / "checkpoint-1").glob("*.safetensors"))
    weights.write_bytes(b"\0" + weights.read_bytes()[1:])
    with pytest.raises(CheckpointError, match="none of the 2 checkpoints checks out") as err:
        restore_latest(resumed, tmp_path)
    assert "checkpoint-2: manifest.json is missing" in str(err.value)
    assert "checkpoint-1: model.safetensors does not match" in str(err.value)
    assert restore_latest(resumed, tmp_path / "empty") is None  # no checkpoint at all: a first start


def test_a_checkpoint_loads_no_pickled_code(tmp_path: Path, trainer) -> None:
    """The optimizer state is read with weights_only=True: a file that would run code when unpickled is
    refused, not executed."""
    policy, tokenizer = trainer
    writer = CheckpointWriter(tmp_path, policy, tokenizer, keep=1)
    writer.take(1, {"step": 1, "policy_version": 1, "sampler": {}})
    writer.close()
    marker = tmp_path / "ran"
    folder = tmp_path / "checkpoint-1"
    torch.save({"optimizer": Exploit(str(marker)), "scheduler": {}}, folder / "optimizer.pt")
    write_manifest(folder)  # even a checkpoint whose manifest matches (a writer of the folder)
    resumed = type(policy)(policy.model, policy.spec)
    with pytest.raises(Exception, match=r"Weights only load failed|Unsupported global"):
        restore_latest(resumed, tmp_path)
    assert not marker.exists()


class Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


def test_keep_holds_only_the_newest(tmp_path: Path, trainer) -> None:
    policy, tokenizer = trainer
    writer = CheckpointWriter(tmp_path, policy, tokenizer, keep=2)
    for step in range(1, 6):
        writer.take(step, {"step": step, "policy_version": step, "sampler": {}})
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-5"]


# ----------------------------------------------------------------------------------------- metrics
def test_a_resumed_run_drops_the_rows_it_will_redo(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        for step in range(1, 8):
            log.write({"step": step, "reward_mean": step / 10})
    assert truncate_after(path, 4) == 3
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4]
    assert truncate_after(path, 4) == 0 and truncate_after(tmp_path / "none.jsonl", 1) == 0
    assert json.loads(path.read_text().splitlines()[0])["step"] == 1


async def test_a_restarted_learner_publishes_past_what_workers_still_hold() -> None:
    from decentralized_verl.orchestration.wiring import past_held_versions
    from decentralized_verl.transport import messages as m

    class Worker:
        def __init__(self, wid, version):
            self.worker_id, self.version = wid, version

        async def info(self):
            if self.version is None:
                raise RuntimeError("restarting")
            return m.WorkerInfo(self.worker_id, "rollout", self.version, 0.0, "hf")

    assert await past_held_versions([Worker("a", 3), Worker("b", None)], 3) == 3  # same lineage
    assert await past_held_versions([Worker("a", 7), Worker("b", 5)], 3) == 8  # never reuse 4..7
    assert await past_held_versions([Worker("a", 0)], 3) == 3


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (4, 1)])
def test_resuming_at_another_learner_count_keeps_the_epoch_order(before: int, after: int) -> None:
    """The coordinator draws global batches of batchSize x learners: a run resumed with another learner count
    continues the same epoch order where it stopped, no prompt skipped or repeated."""
    from decentralized_verl.data import PromptSampler
    from decentralized_verl.data.sampler import epoch_order

    n, per_learner, seed = 101, 4, 7
    first = PromptSampler(n, per_learner * before, seed=seed, drop_last=True)
    taken = [first.next_global_batch() for _ in range(3)]
    resumed = PromptSampler(n, per_learner * after, seed=seed, drop_last=True)
    resumed.load_state(first.state())
    epoch0 = []
    while resumed.state()["epoch"] == 0:
        epoch0.append(resumed.next_global_batch())
    drawn = [i for batch in taken + epoch0 for i in batch]
    assert len(drawn) == len(set(drawn))  # nothing twice
    assert drawn == epoch_order(n, seed, 0)[: len(drawn)]  # the same order, nothing skipped
    assert n - len(drawn) < per_learner * after  # only the tail a full batch cannot use is left


def _critic_batch():
    from decentralized_verl.core.samples import Prompt, Sample

    samples = [
        Sample(Prompt(f"p{i}", i, (3, 4, 5), "q"), 0, (6, 7), (-0.1, -0.2), "stop", "", 0) for i in range(4)
    ]
    return samples, [(1.0, 0.5)] * 4, [(0.0, 0.0)] * 4


def test_a_restarted_critic_continues_from_what_it_had_learned(tmp_path: Path) -> None:
    from decentralized_verl.serving.critic_state import PersistentCritic
    from decentralized_verl.serving.scoring import CriticWorker

    def fresh():
        return CriticWorker.from_spec(_spec(), worker_id="c")

    first = PersistentCritic(fresh(), tmp_path)
    samples, returns, old = _critic_batch()
    for _ in range(3):
        first.train(samples, returns, old)
    first.close()
    expected = first.values(samples)
    again = PersistentCritic(fresh(), tmp_path)  # the process came back
    assert again.version == 3 and again.values(samples) == expected
    assert fresh().values(samples) != expected


def _spec():
    from decentralized_verl.spec.manifest import parse_spec

    return parse_spec(
        {
            "model": {"tiny": TINY.model_dump(by_alias=True)},
            "algorithm": {"name": "ppo", "samplesPerPrompt": 2},
            "data": {"train": "t.jsonl"},
            "roles": {"critic": {"replicas": 1}},
            "training": {"steps": 3, "batchSize": 2, "learningRate": 0.01, "criticLearningRate": 0.05},
        }
    )


def test_a_colocated_critic_is_saved_and_restored_with_the_learner(tmp_path: Path, trainer) -> None:
    from decentralized_verl.orchestration.assemble import CRITIC_STATE, restore_colocated_critic
    from decentralized_verl.orchestration.wiring import RoleClients
    from decentralized_verl.serving.local import LocalCriticClient
    from decentralized_verl.serving.scoring import CriticWorker

    policy, tokenizer = trainer
    critic = CriticWorker.from_spec(_spec(), worker_id="c")
    samples, returns, old = _critic_batch()
    critic.train(samples, returns, old)
    writer = CheckpointWriter(tmp_path, policy, tokenizer, keep=1, extras={CRITIC_STATE: critic.state})
    folder = writer.take(1, {"step": 1, "policy_version": 1, "sampler": {}})
    writer.close()
    restored = CriticWorker.from_spec(_spec(), worker_id="c")
    roles = RoleClients([], {}, lambda v: None, None, None, LocalCriticClient(restored))
    restore_colocated_critic(roles, folder)
    assert restored.version == 1 and restored.values(samples) == critic.values(samples)


def test_checkpoint_cost_reads_a_runs_metrics(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import checkpoint_cost

    rows = [
        {"step": 1, "step_seconds": 2.0, "checkpoint_snapshot_seconds": 0.1},
        {"step": 2, "step_seconds": 4.0, "checkpoint_snapshot_seconds": 0.3, "checkpoint_write_seconds": 1.5},
        {"step": 3, "step_seconds": 4.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = checkpoint_cost.cost(tmp_path)
    assert got["checkpoints"] == 2 and got["snapshot_median_s"] == pytest.approx(0.2)
    assert got["write_median_s"] == 1.5 and got["step_median_s"] == 4.0
    assert got["snapshot_share"] == pytest.approx(0.4 / 10.0)
