#!/usr/bin/env bash
# Real-node test (make test-real-nodes). Brings up its own cluster with four real nodes (a real
# kubelet, containerd v2 + runc, CNI and kube-proxy each, in namespaces of their own; mock H100s, L4s
# and MIG-enabled A100s, and one without a GPU) beside one KWOK node, on free ports. No real node gets
# a GPU label from the harness: GPU discovery finds their GPUs on their PCI bus and labels them. First what the product's pods rely on:
# pods run from locally imported images; `kubectl logs` and `exec` work; a pod reaches the API through
# the `kubernetes` Service and a pod on the other node; a DRA claim allocated by the scheduler is
# prepared by a plugin registered with the real kubelet, and containerd injects the claim's CDI device
# into the container. Then the install guide and the DRA stack's scenarios on those nodes: the chart
# from the images of `make images` (debug build), the GPUCluster ready; the Rust scenarios of
# e2e/tests/real_nodes/ (the guide's promises on every GPU node, each component's token, the guide's
# workloads, the upstream sharing API, CEL selection, GPUClasses: see their module docs); then a
# kubelet restart, the plugin's metrics under upstream's names, the exporter's admin-access claim,
# the plugin pod replaced under a prepared claim, a MIG claim, the plugin SIGKILLed mid-prepare,
# consumable shares, health through the kubelet, a mode switch under a running pod (the node then
# served by the device plugin: allocatable nvidia.com/gpu, its validator, a pod asking
# nvidia.com/gpu: 1 given its GPU through CDI; a lost GPU; time-slicing from the GPUCluster; a
# ClusterPolicy taking the plane), two nodes handed over under a PodDisruptionBudget, a GPU and then
# a driver arriving on the node without one, an operand's image that cannot be pulled, and an
# uninstall that leaves no pod, claim, CDI spec
# or checkpoint entry. On exit, pass or fail, it takes the cluster down and checks that no process,
# network namespace, link, cgroup, mount or firewall rule is left.
#
# Kubernetes versions: the control plane runs K8S_VERSION (default: HACK_K8S_VERSION of
# hack/cluster.mk), and the MIG node real-gpu-2 runs the oldest supported kubelet (HACK_K8S_OLDEST)
# under it, as the version skew policy allows (not real-gpu-1: see docs/migration.md on a kubelet
# before 1.35 that ran the device plugin). SUBSET=oldest runs a subset (pods, the fake plugin, the install, a claim,
# a two-GPU claim, a MIG claim, health, a hand-over to the device plugin and back, the uninstall) with
# every kubelet on K8S_VERSION: make test runs it with K8S_VERSION=HACK_K8S_OLDEST.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
export CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
TEST_NAME=real-nodes
# shellcheck source=hack/test/lib.sh
source "$HACK_DIR/test/lib.sh"
# full: the whole test, not SUBSET=oldest.
full() { [[ -z "${SUBSET:-}" ]]; }
[[ "${SUBSET:-oldest}" == oldest ]] || { echo "real-nodes.sh: unknown SUBSET=$SUBSET (oldest or none)" >&2; exit 2; }
DEFAULT_K8S_VERSION="$(sed -n 's/^HACK_K8S_VERSION := //p' "$HACK_DIR/cluster.mk")"
OLDEST_K8S_VERSION="$(sed -n 's/^HACK_K8S_OLDEST := //p' "$HACK_DIR/cluster.mk")"
export K8S_VERSION="${K8S_VERSION:-$DEFAULT_K8S_VERSION}"
SKEWED_NODE=real-gpu-2
if full; then
  export KUBELET_VERSIONS="- - $OLDEST_K8S_VERSION -"
  skewed_version=$OLDEST_K8S_VERSION
else
  export KUBELET_VERSIONS=-
  skewed_version=$K8S_VERSION
fi
PORT_BASE="$(free_port_base 41000 real)"
export PORT_BASE
export CLUSTER_DIR="$REPO_DIR/.cluster/real-$PORT_BASE"
# Three products on three real nodes, the last with MIG enabled (it publishes MIG devices only).
# The fourth real node has no GPU until one is plugged in late in the test.
export NODES=1 CPU_NODES=0 REAL_NODES=4 REAL_GPUS="h100-sxm5-80gb:4 l4:2 a100-sxm4-40gb-mig-mixed:2 l4:0"
GPULESS_NODE=real-gpu-3
KUBECONFIG_FILE="$CLUSTER_DIR/kubeconfig"
IMAGE=gpu-operator-rs.dev/test/busybox:1
DRIVER=gpu.fake.example.com
NS=real-nodes
EVENTS="$CLUSTER_DIR/fake-dra-plugin.events"
CID="$(printf '%s' "$CLUSTER_DIR" | sha256sum | cut -c1-6)"

phase() { k -n "$NS" get pod "$1" -o jsonpath='{.status.phase}'; }
pod_done() { [[ "$(phase "$1")" == Succeeded || "$(phase "$1")" == Failed ]]; }
pod_running() { [[ "$(phase "$1")" == Running ]]; }

# What the host looks like before: compared after `down`.
host_state() {
  echo "netns: $(ip netns list | grep -c "gor-$CID" || true)"
  echo "links: $(ip -br link | grep -c "^gor$CID" || true)"
  echo "cgroups: $(find /sys/fs/cgroup -maxdepth 2 -name "gor-$CID-*" | wc -l)"
  echo "mounts: $(grep -c "gor-nodes\|$CLUSTER_DIR" /proc/self/mountinfo || true)"
  echo "iptables:"
  iptables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//'
  echo "nft:"
  nft list ruleset 2>/dev/null
}
BEFORE="$(host_state)"

# host_diff: what the host holds after down that it did not before (nothing when clean).
host_diff() { diff <(echo "$BEFORE") <(host_state) | tr '\n' ' ' || true; }

cleanup() {
  local rc=$?
  # A pipeline's subshell may run the trap too; only the test's own shell cleans up.
  [[ "$BASHPID" == "$$" ]] || return "$rc"
  if [[ -n "${kept:-}" ]]; then
    summary "real-node test (stopped after the scenarios, cluster kept)"
    ((failed == 0)) || exit 1
    exit 0
  fi
  finish_cluster_test "$rc" "real-node test" "no process, netns, link, cgroup, mount or firewall rule left behind" host_diff
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- cluster up -------------------------------------------------------------------------------------
t0=$SECONDS
"$HACK_DIR/cluster" up
pass "cluster up: 4 real nodes and 1 KWOK node Ready in $((SECONDS - t0))s"
eval "$("$HACK_DIR/real-node" net-env)"

info="$(k get node real-gpu-0 "$SKEWED_NODE" -o jsonpath='{range .items[*]}{.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion} {.status.addresses[0].address}{"\n"}{end}')"
# discovery_labels NODE...: every NFD or GPU feature discovery label of the nodes, "node:key=value".
discovery_labels() {
  local nodes
  nodes="$(IFS='|'; echo "$*")"
  # shellcheck disable=SC2016 # a Go template, not shell
  k get nodes -o go-template='{{range .items}}{{$n := .metadata.name}}{{range $k, $v := .metadata.labels}}{{$n}}:{{$k}}={{$v}}{{"\n"}}{{end}}{{end}}' |
    grep -E "^($nodes):(feature\.node\.kubernetes\.io/|nvidia\.com/(gpu\.|mig\.|cuda\.))" || true
}
stamped="$(discovery_labels real-gpu-0 real-gpu-1 real-gpu-2 "$GPULESS_NODE")"
api_version="$(k version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
if [[ "$api_version" == "$K8S_VERSION" && "$(sed -n 1p <<<"$info")" == "$K8S_VERSION containerd://2.4.2 198.18."* &&
  "$(sed -n 2p <<<"$info")" == "$skewed_version containerd://2.4.2 198.18."* && -z "$stamped" ]]; then
  pass "apiserver $api_version; real-gpu-0 runs kubelet $K8S_VERSION, $SKEWED_NODE kubelet $skewed_version, both containerd v2.4.2, with no GPU label from the harness: $(tr '\n' ';' <<<"$info")"
else
  fail "unexpected real node info: $info; labels from the harness: $(tr '\n' ' ' <<<"$stamped")"
fi

k create namespace "$NS" >/dev/null
wait_until 60 k -n "$NS" get serviceaccount default || fail "no default ServiceAccount in $NS"

# --- pods, logs, exec, Service VIP, pod to pod ------------------------------------------------------
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: $NS}
spec:
  nodeName: real-gpu-0
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo pong-from-real-gpu-0 | nc -l -p 8080; done"]
---
apiVersion: v1
kind: Pod
metadata: {name: api-check, namespace: $NS}
spec:
  nodeName: real-gpu-1
  restartPolicy: Never
  containers:
  - name: main
    image: $IMAGE
    imagePullPolicy: Never
    # Until the node's kube-proxy has the Service's rules (a node just Ready may not yet): refused
    # connections are retried for 20s, as the client below retries the server.
    command: ["sh", "-c", "i=0; while [ \$i -lt 20 ]; do echo x | nc -w 3 \$KUBERNETES_SERVICE_HOST \$KUBERNETES_SERVICE_PORT >/dev/null && echo api-reachable \$KUBERNETES_SERVICE_HOST && exit 0; i=\$((i+1)); sleep 1; done; exit 1"]
EOF
if wait_until 90 pod_done api-check && [[ "$(phase api-check)" == Succeeded ]] &&
  k -n "$NS" logs api-check | grep -q "api-reachable $SERVICE_IP"; then
  pass "a pod on real-gpu-1 reaches the API through the kubernetes Service ($SERVICE_IP, kube-proxy); kubectl logs works"
else
  fail "api-check: phase $(phase api-check), log: $(k -n "$NS" logs api-check 2>&1 | tail -3 | tr '\n' ' '); events: $(k -n "$NS" get events --field-selector involvedObject.name=api-check -o jsonpath='{.items[*].message}')"
fi
if wait_until 60 pod_running server; then
  server_ip="$(k -n "$NS" get pod server -o jsonpath='{.status.podIP}')"
  # shellcheck disable=SC2016 # expanded by the container's shell
  out="$(k -n "$NS" exec server -- sh -c 'echo exec-ok $(cat /etc/hostname)' 2>&1 || true)"
  if [[ "$out" == "exec-ok server" ]]; then pass "kubectl exec into a pod on real-gpu-0"; else fail "kubectl exec: $out"; fi
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: $NS}
spec:
  nodeName: real-gpu-1
  restartPolicy: Never
  containers:
  - name: main
    image: $IMAGE
    imagePullPolicy: Never
    # Until the server answers (a Running server may not listen yet); the answer proves the round trip.
    command: ["sh", "-c", "i=0; while [ \$i -lt 30 ]; do r=\$(echo hello-from-real-gpu-1 | nc -w 3 $server_ip 8080); [ \"\$r\" = pong-from-real-gpu-0 ] && echo got \$r && exit 0; i=\$((i+1)); sleep 1; done; exit 1"]
EOF
  if wait_until 60 pod_done client && [[ "$(phase client)" == Succeeded ]] &&
    k -n "$NS" logs client | grep -q "got pong-from-real-gpu-0"; then
    pass "a pod on real-gpu-1 reached a pod on real-gpu-0 at $server_ip"
  else
    fail "pod to pod across nodes: client $(phase client), client log: $(k -n "$NS" logs client 2>&1 | tail -2 | tr '\n' ' '), server log: $(k -n "$NS" logs server 2>&1 | tail -2 | tr '\n' ' ')"
  fi
else
  fail "pod server not Running on real-gpu-0: $(k -n "$NS" describe pod server | tail -5 | tr '\n' ' ')"
fi

# --- DRA: scheduler allocates, plugin on the real kubelet prepares, containerd injects the CDI device --
# The stand-in plugin publishes nothing itself: a hand-written slice of two devices on real-gpu-0.
k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: fake-gpu}
spec:
  selectors:
  - cel: {expression: device.driver == "$DRIVER"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: real-gpu-0-fake}
spec:
  driver: $DRIVER
  nodeName: real-gpu-0
  pool: {name: real-gpu-0, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
  - name: gpu-1
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: gpu, namespace: $NS}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: fake-gpu, count: 1}
EOF
uid="$(k -n "$NS" get resourceclaim gpu -o jsonpath='{.metadata.uid}')"
# What a DRA driver writes for a claim: a CDI spec in the node's /var/run/cdi. The device the
# scheduler will pick is not known yet, so both get one; the container must get only its own.
cat >"$CLUSTER_DIR/nodes/real-gpu-0/run/cdi/$DRIVER-fake.yaml" <<EOF
cdiVersion: 0.5.0
kind: $DRIVER/fake
devices:
- name: $uid-gpu-0
  containerEdits:
    env: ["FAKE_GPU=gpu-0"]
    deviceNodes: [{path: /dev/nvidia0}]
- name: $uid-gpu-1
  containerEdits:
    env: ["FAKE_GPU=gpu-1"]
    deviceNodes: [{path: /dev/nvidia1}]
EOF
# The stand-in plugin runs inside the node, so its sockets are where the real kubelet looks. It
# registers before the pod exists: a pod that found no driver waits out the kubelet's backoff.
: >"$EVENTS"
"$HACK_DIR/cluster" node-exec real-gpu-0 "$BIN_DIR/fake-dra-plugin" --kubeconfig "$KUBECONFIG_FILE" --driver "$DRIVER" \
  --registry-dir /var/lib/kubelet/plugins_registry --plugins-dir /var/lib/kubelet/plugins \
  --event-log "$EVENTS" >"$CLUSTER_DIR/logs/fake-dra-plugin.log" 2>&1 &
wait_until 30 grep -q ' registration registered=true' "$EVENTS" || fail "the stand-in plugin did not register with real-gpu-0's kubelet"
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: gpu-pod, namespace: $NS}
spec:
  restartPolicy: Never
  resourceClaims:
  - {name: gpu, resourceClaimName: gpu}
  containers:
  - name: main
    image: $IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "echo FAKE_GPU=\$FAKE_GPU; stat -c '%n %F %t:%T' /dev/nvidia*"]
    resources:
      claims: [{name: gpu}]
EOF
if wait_until 90 pod_done gpu-pod && [[ "$(phase gpu-pod)" == Succeeded ]]; then
  # The claim is released once its pod is done: the device is the one its CDI edits named.
  log="$(k -n "$NS" logs gpu-pod)"
  device="$(sed -n 's/^FAKE_GPU=//p' <<<"$log")"
  minor="${device#gpu-}"
  if [[ "$device" == gpu-[01] ]] && grep -q "^/dev/nvidia$minor character special file c3:$(printf '%x' "$minor")$" <<<"$log" &&
    [[ "$(grep -c '^/dev/nvidia' <<<"$log")" == 1 ]]; then
    pass "claim prepared through the real kubelet; containerd injected CDI device $device (/dev/nvidia$minor c 195:$minor, env) and nothing else"
  else
    fail "the container did not get exactly the claim's CDI edits ($device): $(tr '\n' ' ' <<<"$log")"
  fi
else
  fail "gpu-pod: phase $(phase gpu-pod); plugin events: $(tr '\n' ' ' <"$EVENTS"); $(k -n "$NS" describe pod gpu-pod | tail -4 | tr '\n' ' ')"
fi
if grep -q " prepare $NS/gpu uid=$uid" "$EVENTS"; then
  pass "NodePrepareResources from the real kubelet for $NS/gpu"
else
  fail "no NodePrepareResources for $NS/gpu in the plugin's event log"
fi
k -n "$NS" delete pod gpu-pod --wait=false >/dev/null
if wait_until 90 grep -q " unprepare $NS/gpu uid=$uid" "$EVENTS"; then
  pass "NodeUnprepareResources once the pod was deleted"
else
  fail "no NodeUnprepareResources within 90s of deleting the pod"
fi

# --- the install guide on the real nodes ------------------------------------------------------------
k delete namespace "$NS" --wait=false >/dev/null
k delete deviceclass fake-gpu >/dev/null
k delete resourceslice real-gpu-0-fake >/dev/null
rm "$CLUSTER_DIR/nodes/real-gpu-0/run/cdi/$DRIVER-fake.yaml"
# The KWOK node would take the operator's pods without running them: keep it out of the way.
k taint node gpu-node-0 gpu-operator-rs.dev/fake=true:NoSchedule >/dev/null
images="$CLUSTER_DIR/images"
PROFILE=debug IMAGES_OUT="$images" "$HACK_DIR/images.sh" >/dev/null
IMAGES_DIR="$images" "$HACK_DIR/cluster" load-images
GNS=gpu-operator
t0=$SECONDS
"$BIN_DIR/helm" --kubeconfig "$KUBECONFIG_FILE" upgrade --install gpu-operator "$REPO_DIR/charts/gpu-operator" \
  --namespace "$GNS" --create-namespace --set gpuCluster.enabled=true --set driver.enabled=false \
  --set 'operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE' --set 'operator.env[0].value=dra' \
  --set gpuCluster.migration.drain=wait --set nodeDiscovery.intervalSeconds=3 >/dev/null
gc_ready() { [[ "$(k get gpucluster gpu-cluster -o jsonpath='{.status.state}')" == ready ]]; }
if wait_until 300 gc_ready; then
  pods="$(k -n "$GNS" get pods --no-headers -o wide | awk '{print $1" "$2" "$3" "$7}' | tr '\n' ';')"
  pass "the guide's helm install: GPUCluster ready in $((SECONDS - t0))s, every operand a pod on a real node: $pods"
else
  fail "GPUCluster not ready within 300s: $(k get gpucluster gpu-cluster -o jsonpath='{.status.conditions[0].message}'); $(k -n "$GNS" get pods --no-headers | tr '\n' ';')"
  exit 1
fi

# Helpers of the scenarios still in this script. stack_of NODE: its readiness labels and cordon.
stack_of() { k get node "$1" -o jsonpath='{.metadata.labels.gpu-operator-rs\.dev/gpu-stack} {.metadata.labels.gpu-operator-rs\.dev/gpu-setup-complete} {.spec.unschedulable}'; }
slice_uuids() { k get resourceslices --field-selector "spec.nodeName=$1,spec.driver=gpu.nvidia.com" -o jsonpath='{range .items[*].spec.devices[*]}{.attributes.uuid.string}{"\n"}{end}'; }
# node_uuids NODE: the GPU UUIDs NODE serves, from its slices (DRA) or its device plugin's CDI spec.
node_uuids() {
  slice_uuids "$1"
  grep -o '^- *name: GPU-[0-9a-f-]*' "$CLUSTER_DIR/nodes/$1/run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml" 2>/dev/null | grep -o 'GPU-.*' || true
}
# gfd_labels NODE: the labels a workload author selects on, as GPU feature discovery names them.
gfd_labels() {
  k get node "$1" -o jsonpath='{.metadata.labels.feature\.node\.kubernetes\.io/pci-10de\.present} {.metadata.labels.nvidia\.com/gpu\.product} {.metadata.labels.nvidia\.com/gpu\.count} {.metadata.labels.nvidia\.com/gpu\.memory} {.metadata.labels.nvidia\.com/gpu\.family} {.metadata.labels.nvidia\.com/gpu\.compute\.major}.{.metadata.labels.nvidia\.com/gpu\.compute\.minor} {.metadata.labels.nvidia\.com/mig\.capable} {.metadata.labels.nvidia\.com/cuda\.driver-version\.full} {.metadata.labels.nvidia\.com/cuda\.runtime-version\.full}'
}

# gpu_pod NAME NODE COUNT [CLASS [CEL [SCRIPT]]]: the guide's claim template and pod, COUNT devices of
# CLASS (gpu.nvidia.com), CEL an extra selector, pinned to NODE unless it is empty; its container runs
# SCRIPT, by default LIST_GPUS: nvidia-smi -L, its /dev/nvidia<minor> nodes, and NVML's library. Its
# image is the guide's unless WORKLOAD_IMAGE names another.
LIST_GPUS="nvidia-smi -L; ls /dev | grep '^nvidia[0-9]'; test -e /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 && echo nvml-present"
gpu_pod() {
  local name=$1 node=$2 count=$3 class=${4:-gpu.nvidia.com} cel=${5:-} script=${6:-$LIST_GPUS} pin="" select=""
  [[ -n "$node" ]] && pin="nodeSelector: {kubernetes.io/hostname: $node}"
  [[ -n "$cel" ]] && select="selectors: [{cel: {expression: \"$cel\"}}]"
  k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $name, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: $class
          allocationMode: ExactCount
          count: $count
          $select
---
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  $pin
  resourceClaims: [{name: gpu, resourceClaimTemplateName: $name}]
  containers:
  - name: workload
    image: ${WORKLOAD_IMAGE:-nvcr.io/nvidia/cuda:12.6.2-base-ubi9}
    command: ["sh", "-c", "$script"]
    resources:
      claims: [{name: gpu}]
EOF
}
pod_phase() { k -n default get pod "$1" -o jsonpath='{.status.phase}'; }
pod_node() { k -n default get pod "$1" -o jsonpath='{.spec.nodeName}'; }
finished() { [[ "$(pod_phase "$1")" == Succeeded || "$(pod_phase "$1")" == Failed ]]; }
running() { [[ "$(pod_phase "$1")" == Running ]]; }
# check_gpu_pod NAME NODES COUNT: the pod succeeded on one of NODES (a|b) and saw exactly COUNT of that
# node's GPUs, nothing else.
check_gpu_pod() {
  local name=$1 nodes=$2 count=$3 node log uuids seen devs known=1 u
  if ! wait_until 120 finished "$name" || [[ "$(pod_phase "$name")" != Succeeded ]]; then
    fail "$name: $(pod_phase "$name"); $(k -n default describe pod "$name" | tail -4 | tr '\n' ' ')"
    return
  fi
  node="$(pod_node "$name")"
  log="$(k -n default logs "$name")"
  uuids="$(node_uuids "$node")"
  seen="$(grep -c '^GPU [0-9]*: NVIDIA .* (UUID: GPU-' <<<"$log" || true)"
  devs="$(grep -c '^nvidia[0-9]*$' <<<"$log" || true)"
  while read -r u; do grep -qx "$u" <<<"$uuids" || known=0; done < <(grep -o 'GPU-[0-9a-f-]*' <<<"$log")
  if [[ "|$nodes|" != *"|$node|"* ]]; then
    fail "$name ran on $node, not on $nodes"
  elif [[ "$seen" == "$count" && "$devs" == "$count" && "$known" == 1 ]] && grep -q '^nvml-present$' <<<"$log"; then
    pass "$name on $node: nvidia-smi -L lists exactly its $count GPU(s) of that node, $count /dev/nvidia<minor>, libnvidia-ml.so.1 injected: $(grep '^GPU' <<<"$log" | tr '\n' ';')"
  else
    fail "$name on $node: expected $count GPU(s) of the node, got: $(tr '\n' ';' <<<"$log")"
  fi
}
# resource_pod NAME NODE [SCRIPT]: a pod asking RESOURCE (default nvidia.com/gpu): 1, no claim, pinned
# to NODE unless NODE is empty, running SCRIPT, by default LIST_GPUS.
resource_pod() {
  local pin=""
  [[ -z "$2" ]] || pin="nodeSelector: {kubernetes.io/hostname: $2}"
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  $pin
  containers:
  - name: workload
    image: nvcr.io/nvidia/cuda:12.6.2-base-ubi9
    command: ["sh", "-c", "${3:-$LIST_GPUS}"]
    resources:
      limits: {${RESOURCE:-nvidia.com/gpu}: 1}
EOF
}
# The scenarios of e2e/tests/real_nodes/ on this cluster, one PASS or FAIL line each: what the install
# guide promises on every GPU node (readiness labels, the GPUCluster's counts, DeviceClasses,
# driver-ready, every GPU and MIG device published, GPU discovery's labels), what each component's
# token may do, the guide's workloads, the kubelet plugin on a real kubelet (a restart, its
# metrics, its pod replaced under a claim, a MIG claim, a SIGKILL mid-prepare), claims written for
# the upstream driver's sharing API and consumable shares, GPU health through the kubelet, CEL
# selection, GPUClasses' extended resources and shares, and what the GPUCluster says the apiserver
# serves. The subset leaves out CEL selection, the GPUClasses (1.34 serves no shares) and of the
# plugin's scenarios all but the MIG claim. With KEEP_CLUSTER=1 the test stops after them and leaves the
# cluster up, the chart installed, for running one alone (e2e/run.sh --real-nodes).
# scenario_verdicts LOG: "NAME ok|FAILED" per test in the output of libtest with --nocapture, where
# a test's own lines come between its "test NAME ... " and its verdict, alone on a line.
scenario_verdicts() {
  awk 'match($0, /^test [A-Za-z0-9_:]+ \.\.\. /) {
         name = $2; rest = substr($0, RLENGTH + 1)
         if (rest == "ok" || rest == "FAILED") { print name, rest; name = "" }
         next
       }
       name != "" && ($0 == "ok" || $0 == "FAILED") { print name, $0; name = "" }' "$1"
}
if full; then scenarios=(); else scenarios=(install:: access:: workloads:: sharing:: health:: plugin::a_mig_claim); fi
scenario_log="$CLUSTER_DIR/logs/real-node-scenarios.log"
SHARED_CLUSTER=1 CLUSTER_DIR="$CLUSTER_DIR" "$REPO_DIR/e2e/run.sh" --real-nodes "${scenarios[@]}" 2>&1 | tee "$scenario_log" || true
ran=0
while read -r name verdict; do
  ran=$((ran + 1))
  if [[ "$verdict" == ok ]]; then pass "scenario $name"; else fail "scenario $name (its steps and the components' logs in $scenario_log)"; fi
done < <(scenario_verdicts "$scenario_log")
((ran > 0)) || fail "no real-node scenario ran: $(tail -5 "$scenario_log" | tr '\n' ' ')"
if [[ -n "${KEEP_CLUSTER:-}" ]]; then
  kept=1
  echo "real-nodes: cluster kept in $CLUSTER_DIR (KUBECONFIG=$KUBECONFIG_FILE)"
  echo "  one scenario: SHARED_CLUSTER=1 CLUSTER_DIR=$CLUSTER_DIR e2e/run.sh --real-nodes NAME"
  echo "  down:         CLUSTER_DIR=$CLUSTER_DIR hack/cluster down && rm -rf $CLUSTER_DIR"
  exit 0
fi

# plugin_on NODE: "name ready" of the DRA kubelet plugin pod on NODE.
plugin_on() { k -n "$GNS" get pods -l app=nvidia-dra-driver-kubelet-plugin --field-selector "spec.nodeName=$1" -o jsonpath='{range .items[*]}{.metadata.name} {.status.containerStatuses[?(@.name=="gpus")].ready}{"\n"}{end}'; }

# Faults for the device plugin's NVML on real-gpu-1 (a lost GPU, below) come from a control file of
# the mock in the node's own folder, named to the plugins through the GPUCluster (as an admin sets
# env), with a short recovery period. The DRA plugin's pods are replaced for the new env; in the
# same edit (the full run: 1.34's apiserver serves consumable capacity only as alpha) whole GPUs are
# offered as 2 consumable shares for the rest of the test.
shares_mode=disabled
full && shares_mode=2
faults="$CLUSTER_DIR/nodes/real-gpu-1/var/lib/kubelet/mock-nvml-faults.json"
mock_faults() { # FAULTS (JSON object)
  printf '{"profile": "l4", "gpu_count": 2, "visible_dev_dir": "/dev", "faults": %s}\n' "$1" >"$faults.tmp"
  mv "$faults.tmp" "$faults"
}
mock_faults '{}'
fault_env='[{"name": "MOCK_NVML_CONFIG", "value": "/host/var/lib/kubelet/mock-nvml-faults.json"},
  {"name": "HEALTH_RECOVERY_PERIOD", "value": "5"}, {"name": "HEALTH_PROBE_INTERVAL", "value": "1"}]'
old_plugin="$(plugin_on real-gpu-1 | cut -d' ' -f1)"
k patch gpucluster gpu-cluster --type merge -p "{\"spec\": {\"devicePlugin\": {\"env\": $fault_env},
  \"draDriver\": {\"gpus\": {\"consumableShares\": \"$shares_mode\", \"kubeletPlugin\": {\"env\": $fault_env}}}}}" >/dev/null
replaced() { local p; p="$(plugin_on real-gpu-1)"; [[ -n "$p" && "$p" != "$old_plugin "* && "$p" == *" true" && "$(slice_uuids real-gpu-1 | grep -c ^GPU-)" == 2 ]]; }
wait_until 120 replaced || fail "the DRA plugin on real-gpu-1 was not replaced for its new env: $(plugin_on real-gpu-1 | tr '\n' ' ')"

# Switching a node with a running GPU pod to device-plugin: the validator and exporter leave at once,
# the DRA plugin stays until the pod is gone, then leaves too; switched back, it returns.
label_of() { k get node "$1" -o jsonpath="{.metadata.labels.nvidia\.com/gpu\.deploy\.$2}"; }
gpu_pod switch real-gpu-1 1 gpu.nvidia.com "" "$LIST_GPUS; sleep 3600"
if wait_until 120 running switch; then
  k label node real-gpu-1 nvidia.com/gpu-operator.resource-allocation.mode=device-plugin --overwrite >/dev/null
  deferred() { [[ -z "$(label_of real-gpu-1 dra-validator)" && "$(label_of real-gpu-1 dra-driver)" == true && -z "$(label_of real-gpu-1 device-plugin)" && "$(stack_of real-gpu-1)" == "  true" ]]; }
  if wait_until 60 deferred && sleep 5 && deferred && [[ -n "$(plugin_on real-gpu-1)" ]]; then
    pass "mode switched to device-plugin under a running GPU pod (migration.drain: wait): node cordoned, readiness labels gone, consumers' labels gone, the DRA plugin kept, no device plugin yet (one plane per node)"
  else
    fail "switch under a running pod: dra-validator '$(label_of real-gpu-1 dra-validator)', dra-driver '$(label_of real-gpu-1 dra-driver)', device-plugin '$(label_of real-gpu-1 device-plugin)', stack/complete/unschedulable '$(stack_of real-gpu-1)'"
  fi
  held_on_dra() { k get gpucluster gpu-cluster -o jsonpath="{.status.conditions[?(@.type==\"NodesHeldOnDRA\")].$1}"; }
  held_reported() { [[ "$(held_on_dra message)" == *"node real-gpu-1 "* ]]; }
  hold_over() { [[ "$(held_on_dra status)" == False ]]; }
  if wait_until 30 held_reported; then
    pass "the GPUCluster's NodesHeldOnDRA names real-gpu-1 while its pod holds a claim"
  else
    fail "NodesHeldOnDRA: $(held_on_dra status) $(held_on_dra message)"
  fi
  k -n default delete pod switch --wait=false >/dev/null
  driver_gone() { [[ -z "$(label_of real-gpu-1 dra-driver)" && -z "$(plugin_on real-gpu-1)" ]]; }
  if wait_until 120 driver_gone; then
    pass "once the pod left, the DRA plugin left real-gpu-1"
    wait_until 30 hold_over ||
      fail "NodesHeldOnDRA still $(held_on_dra status) after the pod left: $(held_on_dra message)"
  else
    fail "dra-driver '$(label_of real-gpu-1 dra-driver)', plugin $(plugin_on real-gpu-1) after the pod left"
  fi
  # Now on the device-plugin plane: the GPUCluster's device plugin registers nvidia.com/gpu with the
  # real kubelet, and a pod that asks nvidia.com/gpu: 1 gets one GPU through CDI.
  dp_on() { k -n "$GNS" get pods -l app=nvidia-device-plugin-daemonset --field-selector "spec.nodeName=$1" -o jsonpath='{range .items[*]}{.metadata.name} {.status.containerStatuses[0].ready}{"\n"}{end}'; }
  allocatable() { k get node "$1" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
  dp_served() { [[ "$(dp_on real-gpu-1)" == *" true" && "$(allocatable real-gpu-1)" == 2 ]]; }
  t0=$SECONDS
  if wait_until 180 dp_served; then
    pass "gpu-device-plugin on real-gpu-1 ready in $((SECONDS - t0))s: the kubelet shows allocatable nvidia.com/gpu: 2"
  else
    fail "device plugin on real-gpu-1: pod '$(dp_on real-gpu-1)', allocatable nvidia.com/gpu '$(allocatable real-gpu-1)', label '$(label_of real-gpu-1 device-plugin)'"
  fi
  # The plane's validator: its validation pod was given a GPU by the device plugin and NVML showed
  # that GPU, then the validator turned ready (and the validation pod was deleted).
  opval_on() { k -n "$GNS" get pods -l app=nvidia-operator-validator --field-selector "spec.nodeName=$1" -o jsonpath='{range .items[*]}{.metadata.name} {.status.containerStatuses[0].ready}{"\n"}{end}'; }
  opval_ready() { [[ "$(opval_on real-gpu-1)" == *" true" ]]; }
  t0=$SECONDS
  if wait_until 180 opval_ready; then
    said="$(k -n "$GNS" logs "$(opval_on real-gpu-1 | cut -d' ' -f1)" -c plugin-validation 2>&1 | grep -o 'ready: .*' | head -1)"
    left="$(k -n "$GNS" get pods -l app=nvidia-device-plugin-validator --no-headers 2>/dev/null | wc -l)"
    if [[ "$said" == *"offers nvidia.com/gpu"* && "$left" == 0 ]]; then
      pass "nvidia-operator-validator ready on real-gpu-1 in $((SECONDS - t0))s: $said; validation pod removed"
    else
      fail "operator-validator: log '$said', validation pods left: $left"
    fi
  else
    fail "operator-validator on real-gpu-1: '$(opval_on real-gpu-1)'; $(k -n "$GNS" logs -l app=nvidia-operator-validator -c plugin-validation --tail=3 2>&1 | tr '\n' ' ')"
  fi
  dp_ready_1() { [[ "$(stack_of real-gpu-1)" == "device-plugin true " ]]; }
  if wait_until 30 dp_ready_1; then
    pass "hand-over of real-gpu-1 complete: gpu-stack=device-plugin, gpu-setup-complete=true, node uncordoned"
  else
    fail "after the validator passed on real-gpu-1 (gpu-stack setup-complete unschedulable): '$(stack_of real-gpu-1)'; annotation $(k get node real-gpu-1 -o jsonpath='{.metadata.annotations.gpu-operator-rs\.dev/plane-handover}')"
  fi
  planes() { k get gpucluster gpu-cluster -o jsonpath='{.status.nodes.dra} {.status.nodes.devicePlugin} {.status.nodes.readyDevicePlugin}'; }
  counted() { [[ "$(planes)" == "3 1 1" ]]; }
  if wait_until 60 counted; then
    pass "GPUCluster status counts both planes (dra, devicePlugin, readyDevicePlugin): $(planes)"
  else
    fail "GPUCluster status.nodes (dra devicePlugin readyDevicePlugin): $(planes)"
  fi
  resource_pod dp-workload real-gpu-1
  check_gpu_pod dp-workload real-gpu-1 1
  k -n default delete pod dp-workload --wait=false >/dev/null
  # The guide's readiness check: a PhysicalGPU for every card of every GPU node, each Ready,
  # written by the plugin of the plane that serves its node.
  pgpu_rows() {
    k get physicalgpu -o jsonpath='{range .items[*]}{.status.node}/{.status.plane}/{.status.phase}{"\n"}{end}' |
      sort | uniq -c | awk '{printf "%s=%s ", $2, $1}'
  }
  pgpus_listed() { [[ "$(pgpu_rows)" == "real-gpu-0/dra/Ready=4 real-gpu-1/device-plugin/Ready=2 real-gpu-2/dra/Ready=2 " ]]; }
  if wait_until 60 pgpus_listed; then
    pass "kubectl get physicalgpu -o wide: every card of the 3 GPU nodes on both planes, Ready: $(pgpu_rows)"
    k get physicalgpu -o wide | sed 's/^/    /'
  else
    fail "PhysicalGPUs (node/plane/phase=count): $(pgpu_rows)"
  fi
  if full; then # not in the subset: a lost GPU, time-slicing, a ClusterPolicy
  # A GPU lost (the mock's fault injection): one ListAndWatch update takes it out of the kubelet's
  # allocatable; after the recovery period with the GPU readable again, it returns.
  t0=$SECONDS
  mock_faults '{"lost_gpus": [1]}'
  one_left() { [[ "$(allocatable real-gpu-1)" == 1 ]]; }
  if wait_until 60 one_left; then
    lost_after=$((SECONDS - t0))
    t0=$SECONDS
    mock_faults '{}'
    both_back() { [[ "$(allocatable real-gpu-1)" == 2 ]]; }
    if wait_until 60 both_back; then
      pass "a GPU lost on real-gpu-1 left the kubelet's allocatable nvidia.com/gpu in ${lost_after}s (2 -> 1) and returned $((SECONDS - t0))s after it recovered (5 s recovery period)"
    else
      fail "the recovered GPU did not return: allocatable nvidia.com/gpu '$(allocatable real-gpu-1)'"
    fi
  else
    fail "a GPU lost on real-gpu-1: allocatable nvidia.com/gpu stayed '$(allocatable real-gpu-1)'"
  fi
  # Time-slicing from the GPUCluster: the operator writes the plugin's config file and the plugin
  # pods roll; each GPU is offered twice, and once more when the sharing is taken out.
  k patch gpucluster gpu-cluster --type merge -p '{"spec": {"devicePlugin": {"config": {"sharing":
    {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}}}}' >/dev/null
  t0=$SECONDS
  sliced() { [[ "$(dp_on real-gpu-1)" == *" true" && "$(allocatable real-gpu-1)" == 4 ]]; }
  if wait_until 120 sliced; then
    sliced_after=$((SECONDS - t0))
    k patch gpucluster gpu-cluster --type merge -p '{"spec": {"devicePlugin": {"config": {"sharing": null}}}}' >/dev/null
    if wait_until 120 dp_served; then
      pass "time-slicing with 2 replicas: allocatable nvidia.com/gpu 2 -> 4 in ${sliced_after}s after the GPUCluster edit, back to 2 when it was removed"
    else
      fail "sharing removed: allocatable nvidia.com/gpu '$(allocatable real-gpu-1)', pod '$(dp_on real-gpu-1)'"
    fi
  else
    fail "time-slicing: allocatable nvidia.com/gpu '$(allocatable real-gpu-1)', pod '$(dp_on real-gpu-1)', configmap: $(k -n "$GNS" get configmap nvidia-device-plugin-config -o jsonpath='{.data}' 2>&1)"
  fi
  # A ClusterPolicy appears (the upstream CRD's stand-in): the operator, as a pod with the chart's
  # RBAC, leaves the device-plugin plane to it and removes its device plugin; when the CRD goes,
  # the plugin returns.
  apply_policy() { k apply -f "$REPO_DIR/e2e/testdata/clusterpolicy-crd.yaml"; }
  dp_ds() { k -n "$GNS" get daemonset nvidia-device-plugin-daemonset -o name 2>/dev/null; }
  no_dp() { [[ -z "$(dp_ds)" && -z "$(dp_on real-gpu-1)" ]]; }
  t0=$SECONDS
  if wait_until 30 apply_policy && wait_until 60 no_dp; then
    left_after=$((SECONDS - t0))
    k delete crd clusterpolicies.nvidia.com --wait=true >/dev/null
    if wait_until 120 dp_served; then
      pass "a ClusterPolicy took the device-plugin plane: our device plugin gone in ${left_after}s, back when the ClusterPolicy CRD was deleted"
    else
      fail "after the ClusterPolicy CRD went: daemonset '$(dp_ds)', pod '$(dp_on real-gpu-1)', allocatable '$(allocatable real-gpu-1)'"
    fi
  else
    fail "beside a ClusterPolicy: daemonset '$(dp_ds)', pod '$(dp_on real-gpu-1)'; operator log: $(k -n "$GNS" logs deploy/gpu-operator --tail=5 2>&1 | tr '\n' ' ')"
    k delete crd clusterpolicies.nvidia.com --ignore-not-found >/dev/null
  fi
  fi
  # Switched back under a pod holding a GPU the device plugin gave: the device plugin stays (and the
  # DRA plugin waits) until that pod is gone.
  resource_pod dp-hold real-gpu-1 "$LIST_GPUS; sleep 3600"
  if wait_until 120 running dp-hold; then
    k label node real-gpu-1 nvidia.com/gpu-operator.resource-allocation.mode=dra --overwrite >/dev/null
    dp_kept() { [[ -z "$(label_of real-gpu-1 operator-validator)" && "$(label_of real-gpu-1 device-plugin)" == true && -z "$(label_of real-gpu-1 dra-driver)" ]]; }
    if wait_until 60 dp_kept && sleep 5 && dp_kept && [[ -n "$(dp_on real-gpu-1)" ]]; then
      pass "switched back to dra under a pod holding a device-plugin GPU: the validator left, the device plugin stayed, no DRA plugin yet (one plane per node)"
    else
      fail "switch back under a running pod: operator-validator '$(label_of real-gpu-1 operator-validator)', device-plugin '$(label_of real-gpu-1 device-plugin)', dra-driver '$(label_of real-gpu-1 dra-driver)'"
    fi
    k -n default delete pod dp-hold --wait=false >/dev/null
  else
    fail "dp-hold on real-gpu-1: $(pod_phase dp-hold)"
    k label node real-gpu-1 nvidia.com/gpu-operator.resource-allocation.mode=dra --overwrite >/dev/null
  fi
  returned() { [[ "$(plugin_on real-gpu-1)" == *" true" && "$(slice_uuids real-gpu-1 | grep -c ^GPU-)" == 2 && "$(stack_of real-gpu-1)" == "dra true " ]]; }
  dp_gone() { [[ -z "$(dp_on real-gpu-1)" && "$(allocatable real-gpu-1)" =~ ^0?$ ]]; }
  if wait_until 120 returned && wait_until 60 dp_gone; then
    pass "switched back to dra: the device plugin left (allocatable nvidia.com/gpu '$(allocatable real-gpu-1)'), the DRA plugin returned to real-gpu-1 and published its 2 GPUs; hand-over complete (gpu-stack=dra, uncordoned)"
  else
    fail "switched back to dra: plugin '$(plugin_on real-gpu-1)', $(slice_uuids real-gpu-1 | wc -l) GPUs, stack/complete/unschedulable '$(stack_of real-gpu-1)'"
  fi
else
  fail "switch on real-gpu-1: $(pod_phase switch)"
fi

if full; then # not in the subset: two nodes handed over under a PDB, a GPU and driver arriving
# --- node by node under a Deployment with a PodDisruptionBudget (docs/migration.md) ------------------
# Both real GPU nodes go dra -> device-plugin -> dra with migration.drain: evict. The labeler hands
# them over one at a time (cordon, evict through the PDB, switch, wait for the validator, uncordon);
# the Deployment's 2 replicas ask nvidia.com/gpu: 1, which either plane serves, and keep one running.
k patch gpucluster gpu-cluster --type merge -p '{"spec": {"migration": {"drain": "evict"}}}' >/dev/null
k apply -f - >/dev/null <<APP
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: gpu-app, namespace: default}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: gpu-app}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: gpu-app, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: gpu-app}}
  template:
    metadata: {labels: {app: gpu-app}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [real-gpu-0, real-gpu-1]}]
      containers:
      - name: app
        image: nvcr.io/nvidia/cuda:12.6.2-base-ubi9
        command: ["sh", "-c", "nvidia-smi -L; exec sleep 3600"]
        resources:
          limits: {nvidia.com/gpu: 1}
APP
# Replicas Running and not being deleted (an evicted pod stays Running while it terminates).
app_running() { k -n default get pods -l app=gpu-app -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}|{.status.phase}{"\n"}{end}' 2>/dev/null | grep -c '^|Running$' || true; }
moving() { k get nodes real-gpu-0 real-gpu-1 -o jsonpath='{range .items[*]}{.metadata.annotations.gpu-operator-rs\.dev/plane-handover}{"\n"}{end}' | grep -c '"phase":"\(Draining\|WaitingForPlane\)"' || true; }
app_pods() { k -n default get pods -l app=gpu-app -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'; }
in_handover() { k get node "$1" -o jsonpath='{.metadata.annotations.gpu-operator-rs\.dev/plane-handover}' | grep -q '"phase":"\(Draining\|WaitingForPlane\)"'; }
# migrate MODE: both nodes set to MODE; prints "fewest-running most-moving both-planes-seen seconds
# replicas-replaced per-node" once both are ready on MODE with 2 replicas running, sampling every
# second. per-node: each node's hand-over as NODE=START..DONE, seconds after the label change from
# its first sample in a hand-over to its first sample ready on MODE and uncordoned.
migrate() {
  local mode=$1 t0=$SECONDS least=2 most=0 both=0 n r m before
  local -A began=() ended=()
  before="$(app_pods)"
  k label node real-gpu-0 real-gpu-1 "nvidia.com/gpu-operator.resource-allocation.mode=$mode" --overwrite >/dev/null
  while ((SECONDS - t0 < 420)); do
    r="$(app_running)"
    m="$(moving)"
    ((r < least)) && least=$r
    ((m > most)) && most=$m
    # Both plugin labels of a node from one read: two reads could straddle the switch's patch.
    for n in real-gpu-0 real-gpu-1; do
      [[ "$(k get node "$n" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.deploy\.dra-driver}/{.metadata.labels.nvidia\.com/gpu\.deploy\.device-plugin}')" == ?*/?* ]] && both=1
      [[ -z "${began[$n]:-}" ]] && in_handover "$n" && began[$n]=$((SECONDS - t0))
      [[ -n "${began[$n]:-}" && -z "${ended[$n]:-}" && "$(stack_of "$n")" == "$mode true " ]] && ended[$n]=$((SECONDS - t0))
    done
    if [[ "$(stack_of real-gpu-0)" == "$mode true " && "$(stack_of real-gpu-1)" == "$mode true " && "$r" == 2 ]]; then
      # Every replica held a GPU of the plane its node left, so each was evicted and replaced.
      for n in real-gpu-0 real-gpu-1; do [[ -n "${ended[$n]:-}" ]] || ended[$n]=$((SECONDS - t0)); done
      echo "$least $most $both $((SECONDS - t0)) $(grep -cvxF -f <(app_pods) <<<"$before" || true) real-gpu-0=${began[real-gpu-0]:-?}..${ended[real-gpu-0]},real-gpu-1=${began[real-gpu-1]:-?}..${ended[real-gpu-1]}"
      return 0
    fi
    sleep 1
  done
  echo "$least $most $both timeout"
  return 1
}
two_running() { [[ "$(app_running)" == 2 ]]; }
if wait_until 180 two_running; then
  for mode in device-plugin dra; do
    if result="$(migrate "$mode")" && read -r least most both secs replaced pernode <<<"$result" &&
      ((least >= 1 && most == 1 && both == 0 && replaced == 2)); then
      pass "both real nodes handed over to $mode one at a time in ${secs}s (each node from its hand-over's start to ready and uncordoned, seconds after the label change: $pernode) under a 2-replica Deployment with a PDB (drain: evict): both replicas evicted and replaced, at least $least running at every sample, at most $most node between planes, never both planes' plugins on a node, readiness labels $mode on both"
    else
      fail "hand-over to $mode (fewest running, most moving, both planes seen, seconds, replicas replaced): $result; nodes: $(stack_of real-gpu-0) / $(stack_of real-gpu-1); $(k get events -A --field-selector involvedObject.kind=Node --sort-by=.lastTimestamp 2>/dev/null | grep -E 'Handover|PlaneSwitched' | tail -4 | tr '\n' ' ')"
    fi
  done
else
  fail "gpu-app replicas before the hand-over: $(k -n default get pods -l app=gpu-app -o wide --no-headers 2>&1 | tr '\n' ';')"
fi
k -n default delete deployment gpu-app --wait=false >/dev/null
k -n default delete pdb gpu-app >/dev/null

# GPU discovery on a running node with no GPU: a GPU appears on its PCI bus, then its driver comes up
# (a driver container's root in /run/nvidia/driver); nothing is restarted or reinstalled.
agent_before="$(k -n "$GNS" get pods -l app.kubernetes.io/name=gpu-node-discovery --field-selector "spec.nodeName=$GPULESS_NODE" -o jsonpath='{.items[0].metadata.name} {.items[0].status.containerStatuses[0].restartCount}')"
t0=$SECONDS
"$HACK_DIR/cluster" plug-gpus "$GPULESS_NODE" l4 1
gpu_seen() {
  [[ "$(k get node "$GPULESS_NODE" -o jsonpath='{.metadata.labels.feature\.node\.kubernetes\.io/pci-10de\.present}/{.metadata.labels.nvidia\.com/gpu\.product}/{.metadata.labels.nvidia\.com/gpu\.present}')" == "true//true" ]]
}
if wait_until 60 gpu_seen; then
  pass "a GPU on $GPULESS_NODE's PCI bus, no driver yet: pci-10de.present=true from discovery in $((SECONDS - t0))s, gpu.present=true from the labeler, no driver label yet"
else
  fail "after plugging a GPU into $GPULESS_NODE: '$(gfd_labels "$GPULESS_NODE")', gpu.present '$(k get node "$GPULESS_NODE" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.present}')'"
fi
t0=$SECONDS
"$HACK_DIR/cluster" install-driver "$GPULESS_NODE" l4 1
gpu_node_ready() {
  [[ "$(gfd_labels "$GPULESS_NODE")" == "true NVIDIA-L4 1 23034 ada-lovelace 8.9 false 580.95.05 13.0" &&
    "$(stack_of "$GPULESS_NODE")" == "dra true " && "$(slice_uuids "$GPULESS_NODE" | grep -c ^GPU-)" == 1 ]]
}
if wait_until 240 gpu_node_ready; then
  agent_after="$(k -n "$GNS" get pods -l app.kubernetes.io/name=gpu-node-discovery --field-selector "spec.nodeName=$GPULESS_NODE" -o jsonpath='{.items[0].metadata.name} {.items[0].status.containerStatuses[0].restartCount}')"
  if [[ "$agent_after" == "$agent_before" ]]; then
    pass "once its driver came up, $GPULESS_NODE became a DRA GPU node in $((SECONDS - t0))s: GPU feature discovery's labels, readiness labels, its GPU in a ResourceSlice; the discovery pod never restarted ($agent_after)"
  else
    fail "the discovery pod on $GPULESS_NODE changed: before '$agent_before', after '$agent_after'"
  fi
else
  fail "$GPULESS_NODE with a GPU and a driver: labels '$(gfd_labels "$GPULESS_NODE")', stack '$(stack_of "$GPULESS_NODE")', slices $(slice_uuids "$GPULESS_NODE" | wc -l); pods: $(k -n "$GNS" get pods --field-selector "spec.nodeName=$GPULESS_NODE" --no-headers 2>&1 | tr '\n' ';')"
fi
fi

if full; then # not in the subset: an operand's pods stuck
# An operand whose image cannot be pulled: the GPUCluster's Ready and Error conditions name the
# node, the pod, the container and the reason, not only "n of m pods available".
exporter_image="$(k get gpucluster gpu-cluster -o jsonpath='{.spec.dcgmExporter.image}')"
k patch gpucluster gpu-cluster --type merge -p "{\"spec\": {\"dcgmExporter\": {\"image\": \"$exporter_image-missing\"}}}" >/dev/null
ready_says() { k get gpucluster gpu-cluster -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}: {.status.conditions[?(@.type=="Ready")].message}'; }
failing_named() { ready_says | grep -Eq '^OperandPodsFailing: operand pods failing: node real-gpu-[0-9]+: pod nvidia-dcgm-exporter-dra-[a-z0-9]+ container [a-z-]+: (ErrImagePull|ImagePullBackOff) \(.*'"$exporter_image-missing"; }
if wait_until 120 failing_named; then
  pass "an exporter image that cannot be pulled is named in the GPUCluster: $(ready_says | cut -c1-200)"
else
  fail "GPUCluster with an unpullable exporter image says: $(ready_says)"
fi
k patch gpucluster gpu-cluster --type merge -p "{\"spec\": {\"dcgmExporter\": {\"image\": \"$exporter_image\"}}}" >/dev/null
wait_until 180 gc_ready || fail "GPUCluster not ready again once the exporter's image was restored: $(ready_says)"
fi

# Uninstall: nothing of ours is left on the nodes or in the API.
t0=$SECONDS
"$BIN_DIR/helm" --kubeconfig "$KUBECONFIG_FILE" uninstall gpu-operator --namespace "$GNS" --wait >/dev/null
ns_empty() { [[ -z "$(k -n "$GNS" get pods,resourceclaims --no-headers 2>/dev/null)" ]]; }
no_specs() { ! compgen -G "$CLUSTER_DIR/nodes/real-gpu-*/run/cdi/k8s.gpu.nvidia.com-claim_*" >/dev/null; }
no_entries() {
  local f
  for f in "$CLUSTER_DIR"/nodes/real-gpu-*/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json; do
    [[ -e "$f" ]] || continue
    python3 -c 'import json,sys; sys.exit(1 if json.load(open(sys.argv[1]))["payload"]["claims"] else 0)' "$f" || return 1
  done
}
if wait_until 120 ns_empty && wait_until 60 no_specs && wait_until 60 no_entries &&
  [[ -z "$(k get gpucluster --no-headers 2>/dev/null)" && -z "$(k get physicalgpu --no-headers 2>/dev/null)" ]]; then
  pass "helm uninstall in $((SECONDS - t0))s leaves no pod, claim, GPUCluster, PhysicalGPU, CDI spec or checkpoint entry"
else
  fail "after uninstall: $(k -n "$GNS" get pods,resourceclaims --no-headers 2>&1 | tr '\n' ';') PhysicalGPUs: $(k get physicalgpu --no-headers 2>&1 | wc -l) specs: $(find "$CLUSTER_DIR"/nodes/real-gpu-*/run/cdi/ -type f 2>&1 | tr '\n' ' ')"
fi
