"""Continuing a response from a prefix another worker produced before it was cut off (partial rollout).

A rollout worker sends the prefix of each unfinished response now and then (`finish_reason` partial).
When its share is late or it fails, dispatch hands each of its unanswered items to another worker: from the
newest prefix it holds when there is one, as a prompt extended by that prefix with the remaining token
budget, so the tokens already generated are not generated again. The two parts are stitched into one
sample tagged with the worker and policy version of each part (`Sample.parts`); each token keeps the
log-prob of the policy that sampled it, so the learner's importance correction treats a part from an
older policy like any off-policy token. Multi-turn episodes are never continued (their prefixes hold
environment turns); they are regenerated.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

from decentralized_verl.core.interfaces import WorkItem
from decentralized_verl.core.samples import Sample
from decentralized_verl.core.sampling import SamplingParams

Key = tuple[str, int]


def usable_prefix(prefix: Sample | None, sampling: SamplingParams) -> bool:
    """Whether `prefix` can be continued: a single completion with tokens and budget left for more."""
    return (
        prefix is not None
        and not prefix.prompt.environment
        and 0 < len(prefix.response_ids) < sampling.max_new_tokens
    )


def continuation_seed(seed: int | None, prefix_tokens: int) -> int | None:
    """A continuation's own seed: its draws are not the first draws of the prefix's stream."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}\x00continue\x00{prefix_tokens}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


@dataclasses.dataclass(frozen=True)
class Group:
    """Items one call generates: fresh ones (no prefixes) or continuations of prefixes of one length."""

    items: list[WorkItem]
    sampling: SamplingParams
    prefixes: dict[Key, Sample]


def groups(
    share: Sequence[WorkItem], partials: Mapping[Key, Sample], sampling: SamplingParams
) -> list[Group]:
    """Split a share into fresh items and continuations (one group per prefix length: the remaining
    budget is per call). A continuation's prompt is the original prompt followed by the prefix."""
    fresh: list[WorkItem] = []
    by_length: dict[int, Group] = {}
    for prompt, index in share:
        prefix = partials.get((prompt.prompt_id, index))
        if prefix is None or not usable_prefix(prefix, sampling):
            fresh.append((prompt, index))
            continue
        n = len(prefix.response_ids)
        group = by_length.get(n)
        if group is None:
            rest = dataclasses.replace(
                sampling, max_new_tokens=sampling.max_new_tokens - n, seed=continuation_seed(sampling.seed, n)
            )
            group = by_length[n] = Group([], rest, {})
        extended = dataclasses.replace(prompt, token_ids=tuple(prompt.token_ids) + prefix.response_ids)
        group.items.append((extended, index))
        group.prefixes[(prompt.prompt_id, index)] = prefix
    out = [Group(fresh, sampling, {})] if fresh else []
    return out + [by_length[n] for n in sorted(by_length)]


def stitch(prefix: Sample, rest: Sample) -> Sample:
    """The prefix followed by its continuation, as one sample of the original prompt."""
    if rest.key != prefix.key:
        raise ValueError(f"continuation {rest.key} does not continue prefix {prefix.key}")
    parts = prefix.parts or ((prefix.worker_id, prefix.policy_version, len(prefix.response_ids)),)
    extra = dict(rest.extra)
    extra["generation_seconds"] = prefix.extra.get("generation_seconds", 0.0) + rest.extra.get(
        "generation_seconds", 0.0
    )
    extra["continued_tokens"] = float(len(prefix.response_ids))
    return rest.with_(
        prompt=prefix.prompt,
        response_ids=prefix.response_ids + rest.response_ids,
        logprobs=prefix.logprobs + rest.logprobs,
        text=prefix.text + rest.text,
        policy_version=min(prefix.policy_version, rest.policy_version),
        parts=(*parts, (rest.worker_id, rest.policy_version, len(rest.response_ids))),
        extra=extra,
    )


def newer(partials: dict[Key, Sample], sample: Sample) -> None:
    """Keep `sample` (a prefix) as its item's prefix if it is longer than the one held."""
    held = partials.get(sample.key)
    if held is None or len(sample.response_ids) > len(held.response_ids):
        partials[sample.key] = sample
