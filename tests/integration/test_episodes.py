"""The episode loop: model tokens appended as generated, observations as templated tokens with loss mask 0,
every limit (turns, tokens, time) ending an episode with its reason, and real generation whose log-probs
equal the learner's recomputation on exactly the model's tokens."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
import torch

from decentralized_verl.environments.base import EpisodeRecord, StepResult
from decentralized_verl.environments.episode import TurnOutput
from decentralized_verl.environments.rollout import EpisodeRunner, TurnRequest
from decentralized_verl.environments.settings import EpisodeSettings
from decentralized_verl.environments.turns import turn_format
from decentralized_verl.models.tokenizer import build_char_tokenizer

torch.set_num_threads(1)
TOK = build_char_tokenizer()
EOS = TOK.eos_token_id


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


class Script:
    """A generation function that answers each episode's turns from a fixed script, with made-up
    log-probs that encode (episode, turn, position) so the test can find every one of them again."""

    def __init__(self, turns: Sequence[Sequence[str]]) -> None:
        self.turns = turns
        self.contexts: list[TurnRequest] = []

    def __call__(self, requests: Sequence[TurnRequest]):
        for r in requests:
            self.contexts.append(r)
            text = self.turns[r.index][r.turn]
            tokens = ids(text)[: r.max_new_tokens]
            finish = "stop" if tokens and tokens[-1] == EOS else "length"
            logprobs = tuple(-(r.index * 100 + r.turn * 10 + k + 1) / 1000 for k in range(len(tokens)))
            yield (
                r.index,
                TurnOutput(tuple(tokens), logprobs, finish, TOK.decode(tokens, skip_special_tokens=True)),
            )


def play(settings: EpisodeSettings, turns, records=None, max_tokens_per_turn=40, context_tokens=None):
    runner = EpisodeRunner(settings, TOK, eos_token_ids=[EOS], context_tokens=context_tokens)
    prompt = tuple(ids("<|user|>\nWhat is 12*7?</s>\n<|assistant|>\n"))
    records = records or [EpisodeRecord(f"p{i}", "84", seed=i) for i in range(len(turns))]
    script = Script(turns)
    results = dict(runner.run([(prompt, r) for r in records], script, max_tokens_per_turn))
    return [results[i] for i in range(len(turns))], script, prompt


def segments(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of the mask."""
    out: list[tuple[int, int, int]] = []
    for i, v in enumerate(mask):
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1], i + 1)
        else:
            out.append((v, i, i + 1))
    return out


def test_calculator_episode_appends_turns_as_generated_and_observations_as_templated_tokens() -> None:
    turns = [["<calc>12*7</calc></s>", "It is 84</s>"]]
    (result,), script, prompt = play(EpisodeSettings("calculator"), turns)
    first, second = ids(turns[0][0]), ids(turns[0][1])
    observation = ids("\n<|tool|>\n12*7 = 84</s>\n<|assistant|>\n")  # the closer's "</s>" was generated
    assert result.response_ids == (*first, *observation, *second)
    assert result.loss_mask == (1,) * len(first) + (0,) * len(observation) + (1,) * len(second)
    assert [v for v, _, _ in segments(result.loss_mask)] == [1, 0, 1]
    model_logprobs = [lp for lp, m in zip(result.logprobs, result.loss_mask, strict=True) if m]
    assert model_logprobs == [
        -(10 * t + k + 1) / 1000 for t, n in ((0, len(first)), (1, len(second))) for k in range(n)
    ]
    assert all(lp == 0.0 for lp, m in zip(result.logprobs, result.loss_mask, strict=True) if not m)
    assert (result.reward, result.reason, result.tool_calls, result.tool_errors) == (
        1.0,
        "answered: correct",
        1,
        0,
    )
    # The second turn was generated from the prompt and everything before it, token for token.
    assert script.contexts[1].context_ids == (*prompt, *first, *observation)


def test_a_turn_cut_by_its_token_limit_gets_the_whole_closer() -> None:
    (result,), _, _ = play(
        EpisodeSettings("calculator"), [["<calc>1+1</calc> and more", "2</s>"]], max_tokens_per_turn=16
    )
    first = ids("<calc>1+1</calc> and more")[:16]
    assert TOK.decode(list(result.response_ids[16:]), skip_special_tokens=False).startswith(
        "</s>\n<|tool|>\n1+1 = 2"
    )
    assert result.loss_mask[:16] == (1,) * 16 and result.response_ids[:16] == tuple(first)


def test_max_turns_ends_the_episode_without_a_trailing_observation() -> None:
    settings = EpisodeSettings("guessing_game", {"maxNumber": 10}, max_turns=3)
    records = [EpisodeRecord("p", "7", seed=0)]
    (result,), _, _ = play(settings, [["3</s>", "5</s>", "9</s>", "7</s>"]], records)
    assert result.reason == "max_turns" and result.reward == 0.0 and len(result.turns) == 3
    assert result.loss_mask[-1] == 1  # the last turn's tokens end the sequence
    (won,), _, _ = play(settings, [["3</s>", "7</s>"]], records)
    assert won.reason == "guessed in 2" and won.reward == pytest.approx(0.9)


def test_token_budget_ends_the_episode_as_truncated() -> None:
    settings = EpisodeSettings("guessing_game", {"maxNumber": 10}, max_turns=8, max_total_tokens=60)
    (result,), script, _ = play(settings, [["1</s>"] * 8], [EpisodeRecord("p", "9", seed=0)])
    assert result.reason == "token_budget" and result.finish_reason == "length"
    assert len(result.response_ids) <= 60
    assert all(r.max_new_tokens <= 60 for r in script.contexts)
    (ctx,), _, prompt = play(
        EpisodeSettings("guessing_game", max_turns=8), [["1</s>"] * 8], context_tokens=100
    )
    assert len(prompt) + len(ctx.response_ids) <= 100 and ctx.reason == "token_budget"


def test_long_observations_are_cut() -> None:
    settings = EpisodeSettings("python_tool", max_observation_tokens=20)
    (result,), _, _ = play(settings, [["```python\nprint('y' * 500)\n```</s>", "done</s>"]])
    env_tokens = [t for t, m in zip(result.response_ids, result.loss_mask, strict=True) if not m]
    assert "[...]" in TOK.decode(env_tokens) and len(env_tokens) < 60


class Hangs:
    instructions = ""

    def reset(self, record):
        self.calls = 0

    def step(self, turn):
        self.calls += 1
        if self.calls == 1:
            threading.Event().wait(30)  # hangs far past the step timeout
        return StepResult("fine", reward=1.0, done=True)


class Crashes:
    instructions = ""

    def reset(self, record):
        pass

    def step(self, turn):
        if "boom" in turn:
            raise RuntimeError("the tool broke")
        return StepResult(None, reward=0.5, done=True)


@pytest.fixture
def hostile_envs(monkeypatch: pytest.MonkeyPatch):
    import sys
    import types

    module = types.ModuleType("hostile_envs")
    module.Hangs, module.Crashes = Hangs, Crashes
    monkeypatch.setitem(sys.modules, "hostile_envs", module)
    yield
    from decentralized_verl.environments.registry import environment_class

    environment_class.cache_clear()


def test_a_hanging_tool_times_out_without_hanging_the_worker(hostile_envs) -> None:
    started = time.perf_counter()
    (ended,), _, _ = play(
        EpisodeSettings("hostile_envs:Hangs", step_timeout_s=0.3, on_tool_error="end"), [["a</s>"] * 3]
    )
    assert ended.reason == "tool_timeout" and ended.tool_errors == 1 and len(ended.turns) == 1
    (observed,), _, _ = play(
        EpisodeSettings("hostile_envs:Hangs", max_turns=3, step_timeout_s=0.3), [["a</s>"] * 3]
    )
    assert time.perf_counter() - started < 5
    assert observed.tool_errors >= 1 and len(observed.turns) >= 2
    env_text = TOK.decode(
        [t for t, m in zip(observed.response_ids, observed.loss_mask, strict=True) if not m]
    )
    assert "did not answer within 0.3s" in env_text


def test_a_crashing_tool_is_an_error_observation_or_the_end(hostile_envs) -> None:
    (observed,), _, _ = play(EpisodeSettings("hostile_envs:Crashes"), [["boom</s>", "ok</s>"]])
    assert observed.tool_errors == 1 and observed.reward == 0.5 and len(observed.turns) == 2
    env_text = TOK.decode(
        [t for t, m in zip(observed.response_ids, observed.loss_mask, strict=True) if not m]
    )
    assert "RuntimeError: the tool broke" in env_text
    (ended,), _, _ = play(
        EpisodeSettings("hostile_envs:Crashes", on_tool_error="end"), [["boom</s>", "ok</s>"]]
    )
    assert ended.reason == "tool_error" and ended.reward == 0.0 and len(ended.turns) == 1


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NO_TOOL_ROLE = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('roles must be user/assistant/system') }}{% endif %}"
    "{{ '[' + m['role'] + '] ' + m['content'] + ' [end]' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '[assistant] ' }}{% endif %}"
)


def test_turn_format_follows_the_chat_template() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = CHATML
    fmt = turn_format(tok)
    assert fmt.closer == "<|im_end|>\n"
    assert (
        fmt.between_turns("84", "tool", "<|im_end|>")
        == "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        fmt.between_turns("84", "user", "")
        == "<|im_end|>\n<|im_start|>user\n84<|im_end|>\n<|im_start|>assistant\n"
    )
    tok.chat_template = NO_TOOL_ROLE
    fmt = turn_format(tok)
    assert (
        fmt.between_turns("84", "tool", "") == " [end][user] 84 [end][assistant] "
    )  # tool falls back to user
    tok.chat_template = None
    assert turn_format(tok).between_turns("84", "tool", "") == "\n\nTool: 84\n\nAssistant:"
