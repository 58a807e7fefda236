"""A DNS rebinding attack on the source fetcher, run inside a network namespace the test made (its `lo`
holds 127.0.0.1 and the public address 1.2.3.4; nothing leaves the machine) whose resolv.conf names a DNS
server this module runs on 127.0.0.1:53.

`python -m tests.support.rebinding FOLDER pinned|unpinned`: a source server (HTTPS, 127.0.0.1) redirects
to `https://rebind.test:PORT/m.bin`; the DNS server answers the first A query for rebind.test with
1.2.3.4 (public: the redirect check passes) and every later one with 127.0.0.1 (an internal service);
one server listens on both addresses and records which one each request reached. `pinned` fetches as
`sources.fetch` does; `unpinned` as it did before (the redirect check's own lookup, then urllib's). Prints
one JSON line: whether the fetch succeeded (or its error), the hits per local address, and how many A
queries for rebind.test the DNS server answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.node_harness.dns_server import TYPE_A, answer, parse_question
from tests.support.sources_server import self_signed, serving

PUBLIC = "1.2.3.4"
NAME = "rebind.test"
DATA = b"the weights the digest names"


class Rebinder(asyncio.DatagramProtocol):
    """rebind.test: the public address to the first A query, loopback to every later one."""

    def __init__(self) -> None:
        self.a_queries = 0
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            _, _, name, qtype, _ = parse_question(data)
        except ValueError:
            return
        if name == NAME and qtype == TYPE_A:
            self.a_queries += 1
        first = self.a_queries <= 1
        reply = answer(data, lambda n: ([PUBLIC] if first else ["127.0.0.1"]) if n == NAME else None)
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)


def _dns() -> Rebinder:
    loop = asyncio.new_event_loop()
    protocol = Rebinder()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(loop.create_datagram_endpoint(lambda: protocol, local_addr=("127.0.0.1", 53)))
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    ready.wait(30)
    return protocol


def _target(cert: Path, key: Path, hits: dict[str, int]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            local = self.connection.getsockname()[0]
            hits[local] = hits.get(local, 0) + 1
            body = DATA if local == PUBLIC else b"an internal service's answer"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    import hashlib

    from decentralized_verl.sources.fetch import Endpoints, FetchError, fetch
    from decentralized_verl.sources.pinned import Pins
    from decentralized_verl.sources.redirects import GuardedRedirects, resolve

    folder, mode = Path(sys.argv[1]), sys.argv[2]
    (folder / "source").mkdir(parents=True, exist_ok=True)
    (folder / "target").mkdir(parents=True, exist_ok=True)
    source_cert, source_key = self_signed(folder / "source")
    target_cert, target_key = self_signed(folder / "target", host=NAME)
    bundle = folder / "cas.pem"
    bundle.write_bytes(source_cert.read_bytes() + target_cert.read_bytes())
    os.environ["SSL_CERT_FILE"] = str(bundle)
    dns = _dns()
    hits: dict[str, int] = {}
    target = _target(target_cert, target_key, hits)
    result: dict = {}
    with serving(tls=(source_cert, source_key)) as source:
        source.redirects["/m.bin"] = f"https://{NAME}:{target.server_address[1]}/m.bin"
        url = source.url + "/m.bin"
        try:
            if mode == "pinned":
                fetch(url, folder / "out", hashlib.sha256(DATA).hexdigest(), Endpoints())
                result["bytes"] = (folder / "out" / "m.bin").read_bytes().decode()
            else:
                opener = urllib.request.build_opener(GuardedRedirects(pins=Pins(resolve)))
                with opener.open(url, timeout=30) as reply:
                    result["bytes"] = reply.read().decode()
            result["ok"] = True
        except (FetchError, OSError) as exc:
            result["ok"], result["error"] = False, str(exc)
    target.shutdown()
    print(json.dumps({**result, "hits": hits, "a_queries": dns.a_queries}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
