"""Placing a policy's layer spans on rollout workers by their memory, when no one worker holds it whole.

Pure arithmetic over the model's shape (a config.json, a GGUF header or the known-shapes table: no weight
is read), as Petals places blocks on servers by what each can hold. The front (embeddings, final norm,
LM head and sampling) goes on the first worker; then each worker, in order, takes as many of the next
layers as fit in its memory after its share of the KV cache and workspace. A span holds its layers'
weights, their KV cache for the rows decoded together, and one layer's temporaries.

`python -m decentralized_verl.planning.spans CONFIG.json --worker-memory 24Gi --workers 8` prints the
placement (what each worker holds) or says how much memory is missing.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decentralized_verl.planning import memory as mem
from decentralized_verl.planning.devices import GIB, quantity_bytes
from decentralized_verl.planning.memory import (
    Component,
    Estimate,
    kv_cache_bytes,
    layer_transient_bytes,
    peak_bytes,
)
from decentralized_verl.planning.rollout_memory import HF_DECODE_ROWS
from decentralized_verl.planning.shapes import ModelShape, shape_from_config

USABLE = 0.9
"""Share of a worker's memory a span may fill (the rest: the runtime, allocator slack, fragmentation)."""


class SpanPlanError(ValueError):
    """The model's layers do not fit the workers given; the message says how much is missing."""


@dataclass(frozen=True)
class Load:
    """What one generation asks of the chain: rows decoded together and their tokens."""

    rows: int = HF_DECODE_ROWS
    tokens: int = 2048
    dtype_bytes: int = 2


@dataclass(frozen=True)
class SpanPlace:
    """One worker's part: the front (when `front`), and decoder layers [start, end) (none when equal)."""

    worker: str
    memory: int
    start: int
    end: int
    front: bool
    weight_bytes: int
    cache_bytes: int
    workspace_bytes: int

    @property
    def layers(self) -> int:
        return self.end - self.start

    @property
    def total(self) -> int:
        return self.weight_bytes + self.cache_bytes + self.workspace_bytes


@dataclass(frozen=True)
class SpanPlacement:
    places: tuple[SpanPlace, ...]
    layers: int

    @property
    def spans(self) -> list[tuple[int, int]]:
        return [(p.start, p.end) for p in self.places if p.layers]


def layer_bytes(shape: ModelShape, load: Load) -> tuple[int, int]:
    """(weights, KV cache) of one decoder layer under `load`."""
    one = shape.layer_parameters() * load.dtype_bytes
    cache = kv_cache_bytes(shape, load.dtype_bytes, load.rows, load.tokens) // shape.layers
    return one, cache


def front_bytes(shape: ModelShape, load: Load) -> tuple[int, int]:
    """(weights, workspace) of the front: embeddings, LM head and norm; the logits it samples from."""
    return shape.embedding_parameters() * load.dtype_bytes, load.rows * shape.vocab * 4 * 3


def place_spans(shape: ModelShape, workers: Sequence[tuple[str, int]], load: Load = Load()) -> SpanPlacement:
    """Contiguous spans over `workers` ((name, memory bytes), in chain order); every layer placed once."""
    if not workers:
        raise SpanPlanError("spans: no rollout worker to place the model on")
    weight, cache = layer_bytes(shape, load)
    workspace = layer_transient_bytes(shape, load.dtype_bytes, load.rows)
    front_weight, front_work = front_bytes(shape, load)
    places: list[SpanPlace] = []
    start = 0
    for index, (name, memory) in enumerate(workers):
        usable = int(memory * USABLE)
        front = index == 0
        fixed = (front_weight + front_work) if front else 0
        if front and fixed > usable:
            raise SpanPlanError(
                f"spans: the front (embeddings, LM head, logits: {fixed / GIB:.1f} GiB) does not fit "
                f"worker {name} ({usable / GIB:.1f} GiB usable)"
            )
        room = usable - fixed - workspace
        count = max(0, min(shape.layers - start, room // (weight + cache))) if room > 0 else 0
        if count == 0 and not front:
            continue
        places.append(
            SpanPlace(
                name,
                memory,
                start,
                start + count,
                front,
                front_weight * front + count * weight,
                count * cache,
                front_work * front + (workspace if count else 0),
            )
        )
        start += count
        if start == shape.layers:
            break
    if start < shape.layers:
        missing = (shape.layers - start) * (weight + cache)
        per_worker = int(min(m for _, m in workers) * USABLE) - workspace
        more = (
            math.ceil((shape.layers - start) / max(1, per_worker // (weight + cache)))
            if per_worker > 0
            else None
        )
        hint = f"; about {more} more worker(s) like the smallest" if more else ""
        raise SpanPlanError(
            f"spans: {shape.layers - start} of {shape.layers} layers fit on no worker "
            f"({missing / GIB:.1f} GiB more is needed at {load.rows} rows x {load.tokens} tokens{hint})"
        )
    return SpanPlacement(tuple(places), shape.layers)


def chain_estimate(shape: ModelShape, b: int, gen: Any, on_gpu: bool, count: int) -> Estimate:
    """The heaviest process of a rollout worker's chain of `count` spans (`roles.rollout.spans`): the
    front (embeddings, LM head, sampling logits) or the largest span (its layers' weights, their share of
    the KV cache, one layer's temporaries). Every process of the chain gets the rollout role's resources,
    so the role fits when its heaviest process does."""
    device = "gpu" if on_gpu else "host"
    rows = min(gen.sequences, HF_DECODE_ROWS)
    length = gen.prompt_tokens + gen.response_tokens
    layers = -(-shape.layers // count)
    kv = kv_cache_bytes(shape, b, rows, length) * layers // shape.layers
    span = [
        Component(
            "span weights",
            layers * shape.layer_parameters() * b,
            device,
            detail=f"{layers} of {shape.layers} layers",
        ),
        Component(
            "kv cache",
            kv,
            device,
            phase="generation",
            detail=f"{layers} layers x {rows} rows x {length} tokens",
        ),
        Component(
            "workspace", layer_transient_bytes(shape, b, rows * gen.prompt_tokens), device, phase="generation"
        ),
    ]
    front = [
        Component(
            "front weights", shape.embedding_parameters() * b, device, detail="embeddings, LM head, norm"
        ),
        Component(
            "workspace", rows * shape.vocab * 4 * 3, device, phase="generation", detail="sampling logits"
        ),
    ]
    runtime = mem.runtime_components(on_gpu)
    heaviest = max((span, front), key=lambda parts: peak_bytes(parts, device))
    return Estimate(tuple(heaviest + runtime))


def smallest_chain(
    shape: ModelShape, b: int, gen: Any, on_gpu: bool, fits: Any
) -> tuple[int, Estimate] | None:
    """The fewest spans (2 or more) whose heaviest process `fits`, with its estimate; None if none does."""
    for count in range(2, shape.layers + 1):
        estimate = chain_estimate(shape, b, gen, on_gpu, count)
        if fits(estimate):
            return count, estimate
    return None


def render(placement: SpanPlacement) -> str:
    lines = [f"{'worker':<16} {'holds':<28} {'weights':>9} {'kv cache':>9} {'total':>9} {'memory':>9}"]
    for p in placement.places:
        holds = ("front + " if p.front else "") + (f"layers {p.start}:{p.end}" if p.layers else "")
        lines.append(
            f"{p.worker:<16} {holds.removesuffix(' + '):<28} {p.weight_bytes / GIB:>8.1f}G "
            f"{p.cache_bytes / GIB:>8.1f}G {p.total / GIB:>8.1f}G {p.memory / GIB:>8.1f}G"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Place a model's layer spans on workers by memory.")
    parser.add_argument("config", help="a model's config.json (no weights needed)")
    parser.add_argument("--worker-memory", required=True, help="each worker's memory, e.g. 24Gi")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--rows", type=int, default=HF_DECODE_ROWS)
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args(argv)
    shape = shape_from_config(json.loads(Path(args.config).read_text()), source=args.config)
    memory = quantity_bytes(args.worker_memory)
    workers = [(f"rollout-{i}", memory) for i in range(args.workers)]
    try:
        print(render(place_spans(shape, workers, Load(rows=args.rows, tokens=args.tokens))))
    except SpanPlanError as exc:
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
