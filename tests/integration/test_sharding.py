"""FSDP2 learners train like DDP learners and like one unsharded process; gathered weights equal the plain
model's; activation checkpointing changes no gradient, shared-prompt cache included.

The two-rank runs are real torchrun processes (gloo on CPU, `sharding_worker.py`); fp32 throughout. The
tolerance between ddp and fsdp is atol 1e-5 on losses and weights: both sum the same per-rank gradients,
but in different orders (DDP all-reduces buckets, FSDP reduce-scatters per layer), so they agree to float
rounding rather than bit for bit.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.samples import collate
from decentralized_verl.training.sharding import decoder_layers, shard_model
from decentralized_verl.training.trainer import PolicyTrainer
from tests.support.paths import SUPPORT
from tests.support.sharding_worker import PAD, STEPS, samples_for, spec_with, step_batches, tied_model, train

WORKER = SUPPORT / "sharding_worker.py"
ATOL = 1e-5


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("sharding")
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(WORKER), str(out)]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _state(out: Path, rank: int, name: str) -> dict[str, torch.Tensor]:
    return torch.load(out / f"rank{rank}-{name}.pt")


def _assert_states_close(got: dict, want: dict, atol: float = ATOL) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=atol, rtol=0), (
            name,
            (got[name] - want[name]).abs().max(),
        )


def test_fsdp_learners_follow_ddp_learners_over_three_steps(two_ranks):
    out, ranks = two_ranks
    # Rank 1's longer responses take 2 micro-batches to rank 0's 1: the sharded ranks must stay in step.
    assert [r["ddp"]["microbatches"] for r in ranks] == [[1] * STEPS, [2] * STEPS]
    initial = tied_model(spec_with()).state_dict()
    for rank, result in enumerate(ranks):
        assert len(result["fsdp"]["losses"]) == STEPS
        assert result["fsdp"]["losses"] == pytest.approx(result["ddp"]["losses"], abs=ATOL)
        assert result["fsdp"]["grad_norms"] == pytest.approx(result["ddp"]["grad_norms"], abs=ATOL)
        _assert_states_close(_state(out, rank, "fsdp"), _state(out, rank, "ddp"))
    # The norm is global: every rank clipped (and decided to step) on the same number.
    assert ranks[0]["fsdp"]["grad_norms"] == ranks[1]["fsdp"]["grad_norms"]
    # Both ranks gathered the same weights, and those trained away from the start.
    first, second = (_state(out, r, "fsdp") for r in range(2))
    assert sorted(first) == sorted(second) and all(torch.equal(first[k], second[k]) for k in first)
    moved = max((_state(out, 0, "fsdp")[k] - initial[k]).abs().max() for k in initial)
    assert moved > 1e-3


def test_checkpointed_and_offloaded_fsdp_learners_follow_ddp(two_ranks):
    out, ranks = two_ranks
    for variant in ("fsdp_checkpointed", "fsdp_offload"):
        for rank, result in enumerate(ranks):
            assert result[variant]["losses"] == pytest.approx(result["ddp"]["losses"], abs=ATOL), variant
            _assert_states_close(_state(out, rank, variant), _state(out, rank, "ddp"))


def test_fsdp_learners_on_one_batch_follow_one_unsharded_process(two_ranks):
    """Both ranks on rank 0's batches average two equal gradients: one process on those batches alone."""
    out, ranks = two_ranks
    spec = spec_with()
    model = tied_model(spec)
    batches = step_batches(copy.deepcopy(model), spec, 0)
    torch.manual_seed(0)
    alone = train(PolicyTrainer(model, spec), batches)
    for rank, result in enumerate(ranks):
        assert result["fsdp_same_data"]["losses"] == pytest.approx(alone["losses"], abs=ATOL)
        _assert_states_close(_state(out, rank, "fsdp_same_data"), model.state_dict())


def test_one_fsdp_rank_without_a_process_group_trains_like_an_unsharded_process(tmp_path):
    done = subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path)], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    single = json.loads((tmp_path / "single.json").read_text())
    spec = spec_with()
    model = tied_model(spec)
    alone = train(PolicyTrainer(model, spec), step_batches(copy.deepcopy(model), spec, 0))
    assert single["losses"] == pytest.approx(alone["losses"], abs=ATOL)
    _assert_states_close(torch.load(tmp_path / "rank0-fsdp_single.pt"), model.state_dict())


def test_full_state_dict_streams_the_plain_state_dict(two_ranks):
    out, ranks = two_ranks
    for label in ("tied", "untied"):
        first, second = (r["gather"][label] for r in ranks)
        # Each rank held half the parameters, yet streamed every tensor whole, under the plain names.
        assert 2 * first["local_numel"] == first["total_numel"]
        assert first["names"] == first["plain_names"] == second["names"]
        assert not any("_fsdp" in n or "_checkpoint" in n for n in first["names"])
        assert first["tensor_sha"] == second["tensor_sha"]
        gathered, plain = _state(out, 0, f"gathered-{label}"), _state(out, 0, f"plain-{label}")
        assert all(torch.equal(gathered[k], plain[k]) for k in plain)
        assert first["gathered_digest"] == first["weights_digest"] == second["gathered_digest"]
    tied = ranks[0]["gather"]["tied"]["names"]
    assert "lm_head.weight" in tied and "model.embed_tokens.weight" in tied


def test_rollout_state_dict_refuses_a_sharded_model(two_ranks):
    """A sharded model's weights are published through the learner group's gathered stream (the states
    the tests above compare are what that stream decodes to)."""
    _, ranks = two_ranks
    assert ranks[0]["ddp"]["rollout_state_dict_refused"] == ""
    assert "LearnerGroup.weights" in ranks[0]["fsdp"]["rollout_state_dict_refused"]


def _gradients(model, batch, *, plain: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train()
    model.zero_grad(set_to_none=True)
    logprobs, entropy = response_logprobs(model, batch, 0.7, entropy=True, plain=plain)
    (logprobs.sum() + entropy.sum()).backward()
    return logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("plain", [False, True], ids=["shared_prompt", "plain"])
def test_activation_checkpointing_keeps_every_gradient(plain):
    """The shared-prompt forward writes each layer's prompt keys/values into a cache the continuation reads;
    a checkpointed layer replays in the backward pass and must see (and write) the same cache again."""
    spec = spec_with()
    model = tied_model(spec)
    batch = collate(samples_for(model, 1, 0), PAD)
    checkpointed = shard_model(
        copy.deepcopy(model),
        sharding="ddp",
        world=1,
        dtype=None,
        cpu_offload=False,
        activation_checkpointing=True,
    )
    runs = []
    for m in (model, checkpointed):
        calls: list[int] = []
        count = calls.append
        handles = [
            layer.mlp.register_forward_pre_hook(lambda *_, c=count: c(1)) for layer in decoder_layers(m)
        ]
        runs.append((*_gradients(m, batch, plain=plain), len(calls)))
        for handle in handles:
            handle.remove()
    (want_lp, want, want_calls), (got_lp, got, got_calls) = runs
    assert got_calls == 2 * want_calls  # each layer ran again in the backward pass
    assert torch.equal(got_lp, want_lp)
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-6, rtol=1e-5), name
    assert any(bool(g.abs().sum() > 0) for g in got.values())


def test_trainer_with_activation_checkpointing_updates_like_without():
    spec = spec_with()
    checkpointed_spec = spec_with(activationCheckpointing=True)
    model = tied_model(spec)
    batches = step_batches(copy.deepcopy(model), spec, 1)
    twin = copy.deepcopy(model)
    want = train(PolicyTrainer(model, spec), batches)
    got = train(PolicyTrainer(twin, checkpointed_spec), batches)
    assert type(decoder_layers(twin)[0]).__name__.startswith("Checkpointed")
    assert got["losses"] == pytest.approx(want["losses"], abs=1e-6)
    _assert_states_close(twin.state_dict(), model.state_dict(), atol=1e-6)


def test_shard_model_names_the_bad_setting():
    model = tied_model(spec_with())
    with pytest.raises(ValueError, match="sharding: must be one of"):
        shard_model(
            model, sharding="zero3", world=1, dtype=None, cpu_offload=False, activation_checkpointing=False
        )
    with pytest.raises(ValueError, match="cpu_offload: needs sharding 'fsdp'"):
        shard_model(
            model, sharding="ddp", world=1, dtype=None, cpu_offload=True, activation_checkpointing=False
        )
    with pytest.raises(ValueError, match=r"world: 2 ranks need torch\.distributed"):
        shard_model(
            model, sharding="fsdp", world=2, dtype=None, cpu_offload=False, activation_checkpointing=False
        )


def test_ranks_built_on_the_meta_device_get_rank_0s_weights(two_ranks):
    _, ranks = two_ranks
    assert [r["rank0_load"]["built_on_meta"] for r in ranks] == [False, True]
    for result in ranks:
        checks = result["rank0_load"]
        assert checks["gathered_digest"] == checks["weights_digest"]  # bit for bit
        assert checks["buffers_equal"] and checks["trained"]
