"""A job's processes on emulated hosts: the DHT, the learner, cluster workers and volunteers, each started
in its host of a `Network`, each logging to `<name>.log` in one folder.

The one place tests and benchmarks start a volunteer job's processes, across hosts (`HostJob`) or on this
machine (the command lines: `dht_argv`, `learner_argv`, `volunteer_argv`), so a change in how a role is
started (its flags, its environment) is made once. Waits fail early, with the log's tail, when the
process waited on exits or the learner fails; `Network.close()` ends every process started here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from netlab.hosts import Network

BIN = Path(sys.executable).parent
TESTING = Path(__file__).resolve().parents[1]
"""Where netlab lives: on the path of every process started with `process_env`, so a test file run as a
script (a lying volunteer, an attacker) imports its helpers as it does under pytest."""
LEARNER = "learner"
"""The process every wait watches besides its own: when the learner fails, nothing else will happen."""


def process_env(**extra: str) -> dict[str, str]:
    """The console scripts (dverl, dverl-dht, dverl-worker) beside this Python, unbuffered output and one
    thread per process, so several processes on a few cores do not oversubscribe them."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTING), os.environ.get("PYTHONPATH", "")) if p),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def dht_argv(job: str, port: int, listen: str = "0.0.0.0") -> list[str]:
    """A job's DHT bootstrap peer, listening on `listen`:`port` (its log names the `--initial-peers`)."""
    return ["dverl-dht", "--port", str(port), "--job", job, "--host-maddrs", f"/ip4/{listen}/tcp/{port}"]


def learner_argv(config: Path, port: int, output: Path) -> list[str]:
    """The learner (the coordinator of a volunteer job) of the job in `config`, writing to `output`."""
    return [
        "dverl",
        "worker",
        "--role",
        "learner",
        "--config",
        str(config),
        "--port",
        str(port),
        "--output",
        str(output),
    ]


def volunteer_argv(maddr: str, job: str, token: str, listen: str = "0.0.0.0") -> list[str]:
    """A rollout volunteer joining `job` through the DHT at `maddr` with its join token."""
    argv = ["dverl-worker", "--initial-peers", maddr, "--job", job, "--token", token]
    return [*argv, "--role", "rollout", "--host-maddrs", f"/ip4/{listen}/tcp/0"]


def stop_process(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM to a process that leads its own group, then SIGKILL to the whole group after `timeout`
    (its children too); its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


class HostJob:
    """Named processes on the hosts of `net`, logging into `folder`."""

    def __init__(self, net: Network, folder: Path) -> None:
        self.net, self.folder = net, folder
        self.procs: dict[str, subprocess.Popen] = {}
        self.hosts: dict[str, str] = {}
        """Process name -> the host it runs on."""

    def start(self, host: str, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with (self.folder / f"{name}.log").open("w") as log:
            self.procs[name] = self.net.spawn(
                host,
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=process_env(**(env or {})),
                cwd=self.folder,
            )
        self.hosts[name] = host

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def wait_for(self, name: str, pattern: str, timeout: float = 300) -> re.Match:
        """The first match of `pattern` in `name`'s log; RuntimeError when it or the learner exits first
        (the learner exiting 0 is only a failure when it is the one waited on) or after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := re.search(pattern, self.log(name)):
                return found
            for who in (name, LEARNER):
                code = self.procs[who].poll() if who in self.procs else None
                if code is not None and (code != 0 or who == name):
                    raise RuntimeError(
                        f"{who} exited {code} before {name} logged {pattern!r}:\n{self.log(who)[-3000:]}"
                    )
            time.sleep(0.2)
        raise RuntimeError(f"{name}: no {pattern!r} in {timeout:.0f}s:\n{self.log(name)[-3000:]}")

    def stop(self, name: str, timeout: float = 60) -> int:
        """SIGTERM, then SIGKILL to its group after `timeout`; its exit code."""
        return stop_process(self.procs[name], timeout)

    # -------------------------------------------------------------------------------- the roles
    def start_dht(self, host: str, job: str, port: int = 31337, name: str = "dht") -> str:
        """The job's DHT bootstrap peer; returns the multiaddr volunteers dial (`--initial-peers`)."""
        self.start(host, name, dht_argv(job, port))
        return self.wait_for(name, r"--initial-peers (\S+)").group(1)

    def start_learner(
        self,
        host: str,
        config: Path,
        output: Path,
        env: dict[str, str],
        port: int = 7000,
        name: str = LEARNER,
    ) -> None:
        """The learner (the coordinator of a volunteer job), serving gRPC on all of its host's addresses."""
        self.start(host, name, learner_argv(config, port, output), {"DVERL_BIND_HOST": "0.0.0.0", **env})

    def start_worker(
        self,
        host: str,
        role: str,
        config: Path,
        job: str,
        index: int,
        port: int,
        env: dict[str, str],
        name: str,
    ) -> str:
        """A cluster worker of `role` (rollout, reward, ...) on its host; returns the address it serves."""
        argv = ["dverl", "worker", "--role", role, "--config", str(config), "--job", job]
        argv += ["--index", str(index), "--port", str(port)]
        self.start(host, name, argv, {"DVERL_BIND_HOST": "0.0.0.0", **env})
        return f"{self.net.hosts[host].address}:{port}"

    def start_volunteer(self, host: str, maddr: str, job: str, token: str, name: str | None = None) -> None:
        """A rollout volunteer joining `job` through the DHT at `maddr` with its join token."""
        self.start(host, name or host, volunteer_argv(maddr, job, token))

    def volunteer_peer(self, name: str, timeout: float = 600) -> str:
        """The peer id a volunteer joined with, once it has its first weights."""
        return self.wait_for(name, r"volunteer (\S+) joined job", timeout).group(1)


def volunteer_worker_id(peer_id: str) -> str:
    """How a volunteer names itself in the samples it produces (`Sample.worker_id`, step records)."""
    return f"volunteer-{peer_id[-8:]}"


def step_records(output: Path) -> list[dict[str, Any]]:
    """The learner's step records (metrics.jsonl in its output folder)."""
    import json

    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
