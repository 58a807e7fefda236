"""How large a request each gRPC method takes: the one table of receive limits.

Most methods carry a few fields (Ready, Status, Info, GetManifest, Fetch's request, Span Close): they take
at most `DEFAULT_BYTES`. Only the methods that carry batches of samples or weights take more, each named
here with why. A worker enforces them twice:

- gRPC itself refuses a message larger than the largest limit among the methods a server serves
  (`server_limit`): it reads the length prefix and answers RESOURCE_EXHAUSTED before it buffers the body,
  whoever the caller is;
- the job-token interceptor (`transport.secure`) refuses, before parsing, a request over its own method's
  limit that is still under the server's (a role's token holder sending megabytes to Ready), naming the
  method and the limit, and gives the memory the read took back to the kernel.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_BYTES = 64 << 10
"""Every method not named below: a request of a few fields, with room to spare."""

BATCH_BYTES = 64 << 20
"""Batches of samples (texts, token ids, hidden states) and span weight blobs; it scales with the job."""

WEIGHT_CHUNK_BYTES = 16 << 20
"""One weight chunk (2 MiB by default) with the signed manifest on the first, or a manifest alone: a
manifest lists every chunk's digest, ~70 bytes each."""

PROMPT_BATCH_BYTES = 16 << 20
"""A batch of prompts to generate from (the results come back as a stream, under the caller's limit)."""

LIMITS: dict[str, int] = {
    "Rollout/Generate": PROMPT_BATCH_BYTES,
    "Reward/Score": BATCH_BYTES,
    "Reference/LogProbs": BATCH_BYTES,
    "Critic/Values": BATCH_BYTES,
    "Critic/Train": BATCH_BYTES,
    "Span/Forward": BATCH_BYTES,
    "Span/Stage": BATCH_BYTES,
    "Span/Commit": WEIGHT_CHUNK_BYTES,
    "Weights/Push": WEIGHT_CHUNK_BYTES,
    "Weights/BulkOpen": WEIGHT_CHUNK_BYTES,
}
"""Method (`Service/Method`) -> the largest request message it takes, where that is more than the default."""

LARGEST_BYTES = max(DEFAULT_BYTES, *LIMITS.values())
"""What a server that does not say what it serves accepts."""


def limit_of(method: str) -> int:
    """The largest request `method` (`Service/Method`) takes."""
    return LIMITS.get(method, DEFAULT_BYTES)


def server_limit(services: Iterable[str] | None) -> int:
    """The receive limit for a server of `services` (names such as `Reward`, `Health`): the largest of its
    methods' limits; every method's when the server does not say (None)."""
    if services is None:
        return LARGEST_BYTES
    served = set(services)
    return max(
        [DEFAULT_BYTES, *(limit for method, limit in LIMITS.items() if method.split("/", 1)[0] in served)]
    )


def over_limit(method: str, size: int) -> str | None:
    """Why a request of `size` bytes to `method` is refused, or None when it fits."""
    limit = limit_of(method)
    if size <= limit:
        return None
    return f"the request is {size} bytes, over {method}'s limit of {limit} bytes"
