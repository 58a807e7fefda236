"""What every child of a job carries: its labels, an ownerReference to the RLHFJob (so deleting the job
cascades to its children through the garbage collector), and the hashes that tell when it drifted."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from decentralized_verl.spec import API_GROUP, API_VERSION, KIND

LABEL_JOB = f"{API_GROUP}/job"
LABEL_ROLE = f"{API_GROUP}/role"
LABEL_POOL = f"{API_GROUP}/pool"
LABEL_INDEX = f"{API_GROUP}/index"
DEFAULT_POOL = "default"
"""LABEL_POOL's value (and the pool a worker's address lists) for a worker of no named node pool."""
ANNOTATION_TEMPLATE_HASH = f"{API_GROUP}/template-hash"
ANNOTATION_CONFIG_HASH = f"{API_GROUP}/config-hash"
MANAGED_BY = {"app.kubernetes.io/managed-by": "dverl-operator"}


@dataclass(frozen=True)
class Owner:
    """The RLHFJob the children belong to (what ownerReferences and addresses need)."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def job_labels(job: str) -> dict[str, str]:
    return {LABEL_JOB: job, **MANAGED_BY}


def metadata(owner: Owner, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner.reference()],
    }


def content_hash(value: Any) -> str:
    """A short stable hash of JSON-able data (sorted keys), for change detection."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
