"""The operator's identity: one CA and one secret key, kept in a Secret in its own namespace, from which
it issues every job's credentials and rebuilds what its Status client needs for any job.

Each job's observer token (Status and Ready only) is an HMAC of the job's namespace, name and uid under
the operator's key, and each job's server certificate is signed by the operator's CA. So the operator
talks to any coordinator with only its own identity in memory: it never reads a job's Secret, and RBAC
grants it no read access to Secrets beyond its identity Secret (by name). The other roles' tokens and
the weight-signing key are random per job and live only in the job's Secret, each mounted into the pods
of its own role (the signing key into learner pods).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from decentralized_verl.security.credentials import (
    Authority,
    CallerCredentials,
    IssuedCredentials,
    issue,
    new_authority,
)
from dverl_operator.kube.client import Cluster
from dverl_operator.kube.errors import ApiError

log = logging.getLogger(__name__)
KEY_FIELD = "key"
CA_CERT_FIELD = "ca.crt"
CA_KEY_FIELD = "ca.key"


class IdentityError(Exception):
    """The identity Secret exists but is not one this operator can use; the message names the field."""


@dataclass(frozen=True)
class OperatorIdentity:
    key: bytes
    authority: Authority

    @classmethod
    def generate(cls) -> OperatorIdentity:
        return cls(secrets.token_bytes(32), new_authority("dverl operator CA"))

    def job_token(self, namespace: str, name: str, uid: str) -> bytes:
        """The job's observer token (Status and Ready only, `security.rights`): hex text like `dverl
        run`'s tokens; a new job under an old name (a new uid) gets a new one."""
        message = f"dverl-job-token\x00{namespace}\x00{name}\x00{uid}".encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest().encode()

    def caller(self, namespace: str, name: str, uid: str) -> CallerCredentials:
        return CallerCredentials(self.authority.cert, self.job_token(namespace, name, uid))

    def job_credentials(self, namespace: str, name: str, uid: str) -> IssuedCredentials:
        """Random tokens for the job's roles, the observer's derived so this operator can always read
        Status; the operator keeps none of the others (they live in the job's Secret alone)."""
        observer = self.job_token(namespace, name, uid)
        return issue(name, namespace, authority=self.authority, observer_token=observer)

    # ------------------------------------------------------------------------------ the Secret
    def secret(self, name: str, namespace: str) -> dict[str, Any]:
        data = {KEY_FIELD: self.key, CA_CERT_FIELD: self.authority.cert, CA_KEY_FIELD: self.authority.key}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "dverl-operator"},
            },
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }

    @classmethod
    def from_secret(cls, obj: dict[str, Any]) -> OperatorIdentity:
        data = obj.get("data") or {}
        name = (obj.get("metadata") or {}).get("name", "identity Secret")

        def field(key: str) -> bytes:
            try:
                return base64.b64decode(data[key], validate=True)
            except (KeyError, ValueError, TypeError):
                raise IdentityError(f"Secret {name}: data.{key} is missing or not base64") from None

        identity = cls(field(KEY_FIELD), Authority(field(CA_CERT_FIELD), field(CA_KEY_FIELD)))
        if len(identity.key) < 32:
            raise IdentityError(f"Secret {name}: data.{KEY_FIELD} must hold at least 32 bytes")
        return identity


async def load_or_create(cluster: Cluster, namespace: str, name: str) -> OperatorIdentity:
    """The identity in Secret `namespace/name`, created on the first start. Two replicas starting at
    once both read the one that was created first."""
    for _ in range(3):
        found = await cluster.get("Secret", namespace, name)
        if found is not None:
            return OperatorIdentity.from_secret(found)
        fresh = OperatorIdentity.generate()
        try:
            if await cluster.create("Secret", namespace, fresh.secret(name, namespace)):
                log.info("created the operator identity Secret %s/%s", namespace, name)
                return fresh
        except ApiError as exc:
            if exc.status != 409:
                raise
    raise IdentityError(f"Secret {namespace}/{name}: could neither read nor create it")
