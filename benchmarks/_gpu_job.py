"""The GPU check's end-to-end parts: `dverl run` of the tiny GRPO job with separate learner, rollout and
reward processes over gRPC, then a SmolLM2-shaped job (random init, SmolLM2's tokenizer) for a few steps.

On a GPU the parts also watch `nvidia-smi` while the job runs: a job that trained without any of its
processes holding GPU memory ran on the CPU, and that is reported as a failure of the GPU path, not as a
pass.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


class GpuWatch:
    """Polls `nvidia-smi --query-compute-apps` in the background; `pids` are every process seen on a GPU."""

    def __init__(self, period_s: float = 2.0) -> None:
        self.pids: set[int] = set()
        self.available = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)

    def _run(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            query = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
            try:
                text = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            self.pids.update(int(line) for line in text.split() if line.strip().isdigit())

    def __enter__(self) -> GpuWatch:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)


def tiny_manifest(out: Path, steps: int) -> Path:
    """examples/tiny-grpo.yaml with its roles as separate processes: one learner, one rollout, one reward."""
    doc = yaml.safe_load((ROOT / "examples" / "tiny-grpo.yaml").read_text())
    spec = doc["spec"]
    for key in ("train", "eval"):
        spec["data"][key] = str((ROOT / "examples" / spec["data"][key]).resolve())
    spec["roles"] = {
        "rollout": {"replicas": 1, "backend": "hf", "batchSize": spec["roles"]["rollout"]["batchSize"]},
        "reward": {"replicas": 1},
        "learner": {"replicas": 1},
    }
    spec["training"]["steps"] = steps
    spec["training"]["evalEvery"] = max(1, steps // 4)
    path = out / "tiny-grpo-processes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _run(manifest: Path, output: Path, timeout: float) -> dict[str, Any]:
    from decentralized_verl.launch.run import run_job

    return run_job(manifest, output, progress=False, timeout=timeout)


def tiny_job(device: str, tiny: bool, *, out_dir: Path, budget_s: float = 900.0, **_: Any) -> dict[str, Any]:
    """The tiny GRPO job end to end: completes every step; on a full run its reward rises."""
    steps = 6 if tiny else 200
    work = out_dir / "tiny-job"
    work.mkdir(parents=True, exist_ok=True)
    with GpuWatch() as watch:
        summary = _run(tiny_manifest(work, steps), work / "run", timeout=budget_s * 0.9)
    rising = summary["reward_last"] > summary["reward_first"] + 0.15
    on_gpu = bool(watch.pids)
    passed = summary["steps"] == steps and (tiny or rising) and (on_gpu or not device.startswith("cuda"))
    return {
        "passed": passed,
        "steps": summary["steps"],
        "reward_first": summary["reward_first"],
        "reward_last": summary["reward_last"],
        "reward_rising": rising,
        "gpu_processes_seen": sorted(watch.pids) if watch.available else None,
        "note": None if on_gpu or not device.startswith("cuda") else "no process of the job held GPU memory",
    }


def smollm2_shaped_folder(tokenizer_dir: Path | None, out: Path, tiny: bool) -> Path:
    """A Hugging Face folder: SmolLM2-135M's Llama config (a test-sized one for the dry run), random
    weights, SmolLM2's tokenizer (the character tokenizer's stand-in for the dry run)."""
    import torch
    import transformers

    if tokenizer_dir is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    else:
        from decentralized_verl.models.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
    sizes = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
        if tiny
        else dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3)
    )  # fmt: skip
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
        max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **sizes,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    folder = out / "smollm2-shaped"
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def smollm2_job(
    device: str, tiny: bool, *, out_dir: Path, assets: Path | None = None, budget_s: float = 600.0, **_: Any
) -> dict[str, Any]:
    """A SmolLM2-shaped job for a few steps over the arithmetic data: it completes them."""
    steps = 2 if tiny else 5
    work = out_dir / "smollm2-job"
    work.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = None if tiny or assets is None else assets / "smollm2-tokenizer"
    folder = smollm2_shaped_folder(tokenizer_dir, work, tiny)
    arithmetic = ROOT / "examples" / "data" / "arithmetic"
    doc = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "smollm2-shaped"},
        "spec": {
            "model": {"path": str(folder), "dtype": "float32" if tiny else "bfloat16"},
            "algorithm": {"name": "grpo", "samplesPerPrompt": 2 if tiny else 8, "klCoef": 0.0},
            "data": {
                "train": str(arithmetic / "small_train.jsonl"),
                "rewardType": "boxed",
                "maxPromptTokens": 512,
                "maxNewTokens": 4 if tiny else 128,
            },
            "roles": {"rollout": {"replicas": 1, "batchSize": 2 if tiny else 8}, "learner": {"replicas": 1}},
            "training": {"steps": steps, "batchSize": 2 if tiny else 8, "minibatchSize": 2 if tiny else 8},
        },
    }
    manifest = work / "smollm2-shaped.yaml"
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
    with GpuWatch() as watch:
        summary = _run(manifest, work / "run", timeout=budget_s * 0.9)
    on_gpu = bool(watch.pids)
    return {
        "passed": summary["steps"] == steps and (on_gpu or not device.startswith("cuda")),
        "steps": summary["steps"],
        "gpu_processes_seen": sorted(watch.pids) if watch.available else None,
    }


SERVING_ROLES = ("rollout", "reference", "critic", "reward")
"""The roles besides the learner whose workers the every-role part starts as their own processes."""
TINY_MODEL = {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "intermediateSize": 128, "maxPositions": 128}


def every_role_manifest(out: Path, device: str, steps: int, name: str = "every-role") -> Path:
    """PPO with a KL penalty and a reward model: a learner, an HF rollout, a reference, a critic and a
    reward-model worker, each its own process given one GPU and told `device` outright (so a GPU run
    whose worker cannot have CUDA fails at that worker's start, naming the field)."""
    toy = ROOT / "examples" / "data" / "toy"
    gpu = {"resources": {"gpus": 1}} if device.startswith("cuda") else {}
    role = {"replicas": 1, "device": "cuda" if device.startswith("cuda") else "cpu", **gpu}
    doc = {
        "apiVersion": "dverl.io/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"tiny": TINY_MODEL, "dtype": "float32"},
            "algorithm": {"name": "ppo", "samplesPerPrompt": 2, "klCoef": 0.01},
            "data": {
                "train": str(toy / "train.jsonl"),
                "rewardType": "reward_model",
                "rewardModel": {"tiny": TINY_MODEL},
                "maxPromptTokens": 64,
                "maxNewTokens": 8,
            },
            "roles": {
                "rollout": {**role, "backend": "hf", "batchSize": 8},
                "learner": dict(role),
                "reference": dict(role),
                "critic": dict(role),
                "reward": dict(role),
            },
            "training": {"steps": steps, "batchSize": 8, "evalEvery": 0, "refitParityBound": 0.05},
        },
    }
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _readiness(address: str, caller: Any) -> Any:
    """A serving worker's Ready reply (its device and the GPU memory it holds), or None while it cannot
    answer."""
    import grpc

    from decentralized_verl.proto import dverl_pb2 as pb
    from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
    from decentralized_verl.transport import messages as m
    from decentralized_verl.transport import secure

    try:
        with secure.sync_channel(address, caller) as channel:
            return m.readiness_from_proto(pb_grpc.HealthStub(channel).Ready(pb.ReadyRequest(), timeout=2))
    except grpc.RpcError:
        return None


def every_role_job(
    device: str, tiny: bool, *, out_dir: Path, budget_s: float = 600.0, **_: Any
) -> dict[str, Any]:
    """Every role on the device in one job: each serving worker says, in its Ready reply, which device it
    chose and how much GPU memory its own tensors hold (`runtime.device.memory_allocated`, read in that
    process); the learner must show up on the GPU too. On CUDA the part fails unless every one of them
    holds GPU memory; on the CPU dry run, unless every one says cpu and holds none."""
    import time

    from decentralized_verl.launch.local import LocalCluster
    from decentralized_verl.launch.run import write_config
    from decentralized_verl.planning.plan import plan_job
    from decentralized_verl.reporting.metrics import read_metrics
    from decentralized_verl.security.credentials import CallerCredentials, run_folder_credentials
    from decentralized_verl.spec.manifest import load_job

    steps = 3 if tiny else 20
    work = out_dir / "every-role-job"
    work.mkdir(parents=True, exist_ok=True)
    manifest = every_role_manifest(work, device, steps)
    job = load_job(manifest)
    output = work / "run"
    config = write_config(job, manifest, output)
    credentials = run_folder_credentials(output, job.metadata.name)
    observer = credentials.for_role("observer")
    caller = CallerCredentials(observer.ca, observer.token)
    cluster = LocalCluster(plan_job(job.spec, job.metadata.name), config, output, credentials=credentials)
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + budget_s * 0.9
    with GpuWatch() as watch, cluster:
        cluster.start()
        learner = cluster.by_role("learner")[0]
        while learner.process.poll() is None and time.monotonic() < deadline:
            for role in SERVING_ROLES:
                worker = cluster.by_role(role)[0]
                reply = _readiness(worker.address, caller)
                if reply is not None and reply.ready:
                    held = max(seen.get(role, {}).get("memory_allocated", 0), reply.device_memory_allocated)
                    seen[role] = {"worker": reply.worker_id, "device": reply.device, "memory_allocated": held}
            time.sleep(1.0)
        learner_pid = learner.process.pid
        code = learner.process.poll()
    records = read_metrics(output / "metrics.jsonl") if (output / "metrics.jsonl").exists() else []
    on_cuda = device.startswith("cuda")
    roles_ok = {
        role: role in seen
        and (
            seen[role]["device"].startswith("cuda") and seen[role]["memory_allocated"] > 0
            if on_cuda
            else seen[role]["device"] == "cpu" and seen[role]["memory_allocated"] == 0
        )
        for role in SERVING_ROLES
    }
    learner_on_gpu = learner_pid in watch.pids if watch.available else None
    parity = [r.get("refit_logprob_diff_mean") for r in records]
    return {
        "passed": code == 0
        and len(records) == steps
        and all(roles_ok.values())
        and (learner_on_gpu is True or not on_cuda),
        "learner_exit": code,
        "steps": len(records),
        "roles": seen,
        "roles_ok": roles_ok,
        "learner_on_gpu": learner_on_gpu,
        "refit_logprob_diff_mean": parity,
        "logs": str(output / "logs"),
    }


def one_gpu_colocated(
    device: str, tiny: bool, *, out_dir: Path, budget_s: float = 600.0, **_: Any
) -> dict[str, Any]:
    """`dverl run` on a machine with one GPU (this one's first, the others hidden): the layout runs the HF
    rollout inside the learner, one copy of the weights, and puts the reference on the same GPU; then a
    vLLM rollout on that GPU sleeps between its calls (`vllm_sleep_check`). On the CPU dry run the same job
    is laid out on no GPU and runs on the CPU, and the vLLM check is reported as not run."""
    import os

    if device.startswith("cuda"):
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    from decentralized_verl.launch.run import this_machine
    from decentralized_verl.planning.layout import lay_out, machine_job
    from decentralized_verl.spec.manifest import load_job

    steps = 3 if tiny else 20
    work = out_dir / "one-gpu-colocated"
    work.mkdir(parents=True, exist_ok=True)
    manifest = every_role_manifest(work, device, steps, name="one-gpu")
    doc = yaml.safe_load(manifest.read_text())
    for name in ("critic", "reward"):  # the learner, an HF rollout and a reference on one GPU
        doc["spec"]["roles"].pop(name)
    doc["spec"]["algorithm"] = {"name": "grpo", "samplesPerPrompt": 2, "klCoef": 0.01}
    doc["spec"]["data"]["rewardType"] = "decentralized_verl.rewards.toy:first_number"
    doc["spec"]["data"].pop("rewardModel")
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
    job = load_job(manifest)
    machine = this_machine()
    spec, plan, colocated = machine_job(job.spec, job.metadata.name, machine)
    layout = lay_out(spec, plan, machine, colocated=colocated)
    with GpuWatch() as watch:
        summary = _run(manifest, work / "run", timeout=budget_s * 0.9)
    on_cuda = device.startswith("cuda")
    devices = {p.name: p.device for p in layout.placed}
    expected = colocated == ("rollout",) and set(devices.values()) == {"cuda:0"} if on_cuda else True
    sleep = vllm_sleep_check(device) if on_cuda else {"ran": False, "why": "vLLM sleeps on CUDA only"}
    return {
        "passed": summary["steps"] == steps
        and expected
        and (bool(watch.pids) or not on_cuda)
        and sleep.get("passed", True),
        "steps": summary["steps"],
        "machine": machine.words(),
        "colocated": list(colocated),
        "devices": devices,
        "gpu_processes_seen": sorted(watch.pids) if watch.available else None,
        "vllm_sleep": sleep,
    }


def vllm_sleep_check(device: str) -> dict[str, Any]:
    """A vLLM rollout on the learner's GPU, as the one-GPU layout starts it (`sleep_while_idle`, from
    `backends/sleep.py`'s decision): after a generate call it must have handed memory back (the GPU's free
    memory, read device-wide because the engine computes in its own process, rises by at least 256 MiB),
    and after waking decode greedily what it decoded before sleeping. Not run, and said so, where vLLM is
    not installed (it is not among benchmarks/gpu_wheels.txt)."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        return {"ran": False, "why": f"vllm is not installed here ({exc}); pip install vllm to check it"}
    from types import SimpleNamespace

    import torch

    from decentralized_verl.backends.base import GenerationRequest
    from decentralized_verl.backends.sleep import sleeps_while_learner_updates
    from decentralized_verl.backends.vllm_backend import VLLMBackend
    from decentralized_verl.core.sampling import SamplingParams
    from decentralized_verl.models.tiny import build_tiny, tiny_config
    from decentralized_verl.models.tokenizer import build_char_tokenizer
    from decentralized_verl.spec.catalogue.backends import VLLM

    asked = sleeps_while_learner_updates(VLLM, device, True)
    tokenizer = build_char_tokenizer()
    shape = SimpleNamespace(
        architecture="llama",
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        intermediate_size=512,
        max_positions=256,
    )
    config = tiny_config(shape, tokenizer)
    model = build_tiny(config, 0).to(torch.bfloat16).eval()
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0, top_k=0, top_p=1.0)
    request = [GenerationRequest("0", tuple(tokenizer.encode("the learner updates")), greedy)]
    backend = VLLMBackend(
        model, tokenizer, enforce_eager=True, sleep_while_idle=asked,
        engine_kwargs={"gpu_memory_utilization": 0.1},
    )  # fmt: skip
    try:
        backend.sleeper.enabled = False  # the first call stays awake: its free memory is the baseline
        first = [o.response_token_ids for o in backend.generate(request)]
        awake_free = torch.cuda.mem_get_info()[0]
        backend.sleeper.enabled = asked
        backend.sleeper.sleep()
        asleep_free = torch.cuda.mem_get_info()[0]
        again = [o.response_token_ids for o in backend.generate(request)]  # wakes, generates, sleeps
    finally:
        backend.close()
    freed = asleep_free - awake_free
    return {
        "ran": True,
        "passed": asked and freed >= 256 * 2**20 and again == first,
        "decided_to_sleep": asked,
        "freed_mib": round(freed / 2**20, 1),
        "same_tokens_after_waking": again == first,
        "sleep_s": [round(t, 3) for t in backend.sleeper.sleep_seconds],
        "wake_s": [round(t, 3) for t in backend.sleeper.wake_seconds],
    }


GPU_TEST_FILES = ("tests/integration/test_device_cuda.py",)
"""Where the suite's tests marked `gpu` live (tests/unit/test_device_home.py checks the list is whole)."""


def gpu_tests(device: str, tiny: bool, *, out_dir: Path, budget_s: float = 300.0, **_: Any) -> dict[str, Any]:
    """The suite's tests marked `gpu` (skipped on the CPU CI), run here: on CUDA every one must pass and
    none be skipped; on the CPU dry run they must all skip for the one reason they give."""
    import sys

    report = out_dir / "gpu-tests.txt"
    files = [str(ROOT / f) for f in GPU_TEST_FILES]  # collecting the whole suite would take a minute
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", *files]

    done = subprocess.run(command, capture_output=True, text=True, timeout=budget_s * 0.9, cwd=str(ROOT))
    report.write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    skipped = "skipped" in last
    ok = done.returncode == 0 and (not skipped if device.startswith("cuda") else "passed" not in last)
    return {"passed": ok, "summary": last, "report": str(report)}


PARTS = {
    "gpu_tests": gpu_tests,
    "tiny_job": tiny_job,
    "smollm2_job": smollm2_job,
    "every_role_job": every_role_job,
    "one_gpu_colocated": one_gpu_colocated,
}
