"""User reward functions (`module:function`) run apart from the secrets of the process that scores.

Under `dverl run` a learner scores in-process when `roles.reward.replicas` is 0, and it holds the
weight-signing key; a user's function must not share its memory. Once the process entry says so
(`run_user_rewards_apart`, for every process handed another role's secrets than the reward worker's
own), each user function is called in one long-lived child: a fresh interpreter (nothing of this
process's memory), no `DVERL_*` variable, no inherited descriptor, the same `sys.path`. Rewards shipped
with the package stay in-process: they are this project's code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

from decentralized_verl.rewards.result import RewardResult, zero
from decentralized_verl.runtime.secret_free_child import start_secret_free_child

_apart = False
SHIPPED = "decentralized_verl."
"""Rewards of this package: run where they are called."""


def run_user_rewards_apart() -> None:
    global _apart
    _apart = True


def runs_apart(spec: str) -> bool:
    return _apart and not spec.startswith(SHIPPED)


class UserRewardProcess:
    """The child a user's reward functions run in; one call at a time (callers queue on a lock), started
    on first use and again after it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def _started(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._proc = start_secret_free_child("decentralized_verl.rewards._user_reward_child", text=True)
        return self._proc

    def call(
        self, spec: str, completion: str, reference: Any, prompt: str | None, options: dict
    ) -> RewardResult:
        try:
            request = json.dumps(
                {
                    "spec": spec,
                    "completion": completion,
                    "reference": reference,
                    "prompt": prompt,
                    "options": options,
                }
            )
        except (TypeError, ValueError) as exc:
            return zero(f"reward {spec}: its inputs cannot be sent to the process it runs in ({exc})"[:300])
        with self._lock:
            try:
                proc = self._started()
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(request + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                reply = json.loads(line)
            except (OSError, ValueError, AssertionError) as exc:
                if self._proc is not None:
                    self._proc.kill()
                return zero(f"reward {spec}: the process it runs in failed ({type(exc).__name__})")
        return RewardResult(float(reply["score"]), str(reply["reason"]), reply.get("details"))

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()


def import_problem(name: str, extra_path: str) -> str | None:
    """Whether the user's reward `name` imports, checked in a child (with `extra_path` first on its
    path), so its module's code never runs in the caller (`dverl run`'s launcher, which issues every
    role's secrets): None when it does, else why not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVERL_")}
    env["PYTHONPATH"] = os.pathsep.join([extra_path, *(p for p in sys.path if p)])
    done = subprocess.run(
        [sys.executable, "-m", "decentralized_verl.rewards._user_reward_child", "--check", name],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode == 0:
        return None
    return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"


_process = UserRewardProcess()


def call_apart(spec: str, completion: str, reference: Any, prompt: str | None, options: dict) -> RewardResult:
    return _process.call(spec, completion, reference, prompt, options)
