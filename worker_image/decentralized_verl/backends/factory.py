"""The one place a generation backend is built: a `BackendKind` (the spec's catalogue) -> its engine.

Engines are lazy ``module:attribute`` paths imported on first use, so importing this module pulls in no
engine; the table is checked against the catalogue's kinds at import. What a kind's engine is given
beyond the caller's options (tensor parallelism over the worker's GPUs, compiling or not) follows from
the kind's capabilities, never from its name.
"""

from __future__ import annotations

import importlib
from typing import Any

from decentralized_verl.backends.base import GenerationBackend
from decentralized_verl.spec.catalogue import check_registry
from decentralized_verl.spec.catalogue.backends import BACKEND_KINDS, HF, VLLM, BackendKind

ENGINES: dict[BackendKind, str] = {
    HF: "decentralized_verl.backends.hf:HFBackend",
    VLLM: "decentralized_verl.backends.vllm_backend:VLLMBackend",
}
"""Each kind -> "module:attribute" of a callable (model, tokenizer, **options) -> GenerationBackend."""

check_registry("backend", (kind.name for kind in ENGINES), BACKEND_KINDS)


def engine_options(
    kind: BackendKind,
    gpus: int = 1,
    *,
    eager: bool = False,
    memory_fraction: float | None = None,
    sleep_while_idle: bool = False,
) -> dict[str, Any]:
    """Options a worker with ``gpus`` GPUs (its ``resources.gpus``) builds the kind's engine with: a
    tensor-parallel engine is split over all of them, and a compiling one skips compilation with
    ``eager`` (``WorkerSettings.vllm_eager``); an engine on one device takes neither. An engine that
    reserves a share of its GPU takes ``memory_fraction`` (the plan's, when its GPU is shared); one that
    can sleep on a GPU sleeps between generate calls with ``sleep_while_idle`` (`backends/sleep.py`)."""
    options: dict[str, Any] = {}
    if kind.sleeps_on_gpu and sleep_while_idle:
        options["sleep_while_idle"] = True
    if kind.reserves_gpu_share and memory_fraction is not None:
        options["engine_kwargs"] = {"gpu_memory_utilization": memory_fraction}
    if kind.tensor_parallel:
        options["tensor_parallel_size"] = max(1, gpus)
    if kind.compiles:
        options["enforce_eager"] = eager
    return options


def make_backend(
    kind: BackendKind,
    model: Any,
    tokenizer: Any,
    *,
    gpus: int = 1,
    eager: bool = False,
    memory_fraction: float | None = None,
    sleep_while_idle: bool = False,
    **options: Any,
) -> GenerationBackend:
    """Build the kind's engine on ``model``, importing it only now; ``options`` go to the engine as
    given, beside `engine_options(kind, gpus, eager=eager)`."""
    module_name, _, attribute = ENGINES[kind].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"generation backend {kind.name!r} is not installed ({module_name} failed to import: {exc}); "
            f"install the extra that provides it, e.g. `pip install 'decentralized-verl[{kind.name}]'`"
        ) from exc
    factory = getattr(module, attribute)
    chosen = engine_options(
        kind, gpus, eager=eager, memory_fraction=memory_fraction, sleep_while_idle=sleep_while_idle
    )
    return factory(model, tokenizer, **chosen, **options)
