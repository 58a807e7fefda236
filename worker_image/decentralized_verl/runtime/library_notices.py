"""Library notices that tell a user nothing they can act on, dropped once at the process entry.

bitsandbytes, imported on an AVX-512 bf16 CPU, tries to fetch an optional 4-bit matmul kernel from the
Hugging Face hub through the `kernels` package and, without it, warns at import and falls back to its
own CPU path (the one its tests and ours run). Every worker that loads a model imports bitsandbytes
through transformers or PEFT, so that warning was the first line of every pod's log, and so the first
words of a failed pod's termination message (FallbackToLogsOnError), ahead of the cause. No hub is
reached at run time here; the fallback is the intended path.
"""

from __future__ import annotations

import logging

DROPPED: tuple[tuple[str, str], ...] = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),
)
"""(logger, the start of the message) of each notice dropped."""


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_library_notices() -> None:
    """Install the filters (idempotent: a logger keeps one filter a prefix)."""
    for name, prefix in DROPPED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefix) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropPrefix(prefix))
