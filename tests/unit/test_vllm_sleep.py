"""A vLLM rollout on the learner's GPU sleeps while the learner updates, checked without vLLM or a GPU: the
pure decision (one-GPU layout, a backend that can sleep, a CUDA device), the worker's settings carrying
the layout's word to the factory, and the real `VLLMBackend` driving a stand-in for vLLM's `LLM` (asleep
after every generate call, awake before the next call and before a weight refresh, started with sleep mode
only when asked). What it cannot prove: that vLLM really hands the memory back on CUDA and wakes with the
same weights; the GPU check's one_gpu_colocated part runs a real engine for that.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from decentralized_verl.backends.base import GenerationRequest
from decentralized_verl.backends.factory import engine_options
from decentralized_verl.backends.sleep import sleeps_while_learner_updates
from decentralized_verl.backends.vllm_backend import VLLMBackend
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spec.catalogue.backends import HF, VLLM
from tests.support import vllm_fixtures
from tests.support.vllm_fixtures import install_fake_vllm


@pytest.mark.parametrize(
    ("kind", "device", "shared", "sleeps"),
    [
        (VLLM, "cuda:0", True, True),
        (VLLM, "cuda", True, True),
        (VLLM, "cuda:0", False, False),  # its own GPU: nothing to make room for
        (VLLM, "cpu", True, False),  # vLLM's CPU build has no sleep mode
        (HF, "cuda:0", True, False),  # an HF rollout on the learner's GPU runs inside it, one copy
    ],
)
def test_the_decision(kind, device: str, shared: bool, sleeps: bool) -> None:
    assert sleeps_while_learner_updates(kind, device, shared) is sleeps


def test_the_layouts_word_reaches_the_engine_options() -> None:
    settings = WorkerSettings.from_env({"DVERL_GPU_SHARED_WITH_LEARNER": "1"})
    assert settings.gpu_shared_with_learner is True
    assert WorkerSettings.from_env({}).gpu_shared_with_learner is False
    asked = sleeps_while_learner_updates(VLLM, "cuda:0", settings.gpu_shared_with_learner)
    assert engine_options(VLLM, 1, sleep_while_idle=asked)["sleep_while_idle"] is True
    assert "sleep_while_idle" not in engine_options(HF, 1, sleep_while_idle=True)  # it cannot sleep
    assert "sleep_while_idle" not in engine_options(VLLM, 1)


class FakeSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class FakeLLM:
    """Records the engine's state through every call: generating or reloading while asleep fails, as
    vLLM's memory would be gone."""

    made: ClassVar[list[FakeLLM]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.asleep = False
        self.events: list[str] = []
        FakeLLM.made.append(self)

    def sleep(self, level: int = 1) -> None:
        assert self.kwargs.get("enable_sleep_mode"), "vLLM sleeps only when started with sleep mode"
        assert not self.asleep and level == 1
        self.asleep = True
        self.events.append("sleep")

    def wake_up(self) -> None:
        assert self.asleep
        self.asleep = False
        self.events.append("wake")

    def generate(self, prompts: list[dict], params: list[Any], use_tqdm: bool = False, lora_request=None):
        assert not self.asleep, "generated while asleep"
        self.events.append("generate")
        token = SimpleNamespace(logprob=-0.5)
        out = SimpleNamespace(index=0, token_ids=[3], logprobs=[{3: token}], finish_reason="length", text="x")
        return [SimpleNamespace(outputs=[out]) for _ in prompts]

    def collective_rpc(self, method: str, args: tuple = ()) -> list[dict]:
        assert not self.asleep, "reloaded weights while asleep"
        self.events.append("reload")
        return [{}]

    def reset_prefix_cache(self) -> None:
        pass


@pytest.fixture
def fake_vllm(monkeypatch):
    install_fake_vllm(monkeypatch, FakeLLM, FakeSamplingParams)
    return FakeLLM


def requests() -> list[GenerationRequest]:
    return [
        GenerationRequest("0", (1, 2), SamplingParams(max_new_tokens=1, temperature=1.0, top_k=0, top_p=1.0))
    ]


def tiny() -> tuple[torch.nn.Module, Any]:
    return vllm_fixtures.tiny_tied_model(hidden_size=32, num_layers=1, intermediate_size=64, max_positions=64)


def test_a_sleeping_engine_sleeps_after_each_call_and_wakes_before_the_next_and_each_refresh(
    fake_vllm, tmp_path
) -> None:
    model, tokenizer = tiny()
    backend = VLLMBackend(model, tokenizer, enforce_eager=True, shm_dir=tmp_path, sleep_while_idle=True)
    (llm,) = fake_vllm.made
    assert llm.kwargs["enable_sleep_mode"] is True
    assert len(list(backend.generate(requests()))) == 1
    assert llm.asleep, "the learner has the GPU between calls"
    backend.load_weights({k: v + 0.5 for k, v in model.state_dict().items()}, version=1)
    assert not llm.asleep  # the next generate comes soon; a refresh leaves it awake
    list(backend.generate(requests()))
    list(backend.generate(requests()))
    assert llm.events == [
        "generate", "sleep", "wake", "reload", "generate", "sleep", "wake", "generate", "sleep",
    ]  # fmt: skip
    assert backend.sleeper.sleeps == 3 and len(backend.sleeper.wake_seconds) == 2


def test_an_engine_not_asked_to_sleep_never_does(fake_vllm, tmp_path) -> None:
    model, tokenizer = tiny()
    backend = VLLMBackend(model, tokenizer, enforce_eager=True, shm_dir=tmp_path)
    (llm,) = fake_vllm.made
    assert "enable_sleep_mode" not in llm.kwargs
    list(backend.generate(requests()))
    assert llm.events == ["generate"] and backend.sleeper.sleeps == 0
