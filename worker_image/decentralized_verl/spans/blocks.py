"""The torch modules of a span chain, built from a model spec: a span's decoder layers, and the front.

A span module is the model's own decoder (`AutoModel`) configured with only the span's layers, fed
hidden states instead of token ids, with the final norm left to the front: so masks, rotary positions
and the KV cache are transformers' own code, exactly as in the single-process model. The front holds
the embeddings, the final norm and the LM head under their full-model names, so a full state dict's
front part loads into it unchanged.

Each part is built on the meta device and then filled with only its own tensors: a span server never
holds the whole model, and for a model folder it reads only its layers' tensors from the safetensors
files. Supported: causal LMs whose logits are `lm_head(norm(layers(embed(ids))))` (`SUPPORTED`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from decentralized_verl.errors import ModelError
from decentralized_verl.models.grouped_attention import use_grouped_attention
from decentralized_verl.models.loading import load_tokenizer, resolve_hf_dir, torch_dtype
from decentralized_verl.models.tiny import build_tiny, tiny_config
from decentralized_verl.runtime.device import process_device
from decentralized_verl.spans.layout import FRONT_PREFIXES, Span, is_front, to_span_name

SUPPORTED = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Model types whose forward is embed -> decoder layers -> final norm -> LM head, with nothing between."""

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")

TensorSource = Callable[[Callable[[str], bool]], dict[str, Tensor]]
"""Reads the full-model tensors whose names pass a filter (so a part reads only its own)."""


def check_supported(config: Any, *, field: str = "spec.model") -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        raise ModelError(
            f"{field}: a {model_type!r} model cannot be served as spans "
            f"(supported: {', '.join(sorted(SUPPORTED))})"
        )
    if any(getattr(config, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS):
        raise ModelError(f"{field}: a model with transformed logits cannot be served as spans")


def span_config(config: Any, span: Span) -> Any:
    """The full config with only the span's layers (per-layer fields sliced to the span)."""
    if span.end > config.num_hidden_layers:
        raise ModelError(f"layers {span}: the model has only {config.num_hidden_layers} decoder layers")
    out = copy.deepcopy(config)
    out.num_hidden_layers = span.layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        out.layer_types = list(layer_types)[span.start : span.end]
    return out


def _fill(module: nn.Module, tensors: Mapping[str, Tensor], dtype: torch.dtype, what: str) -> nn.Module:
    """Materialize a meta-device module from exactly `tensors` (a missing or extra one is an error)."""
    own = module.state_dict()
    missing = sorted(set(own) - set(tensors))
    extra = sorted(set(tensors) - set(own))
    if missing or extra:
        raise ModelError(f"{what}: weights do not fit (missing {missing[:3]}, unexpected {extra[:3]})")
    module.to_empty(device=process_device())  # the worker's device: the span's weights go there once
    with torch.no_grad():
        for name, target in module.state_dict(keep_vars=True).items():
            source = tensors[name]
            if tuple(source.shape) != tuple(target.shape):
                raise ModelError(
                    f"{what}: {name} has shape {tuple(source.shape)}, expected {tuple(target.shape)}"
                )
            target.copy_(source.to(dtype))
    return module.to(dtype).eval()


def build_span(config: Any, span: Span, source: TensorSource, dtype: torch.dtype) -> nn.Module:
    """The decoder of layers [span.start, span.end), with its tensors read from `source`."""
    check_supported(config)
    cfg = span_config(config, span)
    with torch.device("meta"):
        module = AutoModel.from_config(cfg)
    module.embed_tokens = None  # the span is fed hidden states, never token ids
    module.norm = nn.Identity()  # the front applies the final norm after the last span
    wanted = {}
    for name, tensor in source(lambda n: to_span_name(n, span) is not None).items():
        wanted[to_span_name(name, span)] = tensor
    _fill(module, wanted, dtype, f"span {span}")
    module.rotary_emb = type(module.rotary_emb)(config=cfg).to(process_device())  # its buffers were on meta
    _use_fast_attention(module)
    return module


def _use_fast_attention(module: nn.Module) -> None:
    use_grouped_attention(module)


class FrontModel(nn.Module):
    """Embeddings, final norm and LM head under the full model's names, computing logits from token ids
    through a chain session (passed where a causal LM takes its cache): `HFBackend`'s decode loop drives it
    exactly as it drives a whole model."""

    def __init__(self, config: Any) -> None:
        super().__init__()

        with torch.device("meta"):
            whole = AutoModelForCausalLM.from_config(_no_layers(config))
        self.config = config
        self.generation_config = whole.generation_config
        self.model = nn.Module()
        self.model.embed_tokens = whole.model.embed_tokens
        self.model.norm = whole.model.norm
        self.lm_head = whole.lm_head
        self.tied = bool(getattr(config, "tie_word_embeddings", False))

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def head(self, hidden: Tensor) -> Tensor:
        """Logits from the last span's hidden states: the final norm and the LM head."""
        with torch.no_grad():
            return self.lm_head(self.model.norm(hidden.to(self.lm_head.weight.dtype)))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        past_key_values: Any,
        use_cache: bool = True,
        logits_to_keep: int = 0,
    ) -> Any:
        hidden = self.model.embed_tokens(input_ids)
        hidden = past_key_values.forward(hidden, attention_mask, position_ids).to(hidden.device)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.lm_head(self.model.norm(hidden)))


def _no_layers(config: Any) -> Any:
    out = copy.deepcopy(config)
    out.num_hidden_layers = 0
    if getattr(out, "layer_types", None):
        out.layer_types = []
    return out


def build_front(config: Any, source: TensorSource, dtype: torch.dtype) -> FrontModel:
    check_supported(config)
    front = FrontModel(config)
    tensors = source(is_front)
    if front.tied:
        tensors = {k: v for k, v in tensors.items() if not k.startswith("lm_head.")}
        front.lm_head.weight = front.model.embed_tokens.weight  # one tensor, as in the model
    _fill(front, _with_tied(front, tensors), dtype, "front")
    if front.tied:
        front.lm_head.weight = front.model.embed_tokens.weight
    return front


def _with_tied(front: FrontModel, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    if front.tied and "model.embed_tokens.weight" in tensors:
        return {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]}
    return tensors


# ---------------------------------------------------------------- where the tensors come from


def spec_parts(spec: Any, *, field: str = "spec.model") -> tuple[Any, Any, TensorSource, torch.dtype]:
    """(config, tokenizer, tensor source, dtype) for a model spec, reading no tensor yet."""
    if getattr(spec, "lora", None) is not None:
        raise ModelError(f"{field}.lora: a LoRA model cannot be served as spans")
    dtype = torch_dtype(getattr(spec, "dtype", "float32"), field=f"{field}.dtype")
    tokenizer = load_tokenizer(spec, field=field)
    folder = resolve_hf_dir(spec, field=field)
    if folder is None:
        config = tiny_config(spec.tiny, tokenizer, field=f"{field}.tiny")
        return config, tokenizer, _tiny_source(config, spec.tiny.seed), dtype

    config = AutoConfig.from_pretrained(folder)
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = tokenizer.pad_token_id
    return config, tokenizer, folder_source(folder, field), dtype


def _tiny_source(config: Any, seed: int) -> TensorSource:
    """The tiny model is defined by its seed: build it whole (it is tiny) and hand out the asked part."""

    def read(wanted: Callable[[str], bool]) -> dict[str, Tensor]:
        whole = build_tiny(config, seed)
        return {k: v.detach().clone() for k, v in whole.state_dict().items() if wanted(k)}

    return read


def folder_source(folder: Path, field: str = "spec.model") -> TensorSource:
    """Reads only the wanted tensors from a model folder's safetensors file(s)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    elif (folder / "model.safetensors").exists():
        weight_map = {}
    else:
        raise ModelError(f"{field}: {str(folder)!r} has no safetensors weights (spans read only safetensors)")

    def read(wanted: Callable[[str], bool]) -> dict[str, Tensor]:
        files: dict[str, list[str] | None] = {}
        if weight_map:
            for name, file in weight_map.items():
                if wanted(name):
                    files.setdefault(file, []).append(name)  # type: ignore[union-attr]
        else:
            files["model.safetensors"] = None
        out: dict[str, Tensor] = {}
        for file, names in files.items():
            with safe_open(str(folder / file), framework="pt") as f:
                for name in names if names is not None else [k for k in f.keys() if wanted(k)]:  # noqa: SIM118
                    out[name] = f.get_tensor(name)
        return out

    return read


def part_bytes(config: Any, dtype_bytes: int = 2) -> tuple[int, int]:
    """(bytes of one decoder layer, bytes of the front), from the config alone (no weights read)."""
    with torch.device("meta"):
        one = AutoModelForCausalLM.from_config(_layers(config, 1))
    layer = sum(p.numel() for n, p in one.named_parameters() if n.startswith("model.layers."))
    front = sum(p.numel() for n, p in one.named_parameters() if n.startswith(FRONT_PREFIXES))
    return layer * dtype_bytes, front * dtype_bytes


def _layers(config: Any, count: int) -> Any:
    out = copy.deepcopy(config)
    out.num_hidden_layers = count
    if getattr(out, "layer_types", None):
        out.layer_types = list(out.layer_types)[:count]
    return out
