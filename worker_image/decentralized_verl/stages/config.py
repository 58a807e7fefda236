"""The `dverl train` config file: the model plus one section per stage, validated at the boundary.

Relative paths in the file are resolved against the file's folder, so an example config runs as
shipped from any working directory. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, PrivateAttr, ValidationError, model_validator

from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.spec import CrossFieldProblems, ModelSpec, SpecModel
from decentralized_verl.spec.manifest import load_yaml_text, problems_from_validation_error, read_yaml_file

STAGES = ("sft", "reward", "rlhf")


class TrainingStage(SpecModel):
    """What SFT and reward training share: data, how the prompt is rendered, the optimiser, the output."""

    train_file: str = Field(min_length=1, description="jsonl, json or parquet records (seed-001 format)")
    eval_file: str | None = None
    format: Literal["plain", "chat"] = Field(
        default="chat", description="plain: prompt text as is; chat: a user turn through the chat template"
    )
    epochs: PositiveInt = 1
    max_steps: PositiveInt | None = Field(default=None, description="Stop after this many steps")
    batch_size: PositiveInt = 8
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 1e-4
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    max_length: PositiveInt = 512
    output_dir: str = Field(min_length=1)
    save_every: NonNegativeInt = Field(
        default=0, description="Also checkpoint every N steps (0: only at the end)"
    )
    seed: NonNegativeInt = 0


class SftStage(TrainingStage):
    """Next-token loss on completion tokens only; the prompt conditions but is not learned."""


class RewardStage(TrainingStage):
    """Bradley-Terry training of a one-output sequence classifier on preference pairs."""

    init_from: Literal["auto", "sft", "base"] = Field(
        default="auto", description="auto: the SFT output if one exists, else the base model"
    )


class RlhfStage(SpecModel):
    job: str = Field(min_length=1, description="Path of an RLHFJob manifest")


class TrainConfig(SpecModel):
    model: ModelSpec
    sft: SftStage | None = None
    reward: RewardStage | None = None
    rlhf: RlhfStage | None = None

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> TrainConfig:
        problems: list[Problem] = []
        if self.reward is not None and self.reward.init_from == "sft" and self.sft is None:
            problems.append(Problem("reward.initFrom", "'sft' needs an sft section (its outputDir)"))
        if problems:
            raise CrossFieldProblems(problems)
        return self

    def resolve(self, path: str) -> Path:
        """A path from the file, relative to the file's folder."""
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else self._base_dir / candidate


def parse_train_config(
    document: Any, *, source: str | None = None, base_dir: Path | None = None
) -> TrainConfig:
    if not isinstance(document, dict):
        kind = type(document).__name__
        raise ManifestError([Problem("(root)", f"expected a mapping (a train config), got {kind}")], source)
    try:
        config = TrainConfig.model_validate(document)
    except ValidationError as exc:
        raise ManifestError(problems_from_validation_error(exc), source) from None
    config._base_dir = base_dir or Path.cwd()
    return config


def load_train_config(path: str | Path) -> TrainConfig:
    file = Path(path)
    return parse_train_config(
        load_yaml_text(read_yaml_file(file), str(file)), source=str(file), base_dir=file.parent.resolve()
    )


def require_stage(config: TrainConfig, stage: str, source: str | None = None) -> Any:
    """The stage's section, or an error naming it when the file has none."""
    section = getattr(config, stage)
    if section is None:
        raise ManifestError([Problem(stage, f"section required to run --stage {stage}")], source)
    return section


def stages_summary(document: Any, path: Path) -> str:
    """`dverl validate`'s line for a stages config (ManifestError naming the field when it is invalid)."""
    config = parse_train_config(document, source=str(path), base_dir=path.parent.resolve())
    named = [stage for stage in ("sft", "reward", "rlhf") if getattr(config, stage, None) is not None]
    stages = ", ".join(named) or "none"
    return f"stages config {path}: valid — stages {stages} (run: dverl train --stage all --config {path})"
