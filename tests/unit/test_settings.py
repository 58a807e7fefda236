"""The worker environment is declared once (settings.py), typed, documented in docs/environment.md, and is
the only place a worker reads a DVERL_* variable from."""

from __future__ import annotations

import ast
import re

import pytest

from decentralized_verl.planning.plan import plan_job, worker_env
from decentralized_verl.settings import SettingsError, WorkerSettings, env_name, settings_table
from decentralized_verl.spec.manifest import parse_spec
from tests.support.paths import ROOT

PACKAGE = ROOT / "worker_image" / "decentralized_verl"


def test_docs_document_every_variable() -> None:
    page = ROOT / "docs" / "environment.md"
    assert settings_table() in page.read_text(), "docs/environment.md's worker environment table drifted"


def test_no_module_but_settings_reads_a_dverl_variable() -> None:
    reads = re.compile(
        r"""(environ(\.get)?\(|environ\[|getenv\()\s*f?["'](DVERL_|RANK|WORLD_SIZE|LOCAL_RANK)"""
    )
    offenders = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if path.name != "settings.py" and reads.search(path.read_text())
    ]
    assert offenders == []


ENTRY_PACKAGES = ("entrypoints", "cli", "launch")
"""Where a process starts: `dverl` and its commands, the workers, and the launchers that start them."""
ENTRY_FUNCTIONS = {
    ("spans/server.py", "main"),
    ("spans/volunteer.py", "main"),
}
"""Entries outside those packages: a span server or span volunteer started with `python -m`."""


def from_env_calls(tree: ast.AST) -> list[tuple[str, int]]:
    """(enclosing function, line) of every `WorkerSettings.from_env(...)` call in a module."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            call = child.func if isinstance(child, ast.Call) else None
            if (
                isinstance(call, ast.Attribute)
                and call.attr == "from_env"
                and isinstance(call.value, ast.Name)
                and call.value.id == "WorkerSettings"
            ):
                found.append((function, child.lineno))
            visit(child, inner if function == "" else function)

    visit(tree, "")
    return found


def test_settings_are_read_only_at_a_process_entry() -> None:
    """Deeper modules get the settings passed down; reading them again there would hide what a process
    was started with and let two readings of one process disagree."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        module = path.relative_to(PACKAGE).as_posix()
        if module.split("/")[0] in ENTRY_PACKAGES:
            continue
        for function, line in from_env_calls(ast.parse(path.read_text())):
            if (module, function) not in ENTRY_FUNCTIONS:
                offenders.append(f"{module}:{line} (in {function or 'the module'})")
    assert offenders == [], "WorkerSettings.from_env() outside a process entry: pass the settings down"


def test_the_entry_scan_finds_calls() -> None:
    """The scan above can fail: it sees a call at module level and inside a nested function."""
    code = (
        "x = WorkerSettings.from_env()\ndef f():\n    def g():\n        return WorkerSettings.from_env({})\n"
    )
    assert from_env_calls(ast.parse(code)) == [("", 1), ("f", 4)]
    assert from_env_calls(ast.parse("WorkerSettings.from_json()\nOther.from_env()\n")) == []


def test_typed_values_and_errors_that_name_the_variable() -> None:
    settings = WorkerSettings.from_env(
        {
            "DVERL_ROLLOUT_ADDRS": "a:1,b:2",
            "DVERL_ROLLOUT_POOLS": "a100,",
            "DVERL_VLLM_EAGER": "yes",
            "DVERL_WAIT_VOLUNTEERS": "3:45",
            "DVERL_WORKERS_POLL_S": "0.5",
            "HOME": "/root",
        }
    )
    assert settings.addresses("rollout") == ["a:1", "b:2"] and settings.pools("rollout") == ["a100"]
    assert settings.addresses("critic") == []
    assert settings.vllm_eager is True and settings.volunteer_wait() == (3, 45.0)
    assert settings.workers_poll_s == 0.5
    assert (
        WorkerSettings.from_env({}).vllm_eager is False
        and WorkerSettings.from_env({}).volunteer_wait() is None
    )
    with pytest.raises(SettingsError, match="DVERL_WORKERS_POLL_S"):
        WorkerSettings.from_env({"DVERL_WORKERS_POLL_S": "-1"})
    with pytest.raises(SettingsError, match="DVERL_WAIT_VOLUNTEERS"):
        WorkerSettings.from_env({"DVERL_WAIT_VOLUNTEERS": "many"})


def test_what_the_plan_sets_is_what_the_workers_read() -> None:
    spec = parse_spec(
        {
            "model": {"tiny": {}},
            "algorithm": {"name": "ppo", "samplesPerPrompt": 2},
            "data": {"train": "t.jsonl"},
            "roles": {"rollout": {"replicas": 2}, "critic": {"replicas": 1}, "reward": {"replicas": 1}},
            "training": {"steps": 2, "batchSize": 2},
        }
    )
    plan = plan_job(spec, "j")
    addresses = {w.name: f"{w.name}:50051" for w in plan.workers}
    declared = {field.alias for field in WorkerSettings.model_fields.values()}
    for worker in plan.workers:
        env = worker_env(plan, worker, addresses)
        dverl = {k for k in env if k.startswith("DVERL_")}
        assert dverl <= declared, dverl - declared
        settings = WorkerSettings.from_env(env)
        assert settings.worker_name == worker.name and settings.role == worker.role
        if worker.role == "learner":
            assert settings.addresses("rollout") == ["j-rollout-0:50051", "j-rollout-1:50051"]
            assert settings.addresses("critic") == ["j-critic-0:50051"]
        else:
            assert settings.learner_addr == "j-learner-0:50051"
    assert env_name("learner_addr") == "DVERL_LEARNER_ADDR"


def test_a_sharded_critic_is_one_gang_reached_through_its_rank_0() -> None:
    spec = parse_spec(
        {
            "model": {"tiny": {}},
            "algorithm": {"name": "ppo", "samplesPerPrompt": 2},
            "data": {"train": "t.jsonl"},
            "roles": {"rollout": {"replicas": 1}, "critic": {"replicas": 2, "sharding": "fsdp"}},
            "training": {"steps": 2, "batchSize": 2},
        }
    )
    assert spec.roles.failure_policy("critic") == "restartRole"
    plan = plan_job(spec, "j")
    addresses = {w.name: f"{w.name}:50051" for w in plan.workers}
    addresses["j-critic-0/dist"] = "j-critic-0:29600"
    learner = WorkerSettings.from_env(worker_env(plan, plan.by_role("learner")[0], addresses))
    assert learner.addresses("critic") == ["j-critic-0:50051"]  # rank 1 serves no calls
    for worker in plan.by_role("critic"):
        env = worker_env(plan, worker, addresses)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("j-critic-0", "29600")
        assert (env["WORLD_SIZE"], env["RANK"]) == ("2", str(worker.index))
        rank = WorkerSettings.from_env(env)
        assert (rank.world_size, rank.rank, rank.local_rank) == (2, worker.index, 0)
    learner_env = worker_env(plan, plan.by_role("learner")[0], addresses)
    assert (learner_env["MASTER_ADDR"], learner_env["WORLD_SIZE"]) == ("j-learner-0", "1")
    unsharded = spec.model_copy(deep=True)
    unsharded.roles.critic.sharding = "ddp"
    assert unsharded.roles.failure_policy("critic") == "restartPod"
    plain = plan_job(unsharded, "j")
    assert all("MASTER_ADDR" not in worker_env(plain, w, addresses) for w in plain.by_role("critic"))
