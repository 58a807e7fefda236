"""The transformers generation backend: our own batched sampling loop over a causal LM with a KV cache.

We do not call ``model.generate``: the RL loss needs the exact log-probability of each sampled token
under the sampling distribution's convention (see ``GenerationOutput``), stop strings must be checked
on decoded text, and a seed must make a response independent of its batch-mates. The loop is:

1. expand requests into rows (``n`` per prompt), sort by prompt length, cut into micro-batches;
2. left-pad the micro-batch's distinct prompts, with position ids counted from each row's first real
   token, and run one prefill forward pass that fills a ``DynamicCache``; copy each prompt's cache to
   its rows (a GRPO group's samples share one prompt pass); full-attention layers write into buffers
   sized for the whole generation (`kv_cache.decode_cache`), so a step does not copy the cache;
3. per step: sample one token per live row, record its log-prob, check end-of-sequence / stop strings /
   length, drop finished rows from the batch and the cache, and feed the new tokens.

Weights are replaced in place between micro-batches (``load_weights``), under a lock shared with
generation, so each output carries the version that actually produced it.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from decentralized_verl.backends.base import FinishReason, GenerationOutput, GenerationRequest, SamplingParams
from decentralized_verl.backends.weight_copy import plan_weight_copy
from decentralized_verl.core.kv_cache import cache_keyword, decode_cache

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads (seed, sample_index) pairs over the 63-bit seed space
_SEED_MASK = (1 << 63) - 1


def row_seed(seed: int, sample_index: int) -> int:
    """The generator seed for sample ``sample_index`` of a request seeded with ``seed`` (the rollout worker
    gives each (prompt, sample) item its own request seed, `core.seeds.item_seed`)."""
    return (seed * _SEED_MIX + sample_index * 0x632BE59BD9B4E019 + 1) & _SEED_MASK


def filter_logits(scaled: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Set to -inf the logits that top-k, then top-p (nucleus), remove; one row per sample.

    ``top_k[i] == 0`` and ``top_p[i] >= 1`` disable the filters for row ``i``. Top-p is applied to the
    distribution renormalized after top-k (the usual warper order); a token is removed when the
    probability mass strictly before it, in descending order, has already reached ``top_p``, so the
    most likely token always survives.
    """
    vocab = scaled.shape[-1]
    if bool((top_k == 0).all()) and bool((top_p >= 1).all()):
        return scaled
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device)
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
    sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)


def sampling_probs(logprobs: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """The distribution a row's token is drawn from: its log-probs (at the sampling temperature) after
    top-k and top-p. One home for it: the sampler draws from it, and a verifier replays a seeded draw
    against it (`volunteers.sampling_check`)."""
    filtered = filter_logits(logprobs, top_k, top_p)
    # Unfiltered log-probs are already normalized: exp is the distribution, no second softmax.
    return filtered.exp() if filtered is logprobs else filtered.softmax(dim=-1)


def sample_tokens(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    generators: Sequence[torch.Generator],
) -> tuple[Tensor, Tensor]:
    """Draw one token per row and return (tokens, log-probs).

    The log-prob is ``log_softmax(logits / T)`` of the drawn token, before filtering (T = 1 for greedy
    rows, which have ``temperature == 0`` and take the argmax). Rows sharing one generator object draw
    their uniforms in one call, in row order.
    """
    logits = logits.float()
    greedy = temperature == 0
    if bool((temperature == 1).all()):
        scaled = logits  # the common case: no division pass over the vocabulary
    else:
        scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    sampled_rows = (~greedy).nonzero().flatten().tolist()
    tokens = logits.argmax(dim=-1) if len(sampled_rows) < len(greedy) else None
    if sampled_rows:
        every_row = len(sampled_rows) == len(greedy)
        index = torch.tensor(sampled_rows, device=logits.device)
        rows_logprobs = logprobs_all if every_row else logprobs_all[index]
        rows_top_k, rows_top_p = (top_k, top_p) if every_row else (top_k[index], top_p[index])
        probs = sampling_probs(rows_logprobs, rows_top_k, rows_top_p)
        # Inverse-CDF sampling: one uniform per row from the row's own generator (rows sharing one draw
        # in row order), then one batched search. Exact, and unlike a `multinomial` per seeded row it
        # costs one scalar draw per row instead of a pass over the vocabulary per row.
        uniform = torch.empty(len(sampled_rows), device=logits.device)
        by_generator: dict[int, tuple[torch.Generator, list[int]]] = {}
        for position, row in enumerate(sampled_rows):
            gen = generators[row]
            by_generator.setdefault(id(gen), (gen, []))[1].append(position)
        for gen, positions in by_generator.values():
            drawn_on = gen.device  # a seeded row's generator is on the CPU: its draws replay on any device
            uniform[positions] = torch.rand(len(positions), generator=gen, device=drawn_on).to(logits.device)
        cdf = probs.cumsum(dim=-1)
        # First index whose cdf exceeds u * total: a zero-probability token can never be that index.
        drawn = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).flatten()
        past_end = drawn >= cdf.shape[-1]  # u * total rounded up to total (~2^-24): take the mode
        if bool(past_end.any()):
            drawn = torch.where(past_end, probs.argmax(dim=-1), drawn)
        if tokens is None:
            tokens = drawn
        else:
            tokens[index] = drawn
    assert tokens is not None
    chosen = logprobs_all.gather(-1, tokens[:, None]).flatten()
    return tokens, chosen


def find_stop(text: str, stops: Iterable[str], search_from: int = 0) -> int | None:
    """End index (exclusive) of the earliest-ending stop string in ``text[search_from:]``, else None."""
    best: int | None = None
    for stop in stops:
        start = text.find(stop, search_from)
        if start >= 0:
            end = start + len(stop)
            best = end if best is None else min(best, end)
    return best


@dataclass
class _Row:
    """One response being generated: which request it answers and what it has produced so far."""

    prompt_id: str
    sample_index: int
    prompt: tuple[int, ...]
    params: SamplingParams
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    checked_chars: int = 0
    finish: FinishReason | None = None
    text: str | None = None


class HFBackend:
    """A transformers causal LM behind the ``GenerationBackend`` protocol.

    ``max_batch_size`` bounds the rows (responses) decoded together. ``seed`` seeds the generator of
    requests without a seed of their own. ``eos_token_ids`` overrides the end-of-sequence tokens (by
    default the tokenizer's and the model's generation config's, together). ``load_weights`` must not
    race with a running ``generate`` micro-batch: it waits for it (one lock guards both).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        version: int = 0,
        seed: int = 0,
        eos_token_ids: Iterable[int] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be >= 1 (got {max_batch_size})")
        self.model = model.eval()
        self._tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self._version = version
        self._lock = threading.RLock()
        self.device = next(model.parameters()).device
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)
        self.eos_token_ids = frozenset(eos_token_ids if eos_token_ids is not None else self._default_eos())
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else min(self.eos_token_ids, default=0)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters

        self._cache_keyword = cache_keyword(model)

    def _default_eos(self) -> set[int]:
        ids: set[int] = set()
        for source in (
            self._tokenizer.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif source is not None:
                ids.update(int(i) for i in source)
        return ids

    @property
    def version(self) -> int:
        return self._version

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    # ---------------------------------------------------------------- generation

    def generate(
        self, requests: Sequence[GenerationRequest], partial_every_s: float | None = None
    ) -> Iterator[GenerationOutput]:
        """Yield every response of every request, a micro-batch at a time (order: by prompt length).

        With `partial_every_s`, also yield each unfinished response's prefix (finish reason `partial`)
        that often while its micro-batch decodes (0: after every token), so a worker cut off mid-batch
        leaves work another can continue. All requests are validated here, before any work starts, so a
        bad one fails the call itself (not some later batch).
        """
        rows = self._rows(requests)
        rows.sort(key=lambda r: len(r.prompt))  # stable: a prompt's samples stay adjacent
        return self._batches(rows, partial_every_s)

    def _batches(self, rows: list[_Row], partial_every_s: float | None) -> Iterator[GenerationOutput]:
        for start in range(0, len(rows), self.max_batch_size):
            batch = rows[start : start + self.max_batch_size]
            with self._lock:
                version = self._version
                began = last = time.perf_counter()
                for _ in self._run_batch(batch):
                    now = time.perf_counter()
                    if partial_every_s is None or now - last < partial_every_s:
                        continue
                    last = now
                    for row in batch:
                        if row.finish is None and row.tokens:
                            yield self._output(row, "partial", version, now - began)
                seconds = time.perf_counter() - began
            for row in batch:
                assert row.finish is not None
                yield self._output(row, row.finish, version, seconds)

    def _output(self, row: _Row, finish: FinishReason, version: int, seconds: float) -> GenerationOutput:
        """What `row` holds now; a prefix (`partial`) is decoded here."""
        text = row.text if finish != "partial" else None
        if text is None:
            text = self._tokenizer.decode(row.tokens, skip_special_tokens=True)
        return GenerationOutput(
            prompt_id=row.prompt_id,
            sample_index=row.sample_index,
            prompt_token_ids=row.prompt,
            response_token_ids=tuple(row.tokens),
            logprobs=tuple(row.logprobs),
            finish_reason=finish,
            text=text,
            policy_version=version,
            seconds=seconds,
        )

    def _rows(self, requests: Sequence[GenerationRequest]) -> list[_Row]:
        vocab = self.model.get_input_embeddings().num_embeddings
        rows: list[_Row] = []
        for request in requests:
            prompt = tuple(int(t) for t in request.prompt_token_ids)
            where = f"request {request.prompt_id!r}"
            if any(t < 0 or t >= vocab for t in prompt):
                raise ValueError(f"{where}: prompt token ids must be in [0, {vocab})")
            needed = len(prompt) + request.params.max_new_tokens
            if self.max_positions is not None and needed > self.max_positions:
                raise ValueError(
                    f"{where}: prompt ({len(prompt)} tokens) + max_new_tokens "
                    f"({request.params.max_new_tokens}) exceeds the model's {self.max_positions} positions"
                )
            for index in range(request.params.n):
                if request.params.seed is None:
                    gen = self._generator
                else:
                    # On the CPU whatever the device: the same seed draws the same uniforms on a GPU
                    # volunteer and on the coordinator that replays its draws to check them.
                    gen = torch.Generator()
                    gen.manual_seed(row_seed(request.params.seed, index))
                rows.append(_Row(request.prompt_id, index, prompt, request.params, gen))
        return rows

    @torch.no_grad()
    def _run_batch(self, rows: list[_Row]) -> Iterator[None]:
        """Decode `rows` to their end, yielding after each token step (where prefixes may be reported)."""
        device = self.device
        # Each distinct prompt is prefilled once: a GRPO group's n samples share one prompt, and the prompt
        # pass is most of a short answer's cost. Its keys/values are then copied to every row of the group.
        distinct: dict[tuple[int, ...], int] = {}
        owner = [distinct.setdefault(row.prompt, len(distinct)) for row in rows]
        prompts = list(distinct)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long, device=device)
        attention = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, device=device)
            attention[i, width - len(prompt) :] = 1
        positions = (attention.cumsum(dim=-1) - 1).clamp(min=0)

        temperature = torch.tensor([float(r.params.temperature) for r in rows], device=device)
        top_k = torch.tensor([r.params.top_k for r in rows], device=device)
        top_p = torch.tensor([float(r.params.top_p) for r in rows], device=device)
        live = list(range(len(rows)))  # batch position -> index into rows

        capacity = width + max(r.params.max_new_tokens for r in rows)
        cache = self._new_cache(capacity)
        logits = self._forward(input_ids, attention, positions, cache)
        if len(prompts) < len(rows):
            to_rows = torch.tensor(owner, device=device)
            cache.batch_select_indices(to_rows)
            logits, attention, positions = logits[to_rows], attention[to_rows], positions[to_rows]
        next_position = positions[:, -1] + 1

        while True:
            tokens, logprobs = sample_tokens(
                logits, temperature, top_k, top_p, [rows[i].generator for i in live]
            )
            keep: list[int] = []
            for b, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
                row = rows[live[b]]
                row.tokens.append(token)
                row.logprobs.append(logprob)
                if not self._check_finished(row, token):
                    keep.append(b)
            if not keep:
                return
            yield
            if len(keep) < len(live):
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attention, next_position = attention[index], next_position[index]
                temperature, top_k, top_p = temperature[index], top_k[index], top_p[index]
                tokens = tokens[index]
                live = [live[b] for b in keep]
            attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=-1)
            logits = self._forward(tokens[:, None], attention, next_position[:, None], cache)
            next_position = next_position + 1

    def _new_cache(self, capacity: int) -> Any:
        """One micro-batch's cache for ``capacity`` positions (a span chain's front returns a session)."""
        return decode_cache(self.model.config, capacity)

    def _forward(self, input_ids: Tensor, attention: Tensor, positions: Tensor, cache: Any) -> Tensor:
        """Logits of the last position of each row, float32."""
        extra = {"logits_to_keep": 1} if self._logits_to_keep else {}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **{self._cache_keyword: cache},
            **extra,
        )
        return out.logits[:, -1, :].float()

    def _check_finished(self, row: _Row, token: int) -> bool:
        """Record why ``row`` ends after ``token``, if it does (stop beats length when both hold)."""
        params = row.params
        if token in self.eos_token_ids:
            row.finish = "stop"
        elif params.stop:
            text = self._tokenizer.decode(row.tokens, skip_special_tokens=True)
            longest = max(len(s) for s in params.stop)
            end = find_stop(text, params.stop, max(0, min(row.checked_chars, len(text)) - longest + 1))
            row.checked_chars = len(text)
            if end is not None:
                row.finish, row.text = "stop", text[:end]
                return True
        if row.finish is None and len(row.tokens) >= params.max_new_tokens:
            row.finish = "length"
        if row.finish is not None:
            row.text = self._tokenizer.decode(row.tokens, skip_special_tokens=True)
            return True
        return False

    # ---------------------------------------------------------------- weights

    def load_weights(self, state_dict: Mapping[str, Tensor], version: int, *, partial: bool = False) -> None:
        """Copy ``state_dict`` into the model in place and set ``version`` (``partial``: plan_weight_copy).

        Every tensor is checked first (names, shapes, dtypes; a missing or unexpected name is an error)
        and only then copied, so a bad state dict changes nothing. Tied weights (one tensor under two
        names, e.g. ``lm_head.weight`` and ``model.embed_tokens.weight``) need only one of their names;
        if several are given they must agree in shape and dtype, and the first one is copied.
        """
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version: must be an integer >= 0 (got {version!r})")
        plan = plan_weight_copy(self.model, state_dict, partial=partial)
        with self._lock, torch.no_grad():
            for target, source in plan:
                target.copy_(source)
            self._version = version

    def mark_version(self, version: int) -> None:
        """The weights were changed in place by their owner (a learner sharing this model); only relabel.

        Colocated rollout (roles.rollout.replicas 0) generates with the learner's own model object, so
        a new policy version needs no copy at all.
        """
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version: must be an integer >= 0 (got {version!r})")
        with self._lock:
            self._version = version
