"""A checkpoint volume without room, on a real small volume (a tmpfs of a set size): the write is refused
before a byte is written when the tensors cannot fit, a write that still runs out (other files) is named
as a full volume rather than torch's `unexpected pos`, and in both cases the checkpoint before it is
intact and no half-written folder is left. The error names the folder, the bytes needed and free, and
what to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from decentralized_verl.errors import CheckpointError
from decentralized_verl.models.tiny import build_tiny, tiny_config
from decentralized_verl.models.tokenizer import build_char_tokenizer
from decentralized_verl.spec import TinyModelSpec
from decentralized_verl.training.checkpoints.folders import (
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from decentralized_verl.training.checkpoints.space import module_bytes
from tests.support.small_volume import refused, small_volume

REASON = refused()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs a real small volume: {REASON}")


def model_and_tokenizer(hidden: int):
    tokenizer = build_char_tokenizer()
    spec = TinyModelSpec(hidden_size=hidden, num_layers=2, num_heads=4, intermediate_size=hidden * 2)
    return build_tiny(tiny_config(spec, tokenizer), seed=0), tokenizer


def test_a_checkpoint_larger_than_the_volume_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    model, tokenizer = model_and_tokenizer(256)
    assert module_bytes(model) > 2 << 20
    with small_volume(tmp_path / "ckpt", "2m") as root:
        with pytest.raises(CheckpointError) as refused_write:
            save_checkpoint(checkpoint_dir(root, 1), model, tokenizer, {"step": 1})
        assert list(root.iterdir()) == []  # not a file, not a temporary folder
    said = str(refused_write.value)
    assert f"checkpoint '{root / 'checkpoint-1'}' was not written" in said, said
    assert "it needs about" in said and "MiB free" in said, said
    assert "spec.training.checkpoint.keep" in said, said


def test_a_write_that_runs_out_is_named_and_the_checkpoint_before_it_stays(tmp_path: Path) -> None:
    model, tokenizer = model_and_tokenizer(64)
    with small_volume(tmp_path / "ckpt", "1m") as root:
        first = save_checkpoint(checkpoint_dir(root, 1), model, tokenizer, {"step": 1})
        # Bytes the estimate does not see (not tensors): the check passes and the write meets the wall.
        blob = {"notes": b"x" * (2 << 20)}
        with pytest.raises(CheckpointError) as ran_out:
            save_checkpoint(
                checkpoint_dir(root, 2), model, tokenizer, {"step": 2}, extra_objects={"n.pt": blob}
            )
        assert sorted(p.name for p in root.iterdir()) == ["checkpoint-1"]
        assert latest_checkpoint(root) == first
        assert load_checkpoint(first).extra_state == {"step": 1}
    said = str(ran_out.value)
    assert "the volume ran out of space" in said, said
    assert "unexpected pos" not in said and "spec.training.checkpoint.keep" in said, said
    assert isinstance(ran_out.value.__cause__, OSError | RuntimeError)
