"""The operator's /healthz reflects its real health: the real operator against the Kubernetes emulator,
reached through a TCP relay this test can take away (the API server "goes away") and bring back.

The stall rule (jobs known, no pass finishing) is checked on the pure verdict; a stalled loop cannot be
caused from outside without also breaking what the test observes with.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import yaml

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


async def _healthz(port: int) -> tuple[int, str] | None:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(f"http://127.0.0.1:{port}/healthz") as resp,
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


async def _unhealthy(port: int) -> tuple[int, str] | None:
    answer = await _healthz(port)
    return answer if answer is not None and answer[0] != 200 else None


async def _is_ok(port: int) -> tuple[int, str] | None:
    answer = await _healthz(port)
    return answer if answer is not None and answer[0] == 200 else None
