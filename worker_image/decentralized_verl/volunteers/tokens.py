"""Join tokens: HMAC-signed, expiring, bound to one job (and naming the coordinator's peer id).

`dverl token --job NAME` issues one from the job's secret; the coordinator verifies it when a volunteer
asks to join. The token is a bearer credential for *joining* only: it grants no Kubernetes access and
does not reveal the secret. It also carries the coordinator's libp2p peer id (derived from the secret,
see `identity.py`), so a volunteer sends its token to the authenticated coordinator and to nobody else,
whatever the (writable-by-anyone) DHT says.

Format: `dvt1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(secret, "dvt1." + claims))>`.
Pure functions; the clock is a parameter for tests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from decentralized_verl.errors import VolunteerError
from decentralized_verl.security.peer_identity import coordinator_peer_id

PREFIX = "dvt1"
MIN_SECRET_BYTES = 16


class TokenError(VolunteerError):
    """A join token that must be refused; `reason` says why in words a volunteer can act on."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"join token rejected: {reason}")


@dataclass(frozen=True)
class TokenClaims:
    job: str
    issued_at: float
    expires_at: float
    coordinator: str
    """libp2p peer id of the job's coordinator: where the volunteer sends its join request."""
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise TokenError(f"the job secret must have at least {MIN_SECRET_BYTES} bytes (got {len(secret)})")


def _signature(secret: bytes, signed: str) -> bytes:
    return hmac.new(secret, signed.encode(), hashlib.sha256).digest()


def issue_token(secret: bytes, job: str, ttl: float, *, now: float | None = None) -> str:
    """A token for `job` valid for `ttl` seconds; the coordinator peer id comes from the same secret."""
    _check_secret(secret)
    if not job:
        raise TokenError("the job name must not be empty")
    if ttl <= 0:
        raise TokenError(f"ttl must be > 0 seconds (got {ttl:g})")
    issued = time.time() if now is None else now
    claims = {
        "job": job,
        "iat": round(issued, 3),
        "exp": round(issued + ttl, 3),
        "coord": coordinator_peer_id(secret, job),
        "nonce": secrets.token_hex(8),
    }
    body = _b64(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode())
    signed = f"{PREFIX}.{body}"
    return f"{signed}.{_b64(_signature(secret, signed))}"


def read_claims(token: str) -> TokenClaims:
    """The claims without checking the signature: what a volunteer (who lacks the secret) can read."""
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise TokenError(f"not a dverl join token (expected '{PREFIX}.<claims>.<signature>')")
    try:
        raw = json.loads(_unb64(parts[1]))
        return TokenClaims(
            job=str(raw["job"]),
            issued_at=float(raw["iat"]),
            expires_at=float(raw["exp"]),
            coordinator=str(raw["coord"]),
            nonce=str(raw["nonce"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise TokenError(f"malformed claims ({type(exc).__name__}: {exc})") from None


def verify_token(
    secret: bytes, token: str, job: str, *, now: float | None = None, leeway: float = 5.0
) -> TokenClaims:
    """Check signature, job and expiry (with `leeway` seconds of clock skew); raises TokenError."""
    _check_secret(secret)
    claims = read_claims(token)
    signed, _, signature = token.strip().rpartition(".")
    try:
        given = _unb64(signature)
    except ValueError:
        raise TokenError("signature is not base64url") from None
    if not hmac.compare_digest(given, _signature(secret, signed)):
        raise TokenError("bad signature (tampered, or issued with another secret)")
    if claims.job != job:
        raise TokenError(f"issued for job {claims.job!r}, not {job!r}")
    current = time.time() if now is None else now
    if current > claims.expires_at + leeway:
        raise TokenError(f"expired {current - claims.expires_at:.0f}s ago")
    if claims.issued_at > current + leeway:
        raise TokenError("issued in the future (check the clocks)")
    return claims


class SecretMissing(VolunteerError):
    """The job secret's file is absent or unreadable: the owner has not made it yet, or named another."""


MAKE_SECRET = (
    "make the job's secret once with `openssl rand -hex 32 > {file}` (keep it private: whoever holds it "
    "can admit volunteers), start the job with DVERL_JOIN_SECRET_FILE={file}, then issue tokens from it"
)
"""How to make a job secret, said where one is missing."""


def load_secret(
    *, secret_file: str | None = None, secret_env: str | None = None, secret_value: str | None = None
) -> bytes:
    """The job secret from a file (a mounted Secret), an environment variable or a value already read,
    stripped of newlines."""
    if secret_file:
        try:
            data = Path(secret_file).read_bytes().strip()
        except FileNotFoundError:
            raise SecretMissing(
                f"{secret_file}: no such file; {MAKE_SECRET.format(file=secret_file)}"
            ) from None
        except OSError as exc:
            raise SecretMissing(f"{secret_file}: cannot read the job secret ({exc.strerror})") from None
    elif secret_env:
        value = os.environ.get(secret_env)
        if value is None:
            raise TokenError(f"environment variable {secret_env} is not set")
        data = value.strip().encode()
    elif secret_value is not None:
        data = secret_value.strip().encode()
    else:
        raise TokenError("give --secret-file or --secret-env")
    _check_secret(data)
    return data
