"""`dverl convert`'s work once the source text is read: convert it, check the manifest against the spec,
and write or print it with every unmapped field, note and problem.

Exits 2 when the source cannot be converted or the manifest it gives is not a valid RLHFJob.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from decentralized_verl.convert import convert
from decentralized_verl.convert.common import summary_lines
from decentralized_verl.errors import ManifestError
from decentralized_verl.spec.manifest import parse_job


def main_convert(
    source: str,
    text: str,
    *,
    where: str,
    overrides: list[str],
    name: str | None,
    output: str | None,
    as_json: bool,
) -> int:
    """`text` (read from `where`) as a manifest: to `output` (else stdout), or everything as JSON."""
    folder = None if where == "-" else Path(where).parent

    def read(relative: str) -> str | None:
        """A file of the config's folder (veRL's Hydra defaults), or None when it is not there."""
        path = folder / relative if folder is not None else None
        if path is None or not path.is_file():
            return None
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: cannot be read: {exc}") from exc

    try:
        result = convert(source, text, overrides, name, read if folder is not None else None, where)
    except (ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        print(f"{where}: cannot convert: {exc}", file=sys.stderr)
        return 2
    problems: list[str] = []
    try:
        parse_job(result.manifest, output or "<converted>")
    except ManifestError as exc:
        problems = [str(p) for p in exc.problems]
    document = yaml.safe_dump(result.manifest, sort_keys=False)
    if output:
        Path(output).write_text(document)
    if as_json:
        print(
            json.dumps(
                {
                    "manifest": result.manifest,
                    "unmapped": [{"field": u.field, "value": u.value, "why": u.why} for u in result.unmapped],
                    "notes": result.notes,
                    "problems": problems,
                },
                indent=2,
                default=str,
            )
        )
    else:
        if not output:
            sys.stdout.write(document)
        for line in summary_lines(result.unmapped):
            print(line, file=sys.stderr)
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        for problem in problems:
            print(f"invalid: {problem}", file=sys.stderr)
    return 2 if problems else 0
