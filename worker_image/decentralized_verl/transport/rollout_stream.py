"""One rollout request and the rules for its streamed answers, shared by every transport.

In-cluster workers answer over gRPC and volunteers over Hivemind P2P streams, but a coordinator must ask
them the same way and hold their answers to the same rules: each result valid on its own (see
`completion_from_proto`), no sample answered twice, none left out. Keeping those rules in one place means
a volunteer can never get away with something an in-cluster worker could not.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from decentralized_verl.core.interfaces import WorkItem
from decentralized_verl.core.samples import Prompt, Sample
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m

Key = tuple[str, int]
"""(prompt id, sample index)."""


class BadResult(Exception):
    """A worker's answer broke the contract; the message says which result and how."""


def generate_request(
    items: Sequence[WorkItem], sampling: SamplingParams, version: int
) -> tuple[m.GenerateBatch, dict[Key, Prompt]]:
    """The wire request for `items` at policy `version`, and the coordinator's prompts by key."""
    prompts = {(p.prompt_id, i): p for p, i in items}
    batch = m.GenerateBatch(
        request_id=uuid.uuid4().hex,
        policy_version=version,
        sampling=dataclasses.replace(sampling, n=1),
        items=tuple(_item(p, i) for p, i in items),
    )
    return batch, prompts


def _item(prompt: Prompt, sample_index: int) -> m.GenerateItem:
    """A work item on the wire; its record (reference, text) only when an environment plays on it."""
    if prompt.environment:
        return m.GenerateItem(
            prompt.prompt_id, sample_index, tuple(prompt.token_ids), prompt.ground_truth, prompt.text
        )
    return m.GenerateItem(prompt.prompt_id, sample_index, tuple(prompt.token_ids))


@dataclass
class ResultStream:
    """Checks a request's results one by one as they arrive and turns them into Samples."""

    request: m.GenerateBatch
    prompts: dict[Key, Prompt]
    worker_id: str
    limits: m.WireLimits
    expected_version: int | None = None
    max_staleness: int = 0
    allow_newer: bool = False
    """Async RL: accept samples from a version published after the request (see `_check_version`)."""
    answered: dict[Key, int] = field(default_factory=dict)
    """Key -> index of the result that answered it."""

    partials: int = 0
    """Prefixes received so far (`finish_reason` partial): progress of results not yet answered."""

    def accept(self, msg: pb.GenerateResult) -> Sample:
        """The result as a Sample; a partial one (a prefix, not an answer) has `finish_reason` partial."""
        index = len(self.answered) + self.partials
        path = f"results[{index}]"
        try:
            c = m.completion_from_proto(
                msg,
                limits=self.limits,
                request=self.request,
                expected_version=self.expected_version,
                max_staleness=self.max_staleness,
                path=path,
                allow_newer=self.allow_newer,
            )
        except WireError as exc:
            raise BadResult(f"bad result: {exc}") from None
        if c.key in self.answered:
            raise BadResult(
                f"bad result: {path}: sample {c.sample_index} of prompt {c.prompt_id!r} "
                f"already answered by results[{self.answered[c.key]}]"
            )
        prompt = self.prompts[c.key]
        if prompt.environment != (c.episode is not None):
            asked = "a multi-turn episode" if prompt.environment else "one completion"
            raise BadResult(f"bad result: {path}: asked for {asked}, got the other")
        if c.finish_reason == "partial":
            if c.episode is not None:
                raise BadResult(f"bad result: {path}: a multi-turn episode cannot be sent in part")
            self.partials += 1  # progress, not an answer: the finished result still follows
        else:
            self.answered[c.key] = index
        sample = Sample(
            prompt=prompt,
            sample_index=c.sample_index,
            response_ids=c.response_token_ids,
            logprobs=c.logprobs,
            finish_reason=c.finish_reason,
            text=c.text,
            policy_version=c.policy_version,
            worker_id=self.worker_id,
            extra={"generation_seconds": c.generation_seconds},
        )
        return sample if c.episode is None else with_episode(sample, c.episode)

    def check_complete(self) -> None:
        """Raise BadResult naming the first few samples the stream left out."""
        missing = [k for k in self.request.expected_keys() if k not in self.answered]
        if missing:
            shown = ", ".join(f"{p}#{s}" for p, s in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise BadResult(f"stream ended with {len(missing)} samples unanswered: {shown}")


def with_episode(sample: Sample, episode: m.EpisodeReport) -> Sample:
    """A received sample with its episode: the mask, the turns, and log-probs zeroed where the environment
    wrote (nothing trains on those, and nothing a worker claims there is kept)."""
    logprobs = tuple(lp if keep else 0.0 for lp, keep in zip(sample.logprobs, episode.loss_mask, strict=True))
    extra = {
        **sample.extra,
        "turns": float(len(episode.turns)),
        "tool_calls": float(episode.tool_calls),
        "tool_errors": float(episode.tool_errors),
        "episode_reward": float(episode.reward),
    }
    return sample.with_(
        logprobs=logprobs,
        loss_mask=episode.loss_mask,
        turns=episode.turns,
        end_reason=episode.end_reason,
        extra=extra,
    )
