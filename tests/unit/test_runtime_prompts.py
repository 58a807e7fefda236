"""Prompts are tokenized once; one longer than data.maxPromptTokens is rejected with a reason, not cut."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from decentralized_verl.errors import DataError
from decentralized_verl.models.tokenizer import build_char_tokenizer
from decentralized_verl.orchestration.prompts import prepare_prompts
from decentralized_verl.spec.manifest import parse_spec


def spec_for(train: Path, max_prompt_tokens: int):
    return parse_spec(
        {
            "model": {"tiny": {}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": str(train), "maxPromptTokens": max_prompt_tokens},
            "training": {"batchSize": 8},
        }
    )


def test_long_prompts_are_rejected_with_a_logged_reason(tmp_path: Path, caplog) -> None:
    train = tmp_path / "train.jsonl"
    rows = [
        {"messages": {"role": "user", "content": "1+1="}, "gt_answer": "2"},
        {"messages": {"role": "user", "content": "9" * 200 + "+1="}, "gt_answer": "x"},
        {"messages": {"role": "user", "content": "2+2="}, "gt_answer": "4"},
    ]
    train.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tokenizer = build_char_tokenizer()
    with caplog.at_level(logging.WARNING):
        prompts = prepare_prompts(spec_for(train, 64), tokenizer, str(train), None)
    assert [p.ground_truth for p in prompts] == ["2", "4"]
    assert any("rejected" in r.message and "maxPromptTokens" in r.message for r in caplog.records)
    assert all(len(p.token_ids) <= 64 for p in prompts)
    assert tokenizer.decode(prompts[0].token_ids).count("1+1=") == 1


def test_no_usable_prompt_is_a_data_error(tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text(
        json.dumps({"messages": {"role": "user", "content": "x" * 300}, "gt_answer": "1"}) + "\n"
    )
    with pytest.raises(DataError, match="no usable prompt"):
        prepare_prompts(spec_for(train, 16), build_char_tokenizer(), str(train), None)
