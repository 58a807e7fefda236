"""Weight fan-out in the runtime, with real processes: three `dverl worker --role rollout` processes on
127.0.0.1 and the learner's side built by `connect_roles` in this process, as entrypoints/learner.py does.

After a publish every worker holds the same version with the same bytes (its relay's manifest digest
and tensors equal to the learner's state dict), generates with those weights without pulling, and the
learner sent exactly one copy. A worker killed in the middle of the chain is skipped (the next one is
still served) and, restarted on its port, catches up by pulling from the learner.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch
import yaml

from decentralized_verl.core.samples import Prompt
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.orchestration.wiring import connect_roles
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.serving.servicers import serve
from decentralized_verl.spec import with_defaults
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.training.trainer import rollout_state_dict
from decentralized_verl.transport.clients import GrpcRolloutClient, wait_ready
from decentralized_verl.transport.weights.bulk_plane import BulkPlane
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.push import OK
from decentralized_verl.transport.weights.receive import GrpcWeightSource
from decentralized_verl.transport.weights.route import Hop
from decentralized_verl.transport.weights.service import WeightsServicer
from tests.support.processes import free_port

torch.set_num_threads(1)

SPEC = {
    "model": {"tiny": {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "intermediateSize": 64, "seed": 7}},
    "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
    "data": {"train": "x.jsonl", "rewardType": "boxed"},
    "roles": {"rollout": {"replicas": 3, "batchSize": 4}, "learner": {"replicas": 1}},
    "training": {"batchSize": 4},
}
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, seed=1)


class CountingWeights(WeightsServicer):
    """The learner's Weights service, counting the pulls (Fetch streams) rollout workers make."""

    def __init__(self, publisher: WeightPublisher) -> None:
        super().__init__(publisher)
        self.fetches: list[int] = []

    async def Fetch(self, request, context):
        self.fetches.append(request.version)
        async for msg in super().Fetch(request, context):
            yield msg


class CountingPlane(BulkPlane):
    """The learner's bulk plane, counting the transfers it opens per worker: each carries one whole copy."""

    def __init__(self, relay) -> None:
        super().__init__(relay)
        self.offers: dict[str, int] = {}

    def offer(self, hop: Hop, manifest_bytes: bytes) -> tuple[int, bytes]:
        self.offers[hop.address] = self.offers.get(hop.address, 0) + 1
        return super().offer(hop, manifest_bytes)


class Worker:
    """One `dverl worker --role rollout` process."""

    def __init__(self, config: Path, index: int, port: int, learner: str) -> None:
        self.address = f"127.0.0.1:{port}"
        env = {**os.environ, "DVERL_LEARNER_ADDR": learner, "OMP_NUM_THREADS": "1"}
        args = ["--config", str(config), "--job", "demo", "--index", str(index), "--port", str(port)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "decentralized_verl.cli", "worker", "--role", "rollout", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out or ""


async def held_manifest(address: str) -> pb.WeightManifest:
    """What a worker's relay holds (GetManifest on the worker's own port)."""
    async with grpc.aio.insecure_channel(address) as channel:
        return await pb_grpc.WeightsStub(channel).GetManifest(pb.ManifestRequest(latest=True), timeout=10)


async def generate(address: str, tok, version: int):
    client = GrpcRolloutClient(address, "w")
    try:
        items = [(Prompt(f"p{i}", i, tuple(tok.encode(t)), t), 0) for i, t in enumerate(["ab", "1+2="])]
        return [(s.response_ids, s.policy_version) async for s in client.generate(items, GREEDY, version)]
    finally:
        await client.close()


def perturb(model, scale: float) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * scale)


@pytest.fixture()
def cluster(tmp_path):
    spec = parse_spec(SPEC)
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(with_defaults(spec)))
    workers: list[Worker] = []
    yield spec, config, workers
    for w in workers:
        w.stop()


async def test_publish_reaches_every_worker_through_the_chain_and_a_dead_worker_catches_up(cluster):
    spec, config, workers = cluster
    model, tok = load_model_and_tokenizer(spec.model)
    publisher = WeightPublisher(dtype=None)  # as entrypoints/learner.py: native dtype, bit-exact
    weights_service = CountingWeights(publisher)
    server = await serve(0, weights_service)
    learner = f"127.0.0.1:{server.port}"
    ports = [free_port() for _ in range(3)]
    workers.extend(Worker(config, i, port, learner) for i, port in enumerate(ports))
    addresses = [w.address for w in workers]
    try:
        for worker in workers:
            try:
                await wait_ready(worker.address, timeout=180)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{worker.stop()[-3000:]}") from None
        roles = await connect_roles(
            spec,
            "demo",
            model,
            tok,
            temperature=1.0,
            publisher=publisher,
            addresses=lambda role: addresses if role == "rollout" else [],
        )
        fanout = roles.weights
        assert fanout is not None and fanout.pushing and roles.remote_rollout
        assert fanout.route() == (Hop(addresses[0], (Hop(addresses[1], (Hop(addresses[2]),)),)),)
        assert fanout.last_results == {a: OK for a in addresses}  # version 0 went out at connect

        previous, fanout.relay.bulk = fanout.relay.bulk, CountingPlane(fanout.relay)
        previous.close()  # the learner's relay serves nothing: only its sending side is replaced
        sent = fanout.relay.bulk.offers

        # ---- version 1: one copy from the learner, the chain delivers it everywhere
        perturb(model, 0.5)
        want = {k: t.detach().clone() for k, t in rollout_state_dict(model).items()}
        await asyncio.to_thread(roles.publish, 1)
        assert fanout.last_results == {a: OK for a in addresses}
        # the learner fed only the chain's head, once
        assert sent == {addresses[0]: 1}
        learner_manifest = publisher.get(1).manifest
        for address in addresses:
            held = await held_manifest(address)
            assert held.version == 1 and held.digest == learner_manifest.digest
        pull = GrpcWeightSource(addresses[2], wait_s=1)  # the chain's tail holds the learner's exact bytes
        try:
            version, got = await asyncio.to_thread(pull.fetch_latest, 1)
        finally:
            pull.close()
        assert version == 1 and got.keys() == want.keys()
        assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)

        outputs = [await generate(a, tok, 1) for a in addresses]
        assert all(v == 1 for out in outputs for _, v in out)
        assert outputs[0] == outputs[1] == outputs[2]  # same weights, greedy: same tokens
        assert weights_service.fetches == []  # nobody pulled: the push served them all

        # ---- version 2 with the middle worker dead: skipped, its successor still served
        workers[1].stop(signal.SIGKILL)
        sent.clear()
        perturb(model, 0.5)
        await asyncio.to_thread(roles.publish, 2)
        results = fanout.last_results
        assert results[addresses[0]] == OK and results[addresses[2]] == OK
        assert results[addresses[1]].startswith("failed")
        # still one copy from the learner: worker 0 adopted worker 2 when worker 1 did not answer
        assert sent == {addresses[0]: 1}
        sha2 = publisher.get(2).manifest.digest
        assert (await held_manifest(addresses[2])).digest == sha2
        v2_outputs = await generate(addresses[0], tok, 2)
        assert v2_outputs != outputs[0] and all(v == 2 for _, v in v2_outputs)
        assert weights_service.fetches == []

        # ---- the dead worker comes back (version 0, nothing held) and catches up by pulling
        workers[1] = Worker(config, 1, ports[1], learner)
        await wait_ready(addresses[1], timeout=180)
        revived = await generate(addresses[1], tok, 2)
        assert revived == v2_outputs
        assert weights_service.fetches == [2]  # one pull, from the learner
        assert (await held_manifest(addresses[1])).digest == sha2
        await fanout.close()
        for client in roles.rollout:
            await client.close()
    finally:
        await server.stop(None)
    workers[1].stop()  # its pull is proven above: the learner served exactly one Fetch, of version 2
