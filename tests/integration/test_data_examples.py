"""The shipped examples/data: current with its generator, readable by the loaders, answers right
(checked by independent arithmetic and by running the reference programs as real subprocesses).

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys

from decentralized_verl.data import load_prompts
from tests.support.paths import ROOT
from tests.support.repo_scripts import load_script

DATA = ROOT / "examples" / "data"


def test_code_tests_pass_with_the_reference_programs_run_as_subprocesses() -> None:
    script = load_script("example_code_problems")
    solutions = {script.CODE_PREAMBLE + p.statement: p.solution for p in script.CODE_PROBLEMS}
    train, evals = load_prompts(DATA / "code/train.jsonl"), load_prompts(DATA / "code/eval.jsonl")
    assert train.kind == evals.kind == "code"
    assert 20 <= len(train) + len(evals) <= 40 and len(evals) >= 5
    statements = [r.messages[0].content for r in [*train, *evals]]
    assert len(set(statements)) == len(statements) and set(statements) == set(solutions)
    for record in [*train, *evals]:
        assert 2 <= len(record.tests) <= 4 and len(set(record.tests.inputs)) == len(record.tests)
        source = solutions[record.messages[0].content]
        for stdin, expected in zip(record.tests.inputs, record.tests.outputs, strict=True):
            run = subprocess.run(
                [sys.executable, "-I", "-c", source], input=stdin, capture_output=True, text=True, timeout=30
            )
            assert run.returncode == 0, run.stderr
            assert run.stdout == expected, (record.messages[0].content, stdin)


def test_a_wrong_program_fails_some_test() -> None:
    """The tests discriminate: an off-by-one sum fails them."""
    (record,) = [
        r for r in load_prompts(DATA / "code/train.jsonl") if "print their sum" in r.messages[0].content
    ] or [r for r in load_prompts(DATA / "code/eval.jsonl") if "print their sum" in r.messages[0].content]
    wrong = "a, b = map(int, input().split())\nprint(a + b + 1)\n"
    outputs = [
        subprocess.run([sys.executable, "-I", "-c", wrong], input=i, capture_output=True, text=True).stdout
        for i in record.tests.inputs
    ]
    assert outputs != list(record.tests.outputs)
