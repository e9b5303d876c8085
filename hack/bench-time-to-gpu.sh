#!/usr/bin/env bash
# make bench-time-to-gpu: how long a new GPU node takes to run its first GPU pod, and where the time
# goes. A local cluster of its own with one real node (the control plane's operands run there), the
# guide's helm install with DRA as the default plane, then a second real node joins (hack/cluster
# add-node) with one GPU and its driver while a GPU pod pinned to it waits; hack/bench-time-to-gpu.py
# times each step as `kubectl get --watch` sees it: discovery, labeler, DaemonSets, validator, plugin,
# slices, scheduling, prepare. Prints Markdown for BENCHMARKS.md. Not part of make test (needs root).
#
# PROFILE=debug (default release) measures debug images; BENCH_GPU (default l4:1) is the new node's
# GPUs; BENCH_KEEP=1 leaves the cluster up to look at (hack/cluster down when done).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
export CLUSTER_DIR="$REPO_DIR/.cluster/bench-ttg" PORT_BASE="${BENCH_PORT_BASE:-27800}"
export NODES=0 CPU_NODES=0 REAL_NODES=1 REAL_GPUS="h100-sxm5-80gb:1"
export KUBECONFIG="$CLUSTER_DIR/kubeconfig" PATH="$CACHE_DIR/bin:$PATH"
export IMAGES_DIR="$CLUSTER_DIR/images"
NEW_NODE=real-gpu-1

((EUID == 0)) || { echo "bench-time-to-gpu: real nodes need root" >&2; exit 1; }
make --no-print-directory hack-tools >/dev/null
[[ -n "${BENCH_KEEP:-}" ]] || trap 'hack/cluster down >/dev/null 2>&1 || true' EXIT
hack/cluster down >/dev/null 2>&1 || true
mkdir -p "$IMAGES_DIR"
PROFILE="${PROFILE:-release}" IMAGES_OUT="$IMAGES_DIR" hack/images.sh >/dev/null
cp "$CACHE_DIR/images/pause.tar" "$IMAGES_DIR/"
hack/cluster up >/dev/null
helm upgrade --install gpu-operator charts/gpu-operator --namespace gpu-operator --create-namespace \
  --set gpuCluster.enabled=true --set driver.enabled=false \
  --set 'operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE' --set 'operator.env[0].value=dra' >/dev/null
for _ in $(seq 300); do
  [[ "$(kubectl get gpucluster gpu-cluster -o jsonpath='{.status.state}' 2>/dev/null)" == ready ]] && break
  sleep 1
done
[[ "$(kubectl get gpucluster gpu-cluster -o jsonpath='{.status.state}')" == ready ]] ||
  { echo "bench-time-to-gpu: GPUCluster not ready in 300 s" >&2; exit 1; }

cat >"$CLUSTER_DIR/workload.yaml" <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: time-to-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com}
---
apiVersion: v1
kind: Pod
metadata: {name: time-to-gpu, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: $NEW_NODE}
  resourceClaims: [{name: gpu, resourceClaimTemplateName: time-to-gpu}]
  containers:
  - name: workload
    image: docker.io/library/ubuntu:24.04
    command: [sh, -c, "nvidia-smi -L; sleep 3600"]
    resources: {claims: [{name: gpu}]}
EOF
python3 hack/bench-time-to-gpu.py "$NEW_NODE" "${BENCH_GPU:-l4:1}" "$CLUSTER_DIR/workload.yaml"
echo
echo "The workload's own log: $(kubectl logs time-to-gpu 2>&1 | head -1)"
