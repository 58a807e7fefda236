"""A job whose rollout pods load a corrupted refresh, run by the operator on the test node: the learner's
refit-parity check fails, the learner writes its verdict as its termination message and exits 3, and the
operator fails the job at once (no restart up to backoffLimit: the next refresh would go the same way)
with a condition and an event naming the rollout worker, the learner and the version, whether it hears of
the failure first from the coordinator's Status reply (state Failed, with the verdict and its reason) or
from the learner pod's exit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from decentralized_verl.errors import REFIT_PARITY_REASON
from tests.support.cluster_node import claims, cluster, cluster_spec
from tests.support.node_harness import refused
from tests.support.operator_fixtures import wait_for
from tests.support.paths import ROOT

REASON = refused()
pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
CORRUPT = ROOT / "tests" / "support" / "corrupt_refresh"


def corrupted_spec() -> dict[str, Any]:
    spec = cluster_spec(steps=3)
    spec["backoffLimit"] = 6
    spec["training"] = {**spec["training"], "refitParityBound": 0.01}
    path = os.pathsep.join(p for p in (str(CORRUPT), os.environ.get("PYTHONPATH", "")) if p)
    template = {"spec": {"env": [{"name": "PYTHONPATH", "value": path}]}}
    spec["roles"]["rollout"] = {**spec["roles"]["rollout"], "podTemplate": template}
    return spec


async def test_a_corrupted_refresh_fails_the_job_at_once_naming_both_workers_and_the_version(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, claims(tmp_path)) as (emu, node, op):
        await emu.create_job("parity", corrupted_spec())

        async def failed() -> Any:
            job = await emu.job("parity")
            return job if ((job or {}).get("status") or {}).get("phase") == "Failed" else None

        try:
            job = await wait_for(failed, timeout=300, interval=0.5, what="the job to fail")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{node.all_logs()[-6000:]}\n{op.log()[-3000:]}") from None
        events = [(e["reason"], e["message"]) for e in await emu.events()]
        learners = [p for p in node.pods.values() if p.key[1].startswith("parity-learner-")]
    # Whichever the operator hears of first, the coordinator's Failed reply or the learner pod's exit 3, the
    # job fails for that reason, quoting the learner's verdict.
    condition = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert condition["status"] == "True" and condition["reason"] == REFIT_PARITY_REASON, condition
    said = condition["message"]
    assert "refit parity failed after the refresh to policy version 1" in said, said
    assert "rollout parity-rollout-0" in said and "learner parity-learner-0" in said, said
    assert [m for r, m in events if r == REFIT_PARITY_REASON] == [said], events
    assert not [r for r, _ in events if r in ("Restarting", "BackoffLimitExceeded")], events
    assert len(learners) == 1, "the learner was not restarted"
