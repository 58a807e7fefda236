"""The weight-transfer codec: a state dict <-> versioned, hashed chunks of safetensors bytes.

Pure (no sockets, no gRPC): the learner encodes once and the transport streams the chunks to any number
of rollout workers; each receiver feeds them to a ``WeightAssembler`` in whatever order they arrive.

Trust model: the ``BundleHeader`` (version, chunk count, sizes, bundle digest) comes first from the
learner; every chunk is checked against its own digest on arrival (so a corrupted chunk is named and can
be re-requested) and, at the end, the chunk digests in order against the header's digest.

Digests are BLAKE3 (`transport.digest`): hashing is the receivers' largest cost, so the hash sets the
rate a receiver can verify weights at.

The bundle digest is ``bundle_digest``: the BLAKE3 of the chunks' digests concatenated in order
(a one-level hash tree, as BitTorrent's piece list). Since every chunk's bytes are hashed on arrival and
must match its digest, the digest binds every byte, the order and the count, like a hash of the whole
blob would, but the receiver hashes each byte once instead of twice (per chunk, then the whole blob).
The learner signs the manifest holding the bundle digest (`signing`), so no relay can forge it.

Tied weights and other aliases: a tensor that is the exact same view as an earlier one (e.g.
``lm_head.weight`` tied to ``model.embed_tokens.weight``) is sent once and recorded as an alias in the
safetensors metadata; the decoder puts the *same* tensor object back under the alias name. Tensors that
share storage without being the same view (slices of a fused buffer) are sent separately, each copied
into its own place.

Wire dtype: ``dtype="bfloat16"`` (the default) casts floating tensors to bf16, halving the bytes; the
receiver casts back to its model's dtypes with ``cast_like``. Integer and bool tensors keep their dtype.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from safetensors.torch import load as safetensors_load
from torch import Tensor

from decentralized_verl.core.streamed_weights import TensorSlot
from decentralized_verl.errors import WireError
from decentralized_verl.transport.digest import blake3, digest_hex
from decentralized_verl.transport.weights.blob import BlobWriter

WIRE_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
# Below gRPC's default 4 MiB message limit with room for the message's other fields.
DEFAULT_CHUNK_BYTES = 2 * 1024 * 1024
_VERSION_KEY = "dverl.version"
_ALIASES_KEY = "dverl.aliases"


def bundle_digest(chunk_digests: Iterable[str]) -> str:
    """The bundle digest: BLAKE3 over the chunks' 32-byte digests in order (hex in, hex out).

    Cheap (32 bytes a chunk), so checking it costs nothing next to hashing the chunks themselves.
    """
    whole = blake3()
    for digest in chunk_digests:
        whole.update(bytes.fromhex(digest))
    return whole.hexdigest()


@dataclass(frozen=True)
class WeightChunk:
    """Bytes ``[index * chunk_bytes, ...)`` of one bundle, with their own digest (hex)."""

    version: int
    index: int
    data: bytes | memoryview
    """Bytes, or a read-only view of the one buffer the version was encoded or bulk-received into."""
    digest: str


@dataclass(frozen=True)
class BundleHeader:
    """What a receiver needs before the first chunk: enough to size, order and verify the rest."""

    version: int
    num_chunks: int
    total_bytes: int
    chunk_bytes: int
    digest: str
    dtype: str | None

    def chunk_size(self, index: int) -> int:
        """Exact length chunk ``index`` must have (all are ``chunk_bytes`` but the last)."""
        if index < self.num_chunks - 1:
            return self.chunk_bytes
        return self.total_bytes - self.chunk_bytes * (self.num_chunks - 1)


@dataclass(frozen=True)
class WeightBundle:
    """A whole encoded state dict: its header and every chunk in order."""

    header: BundleHeader
    chunks: tuple[WeightChunk, ...]

    @property
    def version(self) -> int:
        return self.header.version

    def payload(self) -> bytes:
        return b"".join(c.data for c in self.chunks)


def distinct_tensors(state_dict: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors to send (each distinct view once) and alias name -> sent name; nothing is copied."""
    views: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    tensors: dict[str, Tensor] = {}
    for name, tensor in state_dict.items():
        if not isinstance(name, str) or not isinstance(tensor, Tensor):
            raise TypeError(
                f"state_dict[{name!r}]: expected a str name and a tensor (got {type(tensor).__name__})"
            )
        view = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        if tensor.numel() > 0 and view in views:
            aliases[name] = views[view]
            continue
        views[view] = name
        tensors[name] = tensor
    return tensors, aliases


def encoding_dtype(version: int, chunk_bytes: int, dtype: str | None) -> torch.dtype | None:
    """The torch dtype floating tensors go on the wire as (None: each keeps its own), once an encoder's
    arguments are checked; ValueError naming the argument that is wrong."""
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"version: must be an integer >= 0 (got {version!r})")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes: must be >= 1 (got {chunk_bytes})")
    if dtype is not None and dtype not in WIRE_DTYPES:
        raise ValueError(f"dtype: must be one of {sorted(WIRE_DTYPES)} or None (got {dtype!r})")
    return WIRE_DTYPES[dtype] if dtype else None


def encode_state_dict(
    state_dict: Mapping[str, Tensor],
    version: int,
    *,
    dtype: str | None = "bfloat16",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    metadata: Mapping[str, str] | None = None,
) -> WeightBundle:
    """Serialize ``state_dict`` as safetensors bytes tagged with ``version``, in one buffer whose chunks are
    views of it (`blob.BlobWriter`): the bundle is the only copy the host holds.

    ``dtype`` is the wire dtype for floating tensors (``None`` keeps each tensor's own dtype);
    ``metadata`` adds entries to the blob's header (a decoder returns them on `WireStateDict.metadata`).
    """
    wire = encoding_dtype(version, chunk_bytes, dtype)
    tensors, aliases = distinct_tensors(state_dict)
    header = {**(metadata or {}), "format": "pt", _VERSION_KEY: str(version)}
    header[_ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    slots = [TensorSlot(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
    writer = BlobWriter(slots, wire, header, chunk_bytes)
    for tensor in tensors.values():
        writer.put(tensor)
    return bundle_of(writer, version, dtype)


def bundle_of(writer: BlobWriter, version: int, dtype: str | None) -> WeightBundle:
    """The bundle a filled writer holds: its chunks are views of the writer's one buffer."""
    chunks = tuple(WeightChunk(version, i, part, digest) for i, (part, digest) in enumerate(writer.finish()))
    digest = bundle_digest(c.digest for c in chunks)
    return WeightBundle(
        BundleHeader(version, len(chunks), writer.total, writer.chunk_bytes, digest, dtype), chunks
    )


def _safetensors_metadata(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (8-byte little-endian header length, then JSON)."""
    try:
        (length,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + length])
    except (struct.error, ValueError) as exc:
        raise WireError("weights.payload", f"not a safetensors blob ({exc})") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


class WireStateDict(dict):
    """Decoded tensors plus the blob's header metadata (e.g. the learner's signed per-span manifests)."""

    metadata: dict[str, str]

    def __init__(self, tensors: Mapping[str, Tensor], metadata: Mapping[str, str]) -> None:
        super().__init__(tensors)
        self.metadata = dict(metadata)


def decode_state_dict(blob: bytes, version: int | None = None) -> WireStateDict:
    """Tensors from an encoded bundle's bytes; aliases come back as the same tensor object.

    With ``version`` given, a blob tagged with another version is rejected.
    """
    metadata = _safetensors_metadata(blob)
    tagged = metadata.get(_VERSION_KEY)
    if version is not None and tagged != str(version):
        raise WireError(
            "weights.version", f"payload is tagged version {tagged} but version {version} was expected"
        )
    try:
        tensors = safetensors_load(blob)
    except Exception as exc:  # safetensors raises its own error types for malformed payloads
        raise WireError("weights.payload", f"cannot be decoded as safetensors ({exc})") from None
    try:
        aliases = json.loads(metadata.get(_ALIASES_KEY, "{}"))
    except ValueError:
        raise WireError("weights.aliases", "metadata is not valid JSON") from None
    for alias, target in aliases.items():
        if target not in tensors:
            raise WireError("weights.aliases", f"{alias!r} points at {target!r}, which is not in the payload")
        tensors[alias] = tensors[target]
    return WireStateDict(tensors, metadata)


class WeightAssembler:
    """Collects one bundle's chunks, in any order, verifying each; ``finish`` returns the state dict.

    The one assembler every receiver uses (the gRPC and P2P pullers and relays reach it through
    `weight_service.BundleBuilder`, which adds the wire manifest's checks). Errors are ``WireError``
    naming the chunk: wrong version, index out of range, a second copy of an index (a resend is an
    error: the receiver starts a new assembler rather than guessing), wrong length, or a digest mismatch.
    A rejected chunk leaves the assembler as it was, so it can be resent.
    """

    def __init__(self, header: BundleHeader) -> None:
        if header.num_chunks < 1 or header.chunk_bytes < 1 or header.total_bytes < 1:
            raise WireError("weights.header", "num_chunks, chunk_bytes and total_bytes must be >= 1")
        n, size, total = header.num_chunks, header.chunk_bytes, header.total_bytes
        if not size * (n - 1) < total <= size * n:
            raise WireError("weights.header", f"{n} chunks of {size} bytes cannot hold exactly {total} bytes")
        self.header = header
        self.received: dict[int, WeightChunk] = {}
        """Index -> accepted chunk."""

    @property
    def missing(self) -> list[int]:
        return [i for i in range(self.header.num_chunks) if i not in self.received]

    @property
    def complete(self) -> bool:
        return len(self.received) == self.header.num_chunks

    def add(self, chunk: WeightChunk, *, hashed: bool = False) -> bool:
        """Accept one chunk after checking it; return whether the bundle is now complete.

        ``hashed=True`` says the caller computed ``chunk.digest`` from ``chunk.data`` itself (e.g.
        `weight_service.checked_chunk`), so the bytes are not hashed a second time.
        """
        where = f"weights.chunk[{chunk.index}]"
        if chunk.version != self.header.version:
            raise WireError(
                where, f"is for version {chunk.version} but this bundle is version {self.header.version}"
            )
        if not 0 <= chunk.index < self.header.num_chunks:
            raise WireError(where, f"index out of range (the bundle has {self.header.num_chunks} chunks)")
        if chunk.index in self.received:
            raise WireError(where, "received twice")
        expected = self.header.chunk_size(chunk.index)
        if len(chunk.data) != expected:
            raise WireError(where, f"has {len(chunk.data)} bytes, expected {expected}")
        if not hashed and digest_hex(chunk.data) != chunk.digest:
            raise WireError(where, "digest mismatch (corrupted in transit)")
        self.received[chunk.index] = chunk
        return self.complete

    def bundle(self) -> WeightBundle:
        """The verified bundle (chunk digests against the header's bundle digest), not decoded."""
        if not self.complete:
            raise WireError("weights.chunks", f"missing chunk(s) {self.missing} of {self.header.num_chunks}")
        chunks = tuple(self.received[i] for i in range(self.header.num_chunks))
        if bundle_digest(c.digest for c in chunks) != self.header.digest:
            raise WireError("weights.digest", "the assembled bundle does not match the header's digest")
        return WeightBundle(self.header, chunks)

    def finish(self) -> dict[str, Tensor]:
        """Verify the bundle digest, join and decode; the tensors are in the wire dtype."""
        return decode_bundle(self.bundle())


def decode_bundle(bundle: WeightBundle) -> dict[str, Tensor]:
    """Tensors of a bundle that was already verified (encoded here, or received through a
    `WeightAssembler` / `BundleBuilder`): decoding does not hash the bytes again."""
    return decode_state_dict(bundle.payload(), bundle.header.version)


def cast_like(state_dict: Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Cast each floating tensor to the dtype of the same name in ``reference`` (e.g. ``model.state_dict()``).

    Aliases stay aliases (one cast per distinct tensor); names absent from ``reference`` pass unchanged
    so that the loader, not this helper, reports them. A `WireStateDict` keeps its metadata.
    """
    done: dict[int, Tensor] = {}
    out: dict[str, Tensor] = {}
    for name, tensor in state_dict.items():
        if id(tensor) in done:
            out[name] = done[id(tensor)]
            continue
        ref = reference.get(name)
        cast = tensor.to(ref.dtype) if ref is not None and tensor.is_floating_point() else tensor
        done[id(tensor)] = out[name] = cast
    return WireStateDict(out, state_dict.metadata) if isinstance(state_dict, WireStateDict) else out
