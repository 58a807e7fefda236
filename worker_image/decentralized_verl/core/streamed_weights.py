"""What a sharded learner hands the weight publisher: each tensor's place first, then the tensors as its
ranks gather them, so a model larger than one rank's memory is published without being assembled whole
(`transport/weights/stream.py` encodes it)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class TensorSlot:
    """One tensor's place in the stream: its name, full shape and dtype (before any wire cast)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def wire_dtype(self, wire: torch.dtype | None) -> torch.dtype:
        return wire if wire is not None and self.dtype.is_floating_point else self.dtype

    def nbytes(self, wire: torch.dtype | None) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.wire_dtype(wire)).element_size()


@dataclass(frozen=True)
class StreamedWeights:
    """Weights to publish as a stream: the layout first, then `tensors` yields (name, full tensor) in
    layout order (names in `aliases` are not yielded: the decoder puts the target back under them).

    `tensors` may be a collective (every rank of a sharded learner iterates it together), so the encoder
    always drains it to the end, also when it refuses a tensor half way."""

    slots: tuple[TensorSlot, ...]
    tensors: Iterator[tuple[str, Tensor]]
    aliases: dict[str, str] = field(default_factory=dict)
