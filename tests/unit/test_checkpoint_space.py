"""The checkpoint room estimate and how a failed write is read: tensors counted once per storage, and only
a full volume (ENOSPC, a quota, torch's cut-short writer on a nearly full folder) taken for one."""

from __future__ import annotations

import errno
from pathlib import Path

import torch

from decentralized_verl.errors import CheckpointError
from decentralized_verl.training.checkpoints import space


def test_tied_and_shared_tensors_count_once() -> None:
    weight = torch.zeros(100, 10)
    state = {"embed": weight, "lm_head": weight, "view": weight[:10], "other": [torch.zeros(5)], "n": 3}
    assert space.tensor_bytes(state) == 100 * 10 * 4 + 5 * 4
    assert space.tensor_bytes(state, {"again": weight}) == 100 * 10 * 4 + 5 * 4
    tied = torch.nn.Linear(10, 10)
    assert space.module_bytes(tied) == (100 + 10) * 4


def test_only_a_full_volume_is_taken_for_one(tmp_path: Path) -> None:
    assert space.out_of_space(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert space.out_of_space(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path)
    assert not space.out_of_space(OSError(errno.EACCES, "Permission denied"), tmp_path)
    assert not space.out_of_space(ValueError("bad shape"), tmp_path)
    cut_short = RuntimeError(
        "[enforce fail at inline_container.cc:672] . unexpected pos 56688064 vs 56687952"
    )
    assert not space.out_of_space(cut_short, tmp_path)  # this disk has room: some other fault
    assert space.out_of_space(RuntimeError("PytorchStreamWriter failed: No space left on device"), tmp_path)


def test_a_checkpoint_the_volume_cannot_hold_is_refused_by_folder_and_size(tmp_path: Path) -> None:
    free = space.free_bytes(tmp_path)
    target = tmp_path / "not-yet" / "checkpoint-3"
    space.ensure_room(target, 1)
    try:
        space.ensure_room(target, free + (1 << 40))
    except CheckpointError as refused:
        said = str(refused)
    else:
        raise AssertionError("a checkpoint larger than the free space was let through")
    assert said.startswith(f"checkpoint '{target}' was not written: it needs about"), said
    assert ("GiB free" in said or "MiB free" in said) and "spec.training.checkpoint.keep" in said, said


def test_the_coordinators_status_names_a_failure_a_person_must_fix_as_bad_input() -> None:
    """The operator may hear of a failed run from the coordinator's Status reply before the learner's exit:
    the reply carries the same words and kind (BadInput for input to fix)."""
    from decentralized_verl.errors import OperationFailed
    from decentralized_verl.orchestration.coordinator import TrainingStopped, failure_of

    full = CheckpointError("checkpoint '/c/checkpoint-1' was not written: it needs about 1.1 MiB")
    assert failure_of(full) == {"failure": str(full), "failure_reason": "BadInput"}
    assert failure_of(OperationFailed("a peer went away")) == {"failure": "OperationFailed: a peer went away"}
    assert failure_of(RuntimeError("boom")) == {"failure": "RuntimeError: boom"}
    assert failure_of(TrainingStopped(3, None)) == {} and failure_of(KeyboardInterrupt()) == {}
