"""Volunteer records that only their owner can write: a hivemind record validator for the job's key.

A volunteer's record lives under the job's key (`announce.job_key`) at the sub-key of its libp2p peer id.
An Ed25519 peer id *is* its public key, so the sub-key names the only key that may write it: every value
stored there carries a signature by that key over the key, the sub-key, the value and its expiry. Every
peer of the job (bootstrap, coordinator, volunteers) installs this validator, so each refuses to store, and
drops on reading, any record under that key that is not signed by the peer it names, and any plain value
stored over the whole key (which would evict every volunteer's record). A stranger can therefore neither
write a record in a volunteer's name nor extend, shorten or replace one; a replayed old record loses to
the newer expiry its owner keeps storing.
"""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase

from decentralized_verl.security.peer_identity import keypair, peer_id_of_public, public_key_of_peer
from decentralized_verl.volunteers.announce import job_key

DOMAIN = b"dverl-dht-record-v1\x00"
MARK = b"\x00dverl-s"
"""Precedes the 64-byte signature appended to a signed value."""
SIGNED_TAIL = len(MARK) + 64


def signed_bytes(record: DHTRecord, value: bytes) -> bytes:
    """What a record's signature covers: the key, the sub-key, the expiry and the value (its own bytes)."""
    return (
        DOMAIN
        + struct.pack(">Qd", len(record.subkey), record.expiration_time)
        + record.key
        + record.subkey
        + value
    )


class OwnedRecords(RecordValidatorBase):
    """Refuses every record under `job`'s volunteer key not signed by the peer its sub-key names, and
    signs this peer's own (`seed`: its identity; None for a peer that only reads and relays, the
    bootstrap and the coordinator)."""

    def __init__(self, job: str, seed: bytes | None = None) -> None:
        self.job = job
        self.key_id = DHTID.generate(source=job_key(job)).to_bytes()
        self._serializer = DHTProtocol.serializer
        self._private: bytes | None = None
        self._own_subkey: bytes | None = None
        if seed is not None:
            private, public = keypair(seed)
            self._private = private
            self._own_subkey = self._serializer.dumps(peer_id_of_public(public))

    def validate(self, record: DHTRecord) -> bool:
        if record.key != self.key_id:
            return True  # another key: not this validator's to judge
        try:
            owner = self._serializer.loads(record.subkey) if record.subkey else None
        except Exception:
            return False
        if not isinstance(owner, str):
            return False  # a plain value over the whole key would evict every volunteer's record
        try:
            public = public_key_of_peer(owner)
        except ValueError:
            return False
        value = record.value
        if len(value) < SIGNED_TAIL or value[-SIGNED_TAIL:-64] != MARK:
            return False

        try:
            Ed25519PublicKey.from_public_bytes(public).verify(
                value[-64:], signed_bytes(record, value[:-SIGNED_TAIL])
            )
        except InvalidSignature:
            return False
        return True

    def sign_value(self, record: DHTRecord) -> bytes:
        if record.key != self.key_id or self._private is None or record.subkey != self._own_subkey:
            return record.value  # not ours to sign: peers refuse it (validate)

        signature = Ed25519PrivateKey.from_private_bytes(self._private).sign(
            signed_bytes(record, record.value)
        )
        return record.value + MARK + signature

    def strip_value(self, record: DHTRecord) -> bytes:
        if record.key == self.key_id and record.value[-SIGNED_TAIL:-64] == MARK:
            return record.value[:-SIGNED_TAIL]
        return record.value

    @property
    def priority(self) -> int:
        return 10  # signs last, checks first: the signature covers the value as other validators left it

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False
