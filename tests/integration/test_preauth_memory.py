"""What an oversized call costs a live worker (a real reward worker: TLS, a token per role), before and
after authentication:

- a stranger's 32 concurrent token-less unary calls of ~64 MiB each are refused, and the worker's resident
  memory grows by a bounded amount (the refused bodies are never read in), where it used to grow by ~2 GB
  and keep it;
- a holder of the learner's token (it may call Ready and Score) sending calls of tens of MiB to Ready,
  whose requests are a few bytes, is refused with RESOURCE_EXHAUSTED naming the method and its 64 KiB
  limit; over the largest request the server's methods take (Score's 64 MiB) gRPC refuses from the length
  prefix, before the body is read; either way the worker's memory comes back to where it was, and it
  answers honest calls after.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.launch.run import write_config
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.security.credentials import run_folder_credentials
from decentralized_verl.spec.manifest import load_job
from decentralized_verl.transport import secure
from tests.support.job_manifests import e2e_manifest

CALLS = 32
BODY = 63 << 20
BOUND = 256 << 20
"""Far below the ~2 GB the bodies would take, far above a worker's own churn serving 32 refusals."""
READY = f"/{pb.DESCRIPTOR.services_by_name['Health'].full_name}/Ready"
SEND_BIG = [("grpc.max_send_message_length", 128 << 20)]


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def unknown_field(size: int) -> bytes:
    """A valid protobuf message of exactly `size` bytes, one unknown field (number 15): any request type
    parses it, so only a size limit refuses it."""
    payload = size - 1 - len(varint(size))
    payload = size - 1 - len(varint(payload))
    message = b"\x7a" + varint(payload) + b"x" * payload
    assert len(message) == size
    return message


@pytest.fixture(scope="module")
def reward_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    tmp_path = tmp_path_factory.mktemp("preauth")
    manifest = e2e_manifest(tmp_path, "preauth", **{"roles.reward": {"replicas": 1}})
    job = load_job(manifest)
    output = tmp_path / "run"
    config = write_config(job, manifest, output)
    local = run_folder_credentials(output, job.metadata.name)
    with LocalCluster(plan_job(job.spec, job.metadata.name), config, output, credentials=local) as cluster:
        cluster.start(("reward",))
        worker = cluster.by_role("reward")[0]
        with secure.sync_channel(worker.address, local.for_role("observer")) as channel:
            grpc.channel_ready_future(channel).result(timeout=300)
            pb_grpc.HealthStub(channel).Ready(pb.ReadyRequest(), timeout=300, wait_for_ready=True)
        yield worker, local


def test_token_less_huge_calls_cost_a_live_worker_bounded_memory(reward_worker: tuple[Any, Any]) -> None:
    worker, local = reward_worker
    before = rss(worker.process.pid)
    item = pb.ScoreItem(prompt_text="2+2", completion_text="4" * BODY, ground_truth="4", reward_type="x")
    request = pb.ScoreRequest(items=[item])

    def stranger(_: int) -> grpc.StatusCode:
        tls = grpc.ssl_channel_credentials(local.issued.ca)
        with grpc.secure_channel(worker.address, tls, options=SEND_BIG) as channel:
            try:
                pb_grpc.RewardStub(channel).Score(request, timeout=120)
            except grpc.RpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    with concurrent.futures.ThreadPoolExecutor(CALLS) as pool:
        codes = list(pool.map(stranger, range(CALLS)))
    after = rss(worker.process.pid)
    assert worker.alive()
    assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE}, codes
    assert grpc.StatusCode.UNAUTHENTICATED in codes
    print(f"RSS {before >> 20} MiB -> {after >> 20} MiB after {CALLS} token-less {BODY >> 20} MiB calls")
    assert after - before < BOUND, (before, after)


def settled_rss(pid: int, ceiling: int, deadline_s: float = 120.0) -> int:
    """The worker's RSS once it is under `ceiling`, or the last seen at the deadline: the memory a refused
    read took is given back shortly after the refusal, not at an instant a test can name."""
    end = time.monotonic() + deadline_s
    while True:
        now = rss(pid)
        if now < ceiling or time.monotonic() > end:
            return now
        time.sleep(0.5)


def test_a_token_holder_cannot_send_a_small_method_megabytes(reward_worker: tuple[Any, Any]) -> None:
    worker, local = reward_worker
    learner = local.for_role("learner")
    before = rss(worker.process.pid)

    def insider(size: int) -> tuple[grpc.StatusCode, str]:
        with secure.sync_channel(worker.address, learner) as channel:
            ready = channel.unary_unary(READY)
            try:
                ready(unknown_field(size), timeout=120)
            except grpc.RpcError as exc:
                return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    # Under the server's limit (Score takes 64 MiB): read, then refused by Ready's own limit, by name.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(insider, [60 << 20] * 8))
    for code, details in answers:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "Ready from " in details and "over Health/Ready's limit of 65536 bytes" in details, details
    # Over it: gRPC refuses from the length prefix, the body never buffered.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(insider, [(64 << 20) + 1024] * 8))
    for code, details in answers:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "larger than max" in details and str(64 << 20) in details, details
    code, details = insider(1 << 20)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "1048576 bytes, over Health/Ready's" in details
    after = settled_rss(worker.process.pid, before + BOUND // 2)
    print(
        f"RSS {before >> 20} MiB -> {after >> 20} MiB after 17 oversized Ready calls with the learner's token"
    )
    assert after - before < BOUND // 2, (before, after)
    assert worker.alive()
    with secure.sync_channel(worker.address, learner) as channel:
        assert pb_grpc.HealthStub(channel).Ready(pb.ReadyRequest(), timeout=60).ready
