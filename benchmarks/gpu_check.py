"""The GPU check: correctness of the fast paths on CUDA, a job end to end, and the GRPO step beside TRL.

    python benchmarks/gpu_check.py --device cuda --out gpu-check            # on the GPU machine
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/dry-run   # the dry run (in the suite)
    python benchmarks/gpu_check.py --device cuda --parts matmul_peak,learner_alone --out again

Each part runs in its own process with its own time budget (a hung CUDA kernel or a deadlocked collective
costs that part, not the run): the process is killed with its whole group when its budget is spent.
Everything goes to the output folder: `parts/<name>.json` per part, `summary.json` for the run, and
`gpu_check.log` with every part's output. Plain progress lines go to stdout. Exit status: 0 when every
correctness and job part passed, 1 when one failed, errored or ran out of time, 2 for bad arguments.

The parts (see `_gpu_correctness`, `_gpu_job`, `_gpu_perf`):
  correctness  shared_prompt_forward, grouped_attention, chunked_logprobs, fsdp2_checkpoint, weight_refresh,
               qlora (a 4-bit base: adapters train, reference with adapters off, adapters-only refresh;
               on CUDA with vLLM installed, vLLM serving the dequantized base with the adapters per version),
               gpu_tests (the suite's tests marked `gpu`, skipped on the CPU CI)
  job          tiny_job (learner, rollout, reward processes over gRPC), smollm2_job (SmolLM2-shaped),
               every_role_job (learner, HF rollout, reference, critic and reward-model workers, each proving
               it holds memory on its GPU), one_gpu_colocated (`dverl run`'s one-GPU layout)
  speed        matmul_peak, grpo_side_by_side (ours vs TRL, Qwen2.5-0.5B shape), learner_alone (1.5B shape)
What travels to a GPU machine: `scripts/prepare-gpu-check.sh` (wheels in benchmarks/gpu_wheels.txt and
SmolLM2's tokenizer, no model weights).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Part:
    name: str
    group: str
    budget_s: float
    """Seconds on a GPU; the CPU dry run scales every budget (`--budget-scale`)."""


PARTS = (
    Part("matmul_peak", "speed", 30),
    Part("shared_prompt_forward", "correctness", 60),
    Part("grouped_attention", "correctness", 30),
    Part("chunked_logprobs", "correctness", 30),
    Part("fsdp2_checkpoint", "correctness", 60),
    Part("weight_refresh", "correctness", 30),
    Part("gpu_tests", "correctness", 120),
    Part("qlora", "correctness", 90),
    Part("tiny_job", "job", 150),
    Part("smollm2_job", "job", 90),
    Part("every_role_job", "job", 150),
    Part("one_gpu_colocated", "job", 120),
    Part("grpo_side_by_side", "speed", 240),
    Part("learner_alone", "speed", 60),
)
BY_NAME = {part.name: part for part in PARTS}
GATING = ("correctness", "job")
"""Groups whose failure fails the check; speed parts report numbers (a crash there still shows)."""


def part_function(name: str) -> Any:
    sys.path.insert(0, str(HERE))
    import _gpu_correctness
    import _gpu_job
    import _gpu_perf

    for module in (_gpu_correctness, _gpu_job, _gpu_perf):
        if name in module.PARTS:
            return module.PARTS[name]
    raise KeyError(name)


def run_part(args: argparse.Namespace) -> int:
    """Inside the part's own process: run it, write parts/<name>.json whatever happens."""
    from decentralized_verl.runtime.cpus import configure_from_environment
    from decentralized_verl.settings import WorkerSettings

    configure_from_environment(WorkerSettings.from_env())
    out_dir = Path(args.out)
    target = out_dir / "parts" / f"{args.part}.json"
    began = time.perf_counter()
    try:
        result = part_function(args.part)(
            args.device, args.tiny, assets=args.assets, out_dir=out_dir, budget_s=args.budget_s
        )
        status = "passed" if result.get("passed") else "failed"
    except Exception as exc:  # the report must say what broke, with its traceback
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        status = "error"
        print(result["traceback"], file=sys.stderr, flush=True)
    record = {"name": args.part, "status": status, "seconds": time.perf_counter() - began, **result}
    target.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return 0 if status == "passed" else 1


def _launch(part: Part, args: argparse.Namespace, budget: float, log: Any) -> dict[str, Any]:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--part", part.name, "--device", args.device,
        "--out", str(args.out), "--budget-s", str(budget),
    ]  # fmt: skip
    if args.tiny:
        command.append("--tiny")
    if args.assets:
        command += ["--assets", str(args.assets)]
    log.write(f"\n===== {part.name} (budget {budget:.0f}s): {' '.join(command)}\n")
    log.flush()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        process.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return {
            "name": part.name,
            "status": "timeout",
            "seconds": time.perf_counter() - began,
            "budget_s": budget,
        }
    path = Path(args.out) / "parts" / f"{part.name}.json"
    if not path.exists():
        return {
            "name": part.name,
            "status": "error",
            "error": f"exited {process.returncode} without a report",
        }
    return json.loads(path.read_text())


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def run_all(args: argparse.Namespace) -> int:
    out = Path(args.out)
    (out / "parts").mkdir(parents=True, exist_ok=True)
    chosen = [BY_NAME[name] for name in args.parts] if args.parts else list(PARTS)
    results = []
    with open(out / "gpu_check.log", "a") as log:
        for index, part in enumerate(chosen, 1):
            budget = part.budget_s * args.budget_scale
            print(f"[{index}/{len(chosen)}] {part.name} ({part.group}, budget {budget:.0f}s) ...", flush=True)
            stale = out / "parts" / f"{part.name}.json"
            stale.unlink(missing_ok=True)
            result = _launch(part, args, budget, log)
            result["group"] = part.group
            results.append(result)
            print(
                f"[{index}/{len(chosen)}] {part.name}: {result['status']} in {result.get('seconds', 0):.1f}s",
                flush=True,
            )
    failed = [r["name"] for r in results if r["group"] in GATING and r["status"] != "passed"]
    crashed = [r["name"] for r in results if r["status"] in ("error", "timeout")]
    summary = {
        "command": " ".join(["python", "benchmarks/gpu_check.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": args.device,
        "tiny": args.tiny,
        "machine": machine(),
        "passed": not failed and not crashed,
        "failed": failed,
        "crashed": crashed,
        "parts": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(
        f"gpu check: {'passed' if summary['passed'] else 'FAILED'}; failed {failed}, crashed {crashed}; "
        f"report {out / 'summary.json'}",
        flush=True,
    )
    return 0 if summary["passed"] else 1


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the GPU run) or cpu (the dry run)")
    parser.add_argument("--tiny", action="store_true", help="test-sized shapes and steps (the dry run)")
    parser.add_argument(
        "--out", required=True, help="output folder: parts/*.json, summary.json, gpu_check.log"
    )
    parser.add_argument("--assets", type=Path, help="folder from scripts/prepare-gpu-check.sh (tokenizer)")
    parser.add_argument(
        "--parts", type=lambda s: [p for p in s.split(",") if p], help="comma-separated subset"
    )
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiply every part's time budget")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--budget-s", type=float, default=600.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts or [] if p not in BY_NAME]
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {list(BY_NAME)}")
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device: cuda or cpu (got {args.device!r})")
    if args.device == "cuda" and not args.part:
        import torch

        if not torch.cuda.is_available():
            parser.error(
                "--device cuda: torch sees no CUDA device here (use --device cpu --tiny for the dry run)"
            )
    if args.device == "cuda" and not args.tiny and args.assets is None:
        parser.error("--assets: the full run needs SmolLM2's tokenizer (scripts/prepare-gpu-check.sh)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.part:
        return run_part(args)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
