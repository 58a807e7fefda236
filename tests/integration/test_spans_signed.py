"""Weights per span: the learner signs one manifest per span over exactly that span's tensors, the front
hands each span only its share, and a span server checks its manifest (signature, span, version, the
exact subset, every tensor's bytes) before it changes anything. In one process for the many refusals;
with real span server processes for a learner publish reaching every span."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from decentralized_verl.backends.base import GenerationRequest, SamplingParams
from decentralized_verl.backends.hf import HFBackend
from decentralized_verl.errors import WireError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.spans import signed
from decentralized_verl.spans.backend import SpanBackend
from decentralized_verl.spans.blocks import build_span, spec_parts
from decentralized_verl.spans.chain import _blob
from decentralized_verl.spans.client import SpanClient
from decentralized_verl.spans.layout import Span, split_state
from decentralized_verl.spans.server import SpanServer, decode_commit
from decentralized_verl.spec.model import ModelSpec
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.receive import LocalWeightSource
from tests.support.keys import ed25519_keypair
from tests.support.processes import ProcessGroup, free_port

torch.set_num_threads(1)

MODEL = {
    "tiny": {"hiddenSize": 32, "numLayers": 4, "numHeads": 4, "intermediateSize": 64, "maxPositions": 64}
}
SPEC = ModelSpec.model_validate(MODEL)
TWO = (Span(0, 2), Span(2, 4))


KEY, PUBLIC = ed25519_keypair()
OTHER_KEY, _ = ed25519_keypair()


@pytest.fixture(scope="module")
def new_state():
    """A learner's next version: the model's tensors, changed."""
    model, _ = load_model_and_tokenizer(SPEC)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    return model.state_dict(), model


def _server(span: Span) -> SpanServer:
    config, _, source, dtype = spec_parts(SPEC)
    return SpanServer(
        build_span(config, span, source, dtype), span, server_id=f"span-{span}", verify_key=PUBLIC
    )


def _manifest(state, version=1, key=KEY, spans=TWO, index=1):
    return signed.span_manifests(state, version, spans, key)[index]


def _tampered_bytes(state):
    changed = dict(state)
    changed["model.layers.3.mlp.up_proj.weight"] = changed["model.layers.3.mlp.up_proj.weight"] + 1e-3
    return _manifest(changed)


def _drop_one(state):
    m = _manifest(state)
    return signed._sign(signed.SpanManifest(m.version, m.span, m.tensors[1:]), KEY)


def _extra_one(state):
    m = _manifest(state)
    extra = signed.TensorEntry("layers.1.extra", "float32", (1,), "00")
    return signed._sign(signed.SpanManifest(m.version, m.span, (*m.tensors, extra)), KEY)


def _forged(state):
    m = _tampered_bytes(state)
    return signed.SpanManifest(m.version, m.span, m.tensors, _manifest(state).signature)


BAD = {
    "no manifest": (lambda s: None, "came without a signed manifest"),
    "unsigned": (lambda s: _manifest(s, key=None), "the manifest is not signed"),
    "another key": (lambda s: _manifest(s, key=OTHER_KEY), "not signed by this job's learner"),
    "forged signature": (_forged, "not signed by this job's learner"),
    "another span": (lambda s: _manifest(s, index=0), "the manifest covers layers 0:2"),
    "another version": (lambda s: _manifest(s, version=2), "the manifest is for version 2"),
    "tensor outside the subset": (_drop_one, "sent tensors outside its signed subset"),
    "tensor not sent": (_extra_one, r"names tensors not sent: \['layers.1.extra'\]"),
    "other bytes": (_tampered_bytes, r"'layers.1.mlp.up_proj.weight'.*bytes differ from the signed manifest"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_span_refuses_a_refresh_its_signed_manifest_does_not_cover(new_state, case):
    state, _ = new_state
    make, message = BAD[case]
    server = _server(TWO[1])
    before = {k: v.clone() for k, v in server.module.state_dict().items()}
    _, parts = split_state(state, TWO)
    server.stage(_blob(parts[1], 1))
    with pytest.raises(WireError, match=message):
        server.commit(1, make(state))
    assert server.version == 0 and not server.staged  # nothing changed; a retry must restage
    assert all(torch.equal(before[k], v) for k, v in server.module.state_dict().items())
    server.stage(_blob(parts[1], 1))  # the right manifest still loads
    server.commit(1, _manifest(state))
    assert server.version == 1
    assert all(torch.equal(parts[1][k], v) for k, v in server.module.state_dict().items())


def test_a_span_refuses_a_tensor_outside_its_layers_when_staged(new_state):
    state, _ = new_state
    server = _server(TWO[1])
    _, parts = split_state(state, TWO)
    with pytest.raises(
        WireError, match=r"span 2:4: tensors outside its layers: \['layers.2.mlp.up_proj.weight'\]"
    ):
        server.stage(
            _blob({**parts[1], "layers.2.mlp.up_proj.weight": parts[1]["layers.1.mlp.up_proj.weight"]}, 1)
        )


@pytest.mark.parametrize(
    "data, field",
    [
        (b"7", "commit.version"),
        (b"not json", "commit"),
        (b'{"version": -1}', "commit.version"),
        (b'{"version": 1, "manifest": {"version": 1, "span": "2-4", "tensors": []}}', "commit.manifest.span"),
        (b'{"version": 1, "manifest": {"version": 1, "span": "2:4", "tensors": [["a"]]}}', r"tensors\[0\]"),
        (
            b'{"version": 1, "manifest": {"version": 1, "span": "2:4", "tensors": [], "signature": "zz"}}',
            "signature",
        ),
    ],
)
def test_a_malformed_commit_names_the_field(data, field):
    with pytest.raises(WireError, match=field):
        decode_commit(data)


def test_the_learners_bundle_carries_one_signed_manifest_per_span_and_another_layout_is_refused(new_state):
    state, model = new_state
    publisher = WeightPublisher(
        dtype="bfloat16", signing_key=KEY, bundle_metadata=signed.bundle_metadata(TWO)
    )
    publisher.publish(state, 1)
    _, received = LocalWeightSource(publisher).fetch_latest(1)
    manifests = signed.from_metadata(received.metadata)
    assert [m.span for m in manifests] == list(TWO)
    _, parts = split_state(received, TWO)
    for manifest, span, part in zip(manifests, TWO, parts, strict=True):
        signed.check(manifest, span, 1, part, PUBLIC)  # over the bf16 wire tensors, as the span gets them
        assert {t.name for t in manifest.tensors} == set(part)
    # A sharded learner publishes a stream (gathered tensor by tensor): its bundle carries them too.
    from decentralized_verl.training.learner_group import streamed_weights

    streamed = WeightPublisher(dtype=None, signing_key=KEY, bundle_metadata=signed.bundle_metadata(TWO))
    streamed.publish(streamed_weights(model), 3)
    _, whole = LocalWeightSource(streamed).fetch_latest(3)
    _, parts = split_state(whole, TWO)
    for manifest, span, part in zip(signed.from_metadata(whole.metadata), TWO, parts, strict=True):
        signed.check(manifest, span, 3, part, PUBLIC)
    three = (Span(0, 1), Span(1, 3), Span(3, 4))
    config, tokenizer, source, dtype = spec_parts(SPEC)
    from decentralized_verl.spans.blocks import build_front
    from decentralized_verl.spans.chain import Chain

    front = SpanBackend(
        build_front(config, source, dtype),
        tokenizer,
        Chain(three, [["127.0.0.1:9"]] * 3, 32),
        verify_key=PUBLIC,
    )
    with pytest.raises(
        WireError, match=r"signs layers \['0:2', '2:4'\], not this chain's spans \['0:1', '1:3', '3:4'\]"
    ):
        front.load_weights(received, 1)
    with pytest.raises(WireError, match="came without a signed manifest"):
        front.load_weights(dict(received), 1)  # a bundle without manifests, with a key to check them
    assert front.version == 0


def _command(span: Span, port: int) -> list[str]:
    return [
        sys.executable, "-m", "decentralized_verl.spans.server", "--model", json.dumps(MODEL),
        "--layers", str(span), "--port", str(port), "--weights-key", PUBLIC.hex(),
    ]  # fmt: skip


def test_a_learner_publish_reaches_each_span_process_with_only_its_share(tmp_path, new_state):
    state, new_model = new_state
    group = ProcessGroup(tmp_path)
    ports = [free_port() for _ in TWO]
    try:
        for span, port in zip(TWO, ports, strict=True):
            group.start(f"span-{span.start}", _command(span, port))
        for span in TWO:
            group.wait_for(f"span-{span.start}", "ready on port")
        addresses = [[f"127.0.0.1:{p}"] for p in ports]
        front = SpanBackend.from_spec(SPEC, TWO, addresses, verify_key=PUBLIC, max_batch_size=4)
        publisher = WeightPublisher(
            dtype=None, signing_key=KEY, bundle_metadata=signed.bundle_metadata(TWO)
        )  # the learner's, as it runs
        publisher.publish(state, 1)
        worker = RolloutWorker(front, "rollout-0", LocalWeightSource(publisher))
        assert worker.ensure_version(1) == 1
        whole = sum(t.numel() * t.element_size() for t in state.values())
        for address in addresses:
            info = SpanClient(address[0]).info()
            assert info["version"] == 1
            # its own layers' bytes (plus a safetensors header), a fraction of the model
            assert info["parameter_bytes"] <= info["weight_bytes_received"] < 1.1 * info["parameter_bytes"]
            assert info["weight_bytes_received"] < 0.5 * whole
        _, tokenizer = load_model_and_tokenizer(SPEC)
        requests = [
            GenerationRequest(
                str(i), tuple(tokenizer.encode(t)), SamplingParams(max_new_tokens=8, temperature=0.0)
            )
            for i, t in enumerate(["hello", "abc"])
        ]
        expected = {
            o.prompt_id: o.response_token_ids for o in HFBackend(new_model, tokenizer).generate(requests)
        }
        assert {o.prompt_id: o.response_token_ids for o in front.generate(requests)} == expected
        # An unsigned publish (not the learner's key) is refused by the front before any span changes.
        rogue = WeightPublisher(dtype=None, signing_key=None, bundle_metadata=signed.bundle_metadata(TWO))
        rogue.publish(state, 2)
        with pytest.raises(WireError, match="the manifest is not signed"):
            worker.load_weights(LocalWeightSource(rogue).fetch_latest(2)[1], 2)
        assert [SpanClient(a[0]).info()["version"] for a in addresses] == [1, 1]
        # The span checks on its own too: a front that skips the check still cannot load it.
        front.verify_key = None
        with pytest.raises(WireError, match="the manifest is not signed"):
            worker.load_weights(LocalWeightSource(rogue).fetch_latest(2)[1], 2)
        assert [SpanClient(a[0]).info()["version"] for a in addresses] == [1, 1]
        front.close()
    finally:
        group.close()


def test_a_span_process_never_goes_back_to_an_older_genuine_version(tmp_path, new_state):
    """A span server process given v1 and then v2 (each with the learner's genuine signed manifest) is
    sent v1's blob and manifest again over the wire, as anyone who recorded them could: refused, v2 kept.
    The same version again (a front's retry) still loads."""
    state, _ = new_state
    older_state = {k: v + 0.5 for k, v in state.items()}
    older, newer = split_state(older_state, TWO)[1][1], split_state(state, TWO)[1][1]
    group = ProcessGroup(tmp_path)
    port = free_port()
    try:
        group.start("span", _command(TWO[1], port))
        group.wait_for("span", "ready on port")
        client = SpanClient(f"127.0.0.1:{port}")
        client.stage(_blob(older, 1))
        client.commit(1, _manifest(older_state, version=1))
        client.stage(_blob(newer, 2))
        client.commit(2, _manifest(state, version=2))
        assert client.info()["version"] == 2
        with pytest.raises(WireError, match=r"v1 is older than v2 held here \(a rollback is refused\)"):
            client.stage(_blob(older, 1))
        with pytest.raises(WireError, match="a rollback is refused"):
            client.commit(1, _manifest(older_state, version=1))
        assert client.info()["version"] == 2
        client.stage(_blob(newer, 2))
        client.commit(2, _manifest(state, version=2))
        assert client.info()["version"] == 2
    finally:
        group.close()
