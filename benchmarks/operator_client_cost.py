"""What a Kubernetes client costs the operator image: packages added, RSS and import time.

    python benchmarks/operator_client_cost.py             # lightkube, kubernetes_asyncio, kr8s, kubernetes
    python benchmarks/operator_client_cost.py lightkube   # one candidate

For each candidate: a fresh venv with what the operator image installs (this project's wheel, kopf,
prometheus-client) plus the candidate, from the package index pip is configured with; then the size of its
site-packages (pip and setuptools left out), and in a fresh interpreter the peak RSS and the time of
`import kopf` followed by the client. A baseline venv without any client comes first. Takes a few minutes
(one wheel build, five venvs); needs the package index, nothing else.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = {
    "lightkube": ("lightkube>=1.0.1,<2", "lightkube"),
    "kubernetes_asyncio": ("kubernetes_asyncio", "kubernetes_asyncio.client"),
    "kr8s": ("kr8s", "kr8s.asyncio"),
    "kubernetes": ("kubernetes>=37,<38", "kubernetes.client"),
}
IMAGE = ["kopf>=1.45,<1.46", "prometheus-client>=0.20"]
PROBE = """
import resource, time
started = time.perf_counter()
import kopf
{client}
took = time.perf_counter() - started
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, took)
"""
LEFT_OUT = ("pip", "setuptools", "_distutils_hack")


def site_packages_mib(venv: Path) -> float:
    (site,) = venv.glob("lib/python3*/site-packages")
    total = 0
    for entry in site.iterdir():
        if entry.name.split("-")[0] in LEFT_OUT:
            continue
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        total += sum(p.stat().st_size for p in files)
    return total / 2**20


def measure(work: Path, wheel: Path, name: str, requirement: str | None, module: str | None) -> str:
    venv = work / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    extra = [requirement] if requirement else []
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel), *IMAGE, *extra],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    probe = PROBE.format(client=f"import {module}" if module else "")
    rss, seconds = subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True
    ).stdout.split()
    return f"{name:20} {site_packages_mib(venv):10.1f} {float(rss):10.1f} {float(seconds):10.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clients", nargs="*", help=f"some of {', '.join(CANDIDATES)} (default: all)")
    args = parser.parse_args()
    unknown = sorted(set(args.clients) - set(CANDIDATES))
    if unknown:
        parser.error(f"unknown client(s) {', '.join(unknown)}; choose from {', '.join(CANDIDATES)}")
    with tempfile.TemporaryDirectory(prefix="dverl-client-cost-") as tmp:
        work = Path(tmp)
        source = work / "src"  # what the Dockerfile copies, so no stale build/ of the checkout gets in
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, source / name)
        for name in ("worker_image", "operator"):
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work), str(source)]
        subprocess.run(build, check=True)
        (wheel,) = work.glob("decentralized_verl-*.whl")
        print(f"{'client':20} {'MiB pkgs':>10} {'RSS MiB':>10} {'import s':>10}", flush=True)
        print(measure(work, wheel, "none (baseline)", None, None), flush=True)
        for name in args.clients or list(CANDIDATES):
            requirement, module = CANDIDATES[name]
            print(measure(work, wheel, name, requirement, module), flush=True)


if __name__ == "__main__":
    main()
