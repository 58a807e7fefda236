"""A worker's secrets against its neighbours: `dverl run`'s launcher starts a real reward worker, handing
it the role's token, while another process of the same user (root without CAP_SYS_PTRACE on both sides:
what an ordinary user's processes are to each other) tries every route `/proc` offers from the moment
the worker exists: each `/proc/<pid>/fd/<n>` opened and read, its environment, its memory. The handed
secrets were readable through the pipe they used to come on; now none of them is ever read, and once the
worker serves, its descriptors and memory are closed to the neighbour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the neighbour is root less CAP_SYS_PTRACE")


def _support(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testing")])}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.proc_snoop", *args], env=env, text=True, **kwargs
    )


def test_a_neighbour_of_the_same_user_reads_no_handed_secret(tmp_path: Path) -> None:
    launcher = _support("launch", str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        started = json.loads(launcher.stdout.readline())
        # From the worker's first moments (it is still importing) until well after it serves.
        snoop = _support("snoop", str(started["pid"]), "20", stdout=subprocess.PIPE)
        seen = json.loads(snoop.communicate(timeout=120)[0])
    finally:
        launcher.stdin.close()
        launcher.wait(timeout=60)
    log = next((tmp_path / "run" / "logs").glob("*reward*.log")).read_text()
    assert "ready on port" in log, log[-2000:]
    stolen = b"".join(bytes.fromhex(data) for data in seen["stolen"])
    for secret in started["secrets"]:
        assert secret.encode() not in stolen and bytes.fromhex(secret) not in stolen
    # Before its entry ran the worker was an ordinary process (the neighbour could open its
    # descriptors, which held nothing yet); once it took its secrets, nothing of it opens.
    assert "fd_opened" not in seen["at_the_end"] and "mem" not in seen["at_the_end"], seen
