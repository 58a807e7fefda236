"""Data file -> tokenized prompts, once per job, on the coordinator.

Prompts longer than `data.maxPromptTokens` are rejected with a logged reason (never truncated
silently: a cut prompt would change the question). Code tests travel to reward workers as JSON.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from decentralized_verl.core.samples import Prompt
from decentralized_verl.data import load_prompts, prompt_records, render_prompt
from decentralized_verl.data.records import PromptRecord
from decentralized_verl.environments.registry import instructions
from decentralized_verl.errors import DataError
from decentralized_verl.spec import JobSpec

log = logging.getLogger(__name__)


def ground_truth_text(record: PromptRecord) -> str:
    if record.tests is not None:
        return json.dumps({"inputs": list(record.tests.inputs), "outputs": list(record.tests.outputs)})
    return record.ground_truth or ""


def resolve(path: str, base: Path | None) -> Path:
    """Relative data paths resolve against the manifest's folder (`base`), else the cwd."""
    candidate = Path(path)
    if candidate.is_absolute() or base is None:
        return candidate
    return base / candidate


def prepare_prompts(
    spec: JobSpec, tokenizer: Any, path: str, base: Path | None, limit: int | None = None
) -> list[Prompt]:
    data = spec.data
    records = prompt_records(load_prompts(resolve(path, base), format=data.format))
    if limit is not None:
        records = records[:limit]
    few_shot = [m.model_dump() for m in data.few_shot] or None
    system_prompt = data.system_prompt
    if system_prompt is None and data.environment is not None:  # how to use the tool, unless the job says
        system_prompt = instructions(data.environment.name) or None
    prompts: list[Prompt] = []
    rejected = 0
    for record in records:
        text = render_prompt(record, tokenizer, system_prompt, few_shot)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > data.max_prompt_tokens:
            rejected += 1
            log.warning(
                "prompt %s rejected: %d tokens > data.maxPromptTokens %d",
                record.id,
                len(ids),
                data.max_prompt_tokens,
            )
            continue
        episode = data.environment is not None
        prompts.append(Prompt(record.id, 0, tuple(ids), text, ground_truth_text(record), environment=episode))
    if not prompts:
        raise DataError(f"{path}: no usable prompt ({rejected} longer than data.maxPromptTokens)")
    return prompts
