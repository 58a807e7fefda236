"""A volunteer serving one span over P2P.

Joining a job (`dverl worker --role span --initial-peers MADDR --job NAME --token T [--layers a:b]`,
`serve_for_job`): admitted with its join token like every volunteer, it asks the coordinator which span
of the job's layout it serves (the one it names, or the one with the fewest volunteers) and for which
fronts (`spans.roster`), loads those layers, announces itself, and answers the span service
(`spans.p2p`) for those fronts only. By hand (`python -m decentralized_verl.spans.volunteer`,
tests and benchmarks): it is told the layers, the fronts' peer ids and the learner's key.

Either way it is untrusted: the front spot-checks its outputs against a trusted replica and drops it on a
mismatch, and it loads weights only with the learner's signed manifest of its span.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

from google.protobuf.wrappers_pb2 import BytesValue

from decentralized_verl.errors import DverlError, VolunteerError, WireError
from decentralized_verl.runtime.cpus import configure_from_environment
from decentralized_verl.runtime.lifecycle import serve_until_stopped
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spans.layout import parse_span
from decentralized_verl.spans.p2p import serve_span_p2p
from decentralized_verl.spans.roster import ASSIGN
from decentralized_verl.spans.server import load_span_server
from decentralized_verl.spec.model import ModelSpec
from decentralized_verl.transport.p2p import listen_maddrs, peer
from decentralized_verl.volunteers.announce import VolunteerRecord, hardware_summary
from decentralized_verl.volunteers.dht import PeerOptions, start_dht


async def serve_for_job(
    session: Any,
    coordinator: str,
    spec: Any,
    verify_key: bytes | None,
    layers: str | None,
    *,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve the span the coordinator assigns until stopped; `session` is the admitted volunteer's
    (`volunteers.session.VolunteerSession`)."""
    p2p = await session.p2p()
    me = session.me
    answer = await ask_assignment(p2p, coordinator, layers)
    if not answer.get("ok"):
        raise VolunteerError(f"the coordinator gave this peer no span: {answer.get('error')}")
    span, fronts = parse_span(str(answer["span"])), [str(f) for f in answer["fronts"]]
    server = await asyncio.to_thread(
        load_span_server, spec.model, span, server_id=f"volunteer-span-{me[-8:]}", verify_key=verify_key
    )
    await serve_span_p2p(p2p, server, fronts)
    hardware, maddrs = hardware_summary(), listen_maddrs(session.dht)

    def record(expires_at: float) -> VolunteerRecord:
        return VolunteerRecord(me, "span", hardware, 0.0, server.version, expires_at, maddrs=maddrs)

    await session.announce(record)
    return await serve_until_stopped(
        f"span volunteer {me} joined job {session.options.job}: layers {span} ready for fronts "
        f"{','.join(fronts)}",
        served=lambda: f"span volunteer {me} served {server.hops} hops",
        stop=stop,
    )


async def ask_assignment(p2p: Any, coordinator: str, layers: str | None) -> dict[str, Any]:
    """The coordinator's answer: {"ok", "span", "fronts"} or {"ok": False, "error"}."""
    request = BytesValue(value=json.dumps({"layers": layers or ""}).encode())
    reply = await asyncio.wait_for(
        p2p.call_protobuf_handler(peer(coordinator), ASSIGN, request, BytesValue), 30.0
    )
    return json.loads(reply.value)


async def serve(args: argparse.Namespace) -> int:
    """Serve the span the arguments name until stopped."""
    span = parse_span(args.layers, field="--layers")
    fronts = [f.strip() for f in args.front.split(",") if f.strip()]
    if not fronts:
        raise WireError("--front", "name at least one front's peer id")
    try:
        verify_key = bytes.fromhex(args.weights_key) if args.weights_key else None
    except ValueError:
        raise WireError("--weights-key", "must be the learner's public key in hex") from None
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


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = WorkerSettings.from_env()  # this process's entry: `python -m` starts a span volunteer here
    configure_from_environment(settings)
    try:
        return asyncio.run(serve(args))
    except DverlError as exc:
        print(f"error: {exc}", flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
