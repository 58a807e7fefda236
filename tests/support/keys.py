"""Signing keys as a learner holds them: raw Ed25519 key pairs."""

from __future__ import annotations


def ed25519_keypair() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    private = key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    return private, key.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
