"""`dverl convert`: veRL's and TRL's documented GRPO examples and an OpenRLHF command line become manifests
that validate, with the settings carried over and every field left out listed with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from convert_tables import tables_section

from decentralized_verl.cli.main import main
from decentralized_verl.convert import convert
from decentralized_verl.planning.fitting_job import load_fitting_job
from tests.support.paths import FIXTURES, ROOT

CONVERT = FIXTURES / "convert"


def _convert(tmp_path: Path, capsys, *args: str) -> tuple[dict, str]:
    out = tmp_path / "job.yaml"
    assert main(["convert", *args, "--output", str(out)]) == 0, capsys.readouterr().err
    job = load_fitting_job(out)  # validates, and fits, as `dverl validate` checks it
    assert job is not None
    return yaml.safe_load(out.read_text()), capsys.readouterr().err


def test_verl_documented_grpo_example(tmp_path: Path, capsys) -> None:
    doc, err = _convert(tmp_path, capsys, "verl", str(CONVERT / "verl_grpo_qwen2_7b.sh"))
    spec = doc["spec"]
    assert doc["metadata"]["name"] == "qwen2-7b-function-rm"
    assert spec["model"] == {"path": "Qwen/Qwen2-7B-Instruct", "dtype": "bfloat16"}
    assert spec["algorithm"]["name"] == "grpo" and spec["algorithm"]["samplesPerPrompt"] == 5
    assert spec["algorithm"]["klIn"] == "loss" and spec["algorithm"]["klCoef"] == 0.001
    assert spec["algorithm"]["klEstimator"] == "k3" and spec["algorithm"]["entropyCoef"] == 0.0
    assert spec["data"]["train"] == "$HOME/data/gsm8k/train.parquet"
    assert spec["data"]["maxPromptTokens"] == 512 and spec["data"]["maxNewTokens"] == 1024
    learner = spec["roles"]["learner"]
    assert learner["replicas"] == 8 and learner["sharding"] == "fsdp" and learner["activationCheckpointing"]
    assert spec["roles"]["rollout"]["resources"]["gpus"] == 2 and spec["roles"]["rollout"]["replicas"] == 4
    assert spec["roles"]["reference"]["replicas"] == 1
    training = spec["training"]
    assert training["batchSize"] * learner["replicas"] == 1024  # veRL's batch is over all GPUs
    assert training["minibatchSize"] * learner["replicas"] == 256
    assert training["microbatchSize"] == 8  # 40 samples per GPU / 5 per prompt
    assert training["learningRate"] == 1e-6 and training["epochs"] == 15
    assert training["evalEvery"] == 5 and training["checkpoint"]["every"] == 20
    assert training["logging"] == ["wandb"]
    assert training["tracking"] == {"project": "verl_grpo_example_gsm8k", "runName": "qwen2_7b_function_rm"}
    assert "unmapped: actor_rollout_ref.rollout.gpu_memory_utilization=0.6: dverl plan sizes" in err
    assert "unmapped: trainer.logger='console': progress lines are always printed" in err


def test_trl_documented_grpo_quickstart(tmp_path: Path, capsys) -> None:
    doc, err = _convert(tmp_path, capsys, "trl", str(CONVERT / "trl_grpo_quickstart.yaml"))
    spec = doc["spec"]
    assert doc["metadata"]["name"] == "qwen2-0-5b-grpo"
    assert spec["model"]["path"] == "Qwen/Qwen2-0.5B-Instruct"
    # TRL's defaults: beta 0 (no KL), loss_type dapo (token-mean); no vLLM, so no rollout correction
    assert spec["algorithm"] == {"name": "grpo", "samplesPerPrompt": 8, "lossAggregation": "token_mean"}
    assert spec["training"]["batchSize"] == 1  # 8 completions a device / 8 generations
    assert spec["training"]["epochs"] == 3 and spec["training"]["checkpoint"]["dir"] == "Qwen2-0.5B-GRPO"
    assert spec["data"]["train"] == "trl-lib/tldr"
    assert "unmapped: reward_funcs='reward_len': a TRL built-in or a bare name, not an import path" in err
    assert "unmapped: logging_steps=10: metrics are written every step" in err
    assert "Hugging Face Hub dataset" in err


def test_trl_config_json_with_choices(tmp_path: Path, capsys) -> None:
    config = {
        "model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",
        "dataset_name": "math.jsonl",
        "reward_funcs": ["my_rewards:accuracy", "my_rewards:format"],
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
        "max_steps": 50,
        "num_train_epochs": 2,
        "beta": 0.04,
        "loss_type": "dr_grpo",
        "importance_sampling_level": "sequence",
        "report_to": ["tensorboard", "comet_ml"],
        "learning_rate": 3e-6,
        "warmup_ratio": 0.1,
    }
    path = tmp_path / "grpo.json"
    path.write_text(json.dumps(config))
    doc, err = _convert(tmp_path, capsys, "trl", str(path))
    spec = doc["spec"]
    assert spec["training"]["batchSize"] == 4 and spec["training"]["steps"] == 50
    assert "epochs" not in spec["training"]
    assert spec["algorithm"]["klCoef"] == 0.04 and spec["roles"]["reference"]["replicas"] == 1
    assert "lossAggregation" not in spec["algorithm"]  # gspo's objective is a mean over sequences
    assert spec["algorithm"]["normAdvByStd"] is False and spec["algorithm"]["policyLoss"] == "gspo"
    assert spec["data"]["rewardType"] == "my_rewards:accuracy"
    assert spec["training"]["logging"] == ["tensorboard"]
    assert "unmapped: reward_funcs='my_rewards:format': dverl takes one reward" in err
    assert "unmapped: report_to='comet_ml': not a dverl tracker" in err
    assert "unmapped: warmup_ratio=0.1: give warmup as training.warmupSteps" in err
    assert "unmapped: loss_type='dr_grpo': dverl's gspo averages over sequences" in err


def test_openrlhf_command_line(tmp_path: Path, capsys) -> None:
    doc, err = _convert(tmp_path, capsys, "openrlhf", str(CONVERT / "openrlhf_reinforce.sh"))
    spec = doc["spec"]
    assert doc["metadata"]["name"] == "qwen-rpp"
    assert spec["algorithm"]["name"] == "reinforce_plus_plus_baseline"
    assert spec["algorithm"]["klEstimator"] == "k2" and spec["algorithm"]["klIn"] == "loss"
    assert spec["roles"]["learner"]["replicas"] == 2 and spec["roles"]["rollout"]["replicas"] == 2
    assert spec["training"]["batchSize"] == 16  # 32 prompts a step over 2 learners
    assert spec["training"]["microbatchSize"] == 2  # 8 samples / 4 per prompt
    assert spec["data"]["train"] == "data/math.jsonl" and spec["model"]["dtype"] == "bfloat16"
    assert "unmapped: zero_stage='3': sharding is roles.learner.sharding" in err


def test_openrlhf_ppo_gets_a_critic() -> None:
    result = convert(
        "openrlhf", "train_ppo_ray --pretrain m --advantage_estimator gae --critic_learning_rate 9e-6"
    )
    spec = result.manifest["spec"]
    assert spec["algorithm"]["name"] == "ppo" and spec["roles"]["critic"]["replicas"] == 1
    assert spec["training"]["criticLearningRate"] == 9e-6


def test_verl_yaml_with_hydra_overrides() -> None:
    base = {
        "algorithm": {"adv_estimator": "grpo", "kl_ctrl": {"kl_coef": 0.001}},
        "data": {"train_files": ["a.parquet", "b.parquet"], "max_prompt_length": 256},
        "actor_rollout_ref": {
            "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", "lora_rank": 0, "lora_alpha": 16},
            "rollout": {"n": 4, "log_prob_micro_batch_size": "${actor_rollout_ref.actor.x}"},
            "actor": {"optim": {"lr": 1e-6}, "some_new_knob": 3},
        },
        "trainer": {"logger": ["console", "tensorboard"], "total_epochs": 2},
    }
    result = convert(
        "verl",
        yaml.safe_dump(base),
        [
            "actor_rollout_ref.rollout.n=16",
            "~trainer.logger",
            "+trainer.total_training_steps=50",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.target_modules=all-linear",
        ],
    )
    spec = result.manifest["spec"]
    assert spec["algorithm"]["samplesPerPrompt"] == 16
    assert "logging" not in spec["training"]
    assert spec["training"]["steps"] == 50 and "epochs" not in spec["training"]
    assert spec["model"]["lora"]["rank"] == 8 and len(spec["model"]["lora"]["targetModules"]) == 7
    assert spec["data"]["train"] == "a.parquet"
    why = {u.field: u.why for u in result.unmapped}
    assert "takes one file" in why["data.train_files"]
    assert "Hydra interpolation" in why["actor_rollout_ref.rollout.log_prob_micro_batch_size"]
    assert why["actor_rollout_ref.actor.some_new_knob"] == "no dverl equivalent known to the converter"
    assert "algorithm.kl_ctrl.kl_coef" not in why  # the KL is off: the coefficient means nothing


def test_a_value_that_does_not_fit_is_listed_not_guessed() -> None:
    result = convert(
        "verl", "", ["actor_rollout_ref.rollout.n=many", "actor_rollout_ref.actor.loss_agg_mode=odd"]
    )
    why = {u.field: u.why for u in result.unmapped}
    assert why["actor_rollout_ref.rollout.n"].startswith("cannot be read as spec.algorithm.samplesPerPrompt")
    assert why["actor_rollout_ref.actor.loss_agg_mode"].startswith(
        "cannot be read as spec.algorithm.lossAggregation"
    )


@pytest.mark.parametrize(
    ("args", "text", "expected"),
    [
        (["trl"], "- just\n- a list\n", "cannot convert: a GRPOConfig is a JSON or YAML mapping"),
        (["verl"], "a: [unclosed", "cannot convert"),
        (["verl", "notanoverride"], "a: 1\n", "expected key=value"),
        (["trl", "x=1"], "{}", "overrides (key=value) apply to veRL configs only"),
    ],
)
def test_bad_inputs_exit_2_with_a_message(tmp_path: Path, capsys, args, text, expected) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    source, *overrides = args
    assert main(["convert", source, str(path), *overrides]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_json_output_and_a_manifest_that_does_not_validate(tmp_path: Path, capsys) -> None:
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"num_generations": 4, "logging_steps": 5}))
    assert main(["convert", "trl", str(path), "--json"]) == 2  # no model_name_or_path: no spec.model
    result = json.loads(capsys.readouterr().out)
    assert result["manifest"]["kind"] == "RLHFJob"
    assert result["problems"] == ["spec.model: required field is missing"]
    assert result["unmapped"] == [
        {"field": "logging_steps", "value": 5, "why": "metrics are written every step"}
    ]
    assert any("dataset_name not given" in note for note in result["notes"])


def test_docs_show_the_mapping_both_ways() -> None:
    page = (ROOT / "docs" / "convert.md").read_text()
    assert page.endswith(tables_section()), (
        "docs/convert.md drifted from the converters' tables: run python testing/convert_tables.py"
    )
