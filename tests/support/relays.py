"""Weight relays served from threads of the test process, as separate rollout workers would serve them, and
the small model state they pass around (the fan-out, bulk-plane and security tests share them)."""

from __future__ import annotations

import asyncio
import threading

import torch

from decentralized_verl.transport.weights.publish import WeightPublisher
from decentralized_verl.transport.weights.receive import LocalWeightSource
from decentralized_verl.transport.weights.relay import WeightRelay, serve_relay

CHUNK = 4096


def model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A small float32 'model' of ~40 KB: a dozen chunks of CHUNK bytes in bf16."""
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(64, 32, generator=gen)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.q_proj.weight": torch.randn(32, 32, generator=gen),
        "model.layers.0.mlp.up_proj.weight": torch.randn(96, 32, generator=gen),
        "model.norm.weight": torch.rand(32, generator=gen) + 0.5,
        "lm_head.weight": embed,  # tied
        "steps": torch.tensor([3, 4], dtype=torch.int64),
    }


class RelayThread:
    """A `WeightRelay` served from its own thread and event loop, like a separate rollout worker."""

    def __init__(self, relay: WeightRelay | None = None, port: int = 0) -> None:
        self.relay = relay or WeightRelay(WeightPublisher(chunk_bytes=CHUNK))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self.call(serve_relay(self.relay, port))
        self.address = f"127.0.0.1:{self.server.port}"

    def call(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.call(self.server.stop(None))
        self.call(self.relay.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def state(self) -> tuple[int, dict[str, torch.Tensor]]:
        return LocalWeightSource(self.relay.publisher, wait_s=0).fetch_latest(0)
