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
