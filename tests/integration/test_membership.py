"""Rollout workers added or removed by scaling reach a running learner through the mounted workers file.

The file is the one the operator writes (children.config_map); the watcher drives a real Dispatcher whose
clients talk gRPC to real rollout servers on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.core.samples import Prompt
from decentralized_verl.core.sampling import SamplingParams
from decentralized_verl.orchestration.dispatch import Dispatcher
from decentralized_verl.orchestration.membership import (
    Member,
    WorkersFileError,
    WorkersFileWatcher,
    connect_when_ready,
    rollout_members,
    workers_file_path,
)
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.serving.servicers import HealthServicer, RolloutServicer, serve
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spec import TinyModelSpec
from decentralized_verl.spec.catalogue.backends import HF
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.transport.clients import GrpcRolloutClient
from dverl_operator.children.config_map import WORKERS_KEY, config_map
from dverl_operator.objects import owned
from tests.support.operator_fixtures import free_port, tiny_spec

torch.set_num_threads(1)
TINY = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=96)


def entry(role: str = "rollout", address: str = "h:1", **extra) -> dict:
    return {"role": role, "index": 0, "address": address, **extra}


# --- the file format: what the operator writes is what the learner reads ---------------------------------


def test_operator_workers_file_lists_every_rollout_pod_with_its_address_and_gpu_prior():
    spec = parse_spec(
        tiny_spec(
            roles={
                "rollout": {
                    "replicas": 3,
                    "nodePools": [
                        {"name": "big", "replicas": 1, "gpuType": "a100"},
                        {"name": "small", "replicas": 2, "gpuType": "rtx4090"},
                    ],
                },
                "learner": {"replicas": 1},
            },
        )
    )
    owner = owned.Owner("job", "ns", "u-1")
    cm = config_map(owner, spec, plan_job(spec, "job"))
    members = rollout_members(cm["data"][WORKERS_KEY])
    assert sorted(members) == ["job-rollout-0", "job-rollout-1", "job-rollout-2"]
    assert (
        members["job-rollout-0"].address
        == "job-rollout-0.job-workers.ns.svc:" + members["job-rollout-0"].address.rsplit(":", 1)[1]
    )
    assert members["job-rollout-0"].prior == 3.0  # a100
    assert members["job-rollout-2"].prior == 2.0  # rtx4090
    assert "job-learner-0" not in members


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a: [1, 2", "not YAML"),
        ("- a\n- b\n", "mapping of worker name"),
        ("w0: just-a-string\n", "w0: expected a mapping"),
        ("w0: {index: 0, address: 'h:1'}\n", "w0.role"),
        ("w0: {role: 7, address: 'h:1'}\n", "w0.role"),
        ("w0: {role: rollout}\n", "w0.address"),
        ("w0: {role: rollout, address: nohostport}\n", "w0.address"),
        ("w0: {role: rollout, address: 'h:1', pool: [a]}\n", "w0.pool"),
        ("w0: {role: rollout, address: 'h:1', gpuType: 3}\n", "w0.gpuType"),
    ],
)
def test_bad_workers_files_name_the_entry_and_field(text, fragment):
    with pytest.raises(WorkersFileError, match=fragment.replace("[", r"\[")):
        rollout_members(text, "workers.yaml")


def test_empty_file_means_no_rollout_workers_and_other_roles_are_ignored():
    assert rollout_members("") == {}
    text = yaml.safe_dump({"j-critic-0": entry("critic"), "j-rollout-0": entry(address="x:2")})
    assert list(rollout_members(text)) == ["j-rollout-0"]


def test_workers_file_path_prefers_the_explicit_variable_then_the_file_beside_the_config(tmp_path):
    def path_for(environ):
        return workers_file_path(WorkerSettings.from_env(environ))

    (tmp_path / "job.yaml").write_text("x")
    assert path_for({"DVERL_CONFIG": str(tmp_path / "job.yaml")}) is None  # no file: no watcher
    (tmp_path / "workers.yaml").write_text("")
    assert path_for({"DVERL_CONFIG": str(tmp_path / "job.yaml")}) == tmp_path / "workers.yaml"
    assert path_for({"DVERL_WORKERS_FILE": "/x/w.yaml", "DVERL_CONFIG": "/y"}) == Path("/x/w.yaml")


# --- the watcher against real rollout servers ---------------------------------------------------------


async def start_rollout(model, tokenizer, worker_id, port=0):
    worker = RolloutWorker(make_backend(HF, model, tokenizer, max_batch_size=4), worker_id)
    server = await serve(port, RolloutServicer(worker), HealthServicer("rollout", worker_id, ready=True))
    return server, f"127.0.0.1:{server.port}"


def write_workers(path: Path, workers: dict[str, str]) -> None:
    path.write_text(yaml.safe_dump({wid: entry(address=addr) for wid, addr in workers.items()}))


def items_for(tokenizer, n_prompts=4, per_prompt=2):
    prompts = [
        Prompt(f"p{i}", i, tuple(tokenizer.encode(f"{i}+1=")), "", ground_truth="") for i in range(n_prompts)
    ]
    return [(p, k) for p in prompts for k in range(per_prompt)]


async def test_scaled_up_worker_joins_and_scaled_down_worker_leaves_between_dispatches(policy, tmp_path):
    model, tok = policy
    s0, a0 = await start_rollout(model, tok, "j-rollout-0")
    s1, a1 = await start_rollout(model, tok, "j-rollout-1")
    path = tmp_path / "workers.yaml"
    write_workers(path, {"j-rollout-0": a0})
    first = GrpcRolloutClient(a0, "j-rollout-0")
    dispatcher = Dispatcher([first])
    watcher = WorkersFileWatcher(
        path, dispatcher, connect_when_ready, known={"j-rollout-0": Member("j-rollout-0", a0)}
    )
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, seed=3)
    try:
        assert (await watcher.refresh()).added == ()  # nothing changed yet
        write_workers(path, {"j-rollout-0": a0, "j-rollout-1": a1})  # the operator scaled to 2
        change = await watcher.refresh()
        assert change.added == ("j-rollout-1",) and change.removed == ()
        items = items_for(tok)
        samples, report = await dispatcher.run(items, sampling, 0)
        assert sorted(s.key for s in samples) == sorted((p.prompt_id, k) for p, k in items)
        assert {s.worker_id for s in samples} == {"j-rollout-0", "j-rollout-1"}
        assert sum(report.assigned.values()) == len(items)

        write_workers(path, {"j-rollout-1": a1})  # scaled back to 1: pod 0 went away
        change = await watcher.refresh()
        assert change.removed == ("j-rollout-0",)
        assert set(dispatcher.clients) == {"j-rollout-1"}
        samples, _ = await dispatcher.run(items, sampling, 0)
        assert len(samples) == len(items) and {s.worker_id for s in samples} == {"j-rollout-1"}
    finally:
        await watcher.close()
        for client in dispatcher.clients.values():
            await client.close()
        await s0.stop(None)
        await s1.stop(None)


async def test_listed_worker_that_is_not_up_yet_waits_then_joins(policy, tmp_path):
    model, tok = policy
    s0, a0 = await start_rollout(model, tok, "j-rollout-0")
    port = free_port()
    path = tmp_path / "workers.yaml"
    write_workers(path, {"j-rollout-0": a0, "j-rollout-1": f"127.0.0.1:{port}"})
    dispatcher = Dispatcher([GrpcRolloutClient(a0, "j-rollout-0")])

    async def quick(member):
        return await connect_when_ready(member, timeout_s=0.5)

    watcher = WorkersFileWatcher(path, dispatcher, quick, known={"j-rollout-0": Member("j-rollout-0", a0)})
    s1 = None
    try:
        change = await watcher.refresh()
        assert change.waiting == ("j-rollout-1",) and change.added == ()
        assert set(dispatcher.clients) == {"j-rollout-0"}  # never dispatch to a pod that is not serving
        s1, _ = await start_rollout(model, tok, "j-rollout-1", port=port)
        change = await watcher.refresh()
        assert change.added == ("j-rollout-1",)
        samples, _ = await dispatcher.run(items_for(tok, 4, 2), SamplingParams(max_new_tokens=3, seed=1), 0)
        assert {s.worker_id for s in samples} == {"j-rollout-0", "j-rollout-1"}
    finally:
        for client in dispatcher.clients.values():
            await client.close()
        await s0.stop(None)
        if s1 is not None:
            await s1.stop(None)


@pytest.mark.parametrize("bad", ["w: [unclosed", "- not\n- a mapping\n", "j-rollout-0: {role: rollout}\n"])
async def test_bad_or_missing_file_never_takes_workers_away(tmp_path, bad):
    added: list[str] = []

    class Stub:
        def __init__(self, wid):
            self.worker_id = wid

        async def close(self):
            pass

    async def connect(member):
        added.append(member.worker_id)
        return Stub(member.worker_id)

    dispatcher = Dispatcher([Stub("j-rollout-0")])
    path = tmp_path / "workers.yaml"
    known = {"j-rollout-0": Member("j-rollout-0", "h:1")}
    watcher = WorkersFileWatcher(path, dispatcher, connect, known=known)
    assert (await watcher.refresh()).removed == ()  # missing file
    path.write_text(bad)
    assert (await watcher.refresh()).removed == ()
    assert set(dispatcher.clients) == {"j-rollout-0"} and added == []
    two = {"j-rollout-0": entry(address="h:1"), "j-rollout-1": entry(address="h:2")}
    path.write_text(yaml.safe_dump(two))
    assert (await watcher.refresh()).added == ("j-rollout-1",)  # a good file afterwards applies
    path.write_text(yaml.safe_dump({"j-rollout-1": entry(address="h:3")}))  # moved + removed
    change = await watcher.refresh()
    assert change.removed == ("j-rollout-0",) and change.added == ("j-rollout-1",)
    assert watcher.known["j-rollout-1"].address == "h:3"
