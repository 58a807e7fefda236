"""Commands about a manifest, before anything runs: validate, plan, crd, convert."""

from __future__ import annotations

import argparse
import json
import sys

from decentralized_verl.commands import Command, command

JSON_HELP = "print machine-readable JSON on stdout instead of text"


@command(
    "validate", "check an RLHFJob manifest (and that it fits its GPUs); exit 2 with field paths when not"
)
def _validate(parser: argparse.ArgumentParser) -> Command:
    parser.add_argument("files", nargs="+", metavar="FILE.yaml", help="one or more RLHFJob manifests")
    parser.add_argument("--json", action="store_true", help=JSON_HELP + " (one object per file, a list)")

    def run(args: argparse.Namespace) -> int:
        from decentralized_verl.errors import ManifestError
        from decentralized_verl.manifest import load_fitting_job, summary, warnings_for

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
            warnings = [str(w) for w in warnings_for(job.spec)]
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
        from decentralized_verl.crd import crd_yaml

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
