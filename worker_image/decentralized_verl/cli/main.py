"""The `dverl` command line: parses, runs one subcommand (`decentralized_verl.cli.commands`), maps errors to
exit codes. No tracebacks for anything a person can act on.

Exit codes: 0 success; 1 a run or operation that failed (`OperationFailed`); 2 usage or invalid input
(argparse's own errors, every other `DverlError`: manifests, data, models, checkpoints asked for);
130 interrupted. A closed stdout (`dverl plan ... | head -1`) ends quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from decentralized_verl import __version__
from decentralized_verl.cli.commands import load_all
from decentralized_verl.cli.commands.peers import run_operator
from decentralized_verl.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    DverlError,
    ManifestError,
    OperationFailed,
)
from decentralized_verl.runtime.library_notices import quiet_library_notices
from decentralized_verl.runtime.orphans import die_with_parent
from decentralized_verl.settings import SettingsError, WorkerSettings, env_name

SECRETS_FD_VARIABLE = env_name("secrets_fd")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only when it says something (not None, not an off flag); a None default's meaning
    is in the help text itself."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or action.required:
            return action.help or ""
        return super()._get_help_string(action) or ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dverl", description="Decentralized veRL: RL fine-tuning of LLMs")
    parser.add_argument("--version", action="version", version=f"dverl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (setup, help_text) in load_all().items():
        setup(
            sub.add_parser(
                name,
                help=help_text,
                description=help_text,
                formatter_class=HelpFormatter,
            )
        )
    return parser


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args._run(args) or 0)
    except ManifestError as exc:
        source = f"{exc.source}: " if exc.source else ""
        for problem in exc.problems:
            print(f"{source}{problem}", file=sys.stderr)
        return EXIT_USAGE
    except OperationFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except DverlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _quiet_closed_pipe() -> int:
    """The reader of stdout went away: send the rest (and Python's final flush) nowhere, as `head` users
    expect of any Unix tool, and exit like a process killed by SIGPIPE would report in a shell."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13


def _take_secrets(settings: WorkerSettings) -> None:
    """Before anything else of this process runs: the secrets a launcher handed it, read and their
    descriptor closed, the process made non-dumpable first (`security.handed`)."""
    if settings.secrets_fd is None:
        return
    from decentralized_verl.security import handed  # noqa: PLC0415 light: ctypes, for a process handed secrets

    os.environ.pop(SECRETS_FD_VARIABLE, None)  # nothing it starts inherits a number naming nothing
    taken = handed.take(settings.secrets_fd) or b""
    from decentralized_verl.environments.apart import run_user_environments_apart  # noqa: PLC0415 light: a flag, for a process handed secrets

    run_user_environments_apart()  # a user's environment runs with no role's secret
    if taken.split(b"\n", 1)[0] != b"reward":  # a user's reward runs with no other role's secrets
        from decentralized_verl.rewards.apart import run_user_rewards_apart  # noqa: PLC0415 light: a flag, for a process handed secrets

        run_user_rewards_apart()


def _adopt(settings: WorkerSettings) -> None:
    """Hand the process-wide settings to the modules that hold them for the whole process: its job
    credentials (every server, channel and weight receiver uses them) and the converted-model cache.
    Each is imported only by a process given it: `dverl validate` and `plan` load neither."""
    if settings.tls_dir:
        from decentralized_verl.security import trust  # noqa: PLC0415 light: credentials, for a process given them

        trust.adopt(settings)
    if settings.cache_dir:
        from decentralized_verl.models import loading  # noqa: PLC0415 light: torch, in a process given a cache

        loading.use_cache_dir(settings.cache_dir)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = WorkerSettings.from_env()  # this process's entry: every `dverl` command starts here
        _take_secrets(settings)
    except (SettingsError, DverlError) as exc:  # DverlError: handed secrets refused
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    die_with_parent(settings.die_with_parent)  # a worker `dverl run` started ends with it
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["operator"]:
        return run_operator(argv[1:])  # the operator owns its flags (and its --help)
    _adopt(settings)
    quiet_library_notices()
    try:
        args = build_parser().parse_args(argv)
        code = _run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _quiet_closed_pipe()


def _alias(subcommand: str) -> Callable[[], int]:
    def entry() -> int:
        return main([subcommand, *sys.argv[1:]])

    return entry


dht_main = _alias("dht")
worker_main = _alias("worker")
train_main = _alias("train")
