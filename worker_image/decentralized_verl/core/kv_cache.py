"""A decode cache whose full-attention layers write into one buffer sized for the whole generation.

transformers' ``DynamicLayer`` appends a decode step's keys/values with ``torch.cat``, which copies the whole
cache of every layer at every step: for 64 rows x ~100 positions that copy costs more than the step's
attention itself. ``PreallocatedLayer`` allocates ``capacity`` positions once and writes each step's column in
place, handing the model views of the filled part. Dropping finished rows (``batch_select_indices``) is one
gather of the buffer, as before. Layers of other kinds (sliding-window, linear attention) are left as the
model's config made them.
"""

from __future__ import annotations

import inspect
from functools import lru_cache, partial
from typing import Any

from torch import Tensor
from transformers.cache_utils import DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` that holds ``capacity`` positions per row, filled left to right.

    ``keys``/``values`` are views of the filled part, so everything that reads a ``DynamicLayer`` (sequence
    length, mask sizes) sees the same tensors. Writing past ``capacity`` is an error: the caller sized the
    cache from the prompt width and the largest ``max_new_tokens``.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1 (got {capacity})")
        self.capacity = capacity
        self.length = 0
        self._key_buffer: Tensor | None = None
        self._value_buffer: Tensor | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        batch, heads, _, key_dim = key_states.shape
        self._key_buffer = key_states.new_empty((batch, heads, self.capacity, key_dim))
        self._value_buffer = value_states.new_empty((batch, heads, self.capacity, value_states.shape[-1]))

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self._key_buffer is not None and self._value_buffer is not None
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"kv cache: {end} positions written into a layer sized for {self.capacity}")
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        if self._key_buffer is None:
            return
        self._key_buffer = self._key_buffer.index_select(0, indices)
        self._value_buffer = self._value_buffer.index_select(0, indices)
        self._expose()

    def _expose(self) -> None:
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self.length = 0
        super().reset()


def decode_cache(config: Any, capacity: int) -> DynamicCache:
    """The model's own ``DynamicCache``, each plain full-attention layer replaced by a preallocated one."""
    cache = DynamicCache(config=config)
    if (
        cache.layer_class_to_replicate is DynamicLayer
    ):  # a config that names no layer types: layers come lazily
        cache.layer_class_to_replicate = partial(PreallocatedLayer, capacity)
    cache.layers = [
        PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


def cache_keyword(module: Any) -> str:
    """The name under which ``module.forward`` takes a cache: ``cache`` in newer transformers releases,
    ``past_key_values`` (deprecated there, removed later) in older ones."""
    forward = module.forward
    function = getattr(forward, "__func__", None)  # a plain method: the answer holds for its class
    return _cache_keyword_of(function) if function is not None else _cache_keyword_of.__wrapped__(forward)


@lru_cache(maxsize=256)
def _cache_keyword_of(forward: Any) -> str:
    """Looked up once per model class: the learner asks on every micro-batch."""
    parameters = inspect.signature(forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The cache a forward returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
