"""`dverl validate FILE.yaml ...`: each manifest checked the way `dverl run` checks it (valid, within the
planner's limits, fitting in the memory its pools have), with its summary and warnings, as text or JSON.

A file may hold several YAML documents (a Kubernetes bundle such as the KubeRay example: a ConfigMap
carrying the job, a volume claim, the RayJob): every RLHFJob in it is checked, one carried as a
ConfigMap's data too, and the other kinds are named as not checked. A stages config (`dverl train`) is
checked by the caller's `stages` check, so `dverl validate examples/*.yaml` covers every shipped file.
Exits 2 when any file is invalid, so a script can gate a submission on it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.planning.fitting_job import load_fitting_job
from decentralized_verl.spec.manifest import STAGE_KEYS, load_yaml_documents, summary, warnings_for
from decentralized_verl.spec.source_paths import cluster_warnings, unseen_paths

StagesCheck = Callable[[Any, Path], str]
"""A stages config document and its file -> its summary line; ManifestError when it is invalid."""

JOB_KIND = "RLHFJob"


def main_validate(
    files: Sequence[str], *, as_json: bool = False, stages: StagesCheck | None = None, target: str = "local"
) -> int:
    """Each file's summary (problems and warnings on stderr), or one JSON list; 2 when any is invalid.
    `target` cluster: a model or data path no pod can see is a problem, as the operator refuses it."""
    results = [result for file in files for result in _check_file(file, stages, target)]
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            _print(result)
    return 2 if any(r.get("valid") is False for r in results) else 0


def _check_file(file: str, stages: StagesCheck | None, target: str) -> Iterator[dict[str, Any]]:
    try:
        text = Path(file).read_text(encoding="utf-8")
        documents = load_yaml_documents(text, file)
    except FileNotFoundError:
        yield _invalid(file, ManifestError([Problem("(file)", "no such file")], file))
        return
    except (UnicodeDecodeError, IsADirectoryError) as exc:
        yield _invalid(file, ManifestError([Problem("(file)", f"cannot read as text: {exc}")], file))
        return
    except ManifestError as exc:
        yield _invalid(file, exc)
        return
    if len(documents) == 1 and _is_stages(documents[0]) and stages is not None:
        yield _check_stages(file, documents[0], stages)
        return
    if len(documents) <= 1:  # one manifest: whatever it holds is checked as a job and refused by field
        yield _check_job(file, file, documents[0] if documents else None, target)
        return
    found = False
    for index, document in enumerate(documents):
        for label, job in _jobs_in(file, index, document):
            found = True
            yield _check_job(file, label, job, target)
        if not _carries_job(document):
            kind = document.get("kind", "?") if isinstance(document, dict) else type(document).__name__
            name = (
                (document.get("metadata") or {}).get("name", "") if isinstance(document, dict) else ""
            ) or ""
            yield {"file": f"{file}[{index}]", "kind": kind, "name": name, "checked": False}
    if not found:
        problem = Problem("(file)", f"none of its {len(documents)} YAML documents is an RLHFJob")
        yield _invalid(file, ManifestError([problem], file))


def _jobs_in(file: str, index: int, document: Any) -> Iterator[tuple[str, Any]]:
    """The RLHFJobs a document is or carries (a ConfigMap's data value holding one), each with its label."""
    if not isinstance(document, dict):
        return
    if document.get("kind") == JOB_KIND:
        yield f"{file}[{index}]", document
    elif document.get("kind") == "ConfigMap":
        name = (document.get("metadata") or {}).get("name", "")
        for key, value in (document.get("data") or {}).items():
            carried = _parsed(value, file)
            if isinstance(carried, dict) and carried.get("kind") == JOB_KIND:
                yield f"{file}[{index}] (ConfigMap {name} data.{key})", carried


def _carries_job(document: Any) -> bool:
    return any(True for _ in _jobs_in("", 0, document))


def _parsed(value: Any, file: str) -> Any:
    if not isinstance(value, str):
        return None
    try:
        documents = load_yaml_documents(value, file)
    except ManifestError:
        return None
    return documents[0] if len(documents) == 1 else None


def _is_stages(document: Any) -> bool:
    return isinstance(document, dict) and "kind" not in document and bool(STAGE_KEYS & set(document))


def _check_job(file: str, label: str, document: Any, target: str) -> dict[str, Any]:
    try:
        job = load_fitting_job(file) if label == file else load_fitting_job(file, document)
        unseen = unseen_paths(job.spec) if target == "cluster" else []
        if unseen:
            raise ManifestError([Problem(field, why) for field, why in unseen], source=label)
    except ManifestError as exc:
        return _invalid(label, exc)
    warnings = [str(w) for w in warnings_for(job.spec)] + list(cluster_warnings(job.spec))
    return {"file": label, "valid": True, "summary": summary(job), "warnings": warnings}


def _check_stages(file: str, document: Any, stages: StagesCheck) -> dict[str, Any]:
    try:
        said = stages(document, Path(file))
    except ManifestError as exc:
        return _invalid(file, exc)
    return {"file": file, "valid": True, "summary": said, "warnings": []}


def _invalid(label: str, exc: ManifestError) -> dict[str, Any]:
    problems = [{"path": p.path, "message": p.message} for p in exc.problems]
    return {"file": label, "valid": False, "problems": problems}


def _print(result: dict[str, Any]) -> None:
    label = result["file"]
    if result.get("checked") is False:
        print(
            f"{label}: {result['kind']} {result['name']}: not an RLHFJob, not checked".rstrip(),
            file=sys.stderr,
        )
    elif result["valid"]:
        print(result["summary"])
        for warning in result["warnings"]:
            print(f"{label}: warning: {warning}", file=sys.stderr)
    else:
        for problem in result["problems"]:
            print(f"{label}: {problem['path']}: {problem['message']}", file=sys.stderr)
