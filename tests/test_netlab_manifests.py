"""The one builder of the network tests' and benchmarks' volunteer job: what it writes is a job the
manifest loader accepts, and an override changes the field it names and nothing else."""

from __future__ import annotations

from pathlib import Path

from job_manifests import TOY

from decentralized_verl.manifest import load_job
from decentralized_verl.netlab.manifests import BF16_TINY, volunteer_job, with_overrides


def test_with_overrides_sets_dotted_paths_and_leaves_the_base_alone() -> None:
    base = {"training": {"steps": 3, "batchSize": 4}, "roles": {"learner": {"replicas": 1}}}
    out = with_overrides(base, {"training.steps": 7, "roles": {"rollout": {"replicas": 2}}, "a.b.c": 1})
    assert out == {
        "training": {"steps": 7, "batchSize": 4},
        "roles": {"rollout": {"replicas": 2}},
        "a": {"b": {"c": 1}},
    }
    assert base == {"training": {"steps": 3, "batchSize": 4}, "roles": {"learner": {"replicas": 1}}}


def test_the_volunteer_job_loads_with_its_overrides(tmp_path: Path) -> None:
    path = volunteer_job(
        tmp_path,
        "netjob",
        TOY / "train.jsonl",
        model=BF16_TINY,
        **{"training.steps": 5, "data.maxNewTokens": 8},
    )
    assert path == tmp_path / "netjob.yaml"
    job = load_job(path)
    assert job.metadata.name == "netjob"
    spec = job.spec
    assert spec.training.steps == 5 and spec.training.batch_size == 4
    assert spec.data.max_new_tokens == 8 and spec.data.train == str(TOY / "train.jsonl")
    assert spec.model.dtype == "bfloat16" and spec.model.tiny.hidden_size == 128
    assert spec.volunteers.enabled and spec.volunteers.token_secret_ref.name == "netjob-join"
    assert spec.roles.rollout.replicas == 0
