# shellcheck shell=bash
# Sourced by hack/bench-prepare.sh and hack/bench-mig.sh: pods with a claim created and deleted on a
# node of a local cluster, timed by the node's mini-kubelet (its DRA gRPC histogram). The caller sets
# WORK (scratch folder), NODES_DIR (the cluster's nodes) and REPORT (hack/bench-prepare-report.py);
# CLAIM_TEMPLATE names the ResourceClaimTemplate the pods use (default one-gpu).
devices() { kubectl get resourceslices --field-selector "spec.nodeName=$1" -o jsonpath='{range .items[*].spec.devices[*]}{.name}{" "}{end}' | wc -w; }
published() { (($(devices "$1") == $2)); }
wait_for() { local n="$1"; shift; for _ in $(seq "$((n * 5))"); do "$@" && return 0; sleep 0.2; done; echo "bench-prepare: timed out: $*" >&2; return 1; }
scrape() { # node file
  curl -sf "http://$(cat "$NODES_DIR/$1/kubelet/metrics-addr")/metrics" | grep '^kubelet_dra_grpc_operations_duration_seconds\|^dra_grpc_operations_duration_seconds' >"$2" || true
}
calls() { "${REPORT[@]}" count "$1" "$2"; } # node-scrape method
pods() { # node phase count: that many pods with a 1-GPU claim, in one apply
  for ((i = 0; i < $3; i++)); do
    cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $2-$i, namespace: default, labels: {bench: $2}}
spec:
  nodeSelector: {kubernetes.io/hostname: $1}
  containers:
  - {name: main, image: busybox, resources: {claims: [{name: gpu}]}}
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: ${CLAIM_TEMPLATE:-one-gpu}}
---
YAML
  done | kubectl apply -f - >/dev/null
}
# cycle NODE PHASE COUNT: create COUNT pods at once, wait until the kubelet prepared them all, delete
# them and wait until it unprepared them all.
cycle() {
  local node="$1" phase="$2" count="$3" before="$WORK/cycle.prom"
  scrape "$node" "$before"
  local prepared unprepared
  prepared="$(calls "$before" NodePrepareResources)" unprepared="$(calls "$before" NodeUnprepareResources)"
  pods "$node" "$phase" "$count"
  # kubectl wait's own start-up (about 0.2 s of CPU) would compete with the prepares it waits for.
  sleep 1
  kubectl wait pods -l "bench=$phase" --timeout=120s \
    --for=jsonpath='{.metadata.annotations.minikubelet\.gpu-operator-rs\.dev/prepared}'=true >/dev/null
  kubectl delete pods -l "bench=$phase" --wait=true --timeout=120s >/dev/null
  done_unpreparing() { scrape "$node" "$before" && (($(calls "$before" NodeUnprepareResources) >= unprepared + count)); }
  wait_for 60 done_unpreparing
  (($(calls "$before" NodePrepareResources) == prepared + count)) ||
    echo "bench-prepare: $phase on $node: $(($(calls "$before" NodePrepareResources) - prepared)) prepares for $count pods" >&2
}
