"""Job manifests that several test modules build the same way, kept in one place so a spec change is
mended once."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from netlab.manifests import with_overrides, write_job

from tests.support.paths import EXAMPLES, FIXTURES, TOY

EXAMPLE_JOBS = sorted(
    p
    for p in EXAMPLES.glob("*.yaml")
    if any((doc or {}).get("kind") == "RLHFJob" for doc in yaml.safe_load_all(p.read_text()))
)
"""Every shipped example that is an RLHFJob (the stages pipeline and Kubernetes manifests are not)."""

SMALL_JOB: dict[str, Any] = {
    "apiVersion": "dverl.io/v1alpha1",
    "kind": "RLHFJob",
    "metadata": {"name": "job"},
    "spec": {
        "model": {"tiny": {"hiddenSize": 32, "numHeads": 4}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 4},
        "data": {"train": "train.jsonl", "eval": "eval.jsonl"},
        "roles": {"rollout": {"replicas": 2, "batchSize": 4}, "learner": {"replicas": 1}},
        "training": {"steps": 10, "batchSize": 8, "minibatchSize": 4, "microbatchSize": 2},
    },
}
"""A valid job the spec and CRD tests change one field of at a time (never run; copy before changing)."""


def environment_job(environment: dict) -> dict:
    """The smallest learner-only GRPO job whose `data.environment` is the given mapping: what the spec
    tests of environments parse (it is never run)."""
    return {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "job"},
        "spec": {
            "model": {"tiny": {"hiddenSize": 32, "numHeads": 4}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 4},
            "data": {"train": "train.jsonl", "environment": environment},
            "roles": {"rollout": {"replicas": 0}, "learner": {"replicas": 1}},
            "training": {"steps": 2, "batchSize": 4},
        },
    }


def e2e_manifest(folder: Path, name: str, **overrides: Any) -> Path:
    """The end-to-end runs' job: a tiny Llama learning the toy task with GRPO, two rollout workers and
    one learner. Each override is a dotted spec path and the value put there (`"training.steps": 4`,
    `"roles.learner": {...}`), so a test states only what it changes."""
    spec: dict[str, Any] = {
        "model": {
            "tiny": {
                "hiddenSize": 64,
                "numLayers": 2,
                "numHeads": 4,
                "intermediateSize": 128,
                "maxPositions": 128,
            }
        },
        "algorithm": {"name": "grpo", "samplesPerPrompt": 8},
        "data": {
            "train": str(TOY / "train.jsonl"),
            "eval": str(TOY / "eval.jsonl"),
            "rewardType": "decentralized_verl.rewards.toy:first_number",
            "maxPromptTokens": 64,
            "maxNewTokens": 8,
        },
        "roles": {"rollout": {"replicas": 2, "batchSize": 8}, "learner": {"replicas": 1}},
        "training": {"steps": 80, "batchSize": 16, "learningRate": 1.0e-3, "evalEvery": 40},
    }
    return write_job(folder, name, with_overrides(spec, overrides))


QWEN7B_CONFIG = FIXTURES / "qwen7b-config"
"""Qwen2-7B's config.json alone (no weights): what planning reads of a real model."""

QWEN7B = {
    "apiVersion": "dverl.io/v1alpha1",
    "kind": "RLHFJob",
    "metadata": {"name": "q7"},
    "spec": {
        "model": {"path": str(QWEN7B_CONFIG), "dtype": "bfloat16"},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 8},
        "data": {"train": "t.jsonl", "maxPromptTokens": 512, "maxNewTokens": 1024},
        "roles": {
            "rollout": {"replicas": 4, "backend": "vllm", "batchSize": 16, "resources": {"gpus": 1}},
            "learner": {"replicas": 2, "resources": {"gpus": 1, "gpuMemory": "24Gi"}},
        },
        "training": {"steps": 10, "batchSize": 32, "minibatchSize": 8, "microbatchSize": 1},
    },
}
"""A 7B GRPO job on GPUs, as the planner sees it."""


def qwen7b(**roles) -> dict:
    doc = copy.deepcopy(QWEN7B)
    for name, fields in roles.items():
        if name == "model":
            doc["spec"]["model"].update(fields)
        elif name == "training":
            doc["spec"]["training"].update(fields)
        else:
            doc["spec"]["roles"][name] = fields
    return doc


def cluster_manifest(folder: Path, sources: list[dict], **overrides) -> Path:
    """The e2e job with its data read from pod paths, as a cluster's pods would."""
    return e2e_manifest(
        folder,
        "cluster-form",
        **{
            "data.train": "/data/train.jsonl",
            "data.eval": "/eval/eval.jsonl",
            "sources": sources,
            **overrides,
        },
    )


SOURCE_DIGEST = "ab" * 32

GOOD_SOURCES = [
    {"name": "toy", "mountPath": "/data", "local": "data", "pvc": {"claimName": "rl", "subPath": "toy/v1"}},
    {
        "name": "model",
        "mountPath": "/models",
        "uri": {"url": "hf://owner/repo/m.tar.gz", "sha256": SOURCE_DIGEST},
    },
    {"name": "small", "mountPath": "/small", "configMap": {"name": "small-data"}},
    {"name": "examples", "image": {"path": "/opt/dverl/examples"}},
    {
        "name": "s3",
        "mountPath": "/s3",
        "roles": ["rollout"],
        "uri": {"url": "s3://bucket/key/file.bin", "insecureSkipDigest": True},
    },
]
"""One source of every kind, each valid: a pvc with a local copy, a digest-checked URI, a ConfigMap, the
image's own folder, and a role-limited URI that accepts an unchecked download explicitly."""


def sources_spec(sources: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A spec reading its model and data from pod paths that `sources` fill."""
    document: dict[str, Any] = {
        "model": {"path": "/models/m"},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
        "data": {"train": "/data/toy/train.jsonl"},
        "sources": sources,
    }
    document.update(extra)
    return document
