"""Sharded (DCP) checkpoints of FSDP2 learners: saved by 2 ranks and resumed on 1 or 2, saved by 1 and
resumed on 2, exported to a Hugging Face folder that gives the sharded model's logits, refused when torn or
corrupt, and `dverl export`'s errors.

The runs: 1 rank (a process group of one in this process) trains 2 steps, saves, and takes a third; 2
torchrun ranks do the same, then resume both checkpoints; 1 rank resumes theirs. Every resume loads a model
built from another seed, so only the load can make it match, then takes the third step. The dumps hold
whole (gathered) tensors keyed by parameter name.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from decentralized_verl.errors import CheckpointError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.training.checkpoints.folders import save_checkpoint
from decentralized_verl.training.checkpoints.sharded import export_hf
from tests.support import sharded_checkpoint_worker as worker

"""One learner sums a step's 4 rows in one backward, two learners in two halves averaged by the reduce-
scatter: the same gradient up to float32 rounding, which Adam's normalisation lifts for near-zero gradient
entries (measured <= 1.1e-6 on the weights after the step; the step itself moves weights by ~1e-2)."""


def test_export_of_a_hugging_face_checkpoint_copies_its_model_files(tmp_path: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(worker.SPEC)
    folder = save_checkpoint(tmp_path / "checkpoint-1", model, tokenizer, {"step": 1}, {"optimizer": {}})
    out = export_hf(folder, tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not {"optimizer.pt", "trainer_state.json", "manifest.json"} & {p.name for p in out.iterdir()}
    with pytest.raises(CheckpointError, match="is not empty"):
        export_hf(folder, out)
