#!/usr/bin/env bash
# hack/prometheus/start.sh NODE [HELM FLAGS...] — Prometheus (built by make hack-tools) on the local
# cluster in $CLUSTER_DIR, scraping it as a kube-prometheus-stack Prometheus scrapes the chart's
# PodMonitors (config.py translates them, the apiserver included) and evaluating the chart's alerts.
# The chart is rendered with prometheusRule.enabled=true and the HELM FLAGS (shorter `for` windows,
# say). It runs inside real node NODE's network namespace, where the pods' addresses are routed,
# and stops with the node (hack/cluster down). Its address goes to $CLUSTER_DIR/prometheus-url, its
# configuration, data and log to $CLUSTER_DIR/prometheus/.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
BIN_DIR="$CACHE_DIR/bin"
: "${CLUSTER_DIR:?set CLUSTER_DIR to a running real-node cluster}"
node="${1:?usage: hack/prometheus/start.sh NODE [HELM FLAGS...]}"
shift
[[ -x "$BIN_DIR/prometheus" ]] || { echo "prometheus: $BIN_DIR/prometheus is missing: run make hack-tools" >&2; exit 2; }

dir="$CLUSTER_DIR/prometheus"
rm -rf "$dir" && mkdir -p "$dir"
"$BIN_DIR/helm" template gpu-operator "$REPO_DIR/charts/gpu-operator" --namespace gpu-operator \
  --set prometheusRule.enabled=true "$@" >"$dir/chart.yaml"
python3 "$HACK_DIR/prometheus/config.py" "$dir/chart.yaml" "$CLUSTER_DIR/kubeconfig" "$dir"
ip="$("$HACK_DIR/cluster" node-exec "$node" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)"
[[ -n "$ip" ]] || { echo "prometheus: no address of node $node" >&2; exit 1; }
url="http://$ip:9090"
nohup "$HACK_DIR/cluster" node-exec "$node" "$BIN_DIR/prometheus" --config.file="$dir/prometheus.yml" \
  --storage.tsdb.path="$dir/data" --web.listen-address="$ip:9090" >"$dir/prometheus.log" 2>&1 &
ready() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$url/-/ready" 2>/dev/null; }
for _ in $(seq 1 60); do
  if ready; then
    echo "$url" >"$CLUSTER_DIR/prometheus-url"
    echo "prometheus: $url (in node $node), config and log in $dir"
    exit 0
  fi
  sleep 1
done
echo "prometheus: not ready at $url within 60s: $(tail -5 "$dir/prometheus.log")" >&2
exit 1
