#!/usr/bin/env bash
# make demo: the product end to end on the local cluster, as the install guide shows it.
# Builds what is missing (the binaries, the images, the cluster's tools), starts the local cluster with
# two real GPU nodes of different products (a real kubelet and containerd each, fake GPUs), installs
# gpu-operator-rs with the guide's Helm command, runs the guide's pod and prints what a user would look
# at. Every component of ours runs as a pod from locally built images. Leaves the cluster up;
# `make cluster-down` stops everything.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
export CLUSTER_DIR="${CLUSTER_DIR:-$REPO_DIR/.cluster}"
# The guide's path runs on real nodes only: a KWOK node would take the operator's pods without running them.
export NODES=0 CPU_NODES=0 REAL_NODES="${REAL_NODES:-2}"
TOOLS="$CACHE_DIR/bin"
NS=gpu-operator
LOGS="$CLUSTER_DIR/logs"

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

step "Building gpu-operator-rs and its images (cargo, then OCI archives; the first build takes several minutes)"
make --no-print-directory hack-tools
make --no-print-directory images
for image in gpu-operator gpu-kubelet-plugin cuda-standin; do
  [[ -f "$CACHE_DIR/images/$image.tar" ]] || { echo "demo: make images failed; run it to see why" >&2; exit 1; }
done

step "Starting the local cluster: a real control plane and 2 real GPU nodes (kubelet, containerd, kube-proxy each)"
if "$HACK_DIR/cluster" status >/dev/null 2>&1; then
  echo "A cluster is already running in $CLUSTER_DIR; restarting it for a clean demo."
fi
"$HACK_DIR/cluster" down >/dev/null 2>&1 || true
"$HACK_DIR/cluster" up
# shellcheck disable=SC2016 # a Go template, not shell
stamped="$(k get nodes -o go-template='{{range .items}}{{$n := .metadata.name}}{{range $k, $v := .metadata.labels}}{{$n}}:{{$k}} {{end}}{{end}}' | tr ' ' '\n' | grep -E ':(feature\.node\.kubernetes\.io/|nvidia\.com/gpu\.)' || true)"
[[ -z "$stamped" ]] || { echo "demo: the harness labelled nodes as only GPU discovery may: $stamped" >&2; exit 1; }
show "get nodes -o wide -L feature.node.kubernetes.io/pci-10de.present,nvidia.com/gpu.product" "real kubelets and containerd; fake GPUs (a PCI bus and the mock NVML) but no GPU label yet: nothing has looked"

step "Installing gpu-operator-rs with the guide's command (pre-installed driver tab)"
explain "helm upgrade --install gpu-operator charts/gpu-operator --namespace gpu-operator --create-namespace --set gpuCluster.enabled=true --set driver.enabled=false --set operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE --set operator.env[0].value=dra" \
  "the images were imported into each node's containerd by make images"
"$TOOLS/helm" --kubeconfig "$CLUSTER_DIR/kubeconfig" upgrade --install gpu-operator charts/gpu-operator \
  --namespace "$NS" --create-namespace --set gpuCluster.enabled=true --set driver.enabled=false \
  --set 'operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE' --set 'operator.env[0].value=dra'

step "Waiting for the GPUCluster to become ready (operator, labeler, kubelet plugin and validator pods)"
if ! wait_until 300 "gpu-cluster ready" bash -c "[[ \$('$TOOLS/kubectl' --kubeconfig '$CLUSTER_DIR/kubeconfig' get gpucluster gpu-cluster -o jsonpath='{.status.state}') == ready ]]"; then
  k get gpucluster gpu-cluster -o yaml | sed -n '/^status:/,$p'
  k -n "$NS" get pods -o wide
  exit 1
fi

show "get nodes -L feature.node.kubernetes.io/pci-10de.present,nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.present" \
  "GPU node discovery (the chart's gpu-node-discovery DaemonSet) labelled the GPU nodes from their PCI bus and NVML"

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
if ! wait_until 120 "gpu-workload Succeeded" bash -c "[[ \$('$TOOLS/kubectl' --kubeconfig '$CLUSTER_DIR/kubeconfig' get pod gpu-workload -o jsonpath='{.status.phase}') == Succeeded ]]"; then
  k describe pod gpu-workload | tail -15
  k logs gpu-workload || true
  exit 1
fi

step "What a user looks at"
show "get gpucluster" "the GPUCluster reports ready once every operand is ready"
show "get pods -n $NS -o wide" "our operands as pods on the real nodes; the kubelet-plugin pod shows 2/2 with ComputeDomains on (their container is a stand-in here)"
show "get deviceclass" "the five NVIDIA DeviceClasses claims refer to, and the one of the operands' own claims"
show "get resourceslices" "each GPU node publishes its GPUs"
show "get pod gpu-workload -o wide" "the guide's pod ran on a real node and finished (its claim was released with it)"
show "logs gpu-workload" "nvidia-smi -L inside the container: exactly the GPU the claim got, injected by containerd through CDI"

cat <<TXT

The cluster stays up. Explore it with:
  eval "\$(hack/cluster env)"      # KUBECONFIG and a PATH with kubectl and helm
  kubectl describe gpucluster gpu-cluster
  kubectl get nodes -L nvidia.com/gpu-operator.resource-allocation.mode,nvidia.com/gpu.deploy.dra-driver
Logs of the nodes' kubelet, containerd and kube-proxy: $LOGS/
Tear everything down with:  make cluster-down
TXT
