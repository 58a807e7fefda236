"""Room on the checkpoint volume: checked before a checkpoint is written, and named when a write runs out.

A full volume is the commonest way a long run dies at its first checkpoint, and torch says it badly: a
`torch.save` to a path that hits ENOSPC ends in `[enforce fail at inline_container.cc] unexpected pos` or
`PytorchStreamWriter failed writing file`, with no word of the disk. A restart meets the same full volume,
so the error says what a person must do (a larger claim, fewer checkpoints kept) and is a `CheckpointError`
(input to fix: `dverl` exits 2 and the operator fails the job at once rather than restarting it into the
same wall). The estimate is the tensors' bytes, which is what dominates every file a checkpoint holds.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from decentralized_verl.errors import CheckpointError

_OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")
"""What torch's zip writer raises when the file it writes was cut short (a full disk or quota)."""
_NEARLY_FULL = 64 << 20
"""Below this much free space a torch writer failure is taken for a full volume."""


def tensor_bytes(*objects: Any) -> int:
    """Bytes of every distinct tensor storage reachable through dicts, lists and tuples (a tied embedding
    counts once, as safetensors and torch.save store it once)."""
    seen: set[int] = set()
    total = 0
    for tensor in _tensors(objects):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in seen and key != 0:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def module_bytes(module: torch.nn.Module) -> int:
    return tensor_bytes(list(module.parameters()), list(module.buffers()))


def free_bytes(folder: Path) -> int:
    """Free bytes on the volume holding `folder` (its nearest existing ancestor)."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


FIX = "give the volume more room (a larger claim) or keep fewer checkpoints (spec.training.checkpoint.keep)"
"""Short, so the whole error fits the operator's quote of a termination message (its last 300 characters)."""


def ensure_room(target: Path, needed: int) -> None:
    """Refuse to start a checkpoint the volume cannot hold, before a byte of it is written."""
    free = free_bytes(target.parent)
    if needed > free:
        raise CheckpointError(
            f"checkpoint {str(target)!r} was not written: it needs about {_gib(needed)} and the volume "
            f"has {_gib(free)} free; {FIX}"
        )


def out_of_space(exc: BaseException, folder: Path) -> bool:
    """Whether `exc` is a write cut short by a full volume (or quota) under `folder`."""
    if isinstance(exc, OSError) and exc.errno in _OUT_OF_SPACE:
        return True
    text = str(exc)
    if isinstance(exc, RuntimeError) and any(words in text for words in _TORCH_WRITE_FAILED):
        return free_bytes(folder) < _NEARLY_FULL
    return "No space left on device" in text or "Disk quota exceeded" in text


def ran_out_reason(target: Path, needed: int | None = None) -> str:
    """Why a checkpoint write that a full volume cut short failed, and what to do."""
    wanted = f", about {_gib(needed)} needed" if needed is not None else ""
    return f"the volume ran out of space ({_gib(free_bytes(target.parent))} free{wanted}); {FIX}"


def ran_out(target: Path, needed: int | None = None) -> CheckpointError:
    return CheckpointError(f"checkpoint {str(target)!r} was not written: {ran_out_reason(target, needed)}")


@contextmanager
def room_for(target: Path, needed: int, *, catch: Iterable[type[BaseException]] = (OSError, RuntimeError)):
    """Check the room first, then name a write that still ran out (other files, other writers)."""
    ensure_room(target, needed)
    try:
        yield
    except tuple(catch) as exc:
        if not out_of_space(exc, target.parent):
            raise
        raise ran_out(target, needed) from exc
