"""Job manifests that several test modules build the same way, kept in one place so a spec change is
mended once."""

from __future__ import annotations


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
