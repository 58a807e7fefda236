"""Commands about a manifest, before anything runs: validate, plan, crd, convert."""

from __future__ import annotations

import argparse
import sys

from decentralized_verl.cli.commands.registry import Command, command
from decentralized_verl.spec import safe_yaml

JSON_HELP = "print machine-readable JSON on stdout instead of text"


@command(
    "validate", "check an RLHFJob manifest (and that it fits its GPUs); exit 2 with field paths when not"
)
def _validate(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE.yaml",
        help="RLHFJob manifests (every RLHFJob of a multi-document file), or a stages config",
    )
    parser.add_argument("--json", action="store_true", help=JSON_HELP + " (one object per file, a list)")
    parser.add_argument(
        "--target",
        choices=("local", "cluster"),
        default="local",
        help="where the job will run: cluster makes a model or data path no pod can see an error "
        "(local, for `dverl run`: a warning)",
    )

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.planning.run_validate import main_validate  # noqa: PLC0415 entry: the command's body
        from decentralized_verl.stages.config import stages_summary  # noqa: PLC0415 entry: a stages file's check

        return main_validate(args.files, as_json=args.json, stages=stages_summary, target=args.target)

    return run


@command("crd", "print the RLHFJob CustomResourceDefinition (generated from the spec)")
def _crd(parser: argparse.ArgumentParser) -> Command:
    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.spec.crd import crd_yaml  # noqa: PLC0415 entry: the command's body

        sys.stdout.write(crd_yaml())
        return 0

    return run


@command("plan", "what fits: each role's memory per worker and pool, checked against its GPUs")
def _plan(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("file", metavar="FILE.yaml", help="the RLHFJob manifest")
    parser.add_argument("--json", action="store_true", help=JSON_HELP + " (bytes, components; or workers)")
    parser.add_argument(
        "--workers",
        action="store_true",
        help="list the worker processes instead (role, pool, device, command)",
    )
    parser.add_argument(
        "--machine",
        default=None,
        metavar="GPUS[xMEMORY]",
        help="lay the workers out on one machine of this description, as `dverl run` would there "
        "(e.g. 1x24Gi, 8xa100, 0): each worker's GPU; implies --workers",
    )

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.planning.run_plan import main_plan  # noqa: PLC0415 entry: the command's body

        return main_plan(args.file, as_json=args.json, workers=args.workers, machine=args.machine)

    return run


@command(
    "convert",
    "turn a veRL ppo_trainer config, a TRL GRPOConfig or an OpenRLHF command line into an RLHFJob manifest",
)
def _convert(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument(
        "source", choices=["verl", "trl", "openrlhf"], help="the framework the config is written for"
    )
    parser.add_argument(
        "file",
        metavar="FILE",
        help="veRL: its YAML or a run script (main_ppo ... key=value); TRL: GRPOConfig fields as "
        "JSON/YAML; OpenRLHF: a run script or the command line in a file; - reads stdin",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="veRL: Hydra-style overrides applied on top"
    )
    parser.add_argument("--name", default=None, help="the job's name (default: from the run name)")
    parser.add_argument("--output", "-o", default=None, help="write the manifest here (default: stdout)")
    parser.add_argument(
        "--json", action="store_true", help=JSON_HELP + " (the manifest, unmapped fields, notes)"
    )

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.convert.command import main_convert  # noqa: PLC0415 entry: the command's body

        try:
            text = (
                safe_yaml.read_limited_stream(sys.stdin.buffer)
                if args.file == "-"
                else safe_yaml.read_limited(args.file)
            )
        except OSError as exc:
            parser.error(f"{args.file}: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            parser.error(f"{args.file}: not UTF-8 text ({exc.reason} at byte {exc.start})")
        return main_convert(
            args.source,
            text,
            where=args.file,
            overrides=args.overrides,
            name=args.name,
            output=args.output,
            as_json=args.json,
        )

    return run
