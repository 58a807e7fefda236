"""`spec.data`: the training and eval files, the reward, prompt rendering and sampling."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from decentralized_verl.rewards.names import BUILTIN_REWARD_TYPES, CALLABLE_PATTERN
from decentralized_verl.spec.base import Probability, SpecModel, one_of, registered_name
from decentralized_verl.spec.model import ModelSpec

RewardType = registered_name(
    "reward type", BUILTIN_REWARD_TYPES, CALLABLE_PATTERN.pattern, "or a callable as module:function"
)
"""A built-in reward (the CRD lists them) or a user callable written as `module:function`."""


class ChatMessage(SpecModel):
    role: Literal["system", "user", "assistant"]
    content: str


class DataSpec(SpecModel):
    train: str = Field(min_length=1, description="Training file (jsonl, json or parquet)")
    eval: str | None = None
    format: Literal["jsonl", "json", "parquet"] | None = Field(
        default=None, description="File format; inferred from the extension when omitted"
    )
    reward_type: RewardType = Field(
        default="boxed", description=f"{one_of(BUILTIN_REWARD_TYPES)}, or a callable as module:function"
    )
    reward_model: ModelSpec | None = None
    system_prompt: str | None = None
    few_shot: list[ChatMessage] = Field(default_factory=list)
    max_prompt_tokens: PositiveInt = 512
    max_new_tokens: PositiveInt = 256
    temperature: Annotated[float, Field(ge=0, le=5)] = 1.0
    top_p: Probability = 1.0
    top_k: NonNegativeInt = 0
    stop: list[str] = Field(default_factory=list)
    eval_samples: PositiveInt | None = Field(default=None, description="Evaluate on the first N eval items")


__all__ = ["ChatMessage", "DataSpec", "RewardType"]
