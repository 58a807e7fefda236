"""The job manifests tests and benchmarks run, built in one place so a spec change is mended once.

A caller starts from a base job and states only what it changes: each override is a dotted spec path and
the value put there (`"training.steps": 4`, `"roles": {...}`), so two runs of the same kind read as the
same job with a few named differences.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

BF16_TINY: dict[str, Any] = {
    "dtype": "bfloat16",
    "tiny": {"hiddenSize": 128, "numLayers": 2, "numHeads": 4, "intermediateSize": 512, "maxPositions": 128},
}
"""The network benchmarks' model: a tiny Llama served in bf16, so volunteers pull each new version as a
delta, with weights large enough that a slow link shows in the pull."""


def with_overrides(spec: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `spec` with each dotted path set to its value (missing parents are made); `spec` is
    left as it was."""
    out = copy.deepcopy(dict(spec))
    for path, value in overrides.items():
        node = out
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return out


def example_spec(example: Path) -> dict[str, Any]:
    """A shipped example's spec with its data files as absolute paths (an example names them relative to
    itself), for a caller to change and write with `write_job` under a name of its own."""
    spec = yaml.safe_load(example.read_text())["spec"]
    for key in ("train", "eval"):
        if key in spec["data"]:
            spec["data"][key] = str((example.parent / spec["data"][key]).resolve())
    return spec


def write_job(folder: Path, name: str, spec: Mapping[str, Any]) -> Path:
    """`spec` as the RLHFJob `name`, written to `folder/name.yaml`; returns that path."""
    doc = {"apiVersion": "dverl.io/v1alpha1", "kind": "RLHFJob", "metadata": {"name": name}, "spec": spec}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def volunteer_job(folder: Path, name: str, train: Path, **overrides: Any) -> Path:
    """A volunteer job, written to `folder/name.yaml`: a tiny Llama learning `train` (the toy task's
    prompts, scored by its first number) with GRPO from the learner and volunteers alone, which join with
    a token signed by the secret `name-join` names. `overrides` as `with_overrides` takes them."""
    spec: dict[str, Any] = {
        "model": {
            "tiny": {
                "hiddenSize": 32,
                "numLayers": 1,
                "numHeads": 2,
                "intermediateSize": 64,
                "maxPositions": 128,
            }
        },
        "algorithm": {"name": "grpo", "samplesPerPrompt": 4},
        "data": {
            "train": str(train),
            "rewardType": "decentralized_verl.rewards.toy:first_number",
            "maxPromptTokens": 64,
            "maxNewTokens": 6,
        },
        "roles": {"rollout": {"replicas": 0}, "learner": {"replicas": 1}},
        "training": {"steps": 3, "batchSize": 4, "learningRate": 1.0e-3},
        "volunteers": {
            "enabled": True,
            "verifyFraction": 0.1,
            "tokenSecretRef": {"name": f"{name}-join", "key": "secret"},
        },
    }
    return write_job(folder, name, with_overrides(spec, overrides))
