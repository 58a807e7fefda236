"""Run a plan on a Ray cluster: the third executor of a plan (operator pods and local processes are the
others), for teams whose machines already live on Ray.

Each planned worker is one named Ray actor (`<job>-<role>-<index>`, in the `dverl` namespace) that asks Ray
for the role's resources and runs the same `dverl worker` command, environment and credentials a pod gets;
the learner ranks share one placement group. Weights and rollouts still travel over the runtime's own gRPC
plane; Ray only places and supervises the processes.

Failover is the runtime's own, as under `dverl run`, and Ray's `max_restarts` stays 0 so the two never
race: the supervisor loop in `launch.run` restarts a worker whose process exited inside its actor, and an
actor that died (`ray.kill`, its node lost) is made again, on its old node and port when that node still
lives. A serving worker that comes back at another address restarts the learner gang, which resumes from
its newest checkpoint with the new addresses.

`RayCluster` answers what `launch.run` asks of `LocalCluster` (by_role, failed, restart, restart_gang,
kill, stop, addresses), so one supervisor loop drives both executors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decentralized_verl.launch.ray_placement import (
    NAMESPACE,
    PlacementError,
    RayUnavailable,
    actor_options,
    learner_gang,
    record_name,
    threads_for,
    unplaceable,
)
from decentralized_verl.planning.plan import Plan, PlannedWorker, worker_env
from decentralized_verl.security.credentials import LocalCredentials
from decentralized_verl.settings import env_name

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )
except ImportError as missing:  # the `ray` extra is optional: only `--ray` comes here
    raise RayUnavailable("--ray needs Ray installed: pip install 'decentralized-verl[ray]'") from missing

from decentralized_verl.launch.ray_actor import JobRecord, WorkerHost  # after the check: it imports ray too

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0
"""How long one call to a worker's actor may take before the actor counts as lost."""
ACTOR_LOST = -9
"""The exit code a worker whose actor died is reported with (its process was killed with it, as by
SIGKILL)."""


RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
"""Ray's own token authentication (Ray >= 2.52): every RPC to the GCS, raylets and workers carries it."""


def auth_problem(env: Mapping[str, str], home: Path) -> str | None:
    """Why this driver would join a Ray cluster without Ray's token authentication, or None.

    A Ray cluster runs whatever any client that reaches its GCS asks: without a token, anyone on the
    network lists the job's actors, calls them, reads what they hold and runs tasks as their user. So the
    job joins only with RAY_AUTH_MODE=token and a token, and a cluster started with the same setting
    refuses every client that lacks it."""
    if env.get(RAY_AUTH_MODE, "").lower() != "token":
        return (
            f"{RAY_AUTH_MODE}=token is not set: a Ray cluster without Ray's token authentication runs "
            "whatever anyone who reaches it asks (the job's actors, its keys). Start the cluster and run "
            f"dverl with {RAY_AUTH_MODE}=token and the cluster's token in {RAY_AUTH_TOKEN} (or "
            f"{RAY_AUTH_TOKEN_PATH}); docs/ray.md says how"
        )
    path = env.get(RAY_AUTH_TOKEN_PATH)
    token_file = Path(path) if path else home / ".ray" / "auth_token"
    if env.get(RAY_AUTH_TOKEN) or token_file.is_file():
        return None
    return f"{RAY_AUTH_MODE}=token but no token: set {RAY_AUTH_TOKEN} or {RAY_AUTH_TOKEN_PATH}"


def connect(address: str) -> Any:
    """Join the Ray cluster at `address` (`auto`: the one this machine belongs to) with Ray's token
    authentication (`auth_problem`); returns the module."""
    if not ray.is_initialized():
        problem = auth_problem(os.environ, Path.home())
        if problem is not None:
            raise RayUnavailable(f"--ray {address}: {problem}")
        _reachable(address)
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayUnavailable(f"--ray {address}: cannot join a Ray cluster there: {exc}") from exc
    return ray


def node_addresses(address: str) -> list[str]:
    """The IP address of every live node of the cluster (where workers may listen)."""
    ray = connect(address)
    return sorted({node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")})


def _reachable(address: str, timeout: float = 10.0) -> None:
    """Fail at once, naming the address, where nothing listens (Ray itself would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RayUnavailable(
            f"--ray {address}: no Ray cluster answers there ({exc.strerror or exc})"
        ) from None


class RemoteProcess:
    """A worker process inside its actor, with the parts of `subprocess.Popen` the supervisor uses."""

    def __init__(self, ray: Any, actor: Any, pid: int) -> None:
        self._ray, self._actor, self.pid = ray, actor, pid
        self.returncode: int | None = None
        self.actor_lost = False
        """Whether the actor itself is gone (not only its worker process): it must be made again."""

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            self.returncode = self._ray.get(self._actor.poll.remote(), timeout=CALL_TIMEOUT_S)
        except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
            self.returncode, self.actor_lost = ACTOR_LOST, True
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"pid {self.pid} still running after {timeout} s")
            time.sleep(0.2)
        return int(self.returncode)  # type: ignore[arg-type]


@dataclass
class RayWorker:
    worker: PlannedWorker
    log_path: Path
    host: str = ""
    port: int = 0
    node_id: str = ""
    dist_port: int | None = None
    actor: Any = None
    process: RemoteProcess | None = None
    restarts: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(Exception):
            return ray.get(self.actor.log_tail.remote(lines), timeout=CALL_TIMEOUT_S)
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class RayCluster:
    """The plan's workers as named actors of the Ray cluster this process joined."""

    def __init__(
        self,
        plan: Plan,
        config_path: Path,
        output_dir: Path,
        address: str,
        extra_env: dict[str, str] | None = None,
        extra_args: dict[str, list[str]] | None = None,
        credentials: LocalCredentials | None = None,
    ) -> None:
        for worker in plan.workers:  # what Ray cannot express fails here, before anything is placed
            actor_options(worker)
        self.ray = connect(address)
        nodes = [node["Resources"] for node in self.ray.nodes() if node.get("Alive")]
        problems = unplaceable(plan, nodes)
        if problems:
            raise PlacementError("; ".join(problems))
        self.plan = plan
        self.config_path = config_path
        self.output_dir = output_dir.resolve()
        self.extra_env = extra_env or {}
        self.extra_args = extra_args or {}
        self.credentials = credentials
        logs = self.output_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.workers = {w.name: RayWorker(w, logs / f"{w.name}.log") for w in plan.workers}
        self._host_class = self.ray.remote(max_restarts=0)(WorkerHost)
        self.group = None
        gang = learner_gang(plan)
        if gang is not None:
            labels = {"bundle_label_selector": list(gang.label_selectors)} if gang.label_selectors else {}
            self.group = placement_group(
                list(gang.bundles), strategy=gang.strategy, name=f"{plan.job}-learners", **labels
            )
        self.record = (
            self.ray.remote(num_cpus=0, max_restarts=0)(JobRecord)
            .options(name=record_name(plan.job), namespace=NAMESPACE)
            .remote()
        )
        self.record.update.remote(
            {"job": plan.job, "output": str(self.output_dir), "workers": [w.name for w in plan.workers]}
        )

    # ------------------------------------------------------------------------------ placement
    def _make_actor(self, rw: RayWorker, node_id: str | None = None) -> None:
        """The worker's actor, placed by its role's resources (learners inside their placement group;
        a replacement on `node_id`, its predecessor's node, when that node still has room)."""
        options = actor_options(rw.worker)
        if rw.worker.role == "learner" and self.group is not None:
            options.pop("label_selector", None)
            options.pop("accelerator_type", None)
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=rw.worker.index
            )
        elif node_id:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
        rw.options = options
        rw.actor = self._host_class.options(name=rw.worker.name, namespace=NAMESPACE, **options).remote(
            rw.worker.name, str(self.output_dir)
        )

    def _locate(self, rw: RayWorker, keep_port: bool) -> bool:
        """Learn the actor's node and free ports there (the gRPC port kept when `keep_port` and the node
        is the same; the rendezvous port always fresh, as a restarted gang needs); True when the worker's
        gRPC address changed."""
        where = self.ray.get(rw.actor.where.remote("dist" in rw.worker.ports), timeout=None)
        before = rw.address
        if not (keep_port and where["host"] == rw.host):
            rw.port = where["port"]
        rw.dist_port = where["dist_port"]
        rw.host, rw.node_id = where["host"], where["node_id"]
        return rw.address != before

    def _files(self, rw: RayWorker) -> dict[str, bytes]:
        """What a pod would find mounted: the rendered job and the run's public credential files (the
        secrets travel apart, see `_spawn`)."""
        files = {str(self.config_path.resolve()): self.config_path.read_bytes()}
        if self.credentials is not None:
            folder = self.credentials.folder
            for path in folder.iterdir():
                if path.is_file():
                    files[str(path.resolve())] = path.read_bytes()
        return files

    def place(self) -> None:
        """Create every worker's actor and learn where each landed (before any worker starts, since each
        worker's environment holds every other's address)."""
        if self.group is not None:
            try:
                self.ray.get(self.group.ready(), timeout=CALL_TIMEOUT_S * 5)
            except self.ray.exceptions.GetTimeoutError as exc:
                raise RayUnavailable(
                    f"the learners' placement group ({self.group.bundle_specs}) found no room on the cluster"
                ) from exc
        for rw in self.workers.values():
            self._make_actor(rw)
        for rw in self.workers.values():
            self._locate(rw, keep_port=False)

    # ------------------------------------------------------------------------------ the interface
    def addresses(self) -> dict[str, str]:
        out = {name: rw.address for name, rw in self.workers.items()}
        for rw in self.workers.values():
            if rw.dist_port is not None and rw.worker.index == 0:
                out[f"{rw.worker.name}/dist"] = f"{rw.host}:{rw.dist_port}"
        return out

    def env_for(self, rw: RayWorker) -> dict[str, str]:
        env = worker_env(self.plan, rw.worker, self.addresses())
        env[env_name("bind_host")] = rw.host  # the node's address, which the others dial
        env.update(self.extra_env)
        if self.credentials is not None:
            env[env_name("tls_dir")] = str(self.credentials.folder.resolve())
        threads = threads_for(rw.options.get("num_cpus", 1.0))
        env[env_name("cpus")] = str(threads)
        env["OMP_NUM_THREADS"] = str(threads)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def command_for(self, rw: RayWorker) -> list[str]:
        command = rw.worker.command(str(self.config_path.resolve()), rw.port)
        assert command[0] == "dverl"
        args = ["-m", "decentralized_verl.cli", *command[1:]]
        if rw.worker.role != "dht":  # the DHT bootstrap writes nothing into the run folder
            args += ["--output", str(self.output_dir)]
        return [*args, *self.extra_args.get(rw.worker.role, [])]

    def start(self, roles: tuple[str, ...] | None = None) -> None:
        if not any(rw.actor is not None for rw in self.workers.values()):
            self.place()
        for rw in self.workers.values():
            if roles is None or rw.worker.role in roles:
                self._spawn(rw)

    def _spawn(self, rw: RayWorker) -> None:
        self.ray.get(rw.actor.put_files.remote(self._files(rw)), timeout=CALL_TIMEOUT_S)
        # The role's secrets go to the actor in the call itself (Ray's RPC, inline for a few hundred
        # bytes, not the object store), and from the actor to the worker through a pipe.
        secrets = self.credentials.handed(rw.worker.role) if self.credentials is not None else None
        pid = self.ray.get(
            rw.actor.start.remote(self.command_for(rw), self.env_for(rw), secrets), timeout=CALL_TIMEOUT_S
        )
        rw.process = RemoteProcess(self.ray, rw.actor, pid)
        self._publish()

    def _revive(self, rw: RayWorker) -> bool:
        """Make a lost actor again; True when the worker's address changed."""
        log.warning("actor of %s is gone; making it again", rw.worker.name)
        with contextlib.suppress(Exception):
            self.ray.kill(rw.actor, no_restart=True)
        self._wait_name_free(rw.worker.name)
        self._make_actor(rw, node_id=rw.node_id)
        return self._locate(rw, keep_port=True)

    def _wait_name_free(self, name: str) -> None:
        """A killed actor's name is released asynchronously; a new actor may take it only after."""
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                self.ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                return
            time.sleep(0.2)

    def _actor_lost(self, rw: RayWorker) -> bool:
        return rw.process is not None and rw.process.actor_lost

    def restart(self, name: str) -> None:
        """Start a worker again: in its actor, or in a new actor if that one is gone. A serving worker
        that comes back at another address makes the learners restart with the new wiring."""
        rw = self.workers[name]
        if rw.alive():
            return
        rw.restarts += 1
        moved = self._revive(rw) if self._actor_lost(rw) else False
        self._spawn(rw)
        if moved and rw.worker.role != "learner":
            log.warning("%s moved to %s; restarting the learners with the new address", name, rw.address)
            self.restart_gang("learner", extra_args=["--resume"])

    def restart_gang(self, role: str, *, extra_args: list[str] | None = None) -> None:
        gang = self.by_role(role)
        for rw in gang:
            self.kill(rw.worker.name, signal.SIGKILL)
        for rw in gang:
            if rw.process is not None:
                rw.process.wait(timeout=CALL_TIMEOUT_S)
        if extra_args is not None:
            self.extra_args[role] = list(extra_args)
        moved = False
        for rw in gang:
            if self._actor_lost(rw):
                moved = self._revive(rw) or moved
            elif rw.dist_port is not None:  # a fresh rendezvous port, as torch.distributed needs
                self._locate(rw, keep_port=True)
        for rw in gang:
            rw.restarts += 1
            self._spawn(rw)
        if moved and role == "learner":
            # Serving workers pull weights from the coordinator's address they were started with.
            log.warning("the learners moved; restarting the serving workers with their new address")
            for rw in self.workers.values():
                if rw.worker.role != "learner":
                    self.kill(rw.worker.name, signal.SIGKILL)
                    if rw.process is not None:
                        rw.process.wait(timeout=CALL_TIMEOUT_S)
                    rw.restarts += 1
                    if self._actor_lost(rw):
                        self._revive(rw)
                    self._spawn(rw)

    def by_role(self, role: str) -> list[RayWorker]:
        return [rw for rw in self.workers.values() if rw.worker.role == role]

    def failed(self) -> list[RayWorker]:
        return [
            rw
            for rw in self.workers.values()
            if rw.process is not None and rw.process.poll() not in (None, 0)
        ]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        rw = self.workers[name]
        if rw.actor is not None and rw.alive():
            with contextlib.suppress(Exception):
                self.ray.get(rw.actor.signal.remote(int(sig)), timeout=CALL_TIMEOUT_S)

    def publish(self, **state: Any) -> None:
        """What `dverl status --ray` shows besides the actors: step, phase, restarts."""
        with contextlib.suppress(Exception):
            self.record.update.remote(state)

    def _publish(self) -> None:
        self.publish(
            addresses=self.addresses(),
            restarts={rw.worker.name: rw.restarts for rw in self.workers.values()},
        )

    def fetch_results(self, names: tuple[str, ...] = ("summary.json", "metrics.jsonl", "eval.jsonl")) -> None:
        """The learner's run files, brought to this machine when the learner ran on another node."""
        learners = self.by_role("learner")
        if not learners or learners[0].actor is None:
            return
        for name in names:
            path = self.output_dir / name
            with contextlib.suppress(Exception):
                data = self.ray.get(learners[0].actor.read.remote(name), timeout=CALL_TIMEOUT_S)
                if data is not None and (not path.exists() or path.read_bytes() != data):
                    path.write_bytes(data)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every worker, SIGKILL what is left after `grace`, then remove the actors and the group."""
        pending = [rw.actor.stop.remote(grace) for rw in self.workers.values() if rw.actor is not None]
        with contextlib.suppress(Exception):
            self.ray.get(pending, timeout=grace + CALL_TIMEOUT_S)
        for rw in self.workers.values():
            if rw.actor is not None:
                with contextlib.suppress(Exception):
                    self.ray.kill(rw.actor, no_restart=True)
        with contextlib.suppress(Exception):
            self.ray.kill(self.record, no_restart=True)
        if self.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
