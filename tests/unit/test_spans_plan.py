"""`roles.rollout.spans` in a job: the plan's span workers (each rollout worker its own chain, each span
its replicas), the rollout worker's DVERL_SPAN_ADDRS, the operator's span pods, and the spec's refusals."""

from __future__ import annotations

import pytest

from decentralized_verl.errors import ManifestError
from decentralized_verl.planning.plan import plan_job, worker_env
from decentralized_verl.spans.backend import parse_span_addresses
from decentralized_verl.spec.manifest import parse_spec


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
    from dverl_operator.objects.owned import Owner
    from dverl_operator.reconcile.desired import for_job

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


def _seventy_b_job(tmp_path, **rollout):
    import json

    folder = tmp_path / "llama-70b"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(
            {
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
        )
    )
    gpu = {"gpus": 1, "gpuMemory": "24Gi"}
    return parse_spec(
        {
            "model": {"path": str(folder), "dtype": "bfloat16"},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 4},
            "data": {"train": "/data/train.jsonl", "maxPromptTokens": 256, "maxNewTokens": 256},
            "roles": {
                "rollout": {"replicas": 1, "batchSize": 4, "resources": gpu, **rollout},
                "learner": {"replicas": 1, "resources": {"gpus": 1, "gpuMemory": "1000Gi"}},
            },
            "training": {"batchSize": 4},
        }
    )


def test_a_70b_rollout_that_fits_no_worker_is_planned_as_spans(tmp_path):
    from decentralized_verl.planning import plan_for

    plan = plan_for(_seventy_b_job(tmp_path), tmp_path)
    count = plan.chosen_spans
    assert count is not None and 5 <= count <= 10  # ~131 GiB of bf16 weights over 24 GiB GPUs
    assert plan.spec.roles.rollout.spans.count == count and not plan.problems()
    rollout = next(w for w in plan.workers if w.role == "rollout")
    assert rollout.verdict == "fits", rollout.reason
    names = {c.name: c for c in rollout.estimate.components}
    assert "of 80 layers" in names["span weights"].detail
    (note,) = [n for n in plan.notes if n.startswith("rollout: the model needs ~")]
    need = float(note.split("~")[1].split()[0])
    assert need > 100 and "a worker has 24.0 GiB" in note and f"served as {count} spans" in note

    # The count is the fewest that fits: one span fewer, set by hand, does not.
    fewer = plan_for(_seventy_b_job(tmp_path, spans={"count": count - 1}), tmp_path)
    assert next(w for w in fewer.workers if w.role == "rollout").verdict == "does not fit"
    assert fewer.chosen_spans is None and fewer.spec.roles.rollout.spans.count == count - 1


def test_an_explicit_span_count_wins_and_a_fitting_model_is_unchanged(tmp_path):
    from decentralized_verl.planning import plan_for

    explicit = plan_for(_seventy_b_job(tmp_path, spans={"count": 12, "replicas": 2}), tmp_path)
    assert explicit.chosen_spans is None and not explicit.problems()
    assert explicit.spec.roles.rollout.spans.count == 12 and explicit.spec.roles.rollout.spans.replicas == 2
    assert not any("served as" in n for n in explicit.notes)

    gpu = {"gpus": 1, "gpuMemory": "24Gi"}
    small = _spec(resources=gpu)
    small["roles"]["learner"] = {"resources": gpu}
    fitting = plan_for(parse_spec(small), None)
    rollout = next(w for w in fitting.workers if w.role == "rollout")
    assert rollout.verdict == "fits" and fitting.chosen_spans is None
    assert fitting.spec.roles.rollout.spans is None and not plan_job(fitting.spec, "j").by_role("span")


def test_a_model_that_fits_even_as_spans_on_no_worker_is_refused_with_the_numbers(tmp_path):
    from decentralized_verl.planning import plan_for

    spec = _seventy_b_job(tmp_path)
    tiny_gpus = {"gpus": 1, "gpuMemory": "1Gi"}
    raw = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["roles"]["rollout"]["resources"] = tiny_gpus
    plan = plan_for(parse_spec(raw), tmp_path)
    assert plan.chosen_spans is None and plan.spec.roles.rollout.spans is None
    (problem,) = [p for p in plan.problems() if "rollout" in p.path]
    assert "rollout needs ~" in problem.message and "but each worker has 1.0 GiB" in problem.message
    assert "even as spans of one layer each its heaviest process needs ~" in problem.message
    assert "roles.rollout.spans.count" not in problem.message


def _write_manifest(tmp_path, spec):
    import yaml

    path = tmp_path / "job.yaml"
    document = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "big"},
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_dverl_plan_shows_the_chosen_spans_and_run_starts_them(tmp_path, capsys):
    import json

    from decentralized_verl.launch.run import write_config
    from decentralized_verl.planning.fitting_job import load_fitting_job
    from decentralized_verl.planning.run_plan import main_plan
    from decentralized_verl.spec.manifest import load_job, summary

    path = _write_manifest(tmp_path, _seventy_b_job(tmp_path))
    assert main_plan(str(path), as_json=True) == 0
    shown = json.loads(capsys.readouterr().out)
    count = shown["spans"]["count"]
    assert shown["fits"] and shown["spans"]["chosenByPlanner"] and 5 <= count <= 10
    assert f"served as {count} spans" in shown["spans"]["reason"]
    assert main_plan(str(path)) == 0
    assert f"served as {count} spans" in capsys.readouterr().out
    assert main_plan(str(path), as_json=True, workers=True) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sum(r["role"] == "span" for r in rows) == count

    # `dverl run`'s job and the config its workers read carry the same count.
    job = load_fitting_job(path)
    assert job.spec.roles.rollout.spans.count == count
    assert summary(job).endswith(f"(rollout as {count} layer spans)")
    config = write_config(job, path, tmp_path / "run", fetcher=None)
    assert load_job(config).spec.roles.rollout.spans.count == count
    assert len(plan_job(job.spec, "big").by_role("span")) == count


def test_the_operator_makes_the_span_pods_of_a_job_it_places_as_spans():
    import yaml

    from dverl_operator.reconcile.decide import decide
    from dverl_operator.reconcile.observed import Observed
    from dverl_operator.reconcile.settings import Settings

    gpu = {"gpus": 1, "gpuMemory": "24Gi"}
    spec = {
        "sources": [
            {"name": "models", "mountPath": "/models", "pvc": {"claimName": "models"}},
            {"name": "data", "mountPath": "/data", "pvc": {"claimName": "data"}},
        ],
        "model": {"path": "/models/Qwen2.5-14B-Instruct", "dtype": "bfloat16"},  # known by name: ~28 GiB
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "/data/train.jsonl", "maxPromptTokens": 128, "maxNewTokens": 128},
        "roles": {
            "rollout": {"replicas": 1, "batchSize": 2, "resources": gpu},
            "learner": {"replicas": 1, "resources": {"gpus": 1, "gpuMemory": "1000Gi"}},
        },
        "training": {"batchSize": 2},
    }
    observed = Observed(
        job={"metadata": {"name": "q14", "namespace": "ns", "uid": "u"}, "spec": spec, "status": {}},
        pods={},
        config_map=None,
        service=None,
        progress=None,
        now=1.0,
    )
    actions = decide(observed, Settings())
    assert actions.status.get("phase") != "Failed", actions.status
    created = {body["metadata"]["name"]: body for body in actions.create}
    spans = sorted(n for n in created if n.startswith("q14-span-"))
    assert len(spans) >= 2
    config = parse_spec(yaml.safe_load(created["q14-config"]["data"]["job.yaml"]))
    assert config.roles.rollout.spans.count == len(spans)
    front = created["q14-rollout-0"]["spec"]["containers"][0]["env"]
    addresses = next(e["value"] for e in front if e["name"] == "DVERL_SPAN_ADDRS")
    assert len(parse_span_addresses(addresses)) == len(spans)
