"""Commands about a manifest, before anything runs: validate, plan, crd, convert."""

from __future__ import annotations

import argparse
import json
import sys

from decentralized_verl.cli.commands.registry import Command, command

JSON_HELP = "print machine-readable JSON on stdout instead of text"


@command(
    "validate", "check an RLHFJob manifest (and that it fits its GPUs); exit 2 with field paths when not"
)
def _validate(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("files", nargs="+", metavar="FILE.yaml", help="one or more RLHFJob manifests")
    parser.add_argument("--json", action="store_true", help=JSON_HELP + " (one object per file, a list)")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.errors import ManifestError
        from decentralized_verl.planning.fitting_job import load_fitting_job
        from decentralized_verl.spec.manifest import summary, warnings_for
        from decentralized_verl.spec.source_paths import cluster_warnings

        status, results = 0, []
        for file in args.files:
            try:
                job = load_fitting_job(file)
            except ManifestError as exc:
                status = 2
                problems = [{"path": p.path, "message": p.message} for p in exc.problems]
                results.append({"file": file, "valid": False, "problems": problems})
                if not args.json:
                    for problem in exc.problems:
                        print(f"{file}: {problem}", file=sys.stderr)
                continue
            warnings = [str(w) for w in warnings_for(job.spec)] + list(cluster_warnings(job.spec))
            results.append({"file": file, "valid": True, "summary": summary(job), "warnings": warnings})
            if not args.json:
                print(summary(job))
                for warning in warnings:
                    print(f"{file}: warning: {warning}", file=sys.stderr)
        if args.json:
            print(json.dumps(results, indent=2))
        return status

    return run


@command("crd", "print the RLHFJob CustomResourceDefinition (generated from the spec)")
def _crd(parser: argparse.ArgumentParser) -> Command:
    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.spec.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0

    return run


@command("plan", "what fits: each role's memory per worker and pool, checked against its GPUs")
def _plan(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("file", metavar="FILE.yaml", help="the RLHFJob manifest")
    parser.add_argument("--json", action="store_true", help=JSON_HELP + " (bytes, components; or workers)")
    parser.add_argument(
        "--workers", action="store_true", help="list the worker processes instead (role, pool, command)"
    )

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.planning.run_plan import main_plan

        return main_plan(args.file, as_json=args.json, workers=args.workers)

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
        from pathlib import Path

        import yaml

        from decentralized_verl.convert import convert
        from decentralized_verl.errors import ManifestError
        from decentralized_verl.spec.manifest import parse_job

        try:
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        except OSError as exc:
            parser.error(f"{args.file}: {exc.strerror or exc}")
        try:
            result = convert(args.source, text, args.overrides, args.name)
        except (ValueError, KeyError, yaml.YAMLError) as exc:
            print(f"{args.file}: cannot convert: {exc}", file=sys.stderr)
            return 2
        problems: list[str] = []
        try:
            parse_job(result.manifest, args.output or "<converted>")
        except ManifestError as exc:
            problems = [str(p) for p in exc.problems]
        document = yaml.safe_dump(result.manifest, sort_keys=False)
        if args.output:
            Path(args.output).write_text(document)
        if args.json:
            print(
                json.dumps(
                    {
                        "manifest": result.manifest,
                        "unmapped": [
                            {"field": u.field, "value": u.value, "why": u.why} for u in result.unmapped
                        ],
                        "notes": result.notes,
                        "problems": problems,
                    },
                    indent=2,
                    default=str,
                )
            )
        else:
            if not args.output:
                sys.stdout.write(document)
            for unmapped in result.unmapped:
                print(f"unmapped: {unmapped}", file=sys.stderr)
            for note in result.notes:
                print(f"note: {note}", file=sys.stderr)
            for problem in problems:
                print(f"invalid: {problem}", file=sys.stderr)
        return 2 if problems else 0

    return run
