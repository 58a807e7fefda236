"""Commands that start one process of a job or of the volunteer network: worker, dht, token, operator."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import NoReturn

from decentralized_verl.cli.commands.registry import Command, command
from decentralized_verl.entrypoints.worker_args import ROLES, WorkerArgs, WorkerUsageError, worker_kind

ROLE_HELP = (
    "rollout, learner, critic, reward, reference: a role of the job (--config); actor: an open volunteer "
    "that serves generation for `dverl train --initial-peers` (no --config)"
)


@command("worker", "serve one role of a job (what pods, `dverl run` and volunteers start)")
def _worker(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("--role", required=True, choices=ROLES, help=ROLE_HELP)
    parser.add_argument("--index", type=int, default=0, help="this worker's index within its role")
    parser.add_argument("--config", default=None, help="the job manifest (the ConfigMap's job.yaml in a pod)")
    # Volunteers: no --config; join a running job through its DHT instead.
    parser.add_argument(
        "--initial-peers",
        nargs="+",
        default=None,
        metavar="MADDR",
        help="volunteer: the job's DHT bootstrap peer(s), /ip4/.../tcp/P/p2p/...",
    )
    parser.add_argument("--token", default=None, help="volunteer: the join token (`dverl token`)")
    parser.add_argument("--model", default=None, help="volunteer: local model folder (same architecture)")
    parser.add_argument(
        "--host-maddrs", nargs="+", default=None, metavar="MADDR", help="volunteer: DHT listen addresses"
    )
    parser.add_argument(
        "--announce-maddrs",
        nargs="+",
        default=None,
        metavar="MADDR",
        help="volunteer: addresses others should dial",
    )
    parser.add_argument(
        "--client-mode",
        action="store_true",
        help="volunteer behind NAT: reach out only, accept no DHT requests",
    )
    parser.add_argument("--no-relay", action="store_true", help="volunteer: disable libp2p circuit relays")
    parser.add_argument(
        "--use-auto-relay",
        action="store_true",
        help="volunteer behind NAT: be reachable through public relays",
    )
    parser.add_argument("--job", default=None, help="job name (informational; the config names the job)")
    parser.add_argument(
        "--layers",
        default=None,
        metavar="START:END",
        help="span volunteer (--role span): the span of the job's layout to serve "
        "(default: the coordinator's pick, the span with the fewest volunteers)",
    )
    # Volunteer learners: exact gradient averaging with hivemind's GradientAverager.
    learner = parser.add_argument_group("volunteer learner (--role learner --initial-peers ...)")
    learner.add_argument(
        "--data", default=None, help="jsonl/json of {prompt, completion} (or {text}) records"
    )
    learner.add_argument("--peers", type=int, default=2, help="learners to wait for before the first step")
    learner.add_argument("--steps", type=int, default=1, help="optimizer steps (each averages all peers)")
    learner.add_argument("--shard", type=int, default=0, help="this learner's shard of --data")
    learner.add_argument("--num-shards", type=int, default=1, help="shards --data is split into")
    learner.add_argument("--batch-size", type=int, default=4, help="records per optimizer step")
    learner.add_argument("--learning-rate", type=float, default=0.1, help="SGD learning rate")
    learner.add_argument("--digest-out", default=None, help="write the parameters' sha256 (and .safetensors)")
    parser.add_argument("--port", type=int, default=50051, help="gRPC port this worker serves on")
    parser.add_argument(
        "--device",
        default=None,
        metavar="auto|cpu|cuda[:N]",
        help="where this worker computes (over DVERL_DEVICE and the role's `device`; default auto: its GPU "
        "when it was given one and sees it, else the CPU)",
    )
    parser.add_argument("--output", default=None, help="learner: run folder for metrics and checkpoints")
    parser.add_argument("--resume", action="store_true", help="learner: continue from the newest checkpoint")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.entrypoints.worker import main_worker  # noqa: PLC0415 entry: the worker process

        given = {f.name: getattr(args, f.name) for f in fields(WorkerArgs)}
        for name in ("initial_peers", "host_maddrs", "announce_maddrs"):
            given[name] = tuple(given[name] or ())
        worker = WorkerArgs(**given)
        try:
            worker_kind(worker)
        except WorkerUsageError as exc:
            parser.error(str(exc))
        return main_worker(worker)

    return run


@command("dht", "run a Hivemind DHT bootstrap peer and print the --initial-peers line others use")
def _dht(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("--port", type=int, default=31337, help="TCP port of the DHT")
    parser.add_argument(
        "--job",
        default=None,
        help="the job whose volunteer records this peer checks (each must be signed by the peer it names)",
    )
    parser.add_argument(
        "--host-maddrs",
        nargs="+",
        default=None,
        metavar="MADDR",
        help="listen addresses (default: /ip4/0.0.0.0/tcp/PORT)",
    )
    parser.add_argument(
        "--announce-maddrs",
        nargs="+",
        default=None,
        metavar="MADDR",
        help="addresses others should dial (a public IP, a Service's address)",
    )
    parser.add_argument(
        "--initial-peers", nargs="+", default=(), metavar="MADDR", help="other bootstrap peers to join"
    )

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.volunteers.dht import main_dht  # noqa: PLC0415 entry: the command's body

        return main_dht(
            args.port,
            job=args.job,
            host_maddrs=args.host_maddrs or (),
            announce_maddrs=args.announce_maddrs or (),
            initial_peers=args.initial_peers,
        )

    return run


@command("token", "issue a volunteer join token for a job, signed with the job's secret")
def _token(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("--job", required=True, help="the job the token admits volunteers to")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--secret-file", default=None, help="file holding the job secret (>= 16 bytes)")
    source.add_argument("--secret-env", default=None, help="environment variable holding the job secret")
    parser.add_argument("--ttl", type=float, default=24 * 3600.0, help="seconds the token stays valid")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.volunteers.tokens import issue_token, load_secret  # noqa: PLC0415 entry: the command's body

        secret = load_secret(secret_file=args.secret_file, secret_env=args.secret_env)
        print(issue_token(secret, args.job, args.ttl))
        return 0

    return run


@command("operator", "run the Kubernetes operator (what the Helm chart's Deployment starts)")
def _operator(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("operator_args", nargs=argparse.REMAINDER, help="see `dverl operator --help`")

    def run(args: argparse.Namespace) -> int:
        return run_operator(args.operator_args)

    return run


def run_operator(argv: Sequence[str]) -> NoReturn:
    """The operator's own command line, handed over untouched (`dverl operator --help` is its help).

    The process becomes `python -m dverl_operator` (same pid, so the chart's Deployment signals the
    operator itself): the runtime never imports the operator, which imports the runtime's spec.
    """
    os.execv(sys.executable, [sys.executable, "-m", "dverl_operator", *argv])
