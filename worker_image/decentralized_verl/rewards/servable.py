"""Which rewards a reward volunteer may run for a caller it does not know.

Reward volunteers exist for the open quick-start / trusted-network mode only. A reward is the training
signal itself, and a wrong one cannot be detected from its shape, so the token-checked RLHFJob flow
never takes rewards from a volunteer: its coordinator scores on the trusted side. A reward volunteer runs
only rewards shipped with this package (the built-in types and `module:function` callables under
SHIPPED_REWARD_MODULES), never an arbitrary module a caller names, and `reward_model` only when its
`--model` folder is a reward model (a sequence classifier).
"""

from __future__ import annotations

import json
from pathlib import Path

from decentralized_verl.spec.catalogue.rewards import BUILTIN_REWARD_TYPES

SHIPPED_REWARD_MODULES = ("decentralized_verl.rewards", "decentralized_verl.volunteers.rewards")


def servable_reward(kind: str, *, has_reward_model: bool) -> str | None:
    """None when this volunteer may run reward `kind`; otherwise why not."""
    if kind == "reward_model":
        return None if has_reward_model else "this reward volunteer holds no reward model"
    if kind in BUILTIN_REWARD_TYPES:
        return None
    module, sep, function = kind.partition(":")
    if sep and function and any(module == p or module.startswith(p + ".") for p in SHIPPED_REWARD_MODULES):
        return None
    return f"reward {kind!r} is not shipped with decentralized-verl (a volunteer runs no caller-named code)"


def is_reward_model_folder(folder: str) -> bool:
    """True when `folder`'s config.json names a sequence-classification architecture."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or ())
