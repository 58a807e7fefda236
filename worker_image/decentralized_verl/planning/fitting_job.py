"""A manifest loaded and checked the way `dverl validate` and `dverl run` check it: valid, within the
planner's limits, and fitting in the memory its pools have, with what the planner decided written in. Kept
out of `manifest` (the spec's own validation) because it reads model shapes from files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from decentralized_verl.errors import ManifestError
from decentralized_verl.planning.fit import MemoryPlan, plan_for, planned_spec
from decentralized_verl.planning.limits import limit_problems
from decentralized_verl.sources.local import as_seen_here
from decentralized_verl.spec import RLHFJob
from decentralized_verl.spec.manifest import load_job, parse_job


def load_fitting_job(path: str | Path, document: Any = None) -> RLHFJob:
    """`load_job`, then refuse a job whose workers cannot fit in the memory their pools have (`dverl plan`
    says why; model shapes are read from config.json files next to the manifest). The job comes back as
    its workers run it: a rollout whose model fits on no single worker carries the layer spans the planner
    chose (docs/spans.md). `document`: the manifest already parsed (one document of a multi-document
    file at `path`), else the file is read."""
    job, memory = load_planned_job(path, document)
    base = Path(path).resolve().parent
    problems = limit_problems(memory.spec or job.spec, base, stated=job.spec) + memory.problems()
    if problems:
        raise ManifestError(problems, str(path))
    return job


def load_planned_job(path: str | Path, document: Any = None) -> tuple[RLHFJob, MemoryPlan]:
    """`load_job` and its memory plan, the job's spec with whatever the planner decided written in (the
    rollout's spans), so every consumer of the returned job agrees with the plan."""
    job = parse_job(document, str(path)) if document is not None else load_job(path)
    base = Path(path).resolve().parent
    # Model shapes are read where `dverl run` would find them: a source's local folder stands in for it.
    memory = plan_for(as_seen_here(job.spec, base), base)
    return job.model_copy(update={"spec": planned_spec(job.spec, memory)}), memory
