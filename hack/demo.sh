#!/usr/bin/env bash
# make demo: the product end to end on the local cluster, as the install guide shows it.
# Builds what is missing, starts the local cluster with three fake GPU nodes of different products,
# installs gpu-operator-rs, runs a GPU pod and prints what a user would look at. Leaves the cluster
# up; `make cluster-down` stops everything, our processes included.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
export CLUSTER_DIR="${CLUSTER_DIR:-$REPO_DIR/.cluster}"
export NODES=3 CPU_NODES=1
BIN="$CARGO_TARGET_DIR/debug"
TOOLS="$CACHE_DIR/bin"
NS=gpu-operator
DEMO="$CLUSTER_DIR/demo"
PIDS="$CLUSTER_DIR/pids"
LOGS="$CLUSTER_DIR/logs"
# Fake GPU nodes: node, mock NVML profile, GPU count.
GPUS=("gpu-node-0 h100-sxm5-80gb 8" "gpu-node-1 a100-sxm4-80gb 4" "gpu-node-2 l4 2")

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
explain() { printf '\n\033[1m$ %s\033[0m   # %s\n' "$1" "$2"; }
k() { "$TOOLS/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig" "$@"; }
show() { explain "kubectl $1" "$2"; eval "k $1"; }
wait_until() { # SECONDS WHAT CMD...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then echo "demo: timed out waiting for $what (logs: $LOGS)" >&2; return 1; fi
    sleep 1
  done
}
start() { # NAME CMD... : a product process the cluster's `down` will stop
  local name=$1
  shift
  setsid "$@" >"$LOGS/product-$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/product-$name.pid"
}

step "Building gpu-operator-rs (cargo; the first build takes several minutes)"
cargo build --workspace --locked 2>&1 | grep -E '^(error|warning: unused)|Compiling (api|service|operator|node-labeler|validator|kubelet-plugin|mock-nvml) ' || true
[[ -x "$BIN/gpu-operator" ]] || { echo "demo: the build failed; run 'cargo build --workspace' to see why" >&2; exit 1; }

step "Building the local cluster's tools (Kubernetes from Go modules; the first build takes ~25 minutes)"
make --no-print-directory hack-tools

step "Starting the local cluster: a real control plane, 3 fake GPU nodes, 1 CPU node"
if "$HACK_DIR/cluster" status >/dev/null 2>&1; then
  echo "A cluster is already running in $CLUSTER_DIR; restarting it for a clean demo."
fi
"$HACK_DIR/cluster" down >/dev/null 2>&1 || true
"$HACK_DIR/cluster" up
mkdir -p "$DEMO"

step "Installing gpu-operator-rs"
k create namespace "$NS" --dry-run=client -o yaml | k apply -f - >/dev/null
if [[ -f charts/gpu-operator/Chart.yaml && -d charts/gpu-operator/templates ]]; then
  explain "helm upgrade --install gpu-operator charts/gpu-operator ..." "the guide's pre-installed-driver install"
  "$TOOLS/helm" --kubeconfig "$CLUSTER_DIR/kubeconfig" upgrade --install gpu-operator charts/gpu-operator \
    --namespace "$NS" --create-namespace --set gpuCluster.enabled=true --set driver.enabled=false \
    --set 'operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE' --set 'operator.env[0].value=dra'
else
  echo "(no Helm chart in this checkout yet: applying the CRD, the operands' ServiceAccounts and the default GPUCluster)"
  k apply -f charts/gpu-operator/crds/ >/dev/null
  for sa in nvidia-dra-driver-kubeletplugin nvidia-dra-driver-controller nvidia-dra-validator nvidia-dcgm-exporter nvidia-dcgm; do
    k -n "$NS" create serviceaccount "$sa" --dry-run=client -o yaml | k apply -f - >/dev/null
  done
  k wait --for condition=established crd/gpuclusters.nvidia.com --timeout=30s >/dev/null
  printf 'apiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: gpu-cluster\nspec: {}\n' | k apply -f -
fi

if ! k get gpucluster gpu-cluster >/dev/null 2>&1; then
  echo "(creating the default GPUCluster)"
  printf 'apiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: gpu-cluster\nspec: {}\n' | k apply -f -
fi

echo "No container runtime runs here, so our binaries run as host processes against the cluster:"
export KUBECONFIG="$CLUSTER_DIR/kubeconfig"
start node-labeler env DEFAULT_GPU_ALLOCATION_MODE=dra HTTP_ENDPOINT=127.0.0.1:18181 POD_NAMESPACE=$NS POD_NAME=node-labeler-demo "$BIN/node-labeler"
start gpu-operator env OPERATOR_NAMESPACE=$NS HTTP_ENDPOINT=127.0.0.1:18182 POD_NAME=gpu-operator-demo "$BIN/gpu-operator"
echo "  node-labeler and gpu-operator (metrics on 127.0.0.1:18181 and :18182)"
for entry in "${GPUS[@]}"; do
  read -r node profile count <<<"$entry"
  root="$DEMO/$node/host"
  mkdir -p "$DEMO/$node/validations" "$DEMO/$node/cdi"
  "$REPO_DIR/hack/fake-driver-root" "$root" "$profile" "$count" "$BIN/libmock_nvml.so"
  echo "$node-boot" >"$DEMO/$node/boot_id"
  # What the plugin pod's init container does: find the driver and write driver-ready.
  HOST_ROOT="$root" DRIVER_INSTALL_DIR_CTR_PATH="$DEMO/$node/none" OUTPUT_DIR="$DEMO/$node/validations" \
    "$BIN/dra-driver-validator" driver 2>&1 | sed 's/^/  /'
  kubelet="$(readlink "$CLUSTER_DIR/nodes")/$node/kubelet"
  start "plugin-$node" env NODE_NAME="$node" DRIVER_READY_FILE="$DEMO/$node/validations/driver-ready" \
    CDI_ROOT="$DEMO/$node/cdi" KUBELET_REGISTRAR_DIRECTORY_PATH="$kubelet/plugins_registry" \
    KUBELET_PLUGINS_DIRECTORY_PATH="$kubelet/plugins" BOOT_ID_FILE="$DEMO/$node/boot_id" "$BIN/gpu-kubelet-plugin"
  echo "  gpu-kubelet-plugin on $node: $count x $profile (mock NVML)"
done

step "Waiting for the GPUCluster to become ready"
wait_until 180 "gpu-cluster ready" bash -c "[[ \$('$TOOLS/kubectl' --kubeconfig '$CLUSTER_DIR/kubeconfig' get gpucluster gpu-cluster -o jsonpath='{.status.state}') == ready ]]"

step "Running the guide's single-GPU pod"
k apply -f - <<'YAML'
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: single-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          allocationMode: ExactCount
          count: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-workload
spec:
  restartPolicy: Never
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: single-gpu
  containers:
  - name: workload
    image: nvcr.io/nvidia/cuda:12.6.2-base-ubi9
    command: ["nvidia-smi", "-L"]
    resources:
      claims:
      - name: gpu
YAML
wait_until 90 "gpu-workload Running" bash -c "[[ \$('$TOOLS/kubectl' --kubeconfig '$CLUSTER_DIR/kubeconfig' get pod gpu-workload -o jsonpath='{.status.phase}') == Running ]]"

step "What a user looks at"
show "get gpucluster" "the GPUCluster reports ready once every operand is ready"
show "get pods -n $NS -o wide" "the operands; the kubelet-plugin pod shows 2/2 with ComputeDomains on, the validator is ready only after a GPU was allocated to it"
show "get deviceclass" "the five NVIDIA DeviceClasses claims refer to"
show "get resourceslices" "each GPU node publishes its GPUs"
claim=$(k get pod gpu-workload -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
show "get resourceclaim $claim -o jsonpath='{.status.allocation.devices.results}{\"\\n\"}'" "the scheduler allocated one GPU to the pod's claim"
show "get pod gpu-workload -o jsonpath='{.spec.nodeName}{\"  \"}{.metadata.annotations.minikubelet\\.gpu-operator-rs\\.dev/cdi-devices}{\"\\n\"}'" "the node, and the CDI device the kubelet got from our plugin"
node=$(k get pod gpu-workload -o jsonpath='{.spec.nodeName}')
uid=$(k get resourceclaim "$claim" -o jsonpath='{.metadata.uid}')
explain "cat $DEMO/$node/cdi/k8s.gpu.nvidia.com-claim_$uid.yaml" "the CDI spec our plugin wrote for that claim"
cat "$DEMO/$node/cdi/k8s.gpu.nvidia.com-claim_$uid.yaml"

cat <<TXT

The cluster stays up. Explore it with:
  eval "\$(hack/cluster env)"      # KUBECONFIG and a PATH with kubectl and helm
  kubectl describe gpucluster gpu-cluster
  kubectl get nodes -L nvidia.com/gpu-operator.resource-allocation.mode,nvidia.com/gpu.deploy.dra-driver
Logs of our processes: $LOGS/product-*.log
Tear everything down with:  make cluster-down
TXT
