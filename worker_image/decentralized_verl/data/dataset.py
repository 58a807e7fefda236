"""Load a whole data file into normalised records, checking every record before any is used.

A file holds one layout (`kind`): detected from its first record's keys unless forced; a record
that announces another layout is an error (`mixed kinds`), since a half-SFT, half-math file is
almost always two files concatenated by mistake.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decentralized_verl.data.formats import detect_kind, parse_record, unknown_layout_message
from decentralized_verl.data.readers import Where, read_rows, type_name
from decentralized_verl.data.records import (
    KINDS,
    PROMPT_KINDS,
    PreferenceRecord,
    PromptRecord,
    Record,
    SFTRecord,
)
from decentralized_verl.errors import DataError


@dataclass(frozen=True)
class Dataset:
    """The records of one file, in file order; indices are what `PromptSampler` hands out."""

    path: str
    kind: str
    records: tuple[Record, ...]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Record:
        return self.records[index]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def take(self, indices: list[int]) -> list[Record]:
        """The records a sampler batch names."""
        return [self.records[i] for i in indices]


def _record_id(obj: dict[str, Any], where: Where, stem: str, ordinal: int) -> str:
    """The record's own `id` when it has one (string or integer), else `<file stem>-<ordinal>`."""
    if "id" not in obj or obj["id"] is None:
        return f"{stem}-{ordinal}"
    value = obj["id"]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise where.error("id", f"expected a string or an integer (got {type_name(value)})")
    return str(value)


def _partial(detected: str, file_kind: str) -> bool:
    """A record with only `prompt` in a file of another prompt-keyed layout is an incomplete record
    of that layout (report its missing field), not a second layout."""
    return detected == "prompt" and file_kind in ("sft", "preference", "verl")


def load_dataset(path: str | Path, *, format: str | None = None, kind: str | None = None) -> Dataset:
    """Read and check every record of a jsonl / json / parquet file.

    `format` overrides the extension; `kind` forces the layout (see `formats`), otherwise the
    first record's keys choose it. Any problem raises `DataError` naming file, line/row and field.
    """
    if kind is not None and kind not in KINDS:
        raise DataError(f"{path}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    stem = Path(path).stem
    file_kind = kind
    first_where: Where | None = None
    records: list[Record] = []
    seen_ids: dict[str, Where] = {}
    for ordinal, row in enumerate(read_rows(path, format)):
        obj, where = row.value, row.where
        detected = detect_kind(obj)
        if file_kind is None:
            if detected is None:
                raise where.error("", unknown_layout_message(obj))
            file_kind, first_where = detected, where
        # A record of no known layout, or an incomplete one (see `_partial`), is parsed as the
        # file's kind below so the error names its missing field; another full layout is a mix-up.
        elif kind is None and detected not in (None, file_kind) and not _partial(detected, file_kind):
            raise where.error(
                "",
                f"mixed kinds: a {detected} record in a file of {file_kind} records "
                f"(kind set by {first_where})",
            )
        rid = _record_id(obj, where, stem, ordinal)
        if rid in seen_ids:
            raise where.error("id", f"{rid!r} already used at {seen_ids[rid]}")
        seen_ids[rid] = where
        records.append(parse_record(file_kind, obj, where, rid))
    assert file_kind is not None  # read_rows raises on an empty file
    return Dataset(path=str(path), kind=file_kind, records=tuple(records))


def _expect(dataset: Dataset, allowed: tuple[str, ...], purpose: str) -> Dataset:
    if dataset.kind not in allowed:
        raise DataError(
            f"{dataset.path}: holds {dataset.kind} records; {purpose} needs {' or '.join(allowed)} records"
        )
    return dataset


def load_prompts(path: str | Path, *, format: str | None = None, kind: str | None = None) -> Dataset:
    """A file of RL prompts (math, code, prompt-only or veRL): every record is a `PromptRecord`."""
    return _expect(load_dataset(path, format=format, kind=kind), PROMPT_KINDS, "RL training")


def load_sft(path: str | Path, *, format: str | None = None) -> list[SFTRecord]:
    """Supervised pairs (seed-001 prompt/completion)."""
    dataset = _expect(load_dataset(path, format=format), ("sft",), "supervised fine-tuning")
    return [r for r in dataset.records if isinstance(r, SFTRecord)]


def load_preferences(path: str | Path, *, format: str | None = None) -> list[PreferenceRecord]:
    """Preference pairs (seed-001 prompt/chosen/rejected)."""
    dataset = _expect(load_dataset(path, format=format), ("preference",), "reward-model training")
    return [r for r in dataset.records if isinstance(r, PreferenceRecord)]


def prompt_records(dataset: Dataset) -> list[PromptRecord]:
    """The records typed as prompts (after `load_prompts` they all are)."""
    return [r for r in _expect(dataset, PROMPT_KINDS, "RL training").records if isinstance(r, PromptRecord)]
