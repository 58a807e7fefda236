"""The learner process: rank 0 coordinates and serves Status/Weights; other ranks follow in lock-step.

Roles with replicas 0 are built here, in-process, behind the same client protocols as remote ones.
Rendezvous comes from the environment torchrun would set (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from decentralized_verl.models.checkpoint import checkpoint_dir, latest_checkpoint, save_checkpoint
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.roles.coordinator import Coordinator, LoopParts
from decentralized_verl.roles.dispatch import Dispatcher
from decentralized_verl.roles.progress import MetricsLog, ProgressState
from decentralized_verl.roles.prompts import prepare_prompts
from decentralized_verl.roles.trainer import PolicyTrainer
from decentralized_verl.roles.wiring import bind_host
from decentralized_verl.spec import JobSpec

log = logging.getLogger(__name__)


def _host() -> str:
    """127.0.0.1 for `dverl run`; pods listen on every interface (DVERL_BIND_HOST=0.0.0.0)."""
    return bind_host()


def _init_distributed(world: int, rank: int) -> None:
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)


def checkpoint_root(spec: JobSpec, output: Path) -> Path:
    configured = spec.training.checkpoint.dir
    if configured is None:
        return output / "checkpoints"
    path = Path(configured)
    return path if path.is_absolute() else output / path


def _restore(trainer: PolicyTrainer, folder: Path) -> dict[str, Any]:
    """Load weights, optimizer and loop state saved by `_save` (same process layout)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    missing, unexpected = trainer.model.load_state_dict(state, strict=False)
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise RuntimeError(f"checkpoint {folder}: missing {real_missing[:3]}, unexpected {unexpected[:3]}")
    optimizer_file = folder / "optimizer.pt"
    if optimizer_file.exists():
        saved = torch.load(optimizer_file, weights_only=False)
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.scheduler.load_state_dict(saved["scheduler"])
    return json.loads((folder / "trainer_state.json").read_text())


async def run_learner(
    spec: JobSpec, job: str, *, port: int, output: Path, base_dir: Path | None, resume: bool
) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", str(spec.roles.learner.replicas)))
    torch.manual_seed(spec.training.seed)
    _init_distributed(world, rank)
    model, tokenizer = load_model_and_tokenizer(spec.model)
    trainer = PolicyTrainer(model, spec, distributed=world > 1)
    if rank != 0:
        return _follow(trainer)
    return await _coordinate(
        spec, job, trainer, tokenizer, port=port, output=output, base_dir=base_dir, resume=resume
    )


def _follow(trainer: PolicyTrainer) -> int:
    """Ranks > 0: receive a shard, update (DDP averages gradients with rank 0), until told to stop."""
    while True:
        box: list[Any] = [None]
        dist.scatter_object_list(box, None, src=0)
        if box[0] is None:
            break
        trainer.update(box[0])
    _gather_digests(trainer.model)
    dist.destroy_process_group()
    return 0


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: replicas that stayed in lock-step have equal digests."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _gather_digests(model: torch.nn.Module) -> list[str]:
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, weights_digest(model))
    return digests


def _scatter(shards: list[Any]) -> Any:
    box: list[Any] = [None]
    dist.scatter_object_list(box, shards, src=0)
    return box[0]


async def _coordinate(
    spec: JobSpec,
    job: str,
    trainer: PolicyTrainer,
    tokenizer,
    *,
    port: int,
    output: Path,
    base_dir: Path | None,
    resume: bool,
) -> int:
    from decentralized_verl.roles.servicers import HealthServicer, serve
    from decentralized_verl.roles.status_service import CoordinatorServicer
    from decentralized_verl.roles.wiring import connect_roles
    from decentralized_verl.transport.weight_service import WeightPublisher, WeightsServicer

    model = trainer.model
    progress = ProgressState()
    stopped_followers = False
    # Native dtype on the wire keeps rollout and learner log-probs identical; bf16 models send bf16.
    publisher = WeightPublisher(dtype=None, is_adapter=spec.model.lora is not None)
    health = HealthServicer(role="learner", worker_id=f"{job}-learner-0")
    server = await serve(
        port, CoordinatorServicer(progress), WeightsServicer(publisher), health, host=_host()
    )
    world = spec.roles.learner.replicas
    volunteers = None  # issue 7: the VolunteerHub, when volunteers are enabled
    watcher = None  # follows workers.yaml when the operator scales rollout workers
    try:
        prompts = prepare_prompts(spec, tokenizer, spec.data.train, base_dir)
        eval_prompts = (
            prepare_prompts(spec, tokenizer, spec.data.eval, base_dir, limit=spec.data.eval_samples)
            if spec.data.eval
            else []
        )
        from decentralized_verl.data import PromptSampler

        sampler = PromptSampler(
            len(prompts), spec.training.batch_size * world, seed=spec.training.seed, drop_last=True
        )
        start_step = start_version = 0
        ckpt_root = checkpoint_root(spec, output)
        if resume:
            folder = latest_checkpoint(ckpt_root)
            if folder is not None:
                state = _restore(trainer, folder)
                sampler.load_state(state["sampler"])
                start_step, start_version = int(state["step"]), int(state["policy_version"])
                progress.last_checkpoint = str(folder)
                log.info("resumed from %s at step %d", folder, start_step)

        # Serving roles: remote workers when planned, else in this process behind the same protocol.
        roles = await connect_roles(
            spec,
            job,
            model,
            tokenizer,
            temperature=trainer.settings.temperature,
            publisher=publisher,
            start_version=start_version,
        )

        def checkpoint(step: int, state: dict[str, Any]) -> str:
            folder = checkpoint_dir(ckpt_root, step)
            save_checkpoint(
                folder,
                model,
                tokenizer,
                extra_state=state,
                optimizer_state={
                    "optimizer": trainer.optimizer.state_dict(),
                    "scheduler": trainer.scheduler.state_dict(),
                },
            )
            _prune(ckpt_root, spec.training.checkpoint.keep)
            return str(folder)

        metrics = MetricsLog(output / "metrics.jsonl", list(spec.training.logging))
        dispatcher = Dispatcher(roles.rollout, roles.priors)
        # --- volunteers over Hivemind (issue 7): peers found in the job's DHT join this dispatcher ---
        if spec.volunteers.enabled and os.environ.get("DVERL_DHT_ADDR"):
            from decentralized_verl.volunteers.discovery import start_volunteer_discovery

            volunteers = await start_volunteer_discovery(
                spec,
                job,
                dispatcher,
                model=model,
                publisher=publisher,
                progress=progress,
                temperature=trainer.settings.temperature,
                pad_token_id=tokenizer.pad_token_id,
                start_version=start_version,
            )
            roles.publish = volunteers.wrap_publish(roles.publish, model)
        # --- end volunteers ---
        if roles.remote_rollout:
            # Scaling adds or removes rollout pods while this process runs; follow the operator's list.
            from decentralized_verl.roles.membership import start_watching
            from decentralized_verl.roles.wiring import env_addresses

            watcher = start_watching(
                job,
                dispatcher,
                env_addresses("rollout"),
                allow_newer=spec.training.max_staleness > 0,
                weights=roles.weights,
            )
        parts = LoopParts(
            spec=spec,
            trainer=trainer,
            dispatcher=dispatcher,
            reward=roles.reward,
            reference=roles.reference,
            critic=roles.critic,
            prompts=prompts,
            eval_prompts=eval_prompts,
            sampler=sampler,
            pad_token_id=tokenizer.pad_token_id,
            publish=roles.publish,
            scatter=_scatter if world > 1 else None,
            checkpoint=checkpoint if spec.training.checkpoint.every else None,
            progress=progress,
            metrics=metrics,
            async_capable=roles.remote_rollout,
        )
        health.set_ready(True)
        coordinator = Coordinator(parts, start_step=start_step, start_version=start_version)
        summary = await coordinator.run()
        metrics.close()
        if world > 1:
            _scatter([None] * world)
            summary["replica_digests"] = _gather_digests(model)
            if len(set(summary["replica_digests"])) != 1:
                log.error("learner replicas diverged: %s", summary["replica_digests"])
        stopped_followers = True
        (output / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        log.info("summary: %s", summary)
        for client in roles.rollout:
            await client.close()
        if roles.weights is not None:
            await roles.weights.close()
        return 0
    finally:
        if world > 1 and dist.is_initialized():
            if not stopped_followers:
                _scatter([None] * world)
                _gather_digests(model)
            dist.destroy_process_group()
        if volunteers is not None:  # issue 7
            await volunteers.close(output)
        if watcher is not None:
            await watcher.close()
        await server.stop(grace=1.0)


def _prune(root: Path, keep: int) -> None:
    import shutil

    folders = sorted(
        (p for p in root.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
    )
    for old in folders[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def run(spec: JobSpec, job: str, *, port: int, output: Path, base_dir: Path | None, resume: bool) -> int:
    return asyncio.run(run_learner(spec, job, port=port, output=output, base_dir=base_dir, resume=resume))
