"""TRL's side of the fast-path benchmarks: `GRPOTrainer` on the same model, prompts and reward as ours.

Split out of `_common` so the shared settings/prompts/report helpers stay small: `TRLGRPO` is driven from
the same `GRPOSettings` as `OursGRPO` (`trl_config_kwargs` names every deviation from TRL's defaults) and
reports per-step wall times plus a split of where the time went, from TRL's own profiling timings.
Heavy imports (trl, transformers, datasets) happen inside functions: `--help` stays fast.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from _common import GRPOSettings, PromptItem, boxed_score


def trl_boxed_reward(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """TRL reward-function signature over `boxed_score` (the dataset's `answer` column arrives as kwarg)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [boxed_score(t, a) for t, a in zip(texts, answer, strict=True)]


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
        attention: str = "sdpa",
    ) -> None:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        # TRL users get the model as `from_pretrained` makes it (SDPA attention); `attention="same"` keeps
        # whatever our loader chose, to show how much of a gap the attention kernel accounts for.
        if attention != "same":
            model.set_attn_implementation(attention)
        self.attention = model.config._attn_implementation
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
        shown["attention"] = self.attention
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

        from decentralized_verl.runtime import compute_thread

        self.trainer.remove_callback(PrinterCallback)  # it prints every log dict to stdout
        self.trainer.remove_callback(ProgressCallback)
        self.trainer.add_callback(Clock())
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout is for the JSON report
                # on the compute thread, like our side: one OpenMP team in the process (compute_thread)
                compute_thread.call(self.trainer.train)
        finally:
            profile.close()

    def close(self) -> None:
        self._tmp.cleanup()
