"""What the secured path costs: TLS + the job token on every call + signed weight manifests, against the
same work in plaintext, side by side in one run.

    python benchmarks/security_cost.py           # 270 MB weight sync (SmolLM2-135M bf16), tiny GRPO
    python benchmarks/security_cost.py --smoke   # 2 MB, 3 steps, one repeat (what the test suite runs)

Three measurements, each alternating plaintext and secured runs so a loaded machine hits both alike:
- primitives: Ed25519 sign and verify of one manifest, and a new connection's first call (TCP, plus
  the TLS handshake when secured) against one of our servers;
- weight sync: the benchmarks/weight_sync.py paths (every receiver a separate process): `grpc chain`,
  the learner's push down a relay chain, and `grpc fetch`, every receiver pulling; secured receivers
  check the signature and talk TLS;
- a GRPO step: the tiny job of benchmarks/chaos.py (2 rollout workers, reward, reference, learner as
  separate processes, as `dverl run` starts them), its median step time over the steps after the first.
Reported: medians, the secured/plaintext ratio, and every run (the spread). Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _weight_sync_nodes import Learner, run_grpc, start_receivers, stop_receivers
from chaos import tiny_job
from weight_sync import machine_info, smollm2_like_state

MODES = ("plaintext", "secured")
PARTS = ("primitives", "sync", "grpo")


def _ratio(rows: dict[str, list[float]]) -> str:
    plain, secured = statistics.median(rows["plaintext"]), statistics.median(rows["secured"])
    return f"{secured / plain:.2f}x" if plain > 0 else "n/a"


def _runs(values: list[float], fmt: str = "{:.3f}") -> str:
    return ", ".join(fmt.format(v) for v in values)


def row(what: str, values: dict[str, list[float]], scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    plain = [v * scale for v in values["plaintext"]]
    secured = [v * scale for v in values["secured"]]
    return (
        f"| {what} | {fmt.format(statistics.median(plain))} | {fmt.format(statistics.median(secured))} | "
        f"{_ratio(values)} | {_runs(plain, fmt)} | {_runs(secured, fmt)} |"
    )


# ------------------------------------------------------------------------------------ primitives


def primitives(creds, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per manifest signature / check, and per first call on a new connection."""
    import asyncio

    from decentralized_verl.proto import dverl_pb2 as pb
    from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
    from decentralized_verl.serving.servicers import serve
    from decentralized_verl.transport import secure
    from decentralized_verl.transport.weights import signing
    from decentralized_verl.transport.weights.publish import WeightPublisher
    from decentralized_verl.transport.weights.service import WeightsServicer

    publisher = WeightPublisher(chunk_bytes=1 << 20, signing_key=None)
    publisher.publish(smollm2_like_state(8), 1)
    manifest = publisher.get(1).manifest
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        signed = signing.sign(manifest, creds.signing_key)
    sign_s = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        signing.check(signed, creds.verify_key)
    check_s = (time.perf_counter() - t) / n

    async def first_calls(credentials) -> list[float]:
        server = await serve(0, WeightsServicer(publisher), credentials=credentials)
        out = []
        try:
            for _ in range(repeats * 5):
                t0 = time.perf_counter()
                async with secure.aio_channel(f"127.0.0.1:{server.port}", credentials) as channel:
                    await pb_grpc.WeightsStub(channel).GetManifest(
                        pb.ManifestRequest(latest=True), timeout=10
                    )
                out.append(time.perf_counter() - t0)
        finally:
            await server.stop(None)
        return out

    connect = {mode: asyncio.run(first_calls(creds if mode == "secured" else None)) for mode in MODES}
    return {"sign": {"secured": [sign_s]}, "check": {"secured": [check_s]}, "connect": connect}


# ----------------------------------------------------------------------------------- weight sync


def weight_sync(creds, tls_dir: str, mb: float, receivers: int, repeats: int, chunk_mb: float) -> dict:
    """Median wall seconds per method and mode; the receiver pools live through all runs."""
    state = smollm2_like_state(mb)
    chunk = int(chunk_mb * 1024 * 1024)
    learners = {"plaintext": Learner(chunk, [], None), "secured": Learner(chunk, [], creds)}
    pools = {
        "plaintext": start_receivers(receivers, [], 2, None),
        "secured": start_receivers(receivers, [], 2, tls_dir),
    }
    version = 0
    walls: dict[str, dict[str, list[float]]] = {m: {mode: [] for mode in MODES} for m in ("chain", "fetch")}
    try:
        for _ in range(repeats):
            for method in walls:
                for mode in MODES:
                    version += 1
                    learners[mode].relay.publish(state, version)  # encoding and signing: not timed
                    wall, _ = run_grpc(learners[mode], version, pools[mode], method)
                    walls[method][mode].append(wall)
                    print(f"  weight sync {method} {mode}: {wall:.3f}s", file=sys.stderr, flush=True)
        size = learners["secured"].relay.publisher.get().manifest.total_bytes
    finally:
        for mode in MODES:
            stop_receivers(pools[mode])
            learners[mode].stop()
    return {"bytes": size, "walls": walls}


# --------------------------------------------------------------------------------------- GRPO step


def grpo_steps(folder: Path, steps: int, repeats: int) -> dict[str, list[float]]:
    """Median step seconds (steps after the first) of the tiny job, per run, per mode."""
    from decentralized_verl.launch.local import LocalCluster
    from decentralized_verl.launch.run import write_config
    from decentralized_verl.planning.plan import plan_job
    from decentralized_verl.reporting.metrics import read_metrics
    from decentralized_verl.security.credentials import run_folder_credentials
    from decentralized_verl.spec.manifest import load_job

    out: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(repeats):
        for mode in MODES:
            path = tiny_job(folder, f"sec-{mode}-{r}", steps, seed=1)
            job = load_job(path)
            output = folder / f"run-{mode}-{r}"
            config = write_config(job, path, output)
            creds = run_folder_credentials(output, job.metadata.name) if mode == "secured" else None
            cluster = LocalCluster(plan_job(job.spec, job.metadata.name), config, output, credentials=creds)
            learner = cluster.by_role("learner")[0]
            with cluster:
                cluster.start()
                code = learner.process.wait(timeout=1800)
            if code != 0:
                raise RuntimeError(f"{mode} run {r} failed:\n{learner.log_tail()}")
            seconds = [row["step_seconds"] for row in read_metrics(output / "metrics.jsonl")][1:]
            out[mode].append(statistics.median(seconds))
            print(f"  GRPO {mode} run {r}: median step {out[mode][-1]:.3f}s", file=sys.stderr, flush=True)
    return out


# ------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=270.0, help="weight payload in MB (SmolLM2-135M bf16)")
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps per run of the tiny job")
    parser.add_argument("--chunk-mb", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=None, help="JSON report")
    parser.add_argument("--smoke", action="store_true", help="2 MB, 3 steps, one repeat")
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure (default: all)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.mb, args.repeats, args.steps, args.chunk_mb, args.receivers = 2.0, 1, 3, 0.25, 1
    os.environ.pop("DVERL_TLS_DIR", None)  # this process chooses per run; it holds no job of its own

    from decentralized_verl.security.credentials import run_folder_credentials, write

    info = machine_info()
    with tempfile.TemporaryDirectory(prefix="dverl-security-") as tmp:
        issued = run_folder_credentials(Path(tmp) / "bench", "security-bench").issued
        creds = issued.for_role("learner")
        rollout_dir = write(Path(tmp) / "rollout", issued, "rollout")
        prims = primitives(creds, args.repeats) if "primitives" in args.parts else None
        sync = (
            weight_sync(creds, str(rollout_dir), args.mb, args.receivers, args.repeats, args.chunk_mb)
            if "sync" in args.parts
            else None
        )
        steps = grpo_steps(Path(tmp), args.steps, args.repeats) if "grpo" in args.parts else None

    report = {
        "primitives": prims,
        "weight_sync": sync,
        "grpo_step_s": steps,
        "args": {**vars(args), "out": None},
    }
    command = shlex.join(["python", "benchmarks/security_cost.py", *(sys.argv[1:] if argv is None else argv)])
    print(f"\nCommand: `{command}`\n")
    print("\n".join(info))
    print(f"- load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if prims is not None:
        sign_us, check_us = prims["sign"]["secured"][0] * 1e6, prims["check"]["secured"][0] * 1e6
        print(f"- Ed25519: sign a manifest {sign_us:.0f} us, check one {check_us:.0f} us")
    print()
    print(
        "| what | plaintext median | secured median | secured / plaintext | runs plaintext | runs secured |"
    )
    print("|---|---|---|---|---|---|")
    if prims is not None:
        print(row("new connection + first call (ms)", prims["connect"], 1e3, "{:.2f}"))
    if sync is not None:
        mb = sync["bytes"] / 1e6
        for method, walls in sync["walls"].items():
            print(row(f"weight sync {mb:.0f} MB, grpc {method} x{args.receivers} (s)", walls))
    if steps is not None:
        print(row(f"tiny GRPO step, median of steps 2-{args.steps} (s)", steps))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
