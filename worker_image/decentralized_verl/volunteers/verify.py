"""Re-checking untrusted results on the trusted side.

A volunteer's claimed log-probs must be what the policy of the claimed version assigns to the claimed
tokens (recomputed here with the same forward pass the learner trains with); a verifiable reward is
recomputed by the trusted reward function. A configurable fraction of every volunteer batch is checked;
one mismatch beyond tolerance rejects the whole batch (it is re-dispatched) and blocks the peer.
Which samples are checked is drawn from the operating system's randomness (`os.urandom`), never from
anything a volunteer is told (the job's `training.seed` reaches every volunteer with the spec): a
volunteer that could predict the picks would cheat only on the samples nobody looks at.
Altered tokens are caught too: their claimed log-probs were computed for other tokens. And a response
the volunteer chose rather than sampled, even with honest log-probs, is caught by replaying its seeded
draws (`sampling_check`): every request carries a seed the coordinator picked.
Wrong versions, shapes and NaNs never get here (`transport.messages.completion_from_proto`).
"""

from __future__ import annotations

import copy
import math
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.samples import Sample, collate
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.environments.rollout import EpisodeRunner
from decentralized_verl.environments.settings import EpisodeSettings
from decentralized_verl.environments.verify import episode_problem
from decentralized_verl.transport.weights.codec import cast_like
from decentralized_verl.transport.weights.receive import decode_held
from decentralized_verl.volunteers.sampling_check import (
    DEFAULT_TOL,
    checkable,
    response_logits,
    sample_problem,
)

DEFAULT_ATOL = {"float32": 0.02, "float16": 0.1, "bfloat16": 0.25}
"""Largest |claimed - recomputed| per token accepted: incremental decoding and a full forward differ by
rounding only (~1e-5 in float32); a forged value differs by far more."""


@dataclass(frozen=True)
class Mismatch:
    key: tuple[str, int]
    what: str

    def __str__(self) -> str:
        return f"{self.key[0]}#{self.key[1]}: {self.what}"


def choose_for_check(n: int, fraction: float, rng: random.Random) -> list[int]:
    """Indices to re-check: ceil(fraction * n) of n, at random (at least one when fraction > 0)."""
    if n <= 0 or fraction <= 0:
        return []
    k = min(n, max(1, math.ceil(fraction * n - 1e-9)))
    return sorted(rng.sample(range(n), k))


def compare_logprobs(
    key: tuple[str, int],
    claimed: Sequence[float],
    recomputed: Sequence[float],
    atol: float,
    mask: Sequence[int] | None = None,
) -> Mismatch | None:
    """The worst token beyond `atol`, among the tokens the policy generated (`mask`: a multi-turn
    episode's loss mask; the environment's tokens have no claimed log-probs)."""
    if len(claimed) != len(recomputed):
        return Mismatch(key, f"{len(claimed)} log-probs for {len(recomputed)} tokens")
    worst, where = 0.0, -1
    for i, (a, b) in enumerate(zip(claimed, recomputed, strict=True)):
        if mask is not None and not mask[i]:
            continue
        diff = abs(a - b) if math.isfinite(a) else math.inf
        if diff > worst:
            worst, where = diff, i
    if worst > atol:
        return Mismatch(
            key,
            f"log-prob of token {where} is {claimed[where]:.4f}, recomputed {recomputed[where]:.4f} "
            f"(|diff| {worst:.4f} > {atol:g})",
        )
    return None


def compare_scores(
    keys: Sequence[tuple[str, int]], claimed: Sequence[float], recomputed: Sequence[float], atol: float = 1e-6
) -> list[Mismatch]:
    """For reward volunteers: claimed scores against the trusted reward function's."""
    return [
        Mismatch(k, f"score {a:g}, recomputed {b:g}")
        for k, a, b in zip(keys, claimed, recomputed, strict=True)
        if not (math.isfinite(a) and abs(a - b) <= atol)
    ]


def model_logprobs(
    model, samples: Sequence[Sample], temperature: float, pad_token_id: int, microbatch: int = 8
) -> list[tuple[float, ...]]:
    """log p(response token | prefix) under `model` for each sample, in the learner's layout."""
    out: list[tuple[float, ...]] = []
    with torch.no_grad():
        for start in range(0, len(samples), microbatch):
            mb = list(samples[start : start + microbatch])
            batch = collate(mb, pad_token_id)
            logp, _ = response_logprobs(model, batch, temperature)
            out.extend(tuple(logp[i, : len(s.response_ids)].tolist()) for i, s in enumerate(mb))
    return out


class PublishedPolicy:
    """The policy of any version the learner still publishes, in a private model copy.

    Verification runs while the colocated rollout generates and never touches the learner's model; the
    copy is loaded from the publisher's (hash-checked) bundle of exactly the claimed version.
    """

    def __init__(self, model, publisher, temperature: float, pad_token_id: int) -> None:
        self.model = model.eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.publisher = publisher
        self.temperature = temperature
        self.pad_token_id = pad_token_id
        self.version: int | None = None
        self._lock = threading.Lock()

    def _load(self, version: int) -> None:
        held = self.publisher.get(version)
        if held is None:
            raise LookupError(f"policy version {version} is no longer held (held: {self.publisher.versions})")
        state = cast_like(decode_held(held), self.model.state_dict())
        self.model.load_state_dict(state, strict=False)
        self.version = version

    def logprobs(self, samples: Sequence[Sample], version: int) -> list[tuple[float, ...]]:
        with self._lock:
            if self.version != version:
                self._load(version)
            return model_logprobs(self.model, samples, self.temperature, self.pad_token_id)

    def draw_problems(
        self, samples: Sequence[Sample], version: int, sampling: SamplingParams, tol: float
    ) -> list[str | None]:
        """For each sample: None when its tokens are the seeded draws from this version's policy."""
        with self._lock:
            if self.version != version:
                self._load(version)
            every = response_logits(self.model, list(samples), self.pad_token_id)
            return [
                sample_problem(logits, s, sampling, tol) for s, logits in zip(samples, every, strict=True)
            ]


@dataclass
class CheckResult:
    checked: int
    mismatches: list[Mismatch]

    @property
    def ok(self) -> bool:
        return not self.mismatches


class Verifier:
    """Checks `fraction` of each batch against `policy` (anything with `logprobs(samples, version)`);
    `episodes` (a multi-turn job's check, `sample -> problem or None`) rebuilds each chosen episode."""

    def __init__(
        self,
        policy,
        *,
        fraction: float,
        atol: float = 0.02,
        episodes: Callable[[Sample], str | None] | None = None,
        draw_tol: float | None = None,
        picks: random.Random | None = None,
    ) -> None:
        """`draw_tol`: replay each checked sample's seeded draws (every model turn of an episode) within
        this probability mass (`sampling_check`); None checks log-probs only (a backend whose sampler
        cannot be replayed). `picks`: where the choice of samples to check comes from; the default,
        `random.SystemRandom`, is the only one a volunteer cannot predict (a seeded generator is for
        tests that need to know the picks)."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"verify fraction must be in [0, 1] (got {fraction})")
        self.policy = policy
        self.episodes = episodes
        self.draw_tol = draw_tol
        self.fraction = fraction
        self.atol = atol
        self._rng = picks if picks is not None else random.SystemRandom()
        self._rng_lock = threading.Lock()
        self.checked = 0
        self.rejected_batches = 0

    def check(
        self, samples: Sequence[Sample], version: int, sampling: SamplingParams | None = None
    ) -> CheckResult:
        """Check a sampled fraction of `samples`, asked at policy `version` with `sampling` (the request's:
        its seed lets the draws be replayed)."""
        with self._rng_lock:
            picked = choose_for_check(len(samples), self.fraction, self._rng)
        if not picked:
            return CheckResult(0, [])
        chosen = [samples[i] for i in picked]
        wrong = [
            Mismatch(s.key, f"claims policy v{s.policy_version}, asked v{version}")
            for s in chosen
            if s.policy_version != version
        ]
        if not wrong and self.episodes is not None:
            for s in chosen:
                problem = (
                    self.episodes(s) if s.loss_mask is not None else "a single completion for an episode"
                )
                if problem is not None:
                    wrong.append(Mismatch(s.key, f"episode: {problem}"))
        if not wrong:
            recomputed = self.policy.logprobs(chosen, version)
            for s, values in zip(chosen, recomputed, strict=True):
                problem = compare_logprobs(s.key, s.logprobs, values, self.atol, s.loss_mask)
                if problem is not None:
                    wrong.append(problem)
        if not wrong and self.draw_tol is not None and sampling is not None and checkable(sampling):
            draws = self.policy.draw_problems(chosen, version, sampling, self.draw_tol)
            wrong.extend(Mismatch(s.key, p) for s, p in zip(chosen, draws, strict=True) if p is not None)
        self.checked += len(chosen)
        if wrong:
            self.rejected_batches += 1
        return CheckResult(len(chosen), wrong)


def verifier_for(
    model,
    publisher,
    *,
    temperature: float,
    pad_token_id: int,
    fraction: float,
    atol=None,
    episodes: Callable[[Sample], str | None] | None = None,
    replay_draws: bool = True,
) -> Verifier | None:
    """A verifier over a private copy of `model` (None when nothing is to be checked); `atol` defaults to
    the model dtype's tolerance in DEFAULT_ATOL; `episodes` checks a multi-turn job's episodes
    (`episode_check`). `replay_draws`: also replay each checked response's seeded draws (the hf
    backend's sampler; another engine's draws cannot be replayed here)."""
    if fraction <= 0:
        return None
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    policy = PublishedPolicy(copy.deepcopy(model), publisher, temperature, pad_token_id)
    tolerance = atol if atol is not None else DEFAULT_ATOL.get(dtype, 0.25)
    draw_tol = DEFAULT_TOL.get(dtype, 0.05) if replay_draws else None
    return Verifier(policy, fraction=fraction, atol=tolerance, episodes=episodes, draw_tol=draw_tol)


def episode_check(spec, tokenizer, model) -> Callable[[Sample], str | None] | None:
    """For a job with `data.environment`: rebuild a volunteer's episode from its model tokens
    (`environments.verify`); None for single-turn jobs."""
    if spec.data.environment is None:
        return None

    runner = EpisodeRunner(
        EpisodeSettings.from_spec(spec.data.environment),
        tokenizer,
        eos_token_ids=_eos_ids(model, tokenizer),
        context_tokens=getattr(getattr(model, "config", None), "max_position_embeddings", None),
    )
    stop = tuple(spec.data.stop)
    return lambda sample: episode_problem(runner, sample, spec.data.max_new_tokens, stop)


def _eos_ids(model, tokenizer) -> set[int]:
    """The end-of-sequence ids a generation backend stops on (the tokenizer's and the model's)."""
    ids: set[int] = set()
    for source in (
        tokenizer.eos_token_id,
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return ids
