"""The `dverl` subcommands, registered by module; each imports its heavy dependencies only when it runs.

Conventions every command follows (the tests walk the parser to hold them): every argument has help
text and its default shown; one name per idea (`--output` for a folder a command writes, `--json` for
machine-readable output); exit 0 on success, 1 when a run or operation failed, 2 for usage or invalid input.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from decentralized_verl.cli.commands import jobs, peers, runs  # noqa: F401
from decentralized_verl.cli.commands.registry import COMMANDS


def load_all() -> dict[str, tuple[Callable[[argparse.ArgumentParser], None], str]]:
    """Import every command module (each registers its commands) in the order `--help` lists them."""
    return COMMANDS
