"""Network faults in a running job, short and seeded (`benchmarks/chaos.py --network` is the full run): every
process on its own host; a volunteer on 20 Mbit/s + 150 ms + 1 % loss cut off just after it is admitted,
a rollout worker and then the reward worker partitioned mid-job. The job completes with no sample lost or
counted twice, and each cut-off host serves again once reconnected. Skipped with the reason where network
namespaces are refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from netlab.hosts import namespaces_refused

from tests.support.paths import ROOT

REFUSED = namespaces_refused()
BENCHMARKS = ROOT / "benchmarks"


@pytest.mark.skipif(REFUSED is not None, reason=f"network namespaces refused: {REFUSED}")
def test_partitions_and_a_cut_lose_no_sample_and_every_host_serves_again(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    from chaos_network import run

    report = run(
        steps=10, seed=3, partition_s=4, reward_partition_s=3, cut_s=2, volunteers=1, folder=tmp_path
    )
    assert report["steps"] == 10 and not report["steps_repeated_or_missing"], report
    assert report["samples_lost"] == 0 and report["samples_duplicated"] == 0, report
    recovery = report["recovery_s"]
    # Each host cut off served again after it came back: the volunteer and rollout worker produced samples
    # in a later step, and a step finished after the reward worker's heal.
    assert None not in recovery.values(), report
    assert report["volunteer_steps_served"]["v0"] > 0, report
