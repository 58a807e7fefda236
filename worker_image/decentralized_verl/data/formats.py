"""Record layouts: which one a dict is, and how it becomes a normalised record.

Layouts (the names `kind` arguments accept):
  math        {"messages": {role, content} | [{role, content}, ...], "gt_answer": "3"}
  code        {"messages": ..., "test_cases": {"inputs": [str], "outputs": [str]}}
  sft         {"prompt": str, "completion": str}
  preference  {"prompt": str, "chosen": str, "rejected": str}
  prompt      {"prompt": str} with an optional "answer" or "ground_truth"
  verl        veRL parquet: {"prompt": [{role, content}, ...], "reward_model": {"ground_truth", "style"},
              "data_source": str, "extra_info": {...}?}
Every check names the field path (`messages[1].content`, `test_cases.outputs[2]`); keys a layout
does not use are ignored, since real data sets carry bookkeeping columns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from decentralized_verl.data.readers import Where, type_name
from decentralized_verl.data.records import (
    KINDS,
    ROLES,
    ChatMessage,
    CodeTests,
    PreferenceRecord,
    PromptRecord,
    Record,
    SFTRecord,
)

KIND_KEYS: dict[str, str] = {
    "math": "messages, gt_answer",
    "code": "messages, test_cases",
    "sft": "prompt, completion",
    "preference": "prompt, chosen, rejected",
    "prompt": "prompt",
    "verl": "prompt as chat messages, reward_model, data_source",
}


def detect_kind(obj: Mapping[str, Any]) -> str | None:
    """The layout a record's keys announce, or None when they announce none."""
    if "messages" in obj:
        if "test_cases" in obj:
            return "code"
        if "gt_answer" in obj:
            return "math"
        return None
    if "prompt" in obj:
        if "chosen" in obj or "rejected" in obj:
            return "preference"
        if "completion" in obj:
            return "sft"
        if "reward_model" in obj or isinstance(obj["prompt"], list):
            return "verl"
        return "prompt"
    return None


def unknown_layout_message(obj: Mapping[str, Any]) -> str:
    keys = ", ".join(sorted(map(str, obj))) or "none"
    known = "; ".join(f"{kind} ({keys_})" for kind, keys_ in KIND_KEYS.items())
    return f"unknown record format: cannot tell it from its keys ({keys}); expected one of: {known}"


# ----------------------------------------------------------------------------------------- fields
def _field(obj: Mapping[str, Any], key: str, where: Where, path: str) -> Any:
    if key not in obj:
        raise where.error(path, "missing")
    return obj[key]


def _string(value: Any, where: Where, path: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise where.error(path, f"expected a string (got {type_name(value)})")
    if not allow_empty and not value.strip():
        raise where.error(path, "must not be empty")
    return value


def _answer(value: Any, where: Where, path: str) -> str:
    """Ground truths are strings; plain numbers are accepted and written as Python prints them."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise where.error(path, f"expected a string or a number (got {type_name(value)})")
    if isinstance(value, float) and not math.isfinite(value):
        raise where.error(path, f"expected a finite number (got {value})")
    return _string(value if isinstance(value, str) else str(value), where, path)


def _object(value: Any, where: Where, path: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise where.error(path, f"expected an object with {what} (got {type_name(value)})")
    return value


def _message(value: Any, where: Where, path: str) -> ChatMessage:
    obj = _object(value, where, path, "role and content")
    role = _field(obj, "role", where, f"{path}.role")
    if role not in ROLES:
        shown = role if isinstance(role, str) else type_name(role)
        raise where.error(f"{path}.role", f"expected one of {', '.join(ROLES)} (got {shown!r})")
    content = _string(_field(obj, "content", where, f"{path}.content"), where, f"{path}.content")
    return ChatMessage(role=role, content=content)


def _messages(value: Any, where: Where, path: str, *, allow_single: bool) -> tuple[ChatMessage, ...]:
    """A chat: a list of messages (or, in the math layout, one message object) ending with the user."""
    if allow_single and isinstance(value, dict):
        messages: tuple[ChatMessage, ...] = (_message(value, where, path),)
    elif isinstance(value, list):
        if not value:
            raise where.error(path, "must not be empty")
        messages = tuple(_message(item, where, f"{path}[{i}]") for i, item in enumerate(value))
    else:
        expected = "a message object or a list of messages" if allow_single else "a list of chat messages"
        raise where.error(path, f"expected {expected} (got {type_name(value)})")
    if messages[-1].role != "user":
        raise where.error(path, f"the last message must be from the user (got {messages[-1].role})")
    return messages


def _string_list(value: Any, where: Where, path: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise where.error(path, f"expected a list of strings (got {type_name(value)})")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise where.error(f"{path}[{i}]", f"expected a string (got {type_name(item)})")
    return tuple(value)


def _tests(value: Any, where: Where, path: str) -> CodeTests:
    if isinstance(value, str):  # PRIME dumps sometimes store the object as a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise where.error(path, f"a string that is not valid JSON ({exc.msg})") from None
    obj = _object(value, where, path, "inputs and outputs")
    inputs = _string_list(_field(obj, "inputs", where, f"{path}.inputs"), where, f"{path}.inputs")
    outputs = _string_list(_field(obj, "outputs", where, f"{path}.outputs"), where, f"{path}.outputs")
    if not inputs:
        raise where.error(f"{path}.inputs", "must not be empty")
    if len(inputs) != len(outputs):
        raise where.error(
            path, f"inputs and outputs differ in length ({len(inputs)} inputs, {len(outputs)} outputs)"
        )
    return CodeTests(inputs=inputs, outputs=outputs)


def _optional_string(obj: Mapping[str, Any], key: str, where: Where) -> str | None:
    value = obj.get(key)
    return None if value is None else _string(value, where, key)


# ---------------------------------------------------------------------------------------- layouts
def _math(obj: Mapping[str, Any], where: Where, rid: str) -> PromptRecord:
    return PromptRecord(
        id=rid,
        messages=_messages(_field(obj, "messages", where, "messages"), where, "messages", allow_single=True),
        ground_truth=_answer(_field(obj, "gt_answer", where, "gt_answer"), where, "gt_answer"),
        data_source=_optional_string(obj, "data_source", where),
        kind="math",
    )


def _code(obj: Mapping[str, Any], where: Where, rid: str) -> PromptRecord:
    return PromptRecord(
        id=rid,
        messages=_messages(_field(obj, "messages", where, "messages"), where, "messages", allow_single=True),
        tests=_tests(_field(obj, "test_cases", where, "test_cases"), where, "test_cases"),
        data_source=_optional_string(obj, "data_source", where),
        kind="code",
    )


def _prompt_only(obj: Mapping[str, Any], where: Where, rid: str) -> PromptRecord:
    prompt = _string(_field(obj, "prompt", where, "prompt"), where, "prompt")
    present = [key for key in ("answer", "ground_truth") if obj.get(key) is not None]
    if len(present) == 2:
        raise where.error("answer", "both answer and ground_truth are given; keep one")
    truth = _answer(obj[present[0]], where, present[0]) if present else None
    return PromptRecord(
        id=rid,
        messages=(ChatMessage("user", prompt),),
        ground_truth=truth,
        data_source=_optional_string(obj, "data_source", where),
        kind="prompt",
    )


def _verl(obj: Mapping[str, Any], where: Where, rid: str) -> PromptRecord:
    messages = _messages(_field(obj, "prompt", where, "prompt"), where, "prompt", allow_single=False)
    reward = _object(
        _field(obj, "reward_model", where, "reward_model"), where, "reward_model", "ground_truth and style"
    )
    truth = _answer(
        _field(reward, "ground_truth", where, "reward_model.ground_truth"), where, "reward_model.ground_truth"
    )
    style = reward.get("style")
    if style is not None:
        style = _string(style, where, "reward_model.style")
    source = _string(_field(obj, "data_source", where, "data_source"), where, "data_source")
    extra = obj.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise where.error("extra_info", f"expected an object (got {type_name(extra)})")
    return PromptRecord(
        id=rid,
        messages=messages,
        ground_truth=truth,
        data_source=source,
        kind="verl",
        reward_style=style,
        extra_info=dict(extra or {}),
    )


def _sft(obj: Mapping[str, Any], where: Where, rid: str) -> SFTRecord:
    return SFTRecord(
        id=rid,
        prompt=_string(_field(obj, "prompt", where, "prompt"), where, "prompt"),
        completion=_string(_field(obj, "completion", where, "completion"), where, "completion"),
    )


def _preference(obj: Mapping[str, Any], where: Where, rid: str) -> PreferenceRecord:
    prompt = _string(_field(obj, "prompt", where, "prompt"), where, "prompt")
    chosen = _string(_field(obj, "chosen", where, "chosen"), where, "chosen")
    rejected = _string(_field(obj, "rejected", where, "rejected"), where, "rejected")
    if chosen == rejected:
        raise where.error("rejected", "identical to chosen (the pair teaches nothing)")
    return PreferenceRecord(id=rid, prompt=prompt, chosen=chosen, rejected=rejected)


PARSERS: dict[str, Callable[[Mapping[str, Any], Where, str], Record]] = {
    "math": _math,
    "code": _code,
    "prompt": _prompt_only,
    "verl": _verl,
    "sft": _sft,
    "preference": _preference,
}
assert set(PARSERS) == set(KINDS)


def parse_record(kind: str, obj: Mapping[str, Any], where: Where, rid: str) -> Record:
    """One raw dict as a record of `kind`, or a `DataError` naming the place and the field."""
    return PARSERS[kind](obj, where, rid)
