"""Weight manifests and chunks: versioned, hashed, in order."""

from __future__ import annotations

from dataclasses import dataclass, field

from decentralized_verl.transport.digest import digest_hex
from decentralized_verl.transport.wire.common import (
    _HEX64,
    WEIGHT_FORMATS,
    WireError,
    _check_nonempty_text,
    pb,
)


@dataclass(frozen=True)
class WeightManifest:
    """Everything a receiver needs to verify a weight version chunk by chunk and as a whole."""

    version: int
    total_bytes: int
    digest: str
    chunk_digests: tuple[str, ...]
    chunk_bytes: int
    format: str = "safetensors"
    dtype: str = "float32"
    is_adapter: bool = False
    signature: bytes = b""
    """The learner's Ed25519 signature over the fields above (`weights.signing`); empty when unsigned."""

    def chunk_size(self, index: int) -> int:
        """Bytes in chunk `index`: chunk_bytes for all but the last, the remainder for the last."""
        if index < len(self.chunk_digests) - 1:
            return self.chunk_bytes
        return self.total_bytes - self.chunk_bytes * (len(self.chunk_digests) - 1)


@dataclass(frozen=True)
class WeightChunk:
    """One verified piece of a weight version."""

    version: int
    index: int
    total: int
    data: bytes
    digest: str
    manifest: WeightManifest | None = field(default=None, compare=False)


def manifest_to_proto(m: WeightManifest) -> pb.WeightManifest:
    return pb.WeightManifest(
        version=m.version,
        total_bytes=m.total_bytes,
        digest=m.digest,
        chunk_digests=list(m.chunk_digests),
        chunk_bytes=m.chunk_bytes,
        format=m.format,
        dtype=m.dtype,
        is_adapter=m.is_adapter,
        signature=m.signature,
    )


def manifest_from_proto(msg: pb.WeightManifest, path: str = "manifest") -> WeightManifest:
    """Validate a manifest: known format, well-formed hashes, a chunk count that fits the sizes."""
    if msg.format not in WEIGHT_FORMATS:
        known = ", ".join(sorted(WEIGHT_FORMATS))
        raise WireError(f"{path}.format", f"unsupported format {msg.format!r} (one of {known})")
    _check_nonempty_text(msg.dtype, f"{path}.dtype")
    if not _HEX64.fullmatch(msg.digest):
        raise WireError(f"{path}.digest", "must be 64 lowercase hex digits")
    for i, h in enumerate(msg.chunk_digests):
        if not _HEX64.fullmatch(h):
            raise WireError(f"{path}.chunk_digests[{i}]", "must be 64 lowercase hex digits")
    if msg.total_bytes == 0:
        raise WireError(f"{path}.total_bytes", "must be > 0")
    if msg.chunk_bytes == 0:
        raise WireError(f"{path}.chunk_bytes", "must be > 0")
    want = -(-msg.total_bytes // msg.chunk_bytes)
    if len(msg.chunk_digests) != want:
        raise WireError(
            f"{path}.chunk_digests",
            f"{len(msg.chunk_digests)} chunk hashes, but {msg.total_bytes} bytes in chunks of "
            f"{msg.chunk_bytes} make {want}",
        )
    if msg.signature and len(msg.signature) != 64:
        raise WireError(f"{path}.signature", f"an Ed25519 signature has 64 bytes (got {len(msg.signature)})")
    return WeightManifest(
        version=msg.version,
        total_bytes=msg.total_bytes,
        digest=msg.digest,
        chunk_digests=tuple(msg.chunk_digests),
        chunk_bytes=msg.chunk_bytes,
        format=msg.format,
        dtype=msg.dtype,
        is_adapter=msg.is_adapter,
        signature=msg.signature,
    )


def chunk_to_proto(c: WeightChunk) -> pb.WeightChunk:
    data = c.data if isinstance(c.data, bytes) else bytes(c.data)  # a bulk-received version: buffer views
    msg = pb.WeightChunk(version=c.version, index=c.index, total=c.total, data=data, digest=c.digest)
    if c.manifest is not None:
        msg.manifest.CopyFrom(manifest_to_proto(c.manifest))
    return msg


def chunk_from_proto(msg: pb.WeightChunk, manifest: WeightManifest, path: str = "chunk") -> WeightChunk:
    """Validate one chunk against the manifest of its version: place, size and both hashes.

    ``msg.data`` is read once: with upb every read of a bytes field is a fresh copy, which at multi-MiB
    chunks costs a good part of a hashing pass.
    """
    data = msg.data
    if msg.version != manifest.version:
        raise WireError(f"{path}.version", f"got {msg.version}, expected {manifest.version}")
    n = len(manifest.chunk_digests)
    if msg.total != n:
        raise WireError(f"{path}.total", f"got {msg.total}, the manifest has {n} chunks")
    if msg.index >= n:
        raise WireError(f"{path}.index", f"{msg.index} is outside [0, {n})")
    size = manifest.chunk_size(msg.index)
    if len(data) != size:
        raise WireError(f"{path}.data", f"{len(data)} bytes, chunk {msg.index} must have {size}")
    digest = digest_hex(data)
    if msg.digest != digest:
        raise WireError(f"{path}.digest", f"does not match the data (data hashes to {digest[:12]}...)")
    if digest != manifest.chunk_digests[msg.index]:
        raise WireError(f"{path}.digest", f"does not match the manifest's chunk_digests[{msg.index}]")
    attached = manifest_from_proto(msg.manifest, f"{path}.manifest") if msg.HasField("manifest") else None
    return WeightChunk(msg.version, msg.index, msg.total, data, digest, attached)
