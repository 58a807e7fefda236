"""Sizes a job cannot mean: prompts plus responses longer than the model's context, steps or tokens a
step beyond anything that could run. Each refusal names the field and the number it computed."""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.errors import Problem
from decentralized_verl.planning.locate import model_shape
from decentralized_verl.spec import JobSpec

MAX_TOKENS_PER_STEP = 2**31
"""Prompt and response positions of one step's samples; beyond this no cluster holds one step."""
MAX_STEPS = 10**9


def limit_problems(spec: JobSpec, base_dir: Path | None, *, stated: JobSpec | None = None) -> list[Problem]:
    """`stated`: the spec as the manifest wrote it (`spec` may be one re-validated with every default
    filled in), to tell a tiny model's stated `maxPositions` from its default."""
    problems: list[Problem] = []
    data, training = spec.data, spec.training
    length = data.max_prompt_tokens + data.max_new_tokens
    context, source = _context(spec, base_dir, stated or spec)
    if context and length > context:
        problems.append(
            Problem(
                "spec.data.maxNewTokens",
                f"maxPromptTokens {data.max_prompt_tokens} + maxNewTokens {data.max_new_tokens} = {length} "
                f"positions, beyond the model's context of {context} ({source}); make the two add up to "
                f"<= {context}",
            )
        )
    samples = training.batch_size * spec.algorithm.samples_per_prompt * spec.roles.learner.replicas
    tokens = samples * length
    if tokens > MAX_TOKENS_PER_STEP:
        problems.append(
            Problem(
                "spec.training.batchSize",
                f"{training.batch_size} prompts x {spec.algorithm.samples_per_prompt} samples x "
                f"{spec.roles.learner.replicas} learners x {length} positions = {tokens:,} tokens a step, "
                f"more than {MAX_TOKENS_PER_STEP:,}",
            )
        )
    if training.steps is not None and training.steps > MAX_STEPS:
        problems.append(
            Problem("spec.training.steps", f"{training.steps:,} steps is more than {MAX_STEPS:,}")
        )
    return problems


def _context(spec: JobSpec, base_dir: Path | None, stated: JobSpec) -> tuple[int | None, str]:
    """The model's context length and where it comes from: a tiny model's `maxPositions` when the
    manifest states it (its default is no statement: the test model's rotary positions reach past it),
    else the model's config (`max_position_embeddings`, a GGUF's context length); None when unknown."""
    tiny = spec.model.tiny
    if tiny is not None:
        said = stated.model.tiny is not None and "max_positions" in stated.model.tiny.model_fields_set
        return (tiny.max_positions if said else None), "spec.model.tiny.maxPositions"
    shape = model_shape(spec.model, base_dir).shape
    return (shape.max_positions if shape is not None else None), "max_position_embeddings"
