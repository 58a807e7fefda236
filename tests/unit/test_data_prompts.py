"""render_prompt through a real transformers tokenizer (built offline: a char-level WordLevel model
with a chat template we set) and through the plain fallback when a tokenizer has no template."""

from __future__ import annotations

import string
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from decentralized_verl.data import (
    ChatMessage,
    PreferenceRecord,
    PromptRecord,
    SFTRecord,
    build_messages,
    plain_format,
    render_prompt,
)

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def char_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    specials = ["<unk>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    chars = sorted(set(string.printable))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<|end|>",
        additional_special_tokens=specials[2:],
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


RECORD = PromptRecord(id="r", messages=(ChatMessage("user", "What is 37 + 45?"),), ground_truth="82")
FEW_SHOT = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "3 + 4 = 7. The answer is \\boxed{7}."},
]


def test_chat_template_with_system_prompt_and_one_shot_demo() -> None:
    tokenizer = char_tokenizer(TEMPLATE)
    text = render_prompt(RECORD, tokenizer, system_prompt="Answer in \\boxed{}.", few_shot=FEW_SHOT)
    assert text == (
        "<|system|>Answer in \\boxed{}.<|end|>\n"
        "<|user|>What is 3 + 4?<|end|>\n"
        "<|assistant|>3 + 4 = 7. The answer is \\boxed{7}.<|end|>\n"
        "<|user|>What is 37 + 45?<|end|>\n"
        "<|assistant|>"
    )
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.unk_token_id not in ids
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|assistant|>")  # the special token, not characters


def test_chat_template_record_only() -> None:
    text = render_prompt(RECORD, char_tokenizer(TEMPLATE))
    assert text == "<|user|>What is 37 + 45?<|end|>\n<|assistant|>"


def test_records_own_system_message_wins_over_the_job_system_prompt() -> None:
    record = PromptRecord(
        id="s", messages=(ChatMessage("system", "Own system."), ChatMessage("user", "Q?")), ground_truth="1"
    )
    messages = build_messages(record, system_prompt="Job system.", few_shot=FEW_SHOT)
    assert [m.role for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0].content == "Own system." and messages[-1].content == "Q?"
    text = render_prompt(record, char_tokenizer(TEMPLATE), system_prompt="Job system.")
    assert "Job system." not in text and text.startswith("<|system|>Own system.<|end|>")


def test_multi_turn_record_keeps_its_order_after_demos() -> None:
    record = PromptRecord(
        id="m",
        messages=(ChatMessage("user", "a"), ChatMessage("assistant", "b"), ChatMessage("user", "c")),
    )
    messages = build_messages(record, few_shot=FEW_SHOT[:1] + FEW_SHOT[1:])
    assert [m.content for m in messages] == [FEW_SHOT[0]["content"], FEW_SHOT[1]["content"], "a", "b", "c"]


def test_no_template_falls_back_to_the_plain_format() -> None:
    tokenizer = char_tokenizer(None)
    assert tokenizer.chat_template is None
    text = render_prompt(RECORD, tokenizer, system_prompt="Be brief.", few_shot=FEW_SHOT)
    assert text == (
        "System: Be brief.\n\n"
        "User: What is 3 + 4?\n\n"
        "Assistant: 3 + 4 = 7. The answer is \\boxed{7}.\n\n"
        "User: What is 37 + 45?\n\n"
        "Assistant:"
    )
    assert render_prompt("3+4=", None) == "User: 3+4=\n\nAssistant:"


def test_duck_typed_tokenizer_and_spec_like_few_shot() -> None:
    calls = []

    class Fake:
        chat_template = "anything"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            calls.append((messages, tokenize, add_generation_prompt))
            return "rendered"

    demos = [SimpleNamespace(role="user", content="d1"), SimpleNamespace(role="assistant", content="d2")]
    assert render_prompt(RECORD, Fake(), few_shot=demos) == "rendered"
    assert calls == [
        (
            [
                {"role": "user", "content": "d1"},
                {"role": "assistant", "content": "d2"},
                {"role": "user", "content": "What is 37 + 45?"},
            ],
            False,
            True,
        )
    ]
    without = SimpleNamespace(chat_template=None, apply_chat_template=lambda *a, **k: pytest.fail("called"))
    assert render_prompt(RECORD, without) == "User: What is 37 + 45?\n\nAssistant:"


def test_sft_and_preference_prompts_render_as_one_user_turn() -> None:
    tokenizer = char_tokenizer(TEMPLATE)
    sft = SFTRecord("a", "What is 1 + 1?", "2")
    pref = PreferenceRecord("b", "What is 1 + 1?", "2", "3")
    assert (
        render_prompt(sft, tokenizer)
        == render_prompt(pref, tokenizer)
        == render_prompt("What is 1 + 1?", tokenizer)
    )


def test_bad_few_shot_message_is_named() -> None:
    with pytest.raises(ValueError, match=r"few_shot\[1\]: expected \{role"):
        render_prompt(RECORD, None, few_shot=[FEW_SHOT[0], {"role": "bot", "content": "x"}])


def test_plain_format_of_a_single_turn() -> None:
    assert plain_format([ChatMessage("user", "hi")]) == "User: hi\n\nAssistant:"


TOOL_DEMO = [
    {"role": "user", "content": "What is 23 * 47?"},
    {"role": "assistant", "content": "<calc>23*47</calc>"},
    {"role": "tool", "content": "23*47 = 1081"},
    {"role": "assistant", "content": "The answer is 1081."},
]
# A template that refuses any role but system, user and assistant, as some do.
STRICT = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_demo_shows_a_tool_answer_as_the_template_has_it() -> None:
    text = render_prompt(RECORD, char_tokenizer(TEMPLATE), few_shot=TOOL_DEMO)
    assert "<|assistant|><calc>23*47</calc><|end|>\n<|tool|>23*47 = 1081<|end|>\n" in text
    strict = render_prompt(RECORD, char_tokenizer(STRICT), few_shot=TOOL_DEMO)
    assert "<|assistant|><calc>23*47</calc><|end|>\n<|user|>23*47 = 1081<|end|>\n" in strict
    plain = render_prompt(RECORD, None, few_shot=TOOL_DEMO)
    assert "Assistant: <calc>23*47</calc>\n\nTool: 23*47 = 1081\n\nAssistant: The answer is 1081." in plain
    with pytest.raises(Exception, match="unknown role system"):  # other template errors still raise
        render_prompt(RECORD, char_tokenizer(STRICT.replace("'system', ", "")), system_prompt="Hi")
