#!/usr/bin/env bash
# Snapshot tests of the chart: renders each case below with `helm template` and compares the output
# (or the error, for cases that must fail) with tests/snapshots/<case>.txt.
#   charts/gpu-operator/tests/snapshot.sh            check (make test-chart)
#   UPDATE=1 charts/gpu-operator/tests/snapshot.sh   rewrite the snapshots (make update-chart-snapshots)
# HELM (default $CACHE_DIR/bin/helm, else helm on PATH) is the binary used.
set -euo pipefail

CHART_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SNAP_DIR="$CHART_DIR/tests/snapshots"
CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
HELM="${HELM:-$CACHE_DIR/bin/helm}"
[[ -x "$HELM" ]] || HELM="$(command -v helm)" || { echo "snapshot: no helm (run make hack-tools)" >&2; exit 2; }
UPDATE="${UPDATE:-}"

# An offline render sees no cluster, so the cases that create a GPUCluster tell Helm that the DRA
# API is served, as the validation message asks.
DRA=(--api-versions resource.k8s.io/v1/DeviceClass)
# The install guide's commands, flags exactly as written there ("Install", both tabs); only the chart
# reference differs (this folder instead of nvidia/gpu-operator, so --version does not apply).
GUIDE_COMMON=(--version=v26.7.0 --create-namespace --namespace gpu-operator)
GUIDE_MODE=(--set 'operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE' --set 'operator.env[0].value=dra')

declare -A CASES=(
  [guide-operator-managed-driver]="${GUIDE_COMMON[*]} --set gpuCluster.enabled=true --set driver.nvidiaDriverCRD.enabled=true ${GUIDE_MODE[*]} ${DRA[*]}"
  [guide-preinstalled-driver]="${GUIDE_COMMON[*]} --set gpuCluster.enabled=true --set driver.enabled=false ${GUIDE_MODE[*]} ${DRA[*]}"
  [defaults]="--namespace gpu-operator"
  [customised]="--namespace gpu-system --set operator.annotations.example\.com/team=gpu --set operator.labels.example\.com/tier=infra --set nodeLabeler.driverAutoUpgrade=true --set gpuCluster.enabled=true --set gpuCluster.planePolicy.rules[0].name=h100-on-dra --set gpuCluster.planePolicy.rules[0].mode=dra --set gpuCluster.planePolicy.rules[0].nodeSelector.matchLabels.nvidia\.com/gpu\.product=NVIDIA-H100-80GB-HBM3 --set driver.enabled=false ${GUIDE_MODE[*]} ${DRA[*]} --set gpuCluster.draDriver.computeDomains.enabled=false --set gpuCluster.draDriver.featureGates.PassthroughSupport=true --set dcgm.enabled=true --set dcgmExporter.serviceMonitor.enabled=false --set hostPaths.kubeletRootDir=/var/lib/k0s/kubelet --set daemonsets.updateStrategy=OnDelete --set operator.replicas=2 --set nodeLabeler.replicas=2 --set operator.logFormat=json --set operator.version=v0.2.0 --set kubeletPlugin.version=v0.2.0 --set cleanupHook.enabled=false --set gpuCluster.draDriver.gpus.consumableShares=4 --set gpuCluster.draDriver.gpus.migPartitioning=dynamic"
  [error-consumable-shares]="--namespace gpu-operator --set gpuCluster.enabled=true --set driver.enabled=false ${DRA[*]} --set gpuCluster.draDriver.gpus.consumableShares=half"
  [error-no-dra-api]="--namespace gpu-operator --set gpuCluster.enabled=true --set driver.enabled=false ${GUIDE_MODE[*]}"
  [error-driver-both]="--namespace gpu-operator --set driver.enabled=false --set driver.nvidiaDriverCRD.enabled=true"
  [error-driver-unmanaged]="--namespace gpu-operator --set gpuCluster.enabled=true ${GUIDE_MODE[*]} ${DRA[*]}"
  [error-bad-mode]="--namespace gpu-operator --set operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE --set operator.env[0].value=DRA"
  [error-device-plugin-mode]="--namespace gpu-operator --set gpuCluster.enabled=true --set driver.enabled=false --set devicePlugin.enabled=false --set operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE --set operator.env[0].value=device-plugin ${DRA[*]}"
  [device-plugin-mixed]="--namespace gpu-operator --set gpuCluster.enabled=true --set driver.enabled=false --set mig.strategy=mixed --set devicePlugin.env[0].name=HEALTH_RECOVERY_PERIOD --set-string devicePlugin.env[0].value=120 --set devicePlugin.config.sharing.timeSlicing.resources[0].name=nvidia.com/gpu --set devicePlugin.config.sharing.timeSlicing.resources[0].replicas=4 ${DRA[*]}"
  [prometheus-rule]="--namespace gpu-operator --set gpuCluster.enabled=true --set driver.enabled=false ${GUIDE_MODE[*]} ${DRA[*]} --set prometheusRule.enabled=true --set prometheusRule.additionalLabels.release=kube-prometheus --set gpuCluster.migration.drain=wait --set dashboard.enabled=true"
  [error-rootfs]="--namespace gpu-operator --set hostPaths.rootFS=/host"
  [error-partial-image]="--namespace gpu-operator --set gpuCluster.enabled=true --set driver.enabled=false ${DRA[*]} --set gpuCluster.draDriver.repository=example.com/dra"
  [error-typo]="--namespace gpu-operator --set gpuCluster.enable=true"
  [error-env-typo]="--namespace gpu-operator --set operator.env[0].nmae=DEFAULT_GPU_ALLOCATION_MODE --set operator.env[0].value=dra"
  [error-wrong-type]="--namespace gpu-operator --set-string operator.replicas=two"
  [discovery-from-nfd]="--namespace gpu-operator --set nodeDiscovery.source=nfd"
  [discovery-upstream-nfd-off]="--namespace gpu-operator --set nfd.enabled=false"
  [error-discovery-source]="--namespace gpu-operator --set nodeDiscovery.source=NFD"
  [error-wrong-type-bool]="--namespace gpu-operator --set dcgmExporter.enabled=yes"
)

failed=0
for name in $(printf '%s\n' "${!CASES[@]}" | sort); do
  # shellcheck disable=SC2086 # the case strings are word lists
  out="$("$HELM" template gpu-operator "$CHART_DIR" ${CASES[$name]} 2>&1)" && rc=0 || rc=$?
  if [[ "$name" == error-* ]]; then
    ((rc != 0)) || { echo "FAIL $name: rendered, but must fail"; failed=1; continue; }
  else
    ((rc == 0)) || { echo "FAIL $name: helm template failed:"; echo "$out"; failed=1; continue; }
  fi
  file="$SNAP_DIR/$name.txt"
  if [[ -n "$UPDATE" ]]; then
    printf '%s\n' "$out" >"$file"
    echo "updated $name"
  elif ! diff -u "$file" <(printf '%s\n' "$out") >/tmp/chart-snapshot-$$.diff 2>&1; then
    echo "FAIL $name: output differs from tests/snapshots/$name.txt (UPDATE=1 to accept):"
    cat /tmp/chart-snapshot-$$.diff
    failed=1
  else
    echo "ok   $name"
  fi
done
rm -f /tmp/chart-snapshot-$$.diff
# Least privilege, whatever the snapshots say: no role of the chart may use wildcards, touch Secrets,
# or escalate (escalate, bind, impersonate, RBAC objects), in the guide's render.
# shellcheck disable=SC2086 # the case holds several flags
rules="$("$HELM" template gpu-operator "$CHART_DIR" ${CASES[guide-preinstalled-driver]} \
  | awk '/^kind: (Cluster)?Role$/{r=1} /^---/{r=0} r')"
for bad in "'\*'" '"\*"' '\[\*\]' 'secrets' 'escalate' 'bind\b' 'impersonate' 'rbac.authorization.k8s.io\]'; do
  if grep -nE -- "$bad" <<<"$rules" | grep -v 'apiGroup: rbac' >/dev/null; then
    echo "FAIL least privilege: a Role or ClusterRole matches $bad:"
    grep -nE -- "$bad" <<<"$rules" | grep -v 'apiGroup: rbac'
    failed=1
  fi
done
((failed)) || echo "ok   least privilege (no wildcard, Secrets, escalate/bind/impersonate or RBAC rules)"
if [[ -z "$UPDATE" ]]; then
  # A snapshot whose case was removed is stale.
  for file in "$SNAP_DIR"/*.txt; do
    name="$(basename "$file" .txt)"
    [[ -v "CASES[$name]" ]] || { echo "FAIL stale snapshot $name.txt (no such case)"; failed=1; }
  done
fi
exit "$failed"
