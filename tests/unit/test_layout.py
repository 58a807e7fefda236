"""One machine's layout: which GPU each worker gets on a one-GPU and an eight-GPU machine, what moves
inside the learner, a vLLM engine's share of a shared GPU, and `dverl plan --machine` showing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from decentralized_verl.planning.layout import MachineError, lay_out, machine_job, parse_machine
from decentralized_verl.planning.run_plan import main_plan
from decentralized_verl.spec.manifest import parse_spec

TINY = {"hiddenSize": 32, "numLayers": 2, "numHeads": 2, "intermediateSize": 64}
ONE_GPU_EACH = {"resources": {"gpus": 1}}
SPEC = {
    "model": {"tiny": TINY},
    "algorithm": {"name": "grpo", "klCoef": 0.01},
    "data": {"train": "x.jsonl", "rewardType": "boxed"},
    "roles": {
        "rollout": {"replicas": 2, "batchSize": 8, **ONE_GPU_EACH},
        "learner": {"replicas": 1, **ONE_GPU_EACH},
        "reference": {"replicas": 1, **ONE_GPU_EACH},
        "reward": {"replicas": 1, "device": "cpu", **ONE_GPU_EACH},
    },
    "training": {"batchSize": 16},
}


def devices(spec: dict, machine: str) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    parsed = parse_spec(spec)
    moved, plan, colocated = machine_job(parsed, "j", parse_machine(machine))
    layout = lay_out(moved, plan, parse_machine(machine), colocated=colocated)
    return {p.name: p.device for p in layout.placed}, layout.colocated, layout.notes


def test_eight_gpus_give_each_worker_its_own() -> None:
    got, colocated, _ = devices(SPEC, "8x80Gi")
    assert colocated == ()
    assert got == {
        "j-learner-0": "cuda:0",
        "j-rollout-0": "cuda:1",
        "j-rollout-1": "cuda:2",
        "j-reward-0": "cpu",  # its spec keeps it on the CPU whatever the machine
        "j-reference-0": "cuda:3",
    }


def test_one_gpu_runs_the_hf_rollout_inside_the_learner_and_shares_the_gpu() -> None:
    got, colocated, notes = devices(SPEC, "1x24Gi")
    assert colocated == ("rollout",)
    assert got == {"j-learner-0": "cuda:0", "j-reward-0": "cpu", "j-reference-0": "cuda:0"}
    assert any("one copy of the weights" in n for n in notes)


def test_no_gpu_puts_everything_on_the_cpu() -> None:
    got, colocated, notes = devices(SPEC, "0")
    assert set(got.values()) == {"cpu"} and colocated == ()
    assert "no GPU: workers given one compute on the CPU" in notes


def test_a_vllm_rollout_gets_its_share_of_a_shared_gpu() -> None:
    spec = {
        **SPEC,
        "roles": {**SPEC["roles"], "rollout": {"replicas": 1, "batchSize": 16, "backend": "vllm"}},
    }
    spec["roles"]["rollout"].update(ONE_GPU_EACH)
    parsed = parse_spec(spec)
    moved, plan, colocated = machine_job(parsed, "j", parse_machine("1x24Gi"))
    assert colocated == ()  # vLLM keeps its own copy: it cannot share the learner's modules
    layout = lay_out(moved, plan, parse_machine("1x24Gi"), {"rollout": 6 * 2**30, "learner": 10 * 2**30})
    rollout = layout.of("j-rollout-0")
    assert rollout.device == "cuda:0" and rollout.memory_fraction == 0.25  # 6 of 24 GiB
    assert rollout.env()["DVERL_GPU_MEMORY_FRACTION"] == "0.250"
    assert layout.of("j-learner-0").memory_fraction is None and layout.problems == ()
    assert rollout.shares_with_learner and rollout.env()["DVERL_GPU_SHARED_WITH_LEARNER"] == "1"
    apart = lay_out(*machine_job(parsed, "j", parse_machine("8x80Gi"))[:2], parse_machine("8x80Gi"))
    assert not apart.of("j-rollout-0").shares_with_learner  # its own GPU: nothing to make room for
    assert "DVERL_GPU_SHARED_WITH_LEARNER" not in apart.of("j-rollout-0").env()
    over = lay_out(moved, plan, parse_machine("1x24Gi"), {"rollout": 16 * 2**30, "learner": 10 * 2**30})
    assert over.problems == (
        "GPU 0: j-learner-0, j-rollout-0, j-reference-0 need 26.0 GiB together, it has 24.0 GiB",
    )


def test_a_placed_worker_sees_only_its_gpu() -> None:
    parsed = parse_spec(SPEC)
    moved, plan, colocated = machine_job(parsed, "j", parse_machine("8"))
    layout = lay_out(moved, plan, parse_machine("8"), colocated=colocated)
    # the machine's GPU 2 is the only one rollout 1 sees: inside it, it is cuda:0
    assert layout.of("j-rollout-1").env() == {"CUDA_VISIBLE_DEVICES": "2", "DVERL_DEVICE": "cuda"}
    assert layout.of("j-reward-0").env() == {"CUDA_VISIBLE_DEVICES": "", "DVERL_DEVICE": "cpu"}


@pytest.mark.parametrize("text", ["x", "2xnonsense", "-1", "1x"])
def test_a_bad_machine_names_the_flag(text: str) -> None:
    with pytest.raises(MachineError, match="--machine"):
        parse_machine(text)


def test_known_gpu_types_and_quantities() -> None:
    assert parse_machine("8x80Gi").gpu_memory == 80 * 2**30 and parse_machine("8x80Gi").gpus == 8
    assert parse_machine("4xa100").gpu_memory is not None


def test_dverl_plan_shows_each_workers_device_for_one_and_eight_gpus(tmp_path: Path, capsys) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob",
                                        "metadata": {"name": "j"}, "spec": SPEC}))  # fmt: skip
    (tmp_path / "x.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    assert main_plan(str(manifest), as_json=True, machine="8x80Gi") == 0
    eight = json.loads(capsys.readouterr().out)
    assert {w["name"]: w["device"] for w in eight["workers"]} == devices(SPEC, "8x80Gi")[0]
    assert eight["workers"][0]["visible_gpus"] == [0]
    assert main_plan(str(manifest), as_json=True, machine="1x80Gi") == 0
    one = json.loads(capsys.readouterr().out)
    assert one["colocated"] == ["rollout"]
    assert {w["name"]: w["device"] for w in one["workers"]} == {
        "j-learner-0": "cuda:0", "j-reward-0": "cpu", "j-reference-0": "cuda:0",
    }  # fmt: skip
    assert main_plan(str(manifest), workers=True) == 0  # no machine: what each pod would get
    lines = capsys.readouterr().out
    assert "j-learner-0: role=learner index=0 gpus=1 device=cuda " in lines
    assert "j-reward-0: role=reward index=0 gpus=1 device=cpu " in lines
