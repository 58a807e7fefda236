"""`spec.sources` and `spec.roles.<role>.podTemplate`: where the model and the data come from in a cluster,
and what the pods of a role get that the spec does not model.

A source mounts one thing (a PVC, a ConfigMap, a folder of the image, a fetched URI) at `mountPath` in the
pods of the roles it names; `model.path` / `data.train` that lie under a `mountPath` are pod paths. Under
`dverl run` the same manifest maps each pod path to the source's `local` folder (or a fetched URI's cache),
so one manifest runs in both places. Cross-field rules live in source_rules.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from decentralized_verl.spec.base import SpecModel

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SOURCE_KINDS = ("pvc", "config_map", "image", "uri")

_K8S_OBJECT = {"x-kubernetes-preserve-unknown-fields": True}
"""Kubernetes objects passed through as they are (the API server checks them where they land)."""


class PvcSource(SpecModel):
    claim_name: str = Field(
        min_length=1, max_length=253, description="An existing PersistentVolumeClaim, mounted read-only"
    )
    sub_path: str | None = Field(
        default=None,
        description="A folder inside the volume to mount instead of its root (relative, no '..')",
    )


class ConfigMapSource(SpecModel):
    name: str = Field(
        min_length=1,
        max_length=253,
        description="An existing ConfigMap: each key becomes a file (small data)",
    )


class ImageSource(SpecModel):
    path: str = Field(
        min_length=1,
        description="An absolute folder that already exists in the worker image (nothing is mounted)",
    )


class UriSource(SpecModel):
    url: str = Field(
        min_length=1,
        description=(
            "https://host/file, s3://bucket/key or hf://owner/repo[/file][?revision=R]; an archive "
            "(.tar, .tar.gz, .tgz, .zip) is unpacked at mountPath, any other file lands there by its name"
        ),
    )
    sha256: str | None = Field(
        default=None,
        description=(
            "Hex SHA-256 of the downloaded file; the pod fails when it differs. Required unless "
            "insecureSkipDigest is true (or a whole hf repository is pinned by ?revision=<commit>)"
        ),
    )
    insecure_skip_digest: bool = Field(
        default=False,
        description=(
            "Accept a download nothing checks: whoever serves the URL (or steers its redirects within "
            "what the fetcher follows) decides the bytes the job runs on"
        ),
    )


class SourceSpec(SpecModel):
    """One thing mounted at `mountPath` in the pods of `roles`; exactly one of pvc, configMap, image, uri."""

    name: str = Field(
        min_length=1, max_length=40, pattern=DNS_LABEL, description="DNS-1123 label, unique in the job"
    )
    mount_path: str | None = Field(
        default=None,
        description=(
            "Absolute path in the pod; model and data paths under it are pod paths (an image source: its "
            "path when omitted)"
        ),
    )
    roles: list[str] | None = Field(
        default=None,
        description="Roles whose pods mount it (default: every role of the job; the DHT peer never)",
    )
    local: str | None = Field(
        default=None,
        description="The folder standing in for it under `dverl run` (relative to the manifest's folder)",
    )
    pvc: PvcSource | None = Field(default=None, description="A PersistentVolumeClaim, mounted read-only")
    config_map: ConfigMapSource | None = Field(default=None, description="A ConfigMap, one file per key")
    image: ImageSource | None = Field(default=None, description="A folder already in the worker image")
    uri: UriSource | None = Field(
        default=None,
        description="Downloaded by an init container into an emptyDir at mountPath; its digest checked",
    )

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> SourceSpec:
        given = [kind for kind in SOURCE_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            names = ", ".join(_alias(k) for k in given) if given else "none"
            raise ValueError(f"set exactly one of pvc, configMap, image, uri (got {names})")
        if self.image is not None and self.mount_path is None:
            self.mount_path = self.image.path
        if self.mount_path is None:
            raise ValueError("mountPath: required (where the pods see it)")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in SOURCE_KINDS if getattr(self, kind) is not None)


def _alias(name: str) -> str:
    return "configMap" if name == "config_map" else name


def _objects(description: str) -> Any:
    """A list of Kubernetes objects passed through as written (the API server checks their schema)."""
    return Field(
        default_factory=list,
        description=description,
        json_schema_extra={"items": {"type": "object", **_K8S_OBJECT}},
    )


class PodMetadata(SpecModel):
    labels: dict[str, str] = Field(
        default_factory=dict, description="Added to the pods (the operator's own labels win)"
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Added to the pods (the operator's own annotations win)"
    )


class PodOverrides(SpecModel):
    """Merged into the role's pods: lists of named things by name, other lists appended, maps merged,
    single values replaced; the operator's own env, volumes, labels and node pool selector win."""

    env: list[dict[str, Any]] = _objects(
        "Env of the worker container (DVERL_* and torch rendezvous variables are the operator's)"
    )
    env_from: list[dict[str, Any]] = _objects("envFrom of the worker container")
    volumes: list[dict[str, Any]] = _objects(
        "Extra pod volumes (hostPath is refused: the pods stay in the restricted profile)"
    )
    volume_mounts: list[dict[str, Any]] = _objects("Extra mounts of the worker container")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Merged with the node pool's selector (the pool's wins)"
    )
    tolerations: list[dict[str, Any]] = _objects("Appended to the node pool's tolerations")
    affinity: dict[str, Any] | None = Field(
        default=None, description="The pods' affinity", json_schema_extra=_K8S_OBJECT
    )
    init_containers: list[dict[str, Any]] = _objects(
        "Run after the source fetchers, before the worker (restricted settings filled in)"
    )
    image_pull_secrets: list[dict[str, Any]] = _objects("Secrets to pull the worker image with")
    service_account_name: str | None = Field(
        default=None,
        description="The pods' ServiceAccount; its token is then mounted (the workers get none otherwise)",
    )


class PodTemplate(SpecModel):
    """What the pods of a role get that the spec does not model (like a JobSet / Trainer pod template)."""

    metadata: PodMetadata = Field(default_factory=PodMetadata, description="Labels and annotations")
    spec: PodOverrides = Field(default_factory=PodOverrides, description="Merged into the pod spec")


__all__ = [
    "SOURCE_KINDS",
    "ConfigMapSource",
    "ImageSource",
    "PodMetadata",
    "PodOverrides",
    "PodTemplate",
    "PvcSource",
    "SourceSpec",
    "UriSource",
]
