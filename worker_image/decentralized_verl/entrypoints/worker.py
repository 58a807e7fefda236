"""`dverl worker`: one entry for every process that serves a role of a job.

Which kind of worker a command line asks for is one pure decision (`worker_args.worker_kind`); each
kind then has its own module, imported only by a process of that kind:
- `--config JOB` (a pod, `dverl run`): an in-cluster role or the learner (cluster_worker.py);
- `--initial-peers MADDR --job NAME --token T`: a token-checked volunteer (volunteer.py);
- `--initial-peers MADDR --model PATH` without a token: the open quick-start worker (open_volunteer.py);
- `--initial-peers MADDR --role learner --model PATH --data FILE`: a volunteer learner that averages
  gradients over the DHT (volunteer_learner.py).
"""

from __future__ import annotations

from pathlib import Path

from decentralized_verl.core.final_report import TERMINATION_LOG
from decentralized_verl.core.memory_report import clear_estimate, clear_on_sigterm
from decentralized_verl.entrypoints.worker_args import WorkerArgs, worker_kind
from decentralized_verl.entrypoints.worker_config import leave_memory_estimate, load_worker_config
from decentralized_verl.settings import WorkerSettings


def volunteer_device(args: WorkerArgs, settings: WorkerSettings) -> None:
    """A volunteer's device, chosen before anything touches CUDA: the GPU it has (it was given its whole
    machine), unless `--device` or DVERL_DEVICE says otherwise."""
    from decentralized_verl.runtime import device  # noqa: PLC0415 light: torch, loaded only once a volunteer needs it

    override, field = (
        (args.device, "--device") if args.device else (settings.device or "auto", "DVERL_DEVICE")
    )
    device.enter(
        override=override,
        gpus=device.gpu_count(),
        visible=settings.visible_devices,
        local_rank=settings.local_rank,
        field=field,
    )


def main_worker(args: WorkerArgs) -> int:
    kind = worker_kind(args)
    settings = WorkerSettings.from_env()  # the worker process's entry: read once, passed down from here
    if kind == "cluster":
        return _job_worker(args, settings)
    from decentralized_verl.runtime.cpus import configure_from_environment  # noqa: PLC0415 light: torch, loaded after the memory estimate is left

    configure_from_environment(settings)
    volunteer_device(args, settings)
    reach = {
        "initial_peers": tuple(args.initial_peers),
        "port": args.p2p_port,
        "host_maddrs": tuple(args.host_maddrs),
        "announce_maddrs": tuple(args.announce_maddrs),
        "client_mode": args.client_mode,
    }
    relays = {"use_relay": not args.no_relay, "use_auto_relay": args.use_auto_relay}
    if kind == "volunteer-learner":
        from decentralized_verl.entrypoints.volunteer_learner import LearnerOptions, main_learner  # noqa: PLC0415 entry: a volunteer learner's process

        return main_learner(
            LearnerOptions(
                model=args.model,
                data=args.data,
                job=args.job or "quickstart",
                peers=args.peers,
                steps=args.steps,
                shard=args.shard,
                num_shards=args.num_shards,
                batch_size=args.batch_size,
                learning_rate=args.learning_rate,
                digest_out=args.digest_out,
                **reach,
            )
        )
    if kind == "open-volunteer":
        from decentralized_verl.entrypoints.open_volunteer import OpenWorkerOptions, main_open_worker  # noqa: PLC0415 entry: an open volunteer's process

        return main_open_worker(
            OpenWorkerOptions(
                model=args.model, role=args.role, job=args.job or "quickstart", **reach, **relays
            )
        )
    if kind == "volunteer":
        from decentralized_verl.entrypoints.volunteer import VolunteerOptions, main_volunteer  # noqa: PLC0415 entry: a volunteer's process

        return main_volunteer(
            VolunteerOptions(
                job=args.job,
                token=args.token,
                role=args.role,
                model=args.model,
                layers=args.layers,
                vllm_eager=settings.vllm_eager,
                **reach,
                **relays,
            )
        )
    raise AssertionError(f"unhandled worker kind {kind!r}")


def _job_worker(args: WorkerArgs, settings: WorkerSettings, termination_log: Path = TERMINATION_LOG) -> int:
    """A job's worker (a pod, `dverl run`): its config read and its memory estimate left as the
    termination message before torch loads, so a kill for memory at any point after names the planner's
    figure; any other end clears the estimate (core/memory_report.py). It chooses its device once it has
    read its role's resources (cluster_worker.worker_device)."""
    config = load_worker_config(Path(args.config), args.job)
    try:
        if leave_memory_estimate(config[0], args.role, args.index, config[2], termination_log):
            clear_on_sigterm(termination_log)
        from decentralized_verl.runtime.cpus import configure_from_environment  # noqa: PLC0415 light: torch, loaded after the memory estimate is left

        configure_from_environment(settings)
        from decentralized_verl.entrypoints.cluster_worker import main_cluster_worker  # noqa: PLC0415 entry: a job's worker process

        return main_cluster_worker(
            config,
            args.role,
            args.index,
            args.port,
            args.output,
            args.resume,
            settings=settings,
            device_flag=args.device,
        )
    finally:
        clear_estimate(termination_log)
