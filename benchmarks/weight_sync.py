"""Weight sync learner -> N rollout workers on loopback: our gRPC paths vs a raw TCP copy of the same bytes.

    python benchmarks/weight_sync.py            # ~270 MB (SmolLM2-135M in bf16), N = 1 2 4, 3 repeats
    python benchmarks/weight_sync.py --mb 64 --repeats 5 --chunk-mb 8
    python benchmarks/weight_sync.py --smoke    # 2 MB, one repeat: what the test suite runs

The payload is a SmolLM2-135M-shaped state dict of random bf16 tensors (embedding 49152x576, then
decoder layers until --mb is reached), encoded once with the project's codec (safetensors bytes, bf16
on the wire, hashed chunks). Each receiver is a separate process; the learner is this process.

Methods (each delivers the whole payload into every receiver's memory):
- raw socket:       the learner writes N copies of the bytes over N TCP sockets (threads); receivers
                    recv_into a buffer. No hashing, no framing: the limit for one sender.
- raw socket chain: the learner writes one copy to receiver 1, which forwards every piece it reads to
                    receiver 2, and so on: the limit for a relay chain.
- grpc fetch:       every receiver Fetches the version from the learner concurrently (the simple path).
- grpc chain:       `WeightRelay.fan_out` along a chain (learner -> r1 -> r2 -> ...), chunks pipelined.
- grpc tree:        the same along a binary tree (learner -> r1, r2; r1 -> r3, r4).
- bulk chain/tree:  the same routes over the bulk data plane (`transport.weights.bulk_plane`): BulkOpen with
                    the manifest, then the payload over TCP into one buffer per receiver, each chunk hashed
                    as it lands and relayed from that buffer. What the runtime's `WeightFanout` uses.
With --tls every node is a worker of a secured job (TLS, the job token, signed weights; the bulk sockets
are TLS too); the raw-socket rows stay plaintext.
The gRPC methods hash every chunk once (BLAKE3, checked against the manifest, up to --verify-threads
chunks at a time per receiver) and check the bundle digest over the chunk digests before a receiver
holds the version (decoding into tensors, which a rollout worker does when it loads them, is not timed).

Reported per method and N: median wall time over --repeats runs (from the first byte sent to the
last receiver holding the version), sync rate = payload / wall (how fast every worker gets the new
weights), aggregate = N * payload / wall, the median of per-receiver rates (payload / that receiver's
own finish time), and the ratio of the sync rate to the raw-socket figure for the same N.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

from _weight_sync_nodes import Learner, receiver_cpu, run_grpc, run_raw, start_receivers, stop_receivers

from decentralized_verl.transport.digest import digest_hex

BF16_BYTES = 2
VOCAB, HIDDEN, INTER, HEADS_KV = 49152, 576, 1536, 3 * 64  # SmolLM2-135M: 30 layers, 9 heads, 3 kv heads


def smollm2_like_state(total_mb: float, seed: int = 0):
    """Random bf16 tensors named and shaped like SmolLM2-135M, truncated/extended to ~total_mb."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    budget = int(total_mb * 1e6) // BF16_BYTES
    embed_rows = min(VOCAB, max(1, budget // HIDDEN))
    state = {"model.embed_tokens.weight": torch.randn(embed_rows, HIDDEN, generator=gen).to(torch.bfloat16)}
    budget -= embed_rows * HIDDEN
    layer = {
        "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        "self_attn.k_proj.weight": (HEADS_KV, HIDDEN),
        "self_attn.v_proj.weight": (HEADS_KV, HIDDEN),
        "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        "mlp.gate_proj.weight": (INTER, HIDDEN),
        "mlp.up_proj.weight": (INTER, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, INTER),
        "input_layernorm.weight": (HIDDEN,),
        "post_attention_layernorm.weight": (HIDDEN,),
    }
    i = 0
    while budget > 0:
        for name, shape in layer.items():
            numel = 1
            for d in shape:
                numel *= d
            if numel > budget and len(shape) > 1:  # the last layer is partial: fill the budget exactly
                shape = (max(1, budget // shape[1]), shape[1])
                numel = shape[0] * shape[1]
            state[f"model.layers.{i}.{name}"] = torch.randn(*shape, generator=gen).to(torch.bfloat16)
            budget -= numel
            if budget <= 0:
                break
        i += 1
    state["model.norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    return state


# ------------------------------------------------------------------------------------------ report


def machine_info() -> list[str]:
    import grpc
    import torch

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"- machine: {platform.platform()}, CPU {cpu}, {os.cpu_count()} cores ({usable} usable)",
        f"- python {platform.python_version()}, torch {torch.__version__}, grpcio {grpc.__version__}",
        f"- load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]


def micro_costs(mb: int = 64) -> str:
    """Single-thread costs per byte on this machine: what each receiver pays besides the socket."""
    from decentralized_verl.proto import dverl_pb2 as pb

    data = os.urandom(4 << 20)
    n = max(1, mb // 4)

    def rate(fn) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return n * len(data) / (time.perf_counter() - t) / 1e9

    raw = pb.WeightChunk(data=data).SerializeToString()
    return (
        "- per-byte costs here (single thread, 4 MiB pieces): "
        f"BLAKE3 (the chunk digest) {rate(lambda: digest_hex(data)):.2f} GB/s, "
        f"sha256 {rate(lambda: hashlib.sha256(data)):.2f} GB/s, "
        f"protobuf serialize {rate(lambda: pb.WeightChunk(data=data).SerializeToString()):.2f} GB/s, "
        f"parse+read {rate(lambda: pb.WeightChunk.FromString(raw).data):.2f} GB/s, "
        f"memcpy {rate(lambda: bytearray(data)):.2f} GB/s"
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| method | receivers | median wall s | sync GB/s (payload/wall) | aggregate GB/s | "
        "per-receiver GB/s (median) | vs raw socket | CPU s sender / receivers | runs (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    raw = {r["n"]: r["sync"] for r in rows if r["method"] == "raw socket"}
    for r in rows:
        ratio = r["sync"] / raw[r["n"]] if raw.get(r["n"]) else float("nan")
        lines.append(
            f"| {r['method']} | {r['n']} | {r['wall']:.3f} | {r['sync']:.2f} | {r['sync'] * r['n']:.2f} | "
            f"{r['per']:.2f} | {ratio:.0%} | {r['cpu'][0]:.2f} / {r['cpu'][1]:.2f} | "
            f"{', '.join(f'{w:.3f}' for w in r['walls'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mb", type=float, default=270.0, help="payload size in MB (default ~SmolLM2-135M bf16)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--receivers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--chunk-mb", type=float, default=4.0, help="chunk (gRPC message) size in MiB")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["raw socket", "raw socket chain", "grpc fetch", "grpc chain", "grpc tree", "bulk chain"],
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unmeasured deliveries per method and N first (buffers allocated, connections open)",
    )
    parser.add_argument("--tls", action="store_true", help="secured job: TLS, token, signed weights")
    parser.add_argument(
        "--grpc-option",
        action="append",
        default=[],
        metavar="NAME=INT",
        help="extra gRPC channel/server option for every node, e.g. grpc.http2.max_frame_size=16777215",
    )
    parser.add_argument(
        "--verify-threads", type=int, default=2, help="chunks each receiver hashes at once (default 2)"
    )
    parser.add_argument("--smoke", action="store_true", help="2 MB, 256 KiB chunks, one repeat")
    args = parser.parse_args(argv)
    if args.smoke:
        args.mb, args.repeats, args.chunk_mb = 2.0, 1, 0.25
    chunk_bytes = int(args.chunk_mb * 1024 * 1024)
    grpc_options = [(k, int(v)) for k, v in (o.split("=", 1) for o in args.grpc_option)]

    from decentralized_verl.transport.weights.codec import encode_state_dict

    state = smollm2_like_state(args.mb)
    tls_dir, credentials = None, None
    if args.tls:
        import tempfile

        from decentralized_verl.security.credentials import run_folder_credentials, write

        base = Path(tempfile.mkdtemp(prefix="weight-sync-"))
        issued = run_folder_credentials(base, "weight-sync").issued
        tls_dir, credentials = str(write(base / "rollout", issued, "rollout")), issued.for_role("learner")
    learner = Learner(chunk_bytes, grpc_options, credentials)
    version = 0
    payload_bytes = encode_state_dict(state, 0, dtype="bfloat16", chunk_bytes=chunk_bytes).payload()
    size = len(payload_bytes)
    print(
        f"payload: {size / 1e6:.1f} MB in {-(-size // chunk_bytes)} chunks of {chunk_bytes / 2**20:g} MiB",
        flush=True,
    )
    rows: list[dict] = []
    info = machine_info()
    try:
        # the first n of them serve each N
        pool = start_receivers(max(args.receivers), grpc_options, args.verify_threads, tls_dir)
        try:
            for n in args.receivers:
                receivers = pool[:n]
                for method in args.methods:
                    walls: list[float] = []
                    pers: list[float] = []
                    cpu_sender = cpu_receivers = 0.0
                    for repeat in range(-args.warmup, args.repeats):
                        if not method.startswith("raw"):
                            version += 1
                            learner.relay.publish(state, version)  # encoding is not part of the sync
                        cpu0 = time.process_time(), receiver_cpu(receivers)
                        if method.startswith("raw"):
                            wall, each = run_raw(
                                payload_bytes, receivers, chunk_bytes, chain=method.endswith("chain")
                            )
                        else:
                            mode = method.split(" ", 1)[-1] if method.startswith("grpc") else method
                            wall, each = run_grpc(learner, version, receivers, mode)
                        if repeat < 0:
                            continue
                        cpu_sender += time.process_time() - cpu0[0]
                        cpu_receivers += receiver_cpu(receivers) - cpu0[1]
                        walls.append(wall)
                        pers.append(statistics.median(size / t / 1e9 for t in each))
                    wall = statistics.median(walls)
                    rows.append(
                        dict(
                            method=method,
                            n=n,
                            wall=wall,
                            sync=size / wall / 1e9,
                            per=statistics.median(pers),
                            cpu=(cpu_sender / args.repeats, cpu_receivers / args.repeats),
                            walls=walls,
                        )
                    )
                    print(f"  {method} x{n}: median {wall:.3f}s", file=sys.stderr, flush=True)
        finally:
            stop_receivers(pool)
    finally:
        learner.stop()
    print()
    command = shlex.join(["python", "benchmarks/weight_sync.py", *(sys.argv[1:] if argv is None else argv)])
    print(f"Command: `{command}`")
    print()
    print("\n".join(info))
    print(f"- load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"- payload {size / 1e6:.1f} MB, chunks {chunk_bytes / 2**20:g} MiB, "
        f"median of {args.repeats} run(s) after {args.warmup} unmeasured, "
        f"{args.verify_threads} hashing thread(s) per receiver, "
        + ("secured (TLS, token, signed weights)" if args.tls else "plaintext")
    )
    print(micro_costs(8 if args.smoke else 64))
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
