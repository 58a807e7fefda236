"""SmolLM2-135M served as 3 span processes generates the same greedy tokens as the whole model in one
process, with log-probs within 1e-4 (fp32; the spans run the model's own layers on the same inputs).

Here the jobs that train end to end; the ones with real processes and servers in tests/integration/, under
the same name.
"""

from __future__ import annotations

import pytest

from tests.support.paths import ROOT


@pytest.mark.timeout(1800)  # 5 SmolLM2 processes on 2 shared cores: ~4 min idle, more when loaded
def test_dverl_run_trains_smollm2_with_the_rollout_as_three_span_processes(tmp_path):
    """examples/smollm2-spans-grpo.yaml cut to 2 short steps: `dverl run` starts the learner, the front and
    3 span processes on its secured path (TLS, tokens, signed weights and signed per-span manifests)."""
    import yaml
    from netlab.manifests import write_job

    from decentralized_verl.launch.run import run_job
    from decentralized_verl.reporting.metrics import read_metrics

    root = ROOT
    spec = yaml.safe_load((root / "examples" / "smollm2-spans-grpo.yaml").read_text())["spec"]
    spec["data"] = {
        **spec["data"],
        "train": str(root / "examples" / spec["data"]["train"]),
        "maxNewTokens": 8,
    }
    spec["algorithm"]["samplesPerPrompt"] = 2
    spec["roles"]["rollout"]["batchSize"] = 4
    spec["training"] = {
        **spec["training"],
        "steps": 2,
        "batchSize": 2,
        "minibatchSize": 2,
        "microbatchSize": 2,
    }
    summary = run_job(
        write_job(tmp_path, "smollm2-spans", spec), tmp_path / "run", progress=False, timeout=1500
    )
    assert summary["steps"] == 2 and summary["policy_version"] == 2
    logs = tmp_path / "run" / "logs"
    for index, layers in enumerate(["0:10", "10:20", "20:30"]):
        assert f"layers {layers} of rollout 0 ready" in (logs / f"smollm2-spans-span-{index}.log").read_text()
    for r in read_metrics(tmp_path / "run" / "metrics.jsonl"):
        assert r["samples"] == r["expected_samples"] == r["unique_samples"] == 4
