"""gRPC channels and servers with the job's credentials: TLS (callers check they reach the job's servers;
traffic encrypted) and the job token on every call, checked by a server interceptor that names the call and
the caller when it refuses (`Push from 10.0.3.7:51234: no valid job token`). A refused call never reaches
the servicer, so it changes nothing.

Every process of a job that `dverl run` or the operator starts holds credentials (`DVERL_TLS_DIR`); a
process without them (library use, unit tests of one component) talks plaintext with no token.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import grpc

from decentralized_verl.security.credentials import CallerCredentials, JobCredentials
from decentralized_verl.security.trust import process_credentials
from decentralized_verl.transport.grpc_options import channel_options, server_options
from decentralized_verl.transport.token_metadata import TOKEN_KEY, SyncToken, aio_token, bearer

PROCESS: Any = object()
"""Default for `credentials=`: this process's own (`security.trust`); None means plaintext."""
log = logging.getLogger(__name__)


def _resolve(credentials: Any) -> JobCredentials | CallerCredentials | None:
    return process_credentials() if credentials is PROCESS else credentials


def resolve(credentials: Any) -> JobCredentials | CallerCredentials | None:
    """What a `credentials=` argument means: this process's own for `PROCESS`, None for plaintext."""
    return _resolve(credentials)


def _tls(creds: JobCredentials | CallerCredentials) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=creds.ca)


def aio_channel(
    address: str, credentials: Any = PROCESS, options: list[tuple[str, Any]] | None = None
) -> grpc.aio.Channel:
    """A channel to one of the job's servers: TLS checked against the job's CA, the token on every call."""
    creds = _resolve(credentials)
    opts = [*channel_options(), *(options or [])]
    if creds is None:
        return grpc.aio.insecure_channel(address, options=opts)
    return grpc.aio.secure_channel(address, _tls(creds), options=opts, interceptors=aio_token(creds.token))


def sync_channel(address: str, credentials: Any = PROCESS) -> grpc.Channel:
    """The blocking twin of `aio_channel` (rollout workers pull weights from their generation thread)."""
    creds = _resolve(credentials)
    if creds is None:
        return grpc.insecure_channel(address, options=channel_options())
    channel = grpc.secure_channel(address, _tls(creds), options=channel_options())
    return grpc.intercept_channel(channel, SyncToken(creds.token))


def aio_server(
    extra_options: list[tuple[str, Any]] | None = None, credentials: Any = PROCESS
) -> grpc.aio.Server:
    """A server that refuses every call without the job token when the process holds credentials."""
    creds = _resolve(credentials)
    interceptors = [RequireJobToken(creds.token)] if creds is not None else []
    server = grpc.aio.server(options=[*server_options(), *(extra_options or [])], interceptors=interceptors)
    server._dverl_credentials = creds  # type: ignore[attr-defined]  # what `bind` listens with
    return server


def bind(server: grpc.aio.Server, host: str, port: int) -> int:
    """Listen on host:port (TLS when the server was made with credentials); the bound port, 0 on failure."""
    creds = getattr(server, "_dverl_credentials", None)
    if creds is None:
        return server.add_insecure_port(f"{host}:{port}")
    tls = grpc.ssl_server_credentials([(creds.key, creds.cert)])
    return server.add_secure_port(f"{host}:{port}", tls)


def _short(method: str) -> str:
    return method.rsplit("/", 1)[-1]


def _peer(context: Any) -> str:
    peer = context.peer() or "an unknown peer"
    return peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer


class RequireJobToken(grpc.aio.ServerInterceptor):
    """Refuse, before the servicer runs, every call that does not carry the job token."""

    def __init__(self, token: bytes) -> None:
        self.expected = bearer(token).encode()

    def _valid(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == TOKEN_KEY:
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self.expected)
        return False

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or self._valid(details.invocation_metadata):
            return handler
        return _refusing(handler, _short(details.method))


def _refusing(handler: Any, method: str) -> Any:
    """The same method, answering UNAUTHENTICATED with who called what."""

    async def refuse(context: Any) -> None:
        message = f"{method} from {_peer(context)}: no valid job token"
        log.warning("refused %s", message)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def unary(request: Any, context: Any) -> None:
        await refuse(context)

    async def streaming(request: Any, context: Any) -> Any:
        await refuse(context)
        yield  # pragma: no cover - abort raised

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    behavior = streaming if handler.response_streaming else unary
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
