"""Files that would exhaust the YAML parser, through the real `dverl` command line: every command that
reads YAML refuses them with exit 2 and a line naming the limit, within a memory cap the unlimited parser
blew through (0.6-2.3 GB for a 1 KB file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hostile_yaml import billion_laughs

MEMORY_CAP = 1024 * 1024 * 1024
"""Address space each command may use; the interpreter and its imports need well under it."""


CAPPED = (
    f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP})); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
"""Caps itself, then execs the command: a preexec_fn would make this process fork(), and a fork of a
process whose gRPC threads are busy (earlier tests' servers) can abort in the child."""


def run_dverl(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", CAPPED, "-m", "decentralized_verl.cli", *args],
        capture_output=True,
        input=stdin,
        timeout=120,
    )


ATTACKS = {
    "billion-laughs": ("maxNodes", lambda: billion_laughs()),
    "deep-nesting": ("maxDepth", lambda: "a: " + "[" * 100_000 + "]" * 100_000 + "\n"),
    "huge-integer": ("maxNumberChars", lambda: "spec:\n  training:\n    steps: " + "9" * 200_000 + "\n"),
    "huge-file": ("maxBytes", lambda: "a:\n" + ('  - "' + "x" * 1000 + '"\n') * 5000),
}

COMMANDS = {
    "validate": lambda f: ("validate", f),
    "plan": lambda f: ("plan", f),
    "run": lambda f: ("run", f),
    "convert-verl": lambda f: ("convert", "verl", f),
    "convert-trl": lambda f: ("convert", "trl", f),
    "train": lambda f: ("train", "--stage", "sft", "--config", f),
}


@pytest.fixture(scope="module")
def attack_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("attacks")
    files = {}
    for name, (_, make) in ATTACKS.items():
        files[name] = folder / f"{name}.yaml"
        files[name].write_text(make())
    assert files["billion-laughs"].stat().st_size < 1024
    return files


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_command_refuses_the_attack_naming_the_limit(
    attack_files: dict[str, Path], command: str, attack: str
) -> None:
    limit = ATTACKS[attack][0]
    result = run_dverl(*COMMANDS[command](str(attack_files[attack])))
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr[-2000:]
    assert f"YAML limit {limit} exceeded" in stderr, stderr[-2000:]
    assert "Traceback" not in stderr


def test_convert_from_stdin_stops_reading_at_the_size_limit() -> None:
    result = run_dverl("convert", "verl", "-", stdin=b"a: " + b"x" * (64 * 1024 * 1024))
    assert result.returncode == 2
    assert b"YAML limit maxBytes exceeded" in result.stderr
