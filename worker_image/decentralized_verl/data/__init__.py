"""Data files (jsonl / json / parquet) in the seed layouts, prompt rendering and the prompt order.

Torch-free and transformers-free at import time; pyarrow is imported only to read parquet.
"""

from decentralized_verl.data.dataset import (
    Dataset,
    load_dataset,
    load_preferences,
    load_prompts,
    load_sft,
    prompt_records,
)
from decentralized_verl.data.formats import detect_kind
from decentralized_verl.data.prompts import build_messages, plain_format, render_prompt
from decentralized_verl.data.readers import FORMATS, read_rows, resolve_format
from decentralized_verl.data.records import (
    KINDS,
    PROMPT_KINDS,
    ChatMessage,
    CodeTests,
    PreferenceRecord,
    PromptRecord,
    Record,
    SFTRecord,
)
from decentralized_verl.data.sampler import PromptSampler, epoch_order

__all__ = [
    "FORMATS",
    "KINDS",
    "PROMPT_KINDS",
    "ChatMessage",
    "CodeTests",
    "Dataset",
    "PreferenceRecord",
    "PromptRecord",
    "PromptSampler",
    "Record",
    "SFTRecord",
    "build_messages",
    "detect_kind",
    "epoch_order",
    "load_dataset",
    "load_preferences",
    "load_prompts",
    "load_sft",
    "plain_format",
    "prompt_records",
    "read_rows",
    "render_prompt",
    "resolve_format",
]
