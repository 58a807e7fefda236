"""Multi-turn episodes on the vllm backend, without vLLM: a fake ``vllm`` module whose engine samples from a
real tiny transformers model, token by token, the way vLLM reports it (token ids, one log-prob dict per
token, stop strings kept in the text, ``stop_token_ids``, ``max_tokens``).

What this proves: through `VLLMBackend` and the rollout worker's episode loop, each turn's engine prompt is
exactly the prompt plus the episode's tokens so far (token ids, never text); the engine's tokens and
log-probs land unchanged on the mask-1 positions, and only there; every turn carries the job's stop strings,
the end-of-turn ids and its own token budget; the learner's log-probs equal the engine's on exactly the
model's tokens; a weight refresh between two turns (a colocated learner's publish) labels the episode with
its oldest version. What it cannot prove: vLLM's own sampling and detokenizing; the real-engine episode test
in tests/integration/test_backend_vllm.py and `benchmarks/vllm_episodes.py` run those with vLLM installed.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from decentralized_verl.backends.vllm_backend import VLLMBackend
from decentralized_verl.core.forward import response_logprobs
from decentralized_verl.core.samples import Prompt, collate
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.data.prompts import render_prompt
from decentralized_verl.environments.settings import EpisodeSettings
from decentralized_verl.models.tiny import build_tiny, tiny_config
from decentralized_verl.models.tokenizer import build_char_tokenizer
from decentralized_verl.serving.rollout import RolloutWorker
from tests.support.vllm_fixtures import install_fake_vllm

GAME = EpisodeSettings("guessing_game", {"maxNumber": 9}, max_turns=3)
STOP = tuple("0123456789aeiou")  # a digit or a vowel ends a turn, as `</calc>` hands one to the calculator


class FakeSamplingParams:
    """vLLM's SamplingParams as a record of what the backend asked for."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class FakeLLM:
    """An engine that samples from `policy` (a transformers model) and answers like `vllm.LLM.generate`."""

    policy: ClassVar[Any] = None
    made: ClassVar[list[FakeLLM]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[list[tuple[tuple[int, ...], Any, Any]]] = []  # (prompt ids, params, answer)
        self.generator = torch.Generator().manual_seed(kwargs["seed"])
        FakeLLM.made.append(self)

    @torch.no_grad()
    def generate(
        self, prompts: list[dict], params: list[Any], use_tqdm: bool = False, lora_request: Any = None
    ) -> list[Any]:
        assert lora_request is None, "a full-weights job asks vLLM for no adapter"
        model, tokenizer = FakeLLM.policy
        results, call = [], []
        for prompt, sp in zip(prompts, params, strict=True):
            outputs = [self._sample(model, tokenizer, prompt["prompt_token_ids"], sp, i) for i in range(sp.n)]
            results.append(SimpleNamespace(outputs=outputs))
            call.append((tuple(prompt["prompt_token_ids"]), sp, outputs[0]))
        self.calls.append(call)
        return results

    def _sample(self, model: Any, tokenizer: Any, prompt: list[int], sp: Any, index: int) -> Any:
        tokens: list[int] = []
        logprobs: list[dict[int, Any]] = []
        finish, text = "length", ""
        while len(tokens) < sp.max_tokens:
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, -1].float()
            scaled = torch.log_softmax(logits / (sp.temperature or 1.0), dim=-1)
            if sp.temperature == 0:
                token = int(scaled.argmax())
            else:
                token = int(torch.multinomial(scaled.exp(), 1, generator=self.generator))
            tokens.append(token)
            logprobs.append({token: SimpleNamespace(logprob=float(scaled[token]))})
            text = tokenizer.decode(tokens, skip_special_tokens=sp.skip_special_tokens)
            if token in (sp.stop_token_ids or ()):
                finish = "stop"
                break
            hits = [text.find(s) + len(s) for s in sp.stop or () if s in text]
            if hits:
                text, finish = text[: min(hits)], "stop"
                break
        return SimpleNamespace(
            index=index, token_ids=tokens, logprobs=logprobs, finish_reason=finish, text=text
        )

    def collective_rpc(self, method: str, args: tuple = ()) -> list[dict]:
        assert method == "dverl_reload_from_file"
        return [{}]

    def reset_prefix_cache(self) -> None:
        pass


@pytest.fixture
def fake_vllm(monkeypatch):
    install_fake_vllm(monkeypatch, FakeLLM, FakeSamplingParams)
    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    spec = SimpleNamespace(
        architecture="llama",
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        max_positions=256,
    )
    model = build_tiny(tiny_config(spec, tokenizer), 0).float().eval()
    FakeLLM.policy = (model, tokenizer)
    return model, tokenizer


def episode_items(tokenizer: Any, prompts: int = 2, samples: int = 3) -> list[tuple[Prompt, int]]:
    items = []
    for i in range(prompts):
        text = render_prompt(f"Guess my number ({i})", tokenizer)
        ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        prompt = Prompt(f"p{i}", i, ids, text, "5", environment=True)
        items.extend((prompt, k) for k in range(samples))
    return items


def mask_runs(mask: tuple[int, ...]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i, m in enumerate(mask):
        if m and runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        elif m:
            runs.append((i, i + 1))
    return runs


def test_turns_continue_from_exact_token_ids_and_only_model_tokens_carry_logprobs(fake_vllm) -> None:
    model, tok = fake_vllm
    backend = VLLMBackend(model, tok, seed=3)
    worker = RolloutWorker(backend, "w", backend_name="vllm", environment=GAME)
    items = episode_items(tok)
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, stop=STOP, seed=5)
    samples = list(worker.generate_sync(items, sampling, 0))
    (engine,) = FakeLLM.made
    assert sorted(s.key for s in samples) == sorted((p.prompt_id, k) for p, k in items)
    assert any(len(s.turns) > 1 for s in samples)

    # Engine call r holds turn r of every episode still playing, in item order.
    for position, sample in enumerate(samples_in_item_order(samples, items)):
        runs = mask_runs(sample.loss_mask)
        assert len(runs) == len(sample.turns)
        for turn, (start, end) in enumerate(runs):
            prompt_ids, _, answer = engine_call_for(engine, samples, items, position, turn)
            assert prompt_ids == (*sample.prompt.token_ids, *sample.response_ids[:start])
            assert sample.response_ids[start:end] == tuple(answer.token_ids)  # as sampled, nothing added
            assert sample.logprobs[start:end] == tuple(
                lp[t].logprob for t, lp in zip(answer.token_ids, answer.logprobs, strict=True)
            )
            assert sample.turns[turn] == answer.text
        env = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if not m]
        assert all(lp == 0.0 for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if not m)
        if len(sample.turns) > 1:
            assert "<|user|>" in tok.decode(env) and tok.decode(env).endswith("<|assistant|>\n")

    answered = sum(len(answer.token_ids) for call in engine.calls for _, _, answer in call)
    assert answered == sum(sum(s.loss_mask) for s in samples)  # every engine token is a mask-1 token

    batch = collate(samples, tok.pad_token_id)
    trained = batch.trained_mask()
    with torch.no_grad():
        learner = response_logprobs(model, batch, 1.0)[0]
    assert float(((learner - batch.old_logprobs).abs() * trained).max()) < 1e-5
    assert float(learner[(batch.response_mask - trained).bool()].abs().min()) > 0


def test_every_turn_has_its_stop_strings_end_of_turn_ids_and_budget(fake_vllm) -> None:
    model, tok = fake_vllm
    backend = VLLMBackend(model, tok, seed=1)
    worker = RolloutWorker(backend, "w", backend_name="vllm", environment=GAME)
    sampling = SamplingParams(max_new_tokens=5, temperature=1.0, stop=STOP)
    samples = list(worker.generate_sync(episode_items(tok, samples=4), sampling, 0))
    (engine,) = FakeLLM.made
    for call in engine.calls:
        for prompt_ids, sp, _ in call:
            assert sp.n == 1 and sp.stop == list(STOP) and sp.include_stop_str_in_output
            assert sp.stop_token_ids == [tok.eos_token_id] and sp.ignore_eos and sp.logprobs == 0
            assert sp.max_tokens == min(5, 256 - len(prompt_ids))
    turns = [turn for s in samples for turn in s.turns]
    stopped = [t for t in turns if any(c in t for c in STOP)]
    assert len(stopped) >= 3, "too few turns reached a stop string; pick another seed"
    for text in stopped:  # the turn ended at its first stop string, which it keeps
        assert text[-1] in STOP and not any(c in text[:-1] for c in STOP), text
    for s in samples:  # a turn cut by the stop string is followed by the environment, then the next turn
        for (start, end), text in zip(mask_runs(s.loss_mask), s.turns, strict=True):
            assert tok.decode(list(s.response_ids[start:end]), skip_special_tokens=True) == text


def test_a_refresh_between_turns_labels_the_episode_with_its_oldest_version(fake_vllm) -> None:
    """A colocated learner publishes by `mark_version` while episodes play: the refresh lands between two
    turns (the engine's lock keeps it out of a turn), later turns use the new weights, and the sample
    says the oldest version it holds tokens of (its log-probs are each turn's own policy's)."""
    model, tok = fake_vllm
    backend = VLLMBackend(model, tok, seed=2)
    worker = RolloutWorker(backend, "w", backend_name="vllm", environment=GAME)
    inner = backend.generate

    def generate_then_publish(requests):
        yield from inner(requests)
        if backend.version == 0:
            backend.mark_version(1)  # after the first turn of every episode

    backend.generate = generate_then_publish
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0)
    samples = list(worker.generate_sync(episode_items(tok), sampling, 0))
    assert backend.version == 1 and any(len(s.turns) > 1 for s in samples)
    assert all(s.policy_version == 0 for s in samples)
    later = list(worker.generate_sync(episode_items(tok, prompts=1, samples=1), sampling, 1))
    assert [s.policy_version for s in later] == [1]


# ------------------------------------------------------------------ helpers


def samples_in_item_order(samples: list[Any], items: list[tuple[Prompt, int]]) -> list[Any]:
    by_key = {s.key: s for s in samples}
    return [by_key[(p.prompt_id, k)] for p, k in items]


def engine_call_for(engine: FakeLLM, samples, items, position: int, turn: int) -> tuple[Any, ...]:
    """The engine request of item `position`'s `turn`: call `turn` lists the live episodes in item order."""
    ordered = samples_in_item_order(samples, items)
    live = [i for i, s in enumerate(ordered) if len(s.turns) > turn]
    return engine.calls[turn][live.index(position)]
