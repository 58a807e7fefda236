"""What only a GPU shows, through the same code the CPU suite runs: marked `gpu`, skipped where torch
sees no CUDA device (every run of the CPU CI), run by the GPU check's `gpu_tests` part.

Each worker started on CUDA reports its own device and holds GPU memory; a model FSDP2 shards on the
GPU keeps its embeddings tied; a process group on a GPU uses the mixed backend and reduces GPU tensors.
"""

from __future__ import annotations

import pytest
import torch

from decentralized_verl.runtime import device
from decentralized_verl.runtime.device_choice import GPU_BACKEND

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(device.gpu_count() == 0, reason="no CUDA device: torch sees no GPU on this machine"),
]


def test_entering_on_a_gpu_makes_it_current_and_counts_memory() -> None:
    got = device.enter(override="cuda", gpus=1)
    assert got.type == "cuda" and device.choice().is_gpu
    held = torch.ones(1024, 1024, device=device.process_device())
    assert device.memory_allocated() >= held.numel() * 4
    assert device.pins_memory() and device.pin_for_device(torch.ones(4)).is_pinned()


def test_fsdp2_on_the_gpu_keeps_embeddings_tied_and_uses_the_mixed_backend() -> None:
    import torch.distributed as dist

    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.training.sharding import shard_model

    device.enter(override="cuda", gpus=1)
    spec = ModelSpec(tiny={"hiddenSize": 32, "numLayers": 2, "numHeads": 2, "intermediateSize": 64})
    model, _ = load_model_and_tokenizer(spec, device="cpu")  # in host memory: FSDP2 moves the shards
    model.config.tie_word_embeddings = True  # as Qwen2.5 0.5B/1.5B and SmolLM2 tie theirs
    model.lm_head.weight = model.model.embed_tokens.weight
    shard_model(model, sharding="fsdp", world=1)
    assert dist.get_backend() == GPU_BACKEND or "nccl" in str(dist.get_backend())
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight is embeddings.weight
    assert next(model.parameters()).device.type == "cuda"
    summed = torch.ones(1, device=device.collective_device())
    dist.all_reduce(summed)
    assert float(summed) == 1.0


def test_weights_leave_the_gpu_in_buckets_through_pinned_staging() -> None:
    from decentralized_verl.transport.weights.codec import decode_bundle, encode_state_dict
    from decentralized_verl.transport.weights.staging import HostStaging

    device.enter(override="cuda", gpus=1)
    weights = torch.randn(3000, 1000, device=device.process_device())  # 12 MB: three 4 MiB buckets
    staging = HostStaging(4 * 2**20)
    host = staging.to_host(weights)
    assert staging.pin and staging.buckets == 3 and host.device.type == "cpu"
    assert torch.equal(host, weights.cpu())
    bundle = encode_state_dict({"w": weights}, 1, dtype=None)
    assert torch.equal(decode_bundle(bundle)["w"], weights.cpu())
