"""Wire messages <-> dataclasses: valid ones survive a round trip; each bad one names its field."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from blake3 import blake3

from decentralized_verl.core.status import RefitParity
from decentralized_verl.errors import DverlError, WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.digest import digest_hex

LIMITS = m.WireLimits(vocab_size=50, max_batch=8, max_prompt_tokens=6, max_new_tokens=16)
NAN, INF = math.nan, math.inf


def _raises(field: str, fragment: str, fn: Callable[[], object]) -> WireError:
    with pytest.raises(WireError) as err:
        fn()
    assert err.value.field == field, str(err.value)
    assert str(err.value).startswith(f"{field}: ")
    assert fragment in str(err.value), str(err.value)
    return err.value


def test_wire_error_is_a_project_error_with_the_field_in_its_text() -> None:
    err = WireError("results[3].logprobs", "length 5 does not match response_token_ids length 6")
    assert isinstance(err, DverlError)
    assert str(err) == "results[3].logprobs: length 5 does not match response_token_ids length 6"


# ------------------------------------------------------------------------------------------------
# Generate requests (as a rollout worker receives them)
# ------------------------------------------------------------------------------------------------


def _batch() -> m.GenerateBatch:
    return m.GenerateBatch(
        request_id="step7-w1",
        policy_version=7,
        sampling=m.SamplingParams(
            max_new_tokens=4, temperature=0.8, top_p=0.9, top_k=20, stop=("\n\n",), n=2
        ),
        items=(m.GenerateItem("gsm-1", 0, (1, 2, 3)), m.GenerateItem("gsm-2", 4, (9, 49))),
    )


def _request() -> pb.GenerateRequest:
    return m.generate_request_to_proto(_batch())


def test_generate_request_round_trip() -> None:
    batch = _batch()
    again = m.generate_request_from_proto(
        pb.GenerateRequest.FromString(_request().SerializeToString()), LIMITS
    )
    assert again == batch
    assert batch.expected_keys() == [("gsm-1", 0), ("gsm-1", 1), ("gsm-2", 4), ("gsm-2", 5)]
    assert again.sampling.seed is None


def test_sampling_seed_survives_and_zero_is_not_unset() -> None:
    batch = _batch()
    seeded = m.GenerateBatch(batch.request_id, 0, m.SamplingParams(max_new_tokens=2, seed=0), batch.items)
    again = m.generate_request_from_proto(m.generate_request_to_proto(seeded), LIMITS)
    assert again.sampling.seed == 0 and again.policy_version == 0


def _set(path: str, value: object) -> Callable[[pb.GenerateRequest], None]:
    def mutate(msg: pb.GenerateRequest) -> None:
        *parents, last = path.split(".")
        target: object = msg
        for part in parents:
            name, _, idx = part.partition("[")
            target = getattr(target, name)
            if idx:
                target = target[int(idx[:-1])]  # type: ignore[index]
        if isinstance(value, list):
            del getattr(target, last)[:]
            getattr(target, last).extend(value)
        else:
            setattr(target, last, value)

    return mutate


def _clear(name: str) -> Callable[[pb.GenerateRequest], None]:
    return lambda msg: msg.ClearField(name)


def _too_many_items(msg: pb.GenerateRequest) -> None:
    for i in range(3):
        msg.items.add(prompt_id=f"x{i}", prompt_token_ids=[1])


def _duplicate_item(msg: pb.GenerateRequest) -> None:
    msg.items.add(prompt_id="gsm-1", sample_index=1, prompt_token_ids=[1])


BAD_REQUESTS = [
    (_set("request_id", ""), "request_id", "must not be empty"),
    (_clear("policy_version"), "policy_version", "is missing"),
    (_clear("sampling"), "sampling", "is missing"),
    (_set("sampling.max_new_tokens", 0), "sampling.max_new_tokens", ">= 1"),
    (_set("sampling.max_new_tokens", 17), "sampling.max_new_tokens", "exceeds the limit of 16"),
    (_set("sampling.temperature", -0.1), "sampling.temperature", ">= 0"),
    (_set("sampling.temperature", NAN), "sampling.temperature", "finite"),
    (_set("sampling.top_p", 0.0), "sampling.top_p", "(0, 1]"),
    (_set("sampling.top_p", 1.5), "sampling.top_p", "(0, 1]"),
    (_set("sampling.top_k", -1), "sampling.top_k", ">= 0"),
    (_set("sampling.n", 0), "sampling.n", ">= 1"),
    (_set("sampling.stop", ["ok", ""]), "sampling.stop[1]", "must not be empty"),
    (_set("items", []), "items", "must not be empty"),
    (_too_many_items, "items", "10 items exceed the limit of 8"),  # 5 items x n=2 samples
    (_set("items[1].prompt_id", " "), "items[1].prompt_id", "must not be empty"),
    (_set("items[0].sample_index", -2), "items[0].sample_index", ">= 0"),
    (_duplicate_item, "items[2].sample_index", "already requested by items[0]"),
    (_set("items[1].prompt_token_ids", []), "items[1].prompt_token_ids", "must not be empty"),
    (_set("items[0].prompt_token_ids", [1] * 7), "items[0].prompt_token_ids", "prompt limit of 6"),
    (
        _set("items[1].prompt_token_ids", [3, 50]),
        "items[1].prompt_token_ids[1]",
        "token id 50 is outside [0, 50)",
    ),
    (_set("items[0].prompt_token_ids", [-1, 2]), "items[0].prompt_token_ids[0]", "token id -1"),
]


@pytest.mark.parametrize(("mutate", "field", "fragment"), BAD_REQUESTS)
def test_bad_generate_request(
    mutate: Callable[[pb.GenerateRequest], None], field: str, fragment: str
) -> None:
    msg = _request()
    mutate(msg)
    _raises(field, fragment, lambda: m.generate_request_from_proto(msg, LIMITS))


def test_request_without_vocab_limit_still_rejects_negative_ids() -> None:
    msg = _request()
    msg.items[0].prompt_token_ids[1] = -5
    _raises(
        "items[0].prompt_token_ids[1]",
        "[0, 2**31)",
        lambda: m.generate_request_from_proto(msg, m.WireLimits()),
    )


# ------------------------------------------------------------------------------------------------
# Generate results (as the coordinator receives them)
# ------------------------------------------------------------------------------------------------


def _completion(**kw: object) -> m.Completion:
    base = dict(
        request_id="step7-w1",
        prompt_id="gsm-2",
        sample_index=5,
        response_token_ids=(4, 8, 15, 0),
        logprobs=(-0.5, -1.25, 0.0, -3.0),
        finish_reason="length",
        text="4 8 15",
        policy_version=7,
        worker_id="rollout-1",
        generation_seconds=0.25,
    )
    base.update(kw)
    return m.Completion(**base)  # type: ignore[arg-type]


def _result(**kw: object) -> pb.GenerateResult:
    return m.completion_to_proto(_completion(**kw))


def test_completion_round_trip_with_request() -> None:
    c = _completion()
    wire = pb.GenerateResult.FromString(_result().SerializeToString())
    assert m.completion_from_proto(wire, limits=LIMITS, request=_batch()) == c
    assert c.key == ("gsm-2", 5)


def test_logprob_a_hair_above_zero_is_rounding_not_an_error() -> None:
    got = m.completion_from_proto(_result(logprobs=(-0.5, 5e-5, 0.0, -1.0)), limits=LIMITS, request=_batch())
    assert got.logprobs[1] == pytest.approx(5e-5)


def test_stale_version_accepted_within_max_staleness() -> None:
    got = m.completion_from_proto(
        _result(policy_version=5), limits=LIMITS, expected_version=7, max_staleness=2
    )
    assert got.policy_version == 5
    _raises(
        "result.policy_version",
        "got 4, expected 5..7",
        lambda: m.completion_from_proto(
            _result(policy_version=4), limits=LIMITS, expected_version=7, max_staleness=2
        ),
    )


def _res(**kw: object) -> Callable[[], pb.GenerateResult]:
    return lambda: _result(**kw)


def _res_mut(fn: Callable[[pb.GenerateResult], None]) -> Callable[[], pb.GenerateResult]:
    def build() -> pb.GenerateResult:
        msg = _result()
        fn(msg)
        return msg

    return build


BAD_RESULTS = [
    (
        _res(logprobs=(-0.5, -1.0, -1.0, -1.0, -2.0)),
        "results[3].logprobs",
        "length 5 does not match response_token_ids length 4",
    ),
    (_res(logprobs=(-0.5, -1.0, -1.0)), "results[3].logprobs", "length 3 does not match"),
    (_res(logprobs=(-0.5, NAN, -1.0, -1.0)), "results[3].logprobs[1]", "is NaN"),
    (_res(logprobs=(-0.5, -1.0, -INF, -1.0)), "results[3].logprobs[2]", "is -inf"),
    (_res(logprobs=(INF, -1.0, -1.0, -1.0)), "results[3].logprobs[0]", "is inf"),
    (_res(logprobs=(-0.5, -1.0, -1.0, 0.5)), "results[3].logprobs[3]", "log-prob must be <= 0 (got 0.5)"),
    (
        _res(response_token_ids=(4, 8, 50, 0)),
        "results[3].response_token_ids[2]",
        "token id 50 is outside [0, 50)",
    ),
    (_res(response_token_ids=(4, -3, 1, 0)), "results[3].response_token_ids[1]", "token id -3"),
    (_res(response_token_ids=(), logprobs=()), "results[3].response_token_ids", "must not be empty"),
    (
        _res(response_token_ids=(1,) * 5, logprobs=(-1.0,) * 5),
        "results[3].response_token_ids",
        "length 5 exceeds max_new_tokens 4",
    ),
    (_res(policy_version=6), "results[3].policy_version", "got 6, expected 7"),
    (_res(policy_version=8), "results[3].policy_version", "got 8, expected 7"),
    (_res_mut(lambda r: r.ClearField("policy_version")), "results[3].policy_version", "is missing"),
    (_res(request_id="step6-w1"), "results[3].request_id", "does not match the request 'step7-w1'"),
    (_res(prompt_id=""), "results[3].prompt_id", "must not be empty"),
    (_res(prompt_id="gsm-9"), "results[3].sample_index", "prompt 'gsm-9' was not requested"),
    (_res(sample_index=6), "results[3].sample_index", "sample 6 of prompt 'gsm-2' was not requested"),
    (_res(sample_index=-1), "results[3].sample_index", ">= 0"),
    (_res_mut(lambda r: r.ClearField("finish_reason")), "results[3].finish_reason", "unknown or unset"),
    (_res_mut(lambda r: setattr(r, "finish_reason", 7)), "results[3].finish_reason", "unknown or unset (7)"),
    (_res(worker_id=""), "results[3].worker_id", "must not be empty"),
    (_res(generation_seconds=-1.0), "results[3].generation_seconds", ">= 0"),
    (_res(generation_seconds=NAN), "results[3].generation_seconds", "finite"),
]


@pytest.mark.parametrize(("build", "field", "fragment"), BAD_RESULTS)
def test_bad_generate_result(build: Callable[[], pb.GenerateResult], field: str, fragment: str) -> None:
    msg = build()
    _raises(
        field,
        fragment,
        lambda: m.completion_from_proto(msg, limits=LIMITS, request=_batch(), path="results[3]"),
    )


def test_empty_response_allowed_when_the_limits_say_so() -> None:
    limits = m.WireLimits(vocab_size=50, allow_empty_response=True)
    got = m.completion_from_proto(_result(response_token_ids=(), logprobs=()), limits=limits)
    assert got.response_token_ids == () and got.logprobs == ()


def test_missing_version_rejected_even_without_an_expected_one() -> None:
    msg = _result()
    msg.ClearField("policy_version")
    _raises("result.policy_version", "is missing", lambda: m.completion_from_proto(msg, limits=LIMITS))


def _answers(*keys: tuple[str, int]) -> list[m.Completion]:
    return [_completion(prompt_id=p, sample_index=s) for p, s in keys]


def test_all_answered_in_any_order() -> None:
    m.check_all_answered(_batch(), _answers(("gsm-2", 5), ("gsm-1", 0), ("gsm-2", 4), ("gsm-1", 1)))


@pytest.mark.parametrize(
    ("keys", "field", "fragment"),
    [
        (
            [("gsm-1", 0), ("gsm-1", 1), ("gsm-2", 4), ("gsm-1", 1), ("gsm-2", 5)],
            "results[3]",
            "already answered by results[1]",
        ),
        ([("gsm-1", 0), ("gsm-3", 0)], "results[1]", "prompt 'gsm-3' was not requested"),
        ([("gsm-1", 0), ("gsm-2", 5)], "results", "2 requested samples not answered: gsm-1#1, gsm-2#4"),
        ([], "results", "4 requested samples not answered"),
    ],
)
def test_answers_counted_exactly_once(keys: list[tuple[str, int]], field: str, fragment: str) -> None:
    _raises(field, fragment, lambda: m.check_all_answered(_batch(), _answers(*keys)))


# ------------------------------------------------------------------------------------------------
# Reference log-probs, critic values, critic training
# ------------------------------------------------------------------------------------------------


def _sequences() -> m.SequenceBatch:
    return m.SequenceBatch(
        items=(m.SequencePair((1, 2), (3, 4, 5)), m.SequencePair((6,), (7,))),
        policy_version=3,
    )


def test_sequence_batch_round_trip() -> None:
    batch = _sequences()
    assert m.sequence_batch_from_proto(m.sequence_batch_to_proto(batch), LIMITS) == batch
    unversioned = m.SequenceBatch(batch.items)
    assert m.sequence_batch_from_proto(m.sequence_batch_to_proto(unversioned), LIMITS).policy_version is None


@pytest.mark.parametrize(
    ("items", "field", "fragment"),
    [
        ([], "items", "must not be empty"),
        ([((1,), (2,))] * 9, "items", "9 items exceed the limit of 8"),
        ([((1,), (2,)), ((), (2,))], "items[1].prompt_token_ids", "must not be empty"),
        ([((1,), ())], "items[0].response_token_ids", "must not be empty"),
        ([((1,) * 7, (2,))], "items[0].prompt_token_ids", "prompt limit of 6"),
        ([((1,), (2, 99))], "items[0].response_token_ids[1]", "token id 99"),
    ],
)
def test_bad_sequence_batch(
    items: list[tuple[tuple[int, ...], tuple[int, ...]]], field: str, fragment: str
) -> None:
    msg = pb.SequenceBatch(
        items=[pb.Sequence(prompt_token_ids=p, response_token_ids=r) for p, r in items], policy_version=1
    )
    _raises(field, fragment, lambda: m.sequence_batch_from_proto(msg, LIMITS))


def _values(*rows: tuple[float, ...], version: int | None = 3) -> pb.TokenValuesBatch:
    return m.token_values_to_proto(m.TokenValues(tuple(rows), version, "ref-0"))


def test_token_values_round_trip() -> None:
    got = m.token_values_from_proto(
        _values((-0.5, -1.0, -2.0), (-0.25,)), _sequences(), logprobs=True, expected_version=3
    )
    assert got == m.TokenValues(((-0.5, -1.0, -2.0), (-0.25,)), 3, "ref-0")
    values = m.token_values_from_proto(_values((0.5, 1.5, 2.0), (3.0,)), _sequences(), logprobs=False)
    assert values.values[0] == (0.5, 1.5, 2.0)  # values may be positive; log-probs may not


@pytest.mark.parametrize(
    ("reply", "logprobs", "field", "fragment"),
    [
        (_values((-0.5, -1.0, -2.0)), True, "results", "length 1 does not match request items length 2"),
        (
            _values((-0.5, -1.0), (-0.25,)),
            True,
            "results[0].values",
            "length 2 does not match response_token_ids length 3",
        ),
        (_values((-0.5, -1.0, -2.0), (-0.25, -1.0)), False, "results[1].values", "length 2 does not match"),
        (_values((-0.5, NAN, -2.0), (-0.25,)), True, "results[0].values[1]", "is NaN"),
        (_values((0.5, 1.0, INF), (0.25,)), False, "results[0].values[2]", "is inf"),
        (_values((-0.5, -1.0, -2.0), (0.75,)), True, "results[1].values[0]", "log-prob must be <= 0"),
        (_values((-0.5, -1.0, -2.0), (-0.25,), version=2), True, "policy_version", "got 2, expected 3"),
        (
            _values((-0.5, -1.0, -2.0), (-0.25,), version=None),
            True,
            "policy_version",
            "is missing (expected 3)",
        ),
    ],
)
def test_bad_token_values(reply: pb.TokenValuesBatch, logprobs: bool, field: str, fragment: str) -> None:
    _raises(
        field,
        fragment,
        lambda: m.token_values_from_proto(reply, _sequences(), logprobs=logprobs, expected_version=3),
    )


def _train_items() -> list[m.CriticTrainItem]:
    return [m.CriticTrainItem(m.SequencePair((1, 2), (3, 4)), (1.0, 0.5), (0.25, 0.0))]


def test_critic_train_round_trip() -> None:
    items, version = m.critic_train_request_from_proto(
        m.critic_train_request_to_proto(_train_items(), 4), LIMITS
    )
    assert items == tuple(_train_items()) and version == 4


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [
        (
            lambda r: r.items[0].returns.append(1.0),
            "items[0].returns",
            "length 3 does not match response_token_ids length 2",
        ),
        (lambda r: r.items[0].old_values.pop(), "items[0].old_values", "length 1 does not match"),
        (lambda r: r.items[0].returns.__setitem__(1, NAN), "items[0].returns[1]", "is NaN"),
        (lambda r: r.items[0].old_values.__setitem__(0, -INF), "items[0].old_values[0]", "is -inf"),
        (lambda r: r.items[0].ClearField("sequence"), "items[0].sequence", "is missing"),
        (
            lambda r: r.items[0].sequence.response_token_ids.__setitem__(0, 77),
            "items[0].sequence.response_token_ids[0]",
            "token id 77",
        ),
        (lambda r: r.ClearField("items"), "items", "must not be empty"),
    ],
)
def test_bad_critic_train_request(
    mutate: Callable[[pb.CriticTrainRequest], None], field: str, fragment: str
) -> None:
    msg = m.critic_train_request_to_proto(_train_items(), 4)
    mutate(msg)
    _raises(field, fragment, lambda: m.critic_train_request_from_proto(msg, LIMITS))


# ------------------------------------------------------------------------------------------------
# Rewards
# ------------------------------------------------------------------------------------------------


def test_score_round_trip() -> None:
    items = [
        m.ScoreItem("2+2?", "\\boxed{4}", "4", "boxed"),
        m.ScoreItem("f?", "def f(): 1", '[{"in": 1}]', "code"),
    ]
    assert m.score_request_from_proto(m.score_request_to_proto(items), LIMITS) == tuple(items)
    scores = [m.Score(1.0, "matches"), m.Score(0.0, "no \\boxed{} answer")]
    assert m.scores_from_proto(m.scores_to_proto(scores), 2) == tuple(scores)


def test_bad_score_request_and_reply() -> None:
    _raises(
        "items[1].reward_type",
        "must not be empty",
        lambda: m.score_request_from_proto(
            m.score_request_to_proto([m.ScoreItem("a", "b", "c", "boxed"), m.ScoreItem("a", "b", "c", "")]),
            LIMITS,
        ),
    )
    _raises("items", "must not be empty", lambda: m.score_request_from_proto(pb.ScoreRequest(), LIMITS))
    big = m.score_request_to_proto([m.ScoreItem("a", "b", "c", "boxed")] * 9)
    _raises("items", "9 items exceed the limit of 8", lambda: m.score_request_from_proto(big, LIMITS))
    _raises(
        "results",
        "length 1 does not match request items length 2",
        lambda: m.scores_from_proto(m.scores_to_proto([m.Score(1.0)]), 2),
    )
    _raises(
        "results[1].score",
        "must be finite (got nan)",
        lambda: m.scores_from_proto(m.scores_to_proto([m.Score(1.0), m.Score(NAN)]), 2),
    )


# ------------------------------------------------------------------------------------------------
# Weights
# ------------------------------------------------------------------------------------------------

BLOB = bytes(range(10))  # 10 bytes in chunks of 4: [0..3], [4..7], [8, 9]


def _manifest(**kw: object) -> m.WeightManifest:
    chunks = [BLOB[i : i + 4] for i in range(0, len(BLOB), 4)]
    base = dict(
        version=9,
        total_bytes=len(BLOB),
        digest=digest_hex(BLOB),
        chunk_digests=tuple(digest_hex(c) for c in chunks),
        chunk_bytes=4,
        format="safetensors",
        dtype="bfloat16",
        is_adapter=True,
    )
    base.update(kw)
    return m.WeightManifest(**base)  # type: ignore[arg-type]


def _chunk(index: int, **kw: object) -> pb.WeightChunk:
    data = BLOB[index * 4 : index * 4 + 4]
    fields = dict(version=9, index=index, total=3, data=data, digest=digest_hex(data))
    fields.update(kw)
    return pb.WeightChunk(**fields)  # type: ignore[arg-type]


def test_manifest_and_chunks_verify_and_reassemble() -> None:
    manifest = m.manifest_from_proto(m.manifest_to_proto(_manifest()))
    assert manifest == _manifest()
    assert [manifest.chunk_size(i) for i in range(3)] == [4, 4, 2]
    first = m.chunk_to_proto(m.WeightChunk(9, 0, 3, BLOB[:4], blake3(BLOB[:4]).hexdigest(), manifest))
    pieces = [m.chunk_from_proto(first, manifest)] + [m.chunk_from_proto(_chunk(i), manifest) for i in (1, 2)]
    assert pieces[0].manifest == manifest
    whole = b"".join(p.data for p in pieces)
    assert whole == BLOB and digest_hex(whole) == manifest.digest


@pytest.mark.parametrize(
    ("manifest", "field", "fragment"),
    [
        (_manifest(format="pickle"), "manifest.format", "unsupported format 'pickle'"),
        (_manifest(dtype=""), "manifest.dtype", "must not be empty"),
        (_manifest(digest="abc"), "manifest.digest", "64 lowercase hex"),
        (_manifest(digest="A" * 64), "manifest.digest", "64 lowercase hex"),
        (
            _manifest(chunk_digests=("0" * 64, "zz", "0" * 64)),
            "manifest.chunk_digests[1]",
            "64 lowercase hex",
        ),
        (
            _manifest(chunk_digests=("0" * 64,) * 2),
            "manifest.chunk_digests",
            "2 chunk hashes, but 10 bytes in chunks of 4 make 3",
        ),
        (_manifest(total_bytes=0), "manifest.total_bytes", "must be > 0"),
        (_manifest(chunk_bytes=0), "manifest.chunk_bytes", "must be > 0"),
    ],
)
def test_bad_manifest(manifest: m.WeightManifest, field: str, fragment: str) -> None:
    _raises(field, fragment, lambda: m.manifest_from_proto(m.manifest_to_proto(manifest)))


def _corrupt(msg: pb.WeightChunk) -> pb.WeightChunk:
    msg.data = b"\x00" + msg.data[1:]
    return msg


@pytest.mark.parametrize(
    ("chunk", "field", "fragment"),
    [
        (_chunk(1, version=8), "chunk.version", "got 8, expected 9"),
        (_chunk(1, total=4), "chunk.total", "got 4, the manifest has 3 chunks"),
        (_chunk(3, data=b"", digest=blake3(b"").hexdigest()), "chunk.index", "3 is outside [0, 3)"),
        (
            _chunk(2, data=BLOB[8:9], digest=blake3(BLOB[8:9]).hexdigest()),
            "chunk.data",
            "1 bytes, chunk 2 must have 2",
        ),
        (_corrupt(_chunk(1)), "chunk.digest", "does not match the data"),
        (
            _chunk(1, data=b"\xff" * 4, digest=blake3(b"\xff" * 4).hexdigest()),
            "chunk.digest",
            "manifest's chunk_digests[1]",
        ),
        (
            _chunk(0, manifest=m.manifest_to_proto(_manifest(format="gguf"))),
            "chunk.manifest.format",
            "unsupported format",
        ),
    ],
)
def test_bad_chunk(chunk: pb.WeightChunk, field: str, fragment: str) -> None:
    _raises(field, fragment, lambda: m.chunk_from_proto(chunk, _manifest()))


# ------------------------------------------------------------------------------------------------
# Status, volunteers, health
# ------------------------------------------------------------------------------------------------


def _status(**kw: object) -> m.JobStatus:
    base = dict(
        step=12,
        total_steps=100,
        phase="rollout",
        state="Running",
        reward_mean=0.5,
        reward_std=0.25,
        kl=0.015625,
        response_length_mean=42.5,
        policy_version=12,
        tokens_per_second=1234.5,
        phase_seconds=(("reward", 0.5), ("rollout", 3.25)),
        last_checkpoint="/ckpt/step-10",
        eval_accuracy=0.375,
        volunteers=2,
        refit_parity=RefitParity(diff_mean=2.5e-7, diff_max=1.5e-6, version=11, tokens=96),
    )
    base.update(kw)
    return m.JobStatus(**base)  # type: ignore[arg-type]


def test_status_round_trip() -> None:
    assert m.job_status_from_proto(m.job_status_to_proto(_status())) == _status()
    assert m.job_status_from_proto(m.job_status_to_proto(_status(eval_accuracy=None))).eval_accuracy is None
    assert m.job_status_from_proto(m.job_status_to_proto(_status(eval_accuracy=0.0))).eval_accuracy == 0.0
    assert m.job_status_from_proto(m.job_status_to_proto(_status(refit_parity=None))).refit_parity is None
    failed = _status(state="Failed", failure="refit parity failed ...", failure_reason="RefitParityFailed")
    assert m.job_status_from_proto(m.job_status_to_proto(failed)) == failed


@pytest.mark.parametrize(
    ("status", "field", "fragment"),
    [
        (_status(state=""), "state", "must not be empty"),
        (_status(step=101), "step", "exceeds total_steps 100"),
        (_status(reward_mean=NAN), "reward_mean", "finite"),
        (_status(kl=INF), "kl", "finite"),
        (_status(reward_std=-0.5), "reward_std", ">= 0"),
        (_status(phase_seconds=(("rollout", -1.0),)), "phase_seconds['rollout']", ">= 0"),
        (_status(eval_accuracy=1.5), "eval_accuracy", "[0, 1]"),
        (_status(refit_parity=RefitParity(NAN, 1.0, 3)), "refit_parity.diff_mean", "finite"),
        (_status(refit_parity=RefitParity(0.5, INF, 3)), "refit_parity.diff_max", "finite"),
        (_status(refit_parity=RefitParity(-0.5, 1.0, 3)), "refit_parity.diff_mean", ">= 0"),
        (_status(refit_parity=RefitParity(0.5, 0.25, 3)), "refit_parity.diff_max", "below diff_mean 0.5"),
        (_status(refit_parity=RefitParity(0.5, 1.0, 13)), "refit_parity.version", "newer than the policy"),
        (_status(state="Failed", failure_reason="Refit Parity"), "failure_reason", "one word"),
        (_status(state="Failed", failure_reason="refitParity"), "failure_reason", "one word"),
        (_status(state="Failed", failure="x" * 4001), "failure", "at most 4000"),
    ],
)
def test_bad_status(status: m.JobStatus, field: str, fragment: str) -> None:
    _raises(field, fragment, lambda: m.job_status_from_proto(m.job_status_to_proto(status)))


def test_join_and_heartbeat_round_trip() -> None:
    join = m.JoinRequest("gsm8k", "tok.sig", "rollout", "1x RTX 4090", 850.0)
    assert m.join_request_from_proto(m.join_request_to_proto(join)) == join
    assert "tok.sig" not in repr(join)
    reply = m.JoinReply(True, "peer-1", "", 4, "10.0.0.5:50051")
    assert m.join_reply_from_proto(m.join_reply_to_proto(reply)) == reply
    beat = m.Heartbeat("peer-1", 4, 0.5)
    assert m.heartbeat_from_proto(m.heartbeat_to_proto(beat)) == beat
    ready = m.Readiness(False, "reference", "ref-0")
    assert m.readiness_from_proto(m.readiness_to_proto(ready)) == ready
    info = m.WorkerInfo("rollout-1", "rollout", 3, 512.0, "hf")
    assert m.worker_info_from_proto(m.worker_info_to_proto(info)) == info


@pytest.mark.parametrize(
    ("build", "field", "fragment"),
    [
        (
            lambda: m.join_request_from_proto(pb.JoinRequest(job="", token="t", role=pb.ROLE_ROLLOUT)),
            "job",
            "must not be empty",
        ),
        (
            lambda: m.join_request_from_proto(pb.JoinRequest(job="j", token="", role=pb.ROLE_ROLLOUT)),
            "token",
            "must not be empty",
        ),
        (
            lambda: m.join_request_from_proto(pb.JoinRequest(job="j", token="t")),
            "role",
            "unknown or unset role (0)",
        ),
        (
            lambda: m.join_request_from_proto(pb.JoinRequest(job="j", token="t", role=9)),
            "role",
            "unknown or unset role (9)",
        ),
        (
            lambda: m.join_request_from_proto(
                pb.JoinRequest(job="j", token="t", role=1, tokens_per_second=NAN)
            ),
            "tokens_per_second",
            "finite",
        ),
        (
            lambda: m.join_reply_from_proto(pb.JoinReply(accepted=True, weights_address="a:1")),
            "peer_id",
            "must not be empty",
        ),
        (
            lambda: m.join_reply_from_proto(pb.JoinReply(accepted=True, peer_id="p")),
            "weights_address",
            "must not be empty",
        ),
        (lambda: m.join_reply_from_proto(pb.JoinReply(accepted=False)), "reason", "must not be empty"),
        (lambda: m.heartbeat_from_proto(pb.HeartbeatRequest(peer_id="p", load=1.5)), "load", "[0, 1]"),
        (lambda: m.heartbeat_from_proto(pb.HeartbeatRequest(peer_id="p", load=-0.1)), "load", ">= 0"),
        (lambda: m.heartbeat_from_proto(pb.HeartbeatRequest(load=0.5)), "peer_id", "must not be empty"),
        (lambda: m.readiness_from_proto(pb.ReadyReply(ready=True, role=2)), "worker_id", "must not be empty"),
        (
            lambda: m.worker_info_from_proto(
                pb.WorkerInfo(worker_id="w", role=1, tokens_per_second=-1.0, backend="hf")
            ),
            "tokens_per_second",
            ">= 0",
        ),
        (
            lambda: m.worker_info_from_proto(pb.WorkerInfo(worker_id="w", role=1, backend="")),
            "backend",
            "must not be empty",
        ),
        (lambda: m.role_from_name("actor"), "role", "unknown role 'actor'"),
    ],
)
def test_bad_volunteer_and_health_messages(build: Callable[[], object], field: str, fragment: str) -> None:
    _raises(field, fragment, build)


def test_large_valid_result_is_checked_quickly() -> None:
    """The fast path (min/max/sum in C) keeps validation cheap for long responses."""
    import time

    n = 4096
    ids = tuple(i % 50 for i in range(n))
    lps = tuple(-(i % 7) / 8 for i in range(n))
    msg = _result(response_token_ids=ids, logprobs=lps)
    start = time.perf_counter()
    for _ in range(50):
        m.completion_from_proto(msg, limits=LIMITS, expected_version=7)
    assert time.perf_counter() - start < 2.0


def test_newer_version_accepted_only_when_allowed() -> None:
    """Async RL: a worker that fetched weights after the request may answer with a newer version."""
    got = m.completion_from_proto(
        _result(policy_version=9), limits=LIMITS, expected_version=7, max_staleness=1, allow_newer=True
    )
    assert got.policy_version == 9
    with pytest.raises(WireError, match=r"policy_version: got 9, expected 7"):
        m.completion_from_proto(_result(policy_version=9), limits=LIMITS, expected_version=7)
    with pytest.raises(WireError, match=r"policy_version: got 5, expected >= 6"):
        m.completion_from_proto(
            _result(policy_version=5), limits=LIMITS, expected_version=7, max_staleness=1, allow_newer=True
        )
