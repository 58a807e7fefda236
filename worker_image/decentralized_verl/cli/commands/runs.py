"""Commands about a run on this machine: run, status, plot, export, train."""

from __future__ import annotations

import argparse
import json
import time

from decentralized_verl.cli.commands.registry import Command, command
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spec.catalogue.algorithms import PRESETS

OUTPUT_HELP = "run folder (default: runs/<job name>)"


@command("run", "run a job on this machine: every worker as a local process on 127.0.0.1")
def _run(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("file", metavar="JOB.yaml", help="the RLHFJob manifest")
    parser.add_argument("--output", "-o", default=None, help=OUTPUT_HELP)
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in the folder from its newest checkpoint"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the run already in the folder and start over (without it such a folder is refused)",
    )
    parser.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run every worker as a named actor of the Ray cluster at ADDRESS (or `auto`) instead",
    )
    parser.add_argument(
        "--log-every",
        type=int,
        default=1,
        metavar="N",
        help="off a terminal, print every N-th step's line and the last (evaluations always; %(default)s)",
    )

    def run(args: argparse.Namespace) -> int:
        if args.log_every < 1:
            parser.error(f"--log-every must be >= 1 (got {args.log_every})")
        from decentralized_verl.launch.run import main_run  # noqa: PLC0415 entry: the command's body

        return main_run(
            args.file,
            args.output,
            args.resume,
            ray=args.ray,
            overwrite=args.overwrite,
            log_every=args.log_every,
        )

    return run


@command("status", "where a run stands: step, reward, ETA, workers, last evaluation (from its folder)")
def _status(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="the run folder (`dverl run --output`), or the job's name with --ray",
    )
    parser.add_argument("--json", action="store_true", help="print the status as one JSON object")
    parser.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="read the job from the Ray cluster at ADDRESS (or `auto`)",
    )
    parser.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=5.0,
        default=None,
        metavar="SECONDS",
        help="print it again every SECONDS (5 when given bare) until the run ends",
    )

    def run(args: argparse.Namespace) -> int:
        if args.ray is not None:
            from decentralized_verl.launch.ray_status import main_ray_status  # noqa: PLC0415 entry: the command's body

            return main_ray_status(args.ray, args.run_dir, as_json=args.json)
        from decentralized_verl.launch.run_status import ACTIVE_STATES, render_status, run_status  # noqa: PLC0415 entry: the command's body

        while True:
            status = run_status(args.run_dir)
            print(json.dumps(status, default=str) if args.json else render_status(status), flush=True)
            if args.watch is None or status["state"] not in ACTIVE_STATES:
                return 0
            time.sleep(max(args.watch, 0.1))

    return run


@command("plot", "write PNG curves (reward, KL, entropy, loss, grad norm, accuracy, ...) from a run folder")
def _plot(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (`dverl run --output`)")
    parser.add_argument(
        "--smooth",
        type=float,
        default=0.6,
        help="exponential smoothing of each curve, 0 (raw) to <1 (the raw values stay drawn faintly)",
    )

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.cli.plotting import plot_run  # noqa: PLC0415 entry: the command's body

        if not 0 <= args.smooth < 1:
            parser.error(f"--smooth must be in [0, 1) (got {args.smooth})")
        for path in plot_run(args.run_dir, smooth=args.smooth):
            print(path)
        return 0

    return run


@command("export", "write one checkpoint of a run (sharded or not) as a plain Hugging Face model folder")
def _export(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (`dverl run --output`)")
    parser.add_argument(
        "--step", type=int, default=None, help="checkpoint step (default: the newest complete)"
    )
    parser.add_argument(
        "--output",
        "-o",
        "--out",
        dest="output",
        required=True,
        metavar="DIR",
        help="absent or empty folder to write (--out is the old name)",
    )

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.training.run_export import main_export  # noqa: PLC0415 entry: the command's body

        return main_export(args.run_dir, args.step, args.output)

    return run


@command("train", "run the SFT, reward-model and RL stages on one machine, or the DHT quick start")
def _train(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument(
        "--stage", default=None, choices=["sft", "reward", "rlhf", "all"], help="which stage(s) to run"
    )
    parser.add_argument(
        "--config", default=None, metavar="FILE.yaml", help="the stages config (examples/stages.yaml)"
    )
    # The DHT quick start: train with the open actor/critic workers found through the DHT.
    quick = parser.add_argument_group("quick start over the DHT (--initial-peers ...)")
    quick.add_argument(
        "--initial-peers", nargs="+", default=None, metavar="MADDR", help="the DHT's bootstrap peer(s)"
    )
    quick.add_argument(
        "--model", default=None, help="local model folder (default: the one the actor announced)"
    )
    quick.add_argument("--prompts-file", default=None, help="a JSON list of prompt strings, or a data file")
    quick.add_argument(
        "--algorithm",
        default="ppo",
        choices=sorted(PRESETS),
        help="the RL algorithm",
    )
    quick.add_argument("--num-epochs", type=int, default=1, help="passes over the prompts")
    quick.add_argument("--job", default=None, help="open job name the workers announced under (quickstart)")
    quick.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    quick.add_argument(
        "--samples-per-prompt", type=int, default=None, help="samples per prompt (default: the algorithm's)"
    )
    quick.add_argument("--max-new-tokens", type=int, default=32, help="longest response")
    quick.add_argument("--learning-rate", type=float, default=1e-5, help="optimizer learning rate")
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
    quick.add_argument("--output", "-o", default=None, help="run folder (default: runs/<job>)")
    quick.add_argument("--port", type=int, default=0, help="this peer's P2P port (0: any free one)")

    def run(args: argparse.Namespace) -> int:
        settings = WorkerSettings.from_env()  # this process trains: its entry reads the settings
        if args.initial_peers:
            from decentralized_verl.entrypoints.quickstart import QuickstartOptions, main_quickstart  # noqa: PLC0415 entry: the command's body

            if not args.prompts_file:
                parser.error("--initial-peers: give --prompts-file prompts.json")
            reward = {"reward_type": args.reward_type} if args.reward_type else {}  # else the quick start's
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
                    reward_model=args.reward_model,
                    learning_rate=args.learning_rate,
                    verify_fraction=args.verify_fraction,
                    kl_coef=args.kl_coef,
                    wait_workers_s=args.wait_workers,
                    output=args.output,
                    port=args.port,
                    **reward,
                ),
                settings,
            )
        if args.stage is None or args.config is None:
            parser.error("give --stage and --config (or --initial-peers ... for the DHT quick start)")
        from decentralized_verl.stages.runner import main_stage  # noqa: PLC0415 entry: the command's body

        return main_stage(args.stage, args.config, settings)

    return run
