"""`dverl worker` as a pod runs it: the operator's ConfigMap holds a bare spec, the job name comes by flag.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from decentralized_verl.core.memory_report import read_estimate
from decentralized_verl.spec import with_defaults
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.transport.clients import wait_ready
from tests.support.processes import free_port

SPEC = {
    "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64}},
    "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
    "data": {"train": "x.jsonl", "rewardType": "boxed"},
    "roles": {
        "rollout": {"replicas": 2, "batchSize": 4},
        "learner": {"replicas": 1},
        "reward": {"replicas": 1},
    },
    "training": {"batchSize": 8},
}


def test_serving_worker_starts_from_a_bare_spec_config(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(with_defaults(parse_spec(SPEC))))
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "decentralized_verl.cli",
            "worker",
            "--role",
            "reward",
            "--config",
            str(config),
            "--job",
            "demo",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = asyncio.run(wait_ready(f"127.0.0.1:{port}", timeout=120))
        assert ready.ready and ready.worker_id == "demo-reward-0"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def test_bare_spec_without_job_name_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(with_defaults(parse_spec(SPEC))))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "decentralized_verl.cli",
            "worker",
            "--role",
            "reward",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--job: required" in result.stderr


LEAVING_ITS_ESTIMATE = """
import logging
import sys
from pathlib import Path

from decentralized_verl.entrypoints.worker import _job_worker
from decentralized_verl.entrypoints.worker_args import WorkerArgs
from decentralized_verl.settings import WorkerSettings

log, role, config, port = sys.argv[1:]
logging.basicConfig(level=logging.WARNING)
logging.getLogger("decentralized_verl.entrypoints.worker_config").setLevel(logging.DEBUG)  # what it left
args = WorkerArgs(role=role, config=config, job="demo", port=int(port))
sys.exit(_job_worker(args, WorkerSettings.from_env(), Path(log)))
"""
"""A job's worker as `dverl worker --config` starts it, its termination message at a path a test reads
(a pod's is /dev/termination-log)."""


def test_a_workers_memory_estimate_is_its_message_while_it_runs_and_gone_when_it_ends(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(with_defaults(parse_spec(SPEC))))
    log = tmp_path / "termination-log"
    log.touch()  # as the kubelet binds it
    port = free_port()
    command = [sys.executable, "-c", LEAVING_ITS_ESTIMATE, str(log), "reward", str(config), str(port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = asyncio.run(wait_ready(f"127.0.0.1:{port}", timeout=120))
        assert ready.ready and ready.worker_id == "demo-reward-0"
        left = read_estimate(log.read_text())  # what a kill for memory now would leave the kubelet
        assert left is not None and left.role == "reward" and left.host_bytes > 0, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert log.read_text() == "", "an ordinary end leaves no estimate standing in for a message"

    # A model the planner sizes from its config.json but that cannot load: the worker fails, and the
    # kubelet falls back to its log tail, as before.
    folder = tmp_path / "broken"
    folder.mkdir()
    tiny = SPEC["model"]["tiny"]
    (folder / "config.json").write_text(
        f'{{"model_type": "llama", "hidden_size": {tiny["hiddenSize"]}, "num_hidden_layers": 1, '
        f'"num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 300}}'
    )
    broken = {
        **SPEC,
        "model": {"path": str(folder)},
        "roles": {**SPEC["roles"], "reference": {"replicas": 1}},
    }
    config.write_text(yaml.safe_dump(with_defaults(parse_spec(broken))))
    command = [
        sys.executable,
        "-c",
        LEAVING_ITS_ESTIMATE,
        str(log),
        "reference",
        str(config),
        str(free_port()),
    ]
    failed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0, said
    assert "reference 0: the planner estimates" in said, said  # it was left, then cleared
    assert log.read_text() == "", said
