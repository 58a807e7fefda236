"""What a user of any Unix CLI expects of `dverl`: help and defaults for every argument, one name per
idea, exit codes that tell a failed run (1) from bad input (2), quiet on a closed pipe, --json where
machines read, and plain progress lines when stderr is not a terminal.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from decentralized_verl.cli.main import _run, build_parser, main
from decentralized_verl.core.status import JobStatus
from decentralized_verl.errors import PeerUnavailable
from decentralized_verl.launch.run import RunFailed
from decentralized_verl.launch.step_lines import StepLines
from decentralized_verl.reporting.progress import eta_seconds, format_duration, progress_line
from tests.support.paths import ROOT

TINY = str(ROOT / "examples" / "tiny-grpo.yaml")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_argument_has_help_and_shows_its_default() -> None:
    missing, undefaulted = [], []
    for name, sub in _subparsers().items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.help:
                missing.append(f"{name} {action.dest}")
            shown = formatter._get_help_string(action)
            meaningful = action.default not in (None, False, argparse.SUPPRESS) and not action.required
            if meaningful and "%(default)" not in shown:
                undefaulted.append(f"{name} {action.dest}")
    assert not missing, missing
    assert not undefaulted, undefaulted


def test_one_name_for_the_folder_a_command_writes() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", TINY, "--output", "x"]).output == "x"
    assert parser.parse_args(["export", "r", "--output", "x"]).output == "x"
    assert parser.parse_args(["export", "r", "-o", "x"]).output == "x"
    assert parser.parse_args(["export", "r", "--out", "x"]).output == "x"  # the old name still works
    assert parser.parse_args(["train", "--output", "x"]).output == "x"


def test_worker_help_documents_the_actor_role(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    assert "actor: an open volunteer" in capsys.readouterr().out


def test_usage_and_invalid_input_exit_2_a_failed_operation_1(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["plan"])
    assert usage.value.code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: RLHFJob\n")
    assert main(["validate", str(bad)]) == 2
    assert main(["status", str(tmp_path / "absent")]) == 2

    def failing(args: argparse.Namespace) -> int:
        raise RunFailed("learner exited with code 1")

    assert _run(argparse.Namespace(_run=failing)) == 1

    def unreachable(args: argparse.Namespace) -> int:
        raise PeerUnavailable("could not reach the coordinator 1.2.3.4:5 in 30s")

    assert _run(argparse.Namespace(_run=unreachable)) == 1  # a peer that is down: the input was fine


def test_json_on_validate_and_every_plan_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: RLHFJob\n")
    assert main(["validate", "--json", TINY, str(bad)]) == 2
    results = json.loads(capsys.readouterr().out)
    assert results[0]["valid"] and "tiny-grpo: valid" in results[0]["summary"]
    assert not results[1]["valid"] and results[1]["problems"][0]["path"] == "apiVersion"
    assert main(["plan", TINY, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True
    assert main(["plan", TINY, "--workers", "--json"]) == 0
    workers = json.loads(capsys.readouterr().out)
    assert {w["role"] for w in workers} == {"learner", "rollout"}
    assert all(w["command"][:1] for w in workers)


def test_progress_line_and_eta() -> None:
    assert (
        format_duration(185) == "3m05s" and format_duration(3720) == "1h02m" and format_duration(None) == "?"
    )
    assert eta_seconds(10, 110, 20.0) == pytest.approx(200.0)
    assert eta_seconds(5, 10, 10.0, first_step=5) is None
    line = progress_line(12, 200, 0.4123, 1830.4, 185, accuracy=0.55)
    assert line == "step 12/200 reward 0.412 acc 55.0% tok/s 1830 eta 3m05s"


def test_step_lines_without_files_print_each_polled_step_once(capsys: pytest.CaptureFixture[str]) -> None:
    lines = StepLines()  # no run folder here (Ray): the Status RPC's numbers
    lines.show(JobStatus(step=0, total_steps=10), 0.0)  # nothing finished yet: no line
    lines.show(JobStatus(step=1, total_steps=10, reward_mean=0.1, tokens_per_second=10), 1.0)
    lines.show(JobStatus(step=1, total_steps=10, reward_mean=0.1, tokens_per_second=10), 1.5)
    lines.show(JobStatus(step=3, total_steps=10, reward_mean=0.3, tokens_per_second=10), 5.0)
    out = capsys.readouterr().err.splitlines()
    assert out == ["step 1/10 reward 0.100 tok/s 10 eta ?", "step 3/10 reward 0.300 tok/s 10 eta 14s"]
