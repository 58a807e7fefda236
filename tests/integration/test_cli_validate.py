"""`dverl validate` as a user runs it: exit codes and one line per problem, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import dverl


def test_valid_example_prints_one_line_and_exits_0() -> None:
    result = dverl("validate", str(ROOT / "examples" / "tiny-grpo.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and "tiny-grpo: valid" in result.stdout


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("apiVersion: [unclosed", "not valid YAML: line 1"),
        ("- a\n- b\n", "(root): expected a mapping"),
        ("", "(root): expected a mapping (an RLHFJob object), got empty"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "kind: expected 'RLHFJob'"),
        ("a: 1\n---\nb: 2\n", "none of its 2 YAML documents is an RLHFJob"),
        (
            "apiVersion: dverl.io/v1alpha1\nkind: RLHFJob\nmetadata: {name: j}\n"
            "spec:\n  model: {tiny: {}}\n  algorithm: {name: grpo, samplesPerPrompt: 1}\n"
            "  data: {train: t.jsonl}\n  roles: {rollout: {replicas: -2}}\n",
            "spec.roles.rollout.replicas: must be >= 0 (got -2)",
        ),
        (
            "apiVersion: dverl.io/v1alpha1\nkind: RLHFJob\nmetadata: {name: j}\n"
            "spec:\n  model: {tiny: {}, quantization: {type: nf4}}\n"
            "  algorithm: {name: grpo, samplesPerPrompt: 2}\n  data: {train: t.jsonl}\n",
            "spec.model.quantization: needs model.lora",
        ),
        (
            "apiVersion: dverl.io/v1alpha1\nkind: RLHFJob\nmetadata: {name: j}\n"
            "spec:\n  model: {tiny: {}, lora: {}, quantization: {bits: 8}}\n"
            "  algorithm: {name: grpo, samplesPerPrompt: 2}\n  data: {train: t.jsonl}\n",
            "spec.model.quantization.bits",
        ),
    ],
)
def test_invalid_files_exit_2_with_field_lines(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(content)
    result = dverl("validate", str(path))
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert all(line.startswith(str(path)) for line in result.stderr.strip().splitlines())


def test_missing_and_binary_files(tmp_path: Path) -> None:
    missing = dverl("validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    result = dverl("validate", str(binary))
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_every_problem_gets_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: dverl.io/v1alpha1\nkind: RLHFJob\nmetadata: {name: j}\n"
        "spec:\n  model: {tiny: {}}\n  algorithm: {name: ppo, samplesPerPrompt: 2}\n"
        "  data: {train: t.jsonl, rewardType: vibes}\n"
        "  training: {batchSize: 4, minibatchSize: 8}\n"
    )
    result = dverl("validate", str(path))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert any("spec.roles.critic:" in line for line in lines)
    assert any("spec.data.rewardType:" in line for line in lines)
    assert any("spec.training.minibatchSize:" in line for line in lines)
