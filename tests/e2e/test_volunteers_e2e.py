"""Volunteers end to end: a bootstrap peer, a coordinator (learner) and volunteers as separate processes
on 127.0.0.1, talking only through the Hivemind DHT and P2P streams.

Run as a script (`python tests/e2e/test_volunteers_e2e.py MODE ...`) this file is also a volunteer that can
misbehave on purpose: `slow` (to be killed mid-task), `cheat` (alters log-probs or tokens), `chosen`
(submits responses drawn with a seed of its own, log-probs honest) or `predict` (predicts which samples
a verifier seeded from the job's `training.seed` would check, and forges only the others).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netlab.jobs import dht_argv, learner_argv, volunteer_argv
from netlab.manifests import volunteer_job

from decentralized_verl.security.credentials import issue, write
from tests.support.job_manifests import TOY
from tests.support.processes import ProcessGroup, free_port, script_argv

SECRET = "volunteer-e2e-secret-0123456789"

pytestmark = pytest.mark.usefixtures("collected_before_fork")


def learner_folder(tmp_path: Path, job: str) -> Path:
    """A learner's credentials as its pod mounts them (its token and the signing key)."""
    return write(tmp_path / "credentials", issue(job, "local"), "learner")


def manifest(tmp_path: Path, name: str, steps: int = 3, verify: float = 1.0) -> Path:
    """The volunteer job, every sample checked unless `verify` says fewer."""
    overrides = {"training.steps": steps, "volunteers.verifyFraction": verify}
    return volunteer_job(tmp_path, name, TOY / "train.jsonl", **overrides)


class Procs(ProcessGroup):
    def wait_for(self, name: str, pattern: str, timeout: float = 90.0) -> re.Match:
        return super().wait_for(name, pattern, timeout, also_alive="learner")


@pytest.fixture
def procs(tmp_path: Path):
    p = Procs(tmp_path)
    yield p
    p.close()


def token(job: str, ttl: float = 3600) -> str:
    from decentralized_verl.volunteers.tokens import issue_token

    return issue_token(SECRET.encode(), job, ttl)


def start_job(procs: Procs, tmp_path: Path, job: str, volunteers: int, **kw) -> tuple[str, Path]:
    """Bootstrap + coordinator; returns the --initial-peers address and the run folder."""
    port = free_port()
    procs.start("dht", dht_argv(job, port, "127.0.0.1"))
    maddr = procs.wait_for("dht", r"--initial-peers (\S+)").group(1)
    out = tmp_path / "run"
    procs.start(
        "learner",
        learner_argv(manifest(tmp_path, job, **kw), free_port(), out),
        {
            # A secured learner, as the operator starts one: it signs every weight version, and the
            # volunteers it admits refuse any version its key did not sign.
            "DVERL_TLS_DIR": str(learner_folder(tmp_path, job)),
            "DVERL_DHT_ADDR": maddr,  # what the bootstrap printed: its identity is random
            "DVERL_JOIN_SECRET": SECRET,
            "DVERL_WAIT_VOLUNTEERS": f"{volunteers}:180",
            "DVERL_VOLUNTEER_POLL_S": "0.5",
        },
    )
    return maddr, out


def volunteer_cmd(maddr: str, job: str, tok: str, mode: str | None = None, *args: str) -> list[str]:
    if mode is None:
        return volunteer_argv(maddr, job, tok, "127.0.0.1")
    return script_argv(__file__, mode, maddr, job, tok, *args)


def finish(procs: Procs, out: Path, timeout: float = 240) -> tuple[list[dict], dict]:
    try:
        assert procs.procs["learner"].wait(timeout) == 0, procs.log("learner")[-4000:]
    except subprocess.TimeoutExpired:
        raise AssertionError(procs.log("learner")[-4000:]) from None
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return records, json.loads((out / "volunteers.json").read_text())


def test_two_volunteers_train_and_every_prompt_is_answered_once(procs: Procs, tmp_path: Path) -> None:
    job = "vol-e2e"
    maddr, out = start_job(procs, tmp_path, job, volunteers=2)
    for i in range(2):  # each volunteer its own token: a token admits one peer identity
        procs.start(f"vol{i}", volunteer_cmd(maddr, job, token(job)))
    for i in range(2):
        joined = procs.wait_for(f"vol{i}", r"joined job vol-e2e as rollout: weights v0 \((\d+) bytes\)", 180)
        assert int(joined.group(1)) > 10_000  # the tiny model's weights really came over P2P
        assert "weights: only versions signed with the job's key" in procs.log(f"vol{i}")
    records, report = finish(procs, out)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["samples"] == r["expected_samples"] == r["unique_samples"] == 16 for r in records)
    assert all(r["redispatched"] == 0 and r["worker_failures"] == 0 for r in records)
    assert len(report["admitted"]) == 2 and not report["blocked"]
    served = {pid: s["accepted"] for pid, s in report["samples"].items()}
    assert len(served) == 2 and all(n > 0 for n in served.values()), served
    assert report["verified_samples"] == sum(served.values())  # verifyFraction 1.0: all honest, all pass
    for i in range(2):
        procs.procs[f"vol{i}"].send_signal(signal.SIGTERM)
        procs.procs[f"vol{i}"].wait(30)
        assert re.search(r"served (\d+) samples", procs.log(f"vol{i}"))


def test_killed_volunteer_work_is_redispatched(procs: Procs, tmp_path: Path) -> None:
    job = "vol-kill"
    maddr, out = start_job(procs, tmp_path, job, volunteers=2, steps=2)
    procs.start("honest", volunteer_cmd(maddr, job, token(job)))
    procs.start("slow", volunteer_cmd(maddr, job, token(job), "slow"))
    procs.wait_for("slow", r"request \w+: \d+ items", 240)  # mid-task: it sleeps before each result
    procs.procs["slow"].kill()
    records, report = finish(procs, out)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["samples"] == r["expected_samples"] == r["unique_samples"] == 16 for r in records)
    assert records[0]["redispatched"] > 0 and records[0]["worker_failures"] == 1
    kinds = {(e["kind"]) for e in report["events"]}
    assert "Failed" in kinds and not report["blocked"]


def test_dishonest_volunteer_is_caught_and_blocked(procs: Procs, tmp_path: Path) -> None:
    job = "vol-cheat"
    maddr, out = start_job(procs, tmp_path, job, volunteers=2, steps=2)
    procs.start("honest", volunteer_cmd(maddr, job, token(job)))
    procs.start("cheat", volunteer_cmd(maddr, job, token(job), "cheat", "logprobs", "0.5"))
    cheat_peer = procs.wait_for("cheat", r"volunteer (\S+) joined", 180).group(1)
    records, report = finish(procs, out)
    assert all(r["samples"] == r["expected_samples"] == r["unique_samples"] == 16 for r in records)
    assert list(report["blocked"]) == [cheat_peer]
    assert "verification failed" in report["blocked"][cheat_peer]
    assert report["samples"][cheat_peer]["accepted"] == 0  # nothing it sent reached training
    assert records[0]["redispatched"] > 0


def test_a_volunteer_that_chooses_its_responses_is_caught_and_blocked(procs: Procs, tmp_path: Path) -> None:
    """Its responses are real samples of the policy with honest log-probs, drawn with a seed it picked
    rather than the one the coordinator assigned: the replay of the assigned seed's draws catches it."""
    job = "vol-chosen"
    maddr, out = start_job(procs, tmp_path, job, volunteers=2, steps=2)
    procs.start("honest", volunteer_cmd(maddr, job, token(job)))
    procs.start("chooser", volunteer_cmd(maddr, job, token(job), "chosen"))
    chooser = procs.wait_for("chooser", r"volunteer (\S+) joined", 180).group(1)
    records, report = finish(procs, out)
    assert all(r["samples"] == r["expected_samples"] == r["unique_samples"] == 16 for r in records)
    assert list(report["blocked"]) == [chooser]
    assert "not sampled from the policy with its seed" in report["blocked"][chooser]
    assert report["samples"][chooser]["accepted"] == 0


def test_a_volunteer_that_predicts_the_checks_is_caught(procs: Procs, tmp_path: Path) -> None:
    """It is the only volunteer, so it sees every batch the verifier checks, in order, and it knows the
    job's seed and verify fraction (the spec it is served): picks drawn from that seed were predicted
    (its forged samples trained, never caught); picks drawn from the learner's own randomness are not.
    A batch escapes only if the secret picks fall exactly on its honest samples (1 in C(8, 4) = 70): it is
    blocked at its first batch or, with a chance below 1e-5, one of the next two."""
    job = "vol-predict"
    maddr, out = start_job(procs, tmp_path, job, volunteers=1, steps=4, verify=0.5)
    seed = "0"  # volunteer_job leaves training.seed at its default, and every volunteer is served it
    procs.start("predictor", volunteer_cmd(maddr, job, token(job), "predict", seed, "0.5"))
    predictor = procs.wait_for("predictor", r"volunteer (\S+) joined", 180).group(1)
    records, report = finish(procs, out)
    assert all(r["samples"] == r["expected_samples"] == r["unique_samples"] == 16 for r in records)
    assert "forged" in procs.log("predictor")  # it did cheat, and on the samples it predicted unchecked
    assert list(report["blocked"]) == [predictor]
    assert "verification failed" in report["blocked"][predictor]
    batches = procs.log("predictor").count("predict: batch of")
    assert report["samples"][predictor]["accepted"] < sum(r["samples"] for r in records)
    assert batches <= 4


def test_volunteer_without_valid_token_gets_no_work(procs: Procs, tmp_path: Path) -> None:
    from decentralized_verl.volunteers.tokens import issue_token

    job = "vol-token"
    maddr, out = start_job(procs, tmp_path, job, volunteers=1, steps=2)
    good = token(job)
    tampered = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    expired = issue_token(SECRET.encode(), job, 1, now=time.time() - 100)
    # The learner waits for one volunteer, trains two steps and exits: the honest volunteer starts only
    # once the tampered one has been refused, so the coordinator is surely still there to refuse it.
    procs.start("tampered", volunteer_cmd(maddr, job, tampered))
    procs.start("rogue", volunteer_cmd(maddr, job, good, "rogue"))  # announces without joining
    assert procs.procs["tampered"].wait(180) == 2
    assert "refused to let this peer join: bad signature" in procs.log("tampered")
    procs.start("honest", volunteer_cmd(maddr, job, good))
    procs.start("expired", volunteer_cmd(maddr, job, expired))
    assert procs.procs["expired"].wait(60) == 2
    assert "expired" in procs.log("expired")
    records, report = finish(procs, out)
    assert all(r["samples"] == r["unique_samples"] == 16 for r in records)
    assert len(report["admitted"]) == 1
    refused = [e for e in report["events"] if e["kind"] == "JoinRefused"]
    assert refused and "bad signature" in refused[0]["reason"]
    procs.wait_for("rogue", r"rogue announced", 30)
    procs.procs["rogue"].send_signal(signal.SIGTERM)
    procs.procs["rogue"].wait(30)
    assert "rogue got 0 requests" in procs.log("rogue")


# ------------------------------------------------------------------------- misbehaving volunteers
def _misbehave(mode: str, maddr: str, job: str, tok: str, *args: str) -> int:
    import asyncio
    import dataclasses
    import logging

    from decentralized_verl.entrypoints.volunteer import VolunteerOptions, run_volunteer

    logging.basicConfig(level=logging.INFO)

    from decentralized_verl.serving import handlers

    # This process is the misbehaving volunteer: its rollout role's answers are changed before it starts.
    honest = handlers.completions
    if mode == "rogue":
        return asyncio.run(_rogue(maddr, job))
    if mode == "slow":  # each result 2 s late

        async def slow(worker, batch):
            async for completion in honest(worker, batch):
                await asyncio.sleep(2.0)
                yield completion

        handlers.completions = slow
    elif mode == "cheat":
        what, fraction = args[0], float(args[1])
        counter = {"n": 0}

        def transform(c):
            counter["n"] += 1
            if (counter["n"] * fraction) % 1.0 >= fraction and fraction < 1.0:
                return c
            if what == "logprobs":
                return dataclasses.replace(c, logprobs=tuple(x * 0.5 for x in c.logprobs))
            ids = tuple((t + 1) % 64 for t in c.response_token_ids)
            return dataclasses.replace(c, response_token_ids=ids)

        async def cheating(worker, batch):
            async for completion in honest(worker, batch):
                yield transform(completion)

        handlers.completions = cheating
    elif mode == "predict":
        import random

        from decentralized_verl.volunteers.verify import choose_for_check

        seeded, fraction = random.Random(int(args[0])), float(args[1])

        async def predicting(worker, batch):
            answers = [c async for c in honest(worker, batch)]
            picked = set(choose_for_check(len(answers), fraction, seeded))
            forged = [i for i in range(len(answers)) if i not in picked]
            print(f"predict: batch of {len(answers)}, forged {forged}", flush=True)
            for i, c in enumerate(answers):
                yield (
                    c if i in picked else dataclasses.replace(c, logprobs=tuple(x * 0.5 for x in c.logprobs))
                )

        handlers.completions = predicting
    elif mode == "chosen":  # samples with a seed of its own choosing; its log-probs stay honest

        def choosing(worker, batch):
            own = dataclasses.replace(batch.sampling, seed=(batch.sampling.seed or 0) + 1)
            return honest(worker, dataclasses.replace(batch, sampling=own))

        handlers.completions = choosing
    options = VolunteerOptions((maddr,), job, tok, host_maddrs=("/ip4/127.0.0.1/tcp/0",))
    return asyncio.run(run_volunteer(options))


async def _rogue(maddr: str, job: str) -> int:
    """A peer that skips the join and only writes a DHT record plus a Generate handler."""
    import asyncio

    from decentralized_verl.proto import dverl_pb2 as pb
    from decentralized_verl.transport import p2p as wire
    from decentralized_verl.volunteers.announce import Heartbeat, VolunteerRecord
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht

    dht = start_dht(PeerOptions(initial_peers=(maddr,), host_maddrs=("/ip4/127.0.0.1/tcp/0",)))
    p2p = await dht.replicate_p2p()
    me = dht.peer_id.to_base58()
    calls = {"n": 0}

    async def generate(request, context):
        calls["n"] += 1
        if False:
            yield pb.GenerateResult()

    await p2p.add_protobuf_handler(wire.GENERATE, generate, pb.GenerateRequest, stream_output=True)
    heartbeat = Heartbeat(
        dht, job, lambda exp: VolunteerRecord(me, "rollout", "cuda:H100", 1e6, 0, exp), interval=1.0, ttl=10.0
    )
    await heartbeat.beat()
    heartbeat.start()
    print("rogue announced", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await heartbeat.stop()
    print(f"rogue got {calls['n']} requests", flush=True)
    dht.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(_misbehave(*sys.argv[1:]))
