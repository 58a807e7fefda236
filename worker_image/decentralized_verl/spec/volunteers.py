"""`spec.volunteers`: machines outside the cluster joining through the job's DHT."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt

from decentralized_verl.spec.base import Fraction, SpecModel


class SecretKeyRef(SpecModel):
    name: str = Field(min_length=1)
    """Name of the Secret."""
    key: str = Field(default="token-secret", min_length=1)
    """Key within the Secret."""


class VolunteersSpec(SpecModel):
    enabled: bool = False
    """Let volunteers join this job."""
    dht_port: Annotated[int, Field(ge=1024, le=65535)] = 31337
    """Port of the job's DHT bootstrap peer."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret holding the key join tokens are signed with; required when enabled."""
    verify_fraction: Fraction = 0.2
    """Fraction of volunteer results re-computed by a trusted worker to catch cheats."""
    max_volunteers: PositiveInt = 64
    """Most volunteers admitted at once."""
    roles: list[Literal["rollout", "reward", "reference", "critic", "learner", "span"]] = Field(
        default_factory=lambda: ["rollout"]
    )
    """Roles volunteers may take (`span`: layers of a rollout served as spans, docs/spans.md)."""
