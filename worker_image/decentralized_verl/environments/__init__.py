"""Multi-turn environments: tools and games the model acts in, turn after turn (docs/multi-turn.md).

`base` defines the protocol, `registry` the names, `episode` the token bookkeeping of one episode and
`rollout` the batched loop a rollout worker runs. Importing this package imports no torch or transformers.
"""

from decentralized_verl.environments.base import (
    Environment,
    EnvironmentOptionsError,
    EpisodeRecord,
    StepInfo,
    StepResult,
)
from decentralized_verl.environments.names import BUILTIN_ENVIRONMENTS, is_known_environment

__all__ = [
    "BUILTIN_ENVIRONMENTS",
    "Environment",
    "EnvironmentOptionsError",
    "EpisodeRecord",
    "StepInfo",
    "StepResult",
    "is_known_environment",
]
