"""What `dverl run` checks before it starts a worker: the data files read, the reward callable
imports, the trackers the job names are installed. A cluster cannot read a person's files at
submission; this machine can, so a typo costs seconds here rather than a failed learner minutes in."""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.data.dataset import load_prompts
from decentralized_verl.errors import DverlError, Problem
from decentralized_verl.reporting.trackers import INSTALL, missing_packages
from decentralized_verl.rewards.apart import SHIPPED, import_problem
from decentralized_verl.rewards.registry import reward_function
from decentralized_verl.spec import JobSpec


def preflight_problems(spec: JobSpec, base: Path) -> list[Problem]:
    problems: list[Problem] = []
    data = spec.data
    for field, path in (("train", data.train), ("eval", data.eval)):
        if path is None:
            continue
        candidate = Path(path) if Path(path).is_absolute() else base / path
        try:
            if len(load_prompts(candidate, format=data.format)) == 0:
                problems.append(Problem(f"spec.data.{field}", f"{candidate} holds no records"))
        except (DverlError, OSError) as exc:
            problems.append(Problem(f"spec.data.{field}", str(exc)))
    if data.environment is None and ":" in data.reward_type:
        problems.extend(_reward_problems(data.reward_type, base))
    problems.extend(_tracker_problems(list(spec.training.logging)))
    return problems


def _tracker_problems(names: list[str]) -> list[Problem]:
    return [
        Problem("spec.training.logging", f"{name} is not installed here ({INSTALL})")
        for name in missing_packages(names)
    ]


def _reward_problems(name: str, base: Path) -> list[Problem]:
    # Workers import a user module from the manifest's folder as well as the installed packages. A
    # user's module is imported in a child: its code never runs in this process, which will hold every
    # role's secrets. The package's own rewards are checked here.
    if not name.startswith(SHIPPED):
        problem = import_problem(name, str(base))
        return [Problem("spec.data.rewardType", problem)] if problem else []
    try:
        reward_function(name)
    except (ValueError, ImportError) as exc:
        return [Problem("spec.data.rewardType", str(exc))]
    return []
