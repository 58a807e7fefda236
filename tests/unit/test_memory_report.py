"""A worker's own memory estimate, left as its termination message while it runs: written from the
model's files (which the operator never reads), read back by the operator only when it is well formed,
and cleared on every end but a kill for memory, never over what else a worker wrote there."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from decentralized_verl.core.final_report import read_final, write_final, write_verdict
from decentralized_verl.core.memory_report import (
    MAX_BYTES,
    MemoryEstimate,
    clear_estimate,
    estimate_line,
    read_estimate,
    write_estimate,
)
from decentralized_verl.entrypoints.worker_config import leave_memory_estimate
from decentralized_verl.planning import plan_for
from decentralized_verl.planning.own_estimate import own_estimate
from decentralized_verl.spec import JobSpec
from decentralized_verl.spec.manifest import parse_spec

LEARNER = MemoryEstimate("learner", 35_429_146_656, None)
ROLLOUT_ON_GPU = MemoryEstimate("rollout", 536_870_912, 6_933_454_848)
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def model_folder(base: Path) -> Path:
    """A model as a user's folder holds it, as far as the planner reads it: its config.json alone."""
    folder = base / "models" / "m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def path_spec(model: str = "models/m") -> JobSpec:
    return parse_spec(
        {
            "model": {"path": model},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "x.jsonl"},
            "roles": {
                "rollout": {
                    "replicas": 3,
                    "nodePools": [
                        {"name": "cpu", "replicas": 1, "resources": {"memory": "64Gi"}},
                        {
                            "name": "gpu",
                            "replicas": 2,
                            "resources": {"memory": "32Gi", "gpus": 1, "gpuMemory": "80Gi"},
                        },
                    ],
                },
                "learner": {"replicas": 1, "resources": {"memory": "2Gi"}},
            },
            "training": {"batchSize": 4},
        }
    )


def test_written_where_the_kubelet_reads_it_and_read_back(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    assert write_estimate(LEARNER, log) is False and not log.exists()  # not in a pod: nothing written
    log.touch()
    assert write_estimate(ROLLOUT_ON_GPU, log) is True
    line = log.read_text()
    assert json.loads(line) == {
        "dverlMemory": {"role": "rollout", "hostBytes": 536870912, "gpuBytes": 6933454848}
    }
    assert read_estimate(line) == ROLLOUT_ON_GPU
    assert read_estimate(estimate_line(LEARNER)) == LEARNER
    assert read_final(line) == {}  # no final progress either


@pytest.mark.parametrize(
    "message",
    [
        "",
        "   \n",
        "Traceback (most recent call last):\n  ...\nMemoryError",
        '{"dverlFinal": {"step": 3, "policyVersion": 3}}',
        "{not json",
        "[1, 2]",
        '{"dverlMemory": [1, 2]}',
        '{"dverlMemory": {"role": "learner"}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": 0}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": -5}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": true}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": 1.5e9}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": "1000"}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": null}}',
        f'{{"dverlMemory": {{"role": "learner", "hostBytes": {MAX_BYTES + 1}}}}}',
        f'{{"dverlMemory": {{"role": "learner", "hostBytes": {"9" * 5000}}}}}',  # far too long
        f'{{"dverlMemory": {{"role": "learner", "hostBytes": 1{"0" * 400}}}}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": 1000, "gpuBytes": "lots"}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": 1000, "gpuBytes": 0}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": 1000, "gpuBytes": false}}',
        '{"dverlMemory": {"role": 7, "hostBytes": 1000}}',
        '{"dverlMemory": {"role": "", "hostBytes": 1000}}',
        '{"dverlMemory": {"role": "Learner; rm -rf /", "hostBytes": 1000}}',
        '{"dverlMemory": {"role": "' + "a" * 100 + '", "hostBytes": 1000}}',
        '{"dverlMemory": {"role": "learner", "hostBytes": 1000}, "other": 1}',
        '{"dverlMemory": {"role": "learner", "hostBytes": 1000}}\nKilled',  # more than the line
        "[" * 100_000,  # deep nesting
        '{"dverlMemory": {"role": "learner", "hostBytes": 1000' + " " * 1000 + "}}",  # too long a line
    ],
)
def test_anything_else_in_a_termination_message_is_no_estimate(message: str) -> None:
    assert read_estimate(message) is None


def test_a_well_formed_line_is_read_whatever_the_whitespace_around_it() -> None:
    said = '  {"dverlMemory": {"role": "reward", "hostBytes": 1000, "gpuBytes": null}}\n\n'
    assert read_estimate(said) == MemoryEstimate("reward", 1000, None)
    assert read_estimate('{"dverlMemory": {"role": "critic", "hostBytes": 1000}}') == MemoryEstimate(
        "critic", 1000
    )


def test_clearing_takes_away_the_estimate_and_nothing_else(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    assert clear_estimate(log) is False  # not in a pod
    log.touch()
    assert clear_estimate(log) is False and log.read_text() == ""
    write_estimate(LEARNER, log)
    assert clear_estimate(log) is True and log.read_text() == ""

    write_estimate(LEARNER, log)
    write_final({"steps": 3, "policy_version": 3, "reward_last": 0.5}, log)  # the learner finished
    assert clear_estimate(log) is False
    assert read_final(log.read_text()) == {"step": 3, "policyVersion": 3, "reward": 0.5}

    write_estimate(LEARNER, log)
    write_verdict("refit parity failed after the refresh to policy version 3", log)
    assert clear_estimate(log) is False
    assert log.read_text() == "refit parity failed after the refresh to policy version 3\n"

    log.write_text("x" * 100_000)  # something long that is no estimate stays whole
    assert clear_estimate(log) is False and len(log.read_text()) == 100_000


def test_each_worker_gets_the_estimate_of_its_own_pool_from_its_models_files(tmp_path: Path) -> None:
    model_folder(tmp_path)
    spec = path_spec()
    plan = plan_for(spec, tmp_path)
    assert plan_for(spec, None).workers == ()  # the operator, reading no folders, knows nothing of it
    learner = own_estimate(plan, spec, "learner", 0)
    assert learner is not None and learner.role == "learner" and learner.gpu_bytes is None
    assert learner.host_bytes > 2 * 1024**3  # a 1B-parameter model's learner: far over its 2Gi
    on_cpu = own_estimate(plan, spec, "rollout", 0)
    on_gpu = [own_estimate(plan, spec, "rollout", i) for i in (1, 2)]
    assert on_cpu is not None and on_cpu.gpu_bytes is None
    assert on_gpu[0] == on_gpu[1] and on_gpu[0] is not None and on_gpu[0].gpu_bytes is not None
    assert on_gpu[0].host_bytes < on_cpu.host_bytes  # the weights live on the GPU there
    assert own_estimate(plan, spec, "span", 0) is None  # roles the planner does not size: nothing
    assert own_estimate(plan, spec, "critic", 0) is None


def test_a_worker_leaves_its_estimate_only_when_the_planner_has_one(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.touch()
    assert leave_memory_estimate(path_spec(), "learner", 0, tmp_path, log) is False  # no such folder
    assert log.read_text() == ""
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{broken")
    assert leave_memory_estimate(path_spec(), "learner", 0, tmp_path, log) is False  # loading will say
    assert log.read_text() == ""
    (tmp_path / "models" / "m" / "config.json").write_text(json.dumps(CONFIG))
    assert leave_memory_estimate(path_spec(), "learner", 0, tmp_path, log) is True
    said = read_estimate(log.read_text())
    assert said is not None and said == own_estimate(
        plan_for(path_spec(), tmp_path), path_spec(), "learner", 0
    )
    assert leave_memory_estimate(path_spec(), "learner", 0, tmp_path, tmp_path / "absent") is False


TERMINATED_WHILE_LOADING = """
import os, signal, sys, time
from pathlib import Path
from decentralized_verl.core.final_report import write_final
from decentralized_verl.core.memory_report import MemoryEstimate, clear_on_sigterm, write_estimate

log, finished = Path(sys.argv[1]), sys.argv[2] == "finished"
write_estimate(MemoryEstimate("learner", 1000), log)
clear_on_sigterm(log)
if finished:
    write_final({"steps": 2, "policy_version": 2}, log)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)  # the signal ends it first
sys.exit(9)
"""


def test_a_sigterm_before_the_worker_handles_it_clears_the_estimate_and_still_ends_it(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.touch()
    for finished, left in ((False, ""), (True, '{"dverlFinal": {"step": 2, "policyVersion": 2}}\n')):
        command = [sys.executable, "-c", TERMINATED_WHILE_LOADING, str(log), "finished" if finished else "no"]
        ended = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert ended.returncode == -signal.SIGTERM, ended.stderr  # ended by the signal, as by default
        assert log.read_text() == left
