"""A worker's secrets against its neighbours: `dverl run`'s launcher starts a real reward worker, handing
it the role's token, while another process of the same user (root without CAP_SYS_PTRACE on both sides:
what an ordinary user's processes are to each other) tries every route `/proc` offers from the moment
the worker exists: each `/proc/<pid>/fd/<n>` opened and read, its environment, its memory. The handed
secrets were readable through the pipe they used to come on; now none of them is ever read, and once the
worker serves, its descriptors and memory are closed to the neighbour.

At the same time a process of another user (uid 65534, `setpriv`, with the shell tools of /usr/bin: the
interpreter lives under /root, out of that user's reach) lists `/proc/<pid>/fd`, reads every
`/proc/<pid>/fd/<n>` and `/proc/<pid>/environ` from the worker's first moments: nothing opens to it.
The same tools as the same uid read a process of that uid's own environment and descriptors, so the
attack is one that works where the kernel allows it.

The job's user environment (`module:Class`) is an attacker too: replaying an episode in the live worker,
it scans its own memory, environment and descriptors and its parent's /proc, and finds no token, key or
seed: it runs in a child of the worker (`environments/apart.py`). Played in the worker itself, as before,
it found the worker's token in memory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from decentralized_verl.environments.replay import transcript
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from tests.support.paths import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the neighbour is root less CAP_SYS_PTRACE")


def _support(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testing")])}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.proc_snoop", *args], env=env, text=True, **kwargs
    )


SPY = "tests.support.spy_environment:Spy"
NOBODY = ("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups")
ATTACK = """
echo "uid $(id -u)"
P=$1; END=$(( $(date +%s) + $2 ))
while [ "$(date +%s)" -lt "$END" ] && [ -d "/proc/$P" ]; do
  ls "/proc/$P/fd" >/dev/null 2>&1 && echo "listed fd"
  cat "/proc/$P/environ" 2>/dev/null && echo && echo "read environ"
  for n in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
    timeout 0.2 cat "/proc/$P/fd/$n" 2>/dev/null; rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "opened fd $n"; fi
  done
  sleep 0.05
done
"""
"""Every route `/proc` offers, with /usr/bin's tools, for `$2` seconds; what it read, and a line for each
route that opened."""


def _attack_as_nobody(pid: int, seconds: int) -> subprocess.Popen:
    return subprocess.Popen(
        [*NOBODY, "/bin/sh", "-c", ATTACK, "attack", str(pid), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux's setpriv is not installed")
def test_the_attack_reads_a_process_of_its_own_uid() -> None:
    """The control: the same tools, as uid 65534, against a process of uid 65534 holding a secret."""
    victim = subprocess.Popen(
        [*NOBODY, "/usr/bin/sleep", "30"], env={"PATH": "/usr/bin", "SECRET": "own-uid-secret"}
    )
    try:
        out = _attack_as_nobody(victim.pid, 1).communicate(timeout=60)[0].decode(errors="replace")
    finally:
        victim.kill()
        victim.wait()
    assert "uid 65534" in out and "own-uid-secret" in out and "read environ" in out, out
    assert "listed fd" in out and "opened fd 0" in out, out


def _wait_ready(logs: Path, launcher: subprocess.Popen, deadline_s: float = 600.0) -> None:
    """Until the worker's log says it serves (its launcher must stay up meanwhile)."""
    end = time.monotonic() + deadline_s
    while True:
        log = "".join(p.read_text() for p in logs.glob("*reward*.log"))
        if "ready on port" in log:
            return
        assert launcher.poll() is None and time.monotonic() < end, log[-2000:]
        time.sleep(0.5)


@dataclass
class Watched:
    """A reward worker a launcher started, what the neighbours saw of it, and where its job's user
    environment writes what it reached."""

    started: dict
    seen: dict
    at_the_end: dict
    by_nobody: bytes | None
    report: Path


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    folder = tmp_path_factory.mktemp("neighbours")
    report = folder / "spy.json"
    overrides = {"data.environment": {"name": SPY, "options": {"report": str(report)}}}
    launcher = _support(
        "launch", str(folder), json.dumps(overrides), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    other = None
    try:
        started = json.loads(launcher.stdout.readline())
        # From the worker's first moments (it is still importing) until well after it serves.
        snoop = _support("snoop", str(started["pid"]), "20", stdout=subprocess.PIPE)
        if shutil.which("setpriv") is not None:
            other = _attack_as_nobody(started["pid"], 20)
        seen = json.loads(snoop.communicate(timeout=120)[0])
        by_nobody = other.communicate(timeout=120)[0] if other is not None else None
        # A busy machine may take longer than that to start it: once it serves, the neighbour again.
        _wait_ready(folder / "run" / "logs", launcher)
        later = _support("snoop", str(started["pid"]), "2", stdout=subprocess.PIPE)
        at_the_end = json.loads(later.communicate(timeout=120)[0])
        yield Watched(started, seen, at_the_end, by_nobody, report)  # the worker serves on meanwhile
    finally:
        launcher.stdin.close()
        launcher.wait(timeout=60)


def test_a_neighbour_of_the_same_user_reads_no_handed_secret(watched: Watched) -> None:
    started, seen, at_the_end = watched.started, watched.seen, watched.at_the_end
    stolen = b"".join(bytes.fromhex(data) for data in [*seen["stolen"], *at_the_end["stolen"]])
    for secret in started["secrets"]:
        assert secret.encode() not in stolen and bytes.fromhex(secret) not in stolen
    # Before its entry ran the worker was an ordinary process (the neighbour could open its
    # descriptors, which held nothing yet); once it took its secrets, nothing of it opens.
    assert "fd_opened" not in at_the_end["ever"] and "mem" not in at_the_end["ever"], at_the_end
    if watched.by_nobody is not None:
        # Another uid: not one route opens, not even before the worker's entry ran.
        said = watched.by_nobody.decode(errors="replace")
        assert said.startswith("uid 65534"), said[:200]
        assert not any(line.startswith(("listed", "read", "opened")) for line in said.splitlines()), said
        for secret in started["secrets"]:
            assert secret.encode() not in watched.by_nobody and bytes.fromhex(secret) not in watched.by_nobody


def test_a_user_environment_in_the_live_worker_reaches_no_secret(watched: Watched) -> None:
    """The job's user environment (`tests/support/spy_environment.py`) replays an episode the learner's
    token holder asks the worker to score, and on reset writes down what it could reach."""
    started = watched.started
    tls = grpc.ssl_channel_credentials(started["ca"].encode())
    token = ("authorization", f"Bearer {started['tokens']['learner']}")
    with grpc.secure_channel(started["address"], tls) as channel:
        item = pb.ScoreItem(
            prompt_text="hi", completion_text=transcript("p1", ["hello"]), reward_type="environment"
        )
        reply = pb_grpc.RewardStub(channel).Score(
            pb.ScoreRequest(items=[item]), timeout=300, metadata=[token]
        )
    assert [r.score for r in reply.results] == [1.0], reply
    seen = json.loads(watched.report.read_text())
    reachable = " ".join([*seen["memory_hex"], *seen["raw32"], *seen["texts"]])
    assert seen["memory_hex"], "the memory scan found nothing at all: it did not run"
    for secret in started["secrets"]:
        for form in (secret, bytes.fromhex(secret).decode(errors="replace")):
            assert form not in reachable, f"the environment reached a secret: {form[:8]}..."
    worker = started["pid"]
    assert seen["pid"] != worker and seen["ppid"] == worker, (seen["pid"], seen["ppid"], worker)
    assert seen["dverl_env"] == []
    assert not any(link.startswith("socket:") for link in seen["fds"].values()), seen["fds"]
    # The parent's memory and descriptors never open; its command line, maps and environment may (this
    # kernel shows them to a process of the same uid), and hold no secret (checked above).
    assert not [r for r in seen["parent_opened"] if r == "mem" or r.startswith("fd/")], seen["parent_opened"]
