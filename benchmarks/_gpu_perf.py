"""The GPU check's speed parts: the bf16 matmul peak, our GRPO step beside TRL's GRPOTrainer on one
random-init model of Qwen2.5-0.5B's shape, and the learner alone at Qwen2.5-1.5B's shape.

MFU is counted against the peak measured in the same run on the same card (a datasheet peak would hide
clock and power limits), with the 6 x parameters x tokens rule for a training step. Both sides of the
comparison get the same model object (a fresh copy each), tokenizer, prompts, reward and batch, through the
runners the CPU benchmarks use (`grpo_vs_trl.run_ours` / `run_trl`), so "same step" holds by construction.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import _common as c

# Shapes of the public configs (no hub at run time: the numbers travel, the weights are random).
QWEN25_05B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
    max_position_embeddings=32768, rms_norm_eps=1e-6,
)  # fmt: skip
QWEN25_15B = dict(
    hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
    max_position_embeddings=32768, rms_norm_eps=1e-6,
)  # fmt: skip
TINY_QWEN = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=512,
)  # fmt: skip


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tokenizer_for(assets: Path | None, tiny: bool) -> Any:
    """SmolLM2's tokenizer from the assets folder (saved by the prepare step; it travels, the model does
    not), or the character tokenizer for the CPU dry run."""
    if tiny or assets is None:
        from decentralized_verl.models.tokenizer import build_char_tokenizer

        return build_char_tokenizer(padding_side="left")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(assets / "smollm2-tokenizer"), padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def qwen_model(shape: dict[str, Any], tokenizer: Any, device: str, dtype: str, seed: int = 0) -> Any:
    import torch
    import transformers

    fields = dict(shape)
    fields.setdefault("vocab_size", len(tokenizer))
    config = transformers.Qwen2Config(
        **fields,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(config).to(device=device, dtype=getattr(torch, dtype)).train()


def matmul_peak(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    """Median TFLOP/s of square bf16 matmuls on the device: the denominator of every MFU here."""
    import torch

    size, repeats = (256, 5) if tiny else (8192, 30)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b)
    rates = []
    for _ in range(repeats):
        synchronize(device)
        began = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        rates.append(2 * size**3 / (time.perf_counter() - began) / 1e12)
    return {
        "passed": True,
        "size": size,
        "median_tflops": statistics.median(rates),
        "best_tflops": max(rates),
        "spread_tflops": [min(rates), max(rates)],
    }


def _peak(out_dir: Path | None) -> float | None:
    import json

    if out_dir is None:
        return None
    path = out_dir / "parts" / "matmul_peak.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("median_tflops")


def grpo_side_by_side(
    device: str, tiny: bool, *, assets: Path | None = None, out_dir: Path | None = None, **_: Any
) -> dict[str, Any]:
    """Our GRPO step vs TRL's GRPOTrainer: 64 completions x 256 new tokens, HF generation on both sides,
    bf16, on a random-init model of Qwen2.5-0.5B's shape; median step time, generation/update split."""
    from _trl import TRL_VARIANTS
    from grpo_vs_trl import run_ours, run_trl, summarize

    dtype = "float32" if tiny else "bfloat16"
    tokenizer = tokenizer_for(assets, tiny)
    settings = (
        c.GRPOSettings(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=4, microbatch_prompts=1)
        if tiny
        else c.GRPOSettings(
            prompts_per_step=8, samples_per_prompt=8, max_new_tokens=256, microbatch_prompts=2
        )
    )
    warmup, steps = (0, 1) if tiny else (1, 3)
    base = qwen_model(TINY_QWEN if tiny else QWEN25_05B, tokenizer, device, dtype)
    prompts = c.arithmetic_prompts(tokenizer, limit=settings.prompts_per_step * (warmup + steps))
    ours_records, ours_used = run_ours(base, tokenizer, prompts, settings, dtype, warmup, steps)
    sides: dict[str, Any] = {"ours": summarize(ours_records)}
    missing = c.trl_missing_reason()
    if missing is None:
        trl_records, _ = run_trl(base, tokenizer, prompts, settings, TRL_VARIANTS["matched"], warmup, steps)
        sides["trl-matched"] = summarize(trl_records)
    parameters = c.count_parameters(base)
    tokens = statistics.median(r["tokens"] for r in ours_records)
    learner_s = statistics.median(
        sum(r["profile"].get(k, 0.0) for k in ("forward_loss", "backward", "optimizer")) for r in ours_records
    )
    peak = _peak(out_dir)
    out: dict[str, Any] = {
        "passed": True,
        "model": "Qwen2.5-0.5B shape, random init" if not tiny else "tiny Qwen2 shape",
        "parameters": parameters,
        "dtype": dtype,
        "settings": c.settings_dict(settings),
        "sides": sides,
        "ours_settings": ours_used,
        "tokens_per_step": tokens,
        "learner_tokens_per_s": tokens / learner_s if learner_s else None,
        "peak_tflops": peak,
    }
    if peak and learner_s:
        out["learner_mfu"] = 6.0 * parameters * tokens / learner_s / (peak * 1e12)
    if "trl-matched" in sides:
        out["ratio_trl_over_ours"] = sides["trl-matched"]["median_step_s"] / sides["ours"]["median_step_s"]
    else:
        out["trl_missing"] = missing
    return out


def learner_alone(
    device: str, tiny: bool, *, assets: Path | None = None, out_dir: Path | None = None, **_: Any
) -> dict[str, Any]:
    """The learner's update alone on a synthetic GRPO batch at Qwen2.5-1.5B's shape: median update time,
    tokens/s and MFU against the measured peak."""
    from _ours import ours_spec
    from learner_mfu import flop_counts, synthetic_batch

    from decentralized_verl.training.advantage_step import attach_advantages
    from decentralized_verl.training.trainer import PolicyTrainer

    dtype = "float32" if tiny else "bfloat16"
    tokenizer = tokenizer_for(assets, tiny)
    settings = (
        c.GRPOSettings(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=4, microbatch_prompts=1)
        if tiny
        else c.GRPOSettings(
            prompts_per_step=8, samples_per_prompt=8, max_new_tokens=256, microbatch_prompts=1
        )
    )
    repeats = 1 if tiny else 5
    model = qwen_model(TINY_QWEN if tiny else QWEN25_15B, tokenizer, device, dtype)
    batch = synthetic_batch(tokenizer, settings, model)
    trainer = PolicyTrainer(model, ours_spec(settings, dtype, steps=repeats + 2))
    attach_advantages(batch, trainer.settings)
    counts = flop_counts(model, batch)
    trainer.update(batch)  # warm-up: allocator, optimizer state
    walls = []
    for _ in range(repeats):
        synchronize(device)
        began = time.perf_counter()
        trainer.update(batch)
        synchronize(device)
        walls.append(time.perf_counter() - began)
    update_s = statistics.median(walls)
    peak = _peak(out_dir)
    out: dict[str, Any] = {
        "passed": True,
        "model": "Qwen2.5-1.5B shape, random init" if not tiny else "tiny Qwen2 shape",
        "dtype": dtype,
        **counts,
        "update_s": walls,
        "median_update_s": update_s,
        "tokens_per_s": counts["tokens"] / update_s,
        "peak_tflops": peak,
    }
    if peak:
        out["mfu_6nt"] = counts["flops_6nt"] / update_s / (peak * 1e12)
    if device.startswith("cuda"):
        import torch

        out["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


PARTS = {
    "matmul_peak": matmul_peak,
    "grpo_side_by_side": grpo_side_by_side,
    "learner_alone": learner_alone,
}
