"""Shipped environments: the arithmetic evaluator, calculator, guessing game and sandboxed Python tool
(real child processes, hostile programs included), the registry and the spec's `data.environment`.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from decentralized_verl.environments.base import EpisodeRecord
from decentralized_verl.environments.registry import make_environment


def python_env(**options):
    env = make_environment("python_tool", {"timeoutS": 2, "cpuTimeS": 1, **options})
    env.reset(EpisodeRecord("p", "42", seed=0))
    return env


def run_block(code: str, **options):
    return python_env(**options).step(f"Let me run:\n```python\n{code}\n```")


def test_python_tool_returns_output_and_scores_the_answer() -> None:
    env = python_env()
    step = env.step("```python\nprint(6 * 7)\n```")
    assert step.observation.strip() == "42" and step.info.tool_calls == 1 and step.info.tool_errors == 0
    final = env.step("The answer is 42.")
    assert final.done and final.reward == 1.0


def test_python_tool_reports_a_failing_program() -> None:
    step = run_block("print('partial')\nraise ValueError('boom')")
    assert step.info.tool_errors == 1 and not step.done
    assert "partial" in step.observation and "ValueError: boom" in step.observation


def test_python_tool_cannot_read_the_workers_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DVERL_JOIN_TOKEN", "s3cr3t-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-aws")
    step = run_block("import os\nprint(sorted(os.environ.items()))")
    assert "s3cr3t" not in step.observation
    assert "DVERL_JOIN_TOKEN" not in step.observation


def test_python_tool_cannot_read_files_outside(tmp_path: Path) -> None:
    secret = tmp_path / "credentials"
    secret.write_text("s3cr3t-file")
    step = run_block(f"print(open({str(secret)!r}).read())")
    assert "s3cr3t" not in step.observation and step.info.tool_errors == 1
    proc = run_block("print(open('/proc/1/environ').read())")
    assert proc.info.tool_errors == 1


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.fork()",
        "import os\nos.system('echo pw\"\"ned')",
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo pw\"\"ned'])",
        "import socket\ns = socket.socket()\ns.connect(('1.1.1.1', 80))",
        "import urllib.request\nurllib.request.urlopen('http://example.com')",
    ],
    ids=["fork", "system", "subprocess", "socket", "http"],
)
def test_python_tool_refuses_processes_and_network(code: str) -> None:
    step = run_block(code)
    assert step.info.tool_errors == 1
    assert "pwned" not in step.observation  # the source echoes pw""ned; only running it prints pwned
    assert "PermissionError" in step.observation or "sandbox" in step.observation


def test_python_tool_stops_an_infinite_loop_in_time() -> None:
    started = time.perf_counter()
    step = run_block("while True:\n    pass")
    assert time.perf_counter() - started < 5
    assert step.info.tool_errors == 1 and ("time" in step.observation or "CPU" in step.observation)


def test_python_tool_cuts_a_flood_of_output() -> None:
    step = run_block("print('x' * 100000)", maxOutputChars=100)
    assert len(step.observation) < 400
