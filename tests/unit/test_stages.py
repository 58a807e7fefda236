"""`dverl train` stages on the tiny model: SFT learns, the reward model separates, outputs chain."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml
from transformers import AutoModelForSequenceClassification

from decentralized_verl.errors import DataError, DverlError, ManifestError, ModelError
from decentralized_verl.stages import runner
from decentralized_verl.stages.batching import encode_completion
from decentralized_verl.stages.reward import bradley_terry_loss, score_texts
from decentralized_verl.stages.runner import run_stage
from decentralized_verl.training.checkpoints.folders import latest_checkpoint, load_checkpoint

torch.set_num_threads(1)

TINY = {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}}
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "honey",
    "lemon",
    "piano",
    "candle",
    "forest",
    "ocean",
    "pepper",
    "violet",
    "garden",
    "rocket",
]


def write_json(path, records):
    path.write_text(json.dumps(records))
    return path.name


def write_config(tmp_path, **sections) -> str:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({"model": TINY, **sections}))
    return str(path)


def sft_section(tmp_path, **overrides):
    train = [{"prompt": f"Say {w}", "completion": f"{w[::-1]}!"} for w in WORDS[:8]]
    section = {
        "trainFile": write_json(tmp_path / "sft.json", train),
        "evalFile": write_json(tmp_path / "sft_eval.json", train[:2]),
        "format": "chat",
        "epochs": 100,
        "batchSize": 8,
        "learningRate": 0.01,
        "maxLength": 64,
        "outputDir": "out/sft",
    }
    return {**section, **overrides}


def preference_pairs(words, good="yes", bad="no"):
    """Trivially separable: the chosen answer ends in `good`, the rejected one in `bad`."""
    rng = random.Random(0)
    return [
        {
            "prompt": f"Is {w} fine?",
            "chosen": f"{rng.choice(WORDS)} {good}",
            "rejected": f"{rng.choice(WORDS)} {bad}",
        }
        for w in words
    ]


def reward_section(tmp_path, good="yes", bad="no", **overrides):
    section = {
        "trainFile": write_json(tmp_path / "pref.json", preference_pairs(WORDS[:10], good, bad)),
        "evalFile": write_json(tmp_path / "pref_eval.json", preference_pairs(WORDS[10:], good, bad)),
        "format": "plain",
        "epochs": 15,
        "batchSize": 5,
        "learningRate": 0.003,
        "maxLength": 64,
        "outputDir": "out/rm",
    }
    return {**section, **overrides}


def test_sft_then_reward_chain_through_checkpoints(tmp_path):
    config = write_config(tmp_path, sft=sft_section(tmp_path), reward=reward_section(tmp_path))

    sft = run_stage("sft", config)
    assert sft.metrics["steps"] == 100
    assert sft.metrics["train_loss_after"] < 0.3 * sft.metrics["train_loss_before"]
    assert sft.metrics["eval_loss_after"] < sft.metrics["eval_loss_before"]
    assert sft.checkpoint == tmp_path / "out/sft/checkpoint-100" == latest_checkpoint(tmp_path / "out/sft")
    lines = [json.loads(line) for line in (tmp_path / "out/sft/metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, *range(1, 101), 100]
    assert lines[1]["loss"] > lines[100]["loss"] and all(line["stage"] == "sft" for line in lines)

    policy = load_checkpoint(sft.checkpoint)  # the saved model really learned: greedy decoding recites
    tok = policy.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Say apple"}], add_generation_prompt=True, tokenize=False
    )
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = policy.model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True) == "elppa!"

    reward = run_stage("reward", config)
    assert reward.metrics["eval_accuracy_before"] <= 0.5  # the new head starts out wrong here ...
    assert reward.metrics["eval_accuracy_after"] >= 0.9  # ... and learns the preference
    assert reward.metrics["last_loss"] < reward.metrics["first_loss"]
    saved = json.loads((reward.checkpoint / "trainer_state.json").read_text())
    assert saved["init_from"] == str(sft.checkpoint)  # `auto` picked up the SFT output

    rm = AutoModelForSequenceClassification.from_pretrained(reward.checkpoint).eval()
    assert rm.config.num_labels == 1 and rm.config.pad_token_id == tok.pad_token_id
    scores = score_texts(rm, tok, ["Is pear fine?", "Is pear fine?"], ["lime yes", "lime no"], "plain", 64)
    assert scores[0] > scores[1]


def test_all_runs_every_configured_stage_and_reward_can_start_from_base(tmp_path):
    config = write_config(
        tmp_path,
        sft=sft_section(tmp_path, epochs=1, maxSteps=1),
        # the seeded random head happens to prefer "yes" already, so here "no" is the chosen answer
        reward=reward_section(tmp_path, good="no", bad="yes", initFrom="base"),
    )
    result = run_stage("all", config)
    assert [r.stage for r in result.stages] == ["sft", "reward"]
    assert result.checkpoint == result.stages[1].checkpoint
    assert result.metrics["reward"]["eval_accuracy_before"] <= 0.5
    assert result.metrics["reward"]["eval_accuracy_after"] >= 0.9
    state = json.loads((result.checkpoint / "trainer_state.json").read_text())
    assert state["init_from"] == "base"


def test_reward_init_from_sft_needs_a_checkpoint(tmp_path):
    config = write_config(
        tmp_path, sft=sft_section(tmp_path), reward=reward_section(tmp_path, initFrom="sft")
    )
    with pytest.raises(ModelError, match=r"reward\.initFrom: 'sft' but sft\.outputDir .* no checkpoint"):
        run_stage("reward", config)


def test_rlhf_stage_hands_the_job_to_the_runtime(tmp_path, monkeypatch):
    config = write_config(tmp_path, rlhf={"job": "job.yaml"})
    seen = []
    monkeypatch.setattr(runner, "run_job", lambda path: seen.append(path) or "ok")
    result = run_stage("rlhf", config)
    assert seen == [tmp_path / "job.yaml"] and result.metrics["result"] == "ok"


@pytest.mark.parametrize(
    ("sections", "stage", "pattern"),
    [
        ({"sft": {"trainFile": "a.json", "outputDir": "o", "learningRat": 1}}, "sft", r"sft\.learningRat"),
        ({"sft": {"trainFile": "a.json", "outputDir": "o", "batchSize": 0}}, "sft", r"sft\.batchSize"),
        ({"sft": {"trainFile": "a.json"}}, "sft", r"sft\.outputDir"),
        ({"sft": {"trainFile": "a.json", "outputDir": "o", "format": "xml"}}, "sft", r"sft\.format"),
        (
            {"reward": {"trainFile": "a.json", "outputDir": "o", "initFrom": "sft"}},
            "reward",
            r"reward\.initFrom",
        ),
        ({"reward": {"trainFile": "a.json", "outputDir": "o"}}, "sft", r"sft: section required"),
        ({"rlhf": {}}, "rlhf", r"rlhf\.job"),
    ],
)
def test_bad_config_names_the_field(tmp_path, sections, stage, pattern):
    with pytest.raises(ManifestError, match=pattern):
        run_stage(stage, write_config(tmp_path, **sections))


def test_bad_model_stage_and_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {}, "sft": {"trainFile": "a", "outputDir": "o"}}))
    with pytest.raises(ManifestError, match="model"):
        run_stage("sft", path)
    with pytest.raises(DverlError, match="--stage: must be one of"):
        run_stage("ppo", path)
    with pytest.raises(ManifestError, match="no such file"):
        run_stage("sft", tmp_path / "absent.yaml")


def test_bad_data_names_file_record_and_field(tmp_path):
    (tmp_path / "sft.jsonl").write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n')
    config = write_config(tmp_path, sft=sft_section(tmp_path, trainFile="sft.jsonl"))
    with pytest.raises(DataError, match=r"sft\.jsonl:2: completion: missing"):
        run_stage("sft", config)
    (tmp_path / "pref.json").write_text('[{"prompt": "a", "chosen": "b", "rejected": 3}]')
    config = write_config(tmp_path, reward=reward_section(tmp_path, trainFile="pref.json"))
    # reward_section rewrote pref.json; break it again after the config is written
    (tmp_path / "pref.json").write_text('[{"prompt": "a", "chosen": "b", "rejected": 3}]')
    with pytest.raises(DataError, match=r"pref\.json:\[0\]: rejected: expected a string"):
        run_stage("reward", config)


def test_prompt_tokens_carry_no_loss_and_truncation_keeps_the_answer():
    from decentralized_verl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    ids, mask = encode_completion(tok, "ab", "xyz", "plain", 64)
    assert tok.decode(ids) == "abxyz</s>" and mask == [0, 0, 1, 1, 1, 1]
    ids, mask = encode_completion(tok, "0123456789", "abcdefghij", "plain", 8)
    assert tok.decode(ids) == "6789abcd" and mask == [0, 0, 0, 0, 1, 1, 1, 1]  # completion keeps half
    assert float(bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0]))) == pytest.approx(
        0.126928, abs=1e-6
    )


def test_completion_loss_matches_hf_loss_with_prompt_labels_ignored():
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.stages.batching import pad, pad_values
    from decentralized_verl.stages.sft import completion_loss

    spec = ModelSpec.model_validate({"tiny": TINY["tiny"]})
    model, tok = load_model_and_tokenizer(spec, padding_side="right")
    pairs = [("Say hi", "ih!"), ("Count", "1 2 3 4 5")]
    examples = [encode_completion(tok, p, c, "chat", 64) for p, c in pairs]
    ids, attention = pad([e[0] for e in examples], tok.pad_token_id)
    labels = torch.where(pad_values([e[1] for e in examples]).bool(), ids, torch.full_like(ids, -100))
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        ours = completion_loss(model, examples, tok.pad_token_id)
    assert float(ours) == pytest.approx(float(reference), rel=1e-5)


def test_sft_with_lora_saves_a_plain_model_the_reward_stage_loads(tmp_path):
    lora = {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]}
    path = tmp_path / "train.yaml"
    sections = {
        "sft": sft_section(tmp_path, epochs=4, saveEvery=2),
        "reward": reward_section(tmp_path, epochs=1),
    }
    path.write_text(yaml.safe_dump({"model": {**TINY, "lora": lora}, **sections}))
    sft = run_stage("sft", path)
    assert sft.metrics["train_loss_after"] < sft.metrics["train_loss_before"]
    middle = tmp_path / "out/sft/checkpoint-2"
    assert (middle / "adapter").is_dir() and (middle / "optimizer.pt").is_file()  # resumable on adapters
    assert not (sft.checkpoint / "adapter").exists()  # the stage output is merged: a plain HF model
    reward = run_stage("reward", path)
    state = json.loads((reward.checkpoint / "trainer_state.json").read_text())
    assert state["init_from"] == str(sft.checkpoint)
    assert AutoModelForSequenceClassification.from_pretrained(reward.checkpoint).config.num_labels == 1
