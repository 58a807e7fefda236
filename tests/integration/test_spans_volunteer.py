"""Volunteers serving a span over Hivemind P2P (a real volunteer process reached only through libp2p
streams), spot-checked by the front against a trusted span server: an honest volunteer's hops pass and
the tokens equal the single-process model's; a volunteer returning wrong activations is caught, dropped,
and the generation goes on from the trusted replica with the same tokens. The volunteer loads weights
only with the learner's signed manifest of its span.

Run as a script (`script_argv(__file__, ARGS...)`) this file is a volunteer that cheats: it adds noise to
every activation it returns."""

from __future__ import annotations

import asyncio
import json
import sys
import threading

import pytest
import torch

from decentralized_verl.backends.base import GenerationRequest, SamplingParams
from decentralized_verl.backends.hf import HFBackend
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spans import signed
from decentralized_verl.spans.backend import SpanBackend
from decentralized_verl.spans.layout import Span
from decentralized_verl.spans.p2p import P2PSpanClient
from decentralized_verl.spec.model import ModelSpec
from tests.support.keys import ed25519_keypair
from tests.support.processes import ProcessGroup, free_port, script_argv

MODEL = {
    "tiny": {"hiddenSize": 32, "numLayers": 4, "numHeads": 4, "intermediateSize": 64, "maxPositions": 64}
}
SPEC = ModelSpec.model_validate(MODEL)
ONE = (Span(0, 4),)
"""One span, the whole decoder: a trusted server and volunteers for it (fewer processes to start)."""

pytestmark = pytest.mark.usefixtures("collected_before_fork")


KEY, PUBLIC = ed25519_keypair()


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """The front's DHT peer (its event loop on a thread), a trusted gRPC span server, an honest and a
    cheating volunteer for the same span (real processes that reach the front only over P2P)."""
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht

    torch.set_num_threads(1)
    dht = start_dht(PeerOptions(host_maddrs=("/ip4/127.0.0.1/tcp/0",)))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    group = ProcessGroup(tmp_path_factory.mktemp("volunteer-spans"))
    p2p = None
    try:
        p2p = asyncio.run_coroutine_threadsafe(dht.replicate_p2p(), loop).result(60)
        me = dht.peer_id.to_base58()
        maddrs = [str(a) for a in dht.get_visible_maddrs()]
        port = free_port()
        group.start(
            "trusted",
            [sys.executable, "-m", "decentralized_verl.spans.server",
             "--model", json.dumps(MODEL), "--layers", "0:4", "--port", str(port)],
        )  # fmt: skip
        volunteer = ["--model", json.dumps(MODEL), "--layers", "0:4", "--front", me,
                     "--weights-key", PUBLIC.hex(), "--host-maddr", "/ip4/127.0.0.1/tcp/0",
                     "--initial-peers", *maddrs]  # fmt: skip
        group.start("honest", [sys.executable, "-m", "decentralized_verl.spans.volunteer", *volunteer])
        group.start("cheat", script_argv(__file__, *volunteer))
        group.wait_for("trusted", "ready on port")
        ready = {
            name: group.wait_for(name, r"span volunteer (\S+) layers 0:4 ready at (.*)", 180)
            for name in ("honest", "cheat")
        }
        peers = {name: match.group(1) for name, match in ready.items()}
        peers["honest-maddrs"] = ready["honest"].group(2).split()
        yield p2p, loop, f"127.0.0.1:{port}", peers
    finally:
        group.close()
        if p2p is not None:
            asyncio.run_coroutine_threadsafe(p2p.shutdown(), loop).result(30)
        dht.shutdown()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture(scope="module")
def reference():
    return load_model_and_tokenizer(SPEC)


def _requests(tokenizer):
    params = SamplingParams(max_new_tokens=10, temperature=0.0, n=2)
    return [
        GenerationRequest(str(i), tuple(tokenizer.encode(t)), params)
        for i, t in enumerate(["hello there", "abc", "x"])
    ]


def _tokens(outputs):
    return {(o.prompt_id, o.sample_index): o.response_token_ids for o in outputs}


def _front(swarm, name: str) -> SpanBackend:
    p2p, loop, trusted, peers = swarm
    volunteer = P2PSpanClient(p2p, peers[name], loop, timeout_s=60.0)
    replicas = [[volunteer, trusted]]  # the volunteer first: it takes the work
    options = {"timeout_s": 60.0, "failover_s": 120.0, "check_fraction": 1.0, "seed": 0}
    return SpanBackend.from_spec(
        SPEC, ONE, replicas, chain_options=options, verify_key=PUBLIC, max_batch_size=6
    )


def _refresh(front: SpanBackend, model, version: int) -> None:
    """The learner's signed publish of `version`, loaded by the front into every span (volunteer too)."""
    from decentralized_verl.transport.weights.publish import WeightPublisher
    from decentralized_verl.transport.weights.receive import LocalWeightSource

    publisher = WeightPublisher(dtype=None, signing_key=KEY, bundle_metadata=signed.bundle_metadata(ONE))
    publisher.publish(model.state_dict(), version)
    front.load_weights(LocalWeightSource(publisher).fetch_latest(version)[1], version)


def test_an_honest_volunteer_serves_a_span_over_p2p_and_passes_its_spot_checks(swarm, reference):
    model, tokenizer = reference
    front = _front(swarm, "honest")
    volunteer = front.chain.routes[0].clients[0]
    _refresh(front, model, 1)  # the volunteer checks the learner's signed manifest of its span
    assert volunteer.info()["version"] == 1
    expected = _tokens(HFBackend(model, tokenizer, max_batch_size=6).generate(_requests(tokenizer)))
    assert _tokens(front.generate(_requests(tokenizer))) == expected
    stats = front.chain.routes[0].stats
    assert stats.checks > 0 and stats.dropped == []
    assert front.chain.routes[0].client is volunteer and volunteer.info()["hops"] > 0
    front.close()


def test_a_volunteer_returning_wrong_activations_is_caught_and_dropped(swarm, reference):
    model, tokenizer = reference
    front = _front(swarm, "cheat")
    cheat = front.chain.routes[0].clients[0]
    _refresh(front, model, 2)
    expected = _tokens(HFBackend(model, tokenizer, max_batch_size=6).generate(_requests(tokenizer)))
    assert _tokens(front.generate(_requests(tokenizer))) == expected  # the trusted replica's activations
    route = front.chain.routes[0]
    assert route.stats.dropped == [cheat.address]
    assert cheat not in route.clients and route.client.trusted
    front.close()


def test_a_volunteer_that_stops_answering_is_dropped_and_reported_lost(swarm, reference):
    """A volunteer gone mid-generation (a peer nobody can reach) is not waited for: its span goes on on
    the trusted replica with the same tokens, and the front is told it was lost, not caught lying."""
    import os

    from decentralized_verl.security.peer_identity import peer_id_of_seed

    model, tokenizer = reference
    p2p, loop, _, _ = swarm
    front = _front(swarm, "honest")
    _refresh(front, model, 3)
    ghost = P2PSpanClient(p2p, peer_id_of_seed(os.urandom(32)), loop, timeout_s=5.0)
    lost: list[tuple[str, str]] = []
    front.chain.on_lost = lambda client, why: lost.append((client.address, why))
    front.chain.attach(0, ghost)  # the newest replica takes the span's next hops
    expected = _tokens(HFBackend(model, tokenizer, max_batch_size=6).generate(_requests(tokenizer)))
    assert _tokens(front.generate(_requests(tokenizer))) == expected
    route = front.chain.routes[0]
    assert ghost not in route.clients and route.client.trusted
    assert [address for address, _ in lost] == [ghost.address]
    assert "UNAVAILABLE" in lost[0][1] or "DEADLINE_EXCEEDED" in lost[0][1], lost
    front.close()


def test_a_volunteer_answers_only_the_fronts_it_serves(swarm):
    """Another peer of the swarm (its own libp2p identity) is refused by name; nothing is computed."""
    import hivemind

    from decentralized_verl.errors import WireError

    _, loop, _, peers = swarm
    stranger = hivemind.DHT(
        start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=peers["honest-maddrs"]
    )
    try:
        other = asyncio.run_coroutine_threadsafe(stranger.replicate_p2p(), loop).result(60)
        client = P2PSpanClient(other, peers["honest"], loop, timeout_s=30.0)
        with pytest.raises(WireError, match=r"PERMISSION_DENIED: peer \S+ is not a front this span serves"):
            client.info()
        asyncio.run_coroutine_threadsafe(other.shutdown(), loop).result(30)
    finally:
        stranger.shutdown()


def test_a_stolen_key_cannot_lock_a_live_front_out_of_genuine_rosters(swarm, reference, monkeypatch):
    """A front taking volunteers from rosters (its handler on the swarm's P2P peer), pushed to over libp2p
    by another peer holding the learner's key: the coordinator's roster is taken; the thief's, with an
    enormous, infinite or NaN sequence and the cheating volunteer offered, is refused by the clock bound;
    the coordinator's next roster is still taken, and the volunteer it offers is attached. With the bound
    lifted the same roster locks the front out: every genuine roster after it is a "replay"."""
    import math
    import time

    import hivemind
    from google.protobuf.wrappers_pb2 import BytesValue

    from decentralized_verl.spans import front_volunteers
    from decentralized_verl.spans.front_volunteers import FrontVolunteers
    from decentralized_verl.spans.roster import PUSH, sign_push
    from decentralized_verl.transport.p2p import connect, peer

    model, _ = reference
    p2p, loop, trusted, peers = swarm

    def run(coroutine, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)

    options = {"timeout_s": 60.0, "failover_s": 120.0, "check_fraction": 1.0, "seed": 0}
    backend = SpanBackend.from_spec(
        SPEC, ONE, [[trusted]], chain_options=options, verify_key=PUBLIC, max_batch_size=6
    )
    _refresh(backend, model, 4)
    me = p2p.peer_id.to_base58()
    front = FrontVolunteers(backend, p2p, "job", me, PUBLIC, loop)
    run(front.register())
    maddrs = [str(a) for a in run(p2p.get_visible_maddrs())]
    sender = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs)
    try:
        other = run(sender.replicate_p2p())
        assert run(connect(other, me, [a.split("/p2p/")[0] for a in maddrs]))

        def push(seq: float, *offered: str) -> dict:
            volunteers = [{"peer": peers[name], "span": "0:4", "maddrs": peers["honest-maddrs"]}
                          for name in offered]  # fmt: skip
            payload = {"job": "job", "front": me, "seq": seq, "volunteers": volunteers}
            data = BytesValue(value=sign_push(payload, KEY))
            return json.loads(run(other.call_protobuf_handler(peer(me), PUSH, data, BytesValue)).value)

        assert "error" not in push(time.time())  # the coordinator's, at its send time
        for enormous in (9e18, math.inf, math.nan):
            assert "ahead of this front's clock" in push(enormous, "cheat")["error"]
        assert "error" not in push(time.time(), "honest")  # genuine rosters are still taken
        deadline = time.monotonic() + 180
        while peers["honest"] not in push(time.time(), "honest").get("attached", {}):
            assert time.monotonic() < deadline, front.reply()
            time.sleep(0.5)
        assert peers["cheat"] not in front.attached and peers["cheat"] not in front.dropped

        monkeypatch.setattr(front_volunteers, "ROSTER_CLOCK_SKEW_S", math.inf)  # the bound lifted
        assert "error" not in push(9e18)
        assert "a replay" in push(time.time())["error"]
        run(other.shutdown())
    finally:
        sender.shutdown()
        backend.close()


def _cheat() -> int:
    """A volunteer that adds noise to every activation it returns: this process's span server is made to
    lie before the volunteer starts."""
    from decentralized_verl.spans import volunteer
    from decentralized_verl.spans.codec import decode_request, encode_hidden
    from decentralized_verl.spans.server import SpanServer

    def noisy(server: SpanServer, data: bytes) -> bytes:
        out = server.run(decode_request(data, server.hidden_size, server.dtype))
        return encode_hidden(out + 0.05 * torch.randn_like(out))

    SpanServer.forward = noisy
    return volunteer.main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(_cheat())
