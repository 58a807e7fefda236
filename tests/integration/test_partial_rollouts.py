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
from decentralized_verl.orchestration import dispatch, hedging
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
    prefix (when armed), and records the prefixes it passed on.

    The worker is stopped, for the dispatcher, at that prefix: whatever the worker had sent past it before
    the signal took hold (on a busy machine it may have finished its share meanwhile) is never read, as if
    the stop had come first. The share then waits, as a stopped worker's does, until the dispatcher gives
    up on it."""

    def __init__(self, address: str, worker_id: str, pid: int) -> None:
        super().__init__(address, worker_id)
        self.pid, self.armed, self.stopped = pid, False, asyncio.Event()
        self.prefixes: dict[tuple[str, int], Sample] = {}

    async def generate(self, items, sampling, version):
        async for s in super().generate(items, sampling, version):
            if s.finish_reason == "partial":
                self.prefixes[s.key] = s
            yield s
            if s.finish_reason == "partial" and self.armed:
                os.kill(self.pid, signal.SIGSTOP)
                self.stopped.set()
                await asyncio.Event().wait()  # nothing more comes from a stopped worker


class FinishesAfter(GrpcRolloutClient):
    """The real gRPC client of a real worker process whose share ends only once `after` is set (each answer
    still passes on as it comes). The dispatcher hedges a late share only onto a worker that finished its
    own: held until the other worker was stopped, this one cannot be handed that share before there is a
    prefix to continue from."""

    def __init__(self, address: str, worker_id: str) -> None:
        super().__init__(address, worker_id)
        self.after: asyncio.Event | None = None

    async def generate(self, items, sampling, version):
        async for s in super().generate(items, sampling, version):
            yield s
        if self.after is not None:
            await self.after.wait()


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
            env=console_env(DVERL_PARTIAL_EVERY_S="0"),  # a prefix after every token
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
    # The stopped worker's share is hedged, not failed at a deadline; the held share of the other worker
    # must not fail at one either, however long the machine takes to reach the stop.
    monkeypatch.setattr(dispatch, "DEADLINE_FLOOR_S", 3600.0)
    for proc, address in procs:
        try:
            await wait_ready(address, timeout=180)
        except TimeoutError:
            proc.kill()
            logs = (folder / "w0.log").read_text()[-2000:] + (folder / "w1.log").read_text()[-2000:]
            raise AssertionError(logs) from None
    _, tok = load_model_and_tokenizer(spec.model)
    slow = StopsOnFirstPrefix(procs[0][1], "slow", procs[0][0].pid)
    fast = FinishesAfter(procs[1][1], "fast")
    dispatcher = Dispatcher([slow, fast])
    originals = {f"q{i}": Prompt(f"q{i}", i, tuple(tok.encode(f"{i} + {i} =")), f"{i}+{i}") for i in range(2)}
    work = [(p, k) for p in originals.values() for k in range(2)]
    try:
        await dispatcher.run(work, LONG, 0)  # both measured
        # The slow worker is stopped right after its first prefix reaches us; the fast one finishes its own
        # share only then, and is handed the stopped share's items to continue.
        slow.armed, fast.after = True, slow.stopped
        try:
            samples, report = await asyncio.wait_for(dispatcher.run(work, LONG, 0), 300)
        except TimeoutError:
            raise AssertionError(
                f"the step never ended: slow stopped {slow.stopped.is_set()}, benched {dispatcher._skip}, "
                f"down {dispatcher.gate.down}"
            ) from None
        keys = [s.key for s in samples]
        assert sorted(keys) == sorted((p.prompt_id, k) for p, k in work) and len(set(keys)) == len(keys)
        assert slow.stopped.is_set() and report.assigned["slow"] >= 1, report
        assert report.continued > 0 and report.hedged >= report.continued, report
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
