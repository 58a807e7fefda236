"""The command line a run script starts, as words, with the script's own variables and bash arrays expanded.

Training scripts build their command from shell variables (`MODEL_PATH=...`, `--pretrain ${MODEL_PATH}`)
and, in OpenRLHF's newer examples, bash arrays (`OPTIMIZER_ARGS=( ... )`, `"${OPTIMIZER_ARGS[@]}"`). This is
no shell: it reads assignments (`${A:-default}`, `$(( ... ))` over numbers, quoted values over several
lines) and arrays, expands them where the command uses them (an unquoted `$CONFIG` holding several words
becomes those words, as the shell splits it), follows no control flow, and leaves every other
`$NAME` (an environment variable such as `$HOME`, or a command substitution) as written, reporting it, since
it belongs to the machine the job runs on, not to the one converting it.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|declare\s+(?:-a\s+)?)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_ARRAY_USE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}$")
_WHOLE_VAR = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class ScriptCommand:
    words: list[str]
    """The command's words, variables and arrays expanded."""
    unresolved: list[str] = field(default_factory=list)
    """Variables left as written (from the environment, or set by a command substitution), in order."""
    cut_at: str | None = None
    """The line after the command when it looks like more of it (an indented `key=value` or `--flag`): a
    backslash not at the very end of a line (a space or a comment after it) ends a shell command there."""


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


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # shell arithmetic is integer arithmetic
    ast.Mod: operator.mod,
}


def _arithmetic(text: str, scalars: dict[str, str]) -> str | None:
    """The value of `$(( expression ))` over whole numbers and variables the script set, or None when it is
    not one or names something unknown (then the shell's value stays unknown here too)."""
    if not (text.startswith("$((") and text.endswith("))")):
        return None
    expression = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", text[3:-2])

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and scalars.get(node.id, "").lstrip("-").isdigit():
            return int(scalars[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(ast.dump(node))

    try:
        return str(value(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def _closing(text: str, start: int) -> int | None:
    """The index of the `}` closing the `{` at `start`, braces nesting."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


class _Expander:
    def __init__(self) -> None:
        self.scalars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}

    def scalar(self, word: str) -> str:
        """`word` with `$NAME`, `${NAME}` and `${NAME:-default}` (defaults may nest) expanded where the
        script set NAME; every other reference is kept as written."""
        out: list[str] = []
        i = 0
        while i < len(word):
            if word[i] != "$" or i + 1 >= len(word):
                out.append(word[i])
                i += 1
                continue
            if word[i + 1] == "{":
                end = _closing(word, i + 1)
                if end is None:
                    out.append(word[i:])
                    break
                out.append(self._braced(word[i + 2 : end], word[i : end + 1]))
                i = end + 1
                continue
            match = _NAME.match(word, i + 1)
            if match is None:
                out.append(word[i])
                i += 1
                continue
            name = match.group(0)
            out.append(self._value(name) if self._known(name) else word[i : match.end()])
            i = match.end()
        return "".join(out)

    def _known(self, name: str) -> bool:
        return name in self.scalars or name in self.arrays

    def _value(self, name: str) -> str:
        return self.scalars[name] if name in self.scalars else " ".join(self.arrays[name])

    def _braced(self, body: str, written: str) -> str:
        match = _NAME.match(body)
        if match is None:
            return written
        name, rest = match.group(0), body[match.end() :]
        if rest == "" and self._known(name):
            return self._value(name)
        for fallback in (":-", "-"):
            if rest.startswith(fallback):
                return self._value(name) if self._known(name) else self.scalar(rest[len(fallback) :])
        return written

    def words(self, words: list[str]) -> list[str]:
        out: list[str] = []
        for word in words:
            array = _ARRAY_USE.match(word)
            whole = _WHOLE_VAR.match(word)
            if array and array.group(1) in self.arrays:
                out.extend(self.arrays[array.group(1)])
            elif (
                whole
                and whole.group(1) in self.scalars
                and any(c.isspace() for c in self.scalars[whole.group(1)])
            ):
                # `$CONFIG` holding several overrides: the shell splits an unquoted variable into words
                out.extend(_words(self.scalars[whole.group(1)]) or self.scalars[whole.group(1)].split())
            else:
                out.append(self.scalar(word))
        return out


_OPERATOR = re.compile(r"^(\|\|?|&&|;|&|[0-9]*>>?(&[0-9])?|&>>?|<)$")


def _until_operator(words: list[str]) -> list[str]:
    """The command's own words: a pipe, `&&`, `;`, `&` or a redirection (`&>> log`, `2>&1`) ends them."""
    end = next((k for k, w in enumerate(words) if _OPERATOR.match(w)), len(words))
    return words[:end]


def _inner(words: list[str], marker: str) -> list[str]:
    """`words` from the marker on; when the marker sits inside one quoted word (`bash -c "... train ..."`,
    as cluster launch scripts pass the command), that word's own words from the marker on."""
    for _ in range(5):
        if not any(c.isspace() for c in words[0]):
            break
        inner = _words(words[0]) or words[0].split()
        at = next((k for k, w in enumerate(inner) if marker in w), None)
        if at is None:
            break
        words = inner[at:] + words[1:]
    return words


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
            arithmetic = _arithmetic(rest.strip(), env.scalars)
            if arithmetic is not None:
                env.scalars[name] = arithmetic
                i += 1
                continue
            substituted = "$(" in rest or "`" in rest
            words = _words(rest) if not substituted else None
            if words is None and not substituted and rest.count('"') % 2:  # a quoted value over lines
                end = next((k for k in range(i + 1, min(len(lines), i + 500)) if '"' in lines[k]), None)
                if end is not None:
                    rest = "\n".join([rest, *lines[i + 1 : end + 1]])
                    words, i = _words(rest), end
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
            words = _until_operator(_inner(words[start:], marker))
            expanded = env.words(words)
            following = next((ln for ln in lines[i + 1 :] if ln.strip()), "")
            first = following.split()[0] if following.strip() else ""
            looks_continued = following[:1].isspace() and ("=" in first or first.startswith("--"))
            return ScriptCommand(
                expanded, unresolved_names(expanded), following.strip() if looks_continued else None
            )
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


def cut_note(command: ScriptCommand | None) -> str | None:
    """A note when the command seems to stop early (see `ScriptCommand.cut_at`)."""
    if command is None or command.cut_at is None:
        return None
    return (
        f"the command ends before `{command.cut_at[:60]}`: a backslash followed by a space or a comment "
        "ends a shell line, so the shell does not pass what follows either; it is not converted"
    )
