"""Partial rollouts: a rollout worker sends the prefixes of unfinished responses; when it is cut off (here a
real `dverl worker --role rollout` process SIGSTOPped mid-share), another worker continues each of its items
from that prefix, and the step completes with every item once, each continued one tagged with the worker
and policy version of both parts. Also the pieces: the backend's prefixes, the wire rules for them, and the
grouping and stitching of continuations, with their bad cases.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
import torch
import yaml

from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.orchestration import hedging
from decentralized_verl.orchestration.dispatch import Dispatcher
from decentralized_verl.spec import with_defaults
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.transport.clients import GrpcRolloutClient, wait_ready
from tests.support.processes import console_env, free_port

torch.set_num_threads(1)

TINY = {
    "hiddenSize": 64,
    "numLayers": 2,
    "numHeads": 4,
    "intermediateSize": 128,
    "maxPositions": 512,
    "seed": 3,
}
LONG = SamplingParams(max_new_tokens=64, temperature=1.0, seed=5)


# ---------------------------------------------------------------------------------- real processes


class StopsOnFirstPrefix(GrpcRolloutClient):
    """The real gRPC client of a real worker process, which SIGSTOPs that process as soon as it has sent a
    prefix (when armed), and records the prefixes it passed on."""

    def __init__(self, address: str, worker_id: str, pid: int) -> None:
        super().__init__(address, worker_id)
        self.pid, self.armed, self.stopped = pid, False, False
        self.prefixes: dict[tuple[str, int], Sample] = {}

    async def generate(self, items, sampling, version):
        async for s in super().generate(items, sampling, version):
            if s.finish_reason == "partial":
                if self.armed and not self.stopped:
                    os.kill(self.pid, signal.SIGSTOP)
                    self.stopped = True
                self.prefixes[s.key] = s
            yield s


@pytest.fixture()
def workers(tmp_path):
    spec = parse_spec(
        {
            "model": {"tiny": TINY},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "x.jsonl", "rewardType": "boxed"},
            "roles": {"rollout": {"replicas": 2, "batchSize": 8}, "learner": {"replicas": 1}},
            "training": {"batchSize": 4},
        }
    )
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(with_defaults(spec)))
    procs: list[tuple[subprocess.Popen, str]] = []
    for index in range(2):
        port = free_port()
        args = ["--config", str(config), "--job", "pr", "--index", str(index), "--port", str(port)]
        log = (tmp_path / f"w{index}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "decentralized_verl.cli", "worker", "--role", "rollout", *args],
            env=console_env(DVERL_PARTIAL_EVERY_S="0.05"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append((proc, f"127.0.0.1:{port}"))
    yield spec, procs, tmp_path
    for proc, _ in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


async def test_a_stopped_workers_items_are_continued_elsewhere_from_their_prefixes(
    workers, monkeypatch
) -> None:
    spec, procs, folder = workers
    monkeypatch.setattr(hedging, "HEDGE_FLOOR_S", 1.0)
    monkeypatch.setattr(hedging, "HEDGE_FACTOR", 1.0)  # hedged once past the time its speed implies
    for proc, address in procs:
        try:
            await wait_ready(address, timeout=180)
        except TimeoutError:
            proc.kill()
            logs = (folder / "w0.log").read_text()[-2000:] + (folder / "w1.log").read_text()[-2000:]
            raise AssertionError(logs) from None
    _, tok = load_model_and_tokenizer(spec.model)
    slow = StopsOnFirstPrefix(procs[0][1], "slow", procs[0][0].pid)
    fast = GrpcRolloutClient(procs[1][1], "fast")
    originals = {f"q{i}": Prompt(f"q{i}", i, tuple(tok.encode(f"{i} + {i} =")), f"{i}+{i}") for i in range(2)}
    work = [(p, k) for p in originals.values() for k in range(2)]
    try:
        # The slow worker is stopped right after its first prefix reaches us; if it had already finished its
        # share by then (a very busy machine), nothing needed continuing: let it go and try another step.
        # Each try has a dispatcher of its own, both workers measured first: a worker hedged in one try
        # would sit out the next (its probation) and leave nothing to stop.
        for _ in range(3):
            dispatcher = Dispatcher([slow, fast])
            slow.armed = False
            await dispatcher.run(work, LONG, 0)  # both measured
            slow.armed, slow.stopped = True, False
            samples, report = await asyncio.wait_for(dispatcher.run(work, LONG, 0), 300)
            keys = [s.key for s in samples]
            assert sorted(keys) == sorted((p.prompt_id, k) for p, k in work) and len(set(keys)) == len(keys)
            os.kill(procs[0][0].pid, signal.SIGCONT)
            if report.continued:
                break
        # Hedged when its share ran late, or re-dispatched if its stream broke first (a keepalive timeout).
        assert report.continued > 0 and report.hedged + report.redispatched >= report.continued
        continued = [s for s in samples if s.parts]
        assert len(continued) == report.continued
        for s in continued:
            (first, k, n1), (second, v, n2) = s.parts
            assert (first, second, k, v) == ("slow", "fast", 0, 0) and n1 + n2 == len(s.response_ids)
            prefix = slow.prefixes[s.key]
            assert s.response_ids[:n1] == prefix.response_ids and s.logprobs[:n1] == prefix.logprobs
            assert len(s.logprobs) == len(s.response_ids) <= LONG.max_new_tokens
            assert s.worker_id == "fast" and s.prompt == originals[s.prompt.prompt_id]  # not the extended one
        assert all(not s.parts for s in samples if s.worker_id == "slow")
    finally:
        os.kill(procs[0][0].pid, signal.SIGCONT)
        await slow.close()
        await fast.close()
