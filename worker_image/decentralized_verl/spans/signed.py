"""Per-span weight manifests signed by the learner, so a span server trusts its layers, not the front.

The learner's bundle signature covers the whole model, which a span never sees. So, for a job served as
spans, the learner also signs one small manifest per span: the version, the span's layers and, for every
tensor of that span (under the span's own names), its dtype, shape and SHA-256. The manifests ride in the
bundle's metadata; the front hands each span its own with its tensors, and the span refuses a refresh
whose manifest is unsigned or signed by another key, covers another span or version, names a tensor it
was not sent, or was sent a tensor it does not name or whose bytes differ. A span thus receives and
checks exactly its share, and a front (or anyone reaching the span) cannot make it load other weights.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from torch import Tensor

from decentralized_verl.errors import WireError
from decentralized_verl.spans.layout import LayoutError, Span, parse_span, split_state

DOMAIN = b"dverl-span-weights-v1\x00"
METADATA_KEY = "dverl.span_manifests"
"""The bundle metadata entry holding every span's signed manifest (a JSON list)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    sha256: str


@dataclass(frozen=True)
class SpanManifest:
    """What one span must hold for one version; `signature` is the learner's Ed25519 over the rest."""

    version: int
    span: Span
    tensors: tuple[TensorEntry, ...]
    signature: bytes = b""

    def signed_bytes(self) -> bytes:
        body = {
            "version": self.version,
            "span": str(self.span),
            "tensors": [[t.name, t.dtype, list(t.shape), t.sha256] for t in self.tensors],
        }
        return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "span": str(self.span),
            "tensors": [[t.name, t.dtype, list(t.shape), t.sha256] for t in self.tensors],
            "signature": self.signature.hex(),
        }

    @classmethod
    def from_json(cls, data: object, field: str = "manifest") -> SpanManifest:
        """Parse a manifest, naming the malformed field."""
        if not isinstance(data, dict):
            raise WireError(field, f"must be an object (got {type(data).__name__})")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise WireError(f"{field}.version", f"must be an integer >= 0 (got {version!r})")
        try:
            span = parse_span(str(data.get("span", "")), field=f"{field}.span")
        except LayoutError as exc:
            raise WireError(f"{field}.span", str(exc)) from None
        rows = data.get("tensors")
        if not isinstance(rows, list):
            raise WireError(f"{field}.tensors", "must be a list of [name, dtype, shape, sha256]")
        entries = []
        for i, row in enumerate(rows):
            ok = (
                isinstance(row, list)
                and len(row) == 4
                and all(isinstance(x, str) for x in (row[0], row[1], row[3]))
                and isinstance(row[2], list)
                and all(isinstance(d, int) and d >= 0 for d in row[2])
            )
            if not ok:
                raise WireError(f"{field}.tensors[{i}]", "must be [name, dtype, shape, sha256]")
            entries.append(TensorEntry(row[0], row[1], tuple(row[2]), row[3]))
        try:
            signature = bytes.fromhex(str(data.get("signature", "")))
        except ValueError:
            raise WireError(f"{field}.signature", "must be hex") from None
        return cls(version, span, tuple(entries), signature)


def tensor_entry(name: str, tensor: Tensor) -> TensorEntry:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    return TensorEntry(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), digest)


def span_manifests(
    state_dict: Mapping[str, Tensor],
    version: int,
    spans: Sequence[Span],
    signing_key: bytes | None,
    wire_dtype: torch.dtype | None = None,
) -> list[SpanManifest]:
    """One manifest per span over the tensors as they go on the wire (floating ones cast to
    `wire_dtype` when given), signed with `signing_key` (unsigned when None)."""
    _, parts = split_state(state_dict, tuple(spans))
    out = []
    for span, part in zip(spans, parts, strict=True):
        entries = []
        for name in sorted(part):
            tensor = part[name]
            if wire_dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(wire_dtype)
            entries.append(tensor_entry(name, tensor))
        manifest = SpanManifest(version, span, tuple(entries))
        out.append(_sign(manifest, signing_key) if signing_key is not None else manifest)
    return out


def _sign(manifest: SpanManifest, signing_key: bytes) -> SpanManifest:
    key = Ed25519PrivateKey.from_private_bytes(signing_key)
    return SpanManifest(manifest.version, manifest.span, manifest.tensors, key.sign(manifest.signed_bytes()))


def to_metadata(manifests: Sequence[SpanManifest]) -> dict[str, str]:
    return {METADATA_KEY: json.dumps([m.to_json() for m in manifests], sort_keys=True)}


def bundle_metadata(spans: Sequence[Span]):
    """What a `WeightPublisher` adds to each bundle when the rollout is served as `spans`: one signed
    manifest per span, over the tensors as they go on the wire."""
    layout = tuple(spans)

    def metadata(
        state_dict: Mapping[str, Tensor],
        version: int,
        signing_key: bytes | None,
        wire_dtype: torch.dtype | None,
    ) -> dict[str, str]:
        return to_metadata(span_manifests(state_dict, version, layout, signing_key, wire_dtype))

    return metadata


def from_metadata(metadata: Mapping[str, str]) -> list[SpanManifest] | None:
    """The span manifests a bundle carries, or None when it carries none."""
    text = metadata.get(METADATA_KEY)
    if text is None:
        return None
    try:
        rows = json.loads(text)
    except ValueError:
        raise WireError(f"weights.{METADATA_KEY}", "is not valid JSON") from None
    if not isinstance(rows, list):
        raise WireError(f"weights.{METADATA_KEY}", "must be a list of span manifests")
    return [SpanManifest.from_json(row, f"weights.{METADATA_KEY}[{i}]") for i, row in enumerate(rows)]


def check(
    manifest: SpanManifest | None,
    span: Span,
    version: int,
    tensors: Mapping[str, Tensor],
    verify_key: bytes | None,
) -> None:
    """Raise WireError unless `tensors` are exactly what `manifest` (signed by `verify_key`'s holder when
    one is given) says span `span` holds at `version`. Without a key an absent manifest is accepted (a
    process with no job credentials accepts unsigned weights, as every other receiver does)."""
    where = f"span {span} weights v{version}"
    if manifest is None:
        if verify_key is not None:
            raise WireError(
                "weights.manifest",
                f"{where}: came without a signed manifest; this span accepts signed weights only",
            )
        return
    if verify_key is not None:
        _check_signature(manifest, verify_key, where)
    if manifest.span != span:
        raise WireError("weights.manifest.span", f"{where}: the manifest covers layers {manifest.span}")
    if manifest.version != version:
        raise WireError(
            "weights.manifest.version", f"{where}: the manifest is for version {manifest.version}"
        )
    named = {t.name: t for t in manifest.tensors}
    outside = sorted(set(tensors) - set(named))
    if outside:
        raise WireError("weights.tensors", f"{where}: sent tensors outside its signed subset: {outside[:5]}")
    missing = sorted(set(named) - set(tensors))
    if missing:
        raise WireError(
            "weights.tensors", f"{where}: the signed subset names tensors not sent: {missing[:5]}"
        )
    for name, tensor in tensors.items():
        if tensor_entry(name, tensor) != named[name]:
            raise WireError(
                f"weights[{name!r}]", f"{where}: dtype, shape or bytes differ from the signed manifest"
            )


def _check_signature(manifest: SpanManifest, verify_key: bytes, where: str) -> None:
    if not manifest.signature:
        raise WireError("weights.manifest.signature", f"{where}: the manifest is not signed")
    try:
        Ed25519PublicKey.from_public_bytes(verify_key).verify(manifest.signature, manifest.signed_bytes())
    except InvalidSignature:
        raise WireError("weights.manifest.signature", f"{where}: not signed by this job's learner") from None
