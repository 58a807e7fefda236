"""What fits: per-worker memory estimates from a model's config.json alone, checked against each node
pool's GPUs (`dverl plan`, `dverl validate`, `dverl run` and the operator all refuse a job that cannot fit).

shapes.py reads a model's shape, locate.py finds it for a model spec, memory.py estimates (rollout_memory.py
the generation part), devices.py says what a worker has, fit.py checks and computes fixes, report.py
prints. Torch-free: the operator imports it.
"""

from decentralized_verl.planning.fit import MemoryPlan, WorkerPlan, plan_for, plan_memory, plan_problems
from decentralized_verl.planning.shapes import KNOWN_SHAPES, ModelShape, known_shape, shape_from_config

__all__ = [
    "KNOWN_SHAPES",
    "MemoryPlan",
    "ModelShape",
    "WorkerPlan",
    "known_shape",
    "plan_for",
    "plan_memory",
    "plan_problems",
    "shape_from_config",
]
