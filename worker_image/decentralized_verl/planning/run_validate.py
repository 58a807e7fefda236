"""`dverl validate FILE.yaml ...`: each manifest checked the way `dverl run` checks it (valid, within the
planner's limits, fitting in the memory its pools have), with its summary and warnings, as text or JSON.

Exits 2 when any file is invalid, so a script can gate a submission on it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.planning.fitting_job import load_fitting_job
from decentralized_verl.spec.manifest import summary, warnings_for
from decentralized_verl.spec.source_paths import cluster_warnings, unseen_paths


def main_validate(files: Sequence[str], *, as_json: bool = False, target: str = "local") -> int:
    """Each file's summary (problems and warnings on stderr), or one JSON list; 2 when any is invalid.
    `target` cluster: a model or data path no pod can see is a problem, as the operator refuses it."""
    status, results = 0, []
    for file in files:
        try:
            job = load_fitting_job(file)
            unseen = unseen_paths(job.spec) if target == "cluster" else []
            if unseen:
                raise ManifestError([Problem(field, why) for field, why in unseen], source=file)
        except ManifestError as exc:
            status = 2
            problems = [{"path": p.path, "message": p.message} for p in exc.problems]
            results.append({"file": file, "valid": False, "problems": problems})
            if not as_json:
                for problem in exc.problems:
                    print(f"{file}: {problem}", file=sys.stderr)
            continue
        warnings = [str(w) for w in warnings_for(job.spec)] + list(cluster_warnings(job.spec))
        results.append({"file": file, "valid": True, "summary": summary(job), "warnings": warnings})
        if not as_json:
            print(summary(job))
            for warning in warnings:
                print(f"{file}: warning: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps(results, indent=2))
    return status
