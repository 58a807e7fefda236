"""Thread pools that fit the machine: the CPU limit is read from affinity, the cgroup quota and DVERL_CPUS,
and `dverl run` splits the cores among processes that compute at the same time.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from decentralized_verl.runtime import cpus
from decentralized_verl.settings import SettingsError, WorkerSettings


@pytest.mark.parametrize(
    ("text", "want"),
    [("400000 100000\n", 4.0), ("150000 100000", 1.5), ("max 100000\n", None), ("", None), ("x y", None),
     ("0 100000", None), ("100000", None)],
)  # fmt: skip
def test_parse_cgroup_v2_cpu_max(text: str, want: float | None) -> None:
    assert cpus.parse_cpu_max(text) == want


def test_parse_cgroup_v1_quota() -> None:
    assert cpus.parse_cfs("200000\n", "100000\n") == 2.0
    assert cpus.parse_cfs("-1", "100000") is None
    assert cpus.parse_cfs("junk", "100000") is None


def test_cgroup_quota_read_from_v2_then_v1(tmp_path: Path) -> None:
    assert cpus.cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cpus.cgroup_cpus(tmp_path) == 3.0
    (tmp_path / "cpu.max").write_text("250000 100000")
    assert cpus.cgroup_cpus(tmp_path) == 2.5


def test_available_cpus_takes_the_smallest_limit(tmp_path: Path) -> None:
    machine = cpus.affinity_cpus()

    def given(environ: dict[str, str]) -> float | None:
        return WorkerSettings.from_env(environ).cpus

    assert cpus.available_cpus(given({}), root=tmp_path) == machine
    (tmp_path / "cpu.max").write_text("150000 100000")  # a pod limited to 1.5 CPUs on any node
    assert cpus.available_cpus(given({}), root=tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{(machine + 8) * 100000} 100000")  # a quota above the cores
    assert cpus.available_cpus(given({}), root=tmp_path) == machine
    assert cpus.available_cpus(given({"DVERL_CPUS": "1"}), root=tmp_path) == 1
    assert cpus.available_cpus(given({"DVERL_CPUS": "0.3"}), root=tmp_path) == 1  # never zero threads
    with pytest.raises(SettingsError, match="DVERL_CPUS"):
        given({"DVERL_CPUS": "-2"})


def test_share_cores_by_phase() -> None:
    workers = [
        ("l0", "learner"),
        ("r0", "rollout"),
        ("r1", "rollout"),
        ("ref", "reference"),
        ("rw", "reward"),
    ]
    on_policy = cpus.share_cores(12, workers, overlapped=False)
    assert on_policy == {"l0": 12, "r0": 4, "r1": 4, "ref": 4, "rw": 1}
    overlapped = cpus.share_cores(12, workers, overlapped=True)
    assert overlapped == {"l0": 3, "r0": 3, "r1": 3, "ref": 3, "rw": 1}
    assert cpus.share_cores(2, workers, overlapped=True)["r0"] == 1  # more processes than cores: one each
    two_learners = cpus.share_cores(8, [("l0", "learner"), ("l1", "learner")], overlapped=False)
    assert two_learners == {"l0": 4, "l1": 4}
