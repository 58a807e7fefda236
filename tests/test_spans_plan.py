"""`roles.rollout.spans` in a job: the plan's span workers (each rollout worker its own chain, each span
its replicas), the rollout worker's DVERL_SPAN_ADDRS, the operator's span pods, and the spec's refusals."""

from __future__ import annotations

import pytest

from decentralized_verl.errors import ManifestError
from decentralized_verl.manifest import parse_spec
from decentralized_verl.plan import plan_job, worker_env
from decentralized_verl.serving.spans.backend import parse_span_addresses


def _spec(**rollout):
    return {
        "model": {"tiny": {"numLayers": 4}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "/data/train.jsonl"},
        "roles": {"rollout": {"replicas": 2, "batchSize": 4, **rollout}},
        "training": {"batchSize": 8},
    }


def test_each_rollout_worker_gets_its_own_chain_of_span_workers():
    spec = parse_spec(_spec(spans={"count": 2, "replicas": 2}))
    plan = plan_job(spec, "j")
    spans = plan.by_role("span")
    assert [w.span for w in spans] == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0), (1, 1), (1, 1)]
    assert [w.name for w in spans[:2]] == ["j-span-0", "j-span-1"]
    assert spans[0].command("/c.yaml", 7)[:4] == ["dverl", "worker", "--role", "span"]
    addresses = {w.name: f"{w.name}:50051" for w in plan.workers}
    env = worker_env(plan, plan.by_role("rollout")[1], addresses)
    chain = parse_span_addresses(env["DVERL_SPAN_ADDRS"])
    assert chain == [["j-span-4:50051", "j-span-5:50051"], ["j-span-6:50051", "j-span-7:50051"]]
    assert "DVERL_SPAN_ADDRS" not in worker_env(plan, plan.by_role("learner")[0], addresses)
    assert spec.roles.failure_policy("span") == spec.roles.failure_policy("rollout") == "restartPod"
    assert not plan_job(parse_spec(_spec()), "j").by_role("span")


def test_the_operator_makes_span_pods_and_wires_the_front_to_them():
    from dverl_operator.children import Owner, for_job

    spec = parse_spec(_spec(spans={"count": 2}))
    children = for_job(Owner("j", "ns", "uid-1"), spec, plan_job(spec, "j"), "img")
    assert {"j-span-0", "j-span-1", "j-span-2", "j-span-3"} <= set(children.pods)
    command = children.pods["j-span-2"]["spec"]["containers"][0]["command"]
    assert command[command.index("--role") + 1] == "span" and command[command.index("--index") + 1] == "2"
    env = {e["name"]: e.get("value") for e in children.pods["j-rollout-0"]["spec"]["containers"][0]["env"]}
    assert len(parse_span_addresses(env["DVERL_SPAN_ADDRS"])) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"roles.rollout.backend": "vllm"}, "roles.rollout.spans: needs the hf backend"),
        ({"roles.rollout.replicas": 0}, "roles.rollout.spans: needs roles.rollout.replicas >= 1"),
        ({"roles.rollout.spans": {"count": 5}}, "roles.rollout.spans.count: 5 spans for a model of 4 layers"),
        ({"roles.rollout.spans": {"count": 0}}, "roles.rollout.spans.count"),
        ({"roles.rollout.spans": {"count": 2, "extra": 1}}, "extra"),
        (
            {"roles.reward": {"replicas": 1, "spans": {"count": 2}}},
            "roles.reward.spans: only the rollout role",
        ),
        ({"model.lora": {}}, "roles.rollout.spans: cannot serve a model.lora job"),
    ],
)
def test_misused_spans_are_refused_by_name(change, message):
    raw = _spec(spans={"count": 2})
    for path, value in change.items():
        node = raw
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    with pytest.raises(ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(raw)


@pytest.mark.parametrize("text", ["", ";", "a:1;;b:2", " , "])
def test_bad_span_addresses_name_the_variable(text):
    with pytest.raises(ValueError, match="DVERL_SPAN_ADDRS"):
        parse_span_addresses(text)
