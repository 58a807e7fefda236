"""Verifiable rewards (boxed, think_answer_tags, code in a sandbox), reward-model scoring, user callables.

Importing this package imports no torch, transformers or sympy: the spec and operator use
`REWARD_TYPES` / `is_known_reward_type`, and math-verify runs in a child process.
"""

from decentralized_verl.rewards.names import BUILTIN_REWARD_TYPES, is_known_reward_type
from decentralized_verl.rewards.registry import REWARD_TYPES, reward_type
from decentralized_verl.rewards.result import RewardResult
from decentralized_verl.rewards.reward_model import RewardModelScorer
from decentralized_verl.rewards.sandbox import SandboxLimits
from decentralized_verl.rewards.scoring import score, score_batch

__all__ = [
    "BUILTIN_REWARD_TYPES",
    "REWARD_TYPES",
    "RewardModelScorer",
    "RewardResult",
    "SandboxLimits",
    "is_known_reward_type",
    "reward_type",
    "score",
    "score_batch",
]
