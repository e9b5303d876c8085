#!/usr/bin/env bash
# make bench-requests: the API requests of the kubelet plugin's slice publisher and of the operator
# for ordinary events (e2e/examples/api_requests.rs), on a local cluster of its own, fresh for each
# run. BASELINE_BIN_DIR=<folder with gpu-operator and gpu-kubelet-plugin of another build> runs the
# same first, for a side-by-side row. Prints Markdown rows for BENCHMARKS.md. Not part of make test.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
export CLUSTER_DIR="$REPO_DIR/.cluster/bench-requests" PORT_BASE="${BENCH_PORT_BASE:-28400}" NODES=1 CPU_NODES=0
cargo build --locked --workspace --bins
cargo build --locked -p e2e --example api_requests
trap 'hack/cluster down >/dev/null 2>&1 || true' EXIT
echo "| binaries | slice LISTs | slice writes | reconciles for one spec change | operand GETs and LISTs meanwhile |"
echo "|---|---|---|---|---|"
for bins in ${BASELINE_BIN_DIR:-} "$CARGO_TARGET_DIR/debug"; do
  hack/cluster down >/dev/null 2>&1 || true
  hack/cluster up >/dev/null
  E2E_KUBECONFIG="$CLUSTER_DIR/kubeconfig" E2E_CLUSTER_DIR="$CLUSTER_DIR" E2E_BIN_DIR="$bins" \
    E2E_LOG_DIR="$CLUSTER_DIR/bench-logs" "$CARGO_TARGET_DIR/debug/examples/api_requests"
done
