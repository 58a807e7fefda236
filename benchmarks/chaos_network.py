"""Network faults in a running job (`python benchmarks/chaos.py --network`): every process on its own
emulated host (testing/netlab), and faults that are links, not signals.

The job: a learner (the coordinator) on one host, 2 rollout workers and a reward worker on hosts of their
own (gRPC), a DHT host and 3 volunteers, the last third of them on 20 Mbit/s + 150 ms RTT + 1 % loss.
Faults, in order:

- the home20 volunteer is cut off (partitioned) for `cut_s` as it starts pulling its first full weights,
  then reconnected: the broken pull resumes from its last verified chunk;
- rollout worker 0 is partitioned for `partition_s` (60 s in the full run) once training is under way;
- then the reward worker is partitioned for `reward_partition_s`.

Reported: whether the job completed, samples lost and duplicated (from every step's own counters: both
must be 0), and recovery times: for the rollout worker from its heal to the end of the first step it
produced samples in again, for the reward worker from its heal to the next step row, for the volunteer
from its heal to the first step it produced samples in; also the transfers the volunteer resumed, and the
steps whose rollout was hedged or continued from prefixes.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing"))  # netlab: test and benchmark tooling, not in the package
TOY = ROOT / "examples" / "data" / "toy"
SECRET = "chaos-network-secret-0123456789abcdef"
JOB = "netchaos"
RESUMED = re.compile(r"resuming from chunk|delta stream broke \(.*\); resuming")


def manifest(folder: Path, steps: int, seed: int) -> Path:
    """The volunteer job with cluster rollout and reward workers beside its volunteers."""
    from netlab.manifests import BF16_TINY, volunteer_job

    return volunteer_job(
        folder,
        JOB,
        TOY / "train.jsonl",
        model=BF16_TINY,
        roles={
            "rollout": {"replicas": 2, "batchSize": 3},
            "reward": {"replicas": 1},
            "learner": {"replicas": 1},
        },
        training={"steps": steps, "batchSize": 6, "learningRate": 1.0e-5, "seed": seed},
        **{"data.maxNewTokens": 8},
    )


def run(
    steps: int = 40,
    seed: int = 0,
    partition_s: float = 60.0,
    reward_partition_s: float = 30.0,
    cut_s: float = 5.0,
    volunteers: int = 3,
    folder: Path | None = None,
) -> dict[str, Any]:
    """Run the job with its network faults; the report (see the module docstring)."""
    from netlab.hosts import Network
    from netlab.jobs import HostJob, step_records
    from netlab.profiles import profile

    from decentralized_verl.volunteers.tokens import issue_token

    folder = folder or Path(tempfile.mkdtemp(prefix="dverl-netchaos-"))
    names = [f"v{i}" for i in range(volunteers)]
    slow = names[-max(1, volunteers // 3) :]  # the last third on home20
    events: dict[str, float] = {}
    started = time.time()
    with Network(seed=seed) as net:
        for host in ("dht", "coord", "r0", "r1", "rw"):
            net.add_host(host)
        for name in names:
            net.add_host(name, profile("home20" if name in slow else "lan"))
        job = HostJob(net, folder)
        maddr = job.start_dht("dht", JOB)
        config, out = manifest(folder, steps, seed), folder / "run"
        learner_addr = f"{net.hosts['coord'].address}:7000"
        rollout = [
            job.start_worker(
                h, "rollout", config, JOB, i, 7001, {"DVERL_LEARNER_ADDR": learner_addr}, f"rollout{i}"
            )
            for i, h in enumerate(("r0", "r1"))
        ]
        reward = job.start_worker("rw", "reward", config, JOB, 0, 7002, {}, "reward")
        job.start_learner(
            "coord",
            config,
            out,
            {
                "DVERL_ROLLOUT_ADDRS": ",".join(rollout),
                "DVERL_REWARD_ADDRS": reward,
                "DVERL_DHT_ADDR": maddr,  # what the bootstrap printed: its identity is random
                "DVERL_JOIN_SECRET": SECRET,
                "DVERL_WAIT_VOLUNTEERS": f"{volunteers}:600",
                "DVERL_VOLUNTEER_POLL_S": "0.5",
            },
        )
        for name in names:  # a join token admits one peer identity
            job.start_volunteer(name, maddr, JOB, issue_token(SECRET.encode(), JOB, 7200))
        cut = slow[0]
        job.wait_for(cut, r"pulling the full bundle", 600)  # its first weights: cut it mid-transfer
        net.partition(cut)
        time.sleep(cut_s)
        net.heal(cut)
        events["volunteer_healed"] = time.time()
        peers = {name: job.volunteer_peer(name) for name in names}
        job.wait_for("learner", r"step 3/", 900)
        net.partition("r0")
        events["rollout_partitioned"] = time.time()
        time.sleep(partition_s)
        net.heal("r0")
        events["rollout_healed"] = time.time()
        net.partition("rw")
        events["reward_partitioned"] = time.time()
        time.sleep(reward_partition_s)
        net.heal("rw")
        events["reward_healed"] = time.time()
        code = job.procs["learner"].wait(3600)
        for name in [*names, "rollout0", "rollout1", "reward"]:
            job.stop(name)
        logs = {name: job.log(name) for name in names}
        if code != 0:
            raise RuntimeError(f"the learner exited {code}:\n{job.log('learner')[-3000:]}")
    records = step_records(out)
    return summarize(records, events, peers, logs, cut, started, folder, f"{JOB}-rollout-0")


def _first_step_with(records: list[dict], worker: str, after: float) -> float | None:
    """Seconds from `after` to the end of the first step after it with samples from `worker`."""
    for r in records:
        if r["time"] > after and r.get("samples_by_worker", {}).get(worker, 0) > 0:
            return round(r["time"] - after, 1)
    return None


def summarize(records, events, peers, logs, cut, started, folder, rollout0) -> dict[str, Any]:
    from netlab.jobs import volunteer_worker_id

    next_row = [r["time"] for r in records if r["time"] > events["reward_healed"]]
    steps_in = [r["step"] for r in records]
    return {
        "steps": len(records),
        "steps_repeated_or_missing": steps_in != list(range(1, len(records) + 1)),
        "samples_lost": sum(r["expected_samples"] - r["unique_samples"] for r in records),
        "samples_duplicated": sum(r["samples"] - r["unique_samples"] for r in records),
        "hedged_items": sum(r.get("hedged", 0) for r in records),
        "continued_items": sum(r.get("continued", 0) for r in records),
        "redispatched_items": sum(r["redispatched"] for r in records),
        "recovery_s": {
            "volunteer_cut": _first_step_with(
                records, volunteer_worker_id(peers[cut]), events["volunteer_healed"]
            ),
            "rollout_partition": _first_step_with(records, rollout0, events["rollout_healed"]),
            "reward_partition": round(next_row[0] - events["reward_healed"], 1) if next_row else None,
        },
        "volunteer_transfers_resumed": len(RESUMED.findall(logs[cut])),
        "volunteer_steps_served": {
            name: sum(1 for r in records if r.get("samples_by_worker", {}).get(volunteer_worker_id(p), 0))
            for name, p in peers.items()
        },
        "step_s_median": sorted(r["step_seconds"] for r in records)[len(records) // 2],
        "wall_s": round(time.time() - started, 1),
        "logs": str(folder),
    }
