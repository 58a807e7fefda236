"""Every role's worker takes its device through the one path a GPU run takes: `dverl worker` reads the
role's resources and override, `runtime.device.enter` decides, and the worker reports in its Ready reply
the device it chose and the GPU memory it holds (what the GPU check reads on CUDA).

On this machine every device resolves to the CPU; a worker asked for CUDA here fails at its start, naming
the setting that asked, before it loads anything.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from decentralized_verl.runtime.device import gpu_count
from decentralized_verl.spec import with_defaults
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.transport.clients import wait_ready
from tests.support.processes import free_port

TINY = {"hiddenSize": 32, "numLayers": 2, "numHeads": 2, "intermediateSize": 64}
SPEC = {
    "model": {"tiny": TINY},
    "algorithm": {"name": "ppo", "klCoef": 0.01},
    "data": {"train": "x.jsonl", "rewardType": "reward_model", "rewardModel": {"tiny": TINY}},
    "roles": {
        "rollout": {"replicas": 1, "batchSize": 8, "resources": {"gpus": 1}},  # given a GPU: auto falls back
        "learner": {"replicas": 1},
        "reward": {"replicas": 1, "device": "cpu"},
        "reference": {"replicas": 1, "device": "auto"},
        "critic": {"replicas": 1},
    },
    "training": {"batchSize": 8},
}


def write_config(tmp_path: Path, spec: dict) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(with_defaults(parse_spec(spec))))
    return config


def start(config: Path, role: str, port: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "decentralized_verl.cli", "worker", "--role", role, "--config", str(config)]
    argv += ["--job", "dev", "--port", str(port), *extra]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "DVERL_CPUS": "1", **(env or {})},
    )


async def readiness(ports: dict[str, int]) -> dict:
    got = await asyncio.gather(*(wait_ready(f"127.0.0.1:{p}", timeout=240) for p in ports.values()))
    return dict(zip(ports, got, strict=True))


def test_every_serving_role_reports_the_device_its_entry_chose(tmp_path: Path) -> None:
    config = write_config(tmp_path, SPEC)
    ports = {role: free_port() for role in ("rollout", "reward", "reference", "critic")}
    extra = {"critic": ("--device", "cpu")}
    procs = {role: start(config, role, port, *extra.get(role, ())) for role, port in ports.items()}
    try:
        ready = asyncio.run(readiness(ports))
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        outs = {role: proc.communicate(timeout=60)[0] for role, proc in procs.items()}
    for role, reply in ready.items():
        assert reply.ready and reply.worker_id == f"dev-{role}-0", outs[role]
        assert reply.device == "cpu" and reply.device_memory_allocated == 0, (role, reply)
        assert procs[role].returncode == 0, outs[role]
    # each says why: the rollout was given a GPU it cannot see; the reward's spec says cpu; --device
    assert "device cpu: the worker was given 1 GPU(s) but this process sees none" in outs["rollout"]
    assert "device cpu: spec.roles.reward.device is cpu" in outs["reward"]
    assert "device cpu: the role's workers were given no GPU" in outs["reference"]
    assert "device cpu: --device is cpu" in outs["critic"]


@pytest.mark.parametrize(
    "spec_device, flag, env, field",
    [
        ("cuda", (), {}, "spec.roles.reference.device"),
        ("auto", ("--device", "cuda"), {}, "--device"),
        ("cpu", (), {"DVERL_DEVICE": "cuda:0"}, "DVERL_DEVICE"),  # the environment wins over the spec
        ("auto", ("--device", "cuda"), {"CUDA_VISIBLE_DEVICES": ""}, "--device"),
    ],
)
def test_cuda_asked_for_where_none_is_seen_fails_the_worker_naming_the_setting(
    tmp_path: Path, spec_device: str, flag: tuple, env: dict, field: str
) -> None:
    if not env and gpu_count():  # on a GPU machine the same worker would start on its GPU: hide them
        env = {"CUDA_VISIBLE_DEVICES": ""}
    spec = {**SPEC, "roles": {**SPEC["roles"], "reference": {"replicas": 1, "device": spec_device}}}
    config = write_config(tmp_path, spec)
    proc = start(config, "reference", free_port(), *flag, env=env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert f"{field}: cuda" in out and "asked for, but this process sees no GPU" in out, out
