#!/usr/bin/env bash
# make bench-scale: the labeler and operator at 1,000 and 5,000 fake GPU nodes (release builds), on a
# local cluster of its own. Prints one Markdown row per size for BENCHMARKS.md. Not part of make test.
# BASELINE_BIN_DIR=<folder with node-labeler and gpu-operator of another build> adds a row per size
# for that build, each on a fresh cluster right before this build's row.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
export CLUSTER_DIR="$REPO_DIR/.cluster/bench" PORT_BASE="${BENCH_PORT_BASE:-28300}" NODES=0 CPU_NODES=1
cargo build --release --locked -p operator -p node-labeler -p e2e --examples --bins
trap 'hack/cluster down >/dev/null 2>&1 || true' EXIT
echo "| build | nodes | raw writer, same writes | labeler convergence | labeler writes | labeler RSS | operator RSS | idle writes |"
echo "|---|---|---|---|---|---|---|---|"
for n in ${SIZES:-1000 5000}; do
  for bins in ${BASELINE_BIN_DIR:-} "$CARGO_TARGET_DIR/release"; do
    hack/cluster down >/dev/null 2>&1 || true
    hack/cluster up >/dev/null
    printf '| %s ' "$([[ "$bins" == "$CARGO_TARGET_DIR/release" ]] && echo this || echo baseline)"
    E2E_KUBECONFIG="$CLUSTER_DIR/kubeconfig" E2E_CLUSTER_DIR="$CLUSTER_DIR" E2E_BIN_DIR="$bins" \
      E2E_LOG_DIR="$CLUSTER_DIR/bench-logs" "$CARGO_TARGET_DIR/release/examples/scale" "$n"
  done
done
