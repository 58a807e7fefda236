"""A job run by an ordinary user, and a neighbour of its workers.

Both run as root without CAP_SYS_PTRACE (`_as_plain_user`): to each other what two processes of one
ordinary user are. `launch FOLDER [OVERRIDES]`: `dverl run`'s launcher issues the run's credentials and
starts one reward worker the way `dverl run` does (the job's spec changed by the JSON `OVERRIDES`, dotted
paths);
prints one JSON line (the worker's pid and address, the run's secrets in hex, each role's token, the CA)
and stops the worker when its stdin closes.

`snoop PID SECONDS`: tries what any process of the same user can try on a freshly started
worker, again and again: open every `/proc/<pid>/fd/<n>` and read what is buffered there, read
`/proc/<pid>/environ`, and open `/proc/<pid>/mem` (the ptrace route to its memory); prints one JSON
line: the bytes it read (hex), and which routes were open to it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import sys
import time
from pathlib import Path

PR_CAPBSET_DROP = 24
CAP_SYS_PTRACE = 19
DROPPED = "PROC_SNOOP_PLAIN"


def _as_plain_user() -> None:
    """Root with CAP_SYS_PTRACE dropped from the bounding set, then exec'd again, so this process and
    all it starts hold the same capabilities as each other and none that overrides the kernel's
    same-user checks: what an ordinary user's processes are to one another (an interpreter under
    /root is not reachable by another uid, so the test cannot simply change uid)."""
    if os.environ.get(DROPPED):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    os.environ[DROPPED] = "1"
    os.execv(sys.executable, [sys.executable, "-m", "tests.support.proc_snoop", *sys.argv[1:]])


def _read_available(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ready, _, _ = select.select([fd], [], [], 0)
        return os.read(fd, 65536) if ready else b""
    finally:
        os.close(fd)


def snoop(pid: int, seconds: float) -> dict[str, object]:
    stolen: set[str] = set()
    routes = {"fd_listed": False, "fd_opened": False, "environ": False, "mem": False}
    seen: dict[str, bool] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen |= {k: v for k, v in routes.items() if v}
        routes = dict.fromkeys(routes, False)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            routes["fd_listed"] = True
        except FileNotFoundError:
            break  # the worker is gone
        except OSError:
            fds = []
        for n in fds:
            try:
                data = _read_available(f"/proc/{pid}/fd/{n}")
                routes["fd_opened"] = True
            except OSError:
                continue
            if data:
                stolen.add(data.hex())
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                stolen.add(environ.read().hex())
            routes["environ"] = True
        except OSError:
            pass
        try:
            os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY))
            routes["mem"] = True
        except OSError:
            pass
        time.sleep(0.002)
    at_the_end = sorted(k for k, v in routes.items() if v)
    return {"stolen": sorted(stolen), "ever": sorted(seen), "at_the_end": at_the_end}


def launch(folder: Path, overrides: dict | None = None) -> None:
    from decentralized_verl.launch.local import LocalCluster
    from decentralized_verl.launch.run import write_config
    from decentralized_verl.planning.plan import plan_job
    from decentralized_verl.security.credentials import run_folder_credentials
    from decentralized_verl.spec.manifest import load_job
    from tests.support.job_manifests import e2e_manifest

    manifest = e2e_manifest(folder, "neighbours", **{"roles.reward": {"replicas": 1}, **(overrides or {})})
    job = load_job(manifest)
    output = folder / "run"
    config = write_config(job, manifest, output)
    local = run_folder_credentials(output, job.metadata.name)
    with LocalCluster(plan_job(job.spec, job.metadata.name), config, output, credentials=local) as cluster:
        cluster.start(("reward",))
        worker = cluster.by_role("reward")[0]
        secrets = [local.issued.signing_key.hex(), local.issued.dht_seed.hex()]
        secrets += [t.hex() for t in local.issued.tokens.values()]
        tokens = {role: token.decode() for role, token in local.issued.tokens.items()}
        started = {"pid": worker.process.pid, "secrets": secrets, "address": worker.address, "tokens": tokens}
        print(json.dumps({**started, "ca": local.issued.ca.decode()}), flush=True)
        sys.stdin.read()


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    launching = sub.add_parser("launch")
    launching.add_argument("folder", type=Path)
    launching.add_argument("overrides", nargs="?", type=json.loads, default=None)
    snooping = sub.add_parser("snoop")
    snooping.add_argument("pid", type=int)
    snooping.add_argument("seconds", type=float)
    args = parser.parse_args()
    _as_plain_user()
    if args.what == "launch":
        launch(args.folder, args.overrides)
    else:
        print(json.dumps(snoop(args.pid, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
