"""`dverl train --stage sft|reward|rlhf|all --config FILE`: one stage, or every configured one in order."""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.errors import DverlError
from decentralized_verl.launch.run import run_job
from decentralized_verl.runtime.cpus import configure_from_environment
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.stages.common import StageResult
from decentralized_verl.stages.config import STAGES, TrainConfig, load_train_config, require_stage
from decentralized_verl.stages.reward import run_reward
from decentralized_verl.stages.sft import run_sft

CHOICES = (*STAGES, "all")


def run_rlhf(config: TrainConfig) -> StageResult:
    """Hand the RLHFJob manifest to the runtime that `dverl run` uses."""
    section = config.rlhf
    assert section is not None

    job = config.resolve(section.job)
    outcome = run_job(job)
    return StageResult("rlhf", None, {"job": str(job), "result": outcome})


def _run_one(stage: str, config: TrainConfig) -> StageResult:
    if stage == "sft":
        return run_sft(config)
    if stage == "reward":
        return run_reward(config)
    return run_rlhf(config)


def run_stage(stage: str, config_path: str | Path) -> StageResult:
    """Run `stage` from the config file; `all` runs every section the file has, in pipeline order."""
    if stage not in CHOICES:
        raise DverlError(f"--stage: must be one of {', '.join(CHOICES)} (got {stage!r})")
    config = load_train_config(config_path)
    if stage != "all":
        require_stage(config, stage, str(config_path))
        return _run_one(stage, config)
    present = [s for s in STAGES if getattr(config, s) is not None]
    if not present:
        require_stage(config, "sft", str(config_path))
    results = [_run_one(s, config) for s in present]
    last = next((r.checkpoint for r in reversed(results) if r.checkpoint is not None), None)
    return StageResult("all", last, {r.stage: r.metrics for r in results}, results)


def main_stage(stage: str, config_path: str | Path, settings: WorkerSettings) -> int:
    """`dverl train --stage`: run the stage(s) and print one line of metrics (and checkpoint) for each."""
    configure_from_environment(settings)  # this process trains: torch sized to its cores
    result = run_stage(stage, config_path)
    for one in result.stages or [result]:
        metrics = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in one.metrics.items()
        )
        print(f"stage {one.stage}: {metrics}" + (f"; checkpoint {one.checkpoint}" if one.checkpoint else ""))
    return 0
