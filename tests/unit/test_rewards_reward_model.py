"""RewardModelScorer on a tiny random LlamaForSequenceClassification saved with an offline tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from decentralized_verl.rewards import RewardModelScorer, score, score_batch

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +=?.,!"


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.LlamaForSequenceClassification(config)
    path = tmp_path_factory.mktemp("rm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


PROMPTS = ["what is 2+2?", "say hi", "count to 3, please"]
COMPLETIONS = ["4", "hi there!", "1 2 3"]


def reference_scores(path: Path) -> list[float]:
    """Slow path: each pair alone, no padding, the logit read at the last token by hand."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    for prompt, completion in zip(PROMPTS, COMPLETIONS, strict=True):
        ids = torch.tensor([tokenizer(prompt + completion)["input_ids"]])
        with torch.no_grad():
            hidden = model.model(input_ids=ids).last_hidden_state
            out.append(float(model.score(hidden[0, -1])))
    return out


def test_batched_scores_match_one_by_one(saved_model: Path) -> None:
    scorer = RewardModelScorer(saved_model, batch_size=2)
    batched = scorer.score(PROMPTS, COMPLETIONS)
    assert batched == pytest.approx(reference_scores(saved_model), abs=1e-5)
    # different completions get different scores (the model reads the text)
    assert len({round(s, 6) for s in batched}) == len(batched)


def test_model_object_and_score_api(saved_model: Path) -> None:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(saved_model)
    scorer = RewardModelScorer(model, build_tokenizer(), batch_size=8)
    expected = reference_scores(saved_model)
    one = score("reward_model", COMPLETIONS[0], None, prompt=PROMPTS[0], scorer=scorer)
    assert one.score == pytest.approx(expected[0], abs=1e-5)
    many = score_batch("reward_model", COMPLETIONS, [None] * 3, prompts=PROMPTS, scorer=scorer)
    assert [r.score for r in many] == pytest.approx(expected, abs=1e-5)


def test_long_inputs_keep_their_end(saved_model: Path) -> None:
    scorer = RewardModelScorer(saved_model, max_length=16)
    long_prompt = "x" * 100
    assert scorer.score([long_prompt], ["abc"]) == pytest.approx(scorer.score(["x" * 13], ["abc"]), abs=1e-5)


def test_bad_inputs_score_zero(saved_model: Path) -> None:
    scorer = RewardModelScorer(saved_model)
    prompts = ["p", "p", None]
    results = score_batch("reward_model", ["ok", None, "ok"], [None] * 3, prompts=prompts, scorer=scorer)
    assert results[0].reason == "reward model score"
    assert (results[1].score, results[2].score) == (0.0, 0.0)
    assert "needs the prompt" in results[2].reason
    assert "needs a scorer" in score("reward_model", "x", None, prompt="p").reason


def test_failing_scorer_scores_zero() -> None:
    class Broken:
        def score(self, prompts, completions):
            raise RuntimeError("CUDA out of memory")

    result = score("reward_model", "x", None, prompt="p", scorer=Broken())
    assert result.score == 0.0 and "CUDA out of memory" in result.reason


def test_wrong_head_is_rejected(tmp_path: Path) -> None:
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_labels=3,
    )  # fmt: skip
    with pytest.raises(ValueError, match="num_labels=1"):
        RewardModelScorer(transformers.LlamaForSequenceClassification(config), build_tokenizer())
