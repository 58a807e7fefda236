"""One span server seen from the front: blocking gRPC calls with a deadline, failures sorted into the
ones a replica can fix (the server died, hung, restarted, lost the session, holds other weights) and the
ones it cannot (the front sent something malformed: a bug, raised as `WireError`)."""

from __future__ import annotations

import json
from typing import Any

import grpc
from torch import Tensor

from decentralized_verl.errors import DverlError, WireError
from decentralized_verl.spans.codec import HopRequest, decode_hidden, encode_request
from decentralized_verl.spans.server import SERVICE, encode_commit
from decentralized_verl.transport import secure

REPLACEABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,  # dead, or not up yet
        grpc.StatusCode.DEADLINE_EXCEEDED,  # hung (SIGSTOP, a stuck device)
        grpc.StatusCode.NOT_FOUND,  # lost the session: restarted, or the session expired
        grpc.StatusCode.FAILED_PRECONDITION,  # holds another policy version
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # no session slot free
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)


class SpanFailure(DverlError):
    """A span server that could not answer; `code` says why, `address` which one."""

    def __init__(self, address: str, code: grpc.StatusCode, details: str) -> None:
        self.address = address
        self.code = code
        super().__init__(f"span server {address}: {code.name}: {details}")


def failure(address: str, method: str, code: grpc.StatusCode, details: str) -> DverlError:
    """A replaceable `SpanFailure`, or a `WireError` for what no replica can fix."""
    if code in REPLACEABLE:
        return SpanFailure(address, code, details)
    return WireError(f"span {address} {method}", f"{code.name}: {details}")


class SpanCalls:
    """The span service's calls over any carrier: a subclass provides `_call(method, data, timeout_s)`.

    `trusted`: a job's own span server; an untrusted one (a volunteer) has its outputs spot-checked by
    the front against a trusted replica (`chain.ChainSession`)."""

    address: str
    timeout_s: float
    trusted: bool = True
    hops_served: int = 0
    """Hops this replica answered for the front (counted by the chain)."""

    def _call(self, method: str, data: bytes, timeout_s: float | None = None) -> bytes:
        raise NotImplementedError

    def forward(self, request: HopRequest, hidden_size: int) -> Tensor:
        rows = int(request.hidden.shape[0])
        tokens = request.keep_last or int(request.hidden.shape[1])
        return decode_hidden(self._call("Forward", encode_request(request)), rows, tokens, hidden_size)

    def close(self, session: str) -> bool:
        return self._call("Close", session.encode(), timeout_s=min(self.timeout_s, 10.0)) == b"1"

    def info(self, timeout_s: float | None = None) -> dict[str, Any]:
        return json.loads(self._call("Info", b"", timeout_s))

    def stage(self, blob: bytes) -> int:
        return int(self._call("Stage", blob))

    def commit(self, version: int, manifest: Any = None) -> None:
        """Load the staged version; `manifest` is the learner's signed `SpanManifest` of this span."""
        self._call("Commit", encode_commit(version, manifest))

    def shutdown(self) -> None:
        pass


class SpanClient(SpanCalls):
    """A span server over gRPC (TLS and the job token when this process holds job credentials)."""

    def __init__(self, address: str, *, timeout_s: float = 60.0, credentials: Any = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = secure.sync_channel(address, secure.PROCESS if credentials is None else credentials)
        self._methods = {
            name: self._channel.unary_unary(f"/{SERVICE}/{name}")
            for name in ("Forward", "Close", "Info", "Stage", "Commit")
        }

    def _call(self, method: str, data: bytes, timeout_s: float | None = None) -> bytes:
        try:
            return self._methods[method](data, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as exc:
            raise failure(self.address, method, exc.code(), exc.details() or "") from None

    def shutdown(self) -> None:
        self._channel.close()
