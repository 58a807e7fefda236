"""A character-level tokenizer made offline, so tests and `tiny` models need no model hub.

Every printable ASCII character, newline and tab is one token; special tokens come first so ids
are stable across machines (rollout workers and the learner must agree on them without sharing files).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
CHAT_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *CHAT_MARKERS)
CHARACTERS = ("\t", "\n", *(chr(c) for c in range(32, 127)))

# Zephyr-like: a role marker, the content, the end-of-sequence token. A generated assistant turn
# therefore stops at EOS, which is what generation already stops on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def char_vocabulary() -> dict[str, int]:
    """Token -> id: special tokens first, then tab, newline and printable ASCII in code-point order."""
    return {token: i for i, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}


def build_char_tokenizer(padding_side: str = "left") -> PreTrainedTokenizerFast:
    """A `PreTrainedTokenizerFast` over single characters; saves and reloads like any HF tokenizer.

    A BPE model with no merges splits every word into its characters; with no pre-tokenizer the whole
    text is one word, so spaces are ordinary tokens and `decode` (Fuse) gives the text back exactly.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right' (got {padding_side!r})")
    backend = Tokenizer(BPE(vocab=char_vocabulary(), merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side=padding_side,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1_000_000,
    )
