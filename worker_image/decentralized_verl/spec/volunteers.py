"""`spec.volunteers`: machines outside the cluster joining through the job's DHT."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt

from decentralized_verl.spec.base import Fraction, SpecModel


class SecretKeyRef(SpecModel):
    name: str = Field(min_length=1)
    key: str = Field(default="token-secret", min_length=1)


class VolunteersSpec(SpecModel):
    enabled: bool = False
    dht_port: Annotated[int, Field(ge=1024, le=65535)] = 31337
    token_secret_ref: SecretKeyRef | None = None
    verify_fraction: Fraction = 0.2
    max_volunteers: PositiveInt = 64
    roles: list[Literal["rollout", "reward", "reference", "critic", "learner"]] = Field(
        default_factory=lambda: ["rollout"]
    )
