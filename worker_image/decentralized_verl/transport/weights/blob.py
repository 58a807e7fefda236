"""One version's bytes in one host buffer, written tensor by tensor, its chunks views of that buffer.

What publishing a version costs the learner's host is this buffer and nothing more: the safetensors
header is written first (every tensor's name, shape and wire dtype are known before any byte is), each
tensor is copied straight into its place (off a GPU bucket by bucket through the pinned staging buffer,
`staging.HostStaging.copy_into`), and each chunk is a read-only view of the buffer, hashed as soon as
its last byte is in. No serialized copy of the state dict, no bytes object per chunk: the bytes a
receiver is sent are the bytes held, and a sender turns one chunk at a time into a message.

Both encoders write through it: `codec.encode_state_dict` (a whole state dict) and `stream.encode_stream`
(a sharded learner's tensors as its ranks gather them). The bytes are a valid safetensors file; tensors
lie in the order given, not safetensors' own sort.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import torch
from torch import Tensor

from decentralized_verl.core.streamed_weights import TensorSlot
from decentralized_verl.transport.digest import digest_hex
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


def safetensors_header(
    slots: Sequence[TensorSlot], wire: torch.dtype | None, metadata: dict[str, str]
) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file holding `slots` in order."""
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


class BlobWriter:
    """Fills one buffer with a header and then each slot's tensor in order; `chunks` are (view, digest)
    of every chunk whose bytes are all in, in order."""

    def __init__(
        self,
        slots: Sequence[TensorSlot],
        wire: torch.dtype | None,
        metadata: dict[str, str],
        chunk_bytes: int,
        staging: HostStaging | None = None,
    ) -> None:
        for slot in slots:
            if slot.dtype not in SAFETENSORS_DTYPES:
                raise TypeError(f"weights[{slot.name!r}]: dtype {slot.dtype} cannot be sent")
        head = safetensors_header(slots, wire, metadata)
        self.slots, self.wire, self.chunk_bytes = tuple(slots), wire, chunk_bytes
        self.total = len(head) + sum(slot.nbytes(wire) for slot in slots)
        # Left unzeroed (every byte is written below), so its pages are touched once, by the copies.
        self._bytes = torch.empty(self.total, dtype=torch.uint8)
        self._view = memoryview(self._bytes.numpy()).toreadonly()  # the views keep the buffer alive
        self._bytes[: len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
        self.filled = len(head)
        self.written = 0
        """Slots written so far."""
        self.chunks: list[tuple[memoryview, str]] = []
        self.staging = staging or HostStaging()  # one bucket of host memory for every tensor off a GPU

    def put(self, tensor: Tensor) -> None:
        """Write the next slot's tensor (checked against the slot) in the wire dtype, then hash the chunks
        it completed."""
        if self.written >= len(self.slots):
            raise ValueError("weights: more tensors than the layout holds")
        slot = self.slots[self.written]
        if tuple(tensor.shape) != slot.shape or tensor.dtype != slot.dtype:
            raise ValueError(
                f"weights[{slot.name!r}]: expected {slot.shape} {slot.dtype}, got {tuple(tensor.shape)} "
                f"{tensor.dtype}"
            )
        size = slot.nbytes(self.wire)
        if size:
            out = tensor.detach().to(dtype=slot.wire_dtype(self.wire))  # on its device: one tensor at most
            self.staging.copy_into(out, self._bytes[self.filled : self.filled + size])
            del out
        self.filled += size
        self.written += 1
        self._seal(self.filled)

    def _seal(self, upto: int) -> None:
        """Hash every chunk whose bytes all lie before `upto`."""
        while (start := len(self.chunks) * self.chunk_bytes) < self.total:
            stop = min(start + self.chunk_bytes, self.total)
            if stop > upto:
                return
            part = self._view[start:stop]
            self.chunks.append((part, digest_hex(part)))

    def finish(self) -> list[tuple[memoryview, str]]:
        """Every chunk, once every slot is written."""
        if self.written != len(self.slots):
            raise ValueError(f"weights: the stream ended before {self.slots[self.written].name!r}")
        self._seal(self.total)
        return self.chunks
