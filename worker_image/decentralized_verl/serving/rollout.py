"""The rollout worker: work items in, samples out, with the policy version the coordinator asked for.

Transport-free: the gRPC servicer and the colocated client both wrap `RolloutWorker.generate_sync`.
Before a batch the worker makes sure it holds at least the requested version, pulling the newest
published weights (a worker that missed versions jumps straight to the latest, it never replays them).
With an environment (`data.environment`) each work item is a whole multi-turn episode, played by
`environments.rollout.EpisodeRunner` with this worker's backend; it is still one sample, so dispatch,
re-dispatch and exactly-once accounting treat it like a single completion.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from decentralized_verl.backends.base import GenerationBackend, GenerationRequest
from decentralized_verl.core.interfaces import WorkItem
from decentralized_verl.core.samples import Sample
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.core.seeds import item_seed, turn_seed
from decentralized_verl.environments.base import EpisodeRecord
from decentralized_verl.environments.episode import TurnOutput
from decentralized_verl.environments.rollout import EpisodeRunner, record_seed
from decentralized_verl.environments.settings import EpisodeSettings, episode_settings
from decentralized_verl.models.lora import is_lora
from decentralized_verl.spec.catalogue.backends import HF, backend_kind
from decentralized_verl.transport.weights.codec import cast_like

if TYPE_CHECKING:
    from torch import Tensor


class WeightSource(Protocol):
    """Where a rollout worker pulls policy weights from (the learner's publisher, over gRPC or in-process)."""

    def fetch_latest(self, min_version: int) -> tuple[int, Mapping[str, Tensor]]:
        """The newest version >= min_version and its state dict (wire dtype); raises if none arrives."""
        ...


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
        backend_name: str = HF.name,
        ema: float = 0.3,
        environment: EpisodeSettings | Any | None = None,
        partial_every_s: float | None = None,
    ) -> None:
        """`environment`: episode settings (or the spec's `data.environment`) to play multi-turn episodes.
        `partial_every_s`: also yield each unfinished completion's prefix this often (finish reason
        `partial`), so a coordinator can continue it elsewhere if this worker is cut off; hf backend only."""
        self.backend = backend
        self.worker_id = worker_id
        self.weight_source = weight_source
        self.backend_name = backend_name
        self._ema = ema
        self._lock = threading.Lock()
        self.tokens_per_second = 0.0
        self.weight_loads = 0
        self.environment = episode_settings(environment)
        self._runner: EpisodeRunner | None = None
        self.partial_every_s = partial_every_s if backend_kind(backend_name).partial_prefixes else None

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
        """Yield one Sample per item as its micro-batch (or episode) finishes; validates everything first.
        With `partial_every_s`, prefixes of unfinished items come too (finish reason `partial`)."""
        if self.environment is not None:
            yield from self._episodes(items, sampling, version)
            return
        requests = to_requests(items, sampling)
        with self._lock:
            self._ensure_version(version)
            began = time.perf_counter()
            tokens = 0
            if self.partial_every_s is None:
                outputs = self.backend.generate(requests)
            else:
                outputs = self.backend.generate(requests, partial_every_s=self.partial_every_s)
            try:
                for out in outputs:
                    prompt, sample_index = items[int(out.prompt_id)]
                    if out.finish_reason != "partial":
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

    def _episodes(
        self, items: Sequence[WorkItem], sampling: SamplingParams, version: int
    ) -> Iterator[Sample]:
        """One multi-turn episode per item, each yielded as it ends (the others play on)."""
        with self._lock:
            self._ensure_version(version)
            runner = self._episode_runner()
            starts = [
                (
                    tuple(prompt.token_ids),
                    EpisodeRecord(
                        prompt.prompt_id, prompt.ground_truth, record_seed(prompt.prompt_id), prompt.text
                    ),
                )
                for prompt, _ in items
            ]
            versions: dict[int, int] = {}
            began = time.perf_counter()
            tokens = 0
            try:
                generate = self._turn_generator(items, sampling, versions)
                for index, result in runner.run(starts, generate, sampling.max_new_tokens):
                    prompt, sample_index = items[index]
                    tokens += result.model_tokens
                    yield Sample(
                        prompt=prompt,
                        sample_index=sample_index,
                        response_ids=result.response_ids,
                        logprobs=result.logprobs,
                        finish_reason=result.finish_reason,
                        text=runner.tokenizer.decode(list(result.response_ids), skip_special_tokens=False),
                        policy_version=versions.get(index, self.backend.version),
                        worker_id=self.worker_id,
                        extra={
                            "generation_seconds": time.perf_counter() - began,
                            "turns": float(len(result.turns)),
                            "tool_calls": float(result.tool_calls),
                            "tool_errors": float(result.tool_errors),
                            "episode_reward": float(result.reward),
                        },
                        loss_mask=result.loss_mask,
                        turns=result.turns,
                        end_reason=result.reason,
                    )
            finally:
                self._record_throughput(tokens, time.perf_counter() - began)

    def _episode_runner(self) -> EpisodeRunner:
        if self._runner is None:
            assert self.environment is not None
            tokenizer = self.backend.tokenizer
            eos = getattr(self.backend, "eos_token_ids", None)
            if eos is None:
                eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
            self._runner = EpisodeRunner(
                self.environment,
                tokenizer,
                eos_token_ids=eos,
                context_tokens=getattr(self.backend, "max_positions", None)
                or getattr(self.backend, "max_model_len", None),  # hf, vllm
            )
        return self._runner

    def _turn_generator(self, items: Sequence[WorkItem], sampling: SamplingParams, versions: dict[int, int]):
        """Episode turns through the backend: one n=1 request per turn, seeded by (item, turn), so a
        re-dispatched episode plays out the same."""

        def generate(turns):
            requests = []
            for turn in turns:
                prompt, sample_index = items[turn.index]
                seed = None
                if sampling.seed is not None:
                    seed = turn_seed(sampling.seed, prompt.prompt_id, sample_index, turn.turn)
                params = dataclasses.replace(sampling, n=1, seed=seed, max_new_tokens=turn.max_new_tokens)
                requests.append(GenerationRequest(str(turn.index), turn.context_ids, params))
            for out in self.backend.generate(requests):
                index = int(out.prompt_id)
                versions[index] = min(versions.get(index, out.policy_version), out.policy_version)
                yield (
                    index,
                    TurnOutput(
                        tuple(out.response_token_ids), tuple(out.logprobs), out.finish_reason, out.text
                    ),
                )

        return generate

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
