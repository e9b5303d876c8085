#!/usr/bin/env bash
# End-to-end check of gpu-kubelet-plugin on the local cluster of hack/ (real apiserver, scheduler,
# KWOK nodes and the mini-kubelet running the kubelet's DRA manager code). Not part of
# `cargo test`; `make test` runs it as `make test-kubelet-plugin-cluster` (about 30 s).
#
#   crates/kubelet-plugin/tests/cluster/check.sh
#
# Brings up its own cluster (2 GPU nodes) in a temp dir on PORT_BASE (default 31000), runs one
# plugin per node from target/debug with mock-nvml driver roots (gpu-node-0: A100 x8,
# gpu-node-1: A100 MIG mixed layout x2), prints PASS/FAIL per point and tears everything down.
# With SHARED_CLUSTER=1 (hack/test/cluster-suites.sh) it runs on the cluster in $CLUSTER_DIR
# instead, and removes what it made (plugins, their state, slices, class, pods) rather than the
# cluster.
set -Euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$HOME/.cache/gpu-operator-rs/target}"
BIN="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}/bin"
WORK="$(mktemp -d /tmp/kp-check.XXXXXX)"
if [[ -z "${SHARED_CLUSTER:-}" ]]; then
  export CLUSTER_DIR="$WORK/cluster" PORT_BASE="${PORT_BASE:-31000}" NODES=2 CPU_NODES=0
fi
export KUBECONFIG="$CLUSTER_DIR/kubeconfig" PATH="$BIN:$PATH"
failures=0
pass() { printf 'PASS %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$*"; failures=$((failures + 1)); }
check() { local what="$1"; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
wait_for() { local n="$1"; shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 1; done; return 1; }

declare -A PIDS=()
cleanup() {
  for node in "${!PIDS[@]}"; do kill "${PIDS[$node]}" 2>/dev/null; done
  wait 2>/dev/null
  if [[ -n "${SHARED_CLUSTER:-}" ]]; then
    kubectl delete pod gpu-pod gpu-pod-2 pinned-pod --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1
    kubectl delete resourceclaimtemplate one-gpu pinned-gpu --ignore-not-found >/dev/null 2>&1
    kubectl delete deviceclass gpu.nvidia.com --ignore-not-found >/dev/null 2>&1
    kubectl delete resourceslices --field-selector spec.driver=gpu.nvidia.com >/dev/null 2>&1
    local nodes
    nodes="$(readlink "$CLUSTER_DIR/nodes")"
    rm -rf "$nodes"/gpu-node-{0,1}/kubelet/plugins/gpu.nvidia.com
  else
    "$REPO/hack/cluster" down >/dev/null 2>&1
  fi
  if ((failures)); then echo "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

(cd "$REPO" && cargo build -q -p kubelet-plugin -p mock-nvml -p validator) || exit 1
[[ -n "${SHARED_CLUSTER:-}" ]] || "$REPO/hack/cluster" up >/dev/null || exit 1

driver_root() { # node profile gpus: a host root with the mock driver, validated as the init container does
  "$REPO/hack/fake-driver-root" "$WORK/$1/host" "$2" "$3" "$TARGET/debug/libmock_nvml.so"
  HOST_ROOT="$WORK/$1/host" DRIVER_INSTALL_DIR_CTR_PATH="$WORK/$1/none" OUTPUT_DIR="$WORK/$1" \
    "$TARGET/debug/dra-driver-validator" driver >>"$WORK/$1/validator.log" 2>&1
  mkdir -p "$WORK/$1/cdi" && echo "boot-$1" >"$WORK/$1/boot_id"
}
start_plugin() { # node
  local k
  k="$(readlink "$CLUSTER_DIR/nodes")/$1/kubelet"
  NODE_NAME="$1" CDI_ROOT="$WORK/$1/cdi" \
    KUBELET_REGISTRAR_DIRECTORY_PATH="$k/plugins_registry" KUBELET_PLUGINS_DIRECTORY_PATH="$k/plugins" \
    DRIVER_READY_FILE="$WORK/$1/driver-ready" BOOT_ID_FILE="$WORK/$1/boot_id" RUST_LOG=info LOG_FORMAT=json \
    HEALTH_PROBE_INTERVAL=1 HEALTH_RECOVERY_PERIOD=3 \
    "$TARGET/debug/gpu-kubelet-plugin" >>"$WORK/$1/plugin.log" 2>&1 &
  PIDS[$1]=$!
}
devices() { kubectl get resourceslices --field-selector "spec.nodeName=$1" \
  -o jsonpath='{range .items[*].spec.devices[*]}{.name}{" "}{end}'; }
has_devices() { [[ "$(devices "$1")" == "$2" ]]; }
gpu_pod() { # name [template]: a pod on gpu-node-0 with a claim from that template (one-gpu)
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  nodeSelector: {kubernetes.io/hostname: gpu-node-0}
  containers:
  - {name: main, image: busybox, resources: {claims: [{name: gpu}]}}
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: ${2:-one-gpu}}
YAML
}

driver_root gpu-node-0 a100-sxm4-40gb 8
driver_root gpu-node-1 a100-sxm4-40gb-mig-mixed 2
start_plugin gpu-node-0
start_plugin gpu-node-1

A100S="gpu-0 gpu-1 gpu-2 gpu-3 gpu-4 gpu-5 gpu-6 gpu-7 "
MIGS="gpu-0-mig-1g5gb-19-6 gpu-0-mig-2g10gb-14-4 gpu-0-mig-3g20gb-9-0 gpu-1-mig-1g5gb-19-6 gpu-1-mig-2g10gb-14-4 gpu-1-mig-3g20gb-9-0 "
check "apiserver accepts gpu-node-0's slice with 8 A100s" wait_for 30 has_devices gpu-node-0 "$A100S"
check "apiserver accepts gpu-node-1's slice with the MIG devices" wait_for 30 has_devices gpu-node-1 "$MIGS"
check "attributes: gpu-0 is type gpu, A100, 40Gi, driver 580.95.5" test \
  "$(kubectl get resourceslices --field-selector spec.nodeName=gpu-node-0 -o jsonpath='{.items[0].spec.devices[0].attributes.type.string} {.items[0].spec.devices[0].attributes.productName.string} {.items[0].spec.devices[0].capacity.memory.value} {.items[0].spec.devices[0].attributes.driverVersion.version}')" \
  = "gpu NVIDIA A100-SXM4-40GB 40Gi 580.95.5"
check "registered with the kubelet code" wait_for 20 grep -q "registered with the kubelet" "$WORK/gpu-node-0/plugin.log"

kubectl delete resourceslices --field-selector spec.nodeName=gpu-node-0 >/dev/null
check "deleted slices are published again" wait_for 30 has_devices gpu-node-0 "$A100S"

kubectl apply -f "$REPO/crates/kubelet-plugin/tests/cluster/one-gpu.yaml" >/dev/null
gpu_pod gpu-pod
prepared() { [[ "$(kubectl get pod gpu-pod -o jsonpath='{.metadata.annotations.minikubelet\.gpu-operator-rs\.dev/prepared}')" == true ]]; }
check "a pod's GPU claim is prepared through the kubelet DRA manager" wait_for 60 prepared
cdi_ids="$(kubectl get pod gpu-pod -o jsonpath='{.metadata.annotations.minikubelet\.gpu-operator-rs\.dev/cdi-devices}')"
check "the container gets k8s.gpu.nvidia.com/claim=<uid>-gpu-N ($cdi_ids)" \
  grep -qE 'k8s\.gpu\.nvidia\.com/claim=[0-9a-f-]+-gpu-[0-7]' <<<"$cdi_ids"
check "one CDI spec file for the claim" test "$(find "$WORK/gpu-node-0/cdi" -name 'k8s.gpu.nvidia.com-claim_*' | wc -l)" = 1

generation() { kubectl get resourceslices --field-selector spec.nodeName=gpu-node-0 -o jsonpath='{.items[0].spec.pool.generation}'; }
before="$(generation)"
"$REPO/hack/cluster" restart-kubelet gpu-node-0 >/dev/null 2>&1
republished() { has_devices gpu-node-0 "$A100S" && (($(generation) > before)); }
check "after a kubelet restart (which wipes the node's slices) they are published again" wait_for 60 republished
registered_twice() { (($(grep -c "registered with the kubelet" "$WORK/gpu-node-0/plugin.log") >= 2)); }
check "... the plugin registers with the new kubelet" wait_for 30 registered_twice
check "... and the prepared claim keeps its one CDI spec" test "$(find "$WORK/gpu-node-0/cdi" -mindepth 1 | wc -l)" = 1

kill -9 "${PIDS[gpu-node-0]}"; wait "${PIDS[gpu-node-0]}" 2>/dev/null
start_plugin gpu-node-0
check "after SIGKILL the restarted plugin restores the prepared claim" \
  wait_for 20 grep -q '"restored":1' "$WORK/gpu-node-0/plugin.log"
kubectl delete pod gpu-pod --wait=false >/dev/null
spec_gone() { [[ -z "$(ls "$WORK/gpu-node-0/cdi")" ]]; }
check "deleting the pod unprepares the claim and removes its CDI spec" wait_for 60 spec_gone

gpu_pod gpu-pod-2
prepared2() { [[ "$(kubectl get pod gpu-pod-2 -o jsonpath='{.metadata.annotations.minikubelet\.gpu-operator-rs\.dev/prepared}')" == true ]]; }
check "a second pod's claim is prepared" wait_for 60 prepared2

kill "${PIDS[gpu-node-0]}"; wait "${PIDS[gpu-node-0]}" 2>/dev/null
check "SIGTERM removes the registration socket" \
  test ! -e "$CLUSTER_DIR/nodes/gpu-node-0/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"
echo garbage >"$CLUSTER_DIR/nodes/gpu-node-0/kubelet/plugins/gpu.nvidia.com/checkpoint.json"
start_plugin gpu-node-0
event() { [[ -n "$(kubectl get events -A --field-selector reason=CheckpointCorrupted,involvedObject.name=gpu-node-0 -o name)" ]]; }
check "a corrupted checkpoint gives a Warning Event on the Node" wait_for 20 event
check "... the claim in use is restored from the API" \
  wait_for 20 grep -q "claim restored into the checkpoint" "$WORK/gpu-node-0/plugin.log"
registrations() { (($(grep -c "registered with the kubelet" "$WORK/gpu-node-0/plugin.log") >= 4)); }
check "... and the plugin registers and serves again" wait_for 20 registrations

# Device health: XID 79 on the GPU the second pod uses (after which NVML reports it lost, as a GPU
# fallen off the bus) taints it NoExecute; the pod is evicted by the control plane's device-taint
# eviction, a claim pinned to that GPU is not allocated; once NVML reads the GPU fine for the
# recovery period (3 s here) the taint goes and the claim is allocated.
control="$WORK/gpu-node-0/host/usr/lib/x86_64-linux-gnu/mock-nvml.json"
mock_faults() { # faults JSON for gpu-node-0's mock NVML, read while it is open
  printf '{"profile": "a100-sxm4-40gb", "gpu_count": 8, "faults": %s}\n' "$1" >"$control.tmp"
  mv "$control.tmp" "$control"
}
claim2="$(kubectl get pod gpu-pod-2 -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')"
dev="$(kubectl get resourceclaim "$claim2" -o jsonpath='{.status.allocation.devices.results[0].device}')"
uuid="$(kubectl get resourceslices --field-selector spec.nodeName=gpu-node-0 \
  -o jsonpath="{.items[0].spec.devices[?(@.name==\"$dev\")].attributes.uuid.string}")"
taint_of() { kubectl get resourceslices --field-selector spec.nodeName=gpu-node-0 \
  -o jsonpath="{range .items[*].spec.devices[?(@.name==\"$dev\")]}{.taints[*].key}={.taints[*].value}:{.taints[*].effect}{end}"; }
tainted() { [[ "$(taint_of)" == "gpu.nvidia.com/gpu-lost=xid-79:NoExecute" ]]; }
untainted() { [[ -n "$dev" && "$(taint_of)" == "=:" ]]; }
check "the second pod's GPU ($dev, $uuid) is published untainted" untainted
start_ms=$(date +%s%3N)
mock_faults "{\"xid_events\": [{\"gpu\": ${dev#gpu-}, \"xid\": 79}]}"
wait_ms() { local n="$1"; shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.05; done; return 1; }
if wait_ms 200 tainted; then
  pass "XID 79 on $dev taints it gpu.nvidia.com/gpu-lost=xid-79:NoExecute ($(($(date +%s%3N) - start_ms)) ms)"
else
  fail "XID 79 on $dev taints it gpu.nvidia.com/gpu-lost=xid-79:NoExecute within 10 s (has '$(taint_of)')"
fi
mock_faults "{\"lost_gpus\": [${dev#gpu-}]}" # and it stays off the bus
unhealthy_event() { kubectl get events -A --field-selector reason=GPUUnhealthy,involvedObject.name=gpu-node-0 -o jsonpath='{.items[*].message}' | grep -q "GPU $uuid is unhealthy (XID 79)"; }
check "... the Node gets a GPUUnhealthy Warning Event naming the GPU and the taint" wait_for 20 unhealthy_event
pod2_gone() { [[ -z "$(kubectl get pod gpu-pod-2 --ignore-not-found -o name)" ]]; }
check "... the pod using it is evicted by the control plane (NoExecute)" wait_for 60 pod2_gone
check "... and its claim unprepared" wait_for 60 spec_gone
kubectl apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: pinned-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].uuid == '$uuid'"}}]
YAML
gpu_pod pinned-pod pinned-gpu
pinned_prepared() { [[ "$(kubectl get pod pinned-pod -o jsonpath='{.metadata.annotations.minikubelet\.gpu-operator-rs\.dev/prepared}')" == true ]]; }
unschedulable() { [[ "$(kubectl get pod pinned-pod -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].status}')" == False ]]; }
check "a claim pinned to the tainted GPU is not allocated: its pod is unschedulable" wait_for 30 unschedulable
check "... while the GPU stays lost, the taint stays" tainted
mock_faults '{}'
check "once NVML reads the GPU fine for the recovery period the taint goes" wait_for 30 untainted
recovered_event() { kubectl get events -A --field-selector reason=GPURecovered,involvedObject.name=gpu-node-0 -o jsonpath='{.items[*].message}' | grep -q "GPU $uuid is healthy again"; }
check "... with a GPURecovered Event on the Node" wait_for 20 recovered_event
check "... and the pinned claim is allocated and prepared" wait_for 60 pinned_prepared
kubectl delete pod pinned-pod --wait=false >/dev/null
check "deleting the pinned pod unprepares its claim" wait_for 60 spec_gone

# A GPU lost at start (NVML_ERROR_GPU_IS_LOST, as after an XID 79) is left out; the node's other
# GPUs are still published and the Node gets a Warning Event that says what to do.
kill "${PIDS[gpu-node-0]}"; wait "${PIDS[gpu-node-0]}" 2>/dev/null
mock_faults '{"lost_gpus": [3]}'
start_plugin gpu-node-0
check "with GPU 3 lost at start, the plugin publishes the other seven" \
  wait_for 30 has_devices gpu-node-0 "gpu-0 gpu-1 gpu-2 gpu-4 gpu-5 gpu-6 gpu-7 "
lost_event() { kubectl get events -A --field-selector reason=GPUUnreadable,involvedObject.name=gpu-node-0 -o jsonpath='{.items[*].message}' | grep -q '^GPU 3 is lost and is not published'; }
check "... the Node gets a GPUUnreadable Warning Event naming GPU 3" wait_for 20 lost_event
serving() { (($(grep -c "registered with the kubelet" "$WORK/gpu-node-0/plugin.log") >= 5)) && kill -0 "${PIDS[gpu-node-0]}"; }
check "... and the plugin keeps running and registers with the kubelet" wait_for 20 serving

echo "$failures failure(s)"
exit $((failures > 0))
