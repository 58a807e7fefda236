"""A Ray cluster only the job can use: a real local Ray head started as docs/ray.md says (Ray's token
authentication on) refuses a client without the token or with another one, `dverl run --ray` refuses to
join a cluster without it, and the job's actors give nothing of their node's files but the run's results.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.ray_head import ROOT

CLIENT = textwrap.dedent(
    """
    import sys, ray
    try:
        ray.init(address=sys.argv[1], namespace="dverl", log_to_driver=False)
        print("JOINED", len(ray.nodes()), flush=True)
    except Exception as exc:
        print("REFUSED", type(exc).__name__, str(exc)[:300], flush=True)
        sys.exit(3)
    """
)


def _env(**auth: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update({k: v for k, v in auth.items() if v is not None})
    paths = [str(ROOT / "worker_image"), str(ROOT / "operator"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["HOME"] = str(Path(env.get("TMPDIR", "/tmp")) / "no-ray-token-home")  # no ~/.ray/auth_token
    return env


def _client(address: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLIENT, address], env=env, capture_output=True, text=True, timeout=180
    )


def test_a_client_without_the_token_is_refused(ray_address: str) -> None:
    token = os.environ["RAY_AUTH_TOKEN"]  # the head's, held by this process while it runs
    # A refused client retries its connection for Ray's whole window (~20 s) before it gives up; the
    # refusal is the same after a few tries.
    brief = {"RAY_gcs_server_port_wait_time_s": "3"}
    stranger = _client(ray_address, _env(**brief))
    assert stranger.returncode != 0 and "JOINED" not in stranger.stdout, (
        stranger.stdout + stranger.stderr[-2000:]
    )
    wrong = _client(ray_address, _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64, **brief))
    assert wrong.returncode != 0 and "JOINED" not in wrong.stdout, wrong.stdout + wrong.stderr[-2000:]
    member = _client(ray_address, _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token))
    assert member.returncode == 0 and "JOINED 1" in member.stdout, member.stderr[-2000:]


def test_dverl_run_refuses_a_cluster_without_token_authentication(ray_address: str, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import chaos

    job = chaos.tiny_job(tmp_path, "noauth", 2, seed=1)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "decentralized_verl.cli",
            "run",
            str(job),
            "-o",
            str(tmp_path / "run"),
            "--ray",
            ray_address,
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "RAY_AUTH_MODE=token is not set" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()


READER = textwrap.dedent(
    """
    import sys, ray
    from decentralized_verl.launch.ray_actor import WorkerHost
    ray.init(address=sys.argv[1], namespace="dverl", log_to_driver=False)
    host = ray.remote(num_cpus=0)(WorkerHost).remote("probe", sys.argv[2])
    print("RESULT", ray.get(host.read.remote("summary.json")), flush=True)
    for name in (sys.argv[3], "../credentials/tls.key", "logs/../tls.key"):
        try:
            print("LEAK", ray.get(host.read.remote(name)), flush=True)
        except Exception as exc:
            print("REFUSED", "only the run's result files" in str(exc), flush=True)
    """
)


def test_the_jobs_actors_read_back_only_the_runs_results(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"steps": 2}')
    key = tmp_path / "credentials" / "tls.key"
    key.parent.mkdir()
    key.write_text("-----BEGIN PRIVATE KEY----- secret")
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=os.environ["RAY_AUTH_TOKEN"])
    result = subprocess.run(
        [sys.executable, "-c", READER, ray_address, str(run), str(key)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RESULT b'{\"steps\": 2}'" in result.stdout
    assert "LEAK" not in result.stdout and "secret" not in result.stdout
    assert result.stdout.count("REFUSED True") == 3
