"""Refusals cost a live worker almost nothing: a stranger floods a job's reward worker (a real process
started the way `dverl run` starts it: TLS, a token per role) with calls that carry no token.

Each is refused from its metadata alone, before its body is parsed (a body that is not a valid message is
UNAUTHENTICATED for a caller with no token, and INVALID_ARGUMENT only for a caller with the right to
call), and 2,000 refusals write a few lines of log, not one line each.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc

from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.launch.run import write_config
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.security.credentials import run_folder_credentials
from decentralized_verl.spec.manifest import load_job
from decentralized_verl.transport import secure
from tests.support.job_manifests import e2e_manifest

FLOOD = 2000
SCORE = "/dverl.v1.Reward/Score"


def raw_score(channel: grpc.Channel, body: bytes) -> grpc.StatusCode:
    call = channel.unary_unary(SCORE, request_serializer=None, response_deserializer=None)
    try:
        call(body, timeout=60)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_a_flood_of_refused_calls_is_neither_parsed_nor_logged_one_by_one(tmp_path: Path) -> None:
    manifest = e2e_manifest(tmp_path, "refusals", **{"roles.reward": {"replicas": 1}})
    job = load_job(manifest)
    output = tmp_path / "run"
    local = run_folder_credentials(output, job.metadata.name)
    cluster = LocalCluster(
        plan_job(job.spec, job.metadata.name), write_config(job, manifest, output), output, credentials=local
    )
    reward = cluster.by_role("reward")[0]
    with cluster:
        cluster.start(roles=("reward",))
        deadline = time.monotonic() + 300
        with secure.sync_channel(reward.address, local.for_role("observer")) as observer:
            while True:
                try:
                    pb_grpc.HealthStub(observer).Ready(pb.ReadyRequest(), timeout=2)
                    break
                except grpc.RpcError:
                    assert reward.alive() and time.monotonic() < deadline, reward.log_tail()
                    time.sleep(0.2)
        stranger = grpc.secure_channel(reward.address, grpc.ssl_channel_credentials(local.issued.ca))
        learner = secure.sync_channel(reward.address, local.for_role("learner"))
        with stranger, learner:
            garbage = b"\xff" * 1024  # not a ScoreRequest: parsing it would fail
            assert raw_score(learner, garbage) == grpc.StatusCode.INVALID_ARGUMENT  # a caller with the right
            before = reward.log_path.stat().st_size
            started = time.perf_counter()
            codes = {raw_score(stranger, garbage) for _ in range(FLOOD)}
            elapsed = time.perf_counter() - started
            assert codes == {grpc.StatusCode.UNAUTHENTICATED}  # refused on its token, the body never parsed
            grown = reward.log_path.stat().st_size - before
            print(f"{FLOOD} refused calls: {elapsed:.2f}s, {grown} bytes of log")
            assert grown < 10_000, reward.log_tail(40)  # one line each would be ~250 kB
            big = os.urandom(48 * 1024 * 1024)
            assert raw_score(stranger, big) == grpc.StatusCode.UNAUTHENTICATED
            assert reward.alive()
