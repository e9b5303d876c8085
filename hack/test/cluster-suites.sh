#!/usr/bin/env bash
# The cluster suites of `make test` on one local cluster (make test-cluster-suites): brings it up once
# (4 GPU and 2 CPU KWOK nodes) in .cluster/suites-<port base> on the first free ports from 28000, runs
# the smoke test (hack/test/smoke.sh), the kubelet plugin's check
# (crates/kubelet-plugin/tests/cluster/check.sh) and the end-to-end suite (e2e/run.sh) on it in turn,
# each removing what it made (SHARED_CLUSTER=1), then takes it down and checks that no process or
# port is left behind. A failed suite does not stop the next one; the run fails if any did.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
TEST_NAME=suites
# shellcheck source=hack/test/lib.sh
source "$HACK_DIR/test/lib.sh"
PORT_BASE="$(free_port_base 28000 suites)"
export PORT_BASE SHARED_CLUSTER=1 NODES=4 CPU_NODES=2
export CLUSTER_DIR="$REPO_DIR/.cluster/suites-$PORT_BASE"
export KEEP_LOGS="$REPO_DIR/.cluster/suites-logs"
KUBECONFIG_FILE="$CLUSTER_DIR/kubeconfig"

cleanup() { finish_cluster_test "$?" "cluster suites" "no process and no port left behind"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$SECONDS
"$HACK_DIR/cluster" up
pass "cluster up once: $((NODES + CPU_NODES)) fake nodes Ready in $((SECONDS - t0))s"

# suite NAME CMD...: runs one suite on the cluster and records its verdict and time.
suite() {
  local name=$1 t=$SECONDS
  shift
  echo "=== $name"
  if "$@"; then pass "$name in $((SECONDS - t))s"; else fail "$name (its output above)"; fi
}
suite "smoke test" "$HACK_DIR/test/smoke.sh"
suite "kubelet plugin check" "$REPO_DIR/crates/kubelet-plugin/tests/cluster/check.sh"
suite "end-to-end suite" "$REPO_DIR/e2e/run.sh"
