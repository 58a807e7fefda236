"""The scoring roles: reference log-probs (KL), critic values and updates (PPO), and rewards.

Transport-free and synchronous: the gRPC servicers and the colocated clients wrap these. Per-token
numbers are computed on `samples.collate`'s layout by `core.forward`, the learner's own forward (one
prompt pass per group, logits only at response tokens), so a reference log-prob and the learner's
log-prob of a token are computed identically; results are cut back to each sample's response length.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from traceback import format_exc
from typing import Any

import torch
import torch.distributed as dist

from decentralized_verl.algorithms.value_loss import clipped_value_loss
from decentralized_verl.core.forward import ForwardChooser, response_logprobs
from decentralized_verl.core.samples import Prompt, Sample, TrainBatch, collate
from decentralized_verl.environments.replay import ENVIRONMENT_REWARD, parse_transcript, replay
from decentralized_verl.environments.settings import episode_settings
from decentralized_verl.models.loading import load_model_and_tokenizer, load_sequence_classifier
from decentralized_verl.models.lora import base_only
from decentralized_verl.rewards import RewardModelScorer, score_batch
from decentralized_verl.rewards.result import failed, is_reward_error
from decentralized_verl.rewards.servable import servable_reward
from decentralized_verl.training.optimizer_step import optimizer_step
from decentralized_verl.training.rank_group import collective_device, split_rounds, world_of
from decentralized_verl.training.sharding import is_sharded, shard_model
from decentralized_verl.training.value_model import build_value_model
from decentralized_verl.transport.messages import Score, ScoreItem, SequencePair

log = logging.getLogger(__name__)


def samples_from_pairs(pairs: Sequence[SequencePair]) -> list[Sample]:
    """Minimal samples for (prompt, response) token ids received on the wire."""
    return [
        Sample(
            prompt=Prompt(prompt_id=f"seq{i}", group=i, token_ids=p.prompt_token_ids, text=""),
            sample_index=0,
            response_ids=p.response_token_ids,
            logprobs=(),
            finish_reason="stop",
            text="",
            policy_version=0,
        )
        for i, p in enumerate(pairs)
    ]


def _bare(samples: Sequence[Sample]) -> list[Sample]:
    """Samples without per-token extras, so collate never trips over a half-filled field."""
    return [s.with_(logprobs=(), ref_logprobs=None, values=None) for s in samples]


def _rows(tensor: torch.Tensor, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
    return [tuple(tensor[i, : len(s.response_ids)].tolist()) for i, s in enumerate(samples)]


def _pad_id(model: Any, pad_token_id: int | None) -> int:
    if pad_token_id is not None:
        return pad_token_id
    config = getattr(model, "config", None)
    pad = getattr(config, "pad_token_id", None)
    return int(pad) if pad is not None else 0


def _microbatches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    return [list(samples[i : i + size]) for i in range(0, len(samples), size)]


class ReferenceWorker:
    """The frozen reference policy: log p_ref(response token | prefix) at the sampling temperature.

    `shares_policy`: `model` is the learner's own LoRA model, and the reference is its base with the
    adapters switched off for each call (one copy of the base, 4-bit or not, in a colocated QLoRA job)."""

    def __init__(
        self,
        model: torch.nn.Module,
        temperature: float = 1.0,
        *,
        microbatch_size: int = 8,
        pad_token_id: int | None = None,
        worker_id: str = "reference",
        shares_policy: bool = False,
    ) -> None:
        if microbatch_size < 1:
            raise ValueError(f"microbatch_size: must be >= 1 (got {microbatch_size})")
        self.shares_policy = shares_policy
        self.model = model
        if not shares_policy:
            self.model.eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.temperature = temperature
        self.microbatch_size = microbatch_size
        self.pad_token_id = _pad_id(model, pad_token_id)
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self.chooser = ForwardChooser(next(self.model.parameters()).device.type)

    @classmethod
    def from_spec(cls, spec: Any, *, device: Any = None, worker_id: str = "reference") -> ReferenceWorker:
        """The policy's initial weights (LoRA off; a 4-bit base when the policy's is), at
        spec.data.temperature."""
        model_spec = spec.model.model_copy(update={"lora": None}) if spec.model.lora else spec.model
        model, tokenizer = load_model_and_tokenizer(model_spec, device=device)
        role = spec.roles.reference
        size = (role.microbatch_size if role else None) or spec.training.microbatch_size or 8
        return cls(
            model,
            spec.data.temperature,
            microbatch_size=size,
            pad_token_id=tokenizer.pad_token_id,
            worker_id=worker_id,
        )

    def logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        out: list[tuple[float, ...]] = []
        policy = base_only(self.model) if self.shares_policy else nullcontext(self.model)
        with self._lock, torch.no_grad(), policy:
            for mb in _microbatches(_bare(samples), self.microbatch_size):
                batch = collate(mb, self.pad_token_id)
                plain = self.chooser.plain_next()
                began = time.perf_counter()
                logp, _ = response_logprobs(self.model, batch, self.temperature, plain=plain)
                out.extend(_rows(logp, mb))  # reading the rows waits for a GPU to finish
                self.chooser.record(plain, time.perf_counter() - began, int(batch.input_ids.numel()))
        return out


class CriticWorker:
    """The PPO value model: values for samples, and one clipped-value-loss AdamW step per `train` call."""

    def __init__(
        self,
        value_model: torch.nn.Module,
        spec: Any = None,
        *,
        learning_rate: float | None = None,
        value_clip: float | None = None,
        weight_decay: float | None = None,
        max_grad_norm: float | None = None,
        microbatch_size: int | None = None,
        pad_token_id: int | None = None,
        worker_id: str = "critic",
    ) -> None:
        training = getattr(spec, "training", None)
        algorithm = getattr(spec, "algorithm", None)
        role = getattr(getattr(spec, "roles", None), "critic", None)

        def pick(given: Any, *fallbacks: Any) -> Any:
            for value in (given, *fallbacks):
                if value is not None:
                    return value
            return None

        lr = pick(
            learning_rate,
            getattr(training, "critic_learning_rate", None),
            getattr(training, "learning_rate", None),
            1e-5,
        )
        self.value_clip = pick(value_clip, getattr(algorithm, "value_clip", None), 0.2)
        self.max_grad_norm = pick(max_grad_norm, getattr(training, "max_grad_norm", None), 1.0)
        self.microbatch_size = int(
            pick(
                microbatch_size,
                getattr(role, "microbatch_size", None),
                getattr(training, "microbatch_size", None),
                8,
            )
        )
        self.model = value_model
        self.rank, self.world = world_of(is_sharded(value_model))
        """This rank and the ranks a sharded value model spans (0, 1 unsharded): with more than one,
        `values` and `train` are collectives every rank calls with the same request."""
        self.pad_token_id = pad_token_id if pad_token_id is not None else 0
        self.worker_id = worker_id
        self.version = 0
        """Optimizer steps taken."""
        self.optimizer = torch.optim.AdamW(
            [p for p in value_model.parameters() if p.requires_grad],
            lr=lr,
            weight_decay=pick(weight_decay, getattr(training, "weight_decay", None), 0.0),
        )
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: Any, *, device: Any = None, worker_id: str = "critic") -> CriticWorker:
        role = spec.roles.critic
        model_spec = (role.model if role is not None else None) or spec.model
        critic, tokenizer = build_value_model(model_spec, device=device)
        if role is not None and (role.sharding == "fsdp" or role.activation_checkpointing):
            # Before the optimizer is made: with fsdp it must hold the shards, not the whole parameters.
            shard_model(
                critic,
                sharding=role.sharding,
                world=dist.get_world_size() if dist.is_initialized() else 1,
                cpu_offload=role.cpu_offload,
                activation_checkpointing=role.activation_checkpointing,
            )
        return cls(critic, spec, pad_token_id=tokenizer.pad_token_id, worker_id=worker_id)

    def _values(self, batch: TrainBatch) -> torch.Tensor:
        # Through the module's call, not `.values`: a sharded model gathers its root's weights in hooks.
        return self.model(batch)

    def state(self) -> dict[str, Any]:
        """A copy of everything the critic has learned (weights, optimizer, updates taken)."""
        with self._lock:
            return {
                "model": copy.deepcopy(self.model.state_dict()),
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "version": self.version,
            }

    def load_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = int(state["version"])

    def values(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        """Per-token values. A sharded critic's ranks all call this with the same samples (collective):
        each computes its rounds of micro-batches and every rank returns the whole answer."""
        rows: dict[int, list[tuple[float, ...]]] = {}
        with self._lock, torch.no_grad():
            self.model.eval()
            mbs = _microbatches(_bare(samples), self.microbatch_size)
            for index, mb in split_rounds(mbs, self.rank, self.world):
                got = _rows(self._values(collate(mb, self.pad_token_id)), mb)
                if index >= 0:
                    rows[index] = got
        if self.world > 1:
            parts: list[Any] = [None] * self.world
            dist.all_gather_object(parts, rows)
            rows = {i: r for part in parts for i, r in part.items()}
        return [row for i in range(len(rows)) for row in rows[i]]

    def train(
        self,
        samples: Sequence[Sample],
        returns: Sequence[Sequence[float]],
        old_values: Sequence[Sequence[float]],
        policy_version: int = 0,
    ) -> float:
        """One optimizer step over the whole batch (micro-batches accumulate, weighted by token count so
        the result equals a token mean over the batch); returns that mean loss."""
        if not (len(samples) == len(returns) == len(old_values)):
            raise ValueError(f"{len(samples)} samples, {len(returns)} returns, {len(old_values)} old values")
        for i, (s, r, v) in enumerate(zip(samples, returns, old_values, strict=True)):
            if not len(r) == len(v) == len(s.response_ids):
                raise ValueError(
                    f"items[{i}]: returns ({len(r)}) and old_values ({len(v)}) must have one number per "
                    f"response token ({len(s.response_ids)})"
                )
        rows = [
            s.with_(logprobs=(), ref_logprobs=tuple(map(float, r)), values=tuple(map(float, v)))
            for s, r, v in zip(samples, returns, old_values, strict=True)
        ]
        total_tokens = sum(len(s.response_ids) for s in samples)
        if total_tokens == 0:
            return 0.0
        with self._lock:
            self.model.train()
            self.optimizer.zero_grad(set_to_none=True)
            total = 0.0
            mbs = _microbatches(rows, self.microbatch_size)
            for index, mb in split_rounds(mbs, self.rank, self.world):
                batch = collate(mb, self.pad_token_id)
                # collate put the returns in ref_logprobs and the old values in values: same [B, R] layout
                loss, _ = clipped_value_loss(
                    self._values(batch),
                    batch.values,
                    batch.ref_logprobs,
                    batch.response_mask,
                    clip_range=self.value_clip,
                    aggregation="token_mean",
                )
                weight = float(batch.response_mask.sum()) / total_tokens if index >= 0 else 0.0
                # Sharded ranks' gradients are averaged over the world: scaled up, they add up instead.
                (loss * weight * self.world).backward()
                total += float(loss.detach()) * weight
            if self.world > 1:
                summed = torch.tensor([total], dtype=torch.float64, device=collective_device())
                dist.all_reduce(summed)
                total = float(summed)
            optimizer_step(
                self.optimizer, self.model.parameters(), max_grad_norm=self.max_grad_norm, clear_grads=True
            )
            self.model.eval()
            self.version += 1
        return total


class RewardWorker:
    """Scores completions with `decentralized_verl.rewards` (the code sandbox runs here) or a reward model.

    Never raises for a bad completion: every failure scores 0.0 with a reason. Runs only the reward
    types the job configures (`allowed_types`): a request names a type, it never chooses code.
    """

    def __init__(
        self,
        reward_type: str | None = None,
        scorer: Any = None,
        *,
        workers: int = 1,
        environment: Any = None,
        **options: Any,
    ) -> None:
        """`environment`: the job's `data.environment` (or `EpisodeSettings`), to score episodes by replay."""
        self.reward_type = reward_type
        self.scorer = scorer
        self.workers = workers
        self.environment = episode_settings(environment)
        self.options = options
        self.worker_id = "reward"
        self.errors = RewardErrorLog()

    def allows(self, kind: str) -> bool:
        """Whether this worker runs reward `kind`: the job's own type (a built-in, or the user's
        `module:function` its spec names) and the replay of the job's own environment; a worker given
        no type (open volunteers, library use) runs only rewards shipped with the package. A request
        names a type; it never chooses code."""
        if kind == ENVIRONMENT_REWARD:
            return True
        if self.reward_type is not None:
            return kind == self.reward_type
        return servable_reward(kind, has_reward_model=True) is None

    def refusal(self, items: Sequence[ScoreItem]) -> str | None:
        """Why a request may not be scored here (the first item naming a type this worker does not
        run), or None."""
        for i, it in enumerate(items):
            if not self.allows(it.reward_type):
                mine = self.reward_type or "the rewards shipped with decentralized-verl"
                kind = it.reward_type[:80]
                return f"items[{i}].reward_type: {kind!r} is not a reward type of this job ({mine})"
        return None

    @classmethod
    def from_spec(cls, spec: Any, *, device: Any = None, workers: int = 1) -> RewardWorker:
        scorer = None
        if spec.data.reward_type == "reward_model":
            model, tokenizer = load_sequence_classifier(
                spec.data.reward_model, device=device, field="spec.data.rewardModel"
            )
            scorer = RewardModelScorer(model, tokenizer, device=device)
        return cls(spec.data.reward_type, scorer, workers=workers, environment=spec.data.environment)

    def score(self, samples: Sequence[Sample], reward_type: str | None = None) -> list[tuple[float, str]]:
        kind = reward_type or self.reward_type
        if kind is None:
            return [(0.0, "no reward type given")] * len(samples)
        items = [ScoreItem.of(s, kind) for s in samples]
        return [(sc.score, sc.reason) for sc in self.score_items(items)]

    def score_items(self, items: Sequence[ScoreItem]) -> list[Score]:
        """Scores in request order; items are grouped by reward type so a reward model runs batched."""
        out: list[Score | None] = [None] * len(items)
        groups: dict[str, list[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault(it.reward_type, []).append(i)
        for kind, index in groups.items():
            if not self.allows(kind):  # never imported, never run
                for i in index:
                    out[i] = Score(0.0, f"reward type {kind[:80]!r} is not one this job configures")
                continue
            if kind == ENVIRONMENT_REWARD:  # sandboxed tools run in child processes: replay side by side
                with ThreadPoolExecutor(max_workers=max(1, min(len(index), 8))) as pool:
                    replayed = pool.map(self._replay, [items[i] for i in index])
                    for i, score in zip(index, replayed, strict=True):
                        out[i] = score
                continue
            options = dict(self.options)
            if kind == "reward_model":
                options["scorer"] = self.scorer
            try:
                results = score_batch(
                    kind,
                    [items[i].completion_text for i in index],
                    [items[i].ground_truth for i in index],
                    prompts=[items[i].prompt_text for i in index],
                    workers=self.workers,
                    **options,
                )
            except Exception as exc:  # a reward bug must not take the worker down
                why = f"{kind} raised {type(exc).__name__}: {exc}"[:300]
                results = [failed(why, traceback=format_exc(limit=-8))] * len(index)
            for i, r in zip(index, results, strict=True):
                if not _finite(r.score):
                    r = failed(f"non-finite score ({r.score}) from {kind}")
                self.errors.note(r, items[i])
                out[i] = Score(float(r.score), r.reason)
        return [s for s in out if s is not None]

    def _replay(self, item: ScoreItem) -> Score:
        """An episode's reward: its environment played again here on the model's turns (`replay.py`)."""
        if self.environment is None:
            return Score(0.0, "the environment reward needs the job's data.environment")
        try:
            episode = parse_transcript(item.completion_text)
        except ValueError as exc:
            return Score(0.0, f"malformed episode: {exc}")
        result = replay(
            self.environment,
            episode.turns,
            prompt_id=episode.prompt_id,
            ground_truth=item.ground_truth,
            prompt_text=item.prompt_text,
        )
        return Score(float(result.score), result.reason)


class RewardErrorLog:
    """A failed reward, once per distinct failure, in this worker's log with the sample it failed on and
    the traceback: the score that travels on says only what failed; here is what to debug it with. Each
    failure is logged the first time it is seen (up to `distinct` of them), then only counted."""

    def __init__(self, distinct: int = 20) -> None:
        self.distinct = distinct
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def note(self, result: Any, item: ScoreItem) -> None:
        if not is_reward_error(result.reason):
            return
        with self._lock:
            first = result.reason not in self.counts
            if first and len(self.counts) >= self.distinct:
                return
            self.counts[result.reason] = self.counts.get(result.reason, 0) + 1
        if first:
            trace = (result.details or {}).get("traceback", "")
            log.warning(
                "%s\n  on the sample: prompt=%.300r\n  completion=%.300r\n  reference=%.200r%s",
                result.reason, item.prompt_text, item.completion_text, item.ground_truth,
                f"\n{trace.rstrip()}" if trace else "",
            )  # fmt: skip


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))
