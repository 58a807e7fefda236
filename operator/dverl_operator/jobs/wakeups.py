"""One asyncio.Event per job: watch events set it, the job's loop waits on it (a resync interval catches
anything a watch missed)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Wakeups:
    events: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)

    def get(self, namespace: str, name: str) -> asyncio.Event:
        return self.events.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        event = self.events.get((namespace, name))
        if event is not None:
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        self.events.pop((namespace, name), None)
