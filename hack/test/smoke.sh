#!/usr/bin/env bash
# Cluster smoke test (make test-cluster). Brings up its own cluster in .cluster/smoke-<ports> on free ports,
# then: a DeviceClass, a hand-written ResourceSlice for one fake node and a pod with a
# ResourceClaimTemplate -> the real scheduler allocates the claim on that node; the pod stays Pending
# while no DRA plugin is registered on the node; once the stand-in plugin (hack/test/fake-dra-plugin)
# registers in that node's plugins_registry the mini-kubelet calls NodePrepareResources and only then
# the pod runs; deleting the pod makes the mini-kubelet call NodeUnprepareResources. Tears everything
# down on exit, pass or fail, and checks that no process or port is left behind (on a shared cluster,
# removes its objects and the stand-in plugin only).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
TEST_NAME=smoke
# shellcheck source=hack/test/lib.sh
source "$HACK_DIR/test/lib.sh"
# A port base whose five ports are all free (another smoke test or a dev cluster may be running), and
# a state folder of its own for it.
# With SHARED_CLUSTER=1 (hack/test/cluster-suites.sh) it runs on the cluster in $CLUSTER_DIR instead, and
# removes what it made rather than taking the cluster down.
if [[ -z "${SHARED_CLUSTER:-}" ]]; then
  PORT_BASE="$(free_port_base 27000 smoke)"
  export PORT_BASE
  export CLUSTER_DIR="$REPO_DIR/.cluster/smoke-$PORT_BASE"
  export NODES=2 CPU_NODES=1
fi
KUBECONFIG_FILE="$CLUSTER_DIR/kubeconfig"
NODE=gpu-node-0
DRIVER=gpu.fake.example.com
NS=smoke
NODE_ROOT="" # set once the cluster is up: below the short folder $CLUSTER_DIR/nodes links to
EVENTS="$CLUSTER_DIR/fake-dra-plugin.events"
PLUGIN_PID=""

cleanup() {
  local rc=$?
  if [[ -n "$PLUGIN_PID" ]]; then
    kill -TERM "$PLUGIN_PID" 2>/dev/null || true
    wait "$PLUGIN_PID" 2>/dev/null || true
  fi
  if [[ -n "${SHARED_CLUSTER:-}" ]]; then
    k delete namespace "$NS" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
    k delete deviceclass fake-gpu --ignore-not-found >/dev/null 2>&1 || true
    k delete resourceslice "$NODE-$DRIVER" --ignore-not-found >/dev/null 2>&1 || true
    finish_suite "$rc" "cluster smoke test"
  fi
  finish_cluster_test "$rc" "cluster smoke test" "no process and no port left behind"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- cluster up -------------------------------------------------------------------------------------
t0=$SECONDS
if [[ -z "${SHARED_CLUSTER:-}" ]]; then
  "$HACK_DIR/cluster" up
  pass "cluster up: $((NODES + CPU_NODES)) fake nodes Ready in $((SECONDS - t0))s"
fi
NODE_ROOT="$(readlink "$CLUSTER_DIR/nodes")/$NODE/kubelet"

api="$(k get --raw /apis/resource.k8s.io/v1)"
missing=""
for r in deviceclasses resourceslices resourceclaims resourceclaimtemplates; do
  grep -q "\"name\":\"$r\"" <<<"$api" || missing+=" $r"
done
if [[ -z "$missing" ]]; then pass "resource.k8s.io/v1 serves deviceclasses, resourceslices, resourceclaims, resourceclaimtemplates"; else fail "resource.k8s.io/v1 lacks:$missing"; fi

labels="$(k get node "$NODE" -o jsonpath='{.metadata.labels.feature\.node\.kubernetes\.io/pci-10de\.present} {.metadata.labels.nvidia\.com/gpu\.product}')"
if [[ "$labels" == "true NVIDIA-"* ]]; then pass "GPU node labels present ($labels)"; else fail "GPU node labels missing on $NODE: '$labels'"; fi

# Every listening socket of the cluster's processes must be on loopback.
nonlocal=""
for f in "$CLUSTER_DIR"/pids/*.pid; do
  pid="$(cat "$f")"
  while read -r addr; do
    [[ "$addr" == 127.0.0.1:* || "$addr" == "[::1]:"* ]] || nonlocal+=" $(basename "$f" .pid)=$addr"
  done < <(ss -Htlnp | awk -v p="pid=$pid," 'index($0, p) {print $4}')
done
if [[ -z "$nonlocal" ]]; then pass "every listening socket is on 127.0.0.1"; else fail "listening beyond loopback:$nonlocal"; fi

# --- DRA objects ------------------------------------------------------------------------------------
k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: fake-gpu
spec:
  selectors:
  - cel:
      expression: device.driver == "$DRIVER"
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: $NODE-$DRIVER
spec:
  driver: $DRIVER
  nodeName: $NODE
  pool:
    name: $NODE
    generation: 1
    resourceSliceCount: 1
  devices:
  - name: gpu-0
    attributes:
      productName: {string: "NVIDIA H100 80GB HBM3"}
      index: {int: 0}
    capacity:
      memory: {value: 80Gi}
  - name: gpu-1
    attributes:
      productName: {string: "NVIDIA H100 80GB HBM3"}
      index: {int: 1}
    capacity:
      memory: {value: 80Gi}
---
apiVersion: v1
kind: Namespace
metadata:
  name: $NS
EOF
wait_until 60 k -n "$NS" get serviceaccount default
k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
  namespace: $NS
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: fake-gpu
          count: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: $NS
spec:
  containers:
  - name: main
    image: registry.invalid/none:1
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
EOF

# --- the scheduler allocates ------------------------------------------------------------------------
pod_node() { [[ -n "$(k -n "$NS" get pod gpu-pod -o jsonpath='{.spec.nodeName}')" ]]; }
if wait_until 60 pod_node; then
  node="$(k -n "$NS" get pod gpu-pod -o jsonpath='{.spec.nodeName}')"
  claim="$(k -n "$NS" get pod gpu-pod -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')"
  alloc="$(k -n "$NS" get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].driver}/{.status.allocation.devices.results[0].pool}/{.status.allocation.devices.results[0].device}')"
  reserved="$(k -n "$NS" get resourceclaim "$claim" -o jsonpath='{.status.reservedFor[0].name}')"
  if [[ "$node" == "$NODE" && "$alloc" == "$DRIVER/$NODE/gpu-"* && "$reserved" == gpu-pod ]]; then
    pass "scheduler bound the pod to $node and allocated claim $claim -> $alloc"
  else
    fail "unexpected scheduling: node=$node claim=$claim allocation=$alloc reservedFor=$reserved"
  fi
else
  fail "pod was not scheduled within 60s: $(k -n "$NS" describe pod gpu-pod | tail -n 5 | tr '\n' ' ')"
  exit 1
fi
claim_uid="$(k -n "$NS" get resourceclaim "$claim" -o jsonpath='{.metadata.uid}')"

# --- no plugin: the pod must be held back -----------------------------------------------------------
sleep 5
phase="$(k -n "$NS" get pod gpu-pod -o jsonpath='{.status.phase}')"
held="$(k -n "$NS" get pod gpu-pod -o jsonpath='{.metadata.annotations.minikubelet\.gpu-operator-rs\.dev/error}')"
if [[ "$phase" == Pending ]]; then
  pass "without a registered DRA plugin the pod stays Pending (mini-kubelet: ${held:-no error recorded})"
else
  fail "pod is $phase although no DRA plugin is registered on $NODE"
fi

# --- register the stand-in plugin; prepare must come before Running ---------------------------------
: >"$EVENTS"
"$BIN_DIR/fake-dra-plugin" --kubeconfig "$KUBECONFIG_FILE" --driver "$DRIVER" \
  --registry-dir "$NODE_ROOT/plugins_registry" --plugins-dir "$NODE_ROOT/plugins" \
  --event-log "$EVENTS" >"$CLUSTER_DIR/logs/fake-dra-plugin.log" 2>&1 &
PLUGIN_PID=$!

pod_running() { [[ "$(k -n "$NS" get pod gpu-pod -o jsonpath='{.status.phase}')" == Running ]]; }
if wait_until 90 pod_running; then
  pass "pod Running after the plugin registered"
else
  fail "pod not Running 90s after the plugin registered (events: $(tr '\n' ' ' <"$EVENTS"); plugin log: $(tail -n 5 "$CLUSTER_DIR/logs/fake-dra-plugin.log" | tr '\n' ' '))"
  exit 1
fi
if grep -q " registration registered=true" "$EVENTS"; then
  pass "kubelet plugin manager registered the plugin (GetInfo + NotifyRegistrationStatus)"
else
  fail "no successful registration in the plugin's event log"
fi
prepare_line="$(grep -m1 " prepare $NS/$claim uid=$claim_uid" "$EVENTS" || true)"
if [[ -n "$prepare_line" ]]; then
  prepared_at="$(cut -d' ' -f1 <<<"$prepare_line")"
  started_at="$(k -n "$NS" get pod gpu-pod -o jsonpath='{.status.startTime}')"
  # startTime has whole seconds; compare at that precision.
  if [[ "$(date -d "${prepared_at%.*}Z" +%s)" -le "$(date -d "$started_at" +%s)" ]]; then
    pass "NodePrepareResources for $claim at $prepared_at, pod started at $started_at"
  else
    fail "NodePrepareResources at $prepared_at came after the pod started at $started_at"
  fi
else
  fail "no NodePrepareResources call for $NS/$claim (uid $claim_uid) in the plugin's event log"
fi
cdi="$(k -n "$NS" get pod gpu-pod -o jsonpath='{.metadata.annotations.minikubelet\.gpu-operator-rs\.dev/cdi-devices}')"
if [[ "$cdi" == *"\"main\":[\"$DRIVER/fake=$claim_uid-gpu-"* ]]; then
  pass "CDI device IDs recorded on the pod: $cdi"
else
  fail "CDI device annotation wrong: '$cdi'"
fi

# --- pod gone -> unprepare --------------------------------------------------------------------------
k -n "$NS" delete pod gpu-pod --wait=false >/dev/null
if wait_until 60 grep -q " unprepare $NS/$claim uid=$claim_uid" "$EVENTS"; then
  pass "NodeUnprepareResources called after the pod was deleted"
else
  fail "no NodeUnprepareResources within 60s of deleting the pod"
fi
