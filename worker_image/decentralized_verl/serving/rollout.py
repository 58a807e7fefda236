"""The rollout worker: work items in, samples out, with the policy version the coordinator asked for.

Transport-free: the gRPC servicer and the colocated client both wrap `RolloutWorker.generate_sync`.
Before a batch the worker makes sure it holds at least the requested version, pulling the newest
published weights (a worker that missed versions jumps straight to the latest, it never replays them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from decentralized_verl.backends.base import GenerationBackend, GenerationRequest
from decentralized_verl.core.interfaces import WorkItem
from decentralized_verl.core.samples import Sample
from decentralized_verl.core.sampling import SamplingParams

if TYPE_CHECKING:
    from torch import Tensor

_SEED_MASK = (1 << 63) - 1


class WeightSource(Protocol):
    """Where a rollout worker pulls policy weights from (the learner's publisher, over gRPC or in-process)."""

    def fetch_latest(self, min_version: int) -> tuple[int, Mapping[str, Tensor]]:
        """The newest version >= min_version and its state dict (wire dtype); raises if none arrives."""
        ...


def item_seed(seed: int, prompt_id: str, sample_index: int) -> int:
    """A 63-bit seed that depends only on (seed, prompt, sample index).

    So a sample is the same whichever worker draws it, in whichever batch, after a re-dispatch.
    """
    digest = hashlib.sha256(f"{seed}\x00{prompt_id}\x00{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & _SEED_MASK


def to_requests(items: Sequence[WorkItem], sampling: SamplingParams) -> list[GenerationRequest]:
    """One n=1 request per item; the request's id is the item's position (prompt ids may repeat)."""
    out = []
    for position, (prompt, sample_index) in enumerate(items):
        seed = None if sampling.seed is None else item_seed(sampling.seed, prompt.prompt_id, sample_index)
        params = dataclasses.replace(sampling, n=1, seed=seed)
        out.append(GenerationRequest(str(position), tuple(prompt.token_ids), params))
    return out


class RolloutWorker:
    """A policy copy behind a generation backend, plus where its new weights come from.

    One generate or weight load runs at a time (a lock), so every sample carries the version that
    really produced it. `tokens_per_second` is an exponential moving average over calls, for dispatch.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        worker_id: str,
        weight_source: WeightSource | None = None,
        *,
        backend_name: str = "hf",
        ema: float = 0.3,
    ) -> None:
        self.backend = backend
        self.worker_id = worker_id
        self.weight_source = weight_source
        self.backend_name = backend_name
        self._ema = ema
        self._lock = threading.Lock()
        self.tokens_per_second = 0.0
        self.weight_loads = 0

    @property
    def version(self) -> int:
        return self.backend.version

    def ensure_version(self, version: int) -> int:
        """Hold at least `version`, pulling the latest weights if needed; returns the version held."""
        with self._lock:
            return self._ensure_version(version)

    def _ensure_version(self, version: int) -> int:
        if self.backend.version >= version:
            return self.backend.version
        if self.weight_source is None:
            raise RuntimeError(
                f"{self.worker_id}: asked for policy version {version} but holds "
                f"{self.backend.version} and has no weight source"
            )
        got, state_dict = self.weight_source.fetch_latest(version)
        if got < version:
            raise RuntimeError(
                f"{self.worker_id}: weight source returned version {got} < requested {version}"
            )
        self._load_weights(state_dict, got)
        return got

    def load_weights(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        """Cast to the model's dtypes (the wire may carry bf16) and load; a bad state dict changes nothing."""
        with self._lock:
            self._load_weights(state_dict, version)

    def _load_weights(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        model = getattr(self.backend, "model", None)
        if model is not None:
            from decentralized_verl.models.lora import is_lora
            from decentralized_verl.transport.weights import cast_like

            state_dict = cast_like(state_dict, model.state_dict())
            if is_lora(model):  # LoRA jobs ship only the adapter; the frozen base stays as loaded
                self.backend.load_weights(state_dict, version, partial=True)
                self.weight_loads += 1
                return
        self.backend.load_weights(state_dict, version)
        self.weight_loads += 1

    def generate_sync(
        self, items: Sequence[WorkItem], sampling: SamplingParams, version: int
    ) -> Iterator[Sample]:
        """Yield one Sample per item as its micro-batch finishes; validates everything before starting."""
        requests = to_requests(items, sampling)
        with self._lock:
            self._ensure_version(version)
            began = time.perf_counter()
            tokens = 0
            try:
                for out in self.backend.generate(requests):
                    prompt, sample_index = items[int(out.prompt_id)]
                    tokens += len(out.response_token_ids)
                    yield Sample(
                        prompt=prompt,
                        sample_index=sample_index,
                        response_ids=tuple(out.response_token_ids),
                        logprobs=tuple(out.logprobs),
                        finish_reason=out.finish_reason,
                        text=out.text,
                        policy_version=out.policy_version,
                        worker_id=self.worker_id,
                        extra={"generation_seconds": float(out.seconds)},
                    )
            finally:
                self._record_throughput(tokens, time.perf_counter() - began)

    def _record_throughput(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        previous = self.tokens_per_second
        self.tokens_per_second = rate if previous == 0 else (1 - self._ema) * previous + self._ema * rate

    def info(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "policy_version": self.backend.version,
            "tokens_per_second": self.tokens_per_second,
            "backend": self.backend_name,
        }
