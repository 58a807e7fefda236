"""The `dverl` command line. Each subcommand imports its heavy dependencies only when it runs.

Every project error (DverlError) is printed as lines a person can act on and exits 2; no tracebacks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from decentralized_verl.entrypoints.worker import ROLES
from decentralized_verl.errors import DverlError, ManifestError

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, help_text: str):
    """Register a subcommand: the decorated function adds its arguments and returns the runner."""

    def register(add_arguments: Callable[[argparse.ArgumentParser], Command]):
        def setup(parser: argparse.ArgumentParser) -> None:
            parser.set_defaults(_run=add_arguments(parser))

        COMMANDS[name] = (setup, help_text)
        return add_arguments

    return register


# ------------------------------------------------------------------------------------------ validate
@command(
    "validate", "check an RLHFJob manifest (and that it fits its GPUs); exit 2 with field paths when not"
)
def _validate(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("files", nargs="+", metavar="FILE.yaml")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.manifest import load_fitting_job, summary
        from decentralized_verl.sources.paths import cluster_warnings

        status = 0
        for file in args.files:
            try:
                job = load_fitting_job(file)
                print(summary(job))
                for warning in cluster_warnings(job.spec):
                    print(f"{file}: warning: {warning}", file=sys.stderr)
            except ManifestError as exc:
                status = 2
                for problem in exc.problems:
                    print(f"{file}: {problem}", file=sys.stderr)
        return status

    return run


# ----------------------------------------------------------------------------------------------- crd
@command("crd", "print the RLHFJob CustomResourceDefinition (generated from the spec)")
def _crd(parser: argparse.ArgumentParser) -> Command:
    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0

    return run


# ---------------------------------------------------------------------------------------------- plan
@command("plan", "what fits: each role's memory per worker and pool, checked against its GPUs")
def _plan(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("file", metavar="FILE.yaml")
    parser.add_argument("--json", action="store_true", help="the memory plan as JSON (bytes, components)")
    parser.add_argument(
        "--workers", action="store_true", help="list the worker processes instead (role, pool, command)"
    )

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.planning.run_plan import main_plan

        return main_plan(args.file, as_json=args.json, workers=args.workers)

    return run


# ----------------------------------------------------------------------------------------------- run
@command("run", "run a job on this machine: every worker as a local process on 127.0.0.1")
def _run(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("file", metavar="JOB.yaml")
    parser.add_argument("--output", "-o", default=None, help="run folder (default runs/<job name>)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.launch.run import main_run

        return main_run(args.file, args.output, args.resume)

    return run


# -------------------------------------------------------------------------------------------- worker
@command("worker", "serve one role of a job (what pods, `dverl run` and volunteers start)")
def _worker(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("--role", required=True, choices=ROLES)
    parser.add_argument("--index", type=int, default=0)
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
    parser.add_argument("--host-maddrs", nargs="+", default=None, metavar="MADDR")
    parser.add_argument("--announce-maddrs", nargs="+", default=None, metavar="MADDR")
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
    # Volunteer learners: exact gradient averaging with hivemind's GradientAverager.
    learner = parser.add_argument_group("volunteer learner (--role learner --initial-peers ...)")
    learner.add_argument(
        "--data", default=None, help="jsonl/json of {prompt, completion} (or {text}) records"
    )
    learner.add_argument("--peers", type=int, default=2, help="learners to wait for before the first step")
    learner.add_argument("--steps", type=int, default=1, help="optimizer steps (each averages all peers)")
    learner.add_argument("--shard", type=int, default=0, help="this learner's shard of --data")
    learner.add_argument("--num-shards", type=int, default=1)
    learner.add_argument("--batch-size", type=int, default=4)
    learner.add_argument("--learning-rate", type=float, default=0.1)
    learner.add_argument("--digest-out", default=None, help="write the parameters' sha256 (and .safetensors)")
    parser.add_argument("--port", type=int, default=50051)
    parser.add_argument("--output", default=None, help="learner: run folder for metrics and checkpoints")
    parser.add_argument("--resume", action="store_true", help="learner: continue from the newest checkpoint")

    def run(args: argparse.Namespace) -> int:
        from dataclasses import fields

        from decentralized_verl.entrypoints.worker import (
            WorkerArgs,
            WorkerUsageError,
            main_worker,
            worker_kind,
        )

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


# ----------------------------------------------------------------------------------------------- dht
@command("dht", "run a Hivemind DHT bootstrap peer and print the --initial-peers line others use")
def _dht(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("--port", type=int, default=31337)
    parser.add_argument("--job", default=None, help="derive the peer id from the job name (the plan sets it)")
    parser.add_argument(
        "--host-maddrs",
        nargs="+",
        default=None,
        metavar="MADDR",
        help="listen addresses (default /ip4/0.0.0.0/tcp/PORT)",
    )
    parser.add_argument(
        "--announce-maddrs",
        nargs="+",
        default=None,
        metavar="MADDR",
        help="addresses others should dial (a public IP, a Service's address)",
    )
    parser.add_argument("--initial-peers", nargs="+", default=(), metavar="MADDR")

    def run(args: argparse.Namespace) -> int:
        import logging

        from decentralized_verl.volunteers.dht import run_bootstrap

        logging.basicConfig(level=logging.WARNING)
        return run_bootstrap(
            args.port,
            job=args.job,
            host_maddrs=args.host_maddrs or (),
            announce_maddrs=args.announce_maddrs or (),
            initial_peers=args.initial_peers,
        )

    return run


# --------------------------------------------------------------------------------------------- token
@command("token", "issue a volunteer join token for a job, signed with the job's secret")
def _token(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("--job", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--secret-file", default=None, help="file holding the job secret (>= 16 bytes)")
    source.add_argument("--secret-env", default=None, help="environment variable holding the job secret")
    parser.add_argument("--ttl", type=float, default=24 * 3600.0, help="seconds the token stays valid")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.volunteers.tokens import issue_token, load_secret

        secret = load_secret(secret_file=args.secret_file, secret_env=args.secret_env)
        print(issue_token(secret, args.job, args.ttl))
        return 0

    return run


# --------------------------------------------------------------------------------------------- train
@command("train", "run the SFT, reward-model and RL stages on one machine, or the DHT quick start")
def _train(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("--stage", default=None, choices=["sft", "reward", "rlhf", "all"])
    parser.add_argument("--config", default=None, metavar="FILE.yaml")
    # The DHT quick start: train with the open actor/critic workers found through the DHT.
    quick = parser.add_argument_group("quick start over the DHT (--initial-peers ...)")
    quick.add_argument("--initial-peers", nargs="+", default=None, metavar="MADDR")
    quick.add_argument(
        "--model", default=None, help="local model folder (default: the one the actor announced)"
    )
    quick.add_argument("--prompts-file", default=None, help="a JSON list of prompt strings, or a data file")
    quick.add_argument(
        "--algorithm", default="ppo", choices=["ppo", "grpo", "dapo", "rloo", "reinforce_plus_plus"]
    )
    quick.add_argument("--num-epochs", type=int, default=1)
    quick.add_argument("--job", default=None, help="open job name the workers announced under (quickstart)")
    quick.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    quick.add_argument("--samples-per-prompt", type=int, default=None)
    quick.add_argument("--max-new-tokens", type=int, default=32)
    quick.add_argument("--learning-rate", type=float, default=1e-5)
    quick.add_argument(
        "--reward-type", default=None, help="boxed | think_answer_tags | code | module:function"
    )
    quick.add_argument("--reward-model", default=None, help="local reward-model folder")
    quick.add_argument(
        "--verify-fraction", type=float, default=0.05, help="share of actor samples re-checked"
    )
    quick.add_argument(
        "--kl-coef",
        type=float,
        default=0.0,
        help="KL penalty against the initial policy (a reference volunteer computes it when one is found)",
    )
    quick.add_argument("--wait-workers", type=float, default=120.0, help="seconds to wait for workers")
    quick.add_argument("--output", default=None, help="run folder (default runs/<job>)")
    quick.add_argument("--port", type=int, default=0, help="this peer's P2P port")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.cpus import configure_from_environment

        configure_from_environment()
        if args.initial_peers:
            from decentralized_verl.entrypoints.quickstart import QuickstartOptions, main_quickstart
            from decentralized_verl.volunteers.rewards import QUICKSTART_REWARD

            if not args.prompts_file:
                parser.error("--initial-peers: give --prompts-file prompts.json")
            return main_quickstart(
                QuickstartOptions(
                    initial_peers=tuple(args.initial_peers),
                    prompts_file=args.prompts_file,
                    algorithm=args.algorithm,
                    num_epochs=args.num_epochs,
                    model=args.model,
                    job=args.job or "quickstart",
                    batch_size=args.batch_size,
                    samples_per_prompt=args.samples_per_prompt,
                    max_new_tokens=args.max_new_tokens,
                    reward_type=args.reward_type or QUICKSTART_REWARD,
                    reward_model=args.reward_model,
                    learning_rate=args.learning_rate,
                    verify_fraction=args.verify_fraction,
                    kl_coef=args.kl_coef,
                    wait_workers_s=args.wait_workers,
                    output=args.output,
                    port=args.port,
                )
            )
        if args.stage is None or args.config is None:
            parser.error("give --stage and --config (or --initial-peers ... for the DHT quick start)")
        from decentralized_verl.stages.runner import main_stage

        return main_stage(args.stage, args.config)

    return run


# ---------------------------------------------------------------------------------------------- plot
@command("plot", "write PNG curves (reward, KL, length, accuracy, throughput) from a run folder")
def _plot(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("run_dir", metavar="RUN_DIR")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.plotting import plot_run

        for path in plot_run(args.run_dir):
            print(path)
        return 0

    return run


# -------------------------------------------------------------------------------------------- export
@command("export", "write one checkpoint of a run (sharded or not) as a plain Hugging Face model folder")
def _export(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (`dverl run --output`)")
    parser.add_argument("--step", type=int, default=None, help="default: the newest complete checkpoint")
    parser.add_argument("--out", required=True, metavar="DIR", help="absent or empty folder to write")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.training.run_export import main_export

        return main_export(args.run_dir, args.step, args.out)

    return run


# ------------------------------------------------------------------------------------------ operator
@command("operator", "run the Kubernetes operator (what the Helm chart's Deployment starts)")
def _operator(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("operator_args", nargs=argparse.REMAINDER, help="see `dverl operator --help`")

    def run(args: argparse.Namespace) -> int:
        from dverl_operator.main import main as operator_main

        return operator_main(args.operator_args)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dverl", description="Decentralized veRL: RL fine-tuning of LLMs")
    from decentralized_verl import __version__

    parser.add_argument("--version", action="version", version=f"dverl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (setup, help_text) in COMMANDS.items():
        setup(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from decentralized_verl.orphans import die_with_parent

    die_with_parent()  # a worker `dverl run` started ends with it
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["operator"]:
        # The operator owns its flags (and its --help); hand them over untouched.
        from dverl_operator.main import main as operator_main

        return operator_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except ManifestError as exc:
        source = f"{exc.source}: " if exc.source else ""
        for problem in exc.problems:
            print(f"{source}{problem}", file=sys.stderr)
        return 2
    except DverlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _alias(subcommand: str) -> Callable[[], int]:
    def entry() -> int:
        return main([subcommand, *sys.argv[1:]])

    return entry


dht_main = _alias("dht")
worker_main = _alias("worker")
train_main = _alias("train")

if __name__ == "__main__":
    sys.exit(main())
