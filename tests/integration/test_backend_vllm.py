"""The vLLM backend: generation contract, log-probs vs transformers after a live refresh, bad refreshes.

Engine tests need vLLM, which the main venv does not have: they skip with the reason below. Run them
with ``scripts/install-vllm.sh`` then
``.venv-vllm/bin/python -m pytest tests/{unit,integration}/test_backend_vllm.py``
(tests/unit holds the weight-export tests, which run everywhere). One engine (a tiny tied-embedding Llama,
fp32, eager) is shared by the module; starting it takes about a minute on 2 cores.
"""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace

import pytest
import torch

from decentralized_verl.backends.base import GenerationRequest, SamplingParams
from decentralized_verl.errors import WireError
from tests.support import vllm_fixtures
from tests.support.paths import ROOT, TOY

SKIP_REASON = (
    "vLLM is not installed in this venv (the main CI venv has none); run scripts/install-vllm.sh and "
    "`.venv-vllm/bin/python -m pytest tests/{unit,integration}/test_backend_vllm.py`"
)
FP32_TOL = 2e-4


def tiny_tied_model(seed: int = 0) -> tuple[torch.nn.Module, object]:
    """A 2-layer Llama with tied embeddings (like SmolLM2), head size 64 (a size vLLM's CPU kernels have)."""
    return vllm_fixtures.tiny_tied_model(
        hidden_size=128, num_layers=2, intermediate_size=256, max_positions=256, seed=seed
    )


def perturbed_state_dict(model: torch.nn.Module, seed: int, scale: float = 0.2) -> dict[str, torch.Tensor]:
    """New weights, far enough from the old ones that stale weights would be obvious (tied alias kept)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        state[name] = tensor + scale * torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


@torch.no_grad()
def reference_logprobs(
    model: torch.nn.Module, prompt: tuple[int, ...], response: tuple[int, ...], temperature: float
):
    """Slow, obvious reference: one transformers forward over prompt + response, log_softmax(logits / T)."""
    ids = torch.tensor([list(prompt) + list(response)])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, dim=-1).gather(-1, torch.tensor(response)[:, None]).flatten()


def assert_logprobs_match(model, outputs, temperature: float, tol: float = FP32_TOL) -> float:
    worst = 0.0
    for out in outputs:
        ref = reference_logprobs(model, out.prompt_token_ids, out.response_token_ids, temperature)
        got = torch.tensor(out.logprobs)
        assert got.shape == ref.shape
        worst = max(worst, float((got - ref).abs().max()))
    assert worst < tol, f"max |vLLM - transformers| log-prob difference {worst} >= {tol}"
    return worst


# ------------------------------------------------------------------ engine


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    pytest.importorskip("vllm", reason=SKIP_REASON)
    from decentralized_verl.backends.factory import make_backend
    from decentralized_verl.spec.catalogue.backends import VLLM

    cache = tmp_path_factory.mktemp("vllm-cache")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{min(2, os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    torch.set_num_threads(1)
    model, tokenizer = tiny_tied_model()
    backend = make_backend(VLLM, model, tokenizer, version=1, seed=0, eager=True)
    yield SimpleNamespace(backend=backend, model=model, tokenizer=tokenizer)
    backend.close()


def prompt_ids(tokenizer, text: str = "12 + 30 = ") -> tuple[int, ...]:
    return tuple(tokenizer(text)["input_ids"])


@pytest.mark.timeout(900)
def test_generation_respects_max_tokens_and_reports_version(engine) -> None:
    backend, tok = engine.backend, engine.tokenizer
    assert backend.version == 1
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=3)
    outs = list(
        backend.generate(
            [GenerationRequest("a", prompt_ids(tok), params), GenerationRequest("b", (5, 6), params)]
        )
    )
    assert [(o.prompt_id, o.sample_index) for o in outs] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("b", 0),
        ("b", 1),
        ("b", 2),
    ]
    for out in outs:
        assert 1 <= len(out.response_token_ids) <= 6
        assert len(out.logprobs) == len(out.response_token_ids)
        assert all(lp <= 0 for lp in out.logprobs)
        ended_by_eos = out.response_token_ids[-1] in backend.eos_token_ids
        assert out.finish_reason == ("stop" if ended_by_eos else "length")
        if out.finish_reason == "length":
            assert len(out.response_token_ids) == 6
        assert out.policy_version == 1
        assert out.text == tok.decode(out.response_token_ids, skip_special_tokens=True)
    assert_logprobs_match(engine.model, outs, temperature=1.0)


@pytest.mark.timeout(900)
def test_stop_string_ends_the_response_and_stays_in_the_text(engine) -> None:
    backend, tok = engine.backend, engine.tokenizer
    request = GenerationRequest("g", prompt_ids(tok), SamplingParams(max_new_tokens=12, temperature=0))
    (free,) = list(backend.generate([request]))
    assert free.finish_reason == "length" and len(free.text) >= 6, free  # char tokenizer: 1 token = 1 char
    stop = free.text[3:5]  # a stop string that completes at the 5th (or an earlier) token
    first_end = free.text.find(stop) + len(stop)
    params = SamplingParams(max_new_tokens=12, temperature=0, stop=(stop, "never-produced"))
    (cut,) = list(backend.generate([GenerationRequest("g", request.prompt_token_ids, params)]))
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[:first_end] and cut.text.endswith(stop)
    assert cut.response_token_ids == free.response_token_ids[:first_end]
    assert cut.logprobs == pytest.approx(free.logprobs[:first_end], abs=1e-5)
    assert_logprobs_match(engine.model, [free, cut], temperature=0)


@pytest.mark.timeout(900)
def test_logprobs_after_refresh_match_transformers_on_the_new_weights(engine) -> None:
    backend, tok = engine.backend, engine.tokenizer
    request = GenerationRequest("r", prompt_ids(tok), SamplingParams(max_new_tokens=10, temperature=0.7, n=4))
    old_model = copy.deepcopy(engine.model)
    new_state = perturbed_state_dict(engine.model, seed=7)
    new_model = copy.deepcopy(engine.model)
    new_model.load_state_dict(new_state)
    new_model.tie_weights()

    backend.load_weights(new_state, 7)
    assert backend.version == 7
    after = list(backend.generate([request]))
    assert all(o.policy_version == 7 for o in after)
    assert_logprobs_match(new_model, after, temperature=0.7)
    # the old weights would not explain the new log-probs (so the refresh did land, lm_head included)
    stale = max(
        float(
            (
                torch.tensor(o.logprobs)
                - reference_logprobs(old_model, o.prompt_token_ids, o.response_token_ids, 0.7)
            )
            .abs()
            .max()
        )
        for o in after
    )
    assert stale > 100 * FP32_TOL
    for name, tensor in engine.model.state_dict().items():  # the reference copy holds v7 too
        assert torch.equal(tensor, new_state[name]), name
    assert backend.refresh_seconds and backend.refresh_seconds[-1] > 0


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update({"model.norm.weight": torch.ones(3)}), r"weights\['model.norm.weight'\]: shape"),
        (lambda s: s.pop("model.layers.1.mlp.up_proj.weight"), r"model.layers.1.mlp.up_proj.weight.*missing"),
        (
            lambda s: s.update(
                {"model.layers.0.input_layernorm.weight": s["model.layers.0.input_layernorm.weight"].double()}
            ),
            r"input_layernorm.weight'\]: dtype torch.float64",
        ),
        (
            lambda s: s.update({"model.extra.weight": torch.zeros(2)}),
            r"model.extra.weight'\]: is not a tensor of this model",
        ),
    ],
    ids=["shape", "missing", "dtype", "unexpected"],
)
def test_bad_refresh_raises_before_touching_the_engine(engine, edit, message) -> None:
    backend, tok = engine.backend, engine.tokenizer
    version, reloads = backend.version, len(backend.refresh_seconds)
    reference = {k: v.clone() for k, v in engine.model.state_dict().items()}
    bad = perturbed_state_dict(engine.model, seed=11)
    edit(bad)
    with pytest.raises(WireError, match=message):
        backend.load_weights(bad, version + 1)
    assert backend.version == version and len(backend.refresh_seconds) == reloads
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, reference[name]), f"{name} changed by a refused refresh"
    outs = list(
        backend.generate([GenerationRequest("ok", prompt_ids(tok), SamplingParams(max_new_tokens=5))])
    )
    assert outs[0].policy_version == version
    assert_logprobs_match(engine.model, outs, temperature=1.0)  # the engine still serves the old weights


@pytest.mark.timeout(900)
def test_bad_requests_are_refused_before_generation(engine) -> None:
    backend = engine.backend
    with pytest.raises(ValueError, match="prompt token ids must be in"):
        backend.generate([GenerationRequest("x", (0, 10**6))])
    with pytest.raises(ValueError, match="exceeds the engine's 256 positions"):
        backend.generate([GenerationRequest("x", (5,) * 250, SamplingParams(max_new_tokens=10))])
    with pytest.raises(ValueError, match="top_k/top_p filtering is not supported"):
        backend.generate([GenerationRequest("x", (5, 6), SamplingParams(top_p=0.9))])
    with pytest.raises(ValueError, match="version: must be an integer >= 0"):
        backend.load_weights(engine.model.state_dict(), -1)
    # greedy ignores the filters (its log-probs are unfiltered at T = 1), so it is allowed
    (out,) = list(
        backend.generate(
            [GenerationRequest("x", (5, 6), SamplingParams(temperature=0, top_k=3, max_new_tokens=3))]
        )
    )
    assert_logprobs_match(engine.model, [out], temperature=0)


@pytest.mark.timeout(900)
def test_lora_adapter_update_is_merged_and_mark_version_pushes_a_shared_model(engine) -> None:
    """A LoRA job ships adapters only (partial); the backend merges them into the base weights."""
    import peft

    backend, tok = engine.backend, engine.tokenizer
    lora_model = peft.get_peft_model(
        copy.deepcopy(engine.model), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    original = backend.model
    backend.model = lora_model  # as if the backend had been built from the LoRA-wrapped model
    try:
        gen = torch.Generator().manual_seed(3)
        adapters = {
            name: torch.randn(p.shape, generator=gen) * 0.5
            for name, p in lora_model.named_parameters()
            if p.requires_grad
        }
        assert adapters and all("lora_" in name for name in adapters)
        backend.load_weights(adapters, 20, partial=True)
        request = GenerationRequest("l", prompt_ids(tok), SamplingParams(max_new_tokens=8, n=2))
        outs = list(backend.generate([request]))
        assert all(o.policy_version == 20 for o in outs)
        assert_logprobs_match(lora_model, outs, temperature=1.0)

        with torch.no_grad():  # a colocated learner changes the shared model in place, then relabels
            for param in lora_model.parameters():
                if param.requires_grad:
                    param.mul_(-1.0)
        backend.mark_version(21)
        outs = list(backend.generate([request]))
        assert all(o.policy_version == 21 for o in outs)
        assert_logprobs_match(lora_model, outs, temperature=1.0)
    finally:
        backend.model = original
        backend.mark_version(22)  # leave the engine serving the plain model again


@pytest.mark.timeout(900)
def test_episodes_continue_from_the_engines_tokens_and_match_the_learner(engine) -> None:
    """Multi-turn episodes through the rollout worker on the real engine: each turn's prompt is the episode's
    exact token ids so far, the engine's tokens and log-probs sit unchanged on the mask-1 positions, each
    turn ended on a stop string, end-of-turn or its budget, and the learner's log-probs agree on them."""
    from decentralized_verl.core.forward import response_logprobs
    from decentralized_verl.core.samples import Prompt, collate
    from decentralized_verl.data.prompts import render_prompt
    from decentralized_verl.environments.settings import EpisodeSettings
    from decentralized_verl.serving.rollout import RolloutWorker

    backend, tok = engine.backend, engine.tokenizer
    seen: list[tuple[GenerationRequest, object]] = []

    class Recording:  # the backend, with every turn's request and answer kept
        version = property(lambda self: backend.version)
        tokenizer = tok
        eos_token_ids = backend.eos_token_ids
        max_model_len = backend.max_model_len

        def generate(self, requests):
            outs = list(backend.generate(requests))
            by_id = {r.prompt_id: r for r in requests}
            seen.extend((by_id[o.prompt_id], o) for o in outs)
            return iter(outs)

    game = EpisodeSettings("guessing_game", {"maxNumber": 9}, max_turns=3)
    worker = RolloutWorker(Recording(), "w", backend_name="vllm", environment=game)
    items = []
    for i in range(2):
        text = render_prompt(f"Guess my number ({i})", tok)
        ids = tuple(tok(text, add_special_tokens=False)["input_ids"])
        items.extend((Prompt(f"p{i}", i, ids, text, "5", environment=True), k) for k in range(3))
    stop = tuple("0123456789")
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, stop=stop)
    samples = list(worker.generate_sync(items, sampling, backend.version))
    assert any(len(s.turns) > 1 for s in samples)
    assert len(seen) == sum(len(s.turns) for s in samples)
    turns_of: dict[int, list] = {}  # a turn's request id is its episode's position in `items`
    for request, out in seen:
        turns_of.setdefault(int(request.prompt_id), []).append((request, out))
    position = {(p.prompt_id, k): i for i, (p, k) in enumerate(items)}
    for s in samples:
        starts = [i for i, m in enumerate(s.loss_mask) if m and (i == 0 or not s.loss_mask[i - 1])]
        turns = turns_of[position[s.key]]
        assert len(turns) == len(starts) == len(s.turns)
        for turn, (start, (request, out)) in enumerate(zip(starts, turns, strict=True)):
            assert request.prompt_token_ids == (*s.prompt.token_ids, *s.response_ids[:start])  # exact ids
            end = start + len(out.response_token_ids)
            assert s.response_ids[start:end] == out.response_token_ids
            assert s.logprobs[start:end] == out.logprobs
            assert all(s.loss_mask[start:end]) and (end == len(s.loss_mask) or not s.loss_mask[end])
            assert s.turns[turn] == out.text
            ended = (
                out.text.endswith(stop)
                or out.response_token_ids[-1] in backend.eos_token_ids
                or (out.finish_reason == "length" and len(out.response_token_ids) == 6)
            )
            assert ended, out
        assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if not m)
    batch = collate(samples, tok.pad_token_id)
    trained = batch.trained_mask()
    with torch.no_grad():
        learner = response_logprobs(engine.model, batch, 1.0)[0]
    assert float(((learner - batch.old_logprobs).abs() * trained).max()) < FP32_TOL


@pytest.mark.timeout(300)
def test_rollout_throughput_benchmark_smoke_hf() -> None:
    """`benchmarks/rollout_throughput.py --tiny --backend hf` runs and reports consistent numbers."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "rollout_throughput.py"),
            "--tiny",
            "--backend",
            "hf",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table, _, rest = done.stdout.partition("\n{")
    assert "| hf | 8 | 64 |" in table  # 2 prompts x 4 samples x 8 tokens, end-of-sequence off
    report = json.loads("{" + rest)
    hf = report["results"]["hf"]
    assert hf["tokens_per_run"] == 64 and hf["completions"] == 8
    run = hf["runs"][0]
    assert run["tokens_per_s"] == pytest.approx(run["tokens"] / run["wall_s"])


@pytest.mark.timeout(1500)
def test_dverl_run_with_a_vllm_rollout_worker(tmp_path) -> None:
    """The whole job: learner + a separate vLLM rollout worker process, weights refreshed every step.

    On-policy, the first update's probability ratio is learner log-prob / vLLM log-prob of the same tokens
    under the same weights: it is 1 only if the engine generated with exactly the learner's weights.
    """
    pytest.importorskip("vllm", reason=SKIP_REASON)
    import yaml

    from decentralized_verl.launch.run import run_job
    from decentralized_verl.reporting.metrics import read_metrics

    toy = str(TOY)
    spec = {
        "model": {
            "tiny": {
                "hiddenSize": 128,
                "numLayers": 2,
                "numHeads": 2,
                "intermediateSize": 256,
                "maxPositions": 256,
            }
        },
        "algorithm": {"name": "grpo", "samplesPerPrompt": 4, "klCoef": 0.0},
        "data": {
            "train": os.path.abspath(os.path.join(toy, "train.jsonl")),
            "rewardType": "decentralized_verl.rewards.toy:first_number",
            "maxPromptTokens": 64,
            "maxNewTokens": 8,
        },
        "roles": {"rollout": {"replicas": 1, "backend": "vllm", "batchSize": 8}, "learner": {"replicas": 1}},
        "training": {"steps": 3, "batchSize": 8, "minibatchSize": 8, "learningRate": 1.0e-3, "evalEvery": 0},
    }
    doc = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "vllm-e2e"},
        "spec": spec,
    }
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    os.environ["DVERL_VLLM_EAGER"] = "1"
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    run_job(manifest, tmp_path / "run", progress=False, timeout=1400)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["samples"] == r["unique_samples"] == 32 for r in records)
    first = records[0]
    ratio = first.get("pg_ratio_max", first.get("ratio_max"))
    assert ratio is not None and abs(ratio - 1.0) < 1e-3, first
