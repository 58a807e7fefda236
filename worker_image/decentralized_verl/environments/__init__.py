"""Multi-turn environments: tools and games the model acts in, turn after turn (docs/multi-turn.md).

`base` defines the protocol, `registry` the names (as `spec/catalogue/environments.py` lists them),
`episode` the token bookkeeping of one episode and `rollout` the batched loop a rollout worker runs.
Importing this package imports no torch or transformers.
"""

from decentralized_verl.environments.base import Environment, EpisodeRecord, StepInfo, StepResult

__all__ = ["Environment", "EpisodeRecord", "StepInfo", "StepResult"]
