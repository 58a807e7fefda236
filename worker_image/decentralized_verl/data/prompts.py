"""Turn a record into the text the policy sees, through the tokenizer's own chat template.

The tokenizer is duck-typed (anything with `apply_chat_template` and a `chat_template`), so this
module imports no transformers. Message order: system, few-shot demos, then the record's chat.
A record's own leading system message is more specific than the job-wide `system_prompt` and
wins over it; two system turns would break many templates.

Without a chat template (a tokenizer that has none, or `tokenizer=None`) the plain format is:

    System: <system prompt>\\n\\nUser: <text>\\n\\nAssistant: <text>\\n\\nUser: <text>\\n\\nAssistant:

i.e. each turn as `<Role>: <content>`, turns separated by a blank line, ending with the open
`Assistant:` turn the model completes. A chat that is just one user turn with no system prompt
and no demos renders the same way (`User: 3+4=\\n\\nAssistant:`), so tiny models see a fixed frame.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from decentralized_verl.data.records import DEMO_ROLES, ChatMessage, PreferenceRecord, PromptRecord, SFTRecord

PLAIN_ROLE_NAMES: dict[str, str] = {
    "system": "System",
    "user": "User",
    "assistant": "Assistant",
    "tool": "Tool",
}


def _as_message(value: Any, where: str) -> ChatMessage:
    """A ChatMessage from a dict or any object with `role` and `content` (e.g. the spec's model)."""
    if isinstance(value, ChatMessage):
        return value
    if isinstance(value, Mapping):
        role, content = value.get("role"), value.get("content")
    else:
        role, content = getattr(value, "role", None), getattr(value, "content", None)
    if role not in DEMO_ROLES or not isinstance(content, str):
        roles = "|".join(DEMO_ROLES)
        raise ValueError(f"{where}: expected {{role: {roles}, content: str}} (got {value!r})")
    return ChatMessage(role=role, content=content)


def record_messages(record: PromptRecord | SFTRecord | PreferenceRecord | str) -> tuple[ChatMessage, ...]:
    """The chat a record asks the model to continue (SFT and preference prompts are one user turn)."""
    if isinstance(record, PromptRecord):
        return record.messages
    if isinstance(record, str):
        return (ChatMessage("user", record),)
    return (ChatMessage("user", record.prompt),)


def build_messages(
    record: PromptRecord | SFTRecord | PreferenceRecord | str,
    system_prompt: str | None = None,
    few_shot: Iterable[Any] | None = None,
) -> list[ChatMessage]:
    """System prompt, then few-shot demos, then the record's chat (see the module docstring)."""
    own = list(record_messages(record))
    system: list[ChatMessage] = []
    if own and own[0].role == "system":
        system = [own.pop(0)]
    elif system_prompt:
        system = [ChatMessage("system", system_prompt)]
    demos = [_as_message(m, f"few_shot[{i}]") for i, m in enumerate(few_shot or ())]
    return [*system, *demos, *own]


def plain_format(messages: Iterable[ChatMessage]) -> str:
    """The documented fallback when no chat template exists."""
    turns = [f"{PLAIN_ROLE_NAMES[m.role]}: {m.content}" for m in messages]
    return "\n\n".join([*turns, "Assistant:"])


def has_chat_template(tokenizer: Any) -> bool:
    return (
        tokenizer is not None
        and callable(getattr(tokenizer, "apply_chat_template", None))
        and bool(getattr(tokenizer, "chat_template", None))
    )


def render_messages(messages: list[ChatMessage], tokenizer: Any) -> str:
    """A template that refuses the `tool` role gets `tool` demos as `user` messages, as an episode's
    observations are (`environments.turns`), so the demo looks like what the model will see."""
    if not has_chat_template(tokenizer):
        return plain_format(messages)
    try:
        return _apply_template(messages, tokenizer)
    except Exception:
        if not any(m.role == "tool" for m in messages):
            raise
    as_user = [ChatMessage("user", m.content) if m.role == "tool" else m for m in messages]
    return _apply_template(as_user, tokenizer)


def _apply_template(messages: list[ChatMessage], tokenizer: Any) -> str:
    text = tokenizer.apply_chat_template(
        [m.as_dict() for m in messages], tokenize=False, add_generation_prompt=True
    )
    if not isinstance(text, str):  # some tokenizers return a one-element list
        text = text[0]
    return text


def render_prompt(
    record: PromptRecord | SFTRecord | PreferenceRecord | str,
    tokenizer: Any,
    system_prompt: str | None = None,
    few_shot: list[dict[str, str]] | None = None,
) -> str:
    """The prompt text for generation: the tokenizer's chat template with the generation prompt
    added, or the plain format when it has no template."""
    return render_messages(build_messages(record, system_prompt, few_shot), tokenizer)
