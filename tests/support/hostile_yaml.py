"""YAML written to exhaust a parser, shared by the loader's unit tests and the CLI's."""

from __future__ import annotations


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """Under 1 KB of YAML whose aliases expand to width**levels strings."""
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    previous = "a"
    for name in "bcdefghijklmnop"[: levels - 1]:
        text += f"{name}: &{name} [" + ",".join([f"*{previous}"] * width) + "]\n"
        previous = name
    return text
