"""Malformed data: every error is a DataError naming the file, the line / index / row and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from decentralized_verl.data import load_dataset, load_preferences, load_prompts, load_sft
from decentralized_verl.errors import DataError, DverlError

DROP = object()  # marks a key to remove
GOOD_MATH = {"messages": {"role": "user", "content": "What is 1 + 1?"}, "gt_answer": "2"}
GOOD_CODE = {
    "messages": {"role": "user", "content": "Print a + b."},
    "test_cases": {"inputs": ["1 2\n"], "outputs": ["3\n"]},
}
GOOD_VERL = {
    "data_source": "gsm8k",
    "prompt": [{"role": "user", "content": "q"}],
    "reward_model": {"ground_truth": "1", "style": "rule"},
}


def jsonl(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def math_with(**changes: object) -> dict:
    row = dict(GOOD_MATH)
    row.update(changes)
    return {k: v for k, v in row.items() if v is not DROP}


def code_tests(**changes: object) -> dict:
    tests = dict(GOOD_CODE["test_cases"])
    tests.update(changes)
    return {**GOOD_CODE, "test_cases": {k: v for k, v in tests.items() if v is not DROP}}


def verl_with(**changes: object) -> dict:
    row = dict(GOOD_VERL)
    row.update(changes)
    return {k: v for k, v in row.items() if v is not DROP}


# (jsonl text, expected message fragment after "bad.jsonl:")
JSONL_CASES: list[tuple[str, str]] = [
    # math
    (jsonl(GOOD_MATH, math_with(gt_answer=DROP)), "2: gt_answer: missing"),
    (
        jsonl(GOOD_MATH, GOOD_MATH, math_with(gt_answer=None)),
        "3: gt_answer: expected a string or a number (got null)",
    ),
    (jsonl(math_with(gt_answer="  ")), "1: gt_answer: must not be empty"),
    (jsonl(math_with(gt_answer=[1])), "1: gt_answer: expected a string or a number (got list)"),
    (jsonl(math_with(gt_answer=True)), "1: gt_answer: expected a string or a number (got bool)"),
    (jsonl(GOOD_MATH, math_with(messages=DROP)), "2: messages: missing"),
    (
        jsonl(math_with(messages="hi")),
        "1: messages: expected a message object or a list of messages (got string)",
    ),
    (jsonl(math_with(messages=[])), "1: messages: must not be empty"),
    (jsonl(math_with(messages={"content": "x"})), "1: messages.role: missing"),
    (jsonl(math_with(messages={"role": "bot", "content": "x"})), "1: messages.role: expected one of"),
    (jsonl(math_with(messages={"role": "user"})), "1: messages.content: missing"),
    (
        jsonl(math_with(messages={"role": "user", "content": 5})),
        "1: messages.content: expected a string (got int)",
    ),
    (
        jsonl(math_with(messages=[{"role": "user", "content": "a"}, "b"])),
        "1: messages[1]: expected an object with role and content (got string)",
    ),
    (
        jsonl(math_with(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": ""}])),
        "1: messages[1].content: must not be empty",
    ),
    (
        jsonl(math_with(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])),
        "1: messages: the last message must be from the user (got assistant)",
    ),
    (jsonl(math_with(data_source=3)), "1: data_source: expected a string (got int)"),
    # code
    (jsonl(code_tests(outputs=5)), "1: test_cases.outputs: expected a list of strings (got int)"),
    (jsonl(code_tests(inputs=DROP)), "1: test_cases.inputs: missing"),
    (jsonl(code_tests(outputs=DROP)), "1: test_cases.outputs: missing"),
    (jsonl(code_tests(outputs=["3\n", 4])), "1: test_cases.outputs[1]: expected a string (got int)"),
    (jsonl(code_tests(inputs=[None])), "1: test_cases.inputs[0]: expected a string (got null)"),
    (
        jsonl(code_tests(inputs=["1\n", "2\n"])),
        "1: test_cases: inputs and outputs differ in length (2 inputs, 1 outputs)",
    ),
    (jsonl(code_tests(inputs=[], outputs=[])), "1: test_cases.inputs: must not be empty"),
    (
        jsonl({**GOOD_CODE, "test_cases": [["1"], ["1"]]}),
        "1: test_cases: expected an object with inputs and outputs (got list)",
    ),
    (jsonl({**GOOD_CODE, "test_cases": "{not json"}), "1: test_cases: a string that is not valid JSON"),
    (
        jsonl(GOOD_CODE, GOOD_MATH),
        "2: mixed kinds: a math record in a file of code records (kind set by bad.jsonl:1)",
    ),
    # sft / preference / prompt-only
    (
        jsonl({"prompt": "p", "completion": "c"}, {"prompt": "p", "completion": 1}),
        "2: completion: expected a string (got int)",
    ),
    (jsonl({"prompt": "p", "completion": ""}), "1: completion: must not be empty"),
    (jsonl({"prompt": "", "completion": "c"}), "1: prompt: must not be empty"),
    (
        jsonl({"prompt": "p", "completion": "c"}, {"completion": "c"}),
        "2: prompt: missing",
    ),
    (jsonl({"prompt": "p", "chosen": "a"}), "1: rejected: missing"),
    (jsonl({"prompt": "p", "rejected": "a"}), "1: chosen: missing"),
    (jsonl({"prompt": "p", "chosen": "a", "rejected": "a"}), "1: rejected: identical to chosen"),
    (jsonl({"prompt": "p", "chosen": "a", "rejected": ["b"]}), "1: rejected: expected a string (got list)"),
    (
        jsonl({"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "completion": "c"}),
        "2: mixed kinds: a sft record",
    ),
    (jsonl({"prompt": 3}), "1: prompt: expected a string (got int)"),
    (
        jsonl({"prompt": "p", "answer": "1", "ground_truth": "1"}),
        "1: answer: both answer and ground_truth are given",
    ),
    (jsonl({"prompt": "p", "answer": {}}), "1: answer: expected a string or a number (got object)"),
    (jsonl({"prompt": "p", "ground_truth": float("nan")}), "1: ground_truth: expected a finite number"),
    (
        jsonl({"prompt": "p"}, {"prompt": "p", "completion": "c"}),
        "2: mixed kinds: a sft record in a file of prompt",
    ),
    (jsonl(GOOD_MATH, {"prompt": "p"}), "2: mixed kinds: a prompt record in a file of math records"),
    (jsonl(GOOD_VERL, {"prompt": "p"}), "2: prompt: expected a list of chat messages (got string)"),
    # veRL
    (
        jsonl(verl_with(reward_model=DROP, prompt=[{"role": "user", "content": "q"}])),
        "1: reward_model: missing",
    ),
    (
        jsonl(verl_with(reward_model="72")),
        "1: reward_model: expected an object with ground_truth and style (got string)",
    ),
    (jsonl(verl_with(reward_model={"style": "rule"})), "1: reward_model.ground_truth: missing"),
    (
        jsonl(verl_with(reward_model={"ground_truth": "1", "style": 2})),
        "1: reward_model.style: expected a string (got int)",
    ),
    (jsonl(verl_with(data_source=DROP)), "1: data_source: missing"),
    (jsonl(verl_with(prompt="plain text")), "1: prompt: expected a list of chat messages (got string)"),
    (
        jsonl(verl_with(prompt={"role": "user", "content": "q"})),
        "1: prompt: expected a list of chat messages (got object)",
    ),
    (
        jsonl(verl_with(prompt=[{"role": "user", "content": 1}])),
        "1: prompt[0].content: expected a string (got int)",
    ),
    (jsonl(verl_with(extra_info=[1])), "1: extra_info: expected an object (got list)"),
    # lines and ids
    (
        jsonl(GOOD_MATH, "{not json"),
        "2: not valid JSON (Expecting property name enclosed in double quotes at column 2)",
    ),
    (jsonl(GOOD_MATH, '"just a string"'), "2: expected a JSON object (got string)"),
    (jsonl(GOOD_MATH, "[1, 2]"), "2: expected a JSON object (got list)"),
    (jsonl(GOOD_MATH, "", "", GOOD_MATH, "null"), "5: expected a JSON object (got null)"),
    (
        jsonl({"question": "q", "answer": "a"}),
        "1: unknown record format: cannot tell it from its keys (answer, question)",
    ),
    (jsonl({"messages": {"role": "user", "content": "q"}}), "1: unknown record format"),
    (jsonl({**GOOD_MATH, "id": "x"}, {**GOOD_MATH, "id": "x"}), "2: id: 'x' already used at bad.jsonl:1"),
    (jsonl({**GOOD_MATH, "id": 1.5}), "1: id: expected a string or an integer (got float)"),
]


@pytest.mark.parametrize(("text", "expected"), JSONL_CASES, ids=[e for _, e in JSONL_CASES])
def test_malformed_jsonl(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(DataError) as info:
        load_dataset(path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path}/bad.jsonl:"), message
    assert expected.replace("bad.jsonl", f"{tmp_path}/bad.jsonl") in message, message
    assert isinstance(info.value, DverlError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty file (no records)"),
        ("\n  \n\n", "empty file (no records)"),
    ],
)
def test_empty_jsonl(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text(text)
    with pytest.raises(DataError, match="^" + re.escape(f"{tmp_path}/e.jsonl: {expected}")):
        load_dataset(path)


def test_jsonl_bad_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    path.write_bytes(json.dumps(GOOD_MATH).encode() + b'\n{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=r"u\.jsonl:2: not valid UTF-8"):
        load_dataset(path)


JSON_CASES: list[tuple[str, str]] = [
    ("", "bad.json: empty file (no records)"),
    ("[]", "bad.json: empty file (no records)"),
    ('{"data": []}', "bad.json: empty file (no records)"),
    ('"text"', 'bad.json: expected a list of objects or {"data": [...]} at the top level (got string)'),
    (
        '{"items": []}',
        'bad.json: expected a list of objects or {"data": [...]} at the top level (got object)',
    ),
    ("42", "at the top level (got int)"),
    ('{"data": {"prompt": "p"}}', "bad.json: data: expected a list of objects (got object)"),
    ('[{"prompt": "p", "completion": "c"},\n  oops]', "bad.json:2: not valid JSON"),
    ('[{"prompt": "p", "completion": "c"}, 3]', "bad.json:[1]: expected a JSON object (got int)"),
    (
        '[{"prompt": "p", "completion": "c"}, {"prompt": "p"}]',
        "bad.json:[1]: completion: missing",
    ),
    (
        '{"data": [{"prompt": "p", "completion": "c"}, {"prompt": "p", "completion": null}]}',
        "bad.json:data[1]: completion: expected a string (got null)",
    ),
    (
        '[{"prompt": "p", "chosen": "x", "rejected": "y"}, {"prompt": "p", "chosen": 1, "rejected": "y"}]',
        "bad.json:[1]: chosen: expected a string (got int)",
    ),
]


@pytest.mark.parametrize(("text", "expected"), JSON_CASES, ids=[e for _, e in JSON_CASES])
def test_malformed_json(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(DataError) as info:
        load_dataset(path)
    assert expected in str(info.value) and str(info.value).startswith(str(tmp_path)), str(info.value)


def test_malformed_parquet_names_the_row(tmp_path: Path) -> None:
    rows = [
        GOOD_VERL,
        {**GOOD_VERL, "reward_model": {"ground_truth": "2", "style": "rule"}},
        {**GOOD_VERL, "reward_model": {"ground_truth": None, "style": "rule"}},
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(
        DataError,
        match=r"train\.parquet:row 2: reward_model\.ground_truth: expected a string or a number \(got null\)",
    ):
        load_prompts(path)


def test_parquet_missing_column_is_a_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "sft.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "p", "completion": "c"}, {"prompt": "q", "completion": None}]), path
    )
    with pytest.raises(DataError, match=r"sft\.parquet:row 1: completion: expected a string \(got null\)"):
        load_sft(path)


def test_parquet_empty_and_corrupt(tmp_path: Path) -> None:
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    with pytest.raises(DataError, match=r"empty\.parquet: empty file \(no records\)"):
        load_dataset(empty)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"corrupt\.parquet: not a readable parquet file"):
        load_dataset(corrupt)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.jsonl: file not found"):
        load_dataset(tmp_path / "nope.jsonl")
    folder = tmp_path / "dir.json"
    folder.mkdir()
    with pytest.raises(DataError, match=r"dir\.json: not a regular file"):
        load_dataset(folder)


def test_unknown_format_and_kind(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("prompt,completion\n")
    with pytest.raises(
        DataError, match=r"data\.csv: unknown format: cannot tell it from the extension '\.csv'"
    ):
        load_dataset(path)
    with pytest.raises(
        DataError, match=r"data\.csv: unknown format 'csv'; expected one of jsonl, json, parquet"
    ):
        load_dataset(path, format="csv")
    with pytest.raises(DataError, match=r"data\.csv: unknown kind 'chat'"):
        load_dataset(path, format="jsonl", kind="chat")


def test_forced_kind_reports_the_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text(jsonl({"prompt": "p", "completion": "c"}))
    with pytest.raises(DataError, match=r"f\.jsonl:1: messages: missing"):
        load_dataset(path, kind="math")


def test_loaders_reject_the_wrong_kind(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(jsonl({"prompt": "p", "completion": "c"}))
    with pytest.raises(
        DataError, match=r"s\.jsonl: holds sft records; RL training needs math or code or prompt or verl"
    ):
        load_prompts(path)
    with pytest.raises(
        DataError, match=r"s\.jsonl: holds sft records; reward-model training needs preference"
    ):
        load_preferences(path)
    math = tmp_path / "m.jsonl"
    math.write_text(jsonl(GOOD_MATH))
    with pytest.raises(DataError, match=r"m\.jsonl: holds math records; supervised fine-tuning needs sft"):
        load_sft(math)
