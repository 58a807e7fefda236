"""Playing a verifiers (v1) environment with our model: its `Env.run` drives the turns, we supply them.

A verifiers multi-turn environment is an `Env` whose `run(task, agents)` opens
`agents.<seat>.interaction(task)` and calls `turn(message)`: each call sends the environment's message and
waits for the model's next reply (`Segment.last_reply`). Verifiers normally answers through a harness
program talking to a model server; here the seat is a stand-in whose `turn` hands the message to our
episode loop as the observation and waits for the turn our rollout worker generates. When `run` returns,
the task's `@vf.reward` functions score the trace (offline: rewards that need a sandbox runtime are
skipped, as verifiers itself does without one), then the env's `finalize`; the episode's reward is the
trace's weighted reward. Harness programs, sandboxes and MCP tool servers are not used.

All episodes of a process share one event loop in a daemon thread; the synchronous `Environment` side
(`verifiers_env.py`) talks to its episode through two queues. This module imports verifiers at import.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.dialects import parse_message
from verifiers.v1.episode import EnvInfo, Episode
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, TraceTask
from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage, content_text

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's verifiers loop, started on first use in a daemon thread."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="verifiers-loop", daemon=True).start()
            _loop = loop
        return _loop


@dataclass(frozen=True)
class Observed:
    """The environment answered the model's turn with a message."""

    text: str


@dataclass(frozen=True)
class Finished:
    """`run` returned: the trace's weighted reward and why it stopped."""

    reward: float
    reason: str


@dataclass(frozen=True)
class Failed:
    message: str


Event = Observed | Finished | Failed


def opening_trace(task: vf.Task) -> vf.Trace:
    """A trace holding the task's system prompt and prompt, as a verifiers rollout starts."""
    trace = vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=AgentInfo(config=vf.AgentConfig()),
    )
    data = task.data
    if data.system_prompt:
        _append(trace, SystemMessage(content=data.system_prompt))
    prompt = data.prompt
    for message in [UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or []):
        _append(trace, parse_message(message) if isinstance(message, dict) else message)
    return trace


def _append(trace: vf.Trace, message: Any, sampled: bool = False) -> None:
    parent = len(trace.nodes) - 1 if trace.nodes else None
    trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))


def message_text(message: str | list[Any]) -> str:
    """A turn's message(s) as the observation text: contents joined by blank lines."""
    if isinstance(message, str):
        return message
    parsed = [parse_message(m) if isinstance(m, dict) else m for m in message]
    return "\n\n".join(text for m in parsed if (text := content_text(m.content)))


class EpisodePlay:
    """One episode: the env's `run` on the loop, fed our model's replies, reporting `Event`s."""

    def __init__(self, env: vf.Env, task: vf.Task, env_id: str) -> None:
        self.env = env
        self.task = task
        self.env_id = env_id
        self.trace = opening_trace(task)
        self.events: queue.Queue[Event] = queue.Queue()
        self.loop = event_loop()
        self.replies: asyncio.Queue[str] = asyncio.Queue()
        self.seat: str | None = None
        self.turns = 0
        self.future = asyncio.run_coroutine_threadsafe(self._play(), self.loop)

    # ------------------------------------------------------------ the synchronous side
    def reply(self, text: str, timeout_s: float) -> Event:
        """Hand the model's turn to the env; its answer (or the end) once it has one."""
        self.loop.call_soon_threadsafe(self.replies.put_nowait, text)
        try:
            return self.events.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"the verifiers environment did not answer within {timeout_s:g}s") from None

    def cancel(self) -> None:
        self.future.cancel()

    # ------------------------------------------------------------ the verifiers side
    async def _play(self) -> None:
        try:
            agents = Seats(self)
            await self.env.setup(agents)
            await self.env.run(self.task, agents)
            await self.task.score(self.trace)
            episode = Episode(env=EnvInfo(id=self.env_id), task=self.trace.task)
            episode.traces.append(self.trace)
            await self.env.finalize(self.task, episode)
            self.events.put(Finished(float(self.trace.reward), self.trace.stop_condition or "finished"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported to the episode as a tool error, never lost in the loop
            self.events.put(Failed(f"{type(exc).__name__}: {exc}"[:500]))

    async def next_reply(self) -> str:
        text = await self.replies.get()
        self.turns += 1
        _append(self.trace, AssistantMessage(content=text), sampled=True)
        return text

    def observe(self, message: str | list[Any]) -> None:
        text = message_text(message)
        parsed = [UserMessage(content=message)] if isinstance(message, str) else message
        for m in parsed:
            _append(self.trace, parse_message(m) if isinstance(m, dict) else m)
        self.events.put(Observed(text))


class Exchange:
    """Stand-in for `vf.Interaction`: `turn(message)` is one model turn of our episode."""

    def __init__(self, play: EpisodePlay) -> None:
        self.play = play

    @property
    def trace(self) -> vf.Trace:
        return self.play.trace

    async def turn(self, message: str | list[Any] | None = None) -> vf.Segment:
        if message is None and self.play.turns > 0:
            raise ValueError("a bare turn() only takes the opening reply; later turns need a message")
        if message is not None and self.play.turns == 0:
            raise ValueError("the task's prompt opens the exchange: take the first reply with a bare turn()")
        if message is not None:
            self.play.observe(message)
        reply = await self.play.next_reply()
        return vf.Segment(messages=[AssistantMessage(content=reply)])


class Seat:
    """Stand-in for a `vf.Agent`: the one trainable seat, played by our model."""

    def __init__(self, play: EpisodePlay, name: str) -> None:
        self.play = play
        self.name = name
        self.trainable = True

    @asynccontextmanager
    async def interaction(self, task: vf.Task, **_: Any) -> AsyncIterator[Exchange]:
        if self.play.seat not in (None, self.name):
            raise ValueError(
                f"seat {self.name!r}: only one seat can be played by the policy "
                f"({self.play.seat!r} already is); multi-agent envs are not supported"
            )
        self.play.seat = self.name
        yield Exchange(self.play)

    async def run(self, task: vf.Task, **_: Any) -> vf.Trace:
        """One segment: the model's reply to the task's prompt."""
        async with self.interaction(task) as exchange:
            await exchange.turn()
        return self.play.trace


class Seats:
    """Stand-in for `vf.Agents`: any seat name the env asks for."""

    def __init__(self, play: EpisodePlay) -> None:
        self._play = play
        self._seats: dict[str, Seat] = {}

    def __getattr__(self, name: str) -> Seat:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._seats.setdefault(name, Seat(self._play, name))


class SingleTurn(vf.Env):
    """A taskset without a multi-turn env of its own: the model's first reply is the episode."""

    async def run(self, task: vf.Task, agents: Any) -> None:
        await agents.agent.run(task)
