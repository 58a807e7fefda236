"""A manifest loaded and checked the way `dverl validate` and `dverl run` check it: valid, within the
planner's limits, and fitting in the memory its pools have. Kept out of `manifest` (the spec's own
validation) because it reads model shapes from files."""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.errors import ManifestError
from decentralized_verl.manifest import load_job
from decentralized_verl.planning.fit import plan_problems
from decentralized_verl.planning.limits import limit_problems
from decentralized_verl.sources.local import as_seen_here
from decentralized_verl.spec import RLHFJob


def load_fitting_job(path: str | Path) -> RLHFJob:
    """`load_job`, then refuse a job whose workers cannot fit in the memory their pools have (`dverl plan`
    says why; model shapes are read from config.json files next to the manifest). Kept out of the spec's
    own validation because it reads files."""
    job = load_job(path)
    base = Path(path).resolve().parent
    # Model shapes are read where `dverl run` would find them: a source's local folder stands in for it.
    here = as_seen_here(job.spec, base)
    problems = limit_problems(here, base) + plan_problems(here, base)
    if problems:
        raise ManifestError(problems, str(path))
    return job
