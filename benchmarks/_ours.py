"""Our side of the fast-path benchmarks: the runtime's GRPO step, driven one step at a time.

Split out of `_common` so the shared settings/prompts/report helpers stay small: `OursGRPO` builds the real
Coordinator with every role colocated (as `dverl run` with replicas 0 runs it) from a `GRPOSettings`, and
`_Timer` splits each step's update into forward, backward and optimizer time. Heavy imports happen inside
functions: `--help` stays fast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from _common import ARITHMETIC, GRPOSettings, PromptItem


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


def ours_spec(settings: GRPOSettings, dtype: str, steps: int, microbatch_tokens: int | None = None) -> Any:
    """The RLHFJob spec of our side: GRPO, every role colocated (replicas 0), no KL, one PPO epoch.
    `microbatch_tokens` packs micro-batches by that token budget instead of `microbatch_prompts` rows."""
    from decentralized_verl.spec.manifest import parse_spec

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
                **(
                    {"microbatchTokens": microbatch_tokens}
                    if microbatch_tokens
                    else {"microbatchSize": settings.microbatch_prompts}
                ),
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
        self,
        model: Any,
        tokenizer: Any,
        prompts: Sequence[PromptItem],
        settings: GRPOSettings,
        dtype: str,
        microbatch_tokens: int | None = None,
    ) -> None:
        from decentralized_verl.core.samples import Prompt
        from decentralized_verl.orchestration.assemble import build_loop
        from decentralized_verl.orchestration.wiring import connect_roles
        from decentralized_verl.training.trainer import PolicyTrainer

        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.spec = ours_spec(settings, dtype, steps=10_000, microbatch_tokens=microbatch_tokens)
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
                pools=lambda role: [],
            )
        )
        self.roles = roles
        our_prompts = [Prompt(p.prompt_id, 0, p.token_ids, p.text, p.answer) for p in prompts]
        self.loop = self._runner.run(
            build_loop(self.spec, self.trainer, tokenizer, roles, job="bench", prompts=our_prompts)
        )
        self.coordinator = self.loop.coordinator

    def settings_used(self) -> dict[str, Any]:
        backend = self.roles.rollout[0].worker.backend
        s, rows = self.trainer.settings, self.settings.microbatch_rows
        budget = self.spec.training.microbatch_tokens
        return {
            "generation": f"own HF sampling loop, KV cache, micro-batches of {backend.max_batch_size} rows",
            "gradient_checkpointing": False,
            "kl": "none (klCoef 0, no reference model)",
            "old_logprobs": "the rollout's own per-token log-probs (1 PPO epoch; no extra forward pass)",
            "loss_aggregation": s.aggregation,
            "norm_adv_by_std": s.norm_by_std,
            "clip": [s.clip_low, s.clip_high],
            "optimizer": "torch AdamW, weight decay 0, constant lr, grad clip 1.0",
            "accumulation": (
                f"micro-batches packed by a {budget}-token budget (shared prompts once)"
                if budget
                else f"{self.settings.accumulation} micro-batches of {rows} rows"
            ),
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
        self._runner.run(self.loop.close())
        self._runner.close()
