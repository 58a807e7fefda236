#!/usr/bin/env python3
"""Write the example data sets under examples/data/ (deterministic: same seed, same bytes).

    python scripts/make_example_data.py [--out examples/data] [--seed 0]

What it writes and why:
  arithmetic/two_digit_*.jsonl          the 2-digit sums of the splits above (README's SmolLM2 example).
  arithmetic/train.jsonl, eval.jsonl   seed-004 math layout ({"messages": {...}, "gt_answer": "82"}).
      Mostly 2-digit addition (a one-shot SmolLM2-135M starts at ~11% per sample there: headroom
      for GRPO), plus a+b with 1..20 and a*b with 2..12 x 2..20. Train and eval share no problem,
      not even with the operands swapped.
  code/train.jsonl, eval.jsonl         seed-004 code layout: small stdin -> stdout problems, each with
      2-4 test cases whose outputs come from running the reference solutions below.
  toy/train.jsonl, eval.jsonl          the task a ~1M-parameter char-level model learns with GRPO in
      minutes on a CPU: "3+4=" -> "7", single-digit sums below 10 (55 problems, one-character
      answers). The toy has no held-out split on purpose: eval is the same 55 problems, because
      the point is to watch RL raise the reward, not to measure generalisation.
  toy/sft.json                         seed-001 SFT pairs "3+4=" -> "\\boxed{7}" to teach a random-init
      model the answer format before RL (`dverl train --stage sft`).
  sft/sft_train.json, sft_eval.json    seed-001 prompt/completion pairs from the arithmetic splits.
  sft/preference_train.json, preference_eval.json   prompt/chosen/rejected (rejected: a near miss).
  sft/prompts.json                     seed-001 prompt-only records with an "answer".
  guessing/train.jsonl, eval.jsonl     games of the multi-turn `guessing_game` environment (1..4): the
      hidden number is the record's answer (examples/tiny-multiturn.yaml).
  calculator/train.jsonl, eval.jsonl   2-digit products for the `calculator` tool environment.
  verifiers_guessing/train.jsonl, eval.jsonl   games of a verifiers taskset, each record naming its task
      (examples/verifiers-guessing.yaml).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the generators' module sits next to this file, also when loaded by path
    sys.path.insert(0, str(HERE))

from example_code_problems import code  # noqa: E402
from example_data_sets import (  # noqa: E402
    arithmetic,
    calculator,
    guessing,
    is_small_sum,
    is_two_digit_sum,
    sft_sets,
    toy,
    verifiers_guessing,
)


# ----------------------------------------------------------------------------------------- write
def write_jsonl(path: Path, items: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items), encoding="utf-8")


def write_json(path: Path, items: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def generate(out: Path, seed: int = 0) -> list[Path]:
    """Write every example file under `out`; returns the paths written."""
    written: list[Path] = []

    def jsonl(rel: str, items: list[dict]) -> None:
        write_jsonl(out / rel, items)
        written.append(out / rel)

    def js(rel: str, items: list[dict]) -> None:
        write_json(out / rel, items)
        written.append(out / rel)

    train, evals = arithmetic(random.Random(f"arithmetic:{seed}"))
    jsonl("arithmetic/train.jsonl", train)
    jsonl("arithmetic/eval.jsonl", evals)
    jsonl("arithmetic/small_train.jsonl", [x for x in train if is_small_sum(x)])
    jsonl("arithmetic/small_eval.jsonl", [x for x in evals if is_small_sum(x)])
    jsonl("arithmetic/two_digit_train.jsonl", [x for x in train if is_two_digit_sum(x)])
    jsonl("arithmetic/two_digit_eval.jsonl", [x for x in evals if is_two_digit_sum(x)])
    code_train, code_eval = code(random.Random(f"code:{seed}"))
    jsonl("code/train.jsonl", code_train)
    jsonl("code/eval.jsonl", code_eval)
    toy_train, toy_eval, toy_sft = toy()
    jsonl("toy/train.jsonl", toy_train)
    jsonl("toy/eval.jsonl", toy_eval)
    js("toy/sft.json", toy_sft)
    for name, items in sft_sets(train, evals, random.Random(f"sft:{seed}")).items():
        js(f"sft/{name}", items)
    games_train, games_eval = guessing(random.Random(f"guessing:{seed}"))
    jsonl("guessing/train.jsonl", games_train)
    jsonl("guessing/eval.jsonl", games_eval)
    calc_train, calc_eval = calculator(random.Random(f"calculator:{seed}"))
    jsonl("calculator/train.jsonl", calc_train)
    jsonl("calculator/eval.jsonl", calc_eval)
    vf_train, vf_eval = verifiers_guessing()
    jsonl("verifiers_guessing/train.jsonl", vf_train)
    jsonl("verifiers_guessing/eval.jsonl", vf_eval)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "examples" / "data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in generate(args.out, args.seed):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
