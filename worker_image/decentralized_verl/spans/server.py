"""A span server: decoder layers [a, b) of one model, and the KV cache of each session sent through them.

Transport-free core (`SpanServer`) plus its gRPC face (`span_handler`, service `dverl.Span`, raw bytes
in and out: the messages are `codec`'s safetensors blobs, so the project's proto is untouched).

Sessions are the front's micro-batches, routed by id. A session's cache lives until the front closes it,
or until it has been idle `session_timeout_s` (a front that died never closes its sessions), and at most
`max_sessions` live at once. A forward that fails part-way drops its session: its cache may hold some
layers' keys and not others, so the front must replay the prefix rather than continue on it.

Weights: a refresh stages this span's tensors (in any number of calls, each a safetensors blob; a tensor
outside the span's layers is refused) and then commits a version with the learner's signed manifest of
this span (`signed`); the commit checks the signature, that the tensors are exactly the signed subset,
byte for byte, and every name, shape and dtype before copying anything, so a bad refresh changes
nothing. Every hop names the version its caller computes with, and a span holding another version
refuses it: a chain never mixes two policies in one token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any

import grpc
import torch
from torch import Tensor

from decentralized_verl.backends.weight_copy import plan_weight_copy
from decentralized_verl.core.kv_cache import cache_keyword, decode_cache
from decentralized_verl.errors import DverlError, WireError
from decentralized_verl.models import loading
from decentralized_verl.planning.plan import plan_job
from decentralized_verl.runtime import compute_thread
from decentralized_verl.runtime.cpus import configure_from_environment
from decentralized_verl.runtime.lifecycle import serve_until_stopped
from decentralized_verl.security import trust
from decentralized_verl.settings import WorkerSettings
from decentralized_verl.spans import signed
from decentralized_verl.spans.blocks import build_span, spec_parts
from decentralized_verl.spans.codec import HopRequest, decode_request, encode_hidden
from decentralized_verl.spans.layout import Span, even_layout, parse_span
from decentralized_verl.spans.signed import SpanManifest
from decentralized_verl.spec.model import ModelSpec
from decentralized_verl.transport import secure
from decentralized_verl.transport.weights.codec import cast_like, decode_state_dict

log = logging.getLogger(__name__)

SERVICE = "dverl.Span"


class UnknownSession(DverlError):
    """A hop for a session this server does not hold (never opened, expired, or the server restarted)."""


class WrongVersion(DverlError):
    """A hop computed with another policy version than this span holds."""


class Busy(DverlError):
    """Every session slot is taken."""


@dataclass
class _Session:
    cache: Any
    rows: int
    last_used: float


class SpanServer:
    """One span's layers and sessions; every method runs on the process's compute thread."""

    def __init__(
        self,
        module: torch.nn.Module,
        span: Span,
        *,
        server_id: str,
        version: int = 0,
        session_timeout_s: float = 300.0,
        max_sessions: int = 64,
        clock: Any = time.monotonic,
        verify_key: bytes | None = None,
    ) -> None:
        """`verify_key`: the learner's public key; with it, a refresh must come with this span's signed
        manifest (`signed.check`)."""
        self.module = module
        self.verify_key = verify_key
        self.span = span
        self.server_id = server_id
        self.version = version
        self.session_timeout_s = session_timeout_s
        self.max_sessions = max_sessions
        self.clock = clock
        self.sessions: dict[str, _Session] = {}
        self.hidden_size = int(module.config.hidden_size)
        self.dtype = next(module.parameters()).dtype
        self.staged: dict[str, Tensor] = {}
        self.staged_version: int | None = None
        self.hops = 0
        self.weight_bytes_received = 0

        self._cache_keyword = cache_keyword(module)

    # ------------------------------------------------------------ sessions

    def sweep(self) -> list[str]:
        """Free the sessions idle longer than the timeout; their ids."""
        now = self.clock()
        expired = [k for k, s in self.sessions.items() if now - s.last_used > self.session_timeout_s]
        for key in expired:
            del self.sessions[key]
        if expired:
            log.info("%s: freed %d idle session(s)", self.server_id, len(expired))
        return expired

    def close(self, session: str) -> bool:
        """Free a session's cache; False when it was not held (closing twice is harmless)."""
        return self.sessions.pop(session, None) is not None

    def forward(self, data: bytes) -> bytes:
        """One hop: decode and check the request, run the layers, answer the hidden states."""
        request = decode_request(data, self.hidden_size, self.dtype)
        return encode_hidden(self.run(request))

    @torch.no_grad()
    def run(self, request: HopRequest) -> Tensor:
        self.sweep()
        if request.version != self.version:
            raise WrongVersion(
                f"{self.server_id}: holds policy version {self.version}, "
                f"the hop was computed with {request.version}"
            )
        session, cache = self._session_for(request)
        on = next(self.module.parameters()).device  # the worker's: hops arrive and leave on the CPU
        try:
            out = self.module(
                inputs_embeds=request.hidden.to(on),
                attention_mask=request.attention.to(on),
                position_ids=request.positions.to(on),
                use_cache=True,
                **{self._cache_keyword: cache},
            ).last_hidden_state
        except Exception:
            self.sessions.pop(request.session, None)  # a half-written cache must not be continued
            raise
        session.rows = int(request.hidden.shape[0])
        session.last_used = self.clock()
        self.sessions[request.session] = session
        self.hops += 1
        return out[:, -request.keep_last :] if request.keep_last else out

    def _session_for(self, request: HopRequest) -> tuple[_Session, Any]:
        """The request's session with its rows selected, every check made before anything changes."""
        tokens = int(request.hidden.shape[1])
        if request.open:
            if request.session in self.sessions:
                raise WireError("hop.session", f"session {request.session!r} is already open")
            if len(self.sessions) >= self.max_sessions:
                raise Busy(f"{self.server_id}: all {self.max_sessions} session slots are in use")
            held = 0
            capacity = request.capacity
            session = _Session(decode_cache(self.module.config, capacity), 0, self.clock())
        else:
            found = self.sessions.get(request.session)
            if found is None:
                raise UnknownSession(
                    f"{self.server_id}: no session {request.session!r} (never opened, expired or restarted)"
                )
            session = found
            held = session.cache.get_seq_length()
            capacity = _capacity(session.cache)
            if request.rows is not None and max(request.rows) >= session.rows:
                raise WireError(
                    "hop.rows", f"row {max(request.rows)} is out of the session's {session.rows} rows"
                )
            if request.rows is None and request.hidden.shape[0] != session.rows:
                raise WireError(
                    "hop.hidden", f"has {request.hidden.shape[0]} rows, the session holds {session.rows}"
                )
        if request.attention.shape[1] != held + tokens:
            raise WireError(
                "hop.attention",
                f"covers {request.attention.shape[1]} positions, expected {held} cached + {tokens} new",
            )
        if capacity and held + tokens > capacity:
            raise WireError(
                "hop.hidden", f"{held} cached + {tokens} new positions exceed the session's {capacity}"
            )
        if request.rows is not None:
            on = next(self.module.parameters()).device
            session.cache.batch_select_indices(torch.tensor(request.rows, dtype=torch.long, device=on))
        return session, session.cache

    # ------------------------------------------------------------ weights

    def _refuse_rollback(self, version: int) -> None:
        """Versions never go backwards here: an older version's manifest is genuine (the learner signed
        it once) but loading it would roll the span back until the next refresh. The same version again
        is a retry of a refresh and loads the same weights (a restarted learner publishes past every
        version already held)."""
        if version < self.version:
            raise WireError(
                "weights.version",
                f"span {self.span}: v{version} is older than v{self.version} held here "
                "(a rollback is refused)",
            )

    def stage(self, data: bytes) -> int:
        """Keep a blob's tensors for the version it is tagged with; the count staged so far."""
        version = _tagged_version(data)
        self._refuse_rollback(version)
        tensors = decode_state_dict(data, version)
        self.weight_bytes_received += len(data)
        own = self.module.state_dict()
        outside = sorted(name for name in tensors if name not in own)
        if outside:
            raise WireError("weights.tensors", f"span {self.span}: tensors outside its layers: {outside[:5]}")
        if self.staged_version != version:
            self.staged, self.staged_version = {}, version  # a new refresh replaces an unfinished one
        self.staged.update(tensors)
        return len(self.staged)

    def commit(self, version: int, manifest: SpanManifest | None = None) -> None:
        """Load the staged tensors as `version` (every one checked first, against the learner's signed
        manifest of this span when one is given or required), or change nothing."""
        self._refuse_rollback(version)
        if self.staged_version != version:
            raise WireError(
                "weights.version", f"nothing staged for version {version} (staged: {self.staged_version})"
            )
        staged, self.staged, self.staged_version = self.staged, {}, None  # a refused refresh is dropped whole
        signed.check(manifest, self.span, version, staged, self.verify_key)
        tensors = cast_like(staged, self.module.state_dict())
        plan = plan_weight_copy(self.module, tensors)
        with torch.no_grad():
            for target, source in plan:
                target.copy_(source)
        self.version = version
        self.sessions.clear()  # caches computed with the old weights must not be continued

    def info(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "layers": str(self.span),
            "version": self.version,
            "sessions": len(self.sessions),
            "hops": self.hops,
            "weight_bytes_received": self.weight_bytes_received,
            "hidden_size": self.hidden_size,
            "dtype": str(self.dtype).removeprefix("torch."),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in self.module.parameters()),
        }


def encode_commit(version: int, manifest: SpanManifest | None) -> bytes:
    return json.dumps({"version": version, "manifest": manifest.to_json() if manifest else None}).encode()


def decode_commit(data: bytes) -> tuple[int, SpanManifest | None]:
    """(version, the span's signed manifest or None) from a Commit call, naming the malformed field."""
    try:
        body = json.loads(data)
    except ValueError:
        raise WireError("commit", f"must be a JSON object (got {data[:20]!r})") from None
    version = body.get("version") if isinstance(body, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise WireError("commit.version", f"must be an integer >= 0 (got {version!r})")
    manifest = body.get("manifest")
    return version, None if manifest is None else SpanManifest.from_json(manifest, "commit.manifest")


def _capacity(cache: Any) -> int:
    capacities = [getattr(layer, "capacity", 0) for layer in getattr(cache, "layers", [])]
    return min(capacities) if capacities and all(capacities) else 0


def _tagged_version(data: bytes) -> int:
    try:
        (length,) = struct.unpack("<Q", data[:8])
        tagged = json.loads(data[8 : 8 + length])["__metadata__"]["dverl.version"]
        return int(tagged)
    except Exception:
        raise WireError("weights.version", "the blob carries no version tag") from None


# ---------------------------------------------------------------- gRPC


def span_methods(server: SpanServer) -> dict[str, Any]:
    """The service's methods over raw bytes, whatever carries them (gRPC here, P2P in `spans.p2p`)."""

    def close(data: bytes) -> bytes:
        return b"1" if server.close(data.decode("utf-8", "replace")) else b"0"

    def commit(data: bytes) -> bytes:
        version, manifest = decode_commit(data)
        server.commit(version, manifest)
        return b""

    def stage(data: bytes) -> bytes:
        return str(server.stage(data)).encode()

    def info(_: bytes) -> bytes:
        return json.dumps(server.info()).encode()

    return {"Forward": server.forward, "Close": close, "Info": info, "Stage": stage, "Commit": commit}


def status_of(exc: Exception) -> str:
    """The gRPC status name a failed call answers with (a front sorts replaceable failures by it)."""
    codes = {WireError: "INVALID_ARGUMENT", UnknownSession: "NOT_FOUND", WrongVersion: "FAILED_PRECONDITION"}
    if isinstance(exc, Busy):
        return "RESOURCE_EXHAUSTED"
    for kind, code in codes.items():
        if isinstance(exc, kind):
            return code
    if isinstance(exc, ValueError):  # a cache written past its capacity, a bad tensor
        return "INVALID_ARGUMENT"
    return "INTERNAL"


def span_handler(server: SpanServer) -> Any:
    """The `dverl.Span` service over raw bytes: Forward, Close, Info, Stage, Commit."""

    def wrap(fn: Any) -> Any:
        async def call(request: bytes, context: Any) -> bytes:
            try:
                return await compute_thread.run(fn, request)
            except Exception as exc:
                code = status_of(exc)
                if code == "INTERNAL":
                    log.exception("%s: span call failed", server.server_id)
                    await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:2000])
                await context.abort(grpc.StatusCode[code], str(exc))

        return grpc.unary_unary_rpc_method_handler(call)

    methods = span_methods(server)
    return grpc.method_handlers_generic_handler(SERVICE, {name: wrap(fn) for name, fn in methods.items()})


async def serve_span(server: SpanServer, port: int, host: str = "127.0.0.1", credentials: Any = None) -> Any:
    """Start a gRPC server for `server` (credentials: `transport.secure`'s; None is plaintext)."""
    grpc_server = secure.aio_server(
        credentials=secure.PROCESS if credentials is None else credentials, services=("Span",)
    )
    grpc_server.add_generic_rpc_handlers((span_handler(server),))
    bound = secure.bind(grpc_server, host, port)
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await grpc_server.start()
    grpc_server.port = bound  # type: ignore[attr-defined]
    return grpc_server


async def _sweeper(server: SpanServer, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await compute_thread.run(server.sweep)


async def _serve_until_stopped(server: SpanServer, port: int, host: str, what: str, sweep_s: float) -> int:
    """Serve `server` over gRPC, freeing idle sessions every `sweep_s`, until the process is told to stop;
    its ready line names it, `what` it serves and the port it bound."""
    grpc_server = await serve_span(server, port, host)
    sweeper = asyncio.create_task(_sweeper(server, sweep_s))
    try:
        return await serve_until_stopped(
            f"{server.server_id} {what} ready on port {grpc_server.port}",
            served=lambda: f"{server.server_id} served {server.hops} hops",
        )
    finally:
        sweeper.cancel()
        await grpc_server.stop(grace=1.0)


def load_span_server(spec: Any, span: Span, **kw: Any) -> SpanServer:
    """Build the span's module from a model spec (reading only its layers) and wrap it."""

    def build() -> torch.nn.Module:
        config, _, source, dtype = spec_parts(spec)
        return build_span(config, span, source, dtype)

    return SpanServer(compute_thread.call(build), span, **kw)


async def serve_span_role(spec: Any, job: str, index: int, port: int, host: str) -> int:
    """`dverl worker --role span --index I`: the span the job's plan gives span worker I, until stopped."""
    planned = plan_job(spec, job).by_role("span")
    if not 0 <= index < len(planned) or planned[index].span is None:
        raise ValueError(f"--index: the job plans {len(planned)} span workers, so no span worker {index}")
    front, position = planned[index].span
    config = spec_parts(spec.model)[0]
    span = even_layout(int(config.num_hidden_layers), spec.roles.rollout.spans.count)[position]

    server = load_span_server(
        spec.model, span, server_id=planned[index].name, verify_key=trust.weights_verify_key()
    )
    return await _serve_until_stopped(server, port, host, f"layers {span} of rollout {front}", 30.0)


async def _main(args: argparse.Namespace) -> int:
    spec = ModelSpec.model_validate(json.loads(args.model))
    span = parse_span(args.layers, field="--layers")
    try:
        verify_key = bytes.fromhex(args.weights_key) if args.weights_key else trust.weights_verify_key()
    except ValueError:
        raise WireError("--weights-key", "must be the learner's public key in hex") from None
    server = load_span_server(
        spec,
        span,
        server_id=args.id or f"span-{span}",
        session_timeout_s=args.session_timeout,
        max_sessions=args.max_sessions,
        verify_key=verify_key,
    )
    sweep_s = min(30.0, args.session_timeout)
    return await _serve_until_stopped(server, args.port, args.host, f"layers {span}", sweep_s)


def main(argv: list[str] | None = None) -> int:
    """`python -m decentralized_verl.spans.server --model JSON --layers a:b --port N`."""
    parser = argparse.ArgumentParser(description="Serve decoder layers [a, b) of a model as one span.")
    parser.add_argument("--model", required=True, help="the job's spec.model as JSON")
    parser.add_argument("--layers", required=True, help="start:end, the span's decoder layers")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--id", default=None)
    parser.add_argument("--session-timeout", type=float, default=300.0)
    parser.add_argument("--max-sessions", type=int, default=64)
    parser.add_argument(
        "--weights-key",
        default=None,
        help="the learner's weight-signing public key (hex); refreshes must then carry this span's signed "
        "manifest (default: the job credentials' key, when the process holds them)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = WorkerSettings.from_env()  # this process's entry: `python -m` starts a span server here
    configure_from_environment(settings)
    trust.adopt(settings)
    loading.use_cache_dir(settings.cache_dir)
    try:
        return asyncio.run(_main(args))
    except DverlError as exc:
        print(f"error: {exc}", flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
