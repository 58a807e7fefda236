"""Tensor-parallel vllm rollout workers, checked without vLLM or a GPU: a fake ``vllm`` module records the
engine's arguments and plays one engine worker per GPU, each running our real worker extension.

What this proves: a worker given N GPUs starts its engine with ``tensor_parallel_size = N`` (1 on CPU,
with a log line), asks for more GPUs than it has are refused naming the spec field, and a weight
refresh reaches every engine worker with the full tensors (each reloads its own slice; vLLM's
loaders do the slicing) while the file is still there. What it cannot prove: that vLLM really splits
the model over GPUs; that needs a GPU run.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from decentralized_verl.backends import vllm_engine_args
from decentralized_verl.backends.factory import engine_options
from decentralized_verl.backends.vllm_backend import VLLMBackend
from decentralized_verl.backends.vllm_engine_args import parallel_kwargs
from decentralized_verl.backends.vllm_extension import QUALNAME, WeightRefreshExtension
from decentralized_verl.planning.plan import worker_resources
from decentralized_verl.spec.catalogue.backends import HF, VLLM
from decentralized_verl.spec.manifest import parse_spec
from tests.support import vllm_fixtures


def tiny_tied_model() -> tuple[torch.nn.Module, Any]:
    return vllm_fixtures.tiny_tied_model(hidden_size=32, num_layers=1, intermediate_size=64, max_positions=64)


class FakeHeadMethod:
    def __init__(self) -> None:
        self.processed = 0

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.processed += 1


class FakeEngineModel(torch.nn.Module):
    """The shape of a vLLM Llama that ``_refresh_tied_head`` looks at: config, model.embed_tokens, lm_head."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.config = SimpleNamespace(tie_word_embeddings=True)
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)  # untied, as after CPU repacking
        self.lm_head.quant_method = FakeHeadMethod()


class FakeWorker(WeightRefreshExtension):
    """One engine worker (one GPU): our extension mixed into a worker with vLLM's two hooks faked."""

    def __init__(self, rank: int, vocab: int, hidden: int) -> None:
        self.rank = rank
        self.engine_model = FakeEngineModel(vocab, hidden)
        self.model_runner = SimpleNamespace(get_model=lambda: self.engine_model)
        self.reloaded: list[dict[str, torch.Tensor]] = []

    def reload_weights(self, weights_iterator: Any) -> None:
        self.reloaded.append({name: tensor.clone() for name, tensor in weights_iterator})


class FakeLLM:
    """Records ``LLM(**kwargs)`` and runs ``collective_rpc`` on every worker, as vLLM's executor does."""

    made: ClassVar[list[FakeLLM]] = []

    def __init__(self, **kwargs: Any) -> None:
        assert kwargs["worker_extension_cls"] == QUALNAME
        self.kwargs = kwargs
        config = json.loads((Path(kwargs["model"]) / "config.json").read_text())
        self.workers = [
            FakeWorker(rank, config["vocab_size"], config["hidden_size"])
            for rank in range(kwargs["tensor_parallel_size"])
        ]
        self.prefix_resets = 0
        FakeLLM.made.append(self)

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        return [getattr(worker, method)(*args) for worker in self.workers]

    def reset_prefix_cache(self) -> None:
        self.prefix_resets += 1


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.made = []
    return FakeLLM


def with_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_parallel_kwargs_use_the_gpus_and_refuse_what_is_not_there(caplog) -> None:
    assert parallel_kwargs(1, 1) == {"tensor_parallel_size": 1}
    assert parallel_kwargs(4, 8) == {"tensor_parallel_size": 4}
    with caplog.at_level(logging.WARNING, logger=vllm_engine_args.__name__):
        assert parallel_kwargs(4, 0) == {"tensor_parallel_size": 1}
    assert "tensor_parallel_size 1" in caplog.text and "4 GPUs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=vllm_engine_args.__name__):
        parallel_kwargs(1, 0)
    assert caplog.text == ""  # nothing asked for, nothing to say
    with pytest.raises(ValueError, match=r"roles\.rollout\.resources\.gpus: .* over 4 GPUs .* sees 2"):
        parallel_kwargs(4, 2)
    with pytest.raises(ValueError, match=r"roles\.rollout\.resources\.gpus"):
        parallel_kwargs(0, 2)


def test_engine_is_split_over_the_gpus_and_a_refresh_reaches_every_worker(fake_vllm, monkeypatch, tmp_path):
    with_gpus(monkeypatch, 2)
    model, tokenizer = tiny_tied_model()
    backend = VLLMBackend(model, tokenizer, tensor_parallel_size=2, enforce_eager=True, shm_dir=tmp_path)
    (llm,) = fake_vllm.made
    assert llm.kwargs["tensor_parallel_size"] == 2
    assert "gpu_memory_utilization" not in llm.kwargs  # the CPU RAM sizing is for CPU engines only

    new = {name: tensor + 0.5 for name, tensor in model.state_dict().items()}
    new["lm_head.weight"] = new["model.embed_tokens.weight"]
    backend.load_weights(new, version=3)

    assert backend.version == 3 and llm.prefix_resets == 1
    assert backend.last_refresh["engine_workers"] == 2.0
    for worker in llm.workers:
        (got,) = worker.reloaded
        # Every worker gets every tensor whole (vLLM's loaders take each rank's slice), the alias once.
        assert set(got) == set(new) - {"lm_head.weight"}
        for name, tensor in got.items():
            torch.testing.assert_close(tensor, new[name], rtol=0, atol=0)
        engine = worker.engine_model
        assert engine.lm_head.weight is engine.model.embed_tokens.weight  # re-tied on this worker
        assert engine.lm_head.quant_method.processed == 1
    assert list(tmp_path.iterdir()) == []  # the weights file is removed once all workers are done
    backend.close()


def test_cpu_engine_stays_on_one_process_and_says_so(fake_vllm, monkeypatch, caplog):
    with_gpus(monkeypatch, 0)
    model, tokenizer = tiny_tied_model()
    with caplog.at_level(logging.WARNING, logger=vllm_engine_args.__name__):
        backend = VLLMBackend(model, tokenizer, tensor_parallel_size=2, enforce_eager=True)
    (llm,) = fake_vllm.made
    assert llm.kwargs["tensor_parallel_size"] == 1 and len(llm.workers) == 1
    assert "gpu_memory_utilization" in llm.kwargs
    assert "has none" in caplog.text
    backend.close()


def test_more_gpus_than_the_machine_has_fail_before_the_engine_starts(fake_vllm, monkeypatch):
    with_gpus(monkeypatch, 1)
    model, tokenizer = tiny_tied_model()
    with pytest.raises(ValueError, match=r"roles\.rollout\.resources\.gpus"):
        VLLMBackend(model, tokenizer, tensor_parallel_size=2, enforce_eager=True)
    assert fake_vllm.made == []


def test_each_rollout_worker_sizes_its_engine_by_its_own_pool_gpus() -> None:
    spec = parse_spec(
        {
            "model": {"tiny": {}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "data/train.jsonl"},
            "roles": {
                "rollout": {
                    "replicas": 3,
                    "backend": "vllm",
                    "resources": {"gpus": 2},
                    "nodePools": [
                        {"name": "big", "replicas": 1, "resources": {"gpus": 4}},
                        {"name": "plain", "replicas": 2},
                    ],
                },
            },
        }
    )
    role = spec.roles.rollout
    gpus = [worker_resources(role, index).gpus for index in range(3)]
    assert gpus == [4, 2, 2]  # the pool's resources replace the role's; a pool without them keeps the role's
    tp = [engine_options(VLLM, g)["tensor_parallel_size"] for g in gpus]
    assert tp == [4, 2, 2]
    assert engine_options(VLLM, 0) == {"tensor_parallel_size": 1, "enforce_eager": False}
    assert engine_options(VLLM, 1, eager=True)["enforce_eager"] is True  # DVERL_VLLM_EAGER=1
    assert engine_options(HF, 4) == {}  # the hf backend runs on one device and takes no such option
    with pytest.raises(ValueError, match="index: the role has 3 replicas"):
        worker_resources(role, 3)
