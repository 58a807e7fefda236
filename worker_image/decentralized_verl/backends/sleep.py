"""When a rollout engine sleeps: in `dverl run`'s one-GPU layout a vLLM rollout shares its GPU with the
learner, and while the learner scores and updates the engine's weights and KV cache would sit in memory
the update could use. vLLM can hand them back (`LLM.sleep(level=1)`: weights offloaded to host memory, KV
cache dropped) and take them back (`wake_up()`), on CUDA only; its CPU build has no sleep mode.

The decision is pure (the layout, the backend's capability, the device); `EngineSleep` carries it out on
an engine object, so the schedule is tested with a stand-in for vLLM's `LLM` through the real backend.
The schedule: the engine sleeps as soon as a generate call has its results, and wakes before the next
generate or weight refresh. A refresh wakes it first because vLLM reloads weights into memory it holds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from decentralized_verl.runtime.device_choice import names_gpu
from decentralized_verl.spec.catalogue.backends import BackendKind

log = logging.getLogger(__name__)

SLEEP_LEVEL = 1
"""vLLM's level 1: weights to host memory (woken without reloading), KV cache discarded."""


def sleeps_while_learner_updates(kind: BackendKind, device: str, shares_gpu_with_learner: bool) -> bool:
    """Whether a rollout engine of `kind` on `device` sleeps between its generate calls: only when it
    shares its GPU with the learner (the one-GPU layout), its kind can sleep, and the device is a GPU."""
    return shares_gpu_with_learner and kind.sleeps_on_gpu and names_gpu(device)


class EngineSleep:
    """Puts an engine to sleep and wakes it, once each, timing both; a no-op when not `enabled`."""

    def __init__(self, engine: Any, *, enabled: bool) -> None:
        self.engine = engine
        self.enabled = enabled
        self.asleep = False
        self.sleeps = 0
        self.sleep_seconds: list[float] = []
        self.wake_seconds: list[float] = []

    def sleep(self) -> None:
        """The engine's idle now (its results are in): hand its GPU memory back."""
        if not self.enabled or self.asleep:
            return
        began = time.perf_counter()
        self.engine.sleep(level=SLEEP_LEVEL)
        self.asleep = True
        self.sleeps += 1
        self.sleep_seconds.append(time.perf_counter() - began)
        log.debug("vllm: asleep in %.3f s", self.sleep_seconds[-1])

    def wake(self) -> None:
        """About to generate or reload: take the memory back."""
        if not self.asleep:
            return
        began = time.perf_counter()
        self.engine.wake_up()
        self.asleep = False
        self.wake_seconds.append(time.perf_counter() - began)
        log.debug("vllm: awake in %.3f s", self.wake_seconds[-1])
