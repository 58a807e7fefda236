"""`dverl worker --config JOB --role ROLE`: one in-cluster process of a job (a pod, or under `dverl run`).

Given the job config (the ConfigMap's job.yaml or `dverl run`'s copy, read by worker_config.py before
torch loaded), builds the role and serves it over gRPC until SIGTERM. The learner role runs the training
loop instead (entrypoints/learner.py).

A rollout worker also serves a weight relay (`transport.weights.relay.WeightRelay`) on the same port: the
learner pushes each new version down a chain of rollout workers, each verifying and forwarding it, and
a worker the push missed pulls from the learner (DVERL_LEARNER_ADDR) when it needs the version.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from decentralized_verl.backends.factory import make_backend
from decentralized_verl.backends.sleep import sleeps_while_learner_updates
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.planning.plan import worker_resources
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.runtime import device
from decentralized_verl.runtime.lifecycle import CALL_GRACE_S, serve_until_stopped
from decentralized_verl.serving import scoring, servicers
from decentralized_verl.serving.critic_state import PersistentCritic
from decentralized_verl.serving.rollout import RolloutWorker
from decentralized_verl.serving.sharded_critic import serve_sharded_critic
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spans.backend import SpanBackend, parse_span_addresses
from decentralized_verl.spans.front_volunteers import start_front_volunteers
from decentralized_verl.spans.server import serve_span_role
from decentralized_verl.spec import JobSpec
from decentralized_verl.training.distributed import exit_process
from decentralized_verl.transport.weights.fanout import RelayWeightSource
from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.relay import WeightRelay, serve_relay

log = logging.getLogger(__name__)


async def serve_role(
    spec: JobSpec,
    job: str,
    role: str,
    index: int,
    port: int,
    base_dir: Path,
    output: Path | None = None,
    *,
    settings: WorkerSettings,
    on: torch.device | None = None,
) -> int:
    """Serve one role's worker until stopped, its model on `on` (the device its entry chose)."""
    on = on if on is not None else device.process_device()
    worker_id = f"{job}-{role}-{index}"
    if role == "span":
        return await serve_span_role(spec, job, index, port, settings.server_host())
    if role == "rollout" and spec.roles.rollout.spans is not None:
        servers = parse_span_addresses(settings.span_addrs or "")
        checks = {"check_fraction": spec.volunteers.verify_fraction}  # of span volunteers' hops
        backend = SpanBackend.from_spec(
            spec.model, len(servers), servers, seed=spec.training.seed + index, chain_options=checks
        )
    elif role == "rollout":
        model, tokenizer = load_model_and_tokenizer(spec.model, device=on)
        backend = make_backend(
            spec.roles.rollout.backend_kind,
            model,
            tokenizer,
            gpus=worker_resources(spec.roles.rollout, index).gpus,  # what this worker's pod was given
            eager=settings.vllm_eager,
            memory_fraction=settings.gpu_memory_fraction,  # the plan's share of a GPU it shares
            sleep_while_idle=sleeps_while_learner_updates(  # the one-GPU layout: room for the update
                spec.roles.rollout.backend_kind, str(on), settings.gpu_shared_with_learner
            ),
            seed=spec.training.seed + index,
        )
    if role == "rollout":
        span_volunteers = await _take_span_volunteers(backend, spec, job, index, settings)
        try:
            return await serve_rollout(
                RolloutWorker(
                    backend,
                    worker_id,
                    backend_name=spec.roles.rollout.backend,
                    environment=spec.data.environment,
                    partial_every_s=settings.partial_every_s,
                ),
                port,
                learner=settings.learner_addr,
                host=settings.server_host(),
            )
        finally:
            if span_volunteers is not None:
                await span_volunteers()
    if role == "reference":
        handler = servicers.ReferenceServicer(
            scoring.ReferenceWorker.from_spec(spec, device=on, worker_id=worker_id)
        )
    elif role == "critic" and spec.roles.critic is not None and spec.roles.critic.sharding == "fsdp":
        return await serve_sharded_critic(spec, worker_id, port, settings, output)
    elif role == "critic":
        critic = scoring.CriticWorker.from_spec(spec, device=on, worker_id=worker_id)
        if output is not None:  # a restarted critic continues from what it had learned
            critic = PersistentCritic(critic, output / worker_id)
        handler = servicers.CriticServicer(critic)
    elif role == "reward":
        handler = servicers.RewardServicer(scoring.RewardWorker.from_spec(spec, device=on))
    else:
        raise ValueError(f"unknown role {role!r}")
    health = servicers.HealthServicer(role=role, worker_id=worker_id, ready=True)
    server = await servicers.serve(port, handler, health, host=settings.server_host())
    try:
        return await serve_until_stopped(f"{worker_id} ready on port {port}", announce=log.info)
    finally:
        await server.stop(grace=CALL_GRACE_S)
        close = getattr(handler.worker, "close", None)
        if close is not None:
            close()  # a critic's last state reaches the disk


async def _take_span_volunteers(backend, spec: JobSpec, job: str, index: int, settings: WorkerSettings):
    """A front whose job lets volunteers serve spans joins the job's DHT to take them; its closer, or None."""
    if not (
        spec.roles.rollout.spans is not None
        and spec.volunteers.enabled
        and "span" in spec.volunteers.roles
        and settings.dht_addr
    ):
        return None

    started = await start_front_volunteers(backend, job, index, settings.dht_addr, settings)
    return None if started is None else started[1]


async def serve_rollout(worker: RolloutWorker, port: int, *, learner: str | None, host: str) -> int:
    """Serve a `RolloutWorker` and a weight relay on one port until stopped.

    With a learner address the worker's weights come from the relay (versions the learner pushed)
    or, when a push missed it, from a pull from the learner; without one it keeps its own weights.
    """
    # A rollout worker only ever needs the newest version, and takes a pushed one only while its learner
    # publishes it (a signed replay or a version the learner never made is refused).
    relay = WeightRelay(WeightPublisher(keep=1), learner=learner or None)
    if learner:
        worker.weight_source = RelayWeightSource(relay, learner, asyncio.get_running_loop())
    health = servicers.HealthServicer(role="rollout", worker_id=worker.worker_id, ready=True)
    rollout = servicers.RolloutServicer(worker)
    server = await serve_relay(
        relay,
        port,
        host,
        add=(
            lambda s: pb_grpc.add_RolloutServicer_to_server(rollout, s),
            lambda s: pb_grpc.add_HealthServicer_to_server(health, s),
        ),
        services=("Rollout", "Health"),
    )
    try:
        ready = f"{worker.worker_id} ready on port {server.port} (weight relay on the same port)"
        return await serve_until_stopped(ready, announce=log.info)
    finally:
        await server.stop(grace=CALL_GRACE_S)
        await relay.close()


def worker_device(
    spec: JobSpec, role: str, index: int, settings: WorkerSettings, flag: str | None = None
) -> torch.device:
    """This process's device, chosen once before anything touches CUDA: from the GPUs the plan gives the
    role's worker, what the process sees, its local rank, and the override (`--device`, else
    DVERL_DEVICE, else `spec.roles.<role>.device`); the error names whichever asked for the impossible."""
    section = "rollout" if role == "span" else role  # span servers run on the rollout's pools
    role_spec = getattr(spec.roles, section, None)
    gpus = worker_resources(role_spec, index if role != "span" else 0).gpus if role_spec is not None else 0
    if flag:
        override, field = flag, "--device"
    elif settings.device:
        override, field = settings.device, "DVERL_DEVICE"
    else:
        override = role_spec.device if role_spec is not None else "auto"
        field = f"spec.roles.{section}.device"
    return device.enter(
        override=override,
        gpus=gpus,
        visible=settings.visible_devices,
        local_rank=settings.local_rank,
        field=field,
    )


def main_cluster_worker(
    config: tuple[JobSpec, str, Path],
    role: str,
    index: int,
    port: int,
    output: str | None,
    resume: bool,
    *,
    settings: WorkerSettings,
    device_flag: str | None = None,
) -> int:
    """`config`: the spec, the job's name and the base folder (entrypoints/worker_config.py), read by the
    worker's entry before torch loaded."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec, name, base = config
    if str(base) not in sys.path:  # a user's `module:function` reward next to the manifest imports, as
        sys.path.append(str(base))  # `dverl run`'s preflight found it (installed modules come first)
    on = worker_device(spec, role, index, settings, device_flag)
    if role == "learner":
        from decentralized_verl.entrypoints.learner import run  # noqa: PLC0415 entry: the learner's process

        out = Path(output or settings.output or Path("runs") / name)
        return run(spec, name, port=port, output=out, base_dir=base, resume=resume, settings=settings, on=on)

    code = 1
    try:
        code = asyncio.run(
            serve_role(
                spec,
                name,
                role,
                index,
                port,
                base,
                Path(output) if output else None,
                settings=settings,
                on=on,
            )
        )
    except BaseException:
        if not dist.is_initialized():
            raise
        log.exception("%s %d failed", role, index)
    if dist.is_initialized():  # a sharded critic's rank: leave without tearing the process group down
        exit_process(code)
    return code
