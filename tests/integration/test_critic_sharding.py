"""A critic sharded over 2 CPU ranks (FSDP2, gloo; real torchrun processes) gives the unsharded critic's
values, value losses and weights after the same updates; its DCP checkpoints resume on 2 ranks and on 1.

Tolerance: atol 1e-5 (fp32), as for the learners in `test_sharding`: the sharded ranks split the
micro-batches between them and FSDP reduce-scatters their gradients per layer, so the sums are the same
but taken in another order, and agree to float rounding rather than bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decentralized_verl.serving.sharded_critic import restore_critic
from tests.support.critic_sharding_worker import STEPS, critic_worker, probe, requests, spec_with
from tests.support.paths import SUPPORT

WORKER = SUPPORT / "critic_sharding_worker.py"
ATOL = 1e-5
VARIANTS = ("fsdp", "fsdp_checkpointed_offload")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("critic-sharding")
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(WORKER), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def unsharded() -> dict:
    """The reference: one process, the whole value model, the same updates (and one more)."""
    worker = critic_worker(spec_with())
    assert worker.world == 1
    before = worker.values(probe())
    losses = [worker.train(*requests(step), policy_version=step) for step in range(STEPS)]
    after = worker.values(probe())
    trained = {k: v.detach().clone() for k, v in worker.model.state_dict().items()}
    extra = worker.train(*requests(STEPS), policy_version=STEPS)
    return {
        "before": before,
        "losses": losses,
        "after": after,
        "trained": trained,
        "extra_loss": extra,
        "extra": worker.model.state_dict(),
    }


def _close_rows(got: list, want: list) -> None:
    assert len(got) == len(want) == 5
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=ATOL)


def _close_states(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=ATOL, rtol=0), (
            name,
            (got[name] - want[name]).abs().max(),
        )


@pytest.mark.parametrize("variant", VARIANTS)
def test_sharded_critic_matches_the_unsharded_critic(two_ranks: Path, unsharded: dict, variant: str) -> None:
    result = json.loads((two_ranks / f"{variant}.json").read_text())
    # Each rank holds about half of the value model.
    assert result["local_numel"] < 0.6 * result["total_numel"]
    _close_rows(result["values_before"], unsharded["before"])
    assert result["losses"] == pytest.approx(unsharded["losses"], abs=ATOL)
    _close_rows(result["values_after"], unsharded["after"])
    assert result["version"] == STEPS
    trained = torch.load(two_ranks / f"{variant}-trained.pt")
    _close_states(trained, unsharded["trained"])
    moved = max(
        (trained[k] - v).abs().max() for k, v in critic_worker(spec_with()).model.state_dict().items()
    )
    assert moved > 1e-3  # the updates did change the weights


@pytest.mark.parametrize("variant", VARIANTS)
def test_sharded_critic_resumes_from_its_checkpoint(two_ranks: Path, unsharded: dict, variant: str) -> None:
    result = json.loads((two_ranks / f"{variant}.json").read_text())
    assert result["resumed_version"] == STEPS
    _close_rows(result["resumed_values"], unsharded["after"])
    # The optimizer's moments came back too: the next update is the unsharded critic's next update.
    assert result["resumed_loss"] == pytest.approx(unsharded["extra_loss"], abs=ATOL)
    _close_states(torch.load(two_ranks / f"{variant}-resumed.pt"), unsharded["extra"])
    assert result["checkpoints"] == [f"checkpoint-{STEPS}", f"checkpoint-{STEPS + 1}"]  # the newest two


def test_a_sharded_critic_checkpoint_loads_into_one_unsharded_process(
    two_ranks: Path, unsharded: dict
) -> None:
    plain = critic_worker(spec_with())
    folder = restore_critic(plain, two_ranks / "fsdp" / "checkpoints")
    assert folder is not None and folder.name == f"checkpoint-{STEPS + 1}"
    assert plain.version == STEPS + 1
    _close_states(plain.model.state_dict(), unsharded["extra"])
    assert restore_critic(critic_worker(spec_with()), two_ranks / "nothing-here") is None
