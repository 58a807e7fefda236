"""The builders of the jobs tests and benchmarks run: what they write is a job the manifest loader accepts,
an override changes the field it names and nothing else, and an example keeps its data wherever it is
written."""

from __future__ import annotations

from pathlib import Path

from netlab.manifests import (
    BF16_TINY,
    example_spec,
    volunteer_job,
    with_overrides,
    write_job,
)

from decentralized_verl.spec.manifest import load_job
from tests.support.paths import EXAMPLES, TOY


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


def test_an_example_written_elsewhere_still_finds_its_data(tmp_path: Path) -> None:
    example = EXAMPLES / "tiny-grpo.yaml"
    spec = example_spec(example)
    assert spec["data"]["train"] == str((EXAMPLES / "data" / "toy" / "train.jsonl").resolve())
    spec["training"]["steps"] = 2
    job = load_job(write_job(tmp_path, "moved", spec))  # another folder: relative paths would break
    assert job.metadata.name == "moved" and job.spec.training.steps == 2
    assert Path(job.spec.data.train).is_file() and Path(job.spec.data.eval).is_file()
