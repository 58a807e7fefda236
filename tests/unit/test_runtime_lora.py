"""LoRA jobs ship only the adapter to rollout workers, and the workers end up with the learner's policy."""

from __future__ import annotations

import torch

from decentralized_verl.backends.hf import HFBackend
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.training.trainer import rollout_state_dict
from decentralized_verl.transport.weights.codec import WeightAssembler, encode_state_dict

SPEC = parse_spec(
    {
        "model": {
            "tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64},
            "lora": {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]},
        },
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "x.jsonl"},
        "training": {"batchSize": 2},
    }
)


def test_adapter_only_update_reaches_a_lora_rollout_worker() -> None:
    learner, tokenizer = load_model_and_tokenizer(SPEC.model)
    rollout_model, _ = load_model_and_tokenizer(SPEC.model)
    with torch.no_grad():  # a "training step": move every adapter weight
        for param in learner.parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * 0.1)
    update = rollout_state_dict(learner)
    assert update and all("lora_" in name for name in update)
    full = sum(t.numel() for t in learner.state_dict().values())
    assert sum(t.numel() for t in update.values()) < full / 5  # only the adapter travels
    bundle = encode_state_dict(update, 1, dtype=None)
    assembler = WeightAssembler(bundle.header)
    for chunk in bundle.chunks:
        assembler.add(chunk)
    worker = RolloutWorker(HFBackend(rollout_model, tokenizer), "r0")
    worker.load_weights(assembler.finish(), 1)
    assert worker.version == 1
    theirs = rollout_model.state_dict()
    for name, tensor in learner.state_dict().items():
        assert torch.equal(theirs[name], tensor), name
