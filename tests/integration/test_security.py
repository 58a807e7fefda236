"""The secured path over real gRPC servers on 127.0.0.1: job credentials on disk, every RPC of every
service refused without the job's token (and a refused call changes nothing), and weights that the job's
learner did not sign refused by rollout workers, relays, pullers and volunteers with their version as it
was, while the learner's own signed pushes and pulls still go through.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import stat
from pathlib import Path

import grpc
import pytest
import torch
from google.protobuf import message_factory

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.security import credentials as cr
from decentralized_verl.security import trust
from decentralized_verl.security.rights import may_call
from decentralized_verl.serving.servicers import serve
from decentralized_verl.transport import secure
from decentralized_verl.transport.weights import signing
from decentralized_verl.transport.weights.publish import Published, WeightPublisher
from decentralized_verl.transport.weights.push import OK
from decentralized_verl.transport.weights.receive import (
    BundleBuilder,
    GrpcWeightSource,
    LocalWeightSource,
)
from decentralized_verl.transport.weights.relay import WeightRelay
from decentralized_verl.transport.weights.route import plan_chain
from decentralized_verl.transport.weights.service import WeightsServicer
from tests.support.paths import ROOT
from tests.support.relays import CHUNK, RelayThread, model_state

torch.set_num_threads(1)

SERVICERS = (
    pb_grpc.RolloutServicer,
    pb_grpc.WeightsServicer,
    pb_grpc.RewardServicer,
    pb_grpc.ReferenceServicer,
    pb_grpc.CriticServicer,
    pb_grpc.CoordinatorServicer,
    pb_grpc.VolunteerServicer,
    pb_grpc.HealthServicer,
)


@pytest.fixture()
def issued(tmp_path: Path) -> cr.IssuedCredentials:
    return cr.run_folder_credentials(tmp_path / "run", "sec-job").issued


@pytest.fixture()
def job(issued: cr.IssuedCredentials, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> cr.JobCredentials:
    """This test process is one of the job's rollout workers (no signing key; it may pull and forward
    weights); the credentials returned are the learner's, which drives every worker."""
    monkeypatch.setattr(trust, "_given", str(cr.write(tmp_path / "rollout", issued, "rollout")))
    return issued.for_role("learner")


def ed25519_key() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    raw = serialization.Encoding.Raw
    return Ed25519PrivateKey.generate().private_bytes(
        raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


# ------------------------------------------------------------------------------------ credentials


def test_run_folder_credentials_keep_every_secret_off_disk(tmp_path: Path) -> None:
    local = cr.run_folder_credentials(tmp_path, "j")
    assert stat.S_IMODE((tmp_path / "secrets").stat().st_mode) == 0o700
    assert stat.S_IMODE(local.folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in local.folder.iterdir())
    assert sorted(f.name for f in local.folder.iterdir()) == sorted(cr.PUBLIC_FILES)
    on_disk = b"".join(f.read_bytes() for f in (tmp_path / "secrets").rglob("*") if f.is_file())
    assert local.issued.signing_key not in on_disk  # handed to the learner through a pipe only
    assert not any(token in on_disk for token in local.issued.tokens.values())
    learner = cr.load(local.folder, local.handed("learner"))
    rollout = cr.load(local.folder, local.handed("rollout"))
    assert learner.signing_key == local.issued.signing_key and rollout.signing_key is None
    assert (learner.role, rollout.role) == ("learner", "rollout") and learner.token != rollout.token
    assert cr.load(local.folder).token == b""  # the files alone: no role, no rights
    dht = cr.load(local.folder, local.handed("dht"))  # the DHT bootstrap is handed nothing
    assert (dht.role, dht.token, dht.signing_key) == ("", b"", None)
    # a resumed run issues new credentials; an older layout's key files are removed
    (tmp_path / "secrets" / "learner").mkdir()
    (tmp_path / "secrets" / "learner" / cr.SIGNING_KEY_FILE).write_bytes(b"k" * 32)
    again = cr.run_folder_credentials(tmp_path, "j")
    assert again.issued.signing_key != local.issued.signing_key
    assert not (tmp_path / "secrets" / "learner").exists()


def test_a_pod_mounts_its_own_roles_token_alone(issued: cr.IssuedCredentials, tmp_path: Path) -> None:
    for role in ("learner", "rollout", "reward", "observer"):
        creds = cr.load(cr.write(tmp_path / role, issued, role))
        assert creds.role == role and creds.token == issued.tokens[role]
        assert (creds.signing_key is not None) == (role == "learner")
    dht = cr.load(cr.write(tmp_path / "dht", issued, "dht"))
    assert dht.role == "" and dht.token == b""


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        (cr.TOKEN_FILE, b"short", "too short to be a job token"),
        (cr.TOKEN_FILE, b"a" * 64, "none of the roles"),
        (cr.VERIFY_KEY_FILE, b"x" * 31, "32-byte Ed25519 public key"),
        (cr.SIGNING_KEY_FILE, b"x" * 5, "32-byte Ed25519 private key"),
        (cr.CALLERS_FILE, b"learner abc", "expected `<role> <sha256 hex>`"),
        (cr.CA_FILE, None, "cannot read the job's credentials"),
    ],
)
def test_bad_credentials_name_the_file(
    issued: cr.IssuedCredentials, tmp_path: Path, file: str, content: bytes | None, message: str
):
    folder = cr.write(tmp_path / "learner", issued, "learner")
    target = folder / file
    if content is None:
        target.unlink()
    else:
        target.write_bytes(content)
    with pytest.raises(cr.CredentialsError, match=message) as err:
        cr.load(folder)
    assert str(target if file != cr.SIGNING_KEY_FILE else folder / file) in str(err.value)


def test_certificate_covers_every_pod_dns_name_and_loopback() -> None:
    from cryptography import x509

    creds = cr.issue("my-job", "team-a")
    cert = x509.load_pem_x509_certificate(creds.cert)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    assert {"*.my-job-workers.team-a.svc", "*.my-job-workers.team-a.svc.cluster.local", "localhost"} <= dns
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    ca = x509.load_pem_x509_certificate(creds.ca)
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    assert cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=300)


# ------------------------------------------------------------------------------ every RPC refused


def every_method() -> list[tuple[str, object]]:
    out = []
    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            out.append((f"/{service.full_name}/{method.name}", method))
    return out


async def call(channel: grpc.aio.Channel, path: str, method) -> grpc.StatusCode:
    """Invoke any method with an empty request; the status code it ends with."""
    request = message_factory.GetMessageClass(method.input_type)()
    ser, de = type(request).SerializeToString, (lambda raw: raw)
    try:
        if method.client_streaming and method.server_streaming:
            stream = channel.stream_stream(path, ser, de)(iter([request]), timeout=5)
            [_ async for _ in stream]
        elif method.client_streaming:
            await channel.stream_unary(path, ser, de)(iter([request]), timeout=5)
        elif method.server_streaming:
            [_ async for _ in channel.unary_stream(path, ser, de)(request, timeout=5)]
        else:
            await channel.unary_unary(path, ser, de)(request, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


async def test_every_rpc_of_every_service_is_refused_without_the_job_token(job, caplog) -> None:
    server = await serve(0, *(cls() for cls in SERVICERS))  # base servicers: UNIMPLEMENTED once reached
    address = f"127.0.0.1:{server.port}"
    other_job = cr.issue("other-job").for_role("learner")
    channels = {
        "no token": secure.aio_channel(address, credentials=None),  # plaintext: no TLS, no token
        "TLS, no token": grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(job.ca)),
        "wrong token": secure.aio_channel(address, dataclasses.replace(job, token=b"f" * 64)),
        "another job's token": secure.aio_channel(address, dataclasses.replace(job, token=other_job.token)),
        "another job's CA": secure.aio_channel(address, other_job),
        "the job's token": secure.aio_channel(address, job),
    }
    methods = every_method()
    assert {path.split("/")[1] for path, _ in methods} == {f"dverl.v1.{c.__name__[:-8]}" for c in SERVICERS}
    try:
        for path, method in methods:
            name = path.rsplit("/", 1)[1]
            for what in ("TLS, no token", "wrong token", "another job's token"):
                code, details = await call(channels[what], path, method)
                assert code == grpc.StatusCode.UNAUTHENTICATED, (path, what, code, details)
                assert details.startswith(f"{name} from 127.0.0.1:") and "no valid job token" in details
            for what in ("no token", "another job's CA"):  # no TLS handshake with the job's server
                code, _ = await call(channels[what], path, method)
                assert code == grpc.StatusCode.UNAVAILABLE, (path, what, code)
            code, details = await call(channels["the job's token"], path, method)
            if may_call("learner", path):  # reached the (unimplemented) servicer
                assert code not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE), (
                    path,
                    details,
                )
            else:  # the Volunteer service: nobody's right over gRPC
                assert code == grpc.StatusCode.PERMISSION_DENIED, (path, code, details)
        assert "refused Push from 127.0.0.1:" in caplog.text  # the worker's log names call and caller
    finally:
        for channel in channels.values():
            await channel.close()
        await server.stop(None)


def call_blocking(channel: grpc.Channel, path: str, method) -> grpc.StatusCode:
    """`call`'s twin on a blocking channel."""
    request = message_factory.GetMessageClass(method.input_type)()
    ser, de = type(request).SerializeToString, (lambda raw: raw)
    try:
        if method.client_streaming and method.server_streaming:
            list(channel.stream_stream(path, ser, de)(iter([request]), timeout=5))
        elif method.client_streaming:
            channel.stream_unary(path, ser, de)(iter([request]), timeout=5)
        elif method.server_streaming:
            list(channel.unary_stream(path, ser, de)(request, timeout=5))
        else:
            channel.unary_unary(path, ser, de)(request, timeout=5)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_blocking_channels_carry_the_token_on_every_rpc_without_a_credentials_plugin(
    job, monkeypatch
) -> None:
    """The token rides in the caller's interceptor: a call-credentials plugin is Python code gRPC's own
    threads call into, and closing a channel that holds one can freeze the process on the GIL."""

    def no_plugin(*args, **kwargs):
        raise AssertionError("a call-credentials plugin was made")

    monkeypatch.setattr(grpc, "metadata_call_credentials", no_plugin)
    monkeypatch.setattr(grpc, "access_token_call_credentials", no_plugin)
    server = await serve(0, *(cls() for cls in SERVICERS))
    address = f"127.0.0.1:{server.port}"

    def every_code(credentials) -> dict[str, grpc.StatusCode]:
        with secure.sync_channel(address, credentials) as channel:
            return {path: call_blocking(channel, path, method) for path, method in every_method()}

    try:
        with_token = await asyncio.to_thread(every_code, job)
        codes = grpc.StatusCode
        rights = {
            p: codes.UNIMPLEMENTED if may_call("learner", p) else codes.PERMISSION_DENIED
            for p, _ in every_method()
        }
        assert with_token == rights
        forged = dataclasses.replace(job, token=b"f" * 64)
        refused = await asyncio.to_thread(every_code, forged)
        assert set(refused.values()) == {grpc.StatusCode.UNAUTHENTICATED}, refused
        aio = secure.aio_channel(address, job)
        try:
            for path, method in every_method():
                code, details = await call(aio, path, method)
                assert code == rights[path], (path, code, details)
        finally:
            await aio.close()
    finally:
        await server.stop(None)


async def test_a_refused_call_changes_nothing(job) -> None:
    learner = WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key)
    learner.publish(model_state(1), 1)
    held = learner.get(1)
    target = WeightPublisher(chunk_bytes=CHUNK)
    server = await serve(0, WeightsServicer(target))
    address = f"127.0.0.1:{server.port}"
    stranger = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(job.ca))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.WeightsStub(stranger).Push(iter(chunk_messages(held)), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert target.versions == []  # a genuine, learner-signed version: still not taken from a stranger
        ack = await push(address, held)  # the same bytes from a holder of the token
        assert ack.ok and target.versions == [1]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [m async for m in pb_grpc.WeightsStub(stranger).Fetch(pb.FetchRequest(version=1), timeout=5)]
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED  # nor are the weights read out
    finally:
        await stranger.close()
        await server.stop(None)


# ------------------------------------------------------------------------------------ signed weights


def chunk_messages(held: Published) -> list[pb.WeightChunk]:
    return [WeightsServicer.chunk_message(held, c, first=c.index == 0) for c in held.bundle.chunks]


async def push(address: str, held: Published) -> pb.PushAck:
    """A push by a caller holding the job token (a compromised pod, a relay gone bad)."""
    channel = secure.aio_channel(address)
    try:
        return await pb_grpc.WeightsStub(channel).Push(iter(chunk_messages(held)), timeout=10)
    finally:
        await channel.close()


def bad_versions(job: cr.JobCredentials) -> dict[str, Published]:
    """Version 2 of someone else's weights: unsigned, signed by another key, or carrying a signature the
    learner made for different weights."""
    evil = model_state(66)
    unsigned = WeightPublisher(chunk_bytes=CHUNK, signing_key=None)
    unsigned.publish(evil, 2)
    forged = WeightPublisher(chunk_bytes=CHUNK, signing_key=ed25519_key())
    forged.publish(evil, 2)
    genuine = WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key)
    genuine.publish(model_state(2), 2)
    borrowed = Published(
        dataclasses.replace(unsigned.get(2).manifest, signature=genuine.get(2).manifest.signature),
        unsigned.get(2).bundle,
    )
    return {"unsigned": unsigned.get(2), "forged": forged.get(2), "borrowed": borrowed}


REFUSALS = {
    "unsigned": "are not signed",
    "forged": "not signed by this job's learner",
    "borrowed": "not signed by this job's learner",
}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
async def test_a_rollout_worker_refuses_weights_the_learner_did_not_sign(job, kind: str) -> None:
    target = WeightPublisher(chunk_bytes=CHUNK)
    good = WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key)
    good.publish(model_state(1), 1)
    target.store(good.get(1))
    server = await serve(0, WeightsServicer(target))
    try:
        ack = await push(f"127.0.0.1:{server.port}", bad_versions(job)[kind])
        assert not ack.ok and REFUSALS[kind] in ack.reason and "signature" in ack.reason
        assert target.versions == [1]  # the version it had, untouched
    finally:
        await server.stop(None)


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_a_relay_refuses_unsigned_weights_and_passes_nothing_on(job, kind: str) -> None:
    relay, child = RelayThread(), RelayThread()
    try:
        bad = bad_versions(job)[kind]
        ack = relay.call(push(relay.address, bad))
        assert not ack.ok and REFUSALS[kind] in ack.reason
        assert relay.relay.publisher.versions == [] and child.relay.publisher.versions == []
        # nor does a relay catching up from a parent that serves such a version hold it
        parent = WeightPublisher(chunk_bytes=CHUNK)
        parent.store(bad)
        server = relay.call(serve(0, WeightsServicer(parent)))
        with pytest.raises(WireError, match="signature"):
            child.call(child.relay.catch_up(f"127.0.0.1:{server.port}", 2))
        assert child.relay.publisher.versions == []
        relay.call(server.stop(None))
    finally:
        relay.stop()
        child.stop()


@pytest.mark.parametrize("kind", sorted(REFUSALS))
async def test_a_puller_refuses_unsigned_weights_from_a_server_that_holds_them(job, kind: str) -> None:
    rogue = WeightPublisher(chunk_bytes=CHUNK)
    rogue.store(bad_versions(job)[kind])
    server = await serve(0, WeightsServicer(rogue))
    source = GrpcWeightSource(f"127.0.0.1:{server.port}", wait_s=1)
    try:
        with pytest.raises(WireError, match="signature"):
            await asyncio.to_thread(source.fetch_latest, 2)
        assert source.fetch_calls == []  # refused on the manifest: not a byte was fetched
    finally:
        source.close()
        await server.stop(None)


def test_a_volunteer_checks_the_key_its_coordinator_gave_it(job) -> None:
    """A volunteer holds no job credentials; its weight source checks the key from its JoinReply."""
    bad = bad_versions(job)
    good = WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key)
    good.publish(model_state(1), 1)
    BundleBuilder(good.get(1).manifest, job.verify_key)  # the learner's own version passes
    for kind, held in bad.items():
        with pytest.raises(WireError, match="signature") as err:
            BundleBuilder(held.manifest, job.verify_key)
        assert REFUSALS[kind] in str(err.value)
    BundleBuilder(bad["unsigned"].manifest, None)  # an unsecured job: no key, unsigned weights accepted


def test_the_coordinator_hands_admitted_volunteers_the_weight_key(job) -> None:
    from decentralized_verl.transport import messages as m
    from decentralized_verl.volunteers.discovery import HubConfig, VolunteerHub
    from decentralized_verl.volunteers.tokens import issue_token

    hub = VolunteerHub(HubConfig(job="sec-job", secret=b"s" * 32), dispatcher=None)
    reply = hub.admit(
        m.JoinRequest("sec-job", issue_token(b"s" * 32, "sec-job", 60), "rollout", "cpu", 0.0), "p1"
    )
    assert reply.accepted and reply.weights_verify_key == job.verify_key
    assert m.join_reply_from_proto(m.join_reply_to_proto(reply)).weights_verify_key == job.verify_key
    refused = hub.admit(m.JoinRequest("sec-job", "bad", "rollout", "cpu", 0.0), "p2")
    assert not refused.accepted and refused.weights_verify_key == b""


def test_the_learners_signed_push_reaches_every_relay_and_puller(job) -> None:
    source = RelayThread(WeightRelay(WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key)))
    receivers = [RelayThread() for _ in range(2)]
    try:
        source.relay.publish(model_state(), 1)
        manifest = source.relay.publisher.get(1).manifest
        signing.check(manifest, job.verify_key)
        results = source.call(source.relay.fan_out(1, plan_chain([r.address for r in receivers])))
        assert results == {r.address: OK for r in receivers}
        for r in receivers:
            assert r.relay.publisher.get(1).manifest == manifest  # the signature travelled with it
        puller = GrpcWeightSource(receivers[-1].address, wait_s=1)
        try:
            version, state = puller.fetch_latest(1)
        finally:
            puller.close()
        assert version == 1
        want = LocalWeightSource(source.relay.publisher, wait_s=0).fetch_latest(1)[1]
        assert all(torch.equal(state[k], want[k]) for k in want)
    finally:
        for node in (source, *receivers):
            node.stop()


def test_a_worker_takes_only_the_version_its_learner_publishes_now(job) -> None:
    """Signed pushes the learner does not publish now are refused before any chunk: a version it never
    made, one from an earlier epoch of the learner (same number, other bytes, same key), an old replay."""
    learner = RelayThread(WeightRelay(WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key)))
    worker = RelayThread(WeightRelay(WeightPublisher(chunk_bytes=CHUNK, keep=1), learner=learner.address))
    other = RelayThread(WeightRelay(WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key)))
    try:
        learner.relay.publish(model_state(), 5)
        route = plan_chain([worker.address])
        assert learner.call(learner.relay.fan_out(5, route)) == {worker.address: OK}
        earlier_epoch = {k: v + 1 for k, v in model_state().items()}
        other.relay.publish(earlier_epoch, 4)
        other.relay.publish(earlier_epoch, 6)  # the learner's v6 will be other weights
        outcome = other.call(other.relay.fan_out(6, route))[worker.address]
        assert "weights v6: the learner at" in outcome and "does not publish v6" in outcome, outcome
        learner.relay.publish(model_state(), 6)
        outcome = other.call(other.relay.fan_out(6, route))[worker.address]
        assert "weights v6: differs from the learner's own v6" in outcome, outcome
        assert worker.relay.publisher.versions == [5]
        outcome = other.call(other.relay.fan_out(4, route))[worker.address]
        assert "weights v4: not newer than v5 held here" in outcome, outcome
        assert learner.call(learner.relay.fan_out(6, route)) == {worker.address: OK}  # the real one
        assert worker.relay.publisher.get(6).manifest == learner.relay.publisher.get(6).manifest
    finally:
        for node in (learner, worker, other):
            node.stop()


def test_a_manifest_signature_covers_every_field_it_binds(job) -> None:
    held = WeightPublisher(chunk_bytes=CHUNK, signing_key=job.signing_key)
    held.publish(model_state(), 3)
    manifest = held.get(3).manifest
    signing.check(manifest, job.verify_key)
    for change in (
        {"version": 4},
        {"dtype": "float32"},
        {"is_adapter": True},
        {"total_bytes": manifest.total_bytes + 1},
        {"digest": "0" * 64},
    ):
        with pytest.raises(WireError, match="not signed by this job's learner"):
            signing.check(dataclasses.replace(manifest, **change), job.verify_key)


def test_security_cost_benchmark_smoke(tmp_path: Path) -> None:
    """The benchmark's short version: plaintext and secured runs of the same transfers, side by side."""
    import json
    import os
    import subprocess
    import sys

    root = ROOT
    out = tmp_path / "security.json"
    env = {k: v for k, v in os.environ.items() if k != "DVERL_TLS_DIR"}
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "security_cost.py"), "--smoke", "--parts", "primitives",
         "sync", "--out", str(out)],
        capture_output=True, text=True, timeout=240, env={**env, "OMP_NUM_THREADS": "1"}, cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert 0 < report["primitives"]["sign"]["secured"][0] < 0.01
    assert 0 < report["primitives"]["check"]["secured"][0] < 0.01
    for method in ("chain", "fetch"):
        walls = report["weight_sync"]["walls"][method]
        assert len(walls["plaintext"]) == len(walls["secured"]) == 1 and min(walls["secured"]) > 0
    assert "| weight sync 2 MB, grpc chain x1 (s) |" in done.stdout
    assert "secured / plaintext" in done.stdout
