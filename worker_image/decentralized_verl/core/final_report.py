"""The learner's final progress, handed to the cluster as its container's termination message.

The operator copies progress into `.status` by polling the coordinator every few seconds; the last
step can finish, and the learner exit, between two polls, leaving a Succeeded job that shows an
earlier step. So the learner writes its final numbers where the kubelet keeps them after the process
is gone (`terminationMessagePath`, `/dev/termination-log`), and the operator reads them from the pod.
A learner that fails for a reason no retry mends (refit parity) writes its verdict there instead.
Outside a pod the file does not exist and nothing is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TERMINATION_LOG = Path("/dev/termination-log")
KEY = "dverlFinal"


def final_fields(summary: Mapping[str, Any]) -> dict[str, Any]:
    """`.status` fields from the learner's run summary (steps, policy version, last step's reward)."""
    out: dict[str, Any] = {"step": int(summary["steps"]), "policyVersion": int(summary["policy_version"])}
    reward = summary.get("reward_last")
    if isinstance(reward, int | float) and math.isfinite(reward):
        out["reward"] = round(float(reward), 6)
    return out


def write_termination_message(text: str, path: Path = TERMINATION_LOG) -> bool:
    """Replace the container's termination message with `text`; False outside a pod (no such file) or
    when it cannot be written."""
    if not path.exists():
        return False
    try:
        path.write_text(text)
    except OSError:
        return False
    return True


def write_final(summary: Mapping[str, Any], path: Path = TERMINATION_LOG) -> bool:
    """Write the final fields as one JSON line where the kubelet reads the termination message."""
    return write_termination_message(json.dumps({KEY: final_fields(summary)}) + "\n", path)


def write_verdict(verdict: str, path: Path = TERMINATION_LOG) -> bool:
    """Write why the learner failed as its termination message, so the operator's failure condition
    quotes it whole even when teardown lines follow it in the log."""
    # the kubelet keeps at most 4096 bytes
    return write_termination_message(" ".join(verdict.split())[:4000] + "\n", path)


def read_final(message: str) -> dict[str, Any]:
    """The final fields from a termination message, {} when it holds none (or anything malformed)."""
    try:
        document = json.loads(message.strip().splitlines()[-1]) if message.strip() else None
    except (json.JSONDecodeError, IndexError):
        return {}
    fields = document.get(KEY) if isinstance(document, dict) else None
    if not isinstance(fields, dict):
        return {}
    out: dict[str, Any] = {}
    for key in ("step", "policyVersion"):
        value = fields.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[key] = value
    reward = fields.get("reward")
    if isinstance(reward, int | float) and not isinstance(reward, bool) and math.isfinite(reward):
        out["reward"] = float(reward)
    return out if "step" in out else {}
