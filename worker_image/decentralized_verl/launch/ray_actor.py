"""The Ray actor that runs one planned worker: the worker process itself is the same `dverl worker` a pod
or `dverl run` starts, a child of the actor, so it dies with it (PR_SET_PDEATHSIG) and a `ray.kill` of
the actor is a kill of the worker.

The actor carries what a pod gets from its volumes: the rendered job and the role's credentials arrive as
file contents and are written on the actor's own node, so the cluster needs no shared filesystem for them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ray

from decentralized_verl.launch.worker_process import start_worker
from decentralized_verl.runtime.orphans import PARENT_VARIABLE
from decentralized_verl.runtime.ports import free_port

RESULT_FILES = frozenset({"summary.json", "metrics.jsonl", "eval.jsonl"})
"""The run files the driver may read back through an actor; nothing else on the node is readable so."""
RAY_CREDENTIALS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""Ray's token: the actor's process needs it, the `dverl worker` it starts does not."""


class WorkerHost:
    """One worker process on whichever node Ray put this actor (used as a Ray actor class)."""

    def __init__(self, name: str, output: str) -> None:
        self.name = name
        self.output = Path(output)
        self.log_path = self.output / "logs" / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def where(self, want_dist_port: bool) -> dict[str, object]:
        """The node this actor runs on and free ports there for the worker's gRPC (and rendezvous)."""
        host = ray.util.get_node_ip_address()
        return {
            "host": host,
            "node_id": ray.get_runtime_context().get_node_id(),
            "port": free_port(host),
            "dist_port": free_port(host) if want_dist_port else None,
        }

    def put_files(self, files: dict[str, bytes]) -> None:
        """Write the job's files (paths absolute, as the driver has them) where this node lacks them."""
        for path, data in files.items():
            target = Path(path)
            with contextlib.suppress(OSError):
                if target.read_bytes() == data:
                    continue
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(target.name + f".{os.getpid()}.tmp")
            temporary.write_bytes(data)
            temporary.chmod(0o600)
            temporary.replace(target)

    def start(self, command: list[str], env: dict[str, str], secrets: bytes | None = None) -> int:
        """Start the worker (any earlier one of this actor must have ended); returns its pid. `secrets`
        (the role's token, the learner's signing key) reach the worker through a pipe it reads once at
        start, as under `dverl run`: never a file on the node, never the environment."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"{self.name} is still running (pid {self.process.pid})")
        environment = {k: v for k, v in os.environ.items() if k not in RAY_CREDENTIALS}
        environment.update(env)
        environment[PARENT_VARIABLE] = str(os.getpid())
        python = environment.pop("DVERL_WORKER_PYTHON", "") or sys.executable
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = start_worker([python, *command], environment, self.log_path, secrets)
        return self.process.pid

    def poll(self) -> int | None:
        """The worker's exit code, None while it runs (or before it started)."""
        return self.process.poll() if self.process is not None else None

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def signal(self, sig: int) -> None:
        """Send `sig` to the worker's process group (what a pod's kubelet or a chaos test does)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def stop(self, grace: float) -> int | None:
        """SIGTERM the worker, SIGKILL it after `grace` seconds; returns its exit code."""
        if self.process is None:
            return None
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self.signal(signal.SIGKILL)
        return self.process.wait()

    def log_tail(self, lines: int) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def read(self, name: str) -> bytes | None:
        """One of the run's result files the worker wrote on this node (`RESULT_FILES`, in the run folder),
        None if absent. Any other name is refused: a caller must not read the node's files (the job's
        keys among them) through the job's actors."""
        if name not in RESULT_FILES:
            raise PermissionError(
                f"{self.name}: only the run's result files are readable ({sorted(RESULT_FILES)})"
            )
        with contextlib.suppress(OSError):
            return (self.output / name).read_bytes()
        return None


class JobRecord:
    """The run as `dverl status --ray` sees it: the supervisor writes it every poll (used as a Ray actor)."""

    def __init__(self) -> None:
        self.state: dict[str, object] = {}

    def update(self, state: dict[str, object]) -> None:
        self.state.update(state)

    def read(self) -> dict[str, object]:
        return dict(self.state)
