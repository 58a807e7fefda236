"""Which decoder layers each span holds, and how a full model's tensor names map onto a span's.

Pure: the planner, the front and the span servers all agree through these functions. A layout is a
tuple of half-open ranges that cover layers 0..L exactly once, in order (span 0 runs first).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
FRONT_PREFIXES = ("model.embed_tokens.", "model.norm.", "lm_head.")
"""Full-model tensors the front holds: embeddings, the final norm, the LM head."""


class LayoutError(ValueError):
    """A span layout that does not cover the model's layers exactly once; the message names the field."""


@dataclass(frozen=True)
class Span:
    """Decoder layers [start, end) of the model."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end <= self.start:
            raise LayoutError(f"span {self.start}:{self.end}: must be start:end with 0 <= start < end")

    @property
    def layers(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.start}:{self.end}"


def parse_span(text: str, *, field: str = "layers") -> Span:
    """`"a:b"` -> Span(a, b); a clear error naming `field` otherwise."""
    start, sep, end = text.partition(":")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise LayoutError(f"{field}: must look like 'start:end', e.g. '0:12' (got {text!r})")
    try:
        return Span(int(start), int(end))
    except LayoutError as exc:
        raise LayoutError(f"{field}: {exc}") from None


def check_layout(spans: Iterable[Span], num_layers: int, *, field: str = "spans") -> tuple[Span, ...]:
    """The spans, checked to cover layers 0..num_layers contiguously and in order."""
    out = tuple(spans)
    if not out:
        raise LayoutError(f"{field}: at least one span is needed")
    expected = 0
    for i, span in enumerate(out):
        if span.start != expected:
            raise LayoutError(
                f"{field}[{i}]: starts at layer {span.start}, expected {expected} (gap or overlap)"
            )
        expected = span.end
    if expected != num_layers:
        raise LayoutError(f"{field}: the spans end at layer {expected} but the model has {num_layers} layers")
    return out


def even_layout(num_layers: int, count: int) -> tuple[Span, ...]:
    """`count` contiguous spans of as equal a size as the layers allow (the first ones take the rest)."""
    if count < 1 or count > num_layers:
        raise LayoutError(f"span count: must be in [1, {num_layers}] for {num_layers} layers (got {count})")
    base, extra = divmod(num_layers, count)
    spans, start = [], 0
    for i in range(count):
        end = start + base + (1 if i < extra else 0)
        spans.append(Span(start, end))
        start = end
    return tuple(spans)


def layer_of(name: str) -> int | None:
    """The decoder layer a full-model tensor belongs to (`model.layers.7.mlp...` -> 7), else None."""
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


def to_span_name(name: str, span: Span) -> str | None:
    """The span module's name for a full-model tensor (`model.layers.7.x` -> `layers.2.x` in span 5:9),
    or None when the tensor is not one of the span's layers."""
    match = _LAYER.match(name)
    if not match:
        return None
    layer = int(match.group(1))
    if not span.start <= layer < span.end:
        return None
    return f"layers.{layer - span.start}.{match.group(2)}"


def is_front(name: str) -> bool:
    return name.startswith(FRONT_PREFIXES)


def split_state(state: Mapping[str, T], spans: tuple[Span, ...]) -> tuple[dict[str, T], list[dict[str, T]]]:
    """(the front's tensors under their full names, each span's tensors under its own names).

    A name that belongs to no part (a rotary buffer, an unknown module) is an error: a refresh that
    silently dropped a tensor would leave the chain serving a mix of versions.
    """
    front: dict[str, T] = {}
    parts: list[dict[str, T]] = [{} for _ in spans]
    for name, tensor in state.items():
        if is_front(name):
            front[name] = tensor
            continue
        layer = layer_of(name)
        if layer is None:
            raise LayoutError(f"weights[{name!r}]: belongs neither to the front nor to a decoder layer")
        for i, span in enumerate(spans):
            local = to_span_name(name, span)
            if local is not None:
                parts[i][local] = tensor
                break
        else:
            raise LayoutError(f"weights[{name!r}]: layer {layer} is in no span of the layout")
    return front, parts
