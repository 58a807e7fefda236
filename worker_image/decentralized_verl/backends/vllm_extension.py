"""Code that runs inside vLLM's worker process: an in-place weight refresh the engine can be asked for.

vLLM mixes this class into its worker (``LLM(..., worker_extension_cls=QUALNAME)``) and the driver
calls its methods by name with ``llm.collective_rpc``. The engine core is another process, and tensors
passed as RPC arguments arrive as nested lists, so the weights travel as a safetensors file in RAM
(``/dev/shm``) and only its path goes through the RPC.

Why not ``model.load_weights`` as TRL does: on CPU vLLM repacks every linear weight for oneDNN and
drops the original parameters, so that path fails (``'Parameter' object has no attribute
'weight_loader'``). The worker's own ``reload_weights`` ("reloading weights in place") restores the
checkpoint layout, loads, and re-runs that repacking; it works the same way on GPU. Two things it does
not do are done here: a tied ``lm_head`` shares the embedding's tensor but keeps its own repacked
copy, so it is re-tied and re-processed; the driver then resets the prefix cache, whose KV entries
were computed with the old weights.

This module imports no vLLM: importing it must not need vLLM (the engine finds it by name).
"""

from __future__ import annotations

import time
from typing import Any

from safetensors.torch import load_file

QUALNAME = "decentralized_verl.backends.vllm_extension.WeightRefreshExtension"


class WeightRefreshExtension:
    """Methods mixed into vLLM's worker; ``self`` is the worker (``reload_weights``, ``model_runner``)."""

    def dverl_reload_from_file(self, path: str) -> dict[str, Any]:
        """Load every tensor of the safetensors file at ``path`` into the running model, in place.

        The caller validated names, shapes and dtypes beforehand: a reload that fails half way leaves
        layers on the meta device and the engine unusable. Returns timing and counts for the log.
        """
        began = time.perf_counter()
        tensors = load_file(path)
        read = time.perf_counter()
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        _refresh_tied_head(self.model_runner.get_model())  # type: ignore[attr-defined]
        done = time.perf_counter()
        return {"tensors": len(tensors), "read_s": read - began, "reload_s": done - read}


def _refresh_tied_head(model: Any) -> None:
    """Re-tie ``lm_head`` to the input embedding and re-run its kernel preparation, if they are tied."""
    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    if lm_head is None or not getattr(config, "tie_word_embeddings", False):
        return
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if embed is not None and lm_head.weight is not embed.weight:
        lm_head.weight = embed.weight
    method = getattr(lm_head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(lm_head)
