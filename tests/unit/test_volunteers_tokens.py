"""Join tokens and deterministic identities: pure functions, hand-checked cases, bad inputs.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import base64
import json

import pytest

from decentralized_verl.security import peer_identity as identity
from decentralized_verl.volunteers.tokens import TokenError, issue_token, read_claims, verify_token

SECRET = b"0123456789abcdef-job-secret"
NOW = 1_700_000_000.0


def test_issue_and_verify_roundtrip() -> None:
    token = issue_token(SECRET, "gsm8k", ttl=600, now=NOW)
    claims = verify_token(SECRET, token, "gsm8k", now=NOW + 10)
    assert claims.job == "gsm8k"
    assert claims.expires_at == NOW + 600
    assert claims.coordinator == identity.coordinator_peer_id(SECRET, "gsm8k")
    assert claims.coordinator.startswith("12D3KooW")
    assert read_claims(token) == claims  # a volunteer can read (not forge) the claims


def test_expired_wrong_job_wrong_secret_and_tampered_are_refused() -> None:
    token = issue_token(SECRET, "gsm8k", ttl=60, now=NOW)
    with pytest.raises(TokenError, match="expired"):
        verify_token(SECRET, token, "gsm8k", now=NOW + 3600)
    with pytest.raises(TokenError, match="issued for job 'gsm8k', not 'other'"):
        verify_token(SECRET, token, "other", now=NOW)
    with pytest.raises(TokenError, match="bad signature"):
        verify_token(b"another-secret-of-16+bytes", token, "gsm8k", now=NOW)
    prefix, body, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["exp"] = NOW + 10**9  # extend the lifetime without the secret
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenError, match="bad signature"):
        verify_token(SECRET, f"{prefix}.{forged}.{signature}", "gsm8k", now=NOW)
    with pytest.raises(TokenError, match="bad signature"):
        verify_token(SECRET, token[:-2] + ("AA" if token[-2:] != "AA" else "BB"), "gsm8k", now=NOW)


@pytest.mark.parametrize("bad", ["", "hello", "dvt1.x.y", "dvt2.abc.def", "dvt1..", "dvt1.e30.AAAA"])
def test_garbage_tokens_have_clear_reasons(bad: str) -> None:
    with pytest.raises(TokenError) as info:
        verify_token(SECRET, bad, "gsm8k", now=NOW)
    assert "join token rejected:" in str(info.value)


def test_issue_rejects_weak_secret_and_bad_ttl() -> None:
    with pytest.raises(TokenError, match="at least 16 bytes"):
        issue_token(b"short", "job", ttl=10)
    with pytest.raises(TokenError, match="ttl must be > 0"):
        issue_token(SECRET, "job", ttl=0)


def test_token_cli(tmp_path, capsys) -> None:
    from decentralized_verl.cli.main import main

    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    assert main(["token", "--job", "demo", "--secret-file", str(secret), "--ttl", "60"]) == 0
    token = capsys.readouterr().out.strip()
    assert verify_token(SECRET, token, "demo").job == "demo"
    (tmp_path / "weak").write_bytes(b"weak")
    assert main(["token", "--job", "demo", "--secret-file", str(tmp_path / "weak")]) == 2
    assert "at least 16 bytes" in capsys.readouterr().err
