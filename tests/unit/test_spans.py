"""Span serving, in one process: the layout rules, the hop codec's refusals, a span server's sessions,
versions and weights against the whole model's own layers (the reference is the single-process model
computing the same hidden states)."""

from __future__ import annotations

import itertools

import pytest
import torch

from decentralized_verl.backends.base import GenerationRequest, SamplingParams
from decentralized_verl.errors import ModelError, WireError
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spans import codec
from decentralized_verl.spans.blocks import build_front, build_span, spec_parts
from decentralized_verl.spans.layout import (
    LayoutError,
    Span,
    check_layout,
    even_layout,
    parse_span,
    split_state,
    to_span_name,
)
from decentralized_verl.spans.server import Busy, SpanServer, UnknownSession, WrongVersion
from decentralized_verl.spec.model import ModelSpec

torch.set_num_threads(1)

SPEC = ModelSpec.model_validate(
    {"tiny": {"hiddenSize": 32, "numLayers": 4, "numHeads": 4, "intermediateSize": 64, "maxPositions": 64}}
)


@pytest.fixture(scope="module")
def whole():
    model, tokenizer = load_model_and_tokenizer(SPEC)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def parts():
    return spec_parts(SPEC)


def _server(parts, span: Span, **kw) -> SpanServer:
    config, _, source, dtype = parts
    return SpanServer(build_span(config, span, source, dtype), span, server_id=f"span-{span}", **kw)


# ---------------------------------------------------------------- layout


def test_even_layout_covers_every_layer_once():
    assert even_layout(30, 3) == (Span(0, 10), Span(10, 20), Span(20, 30))
    assert even_layout(7, 3) == (Span(0, 3), Span(3, 5), Span(5, 7))
    assert check_layout(even_layout(7, 3), 7) == even_layout(7, 3)


@pytest.mark.parametrize(
    ("spans", "layers", "message"),
    [
        ([Span(0, 2), Span(3, 4)], 4, r"spans\[1\]: starts at layer 3, expected 2"),
        ([Span(0, 2), Span(1, 4)], 4, r"spans\[1\]: starts at layer 1, expected 2"),
        ([Span(1, 4)], 4, r"spans\[0\]: starts at layer 1"),
        ([Span(0, 3)], 4, "end at layer 3 but the model has 4"),
        ([], 4, "at least one span"),
    ],
)
def test_bad_layouts_are_named(spans, layers, message):
    with pytest.raises(LayoutError, match=message):
        check_layout(spans, layers)


@pytest.mark.parametrize("text", ["3", "a:b", "4:2", "2:2", "-1:3", ""])
def test_bad_span_text_names_the_field(text):
    with pytest.raises(LayoutError, match="--layers"):
        parse_span(text, field="--layers")
    with pytest.raises(LayoutError):
        even_layout(4, 5)


def test_split_state_gives_each_span_only_its_layers(whole):
    model, _ = whole
    spans = even_layout(4, 2)
    front, spans_parts = split_state(model.state_dict(), spans)
    assert set(front) == {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert all(name.split(".")[1] in {"0", "1"} for name in spans_parts[0])
    assert to_span_name("model.layers.3.mlp.up_proj.weight", spans[1]) == "layers.1.mlp.up_proj.weight"
    assert sum(len(p) for p in spans_parts) + len(front) == len(model.state_dict())
    with pytest.raises(LayoutError, match=r"model.rotary"):
        split_state({"model.rotary.inv_freq": torch.zeros(1)}, spans)
    with pytest.raises(LayoutError, match="layer 9 is in no span"):
        split_state({"model.layers.9.x": torch.zeros(1)}, spans)


# ---------------------------------------------------------------- the parts compute the whole model


def test_front_and_spans_compute_the_whole_models_logits(whole, parts):
    model, tokenizer = whole
    config, _, source, dtype = parts
    front = build_front(config, source, dtype)
    servers = [_server(parts, s) for s in even_layout(4, 3)]
    ids = torch.tensor([tokenizer.encode("hello world")])
    attention = torch.ones_like(ids)
    positions = torch.arange(ids.shape[1])[None]
    hidden = front.model.embed_tokens(ids)
    for i, server in enumerate(servers):
        request = codec.HopRequest(f"s{i}", 0, hidden, attention, positions, open=True, capacity=32)
        hidden = codec.decode_hidden(server.forward(codec.encode_request(request)), 1, ids.shape[1], 32)
    logits = front.lm_head(front.model.norm(hidden))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert all(
        s.info()["parameter_bytes"] < sum(p.numel() * 4 for p in model.parameters()) / 2 for s in servers
    )


# ---------------------------------------------------------------- the codec refuses bad hops


def _hop(**change):
    fields = dict(
        session="s",
        version=0,
        hidden=torch.zeros(2, 3, 32),
        attention=torch.ones(2, 3, dtype=torch.long),
        positions=torch.arange(3).repeat(2, 1),
        open=True,
        capacity=8,
    )
    fields.update(change)
    return codec.encode_request(codec.HopRequest(**fields))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden": torch.zeros(2, 3, 16)}, "hop.hidden"),
        ({"hidden": torch.zeros(2, 3, 32, dtype=torch.float64)}, "hop.hidden"),
        ({"hidden": torch.full((2, 3, 32), float("nan"))}, "hop.hidden"),
        ({"attention": torch.ones(1, 3, dtype=torch.long)}, "hop.attention"),
        ({"attention": torch.full((2, 3), 2, dtype=torch.long)}, "hop.attention"),
        ({"attention": torch.ones(2, 2, dtype=torch.long)}, "hop.attention"),
        ({"positions": torch.zeros(2, 2, dtype=torch.long)}, "hop.positions"),
        ({"positions": torch.full((2, 3), -1, dtype=torch.long)}, "hop.positions"),
        ({"session": ""}, "hop.session"),
        ({"session": "x" * 200}, "hop.session"),
        ({"version": -1}, "hop.version"),
        ({"capacity": 0}, "hop.capacity"),
        ({"rows": (0, 1)}, "hop.rows"),
        ({"keep_last": 4}, "hop.keep_last"),
    ],
)
def test_codec_names_the_bad_field(change, field):
    with pytest.raises(WireError) as caught:
        codec.decode_request(_hop(**change), 32, torch.float32)
    assert caught.value.field == field


def test_codec_refuses_what_is_not_a_hop():
    for data in (b"", b"garbage", b"\x08" + b"\x00" * 7 + b"{}"):
        with pytest.raises(WireError, match="not a span hop message"):
            codec.decode_request(data, 32, torch.float32)


# ---------------------------------------------------------------- a span server's sessions


def _open(
    server: SpanServer, session: str, tokens: int = 3, rows: int = 2, capacity: int = 8, version: int = 0
):
    request = codec.HopRequest(
        session,
        version,
        torch.randn(rows, tokens, 32),
        torch.ones(rows, tokens, dtype=torch.long),
        torch.arange(tokens).repeat(rows, 1),
        open=True,
        capacity=capacity,
    )
    return server.run(request)


def _step(server: SpanServer, session: str, held: int, rows=None, count: int = 2, version: int = 0):
    request = codec.HopRequest(
        session,
        version,
        torch.randn(count, 1, 32),
        torch.ones(count, held + 1, dtype=torch.long),
        torch.full((count, 1), held),
        rows=rows,
    )
    return server.run(request)


def test_sessions_are_routed_by_id_and_refuse_what_does_not_fit(parts):
    server = _server(parts, Span(0, 2), max_sessions=2)
    _open(server, "a")
    _open(server, "b", rows=1)
    with pytest.raises(Busy):
        _open(server, "c")
    with pytest.raises(WireError, match="already open"):
        _open(server, "a")
    with pytest.raises(UnknownSession, match="'zzz'"):
        _step(server, "zzz", 3)
    with pytest.raises(WireError, match=r"hop.rows"):
        _step(server, "a", 3, rows=(0, 5))
    with pytest.raises(WireError, match=r"hop.hidden: has 2 rows, the session holds 1"):
        _step(server, "b", 3)
    assert _step(server, "a", 3).shape == (2, 1, 32)
    with pytest.raises(WireError, match=r"hop.attention: covers 4 positions, expected 4 cached"):
        _step(server, "a", 3)  # as if the previous step had not happened
    assert _step(server, "b", 3, rows=(0, 0, 0), count=3).shape == (3, 1, 32)  # a group copied from a row
    with pytest.raises(WireError, match="exceed the session's 8"):
        server.run(
            codec.HopRequest(
                "b",
                0,
                torch.randn(3, 5, 32),
                torch.ones(3, 9, dtype=torch.long),
                torch.arange(4, 9).repeat(3, 1),
            )
        )
    assert server.close("a") and not server.close("a")
    assert set(server.sessions) == {"b"}


def test_idle_sessions_are_freed_after_the_timeout(parts):
    now = [0.0]
    server = _server(parts, Span(0, 1), session_timeout_s=10.0, clock=lambda: now[0])
    _open(server, "old")
    now[0] = 6.0
    _open(server, "new")
    now[0] = 12.0
    assert server.sweep() == ["old"]
    _step(server, "new", 3)  # in use: kept alive
    now[0] = 21.0
    assert server.sweep() == [] and set(server.sessions) == {"new"}
    now[0] = 40.0
    with pytest.raises(UnknownSession):
        _step(server, "new", 4)


def test_a_hop_with_another_policy_version_is_refused(parts):
    server = _server(parts, Span(0, 1), version=3)
    with pytest.raises(WrongVersion, match="holds policy version 3, the hop was computed with 2"):
        _open(server, "a", version=2)
    assert not server.sessions


def test_weights_load_only_the_spans_layers_and_a_bad_refresh_changes_nothing(whole, parts):
    from decentralized_verl.spans.chain import _blob

    model, _ = whole
    span = Span(2, 4)
    server = _server(parts, span)
    _, spans_parts = split_state(model.state_dict(), (Span(0, 2), span))
    new = {k: v + 1.0 for k, v in spans_parts[1].items()}
    before = {k: v.clone() for k, v in server.module.state_dict().items()}
    with pytest.raises(WireError, match=r"outside its layers: \['layers.9.x'\]"):
        server.stage(_blob({**new, "layers.9.x": torch.zeros(1)}, 1))
    server.stage(_blob({**new, "layers.0.mlp.up_proj.weight": torch.zeros(1)}, 1))  # its name, a bad shape
    with pytest.raises(WireError, match=r"layers.0.mlp.up_proj.weight"):
        server.commit(1)
    assert server.version == 0
    assert all(torch.equal(before[k], v) for k, v in server.module.state_dict().items())
    with pytest.raises(WireError, match="nothing staged for version 1"):
        server.commit(1)
    half = dict(list(new.items())[: len(new) // 2])
    server.stage(_blob(half, 1))
    server.stage(_blob(dict(list(new.items())[len(new) // 2 :]), 1))
    _open(server, "cached")
    server.commit(1)
    assert server.version == 1 and not server.sessions  # old caches are dropped with the old weights
    assert all(torch.equal(new[k], v) for k, v in server.module.state_dict().items())
    with pytest.raises(WireError, match="no version tag"):
        server.stage(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")


def test_models_that_are_not_a_plain_decoder_stack_are_refused(parts):
    config, _, source, dtype = parts
    odd = type(config)(**{**config.to_dict(), "num_hidden_layers": 4})
    odd.model_type = "gemma"
    with pytest.raises(ModelError, match="'gemma' model cannot be served as spans"):
        build_span(odd, Span(0, 1), source, dtype)
    with pytest.raises(ModelError, match="only 4 decoder layers"):
        build_span(config, Span(2, 6), source, dtype)
    with pytest.raises(ModelError, match="lora"):
        spec_parts(
            ModelSpec.model_validate({**SPEC.model_dump(by_alias=True, exclude_none=True), "lora": {}})
        )


def test_generation_request_types_are_shared_with_the_hf_backend():
    # The span backend is the HF backend's loop: one request type, one sampling params type.
    assert GenerationRequest("p", (1,), SamplingParams()).params.n == 1


# ---------------------------------------------------------------- placement by memory

LLAMA_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}


def test_a_70b_model_is_placed_as_spans_over_24_gib_workers():
    from decentralized_verl.planning.devices import GIB
    from decentralized_verl.planning.shapes import shape_from_config
    from decentralized_verl.planning.spans import USABLE, Load, place_spans, render

    shape = shape_from_config(LLAMA_70B)
    whole = shape.parameters() * 2
    assert whole > 5 * 24 * GIB  # ~131 GiB of bf16 weights: no single worker could hold it
    workers = [(f"rollout-{i}", 24 * GIB) for i in range(12)]
    placement = place_spans(shape, workers, Load(rows=16, tokens=1024))
    spans = placement.spans
    assert spans[0][0] == 0 and spans[-1][1] == 80
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous, each layer once
    assert placement.places[0].front and not any(p.front for p in placement.places[1:])
    assert all(p.total <= USABLE * p.memory for p in placement.places)
    assert sum(p.weight_bytes for p in placement.places) == whole
    assert 6 <= len(placement.places) <= 8
    assert "front + layers 0:" in render(placement)


def test_a_placement_that_cannot_fit_says_how_much_is_missing():
    from decentralized_verl.planning.devices import GIB
    from decentralized_verl.planning.shapes import shape_from_config
    from decentralized_verl.planning.spans import Load, SpanPlanError, place_spans

    shape = shape_from_config(LLAMA_70B)
    with pytest.raises(
        SpanPlanError, match=r"of 80 layers fit on no worker \(\d+\.\d GiB more .* more worker"
    ):
        place_spans(shape, [("a", 24 * GIB), ("b", 24 * GIB)], Load(rows=16, tokens=1024))
    with pytest.raises(SpanPlanError, match=r"the front .* does not fit worker small"):
        place_spans(shape, [("small", 2 * GIB)])
    with pytest.raises(SpanPlanError, match="no rollout worker"):
        place_spans(shape, [])


def test_the_placement_cli_prints_what_each_worker_holds(tmp_path, capsys):
    import json

    from decentralized_verl.planning.spans import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_70B))
    assert (
        main([str(config), "--worker-memory", "24Gi", "--workers", "10", "--rows", "8", "--tokens", "512"])
        == 0
    )
    out = capsys.readouterr().out
    assert "front + layers 0:" in out and ":80" in out
    assert main([str(config), "--worker-memory", "24Gi", "--workers", "2"]) == 2
    assert "fit on no worker" in capsys.readouterr().out
