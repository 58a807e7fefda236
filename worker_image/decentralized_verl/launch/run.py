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

from decentralized_verl.core.status import JobStatus
from decentralized_verl.errors import EXIT_REFIT_PARITY, DverlError, ManifestError, OperationFailed, WireError
from decentralized_verl.errors import EXIT_USAGE as EXIT_REFUSED_INPUT
from decentralized_verl.launch.local import LocalCluster
from decentralized_verl.launch.preflight import preflight_problems
from decentralized_verl.launch.progress_display import ProgressDisplay
from decentralized_verl.launch.run_folder import check_run_folder, clear_run_folder
from decentralized_verl.launch.run_record import FAILED, FINISHED, INTERRUPTED, end_record, start_record
from decentralized_verl.launch.run_summary import eval_ends, format_summary, reward_window
from decentralized_verl.launch.volunteer_invite import VolunteerInvite, refuse_without_secret
from decentralized_verl.launch.watchdog import ProgressClock
from decentralized_verl.planning.fitting_job import load_fitting_job
from decentralized_verl.planning.layout import Layout, Machine, lay_out, machine_job
from decentralized_verl.proto import dverl_pb2, dverl_pb2_grpc
from decentralized_verl.runtime.orphans import guard_descendants
from decentralized_verl.security.credentials import CallerCredentials, run_folder_credentials
from decentralized_verl.security.handed import make_undumpable
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.sources.fetch import Endpoints, fetch
from decentralized_verl.sources.local import Fetcher, env_cache, localized
from decentralized_verl.spec import with_defaults
from decentralized_verl.spec.manifest import load_job
from decentralized_verl.spec.sources import SourceSpec
from decentralized_verl.training.checkpoints.root import checkpoint_root
from decentralized_verl.transport import secure
from decentralized_verl.transport.wire.status import job_status_from_proto

log = logging.getLogger(__name__)


class RunFailed(OperationFailed):
    pass


class RunRefused(DverlError):
    """The learner refused its input (exit 2) and a restart would read the same: `dverl run` exits 2."""


def _error_line(log_tail: str) -> str | None:
    """The error a `dverl` process printed last (`error: ...`) in its log, without the prefix."""
    said = [line for line in log_tail.splitlines() if line.startswith("error: ")]
    return said[-1].removeprefix("error: ") if said else None


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
    return fetch(
        source.uri.url,
        folder,
        source.uri.sha256,
        Endpoints.from_env(os.environ),
        insecure_skip_digest=source.uri.insecure_skip_digest,
    )


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
    overwrite: bool = False,
    log_every: int = 1,
) -> dict[str, Any]:
    """Run a job to the end on this machine (or, with `ray`, as actors of the Ray cluster at that address
    or `auto`); returns the summary the learner wrote. `progress` shows a bar (for a terminal); `lines`
    prints one plain line per step (every `log_every`-th) on stderr instead (for a pipe or CI). A folder
    holding an earlier run is refused unless `resume` continues it or `overwrite` deletes it first."""
    manifest = Path(manifest)
    job = load_fitting_job(manifest)
    output = Path(output) if output else Path("runs") / job.metadata.name
    machine = this_machine() if ray is None else Machine(0)  # Ray places its actors on its own nodes
    spec, plan, colocated = machine_job(job.spec, job.metadata.name, machine)
    job = job.model_copy(update={"spec": spec})
    layout = lay_out(spec, plan, machine, colocated=colocated)
    for line in (*layout.notes, *layout.problems):
        log.info("layout on %s: %s", machine.words(), line)
    checkpoints = checkpoint_root(job.spec, output)
    check_run_folder(
        output,
        resume=resume,
        overwrite=overwrite,
        total_steps=job.spec.training.steps,
        checkpoints=checkpoints,
    )
    settings = WorkerSettings.from_env()
    if ray is None:
        refuse_without_secret(job.spec, manifest, settings)
    if overwrite:
        clear_run_folder(output, checkpoints)
    config = _prepare_run_folder(job, manifest, output)
    start_record(output)  # `dverl status` tells this run's end from its processes being gone
    try:
        summary = _supervise(
            job,
            plan,
            layout,
            config,
            output,
            resume=resume,
            ray=ray,
            timeout=timeout,
            bar=progress,
            lines=lines,
            log_every=log_every,
            secret_file=settings.join_secret_file,
        )
    except KeyboardInterrupt:
        end_record(output, INTERRUPTED, "stopped by Ctrl-C or SIGTERM")
        raise
    except BaseException as exc:
        end_record(output, FAILED, str(exc) or type(exc).__name__)
        raise
    end_record(output, FINISHED)
    return summary


def _supervise(
    job,
    plan,
    layout: Layout,
    config: Path,
    output: Path,
    *,
    resume: bool,
    ray: str | None,
    timeout: float | None,
    bar: bool,
    lines: bool,
    log_every: int = 1,
    secret_file: str | None = None,
) -> dict[str, Any]:
    """Start the job's workers as `plan` and `layout` say, watch them to the end (restarting what the job
    allows), stop them."""
    guard_descendants()  # a `kill -9` of this process must not leave workers or their helpers running
    cluster, credentials = _cluster_for(job, plan, config, output, resume=resume, ray=ray, layout=layout)
    observer = credentials.for_role("observer")  # Status and Ready only
    status_credentials = CallerCredentials(observer.ca, observer.token)
    learners = cluster.by_role("learner")
    learner = learners[0]
    gang = _LearnerGang(learners, cluster, job.spec)
    display = ProgressDisplay(cluster, job, output, bar=bar, lines=lines and not bar, every=log_every)
    dht = cluster.by_role("dht")
    invite = VolunteerInvite(
        job.metadata.name, getattr(dht[0], "log_path", None) if dht else None, secret_file
    )
    with _sigterm_as_interrupt():
        try:
            cluster.start()
            gang.started(time.monotonic())
            display.open(len(cluster.workers), time.monotonic())
            started = time.monotonic()
            while learner.process.poll() != 0:
                now = time.monotonic()
                status = coordinator_status(learner.address, status_credentials)
                gang.check(status, now)
                _restart_dead_servers(cluster, job.spec)
                if timeout is not None and now - started > timeout:
                    raise RunFailed(f"run exceeded {timeout:.0f} s; see {output / 'logs'}")
                display.show(status, now)
                if (said := invite.line()) is not None:
                    display.say(said)
                time.sleep(0.5)
        finally:
            display.close()
            if hasattr(cluster, "fetch_results"):
                cluster.fetch_results()
            cluster.stop()
    display.catch_up()  # the last steps may end between two polls of the learner
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


def this_machine() -> Machine:
    """This machine's GPUs, as the layout reads them (torch is loaded only now: the supervisor stays light
    until it starts a job)."""
    from decentralized_verl.runtime import device  # noqa: PLC0415 light: torch, kept off the supervisor's import path

    return Machine(device.gpu_count(), device.gpu_memory_bytes())


def _cluster_for(
    job, plan, config: Path, output: Path, *, resume: bool, ray: str | None, layout: Layout | None = None
) -> tuple[Any, Any]:
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
        worker_env={p.name: p.env() for p in layout.placed} if layout is not None else None,
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
        if learner.process.poll() == EXIT_REFUSED_INPUT:
            # It refused its input (checkpoints that do not check out, a manifest, a reward that fails
            # on every sample): a restart would read the same and fail the same way.
            when = "before it started training" if not self.answered else "during training"
            raise RunRefused(
                f"learner {why} {when}: {_error_line(learner.log_tail(200)) or 'it refused its input'}; "
                f"a restart would read the same, so the run stops; last lines of {learner.log_path}:\n"
                f"{learner.log_tail()}"
            )
        if learner.process.poll() == EXIT_REFIT_PARITY:  # a restart would refresh the same way
            raise RunFailed(f"learner {why}: a weight refresh failed its parity check; {_verdict(learner)}")
        if self.restarts >= self.spec.backoff_limit:
            raise RunFailed(
                f"learner {why}; restarted {self.restarts} times already (backoffLimit "
                f"{self.spec.backoff_limit}); last lines of {learner.log_path}:\n{learner.log_tail()}"
            )
        self.restarts += 1
        log.warning("learner %s; restarting it from its newest checkpoint", why)
        self.cluster.restart_gang("learner", extra_args=["--resume"])
        self.started(time.monotonic())


def _verdict(learner: Any) -> str:
    """The learner log's refit-parity line (what failed, naming the workers and the version), else its
    last lines."""
    tail = learner.log_tail(200)
    found = [line for line in tail.splitlines() if "refit parity failed" in line]
    return found[-1].split("ERROR ", 1)[-1] if found else f"last lines of {learner.log_path}:\n{tail}"


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
    summary.update(reward_window(output / "metrics.jsonl") or {})
    summary.update(eval_ends(output / "eval.jsonl") or {})
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


def main_run(
    manifest: str,
    output: str | None,
    resume: bool,
    ray: str | None = None,
    overwrite: bool = False,
    log_every: int = 1,
) -> int:
    out = Path(output) if output else None
    job_name = load_job(manifest).metadata.name
    out = out or Path("runs") / job_name
    terminal = sys.stderr.isatty()
    summary = run_job(
        manifest,
        out,
        resume=resume,
        progress=terminal,
        lines=not terminal,
        ray=ray,
        overwrite=overwrite,
        log_every=log_every,
    )
    print(format_summary(summary, out))
    return 0
