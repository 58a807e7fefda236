"""The one YAML loader every command uses: PyYAML's safe loader with limits on what a file may cost.

A YAML file is input from whoever wrote it. Without limits a 1 KB file of nested aliases (billion laughs)
expands to 10^9 nodes when anything walks it, deep nesting overflows Python's stack, and a 200,000-digit
integer is a `ValueError` from deep inside `int()`. Here each of those is a `YamlLimitExceeded` that names
the limit (and is a `DverlError`, so the CLI prints it and exits 2), raised before the cost is paid:

- `maxBytes`: the text is refused before parsing (and `read_limited` never reads more than that);
- `maxDepth`: nesting is counted while the node tree is built;
- `maxAliases` and `maxNodes`: aliases are counted, and the tree's size with every alias expanded (what a
  validator or a JSON dump would walk) is computed before any Python object is built;
- `maxNumberChars`: an integer or float scalar longer than this is refused before conversion.

Keys given twice in one mapping are refused too (`DuplicateKey`): YAML says keys are unique, and PyYAML
would silently keep the last value, so a setting a person thinks is in force would not be.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from decentralized_verl.errors import DverlError


@dataclass(frozen=True)
class YamlLimits:
    """What one YAML text may cost. The defaults are far above any manifest, config or workers file."""

    max_bytes: int = 4 * 1024 * 1024
    max_depth: int = 64
    max_aliases: int = 256
    max_nodes: int = 200_000
    max_number_chars: int = 128


DEFAULT_LIMITS = YamlLimits()


class YamlLimitExceeded(yaml.YAMLError, DverlError):
    """A YAML text over one of `YamlLimits`; `limit` is the limit's name as the message says it."""

    def __init__(self, limit: str, message: str) -> None:
        self.limit = limit
        super().__init__(f"YAML limit {limit} exceeded: {message}")


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first_line: int) -> None:
        self.key, self.line, self.first_line = key, line, first_line
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first_line})")


def _line(node: Node) -> str:
    return f"line {node.start_mark.line + 1}"


def _expanded_size(root: Node, limits: YamlLimits) -> int:
    """Nodes in the tree with every alias expanded; shared nodes are sized once (memoised), so this costs
    the size of the file, not of the expansion. A node reached from itself (`&a [*a]`) is refused."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children: list[Node]
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            sizes[key] = 1
            continue
        if children_done:
            open_nodes.discard(key)
            total = 1 + sum(sizes[id(child)] for child in children)
            if total > limits.max_nodes:
                raise YamlLimitExceeded(
                    "maxNodes",
                    f"more than {limits.max_nodes} nodes once aliases are expanded (at {_line(node)})",
                )
            sizes[key] = total
            continue
        if key in open_nodes:
            raise YamlLimitExceeded("maxNodes", f"an alias refers to a node that contains it ({_line(node)})")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def limited_loader(limits: YamlLimits = DEFAULT_LIMITS) -> type[yaml.SafeLoader]:
    """A `yaml.SafeLoader` subclass that enforces `limits` and refuses duplicate keys."""

    class LimitedLoader(yaml.SafeLoader):
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self._depth = 0
            self._aliases = 0

        def compose_node(self, parent: Node | None, index: Any) -> Node:
            if self.check_event(yaml.AliasEvent):
                self._aliases += 1
                if self._aliases > limits.max_aliases:
                    mark = self.peek_event().start_mark
                    raise YamlLimitExceeded(
                        "maxAliases", f"more than {limits.max_aliases} aliases (at line {mark.line + 1})"
                    )
                return super().compose_node(parent, index)
            self._depth += 1
            try:
                if self._depth > limits.max_depth:
                    mark = self.peek_event().start_mark
                    raise YamlLimitExceeded(
                        "maxDepth", f"nested deeper than {limits.max_depth} (at line {mark.line + 1})"
                    )
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_document(self) -> Node:
            node = super().compose_document()
            _expanded_size(node, limits)
            return node

        def _number_text(self, node: ScalarNode) -> str:
            text = str(self.construct_scalar(node))
            if len(text) > limits.max_number_chars:
                raise YamlLimitExceeded(
                    "maxNumberChars",
                    f"a number of {len(text)} characters, more than {limits.max_number_chars} "
                    f"({_line(node)})",
                )
            return text

        def construct_yaml_int(self, node: ScalarNode) -> int:
            self._number_text(node)
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node: ScalarNode) -> float:
            self._number_text(node)
            return super().construct_yaml_float(node)

        def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the constructor below reports it
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKey(key, line, first)
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    LimitedLoader.add_constructor("tag:yaml.org,2002:int", LimitedLoader.construct_yaml_int)
    LimitedLoader.add_constructor("tag:yaml.org,2002:float", LimitedLoader.construct_yaml_float)
    return LimitedLoader


_DEFAULT_LOADER = limited_loader(DEFAULT_LIMITS)


def _loader_for(limits: YamlLimits) -> type[yaml.SafeLoader]:
    return _DEFAULT_LOADER if limits == DEFAULT_LIMITS else limited_loader(limits)


def _check_size(text: str | bytes, limits: YamlLimits) -> None:
    size = len(text.encode("utf-8")) if isinstance(text, str) else len(text)
    if size > limits.max_bytes:
        raise YamlLimitExceeded("maxBytes", f"{size} bytes, more than {limits.max_bytes}")


def load_documents(text: str | bytes, limits: YamlLimits = DEFAULT_LIMITS) -> list[Any]:
    """Every document of a YAML stream (empty ones left out), within `limits`."""
    _check_size(text, limits)
    try:
        return [doc for doc in yaml.load_all(text, Loader=_loader_for(limits)) if doc is not None]
    except RecursionError:  # only if Python's stack is smaller than maxDepth needs
        raise YamlLimitExceeded("maxDepth", "nesting too deep for this process's stack") from None


def load(text: str | bytes, limits: YamlLimits = DEFAULT_LIMITS) -> Any:
    """The one document of a YAML text (None when it is empty), within `limits`: the safe replacement of
    `yaml.safe_load`. Raises `YamlLimitExceeded`, `DuplicateKey` or another `yaml.YAMLError`."""
    documents = load_documents(text, limits)
    if len(documents) > 1:
        raise yaml.YAMLError(f"expected exactly one YAML document, found {len(documents)}")
    return documents[0] if documents else None


def load_json_or_yaml(text: str | bytes, limits: YamlLimits = DEFAULT_LIMITS) -> Any:
    """JSON when the text is JSON, else YAML; either way within the same `limits` (JSON's own parser has
    no depth or number limits: a deep array is a RecursionError, a long integer a ValueError)."""
    _check_size(text, limits)

    def number(kind: type[int] | type[float]) -> Any:
        def parse(literal: str) -> int | float:
            if len(literal) > limits.max_number_chars:
                raise YamlLimitExceeded(
                    "maxNumberChars",
                    f"a number of {len(literal)} characters, more than {limits.max_number_chars}",
                )
            return kind(literal)

        return parse

    try:
        loaded = json.loads(text, parse_int=number(int), parse_float=number(float))
    except json.JSONDecodeError:
        return load(text, limits)
    except RecursionError:
        raise YamlLimitExceeded("maxDepth", f"nested deeper than {limits.max_depth}") from None
    _check_depth(loaded, limits)
    return loaded


def _check_depth(value: Any, limits: YamlLimits) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        if children and depth >= limits.max_depth:
            raise YamlLimitExceeded("maxDepth", f"nested deeper than {limits.max_depth}")
        stack.extend((child, depth + 1) for child in children)


def read_limited(path: str | Path, limits: YamlLimits = DEFAULT_LIMITS) -> str:
    """A file's text, never reading more than `maxBytes` (+1 to tell a file over the limit)."""
    with open(path, "rb") as handle:
        return read_limited_stream(handle, limits)


def read_limited_stream(handle: BinaryIO, limits: YamlLimits = DEFAULT_LIMITS) -> str:
    """A binary stream's text (stdin's `.buffer`), never reading more than `maxBytes` + 1."""
    data = handle.read(limits.max_bytes + 1)
    if len(data) > limits.max_bytes:
        raise YamlLimitExceeded("maxBytes", f"more than {limits.max_bytes} bytes")
    return data.decode("utf-8")
