"""`dverl convert` on configs taken from OpenRLHF, veRL and TRL as they ship today and in their last
release formats (tests/support/fixtures/convert, sources in its README): every flag of either OpenRLHF era
read, scripts with variables and bash arrays, veRL's Hydra defaults composed, environment variables
reported, and a fully composed config summarized instead of printed key by key."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from decentralized_verl.cli.main import main
from decentralized_verl.convert import convert, openrlhf_flags
from decentralized_verl.convert.common import flatten
from decentralized_verl.convert.hydra import compose, resolve
from decentralized_verl.convert.shell import script_command
from decentralized_verl.planning.fitting_job import load_fitting_job
from tests.support.paths import FIXTURES

CONVERT = FIXTURES / "convert"
OPENRLHF = CONVERT / "openrlhf"
VERL = CONVERT / "verl"
TRL = CONVERT / "trl"


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["convert", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _convert(tmp_path: Path, capsys, *args: str) -> tuple[dict, str]:
    out = tmp_path / "job.yaml"
    code, _, err = _run(capsys, *args, "--output", str(out))
    assert code == 0, err
    assert "Traceback" not in err
    assert load_fitting_job(out) is not None  # validates, as `dverl validate` checks it
    return yaml.safe_load(out.read_text())["spec"], err


def test_openrlhf_head_ppo_example_maps_every_dotted_flag(tmp_path: Path, capsys) -> None:
    spec, err = _convert(
        tmp_path, capsys, "openrlhf", str(OPENRLHF / "head" / "train_ppo_ray_hybrid_engine.sh")
    )
    assert "not a train_ppo_ray flag" not in err and "no dverl equivalent known" not in err
    assert spec["model"] == {"dtype": "bfloat16", "path": "OpenRLHF/Llama-3-8b-sft-mixture"}
    assert spec["algorithm"]["name"] == "ppo" and spec["algorithm"]["klCoef"] == 0.01
    assert spec["algorithm"]["rolloutCorrection"] == {
        "enabled": True,
        "importanceSampling": "token",
        "cap": 5.0,
    }
    assert spec["data"]["maxPromptTokens"] + spec["data"]["maxNewTokens"] == 2048  # --data.max_len
    assert spec["data"]["rewardModel"] == {"path": "OpenRLHF/Llama-3-8b-rm-700k"}
    assert spec["roles"]["reward"]["replicas"] == 8 and spec["roles"]["critic"]["replicas"] == 8
    training = spec["training"]
    assert training["microbatchTokens"] == 16384 and "microbatchSize" not in training
    assert training["learningRate"] == 5e-7 and training["criticLearningRate"] == 9e-6
    assert training["batchSize"] * spec["roles"]["learner"]["replicas"] == 1024
    assert "unmapped: ds.zero_stage='3': sharding is roles.learner.sharding" in err
    assert "read as OpenRLHF v0.10.1" not in err


def test_openrlhf_bash_arrays_and_script_variables(tmp_path: Path, capsys) -> None:
    script = OPENRLHF / "head" / "train_reinforce_baseline_hybrid_engine.sh"
    spec, err = _convert(tmp_path, capsys, "openrlhf", str(script))
    assert spec["model"]["path"] == "Qwen/Qwen3-4B-Thinking-2507"  # --actor.model_name_or_path ${MODEL_PATH}
    assert spec["algorithm"]["name"] == "reinforce_plus_plus_baseline"
    assert spec["algorithm"]["rolloutCorrection"] == {
        "enabled": True,
        "importanceSampling": "token",
        "cap": 5.0,
        "rejection": "token",
        "rejectLow": 0.5,
        "rejectHigh": 5.0,
    }  # icepop: tokens outside [0.5, 5] rejected
    assert spec["algorithm"]["dynamicFilter"] == {"enabled": True, "low": 0.0, "high": 1.0}
    assert spec["data"] == {
        "maxNewTokens": 64000,
        "maxPromptTokens": 74240 - 64000,
        "train": "zhuzilin/dapo-math-17k",
        "rewardType": "boxed",
    }
    assert spec["training"]["microbatchTokens"] == 16192
    assert spec["training"]["checkpoint"] == {
        "dir": "${WORK_DIR}/exp/Qwen3-4B-Thinking/ckpt",
        "keep": 3,
        "every": 10,
    }
    assert "note: $WORK_DIR is not set in the script" in err  # set by $(cd ... && pwd): not computed here
    assert "OPTIMIZER_ARGS" not in err and "expected true or false" not in err


@pytest.mark.parametrize(
    "script", ["train_ppo_ray_hybrid_engine.sh", "train_reinforce_baseline_hybrid_engine.sh"]
)
def test_openrlhf_underscore_era_converts_to_the_same_job(tmp_path: Path, capsys, script: str) -> None:
    dotted, _ = _convert(tmp_path, capsys, "openrlhf", str(OPENRLHF / "head" / script))
    underscore, err = _convert(tmp_path, capsys, "openrlhf", str(OPENRLHF / "v0.10.1" / script))
    assert underscore == dotted
    assert "read as OpenRLHF v0.10.1 or earlier (underscore flags)" in err
    assert "not a train_ppo_ray flag" not in err and "no dverl equivalent known" not in err


def test_openrlhf_v0_9_script_keeps_dtype_lengths_correction_and_token_budget(tmp_path: Path, capsys) -> None:
    spec, err = _convert(
        tmp_path, capsys, "openrlhf", str(OPENRLHF / "v0.9.10" / "train_ppo_ray_hybrid_engine.sh")
    )
    assert spec["model"]["dtype"] == "bfloat16"  # --param_dtype bf16
    assert spec["data"]["maxPromptTokens"] + spec["data"]["maxNewTokens"] == 2048  # --max_len
    assert spec["algorithm"]["rolloutCorrection"]["enabled"] is True  # --enable_vllm_is_correction
    assert spec["training"]["microbatchTokens"] == 16384  # --use_dynamic_batch --train_max_tokens_per_gpu
    assert "unmapped: zero_stage='3'" in err  # named as the script wrote it


def test_openrlhf_unknown_and_mixed_flags_are_named_not_fatal(capsys) -> None:
    text = (
        "python3 -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path m --actor_learning_rate 1e-6 "
        "--rollout.n_samples_per_prompt 4 --algo.advantage.estimator group_norm --actor.adam.betaz 0.9 0.9 "
        "--train.max_tokens_per_gpu 8192 --ds.param_dtype fp16"
    )
    result = convert("openrlhf", text)
    why = {u.field: u.why for u in result.unmapped}
    assert why["actor.adam.betaz"].startswith("not a train_ppo_ray flag of OpenRLHF")
    assert "only with --train.dynamic_batch_enable" in why["train.max_tokens_per_gpu"]
    assert any("mixes OpenRLHF's dotted flags" in n for n in result.notes)
    spec = result.manifest["spec"]
    assert spec["training"]["learningRate"] == 1e-6 and spec["model"]["dtype"] == "float16"
    assert "microbatchTokens" not in spec["training"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            "--algo.advantage.is_correction_enable --algo.advantage.is_correction_type seq-mask-tis "
            "--algo.advantage.is_correction_threshold 0.8 1.5",
            {
                "enabled": True,
                "importanceSampling": "token",
                "cap": 1.5,
                "rejection": "sequence",
                "rejectLow": 0.8,
                "rejectHigh": 1.5,
            },
        ),
        (
            "--enable_vllm_is_correction --vllm_is_truncated_threshold 0.5 3",
            {"enabled": True, "importanceSampling": "token", "cap": 3.0},
        ),
        ("", None),
    ],
)
def test_openrlhf_importance_sampling_correction(flags: str, expected: dict | None) -> None:
    result = convert("openrlhf", f"train_ppo_ray --pretrain m --advantage_estimator rloo {flags}")
    assert result.manifest["spec"]["algorithm"].get("rolloutCorrection") == expected
    if expected is None:
        assert any("importance-sampling correction is off" in n for n in result.notes)


def test_verl_compose_equals_verls_own_generated_config() -> None:
    folder = VERL / "config"

    def read(rel: str) -> str | None:
        path = folder / rel
        return path.read_text() if path.is_file() else None

    composed = compose("ppo_trainer.yaml", read)
    assert composed.missing == [] and "actor/actor.yaml" in composed.read
    mine = flatten(composed.config)
    theirs = flatten(yaml.safe_load((folder / "_generated_ppo_trainer.yaml").read_text()))
    assert mine.keys() == theirs.keys()
    differ = {
        k
        for k in mine
        if mine[k] != theirs[k] and str(float(mine[k]) if _number(mine[k]) else mine[k]) != str(theirs[k])
    }
    assert differ == set()  # YAML 1.1 reads `1e-6` as a string; the number is the same
    resolved = resolve(composed.config)
    assert resolved.unresolved == {}
    flat = flatten(resolved.config)
    assert flat["actor_rollout_ref.rollout.prompt_length"] == flat["data.max_prompt_length"]


def _number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


def test_verl_ppo_trainer_yaml_composed_and_summarized(tmp_path: Path, capsys) -> None:
    spec, err = _convert(
        tmp_path,
        capsys,
        "verl",
        str(VERL / "config" / "ppo_trainer.yaml"),
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
    )
    assert "composed" in err and "Hydra defaults from 16 file(s)" in err
    assert (
        spec["model"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    )  # actor_rollout_ref.model from model/hf_model
    assert spec["data"]["maxPromptTokens"] == 512 and spec["data"]["maxNewTokens"] == 512  # data/legacy_data
    assert spec["training"]["learningRate"] == 1e-6  # actor/actor.yaml's optim.lr
    lines = err.splitlines()
    assert len(lines) < 80, "\n".join(lines)
    profiler = "unmapped: *.profiler.*: 39 keys in actor_rollout_ref.actor, actor_rollout_ref.ref, "
    assert any(line.startswith(profiler) for line in lines)  # every role's profiler section, one line
    assert "unmapped: critic.*='72 keys': grpo trains no critic" in err
    assert "~, the home folder" in err and "??? in veRL" in err


def test_verl_defaults_without_their_folder_say_so(tmp_path: Path, capsys, monkeypatch) -> None:
    lone = tmp_path / "ppo_trainer.yaml"
    shutil.copy(VERL / "config" / "ppo_trainer.yaml", lone)
    code, _, err = _run(
        capsys, "verl", str(lone), "actor_rollout_ref.model.path=m", "-o", str(tmp_path / "j.yaml")
    )
    assert "defaults name actor/dp_actor.yaml" in err and "not in its folder" in err
    assert code == 0 and "Traceback" not in err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(lone.read_bytes())))
    code, _, err = _run(capsys, "verl", "-", "actor_rollout_ref.model.path=m", "-o", str(tmp_path / "k.yaml"))
    assert "its config folder is not at hand (read from stdin)" in err and code == 0


@pytest.mark.parametrize("version", ["v0.7.0", "v0.6.1"])
def test_verl_fully_composed_release_configs_are_summarized(tmp_path: Path, capsys, version: str) -> None:
    spec, err = _convert(
        tmp_path,
        capsys,
        "verl",
        str(VERL / version / "_generated_ppo_trainer.yaml"),
        "actor_rollout_ref.model.path=m",
    )
    assert len(err.splitlines()) < 90, err
    assert spec["model"]["path"] == "m" and spec["algorithm"]["name"] == "ppo"


@pytest.mark.parametrize("version", ["head", "v0.6.1"])
def test_verl_run_script_variables_home_and_token_budget(tmp_path: Path, capsys, version: str) -> None:
    spec, err = _convert(tmp_path, capsys, "verl", str(VERL / version / "run_qwen2-7b_seq_balance.sh"))
    assert spec["data"]["train"] == "$HOME/data/gsm8k/train.parquet"
    assert "note: $HOME is not set in the script (data.train_files, data.val_files)" in err
    assert spec["training"]["microbatchTokens"] == 24000 and "microbatchSize" not in spec["training"]
    assert spec["roles"]["rollout"]["backend"] == "vllm" and "rollout.name sglang" in err  # $rollout_name
    assert "unmapped: data.return_raw_chat=True" in err  # $return_raw_chat expanded


def test_verl_math_script_lists_and_micro_batch_fit(tmp_path: Path, capsys) -> None:
    spec, err = _convert(tmp_path, capsys, "verl", str(VERL / "head" / "run_qwen2-7b_math.sh"))
    assert spec["data"]["train"] == "$HOME/data/gsm8k/train.parquet"
    assert "data.train takes one file" in err
    assert spec["training"]["minibatchSize"] % spec["training"]["microbatchSize"] == 0


def test_verl_environment_and_interpolations() -> None:
    config = {
        "data": {"train_files": "${oc.env:DATA_DIR}/train.parquet", "max_prompt_length": 300},
        "actor_rollout_ref": {
            "model": {"path": "m"},
            "rollout": {"n": 4, "prompt_length": "${data.max_prompt_length}", "x": "${oc.select:no.such,7}"},
        },
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"experiment_name": "${oc.create:foo}"},
    }
    result = convert("verl", yaml.safe_dump(config))
    why = {u.field: (u.value, u.why) for u in result.unmapped}
    assert why["data.train_files"] == (
        "${oc.env:DATA_DIR}",
        "read from the environment variable DATA_DIR; give the value",
    )
    assert "naming nothing here" in why["trainer.experiment_name"][1]
    assert why["actor_rollout_ref.rollout.prompt_length"][0] == 300  # resolved, then listed as unmapped
    assert why["actor_rollout_ref.rollout.x"][0] == 7


def test_verl_config_name_not_beside_the_script(capsys, tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo --config-path=config --config-name='ppo_trainer_dapo' \\\n"
        "  actor_rollout_ref.model.path=m algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4\n"
    )
    code, _, err = _run(capsys, "verl", str(script), "-o", str(tmp_path / "j.yaml"))
    assert code == 0 and "--config-name ppo_trainer_dapo (--config-path config), which is not beside" in err
    shutil.copytree(VERL / "config", tmp_path / "config")
    (tmp_path / "config" / "ppo_trainer_dapo.yaml").write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\ndata:\n  max_response_length: 2048\n"
    )
    code, _, err = _run(capsys, "verl", str(script), "-o", str(tmp_path / "j.yaml"))
    assert code == 0 and "composed config/ppo_trainer_dapo.yaml" in err, err
    assert yaml.safe_load((tmp_path / "j.yaml").read_text())["spec"]["data"]["maxNewTokens"] == 2048


def test_trl_current_fields_and_system_prompt(tmp_path: Path, capsys) -> None:
    spec, err = _convert(tmp_path, capsys, "trl", str(TRL / "1.16.0" / "grpo_config.yaml"))
    assert spec["data"]["systemPrompt"] == "Reason step by step, then put the final answer in \\boxed{}."
    assert spec["data"]["rewardType"] == "my_lib.rewards:accuracy"  # a dotted import path
    assert spec["model"]["dtype"] == "bfloat16" and spec["algorithm"]["entropyCoef"] == 0.001
    assert spec["algorithm"]["rolloutCorrection"] == {
        "enabled": True,
        "importanceSampling": "token",
        "cap": 3.0,
        "rejection": "token",
        "rejectHigh": 3.0,
        "rejectLow": 0.5,
    }
    assert spec["training"]["batchSize"] == 4 and spec["training"]["steps"] == 500  # 8 x 4 / 8 generations
    assert "no dverl equivalent known" not in err


def test_trl_release_command_line(tmp_path: Path, capsys) -> None:
    spec, err = _convert(tmp_path, capsys, "trl", str(TRL / "v1.9.0" / "grpo_vlm.sh"))
    assert spec["model"] == {
        "dtype": "bfloat16",
        "lora": {"targetModules": ["q_proj", "v_proj"]},
        "path": "Qwen/Qwen2.5-VL-3B-Instruct",
    }
    assert spec["data"]["maxNewTokens"] == 1024 and spec["roles"]["rollout"]["backend"] == "vllm"
    assert spec["algorithm"]["rolloutCorrection"]["rejection"] == "sequence"  # TRL's default sequence_mask
    assert "unmapped: vllm_mode='colocate'" in err


@pytest.mark.parametrize(
    ("source", "text", "expected"),
    [
        ("openrlhf", "python3 -m openrlhf.cli.train_ppo_ray --pretrain 'unclosed\n", "unclosed quote"),
        ("verl", 'python3 -m verl.trainer.main_ppo data.train_files="[a\n', "unclosed quote"),
        ("openrlhf", "train_ppo_ray --actor.num_nodes two", "cannot convert"),
        ("trl", "just words, no flags", "a GRPOConfig is a JSON or YAML mapping"),
    ],
)
def test_unreadable_sources_exit_2_without_a_traceback(
    tmp_path: Path, capsys, source, text, expected
) -> None:
    path = tmp_path / "in.sh"
    path.write_text(text)
    code, _, err = _run(capsys, source, str(path))
    assert code == 2 and expected in err and "Traceback" not in err


def test_json_keeps_every_unmapped_field(capsys) -> None:
    code, out, _ = _run(
        capsys,
        "verl",
        str(VERL / "v0.7.0" / "_generated_ppo_trainer.yaml"),
        "actor_rollout_ref.model.path=m",
        "--json",
    )
    assert code == 0
    assert len(json.loads(out)["unmapped"]) > 300


def test_verl_rollout_correction_and_keys_gone_from_veRL() -> None:
    base = ["actor_rollout_ref.model.path=m", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"]
    rc = "algorithm.rollout_correction"
    result = convert(
        "verl",
        "",
        [
            *base,
            f"{rc}.rollout_is=sequence",
            f"{rc}.rollout_is_threshold=3.0",
            f"{rc}.rollout_token_veto_threshold=1e-4",
        ],
    )
    assert result.manifest["spec"]["algorithm"]["rolloutCorrection"] == {
        "enabled": True,
        "importanceSampling": "sequence",
        "cap": 3.0,
    }
    why = {u.field: u.why for u in result.unmapped}
    assert why[f"{rc}.rollout_token_veto_threshold"] == "removed from veRL after v0.7.0"
    bypass = convert("verl", "", [*base, f"{rc}.bypass_mode=true"])
    assert bypass.manifest["spec"]["algorithm"]["rolloutCorrection"] == {"enabled": False}


def test_hydra_defaults_null_options_and_hydra_groups_are_skipped() -> None:
    files = {
        "main.yaml": "defaults:\n  - override hydra/job_logging: disabled\n  - extra: null\n"
        "  - part@a.b: one\n  - _self_\na:\n  b:\n    y: 2\n",
        "part/one.yaml": "defaults:\n  - base\nx: 1\ny: 1\n",
        "part/base.yaml": "z: 0\n",
    }
    composed = compose("main.yaml", files.get)
    assert composed.config == {"a": {"b": {"z": 0, "x": 1, "y": 2}}}
    assert composed.missing == [] and composed.read == ["main.yaml", "part/one.yaml", "part/base.yaml"]


def test_verl_script_with_arithmetic_multiline_strings_and_word_split(tmp_path: Path, capsys) -> None:
    """veRL's GSPO example builds its overrides in quoted multi-line variables (`ACTOR_CONFIG="..."`,
    appended to in an `if`), computes lengths with `$((1024 * 2))` and reads GPU counts from the
    environment."""
    spec, err = _convert(tmp_path, capsys, "verl", str(VERL / "head" / "run_qwen30b_gspo.sh"))
    assert spec["model"]["path"] == "$PWD/model/Qwen3-30B-A3B-Base"  # ${DATA_ROOT:-$PWD}, nested
    assert spec["data"]["maxPromptTokens"] == 2048 and spec["data"]["maxNewTokens"] == 8192
    assert spec["algorithm"]["policyLoss"] == "gspo" and spec["algorithm"]["samplesPerPrompt"] == 16
    assert spec["algorithm"]["overlong"] == {"enabled": True, "cacheLength": 4096, "penaltyFactor": 1.0}
    assert "dualClip" not in spec["algorithm"]
    assert "unmapped: trainer.n_gpus_per_node='$ARNOLD_WORKER_GPU': set from a variable the script" in err
    assert "note: $PWD is not set in the script" in err
    assert "--config-name ppo_trainer (--config-path ./config), which is not beside the script" in err


def test_verl_lora_example_learners_replicate(tmp_path: Path, capsys) -> None:
    spec, err = _convert(tmp_path, capsys, "verl", str(VERL / "head" / "run_qwen2_5-3b_gsm8k_grpo_lora.sh"))
    assert spec["model"]["lora"]["rank"] == 64 and spec["roles"]["learner"]["sharding"] == "ddp"
    assert "model.lora: the learners replicate the model (sharding ddp)" in err
    rollout, learner = spec["roles"]["rollout"], spec["roles"]["learner"]
    assert rollout["replicas"] * rollout["batchSize"] == learner["replicas"] * spec["training"]["batchSize"]


def test_verl_script_cut_short_by_a_comment_after_a_backslash(capsys, tmp_path: Path) -> None:
    code, _, err = _run(capsys, "verl", str(VERL / "head" / "run_deepseek7b_llm_pfppo.sh"))
    assert code == 2  # the shell runs no more of the command than this; neither does the converter
    assert "note: the command ends before `algorithm.pf_ppo.weight_pow=2.0" in err
    assert "invalid: spec.model" in err and "Traceback" not in err


def _grpo_config_fields() -> dict:
    """GRPOConfig's own fields and literal defaults, read from the installed TRL's source (importing trl
    and transformers would cost this fast lane half a minute)."""
    spec = importlib.util.find_spec("trl")
    assert spec is not None and spec.submodule_search_locations, "trl is installed with the benchmarks"
    source = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "grpo_config.py"
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOConfig")
    fields: dict = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        default = None
        if isinstance(node.value, ast.Call):
            for keyword in node.value.keywords:
                if keyword.arg == "default":
                    try:
                        default = ast.literal_eval(keyword.value)
                    except ValueError:
                        default = None
        fields[node.target.id] = default
    return fields


def test_trl_every_current_grpo_config_field_is_known() -> None:
    """Each field the pinned TRL's GRPOConfig (1.16.0, installed) declares, at its default, is mapped or
    left out with a reason: none is 'no equivalent known'."""
    fields = _grpo_config_fields()
    assert len(fields) > 60 and "vllm_importance_sampling_mode" in fields
    config = {**fields, "model_name_or_path": "m", "use_vllm": True}
    result = convert("trl", json.dumps({k: v for k, v in config.items() if v is not None}))
    assert [u.field for u in result.unmapped if "no dverl equivalent known" in u.why] == []


@pytest.mark.parametrize("era", ["head", "v0.10.1"])
def test_openrlhf_every_train_ppo_ray_flag_is_known(era: str) -> None:
    """Every flag train_ppo_ray declares (listed from its argparse calls at each version) is read: today's
    by name, the underscore era's through the dotted flag it became."""
    flags = (OPENRLHF / era / "train_ppo_ray_flags.txt").read_text().split()
    assert len(flags) > 140
    known = [
        f for f in flags if f in openrlhf_flags.KNOWN or openrlhf_flags.LEGACY.get(f) in openrlhf_flags.KNOWN
    ]
    assert known == flags
    line = "train_ppo_ray " + " ".join(f"--{f} 1" for f in flags)
    result = convert("openrlhf", line)
    assert [u.field for u in result.unmapped if u.why.startswith("not a train_ppo_ray flag")] == []


def test_a_file_that_is_not_text_exits_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(SystemExit) as exited:
        main(["convert", "verl", str(path)])
    assert exited.value.code == 2
    assert "not UTF-8 text" in capsys.readouterr().err


def test_shell_reader_expands_what_the_script_sets_and_keeps_the_rest() -> None:
    script = (
        "LEN=$((1024 * 2 + 1))\n"
        "HALF=$(( LEN / 2 ))\n"
        "UNKNOWN=$((NOPE * 2))\n"
        'MODEL=${MODEL:-"${ROOT}/models/q"}\n'
        'EXTRA="\n    a=1 \\\n    b=$LEN"\n'
        'ARGS=(\n   --x 1   # a comment\n   # --y 2\n   --z "two words"\n)\n'
        "python3 -m tool.main ${ARGS[@]} $EXTRA m=$MODEL h=$HALF u=$UNKNOWN\n"
    )
    command = script_command(script, "tool.main")
    assert command is not None
    assert command.words == [
        "tool.main", "--x", "1", "--z", "two words", "a=1", "b=2049", "m=${ROOT}/models/q", "h=1024",
        "u=$UNKNOWN",
    ]  # fmt: skip
    assert command.unresolved == ["ROOT", "UNKNOWN"]


def test_openrlhf_command_inside_bash_c_of_a_slurm_script(tmp_path: Path, capsys) -> None:
    spec, err = _convert(tmp_path, capsys, "openrlhf", str(OPENRLHF / "head" / "train_ppo_ray_slurm.sh"))
    assert spec["model"]["path"] == "OpenRLHF/Llama-3-8b-sft-mixture" and spec["algorithm"]["name"] == "ppo"
    assert "not a train_ppo_ray flag" not in err
    assert "JOBLOG" not in err  # a redirection's variable, not a setting
