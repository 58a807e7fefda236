"""The registry the command modules add themselves to, apart from the package that imports them all."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, help_text: str):
    """Register a subcommand: the decorated function adds its arguments and returns the runner."""

    def register(add_arguments: Callable[[argparse.ArgumentParser], Command]):
        def setup(parser: argparse.ArgumentParser) -> None:
            parser.set_defaults(_run=add_arguments(parser))

        COMMANDS[name] = (setup, help_text)
        return add_arguments

    return register
