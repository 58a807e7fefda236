"""gRPC channels and servers with the job's credentials: TLS (callers check they reach the job's servers;
traffic encrypted) and the caller's role token on every call, checked by a server interceptor against the
rights of that role (`security.rights`); it names the call and the caller when it refuses (`Push from
10.0.3.7:51234: no valid job token`, `Score from 10.0.3.7:51234: the rollout role has no right to
Reward/Score`). A refused call never reaches the servicer and its request is never parsed. An allowed
call's request is held to its method's size limit (`message_limits`) before it is parsed.

Every process of a job that `dverl run` or the operator starts holds credentials (`DVERL_TLS_DIR`); a
process without them (library use, unit tests of one component) talks plaintext with no token.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Iterable
from typing import Any

import grpc

from decentralized_verl.runtime.heap import return_freed_memory
from decentralized_verl.security.credentials import CallerCredentials, JobCredentials, token_digest
from decentralized_verl.security.rights import may_call, method_key
from decentralized_verl.security.trust import process_credentials
from decentralized_verl.transport.grpc_options import channel_options, server_options
from decentralized_verl.transport.message_limits import over_limit
from decentralized_verl.transport.token_metadata import TOKEN_KEY, SyncToken, aio_token

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
    extra_options: list[tuple[str, Any]] | None = None,
    credentials: Any = PROCESS,
    services: Iterable[str] | None = None,
) -> grpc.aio.Server:
    """A server that refuses every call that does not carry the token of a role allowed to make it, when
    the process holds credentials. Naming the `services` it will serve (`Reward`, `Health`, ...) keeps its
    receive limit to what they take (`message_limits`); unnamed, it takes every method's largest."""
    creds = _resolve(credentials)
    interceptors = [RequireRole(creds.callers)] if creds is not None else []
    options = [*server_options(services), *(extra_options or [])]
    server = grpc.aio.server(options=options, interceptors=interceptors)
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


class RequireRole(grpc.aio.ServerInterceptor):
    """Refuse, before the servicer runs and before the request's body is even parsed, every call whose
    token is no role's (UNAUTHENTICATED) or whose role has no right to the method (PERMISSION_DENIED,
    `security.rights`); and, before parsing, every request larger than its method takes
    (RESOURCE_EXHAUSTED, `message_limits`). Refusals are logged at most `log_per_window` times a minute,
    so a flood of refused calls costs the worker neither disk nor time."""

    def __init__(self, callers: tuple[tuple[str, str], ...], log_per_window: int = 20) -> None:
        self.roles = dict(callers)
        self.log = RateLimitedLog(log_per_window, window_s=60.0)
        self.trim = MemoryReturn()

    def _role(self, metadata: Any) -> str | None:
        for key, value in metadata or ():
            if key == TOKEN_KEY:
                given = value.encode() if isinstance(value, str) else value
                if not given.startswith(b"Bearer "):
                    return None
                return self.roles.get(token_digest(given[len(b"Bearer ") :]))
        return None

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        role = self._role(details.invocation_metadata)
        if role is not None and may_call(role, details.method):
            handler = await continuation(details)
            if handler is None:
                return None
            return _parsing(handler, _short(details.method), method_key(details.method), self)
        handler = await continuation(details)
        if handler is None:
            return None
        method = _short(details.method)
        if role is None:
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED, method, "no valid job token", self.log)
        why = f"the {role} role has no right to {method_key(details.method)}"
        return _refusing(handler, grpc.StatusCode.PERMISSION_DENIED, method, why, self.log)


RequireJobToken = RequireRole
"""The former name: every server now checks the caller's role, not one shared token."""


class RateLimitedLog:
    """At most `limit` warnings per window; the next one says how many were left out."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self.start, self.count, self.dropped = 0.0, 0, 0

    def warning(self, message: str) -> None:
        now = time.monotonic()
        if now - self.start > self.window_s:
            if self.dropped:
                log.warning(
                    "refused %d more calls in the last %.0f s (not logged)", self.dropped, self.window_s
                )
            self.start, self.count, self.dropped = now, 0, 0
        if self.count < self.limit:
            self.count += 1
            log.warning("refused %s", message)
        else:
            self.dropped += 1


def _raw(data: bytes) -> bytes:
    return data


class MemoryReturn:
    """Give the heap's free pages back to the kernel soon after a refused oversized request is dropped: at
    most one return pending at a time, so a flood of them costs one `malloc_trim` per `delay_s`."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s
        self.pending = False

    def soon(self) -> None:
        if self.pending:
            return
        self.pending = True
        asyncio.get_running_loop().call_later(self.delay_s, self._run)

    def _run(self) -> None:
        self.pending = False
        return_freed_memory()


_REFUSED: Any = object()
"""What a request refused for its size becomes: the call ends with the status already set."""


def _parsing(handler: Any, method: str, key: str, guard: RequireRole) -> Any:
    """The same method, checking each request's size against its method's limit and parsing it itself:
    a request over the limit ends the call with RESOURCE_EXHAUSTED naming the call, the caller and the
    limit, before it is parsed; bytes that are not the message it takes end it with INVALID_ARGUMENT
    (gRPC would answer UNKNOWN, as for a crash)."""
    parse = handler.request_deserializer or _raw

    def oversized(size: int, context: Any) -> str | None:
        too_big = over_limit(key, size)
        if too_big is None:
            return None
        why = f"{method} from {_peer(context)}: {too_big}"
        guard.log.warning(why)
        guard.trim.soon()
        return why

    async def parsed(raw: bytes, context: Any) -> Any:
        try:
            return parse(raw)
        except Exception as exc:  # DecodeError, or anything a custom deserializer raises
            why = f"{method} from {_peer(context)}: the request is not a valid message ({type(exc).__name__})"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)

    async def each(raws: Any, context: Any) -> Any:
        async for raw in raws:
            why = oversized(len(raw), context)
            if why is not None:
                del raw  # the abort's traceback keeps this frame until a collection
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            yield await parsed(raw, context)

    inner = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream

    if handler.request_streaming:

        async def stream_in(raws: Any, context: Any) -> Any:
            return inner(each(raws, context), context)

        behavior = stream_in
    else:

        async def unary_in(raw: bytes, context: Any) -> Any:
            why = oversized(len(raw), context)
            if why is not None:
                # Ended by setting the status, not by `abort`: an abort's exception is kept by the call's
                # state and its traceback holds these frames, and so the request, until a collection.
                context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
                context.set_details(why)
                return _REFUSED
            return inner(await parsed(raw, context), context)

        behavior = unary_in
    return _rebuild(handler, behavior)


def _raw_handler(handler: Any, behavior: Any) -> Any:
    """A method handler of `handler`'s kind (unary or streaming each way) that runs `behavior` on the raw
    request bytes and replies as `handler` does."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(behavior, request_deserializer=_raw, response_serializer=handler.response_serializer)


def _rebuild(handler: Any, parse_then_call: Any) -> Any:
    """`handler` with raw-bytes requests, each parsed by `parse_then_call` before the servicer runs."""
    if handler.response_streaming:

        async def streamed(request: Any, context: Any) -> Any:
            out = await parse_then_call(request, context)
            if out is _REFUSED:
                return
            if hasattr(out, "__aiter__"):
                async for item in out:
                    yield item
            elif inspect.isawaitable(out):  # a servicer that writes with `context.write`
                await out
            else:
                for item in out or ():
                    yield item

        behavior = streamed
    else:

        async def single(request: Any, context: Any) -> Any:
            out = await parse_then_call(request, context)
            if out is _REFUSED:
                return None
            return await out if inspect.isawaitable(out) else out

        behavior = single
    return _raw_handler(handler, behavior)


def _refusing(handler: Any, code: grpc.StatusCode, method: str, why: str, log_to: RateLimitedLog) -> Any:
    """The same method, answering `code` with who called what and why, reading no request message: the
    handler takes its request as a stream, even for a unary method, and never reads it, so gRPC never
    pulls the body in (a unary handler would receive it whole first, up to the largest message a
    server accepts: 32 concurrent 64 MiB token-less calls cost a worker 1.3 GB it kept). What a refused
    call costs is what HTTP/2 flow control lets the caller send unasked, a window per call."""

    async def refuse(context: Any) -> None:
        message = f"{method} from {_peer(context)}: {why}"
        log_to.warning(message)
        await context.abort(code, message)

    async def unary(request: Any, context: Any) -> None:
        await refuse(context)

    async def streaming(request: Any, context: Any) -> Any:
        await refuse(context)
        yield  # pragma: no cover - abort raised

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            streaming, request_deserializer=_raw, response_serializer=handler.response_serializer
        )
    return grpc.stream_unary_rpc_method_handler(
        unary, request_deserializer=_raw, response_serializer=handler.response_serializer
    )
