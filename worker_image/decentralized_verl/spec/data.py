"""`spec.data`: the training and eval files, the reward, prompt rendering and sampling."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from decentralized_verl.spec.base import Probability, SpecModel, one_of, registered_name
from decentralized_verl.spec.catalogue.environments import BUILTIN_ENVIRONMENTS, CLASS_PATTERN
from decentralized_verl.spec.catalogue.rewards import BUILTIN_REWARD_TYPES, CALLABLE_PATTERN
from decentralized_verl.spec.model import ModelSpec

RewardType = registered_name(
    "reward type", BUILTIN_REWARD_TYPES, CALLABLE_PATTERN.pattern, "or a callable as module:function"
)
"""A built-in reward (the CRD lists them) or a user callable written as `module:function`."""


EnvironmentName = registered_name(
    "environment", BUILTIN_ENVIRONMENTS, CLASS_PATTERN.pattern, "or a class as module:Class"
)
"""A built-in environment (the CRD lists them) or a user class written as `module:Class`."""


class EnvironmentSpec(SpecModel):
    """Multi-turn episodes: the model acts, the environment answers, until done or a limit."""

    name: EnvironmentName = Field(description=f"{one_of(BUILTIN_ENVIRONMENTS)}, or a class as module:Class")
    max_turns: Annotated[int, Field(ge=1, le=64)] = Field(default=4, description="Model turns per episode")
    max_total_tokens: PositiveInt | None = Field(
        default=None,
        description="Tokens after the prompt (model and environment) per episode; none: the model's context",
    )
    max_observation_tokens: PositiveInt = Field(
        default=256, description="Longer observations are cut to this many tokens"
    )
    step_timeout_s: Annotated[float, Field(gt=0, le=600)] = Field(
        default=30.0, description="A step that takes longer is a tool error"
    )
    on_tool_error: Literal["observe", "end"] = Field(
        default="observe",
        description="A step that raises or times out: its error is the observation, or the episode ends",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="The environment's own options (see README, Multi-turn and tools)",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ChatMessage(SpecModel):
    role: Literal["system", "user", "assistant", "tool"] = Field(
        description="tool: a demo's tool answer (multi-turn); a template without the role shows it as user"
    )
    content: str
    """The message text."""


class DataSpec(SpecModel):
    train: str = Field(min_length=1, description="Training file (jsonl, json or parquet)")
    eval: str | None = None
    """Evaluation file (same formats); needed when training.evalEvery > 0."""
    format: Literal["jsonl", "json", "parquet"] | None = Field(
        default=None, description="File format; inferred from the extension when omitted"
    )
    reward_type: RewardType = Field(
        default="boxed", description=f"{one_of(BUILTIN_REWARD_TYPES)}, or a callable as module:function"
    )
    reward_error_steps: NonNegativeInt = Field(
        default=3,
        description=(
            "Stop the job (exit 2, naming the reward and its error) after this many steps in a row in "
            "which every sample's reward failed (raised, or returned no number); 0: never stop"
        ),
    )
    reward_model: ModelSpec | None = None
    """The reward model for rewardType reward_model (else roles.reward.model)."""
    system_prompt: str | None = None
    """System message put before every prompt."""
    few_shot: list[ChatMessage] = Field(default_factory=list)
    """Demonstration messages put between the system prompt and each prompt."""
    max_prompt_tokens: PositiveInt = 512
    """Longer prompts are cut (from the left) to this many tokens."""
    max_new_tokens: PositiveInt = 256
    """Most tokens generated per response."""
    temperature: Annotated[float, Field(ge=0, le=5)] = 1.0
    """Sampling temperature; 0 is greedy."""
    top_p: Probability = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability (1: off)."""
    top_k: NonNegativeInt = 0
    """Keep the k likeliest tokens when sampling (0: off)."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end a response."""
    eval_samples: PositiveInt | None = Field(default=None, description="Evaluate on the first N eval items")
    environment: EnvironmentSpec | None = Field(
        default=None, description="Multi-turn episodes with tools or a game; the environment scores them"
    )


__all__ = ["ChatMessage", "DataSpec", "EnvironmentName", "EnvironmentSpec", "RewardType"]
