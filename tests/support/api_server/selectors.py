"""Label selectors as the API server parses them from `?labelSelector=`: equality (`a=b`, `a==b`,
`a!=b`), existence (`a`, `!a`) and sets (`a in (x,y)`, `a notin (x)`). Pure."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

Match = Callable[[Mapping[str, str]], bool]
_SET = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split(text: str) -> list[str]:
    """Commas outside parentheses separate requirements."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _requirement(text: str) -> Match:
    found = _SET.match(text)
    if found:
        key, op, values = found.group(1), found.group(2), {v.strip() for v in found.group(3).split(",")}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if "!=" in text:
        key, value = (s.strip() for s in text.split("!=", 1))
        return lambda labels: labels.get(key) != value
    if "=" in text:
        key, value = (s.strip() for s in text.replace("==", "=").split("=", 1))
        return lambda labels: labels.get(key) == value
    if text.startswith("!"):
        key = text[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: text in labels


def label_selector(text: str | None) -> Match:
    """A predicate on an object's labels (everything matches an empty selector)."""
    requirements = [_requirement(p) for p in _split(text or "")]
    return lambda labels: all(r(labels) for r in requirements)


def field_selector(text: str | None) -> Callable[[Mapping[str, object]], bool]:
    """`metadata.name=x`, `metadata.namespace=y` (the fields every kind supports), `!=` too."""
    checks = []
    for part in _split(text or ""):
        negate = "!=" in part
        key, value = (s.strip() for s in part.replace("!=", "=").replace("==", "=").split("=", 1))
        checks.append((key.split("."), value, negate))

    def match(obj: Mapping[str, object]) -> bool:
        for path, value, negate in checks:
            node: object = obj
            for step in path:
                node = node.get(step) if isinstance(node, Mapping) else None
            if (str(node) == value) == negate:
                return False
        return True

    return match
