"""The wire format of one hop through a span: a few fields and three tensors in one safetensors blob.

safetensors (not pickle) so a span server never runs code from what it receives; every field and
tensor is checked here, and a bad one is a `WireError` naming it, before any session is touched.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from torch import Tensor

from decentralized_verl.errors import WireError

_FIELDS = "dverl.hop"
MAX_ROWS = 4096
MAX_SESSION_CHARS = 128


@dataclass(frozen=True)
class HopRequest:
    """Run `hidden` ([B, T, H]) through the span's layers within session `session`.

    `open` starts the session with a cache of `capacity` positions (it must not exist yet); otherwise the
    session must exist. `rows` (when set) first rebuilds the cached rows from the previous ones (a GRPO
    group's rows copied from its prompt's row, finished rows dropped). `attention` is [B, L] over every
    position the cache will hold after this hop; `positions` [B, T] the rotary positions of `hidden`.
    `keep_last` > 0 returns only that many last columns (a replay needs only the newest). `version` is
    the policy version the caller computes with: a span holding another one refuses.
    """

    session: str
    version: int
    hidden: Tensor
    attention: Tensor
    positions: Tensor
    open: bool = False
    capacity: int = 0
    rows: tuple[int, ...] | None = None
    keep_last: int = 0


def encode_request(request: HopRequest) -> bytes:
    fields = {
        "session": request.session,
        "version": request.version,
        "open": request.open,
        "capacity": request.capacity,
        "rows": list(request.rows) if request.rows is not None else None,
        "keep_last": request.keep_last,
    }
    tensors = {
        "hidden": request.hidden.to("cpu").contiguous(),  # from whichever device computed them
        "attention": request.attention.to("cpu", torch.int64).contiguous(),
        "positions": request.positions.to("cpu", torch.int64).contiguous(),
    }
    return safetensors_save(tensors, metadata={_FIELDS: json.dumps(fields)})


def _blob(data: bytes, what: str) -> tuple[dict[str, Tensor], dict]:
    try:
        tensors = safetensors_load(data)
        (length,) = struct.unpack("<Q", data[:8])
        metadata = json.loads(data[8 : 8 + length]).get("__metadata__") or {}
        fields = json.loads(metadata[_FIELDS])
    except Exception as exc:
        raise WireError(what, f"not a span hop message ({type(exc).__name__}: {exc})") from None
    if not isinstance(fields, dict):
        raise WireError(what, "fields must be a JSON object")
    return tensors, fields


def _int(fields: dict, name: str, low: int, high: int | None = None) -> int:
    value = fields.get(name)
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise WireError(f"hop.{name}", f"must be an integer {bound} (got {value!r})")
    return value


def decode_request(data: bytes, hidden_size: int, dtype: torch.dtype) -> HopRequest:
    """A checked `HopRequest`; `hidden_size` and `dtype` are the span's own."""
    tensors, fields = _blob(data, "hop")
    session = fields.get("session")
    if not isinstance(session, str) or not session or len(session) > MAX_SESSION_CHARS:
        raise WireError("hop.session", f"must be a non-empty string of <= {MAX_SESSION_CHARS} chars")
    version = _int(fields, "version", 0)
    opening = fields.get("open")
    if not isinstance(opening, bool):
        raise WireError("hop.open", f"must be true or false (got {opening!r})")
    capacity = _int(fields, "capacity", 1 if opening else 0)
    keep_last = _int(fields, "keep_last", 0)
    for name in ("hidden", "attention", "positions"):
        if name not in tensors:
            raise WireError(f"hop.{name}", "missing")
    hidden, attention, positions = tensors["hidden"], tensors["attention"], tensors["positions"]
    if hidden.dim() != 3 or hidden.shape[-1] != hidden_size or hidden.shape[0] < 1 or hidden.shape[1] < 1:
        raise WireError("hop.hidden", f"must be [rows, tokens, {hidden_size}] (got {list(hidden.shape)})")
    if hidden.dtype != dtype:
        raise WireError("hop.hidden", f"dtype must be {dtype} (got {hidden.dtype})")
    if not bool(torch.isfinite(hidden).all()):
        raise WireError("hop.hidden", "holds NaN or infinite values")
    rows_count, tokens = hidden.shape[0], hidden.shape[1]
    if hidden.shape[0] > MAX_ROWS:
        raise WireError("hop.hidden", f"at most {MAX_ROWS} rows (got {rows_count})")
    if attention.dtype != torch.int64 or attention.dim() != 2 or attention.shape[0] != rows_count:
        raise WireError(
            "hop.attention", f"must be int64 [{rows_count}, positions] (got {list(attention.shape)})"
        )
    if attention.shape[1] < tokens or not bool(((attention == 0) | (attention == 1)).all()):
        raise WireError("hop.attention", f"must hold 0/1 over >= {tokens} positions")
    if positions.dtype != torch.int64 or list(positions.shape) != [rows_count, tokens]:
        raise WireError(
            "hop.positions", f"must be int64 [{rows_count}, {tokens}] (got {list(positions.shape)})"
        )
    if bool((positions < 0).any()):
        raise WireError("hop.positions", "must be >= 0")
    rows = fields.get("rows")
    if rows is not None:
        if opening:
            raise WireError("hop.rows", "a session being opened has no rows to select from")
        if (
            not isinstance(rows, list)
            or len(rows) != rows_count
            or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rows)
        ):
            raise WireError("hop.rows", f"must be {rows_count} row indices >= 0 (one per hidden row)")
        rows = tuple(rows)
    if keep_last > tokens:
        raise WireError("hop.keep_last", f"must be <= the {tokens} tokens sent (got {keep_last})")
    return HopRequest(session, version, hidden, attention, positions, opening, capacity, rows, keep_last)


def encode_hidden(hidden: Tensor) -> bytes:
    return safetensors_save({"hidden": hidden.to("cpu").contiguous()}, metadata={_FIELDS: "{}"})


def decode_hidden(data: bytes, rows: int, tokens: int, hidden_size: int) -> Tensor:
    """The span's answer, checked against what was asked."""
    tensors, _ = _blob(data, "hop reply")
    hidden = tensors.get("hidden")
    if hidden is None or list(hidden.shape) != [rows, tokens, hidden_size]:
        got = None if hidden is None else list(hidden.shape)
        raise WireError("hop reply.hidden", f"must be [{rows}, {tokens}, {hidden_size}] (got {got})")
    if not bool(torch.isfinite(hidden).all()):
        raise WireError("hop reply.hidden", "holds NaN or infinite values")
    return hidden
