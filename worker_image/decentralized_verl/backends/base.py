"""The generation protocol every rollout engine implements (`factory.make_backend` builds one).

Callers (the rollout role, the colocated in-learner rollout, benchmarks) depend only on this protocol;
it needs no torch at import time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from decentralized_verl.core.sampling import SamplingParams

if TYPE_CHECKING:
    from torch import Tensor

FinishReason = Literal["stop", "length", "partial"]
"""`partial`: a prefix of a response still being decoded (only when asked for: `partial_every_s`)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt, already tokenized (chat templates are applied by the caller), and how to sample it."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"GenerationRequest[{self.prompt_id!r}].prompt_token_ids: must not be empty")


@dataclass(frozen=True)
class GenerationOutput:
    """One sampled response.

    ``logprobs[i]`` is the log-probability of ``response_token_ids[i]`` under the policy of
    ``policy_version``, computed as ``log_softmax(logits / temperature)`` (``temperature = 1`` for
    greedy requests), before top-k/top-p filtering. The learner must compute its log-probs the same
    way, dividing by the same temperature, for importance ratios to be 1 on-policy.
    ``response_token_ids`` includes the token that ended the response (the end-of-sequence token, or
    the token that completed a stop string). ``text`` is the decoded response without special tokens;
    when a stop string ended it, ``text`` ends with that stop string (it is included) and anything
    the last token decoded to after it is cut off. ``seconds`` is the wall time of the batch that
    produced this response.
    """

    prompt_id: str
    sample_index: int
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    text: str
    policy_version: int
    seconds: float


@runtime_checkable
class GenerationBackend(Protocol):
    """A policy copy that samples responses and accepts new weights between batches."""

    @property
    def version(self) -> int:
        """The policy version of the weights currently loaded."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The tokenizer that decodes responses (a transformers tokenizer)."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[GenerationOutput]:
        """Sample ``params.n`` responses per request; yield each as soon as it (or its batch) is done.

        A backend that decodes token by token may also take ``partial_every_s`` and yield unfinished
        prefixes (finish reason ``partial``) that often; callers pass it only to backends that do (hf)."""
        ...

    def load_weights(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        """Replace every weight in place and set ``version``; validate everything before changing anything."""
        ...
