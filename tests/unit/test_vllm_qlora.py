"""QLoRA rollouts on the vllm backend, without vLLM: a fake `vllm` module whose engine does what vLLM's
loader and LoRA manager do with what the backend hands them. It reads the exported model folder as it is
(the 4-bit base dequantized to its compute dtype: the pinned vLLM has no 4-bit loader), loads a LoRA
adapter from the folder a `LoRARequest` names the first time a request carries it, and samples from the
base with that adapter on.

What this proves: the backend hands the engine the LoRA settings (and no quantization) and the base once,
each policy version reaches it as a new adapter request (a new integer id, the old one removed, no weight
reload), and the engine's log-probs equal the learner's QLoRA model's for every 4-bit type (NF4 or FP4,
double quantization or not): the dequantized base holds the values the 4-bit layers compute with.
What it cannot prove: vLLM's own kernels and LoRA layers; `benchmarks/gpu_check.py --parts qlora` runs
the real engine on a GPU, and tests/e2e/test_cluster_gpu_examples.py vLLM's CPU build.
"""

from __future__ import annotations

import copy
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from decentralized_verl.backends.vllm_backend import VLLMBackend
from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.samples import Prompt, collate
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.errors import WireError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.models.lora import base_only
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.spec.manifest import parse_job, parse_spec
from decentralized_verl.training.trainer import rollout_state_dict
from tests.support.job_manifests import SMALL_JOB

TINY = {"hiddenSize": 64, "numLayers": 1, "numHeads": 4, "intermediateSize": 128}
LORA = {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj", "o_proj"]}


class FakeLoRARequest:
    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str = "") -> None:
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class FakeSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class FakeQLoRAEngine:
    """`vllm.LLM` with `enable_lora=True` over a plain checkpoint, as far as the backend sees it."""

    made: ClassVar[list[FakeQLoRAEngine]] = []

    def __init__(self, **kwargs: Any) -> None:
        assert "quantization" not in kwargs and kwargs["enable_lora"], kwargs
        self.kwargs = kwargs
        self.base = AutoModelForCausalLM.from_pretrained(kwargs["model"], dtype=torch.float32)
        self.adapters: PeftModel | None = None
        self.loaded: dict[int, str] = {}  # LoRA id -> the path it was read from
        self.used: list[int] = []  # the LoRA id of every generate call
        self.removed: list[int] = []
        self.generator = torch.Generator().manual_seed(kwargs["seed"])
        self.llm_engine = SimpleNamespace(remove_lora=self.removed.append)
        FakeQLoRAEngine.made.append(self)

    def _with_adapter(self, request: FakeLoRARequest) -> torch.nn.Module:
        lora_id = request.lora_int_id
        assert lora_id > 0 and lora_id not in self.removed, f"LoRA id {lora_id} is not served"
        name = f"lora{lora_id}"
        if lora_id not in self.loaded:  # read when a request first names it, as vLLM's LoRA manager does
            if self.adapters is None:
                self.adapters = PeftModel.from_pretrained(self.base, request.lora_path, adapter_name=name)
            else:
                self.adapters.load_adapter(request.lora_path, adapter_name=name)
            self.loaded[lora_id] = request.lora_path
        self.adapters.set_adapter(name)
        return self.adapters.eval()

    @torch.no_grad()
    def generate(
        self, prompts: list[dict], params: list[Any], use_tqdm: bool = False, lora_request: Any = None
    ) -> list[Any]:
        assert lora_request is not None, "a 4-bit base is served with the policy's adapters on"
        self.used.append(lora_request.lora_int_id)
        model = self._with_adapter(lora_request)
        return [
            SimpleNamespace(outputs=[self._sample(model, p["prompt_token_ids"], sp, i) for i in range(sp.n)])
            for p, sp in zip(prompts, params, strict=True)
        ]

    def _sample(self, model: Any, prompt: list[int], sp: Any, index: int) -> Any:
        tokens: list[int] = []
        logprobs: list[dict[int, Any]] = []
        while len(tokens) < sp.max_tokens:
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, -1].float()
            scaled = torch.log_softmax(logits / sp.temperature, dim=-1)  # processed_logprobs
            token = int(torch.multinomial(scaled.exp(), 1, generator=self.generator))
            tokens.append(token)
            logprobs.append({token: SimpleNamespace(logprob=float(scaled[token]))})
        return SimpleNamespace(
            index=index, token_ids=tokens, logprobs=logprobs, finish_reason="length", text=""
        )


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type[FakeQLoRAEngine]:
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeQLoRAEngine
    vllm.SamplingParams = FakeSamplingParams
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    for name, module in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    FakeQLoRAEngine.made = []
    return FakeQLoRAEngine


def qlora_spec(backend: str = "vllm", **quantization: Any) -> Any:
    return parse_spec(
        {
            "model": {"tiny": TINY, "lora": LORA, "quantization": quantization},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "x.jsonl"},
            "roles": {"rollout": {"replicas": 1, "backend": backend}},
            "training": {"batchSize": 2},
        }
    )


def trained_adapters(model: torch.nn.Module, seed: int) -> None:
    """The adapters a few updates would leave: B away from its zero start."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def items(tokenizer: Any, prompts: int = 2, samples: int = 3) -> list[tuple[Prompt, int]]:
    out = []
    for i in range(prompts):
        ids = tuple(tokenizer(f"{i}+{i}=", add_special_tokens=False)["input_ids"])
        out.extend((Prompt(f"p{i}", i, ids, f"{i}+{i}="), k) for k in range(samples))
    return out


@pytest.mark.parametrize("quantization", [{}, {"type": "fp4"}, {"doubleQuant": False}], ids=str)
def test_each_version_reaches_vllm_as_an_adapter_request_on_the_learners_4bit_base(
    fake_vllm: type[FakeQLoRAEngine], tmp_path: Path, quantization: dict
) -> None:
    spec = qlora_spec(**quantization)
    learner, tokenizer = load_model_and_tokenizer(spec.model)
    rollout_model, _ = load_model_and_tokenizer(spec.model)  # a rollout worker loads its own copy
    backend = VLLMBackend(rollout_model, tokenizer, seed=0, enforce_eager=True, work_dir=tmp_path)
    worker = RolloutWorker(backend, "w", backend_name="vllm")
    (engine,) = fake_vllm.made
    assert {k: engine.kwargs[k] for k in ("enable_lora", "max_lora_rank", "max_loras")} == {
        "enable_lora": True,
        "max_lora_rank": 8,  # rank 4, served in vLLM's next size up
        "max_loras": 1,
    }
    first = backend._lora
    assert (first.lora_int_id, backend.version) == (1, 0) and Path(first.lora_path).is_dir()

    trained_adapters(learner, seed=1)
    worker.load_weights(rollout_state_dict(learner), 1)
    second = backend._lora
    assert (second.lora_int_id, backend.version) == (2, 1)
    assert engine.removed == [1] and not Path(first.lora_path).exists()  # the old adapter is let go

    sampling = SamplingParams(max_new_tokens=5, temperature=1.0)
    samples = list(worker.generate_sync(items(tokenizer), sampling, 1))
    assert engine.used == [2] and len(samples) == 6
    batch = collate(samples, tokenizer.pad_token_id)
    mask = batch.response_mask.bool()
    learner.eval()
    with torch.no_grad():
        theirs = response_logprobs(learner, batch, 1.0)[0]
        with base_only(learner):
            without = response_logprobs(learner, batch, 1.0)[0]
    # the engine's dequantized base with the received adapters computes what the learner computes
    assert float((theirs - batch.old_logprobs).abs()[mask].max()) < 1e-4
    assert float((without - batch.old_logprobs).abs()[mask].max()) > 1e-2  # the adapters were on

    bad = {k: v[..., :-1] for k, v in rollout_state_dict(learner).items()}  # every adapter a column short
    with pytest.raises(WireError, match=r"lora_A.*shape \(4, 63\) does not match the model's \(4, 64\)"):
        worker.load_weights(bad, 2)
    assert backend._lora is second and backend.version == 1 and engine.removed == [1]
    assert sorted(p.name for p in tmp_path.glob("adapter-v*")) == ["adapter-v1"]


def test_every_4bit_type_may_roll_out_on_vllm() -> None:
    """vLLM serves the dequantized base, which any 4-bit type reproduces exactly: none is refused."""
    for quantization in ({"type": "fp4"}, {"doubleQuant": False}, {"type": "nf4"}):
        doc = copy.deepcopy(SMALL_JOB)
        doc["spec"]["model"].update(tiny=TINY, lora=LORA, quantization=quantization)
        doc["spec"]["roles"]["rollout"]["backend"] = "vllm"
        parse_job(doc)
