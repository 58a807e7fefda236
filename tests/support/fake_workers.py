"""In-process stand-ins for rollout workers, for the dispatcher's tests: each has a speed, may fail after
some items or answer garbage."""

from __future__ import annotations

import asyncio

from decentralized_verl.core.interfaces import WorkerFailure
from decentralized_verl.core.samples import Prompt, Sample


class FakeRollout:
    """An in-process rollout worker with a speed, optional failure after k items, optional garbage."""

    def __init__(
        self, worker_id: str, delay: float = 0.0, fail_after: int | None = None, garbage: bool = False
    ):
        self.worker_id = worker_id
        self.delay = delay
        self.fail_after = fail_after
        self.garbage = garbage
        self.calls: list[int] = []

    async def generate(self, items, sampling, version):
        self.calls.append(len(items))
        for n, (prompt, index) in enumerate(items):
            if self.fail_after is not None and n >= self.fail_after:
                raise WorkerFailure(self.worker_id, "connection reset")
            await asyncio.sleep(self.delay)
            key_prompt = Prompt("not-asked", 0, (1,), "x") if self.garbage else prompt
            yield Sample(
                key_prompt, index, (5, 6, 7), (-0.1, -0.2, -0.3), "stop", "abc", version, self.worker_id
            )

    async def close(self):
        pass


def items(n_prompts: int, n: int):
    return [(Prompt(f"p{i}", i, (1, 2), f"q{i}"), k) for i in range(n_prompts) for k in range(n)]
