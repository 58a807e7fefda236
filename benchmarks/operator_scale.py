"""How the operator copes with many RLHFJobs created at once, against kmock's Kubernetes API emulator.

    python benchmarks/operator_scale.py --jobs 10 100 500
    python benchmarks/operator_scale.py --smoke        # N=3, what the test suite runs

For each N: a fresh emulator and a fresh operator process (`python -m dverl_operator`), N jobs
(1 learner + 2 rollout workers each) created concurrently, each in its own namespace (the emulator
ignores label selectors, so per-namespace lists keep its cost per pass near a real API server's).
A job counts as reconciled when its ConfigMap, Service and 3 pods exist and its status says
`workers: 0/3`. Reported: wall time until all are reconciled, p50/p99 of per-job latency
(creation -> reconciled, sampled every 100 ms; every second above N=100), operator peak RSS.
The emulator runs in this process and shares its CPU, so the numbers bound the operator from above.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' operator fixtures
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))  # netlab, which test helpers import

import kmock

from tests.support.operator_fixtures import Emulator, Operator, tiny_spec

PODS = kmock.resource("", "v1", "pods")
JOBS = kmock.resource("dverl.io", "v1alpha1", "rlhfjobs")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation), q in [0, 100]."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reconciled_jobs(emu: Emulator) -> set[str]:
    """Jobs whose children and status are all in place (read from the emulator's store directly)."""
    pods: dict[str, int] = {}
    for (resource, _, _), obj in list(emu.kmock.objects.items()):
        if resource == PODS and not obj.deleted:
            job = ((obj.get("metadata") or {}).get("labels") or {}).get("dverl.io/job")
            pods[job] = pods.get(job, 0) + 1
    done = set()
    for (resource, _, name), obj in list(emu.kmock.objects.items()):
        if resource == JOBS and not obj.deleted:
            status = obj.get("status") or {}
            if status.get("workers") == "0/3" and pods.get(name) == 3:
                done.add(name)
    return done


async def run_once(n: int, timeout: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="dverl-bench-") as tmp:
        async with Emulator(Path(tmp)) as emu:
            # The emulator is one Python thread serving every request; at N=500 a Lease renewal can wait
            # longer than the default 15 s behind the burst, and a leader that cannot renew steps down (as it
            # must on a real cluster). Give the Lease 60 s so the figure measures reconciling, not that.
            op = Operator(emu, "bench", "--resync-seconds", "30", "--lease-seconds", "60").start()
            try:
                # Wait for the operator to lead (its Lease exists) before the clock starts.
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    lease = await emu.call(
                        "GET", "apis/coordination.k8s.io/v1/namespaces/default/leases/dverl-operator"
                    )
                    if lease:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)  # kopf's watches are up
                names = [f"bench-{i:04d}" for i in range(n)]
                created: dict[str, float] = {}

                # All N are submitted at once; 32 requests in flight at a time, as `kubectl apply -f dir/`
                # and client-side rate limits do, so the single-threaded emulator answers within its timeout.
                slots = asyncio.Semaphore(32)

                async def create(name: str) -> None:
                    async with slots:
                        await emu.create_job(name, tiny_spec(), namespace=name)
                    created[name] = time.monotonic()

                start = time.monotonic()
                await asyncio.gather(*(create(name) for name in names))
                finished: dict[str, float] = {}
                while len(finished) < n and time.monotonic() - start < timeout:
                    now = time.monotonic()
                    for name in reconciled_jobs(emu) - finished.keys():
                        finished[name] = now
                    # Scanning the store competes with the emulator for this process: poll less at scale.
                    await asyncio.sleep(0.1 if n <= 100 else 1.0)
                total = time.monotonic() - start
                latencies = [finished[name] - created[name] for name in finished]
                rss = peak_rss_mib(op.pid)
            finally:
                await asyncio.to_thread(op.stop)
    if len(finished) < n:
        raise SystemExit(f"only {len(finished)}/{n} jobs reconciled within {timeout}s; see the operator log")
    return {
        "jobs": n,
        "all_reconciled_s": total,
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "rss_mib": rss,
    }


def table(rows: list[dict[str, float]]) -> str:
    header = (
        f"{'jobs':>6} {'pods':>6} {'all reconciled (s)':>19} {'p50 (s)':>8} {'p99 (s)':>8} "
        f"{'operator RSS (MiB)':>19}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['jobs']:>6} {row['jobs'] * 3:>6} {row['all_reconciled_s']:>19.2f} {row['p50_s']:>8.2f} "
            f"{row['p99_s']:>8.2f} {row['rss_mib']:>19.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 500], help="job counts to try")
    parser.add_argument("--smoke", action="store_true", help="N=3 only (a quick check that it runs)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per N")
    args = parser.parse_args(argv)
    counts = [3] if args.smoke else args.jobs
    rows = [asyncio.run(run_once(n, args.timeout)) for n in counts]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
