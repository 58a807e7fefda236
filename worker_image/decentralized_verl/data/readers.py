"""Raw rows out of jsonl / json / parquet files, each tagged with where it came from.

This layer knows files, not data set layouts: it yields plain dicts and a `Where` that later
error messages use, so a person reading `train.jsonl:17: gt_answer: missing` can open the line.
pyarrow is imported only when a parquet file is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decentralized_verl.errors import DataError

FORMATS: tuple[str, ...] = ("jsonl", "json", "parquet")
EXTENSIONS: dict[str, str] = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class Where:
    """A record's place in its file: `train.jsonl:17`, `train.json:[3]`, `train.json:data[3]`,
    `train.parquet:row 3`. Lines are 1-based (as editors count), list indices and rows 0-based."""

    path: str
    line: int | None = None
    index: int | None = None
    container: str = ""
    row: int | None = None

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.path}:{self.line}"
        if self.index is not None:
            return f"{self.path}:{self.container}[{self.index}]"
        if self.row is not None:
            return f"{self.path}:row {self.row}"
        return self.path

    def error(self, field: str, message: str) -> DataError:
        """The one error type for bad data, naming place and field."""
        return DataError(f"{self}: {field}: {message}" if field else f"{self}: {message}")


@dataclass(frozen=True)
class RawRow:
    where: Where
    value: Any


def type_name(value: Any) -> str:
    """JSON-ish names for what was found, so messages read `(got int)` / `(got null)`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def resolve_format(path: str | Path, format: str | None = None) -> str:
    """The explicit `format` if given (checked), else the one the file's extension implies."""
    if format is not None:
        if format not in FORMATS:
            raise DataError(f"{path}: unknown format {format!r}; expected one of {', '.join(FORMATS)}")
        return format
    suffix = Path(path).suffix.lower()
    if suffix in EXTENSIONS:
        return EXTENSIONS[suffix]
    raise DataError(
        f"{path}: unknown format: cannot tell it from the extension {suffix or '(none)'!r}; "
        f"name the file .jsonl, .json or .parquet or set format to one of {', '.join(FORMATS)}"
    )


def _check_file(path: Path) -> None:
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")


def _read_jsonl(path: Path) -> Iterator[RawRow]:
    raw = path.read_bytes()
    any_record = False
    for number, line_bytes in enumerate(raw.split(b"\n"), start=1):
        where = Where(str(path), line=number)
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise where.error("", f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        if not line.strip():
            continue  # blank lines (and a trailing newline) are allowed
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise where.error("", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(value, dict):
            raise where.error("", f"expected a JSON object (got {type_name(value)})")
        any_record = True
        yield RawRow(where, value)
    if not any_record:
        raise DataError(f"{path}: empty file (no records)")


def _read_json(path: Path) -> Iterator[RawRow]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise DataError(f"{path}: empty file (no records)")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    container = ""
    if isinstance(document, dict) and "data" in document:
        document, container = document["data"], "data"
        if not isinstance(document, list):
            raise DataError(f"{path}: data: expected a list of objects (got {type_name(document)})")
    elif not isinstance(document, list):
        raise DataError(
            f'{path}: expected a list of objects or {{"data": [...]}} at the top level '
            f"(got {type_name(document)})"
        )
    if not document:
        raise DataError(f"{path}: empty file (no records)")
    for index, value in enumerate(document):
        where = Where(str(path), index=index, container=container)
        if not isinstance(value, dict):
            raise where.error("", f"expected a JSON object (got {type_name(value)})")
        yield RawRow(where, value)


def _read_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow as pa  # noqa: PLC0415 light: pyarrow, for parquet files only (`dverl run` reads data with this module)
    import pyarrow.parquet as pq  # noqa: PLC0415 light: pyarrow, for parquet files only (`dverl run` reads data with this module)

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    if table.num_rows == 0:
        raise DataError(f"{path}: empty file (no records)")
    for row, value in enumerate(table.to_pylist()):
        yield RawRow(Where(str(path), row=row), value)


def read_rows(path: str | Path, format: str | None = None) -> Iterator[RawRow]:
    """Every record of the file as a dict with its place; errors are `DataError`s naming the place.

    Raises before yielding anything for a missing file or an unknown format; the generator
    raises at the first bad line otherwise.
    """
    path = Path(path)
    fmt = resolve_format(path, format)
    _check_file(path)
    reader = {"jsonl": _read_jsonl, "json": _read_json, "parquet": _read_parquet}[fmt]
    return reader(path)
