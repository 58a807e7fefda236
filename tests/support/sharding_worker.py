"""One learner rank of `test_sharding`: trains the same tied-embedding tiny Llama on the same per-rank
batches as ddp, fsdp and their variants, and writes what it saw to OUT/rank{R}.json (+ .pt tensors).

Under torchrun (2 CPU ranks, gloo): `torchrun --standalone --nproc_per_node 2 sharding_worker.py OUT`; as
plain `python sharding_worker.py OUT` it is one fsdp rank without a process group (FSDP makes one).
The helpers (`spec_with`, `tied_model`, `step_batches`, `train`) are imported by the test too, to train the
one-process unsharded reference on the same data.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from decentralized_verl.core.samples import Prompt, Sample, TrainBatch, collate
from decentralized_verl.models.tiny import build_tiny, tiny_config
from decentralized_verl.models.tokenizer import build_char_tokenizer
from decentralized_verl.spec.manifest import parse_job
from decentralized_verl.training import microbatches
from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages
from decentralized_verl.training.trainer import PolicyTrainer

STEPS = 3
PAD = build_char_tokenizer().pad_token_id
TINY = {"hiddenSize": 32, "numLayers": 2, "numHeads": 2, "intermediateSize": 64, "seed": 3}


def spec_with(**learner):
    """A GRPO job whose mini-batch (2 prompts) is cut into micro-batches of at most 24 token positions,
    so a rank with longer responses runs more micro-batches than the other; the rollout correction makes
    every update first recompute the batch's log-probs without gradients, in micro-batches too."""
    doc = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "t"},
        "spec": {
            "model": {"tiny": TINY},
            "algorithm": {
                "name": "grpo",
                "samplesPerPrompt": 2,
                "rolloutCorrection": {"importanceSampling": "token", "cap": 5.0},
            },
            "data": {"train": "x.jsonl"},
            "roles": {"rollout": {"replicas": 1, "batchSize": 4}, "learner": {"replicas": 2, **learner}},
            "training": {
                "batchSize": 2,
                "minibatchSize": 2,
                "microbatchTokens": 24,
                "learningRate": 0.01,
                "warmupSteps": 0,
            },
        },
    }
    return parse_job(doc).spec


def tied_model(spec) -> torch.nn.Module:
    """The spec's tiny Llama with the LM head tied to the embeddings, as SmolLM2 has it."""
    tokenizer = build_char_tokenizer()
    config = tiny_config(spec.model.tiny, tokenizer)
    config.tie_word_embeddings = True
    model = build_tiny(config, spec.model.tiny.seed)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def samples_for(model, data_rank: int, step: int) -> list[Sample]:
    """Two prompt groups of two samples, log-probs from `model`; rank 1's responses are longer."""
    g = torch.Generator().manual_seed(100 * step + data_rank)
    samples = []
    for group in range(2):
        prompt = tuple(torch.randint(5, 90, (3 + group,), generator=g).tolist())
        for k in range(2):
            length = 2 + k + 4 * data_rank + group
            response = tuple(torch.randint(5, 90, (length,), generator=g).tolist())
            ids = torch.tensor([prompt + response])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            prompt_record = Prompt(f"p{step}-{group}", group, prompt, "")
            samples.append(
                Sample(prompt_record, k, response, tuple(lp.tolist()), "stop", "", 0, score=float(k == 0))
            )
    return samples


def step_batches(model, spec, data_rank: int) -> list[TrainBatch]:
    """STEPS batches of `samples_for`, advantages attached."""
    batches = []
    for step in range(STEPS):
        batch = collate(samples_for(model, data_rank, step), PAD)
        attach_advantages(batch, AlgorithmSettings.from_spec(spec))
        batches.append(batch)
    return batches


def microbatch_count(batch: TrainBatch, spec) -> int:
    """Micro-batches the trainer cuts `batch` into (one mini-batch holds both prompt groups)."""
    prompt_lengths = batch.attention_mask[:, : batch.prompt_length].sum(dim=1)
    groups = microbatches.groups_of(batch.group_index, prompt_lengths, batch.response_lengths)
    return len(microbatches.by_tokens(groups, spec.training.microbatch_tokens))


def train(trainer: PolicyTrainer, batches: list[TrainBatch]) -> dict:
    """Loss trajectory and micro-batches per step."""
    losses, norms, micros = [], [], []
    for batch in batches:
        micros.append(microbatch_count(batch, trainer.spec))
        metrics = trainer.update(batch)
        losses.append(metrics["pg_loss"])
        norms.append(metrics["grad_norm"])
    return {"losses": losses, "grad_norms": norms, "microbatches": micros}


def _run(name: str, spec, batches, out: Path, rank: int) -> dict:
    from decentralized_verl.training.learner_group import LearnerGroup, streamed_weights
    from decentralized_verl.training.trainer import rollout_state_dict
    from decentralized_verl.transport.weights.codec import decode_bundle
    from decentralized_verl.transport.weights.stream import encode_stream

    model = tied_model(spec)
    trainer = PolicyTrainer(model, spec, distributed=True)
    result = train(trainer, batches)
    if LearnerGroup(trainer, 2).sharded:  # what rollout workers receive: encoded while gathered, decoded
        published = decode_bundle(encode_stream(streamed_weights(model), 1, dtype=None))
    else:
        published = rollout_state_dict(model)
    torch.save(dict(published), out / f"rank{rank}-{name}.pt")
    try:
        rollout_state_dict(model)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    return {**result, "rollout_state_dict_refused": refused}


def _gather_checks(spec, out: Path, rank: int) -> dict:
    """full_state_dict / gathered_digest of freshly sharded models (tied and untied) against the plain
    model's state_dict and weights_digest."""
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.training.distributed import weights_digest
    from decentralized_verl.training.sharding import full_state_dict, gathered_digest, shard_model

    checks = {}
    for label, build in (
        ("tied", lambda: tied_model(spec)),
        ("untied", lambda: load_model_and_tokenizer(spec.model)[0]),
    ):
        plain = build()
        sharded = shard_model(
            build(), sharding="fsdp", world=2, dtype=None, cpu_offload=False, activation_checkpointing=True
        )
        local_numel = sum(p.to_local().numel() for p in sharded.parameters())
        stream = [(name, tensor) for name, tensor in full_state_dict(sharded)]
        torch.save(dict(stream), out / f"rank{rank}-gathered-{label}.pt")
        torch.save(plain.state_dict(), out / f"rank{rank}-plain-{label}.pt")
        checks[label] = {
            "names": [name for name, _ in stream],
            "plain_names": list(plain.state_dict()),
            "tensor_sha": [
                hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                for _, t in stream
            ],
            "gathered_digest": gathered_digest(sharded),
            "weights_digest": weights_digest(plain),
            "local_numel": local_numel,
            "total_numel": sum(p.numel() for p in plain.parameters()),
        }
    return checks


def _rank0_load_checks(spec, rank: int) -> dict:
    """An fsdp learner built the way `dverl worker --role learner` builds one: rank 1 on the meta device,
    filled from rank 0 after sharding. Its gathered weights and buffers against the plainly loaded model."""
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.training import rank0_weights
    from decentralized_verl.training.distributed import weights_digest
    from decentralized_verl.training.sharding import gathered_digest

    plain = load_model_and_tokenizer(spec.model)[0]
    rank0_weights.BLOCK_BYTES = 1000  # many blocks per tensor, most straddling the two shards' boundary
    model, _ = rank0_weights.load_for_rank(spec.model, rank=rank, meta=True)
    built_on_meta = next(model.parameters()).is_meta
    trainer = rank0_weights.build_then_fill(
        model, rank=rank, build=lambda: PolicyTrainer(model, spec, distributed=True)
    )
    buffers = dict(model.named_buffers())
    return {
        "built_on_meta": built_on_meta,
        "gathered_digest": gathered_digest(model),
        "weights_digest": weights_digest(plain),
        "buffers_equal": all(torch.equal(b, buffers[name]) for name, b in plain.named_buffers()),
        "trained": bool(trainer.optimizer.param_groups[0]["params"]),
    }


def main(out: Path) -> None:
    import torch.distributed as dist

    from decentralized_verl.training import distributed

    torch.set_num_threads(1)
    base = spec_with()
    initial = tied_model(base)
    if "RANK" not in os.environ:
        single = _run("fsdp_single", spec_with(sharding="fsdp"), step_batches(initial, base, 0), out, 0)
        (out / "single.json").write_text(json.dumps(single))
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    distributed.init_distributed(world, rank)
    own = step_batches(initial, base, rank)
    shared = step_batches(initial, base, 0)
    results = {
        "ddp": _run("ddp", base, own, out, rank),
        "fsdp": _run("fsdp", spec_with(sharding="fsdp"), own, out, rank),
        "fsdp_same_data": _run("fsdp_same_data", spec_with(sharding="fsdp"), shared, out, rank),
        "fsdp_checkpointed": _run(
            "fsdp_checkpointed", spec_with(sharding="fsdp", activationCheckpointing=True), own, out, rank
        ),
        "fsdp_offload": _run("fsdp_offload", spec_with(sharding="fsdp", cpuOffload=True), own, out, rank),
        "gather": _gather_checks(base, out, rank),
        "rank0_load": _rank0_load_checks(spec_with(sharding="fsdp"), rank),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    distributed.exit_process(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
