#!/usr/bin/env bash
# Runs the end-to-end suite (e2e/tests) on a local cluster of its own: `hack/cluster up` in
# .cluster/e2e on ports from E2E_PORT_BASE (default 28000), `cargo test -p e2e`, then `down`, pass or
# fail. Logs of the cluster and of the processes the tests start are kept in .cluster/e2e-logs.
# With SHARED_CLUSTER=1 (hack/test/cluster-suites.sh) it runs on the cluster in $CLUSTER_DIR, which
# stays up.
#
#   e2e/run.sh [FILTER...]               the suite, or only its tests whose names contain a FILTER
#   e2e/run.sh --real-nodes [FILTER...]  the real-node scenarios (e2e/tests/real_nodes/) on the
#                                        real-node cluster in $CLUSTER_DIR (SHARED_CLUSTER=1; make
#                                        test-real-nodes runs them, KEEP_CLUSTER=1 leaves it up)
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A CLUSTER_DIR given relative to where this was started, made absolute (the tests run elsewhere).
if [[ -n "${CLUSTER_DIR:-}" && -d "$CLUSTER_DIR" ]]; then CLUSTER_DIR="$(cd "$CLUSTER_DIR" && pwd)"; fi
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
TEST_FLAGS=(--include-ignored --test-threads=1 --nocapture)
if [[ "${1:-}" == --real-nodes ]]; then
  shift
  [[ -n "${SHARED_CLUSTER:-}" && -s "${CLUSTER_DIR:-}/kubeconfig" ]] || {
    echo "e2e/run.sh --real-nodes: set SHARED_CLUSTER=1 and CLUSTER_DIR to a running real-node cluster (KEEP_CLUSTER=1 make test-real-nodes leaves one up)" >&2
    exit 2
  }
  export E2E_KUBECONFIG="$CLUSTER_DIR/kubeconfig" E2E_CLUSTER_DIR="$CLUSTER_DIR"
  # The scenarios run `kubectl gpu` as kubectl runs plugins: the binary found on the PATH.
  cargo build -q -p kubectl-gpu --locked
  export E2E_BIN_DIR="$CARGO_TARGET_DIR/debug"
  exec cargo test -p e2e --locked --test real_nodes -- "${TEST_FLAGS[@]}" "$@"
fi
# The suite's test targets: every file of e2e/tests but the real-node scenarios.
SUITE=(--lib)
for target in e2e/tests/*.rs; do
  target="$(basename "$target" .rs)"
  [[ "$target" == real_nodes ]] || SUITE+=(--test "$target")
done
if [[ -z "${SHARED_CLUSTER:-}" ]]; then
  export CLUSTER_DIR="$REPO_DIR/.cluster/e2e"
  export PORT_BASE="${E2E_PORT_BASE:-28000}"
  export NODES="${NODES:-4}" CPU_NODES="${CPU_NODES:-2}"
fi
KEEP_LOGS="$REPO_DIR/.cluster/e2e-logs"

finish() {
  local rc=$?
  rm -rf "$KEEP_LOGS" && mkdir -p "$KEEP_LOGS"
  cp -r "$CLUSTER_DIR/logs/." "$KEEP_LOGS/" 2>/dev/null || true
  if [[ -z "${SHARED_CLUSTER:-}" ]]; then
    hack/cluster down >/dev/null 2>&1 || hack/cluster down
  fi
  if ((rc == 0)); then echo "e2e: PASS"; else echo "e2e: FAIL (logs in $KEEP_LOGS)" >&2; fi
  exit "$rc"
}
trap finish EXIT

[[ -n "${SHARED_CLUSTER:-}" ]] || hack/cluster up
export E2E_KUBECONFIG="$CLUSTER_DIR/kubeconfig" E2E_CLUSTER_DIR="$CLUSTER_DIR"
export E2E_BIN_DIR="$CARGO_TARGET_DIR/debug"
export E2E_LOG_DIR="$CLUSTER_DIR/logs/e2e"
cargo test -p e2e --locked "${SUITE[@]}" -- "${TEST_FLAGS[@]}" "$@"
