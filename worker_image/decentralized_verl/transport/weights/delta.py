"""Weight deltas: version v+1 as a lossless difference from version v, in the bytes the receiver serves.

A version's bundle is a safetensors blob: a JSON header, then every tensor's bytes in the wire dtype.
Between two versions of the same model the layout of the data region is identical and, with bf16
serving and a small learning rate, most elements do not change at all (an fp32 update smaller than
half a bf16 ulp rounds to the same bf16). The delta is the new header plus the XOR of the two data
regions, compressed with zstd: unchanged bytes are zeros, which zstd squeezes to almost nothing.

Trust is unchanged: a receiver applies the delta to the bundle it holds and checks the result against
the new version's signed manifest (every chunk's digest and the bundle digest), exactly as if the full
bundle had arrived, so a wrong base, a corrupted delta or a forged one is refused and nothing is held.

Frame: b"DVD1", a 4-byte little-endian header length, a JSON header (base, version, header_bytes,
data_bytes, codec), then the zstd stream. Pure: no sockets here (delta_p2p carries frames).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np
import zstandard

from decentralized_verl.errors import WireError

MAGIC = b"DVD1"
CODEC = "xor-zstd"
ZSTD_LEVEL = 3
MAX_FRAME_HEADER = 4096


def split_safetensors(blob: bytes | memoryview) -> tuple[memoryview, memoryview]:
    """(header, data) of a safetensors blob: the 8-byte length and JSON header, then the tensors' bytes."""
    view = memoryview(blob)
    if len(view) < 8:
        raise WireError("weights.payload", f"{len(view)} bytes is too short for a safetensors blob")
    (length,) = struct.unpack("<Q", view[:8])
    if 8 + length > len(view):
        raise WireError("weights.payload", f"safetensors header of {length} bytes overruns the blob")
    return view[: 8 + length], view[8 + length :]


@dataclass(frozen=True)
class DeltaInfo:
    """A frame's header: which versions it joins and the sizes the result must have."""

    base: int
    version: int
    header_bytes: int
    data_bytes: int
    codec: str = CODEC

    @property
    def total_bytes(self) -> int:
        return self.header_bytes + self.data_bytes


def encode_delta(
    base: bytes | memoryview,
    target: bytes | memoryview,
    base_version: int,
    version: int,
    *,
    max_changed: float = 1.0,
) -> bytes:
    """The frame turning bundle payload `base` (version `base_version`) into `target` (`version`).

    Raises WireError when the two data regions differ in size (a different model or wire dtype): a delta
    only exists between versions of one layout; and when more than `max_changed` of the data bytes
    differ, before spending the compression on a delta that would not be worth sending (fp32 weights
    after an optimizer step change nearly every byte)."""
    if version <= base_version:
        raise WireError("weights.delta", f"version {version} is not newer than its base {base_version}")
    _, base_data = split_safetensors(base)
    target_header, target_data = split_safetensors(target)
    if len(base_data) != len(target_data):
        raise WireError(
            "weights.delta",
            f"v{base_version} has {len(base_data)} data bytes, v{version} {len(target_data)}: layouts differ",
        )
    xor = np.bitwise_xor(np.frombuffer(base_data, np.uint8), np.frombuffer(target_data, np.uint8))
    if max_changed < 1.0:
        changed = np.count_nonzero(xor) / max(1, xor.size)
        if changed > max_changed:
            raise WireError("weights.delta", f"{changed:.0%} of the bytes changed: not worth a delta")
    info = DeltaInfo(base_version, version, len(target_header), len(target_data))
    head = json.dumps(vars(info), sort_keys=True).encode()
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    body = compressor.compress(bytes(target_header) + xor.tobytes())
    return MAGIC + struct.pack("<I", len(head)) + head + body


def read_info(frame: bytes | memoryview) -> tuple[DeltaInfo, memoryview]:
    """A frame's header and its compressed body; WireError naming what is wrong with a malformed one."""
    view = memoryview(frame)
    if bytes(view[:4]) != MAGIC or len(view) < 8:
        raise WireError("weights.delta", "not a delta frame (bad magic)")
    (length,) = struct.unpack("<I", view[4:8])
    if not 0 < length <= MAX_FRAME_HEADER or 8 + length > len(view):
        raise WireError("weights.delta", f"frame header length {length} is out of range")
    try:
        raw = json.loads(bytes(view[8 : 8 + length]))
        info = DeltaInfo(
            base=int(raw["base"]),
            version=int(raw["version"]),
            header_bytes=int(raw["header_bytes"]),
            data_bytes=int(raw["data_bytes"]),
            codec=str(raw["codec"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError("weights.delta", f"malformed frame header: {exc}") from None
    if info.codec != CODEC:
        raise WireError("weights.delta.codec", f"{info.codec!r} is not supported (only {CODEC!r})")
    if info.header_bytes < 8 or info.data_bytes < 0:
        raise WireError("weights.delta", f"impossible sizes {info.header_bytes}/{info.data_bytes}")
    return info, view[8 + length :]


def apply_delta(base: bytes | memoryview, frame: bytes | memoryview, base_version: int) -> tuple[int, bytes]:
    """(version, payload) from the payload of `base_version` and a frame made against it.

    The result is not trusted yet: the caller checks it against that version's signed manifest."""
    info, body = read_info(frame)
    if info.base != base_version:
        raise WireError(
            "weights.delta.base", f"the frame is against v{info.base}, this receiver holds v{base_version}"
        )
    _, base_data = split_safetensors(base)
    if len(base_data) != info.data_bytes:
        raise WireError(
            "weights.delta",
            f"held v{base_version} has {len(base_data)} data bytes, the frame {info.data_bytes}",
        )
    try:
        raw = zstandard.ZstdDecompressor().decompress(bytes(body), max_output_size=info.total_bytes)
    except Exception as exc:  # zstandard.ZstdError and friends: a damaged stream
        raise WireError("weights.delta", f"cannot be decompressed ({exc})") from None
    if len(raw) != info.total_bytes:
        raise WireError("weights.delta", f"decompressed to {len(raw)} bytes, {info.total_bytes} expected")
    out = bytearray(raw)
    data = np.frombuffer(out, np.uint8)[info.header_bytes :]
    np.bitwise_xor(data, np.frombuffer(base_data, np.uint8), out=data)
    return info.version, bytes(out)


def apply_chain(base: bytes | memoryview, frames: list[bytes], base_version: int) -> tuple[int, bytes]:
    """Apply consecutive frames (v -> v+1 -> ... -> L); each must start where the last ended."""
    version, payload = base_version, bytes(base)
    for frame in frames:
        version, payload = apply_delta(payload, frame, version)
    return version, payload


def changed_fraction(base: bytes | memoryview, target: bytes | memoryview, element_bytes: int) -> float:
    """Fraction of `element_bytes`-wide elements of the data region that differ (what a delta carries)."""
    _, a = split_safetensors(base)
    _, b = split_safetensors(target)
    if len(a) != len(b) or len(a) % element_bytes:
        raise ValueError("the two payloads do not share a layout of whole elements")
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[element_bytes]
    x, y = np.frombuffer(a, dtype), np.frombuffer(b, dtype)
    return float(np.count_nonzero(x != y)) / max(1, x.size)
