"""Pull the final answer (or program) out of a completion: pure string functions, no math.

Each function returns None when the completion has no such answer, so callers can score 0 with a reason.
"""

from __future__ import annotations

import re

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_PYTHON_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def last_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` (or `\fbox{...}`), nested braces included.

    Escaped braces (`\{`, `\}`) do not count as nesting, so `\boxed{\{1,2\}}` gives `\{1,2\}`.
    The brace-less form `\boxed 5` gives `5`. A last box cut off before its closing brace (a truncated
    generation) gives None rather than falling back to an earlier, intermediate box.
    """
    matches = list(_BOX_COMMAND.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :]
    stripped = rest.lstrip()
    if not stripped.startswith("{"):
        if rest[:1].isspace():  # `\boxed 5`
            token = stripped.split("$", 1)[0].split()
            return token[0] if token else None
        return None
    return _braced(stripped)


def _braced(text: str) -> str | None:
    """The content between text[0] == '{' and its matching '}', or None when unbalanced."""
    depth = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[1:i]
        i += 1
    return None


def last_answer_tag(text: str) -> str | None:
    """Content between the last `<answer>` and the `</answer>` after it (stripped), or None."""
    start = text.rfind("<answer>")
    if start < 0:
        return None
    end = text.find("</answer>", start)
    if end < 0:
        return None
    return text[start + len("<answer>") : end].strip()


def think_answer_format_ok(text: str, *, think_open_in_prompt: bool = False) -> bool:
    """True when `<think>…</think>` precedes `<answer>…</answer>`, each tag exactly once, in that order.

    `think_open_in_prompt`: the chat template already put `<think>` in the prompt, so the completion
    must not repeat it and starts inside the reasoning.
    """
    tags = _TAGS[1:] if think_open_in_prompt else _TAGS
    if think_open_in_prompt and "<think>" in text:
        return False
    positions = []
    for tag in tags:
        if text.count(tag) != 1:
            return False
        positions.append(text.index(tag))
    return positions == sorted(positions)


def last_python_block(text: str) -> str | None:
    """Body of the last fenced ```python (or ```py / ```python3) block, or None."""
    blocks = _PYTHON_BLOCK.findall(text)
    if not blocks:
        return None
    return blocks[-1]
