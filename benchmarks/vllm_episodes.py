"""Multi-turn episodes on the vLLM backend, checked token by token against the learner.

    .venv-vllm/bin/python benchmarks/vllm_episodes.py                      # SmolLM2-135M, calculator, fp32
    .venv-vllm/bin/python benchmarks/vllm_episodes.py --prompts 16 --samples 4 --json out.json
    .venv-vllm/bin/python benchmarks/vllm_episodes.py --model-path runs/x/checkpoints/checkpoint-6   # trained

Plays episodes of a manifest's environment (default: examples/smollm2-calculator-tools.yaml, its prompts,
few-shot demo, stop strings and turn limits) through a `RolloutWorker` on a vLLM engine, the path a
`backend: vllm` rollout worker takes, and records every request the engine got and every turn it gave
back. Then checks, per episode:

- continuation: each turn's context is exactly the prompt plus the episode's tokens so far (nothing
  re-tokenized), and each model run in the sample is exactly the tokens vLLM returned for that turn;
- the loss mask is 1 on exactly those tokens, 0 on the template's and environment's tokens in between;
- log-probs: vLLM's for the model's tokens against the learner's recomputation (`response_logprobs`, the
  function the trainer uses) on the whole episode, on mask-1 positions (max and mean |difference|);
- stop per turn: every turn that did not run out of tokens ended on a stop string or an end-of-turn token;
- the trusted side's rebuild (`volunteers.verify.episode_check`): each turn's text is what its tokens
  decode to, and replaying the environment on them gives back exactly the episode's tokens and mask.

It also reports the tool-use rate and mean reward of the episodes played. Needs the venv of
scripts/install-vllm.sh; runs one engine (eager, so it starts in ~30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--manifest", default=str(ROOT / "examples" / "smollm2-calculator-tools.yaml"))
    p.add_argument(
        "--model-path", default=None, help="play this model folder (e.g. a run's checkpoint) instead"
    )
    p.add_argument("--prompts", type=int, default=4, help="eval prompts to play")
    p.add_argument("--samples", type=int, default=4, help="episodes per prompt")
    p.add_argument("--temperature", type=float, default=None, help="default: the manifest's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the measurements here")
    return p.parse_args(argv)


class Recording:
    """Wraps a backend's generate: keeps every request's context and every output's tokens, per turn."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.calls: list[list[tuple[Any, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def generate(self, requests):
        outputs = list(self.backend.generate(requests))
        by_id = {r.prompt_id: r for r in requests}
        self.calls.append([(by_id[o.prompt_id], o) for o in outputs])
        return iter(outputs)


def model_runs(mask: tuple[int, ...]) -> list[tuple[int, int]]:
    """(start, end) of each run of mask-1 positions."""
    runs: list[tuple[int, int]] = []
    for i, m in enumerate(mask):
        if m and runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        elif m:
            runs.append((i, i + 1))
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    from decentralized_verl.backends.factory import make_backend
    from decentralized_verl.core.forward import response_logprobs
    from decentralized_verl.core.samples import collate
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.orchestration.prompts import prepare_prompts
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.spec.catalogue.backends import VLLM
    from decentralized_verl.spec.manifest import load_job
    from decentralized_verl.volunteers.verify import episode_check

    torch.manual_seed(args.seed)
    manifest = Path(args.manifest)
    job = load_job(manifest)
    spec = job.spec
    model_spec = spec.model
    if args.model_path:
        model_spec = model_spec.model_copy(
            update={"path": args.model_path, "package": None, "gguf_file": None}
        )
    model, tokenizer = load_model_and_tokenizer(model_spec)
    model = model.float().eval()
    data = spec.data
    prompts = prepare_prompts(spec, tokenizer, data.eval or data.train, manifest.parent, limit=args.prompts)
    temperature = data.temperature if args.temperature is None else args.temperature
    sampling = SamplingParams(
        max_new_tokens=data.max_new_tokens, temperature=temperature, stop=tuple(data.stop), seed=args.seed
    )
    began = time.perf_counter()
    backend = make_backend(VLLM, model, tokenizer, seed=args.seed, eager=True)
    started = time.perf_counter() - began
    try:
        recording = Recording(backend)
        worker = RolloutWorker(recording, "check", environment=data.environment)
        items = [(p, k) for p in prompts for k in range(args.samples)]
        began = time.perf_counter()
        samples = list(worker.generate_sync(items, sampling, 0))
        played = time.perf_counter() - began
        eos = backend.eos_token_ids
    finally:
        backend.close()

    rebuild = episode_check(spec, tokenizer, model)
    turns_of: dict[int, list[tuple[Any, Any]]] = {}
    for call in recording.calls:
        for request, out in call:
            turns_of.setdefault(int(request.prompt_id), []).append((request, out))
    by_key = {(p.prompt_id, k): i for i, (p, k) in enumerate(items)}
    problems: list[str] = []
    ended = {"stop_string": 0, "end_of_turn": 0, "length": 0, "other": 0}
    for sample in samples:
        index = by_key[sample.key]
        turns = turns_of[index]
        runs = model_runs(sample.loss_mask)
        if len(runs) != len(turns) or len(sample.turns) != len(turns):
            problems.append(f"{sample.key}: {len(turns)} engine turns, {len(runs)} mask runs")
            continue
        for t, ((request, out), (start, end)) in enumerate(zip(turns, runs, strict=True)):
            context = (*sample.prompt.token_ids, *sample.response_ids[:start])
            if tuple(request.prompt_token_ids) != context:
                problems.append(f"{sample.key} turn {t}: context is not the prompt + the tokens so far")
            if sample.response_ids[start:end] != tuple(out.response_token_ids):
                problems.append(f"{sample.key} turn {t}: model tokens differ from the engine's")
            if sample.logprobs[start:end] != tuple(out.logprobs):
                problems.append(f"{sample.key} turn {t}: log-probs differ from the engine's")
            if sample.turns[t] != out.text:
                problems.append(f"{sample.key} turn {t}: turn text differs from the engine's")
            if out.finish_reason == "length":
                ended["length"] += 1
            elif any(out.text.endswith(s) for s in sampling.stop):
                ended["stop_string"] += 1
            elif out.response_token_ids and out.response_token_ids[-1] in eos:
                ended["end_of_turn"] += 1
            else:
                ended["other"] += 1
                problems.append(f"{sample.key} turn {t}: ended 'stop' on neither a stop string nor EOS")
        if any(lp != 0.0 for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if not m):
            problems.append(f"{sample.key}: an environment token carries a log-prob")
        rebuilt = rebuild(sample)  # what the trusted side makes of the episode's model tokens
        if rebuilt is not None:
            problems.append(f"{sample.key}: rebuilt from its tokens: {rebuilt}")

    batch = collate(samples, tokenizer.pad_token_id)
    trained = batch.trained_mask()
    with torch.no_grad():
        learner = response_logprobs(model, batch, temperature if temperature > 0 else 1.0)[0]
    diff = (learner - batch.old_logprobs).abs()[trained.bool()]
    tool_use = statistics.fmean(1.0 if s.extra["tool_calls"] > 0 else 0.0 for s in samples)
    report = {
        "manifest": str(manifest.relative_to(ROOT) if manifest.is_relative_to(ROOT) else manifest),
        "model": args.model_path or spec.model.package or "tiny",
        "dtype": str(next(model.parameters()).dtype),
        "episodes": len(samples),
        "temperature": temperature,
        "model_tokens": int(trained.sum()),
        "environment_tokens": int((batch.response_mask - trained).sum()),
        "turns_mean": statistics.fmean(len(s.turns) for s in samples),
        "multi_turn_episodes": sum(len(s.turns) > 1 for s in samples),
        "turn_ends": ended,
        "logprob_abs_diff_max": float(diff.max()),
        "logprob_abs_diff_mean": float(diff.mean()),
        "tool_use_rate": tool_use,
        "reward_mean": statistics.fmean(s.extra["episode_reward"] for s in samples),
        "end_reasons": {r: sum(s.end_reason == r for s in samples) for r in {s.end_reason for s in samples}},
        "engine_start_s": round(started, 1),
        "play_s": round(played, 1),
        "problems": problems,
        "longest_episode_turns": list(max(samples, key=lambda s: len(s.turns)).turns),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if problems:
        sys.exit(f"{len(problems)} problems, first: {problems[0]}")
    return report


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    main()
