"""The GPU check's end-to-end parts: `dverl run` of the tiny GRPO job with separate learner, rollout and
reward processes over gRPC, then a SmolLM2-shaped job (random init, SmolLM2's tokenizer) for a few steps.

On a GPU the parts also watch `nvidia-smi` while the job runs: a job that trained without any of its
processes holding GPU memory ran on the CPU, and that is reported as a failure of the GPU path, not as a
pass.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


class GpuWatch:
    """Polls `nvidia-smi --query-compute-apps` in the background; `pids` are every process seen on a GPU."""

    def __init__(self, period_s: float = 2.0) -> None:
        self.pids: set[int] = set()
        self.available = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)

    def _run(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            query = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
            try:
                text = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            self.pids.update(int(line) for line in text.split() if line.strip().isdigit())

    def __enter__(self) -> GpuWatch:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)


def tiny_manifest(out: Path, steps: int) -> Path:
    """examples/tiny-grpo.yaml with its roles as separate processes: one learner, one rollout, one reward."""
    doc = yaml.safe_load((ROOT / "examples" / "tiny-grpo.yaml").read_text())
    spec = doc["spec"]
    for key in ("train", "eval"):
        spec["data"][key] = str((ROOT / "examples" / spec["data"][key]).resolve())
    spec["roles"] = {
        "rollout": {"replicas": 1, "backend": "hf", "batchSize": spec["roles"]["rollout"]["batchSize"]},
        "reward": {"replicas": 1},
        "learner": {"replicas": 1},
    }
    spec["training"]["steps"] = steps
    spec["training"]["evalEvery"] = max(1, steps // 4)
    path = out / "tiny-grpo-processes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _run(manifest: Path, output: Path, timeout: float) -> dict[str, Any]:
    from decentralized_verl.launch.run import run_job

    return run_job(manifest, output, progress=False, timeout=timeout)


def tiny_job(device: str, tiny: bool, *, out_dir: Path, budget_s: float = 900.0, **_: Any) -> dict[str, Any]:
    """The tiny GRPO job end to end: completes every step; on a full run its reward rises."""
    steps = 6 if tiny else 200
    work = out_dir / "tiny-job"
    work.mkdir(parents=True, exist_ok=True)
    with GpuWatch() as watch:
        summary = _run(tiny_manifest(work, steps), work / "run", timeout=budget_s * 0.9)
    rising = summary["reward_last"] > summary["reward_first"] + 0.15
    on_gpu = bool(watch.pids)
    passed = summary["steps"] == steps and (tiny or rising) and (on_gpu or not device.startswith("cuda"))
    return {
        "passed": passed,
        "steps": summary["steps"],
        "reward_first": summary["reward_first"],
        "reward_last": summary["reward_last"],
        "reward_rising": rising,
        "gpu_processes_seen": sorted(watch.pids) if watch.available else None,
        "note": None if on_gpu or not device.startswith("cuda") else "no process of the job held GPU memory",
    }


def smollm2_shaped_folder(tokenizer_dir: Path | None, out: Path, tiny: bool) -> Path:
    """A Hugging Face folder: SmolLM2-135M's Llama config (a test-sized one for the dry run), random
    weights, SmolLM2's tokenizer (the character tokenizer's stand-in for the dry run)."""
    import torch
    import transformers

    if tokenizer_dir is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    else:
        from decentralized_verl.models.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
    sizes = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
        if tiny
        else dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3)
    )  # fmt: skip
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
        max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **sizes,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    folder = out / "smollm2-shaped"
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def smollm2_job(
    device: str, tiny: bool, *, out_dir: Path, assets: Path | None = None, budget_s: float = 600.0, **_: Any
) -> dict[str, Any]:
    """A SmolLM2-shaped job for a few steps over the arithmetic data: it completes them."""
    steps = 2 if tiny else 5
    work = out_dir / "smollm2-job"
    work.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = None if tiny or assets is None else assets / "smollm2-tokenizer"
    folder = smollm2_shaped_folder(tokenizer_dir, work, tiny)
    arithmetic = ROOT / "examples" / "data" / "arithmetic"
    doc = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "smollm2-shaped"},
        "spec": {
            "model": {"path": str(folder), "dtype": "float32" if tiny else "bfloat16"},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2 if tiny else 8, "klCoef": 0.0},
            "data": {
                "train": str(arithmetic / "small_train.jsonl"),
                "rewardType": "boxed",
                "maxPromptTokens": 512,
                "maxNewTokens": 4 if tiny else 128,
            },
            "roles": {"rollout": {"replicas": 1, "batchSize": 2 if tiny else 8}, "learner": {"replicas": 1}},
            "training": {"steps": steps, "batchSize": 2 if tiny else 8, "minibatchSize": 2 if tiny else 8},
        },
    }
    manifest = work / "smollm2-shaped.yaml"
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
    with GpuWatch() as watch:
        summary = _run(manifest, work / "run", timeout=budget_s * 0.9)
    on_gpu = bool(watch.pids)
    return {
        "passed": summary["steps"] == steps and (on_gpu or not device.startswith("cuda")),
        "steps": summary["steps"],
        "gpu_processes_seen": sorted(watch.pids) if watch.available else None,
    }


PARTS = {"tiny_job": tiny_job, "smollm2_job": smollm2_job}
