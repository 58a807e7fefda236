"""The RLHFJob spec: one pydantic model behind the CRD schema, `dverl validate`, the operator and the workers.

camelCase in YAML (aliases), snake_case in Python. Unknown fields are errors. Name-valued fields take their
allowed names from the catalogue (`catalogue/`: presets, registry names, backend kinds), which the
registries check themselves against, so the CRD lists them; rules that span fields live in rules.py and
report every problem at once with its own field path; `sections.py` resolves every default a preset
implies. `manifest` turns YAML into a validated job, `crd` writes the CRD, `uri` and `source_paths` are
the pure rules of model and data sources. Torch-free on purpose: the operator imports this package, and
it imports nothing of the runtime's.
"""

from decentralized_verl.spec.algorithm import AlgorithmSpec, DynamicFilterSpec, OverlongSpec
from decentralized_verl.spec.base import CrossFieldProblems, SpecModel
from decentralized_verl.spec.data import ChatMessage, DataSpec
from decentralized_verl.spec.job import (
    API_GROUP,
    API_VERSION,
    KIND,
    PLURAL,
    SHORT_NAME,
    JobSpec,
    ObjectMeta,
    RLHFJob,
    with_defaults,
)
from decentralized_verl.spec.model import LoraSpec, ModelSpec, QuantizationSpec, TinyModelSpec
from decentralized_verl.spec.roles import ROLE_NAMES, NodePool, Resources, RoleSpec, RolesSpec, Toleration
from decentralized_verl.spec.status import Condition, RLHFJobStatus, RoleStatus
from decentralized_verl.spec.training import CheckpointSpec, TrainingSpec
from decentralized_verl.spec.volunteers import SecretKeyRef, VolunteersSpec

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "ROLE_NAMES",
    "SHORT_NAME",
    "AlgorithmSpec",
    "ChatMessage",
    "CheckpointSpec",
    "Condition",
    "CrossFieldProblems",
    "DataSpec",
    "DynamicFilterSpec",
    "JobSpec",
    "LoraSpec",
    "ModelSpec",
    "NodePool",
    "ObjectMeta",
    "OverlongSpec",
    "QuantizationSpec",
    "RLHFJob",
    "RLHFJobStatus",
    "Resources",
    "RoleSpec",
    "RoleStatus",
    "RolesSpec",
    "SecretKeyRef",
    "SpecModel",
    "TinyModelSpec",
    "Toleration",
    "TrainingSpec",
    "VolunteersSpec",
    "with_defaults",
]
