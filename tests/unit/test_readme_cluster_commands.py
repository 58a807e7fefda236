"""The README's short cluster steps are commands that work as written: every namespaced kubectl command
names its namespace, the chart is installed with the image flags the walk-through in docs/cluster.md uses,
and the images are built under the names those flags give."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

README = (ROOT / "README.md").read_text()
STEPS = README[README.index("### A cluster: the operator") : README.index("`spec.sources` mounts a PVC")]
WALKTHROUGH = (ROOT / "docs" / "cluster.md").read_text()


def _commands(tool: str) -> list[str]:
    """`tool ...` commands in the README's steps (inline code, wrapped lines joined)."""
    spans = re.findall(r"`([^`]+)`", STEPS.replace("\n   ", " "))
    return [re.sub(r"\s+", " ", s) for s in spans if s.startswith(f"{tool} ")]


def test_every_namespaced_kubectl_command_names_its_namespace() -> None:
    commands = _commands("kubectl")
    assert commands, STEPS
    cluster_wide = ("kubectl cp", "kubectl explain")  # cp names the namespace in its pod path
    missing = [c for c in commands if not c.startswith(cluster_wide) and " -n " not in c]
    assert not missing, missing


def test_the_chart_is_installed_with_the_walkthroughs_image_flags() -> None:
    [helm] = _commands("helm")
    flags = set(re.findall(r"--set ((?:image|workerImage)\.\S+)", WALKTHROUGH))  # the walk-through's install
    expected = {"image.repository=dverl-operator", "image.tag=dev"}
    assert flags == expected | {"workerImage.repository=dverl-worker", "workerImage.tag=dev"}
    assert set(re.findall(r"--set (\S+)", helm)) == flags and "-n dverl-system" in helm


def test_the_images_are_built_under_the_names_the_chart_is_given() -> None:
    builds = _commands("docker build")
    assert any("--target worker -t dverl-worker:dev" in b for b in builds), builds
    assert any("--target operator -t dverl-operator:dev" in b for b in builds), builds
    assert "kind load docker-image dverl-operator:dev dverl-worker:dev --name dverl" in STEPS.replace(
        "\n   ", " "
    )
