#!/usr/bin/env bash
# Copy the generated CRD (crds/rlhfjob.yaml, the output of `dverl crd`) into the Helm chart.
# Helm installs whatever sits in charts/dverl/crds/, so the chart must carry the very same bytes;
# tests/integration/test_helm.py fails when the two files differ. Run after regenerating the CRD:
#   dverl crd > crds/rlhfjob.yaml && scripts/sync-chart-crd.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$ROOT/charts/dverl/crds"
cp "$ROOT/crds/rlhfjob.yaml" "$ROOT/charts/dverl/crds/rlhfjob.yaml"
echo "synced crds/rlhfjob.yaml -> charts/dverl/crds/rlhfjob.yaml"
