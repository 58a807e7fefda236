"""A volunteer serving one span over P2P: `python -m decentralized_verl.serving.spans.volunteer`.

It joins the swarm through the job's DHT peers (as every volunteer does), loads decoder layers [a, b)
of the job's model, and answers the span service (`spans.p2p`) for the fronts it is told to serve. It is
untrusted: the front spot-checks its outputs against a trusted replica and drops it on a mismatch, and it
loads weights only with the learner's signed manifest of its span (`--weights-key`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

from decentralized_verl.errors import DverlError, WireError


async def serve(args: argparse.Namespace, server: Any = None) -> int:
    """Serve until stopped; `server` (a `SpanServer`) is built from the arguments when not given."""
    from decentralized_verl.runtime.lifecycle import serve_until_stopped
    from decentralized_verl.serving.spans.layout import parse_span
    from decentralized_verl.serving.spans.p2p import serve_span_p2p
    from decentralized_verl.serving.spans.server import load_span_server
    from decentralized_verl.spec.model import ModelSpec
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht

    span = parse_span(args.layers, field="--layers")
    fronts = [f.strip() for f in args.front.split(",") if f.strip()]
    if not fronts:
        raise WireError("--front", "name at least one front's peer id")
    try:
        verify_key = bytes.fromhex(args.weights_key) if args.weights_key else None
    except ValueError:
        raise WireError("--weights-key", "must be the learner's public key in hex") from None
    if server is None:
        spec = ModelSpec.model_validate(json.loads(args.model))
        server = load_span_server(spec, span, server_id=f"volunteer-span-{span}", verify_key=verify_key)
    options = PeerOptions(initial_peers=tuple(args.initial_peers), host_maddrs=(args.host_maddr,))
    dht = await asyncio.to_thread(start_dht, options)
    try:
        p2p = await dht.replicate_p2p()
        await serve_span_p2p(p2p, server, fronts)
        me = dht.peer_id.to_base58()
        at = " ".join(str(a) for a in dht.get_visible_maddrs())
        return await serve_until_stopped(
            f"span volunteer {me} layers {span} ready at {at}",
            served=lambda: f"span volunteer {me} served {server.hops} hops",
        )
    finally:
        dht.shutdown()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Serve decoder layers [a, b) of a job's model over P2P.")
    p.add_argument("--model", required=True, help="the job's spec.model as JSON")
    p.add_argument("--layers", required=True, help="start:end, the span's decoder layers")
    p.add_argument("--initial-peers", nargs="+", required=True, help="the job's DHT peers (multiaddrs)")
    p.add_argument("--front", required=True, help="peer ids of the fronts to serve, comma-separated")
    p.add_argument("--weights-key", default=None, help="the learner's weight-signing public key (hex)")
    p.add_argument("--host-maddr", default="/ip4/0.0.0.0/tcp/0")
    return p


def main(argv: list[str] | None = None, server: Any = None) -> int:
    from decentralized_verl.runtime.cpus import configure_from_environment
    from decentralized_verl.settings import WorkerSettings

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = WorkerSettings.from_env()  # this process's entry: `python -m` starts a span volunteer here
    configure_from_environment(settings)
    try:
        return asyncio.run(serve(args, server))
    except DverlError as exc:
        print(f"error: {exc}", flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
