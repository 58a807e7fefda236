"""Partial rollouts: a rollout worker sends the prefixes of unfinished responses; when it is cut off (here a
real `dverl worker --role rollout` process SIGSTOPped mid-share), another worker continues each of its items
from that prefix, and the step completes with every item once, each continued one tagged with the worker
and policy version of both parts. Also the pieces: the backend's prefixes, the wire rules for them, and the
grouping and stitching of continuations, with their bad cases.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
from processes import console_env, free_port

torch = pytest.importorskip("torch")
grpc = pytest.importorskip("grpc")
yaml = pytest.importorskip("yaml")

from decentralized_verl.backends.base import GenerationRequest  # noqa: E402
from decentralized_verl.backends.factory import make_backend  # noqa: E402
from decentralized_verl.core.samples import Prompt, Sample  # noqa: E402
from decentralized_verl.core.sampling import SamplingParams  # noqa: E402
from decentralized_verl.models.loading import load_model_and_tokenizer  # noqa: E402
from decentralized_verl.orchestration import continuation, dispatch, hedging  # noqa: E402
from decentralized_verl.orchestration.dispatch import Dispatcher  # noqa: E402
from decentralized_verl.proto import dverl_pb2 as pb  # noqa: E402
from decentralized_verl.spec import ModelSpec, TinyModelSpec, with_defaults  # noqa: E402
from decentralized_verl.spec.catalogue.backends import HF  # noqa: E402
from decentralized_verl.spec.manifest import parse_spec  # noqa: E402
from decentralized_verl.transport import messages as m  # noqa: E402
from decentralized_verl.transport.clients import GrpcRolloutClient, wait_ready  # noqa: E402
from decentralized_verl.transport.rollout_stream import BadResult, ResultStream, generate_request  # noqa: E402

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


def prompt(i: int, tokens: tuple[int, ...] = (5, 6, 7), environment: bool = False) -> Prompt:
    return Prompt(f"p{i}", i, tokens, f"text {i}", environment=environment)


def sample(p: Prompt, index: int, ids: tuple[int, ...], *, worker="a", version=0, finish="partial") -> Sample:
    return Sample(p, index, ids, tuple(-0.5 for _ in ids), finish, "x" * len(ids), version, worker)


# ---------------------------------------------------------------------------------- pure pieces


def test_items_with_a_prefix_are_continued_with_the_remaining_budget_and_their_own_seed() -> None:
    p0, p1, p2 = prompt(0), prompt(1), prompt(2)
    partials = {("p1", 0): sample(p1, 0, (9, 9)), ("p2", 1): sample(p2, 1, (8, 8))}
    sampling = SamplingParams(max_new_tokens=10, seed=4)
    groups = continuation.groups([(p0, 0), (p1, 0), (p2, 1)], partials, sampling)
    assert [len(g.items) for g in groups] == [1, 2]  # fresh, then the two 2-token prefixes together
    fresh, cont = groups
    assert fresh.items == [(p0, 0)] and fresh.sampling == sampling and not fresh.prefixes
    assert cont.sampling.max_new_tokens == 8 and cont.sampling.seed not in (None, 4)
    assert [p.token_ids for p, _ in cont.items] == [(5, 6, 7, 9, 9), (5, 6, 7, 8, 8)]
    assert set(cont.prefixes) == {("p1", 0), ("p2", 1)}


def test_prefixes_that_cannot_be_continued_are_generated_again() -> None:
    episode, full, empty = prompt(0, environment=True), prompt(1), prompt(2)
    partials = {
        ("p0", 0): sample(episode, 0, (1,)),  # a multi-turn episode's prefix holds environment turns
        ("p1", 0): sample(full, 0, (1, 2, 3)),  # no budget left
        ("p2", 0): sample(empty, 0, ()),
    }
    groups = continuation.groups(
        [(episode, 0), (full, 0), (empty, 0)], partials, SamplingParams(max_new_tokens=3)
    )
    assert len(groups) == 1 and not groups[0].prefixes and len(groups[0].items) == 3


def test_stitching_keeps_each_parts_worker_version_and_logprobs() -> None:
    p = prompt(0)
    prefix = sample(p, 0, (1, 2), worker="slow", version=3)
    extended = Prompt("p0", 0, (5, 6, 7, 1, 2), "text 0")
    rest = Sample(extended, 0, (4,), (-0.25,), "stop", "y", 4, "fast", extra={"generation_seconds": 1.0})
    whole = continuation.stitch(prefix, rest)
    assert whole.prompt == p and whole.response_ids == (1, 2, 4) and whole.logprobs == (-0.5, -0.5, -0.25)
    assert whole.parts == (("slow", 3, 2), ("fast", 4, 1)) and whole.policy_version == 3  # the oldest part
    assert whole.finish_reason == "stop" and whole.text == "xxy" and whole.extra["continued_tokens"] == 2
    again = continuation.stitch(whole.with_(finish_reason="partial"), rest)  # a continuation continued
    assert again.parts == (("slow", 3, 2), ("fast", 4, 1), ("fast", 4, 1))
    with pytest.raises(ValueError, match=r"\('p0', 1\) does not continue prefix \('p0', 0\)"):
        continuation.stitch(prefix, rest.with_(sample_index=1))


def test_only_a_longer_prefix_replaces_the_one_held() -> None:
    p, partials = prompt(0), {}
    continuation.newer(partials, sample(p, 0, (1, 2)))
    continuation.newer(partials, sample(p, 0, (1,)))
    assert partials[("p0", 0)].response_ids == (1, 2)


# ---------------------------------------------------------------------------------- the wire


def result(request: m.GenerateBatch, key: tuple[str, int], ids, finish: int, **kw) -> pb.GenerateResult:
    return pb.GenerateResult(
        request_id=request.request_id,
        prompt_id=key[0],
        sample_index=key[1],
        response_token_ids=list(ids),
        logprobs=[-0.1] * len(ids),
        finish_reason=finish,
        text="t",
        policy_version=0,
        worker_id="w",
        **kw,
    )


def test_a_prefix_on_the_wire_is_progress_not_an_answer() -> None:
    request, prompts = generate_request([(prompt(0), 0)], SamplingParams(max_new_tokens=4), 0)
    stream = ResultStream(request, prompts, "w", m.WireLimits())
    got = stream.accept(result(request, ("p0", 0), [1], pb.FINISH_REASON_PARTIAL))
    assert got.finish_reason == "partial" and not stream.answered
    with pytest.raises(BadResult, match="unanswered"):
        stream.check_complete()
    stream.accept(result(request, ("p0", 0), [1, 2], pb.FINISH_REASON_PARTIAL))
    stream.accept(result(request, ("p0", 0), [1, 2, 3], pb.FINISH_REASON_STOP))
    stream.check_complete()
    with pytest.raises(BadResult, match=r"results\[3\]: .* already answered by results\[2\]"):
        stream.accept(result(request, ("p0", 0), [1, 2, 3], pb.FINISH_REASON_PARTIAL))


def test_a_prefix_longer_than_the_budget_or_of_an_episode_is_refused() -> None:
    request, prompts = generate_request([(prompt(0), 0)], SamplingParams(max_new_tokens=2), 0)
    stream = ResultStream(request, prompts, "w", m.WireLimits())
    with pytest.raises(BadResult, match=r"results\[0\].response_token_ids.*exceeds max_new_tokens 2"):
        stream.accept(result(request, ("p0", 0), [1, 2, 3], pb.FINISH_REASON_PARTIAL))
    request, prompts = generate_request(
        [(prompt(0, environment=True), 0)], SamplingParams(max_new_tokens=8), 0
    )
    stream = ResultStream(request, prompts, "w", m.WireLimits())
    episode = pb.Episode(loss_mask=[True], turns=["t"], end_reason="max_turns")
    with pytest.raises(BadResult, match="a multi-turn episode cannot be sent in part"):
        stream.accept(result(request, ("p0", 0), [1], pb.FINISH_REASON_PARTIAL, episode=episode))


def test_the_backend_sends_growing_prefixes_of_the_final_responses() -> None:
    model, tok = load_model_and_tokenizer(
        ModelSpec(tiny=TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2))
    )
    backend = make_backend(HF, model, tok, max_batch_size=4)
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=2)
    requests = [GenerationRequest(str(i), (5 + i, 6, 7), sampling) for i in range(3)]
    outs = list(backend.generate(requests, partial_every_s=0.0))
    finals = {o.prompt_id: o for o in outs if o.finish_reason != "partial"}
    partials = [o for o in outs if o.finish_reason == "partial"]
    assert len(finals) == 3 and partials
    for o in partials:
        final = finals[o.prompt_id].response_token_ids
        assert final[: len(o.response_token_ids)] == o.response_token_ids and len(o.response_token_ids) < len(
            final
        )
        assert o.logprobs == finals[o.prompt_id].logprobs[: len(o.logprobs)]
    assert [o.response_token_ids for o in backend.generate(requests)] == [  # without prefixes: same answers
        finals[r.prompt_id].response_token_ids for r in requests
    ]


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
