"""Every data layout's happy path, in every file format, through the public loaders.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from decentralized_verl.data import (
    ChatMessage,
    CodeTests,
    PreferenceRecord,
    PromptRecord,
    SFTRecord,
    detect_kind,
    load_dataset,
    load_preferences,
    load_prompts,
    load_sft,
)
from decentralized_verl.errors import DataError

MATH = [
    {"messages": {"role": "user", "content": "What is 37 + 45?"}, "gt_answer": "82"},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2 * 3?"},
        ],
        "gt_answer": 6,
    },
]
CODE = [
    {
        "messages": {"role": "user", "content": "Print a + b."},
        "test_cases": {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]},
    }
]
SFT = [{"prompt": "Question: 1+1?", "completion": "2"}, {"prompt": "Question: 2+2?", "completion": "4"}]
PREFERENCE = [{"prompt": "Q", "chosen": "good", "rejected": "bad"}]
PROMPTS = [
    {"prompt": "What is 1+1?"},
    {"prompt": "What is 2+2?", "answer": "4"},
    {"prompt": "x", "ground_truth": 3},
]
VERL = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Natalia sold 48 clips..."}],
        "ability": "math",
        "reward_model": {"ground_truth": "72", "style": "rule"},
        "extra_info": {"index": 0, "split": "train"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Weng earns $12..."}],
        "ability": "math",
        "reward_model": {"ground_truth": "10", "style": "rule"},
        "extra_info": {"index": 1, "split": "train"},
    },
]


def write(path: Path, rows: list[dict], fmt: str | None = None) -> Path:
    fmt = fmt or path.suffix.lstrip(".")
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("ext", ["jsonl", "json", "parquet"])
def test_math_in_every_format(tmp_path: Path, ext: str) -> None:
    rows = MATH if ext != "parquet" else [MATH[0], {**MATH[0], "gt_answer": "7"}]  # parquet: one schema
    data = load_prompts(write(tmp_path / f"train.{ext}", rows))
    assert data.kind == "math" and len(data) == 2
    first = data[0]
    assert isinstance(first, PromptRecord)
    assert first.messages == (ChatMessage("user", "What is 37 + 45?"),)
    assert first.ground_truth == "82" and first.tests is None and first.kind == "math"
    assert first.id == "train-0" and data[1].id == "train-1"


def test_math_list_of_messages_and_numeric_answer(tmp_path: Path) -> None:
    data = load_prompts(write(tmp_path / "m.jsonl", MATH))
    second = data[1]
    assert second.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "What is 2 * 3?"))
    assert second.ground_truth == "6"


@pytest.mark.parametrize("ext", ["jsonl", "json", "parquet"])
def test_code_in_every_format(tmp_path: Path, ext: str) -> None:
    data = load_prompts(write(tmp_path / f"code.{ext}", CODE))
    (record,) = data.records
    assert data.kind == "code"
    assert record.tests == CodeTests(inputs=("1 2\n", "3 4\n"), outputs=("3\n", "7\n"))
    assert len(record.tests) == 2 and record.ground_truth is None


def test_code_tests_as_json_string(tmp_path: Path) -> None:
    row = {**CODE[0], "test_cases": json.dumps(CODE[0]["test_cases"])}
    (record,) = load_prompts(write(tmp_path / "c.jsonl", [row])).records
    assert record.tests.outputs == ("3\n", "7\n")


@pytest.mark.parametrize("ext", ["jsonl", "json", "parquet"])
def test_sft_in_every_format(tmp_path: Path, ext: str) -> None:
    records = load_sft(write(tmp_path / f"sft.{ext}", SFT))
    assert records == [SFTRecord("sft-0", "Question: 1+1?", "2"), SFTRecord("sft-1", "Question: 2+2?", "4")]


@pytest.mark.parametrize("ext", ["jsonl", "json", "parquet"])
def test_preference_in_every_format(tmp_path: Path, ext: str) -> None:
    records = load_preferences(write(tmp_path / f"p.{ext}", PREFERENCE))
    assert records == [PreferenceRecord("p-0", "Q", "good", "bad")]


def test_prompt_only_with_optional_answers(tmp_path: Path) -> None:
    data = load_prompts(write(tmp_path / "prompts.json", PROMPTS))
    assert data.kind == "prompt"
    assert [r.ground_truth for r in data] == [None, "4", "3"]
    assert data[0].messages == (ChatMessage("user", "What is 1+1?"),)


@pytest.mark.parametrize("ext", ["parquet", "jsonl"])
def test_verl_rows(tmp_path: Path, ext: str) -> None:
    data = load_prompts(write(tmp_path / f"gsm8k.{ext}", VERL))
    assert data.kind == "verl" and len(data) == 2
    record = data[1]
    assert record.messages == (ChatMessage("user", "Weng earns $12..."),)
    assert record.ground_truth == "10" and record.data_source == "openai/gsm8k"
    assert record.reward_style == "rule" and record.extra_info == {"index": 1, "split": "train"}


def test_verl_parquet_without_optional_columns(tmp_path: Path) -> None:
    rows = [
        {
            "data_source": "d",
            "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"ground_truth": "1"},
        }
    ]
    (record,) = load_prompts(write(tmp_path / "v.parquet", rows)).records
    assert record.reward_style is None and record.extra_info == {}


def test_json_data_wrapper(tmp_path: Path) -> None:
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"data": SFT, "version": 1}))
    assert [r.completion for r in load_sft(path)] == ["2", "4"]


def test_blank_lines_in_jsonl_are_skipped_and_lines_still_count(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text("\n" + json.dumps(SFT[0]) + "\n   \n\n" + json.dumps(SFT[1]) + "\n\n")
    assert len(load_sft(path)) == 2
    path.write_text("\n" + json.dumps(SFT[0]) + "\n\n" + json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(DataError, match=r"b\.jsonl:4: "):
        load_dataset(path)


def test_explicit_format_overrides_extension(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text(json.dumps(SFT[0]) + "\n")
    assert load_dataset(path, format="jsonl").kind == "sft"
    assert load_dataset(write(tmp_path / "x.ndjson", SFT, "jsonl")).kind == "sft"


def test_forced_kind_reads_prompts_out_of_an_sft_file(tmp_path: Path) -> None:
    data = load_prompts(write(tmp_path / "sft.jsonl", SFT), kind="prompt")
    assert data.kind == "prompt" and data[0].messages[0].content == "Question: 1+1?"


def test_explicit_ids_are_kept(tmp_path: Path) -> None:
    rows = [{**SFT[0], "id": "a"}, {**SFT[1], "id": 7}]
    assert [r.id for r in load_sft(write(tmp_path / "s.jsonl", rows))] == ["a", "7"]


def test_records_are_frozen(tmp_path: Path) -> None:
    record = load_prompts(write(tmp_path / "m.jsonl", MATH))[0]
    with pytest.raises(AttributeError):
        record.ground_truth = "1"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("row", "kind"),
    [
        (MATH[0], "math"),
        (CODE[0], "code"),
        (SFT[0], "sft"),
        (PREFERENCE[0], "preference"),
        (PROMPTS[0], "prompt"),
        (VERL[0], "verl"),
        ({"prompt": [{"role": "user", "content": "q"}]}, "verl"),
        ({"messages": []}, None),
        ({"question": "q"}, None),
    ],
)
def test_detect_kind(row: dict, kind: str | None) -> None:
    assert detect_kind(row) == kind


def test_dataset_take_follows_indices(tmp_path: Path) -> None:
    data = load_dataset(write(tmp_path / "s.jsonl", SFT))
    assert [r.completion for r in data.take([1, 0, 1])] == ["4", "2", "4"]
