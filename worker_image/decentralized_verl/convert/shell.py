"""The command line a run script starts, as words, with the script's own variables and bash arrays expanded.

Training scripts build their command from shell variables (`MODEL_PATH=...`, `--pretrain ${MODEL_PATH}`)
and, in OpenRLHF's newer examples, bash arrays (`OPTIMIZER_ARGS=( ... )`, `"${OPTIMIZER_ARGS[@]}"`). This is
no shell: it reads assignments and arrays, expands them where the command uses them, and leaves every other
`$NAME` (an environment variable such as `$HOME`, or a command substitution) as written, reporting it, since
it belongs to the machine the job runs on, not to the one converting it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|declare\s+(?:-a\s+)?)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_ARRAY_USE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class ScriptCommand:
    words: list[str]
    """The command's words, variables and arrays expanded."""
    unresolved: list[str] = field(default_factory=list)
    """Variables left as written (from the environment, or set by a command substitution), in order."""


def logical_lines(text: str) -> list[str]:
    """Lines with backslash-newline continuations joined."""
    return text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines()


def _words(line: str) -> list[str] | None:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unclosed quote: a line this reader cannot take apart
        return None


def _array_body(lines: list[str], start: int, first: str) -> tuple[str, int]:
    """The text between `NAME=(` and its `)`, which may span lines, and the index of the line after it."""
    body, i = [first], start
    while True:
        last = body[-1].strip()
        if (last.endswith(")") and not last.startswith("#")) or i + 1 >= len(lines):
            break
        i += 1
        body.append(lines[i])
    joined = "\n".join(body).rstrip()
    return joined[:-1] if joined.endswith(")") else joined, i + 1


class _Expander:
    def __init__(self) -> None:
        self.scalars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}

    def scalar(self, word: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(3)
            if name in self.scalars:
                return self.scalars[name]
            if name in self.arrays:
                return " ".join(self.arrays[name])
            if match.group(2) is not None:  # ${NAME:-default}
                return match.group(2)
            return match.group(0)

        return _VAR.sub(one, word)

    def words(self, words: list[str]) -> list[str]:
        out: list[str] = []
        for word in words:
            array = _ARRAY_USE.match(word)
            if array and array.group(1) in self.arrays:
                out.extend(self.arrays[array.group(1)])
            else:
                out.append(self.scalar(word))
        return out


def unresolved_names(words: list[str]) -> list[str]:
    """The `$NAME`s still in `words`, each once, in order."""
    names: list[str] = []
    for word in words:
        for match in _VAR.finditer(word):
            name = match.group(1) or match.group(3)
            if name not in names:
                names.append(name)
    return names


def script_command(text: str, marker: str) -> ScriptCommand | None:
    """The words of the first command line in `text` that contains `marker` (e.g. `train_ppo_ray`), from
    the word holding the marker on, or None when no line holds it."""
    lines = logical_lines(text)
    env = _Expander()
    i = 0
    while i < len(lines):
        line = lines[i]
        assign = _ASSIGN.match(line)
        if assign and not line.lstrip().startswith("#") and marker not in line:
            name, rest = assign.groups()
            if rest.lstrip().startswith("("):
                body, i = _array_body(lines, i, rest.lstrip()[1:])
                env.arrays[name] = env.words(_words(body) or [])
                continue
            words = _words(rest) if "$(" not in rest and "`" not in rest else None
            if words is not None and len(words) <= 1:
                env.scalars[name] = env.scalar(words[0]) if words else ""
            else:  # a command substitution: its value is the shell's to compute
                env.scalars.pop(name, None)
            i += 1
            continue
        words = _words(line) if marker in line else None
        if marker in line and words is None:
            raise ValueError(f"the line starting the command has an unclosed quote: {line.strip()[:80]}")
        start = next((k for k, w in enumerate(words or []) if marker in w), None)
        if words is not None and start is not None:
            expanded = env.words(words[start:])
            return ScriptCommand(expanded, unresolved_names(expanded))
        i += 1
    return None


def command_flags(words: list[str]) -> dict[str, Any]:
    """`--key value`, `--key=value` and bare `--flag` (true) options among `words`, `-` in a key read as
    `_`; several values after one flag (`--range 0.0 1.0`) are kept joined by spaces."""
    options: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or word == "--":
            i += 1
            continue
        key = word[2:].replace("-", "_")
        if "=" in key:
            key, value = key.split("=", 1)
            options[key] = value
            i += 1
            continue
        values = []
        while i + 1 < len(words) and not words[i + 1].startswith("--"):
            values.append(words[i + 1])
            i += 1
        options[key] = True if not values else (values[0] if len(values) == 1 else " ".join(values))
        i += 1
    return options
