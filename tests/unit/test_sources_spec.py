"""`spec.sources` and `podTemplate` as `dverl validate` judges them: every bad case named by its field, the
good ones accepted, and model/data paths no source holds flagged for cluster use.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from typing import Any

import pytest

from decentralized_verl.errors import ManifestError
from decentralized_verl.spec.manifest import parse_spec
from decentralized_verl.spec.source_paths import cluster_warnings, pod_roles_of, source_of
from tests.support.job_manifests import GOOD_SOURCES as GOOD
from tests.support.job_manifests import SOURCE_DIGEST as DIGEST
from tests.support.job_manifests import sources_spec


def problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(ManifestError) as caught:
        parse_spec(document)
    return [str(p) for p in caught.value.problems]


def test_every_kind_of_source_is_accepted() -> None:
    parsed = parse_spec(sources_spec(GOOD))
    kinds = [s.kind for s in parsed.sources]
    assert kinds == ["pvc", "uri", "config_map", "image", "uri"]
    assert parsed.sources[3].mount_path == "/opt/dverl/examples"  # derived from the image path
    assert source_of("/data/toy/train.jsonl", parsed.sources).name == "toy"
    assert source_of("/database/x", parsed.sources) is None  # a prefix of the name is not "under"
    assert cluster_warnings(parsed) == []


@pytest.mark.parametrize(
    ("source", "field", "says"),
    [
        ({"pvc": {"claimName": "c", "subPath": "../up"}}, "sources[0].pvc.subPath", "no '..'"),
        ({"pvc": {"claimName": "c", "subPath": "/abs"}}, "sources[0].pvc.subPath", "relative"),
        ({"pvc": {"claimName": "c", "subPath": "a/./b"}}, "sources[0].pvc.subPath", "relative"),
        ({"uri": {"url": "ftp://host/x"}}, "sources[0].uri.url", "scheme 'ftp'"),
        ({"uri": {"url": "https:///x"}}, "sources[0].uri.url", "needs a host"),
        ({"uri": {"url": "https://host"}}, "sources[0].uri.url", "path of a file"),
        ({"uri": {"url": "s3://bucket"}}, "sources[0].uri.url", "bucket and a key"),
        ({"uri": {"url": "hf://owner"}}, "sources[0].uri.url", "needs a repository"),
        ({"uri": {"url": "https://h/a/../b"}}, "sources[0].uri.url", "'..'"),
        ({"uri": {"url": "https://h/x", "sha256": "XYZ"}}, "sources[0].uri.sha256", "64 lowercase hex"),
        ({"uri": {"url": "https://h/x", "sha256": "AB" * 32}}, "sources[0].uri.sha256", "64 lowercase hex"),
        ({"uri": {"url": "hf://o/r", "sha256": DIGEST}}, "sources[0].uri.sha256", "checks one file"),
        ({"uri": {"url": "https://h/x"}}, "sources[0].uri.sha256", "required: give the file's SHA-256"),
        ({"uri": {"url": "hf://o/r/f.bin?revision=" + "a" * 40}}, "sources[0].uri.sha256", "required"),
        ({"uri": {"url": "hf://o/r?revision=main"}}, "sources[0].uri.sha256", "?revision=<40-hex commit>"),
        (
            {"uri": {"url": "https://h/x", "sha256": DIGEST, "insecureSkipDigest": True}},
            "sources[0].uri.insecureSkipDigest",
            "contradicts",
        ),
    ],
)
def test_bad_source_kinds_are_named(source: dict[str, Any], field: str, says: str) -> None:
    found = problems(sources_spec([{"name": "s", "mountPath": "/s", **source}]))
    assert any(p.startswith(f"spec.{field}:") and says in p for p in found), found


@pytest.mark.parametrize(
    ("mount", "says"),
    [
        ("data", "must be an absolute path"),
        ("/", "cannot be /"),
        ("/a/../b", "plain absolute path"),
        ("/etc/dverl", "where the operator mounts"),
        ("/dev/shm/x", "where the operator mounts"),
        ("/home", "where the operator mounts"),  # above the image's home
        ("/var/run/dverl", "where the operator mounts"),
    ],
)
def test_bad_mount_paths_are_named(mount: str, says: str) -> None:
    found = problems(sources_spec([{"name": "s", "mountPath": mount, "configMap": {"name": "c"}}]))
    assert any(p.startswith("spec.sources[0].mountPath:") and says in p for p in found), found


def test_names_unique_mounts_apart_roles_known_and_one_kind() -> None:
    found = problems(
        sources_spec(
            [
                {"name": "a", "mountPath": "/data", "configMap": {"name": "c"}},
                {"name": "a", "mountPath": "/data/sub", "configMap": {"name": "d"}, "roles": ["critic", "x"]},
                {"name": "ckpt", "mountPath": "/ckpt", "configMap": {"name": "e"}},
            ],
            training={"checkpoint": {"dir": "/ckpt/run"}},
        )
    )
    assert "spec.sources[1].name: duplicate source 'a' (also sources[0])" in found
    assert any(p.startswith("spec.sources[1].mountPath: '/data/sub' overlaps sources[0]") for p in found)
    assert any(p.startswith("spec.sources[1].roles[0]: 'critic' is not a role") for p in found)
    assert any(p.startswith("spec.sources[1].roles[1]: 'x' is not a role") for p in found)
    assert any(p.startswith("spec.sources[2].mountPath:") and "checkpoint.dir" in p for p in found)
    assert any("exactly one of" in p for p in problems(sources_spec([{"name": "n", "mountPath": "/n"}])))
    two = problems(
        sources_spec(
            [{"name": "n", "mountPath": "/n", "configMap": {"name": "c"}, "pvc": {"claimName": "p"}}]
        )
    )
    assert any("got pvc, configMap" in p for p in two)
    bad_name = problems(sources_spec([{"name": "Not_DNS", "mountPath": "/n", "configMap": {"name": "c"}}]))
    assert any(p.startswith("spec.sources[0].name:") for p in bad_name)


def test_image_source_is_seen_where_it_lies() -> None:
    found = problems(sources_spec([{"name": "i", "mountPath": "/elsewhere", "image": {"path": "/opt/x"}}]))
    assert any(p.startswith("spec.sources[0].mountPath:") and "must equal image.path" in p for p in found)
    found = problems(sources_spec([{"name": "i", "image": {"path": "opt/x"}}]))
    assert any(p.startswith("spec.sources[0].image.path:") for p in found)


def test_pod_template_refuses_what_the_operator_owns() -> None:
    template = {
        "spec": {
            "env": [
                {"name": "DVERL_JOB", "value": "x"},
                {"name": "MASTER_PORT", "value": "1"},
                {"value": "v"},
            ],
            "volumes": [{"name": "config", "emptyDir": {}}, {"name": "h", "hostPath": {"path": "/"}}],
            "volumeMounts": [{"name": "h", "mountPath": "/tmp/x"}, {"name": "nope", "mountPath": "rel"}],
            "initContainers": [{"image": "busybox"}],
        }
    }
    found = problems(sources_spec(GOOD[:1], roles={"learner": {"podTemplate": template}}))
    at = "spec.roles.learner.podTemplate.spec"
    for expected in (
        f"{at}.env[0].name: DVERL_JOB is set by the operator",
        f"{at}.env[1].name: MASTER_PORT is set by the operator",
        f"{at}.env[2].name: required",
        f"{at}.volumes[0].name: 'config' is the name of one of the operator's volumes",
        f"{at}.volumes[1].hostPath: not allowed",
        f"{at}.volumeMounts[0].mountPath: '/tmp/x' overlaps /tmp",
        f"{at}.volumeMounts[1].mountPath: must be an absolute path",
        f"{at}.volumeMounts[1].name: no volume 'nope'",
        f"{at}.initContainers[0].name: required",
    ):
        assert any(p.startswith(expected) for p in found), (expected, found)
    unknown = problems(
        sources_spec(GOOD[:1], roles={"learner": {"podTemplate": {"spec": {"hostNetwork": True}}}})
    )
    assert any("podTemplate.spec.hostNetwork: unknown field" in p for p in unknown)


def test_default_roles_and_colocated_roles_read_through_the_learner() -> None:
    parsed = parse_spec(
        sources_spec(
            [
                {"name": "all", "mountPath": "/data", "configMap": {"name": "c"}},
                {"name": "ref", "mountPath": "/models", "roles": ["reference"], "configMap": {"name": "d"}},
            ],
            roles={"reference": {"replicas": 0}},
        )
    )
    assert pod_roles_of(parsed.sources[0], parsed) == {"rollout", "learner"}
    assert pod_roles_of(parsed.sources[1], parsed) == {"learner"}  # reference runs inside the learner


def test_paths_under_no_source_are_flagged_for_cluster_use() -> None:
    parsed = parse_spec(
        sources_spec(
            GOOD[:1], data={"train": "/data/t.jsonl", "eval": "rel/eval.jsonl"}, model={"path": "/nowhere/m"}
        )
    )
    warnings = cluster_warnings(parsed)
    # A relative path resolves in the worker image's examples folder, which a pod sees.
    assert [w.split(":")[0] for w in warnings] == ["spec.model.path"]
    eval_above = {"train": "/data/t.jsonl", "eval": "../eval.jsonl"}
    climbing = parse_spec(sources_spec(GOOD[:1], data=eval_above, model={"tiny": {}}))
    assert [w.split(":")[0] for w in cluster_warnings(climbing)] == ["spec.data.eval"]
    assert parse_spec(sources_spec(GOOD[:1], model={"tiny": {}})).model.path is None


def test_an_unchecked_download_is_said_in_so_many_words() -> None:
    pinned = {"url": "hf://o/r?revision=" + "0123456789" * 4}
    skipped = {"url": "https://h/x.bin", "insecureSkipDigest": True}
    parsed = parse_spec(sources_spec([{"name": "a", "mountPath": "/a", "uri": pinned}]))
    assert parsed.sources[0].uri.sha256 is None
    parsed = parse_spec(sources_spec([{"name": "b", "mountPath": "/b", "uri": skipped}]))
    assert parsed.sources[0].uri.insecure_skip_digest is True
