"""The `dverl` subcommands, registered by module; each imports its heavy dependencies only when it runs.

Conventions every command follows (the tests walk the parser to hold them): every argument has help
text and its default shown; one name per idea (`--output` for a folder a command writes, `--json` for
machine-readable output); exit 0 on success, 1 when a run or operation failed, 2 for usage or invalid input.
"""

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


def load_all() -> dict[str, tuple[Callable[[argparse.ArgumentParser], None], str]]:
    """Import every command module (each registers its commands) in the order `--help` lists them."""
    from decentralized_verl.commands import jobs, peers, runs  # noqa: F401

    return COMMANDS
