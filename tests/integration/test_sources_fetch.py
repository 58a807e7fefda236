"""The fetcher an init container runs (`python -m decentralized_verl.sources.fetch`), against a real local
HTTP(S) server: files and archives land in the destination, digests are checked, s3:// and hf:// are read
through their endpoints, and every failure exits 1 with its reason in the termination message."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from decentralized_verl.sources.fetch import MARKER, Endpoints, FetchError, fetch
from tests.support.sources_server import Served, self_signed, serving


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            bundle.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def run_fetch(
    url: str, dest: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    log = dest.parent / "termination-log"
    command = [sys.executable, "-m", "decentralized_verl.sources.fetch", "--url", url, "--dest", str(dest)]
    command += [*extra, "--termination-log", str(log)]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.fixture
def served() -> Served:
    with serving() as s:
        yield s


def test_https_file_with_its_digest_through_a_trusted_ca(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    data = b'{"prompt": "1+1", "answer": "2"}\n'
    with serving(tls=(cert, key)) as s:
        s.files["/data/train.jsonl"] = data
        url = s.url.replace("127.0.0.1", "localhost") + "/data/train.jsonl"
        result = run_fetch(url, tmp_path / "out", "--sha256", sha(data), env={"SSL_CERT_FILE": str(cert)})
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "out" / "train.jsonl").read_bytes() == data
        untrusted = run_fetch(
            url, tmp_path / "other", "--sha256", sha(data), env={"SSL_CERT_FILE": os.devnull}
        )
    assert untrusted.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in (tmp_path / "termination-log").read_text()


def test_s3_archive_unpacks_and_is_not_fetched_twice(served: Served, tmp_path: Path) -> None:
    archive = tar_gz({"model/config.json": b"{}", "model/weights.bin": b"\x00" * 100})
    served.files["/bucket/models/tiny.tar.gz"] = archive
    endpoints = Endpoints(s3=served.url)
    dest = fetch("s3://bucket/models/tiny.tar.gz", tmp_path / "m", sha(archive), endpoints)
    assert (dest / "model" / "config.json").read_bytes() == b"{}"
    assert (dest / "model" / "weights.bin").stat().st_size == 100
    assert not list(dest.glob(".*.part")), "the download itself does not stay"
    fetch("s3://bucket/models/tiny.tar.gz", dest, sha(archive), endpoints)
    assert served.hits["/bucket/models/tiny.tar.gz"] == 1  # the marker says it is there
    assert (dest / MARKER).exists()


def test_s3_endpoint_from_the_environment(served: Served, tmp_path: Path) -> None:
    served.files["/b/k/x.txt"] = b"hello"
    result = run_fetch(
        "s3://b/k/x.txt", tmp_path / "d", "--sha256", sha(b"hello"), env={"AWS_ENDPOINT_URL_S3": served.url}
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "d" / "x.txt").read_bytes() == b"hello"


def test_hf_file_and_whole_repository_with_token(served: Served, tmp_path: Path) -> None:
    files = {"config.json": b'{"a": 1}', "tokenizer/vocab.txt": b"a\nb\n"}
    served.repository("org/tiny", "main", files)
    served.repository("org/tiny", "v2", {"config.json": b'{"a": 2}'})
    env = {"HF_ENDPOINT": served.url, "HF_TOKEN": "secret-token"}
    whole = run_fetch("hf://org/tiny", tmp_path / "repo", "--insecure-skip-digest", env=env)
    assert whole.returncode == 0, whole.stderr
    assert (tmp_path / "repo" / "tokenizer" / "vocab.txt").read_bytes() == b"a\nb\n"
    assert served.headers["/org/tiny/resolve/main/config.json"]["Authorization"] == "Bearer secret-token"
    one = fetch(
        "hf://org/tiny/config.json?revision=v2",
        tmp_path / "one",
        None,
        Endpoints(hf=served.url),
        insecure_skip_digest=True,
    )
    assert (one / "config.json").read_bytes() == b'{"a": 2}'


def test_zip_archive(served: Served, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("toy/train.jsonl", "{}\n")
    served.files["/b/toy.zip"] = buffer.getvalue()
    dest = fetch("s3://b/toy.zip", tmp_path / "z", None, Endpoints(s3=served.url), insecure_skip_digest=True)
    assert (dest / "toy" / "train.jsonl").read_text() == "{}\n"


def test_wrong_digest_fails_the_pod_with_a_clear_message(served: Served, tmp_path: Path) -> None:
    served.files["/b/x.bin"] = b"tampered"
    wanted = sha(b"original")
    result = run_fetch(
        "s3://b/x.bin", tmp_path / "d", "--sha256", wanted, env={"AWS_ENDPOINT_URL_S3": served.url}
    )
    assert result.returncode == 1
    message = (tmp_path / "termination-log").read_text()
    assert message == f"s3://b/x.bin: SHA-256 is {sha(b'tampered')}, expected {wanted}: refusing the download"
    assert message in result.stderr
    assert not (tmp_path / "d" / "x.bin").exists() and not (tmp_path / "d" / MARKER).exists()


@pytest.mark.parametrize(("status", "says"), [(404, "HTTP 404"), (403, "HTTP 403"), (503, "HTTP 503")])
def test_server_refusals_are_reported(served: Served, tmp_path: Path, status: int, says: str) -> None:
    if status != 404:
        served.statuses["/b/x"] = status
    with pytest.raises(FetchError, match=says) as caught:
        fetch("s3://b/x", tmp_path / "d", None, Endpoints(s3=served.url), insecure_skip_digest=True)
    assert str(caught.value).startswith(f"{served.url}/b/x:")
    assert served.hits["/b/x"] == (3 if status >= 500 else 1)  # server errors are retried


def test_unreachable_host_and_bad_uri(tmp_path: Path) -> None:
    result = run_fetch(
        "s3://b/x",
        tmp_path / "d",
        "--insecure-skip-digest",
        env={"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"},
    )
    assert result.returncode == 1 and "cannot download" in (tmp_path / "termination-log").read_text()
    bad = run_fetch("ftp://h/x", tmp_path / "e", "--insecure-skip-digest")
    assert bad.returncode == 1 and "scheme 'ftp' is not supported" in bad.stderr


def test_archive_member_that_escapes_is_refused(served: Served, tmp_path: Path) -> None:
    served.files["/b/evil.tar.gz"] = tar_gz({"../outside.txt": b"x"})
    with pytest.raises(FetchError, match="outside"):
        fetch("s3://b/evil.tar.gz", tmp_path / "d", None, Endpoints(s3=served.url), insecure_skip_digest=True)
    assert not (tmp_path / "outside.txt").exists()
    served.repository("o/r", "main", {"../../escape": b"x"})
    with pytest.raises(FetchError, match="outside"):
        fetch("hf://o/r", tmp_path / "r", None, Endpoints(hf=served.url), insecure_skip_digest=True)


def test_no_digest_is_refused_before_any_request_unless_the_manifest_accepts_it(
    served: Served, tmp_path: Path
) -> None:
    served.files["/b/x.bin"] = b"anything"
    env = {"AWS_ENDPOINT_URL_S3": served.url}
    refused = run_fetch("s3://b/x.bin", tmp_path / "d", env=env)
    assert refused.returncode == 1
    assert "no SHA-256 to check it against: refusing an unchecked download" in refused.stderr
    assert served.hits["/b/x.bin"] == 0 and not (tmp_path / "d" / "x.bin").exists()
    accepted = run_fetch("s3://b/x.bin", tmp_path / "d", "--insecure-skip-digest", env=env)
    assert accepted.returncode == 0, accepted.stderr
    assert (tmp_path / "d" / "x.bin").read_bytes() == b"anything"


def test_a_whole_repository_pinned_by_a_commit_needs_no_digest(served: Served, tmp_path: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    served.repository("org/tiny", commit, {"config.json": b"{}"})
    dest = fetch(f"hf://org/tiny?revision={commit}", tmp_path / "r", None, Endpoints(hf=served.url))
    assert (dest / "config.json").read_bytes() == b"{}"
    with pytest.raises(FetchError, match="refusing an unchecked download"):
        fetch("hf://org/tiny?revision=main", tmp_path / "s", None, Endpoints(hf=served.url))


@pytest.fixture
def tls_pair(tmp_path: Path):
    """Two HTTPS servers on loopback (distinct origins: 127.0.0.1:P and localhost:Q) and a plain one."""
    cert, key = self_signed(tmp_path)
    with serving(tls=(cert, key)) as source, serving(tls=(cert, key)) as other, serving() as plain:
        other.url = other.url.replace("127.0.0.1", "localhost")
        yield source, other, plain, {"SSL_CERT_FILE": str(cert)}


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("plain", "over http://"),
        ("other", "a loopback address"),
        ("https://169.254.169.254/latest/meta-data", "a link-local address"),
        ("https://10.20.30.40/m.bin", "a private address"),
        ("https://[::1]/m.bin", "a loopback address"),
    ],
)
def test_redirects_to_a_downgrade_or_a_private_address_are_refused(
    tls_pair, tmp_path: Path, target: str, says: str
) -> None:
    source, other, plain, env = tls_pair
    data = b"weights"
    for server in (other, plain):
        server.files["/m.bin"] = data
    location = {"plain": plain.url + "/m.bin", "other": other.url + "/m.bin"}.get(target, target)
    source.redirects["/m.bin"] = location
    result = run_fetch(source.url + "/m.bin", tmp_path / "d", "--sha256", sha(data), env=env)
    assert result.returncode == 1
    message = (tmp_path / "termination-log").read_text()
    assert f"refusing the redirect to {location}" in message and says in message, message
    assert other.hits["/m.bin"] == 0 and plain.hits["/m.bin"] == 0
    assert not (tmp_path / "d" / "m.bin").exists()


def test_the_hub_token_stays_with_its_origin(tls_pair, tmp_path: Path) -> None:
    source, other, _, env = tls_pair
    data = b"gated weights"
    source.files["/org/m/resolve/main/same.bin"] = data
    source.redirects["/org/m/resolve/main/a.bin"] = source.url + "/org/m/resolve/main/same.bin"
    other.files["/cdn/b.bin"] = data
    source.redirects["/org/m/resolve/main/b.bin"] = other.url + "/cdn/b.bin"
    env = {**env, "HF_ENDPOINT": source.url, "HF_TOKEN": "hub-secret"}
    same = run_fetch("hf://org/m/a.bin", tmp_path / "a", "--sha256", sha(data), env=env)
    assert same.returncode == 0, same.stderr
    assert source.headers["/org/m/resolve/main/same.bin"]["Authorization"] == "Bearer hub-secret"
    # Another origin is followed only where the deployment names its network, and never with the token.
    moved = run_fetch(
        "hf://org/m/b.bin",
        tmp_path / "b",
        "--sha256",
        sha(data),
        env={**env, "FETCH_PRIVATE_REDIRECTS": "127.0.0.0/8,::1/128"},
    )
    assert moved.returncode == 0, moved.stderr
    assert (tmp_path / "b" / "b.bin").read_bytes() == data
    assert other.hits["/cdn/b.bin"] == 1
    assert "Authorization" not in other.headers["/cdn/b.bin"]
    assert all("hub-secret" not in value for value in other.headers["/cdn/b.bin"].values())
