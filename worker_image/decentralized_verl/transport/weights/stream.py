"""Encode weights that arrive one tensor at a time (a sharded learner gathering layer by layer) straight into
the versioned, hashed chunk stream, without holding the whole model as tensors anywhere.

A sharded learner knows every tensor's full name, shape and dtype before gathering any of them (a DTensor
carries its global shape), so the safetensors header can be written first and each gathered tensor copied
into its place in the payload and dropped. Chunks are hashed as soon as the bytes before their end are
in. The peak on the publishing rank is the payload (which the publisher holds to serve anyway) plus the
one tensor being gathered, instead of the whole model as tensors plus the payload.

The bytes are a valid safetensors file with the same metadata `weights.encode_state_dict` writes (version,
aliases), written through the same `blob.BlobWriter`, so receivers decode both alike.
"""

from __future__ import annotations

import json

from decentralized_verl.core.streamed_weights import StreamedWeights
from decentralized_verl.transport.weights.blob import BlobWriter
from decentralized_verl.transport.weights.codec import (
    _ALIASES_KEY,
    _VERSION_KEY,
    DEFAULT_CHUNK_BYTES,
    WeightBundle,
    bundle_of,
    encoding_dtype,
)


def encode_stream(
    weights: StreamedWeights,
    version: int,
    *,
    dtype: str | None = "bfloat16",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> WeightBundle:
    """Encode streamed weights as `version`; each tensor is checked against its slot on arrival."""
    wire = encoding_dtype(version, chunk_bytes, dtype)
    metadata = {
        "format": "pt",
        _VERSION_KEY: str(version),
        _ALIASES_KEY: json.dumps(weights.aliases, sort_keys=True),
    }
    try:
        writer = BlobWriter(weights.slots, wire, metadata, chunk_bytes)
        for slot in weights.slots:
            item = next(weights.tensors, None)
            if item is None:
                raise ValueError(f"weights: the stream ended before {slot.name!r}")
            name, tensor = item
            if name != slot.name:
                raise ValueError(
                    f"weights[{name!r}]: expected {slot.name!r} {slot.shape} {slot.dtype}, "
                    f"got {tuple(tensor.shape)} {tensor.dtype}"
                )
            writer.put(tensor)
            del tensor, item
        extra = next(weights.tensors, None)
        if extra is not None:
            raise ValueError(f"weights[{extra[0]!r}]: not in the layout")
    finally:
        for _ in weights.tensors:  # the other ranks of a collective gather are waiting on this one
            pass
    return bundle_of(writer, version, dtype)
