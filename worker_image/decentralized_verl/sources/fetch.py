"""`python -m decentralized_verl.sources.fetch --url URI --dest DIR (--sha256 HEX | --insecure-skip-digest)`:
put a source into DIR.

The init container of a pod whose source is a URI runs this (and `dverl run` calls `fetch` for its local
cache). A file is checked against its digest before anything lands in DIR, and without a digest nothing
is downloaded unless the caller says it accepts an unchecked download (a whole hf repository pinned by a
commit hash excepted); redirects are followed as `redirects` allows, and every connection goes to the
addresses that were checked (`pinned`). An archive is unpacked there
(no member may escape DIR), any other file keeps its name. A marker file records what DIR holds, so a
restarted init container or a second `dverl run` does not download it again. When it cannot, it says why
on stderr and in the container's termination message, and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from decentralized_verl.errors import DverlError
from decentralized_verl.sources.pinned import PinnedHTTPHandler, PinnedHTTPSHandler, Pins
from decentralized_verl.sources.redirects import (
    GuardedRedirects,
    Network,
    RedirectRefused,
    networks_from_env,
    resolve,
)
from decentralized_verl.spec.uri import Uri, UriProblem, download_url, listing_url, parse_uri

MARKER = ".dverl-source.json"
TERMINATION_LOG = "/dev/termination-log"
CHUNK = 1 << 20
ATTEMPTS = 3
TIMEOUT_S = 60.0


class FetchError(DverlError):
    """A source that could not be fetched; the message names the URL and what went wrong."""


@dataclass(frozen=True)
class Endpoints:
    """Where s3:// and hf:// are read from, and the Hub token; read once from the environment."""

    s3: str | None = None
    hf: str | None = None
    hf_token: str | None = None
    private_redirects: tuple[Network, ...] = ()
    """Networks a redirect to another origin may lead to although they are not public."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Endpoints:
        try:
            private = networks_from_env(env)
        except RedirectRefused as exc:
            raise FetchError(str(exc)) from None
        return cls(
            s3=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
            hf=env.get("HF_ENDPOINT"),
            hf_token=env.get("HF_TOKEN"),
            private_redirects=private,
        )


def _request(url: str, uri: Uri, endpoints: Endpoints) -> urllib.request.Request:
    headers = {"User-Agent": "dverl-fetch"}
    if uri.scheme == "hf" and endpoints.hf_token:
        headers["Authorization"] = f"Bearer {endpoints.hf_token}"
    return urllib.request.Request(url, headers=headers)


def _download(url: str, uri: Uri, endpoints: Endpoints, target: Path) -> str:
    """Stream `url` into `target`; its hex SHA-256. Retries connection failures and 5xx answers."""
    pins = Pins(resolve)  # each host resolved once: what the redirect check judged is what is dialled
    opener = urllib.request.build_opener(
        GuardedRedirects(endpoints.private_redirects, pins=pins),
        PinnedHTTPHandler(pins),
        PinnedHTTPSHandler(pins),
    )
    for attempt in range(1, ATTEMPTS + 1):
        digest = hashlib.sha256()
        try:
            request = _request(url, uri, endpoints)
            with opener.open(request, timeout=TIMEOUT_S) as answer, target.open("wb") as out:
                while chunk := answer.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            return digest.hexdigest()
        except RedirectRefused as exc:
            raise FetchError(str(exc)) from None
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == ATTEMPTS:
                raise FetchError(f"{url}: the server answered HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            if attempt == ATTEMPTS:
                reason = getattr(exc, "reason", exc)
                raise FetchError(f"{url}: cannot download ({reason}) after {ATTEMPTS} tries") from None
        time.sleep(attempt)
    raise AssertionError("unreachable")


def _inside(dest: Path, name: str) -> Path:
    """Where an archive member or repository file lands; FetchError when it would leave `dest`."""
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise FetchError(f"refusing {name!r}: it would be written outside {dest}")
    return dest.joinpath(*pure.parts)


def _unpack(archive: Path, dest: Path, name: str) -> None:
    if name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as bundle:
            for member in bundle.namelist():
                _inside(dest, member)
            bundle.extractall(dest)
        return
    try:
        with tarfile.open(archive) as bundle:
            for member in bundle.getmembers():
                _inside(dest, member.name)
                if not (member.isfile() or member.isdir()):
                    raise FetchError(f"refusing {member.name!r} in {name}: only files and folders unpack")
            bundle.extractall(dest, filter="data")
    except tarfile.TarError as exc:
        raise FetchError(f"{name}: not a readable archive ({exc})") from None


def _marker(dest: Path) -> dict | None:
    try:
        return json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return None


def fetch(
    url: str, dest: Path, sha256: str | None, endpoints: Endpoints, *, insecure_skip_digest: bool = False
) -> Path:
    """Put the source at `url` into `dest` (created when missing); returns `dest`. Without `sha256` the
    caller must say `insecure_skip_digest` (a whole hf repository pinned by a commit hash excepted)."""
    try:
        uri = parse_uri(url)
    except UriProblem as exc:
        raise FetchError(f"{url}: {exc}") from None
    if sha256 is None and not insecure_skip_digest and not uri.pinned_by_commit:
        raise FetchError(
            f"{url}: no SHA-256 to check it against: refusing an unchecked download "
            "(give its digest, or say insecureSkipDigest: true to accept one)"
        )
    wanted = {"url": url, "sha256": sha256}
    if _marker(dest) == wanted:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    if uri.whole_repository:
        _fetch_repository(uri, dest, endpoints)
    else:
        part = dest / f".{uri.filename}.part"
        try:
            got = _download(
                download_url(uri, s3_endpoint=endpoints.s3, hf_endpoint=endpoints.hf), uri, endpoints, part
            )
            if sha256 is not None and got != sha256:
                raise FetchError(f"{url}: SHA-256 is {got}, expected {sha256}: refusing the download")
            if uri.is_archive:
                _unpack(part, dest, uri.filename)
            else:
                part.replace(dest / uri.filename)
        finally:
            part.unlink(missing_ok=True)
    (dest / MARKER).write_text(json.dumps(wanted))
    return dest


def _fetch_repository(uri: Uri, dest: Path, endpoints: Endpoints) -> None:
    listing = dest / ".listing.part"
    try:
        _download(listing_url(uri, hf_endpoint=endpoints.hf), uri, endpoints, listing)
        files = [s["rfilename"] for s in json.loads(listing.read_text()).get("siblings", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise FetchError(f"hf://{uri.host}: the Hub's file listing is not what it should be") from None
    finally:
        listing.unlink(missing_ok=True)
    if not files:
        raise FetchError(f"hf://{uri.host}@{uri.revision}: the repository lists no files")
    for name in files:
        target = _inside(dest, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        url = download_url(uri, name, s3_endpoint=endpoints.s3, hf_endpoint=endpoints.hf)
        _download(url, uri, endpoints, target)


def _report(message: str, termination_log: Path) -> None:
    print(f"dverl fetch: {message}", file=sys.stderr)
    with contextlib.suppress(OSError):  # not in a pod
        termination_log.write_text(message[:4000])  # Kubernetes keeps at most 4096 bytes of it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m decentralized_verl.sources.fetch", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--sha256")
    parser.add_argument(
        "--insecure-skip-digest",
        action="store_true",
        help="download without a digest to check (only when the manifest says insecureSkipDigest: true)",
    )
    parser.add_argument("--termination-log", default=TERMINATION_LOG)
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    try:
        endpoints = Endpoints.from_env(os.environ)
        fetch(args.url, dest, args.sha256, endpoints, insecure_skip_digest=args.insecure_skip_digest)
    except FetchError as exc:
        _report(str(exc), Path(args.termination_log))
        return 1
    except OSError as exc:
        _report(f"{args.url}: cannot write into {dest}: {exc}", Path(args.termination_log))
        return 1
    print(f"dverl fetch: {args.url} -> {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
