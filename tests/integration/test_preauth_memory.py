"""What a stranger's call costs a live worker before it is authenticated: 32 concurrent token-less unary
calls of ~64 MiB each against a real reward worker (TLS, a token per role) are refused, and the worker's
resident memory grows by a bounded amount (the refused bodies are never read in), where it used to grow
by ~2 GB and keep it."""

from __future__ import annotations

import concurrent.futures
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

CALLS = 32
BODY = 63 << 20
BOUND = 256 << 20
"""Far below the ~2 GB the bodies would take, far above a worker's own churn serving 32 refusals."""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def test_token_less_huge_calls_cost_a_live_worker_bounded_memory(tmp_path: Path) -> None:
    manifest = e2e_manifest(tmp_path, "preauth", **{"roles.reward": {"replicas": 1}})
    job = load_job(manifest)
    output = tmp_path / "run"
    config = write_config(job, manifest, output)
    local = run_folder_credentials(output, job.metadata.name)
    observer = local.for_role("observer")
    with LocalCluster(plan_job(job.spec, job.metadata.name), config, output, credentials=local) as cluster:
        cluster.start(("reward",))
        worker = cluster.by_role("reward")[0]
        with secure.sync_channel(worker.address, observer) as channel:
            grpc.channel_ready_future(channel).result(timeout=300)
            pb_grpc.HealthStub(channel).Ready(pb.ReadyRequest(), timeout=300, wait_for_ready=True)
        before = rss(worker.process.pid)
        item = pb.ScoreItem(prompt_text="2+2", completion_text="4" * BODY, ground_truth="4", reward_type="x")
        request = pb.ScoreRequest(items=[item])
        options = [("grpc.max_send_message_length", 128 << 20)]

        def stranger(_: int) -> grpc.StatusCode:
            tls = grpc.ssl_channel_credentials(local.issued.ca)
            with grpc.secure_channel(worker.address, tls, options=options) as channel:
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
