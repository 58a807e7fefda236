"""`dverl run JOB.yaml`: validate, plan, start every worker locally, show progress, stop everything.

The learner (rank 0) drives training and writes metrics.jsonl, checkpoints and summary.json into the
output folder; this process only supervises: it polls the coordinator's Status RPC for the progress
bar, notices a dead worker, and on Ctrl-C or the end stops every process it started.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import yaml
from tqdm import tqdm

from decentralized_verl.core.status import JobStatus
from decentralized_verl.errors import EXIT_USAGE as EXIT_REFUSED_INPUT
from decentralized_verl.errors import ManifestError, OperationFailed, WireError
from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.launch.preflight import preflight_problems
from decentralized_verl.launch.watchdog import ProgressClock
from decentralized_verl.planning.fitting_job import load_fitting_job
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.proto import dverl_pb2, dverl_pb2_grpc
from decentralized_verl.reporting.metrics import read_evals, read_metrics
from decentralized_verl.reporting.progress import eta_seconds, progress_line
from decentralized_verl.reporting.stats import difference_interval
from decentralized_verl.runtime.orphans import guard_descendants
from decentralized_verl.security.credentials import CallerCredentials, run_folder_credentials
from decentralized_verl.security.handed import make_undumpable
from decentralized_verl.sources.fetch import Endpoints, fetch
from decentralized_verl.sources.local import Fetcher, env_cache, localized
from decentralized_verl.spec import with_defaults
from decentralized_verl.spec.manifest import load_job
from decentralized_verl.spec.sources import SourceSpec
from decentralized_verl.transport import secure
from decentralized_verl.transport.wire.status import job_status_from_proto

log = logging.getLogger(__name__)


class RunFailed(OperationFailed):
    pass


def absolute_paths(spec: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative file paths in a manifest mean "next to the manifest"; workers get them absolute."""

    def fix(section: dict[str, Any] | None, key: str) -> None:
        if section and isinstance(section.get(key), str) and not Path(section[key]).is_absolute():
            candidate = base / section[key]
            # A model "path" that is not next to the manifest may be relative to the cwd; keep it then.
            if key != "path" or candidate.exists():
                section[key] = str(candidate.resolve())

    data = spec.get("data", {})
    fix(data, "train")
    fix(data, "eval")
    fix(spec.get("model"), "path")
    fix(data.get("rewardModel"), "path")
    for role in (spec.get("roles") or {}).values():
        if isinstance(role, dict):
            fix(role.get("model"), "path")
    return spec


def fetch_into_cache(source: SourceSpec, folder: Path) -> Path:
    """A URI source, downloaded once into the local cache (its digest checked), for `dverl run`."""
    assert source.uri is not None
    return fetch(source.uri.url, folder, source.uri.sha256, Endpoints.from_env(os.environ))


def write_config(
    job,
    manifest: Path,
    output: Path,
    *,
    fetcher: Fetcher | None = fetch_into_cache,
    cache: Path | None = None,
) -> Path:
    """The job as workers read it: full spec with defaults, pod paths under a source mapped to the folder
    standing in for it here (a URI source fetched into `cache`), relative paths made absolute."""
    output.mkdir(parents=True, exist_ok=True)
    base = manifest.parent.resolve()
    spec = localized(job.spec, with_defaults(job.spec), base, fetcher=fetcher, cache=cache or env_cache())
    document = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {
            "name": job.metadata.name,
            "annotations": {"dverl.io/base-dir": str(manifest.parent.resolve())},
        },
        "spec": absolute_paths(spec, base),
    }
    path = output / "job.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def coordinator_status(address: str, credentials: CallerCredentials | None = None) -> JobStatus | None:
    """The learner's progress from its Status RPC, validated like every message; None while it cannot
    answer (starting, restarting) or when its reply is malformed."""
    try:
        with secure.sync_channel(address, credentials) as channel:
            reply = dverl_pb2_grpc.CoordinatorStub(channel).Status(dverl_pb2.StatusRequest(), timeout=2)
        return job_status_from_proto(reply)
    except grpc.RpcError:
        return None
    except WireError as exc:
        log.warning("bad Status reply from %s: %s", address, exc)
        return None


def run_job(
    manifest: str | Path,
    output: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    timeout: float | None = None,
    lines: bool = False,
    ray: str | None = None,
) -> dict[str, Any]:
    """Run a job to the end on this machine (or, with `ray`, as actors of the Ray cluster at that address
    or `auto`); returns the summary the learner wrote. `progress` shows a bar (for a terminal); `lines`
    prints one plain line per step on stderr instead (for a pipe or CI)."""
    manifest = Path(manifest)
    job = load_fitting_job(manifest)
    output = Path(output) if output else Path("runs") / job.metadata.name
    config = _prepare_run_folder(job, manifest, output)
    plan = plan_job(job.spec, job.metadata.name)
    guard_descendants()  # a `kill -9` of this process must not leave workers or their helpers running
    cluster, credentials = _cluster_for(job, plan, config, output, resume=resume, ray=ray)
    observer = credentials.for_role("observer")  # Status and Ready only
    status_credentials = CallerCredentials(observer.ca, observer.token)
    learners = cluster.by_role("learner")
    learner = learners[0]
    gang = _LearnerGang(learners, cluster, job.spec)
    display = _ProgressDisplay(cluster, job, bar=progress, lines=lines and not progress)
    with _sigterm_as_interrupt():
        try:
            cluster.start()
            gang.started(time.monotonic())
            display.open()
            started = time.monotonic()
            while learner.process.poll() != 0:
                now = time.monotonic()
                status = coordinator_status(learner.address, status_credentials)
                gang.check(status, now)
                _restart_dead_servers(cluster, job.spec)
                if timeout is not None and now - started > timeout:
                    raise RunFailed(f"run exceeded {timeout:.0f} s; see {output / 'logs'}")
                display.show(status, now)
                time.sleep(0.5)
        finally:
            display.close()
            if hasattr(cluster, "fetch_results"):
                cluster.fetch_results()
            cluster.stop()
    display.catch_up(output / "metrics.jsonl")  # the last steps may end between two polls of the learner
    return _final_summary(output, cluster, gang.restarts)


def _prepare_run_folder(job, manifest: Path, output: Path) -> Path:
    """Write the job as workers will read it into `output` and check it there, before anything starts:
    paths under a source are mapped to the folders standing in for them here, so a missing file is
    refused now, naming the field, rather than by a worker minutes later. A summary left by an earlier
    run is removed so that only this run's learner can produce one."""
    config = write_config(job, manifest, output)
    problems = preflight_problems(load_job(config).spec, manifest.resolve().parent)
    if problems:
        raise ManifestError(problems, str(manifest))
    (output / "summary.json").unlink(missing_ok=True)
    return config


def _cluster_for(job, plan, config: Path, output: Path, *, resume: bool, ray: str | None) -> tuple[Any, Any]:
    """The workers of `plan`, not yet started, as local processes or Ray actors, with the credentials
    they share. The secured path, as in a cluster: TLS and the job token on every call, signed weights."""
    extra_args = {"learner": ["--resume"]} if resume else {}
    make_undumpable()  # this process holds every role's secrets: no neighbour reads its memory
    if ray is not None:
        from decentralized_verl.launch.ray_executor import RayCluster, node_addresses  # noqa: PLC0415 optional: ray (the ray extra), for `--ray` only

        # The servers listen on the Ray nodes' addresses, so the certificate names each of them.
        credentials = run_folder_credentials(output, job.metadata.name, hosts=node_addresses(ray))
        cluster = RayCluster(plan, config, output, ray, extra_args=extra_args, credentials=credentials)
        return cluster, credentials
    credentials = run_folder_credentials(output, job.metadata.name)
    cluster = LocalCluster(
        plan,
        config,
        output,
        extra_args=extra_args,
        credentials=credentials,
        overlapped=job.spec.training.max_staleness > 0,  # asynchronous rollouts overlap the update
    )
    return cluster, credentials


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops a run as Ctrl-C does, so the workers are stopped and results fetched either way."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _LearnerGang:
    """Supervises the learner gang as the operator does: a rank that dies or stops making progress
    restarts the whole gang from its newest checkpoint, up to backoffLimit, unless its failurePolicy
    is failJob or it refused its input (a restart would read the same and fail the same way)."""

    def __init__(self, learners: list, cluster: Any, spec: Any) -> None:
        self.learners = learners
        self.cluster = cluster
        self.spec = spec
        self.clock = ProgressClock(spec.training.stall_factor)
        self.restarts = 0
        self.answered = False  # the learner has served Status since it last started

    def started(self, now: float) -> None:
        self.clock.restarted(now)
        self.answered = False

    def check(self, status: JobStatus | None, now: float) -> None:
        """Restart the gang if it is down; raise RunFailed when a restart is not allowed or cannot help."""
        learner = self.learners[0]
        self.answered = self.answered or status is not None
        self.clock.observe(status.step if status is not None else None, now)
        why = _learner_down(self.learners, self.clock, now)
        if why is None:
            return
        if self.spec.roles.failure_policy("learner") == "failJob":
            raise RunFailed(f"learner {why} and roles.learner.failurePolicy is failJob")
        if not self.answered and learner.process.poll() == EXIT_REFUSED_INPUT:
            # It refused what it starts from (checkpoints that do not check out, a manifest): a
            # restart would read the same and fail the same way.
            raise RunFailed(
                f"learner {why} before it started training: it refused its input, and a restart would "
                f"read the same; last lines of {learner.log_path}:\n{learner.log_tail()}"
            )
        if self.restarts >= self.spec.backoff_limit:
            raise RunFailed(
                f"learner {why}; restarted {self.restarts} times already (backoffLimit "
                f"{self.spec.backoff_limit}); last lines of {learner.log_path}:\n{learner.log_tail()}"
            )
        self.restarts += 1
        log.warning("learner %s; restarting it from its newest checkpoint", why)
        self.cluster.restart_gang("learner", extra_args=["--resume"])
        self.started(time.monotonic())


def _restart_dead_servers(cluster: Any, spec: Any) -> None:
    """A serving worker that dies is started again (alone, or its whole role under restartRole), up to
    backoffLimit; meanwhile the coordinator re-dispatches its work to the others and holds it out until
    it is ready. The learner gang is supervised apart (`_LearnerGang`)."""
    for dead in cluster.failed():
        if dead.worker.role == "learner":
            continue
        if dead.restarts >= spec.backoff_limit:
            raise RunFailed(
                f"worker {dead.worker.name} exited with code {dead.process.returncode} "
                f"{dead.restarts + 1} times (backoffLimit {spec.backoff_limit}); "
                f"last lines of {dead.log_path}:\n{dead.log_tail()}"
            )
        policy = spec.roles.failure_policy(dead.worker.role)
        if policy == "failJob":
            raise RunFailed(
                f"worker {dead.worker.name} exited with code {dead.process.returncode} and "
                f"roles.{dead.worker.role}.failurePolicy is failJob; last lines of {dead.log_path}:\n"
                f"{dead.log_tail()}"
            )
        log.warning(
            "worker %s exited with code %s; restarting %s",
            dead.worker.name,
            dead.process.returncode,
            f"every {dead.worker.role} worker" if policy == "restartRole" else "it",
        )
        if policy == "restartRole":
            cluster.restart_gang(dead.worker.role)
        else:
            cluster.restart(dead.worker.name)


class _ProgressDisplay:
    """Where the learner's progress goes on each poll: a bar on a terminal, one line per step in a
    pipe, and the Ray cluster's dashboard when the run has one."""

    def __init__(self, cluster: Any, job: Any, *, bar: bool, lines: bool) -> None:
        self.cluster = cluster
        self.job = job
        self.want_bar = bar
        self.bar: Any = None
        self.printer = StepLines() if lines else None

    def open(self) -> None:
        if self.want_bar:
            self.bar = tqdm(
                total=self.job.spec.training.steps or 0,
                desc=self.job.metadata.name,
                unit="step",
                dynamic_ncols=True,
            )

    def show(self, status: JobStatus | None, now: float) -> None:
        if status is None:
            return
        if self.bar is not None:
            _show(self.bar, status)
        if self.printer is not None:
            self.printer.show(status, now)
        if hasattr(self.cluster, "publish"):
            self.cluster.publish(step=status.step, total_steps=status.total_steps, phase=status.phase)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def catch_up(self, metrics: Path) -> None:
        if self.printer is not None:
            self.printer.catch_up(metrics)


def _final_summary(output: Path, cluster: Any, learner_restarts: int) -> dict[str, Any]:
    """The learner's summary.json completed with what only the supervisor knows (how often each worker
    was restarted) and with rewards and evaluations read over every learner incarnation, written back
    so the folder holds the same report the caller gets."""
    summary_path = output / "summary.json"
    if not summary_path.exists():
        raise RunFailed(f"learner finished without writing {summary_path}")
    summary = json.loads(summary_path.read_text())
    summary["learner_restarts"] = learner_restarts
    summary["worker_restarts"] = {
        lw.worker.name: lw.restarts for lw in cluster.workers.values() if lw.restarts
    }
    summary.update(_reward_window(output / "metrics.jsonl") or {})
    summary.update(_eval_ends(output / "eval.jsonl") or {})
    summary_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _learner_down(learners: list, clock: ProgressClock, now: float) -> str | None:
    """Why the learner gang must restart (a rank died, or it stopped making progress), or None."""
    for rank in learners:
        code = rank.process.poll() if rank.process is not None else None
        if code not in (None, 0):
            return f"{rank.worker.name} exited with code {code}"
    if clock.stalled(now):
        return f"made no progress for {now - clock.last_change:.0f}s"
    return None


class StepLines:
    """Prints the learner's progress as one line per finished step on stderr (no bar in a pipe)."""

    def __init__(self) -> None:
        self.printed = 0
        self.pace_from: tuple[int, float] | None = None
        self.accuracy: float | None = None
        self.total = 0

    def show(self, status: JobStatus, now: float) -> None:
        if not status.reported or status.step <= self.printed:
            return
        self.total = status.total_steps
        if self.pace_from is None or status.step < self.pace_from[0]:
            self.pace_from = (status.step, now)  # its first step's time is unknown: pace from here
        first, since = self.pace_from
        accuracy = status.eval_accuracy if status.eval_accuracy != self.accuracy else None
        self.accuracy = status.eval_accuracy
        eta = eta_seconds(status.step, status.total_steps, now - since, first)
        line = progress_line(
            status.step, status.total_steps, status.reward_mean, status.tokens_per_second, eta, accuracy
        )
        print(line, file=sys.stderr, flush=True)
        self.printed = status.step

    def catch_up(self, metrics: Path) -> None:
        """Print the steps the learner finished after the last poll, from its metrics file."""
        for record in read_metrics(metrics):
            if int(record.get("step", 0)) > self.printed:
                status = JobStatus(
                    step=int(record["step"]),
                    total_steps=self.total or int(record["step"]),
                    reward_mean=float(record.get("reward_mean") or 0.0),
                    tokens_per_second=float(record.get("tokens_per_second") or 0.0),
                    eval_accuracy=record.get("eval_accuracy", self.accuracy),
                )
                self.show(status, time.monotonic())


def _show(bar: Any, status: JobStatus) -> None:
    if status.total_steps and bar.total != status.total_steps:
        bar.total = status.total_steps
    bar.n = status.step
    bar.set_postfix(
        phase=status.phase,
        reward=f"{status.reward_mean:.3f}",
        kl=f"{status.kl:.4f}",
        tok_s=f"{status.tokens_per_second:.0f}",
        refresh=False,
    )
    bar.refresh()


def _reward_window(metrics: Path) -> dict[str, float] | None:
    """First and last rewards over the whole run (every learner incarnation), as the summary states them."""
    rewards = [float(r["reward_mean"]) for r in read_metrics(metrics) if r.get("reward_mean") is not None]
    if not rewards:
        return None
    window = max(1, min(5, len(rewards) // 3 or 1))
    return {
        "reward_first": sum(rewards[:window]) / window,
        "reward_last": sum(rewards[-window:]) / window,
    }


def _eval_ends(evals: Path) -> dict[str, Any] | None:
    """The first evaluation (before training, even if the learner restarted since) and the last one."""
    rows = read_evals(evals)
    if not rows:
        return None
    first, last = rows[0], rows[-1]
    ends = {
        "eval_accuracy_before": first["eval_accuracy"],
        "eval_interval_before": [first["eval_accuracy_low"], first["eval_accuracy_high"]],
        "eval_accuracy_after": last["eval_accuracy"],
        "eval_interval_after": [last["eval_accuracy_low"], last["eval_accuracy_high"]],
        "eval_problems": last["eval_problems"],
    }
    if len(rows) > 1:
        counts = [(round(r["eval_accuracy"] * r["eval_problems"]), r["eval_problems"]) for r in (first, last)]
        ends["eval_gain"] = last["eval_accuracy"] - first["eval_accuracy"]
        ends["eval_gain_interval"] = list(difference_interval(*counts))
    return ends


def format_summary(summary: dict[str, Any], output: Path) -> str:
    def pct(value: float | None, interval: list[float] | None = None) -> str:
        if value is None:
            return "n/a"
        if not interval:
            return f"{100 * value:.1f}%"
        return f"{100 * value:.1f}% [{100 * interval[0]:.1f}-{100 * interval[1]:.1f}]"

    problems = (
        f" on {summary['eval_problems']} problems, 95% intervals" if summary.get("eval_problems") else ""
    )
    if summary.get("eval_gain_interval"):
        low, high = summary["eval_gain_interval"]
        problems += f"; gain {100 * summary['eval_gain']:+.1f} points [{100 * low:+.1f}, {100 * high:+.1f}]"
    return (
        f"done: {summary['steps']} steps in {summary['seconds']:.0f} s; "
        f"reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}; "
        f"eval accuracy {pct(summary.get('eval_accuracy_before'), summary.get('eval_interval_before'))} -> "
        f"{pct(summary.get('eval_accuracy_after'), summary.get('eval_interval_after'))}{problems}\n"
        f"metrics: {output / 'metrics.jsonl'}  (plot: dverl plot {output})"
        + (f"\ncheckpoint: {summary['last_checkpoint']}" if summary.get("last_checkpoint") else "")
    )


def main_run(manifest: str, output: str | None, resume: bool, ray: str | None = None) -> int:
    out = Path(output) if output else None
    job_name = load_job(manifest).metadata.name
    out = out or Path("runs") / job_name
    terminal = sys.stderr.isatty()
    summary = run_job(manifest, out, resume=resume, progress=terminal, lines=not terminal, ray=ray)
    print(format_summary(summary, out))
    return 0
