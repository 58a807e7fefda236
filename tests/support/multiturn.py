"""The guessing game played by a tiny policy through a rollout worker, for the multi-turn rollout tests."""

from __future__ import annotations

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.core.samples import Prompt
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.data.prompts import render_prompt
from decentralized_verl.environments.settings import EpisodeSettings
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.spec import TinyModelSpec
from decentralized_verl.spec.catalogue.backends import HF

TINY = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=256)

GAME = EpisodeSettings("guessing_game", {"maxNumber": 9}, max_turns=3)

SAMPLING = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)


def prompts(tokenizer, n=2):
    out = []
    for i in range(n):
        text = render_prompt(f"Guess my number ({i})", tokenizer)
        out.append(
            Prompt(f"p{i}", i, tuple(tokenizer(text, add_special_tokens=False)["input_ids"]), text, "5")
        )
    return out


def play(model, tokenizer, items, settings=GAME, sampling=SAMPLING, batch=8):
    worker = RolloutWorker(
        make_backend(HF, model, tokenizer, max_batch_size=batch), "w", environment=settings
    )
    return {s.key: s for s in worker.generate_sync(items, sampling, 0)}
