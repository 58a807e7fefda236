"""One line for a failed RPC, the same whichever carrier or weight path made the call."""

from __future__ import annotations

from typing import Any


def rpc_reason(exc: Any) -> str:
    """`CODE: details` of a grpc.RpcError (or anything shaped like one)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code is not None else 'UNKNOWN'}: {details}"
