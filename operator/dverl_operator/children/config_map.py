"""Pure: the ConfigMap every worker mounts: the job's rendered config and every worker's address."""

from __future__ import annotations

from typing import Any

import yaml

from decentralized_verl.planning.plan import Plan
from decentralized_verl.spec import JobSpec, with_defaults
from dverl_operator.children.services import worker_address
from dverl_operator.objects.owned import (
    ANNOTATION_CONFIG_HASH,
    DEFAULT_POOL,
    Owner,
    content_hash,
    job_labels,
    metadata,
)

CONFIG_KEY = "job.yaml"
WORKERS_KEY = "workers.yaml"


def config_map_name(job: str) -> str:
    return f"{job}-config"


def config_map(owner: Owner, spec: JobSpec, plan: Plan) -> dict[str, Any]:
    """The rendered job config the workers mount at CONFIG_PATH, plus every worker's address."""
    data = {
        CONFIG_KEY: yaml.safe_dump(with_defaults(spec), sort_keys=False),
        WORKERS_KEY: yaml.safe_dump(
            {
                w.name: {
                    "role": w.role,
                    "index": w.index,
                    "address": worker_address(owner, w),
                    "pool": w.pool or DEFAULT_POOL,
                    "gpuType": w.gpu_type or "",
                }
                for w in plan.workers
            },
            sort_keys=False,
        ),
    }
    meta = metadata(owner, config_map_name(owner.name), job_labels(owner.name))
    meta["annotations"] = {ANNOTATION_CONFIG_HASH: content_hash(data)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
