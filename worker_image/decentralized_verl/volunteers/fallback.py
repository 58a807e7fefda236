"""A volunteer's scoring role with the trainer's own implementation behind it.

The quick-start trainer uses reward / reference volunteers when it finds them in the DHT; a call that
fails (peer gone, refused, out of contract) is answered locally instead, so a step never fails or waits
on a volunteer. After `max_failures` failures in a row the peer is dropped for the rest of the run.
The local implementation is built on first use: a trainer whose reference volunteer works never holds
a second copy of the model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from decentralized_verl.core.interfaces import WorkerFailure
from decentralized_verl.core.samples import Sample

log = logging.getLogger(__name__)


class _Fallback:
    def __init__(self, remote: Any | None, make_local: Callable[[], Any], *, max_failures: int = 2) -> None:
        self.remote = remote
        self.make_local = make_local
        self.max_failures = max_failures
        self._local: Any | None = None
        self.remote_calls = 0
        self.local_calls = 0
        self.failures: list[str] = []
        self._in_a_row = 0

    @property
    def local(self) -> Any:
        if self._local is None:
            self._local = self.make_local()
        return self._local

    async def _call(self, name: str, *args: Any) -> Any:
        if self.remote is not None:
            try:
                result = await getattr(self.remote, name)(*args)
                self.remote_calls += 1
                self._in_a_row = 0
                return result
            except WorkerFailure as exc:
                self.failures.append(str(exc))
                self._in_a_row += 1
                log.warning("%s; computing it locally", exc)
                print(f"volunteer failed ({exc}); computing it locally", flush=True)
                if self._in_a_row >= self.max_failures:
                    print(f"dropping {exc.worker_id} after {self._in_a_row} failures in a row", flush=True)
                    self.remote = None
        self.local_calls += 1
        return await getattr(self.local, name)(*args)

    def report(self) -> dict[str, Any]:
        return {"remote_calls": self.remote_calls, "local_calls": self.local_calls, "failures": self.failures}

    async def close(self) -> None:
        for client in (self.remote, self._local):
            close = getattr(client, "close", None)
            if close is not None:
                await close()


class FallbackReward(_Fallback):
    """`RewardClient`: the reward peer, else the trainer's own reward worker."""

    async def score(self, samples: Sequence[Sample], reward_type: str) -> list[tuple[float, str]]:
        return await self._call("score", samples, reward_type)


class FallbackReference(_Fallback):
    """`ReferenceClient`: the reference peer, else a reference model loaded in the trainer."""

    async def logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        return await self._call("logprobs", samples)
