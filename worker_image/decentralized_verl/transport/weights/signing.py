"""Weight manifests signed by the job's learner, checked by every receiver before a byte is applied.

A manifest binds a version's every byte (its bundle digest is a hash of the chunk digests, and every
chunk is hashed against its own digest on arrival), so signing the manifest signs the weights. The
signature covers the version, the sizes, the format, the dtype, the adapter flag and the bundle digest; a
relay, a volunteer or any caller that can reach a worker can forward a signed version but not make one.
"""

from __future__ import annotations

import dataclasses
import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from decentralized_verl.errors import WireError
from decentralized_verl.transport.wire.weights import WeightManifest

DOMAIN = b"dverl-weights-v1\x00"


def signed_bytes(manifest: WeightManifest) -> bytes:
    """The exact bytes a signature covers (the signature itself excluded)."""
    fields = (manifest.format, manifest.dtype, manifest.digest)
    text = b"\x00".join(f.encode() for f in fields)
    numbers = struct.pack(
        ">QQQQ?", manifest.version, manifest.total_bytes, manifest.chunk_bytes, len(manifest.chunk_digests),
        manifest.is_adapter,
    )  # fmt: skip
    return DOMAIN + numbers + text


def sign(manifest: WeightManifest, signing_key: bytes) -> WeightManifest:
    key = Ed25519PrivateKey.from_private_bytes(signing_key)
    return dataclasses.replace(manifest, signature=key.sign(signed_bytes(manifest)))


def check(manifest: WeightManifest, verify_key: bytes, path: str = "manifest.signature") -> None:
    """Raise WireError unless `manifest` carries a valid signature by the holder of `verify_key`'s pair."""
    if not manifest.signature:
        raise WireError(
            path, f"weights v{manifest.version} are not signed; this job accepts signed weights only"
        )
    try:
        Ed25519PublicKey.from_public_bytes(verify_key).verify(manifest.signature, signed_bytes(manifest))
    except InvalidSignature:
        raise WireError(path, f"weights v{manifest.version}: not signed by this job's learner") from None
