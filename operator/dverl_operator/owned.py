"""What every child of a job carries: its labels and an ownerReference to the RLHFJob (so deleting the
job cascades to its children through the garbage collector)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from decentralized_verl.spec import API_GROUP, API_VERSION, KIND

LABEL_JOB = f"{API_GROUP}/job"
LABEL_ROLE = f"{API_GROUP}/role"
LABEL_POOL = f"{API_GROUP}/pool"
LABEL_INDEX = f"{API_GROUP}/index"
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
