#!/usr/bin/env bash
# make bench-prepare: gpu-kubelet-plugin's prepare and unprepare as the kubelet sees them, on a local
# cluster of its own. The release plugin serves gpu-node-0 (32 mock A100s) through the node's
# mini-kubelet, which runs the kubelet's DRA manager; each NodePrepareResources and
# NodeUnprepareResources is timed by the kubelet's own gRPC client interceptor (histogram buckets 2%
# apart, hack/cmd/mini-kubelet). Pods with a 1-GPU claim are created and deleted one at a time, then
# in bursts of 8 and 32. Beside the times it reports what they rest on: the disk's synced-write
# latency (dd), one claim GET on a kept-alive connection (curl), the plugin's system calls per claim
# (strace -f -c over a separate, untimed run) and its memory (VmRSS idle with 8 and with 32 GPUs,
# VmHWM after the load).
#
# UPSTREAM_PLUGIN=/path/to/gpu-kubelet-plugin (built from NVIDIA/k8s-dra-driver-gpu) runs that plugin
# on gpu-node-1 with the same mock GPUs, interleaved phase by phase, and prints the ratios.
# BENCH_SINGLE (default 40) and BENCH_BURST_ROUNDS (default 3) size the run. Prints Markdown for
# BENCHMARKS.md. Not part of make test.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
export CLUSTER_DIR="$REPO_DIR/.cluster/bench-prepare" PORT_BASE="${BENCH_PORT_BASE:-28600}" NODES=2 CPU_NODES=0
# Every pod of a burst is prepared at once, as a kubelet's pod workers do.
export KUBELET_WORKERS=32
export KUBECONFIG="$CLUSTER_DIR/kubeconfig" PATH="$CACHE_DIR/bin:$PATH"
SINGLE="${BENCH_SINGLE:-40}" BURST_ROUNDS="${BENCH_BURST_ROUNDS:-3}"
UPSTREAM="${UPSTREAM_PLUGIN:-}"
RELEASE="$CARGO_TARGET_DIR/release"
PLUGIN_METRICS_PORT=$((PORT_BASE + 700))
REPORT=(python3 "$REPO_DIR/hack/bench-prepare-report.py")
# shellcheck source=hack/bench-cycle.sh
. "$REPO_DIR/hack/bench-cycle.sh"

missing=()
for tool in strace curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[[ -z "$UPSTREAM" || -x "$UPSTREAM" ]] || { echo "bench-prepare: UPSTREAM_PLUGIN=$UPSTREAM is not an executable" >&2; exit 1; }
cargo build --locked --release -p kubelet-plugin -p validator -p mock-nvml

declare -A PIDS=()
stop_plugins() { for node in "${!PIDS[@]}"; do kill "${PIDS[$node]}" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
trap 'stop_plugins; hack/cluster down >/dev/null 2>&1 || true' EXIT
hack/cluster down >/dev/null 2>&1 || true
hack/cluster up >/dev/null
WORK="$CLUSTER_DIR/bench"
rm -rf "$WORK" && mkdir -p "$WORK"
NODES_DIR="$(readlink -f "$CLUSTER_DIR/nodes")"

driver_root() { # dir gpus: the mock driver, validated as the init container does
  hack/fake-driver-root "$1/host" a100-sxm4-40gb "$2" "$RELEASE/libmock_nvml.so"
  HOST_ROOT="$1/host" DRIVER_INSTALL_DIR_CTR_PATH="$1/none" OUTPUT_DIR="$1" \
    "$RELEASE/dra-driver-validator" driver >>"$1/validator.log" 2>&1
  mkdir -p "$1/cdi" && echo "boot-bench" >"$1/boot_id"
}
start_ours() { # node dir
  local k="$NODES_DIR/$1/kubelet"
  NODE_NAME="$1" CDI_ROOT="$2/cdi" DRIVER_READY_FILE="$2/driver-ready" BOOT_ID_FILE="$2/boot_id" \
    KUBELET_REGISTRAR_DIRECTORY_PATH="$k/plugins_registry" KUBELET_PLUGINS_DIRECTORY_PATH="$k/plugins" \
    HTTP_ENDPOINT="127.0.0.1:$PLUGIN_METRICS_PORT" RUST_LOG=warn "$RELEASE/gpu-kubelet-plugin" >>"$2/plugin.log" 2>&1 &
  PIDS[$1]=$!
}
start_upstream() { # node dir
  local k="$NODES_DIR/$1/kubelet"
  hack/bench-upstream-plugin "$UPSTREAM" "$1" "$2" "$k" >>"$2/plugin.log" 2>&1 &
  PIDS[$1]=$!
}
rss() { awk -v k="$2:" '$1 == k {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

kubectl apply -f crates/kubelet-plugin/tests/cluster/one-gpu.yaml >/dev/null
kubectl apply -f - >/dev/null <<'YAML'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: bench-get, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
YAML

# Idle memory with 8 GPUs, each plugin on its own, 20 s after its slice is published.
declare -A IDLE8=()
idle8() { # label start-function
  local dir="$WORK/idle8-$1"
  driver_root "$dir" 8
  "$2" gpu-node-1 "$dir"
  wait_for 60 published gpu-node-1 8
  sleep 20
  IDLE8[$1]="$(rss "${PIDS[gpu-node-1]}" VmRSS)"
  stop_plugins
  kubectl delete resourceslices --field-selector spec.nodeName=gpu-node-1 >/dev/null
  # The two plugins share the driver's folder names (and a checkpoint each can't read).
  rm -rf "$NODES_DIR/gpu-node-1/kubelet/plugins/gpu.nvidia.com" "$NODES_DIR"/gpu-node-1/kubelet/plugins_registry/gpu.nvidia.com*
}
idle8 ours start_ours
[[ -z "$UPSTREAM" ]] || idle8 upstream start_upstream

# The measured plugins: ours on gpu-node-0, upstream (if given) on gpu-node-1, 32 GPUs each.
declare -A NODE_OF=([ours]=gpu-node-0)
PLUGINS=(ours)
driver_root "$WORK/ours" 32
start_ours gpu-node-0 "$WORK/ours"
if [[ -n "$UPSTREAM" ]]; then
  NODE_OF[upstream]=gpu-node-1 PLUGINS+=(upstream)
  driver_root "$WORK/upstream" 32
  start_upstream gpu-node-1 "$WORK/upstream"
fi
# cpu PID: CPU seconds the process used so far (user + system, all threads), the machine's busy
# CPU seconds (every core, all processes), its number of cores and the time (s).
cpu() {
  local tick
  tick="$(getconf CLK_TCK)"
  awk -v t="$tick" '{sub(/^.*\) /, ""); printf "%.3f ", ($12 + $13) / t}' "/proc/$1/stat"
  awk -v t="$tick" '$1 == "cpu" {printf "%.3f ", ($2 + $3 + $4 + $7 + $8 + $9) / t}' /proc/stat
  printf '%s %s\n' "$(nproc)" "$(date +%s.%N)"
}
declare -A IDLE32=()
for p in "${PLUGINS[@]}"; do wait_for 60 published "${NODE_OF[$p]}" 32; done
# The idle CPU (the plugin's, the machine's) over the same 20 s, taken off each phase's CPU.
cpu "${PIDS[gpu-node-0]}" >"$WORK/ours-idle.cpu.before"
sleep 20
cpu "${PIDS[gpu-node-0]}" >"$WORK/ours-idle.cpu.after"
for p in "${PLUGINS[@]}"; do IDLE32[$p]="$(rss "${PIDS[${NODE_OF[$p]}]}" VmRSS)"; done

# phase NAME COUNT ROUNDS: ROUNDS cycles of COUNT pods on every plugin, interleaved.
phase() {
  local p round
  for p in "${PLUGINS[@]}"; do scrape "${NODE_OF[$p]}" "$WORK/$p-$1.before"; done
  cpu "${PIDS[gpu-node-0]}" >"$WORK/ours-$1.cpu.before"
  curl -sf "http://127.0.0.1:$PLUGIN_METRICS_PORT/metrics" >"$WORK/ours-$1.plugin.before"
  for ((round = 0; round < $3; round++)); do
    for p in "${PLUGINS[@]}"; do cycle "${NODE_OF[$p]}" "$1-$p-$round" "$2"; done
  done
  for p in "${PLUGINS[@]}"; do scrape "${NODE_OF[$p]}" "$WORK/$p-$1.after"; done
  cpu "${PIDS[gpu-node-0]}" >"$WORK/ours-$1.cpu.after"
  curl -sf "http://127.0.0.1:$PLUGIN_METRICS_PORT/metrics" >"$WORK/ours-$1.plugin.after"
}

phase warmup 1 3
phase single 1 "$SINGLE"
phase burst8 8 "$BURST_ROUNDS"
phase burst32 32 "$BURST_ROUNDS"
declare -A HWM=()
for p in "${PLUGINS[@]}"; do HWM[$p]="$(rss "${PIDS[${NODE_OF[$p]}]}" VmHWM)"; done

# System calls per claim: a separate run under strace (it slows every call, so nothing is timed).
STRACED=20
for p in "${PLUGINS[@]}"; do
  strace -f -c -o "$WORK/$p.strace" -p "${PIDS[${NODE_OF[$p]}]}" 2>/dev/null &
  tracer=$!
  sleep 1
  for ((i = 0; i < STRACED; i++)); do cycle "${NODE_OF[$p]}" "strace-$p-$i" 1; done
  kill -INT "$tracer"
  wait "$tracer" 2>/dev/null || true
done

# What the times rest on: the disk's synced writes where the state is written, and one claim GET.
dd if=/dev/zero of="$WORK/dd.test" bs=4k count=200 oflag=dsync 2>"$WORK/dd.txt" && rm -f "$WORK/dd.test"
kubeconfig_field() { sed -n "s/^ *$1: //p" "$KUBECONFIG" | head -1; }
kubeconfig_field client-certificate-data | base64 -d >"$WORK/admin.crt"
kubeconfig_field client-key-data | base64 -d >"$WORK/admin.key"
kubeconfig_field certificate-authority-data | base64 -d >"$WORK/admin.ca"
url="$(kubeconfig_field server)/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/bench-get"
urls=()
for ((i = 0; i < 101; i++)); do urls+=("$url" -o /dev/null); done
curl -s --cacert "$WORK/admin.ca" --cert "$WORK/admin.crt" --key "$WORK/admin.key" \
  -w '%{time_total}\n' "${urls[@]}" | tail -n +2 >"$WORK/get.txt"

args=(--work "$WORK" --single "$SINGLE" --burst-rounds "$BURST_ROUNDS" --straced "$STRACED")
for p in "${PLUGINS[@]}"; do
  args+=(--plugin "$p" --idle8 "${IDLE8[$p]}" --idle32 "${IDLE32[$p]}" --hwm "${HWM[$p]}")
done
"${REPORT[@]}" report "${args[@]}"
