"""Find a model spec's shape without loading weights: `tiny` from its fields, `path` from the folder's
config.json (or its GGUF file's metadata), `package` from the GGUF file the package ships, else the
known-shapes table by name. With no folder to read from (the operator: `base_dir=None`) only `tiny` and
the table are used. A shape that cannot be found is reported, never guessed."""

from __future__ import annotations

import importlib.metadata
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decentralized_verl.planning.shapes import (
    ModelShape,
    ShapeError,
    known_shape,
    shape_from_config,
    tiny_shape,
)
from decentralized_verl.spec import ModelSpec


@dataclass(frozen=True)
class ShapeLookup:
    shape: ModelShape | None
    why_not: str = ""
    """When `shape` is None: why it could not be found, in words."""


def model_shape(model: ModelSpec, base_dir: Path | None) -> ShapeLookup:
    if model.tiny is not None:
        t = model.tiny
        return ShapeLookup(
            tiny_shape(t.hidden_size, t.num_layers, t.num_heads, t.intermediate_size, t.max_positions)
        )
    name = model.path or model.package or ""
    try:
        if base_dir is not None:
            found = _from_files(model, base_dir)
            if found is not None:
                return ShapeLookup(found)
    except ShapeError as exc:
        return ShapeLookup(None, f"{name}: {exc}")
    table = known_shape(name)
    if table is not None:
        return ShapeLookup(table)
    where = "its config.json cannot be read here" if base_dir is None else "no config.json found"
    return ShapeLookup(None, f"{name!r} is not a known model and {where}")


def _from_files(model: ModelSpec, base_dir: Path) -> ModelShape | None:
    if model.path:
        folder = Path(model.path).expanduser()
        candidates = [folder] if folder.is_absolute() else [base_dir / folder, folder]
        for candidate in candidates:
            config = candidate / "config.json"
            if config.is_file() and not model.gguf_file:
                return shape_from_config(_read_json(config), f"{config}")
            ggufs = sorted(candidate.glob("*.gguf")) if candidate.is_dir() else []
            chosen = [g for g in ggufs if g.name == model.gguf_file] if model.gguf_file else ggufs[:1]
            if chosen:
                return gguf_shape(chosen[0])
        return None
    if model.package:
        gguf = _package_gguf(model.package, model.gguf_file)
        return gguf_shape(gguf) if gguf is not None else None
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShapeError(f"cannot read {path}: {exc}") from None
    if not isinstance(loaded, dict):
        raise ShapeError(f"{path} is not a JSON object")
    return loaded


def _package_gguf(package: str, gguf_file: str | None) -> Path | None:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [Path(str(dist.locate_file(f))) for f in (dist.files or []) if str(f).endswith(".gguf")]
    if gguf_file:
        files = [f for f in files if f.name == gguf_file]
    return files[0] if files and files[0].is_file() else None


def gguf_shape(path: Path) -> ModelShape:
    """The shape in a GGUF file's metadata, read from its header (nothing is dequantised)."""
    try:
        meta, tensors = read_gguf_header(path)
    except (OSError, ValueError, struct.error) as exc:
        raise ShapeError(f"cannot read GGUF metadata of {path}: {exc}") from None
    arch = meta.get("general.architecture")

    def value(key: str) -> Any:
        return meta.get(f"{arch}.{key}")

    config = {
        "model_type": arch,
        "hidden_size": value("embedding_length"),
        "num_hidden_layers": value("block_count"),
        "num_attention_heads": value("attention.head_count"),
        "num_key_value_heads": value("attention.head_count_kv"),
        "intermediate_size": value("feed_forward_length"),
        "head_dim": value("attention.key_length"),
        "vocab_size": value("vocab_size") or meta.get("tokenizer.ggml.tokens"),
        "max_position_embeddings": value("context_length"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "num_experts": value("expert_count"),
    }
    return shape_from_config(config, f"GGUF metadata of {path.name}")


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def read_gguf_header(path: Path) -> tuple[dict[str, Any], set[str]]:
    """(metadata, tensor names) of a GGUF v2/v3 file. Arrays are kept as their length (the tokenizer's
    vocabulary is a 49k-string array; only its size matters here)."""
    with path.open("rb") as f:
        data = f.read(1 << 16)
        reader = _Reader(f, data)
        if reader.take(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        version = reader.unpack("I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        tensor_count, kv_count = reader.unpack("Q"), reader.unpack("Q")
        meta: dict[str, Any] = {}
        for _ in range(kv_count):
            key = reader.string()
            meta[key] = reader.value(reader.unpack("I"))
        names = set()
        for _ in range(tensor_count):
            names.add(reader.string())
            dims = reader.unpack("I")
            reader.take(8 * dims + 4 + 8)  # dims, type, offset
        return meta, names


class _Reader:
    """Sequential little-endian reads over a file, buffered in 64 KiB chunks."""

    def __init__(self, file: Any, data: bytes) -> None:
        self.file, self.data, self.pos = file, data, 0

    def take(self, n: int) -> bytes:
        while self.pos + n > len(self.data):
            more = self.file.read(max(1 << 16, n))
            if not more:
                raise ValueError("truncated GGUF header")
            self.data = self.data[self.pos :] + more
            self.pos = 0
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, code: str) -> Any:
        size = struct.calcsize("<" + code)
        return struct.unpack("<" + code, self.take(size))[0]

    def string(self) -> str:
        return self.take(self.unpack("Q")).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("I"), self.unpack("Q")
            for _ in range(count):
                self.value(item)
            return count
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self.unpack(_SCALARS[kind])
