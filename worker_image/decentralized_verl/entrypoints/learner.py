"""The learner process: rank 0 coordinates and serves Status/Weights; other ranks follow in lock-step.

Roles the plan gives workers of their own are reached over gRPC; roles with replicas 0 are built here,
in-process, behind the same client protocols (`orchestration.wiring`). The loop itself comes from
`orchestration.assemble.build_loop`. Rendezvous comes from the environment torchrun would set
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from decentralized_verl.core.final_report import write_final, write_verdict
from decentralized_verl.core.status import StatusBoard
from decentralized_verl.errors import EXIT_REFIT_PARITY, REFIT_PARITY_REASON
from decentralized_verl.orchestration.assemble import build_loop
from decentralized_verl.orchestration.coordinator import TrainingStopped
from decentralized_verl.orchestration.membership import follow_scaling
from decentralized_verl.orchestration.refit_check import RefitParityError
from decentralized_verl.orchestration.status_service import CoordinatorServicer
from decentralized_verl.orchestration.volunteering import join_volunteers
from decentralized_verl.orchestration.wiring import connect_roles
from decentralized_verl.serving.metrics_exporter import TrainingMetricsExporter
from decentralized_verl.serving.servicers import HealthServicer, serve
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spans.blocks import spec_parts
from decentralized_verl.spans.layout import even_layout
from decentralized_verl.spans.signed import bundle_metadata
from decentralized_verl.spec import JobSpec
from decentralized_verl.training import distributed, learner_group, rank0_weights
from decentralized_verl.training.checkpoints.root import checkpoint_root
from decentralized_verl.training.learner_group import LearnerGroup
from decentralized_verl.training.trainer import PolicyTrainer
from decentralized_verl.transport.weights.delta_publish import DeltaPublisher
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.service import WeightsServicer

log = logging.getLogger(__name__)
T = TypeVar("T")

STOPPED_EXIT = 128 + signal.SIGTERM
"""How a learner stopped by SIGTERM exits, after its checkpoint: as a process killed by it would, so
nothing mistakes the stop for the end of training."""


async def run_learner(
    spec: JobSpec,
    job: str,
    *,
    port: int,
    output: Path,
    base_dir: Path | None,
    resume: bool,
    settings: WorkerSettings,
    on: torch.device,
) -> int:
    rank = settings.rank
    world = settings.world_size or spec.roles.learner.replicas
    torch.manual_seed(spec.training.seed)
    sharded = spec.roles.learner.sharding == "fsdp"
    distributed.init_distributed(world, rank, sharded=sharded)
    meta = rank0_weights.uses_rank0_load(sharded, world)  # ranks > 0 never hold the whole model
    # A sharded model is put on the device by FSDP, shard by shard (CPU or meta -> fully_shard -> the
    # device); a whole one is loaded there.
    model, tokenizer = rank0_weights.load_for_rank(spec.model, rank=rank, meta=meta, on=on, sharded=sharded)

    def build() -> PolicyTrainer:
        return PolicyTrainer(model, spec, distributed=world > 1)

    trainer = rank0_weights.build_then_fill(model, rank=rank, build=build) if meta else build()
    if rank != 0:
        # A follower leaves when rank 0 releases it, after rank 0's last checkpoint (which needs every rank
        # of a sharded model): SIGTERM alone must not take it away first.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return await _follow(trainer, f"{job}-learner-{rank}", port, settings)
    group = LearnerGroup(trainer, world)
    return await _coordinate(
        spec,
        job,
        group,
        tokenizer,
        port=port,
        output=output,
        base_dir=base_dir,
        resume=resume,
        settings=settings,
    )


async def _follow(trainer: PolicyTrainer, worker_id: str, port: int, settings: WorkerSettings) -> int:
    """A follower rank serves Health on its port while it follows rank 0: what its pod's readiness probe
    dials, so a job of several learner ranks shows Running once every rank is in the group with its model
    (a rank serving nothing would never be Ready, and the job would look Pending while it trains)."""
    health = HealthServicer(role="learner", worker_id=worker_id, ready=True)
    server = await serve(port, health, host=settings.server_host())
    try:
        return await asyncio.to_thread(learner_group.follow, trainer)
    finally:
        await server.stop(grace=1.0)


async def _coordinate(
    spec: JobSpec,
    job: str,
    group: LearnerGroup,
    tokenizer,
    *,
    port: int,
    output: Path,
    base_dir: Path | None,
    resume: bool,
    settings: WorkerSettings,
) -> int:
    trainer = group.trainer
    model = trainer.model
    status = StatusBoard()
    # Native dtype on the wire keeps rollout and learner log-probs identical; bf16 models send bf16.
    # With volunteers, each version is also kept as a delta from the one before: a volunteer holding a
    # recent version pulls the changed bytes, not the model (transport/weights/delta_publish.py).
    publisher_type = DeltaPublisher if spec.volunteers.enabled else WeightPublisher
    publisher = publisher_type(
        dtype=None, is_adapter=spec.model.lora is not None, bundle_metadata=_span_manifests(spec)
    )
    health = HealthServicer(role="learner", worker_id=f"{job}-learner-0")
    server = await serve(
        port,
        CoordinatorServicer(status),
        WeightsServicer(publisher),
        health,
        host=settings.server_host(),
    )
    loop = exporter = None
    metrics_port = settings.metrics_port
    stop = asyncio.Event()
    # SIGTERM (eviction, preemption, `kubectl delete pod`): finish or drop the step in flight, checkpoint,
    # leave with STOPPED_EXIT so the operator restarts the gang with --resume.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        if metrics_port:
            exporter = TrainingMetricsExporter(metrics_port, job)
        start = group.restore(checkpoint_root(spec, output)) if resume else None
        connecting = connect_roles(
            spec,
            job,
            model,
            tokenizer,
            temperature=trainer.settings.temperature,
            publisher=publisher,
            start_version=start.policy_version if start else 0,
            addresses=settings.addresses,
            pools=settings.pools,
            vllm_eager=settings.vllm_eager,
            weights_source=group.weights,
        )
        try:
            # Waiting for the workers can take long; nothing is learned yet, so a stop needs no checkpoint.
            roles = await _unless_stopped(stop, connecting, start.step if start else 0)
        except TrainingStopped as stopped:
            log.warning("learner %s", stopped)
            return STOPPED_EXIT
        loop = await build_loop(
            spec,
            trainer,
            tokenizer,
            roles,
            job=job,
            output=output,
            base_dir=base_dir,
            status=status,
            resume=start,
            scatter=group.scatter if group.world > 1 else None,
            attach=(join_volunteers(publisher, output, settings), follow_scaling(settings)),
            checkpoint=True,
            save=group.save if group.sharded else None,
            on_step=exporter.observe if exporter is not None else None,
            stop=stop,
        )
        health.set_ready(True)
        try:
            summary = await loop.run()
        except TrainingStopped as stopped:
            log.warning("learner %s", stopped)
            return STOPPED_EXIT
        except RefitParityError as failed:
            log.error("%s", failed)  # the job's verdict, in the learner's log and `dverl run`'s error
            status.update(
                state="Failed",
                phase=f"refit parity: {failed}",
                failure=str(failed),
                failure_reason=REFIT_PARITY_REASON,
            )
            write_verdict(str(failed))  # the operator's Failed condition quotes it
            return EXIT_REFIT_PARITY
        if group.world > 1:
            summary["replica_digests"] = group.release()
            if len(set(summary["replica_digests"])) != 1:
                log.error("learner replicas diverged: %s", summary["replica_digests"])
        (output / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        log.info("summary: %s", summary)
        write_final(summary)  # the operator's last progress poll may come after this process is gone
        return 0
    finally:
        if dist.is_initialized():
            group.release()
        if loop is not None:
            await loop.close()
        if exporter is not None:
            exporter.close()
        await server.stop(grace=1.0)


async def _unless_stopped(stop: asyncio.Event, work: Awaitable[T], step: int) -> T:
    """`work`'s result, or TrainingStopped (at `step`, no new checkpoint) when `stop` is set first; the
    work is then cancelled."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise TrainingStopped(step, None)


def run(
    spec: JobSpec,
    job: str,
    *,
    port: int,
    output: Path,
    base_dir: Path | None,
    resume: bool,
    settings: WorkerSettings,
    on: torch.device,
) -> int:
    """Run this learner rank to the end; a rank of a distributed group leaves through `exit_process`."""
    code = 1
    try:
        code = asyncio.run(
            run_learner(
                spec,
                job,
                port=port,
                output=output,
                base_dir=base_dir,
                resume=resume,
                settings=settings,
                on=on,
            )
        )
    except BaseException:
        if not dist.is_initialized():
            raise
        log.exception("learner failed")
    if dist.is_initialized():
        distributed.exit_process(code)
    return code


def _span_manifests(spec: Any):
    """When the rollout is served as layer spans, each span's share is signed on publish."""
    if spec.roles.rollout.spans is None:
        return None

    layers = int(spec_parts(spec.model)[0].num_hidden_layers)
    return bundle_metadata(even_layout(layers, spec.roles.rollout.spans.count))
