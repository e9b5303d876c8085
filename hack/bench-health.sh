#!/usr/bin/env bash
# make bench-health: how fast an NVML fault becomes a device taint, and that a healthy node writes
# nothing. A local cluster of its own with one fake GPU node; the release gpu-kubelet-plugin serves
# its 8 mock A100s (probes every second, recovery after 2 s). hack/bench-health.py injects XID 79
# round after round and times the taint as `kubectl get --watch` sees it, then counts the API writes
# over an idle period with every device healthy.
#
# BENCH_HEALTH_ROUNDS (default 20) and BENCH_IDLE_SECONDS (default 300) size the run. Prints Markdown
# for BENCHMARKS.md. Not part of make test.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
export CLUSTER_DIR="$REPO_DIR/.cluster/bench-health" PORT_BASE="${BENCH_PORT_BASE:-28800}" NODES=1 CPU_NODES=0
export KUBECONFIG="$CLUSTER_DIR/kubeconfig" PATH="$CACHE_DIR/bin:$PATH"
RELEASE="$CARGO_TARGET_DIR/release"
cargo build --locked --release -p kubelet-plugin -p validator -p mock-nvml

PID=""
trap '[[ -z "$PID" ]] || kill "$PID" 2>/dev/null; wait 2>/dev/null; hack/cluster down >/dev/null 2>&1 || true' EXIT
hack/cluster down >/dev/null 2>&1 || true
hack/cluster up >/dev/null
# The plugin keeps the node's PhysicalGPUs too; their writes are counted with the rest.
kubectl apply --server-side -f charts/gpu-operator/crds/gpu-operator-rs.dev_physicalgpus.yaml >/dev/null
kubectl wait --for condition=established crd/physicalgpus.gpu-operator-rs.dev >/dev/null
WORK="$CLUSTER_DIR/bench"
rm -rf "$WORK" && mkdir -p "$WORK/cdi"
KUBELET_DIR="$(readlink -f "$CLUSTER_DIR/nodes")/gpu-node-0/kubelet"

hack/fake-driver-root "$WORK/host" a100-sxm4-40gb 8 "$RELEASE/libmock_nvml.so"
HOST_ROOT="$WORK/host" DRIVER_INSTALL_DIR_CTR_PATH="$WORK/none" OUTPUT_DIR="$WORK" \
  "$RELEASE/dra-driver-validator" driver >>"$WORK/validator.log" 2>&1
echo boot-bench >"$WORK/boot_id"
NODE_NAME=gpu-node-0 CDI_ROOT="$WORK/cdi" DRIVER_READY_FILE="$WORK/driver-ready" BOOT_ID_FILE="$WORK/boot_id" \
  KUBELET_REGISTRAR_DIRECTORY_PATH="$KUBELET_DIR/plugins_registry" KUBELET_PLUGINS_DIRECTORY_PATH="$KUBELET_DIR/plugins" \
  HEALTH_PROBE_INTERVAL=1 HEALTH_RECOVERY_PERIOD=2 RUST_LOG="${RUST_LOG:-warn}" \
  "$RELEASE/gpu-kubelet-plugin" >>"$WORK/plugin.log" 2>&1 &
PID=$!

echo "| gpu-kubelet-plugin, 8 mock A100s, local cluster | |"
echo "|---|---|"
python3 hack/bench-health.py "$WORK/host/usr/lib/x86_64-linux-gnu/mock-nvml.json" gpu-node-0 \
  "${BENCH_HEALTH_ROUNDS:-20}" "${BENCH_IDLE_SECONDS:-300}"
echo "| gpu-kubelet-plugin VmRSS after the idle period | $(awk '/^VmRSS/ {printf "%.1f MiB", $2 / 1024}' "/proc/$PID/status") |"
