"""libp2p identities (Ed25519) this process holds the key of, so peers can be addressed before they start
and sign what they write (`volunteers.signed_records`).

The job's bootstrap peer gets a random key issued with the job's credentials (only its own process holds
the private half; every process of the job holds its peer id, `dht.peer`), so the learner knows the
bootstrap's full multiaddr from `DVERL_DHT_ADDR=host:port` alone and nobody who merely knows the job's
name can start a peer with its identity. The coordinator derives its key from the job *secret*: only the
trusted side can hold it, and join tokens name its peer id, so volunteers talk to the real coordinator.
A volunteer's key is random, made where it runs.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

_PROTO_ED25519 = 1  # libp2p crypto.proto KeyType.Ed25519
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
"""Bitcoin's base58 alphabet, the one libp2p writes peer ids in."""


def b58encode(raw: bytes) -> str:
    """`raw` in base58, each leading zero byte as a leading "1" (what libp2p and the `base58` package
    write; done here because the operator, which issues peer ids, installs no libp2p)."""
    number, digits = int.from_bytes(raw, "big"), []
    while number:
        number, digit = divmod(number, 58)
        digits.append(_BASE58[digit])
    zeros = len(raw) - len(raw.lstrip(b"\0"))
    return "1" * zeros + "".join(reversed(digits))


def b58decode(text: str) -> bytes:
    """The bytes `text` encodes in base58; ValueError naming the first character outside the alphabet."""
    text = text.rstrip()
    number = 0
    for char in text:
        digit = _BASE58.find(char)
        if digit < 0:
            raise ValueError(f"invalid base58 character {char!r}")
        number = number * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    return b"\0" * zeros + number.to_bytes((number.bit_length() + 7) // 8, "big")


def _pb_key(data: bytes) -> bytes:
    """libp2p's crypto.proto PublicKey/PrivateKey{Type=Ed25519, Data=data} serialised by hand."""
    return bytes([0x08, _PROTO_ED25519, 0x12, len(data)]) + data


def keypair(seed: bytes) -> tuple[bytes, bytes]:
    """(raw private, raw public) Ed25519 key of the identity `seed` derives."""
    key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest())
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    private = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return private, public


def peer_id_of_seed(seed: bytes) -> str:
    """The base58 peer id ("12D3KooW...") of the identity `seed` derives (identity multihash)."""
    return peer_id_of_public(keypair(seed)[1])


def peer_id_of_public(public: bytes) -> str:
    """The peer id of a raw Ed25519 public key: the identity multihash of its protobuf encoding."""
    encoded = _pb_key(public)
    return b58encode(bytes([0x00, len(encoded)]) + encoded)


def public_key_of_peer(peer_id: str) -> bytes:
    """The raw Ed25519 public key a peer id names (an Ed25519 id *is* its key); ValueError for any other
    id (an RSA peer's hashed id names no key one could check a signature with)."""
    try:
        raw = b58decode(peer_id)
    except ValueError:
        raise ValueError(f"peer id {peer_id[:60]!r}: not base58") from None
    prefix = bytes([0x00, 36, 0x08, _PROTO_ED25519, 0x12, 32])
    if len(raw) != len(prefix) + 32 or not raw.startswith(prefix):
        raise ValueError(f"peer id {peer_id[:60]!r}: not an Ed25519 identity")
    return raw[len(prefix) :]


def write_identity(seed: bytes, folder: Path) -> Path:
    """Write the private key file p2pd reads (`identity_path`); 0600, in `folder`."""
    private, public = keypair(seed)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"identity-{peer_id_of_seed(seed)[-12:]}.key"
    data = _pb_key(private + public)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    return path


def random_seed() -> bytes:
    """A fresh identity: a volunteer's, or a job's bootstrap peer's (issued with its credentials)."""
    return os.urandom(32)


def coordinator_seed(secret: bytes, job: str) -> bytes:
    return hmac.new(secret, f"dverl coordinator peer\x00{job}".encode(), hashlib.sha256).digest()


def coordinator_peer_id(secret: bytes, job: str) -> str:
    return peer_id_of_seed(coordinator_seed(secret, job))


def bootstrap_maddr(address: str, peer_id: str | None) -> str:
    """`/ip4/H/tcp/P/p2p/ID` (or /dns/...) of the job's bootstrap peer from `host:port` and its peer id
    (the job credentials' `dht.peer`); a whole multiaddr (`/ip4/.../p2p/ID`, what `dverl dht` prints) is
    taken as it is."""
    if address.startswith("/"):
        if "/p2p/" not in address:
            raise ValueError(f"DVERL_DHT_ADDR: a multiaddr must end in /p2p/<peer id> (got {address!r})")
        return address
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"DVERL_DHT_ADDR: expected host:port or a /p2p/ multiaddr (got {address!r})")
    if not peer_id:
        raise ValueError(
            f"DVERL_DHT_ADDR={address}: the bootstrap's peer id is unknown (this process holds no job "
            "credentials naming it); give the whole multiaddr `dverl dht` prints instead"
        )
    proto = "ip4" if host.replace(".", "").isdigit() else "dns"
    return f"/{proto}/{host}/tcp/{port}/p2p/{peer_id}"


def front_seed(job_key: bytes, job: str, index: int) -> bytes:
    """The identity of rollout worker `index` on the job's DHT when its spans take volunteers: derived from
    the job's TLS key, which every process of the job holds and no volunteer does, so the coordinator
    knows each front's peer id in advance and a stranger cannot take one."""
    return hmac.new(job_key, f"dverl span front peer\x00{job}\x00{index}".encode(), hashlib.sha256).digest()
