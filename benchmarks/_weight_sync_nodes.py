"""The moving parts of benchmarks/weight_sync.py: receiver processes, the learner, and the transfer methods.

Split out of the script so it stays a short driver (payload, CLI, report): each receiver is a spawned
process obeying commands over a pipe, `Learner` serves our WeightRelay from a background event loop in the
driver's process, and `run_raw` / `run_grpc` time one delivery of the payload to every receiver.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import threading
import time
from dataclasses import dataclass

# ------------------------------------------------------------------------------------------ receivers


def _receiver(
    conn, grpc_options: list[tuple[str, int]], verify_threads: int, tls_dir: str | None = None
) -> None:
    """A receiver process: obeys (command, *args) messages from the driver until ("stop",). With
    `tls_dir` it is a worker of a secured job: TLS, the job token, and signed weights only."""
    from decentralized_verl.security import trust
    from decentralized_verl.settings import WorkerSettings

    trust.adopt(WorkerSettings(tls_dir=tls_dir))  # this process's entry: a secured job's worker, or none
    from decentralized_verl.transport.weights.publish import WeightPublisher
    from decentralized_verl.transport.weights.relay import WeightRelay, serve_relay

    stored_at: dict[int, float] = {}

    class TimedRelay(WeightRelay):
        def hold(self, published, raws) -> None:
            super().hold(published, raws)
            stored_at[published.manifest.version] = time.monotonic()

    relay = TimedRelay(WeightPublisher(keep=1), grpc_options=grpc_options, verify_threads=verify_threads)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = asyncio.run_coroutine_threadsafe(serve_relay(relay), loop).result()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    conn.send((server.port, listener.getsockname()[1]))
    buffer = bytearray()
    while True:
        cmd, *args = conn.recv()
        if cmd == "stop":
            break
        if cmd == "raw":  # receive `size` bytes from whoever connects, forwarding to `next_port` if set
            size, piece, next_port = args
            if len(buffer) != size:
                buffer = bytearray(size)
            out = socket.create_connection(("127.0.0.1", next_port)) if next_port else None
            sock, _ = listener.accept()
            view, got = memoryview(buffer), 0
            while got < size:
                n = sock.recv_into(view[got : got + piece])
                if n == 0:
                    raise ConnectionError(f"sender closed after {got} of {size} bytes")
                if out is not None:
                    out.sendall(view[got : got + n])
                got += n
            done = time.monotonic()
            sock.close()
            if out is not None:
                out.close()
            conn.send(done)
        elif cmd == "fetch":
            address, version = args
            asyncio.run_coroutine_threadsafe(relay.catch_up(address, version), loop).result()
            conn.send(time.monotonic())
        elif cmd == "stored_at":
            conn.send(stored_at.get(args[0]))
        elif cmd == "cpu":
            conn.send(time.process_time())
    asyncio.run_coroutine_threadsafe(server.stop(None), loop).result()


@dataclass
class Receiver:
    process: mp.Process
    conn: object
    grpc_address: str
    raw_port: int


def start_receivers(
    n: int, grpc_options: list[tuple[str, int]], verify_threads: int, tls_dir: str | None = None
) -> list[Receiver]:
    ctx = mp.get_context("spawn")  # a clean process: no inherited gRPC state
    out = []
    for _ in range(n):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_receiver, args=(child, grpc_options, verify_threads, tls_dir), daemon=True)
        p.start()
        grpc_port, raw_port = parent.recv()
        out.append(Receiver(p, parent, f"127.0.0.1:{grpc_port}", raw_port))
    return out


def receiver_cpu(receivers: list[Receiver]) -> float:
    """CPU seconds (all threads, user + system) the receiver processes have used so far, summed."""
    for r in receivers:
        r.conn.send(("cpu",))
    return sum(r.conn.recv() for r in receivers)


def stop_receivers(receivers: list[Receiver]) -> None:
    for r in receivers:
        r.conn.send(("stop",))
    for r in receivers:
        r.process.join(10)
        if r.process.is_alive():
            r.process.kill()


# ------------------------------------------------------------------------------------------ methods


def run_raw(payload: bytes, receivers: list[Receiver], piece: int, chain: bool) -> tuple[float, list[float]]:
    """Wall time and per-receiver finish times of a raw TCP copy (N copies, or one copy relayed)."""
    size = len(payload)
    order = list(reversed(receivers)) if chain else receivers
    for i, r in enumerate(order):  # the last of a chain first, so each forwards to a listening peer
        nxt = order[i - 1].raw_port if chain and i > 0 else None
        r.conn.send(("raw", size, piece, nxt))
    targets = receivers[:1] if chain else receivers
    socks = [socket.create_connection(("127.0.0.1", r.raw_port)) for r in targets]
    time.sleep(0.05)  # let every receiver reach accept/connect before the clock starts
    view = memoryview(payload)

    def send(sock: socket.socket) -> None:
        for start in range(0, size, piece):
            sock.sendall(view[start : start + piece])
        sock.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=send, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    finished = [r.conn.recv() for r in receivers]
    for t in threads:
        t.join()
    return max(finished) - t0, [f - t0 for f in finished]


class Learner:
    """The learner's WeightRelay served from a background event loop in this process; with
    `credentials` (security.credentials.JobCredentials) it signs each version and talks TLS + token."""

    def __init__(self, chunk_bytes: int, grpc_options: list[tuple[str, int]], credentials=None) -> None:
        from decentralized_verl.transport.weights.publish import WeightPublisher
        from decentralized_verl.transport.weights.relay import WeightRelay, serve_relay

        signing = credentials.signing_key if credentials is not None else None
        publisher = WeightPublisher(dtype="bfloat16", chunk_bytes=chunk_bytes, keep=1, signing_key=signing)
        self.relay = WeightRelay(publisher, grpc_options=grpc_options, credentials=credentials)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = self.call(serve_relay(self.relay))
        self.address = f"127.0.0.1:{self.server.port}"

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.call(self.server.stop(None))
        self.call(self.relay.close())


def run_grpc(
    learner: Learner, version: int, receivers: list[Receiver], mode: str
) -> tuple[float, list[float]]:
    """One delivery by ``mode``: "fetch", "chain" or "tree" over gRPC, "bulk chain" or "bulk tree" over the
    bulk data plane (gRPC BulkOpen, then TCP into each receiver's buffer)."""
    from decentralized_verl.transport.weights.push import OK
    from decentralized_verl.transport.weights.route import plan_chain, plan_tree

    if mode == "fetch":
        t0 = time.monotonic()
        for r in receivers:
            r.conn.send(("fetch", learner.address, version))
        finished = [r.conn.recv() for r in receivers]
    else:
        addresses = [r.grpc_address for r in receivers]
        route = plan_chain(addresses) if mode.endswith("chain") else plan_tree(addresses, 2)
        send = learner.relay.fan_out_bulk if mode.startswith("bulk") else learner.relay.fan_out
        t0 = time.monotonic()
        results = learner.call(send(version, route))
        bad = {a: why for a, why in results.items() if why != OK}
        if bad:
            raise RuntimeError(f"fan-out failed: {bad}")
        finished = []
        for r in receivers:
            r.conn.send(("stored_at", version))
            finished.append(r.conn.recv())
    return max(finished) - t0, [f - t0 for f in finished]
