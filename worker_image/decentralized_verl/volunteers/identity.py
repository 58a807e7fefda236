"""Deterministic libp2p identities (Ed25519), so peers can be addressed before they start.

The job's bootstrap peer derives its key from the job name: the learner then knows the bootstrap's
full multiaddr from `DVERL_DHT_ADDR=host:port` alone. That id is public knowledge, which is fine: it
lets peers find the DHT, not trust it. The coordinator derives its key from the job *secret*: only the
trusted side can hold it, and join tokens name its peer id, so volunteers talk to the real coordinator.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

_PROTO_ED25519 = 1  # libp2p crypto.proto KeyType.Ed25519


def _pb_key(data: bytes) -> bytes:
    """libp2p's crypto.proto PublicKey/PrivateKey{Type=Ed25519, Data=data} serialised by hand."""
    return bytes([0x08, _PROTO_ED25519, 0x12, len(data)]) + data


def _keys(seed: bytes) -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest())
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    private = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return private, public


def peer_id_of_seed(seed: bytes) -> str:
    """The base58 peer id ("12D3KooW...") of the identity `seed` derives (identity multihash)."""
    import base58

    _, public = _keys(seed)
    encoded = _pb_key(public)
    return base58.b58encode(bytes([0x00, len(encoded)]) + encoded).decode()


def write_identity(seed: bytes, folder: Path) -> Path:
    """Write the private key file p2pd reads (`identity_path`); 0600, in `folder`."""
    private, public = _keys(seed)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"identity-{peer_id_of_seed(seed)[-12:]}.key"
    data = _pb_key(private + public)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    return path


def bootstrap_seed(job: str) -> bytes:
    return f"dverl bootstrap peer\x00{job}".encode()


def coordinator_seed(secret: bytes, job: str) -> bytes:
    return hmac.new(secret, f"dverl coordinator peer\x00{job}".encode(), hashlib.sha256).digest()


def bootstrap_peer_id(job: str) -> str:
    return peer_id_of_seed(bootstrap_seed(job))


def coordinator_peer_id(secret: bytes, job: str) -> str:
    return peer_id_of_seed(coordinator_seed(secret, job))


def bootstrap_maddr(host_port: str, job: str) -> str:
    """`/ip4/H/tcp/P/p2p/ID` (or /dns/...) of the job's bootstrap peer from `host:port`."""
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"DVERL_DHT_ADDR: expected host:port (got {host_port!r})")
    proto = "ip4" if host.replace(".", "").isdigit() else "dns"
    return f"/{proto}/{host}/tcp/{port}/p2p/{bootstrap_peer_id(job)}"
