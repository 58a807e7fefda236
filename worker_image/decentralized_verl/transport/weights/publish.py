"""Weights from the learner to rollout workers: a publisher that keeps the newest encoded versions (the
gRPC `Weights` service that streams them is `service`, the receiving side `receive`).

The learner encodes a version once (`transport.weights.codec` codec: safetensors bytes cut into hashed chunks)
and any number of workers fetch it. Only the newest `keep` versions are held: a worker that missed
versions fetches the latest, never the ones in between. A receiver (`BundleBuilder`) hashes every chunk
once as it arrives and checks it against the manifest, and the chunk digests against the manifest's
bundle digest at the end, so a corrupted transfer is rejected before any weight changes; a broken
stream is resumed once from the next missing chunk. Every version a publisher holds was verified (or
encoded here), so reading it back (`decode_held`) does not hash it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from decentralized_verl.core.streamed_weights import StreamedWeights
from decentralized_verl.security.trust import PROCESS_KEY, weights_signing_key
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.weights import signing
from decentralized_verl.transport.weights.codec import (
    DEFAULT_CHUNK_BYTES,
    WIRE_DTYPES,
    BundleHeader,
    WeightBundle,
    decode_bundle,
    encode_state_dict,
)
from decentralized_verl.transport.weights.stream import encode_stream

log = logging.getLogger(__name__)

NATIVE_DTYPE = "native"
BundleMetadata = Callable[[Mapping[str, Tensor], int, "bytes | None", "torch.dtype | None"], dict[str, str]]
"""(state dict, version, signing key, wire dtype) -> extra entries for the bundle's metadata."""
"""The manifest's dtype when tensors travel in their own dtypes (the codec's dtype=None)."""


def header_of(manifest: m.WeightManifest) -> BundleHeader:
    """The codec's header for a (validated) wire manifest."""
    dtype = None if manifest.dtype == NATIVE_DTYPE else manifest.dtype
    return BundleHeader(
        version=manifest.version,
        num_chunks=len(manifest.chunk_digests),
        total_bytes=manifest.total_bytes,
        chunk_bytes=manifest.chunk_bytes,
        digest=manifest.digest,
        dtype=dtype,
    )


def manifest_of(bundle: WeightBundle, *, is_adapter: bool = False) -> m.WeightManifest:
    h = bundle.header
    return m.WeightManifest(
        version=h.version,
        total_bytes=h.total_bytes,
        digest=h.digest,
        chunk_digests=tuple(c.digest for c in bundle.chunks),
        chunk_bytes=h.chunk_bytes,
        format="safetensors",
        dtype=h.dtype or NATIVE_DTYPE,
        is_adapter=is_adapter,
    )


@dataclass(frozen=True)
class Published:
    """One held version: its manifest and its chunks (immutable, shared by every concurrent stream)."""

    manifest: m.WeightManifest
    bundle: WeightBundle


class WeightPublisher:
    """Learner side: encode each new version once and hold the newest `keep` for fetching.

    `dtype` is the wire dtype of floating tensors ("bfloat16" halves the bytes; None keeps the model's
    own dtype, bit-exact). `is_adapter` marks LoRA-only state dicts in the manifest. `signing_key` signs
    every manifest it publishes (default: this process's, which only the job's learner holds).
    `bundle_metadata` adds entries to each bundle from its tensors (a rollout served as layer spans gets
    one signed manifest per span, so a span server can check its own share: `spans.signed`).
    Thread-safe: `publish` runs on the learner's thread while the gRPC service reads from the event loop.
    """

    def __init__(
        self,
        *,
        dtype: str | None = "bfloat16",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        keep: int = 2,
        is_adapter: bool = False,
        signing_key: bytes | object | None = PROCESS_KEY,
        bundle_metadata: BundleMetadata | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep: must be >= 1 (got {keep})")
        self.dtype = dtype
        self.chunk_bytes = chunk_bytes
        self.keep = keep
        self.is_adapter = is_adapter
        self.signing_key = weights_signing_key() if signing_key is PROCESS_KEY else signing_key
        self.bundle_metadata = bundle_metadata
        self._held: dict[int, Published] = {}
        self._changed = threading.Condition()

    def publish(self, state_dict: Mapping[str, Tensor] | StreamedWeights, version: int) -> m.WeightManifest:
        """Encode `state_dict` as `version` (must be newer than every held version) and hold it; a sharded
        learner's `StreamedWeights` are encoded tensor by tensor as they are gathered."""
        if isinstance(state_dict, StreamedWeights):
            bundle = encode_stream(state_dict, version, dtype=self.dtype, chunk_bytes=self.chunk_bytes)
            if self.bundle_metadata:  # it is made from the tensors, which the stream's header goes before
                whole = decode_bundle(bundle)
                metadata = self._metadata(whole, version)
                bundle = encode_state_dict(
                    whole, version, dtype=None, chunk_bytes=self.chunk_bytes, metadata=metadata
                )
        else:
            metadata = self._metadata(state_dict, version) if self.bundle_metadata else None
            bundle = encode_state_dict(
                state_dict, version, dtype=self.dtype, chunk_bytes=self.chunk_bytes, metadata=metadata
            )
        manifest = manifest_of(bundle, is_adapter=self.is_adapter)
        if self.signing_key is not None:
            manifest = signing.sign(manifest, self.signing_key)
        self.store(Published(manifest, bundle))
        return manifest

    def _metadata(self, state_dict: Mapping[str, Tensor], version: int) -> dict[str, str]:
        wire = WIRE_DTYPES[self.dtype] if self.dtype else None
        key = self.signing_key if isinstance(self.signing_key, bytes) else None
        return self.bundle_metadata(state_dict, version, key, wire)

    def store(self, published: Published) -> None:
        """Hold an already encoded (or received and verified) version; the oldest beyond `keep` go."""
        version = published.manifest.version
        with self._changed:
            latest = self.latest_version
            if latest is not None and version <= latest:
                raise ValueError(f"version {version} is not newer than the latest published {latest}")
            self._held[version] = published
            for old in sorted(self._held)[: -self.keep]:
                del self._held[old]
            self._changed.notify_all()

    @property
    def latest_version(self) -> int | None:
        return max(self._held) if self._held else None

    @property
    def versions(self) -> list[int]:
        return sorted(self._held)

    def get(self, version: int | None = None) -> Published | None:
        """The held version `version`, or the newest when None; None when not held."""
        held = dict(self._held)
        if not held:
            return None
        return held.get(max(held) if version is None else version)

    def wait_for(self, min_version: int, timeout: float) -> Published | None:
        """Block until a version >= min_version is held (the newest is returned), or None at timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                latest = self.get()
                if latest is not None and latest.manifest.version >= min_version:
                    return latest
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
