"""The operator's /healthz reflects its real health: the real operator against the Kubernetes emulator,
reached through a TCP relay this test can take away (the API server "goes away") and bring back.

The stall rule (jobs known, no pass finishing) is checked on the pure verdict; a stalled loop cannot be
caused from outside without also breaking what the test observes with.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import aiohttp.web
import kmock
import yaml
from kmock._internal import enums

from tests.support.operator_fixtures import Emulator, Operator, tiny_spec, wait_for
from tests.support.processes import free_port


class Relay:
    """A TCP relay to the emulator: `close()` refuses new connections and cuts open ones, like an API
    server that went away; `open()` serves again on the same port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for writer in list(self.pipes):
            writer.close()
        self.pipes.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.pipes |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self.pipes -= {writer, up_writer}


async def _healthz(port: int, path: str = "/healthz") -> tuple[int, str] | None:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(f"http://127.0.0.1:{port}{path}") as resp,
        ):
            return resp.status, await resp.text()
    except aiohttp.ClientError:
        return None


async def test_healthz_follows_the_api_server(tmp_path) -> None:
    async with Emulator(tmp_path) as emu:
        url = emu.url
        relay = Relay(url.host, url.port)
        await relay.open()
        kubeconfig = yaml.safe_load(emu.kubeconfig.read_text())
        kubeconfig["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{relay.port}"
        relayed = tmp_path / "relayed-kubeconfig.yaml"
        relayed.write_text(yaml.safe_dump(kubeconfig))
        liveness = free_port()
        op = Operator(
            emu, "op-health", "--kubeconfig", str(relayed), "--liveness-port", str(liveness),
            "--no-leader-election",
        )  # fmt: skip
        op.start()
        try:
            await emu.create_job("healthy", tiny_spec())
            healthy = await wait_for(
                lambda: _healthz(liveness), timeout=60, what=f"/healthz to answer\n{op.log()}"
            )
            assert healthy == (200, "ok\n")
            await wait_for(lambda: emu.pods("healthy"), timeout=60, what="the operator to act")

            await relay.close()  # the API server goes away
            down = await wait_for(
                lambda: _unhealthy(liveness), timeout=60, what=f"/healthz to fail\n{op.log()}"
            )
            assert down[0] == 503 and "cannot reach the Kubernetes API" in down[1], down
            assert op.process is not None and op.process.poll() is None  # alive, only reporting

            await relay.open()  # and comes back
            back = await wait_for(
                lambda: _is_ok(liveness), timeout=60, what=f"/healthz to recover\n{op.log()}"
            )
            assert back == (200, "ok\n")
        finally:
            await asyncio.to_thread(op.stop)
            await relay.close()


async def _unhealthy(port: int, path: str = "/healthz") -> tuple[int, str] | None:
    answer = await _healthz(port, path)
    return answer if answer is not None and answer[0] != 200 else None


async def _is_ok(port: int) -> tuple[int, str] | None:
    answer = await _healthz(port)
    return answer if answer is not None and answer[0] == 200 else None


class ForbiddingEmulator(kmock.KubernetesEmulator):
    """The emulator behind an authorizer whose rules a test changes while the operator runs: `forbid`
    holds (action, plural) pairs answered 403, as RBAC answers a request the role no longer allows."""

    forbid: set[tuple[str, str]]

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        resource = request.resource
        plural = resource.plural if resource is not None else ""
        action = request.action.name.lower() if request.action is not None else ""
        if (action, plural) in getattr(self, "forbid", set()):
            body = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
            message = (
                f'{plural} is forbidden: User "system:serviceaccount:dverl:dverl" cannot {action} {plural}'
            )
            return aiohttp.web.json_response({**body, "message": message}, status=403)
        return await super()._handle(request)


async def _forbidding(tmp_path, *extra: str) -> tuple[Emulator, int, list[str]]:
    emu = Emulator(tmp_path)
    emu.kmock = ForbiddingEmulator()
    emu.kmock.forbid = set()
    emu.server = kmock.Server(emu.kmock)
    liveness = free_port()
    args = ["--liveness-port", str(liveness), "--no-leader-election", "--stall-seconds", "4", *extra]
    return emu, liveness, args


async def test_healthz_fails_when_every_reconcile_is_forbidden_and_readyz_does_not(tmp_path) -> None:
    emu, port, args = await _forbidding(tmp_path)
    async with emu:
        op = Operator(emu, "op-forbidden", *args).start()
        try:
            await emu.create_job("j", tiny_spec())
            await wait_for(lambda: emu.pods("j"), timeout=60, what=f"the operator to act\n{op.log()}")
            assert await _healthz(port) == (200, "ok\n")
            # Each pass reads its job, then its pods: the role loses the pods it manages.
            emu.kmock.forbid = {(enums.action.LIST.name.lower(), "pods")}
            down = await wait_for(lambda: _unhealthy(port), timeout=60, what=f"/healthz to fail\n{op.log()}")
            assert "every reconcile pass has failed" in down[1] and "403" in down[1], down
            assert await _healthz(port, "/readyz") == (200, "ok\n")  # the API and the watch are fine
            emu.kmock.forbid = set()
            assert await wait_for(lambda: _is_ok(port), timeout=60, what="/healthz to recover") == (
                200,
                "ok\n",
            )
        finally:
            await asyncio.to_thread(op.stop)


async def test_healthz_and_readyz_fail_while_rlhfjobs_cannot_be_watched(tmp_path) -> None:
    emu, port, args = await _forbidding(tmp_path)
    async with emu:
        op = Operator(emu, "op-unwatched", *args).start()
        try:
            assert await wait_for(lambda: _is_ok(port), timeout=60, what=f"/healthz\n{op.log()}") == (
                200,
                "ok\n",
            )
            emu.kmock.forbid = {(enums.action.WATCH.name.lower(), "rlhfjobs")}
            for path in ("/healthz", "/readyz"):
                down = await wait_for(lambda p=path: _unhealthy(port, p), timeout=30, what=f"{path} to fail")
                assert "watch RLHFJobs" in down[1] and "cannot watch rlhfjobs" in down[1], down
        finally:
            emu.kmock.forbid = set()
            await asyncio.to_thread(op.stop)
