"""Pure: merge a role's `podTemplate` into the pods the operator builds for it.

The merge follows what JobSet and Kubeflow Trainer do with their templates (a strategic merge): lists of
named things (env, volumes, init containers, pull secrets) merge by name, other lists (envFrom,
volumeMounts, tolerations) are appended, maps (labels, annotations, nodeSelector) merge, and single values
(affinity, serviceAccountName) replace. What the operator itself depends on wins: its labels, its
annotations, its env and volumes (`dverl validate` refuses templates that name those), the node pool's
selector, and the restricted security settings, which a template's init containers get where they say
nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from decentralized_verl.spec.sources import PodTemplate
from dverl_operator.pods.security import hardened


def by_name(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`ours` with `theirs` merged in by `name`: a name in both keeps our entry, new names are appended."""
    names = {item.get("name") for item in ours}
    return [*ours, *(copy.deepcopy(item) for item in theirs if item.get("name") not in names)]


def _maps(theirs: Mapping[str, str], ours: Mapping[str, str] | None) -> dict[str, str]:
    return {**theirs, **(ours or {})}


def apply_template(pod: dict[str, Any], template: PodTemplate | None) -> dict[str, Any]:
    """The pod with the template merged in (a new object; `pod` is left as it was)."""
    if template is None:
        return pod
    pod = copy.deepcopy(pod)
    meta, spec, over = pod["metadata"], pod["spec"], template.spec
    meta["labels"] = _maps(template.metadata.labels, meta.get("labels"))
    meta["annotations"] = _maps(template.metadata.annotations, meta.get("annotations"))
    worker = spec["containers"][0]
    worker["env"] = by_name(worker.get("env", []), over.env)
    if over.env_from:
        worker["envFrom"] = [*worker.get("envFrom", []), *copy.deepcopy(over.env_from)]
    worker["volumeMounts"] = [*worker.get("volumeMounts", []), *copy.deepcopy(over.volume_mounts)]
    spec["volumes"] = by_name(spec.get("volumes", []), over.volumes)
    if over.node_selector:
        spec["nodeSelector"] = _maps(over.node_selector, spec.get("nodeSelector"))
    if over.tolerations:
        spec["tolerations"] = [*spec.get("tolerations", []), *copy.deepcopy(over.tolerations)]
    if over.affinity is not None:
        spec["affinity"] = copy.deepcopy(over.affinity)
    if over.init_containers:
        added = [hardened(c) for c in over.init_containers]
        spec["initContainers"] = by_name(spec.get("initContainers", []), added)
    if over.image_pull_secrets:
        spec["imagePullSecrets"] = by_name(spec.get("imagePullSecrets", []), over.image_pull_secrets)
    if over.service_account_name:
        # A chosen ServiceAccount is for API access: its token is mounted as the account says.
        spec["serviceAccountName"] = over.service_account_name
        spec.pop("automountServiceAccountToken", None)
    return pod
