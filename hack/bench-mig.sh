#!/usr/bin/env bash
# make bench-mig: the prepare and unprepare of a MIG claim as the kubelet times them, static beside
# dynamic, in one run on a local cluster of its own. gpu-node-0's plugin serves 8 mock A100s
# partitioned beforehand (static MIG: a claim gets an existing 1g.5gb); gpu-node-1's serves 8 mock
# H100s with MIG_PARTITIONING=dynamic (a claim's 1g.10gb is made at prepare, destroyed at
# unprepare: MIG on, GPU instance, compute instance, each committed to the checkpoint first). Pods
# with one such claim are created and deleted one at a time, the two nodes interleaved; the
# mini-kubelet's gRPC histograms (buckets 2% apart) give p50/p99. BENCH_SINGLE (default 40) sizes
# the run. Prints Markdown for BENCHMARKS.md. Not part of make test.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
export CLUSTER_DIR="$REPO_DIR/.cluster/bench-mig" PORT_BASE="${BENCH_PORT_BASE:-28800}" NODES=2 CPU_NODES=0
export KUBECONFIG="$CLUSTER_DIR/kubeconfig" PATH="$CACHE_DIR/bin:$PATH"
SINGLE="${BENCH_SINGLE:-40}"
RELEASE="$CARGO_TARGET_DIR/release"
REPORT=(python3 "$REPO_DIR/hack/bench-prepare-report.py")
# shellcheck source=hack/bench-cycle.sh
. "$REPO_DIR/hack/bench-cycle.sh"

command -v curl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null; }
cargo build --locked --release -p kubelet-plugin -p validator -p mock-nvml

PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; hack/cluster down >/dev/null 2>&1 || true' EXIT
hack/cluster down >/dev/null 2>&1 || true
hack/cluster up >/dev/null
WORK="$CLUSTER_DIR/bench"
rm -rf "$WORK" && mkdir -p "$WORK"
NODES_DIR="$(readlink -f "$CLUSTER_DIR/nodes")"

# start NODE PROFILE PARTITIONING: the release plugin on NODE, 8 GPUs of mock PROFILE, validated as
# the init container does.
start() {
  local node=$1 dir="$WORK/$1" k="$NODES_DIR/$1/kubelet"
  hack/fake-driver-root "$dir/host" "$2" 8 "$RELEASE/libmock_nvml.so"
  HOST_ROOT="$dir/host" DRIVER_INSTALL_DIR_CTR_PATH="$dir/none" OUTPUT_DIR="$dir" \
    "$RELEASE/dra-driver-validator" driver >>"$dir/validator.log" 2>&1
  mkdir -p "$dir/cdi" && echo "boot-bench" >"$dir/boot_id"
  NODE_NAME="$node" CDI_ROOT="$dir/cdi" DRIVER_READY_FILE="$dir/driver-ready" BOOT_ID_FILE="$dir/boot_id" \
    PROCFS_ROOT="$dir/host" MIG_PARTITIONING="$3" \
    KUBELET_REGISTRAR_DIRECTORY_PATH="$k/plugins_registry" KUBELET_PLUGINS_DIRECTORY_PATH="$k/plugins" \
    RUST_LOG=warn "$RELEASE/gpu-kubelet-plugin" >>"$dir/plugin.log" 2>&1 &
  PIDS+=($!)
}
start gpu-node-0 a100-sxm4-40gb-mig-mixed static
start gpu-node-1 h100-sxm5-80gb dynamic

kubectl apply -f - >/dev/null <<'YAML'
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: mig.nvidia.com}
spec:
  selectors:
  - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-1g, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile.startsWith('1g.') && !device.attributes['gpu.nvidia.com'].profile.endsWith('+me')"}
YAML
export CLAIM_TEMPLATE=one-1g
# 3 MIG devices on each static A100; a card and 25 partitions on each dynamic H100.
wait_for 60 published gpu-node-0 24
wait_for 60 published gpu-node-1 208

NODES_BENCHED=(gpu-node-0 gpu-node-1)
# run PHASE ROUNDS: ROUNDS one-pod cycles on each node, interleaved; scrapes around them.
run() {
  local node round
  for node in "${NODES_BENCHED[@]}"; do scrape "$node" "$WORK/$node-$1.before"; done
  for ((round = 0; round < $2; round++)); do
    for node in "${NODES_BENCHED[@]}"; do cycle "$node" "$1-$node-$round" 1; done
  done
  for node in "${NODES_BENCHED[@]}"; do scrape "$node" "$WORK/$node-$1.after"; done
}
run warmup 3
run single "$SINGLE"

row() { # label node method
  read -r p50 p99 n < <("${REPORT[@]}" quantiles "$WORK/$2-single.before" "$WORK/$2-single.after" "$3")
  echo "| $1 | $3 | $n | $p50 | $p99 |"
}
echo "| claim | call | calls | p50 (ms) | p99 (ms) |"
echo "|---|---|---|---|---|"
for method in NodePrepareResources NodeUnprepareResources; do
  row "static MIG (existing 1g.5gb, A100)" gpu-node-0 "$method"
  row "dynamic MIG (1g.10gb made, H100)" gpu-node-1 "$method"
done
left="$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(len((g.get("mig") or {}).get("gpuInstances", [])) for g in d.values()))' "$WORK/gpu-node-1/host/run/mock-nvml/state.json" 2>/dev/null || echo 0)"
echo
echo "After $SINGLE dynamic claims: $left GPU instances left on gpu-node-1's GPUs."
