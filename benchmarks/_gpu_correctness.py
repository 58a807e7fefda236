"""The GPU check's correctness parts: each compares one fast path with its plain reference on the device.

Every part returns a dict with ``passed`` and the measured error beside the tolerance it was held to, so a
failure on CUDA reads as numbers, not as a bare assertion. Tolerances: float32 parts run with TF32 off
(TF32 rounds matmul inputs to 10 bits and would hide real differences); bfloat16 parts are held to a few
bf16 ulps of the values compared (bf16 keeps 8 significant bits: ~0.4% relative).
Heavy imports happen inside functions, so `gpu_check.py --help` stays fast.
"""

from __future__ import annotations

import copy
import math
import tempfile
from pathlib import Path
from typing import Any

PAD = 0


def _strict_float32() -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def llama(device: str, dtype: str, *, tiny: bool, seed: int = 0, init_range: float = 0.02) -> Any:
    """A SmolLM2-shaped Llama (tied embeddings, 3:1 grouped-query heads, rope theta 1e5) at a test size,
    or at SmolLM2's own width for a device run."""
    import torch
    import transformers

    if tiny:
        sizes = dict(vocab_size=512, hidden_size=96, intermediate_size=256, num_hidden_layers=2)
        heads = dict(num_attention_heads=6, num_key_value_heads=2)
    else:
        sizes = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=4)
        heads = dict(num_attention_heads=9, num_key_value_heads=3)
    config = transformers.LlamaConfig(
        **sizes, **heads, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=512, pad_token_id=PAD, initializer_range=init_range,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=getattr(torch, dtype))


def grouped_batch(vocab: int, device: str, *, tiny: bool, seed: int = 0) -> Any:
    """Prompt groups of different lengths (so left padding differs) with responses of varied lengths."""
    import torch

    from decentralized_verl.core.samples import Prompt, Sample, collate

    g = torch.Generator().manual_seed(seed)
    sizes, prompt_len, max_response = ((3, 1, 4), 4, 9) if tiny else ((8, 8, 4, 8), 96, 128)
    samples = []
    for group, size in enumerate(sizes):
        prompt = tuple(torch.randint(1, vocab, (prompt_len + 3 * group,), generator=g).tolist())
        for k in range(size):
            n = int(torch.randint(1, max_response, (1,), generator=g))
            response = tuple(torch.randint(1, vocab, (n,), generator=g).tolist())
            samples.append(
                Sample(Prompt(f"p{group}", group, prompt, ""), k, response, (0.0,) * n, "stop", "", 0)
            )
    return collate(samples, PAD).to(device)


def _grads(model: Any) -> Any:
    import torch

    return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])


def _relative(a: Any, b: Any) -> float:
    return float((a - b).norm() / (b.norm() + 1e-12))


def shared_prompt_forward(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    """The learner's shared-prompt forward against the model's own call over the padded batch: log-probs,
    entropies and gradients, in float32 and bfloat16."""
    import torch

    from decentralized_verl.core.forward import response_logprobs, shared_prompts

    _strict_float32()
    results: dict[str, Any] = {}
    tolerances = {
        "float32": {"logprob_abs": 1e-4, "grad_rel": 1e-4},
        "bfloat16": {"logprob_abs": 0.15, "grad_rel": 0.05},
    }
    for dtype, tol in tolerances.items():
        model = llama(device, dtype, tiny=tiny)
        batch = grouped_batch(model.config.vocab_size, device, tiny=tiny)
        assert shared_prompts(batch.input_ids[:, : batch.prompt_length]) is not None
        plain, shared = copy.deepcopy(model), copy.deepcopy(model)
        want, want_h = response_logprobs(plain, batch, entropy=True, plain=True)
        got, got_h = response_logprobs(shared, batch, entropy=True)
        weights = torch.linspace(-1, 1, want.numel(), device=want.device).view_as(want)
        ((want * weights).sum() + want_h.sum() * 0.1).backward()
        ((got * weights).sum() + got_h.sum() * 0.1).backward()
        mask = batch.response_mask.bool()
        logprob_err = float((got - want)[mask].abs().max())
        entropy_err = float((got_h - want_h)[mask].abs().max())
        grad_err = _relative(_grads(shared), _grads(plain))
        results[dtype] = {
            "logprob_max_abs": logprob_err,
            "entropy_max_abs": entropy_err,
            "grad_rel": grad_err,
            "tolerance": tol,
            "passed": logprob_err <= tol["logprob_abs"]
            and entropy_err <= tol["logprob_abs"]
            and grad_err <= tol["grad_rel"],
        }
    return {"passed": all(r["passed"] for r in results.values()), "by_dtype": results}


def grouped_attention(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    """The grouped-query attention kernel against SDPA over repeated key/value heads, causal with the
    queries at the end of the keys and with a boolean padding mask, float32 and bfloat16."""
    import torch

    from decentralized_verl.models.grouped_attention import grouped_attention as attend

    class Module(torch.nn.Module):
        is_causal = True

    _strict_float32()
    batch, heads, kv_heads, q_len, k_len, dim = (2, 6, 2, 3, 5, 8) if tiny else (4, 14, 2, 64, 512, 64)
    g = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {}
    for dtype_name, tol in (("float32", 1e-5), ("bfloat16", 2e-2)):
        dtype = getattr(torch, dtype_name)
        q = torch.randn(batch, heads, q_len, dim, generator=g).to(device, dtype)
        k = torch.randn(batch, kv_heads, k_len, dim, generator=g).to(device, dtype)
        v = torch.randn(batch, kv_heads, k_len, dim, generator=g).to(device, dtype)
        allowed = torch.rand(batch, 1, q_len, k_len, generator=g).to(device) > 0.3
        allowed[..., 0] = True
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(diagonal=k_len - q_len)
        errors = {}
        for label, mask, reference_mask in (("causal", None, causal), ("masked", allowed, allowed)):
            out, _ = attend(Module(), q, k, v, mask)
            groups = heads // kv_heads
            want = torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=reference_mask
            ).transpose(1, 2)
            errors[label] = float((out.float() - want.float()).abs().max())
        results[dtype_name] = {"max_abs": errors, "tolerance": tol, "passed": max(errors.values()) <= tol}
    return {"passed": all(r["passed"] for r in results.values()), "by_dtype": results}


def chunked_logprobs(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    """The chunked token log-prob (forward keeps one log-sum-exp per row, backward rebuilds each chunk's
    softmax) against log_softmax + gather over the whole logits, values and gradients."""
    import torch

    from decentralized_verl.core.token_logprobs import token_logprobs

    _strict_float32()
    rows, vocab = (37, 300) if tiny else (2048, 151936)
    g = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {}
    for dtype_name, tol in (("float32", 1e-5), ("bfloat16", 1e-2)):
        dtype = getattr(torch, dtype_name)
        base = (torch.randn(rows, vocab, generator=g) * 3).to(device, dtype)
        tokens = torch.randint(0, vocab, (rows,), generator=g).to(device)
        weights = torch.randn(rows, generator=g).to(device)
        a = base.clone().requires_grad_(True)
        b = base.clone().requires_grad_(True)
        got = token_logprobs(a, tokens, 0.7)
        want = torch.log_softmax(b.float() / 0.7, -1).gather(-1, tokens[:, None]).squeeze(-1)
        (got * weights).sum().backward()
        (want * weights).sum().backward()
        value_err = float((got - want).abs().max())
        grad_err = _relative(a.grad.float(), b.grad.float())
        results[dtype_name] = {
            "value_max_abs": value_err,
            "grad_rel": grad_err,
            "tolerance": tol,
            "passed": value_err <= tol and grad_err <= tol,
        }
    return {"passed": all(r["passed"] for r in results.values()), "by_dtype": results}


def _tiny_spec(sharding: str) -> Any:
    from decentralized_verl.spec.manifest import parse_spec

    return parse_spec(
        {
            "model": {"tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128}},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "unused.jsonl"},
            "roles": {
                "rollout": {"replicas": 1, "batchSize": 2},
                "learner": {"replicas": 1, "sharding": sharding},
            },
            "training": {"batchSize": 2, "minibatchSize": 2, "learningRate": 0.01, "warmupSteps": 0},
        }
    )


def _train_batch(model: Any, step: int) -> Any:
    """Two prompt groups of two samples with the model's own log-probs and advantages attached."""
    import torch

    from decentralized_verl.core.samples import Prompt, Sample, collate
    from decentralized_verl.training.advantage_step import AlgorithmSettings, attach_advantages

    g = torch.Generator().manual_seed(step)
    samples = []
    for group in range(2):
        prompt = tuple(torch.randint(5, 90, (3 + group,), generator=g).tolist())
        for k in range(2):
            response = tuple(torch.randint(5, 90, (3 + k,), generator=g).tolist())
            samples.append(
                Sample(Prompt(f"p{step}-{group}", group, prompt, ""), k, response, (-1.0,) * len(response),
                       "stop", "", 0, score=float(k == 0))
            )  # fmt: skip
    batch = collate(samples, PAD)
    attach_advantages(batch, AlgorithmSettings.from_spec(_tiny_spec("fsdp")))
    return batch


def fsdp2_checkpoint(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    """An FSDP2 learner at world size 1 (nccl on CUDA, gloo on CPU) trains two steps, writes a
    torch.distributed.checkpoint, and a fresh learner restored from it takes the same third step."""
    from decentralized_verl.models.tiny import build_tiny, tiny_config
    from decentralized_verl.models.tokenizer import build_char_tokenizer
    from decentralized_verl.training.checkpoints.sharded import load_sharded, save_sharded
    from decentralized_verl.training.sharding import gathered_digest
    from decentralized_verl.training.trainer import PolicyTrainer

    spec = _tiny_spec("fsdp")

    def learner() -> PolicyTrainer:
        model = build_tiny(tiny_config(spec.model.tiny, build_char_tokenizer()), spec.model.tiny.seed)
        return PolicyTrainer(model.to(device), spec, distributed=True)

    first = learner()
    losses = [first.update(_train_batch(first.model, step))["pg_loss"] for step in range(2)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "checkpoint-2"
        save_sharded(first.model, first.optimizer, first.scheduler, folder, {"step": 2, "policy_version": 2})
        second = learner()
        state = load_sharded(second.model, second.optimizer, second.scheduler, folder)
    restored = gathered_digest(second.model) == gathered_digest(first.model)
    third = _train_batch(first.model, 2)
    a = first.update(third)
    b = second.update(copy.deepcopy(third))
    same_step = abs(a["pg_loss"] - b["pg_loss"]) <= 1e-5 and gathered_digest(first.model) == gathered_digest(
        second.model
    )
    backend = _backend_name()
    return {
        "passed": restored and same_step and int(state["step"]) == 2,
        "process_group_backend": backend,
        "losses": losses,
        "restored_weights_equal": restored,
        "third_step_equal": same_step,
        "third_step_pg_loss": [a["pg_loss"], b["pg_loss"]],
    }


def _backend_name() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_initialized() else None


def weight_refresh(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    """A live HF rollout backend on the device receives new weights as a rollout worker does (CPU tensors
    off the wire) and then decodes exactly what a backend built on those weights decodes (greedy)."""
    from decentralized_verl.backends.base import GenerationRequest
    from decentralized_verl.backends.hf import HFBackend
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    # Wide initial weights: at the default scale a tied-embedding model only repeats its last token,
    # whatever its weights, and a refresh that changed nothing would look the same as one that worked.
    old, new = (llama(device, "float32", tiny=True, seed=seed, init_range=0.5) for seed in (0, 1))
    live = HFBackend(old, tokenizer, version=0)
    reference = HFBackend(copy.deepcopy(new), tokenizer, version=1)
    params = SamplingParams(temperature=0.0, max_new_tokens=8 if tiny else 64)
    requests = [GenerationRequest(f"r{i}", tuple(range(3 + i, 9 + 2 * i)), params) for i in range(4)]

    def decode(backend: HFBackend) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
        outputs = sorted(backend.generate(requests), key=lambda o: o.prompt_id)
        return [(out.response_token_ids, out.logprobs) for out in outputs]

    before = decode(live)
    wire = {name: tensor.detach().to("cpu") for name, tensor in new.state_dict().items()}
    live.load_weights(wire, 1)
    after, want = decode(live), decode(reference)
    same_tokens = [a[0] for a in after] == [w[0] for w in want]
    logprob_err = max(
        abs(x - y) for a, w in zip(after, want, strict=True) for x, y in zip(a[1], w[1], strict=False)
    )
    return {
        "passed": same_tokens and logprob_err <= 1e-4 and live.version == 1,
        "changed_by_refresh": before != after,
        "logprob_max_abs_vs_reference": logprob_err,
        "tokens_after": [a[0] for a in after],
        "tokens_reference": [w[0] for w in want],
    }


def qlora(device: str, tiny: bool, **_: Any) -> dict[str, Any]:
    """QLoRA on the device: a Llama with its base in 4 bits (NF4, double-quantized) trains its adapters
    (finite loss, every adapter gets a gradient); the reference (adapters off on the learner's own model)
    equals a base loaded alone; a second copy given only the adapters computes the learner's log-probs.
    Reports the learner's memory on CUDA, and there, where vLLM is installed, runs vLLM's QLoRA path."""
    import torch

    from decentralized_verl.core.forward import response_logprobs
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.models.lora import base_only
    from decentralized_verl.spec.manifest import parse_spec
    from decentralized_verl.training.trainer import rollout_state_dict

    width = 128 if tiny else 576
    spec = parse_spec(
        {
            "model": {
                "tiny": {"hiddenSize": width, "numLayers": 2, "numHeads": 4, "intermediateSize": 2 * width},
                "dtype": "bfloat16" if device == "cuda" else "float32",
                "lora": {"rank": 8, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
                "quantization": {"type": "nf4", "doubleQuant": True},
            },
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2},
            "data": {"train": "unused.jsonl"},
        }
    )
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    learner, _ = load_model_and_tokenizer(spec.model, device=device)
    optimizer = torch.optim.AdamW([p for p in learner.parameters() if p.requires_grad], lr=1e-2)
    batch = _train_batch(learner, 0)
    losses, missing = [], []
    learner.train()
    for _step in range(2):
        ids = batch.input_ids.to(device)
        loss = learner(input_ids=ids, labels=ids).loss
        loss.backward()
        missing = [n for n, p in learner.named_parameters() if p.requires_grad and p.grad is None]
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    scoring = batch.to(device)
    with torch.no_grad():
        with base_only(learner):
            reference, _ = response_logprobs(learner, scoring)
        plain, _ = load_model_and_tokenizer(spec.model.model_copy(update={"lora": None}), device=device)
        alone, _ = response_logprobs(plain.eval(), scoring)
        rollout, _ = load_model_and_tokenizer(spec.model, device=device)
        theirs = dict(rollout.named_parameters())
        for name, tensor in rollout_state_dict(learner).items():
            theirs[name].copy_(tensor.to("cpu").to(device))
        learner.eval()
        ours, _ = response_logprobs(learner, scoring)
        got, _ = response_logprobs(rollout.eval(), scoring)
    reference_err = float((reference - alone).abs().max())
    refresh_err = float((ours - got).abs().max())
    result = {
        "passed": all(map(math.isfinite, losses))
        and not missing
        and reference_err <= 1e-4
        and refresh_err <= 1e-4,
        "losses": losses,
        "adapters_without_grad": missing[:5],
        "reference_vs_base_alone_max_abs": reference_err,
        "adapters_only_refresh_max_abs": refresh_err,
    }
    if device == "cuda":
        result["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        vllm = _qlora_vllm(learner, spec)
        result.update(vllm)
        result["passed"] = result["passed"] and vllm.get("vllm_passed", True)
    return result


def _qlora_vllm(learner: Any, spec: Any) -> dict[str, Any]:
    """vLLM's QLoRA path, where this machine has vLLM: the engine loads the dequantized base with LoRA
    on, the learner's adapters arrive as the next version's `LoRARequest`, and the engine's sampled-token
    log-probs are held against the learner's own forward: closer to it than to the adapter-free base (the
    adapters are on), and within a bf16 engine's usual distance."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"vllm": "not installed here: the vLLM QLoRA path did not run"}
    import torch

    from decentralized_verl.backends.vllm_backend import VLLMBackend
    from decentralized_verl.core.forward import response_logprobs
    from decentralized_verl.core.samples import Prompt, collate
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.models.lora import base_only
    from decentralized_verl.serving.rollout import RolloutWorker
    from decentralized_verl.training.trainer import rollout_state_dict

    backend = None
    try:
        host, tokenizer = load_model_and_tokenizer(spec.model, device="cpu")  # the backend's host copy
        backend = VLLMBackend(
            host, tokenizer, seed=0, enforce_eager=True, engine_kwargs={"gpu_memory_utilization": 0.3}
        )
        worker = RolloutWorker(backend, "gpu-check", backend_name="vllm")
        first = backend._lora.lora_int_id
        worker.load_weights({k: v.to("cpu") for k, v in rollout_state_dict(learner).items()}, 1)
        second = backend._lora.lora_int_id
        items = [
            (Prompt(f"p{i}", i, tuple(tokenizer(f"{i}+{i}=", add_special_tokens=False)["input_ids"]), ""), k)
            for i in range(4)
            for k in range(4)
        ]
        samples = list(worker.generate_sync(items, SamplingParams(max_new_tokens=16, temperature=1.0), 1))
        batch = collate(samples, tokenizer.pad_token_id).to(next(learner.parameters()).device)
        mask = batch.response_mask.bool()
        learner.eval()
        with torch.no_grad():
            ours, _ = response_logprobs(learner, batch)
            with base_only(learner):
                base, _ = response_logprobs(learner, batch)
        engine = batch.old_logprobs
        to_learner = float((ours - engine).abs()[mask].mean())
        to_base = float((base - engine).abs()[mask].mean())
        return {
            "vllm_passed": (first, second) == (1, 2) and to_learner < 0.1 and to_learner < to_base / 2,
            "vllm_lora_ids": [first, second],
            "vllm_vs_learner_mean_abs": to_learner,
            "vllm_vs_learner_max_abs": float((ours - engine).abs()[mask].max()),
            "vllm_vs_adapter_free_base_mean_abs": to_base,
        }
    except Exception as exc:  # reported beside the rest of the part, which stands on its own
        return {"vllm_passed": False, "vllm_error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        if backend is not None:
            backend.close()


PARTS = {
    "qlora": qlora,
    "shared_prompt_forward": shared_prompt_forward,
    "grouped_attention": grouped_attention,
    "chunked_logprobs": chunked_logprobs,
    "fsdp2_checkpoint": fsdp2_checkpoint,
    "weight_refresh": weight_refresh,
}
