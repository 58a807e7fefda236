# Which torch build install.sh installs, sourced by it (and by its test): the CUDA build only where an
# NVIDIA GPU is present. PyPI's Linux torch is the CUDA build (gigabytes of CUDA libraries a machine
# without a GPU cannot use), so a machine without one gets the CPU build: the wheel pip already finds
# locally (a find-links folder, as on the project's machines and CI) when there is one, else the one on
# PyTorch's CPU index. DVERL_TORCH=cpu|cuda overrides the guess; TORCH_CPU_INDEX the CPU index.
TORCH_VERSION=2.13.0
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

# "cuda" when an NVIDIA GPU answers nvidia-smi, else "cpu"; DVERL_TORCH wins when set.
torch_variant() {
  case "${DVERL_TORCH:-}" in
    cpu|cuda) echo "$DVERL_TORCH"; return ;;
    "") ;;
    *) echo "DVERL_TORCH must be cpu or cuda (got $DVERL_TORCH)" >&2; return 2 ;;
  esac
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo cuda
  else
    echo cpu
  fi
}

# A local CPU wheel pip finds without any index (its find-links), so no network is needed for it.
torch_cpu_wheel_here() {
  local where
  where=$(mktemp -d)
  python -m pip download -q --no-deps --no-index -d "$where" "torch==$TORCH_VERSION" >/dev/null 2>&1
  local found=1
  ls "$where"/torch-"$TORCH_VERSION"+cpu-*.whl >/dev/null 2>&1 && found=0
  rm -rf "$where"
  return $found
}

# Prints the sentence saying what is installed and why, then the pip arguments, one a line.
torch_choice() {
  local variant
  variant=$(torch_variant) || return 2
  if [ "$variant" = cuda ]; then
    echo "torch $TORCH_VERSION: the CUDA build from PyPI (an NVIDIA GPU is present; DVERL_TORCH=cpu to override)"
    echo "torch==$TORCH_VERSION"
  elif torch_cpu_wheel_here; then
    echo "torch $TORCH_VERSION: the CPU build found locally (no NVIDIA GPU here; DVERL_TORCH=cuda to override)"
    echo "torch==$TORCH_VERSION"
  else
    echo "torch $TORCH_VERSION: the CPU build from $TORCH_CPU_INDEX (no NVIDIA GPU here; DVERL_TORCH=cuda to override)"
    echo "torch==$TORCH_VERSION"
    echo "--extra-index-url"
    echo "$TORCH_CPU_INDEX"
  fi
}
