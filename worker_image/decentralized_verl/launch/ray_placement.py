"""Pure: where a planned worker goes on a Ray cluster, in the terms Ray schedules by.

A pod asks Kubernetes for CPUs, memory, GPUs and a node pool's labels; a Ray actor asks its cluster for
the same things: `num_cpus`, `memory` (bytes), `num_gpus`, a custom resource per GPU type (Ray's
`accelerator_type:<TYPE>`, which nodes advertise) and the node pool's selector as a Ray label selector.
The learner ranks are one placement group, so they are placed together or not at all, like a gang of pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decentralized_verl.errors import DverlError
from decentralized_verl.planning.devices import quantity_bytes
from decentralized_verl.planning.plan import Plan, PlannedWorker

DEFAULT_CPUS = 1.0
"""What a worker whose role names no `resources.cpu` asks Ray for: one CPU, as a pod without requests
takes about one core once it computes."""

NAMESPACE = "dverl"
"""The Ray namespace every job's named actors live in (`dverl status --ray` looks them up there)."""


class RayUnavailable(DverlError):
    """No Ray to run on: the extra is not installed, or no cluster answers at the address given."""


class PlacementError(DverlError, ValueError):
    """A role's resources that Ray cannot express; names the worker and the field."""


def cpu_count(quantity: str | None) -> float:
    """A Kubernetes CPU quantity (4, 0.5, 500m, 1k) as Ray's `num_cpus`."""
    if quantity is None:
        return DEFAULT_CPUS
    if quantity.endswith("m"):
        return float(quantity[:-1]) / 1000
    return float(quantity_bytes(quantity))  # the same suffixes (k, Ki, M, ...), as plain numbers


def threads_for(num_cpus: float) -> int:
    """Torch threads for a worker Ray gave `num_cpus` (never 0: half a CPU still computes on one)."""
    return max(1, int(num_cpus))


def record_name(job: str) -> str:
    """The named actor that holds the job's run record (what `dverl status --ray` reads)."""
    return f"{job}-job"


def actor_options(worker: PlannedWorker) -> dict[str, Any]:
    """`.options(...)` for the actor that runs `worker`: its resources and its node pool's placement."""
    try:
        options: dict[str, Any] = {"num_cpus": cpu_count(worker.cpu), "num_gpus": worker.gpus}
        if worker.memory is not None:
            options["memory"] = quantity_bytes(worker.memory)
            if options["memory"] < 1:
                raise ValueError(
                    f"memory {worker.memory!r} is less than one byte (Mi, Gi are bytes; m is 1/1000)"
                )
    except ValueError as exc:
        raise PlacementError(f"{worker.name}: resources: {exc}") from exc
    if worker.gpu_type:
        options["accelerator_type"] = worker.gpu_type
    if worker.node_selector:
        options["label_selector"] = dict(worker.node_selector)
    return options


@dataclass(frozen=True)
class Gang:
    """The learner ranks' placement group: one bundle per rank, in rank order."""

    bundles: tuple[dict[str, float], ...]
    strategy: str
    label_selectors: tuple[dict[str, str], ...] = ()
    """Each bundle's node labels (its rank's node pool selector); empty when no rank has one."""


def learner_gang(plan: Plan) -> Gang | None:
    """The learners' placement group, or None for a job without learner processes.

    STRICT_SPREAD when the ranks span more than one node pool (different kinds of node, so never one
    node, as their pods would be); PACK otherwise, so ranks share a node where they fit and their
    collectives stay off the network.
    """
    learners = plan.by_role("learner")
    if not learners:
        return None
    bundles = []
    for rank in learners:
        options = actor_options(rank)
        bundle = {"CPU": options["num_cpus"]}
        if options["num_gpus"]:
            bundle["GPU"] = float(options["num_gpus"])
        if "memory" in options:
            bundle["memory"] = float(options["memory"])
        if "accelerator_type" in options:  # what Ray's accelerator_type option asks of a node
            bundle[f"accelerator_type:{options['accelerator_type']}"] = 0.001
        bundles.append(bundle)
    pools = {rank.pool for rank in learners}
    selectors = tuple(dict(rank.node_selector) for rank in learners)
    return Gang(
        tuple(bundles),
        "STRICT_SPREAD" if len(pools) > 1 else "PACK",
        selectors if any(selectors) else (),
    )


def _demands(options: dict[str, Any]) -> dict[str, float]:
    """An actor's options as the resource amounts a node must hold."""
    out = {"CPU": float(options["num_cpus"])}
    if options.get("num_gpus"):
        out["GPU"] = float(options["num_gpus"])
    if options.get("memory"):
        out["memory"] = float(options["memory"])
    if options.get("accelerator_type"):
        out[f"accelerator_type:{options['accelerator_type']}"] = 0.001
    return out


def unplaceable(plan: Plan, nodes: list[dict[str, float]]) -> list[str]:
    """Workers that no node of the cluster could ever hold (its total resources, not what is free now),
    each with what it asks and the most any node has; Ray would otherwise wait for them forever."""
    problems = []
    for worker in plan.workers:
        demands = _demands(actor_options(worker))
        if any(all(node.get(k, 0.0) >= v for k, v in demands.items()) for node in nodes):
            continue
        short = [
            f"{k} {v:g} (most on a node: {max((node.get(k, 0.0) for node in nodes), default=0.0):g})"
            for k, v in demands.items()
            if all(node.get(k, 0.0) < v for node in nodes)
        ]
        problems.append(
            f"{worker.name}: no node of the Ray cluster has {', '.join(short) or 'all of ' + str(demands)}"
        )
    return problems
