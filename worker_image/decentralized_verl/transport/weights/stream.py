"""Encode weights that arrive one tensor at a time (a sharded learner gathering layer by layer) straight into
the versioned, hashed chunk stream, without holding the whole model as tensors anywhere.

A sharded learner knows every tensor's full name, shape and dtype before gathering any of them (a DTensor
carries its global shape), so the safetensors header can be written first and each gathered tensor copied
into its place in the payload and dropped. Chunks are hashed as soon as the bytes before their end are
in. The peak on the publishing rank is the payload (which the publisher holds to serve anyway) plus the
one tensor being gathered, instead of the whole model as tensors plus the payload.

The bytes are a valid safetensors file with the same metadata `weights.encode_state_dict` writes (version,
aliases), so receivers decode both alike; tensor order in the payload follows the layout, not
safetensors' own sort, so the digests of the two encoders differ for the same weights (nothing compares
them across encoders).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable

import torch

from decentralized_verl.core.streamed_weights import StreamedWeights, TensorSlot
from decentralized_verl.transport.digest import digest_hex
from decentralized_verl.transport.weights.codec import (
    _ALIASES_KEY,
    _VERSION_KEY,
    DEFAULT_CHUNK_BYTES,
    BundleHeader,
    WeightBundle,
    WeightChunk,
    bundle_digest,
    encoding_dtype,
)
from decentralized_verl.transport.weights.staging import HostStaging

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _header(slots: Iterable[TensorSlot], wire: torch.dtype | None, metadata: dict[str, str]) -> bytes:
    entries: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for slot in slots:
        size = slot.nbytes(wire)
        entries[slot.name] = {
            "dtype": SAFETENSORS_DTYPES[slot.wire_dtype(wire)],
            "shape": list(slot.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes
    return struct.pack("<Q", len(text)) + text


def encode_stream(
    weights: StreamedWeights,
    version: int,
    *,
    dtype: str | None = "bfloat16",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> WeightBundle:
    """Encode streamed weights as `version`; each tensor is checked against its slot on arrival."""
    wire = encoding_dtype(version, chunk_bytes, dtype)
    for slot in weights.slots:
        if slot.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"weights[{slot.name!r}]: dtype {slot.dtype} cannot be sent")
    metadata = {
        "format": "pt",
        _VERSION_KEY: str(version),
        _ALIASES_KEY: json.dumps(weights.aliases, sort_keys=True),
    }
    head = _header(weights.slots, wire, metadata)
    total = len(head) + sum(slot.nbytes(wire) for slot in weights.slots)
    blob = bytearray(total)
    blob[: len(head)] = head
    chunks: list[WeightChunk] = []
    filled = len(head)
    staging = HostStaging()  # one bucket of host memory for every tensor read off a GPU

    def seal(upto: int) -> None:
        """Hash every chunk whose bytes all lie before `upto`."""
        while (start := len(chunks) * chunk_bytes) < total and min(start + chunk_bytes, total) <= upto:
            part = bytes(blob[start : min(start + chunk_bytes, total)])
            chunks.append(WeightChunk(version, len(chunks), part, digest_hex(part)))

    try:
        for slot in weights.slots:
            item = next(weights.tensors, None)
            if item is None:
                raise ValueError(f"weights: the stream ended before {slot.name!r}")
            name, tensor = item
            if name != slot.name or tuple(tensor.shape) != slot.shape or tensor.dtype != slot.dtype:
                raise ValueError(
                    f"weights[{name!r}]: expected {slot.name!r} {slot.shape} {slot.dtype}, "
                    f"got {tuple(tensor.shape)} {tensor.dtype}"
                )
            out = staging.to_host(tensor.detach().to(dtype=slot.wire_dtype(wire)).contiguous())
            raw = out.reshape(-1).view(torch.uint8).numpy() if out.numel() else b""
            blob[filled : filled + len(raw)] = memoryview(raw).cast("B") if len(raw) else b""
            filled += slot.nbytes(wire)
            del out, tensor, raw
            seal(filled)
        extra = next(weights.tensors, None)
        if extra is not None:
            raise ValueError(f"weights[{extra[0]!r}]: not in the layout")
    finally:
        for _ in weights.tensors:  # the other ranks of a collective gather are waiting on this one
            pass
    seal(total)
    digest = bundle_digest(c.digest for c in chunks)
    header = BundleHeader(version, len(chunks), total, chunk_bytes, digest, dtype)
    return WeightBundle(header, tuple(chunks))
