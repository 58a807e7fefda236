"""Span volunteers joining a live `dverl run` job: a GRPO job whose rollout runs as 2 spans, volunteers
enabled for the `span` role. An honest span volunteer and one returning wrong activations join with their
join tokens (`dverl worker --role span`); the learner waits until the front attached both. The job
completes every step with every sample exactly once, the honest volunteer served hops, the cheater was
caught by the front's spot-check, dropped and blocked by the coordinator.

Bad cases against the same live job: a volunteer naming a span not in the layout is told so by field; a
stranger (no token) gets no span from the coordinator, cannot push a roster to the front, and is refused
by a volunteer it is not a front of.

Run as a script (`python tests/e2e/test_spans_volunteers_job.py cheat ARGS...`) this file is a span volunteer
that adds noise to every activation it returns.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
from pathlib import Path

import pytest
import torch

from decentralized_verl.reporting.metrics import read_metrics
from tests.support.job_manifests import e2e_manifest
from tests.support.processes import ProcessGroup, script_argv

SECRET = "span-volunteers-secret-0123456789"
JOB = "spanvol"
HANG_S = 600.0
"""How long a wait goes on while the processes it depends on live: only a hang takes that long. The run
starts six processes on a machine that may be busy; each wait fails at once when one of them dies."""

pytestmark = [
    pytest.mark.usefixtures("collected_before_fork"),
    pytest.mark.timeout(1500),  # several waits, each bounded by HANG_S
]


def _token() -> str:
    from decentralized_verl.volunteers.tokens import issue_token

    return issue_token(SECRET.encode(), JOB, 3600)


def _span_volunteer(maddr: str, *extra: str, cheat: bool = False) -> list[str]:
    argv = ["--role", "span", "--initial-peers", maddr, "--job", JOB, "--token", _token(),
            "--host-maddrs", "/ip4/127.0.0.1/tcp/0", *extra]  # fmt: skip
    if cheat:
        return script_argv(__file__, "cheat", *argv)
    return [sys.executable, "-m", "decentralized_verl.cli", "worker", *argv]


class Stranger:
    """A peer of the job's DHT with an identity of its own and no token, its event loop on a thread."""

    def __init__(self, maddr: str) -> None:
        from decentralized_verl.volunteers.dht import PeerOptions, start_dht

        reach = PeerOptions(initial_peers=(maddr,), host_maddrs=("/ip4/127.0.0.1/tcp/0",), signed_job=JOB)
        self.dht = start_dht(reach)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.p2p = self.run(self.dht.replicate_p2p())

    def run(self, coroutine, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def dial(self, role: str) -> str:
        """Connect to the (first) peer announcing `role` in the job's DHT key, once its record is there (a
        store may still be on its way to every replica); its peer id."""
        import time

        from decentralized_verl.transport.p2p import connect
        from decentralized_verl.volunteers.announce import read_records

        deadline = time.monotonic() + HANG_S
        while True:
            records, _ = self.run(read_records(self.dht, JOB))
            record = next((r for r in records if r.role == role), None)
            if record is not None:
                break
            assert time.monotonic() < deadline, f"no {role} record in the job's DHT key: {records}"
            time.sleep(1.0)
        self.run(connect(self.p2p, record.peer_id, record.maddrs))
        return record.peer_id

    def close(self) -> None:
        self.run(self.p2p.shutdown(), 30)
        self.dht.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _refused_by_everyone(maddr: str) -> None:
    from google.protobuf.wrappers_pb2 import BytesValue

    from decentralized_verl.errors import WireError
    from decentralized_verl.security.peer_identity import coordinator_peer_id
    from decentralized_verl.spans.p2p import P2PSpanClient
    from decentralized_verl.spans.roster import PUSH, sign_push
    from decentralized_verl.spans.volunteer import ask_assignment
    from decentralized_verl.transport.p2p import peer

    stranger = Stranger(maddr)
    try:
        answer = stranger.run(ask_assignment(stranger.p2p, coordinator_peer_id(SECRET.encode(), JOB), "0:1"))
        assert answer["ok"] is False and "has not joined this job as a span volunteer" in answer["error"]
        front = stranger.dial("front")
        forged = sign_push({"job": JOB, "front": front, "seq": 9e18, "volunteers": []}, b"\x01" * 32)
        call = stranger.p2p.call_protobuf_handler(peer(front), PUSH, BytesValue(value=forged), BytesValue)
        assert json.loads(stranger.run(call).value) == {
            "error": "span roster: not signed by the job's learner"
        }
        volunteer = stranger.dial("span")
        client = P2PSpanClient(stranger.p2p, volunteer, stranger.loop, timeout_s=30.0)
        with pytest.raises(WireError, match=r"PERMISSION_DENIED: peer \S+ is not a front this span serves"):
            client.info()
    finally:
        stranger.close()


def test_span_volunteers_join_a_live_job_and_a_cheater_is_dropped(tmp_path: Path) -> None:
    manifest = e2e_manifest(
        tmp_path,
        JOB,
        **{
            "roles.rollout": {"replicas": 1, "batchSize": 16, "spans": {"count": 2}},
            "model.tiny.numLayers": 2,
            "training.evalEvery": 0,
            "training.steps": 3,
            "volunteers": {
                "enabled": True,
                "verifyFraction": 1.0,
                "roles": ["span"],
                "tokenSecretRef": {"name": f"{JOB}-join", "key": "secret"},
            },
        },
    )
    out = tmp_path / "run"
    procs = ProcessGroup(tmp_path)
    try:
        procs.start(
            "run",
            [sys.executable, "-m", "decentralized_verl.cli", "run", str(manifest), "--output", str(out)],
            # Training starts once both span volunteers (the honest one, then the cheater) are attached,
            # however long this machine takes to start them: the test, not a clock, waits for them.
            {
                "DVERL_JOIN_SECRET": SECRET,
                "DVERL_WAIT_VOLUNTEERS": f"2:{4 * HANG_S:.0f}",
                "DVERL_VOLUNTEER_POLL_S": "0.5",
            },
        )
        logs = out / "logs"
        maddr = _line(procs, logs / f"{JOB}-dht-0.log", r"--initial-peers (\S+)").group(1)
        _line(procs, logs / f"{JOB}-learner-0.log", r"volunteer discovery for job")  # the coordinator is up
        procs.start("stray", _span_volunteer(maddr, "--layers", "0:2"))
        procs.start("honest", _span_volunteer(maddr))  # the coordinator picks: the span no one serves
        try:
            procs.wait_for("honest", r"layers 0:1 ready", HANG_S, also_alive="run")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_tails(logs)}") from None
        # The learner waits for two attached span volunteers: the job is live while strangers are tried.
        _refused_by_everyone(maddr)
        assert procs.procs["stray"].wait(HANG_S) == 2, procs.log("stray")
        assert "--layers: span 0:2 is not in this job's layout (0:1, 1:2)" in procs.log("stray")
        procs.start("cheat", _span_volunteer(maddr, "--layers", "1:2", cheat=True))
        cheat_id = procs.wait_for("cheat", r"span volunteer (\S+) joined", HANG_S, also_alive="run").group(1)

        assert procs.procs["run"].wait(HANG_S) == 0, procs.log("run")[-3000:]
        honest_id = re.search(r"span volunteer (\S+) joined", procs.log("honest")).group(1)
        procs.stop("honest")
        hops = int(re.search(r"span volunteer \S+ served (\d+) hops", procs.log("honest")).group(1))
        assert hops > 0
    finally:
        procs.close()
    for r in read_metrics(out / "metrics.jsonl"):  # every prompt x sample exactly once, every step
        assert r["samples"] == r["expected_samples"] == r["unique_samples"] == 128
    assert len(read_metrics(out / "metrics.jsonl")) == 3
    front = (out / "logs" / f"{JOB}-rollout-0.log").read_text()
    assert f"span volunteer {honest_id} attached to span 0:1" in front
    assert f"span volunteer {cheat_id} dropped: span 1:2: activations off by" in front
    report = json.loads((out / "volunteers.json").read_text())
    assert cheat_id in report["blocked"] and honest_id not in report["blocked"]
    assert report["spans"][honest_id]["span"] == "0:1"


def _line(procs: ProcessGroup, log: Path, pattern: str) -> re.Match:
    """The first match of `pattern` in one of the run's worker logs (the run must stay up meanwhile). The
    learner's line comes once every worker of the run is ready, which on a busy machine takes minutes."""
    import time

    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text()) if log.exists() else None
        if found:
            return found
        assert procs.procs["run"].poll() is None, procs.log("run")[-3000:] + _tails(log.parent)
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in {log} after {HANG_S:.0f}s\n{_tails(log.parent)}")


def _tails(logs: Path) -> str:
    """The end of every worker log of the run, for a failure message."""
    return "\n".join(f"=== {p.name}\n{p.read_text()[-2500:]}" for p in sorted(logs.glob("*.log")))


def _cheat() -> int:
    """A span volunteer (`dverl worker --role span ...`) that adds noise to every activation it returns:
    this process's span server is made to lie before the volunteer starts."""
    from decentralized_verl.entrypoints.volunteer import VolunteerOptions, run_volunteer
    from decentralized_verl.spans.codec import decode_request, encode_hidden
    from decentralized_verl.spans.server import SpanServer

    argv = sys.argv[2:]

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    def noisy(server: SpanServer, data: bytes) -> bytes:
        out = server.run(decode_request(data, server.hidden_size, server.dtype))
        return encode_hidden(out + 0.05 * torch.randn_like(out))

    SpanServer.forward = noisy
    options = VolunteerOptions(
        (value("--initial-peers"),),
        job=value("--job"),
        token=value("--token"),
        role="span",
        layers=value("--layers"),
        host_maddrs=(value("--host-maddrs"),),
    )
    import logging

    logging.basicConfig(level=logging.INFO)
    return asyncio.run(run_volunteer(options))


if __name__ == "__main__":
    if sys.argv[1:2] == ["cheat"]:
        raise SystemExit(_cheat())
