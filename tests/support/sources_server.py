"""A real local HTTP(S) server for the source fetcher's tests: serves files from a dict, lists a fake Hub
repository, counts requests, can fail a path with a status or redirect it elsewhere."""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Served:
    files: dict[str, bytes] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    hits: collections.Counter[str] = field(default_factory=collections.Counter)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    """path -> the Location a 302 answer sends the client to."""
    url: str = ""

    def repository(self, repo: str, revision: str, files: dict[str, bytes]) -> None:
        """A Hub repository: its listing and every file's `resolve` URL."""
        siblings = [{"rfilename": name} for name in files]
        self.files[f"/api/models/{repo}/revision/{revision}"] = json.dumps({"siblings": siblings}).encode()
        for name, data in files.items():
            self.files[f"/{repo}/resolve/{revision}/{name}"] = data


def _handler(served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            served.hits[path] += 1
            served.headers[path] = dict(self.headers.items())
            if path in served.redirects:
                self.send_response(302)
                self.send_header("Location", served.redirects[path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = served.statuses.get(path)
            if status is None and path not in served.files:
                status = 404
            if status is not None:
                self.send_error(status)
                return
            body = served.files[path]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serving(tls: tuple[Path, Path] | None = None) -> Iterator[Served]:
    """Serve on 127.0.0.1 on a free port; `tls` (cert, key) makes it HTTPS."""
    served = Served()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    served.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def self_signed(folder: Path, host: str = "localhost") -> tuple[Path, Path]:
    """A certificate for `host` (and 127.0.0.1) signed by itself: the client trusts it via SSL_CERT_FILE."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(host), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path
