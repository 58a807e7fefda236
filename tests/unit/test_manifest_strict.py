"""Manifests that would validate and then waste a run are refused (or warned about) before it starts:
duplicate keys, loose types, contexts too long for the model, absurd sizes, unreadable data, a reward
that does not import; errors quote little of the input; memory fixes meet the need they state."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from decentralized_verl.cli.main import main
from decentralized_verl.errors import ManifestError
from decentralized_verl.planning.fitting_job import load_fitting_job
from decentralized_verl.spec.manifest import load_job, warnings_for
from tests.support.job_manifests import TOY
from tests.support.paths import ROOT

HEAD = "apiVersion: dverl.io/v1alpha1\nkind: RLHFJob\nmetadata: {name: j}\n"


def _spec(**sections: object) -> dict:
    spec = {
        "model": {"tiny": {"hiddenSize": 32, "numHeads": 4}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 4},
        "data": {
            "train": str(TOY / "train.jsonl"),
            "rewardType": "decentralized_verl.rewards.toy:first_number",
        },
        "roles": {"rollout": {"replicas": 0}, "learner": {"replicas": 1}},
        "training": {"steps": 2, "batchSize": 4},
    }
    for key, value in sections.items():
        spec[key] = {**spec.get(key, {}), **value}
    return spec


def _write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(HEAD + yaml.safe_dump({"spec": spec}))
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(ManifestError) as caught:
        load_fitting_job(path)
    return [str(p) for p in caught.value.problems]


def test_a_duplicated_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    text = HEAD + yaml.safe_dump({"spec": _spec()})
    text = text.replace("  training:\n", "  training:\n    steps: 500\n", 1)
    path.write_text(text)
    lines = text.splitlines()
    first = 1 + lines.index("    steps: 500")
    second = 1 + next(i for i, line in enumerate(lines) if line == "    steps: 2")
    problems = _problems(path)
    assert problems == [
        f"(file): duplicate key 'steps' at line {max(first, second)} (first at line {min(first, second)})"
    ]


@pytest.mark.parametrize(
    ("section", "value", "field", "words"),
    [
        ("training", {"learningRate": "0.001"}, "spec.training.learningRate", "remove the quotes"),
        ("algorithm", {"samplesPerPrompt": True}, "spec.algorithm.samplesPerPrompt", "valid integer"),
        ("training", {"batchSize": 1e9}, "spec.training.batchSize", "without a decimal point"),
        ("training", {"steps": 1e38}, "spec.training.steps", "valid integer"),
        ("data", {"maxNewTokens": "8"}, "spec.data.maxNewTokens", "remove the quotes"),
        ("training", {"checkpoint": {"keep": 2.0}}, "spec.training.checkpoint.keep", "without a decimal"),
        ("algorithm", {"maskTruncated": "yes"}, "spec.algorithm.maskTruncated", "true or false"),
    ],
)
def test_loose_numbers_and_booleans_are_refused(
    tmp_path: Path, section: str, value: dict, field: str, words: str
) -> None:
    problems = _problems(_write(tmp_path, _spec(**{section: value})))
    assert any(p.startswith(f"{field}:") and words in p for p in problems), problems


def test_integers_for_floats_still_pass(tmp_path: Path) -> None:
    job = load_job(_write(tmp_path, _spec(data={"temperature": 1}, training={"maxGradNorm": 2})))
    assert job.spec.data.temperature == 1.0 and job.spec.training.max_grad_norm == 2.0


def test_errors_quote_a_few_hundred_characters_at_most(tmp_path: Path) -> None:
    # A billion-laughs-style alias chain: a few hundred bytes of YAML, megabytes once expanded.
    aliases = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
        for i in range(1, 8)
    )
    text = HEAD + "x-aliases:\n" + "".join("  " + line for line in aliases.splitlines(keepends=True))
    text += yaml.safe_dump({"spec": _spec()}).replace("  steps: 2", "  steps: *a7")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert len(text) < 1000
    with pytest.raises(ManifestError) as caught:
        load_job(path)
    message = "\n".join(str(p) for p in caught.value.problems)
    assert "YAML limit maxNodes exceeded" in message  # refused by the loader, before anything walks it
    assert len(message) < 1000, len(message)


def test_context_beyond_the_models_config_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 100,
                "max_position_embeddings": 128,
            }
        )
    )
    spec = _spec(data={"maxPromptTokens": 100, "maxNewTokens": 64})
    spec["model"] = {"path": str(model)}
    problems = _problems(_write(tmp_path, spec))
    assert any(
        "spec.data.maxNewTokens" in p and "= 164 positions" in p and "context of 128" in p for p in problems
    )


def test_context_beyond_a_tiny_models_stated_max_positions_is_refused(tmp_path: Path) -> None:
    spec = _spec(data={"maxPromptTokens": 64, "maxNewTokens": 8})
    spec["model"] = {"tiny": {"hiddenSize": 32, "numHeads": 4, "maxPositions": 32}}
    problems = _problems(_write(tmp_path, spec))
    assert any(
        p.startswith("spec.data.maxNewTokens:") and "= 72 positions" in p and "context of 32" in p
        and "spec.model.tiny.maxPositions" in p
        for p in problems
    ), problems  # fmt: skip
    spec["model"]["tiny"]["maxPositions"] = 72
    load_fitting_job(_write(tmp_path, spec))  # exactly the budget fits


def test_absurd_sizes_are_refused_with_the_number_computed(tmp_path: Path) -> None:
    spec = _spec(training={"batchSize": 10**9}, data={"maxPromptTokens": 64, "maxNewTokens": 64})
    problems = _problems(_write(tmp_path, spec))
    assert any(
        p.startswith("spec.training.batchSize:") and "512,000,000,000 tokens a step" in p for p in problems
    )
    problems = _problems(_write(tmp_path, _spec(training={"steps": 10**38})))
    assert any(p.startswith("spec.training.steps:") for p in problems)


def test_settings_without_a_learning_signal_are_warned(tmp_path: Path, capsys) -> None:
    job = load_job(_write(tmp_path, _spec(data={"temperature": 0})))
    warnings = [str(w) for w in warnings_for(job.spec)]
    assert any(w.startswith("spec.data.temperature:") and "no learning signal" in w for w in warnings)
    assert main(["validate", str(tmp_path / "job.yaml")]) == 0
    assert "warning: spec.data.temperature" in capsys.readouterr().err
    assert warnings_for(load_job(_write(tmp_path, _spec())).spec) == []


def test_the_memory_fix_meets_the_need_it_states(tmp_path: Path) -> None:
    spec = _spec(roles={"learner": {"replicas": 1, "resources": {"memory": "10Mi"}}})
    path = _write(tmp_path, spec)
    problems = _problems(path)
    fix = next(p for p in problems if "resources.memory >=" in p)
    quantity = re.search(r"resources\.memory >= (\w+)", fix).group(1)
    spec["roles"]["learner"]["resources"]["memory"] = quantity
    load_fitting_job(_write(tmp_path, spec))  # the suggested memory fits


def test_a_stages_config_is_checked_as_one_and_says_how_to_run_it(capsys) -> None:
    root = ROOT
    assert main(["validate", str(root / "examples" / "stages.yaml")]) == 0
    assert "dverl train --stage all --config" in capsys.readouterr().out
    with pytest.raises(ManifestError, match="dverl train --stage all --config"):
        load_job(root / "examples" / "stages.yaml")  # `dverl run` on it still says what it is
