"""Poll the job coordinator's Status RPC (learner rank 0) for progress the operator writes to `.status`.

In a cluster the coordinator is `<job>-learner-0.<job>-workers.<ns>.svc:50051`; the address template can
be overridden (flag or DVERL_COORDINATOR_ADDRESS_TEMPLATE) for tests and for clusters with other DNS.
An unreachable coordinator is not an error: a job that is still starting has none yet.
"""

from __future__ import annotations

import logging

import grpc

from decentralized_verl.core.status import JobStatus
from decentralized_verl.errors import WireError
from decentralized_verl.planning.plan import GRPC_PORT
from decentralized_verl.proto import dverl_pb2, dverl_pb2_grpc
from decentralized_verl.security.credentials import CallerCredentials
from decentralized_verl.transport import secure
from decentralized_verl.transport.wire.status import job_status_from_proto

DEFAULT_TEMPLATE = "{job}-learner-0.{job}-workers.{namespace}.svc:" + str(GRPC_PORT)
ENV_TEMPLATE = "DVERL_COORDINATOR_ADDRESS_TEMPLATE"
log = logging.getLogger(__name__)


class CoordinatorClient:
    """One cached gRPC channel per coordinator address (TLS checked against the operator's CA, the job's
    token on every call); `progress` never raises for a dead peer, a refusal or a malformed reply (all
    read as \"no progress now\")."""

    def __init__(self, template: str = DEFAULT_TEMPLATE, timeout: float = 2.0) -> None:
        self.template = template
        self.timeout = timeout
        self._channels: dict[tuple[str, CallerCredentials | None], grpc.aio.Channel] = {}

    def address(self, job: str, namespace: str) -> str:
        return self.template.format(job=job, namespace=namespace)

    async def progress(
        self, job: str, namespace: str, credentials: CallerCredentials | None
    ) -> JobStatus | None:
        address = self.address(job, namespace)
        key = (address, credentials)
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = secure.aio_channel(address, credentials)
        stub = dverl_pb2_grpc.CoordinatorStub(channel)
        try:
            reply = await stub.Status(dverl_pb2.StatusRequest(), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            level = logging.WARNING if exc.code() == grpc.StatusCode.UNAUTHENTICATED else logging.DEBUG
            log.log(level, "coordinator %s: %s %s", address, exc.code().name, exc.details())
            return None
        try:
            return job_status_from_proto(reply)
        except WireError as exc:  # validated like every message: a malformed reply is not progress
            log.warning("coordinator %s sent a bad Status reply: %s", address, exc)
            return None

    async def forget(self, job: str, namespace: str) -> None:
        address = self.address(job, namespace)
        for key in [k for k in self._channels if k[0] == address]:
            channel = self._channels.pop(key)
            if not any(c is channel for c in self._channels.values()):
                await channel.close()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in {id(c): c for c in channels.values()}.values():
            await channel.close()
