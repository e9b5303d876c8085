#!/usr/bin/env bash
# Real-node test (make test-real-nodes). Brings up its own cluster with four real nodes (a real
# kubelet, containerd v2 + runc, CNI and kube-proxy each, in namespaces of their own; mock H100s, L4s
# and MIG-enabled A100s, and one without a GPU) beside one KWOK node, on free ports. No real node gets
# a GPU label from the harness: GPU discovery finds their GPUs on their PCI bus and labels them. First what the product's pods rely on:
# pods run from locally imported images; `kubectl logs` and `exec` work; a pod reaches the API through
# the `kubernetes` Service and a pod on the other node; a DRA claim allocated by the scheduler is
# prepared by a plugin registered with the real kubelet, and containerd injects the claim's CDI device
# into the container. Then the install guide on those nodes: the chart from the images of `make
# images` (debug build), the GPUCluster ready; then the product's scenarios, which are Rust tests
# (e2e/tests/real_nodes/, one function per behaviour, see their module docs and run_scenarios
# below); then an uninstall that leaves no pod, claim, CDI spec
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
# The fourth real node has no GPU until the last scenario plugs one in.
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
# The earlier releases the upgrade scenario goes down to and back from (hack/releases), their
# images beside today's: built once into $CACHE_DIR/releases, kept there between runs.
if full; then
  releases="$("$HACK_DIR/release-images.sh" 2>"$CLUSTER_DIR/logs/release-images.log")" ||
    { fail "building the earlier releases: $(tail -5 "$CLUSTER_DIR/logs/release-images.log" | tr '\n' ' ')"; exit 1; }
  for release in $releases; do
    IMAGES_DIR="$release/images" "$HACK_DIR/cluster" load-images
  done
fi
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

# Prometheus on the cluster, scraping it as kube-prometheus-stack scrapes the chart's PodMonitors and
# evaluating the chart's alerts, their `for` windows short enough for the scenarios to see them
# fire (observability::, health::, planes::).
if CLUSTER_DIR="$CLUSTER_DIR" "$HACK_DIR/prometheus/start.sh" real-gpu-3 \
  --set prometheusRule.unhealthyFor=20s --set prometheusRule.heldOnDraFor=20s >/dev/null; then
  pass "Prometheus serving at $(cat "$CLUSTER_DIR/prometheus-url") (in real-gpu-3's network)"
else
  fail "Prometheus did not start: $(tail -3 "$CLUSTER_DIR/prometheus/prometheus.log" 2>/dev/null | tr '\n' ' ')"
fi

# The scenarios of e2e/tests/real_nodes/ on this cluster, one PASS or FAIL line each (see their
# module docs): what the install guide promises on every GPU node, what each component's token may
# do, the guide's workloads, the kubelet plugin on a real kubelet (a restart, its metrics, its pod
# replaced under a claim, a MIG claim, a SIGKILL mid-prepare), the upstream sharing API and
# consumable shares, GPU health through the kubelet, CEL selection, GPUClasses, what the GPUCluster
# says the apiserver serves, moving a node between planes (under a running pod, the device plugin's
# plane: its validator, a lost GPU, time-slicing, a ClusterPolicy), both nodes handed over under a
# PodDisruptionBudget (watched with `kubectl gpu migration --watch`), an operand's unpullable image
# in the GPUCluster's status, `kubectl gpu`'s nodes, claims and why, the cluster's Prometheus and,
# after those, the chart's dashboard drawing data from them, then `helm upgrade` down to each
# earlier release of hack/releases and back under running GPU pods; then (it
# changes the node for good) a GPU and then its driver arriving on the node without one, and last
# driver upgrades the labeler runs on that driver container (drained, let in, proven; two nodes
# one at a time; a broken driver stopping the rollout). The subset
# leaves out CEL selection, the GPUClasses (1.34 serves no shares), of the plugin's scenarios all
# but the MIG claim, of the planes' all but the switch under a running pod, the hand-over under a
# PDB, the unpullable image, `kubectl gpu`, Prometheus's targets, the dashboard, the upgrade and the hot-plug. With KEEP_CLUSTER=1 the test stops before the
# hot-plug and leaves the cluster up, the chart installed, for running one alone
# (e2e/run.sh --real-nodes); SCENARIOS="FILTER..." runs only those (libtest filters), none of the
# later groups (dashboard, upgrade, hot-plug, driver upgrades).
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
# run_scenarios LOG FILTER...: the scenarios matching FILTER (libtest's filters and --skip), their
# output in LOG, one PASS or FAIL line each.
run_scenarios() {
  local log=$1 ran=0 name verdict
  shift
  SHARED_CLUSTER=1 CLUSTER_DIR="$CLUSTER_DIR" "$REPO_DIR/e2e/run.sh" --real-nodes "$@" 2>&1 | tee "$log" || true
  while read -r name verdict; do
    ran=$((ran + 1))
    if [[ "$verdict" == ok ]]; then pass "scenario $name"; else fail "scenario $name (its steps and the components' logs in $log)"; fi
  done < <(scenario_verdicts "$log")
  ((ran > 0)) || fail "no real-node scenario ran: $(tail -5 "$log" | tr '\n' ' ')"
}
if [[ -n "${SCENARIOS:-}" ]]; then
  read -ra scenarios <<<"$SCENARIOS"
elif full; then
  scenarios=(--skip hotplug:: --skip dashboard:: --skip upgrade:: --skip driver_upgrade::)
else
  scenarios=(install:: access:: workloads:: sharing:: health:: plugin::a_mig_claim planes::a_switch)
fi
run_scenarios "$CLUSTER_DIR/logs/real-node-scenarios.log" "${scenarios[@]}"
# The dashboard's panels, over the time the scenarios took.
all() { full && [[ -z "${SCENARIOS:-}" ]]; }
all && run_scenarios "$CLUSTER_DIR/logs/real-node-dashboard.log" dashboard::
# The product's own upgrade: helm down to each earlier release and back under running GPU pods.
all && run_scenarios "$CLUSTER_DIR/logs/real-node-upgrade.log" upgrade:: --skip driver_upgrade::
if [[ -n "${KEEP_CLUSTER:-}" ]]; then
  kept=1
  echo "real-nodes: cluster kept in $CLUSTER_DIR (KUBECONFIG=$KUBECONFIG_FILE)"
  echo "  one scenario: SHARED_CLUSTER=1 CLUSTER_DIR=$CLUSTER_DIR e2e/run.sh --real-nodes NAME"
  echo "  down:         CLUSTER_DIR=$CLUSTER_DIR hack/cluster down && rm -rf $CLUSTER_DIR"
  exit 0
fi
all && run_scenarios "$CLUSTER_DIR/logs/real-node-hotplug.log" hotplug::
# Driver upgrades run by the labeler, on the driver container the hot-plug brought up.
all && run_scenarios "$CLUSTER_DIR/logs/real-node-driver-upgrade.log" driver_upgrade::

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
