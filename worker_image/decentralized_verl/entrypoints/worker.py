"""`dverl worker`: one entry for every process that serves a role of a job.

Which kind of worker a command line asks for is one pure decision (`worker_kind`); each kind then has
its own module:
- `--config JOB` (a pod, `dverl run`): an in-cluster role or the learner (cluster_worker.py);
- `--initial-peers MADDR --job NAME --token T`: a token-checked volunteer (volunteer.py);
- `--initial-peers MADDR --model PATH` without a token: the open quick-start worker (open_volunteer.py);
- `--initial-peers MADDR --role learner --model PATH --data FILE`: a volunteer learner that averages
  gradients over the DHT (volunteer_learner.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from decentralized_verl.errors import DverlError

ROLES = ("rollout", "learner", "critic", "reward", "reference", "actor", "span")
DEFAULT_PORT = 50051

WorkerKind = Literal["cluster", "volunteer", "open-volunteer", "volunteer-learner"]


class WorkerUsageError(DverlError):
    """A command line that asks for no kind of worker; the message says what is missing."""


@dataclass(frozen=True)
class WorkerArgs:
    role: str
    index: int = 0
    config: str | None = None
    port: int = DEFAULT_PORT
    output: str | None = None
    resume: bool = False
    job: str | None = None
    # joining through a DHT
    initial_peers: tuple[str, ...] = ()
    token: str | None = None
    model: str | None = None
    host_maddrs: tuple[str, ...] = ()
    announce_maddrs: tuple[str, ...] = ()
    client_mode: bool = False
    no_relay: bool = False
    use_auto_relay: bool = False
    layers: str | None = None
    """A span volunteer's span (`start:end`), one of the job's layout."""
    # volunteer learners
    data: str | None = None
    peers: int = 2
    steps: int = 1
    shard: int = 0
    num_shards: int = 1
    batch_size: int = 4
    learning_rate: float = 0.1
    digest_out: str | None = None

    @property
    def p2p_port(self) -> int:
        """The P2P listen port: the one given, or any free port when --port was left at the gRPC default."""
        return self.port if self.port != DEFAULT_PORT else 0


def worker_kind(args: WorkerArgs) -> WorkerKind:
    """What the command line asks for; `WorkerUsageError` when it asks for nothing complete."""
    if args.initial_peers and args.role == "learner":
        if not args.model or not args.data:
            raise WorkerUsageError("a volunteer learner needs --model PATH and --data FILE")
        return "volunteer-learner"
    if args.initial_peers and not args.token:
        if not args.model:
            raise WorkerUsageError(
                "a volunteer needs --job NAME --token TOKEN (a token-checked job) "
                "or --model PATH (the open quick-start job, trusted networks only)"
            )
        return "open-volunteer"
    if args.initial_peers:
        if not args.job:
            raise WorkerUsageError("a volunteer needs --job NAME and --token TOKEN (from `dverl token`)")
        return "volunteer"
    if args.config is None:
        raise WorkerUsageError("--config is required (or --initial-peers ... to join as a volunteer)")
    return "cluster"


def main_worker(args: WorkerArgs) -> int:
    kind = worker_kind(args)
    from decentralized_verl.runtime.cpus import configure_from_environment
    from decentralized_verl.settings import WorkerSettings

    settings = WorkerSettings.from_env()  # the worker process's entry: read once, passed down from here
    configure_from_environment(settings)
    reach = {
        "initial_peers": tuple(args.initial_peers),
        "port": args.p2p_port,
        "host_maddrs": tuple(args.host_maddrs),
        "announce_maddrs": tuple(args.announce_maddrs),
        "client_mode": args.client_mode,
    }
    relays = {"use_relay": not args.no_relay, "use_auto_relay": args.use_auto_relay}
    if kind == "volunteer-learner":
        from decentralized_verl.entrypoints.volunteer_learner import LearnerOptions, main_learner

        return main_learner(
            LearnerOptions(
                model=args.model,
                data=args.data,
                job=args.job or "quickstart",
                peers=args.peers,
                steps=args.steps,
                shard=args.shard,
                num_shards=args.num_shards,
                batch_size=args.batch_size,
                learning_rate=args.learning_rate,
                digest_out=args.digest_out,
                **reach,
            )
        )
    if kind == "open-volunteer":
        from decentralized_verl.entrypoints.open_volunteer import OpenWorkerOptions, main_open_worker

        return main_open_worker(
            OpenWorkerOptions(
                model=args.model, role=args.role, job=args.job or "quickstart", **reach, **relays
            )
        )
    if kind == "volunteer":
        from decentralized_verl.entrypoints.volunteer import VolunteerOptions, main_volunteer

        return main_volunteer(
            VolunteerOptions(
                job=args.job,
                token=args.token,
                role=args.role,
                model=args.model,
                layers=args.layers,
                vllm_eager=settings.vllm_eager,
                **reach,
                **relays,
            )
        )
    from decentralized_verl.entrypoints.cluster_worker import main_cluster_worker

    return main_cluster_worker(
        args.config, args.role, args.index, args.port, args.output, args.resume, args.job, settings=settings
    )
