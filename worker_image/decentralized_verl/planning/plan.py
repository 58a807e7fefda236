"""Pure: a job spec -> the workers it needs. One plan, every executor (operator pods, local processes, Ray).

Nothing here knows about Kubernetes objects or processes; it says which worker runs where, with what
command line, environment and ports. Addresses are supplied by the executor (cluster DNS names or
127.0.0.1 with free ports), and `worker_env` wires them into each worker's environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from decentralized_verl.settings import SERVICE_ROLES, env_name
from decentralized_verl.spec import JobSpec, NodePool, Resources, RoleSpec

GRPC_PORT = 50051
METRICS_PORT = 9400
"""Learner rank 0's Prometheus endpoint (/metrics): the training metrics of each step."""
DIST_PORT = 29500
CONFIG_PATH = "/etc/dverl/job.yaml"
"""Where the operator mounts the ConfigMap with the rendered spec; `dverl run` passes its own path."""


@dataclass(frozen=True)
class PlannedWorker:
    job: str
    role: str
    index: int
    pool: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, object], ...] = ()
    gpu_type: str | None = None
    gpus: int = 0
    cpu: str | None = None
    memory: str | None = None
    ports: Mapping[str, int] = field(default_factory=dict)
    span: tuple[int, int] | None = None
    """A span server's (rollout worker it serves, span position in that worker's chain)."""

    @property
    def name(self) -> str:
        """`<job>-<role>-<index>`: the pod name, the process label and the DNS host name."""
        return f"{self.job}-{self.role}-{self.index}"

    def command(self, config_path: str = CONFIG_PATH, port: int | None = None) -> list[str]:
        """The worker's command line; the executor may move the port (local runs use free ports)."""
        port = port if port is not None else self.ports.get("grpc", GRPC_PORT)
        if self.role == "dht":
            return ["dverl", "dht", "--port", str(port), "--job", self.job]
        return [
            "dverl",
            "worker",
            "--role",
            self.role,
            "--index",
            str(self.index),
            "--config",
            config_path,
            "--job",
            self.job,
            "--port",
            str(port),
        ]


@dataclass(frozen=True)
class Plan:
    job: str
    workers: tuple[PlannedWorker, ...]
    colocated: tuple[str, ...]
    """Roles that run inside the learner process (replicas 0), behind the same interface."""

    def by_role(self, role: str) -> list[PlannedWorker]:
        return [w for w in self.workers if w.role == role]

    def desired(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for worker in self.workers:
            counts[worker.role] = counts.get(worker.role, 0) + 1
        return counts


def _pool_slots(role: RoleSpec) -> list[NodePool | None]:
    """Which pool each replica index lands in: pools in order, replicas filled pool by pool."""
    if not role.node_pools:
        return [None] * role.replicas
    slots: list[NodePool | None] = []
    for pool in role.node_pools:
        slots.extend([pool] * pool.replicas)
    return slots


def _resources_in(role: RoleSpec, pool: NodePool | None) -> Resources:
    return pool.resources if pool is not None and pool.resources is not None else role.resources


def worker_resources(role: RoleSpec, index: int) -> Resources:
    """What replica ``index`` of ``role`` is given (its node pool's resources, else the role's).

    The pod asks Kubernetes for exactly these, and the worker sizes itself by them (a vllm rollout
    worker runs tensor-parallel over its ``gpus``), so both read them from here.
    """
    slots = _pool_slots(role)
    if not 0 <= index < len(slots):
        raise ValueError(f"index: the role has {len(slots)} replicas, so no replica {index}")
    return _resources_in(role, slots[index])


def is_gang(role_name: str, role: RoleSpec) -> bool:
    """Whether the role's replicas are the ranks of one torch.distributed group (the learners; a sharded
    critic), rather than independent workers."""
    return role_name == "learner" or (role_name == "critic" and role.sharding == "fsdp")


def _worker(job: str, role_name: str, index: int, role: RoleSpec, pool: NodePool | None) -> PlannedWorker:
    resources = _resources_in(role, pool)
    ports = {"grpc": GRPC_PORT}
    if is_gang(role_name, role):
        ports["dist"] = DIST_PORT
    if role_name == "learner" and index == 0:
        ports["metrics"] = METRICS_PORT
    return PlannedWorker(
        job=job,
        role=role_name,
        index=index,
        pool=pool.name if pool else None,
        node_selector=dict(pool.node_selector) if pool else {},
        tolerations=tuple(t.model_dump(by_alias=True, exclude_none=True) for t in pool.tolerations)
        if pool
        else (),
        gpu_type=pool.gpu_type if pool else None,
        gpus=resources.gpus,
        cpu=resources.cpu,
        memory=resources.memory,
        ports=ports,
    )


def plan_job(spec: JobSpec, job: str) -> Plan:
    """Every worker process the job needs, learners first (rank order), then the serving roles."""
    workers: list[PlannedWorker] = []
    colocated: list[str] = []
    for role_name in ("learner", *SERVICE_ROLES):
        role = getattr(spec.roles, role_name)
        if role is None:
            continue
        if role.replicas == 0:
            colocated.append(role_name)
            continue
        for index, pool in enumerate(_pool_slots(role)):
            workers.append(_worker(job, role_name, index, role, pool))
        if role_name == "rollout" and role.spans is not None:
            workers.extend(_span_workers(job, role))
    if spec.volunteers.enabled:
        workers.append(PlannedWorker(job=job, role="dht", index=0, ports={"grpc": spec.volunteers.dht_port}))
    return Plan(job=job, workers=tuple(workers), colocated=tuple(colocated))


def _span_workers(job: str, role: RoleSpec) -> list[PlannedWorker]:
    """Each rollout worker's own chain: `spans.count` spans, each served by `spans.replicas` processes,
    on the rollout worker's pool and resources (docs/spans.md)."""
    assert role.spans is not None
    out = []
    for front, pool in enumerate(_pool_slots(role)):
        like = _worker(job, "span", 0, role, pool)
        for position in range(role.spans.count):
            for _ in range(role.spans.replicas):
                out.append(replace(like, index=len(out), span=(front, position)))
    return out


def span_addresses(plan: Plan, front: int, addresses: Mapping[str, str]) -> str:
    """DVERL_SPAN_ADDRS of rollout worker `front`: its spans in chain order separated by `;`, each span's
    servers by `,`."""
    chain: dict[int, list[str]] = {}
    for worker in plan.by_role("span"):
        if worker.span is not None and worker.span[0] == front:
            chain.setdefault(worker.span[1], []).append(addresses[worker.name])
    return ";".join(",".join(chain[position]) for position in sorted(chain))


def worker_env(plan: Plan, worker: PlannedWorker, addresses: Mapping[str, str]) -> dict[str, str]:
    """Environment for one worker given every worker's `host:port` (keyed by worker name; a gang's rank 0
    may add `<name>/dist` for its rendezvous port).

    Learners, and the ranks of a sharded critic, get torch.distributed's rendezvous variables (as torchrun
    sets them, on their own rank 0) and the coordinator (rank 0) gets the address lists of every serving
    role; a sharded critic's is its rank 0's alone, the only rank that serves calls. Dispatch weights by
    pool GPU type come from DVERL_POOLS so the coordinator can start from a prior before it has measured
    throughput.
    """
    env = {
        env_name("job"): plan.job,
        env_name("role"): worker.role,
        env_name("index"): str(worker.index),
        env_name("worker_name"): worker.name,
    }
    if worker.pool:
        env[env_name("pool")] = worker.pool
    if "metrics" in worker.ports:  # an executor may move it, or turn it off with "0" (local runs)
        metrics = addresses.get(f"{worker.name}/metrics", str(worker.ports["metrics"]))
        if metrics != "0":
            env[env_name("metrics_port")] = metrics
    learners = plan.by_role("learner")
    if "dist" in worker.ports:
        env.update(_rendezvous(plan, worker, addresses))
    if worker.role == "rollout" and plan.by_role("span"):
        env[env_name("span_addrs")] = span_addresses(plan, worker.index, addresses)
    dht = plan.by_role("dht")
    if worker.role == "rollout" and plan.by_role("span") and dht:  # a front that takes span volunteers
        env[env_name("dht_addr")] = addresses[dht[0].name]
    if worker.role != "learner":
        if learners:  # where rollout workers pull new weights from (the coordinator's Weights service)
            env[env_name("learner_addr")] = addresses[learners[0].name]
        return env
    for role in SERVICE_ROLES:
        peers = plan.by_role(role)
        if peers and "dist" in peers[0].ports:
            peers = peers[:1]
        if peers:
            env[env_name(f"{role}_addrs")] = ",".join(addresses[p.name] for p in peers)
            env[env_name(f"{role}_pools")] = ",".join(p.gpu_type or p.pool or "" for p in peers)
    if dht:
        env[env_name("dht_addr")] = addresses[dht[0].name]
    return env


def _rendezvous(plan: Plan, worker: PlannedWorker, addresses: Mapping[str, str]) -> dict[str, str]:
    """torchrun's variables for one rank of a gang: rank 0 of the worker's role hosts the rendezvous."""
    gang = plan.by_role(worker.role)
    first = gang[0]
    port = addresses.get(f"{first.name}/dist", str(first.ports.get("dist", DIST_PORT)))
    return {
        "MASTER_ADDR": addresses[first.name].rsplit(":", 1)[0],
        "MASTER_PORT": port.rsplit(":", 1)[-1],
        "WORLD_SIZE": str(len(gang)),
        "RANK": str(worker.index),
        "LOCAL_RANK": "0",
    }
