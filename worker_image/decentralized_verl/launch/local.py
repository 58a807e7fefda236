"""Run a plan as local processes on 127.0.0.1: the second executor of a plan (the operator is the first).

Every worker gets a free port, its environment from `plan.worker_env`, and a log file. Children die
with their parent (each sets PR_SET_PDEATHSIG on itself at start, `orphans.die_with_parent`) and are
stopped as process groups, so no worker outlives a run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from decentralized_verl.launch.worker_process import start_worker
from decentralized_verl.planning.plan import Plan, PlannedWorker, worker_env
from decentralized_verl.runtime.cpus import available_cpus, share_cores
from decentralized_verl.runtime.orphans import PARENT_VARIABLE
from decentralized_verl.runtime.ports import free_port
from decentralized_verl.security.credentials import LocalCredentials
from decentralized_verl.settings import WorkerSettings, env_name


@dataclass
class LocalWorker:
    worker: PlannedWorker
    port: int
    log_path: Path
    process: subprocess.Popen | None = None
    restarts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class LocalCluster:
    """The plan's workers as child processes of this one."""

    def __init__(
        self,
        plan: Plan,
        config_path: Path,
        output_dir: Path,
        extra_env: dict[str, str] | None = None,
        extra_args: dict[str, list[str]] | None = None,
        credentials: LocalCredentials | None = None,
        overlapped: bool = False,
        cores: int | None = None,
        worker_env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.plan = plan
        self.worker_extra_env = dict(worker_env or {})
        """Per worker name: what its place on this machine adds (its visible GPUs and device)."""
        self.config_path = config_path
        self.output_dir = output_dir
        self.extra_env = extra_env or {}
        self.extra_args = extra_args or {}
        self.credentials = credentials
        """The run's credentials: every process reads the public files (DVERL_TLS_DIR) and is handed its
        role's token (and a learner the signing key) through a pipe (None: plaintext, as in-process
        tests do)."""
        logs = output_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.workers = {w.name: LocalWorker(w, free_port(), logs / f"{w.name}.log") for w in plan.workers}
        self.dist_ports = {w.role: free_port() for w in plan.workers if w.index == 0 and "dist" in w.ports}
        """Each gang's rendezvous port (the learners', a sharded critic's), on its rank 0."""
        self.cores = share_cores(
            cores or available_cpus(WorkerSettings.from_env().cpus),
            [(w.name, w.role) for w in plan.workers],
            overlapped=overlapped,
        )
        """Cores each process computes on: the phases' processes split this process's cores."""

    def addresses(self) -> dict[str, str]:
        out = {name: lw.address for name, lw in self.workers.items()}
        for role, port in self.dist_ports.items():
            out[f"{self.plan.by_role(role)[0].name}/dist"] = f"127.0.0.1:{port}"
        for worker in self.plan.workers:  # no Prometheus endpoint here: the run folder has the metrics
            if "metrics" in worker.ports:
                out[f"{worker.name}/metrics"] = "0"
        return out

    def env_for(self, lw: LocalWorker) -> dict[str, str]:
        env = dict(os.environ)
        env.update(worker_env(self.plan, lw.worker, self.addresses()))
        env.update(self.worker_extra_env.get(lw.worker.name, {}))
        env.update(self.extra_env)
        if self.credentials is not None:
            env[env_name("tls_dir")] = str(self.credentials.folder)
        env[env_name("cpus")] = str(self.cores[lw.worker.name])
        env["OMP_NUM_THREADS"] = str(self.cores[lw.worker.name])
        env["PYTHONUNBUFFERED"] = "1"
        # No preexec_fn: this process runs gRPC threads, and Python code between fork and exec in a
        # threaded parent can deadlock on a lock a thread held at the fork (seen: restarts stuck ~60 s).
        env[PARENT_VARIABLE] = str(os.getpid())
        return env

    def command_for(self, lw: LocalWorker) -> list[str]:
        command = lw.worker.command(str(self.config_path), lw.port)
        assert command[0] == "dverl"
        args = [sys.executable, "-m", "decentralized_verl.cli", *command[1:]]
        if lw.worker.role != "dht":  # the DHT bootstrap writes nothing into the run folder
            args += ["--output", str(self.output_dir)]
        return [*args, *self.extra_args.get(lw.worker.role, [])]

    def start(self, roles: tuple[str, ...] | None = None) -> None:
        for lw in self.workers.values():
            if roles is not None and lw.worker.role not in roles:
                continue
            self._spawn(lw)

    def restart(self, name: str) -> None:
        """Start a worker again on its old port (the coordinator re-dispatches to it once it serves)."""
        lw = self.workers[name]
        if lw.alive():
            return
        lw.restarts += 1
        self._spawn(lw)

    def restart_gang(self, role: str, *, extra_args: list[str] | None = None) -> None:
        """Stop every worker of `role` and start them all again (torch.distributed restarts a gang, the
        learners or a sharded critic, together, on a fresh rendezvous port); `extra_args` apply to this
        role from now on."""
        gang = self.by_role(role)
        for lw in gang:
            self.kill(lw.worker.name, signal.SIGKILL)
        for lw in gang:
            if lw.process is not None:
                lw.process.wait()
        if extra_args is not None:
            self.extra_args[role] = list(extra_args)
        if role in self.dist_ports:
            self.dist_ports[role] = free_port()
        for lw in gang:
            lw.restarts += 1
            self._spawn(lw)

    def _spawn(self, lw: LocalWorker) -> None:
        secrets = self.credentials.handed(lw.worker.role) if self.credentials is not None else None
        lw.process = start_worker(self.command_for(lw), self.env_for(lw), lw.log_path, secrets)

    def by_role(self, role: str) -> list[LocalWorker]:
        return [lw for lw in self.workers.values() if lw.worker.role == role]

    def failed(self) -> list[LocalWorker]:
        """Workers that are no longer running: a learner only when it failed (it exits 0 when the job
        is done), any other worker whatever its exit code (a serving worker has no reason to end while
        the job runs; SIGTERM makes one exit 0)."""
        return [
            lw
            for lw in self.workers.values()
            if lw.process is not None
            and lw.process.poll() is not None
            and (lw.process.returncode != 0 or lw.worker.role != "learner")
        ]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        lw = self.workers[name]
        if lw.process is not None and lw.process.poll() is None:
            os.killpg(lw.process.pid, sig)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after `grace` seconds."""
        running = [lw for lw in self.workers.values() if lw.alive()]
        for lw in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(lw.process.pid, signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + grace
        for lw in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                lw.process.wait(timeout=max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
        for lw in running:
            if lw.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(lw.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
                lw.process.wait()  # type: ignore[union-attr]

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
