"""Two CPU effects behind the GRPO step's speed, measured alone.

    python benchmarks/cpu_kernels.py                 # SmolLM2's attention shapes, bf16 and fp32; OpenMP teams
    python benchmarks/cpu_kernels.py --tiny          # smoke sizes (the test suite)

1. Attention at RL shapes (`models/grouped_attention.py`): transformers' SDPA path (a padding mask makes it
   widen the key/value heads with `repeat_kv`, except for one-query decode steps, where it packs the query
   groups) against the grouped attention, forward + backward for the learner's shapes and forward for a
   decode step; 9 query heads over 3 key/value heads of 64, as SmolLM2.
2. One OpenMP team or two (`compute_thread.py`): a decode-like loop of small matmuls and elementwise ops on
   a worker thread, first while it is the only thread that ever computed, then after the main thread has
   computed too.

Prints one JSON object on stdout and a table on stderr; medians of `--repeats`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import _common as c


def timed(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - began)
    return c.median(runs)


def attention_cases(tiny: bool) -> list[tuple[str, int, int, int, bool]]:
    """(name, rows, queries, keys, backward)."""
    if tiny:
        return [("learner response pass", 2, 4, 8, True), ("decode step", 4, 1, 8, False)]
    return [
        ("learner response pass", 16, 31, 106, True),
        ("learner prompt pass", 2, 75, 75, True),
        ("decode step", 64, 1, 100, False),
    ]


def attention(tiny: bool, repeats: int) -> list[dict[str, Any]]:
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import eager_mask, sdpa_mask

    from decentralized_verl.models.grouped_attention import grouped_attention

    class Module(torch.nn.Module):
        is_causal = True
        num_key_value_groups = 3

    module, rows_out = Module(), []

    def run(fn: Callable[..., Any], mask: Any, qkv: tuple[Any, Any, Any], backward: bool) -> None:
        if backward:
            out, _ = fn(module, *qkv, mask, scaling=0.125)
            out.float().sum().backward()
        else:
            with torch.no_grad():
                fn(module, *qkv, mask, scaling=0.125)

    for dtype in (torch.bfloat16, torch.float32):
        for name, rows, queries, keys, backward in attention_cases(tiny):
            g = torch.Generator().manual_seed(0)
            q = torch.randn(rows, 9, queries, 64, generator=g).to(dtype).requires_grad_(backward)
            k = torch.randn(rows, 3, keys, 64, generator=g).to(dtype).requires_grad_(backward)
            v = torch.randn(rows, 3, keys, 64, generator=g).to(dtype).requires_grad_(backward)
            padding = torch.ones(rows, keys, dtype=torch.bool)
            padding[0, : keys // 4] = False  # one left-padded row: a mask is needed
            shape = {"batch_size": rows, "q_length": queries, "kv_length": keys, "q_offset": keys - queries}
            masks = {
                "sdpa": sdpa_mask(**shape, attention_mask=padding, allow_is_causal_skip=False),
                "grouped": eager_mask(**shape, attention_mask=padding, dtype=dtype),
            }
            functions = {"sdpa": sdpa_attention_forward, "grouped": grouped_attention}
            seconds = {
                kind: timed(
                    lambda fn=fn, mask=masks[kind], qkv=(q, k, v), b=backward: run(fn, mask, qkv, b), repeats
                )
                for kind, fn in functions.items()
            }
            rows_out.append(
                {
                    "case": name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "shape": f"{rows} rows x {queries} queries x {keys} keys",
                    "pass": "forward + backward" if backward else "forward",
                    "sdpa_ms": seconds["sdpa"] * 1e3,
                    "grouped_ms": seconds["grouped"] * 1e3,
                    "speedup": seconds["sdpa"] / seconds["grouped"],
                }
            )
    return rows_out


def openmp_teams(tiny: bool, repeats: int) -> dict[str, float]:
    """Seconds of the same loop on a worker thread: alone, then after the main thread computed too."""
    import torch

    x, w = torch.randn(64, 576), torch.randn(576, 576)
    iterations = 50 if tiny else 1500

    def loop() -> None:
        for _ in range(iterations):
            torch.nn.functional.silu(x @ w * 2 + 1)

    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    alone = pool.submit(timed, loop, repeats).result()
    timed(loop, 1)  # the main thread computes: its OpenMP team now exists too
    shared = pool.submit(timed, loop, repeats).result()
    pool.shutdown()
    return {"one_team_s": alone, "two_teams_s": shared, "slowdown": shared / alone}


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--tiny", action="store_true", help="smoke sizes")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: must be >= 1 (got {args.repeats})")
    threads = c.set_threads(args.threads)
    teams = openmp_teams(args.tiny, max(1, args.repeats // 10))  # first: before the main thread computes
    cases = attention(args.tiny, args.repeats)
    table = c.markdown_table(
        ["case", "dtype", "shape", "pass", "SDPA ms", "grouped ms", "speedup"],
        [
            [r["case"], r["dtype"], r["shape"], r["pass"], f"{r['sdpa_ms']:.2f}", f"{r['grouped_ms']:.2f}",
             f"{r['speedup']:.2f}x"]
            for r in cases
        ],
    )  # fmt: skip
    print(table, file=sys.stderr)
    print(
        f"decode-like loop on a worker thread: {teams['one_team_s']:.3f} s with one OpenMP team, "
        f"{teams['two_teams_s']:.3f} s with two ({teams['slowdown']:.2f}x)",
        file=sys.stderr,
    )
    report = {"machine": c.machine_info(threads), "attention": cases, "openmp_teams": teams}
    report["markdown"] = table
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
