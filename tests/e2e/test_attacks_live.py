"""A live job attacked the way an outsider or an insider would: `dverl run`'s secured cluster (a learner,
a rollout worker and a reward worker as real processes on 127.0.0.1, TLS, a token per role) while it
trains, and callers holding no token, a rollout worker's token or a reward worker's token try what
would take it over. Each is refused before the servicer runs, with a status naming the call, the peer
and why; the job trains on to the end, its metrics whole.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import grpc

from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.launch.run import coordinator_status, write_config
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.reporting.metrics import read_metrics
from decentralized_verl.security.credentials import JobCredentials, LocalCredentials, run_folder_credentials
from decentralized_verl.spec.manifest import load_job
from decentralized_verl.transport import secure
from tests.support.job_manifests import e2e_manifest

STEPS = 6
PWNED = "pwned_{pid}"
"""A module that, if a worker ever imported it, would leave a file behind."""


def start_job(tmp_path: Path) -> tuple[LocalCluster, LocalCredentials]:
    manifest = e2e_manifest(
        tmp_path,
        "attack-e2e",
        **{
            "training.steps": STEPS,
            "training.evalEvery": 0,
            "roles.rollout": {"replicas": 1, "batchSize": 16},
            "roles.reward": {"replicas": 1},
        },
    )
    job = load_job(manifest)
    output = tmp_path / "run"
    config = write_config(job, manifest, output)
    local = run_folder_credentials(output, job.metadata.name)
    cluster = LocalCluster(plan_job(job.spec, job.metadata.name), config, output, credentials=local)
    return cluster, local


def rpc(address: str, creds: JobCredentials | None, call) -> tuple[grpc.StatusCode, str]:
    """Run `call(channel)` on a TLS channel carrying `creds`' token (None: the CA alone, no token)."""
    if creds is None:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(local_ca[0]))
    else:
        channel = secure.sync_channel(address, creds)
    with channel:
        try:
            call(channel)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


local_ca: list[bytes] = []


def wait_ready(address: str, observer: JobCredentials, deadline: float) -> None:
    while time.monotonic() < deadline:
        code, _ = rpc(
            address, observer, lambda ch: pb_grpc.HealthStub(ch).Ready(pb.ReadyRequest(), timeout=2)
        )
        if code == grpc.StatusCode.OK:
            return
        time.sleep(0.2)
    raise AssertionError(f"{address} never became ready")


def score(kind: str):
    item = pb.ScoreItem(prompt_text="2+2", completion_text="4", ground_truth="4", reward_type=kind)
    return lambda ch: pb_grpc.RewardStub(ch).Score(pb.ScoreRequest(items=[item]), timeout=10)


def push(relay, version: int, address: str) -> str:
    """Push `relay`'s held `version` to the rollout worker at `address`, as a relay of the chain would;
    the worker's answer ("ok" or why not)."""
    from decentralized_verl.transport.weights.route import plan_route

    async def go() -> str:
        try:
            return (await relay.fan_out(version, plan_route([address]), timeout_s=60))[address]
        finally:
            await relay.close()

    return asyncio.run(go())


def signed_far_ahead(signing_key: bytes, rollout: JobCredentials, version: int):
    """A relay holding a version the learner never made, validly signed with the learner's key."""
    import torch

    from decentralized_verl.transport.weights.publish import WeightPublisher
    from decentralized_verl.transport.weights.relay import WeightRelay

    publisher = WeightPublisher(dtype=None, signing_key=signing_key)
    publisher.publish({"lm_head.weight": torch.zeros(4, 4)}, version)
    return WeightRelay(publisher, credentials=rollout)


def test_outsiders_and_insiders_cannot_take_a_live_job_over(tmp_path: Path, monkeypatch) -> None:
    pwned = PWNED.format(pid=os.getpid())
    marker = tmp_path / "pwned-ran"
    (tmp_path / "attacker").mkdir()
    (tmp_path / "attacker" / f"{pwned}.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n\ndef run(*args, **kwargs):\n    return 1.0\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'attacker'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cluster, local = start_job(tmp_path)
    local_ca[:] = [local.issued.ca]
    observer, rollout, reward, learner_creds = (
        local.for_role(r) for r in ("observer", "rollout", "reward", "learner")
    )
    learner = cluster.by_role("learner")[0]
    reward_worker = cluster.by_role("reward")[0]
    rollout_worker = cluster.by_role("rollout")[0]
    with cluster:
        cluster.start()
        deadline = time.monotonic() + 600
        wait_ready(reward_worker.address, observer, deadline)
        wait_ready(rollout_worker.address, observer, deadline)  # attacked below: it must be serving
        while coordinator_status(learner.address, observer) is None:
            assert learner.alive() and time.monotonic() < deadline, learner.log_tail()
            time.sleep(0.2)
        # A rollout insider records the learner's first version (its token may Fetch it) to replay it.
        from decentralized_verl.transport.weights.relay import WeightRelay

        recorder = WeightRelay(credentials=rollout)
        replayed = asyncio.run(recorder.catch_up(learner.address, 0, wait_s=120))

        # A stranger who trusts the job's CA (it is public) but holds no token: refused on every door.
        code, details = rpc(reward_worker.address, None, score("boxed"))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert details.startswith("Score from 127.0.0.1:") and "no valid job token" in details

        # A broken-into rollout worker: its token pulls and forwards weights, nothing else.
        code, details = rpc(reward_worker.address, rollout, score(f"{pwned}:run"))
        assert code == grpc.StatusCode.PERMISSION_DENIED, details
        assert (
            details.startswith("Score from 127.0.0.1:")
            and "the rollout role has no right to Reward/Score" in details
        )
        code, details = rpc(
            learner.address,
            rollout,
            lambda ch: pb_grpc.CoordinatorStub(ch).Status(pb.StatusRequest(), timeout=5),
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED and "no right to Coordinator/Status" in details
        generate = pb.GenerateRequest(
            request_id="x", items=[pb.GenerateItem(prompt_id="p", prompt_token_ids=[1, 2])]
        )
        code, details = rpc(
            rollout_worker.address,
            reward,
            lambda ch: list(pb_grpc.RolloutStub(ch).Generate(generate, timeout=5)),
        )
        assert (
            code == grpc.StatusCode.PERMISSION_DENIED
            and "the reward role has no right to Rollout/Generate" in details
        )
        code, details = rpc(
            learner.address,
            rollout,
            lambda ch: pb_grpc.WeightsStub(ch).GetManifest(pb.ManifestRequest(latest=True), timeout=5),
        )
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND), details  # a right it needs

        # A version far ahead of the learner's, validly signed (the key is the learner's): the worker
        # refuses it before a byte, naming it, and keeps following the learner.
        jump = 1_000_000
        outcome = push(
            signed_far_ahead(local.issued.signing_key, rollout, jump), jump, rollout_worker.address
        )
        assert outcome != "ok" and f"weights v{jump}" in outcome and "does not publish" in outcome, outcome
        assert f"refused weights v{jump} pushed from" in rollout_worker.log_tail(200)

        # Even the coordinator's own token cannot make the reward worker run code a request names.
        code, details = rpc(reward_worker.address, learner_creds, score(f"{pwned}:run"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert f"items[0].reward_type: '{pwned}:run' is not a reward type of this job" in details
        assert "decentralized_verl.rewards.toy:first_number" in details
        code, _ = rpc(
            reward_worker.address, learner_creds, score("decentralized_verl.rewards.toy:first_number")
        )
        assert code == grpc.StatusCode.OK  # the job's own reward type still scores
        assert not marker.exists()  # the attacker's module was never imported anywhere

        # Nothing secret on disk nor in any worker's environment: the signing key and tokens were
        # handed through pipes.
        secrets = [
            local.issued.signing_key,
            local.issued.signing_key.hex().encode(),
            *local.issued.tokens.values(),
        ]
        for path in (tmp_path / "run").rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert not any(s in data for s in secrets), path
        for lw in cluster.workers.values():
            environ = Path(f"/proc/{lw.process.pid}/environ").read_bytes()
            assert not any(s in environ for s in secrets), lw.worker.name

        # A serving worker that exits 0 (SIGTERM) is no longer running: `dverl run` restarts it.
        cluster.kill(reward_worker.worker.name, signal.SIGTERM)
        reward_worker.process.wait(timeout=60)
        assert reward_worker in cluster.failed()
        cluster.restart(reward_worker.worker.name)
        wait_ready(reward_worker.address, observer, deadline)
        wait_ready(rollout_worker.address, observer, deadline)  # attacked below: it must be serving

        assert learner.process.wait(timeout=600) == 0, learner.log_tail()
        # The recorded version replayed once the worker has moved on (a signed replay): refused.
        assert replayed < STEPS - 1  # the worker holds one of the last two versions by now
        outcome = push(recorder, replayed, rollout_worker.address)
        assert outcome != "ok" and f"weights v{replayed}: not newer than" in outcome, outcome
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert not marker.exists()
