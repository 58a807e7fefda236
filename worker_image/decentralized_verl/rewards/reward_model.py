"""The `reward_model` reward: a sequence-classification model (num_labels=1) scores (prompt, completion).

torch and transformers are imported only when a scorer is built, so the rewards package stays importable
by the torch-free operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from decentralized_verl.rewards.result import RewardResult, zero


class RewardModelScorer:
    """Scores (prompt, completion) pairs in batches with a model whose head outputs one logit.

    `model` is a path to a Hugging Face checkpoint (loaded with AutoModelForSequenceClassification and
    AutoTokenizer) or a loaded model, then `tokenizer` is required. The text scored is the tokenizer's
    chat template over [user: prompt, assistant: completion] when `use_chat_template` and the tokenizer
    has one, else `prompt + completion`. Sequences longer than `max_length` keep their end (the
    completion) because the score is read at the last token.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        batch_size: int = 8,
        max_length: int = 2048,
        device: Any = None,
        use_chat_template: bool = True,
    ) -> None:
        import torch  # noqa: F401, PLC0415 light: torch (checked here, not mid-training); `rewards` loads none

        if isinstance(model, str | Path):
            from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: PLC0415 light: transformers, for a model given by its folder

            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
            model = AutoModelForSequenceClassification.from_pretrained(str(model), num_labels=1)
        if tokenizer is None:
            raise ValueError("RewardModelScorer: a tokenizer is required when a model object is given")
        if getattr(model.config, "num_labels", 1) != 1:
            got = model.config.num_labels
            raise ValueError(f"RewardModelScorer: model must have num_labels=1 (got {got})")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        # A model given as an object stays on the device it was loaded on (its worker's); a folder's model
        # goes where `device` says, else stays where transformers put it.
        device = device if device is not None else next(model.parameters()).device
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.use_chat_template = use_chat_template and bool(getattr(tokenizer, "chat_template", None))

    def text(self, prompt: str, completion: str) -> str:
        """The string the model reads for one pair."""
        if self.use_chat_template:
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return prompt + completion

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """One float per pair, computed `batch_size` pairs at a time."""
        import torch  # noqa: PLC0415 light: torch; `decentralized_verl.rewards` exports this class and loads no torch

        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        texts = [self.text(p, c) for p, c in zip(prompts, completions, strict=True)]
        scores: list[float] = []
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "left"
        try:
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[start : start + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                ).to(self.device)
                with torch.no_grad():
                    logits = self.model(
                        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                    ).logits
                scores.extend(float(v) for v in logits[:, 0].float().cpu())
        finally:
            self.tokenizer.truncation_side = side
        return scores


def reward_model_reward(
    completion: str, reference: Any, *, prompt: str | None = None, scorer: Any = None, **_: Any
) -> RewardResult:
    """Score one completion with `scorer` (a RewardModelScorer); the reference is not used."""
    batch = reward_model_batch([completion], [reference], prompts=[prompt], scorer=scorer)
    return batch[0]


def reward_model_batch(
    completions: Sequence[Any],
    references: Sequence[Any],
    *,
    prompts: Sequence[str | None] | None = None,
    scorer: Any = None,
    **_: Any,
) -> list[RewardResult]:
    """Score a batch in one pass through `scorer`; a pair with a missing prompt/completion scores 0."""
    if scorer is None:
        return [zero("reward_model needs a scorer (RewardModelScorer) option")] * len(completions)
    prompts = list(prompts) if prompts is not None else [None] * len(completions)
    results: list[RewardResult | None] = [None] * len(completions)
    todo = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if not isinstance(c, str):
            results[i] = zero(f"completion is {type(c).__name__}, not text")
        elif not isinstance(p, str):
            results[i] = zero("reward_model needs the prompt")
        else:
            todo.append(i)
    if todo:
        try:
            values = scorer.score([prompts[i] for i in todo], [completions[i] for i in todo])
        except Exception as exc:
            reason = f"reward model failed: {type(exc).__name__}: {exc}"[:300]
            return [r if r is not None else zero(reason) for r in results]
        for i, value in zip(todo, values, strict=True):
            results[i] = RewardResult(float(value), "reward model score")
    return [r for r in results if r is not None]
