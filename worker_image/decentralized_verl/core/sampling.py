"""How to sample: one type from the spec's `data` section to the generation engine and over the wire.

The coordinator fills it from the spec (eval uses temperature 0), the wire carries it to a worker
(`transport.wire.rollout`), and the backend samples with it; `n` completions per prompt, and with a `seed`
a response depends only on (seed, sample, weights). Pure: the spec, the wire and the engines all import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a prompt's responses.

    ``temperature == 0`` means greedy decoding. ``top_k == 0`` and ``top_p == 1`` disable those
    filters. ``stop`` strings end a response when they appear in its decoded text (the end-of-sequence
    token always ends it too). ``n`` responses are drawn per prompt. With a ``seed`` a response depends
    only on (seed, sample index, weights), not on which other requests share its batch. In a rollout
    request `seed` is the step's base seed; the worker derives each sample's own seed from it and the
    sample's identity (`core.seeds.item_seed`), so a re-dispatched sample comes out the same.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        def bad(field: str, rule: str, value: object) -> ValueError:
            return ValueError(f"SamplingParams.{field}: {rule} (got {value!r})")

        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise bad("max_new_tokens", "must be an integer >= 1", self.max_new_tokens)
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)):
            raise bad("temperature", "must be a finite number", self.temperature)
        if self.temperature < 0:
            raise bad("temperature", "must be >= 0 (0 means greedy)", self.temperature)
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise bad("top_p", "must be in (0, 1]", self.top_p)
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "must be an integer >= 0 (0 disables it)", self.top_k)
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be a tuple of non-empty strings", self.stop)
        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "must be an integer >= 1", self.n)
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise bad("seed", "must be None or an integer >= 0", self.seed)
