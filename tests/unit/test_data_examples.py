"""The shipped examples/data: current with its generator, readable by the loaders, answers right
(checked by independent arithmetic and by running the reference programs as real subprocesses).

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from decentralized_verl.data import load_preferences, load_prompts, load_sft
from tests.support.paths import ROOT
from tests.support.repo_scripts import load_script

DATA = ROOT / "examples" / "data"
QUESTION = re.compile(r"^What is (\d+) ([+*]) (\d+)\?$")


def test_checked_in_files_are_what_the_script_writes(tmp_path: Path) -> None:
    written = load_script().generate(tmp_path, seed=0)
    relative = sorted(str(p.relative_to(tmp_path)) for p in written)
    shipped = sorted(
        str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"
    )
    assert relative == shipped
    for rel in relative:
        assert (tmp_path / rel).read_bytes() == (DATA / rel).read_bytes(), (
            f"{rel}: rerun scripts/make_example_data.py"
        )
    total = sum((DATA / rel).stat().st_size for rel in relative)
    assert total < 2 * 1024 * 1024


def test_another_seed_gives_other_data(tmp_path: Path) -> None:
    load_script().generate(tmp_path, seed=1)
    assert (tmp_path / "arithmetic/train.jsonl").read_bytes() != (
        DATA / "arithmetic/train.jsonl"
    ).read_bytes()


def _problem(record) -> tuple[str, int, int]:
    match = QUESTION.match(record.messages[0].content)
    assert match, record.messages
    a, op, b = match.groups()
    return op, int(a), int(b)


def test_arithmetic_answers_are_right_and_eval_is_held_out() -> None:
    train, evals = load_prompts(DATA / "arithmetic/train.jsonl"), load_prompts(DATA / "arithmetic/eval.jsonl")
    assert train.kind == evals.kind == "math"
    assert 2000 <= len(train) <= 5000 and 200 <= len(evals) <= 500
    seen: dict[str, set] = {"train": set(), "eval": set()}
    for split, data in (("train", train), ("eval", evals)):
        for record in data:
            op, a, b = _problem(record)
            assert record.ground_truth == str(a + b if op == "+" else a * b)
            seen[split].add((op, min(a, b), max(a, b)))
    assert len(seen["train"]) == len(train) and len(seen["eval"]) == len(evals)  # no repeats
    assert not seen["train"] & seen["eval"]  # not even with the operands swapped
    two_digit = [p for p in seen["train"] if p[0] == "+" and p[1] >= 10]
    assert len(two_digit) > 0.8 * len(train)
    assert any(p[0] == "*" for p in seen["eval"]) and any(p[0] == "+" and p[2] <= 20 for p in seen["eval"])


def test_toy_task() -> None:
    train, evals = load_prompts(DATA / "toy/train.jsonl"), load_prompts(DATA / "toy/eval.jsonl")
    assert len(train) == 55 and [r.messages for r in train] == [r.messages for r in evals]
    for record in train:
        a, b = re.fullmatch(r"(\d)\+(\d)=", record.messages[0].content).groups()
        assert record.ground_truth == str(int(a) + int(b)) and len(record.ground_truth) == 1
    sft = load_sft(DATA / "toy/sft.json")
    assert [s.prompt for s in sft] == [r.messages[0].content for r in train]
    assert all(s.completion == f"\\boxed{{{r.ground_truth}}}" for s, r in zip(sft, train, strict=True))


@pytest.mark.parametrize("split", ["train", "eval"])
def test_sft_and_preference_sets(split: str) -> None:
    sft = load_sft(DATA / f"sft/sft_{split}.json")
    pairs = load_preferences(DATA / f"sft/preference_{split}.json")
    assert len(sft) >= 50 and len(pairs) >= 50
    for record in sft:
        match = QUESTION.match(record.prompt)
        a, op, b = match.groups()
        answer = int(a) + int(b) if op == "+" else int(a) * int(b)
        assert record.completion.endswith(f"\\boxed{{{answer}}}.")
    for pair in pairs:
        a, op, b = QUESTION.match(pair.prompt).groups()
        answer = int(a) + int(b) if op == "+" else int(a) * int(b)
        assert pair.chosen.endswith(f"\\boxed{{{answer}}}.") and f"\\boxed{{{answer}}}" not in pair.rejected


def test_prompt_only_set() -> None:
    prompts = load_prompts(DATA / "sft/prompts.json")
    assert prompts.kind == "prompt" and len(prompts) >= 100
    assert all(r.ground_truth is not None for r in prompts)
