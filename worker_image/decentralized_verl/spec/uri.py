"""Pure: a source URI (https://, s3://, hf://) -> the HTTP(S) requests that fetch it.

s3:// and hf:// are read through their HTTP endpoints: s3://bucket/key as a path-style GET on the S3
endpoint (public objects or a bucket policy that admits the cluster; requests are not signed), hf:// as the
Hugging Face Hub's `resolve` URL, a whole repository through its file listing. The endpoints come from
the fetcher's environment (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, HF_ENDPOINT), so a mirror or a test
server stands in for either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

URI_SCHEMES = ("https", "s3", "hf")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_S3_ENDPOINT = "https://s3.amazonaws.com"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"


class UriProblem(ValueError):
    """A source URI that cannot be fetched as written; the message says why in the user's words."""


@dataclass(frozen=True)
class Uri:
    scheme: str
    host: str
    """https: the host[:port]; s3: the bucket; hf: owner/repo."""
    path: str
    """The object's path without a leading slash; '' for a whole hf repository."""
    revision: str = "main"

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def is_archive(self) -> bool:
        return self.path.lower().endswith(ARCHIVE_SUFFIXES)

    @property
    def whole_repository(self) -> bool:
        return self.scheme == "hf" and not self.path

    @property
    def pinned_by_commit(self) -> bool:
        """A whole hf repository at a full commit hash: the Hub's content addressing stands in for the
        digest no single file can give."""
        return self.whole_repository and bool(COMMIT.match(self.revision))


def parse_uri(url: str) -> Uri:
    """The URI's parts; `UriProblem` naming what is missing or unsupported."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in URI_SCHEMES:
        raise UriProblem(
            f"scheme {parts.scheme or '(none)'!r} is not supported; use https://, s3:// or hf://"
        )
    path = parts.path.lstrip("/")
    if any(piece in ("", ".", "..") for piece in path.split("/")) and path:
        raise UriProblem(f"path {parts.path!r} has an empty, '.' or '..' part")
    if scheme == "https":
        if not parts.hostname:
            raise UriProblem("https:// needs a host")
        if not path:
            raise UriProblem("https:// needs the path of a file")
        return Uri("https", parts.netloc, path)
    if scheme == "s3":
        if not parts.netloc or not path:
            raise UriProblem("s3:// needs a bucket and a key: s3://bucket/path/to/object")
        return Uri("s3", parts.netloc, path)
    pieces = [parts.netloc, *path.split("/")] if path else [parts.netloc]
    if len(pieces) < 2 or not all(pieces[:2]):
        raise UriProblem("hf:// needs a repository: hf://owner/repo[/path/in/repo][?revision=R]")
    revisions = parse_qs(parts.query).get("revision", ["main"])
    return Uri("hf", "/".join(pieces[:2]), "/".join(pieces[2:]), revisions[0])


def download_url(
    uri: Uri, file: str | None = None, *, s3_endpoint: str | None, hf_endpoint: str | None
) -> str:
    """The HTTP(S) URL of the URI's object, or of `file` in a whole hf repository."""
    if uri.scheme == "https":
        return f"https://{uri.host}/{quote(uri.path)}"
    if uri.scheme == "s3":
        return f"{(s3_endpoint or DEFAULT_S3_ENDPOINT).rstrip('/')}/{uri.host}/{quote(uri.path)}"
    name = file if file is not None else uri.path
    base = (hf_endpoint or DEFAULT_HF_ENDPOINT).rstrip("/")
    return f"{base}/{uri.host}/resolve/{quote(uri.revision, safe='')}/{quote(name)}"


def listing_url(uri: Uri, *, hf_endpoint: str | None) -> str:
    """Where the Hub lists a repository's files (a whole hf:// repository)."""
    base = (hf_endpoint or DEFAULT_HF_ENDPOINT).rstrip("/")
    return f"{base}/api/models/{uri.host}/revision/{quote(uri.revision, safe='')}"
