"""What a `dverl worker` command line asks for: its arguments, and which kind of worker they name.

Pure, so the command line's parser imports it without the workers themselves; `entrypoints/worker.py`
then starts the kind this names.
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
    device: str | None = None
    """`--device`: over DVERL_DEVICE and the role's `device` (`runtime.device_choice`)."""

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
