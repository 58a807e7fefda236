"""Verifiable rewards (boxed, think_answer_tags, code in a sandbox), reward-model scoring, user callables.

Importing this package imports no torch, transformers or sympy, and math-verify runs in a child process.
The names a spec may give are the catalogue's (`spec/catalogue/rewards.py`); `registry` serves them.
"""

from decentralized_verl.rewards.registry import REWARD_TYPES, reward_type
from decentralized_verl.rewards.result import RewardResult
from decentralized_verl.rewards.reward_model import RewardModelScorer
from decentralized_verl.rewards.sandbox import SandboxLimits
from decentralized_verl.rewards.scoring import score, score_batch

__all__ = [
    "REWARD_TYPES",
    "RewardModelScorer",
    "RewardResult",
    "SandboxLimits",
    "reward_type",
    "score",
    "score_batch",
]
