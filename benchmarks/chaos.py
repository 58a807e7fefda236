"""Chaos: a real `dverl run` with faults injected into its worker processes, and what survived.

    python benchmarks/chaos.py --faults 20 --seed 1                      # the tiny job, every role
    python benchmarks/chaos.py --example examples/smollm2-arithmetic-grpo.yaml --faults 5 --seed 1
    python benchmarks/chaos.py --smoke                                   # one of each role (CI's test)
    python benchmarks/chaos.py --network --steps 40                      # partitions, a cut, slow links

Faults, chosen from the seed: `kill` (SIGKILL; `dverl run` restarts the process), `stop` (SIGSTOP for a
while, then SIGCONT: a worker that hangs while alive) and `loop` (kill the same worker again each time it
is back, three times). They go to random roles (rollout, reward, reference, learner) at random steps.
Reported: faults injected, whether the job completed, samples lost and duplicated (from every step's
counters: both must be 0), step rows missing or repeated, steps redone after learner restarts, recovery
time per fault (until the next new step row), and the final reward against a fault-free run of the same
job and seed. Writes a JSON report (and prints a table) to --out. `--network`: faults in the network
instead (benchmarks/chaos_network.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing"))  # netlab: test and benchmark tooling, not in the package

from netlab.manifests import example_spec, write_job  # noqa: E402

TOY = ROOT / "examples" / "data" / "toy"
KINDS = ("kill", "stop", "loop")
ROLES = ("rollout", "reward", "reference", "learner")


@dataclass(frozen=True)
class Fault:
    at_step: int
    role: str
    kind: str
    index: int = 0
    hold_s: float = 8.0
    """How long a `stop` keeps the process stopped."""


@dataclass
class FaultRecord:
    fault: Fault
    worker: str
    injected_at: float
    step_at_injection: int
    recovered_s: float | None = None


@dataclass
class ChaosReport:
    faults: list[FaultRecord] = field(default_factory=list)
    completed: bool = False
    exit_code: int | None = None
    steps: int = 0
    steps_expected: int = 0
    rows_missing: list[int] = field(default_factory=list)
    rows_repeated: list[int] = field(default_factory=list)
    samples_lost: int = 0
    samples_duplicated: int = 0
    steps_redone: int = 0
    learner_restarts: int = 0
    reward_last: float | None = None
    wall_s: float = 0.0

    def recovery(self) -> list[float]:
        return [r.recovered_s for r in self.faults if r.recovered_s is not None]


def tiny_job(folder: Path, name: str, steps: int, seed: int) -> Path:
    """The tiny GRPO job with a worker for every serving role: 2 rollout, 1 reward, 1 reference."""
    spec = {
        "model": {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}},
        "algorithm": {"name": "grpo", "samplesPerPrompt": 8, "klCoef": 0.01},
        "data": {
            "train": str(TOY / "train.jsonl"),
            "rewardType": "decentralized_verl.rewards.toy:first_number",
            "maxPromptTokens": 64,
            "maxNewTokens": 8,
        },
        "roles": {
            "rollout": {"replicas": 2, "batchSize": 8},
            "learner": {"replicas": 1},
            "reward": {"replicas": 1},
            "reference": {"replicas": 1},
        },
        "training": {"steps": steps, "batchSize": 16, "learningRate": 1.0e-3, "seed": seed},
        "backoffLimit": 100,
    }
    return write_job(folder, name, spec)


def example_job(
    example: Path, folder: Path, name: str, seed: int, roles: dict, steps: int | None, dtype: str | None
) -> Path:
    """A shipped example with serving roles of their own (so each can fail), the given seed, optionally
    fewer steps and another dtype; no eval (it is not what is measured) and automatic checkpoints."""
    spec = example_spec(example)
    spec["data"].pop("eval", None)
    spec["roles"].update(roles)
    spec["training"]["seed"] = seed
    spec["training"].pop("evalEvery", None)
    spec["training"].pop("checkpoint", None)
    if steps is not None:
        spec["training"]["steps"] = steps
    if dtype is not None:
        spec["model"]["dtype"] = dtype
    spec["backoffLimit"] = 100
    return write_job(folder, name, spec)


def plan_faults(n: int, steps: int, seed: int, roles: tuple[str, ...] = ROLES) -> list[Fault]:
    """`n` faults at random steps in [2, steps - 2], random roles and kinds, from the seed."""
    rng = random.Random(seed)
    at = sorted(rng.randint(2, max(2, steps - 2)) for _ in range(n))
    return [Fault(step, rng.choice(roles), rng.choice(KINDS), index=rng.randint(0, 1)) for step in at]


def every_role_once(steps: int) -> list[Fault]:
    """The CI run: kill each role once, spread over the run."""
    marks = [max(2, steps * k // 5) for k in (1, 2, 3, 4)]
    return [Fault(at, role, "kill") for at, role in zip(marks, ROLES, strict=True)]


def _rows(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            out.append(json.loads(line))
    return out


def _workers(run: subprocess.Popen) -> dict[str, int]:
    """Worker name -> pid, for the processes `dverl run` started (read from /proc)."""
    from decentralized_verl.runtime.orphans import descendants

    found = {}
    for pid in descendants(run.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode() for a in argv]
        if "--role" in args and "--index" in args and "--job" in args:
            role, index, job = (args[args.index(k) + 1] for k in ("--role", "--index", "--job"))
            found[f"{job}-{role}-{index}"] = pid
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def run_chaos(job: Path, output: Path, faults: list[Fault], timeout: float = 3600.0) -> ChaosReport:
    """Run the job with `dverl run`, inject `faults` as the run reaches each one's step, and report."""
    spec = yaml.safe_load(job.read_text())
    name, steps = spec["metadata"]["name"], int(spec["spec"]["training"]["steps"])
    metrics = output / "metrics.jsonl"
    report = ChaosReport(steps_expected=steps)
    dverl = Path(sys.executable).parent / "dverl"
    command = [
        str(dverl) if dverl.exists() else sys.executable,
        *([] if dverl.exists() else ["-m", "decentralized_verl.cli"]),
    ]
    began = time.monotonic()
    with (output.parent / f"{output.name}.log").open("w") as log:
        run = subprocess.Popen(
            [*command, "run", str(job), "--output", str(output)], stdout=log, stderr=subprocess.STDOUT
        )
    pending = list(faults)
    stopped: list[tuple[float, int]] = []
    looping: list[tuple[str, int]] = []
    try:
        while run.poll() is None and time.monotonic() - began < timeout:
            rows = _rows(metrics)
            step = max((int(r["step"]) for r in rows), default=0)
            now = time.monotonic()
            for record in report.faults:
                if record.recovered_s is None and step > record.step_at_injection:
                    record.recovered_s = now - record.injected_at
            for until, pid in [s for s in stopped if s[0] <= now]:
                _signal(pid, signal.SIGCONT)
                stopped.remove((until, pid))
            workers = _workers(run)
            for worker_name, left in list(looping):
                pid = workers.get(worker_name)
                if pid is not None and pid not in {p for _, p in stopped}:
                    _signal(pid, signal.SIGKILL)
                    looping.remove((worker_name, left))
                    if left > 1:
                        looping.append((worker_name, left - 1))
            while pending and step >= pending[0].at_step:
                fault = pending.pop(0)
                index = fault.index if fault.role == "rollout" else 0
                worker_name = f"{name}-{fault.role}-{index}"
                pid = workers.get(worker_name)
                if pid is None:
                    continue  # that worker is restarting right now: the fault is skipped, not counted
                report.faults.append(FaultRecord(fault, worker_name, now, step))
                if fault.kind == "stop":
                    _signal(pid, signal.SIGSTOP)
                    stopped.append((now + fault.hold_s, pid))
                else:
                    _signal(pid, signal.SIGKILL)
                    if fault.kind == "loop":
                        looping.append((worker_name, 2))
            time.sleep(0.2)
    finally:
        for _, pid in stopped:
            _signal(pid, signal.SIGCONT)
        if run.poll() is None:
            run.terminate()
            try:
                run.wait(60)
            except subprocess.TimeoutExpired:
                run.kill()
    report.wall_s = time.monotonic() - began
    report.exit_code = run.returncode
    report.completed = run.returncode == 0
    rows = _rows(metrics)
    seen = [int(r["step"]) for r in rows]
    report.steps = len(set(seen))
    report.rows_missing = sorted(set(range(1, steps + 1)) - set(seen))
    report.rows_repeated = sorted({s for s in seen if seen.count(s) > 1})
    report.samples_lost = sum(int(r["expected_samples"]) - int(r["samples"]) for r in rows)
    report.samples_duplicated = sum(int(r["samples"]) - int(r["unique_samples"]) for r in rows)
    summary_path = output / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        report.learner_restarts = int(summary.get("learner_restarts", 0))
        report.reward_last = summary.get("reward_last")
    report.steps_redone = _steps_redone(output / "logs" / f"{name}-learner-0.log", report.faults)
    return report


def _steps_redone(learner_log: Path, faults: list[FaultRecord]) -> int:
    """Steps a restarted learner did again: the step reached when its fault hit minus the step resumed at."""
    if not learner_log.exists():
        return 0
    resumed = [
        int(m.group(1)) for m in re.finditer(r"resumed from \S+ at step (\d+)", learner_log.read_text())
    ]
    hits = [r.step_at_injection for r in faults if r.fault.role == "learner"]
    return sum(max(0, hit - back) for hit, back in zip(hits, resumed, strict=False))


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s / {max(values):.1f} s" if values else "n/a"


def table(report: ChaosReport, baseline_reward: float | None) -> str:
    recovery = report.recovery()
    kinds = {k: sum(1 for r in report.faults if r.fault.kind == k) for k in KINDS}
    roles = {k: sum(1 for r in report.faults if r.fault.role == k) for k in ROLES}
    rows = [
        ("faults injected", f"{len(report.faults)} ({', '.join(f'{k} {v}' for k, v in kinds.items())}; "
         f"{', '.join(f'{k} {v}' for k, v in roles.items())})"),
        ("job completed", f"{report.completed} (exit {report.exit_code}), {report.wall_s:.0f} s"),
        ("samples lost / duplicated", f"{report.samples_lost} / {report.samples_duplicated}"),
        ("step rows missing / repeated", f"{report.rows_missing or 0} / {report.rows_repeated or 0}"),
        ("learner restarts, steps redone", f"{report.learner_restarts}, {report.steps_redone}"),
        ("recovery time median / max", _spread(recovery)),
        ("final reward (last 5 steps) vs fault-free", f"{report.reward_last} vs {baseline_reward}"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="job length (tiny: 60; an example: its own)")
    parser.add_argument("--dtype", default=None, help="an example's model dtype instead of its own")
    parser.add_argument(
        "--example", type=Path, default=None, help="a shipped example instead of the tiny job"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the fault-free run")
    parser.add_argument("--smoke", action="store_true", help="kill each role once in a short tiny run")
    parser.add_argument("--out", type=Path, default=None, help="folder for runs and the JSON report")
    parser.add_argument(
        "--network",
        action="store_true",
        help="network faults instead, every process on its own host: partitions, a cut, slow volunteers",
    )
    parser.add_argument("--partition-s", type=float, default=60.0, help="--network: rollout partition")
    parser.add_argument("--reward-partition-s", type=float, default=30.0, help="--network: reward partition")
    args = parser.parse_args(argv)
    if args.network:
        return network_chaos(args)
    out = args.out or Path(tempfile.mkdtemp(prefix="dverl-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.example is not None:
        roles = {"rollout": {"replicas": 2, "batchSize": 4}, "reward": {"replicas": 1}}
        job = example_job(args.example, out, "chaos", args.seed, roles, args.steps, args.dtype)
        steps = int(yaml.safe_load(job.read_text())["spec"]["training"]["steps"])
        faults = plan_faults(args.faults, steps, args.seed, ("rollout", "reward", "learner"))
    else:
        steps = 12 if args.smoke else (args.steps or 60)
        job = tiny_job(out, "chaos", steps, args.seed)
        faults = every_role_once(steps) if args.smoke else plan_faults(args.faults, steps, args.seed)
    baseline = None
    if not (args.no_baseline or args.smoke):
        clean = run_chaos(job, out / "fault-free", [])
        baseline = clean.reward_last
    report = run_chaos(job, out / "chaos", faults)
    print(table(report, baseline))
    payload = {
        "faults_planned": [asdict(f) for f in faults],
        "report": asdict(report),
        "baseline_reward_last": baseline,
    }
    (out / "chaos.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"report: {out / 'chaos.json'}")
    ok = report.completed and not (
        report.samples_lost or report.samples_duplicated or report.rows_missing or report.rows_repeated
    )
    return 0 if ok else 1


def network_chaos(args: argparse.Namespace) -> int:
    """Network faults (chaos_network.py); skipped, with the reason, where namespaces are refused."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from chaos_network import run as run_network
    from netlab.hosts import namespaces_refused

    if (refused := namespaces_refused()) is not None:
        print(json.dumps({"skipped": refused}))
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="dverl-netchaos-"))
    out.mkdir(parents=True, exist_ok=True)
    report = run_network(args.steps or 40, args.seed, args.partition_s, args.reward_partition_s, folder=out)
    print(json.dumps(report, indent=2))
    (out / "chaos-network.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if not (report["samples_lost"] or report["samples_duplicated"]) else 1


if __name__ == "__main__":
    sys.exit(main())
