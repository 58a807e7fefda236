"""Tokens between two model turns, from the tokenizer's own chat template.

After the model's turn the sequence needs: whatever the template closes an assistant message with (the
part the model did not generate itself), the observation as a templated tool or user message, and the
generation prompt of the next assistant turn. These are found once per tokenizer by rendering a
conversation with marker contents and cutting the text around the markers; earlier turns are never
re-tokenized, so the model's tokens stay exactly as sampled.

A template that refuses the `tool` role is asked for a `user` message instead; a tokenizer without a chat
template gets the plain format of `data.prompts` (`\\n\\nUser: ...\\n\\nAssistant:`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from decentralized_verl.data.prompts import PLAIN_ROLE_NAMES, has_chat_template
from decentralized_verl.environments.base import ObservationRole

_TURN_MARK = "QXTURNMARKQX"
_OBS_MARK = "QXOBSMARKQX"
_USER_MARK = "QXUSERQX"


class TemplateError(ValueError):
    """The chat template cannot be cut around an observation; the message says where it failed."""


@dataclass(frozen=True)
class TurnFormat:
    """Texts around an observation: `closer` ends the model's message, `wrappers[role]` surrounds the
    observation (its suffix includes the next generation prompt)."""

    closer: str
    wrappers: dict[str, tuple[str, str]]

    def between_turns(self, observation: str, role: ObservationRole, generated_tail: str) -> str:
        """The text after a model turn whose last token decoded to `generated_tail` ("" unless it is an
        end-of-turn token): the rest of the closer, then the wrapped observation."""
        closer = self.closer
        if generated_tail and closer.startswith(generated_tail):
            closer = closer[len(generated_tail) :]
        prefix, suffix = self.wrappers.get(role) or self.wrappers["user"]
        return f"{closer}{prefix}{observation}{suffix}"


def plain_turn_format() -> TurnFormat:
    """The format of `data.prompts.plain_format`, continued: `\\n\\nTool: ...\\n\\nAssistant:`."""
    return TurnFormat(
        closer="",
        wrappers={
            "tool": (f"\n\n{PLAIN_ROLE_NAMES['tool']}: ", "\n\nAssistant:"),
            "user": (f"\n\n{PLAIN_ROLE_NAMES['user']}: ", "\n\nAssistant:"),
        },
    )


def _render(tokenizer: Any, messages: Sequence[dict[str, str]], generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation_prompt
    )
    return text if isinstance(text, str) else text[0]


def _wrapper(tokenizer: Any, role: str, closed: str) -> tuple[str, str]:
    chat = [
        {"role": "user", "content": _USER_MARK},
        {"role": "assistant", "content": _TURN_MARK},
        {"role": role, "content": _OBS_MARK},
    ]
    full = _render(tokenizer, chat, True)
    if not full.startswith(closed) or full.count(_OBS_MARK) != 1:
        raise TemplateError(f"rendering a {role} message after an assistant turn changes the turns before it")
    prefix, _, suffix = full[len(closed) :].partition(_OBS_MARK)
    return prefix, suffix


def turn_format(tokenizer: Any) -> TurnFormat:
    """The tokenizer's turn format (see the module docstring); TemplateError when neither role works."""
    if not has_chat_template(tokenizer):
        return plain_turn_format()
    closed = _render(
        tokenizer,
        [{"role": "user", "content": _USER_MARK}, {"role": "assistant", "content": _TURN_MARK}],
        False,
    )
    if closed.count(_TURN_MARK) != 1:
        raise TemplateError("the chat template does not render an assistant message's content once")
    closer = closed.partition(_TURN_MARK)[2]
    wrappers: dict[str, tuple[str, str]] = {}
    problems = []
    for role in ("user", "tool"):
        try:
            wrappers[role] = _wrapper(tokenizer, role, closed)
        except Exception as exc:  # templates raise their own errors for roles they refuse
            problems.append(f"{role}: {exc}")
    if "user" not in wrappers:
        raise TemplateError("; ".join(problems))
    wrappers.setdefault("tool", wrappers["user"])
    return TurnFormat(closer, wrappers)
